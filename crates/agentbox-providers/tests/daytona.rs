//! Daytona boxes against the repository's fake Daytona (`agentbox-fakes`), whose sandboxes
//! really run as namespace boxes and whose API the `daytona` Python SDK judges (the fake's own
//! tests): the conformance suite with and without the runner, and what is Daytona's own (the
//! seed's refusals, the network read back, the label index that trails, throttling, a toolbox
//! that stops answering, errors in Daytona's words, the workspace rule, archive, the key kept
//! out of the box).
//!
//! All of Daytona's proof is in this file: `view` reads Daytona from outside the provider; the
//! suites at the top run on the fake; `judged` holds the fake to Daytona's own Python SDK; `live`
//! runs the conformance suite on the real Daytona, where `DAYTONA_API_KEY` is set.

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, ErrorCode, Labels, Lifecycle, Network, NetworkFact, Provider, Spec, Status};
use agentbox_fakes::daytona::{FakeDaytona, FakeDaytonaOptions, FakeSnapshot};
use agentbox_providers::daytona::{ApiKey, DaytonaOptions, DaytonaProvider, VolumeMount};
use agentbox_providers::helper::HelperCommand;
use agentbox_testing::conformance::{self, Options, Outside};

use agentbox_testing::services::rootfs;
use agentbox_testing::sh;
use view::View;

/// The fake's key. Not a secret: the fake's own.
const KEY: &str = "dtn_fake_key_for_tests_0123456789";

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn ctx() -> Ctx {
    Ctx::background().with_timeout(Duration::from_secs(120))
}

/// The fake Daytona, its sandboxes on the test rootfs and its minute a second long; `None`
/// (after a loud notice, or a panic under CI) where this machine has no rootfs.
async fn fake(test: &str, tune: impl FnOnce(&mut FakeDaytonaOptions)) -> Option<FakeDaytona> {
    let rootfs = rootfs(test)?;
    let mut o = FakeDaytonaOptions {
        rootfs: Some(rootfs.into()),
        api_key: KEY.into(),
        minute: Duration::from_secs(1),
        index_lag: Duration::from_millis(300),
        ..Default::default()
    };
    tune(&mut o);
    Some(FakeDaytona::start(o).await.expect("the fake Daytona starts"))
}

fn options(fake: &FakeDaytona) -> DaytonaOptions {
    DaytonaOptions {
        api_url: fake.api_url(),
        api_key: Some(ApiKey::new(KEY)),
        minute: Duration::from_secs(1),
        index_timeout: Duration::from_secs(30),
        poll: Duration::from_millis(50),
        ..Default::default()
    }
}

/// The static runner the sandboxes get (`AGENTBOX_RUNNER`, as scripts/test exports it).
fn runner() -> HelperCommand {
    HelperCommand {
        program: std::env::var_os("AGENTBOX_RUNNER")
            .expect("AGENTBOX_RUNNER names the static runner (scripts/test exports it)")
            .into(),
        args: Vec::new(),
    }
}

fn provider(o: DaytonaOptions) -> Arc<dyn Provider> {
    Arc::new(DaytonaProvider::new(o).expect("the options are whole"))
}

async fn conformance_against(test: &str, with_runner: bool) {
    let Some(fake) = fake(test, |_| {}).await else { return };
    let mut opts = options(&fake);
    if with_runner {
        opts.runner = Some(runner());
    }
    let outside = Arc::new(View::new(&fake.api_url(), KEY));
    // A lifetime past the longest create seen under a loaded CI (a runner uploaded and started
    // through the toolbox, then reached through the preview URL): at 5 s, a create once ran
    // past it and met its sandbox being destroyed.
    let options = Options::new("daytona", Duration::from_secs(10), Duration::from_secs(10), outside);
    let report = conformance::run(
        conformance::factory(move || {
            let opts = opts.clone();
            async move { provider(opts) }
        }),
        options,
    )
    .await;
    report.assert_all_passed();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daytona_boxes_pass_the_conformance_suite() {
    conformance_against("daytona_boxes_pass_the_conformance_suite", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daytona_boxes_with_the_runner_pass_the_conformance_suite() {
    conformance_against("daytona_boxes_with_the_runner_pass_the_conformance_suite", true).await;
}

fn spec() -> Spec {
    Spec::new(Duration::from_secs(120))
}

/// Every sandbox of the fake that is not destroyed or being deleted.
fn live(fake: &FakeDaytona) -> usize {
    fake.sandboxes()
        .iter()
        .filter(|s| s.state != "destroyed" && s.desired_state != "destroyed")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_refusals_name_the_field_and_make_nothing() {
    let Some(fake) = fake("the_seeds_refusals_name_the_field_and_make_nothing", |_| {}).await else {
        return;
    };
    let p = provider(options(&fake));
    let cases: Vec<(&str, Spec, ErrorCode, &str)> = vec![
        (
            "cpus",
            Spec {
                cpus: Some(2.0),
                ..spec()
            },
            ErrorCode::Unsupported,
            "snapshot",
        ),
        (
            "memory_mb",
            Spec {
                memory_mb: Some(4096),
                ..spec()
            },
            ErrorCode::Unsupported,
            "snapshot",
        ),
        (
            "gpu",
            Spec {
                gpu: Some("any".into()),
                ..spec()
            },
            ErrorCode::Unsupported,
            "snapshot",
        ),
        (
            "image",
            Spec {
                image: Some("debian".into()),
                ..spec()
            },
            ErrorCode::Unsupported,
            "snapshot",
        ),
        (
            "network",
            Spec {
                network: Some(Network::Allow(vec!["10.0.0.0/8".into()])),
                ..spec()
            },
            ErrorCode::Unsupported,
            "CIDR",
        ),
        (
            "network",
            Spec {
                network: Some(Network::Allow((0..11).map(|i| format!("h{i}.example.com")).collect())),
                ..spec()
            },
            ErrorCode::Unsupported,
            "at most 10",
        ),
        (
            "ports",
            Spec {
                ports: vec![agentbox_core::PortSpec {
                    port: 8080,
                    kind: agentbox_core::PortKind::Tcp,
                }],
                ..spec()
            },
            ErrorCode::Unsupported,
            "ports",
        ),
        (
            "capabilities",
            Spec {
                capabilities: vec!["fuse".into()],
                ..spec()
            },
            ErrorCode::Unsupported,
            "fuse",
        ),
    ];
    for (field, s, code, says) in cases {
        let e = p
            .create(&s, &ctx())
            .await
            .err()
            .unwrap_or_else(|| panic!("{field}: a box was made"));
        assert_eq!(e.code(), code, "{field}: {e}");
        assert!(e.message().contains(&format!("spec.{field}")), "{field}: {e}");
        assert!(e.message().contains(says), "{field}: {e}");
    }
    assert_eq!(fake.sandboxes().len(), 0, "a refused spec made no sandbox");
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_daytona_did_not_restrict_is_refused_and_deleted() {
    let Some(fake) = fake("a_network_daytona_did_not_restrict_is_refused_and_deleted", |o| {
        o.network_unenforced = true
    })
    .await
    else {
        return;
    };
    let p = provider(options(&fake));
    for network in [Network::None, Network::Allow(vec!["pypi.org".into()])] {
        let s = Spec {
            network: Some(network.clone()),
            ..spec()
        };
        let e = p.create(&s, &ctx()).await.map(|_| ()).expect_err("refused");
        assert_eq!(e.code(), ErrorCode::Unsupported, "{network:?}: {e}");
        assert!(e.message().contains("spec.network"), "{e}");
        assert!(e.message().contains("tier"), "{e}");
        assert_eq!(
            live(&fake),
            0,
            "{network:?}: the sandbox it did not restrict is deleted"
        );
    }
    // The default network is made and its facts say nothing they do not know.
    let b = p.create(&spec(), &ctx()).await.unwrap();
    assert_eq!(b.facts().network, None, "an unasked network is unknown, never open");
    b.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_none_and_an_allowlist_are_read_back_before_they_are_reported() {
    let Some(fake) = fake(
        "network_none_and_an_allowlist_are_read_back_before_they_are_reported",
        |_| {},
    )
    .await
    else {
        return;
    };
    let p = provider(options(&fake));
    let none = p
        .create(
            &Spec {
                network: Some(Network::None),
                ..spec()
            },
            &ctx(),
        )
        .await
        .unwrap();
    assert_eq!(none.facts().network, Some(NetworkFact::None));
    let view = fake.sandboxes().into_iter().find(|s| s.id == none.id().name()).unwrap();
    assert!(view.network_block_all);
    // Really blocked: the box's network namespace has only its loopback.
    let out = sh(&*none, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '").await;
    assert_eq!(out.stdout_text().trim(), "lo", "{}", out.stderr_text());
    let hosts = vec!["pypi.org".to_string(), "*.example.com".to_string()];
    let allow = p
        .create(
            &Spec {
                network: Some(Network::Allow(hosts.clone())),
                ..spec()
            },
            &ctx(),
        )
        .await
        .unwrap();
    assert_eq!(allow.facts().network, Some(NetworkFact::Allowlist(hosts)));
    let view = fake
        .sandboxes()
        .into_iter()
        .find(|s| s.id == allow.id().name())
        .unwrap();
    assert_eq!(view.domain_allow_list.as_deref(), Some("pypi.org,*.example.com"));
    none.destroy(&ctx()).await.unwrap();
    allow.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_waits_for_the_label_index_and_a_list_asks_for_one_label() {
    let Some(fake) = fake(
        "a_create_waits_for_the_label_index_and_a_list_asks_for_one_label",
        |o| o.index_lag = Duration::from_secs(2),
    )
    .await
    else {
        return;
    };
    let p = provider(options(&fake));
    let labels = Labels::from([("team".to_string(), "red".to_string())]);
    let t = std::time::Instant::now();
    let b = p
        .create(
            &Spec {
                labels: labels.clone(),
                ..spec()
            },
            &ctx(),
        )
        .await
        .unwrap();
    assert!(
        t.elapsed() >= Duration::from_secs(2),
        "the create answered in {:?}, before the index could show the box",
        t.elapsed()
    );
    // At once after the create, through the host's labels, the box is there.
    let found = p.list(&labels, &ctx()).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].id(), b.id());
    assert!(
        p.list(&Labels::from([("team".to_string(), "blue".to_string())]), &ctx())
            .await
            .unwrap()
            .is_empty()
    );
    let queries = fake.list_queries();
    assert!(!queries.is_empty());
    for q in &queries {
        let v: serde_json::Value = serde_json::from_str(q.as_deref().unwrap_or("null")).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"agentbox.provider": "daytona"}),
            "a list asked {q:?}"
        );
    }
    b.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_waited_out_and_errors_carry_daytonas_words() {
    let Some(fake) = fake("throttling_is_waited_out_and_errors_carry_daytonas_words", |_| {}).await else {
        return;
    };
    let p = provider(options(&fake));
    fake.throttle(3);
    let b = p.create(&spec(), &ctx()).await.expect("three 429s are waited out");
    // A throttle past the caller's deadline is refused, not slept through.
    fake.throttle(4);
    let e = p
        .attach(b.id(), &Ctx::background().with_timeout(Duration::from_millis(1500)))
        .await
        .map(|_| ())
        .expect_err("throttled past the deadline");
    assert!(matches!(e.code(), ErrorCode::Refused | ErrorCode::Timeout), "{e}");
    // The throttles left are waited out.
    p.attach(b.id(), &ctx()).await.unwrap().expect("the box");
    fake.fail_next(500, "INTERNAL_SERVER_ERROR", "the database is on fire", 1);
    let e = p.attach(b.id(), &ctx()).await.map(|_| ()).expect_err("a 500");
    assert_eq!(e.code(), ErrorCode::Unknown);
    assert!(e.message().contains("the database is on fire"), "{e}");
    assert!(!e.message().contains(KEY), "{e}");
    fake.fail_next(403, "FORBIDDEN", "no such permission", 1);
    let e = p.attach(b.id(), &ctx()).await.map(|_| ()).expect_err("a 403");
    assert_eq!(e.code(), ErrorCode::PermissionDenied, "{e}");
    b.destroy(&ctx()).await.unwrap();
    // A wrong key is refused, and the error does not quote it.
    let mut o = options(&fake);
    o.api_key = Some(ApiKey::new("dtn_wrong_key_0000"));
    let e = provider(o)
        .create(&spec(), &ctx())
        .await
        .map(|_| ())
        .expect_err("a wrong key");
    assert_eq!(e.code(), ErrorCode::PermissionDenied, "{e}");
    assert!(!e.message().contains("dtn_wrong_key_0000"), "{e}");
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_toolbox_that_stops_answering_is_a_timeout_not_a_hang() {
    let Some(fake) = fake("a_toolbox_that_stops_answering_is_a_timeout_not_a_hang", |_| {}).await else {
        return;
    };
    let mut o = options(&fake);
    o.request_timeout = Duration::from_secs(2);
    o.silent = Duration::from_secs(4);
    let p = provider(o);
    let b = p.create(&spec(), &ctx()).await.unwrap();
    let mut prog = b
        .exec(&["sleep".into(), "60".into()], &Default::default(), &Ctx::background())
        .await
        .unwrap();
    fake.hang_toolbox(true);
    let t = std::time::Instant::now();
    let e = tokio::time::timeout(Duration::from_secs(30), prog.wait())
        .await
        .expect("the wait ends")
        .map(|_| ())
        .expect_err("an error");
    assert_eq!(e.code(), ErrorCode::Timeout, "{e}");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    let e = tokio::time::timeout(
        Duration::from_secs(30),
        b.exec(&["true".into()], &Default::default(), &Ctx::background()),
    )
    .await
    .expect("the exec ends")
    .map(|_| ())
    .expect_err("an error");
    assert_eq!(e.code(), ErrorCode::Timeout, "{e}");
    fake.hang_toolbox(false);
    b.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_the_user_cannot_make_fails_the_create_naming_the_path() {
    let Some(fake) = fake(
        "a_workspace_the_user_cannot_make_fails_the_create_naming_the_path",
        |_| {},
    )
    .await
    else {
        return;
    };
    let p = provider(options(&fake));
    // The root is read-only and the snapshot has no passwordless sudo.
    let s = Spec {
        workspace: Some("/usr/agentbox-workspace".into()),
        ..spec()
    };
    let e = p.create(&s, &ctx()).await.map(|_| ()).expect_err("refused");
    assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
    assert!(e.message().contains("/usr/agentbox-workspace"), "{e}");
    assert!(e.message().contains("sudo"), "{e}");
    assert_eq!(live(&fake), 0, "the sandbox is deleted");
    // The default workspace is /tmp/workspace, where programs start.
    let b = p.create(&spec(), &ctx()).await.unwrap();
    assert_eq!(b.facts().workspace.as_deref(), Some("/tmp/workspace"));
    assert_eq!(sh(&*b, "pwd").await.stdout_text().trim(), "/tmp/workspace");
    b.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn facts_come_from_the_snapshot_and_the_lifetime_is_daytonas() {
    let Some(fake) = fake("facts_come_from_the_snapshot_and_the_lifetime_is_daytonas", |o| {
        o.snapshots.push(FakeSnapshot {
            name: "big-vm".into(),
            rootfs: None,
            cpu: 4,
            memory_gb: 8,
            disk_gb: 20,
            class: "linux-vm".into(),
        })
    })
    .await
    else {
        return;
    };
    let p = provider(options(&fake));
    let t0 = now_ms();
    let b = p
        .create(
            &Spec {
                snapshot: Some("big-vm".into()),
                isolation: Some("vm".into()),
                ..Spec::new(Duration::from_millis(2500))
            },
            &ctx(),
        )
        .await
        .unwrap();
    let f = b.facts();
    assert_eq!(f.isolation, "vm");
    assert_eq!(f.cpus, Some(4.0));
    assert_eq!(f.memory_mb, Some(8192));
    assert_eq!(f.disk_gb, Some(20));
    assert_eq!(f.snapshot.as_deref(), Some("big-vm"));
    let started = f.started_at_ms.expect("startedAt");
    assert!(started + 1000 >= t0, "{started} vs {t0}");
    // 2.5 s is three of the fake's minutes, rounded up as Daytona's unit makes it.
    let ends = f.ends_at_ms.expect("the end Daytona keeps");
    assert!(ends >= started + 2500 && ends <= started + 3500, "{ends} - {started}");
    let view = fake.sandboxes().into_iter().find(|s| s.id == b.id().name()).unwrap();
    assert_eq!(view.ttl_minutes, 3);
    assert_eq!(view.auto_stop, 0, "auto-stop is off");
    // Daytona ends it with no call from here.
    let outside = View::new(&fake.api_url(), KEY);
    let mut ended = false;
    for _ in 0..100 {
        if outside.ended(b.id()).await {
            ended = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ended, "the sandbox outlived its time to live");
    // `vm` from a container snapshot is refused, and the sandbox it made deleted.
    let e = p
        .create(
            &Spec {
                isolation: Some("vm".into()),
                ..spec()
            },
            &ctx(),
        )
        .await
        .map(|_| ())
        .expect_err("vm from a container snapshot");
    assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
    assert!(e.message().contains("linux-vm"), "{e}");
    assert_eq!(live(&fake), 0);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_box_archives_and_wakes_with_its_files() {
    let Some(fake) = fake("a_sleeping_box_archives_and_wakes_with_its_files", |_| {}).await else {
        return;
    };
    let dp = DaytonaProvider::new(options(&fake)).unwrap();
    let b = dp.create(&spec(), &ctx()).await.unwrap();
    b.upload("kept.txt", b"still here", &ctx()).await.unwrap();
    let e = dp
        .archive(b.id(), &ctx())
        .await
        .map(|_| ())
        .expect_err("a running box is not archived");
    assert_eq!(e.code(), ErrorCode::Refused, "{e}");
    dp.sleep(b.id(), &ctx()).await.unwrap();
    dp.archive(b.id(), &ctx()).await.unwrap();
    let view = fake.sandboxes().into_iter().find(|s| s.id == b.id().name()).unwrap();
    assert_eq!(view.state, "archived");
    let asleep = dp.attach(b.id(), &ctx()).await.unwrap().unwrap();
    assert_eq!(asleep.status(&ctx()).await.unwrap(), Status::Sleeping);
    let woken = dp.wake(b.id(), &ctx()).await.unwrap();
    assert_eq!(woken.download("kept.txt", 100, &ctx()).await.unwrap(), b"still here");
    woken.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

/// A volume the options name is made when missing, waited on until ready, and mounted in
/// every box: what one box writes there the next reads, after the first is gone, and this
/// machine sees it in the fake's volume directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boxes_mount_their_volume_made_when_missing() {
    let test = "boxes_mount_their_volume_made_when_missing";
    let Some(fake) = fake(test, |o| o.volume_lag = Duration::from_millis(700)).await else {
        return;
    };
    let mut o = options(&fake);
    o.volumes = vec![VolumeMount {
        name: "runs".into(),
        mount_path: "/runs".into(),
    }];
    let dp = DaytonaProvider::new(o.clone()).unwrap();
    let a = dp.create(&spec(), &ctx()).await.unwrap();
    let out = sh(&*a, "echo kept > /runs/note").await;
    assert_eq!(out.status.code, 0, "{}", out.stderr_text());
    a.destroy(&ctx()).await.unwrap();
    let b = dp.create(&spec(), &ctx()).await.unwrap();
    assert_eq!(sh(&*b, "cat /runs/note").await.stdout_text(), "kept\n");
    let dir = fake.volume_dir("runs").expect("the provider made the volume");
    assert_eq!(std::fs::read_to_string(dir.join("note")).unwrap(), "kept\n");
    b.destroy(&ctx()).await.unwrap();
    // A name Daytona would refuse is refused before any call.
    o.volumes[0].name = "../x".into();
    let e = DaytonaProvider::new(o).err().expect("a bad volume name is refused");
    assert!(
        e.message().contains("DaytonaOptions::volumes") && e.message().contains("../x"),
        "{e}"
    );
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_never_reaches_the_box() {
    let Some(fake) = fake("the_key_never_reaches_the_box", |_| {}).await else {
        return;
    };
    let mut o = options(&fake);
    o.runner = Some(runner());
    let p = provider(o);
    let b = p.create(&spec(), &ctx()).await.unwrap();
    let out = sh(&*b, "echo x").await;
    assert_eq!(out.stdout_text(), "x\n");
    assert!(b.facts().runner.is_some(), "the box is reached through its runner");
    // The runner's token, as the provider derives it from the key and the sandbox.
    let token: String = {
        use hmac::{Hmac, KeyInit, Mac};
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(KEY.as_bytes()).unwrap();
        mac.update(b"agentbox-runner:");
        mac.update(b.id().name().as_bytes());
        mac.finalize().into_bytes().iter().map(|x| format!("{x:02x}")).collect()
    };
    // Every process's argv and environment, and every file agentbox wrote in the box.
    let outside = View::new(&fake.api_url(), KEY);
    for secret in [KEY, token.as_str()] {
        let (_, found) = outside
            .run(
                b.id(),
                // A pattern that matches the secret without being it, so this grep does not
                // find itself.
                &format!(
                    "grep -l -a -r -s -E '{}[{}]' /proc/[0-9]*/cmdline /proc/[0-9]*/environ /tmp 2>/dev/null; echo done",
                    &secret[..secret.len() - 1],
                    &secret[secret.len() - 1..]
                ),
            )
            .await;
        assert_eq!(found.trim(), "done", "a secret is in the box: {found}");
    }
    b.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_wakes_a_sleeping_box_and_replaces_one_whose_maker_died() {
    let Some(fake) = fake("an_open_wakes_a_sleeping_box_and_replaces_one_whose_maker_died", |_| {}).await else {
        return;
    };
    let a = DaytonaProvider::new(options(&fake)).unwrap();
    let b = a.open("dev", &spec(), &ctx()).await.unwrap();
    b.upload("kept.txt", b"kept", &ctx()).await.unwrap();
    a.sleep(b.id(), &ctx()).await.unwrap();
    // Another host's open of the name wakes it, with its files.
    let other = provider(options(&fake));
    let woken = other.open("dev", &spec(), &ctx()).await.unwrap();
    assert_eq!(woken.id(), b.id());
    assert_eq!(woken.status(&ctx()).await.unwrap(), Status::Running);
    assert_eq!(sh(&*woken, "cat kept.txt").await.stdout_text(), "kept");
    // Its maker went away before it was whole: not ready, past the making deadline.
    let outside = View::new(&fake.api_url(), KEY);
    let mut labels = outside.read(b.id()).await.unwrap()["labels"].clone();
    labels.as_object_mut().unwrap().remove("agentbox.ready");
    labels["agentbox.making-until"] = serde_json::json!("1");
    outside.put_labels(b.id(), &labels).await;
    // Once the label index has it, a list leaves the half-made box out.
    let mut left_out = false;
    for _ in 0..50 {
        if other
            .list(&Labels::new(), &ctx())
            .await
            .unwrap()
            .iter()
            .all(|x| x.id() != b.id())
        {
            left_out = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(left_out, "a box that is not whole is not listed");
    let fresh = provider(options(&fake));
    let made = fresh.open("dev", &spec(), &ctx()).await.unwrap();
    assert_ne!(made.id(), b.id(), "the half-made box is replaced");
    assert_eq!(sh(&*made, "echo new").await.stdout_text(), "new\n");
    assert!(outside.ended(b.id()).await, "the half-made box is deleted");
    made.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_answer_is_lost_leaves_no_sandbox_behind() {
    let Some(fake) = fake("a_create_whose_answer_is_lost_leaves_no_sandbox_behind", |_| {}).await else {
        return;
    };
    let p = provider(options(&fake));
    // A gateway that timed out after Daytona made the sandbox: not sent again (a second
    // create would make a second sandbox), answered as the error it is.
    fake.fail_after_next_create(503).unwrap();
    let e = p.create(&spec(), &ctx()).await.map(|_| ()).expect_err("a 503");
    assert_eq!(e.code(), ErrorCode::Unknown, "{e}");
    assert!(e.message().contains("503"), "{e}");
    assert!(
        fake.sandboxes().len() <= 1,
        "the create was sent again: {:?}",
        fake.sandboxes()
    );
    // The sandbox it made anyway is found by its name and deleted.
    let mut gone = false;
    for _ in 0..100 {
        if live(&fake) == 0 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(gone, "the sandbox of the lost answer is left: {:?}", fake.sandboxes());
    fake.shutdown().await;
}

mod view {
    //! Daytona seen from outside the provider, shared by the fake's and the live suites.

    use agentbox_core::SandboxId;
    use agentbox_testing::conformance::Outside;
    use async_trait::async_trait;

    /// Daytona's sandboxes seen through its API directly, not through the provider: a box has
    /// ended when its sandbox is gone or not started; a pid is alive while `/proc/PID/stat` in the
    /// sandbox says so (a toolbox call of this view's own).
    pub(crate) struct View {
        http: reqwest::Client,
        api: String,
        key: String,
    }

    impl View {
        pub(crate) fn new(api: &str, key: &str) -> Self {
            // The provider brings its own TLS; a client of the test's needs a process default.
            let _ = rustls::crypto::ring::default_provider().install_default();
            View {
                http: reqwest::Client::builder().no_proxy().build().unwrap(),
                api: api.to_string(),
                key: key.to_string(),
            }
        }

        /// The sandbox as the API answers it; `None` where it answers 404.
        pub(crate) async fn read(&self, id: &SandboxId) -> Option<serde_json::Value> {
            let r = self
                .http
                .get(format!("{}/sandbox/{}", self.api, id.name()))
                .bearer_auth(&self.key)
                .send()
                .await
                .unwrap();
            if r.status() == 404 {
                return None;
            }
            Some(r.json().await.unwrap())
        }

        /// Replace the sandbox's labels, as another client of the API would.
        #[allow(dead_code)] // Only the fake's suite changes a box behind the provider's back.
        pub(crate) async fn put_labels(&self, id: &SandboxId, labels: &serde_json::Value) {
            let r = self
                .http
                .put(format!("{}/sandbox/{}/labels", self.api, id.name()))
                .bearer_auth(&self.key)
                .json(&serde_json::json!({ "labels": labels }))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success(), "{}", r.status());
        }

        /// Run `script` in the sandbox by the toolbox, as a client of the API would.
        pub(crate) async fn run(&self, id: &SandboxId, script: &str) -> (i64, String) {
            let v: serde_json::Value = self
                .http
                .get(format!("{}/sandbox/{}", self.api, id.name()))
                .bearer_auth(&self.key)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let tb = v["toolboxProxyUrl"].as_str().unwrap().to_string();
            let r: serde_json::Value = self
                .http
                .post(format!("{tb}/{}/process/execute", id.name()))
                .bearer_auth(&self.key)
                .json(&serde_json::json!({"command": script, "timeout": 30}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            (
                r["exitCode"].as_i64().unwrap_or(-1),
                r["result"].as_str().unwrap_or_default().to_string(),
            )
        }
    }

    #[async_trait]
    impl Outside for View {
        /// Gone, destroyed or being destroyed; a stopped (sleeping) sandbox has not ended.
        async fn ended(&self, id: &SandboxId) -> bool {
            match self.read(id).await {
                None => true,
                Some(v) => {
                    v["desiredState"] == "destroyed"
                        || matches!(
                            v["state"].as_str(),
                            Some("destroyed" | "destroying" | "error" | "build_failed")
                        )
                }
            }
        }

        async fn any_alive(&self, id: &SandboxId, pids: &[u32]) -> bool {
            if self.ended(id).await {
                return false;
            }
            for pid in pids {
                let (_, out) = self
                    .run(
                        id,
                        &format!("sed -n 's/.*) \\(.\\).*/\\1/p' /proc/{pid}/stat 2>/dev/null"),
                    )
                    .await;
                let state = out.trim();
                if !state.is_empty() && state != "Z" && state != "X" {
                    return true;
                }
            }
            false
        }
    }
}

mod judged {
    //! The judge: Daytona's own Python SDK (`daytona` 0.226.1), which nobody here wrote, against
    //! the fake Daytona. Where the SDK and the fake disagree, the fake is wrong. Besides the SDK's
    //! own walk, the judge makes every HTTP call the `daytona` provider makes, in the provider's
    //! request shapes, through the SDK or its generated clients (`tests/daytona_judge.py`), so
    //! the fake the provider is tested against answers those calls as Daytona's models read them.
    //! `scripts/judge-clients daytona` installs it; `scripts/test` exports the venv's python as
    //! `AGENTBOX_TEST_DAYTONA_PYTHON`.

    use std::path::Path;
    use std::time::Duration;

    use agentbox_fakes::daytona::{FakeDaytona, FakeDaytonaOptions};

    use agentbox_testing::judge;

    /// The judge's whole run, bounded.
    const JUDGE_TIMEOUT: Duration = Duration::from_secs(360);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_python_sdk_judges_the_fake() {
        let test = "the_python_sdk_judges_the_fake";
        let Some(py) = judge::python("daytona", test) else {
            return;
        };
        let Some(rootfs) = agentbox_testing::services::rootfs(test) else {
            return;
        };
        // The boxes' runner, and the server the judge starts in a box behind a preview URL.
        let runner = agentbox_testing::runner::ensure();
        let key = "judge-key-0123456789";
        let fake = FakeDaytona::start(FakeDaytonaOptions {
            rootfs: Some(rootfs.into()),
            api_key: key.into(),
            index_lag: Duration::from_millis(500),
            ..Default::default()
        })
        .await
        .expect("the fake starts");
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests")
            .join("daytona_judge.py");
        let mut command = tokio::process::Command::new(&py);
        command
            .arg(&script)
            .env("DAYTONA_API_URL", fake.api_url())
            .env("DAYTONA_API_KEY", key)
            .env("DAYTONA_USE_DEPRECATED_POLLING", "true")
            .env("NO_PROXY", "127.0.0.1")
            .env("JUDGE_RUNNER", &runner)
            .env_remove("DAYTONA_SERVER_URL")
            .env_remove("DAYTONA_JWT_TOKEN")
            .env_remove("DAYTONA_TARGET");
        let judged = judge::run(command, JUDGE_TIMEOUT, |line| {
            if line == "WAIT throttle" {
                // The SDK's urllib3 retries a GET answered 429 with Retry-After, three times
                // (`RemoteDisconnectedRetry(total=3)`): the fourth 429 reaches the SDK.
                fake.throttle(4);
            }
            if line == "WAIT fail-after-create" {
                fake.fail_after_next_create(503).expect("503 is an error status");
            }
        })
        .await;
        judged.assert_steps(&[
            "create",
            "dirs",
            "exec",
            "exec-timeout",
            "session-sync",
            "session-async-logs",
            "session-input-delete",
            "upload-download",
            "download-missing",
            "set-labels",
            "list-labels",
            "stop",
            "start",
            "archive",
            "rate-limit-429",
            "not-found-404",
            "delete",
            "volume-create",
            "volume-shared",
            "volume-delete",
            "p-create",
            "p-get",
            "p-list-pages",
            "p-labels",
            "p-ttl",
            "p-execute",
            "p-upload",
            "p-download",
            "p-session-exec",
            "p-preview",
            "p-session-delete",
            "p-stop",
            "p-start",
            "p-archive",
            "p-delete",
            "p-create-lost-answer",
        ]);
        assert!(
            fake.list_queries()
                .iter()
                .any(|q| q.as_deref() == Some(r#"{"run": "two"}"#)),
            "the SDK's labels query: {:?}",
            fake.list_queries()
        );
        // The provider's labels query, as serde_json writes it, reached the fake as sent.
        assert!(
            fake.list_queries()
                .iter()
                .any(|q| q.as_deref() == Some(r#"{"agentbox.provider":"daytona"}"#)),
            "the provider's labels query: {:?}",
            fake.list_queries()
        );
        assert!(fake.sandboxes().is_empty(), "the judge left {:?}", fake.sandboxes());
        fake.shutdown().await;
    }
}

mod live {
    //! Daytona boxes against the real Daytona: the conformance suite, only where `DAYTONA_API_KEY`
    //! is set (and `DAYTONA_API_URL`, `DAYTONA_TARGET`, `AGENTBOX_DAYTONA_SNAPSHOT` as the SDK and
    //! the provider read them; see docs/daytona.md). Without a key it says loudly that it did not
    //! run; CI has no key and runs the fake's suite (`tests/daytona.rs`). It makes real sandboxes,
    //! which cost money, and takes minutes: a lifetime is at least one of Daytona's minutes.

    use std::sync::Arc;
    use std::time::Duration;

    use agentbox_core::Provider;
    use agentbox_providers::daytona::{DaytonaOptions, DaytonaProvider};
    use agentbox_providers::helper::HelperCommand;
    use agentbox_testing::conformance::{self, Options};

    use super::view::View;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn daytona_boxes_on_the_real_daytona_pass_the_conformance_suite() {
        let mut opts = DaytonaOptions::from_env().expect("the Daytona variables read");
        let Some(key) = opts.api_key.clone() else {
            eprintln!(
                "\n!!!! daytona_boxes_on_the_real_daytona_pass_the_conformance_suite: DAYTONA_API_KEY unset: this test \
             did NOT run (it needs a Daytona account; see docs/daytona.md) !!!!\n"
            );
            return;
        };
        opts.runner = std::env::var_os("AGENTBOX_RUNNER").map(|p| HelperCommand {
            program: p.into(),
            args: Vec::new(),
        });
        let view = View::new(
            &opts.api_url,
            std::env::var("DAYTONA_API_KEY").as_deref().unwrap_or_default(),
        );
        drop(key);
        let make = opts.clone();
        let options = Options::new(
            "daytona-live",
            Duration::from_secs(70),
            Duration::from_secs(90),
            Arc::new(view),
        );
        let report = conformance::run(
            conformance::factory(move || {
                let o = make.clone();
                async move { Arc::new(DaytonaProvider::new(o).unwrap()) as Arc<dyn Provider> }
            }),
            options,
        )
        .await;
        report.assert_all_passed();
    }
}

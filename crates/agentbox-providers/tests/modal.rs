//! Modal boxes against the repository's fake Modal (`agentbox-fakes`), whose sandboxes really
//! run their programs in namespace boxes and whose API the `modal` Python SDK judges (in
//! `judged` below): the conformance suite, and each of the seed's Modal rules: the
//! refusals, the lifetime as Modal's timeout, GPU and FUSE read in the box, network and ports,
//! stdin's end and its chunks, output resumed from its offset, attach that never fails a live
//! sandbox, labels as tags, snapshots, and the token kept out of the box.
//!
//! All of Modal's proof is in this file: `view` reads Modal from outside the provider; the suites
//! at the top run on the fake; `judged` holds the fake to Modal's own Python SDK; `live` runs the
//! conformance suite on the real Modal, where `MODAL_TOKEN_ID` is set.

#![cfg(feature = "modal")]

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{
    Ctx, ErrorCode, ExecOptions, FinishOptions, Finished, Labels, Network, NetworkFact, PortFact, PortKind, PortSpec,
    Provider, Sandbox, Spec, Status, finish,
};
use agentbox_fakes::modal::{FakeModal, FakeModalOptions};
use agentbox_providers::modal::{ApiKey, ModalOptions, ModalProvider};
use agentbox_testing::conformance::{self, Options};
use agentbox_testing::services::rootfs;

use view::View;

/// The fake's token. Not a secret: the fake's own.
const TOKEN_ID: &str = "ak-agentbox-tests";
const TOKEN_SECRET: &str = "as-fake-secret-for-tests-0123456789";
/// The app the tests' boxes belong to.
const APP: &str = "agentbox-tests";

fn ctx() -> Ctx {
    Ctx::background().with_timeout(Duration::from_secs(120))
}

/// The fake Modal, its sandboxes on the test rootfs, set up by `setup`; `None` (after a loud
/// notice, or a panic under CI) where this machine has no rootfs.
async fn fake(test: &str, setup: impl FnOnce(&mut FakeModalOptions)) -> Option<FakeModal> {
    let rootfs = rootfs(test)?;
    let mut o = FakeModalOptions {
        rootfs: Some(rootfs.into()),
        token_id: TOKEN_ID.into(),
        token_secret: TOKEN_SECRET.into(),
        ..Default::default()
    };
    setup(&mut o);
    Some(FakeModal::start(o).await.expect("the fake Modal starts"))
}

fn options(fake: &FakeModal) -> ModalOptions {
    ModalOptions {
        server_url: fake.url(),
        token_id: Some(TOKEN_ID.into()),
        token_secret: Some(ApiKey::new(TOKEN_SECRET)),
        app: APP.into(),
        attach_pause: Duration::from_millis(50),
        ..Default::default()
    }
}

fn provider(fake: &FakeModal) -> Arc<dyn Provider> {
    Arc::new(ModalProvider::new(options(fake)).expect("the options are whole"))
}

fn view(fake: &FakeModal) -> View {
    View::new(&fake.url(), TOKEN_ID, TOKEN_SECRET)
}

fn spec() -> Spec {
    Spec::new(Duration::from_secs(600))
}

fn argv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

async fn sh(b: &dyn Sandbox, script: &str) -> agentbox_core::Result<Finished> {
    let p = b
        .exec(&argv(&["sh", "-c", script]), &ExecOptions::default(), &ctx())
        .await?;
    finish(p, FinishOptions::default()).await
}

fn calls(fake: &FakeModal, method: &str) -> usize {
    fake.requests().iter().filter(|c| c.method == method).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modal_boxes_pass_the_conformance_suite() {
    let Some(fake) = fake("modal_boxes_pass_the_conformance_suite", |_| {}).await else {
        return;
    };
    let o = options(&fake);
    let outside = Arc::new(view(&fake));
    let report = conformance::run(
        conformance::factory(move || {
            let o = o.clone();
            async move { Arc::new(ModalProvider::new(o).unwrap()) as Arc<dyn Provider> }
        }),
        Options::new("modal", Duration::from_secs(4), Duration::from_secs(10), outside),
    )
    .await;
    report.assert_all_passed();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_refusals_name_the_field_and_make_nothing() {
    let Some(fake) = fake("the_seeds_refusals_name_the_field_and_make_nothing", |_| {}).await else {
        return;
    };
    let p = provider(&fake);
    let with = |f: &dyn Fn(&mut Spec)| {
        let mut s = spec();
        f(&mut s);
        s
    };
    let cases: Vec<(&str, Spec, ErrorCode, &str)> = vec![
        (
            "isolation kata",
            with(&|s| s.isolation = Some("kata".into())),
            ErrorCode::Unsupported,
            "spec.isolation",
        ),
        (
            "gpu with vm",
            with(&|s| {
                s.gpu = Some("T4".into());
                s.isolation = Some("vm".into());
            }),
            ErrorCode::Invalid,
            "spec.gpu",
        ),
        (
            "fuse with gvisor",
            with(&|s| {
                s.capabilities = vec!["fuse".into()];
                s.isolation = Some("gvisor".into());
            }),
            ErrorCode::Unsupported,
            "spec.capabilities",
        ),
        (
            "fuse with a gpu",
            with(&|s| {
                s.capabilities = vec!["fuse".into()];
                s.gpu = Some("T4".into());
            }),
            ErrorCode::Invalid,
            "spec.gpu",
        ),
        (
            "a bad gpu count",
            with(&|s| s.gpu = Some("T4:x".into())),
            ErrorCode::Invalid,
            "spec.gpu",
        ),
        (
            "an empty allowlist",
            with(&|s| s.network = Some(Network::Allow(vec![]))),
            ErrorCode::Invalid,
            "spec.network",
        ),
        (
            "a malformed entry",
            with(&|s| s.network = Some(Network::Allow(vec!["not a host".into()]))),
            ErrorCode::Invalid,
            "spec.network",
        ),
        (
            "ports with network none",
            with(&|s| {
                s.network = Some(Network::None);
                s.ports = vec![PortSpec {
                    port: 8080,
                    kind: PortKind::Https,
                }];
            }),
            ErrorCode::Invalid,
            "spec.ports",
        ),
        (
            "the providers' namespace",
            with(&|s| {
                s.labels.insert("agentbox.x".into(), "1".into());
            }),
            ErrorCode::Invalid,
            "spec.labels",
        ),
        (
            "a label Modal cannot tag",
            with(&|s| {
                s.labels.insert("team".into(), "a b".into());
            }),
            ErrorCode::Invalid,
            "spec.labels.team",
        ),
        (
            "mounts",
            with(&|s| {
                s.mounts = vec![agentbox_core::Mount {
                    source: "/tmp".into(),
                    target: "/m".into(),
                    read_only: true,
                }]
            }),
            ErrorCode::Unsupported,
            "spec.mounts",
        ),
        (
            "an allowlist longer than the tags keep",
            with(&|s| {
                s.network = Some(Network::Allow(
                    (0..60).map(|i| format!("host{i}.example.com")).collect(),
                ))
            }),
            ErrorCode::Invalid,
            "spec.network.allow",
        ),
        (
            "a relative workspace",
            with(&|s| s.workspace = Some("ws".into())),
            ErrorCode::Invalid,
            "spec.workspace",
        ),
    ];
    for (what, s, code, field) in cases {
        let e = p
            .create(&s, &ctx())
            .await
            .err()
            .unwrap_or_else(|| panic!("{what}: made"));
        assert_eq!(e.code(), code, "{what}: {e}");
        assert!(e.message().contains(field), "{what}: {e} names {field}");
    }
    assert_eq!(calls(&fake, "SandboxCreate"), 0, "nothing was made");
    let e = p
        .create(&with(&|s| s.snapshot = Some("nope".into())), &ctx())
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), ErrorCode::NotFound, "{e}");
    assert_eq!(calls(&fake, "SandboxCreate"), 0);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lifetime_is_modals_timeout_rounded_up_and_capped_at_a_day() {
    let Some(fake) = fake("the_lifetime_is_modals_timeout", |_| {}).await else {
        return;
    };
    let p = provider(&fake);
    let v = view(&fake);
    let short = p
        .create(&Spec::new(Duration::from_millis(2_500)), &ctx())
        .await
        .unwrap();
    let long = p
        .create(&Spec::new(Duration::from_secs(3 * 24 * 3600)), &ctx())
        .await
        .unwrap();
    let app = v.app_id(APP).await;
    let timeout = |id: &str| {
        let (v, app, id) = (&v, &app, id.to_string());
        async move { v.info(app, &id).await.expect("listed").timeout_secs }
    };
    assert_eq!(timeout(short.id().name()).await, 3, "2.5 s is 3 whole seconds");
    assert_eq!(timeout(long.id().name()).await, 24 * 3600, "capped at 24 hours");
    let f = long.facts();
    let (start, end) = (f.started_at_ms.unwrap(), f.ends_at_ms.unwrap());
    assert_eq!(end - start, 24 * 3600 * 1000, "the facts say the capped end");
    // Modal ends it with no call from the host.
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while v.result(short.id().name()).await.is_none() {
        assert!(
            std::time::Instant::now() < until,
            "the fake Modal did not end the box at its timeout"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(short.status(&ctx()).await.unwrap(), Status::Ended);
    assert!(p.attach(short.id(), &ctx()).await.unwrap().is_none());
    long.destroy(&ctx()).await.unwrap();
    assert!(v.result(long.id().name()).await.is_some());
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_are_named_as_nvidia_smi_names_them_and_a_box_served_none_is_ended() {
    let Some(fake) = fake("gpus_are_named_as_nvidia_smi_names_them", |o| {
        o.gpus = vec![
            ("T4".into(), vec!["Tesla T4".into(), "Tesla T4".into()]),
            (
                "H100".into(),
                vec!["NVIDIA H200".into(), "NVIDIA A100".into(), "NVIDIA H200".into()],
            ),
        ];
    })
    .await
    else {
        return;
    };
    let p = provider(&fake);
    let gpu = |g: &str| Spec {
        gpu: Some(g.into()),
        ..spec()
    };
    let t4 = p.create(&gpu("T4:2"), &ctx()).await.unwrap();
    assert_eq!(
        t4.facts().gpu.as_deref(),
        Some("Tesla T4"),
        "identical cards are one name"
    );
    let mixed = p.create(&gpu("h100"), &ctx()).await.unwrap();
    assert_eq!(
        mixed.facts().gpu.as_deref(),
        Some("NVIDIA H200 + NVIDIA A100"),
        "each model in the order first seen"
    );
    let e = p.create(&gpu("A10G"), &ctx()).await.err().unwrap();
    assert!(e.message().contains("no GPU"), "{e}");
    let made = fake.sandboxes();
    assert_eq!(made.len(), 3);
    assert!(made[2].1, "the box served no GPU was ended");
    // Attach reads it again.
    let again = p.attach(mixed.id(), &ctx()).await.unwrap().unwrap();
    assert_eq!(again.facts().gpu, mixed.facts().gpu);
    let plain = p.create(&spec(), &ctx()).await.unwrap();
    assert_eq!(plain.facts().gpu, None);
    for b in [t4, mixed, plain] {
        b.destroy(&ctx()).await.unwrap();
    }
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuse_means_a_vm_whose_dev_fuse_root_opens_and_a_box_without_it_is_ended() {
    let Some(fake) = fake("fuse_means_a_vm", |o| o.fuse = true).await else {
        return;
    };
    let p = provider(&fake);
    let fuse = Spec {
        capabilities: vec!["fuse".into()],
        ..spec()
    };
    let b = p.create(&fuse, &ctx()).await.unwrap();
    assert_eq!(b.facts().isolation, "vm", "fuse implies a VM");
    assert_eq!(b.facts().fuse, Some(true));
    let plain = p.create(&spec(), &ctx()).await.unwrap();
    assert_eq!(plain.facts().fuse, Some(false), "gVisor has no /dev/fuse");
    assert_eq!(plain.facts().isolation, "gvisor");
    b.destroy(&ctx()).await.unwrap();
    plain.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;

    let Some(fake) = fake_without_fuse().await else {
        return;
    };
    let p = provider(&fake);
    // A VM asked for without FUSE: a VM whose FUSE reads false.
    let vm = p
        .create(
            &Spec {
                isolation: Some("vm".into()),
                ..spec()
            },
            &ctx(),
        )
        .await
        .unwrap();
    assert_eq!((vm.facts().isolation.as_str(), vm.facts().fuse), ("vm", Some(false)));
    vm.destroy(&ctx()).await.unwrap();
    let e = p.create(&fuse, &ctx()).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
    assert!(e.message().contains("/dev/fuse"), "{e}");
    assert!(fake.sandboxes()[1].1, "the box that failed the check was ended");
    fake.shutdown().await;
}

async fn fake_without_fuse() -> Option<FakeModal> {
    fake("fuse_means_a_vm_without", |o| o.fuse = false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn facts_read_in_the_box_name_the_network_ports_disk_ptrace_and_start() {
    let Some(fake) = fake("facts_read_in_the_box", |_| {}).await else {
        return;
    };
    let p = provider(&fake);
    let asked_at = agentbox_now_ms();
    let allow = vec![
        "api.example.com".to_string(),
        "*.example.org".into(),
        "10.0.0.0/8".into(),
    ];
    // The fake gives an allowlisted box no network at all (it cannot enforce a list), so the
    // ports are a box of their own.
    let listed = p
        .create(
            &Spec {
                network: Some(Network::Allow(allow.clone())),
                ..spec()
            },
            &ctx(),
        )
        .await
        .unwrap();
    assert_eq!(listed.facts().network, Some(NetworkFact::Allowlist(allow)));
    listed.destroy(&ctx()).await.unwrap();
    let s = Spec {
        ports: vec![
            PortSpec {
                port: 8080,
                kind: PortKind::Https,
            },
            PortSpec {
                port: 5432,
                kind: PortKind::Tcp,
            },
        ],
        cpus: Some(0.5),
        memory_mb: Some(1024),
        ..spec()
    };
    let b = p.create(&s, &ctx()).await.unwrap();
    let f = b.facts().clone();
    assert_eq!(f.network, Some(NetworkFact::Open));
    assert_eq!(
        f.ports,
        Some(vec![
            PortFact {
                port: 8080,
                kind: PortKind::Https
            },
            PortFact {
                port: 5432,
                kind: PortKind::Tcp
            }
        ])
    );
    assert_eq!((f.cpus, f.memory_mb), (Some(0.5), Some(1024)));
    assert!(f.disk_gb.is_some(), "the workspace's size: {f:?}");
    assert!(f.ptrace_scope.is_some(), "{f:?}");
    assert!(f.started_at_ms.unwrap() >= asked_at && f.started_at_ms.unwrap() <= agentbox_now_ms());
    assert_eq!(f.secrets_via.as_deref(), Some("fd"));
    assert!(f.live_processes);
    assert_eq!(f.workspace.as_deref(), Some("/workspace"));
    // Endpoints are Modal's tunnels: https for a bare port, a raw address for tcp.
    let https = b.endpoint(8080, &ctx()).await.unwrap();
    assert!(
        https.url.as_deref().is_some_and(|u| u.starts_with("https://")),
        "{https:?}"
    );
    let tcp = b.endpoint(5432, &ctx()).await.unwrap();
    assert_eq!(tcp.url, None);
    assert!(tcp.port > 0);
    let e = b.endpoint(9999, &ctx()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotFound, "{e}");
    assert!(
        !format!("{https:?}{tcp:?}").contains(b.id().name()),
        "never the sandbox's id"
    );

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
    assert_eq!(none.facts().ports, Some(vec![]));
    b.destroy(&ctx()).await.unwrap();
    none.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

fn agentbox_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_goes_in_512_kib_chunks_and_ends_explicitly_and_output_resumes_from_its_offset() {
    let Some(fake) = fake("stdin_goes_in_512_kib_chunks", |_| {}).await else {
        return;
    };
    let p = provider(&fake);
    let b = p.create(&spec(), &ctx()).await.unwrap();
    let data: Vec<u8> = (0..(1536 * 1024 + 7)).map(|i| (i * 7 % 256) as u8).collect();
    let before = calls(&fake, "TaskExecStdinWrite");
    let pr = b.exec(&argv(&["cat"]), &ExecOptions::default(), &ctx()).await.unwrap();
    let out = finish(
        pr,
        FinishOptions {
            stdin: data.clone(),
            max_output: 8 << 20,
        },
    )
    .await
    .unwrap();
    assert_eq!(out.stdout, data, "every byte value, through stdin and back");
    // 1.5 MiB and 7 bytes: four chunks, then the end on its own.
    assert_eq!(calls(&fake, "TaskExecStdinWrite") - before, 5);
    // An end with no byte written.
    let pr = b
        .exec(&argv(&["wc", "-c"]), &ExecOptions::default(), &ctx())
        .await
        .unwrap();
    let out = finish(pr, FinishOptions::default()).await.unwrap();
    assert_eq!(out.stdout_text().trim(), "0");

    // Streams that break part way: the output is read again from its offset, whole.
    fake.cut_stdio_after(100_000, 6);
    let out = sh(
        b.as_ref(),
        "head -c 1000000 /dev/zero | tr '\\0' x; head -c 300000 /dev/zero | tr '\\0' y >&2",
    )
    .await
    .unwrap();
    assert_eq!(out.stdout.len(), 1_000_000);
    assert!(out.stdout.iter().all(|&c| c == b'x'));
    assert_eq!(out.stderr.len(), 300_000);
    assert!(calls(&fake, "TaskExecStdioRead") >= 8, "the streams were opened again");
    b.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_hands_back_every_live_sandbox_falling_back_only_on_hardware() {
    let Some(fake) = fake("attach_hands_back_every_live_sandbox", |o| {
        o.gpus = vec![("T4".into(), vec!["Tesla T4".into()])];
    })
    .await
    else {
        return;
    };
    let p = provider(&fake);
    let b = p
        .create(
            &Spec {
                gpu: Some("T4".into()),
                network: Some(Network::None),
                ..spec()
            },
            &ctx(),
        )
        .await
        .unwrap();
    sh(b.as_ref(), "echo kept > /workspace/f").await.unwrap();
    // A fresh provider finds it, its facts read again.
    let p2 = provider(&fake);
    let a = p2.attach(b.id(), &ctx()).await.unwrap().unwrap();
    assert_eq!(a.facts().gpu.as_deref(), Some("Tesla T4"));
    assert_eq!(a.facts().network, Some(NetworkFact::None));
    assert!(a.facts().ptrace_scope.is_some());
    assert_eq!(
        sh(a.as_ref(), "cat /workspace/f").await.unwrap().stdout_text(),
        "kept\n"
    );

    // Every read fails: the hardware kept in the tags stands in, the security facts are
    // unknown, and the box is handed back all the same.
    fake.fail_next("TaskExecStart", tonic::Code::Internal, "scripted", 3);
    let a = p2
        .attach(b.id(), &ctx())
        .await
        .unwrap()
        .expect("a live sandbox is handed back");
    assert_eq!(a.facts().gpu.as_deref(), Some("Tesla T4"), "from the tag");
    assert_eq!(a.facts().fuse, Some(false));
    assert!(a.facts().disk_gb.is_some());
    assert_eq!(a.facts().ptrace_scope, None, "never from a tag");
    assert_eq!(a.facts().network, None, "never from a tag");
    assert_eq!(a.facts().ports, None, "never from a tag");
    // The workspace setup failing as well: an error, and the box runs on.
    fake.fail_next("TaskExecStart", tonic::Code::Internal, "scripted", 4);
    let e = p2
        .attach(b.id(), &ctx())
        .await
        .expect_err("no handle on a box whose workspace may be missing");
    assert!(e.message().contains("workspace"), "{e}");
    assert_eq!(
        b.status(&ctx()).await.unwrap(),
        Status::Running,
        "attach never ends a box"
    );

    // A box whose make kept no hardware (made before the tag existed): every read failing
    // is an error, never a guess; the box runs on.
    let v = view(&fake);
    let mut t = v.tags(b.id().name()).await;
    t.retain(|k, _| !k.starts_with("agentbox.hw"));
    v.set_tags(b.id().name(), &t).await;
    fake.fail_next("TaskExecStart", tonic::Code::Internal, "scripted", 3);
    let e = p2
        .attach(b.id(), &ctx())
        .await
        .expect_err("nothing measured to fall back on");
    assert!(e.message().contains("could not be read"), "{e}");
    assert_eq!(b.status(&ctx()).await.unwrap(), Status::Running);

    // A box ended behind the provider's back is `None`, and so is one that is not agentbox's.
    fake.end_sandbox(b.id().name());
    assert!(p2.attach(b.id(), &ctx()).await.unwrap().is_none());
    let e = p2.attach(&"docker:x".parse().unwrap(), &ctx()).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::Invalid);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_are_tags_found_by_list_across_pages_and_replaced_by_relabel() {
    let Some(fake) = fake("labels_are_tags", |o| o.list_page = 2).await else {
        return;
    };
    let p = provider(&fake);
    let mut ids = Vec::new();
    for i in 0..5 {
        let s = Spec {
            labels: Labels::from([("team".into(), if i % 2 == 0 { "a" } else { "b" }.into())]),
            ..spec()
        };
        ids.push(p.create(&s, &ctx()).await.unwrap());
    }
    let a = p
        .list(&Labels::from([("team".into(), "a".into())]), &ctx())
        .await
        .unwrap();
    let mut got: Vec<_> = a.iter().map(|b| b.id().clone()).collect();
    got.sort();
    let mut want: Vec<_> = ids.iter().step_by(2).map(|b| b.id().clone()).collect();
    want.sort();
    assert_eq!(got, want, "three boxes over pages of two");
    assert_eq!(p.list(&Labels::new(), &ctx()).await.unwrap().len(), 5);
    for b in &a {
        assert_eq!(
            b.labels(),
            &Labels::from([("team".into(), "a".into())]),
            "the provider's tags are not labels"
        );
    }
    let moved = p
        .relabel(ids[1].id(), &Labels::from([("team".into(), "a".into())]), &ctx())
        .await
        .unwrap();
    assert_eq!(moved.labels().get("team").map(String::as_str), Some("a"));
    assert_eq!(
        p.list(&Labels::from([("team".into(), "a".into())]), &ctx())
            .await
            .unwrap()
            .len(),
        4
    );
    let e = p
        .relabel(ids[1].id(), &Labels::from([("agentbox".into(), "2".into())]), &ctx())
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Invalid, "{e}");
    ids[0].destroy(&ctx()).await.unwrap();
    assert_eq!(
        p.list(&Labels::new(), &ctx()).await.unwrap().len(),
        4,
        "an ended box is not listed"
    );
    for b in &ids[1..] {
        b.destroy(&ctx()).await.unwrap();
    }
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_modal_filesystem_snapshots_named_in_the_app() {
    let Some(fake) = fake("snapshots_are_modal_filesystem_snapshots", |_| {}).await else {
        return;
    };
    let p = provider(&fake);
    let b = p.create(&spec(), &ctx()).await.unwrap();
    sh(b.as_ref(), "echo base > /workspace/w").await.unwrap();
    let s = p.snapshot(b.id(), "base", &ctx()).await.unwrap();
    assert!(!s.memory);
    let e = p.snapshot(b.id(), "base", &ctx()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Refused, "{e}");
    sh(b.as_ref(), "echo later >> /workspace/w").await.unwrap();
    // Another provider (another host) finds it by name.
    let p2 = provider(&fake);
    assert_eq!(
        p2.snapshots(&ctx())
            .await
            .unwrap()
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>(),
        ["base"]
    );
    let c = p2
        .create(
            &Spec {
                snapshot: Some("base".into()),
                ..spec()
            },
            &ctx(),
        )
        .await
        .unwrap();
    assert_eq!(c.facts().snapshot.as_deref(), Some("base"));
    assert_eq!(
        sh(c.as_ref(), "cat /workspace/w").await.unwrap().stdout_text(),
        "base\n"
    );
    assert!(p2.delete_snapshot("base", &ctx()).await.unwrap());
    assert!(!p2.delete_snapshot("base", &ctx()).await.unwrap());
    assert!(p.snapshots(&ctx()).await.unwrap().is_empty());
    assert_eq!(
        sh(c.as_ref(), "cat /workspace/w").await.unwrap().stdout_text(),
        "base\n",
        "its boxes are not touched"
    );
    b.destroy(&ctx()).await.unwrap();
    c.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdin_end_that_fails_is_what_wait_answers_while_the_program_runs() {
    let Some(fake) = fake("a_stdin_end_that_fails", |_| {}).await else {
        return;
    };
    let p = provider(&fake);
    let b = p.create(&spec(), &ctx()).await.unwrap();
    // `cat` waits for the end that does not arrive: wait says so rather than hang.
    let mut pr = b.exec(&argv(&["cat"]), &ExecOptions::default(), &ctx()).await.unwrap();
    fake.fail_next("TaskExecStdinWrite", tonic::Code::Internal, "scripted", 1);
    pr.stdin.take().unwrap().close().await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(30), pr.wait())
        .await
        .expect("wait answers")
        .unwrap_err();
    assert!(e.message().contains("closing the program's stdin"), "{e}");
    // A program that already exited: the failed end is nothing.
    let mut pr = b.exec(&argv(&["true"]), &ExecOptions::default(), &ctx()).await.unwrap();
    // (`true` ends at once; a second is long past its end.)
    tokio::time::sleep(Duration::from_secs(1)).await;
    fake.fail_next("TaskExecStdinWrite", tonic::Code::Internal, "scripted", 1);
    pr.stdin.take().unwrap().close().await.unwrap();
    assert_eq!(pr.wait().await.unwrap().code, 0);
    b.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_snapshots_restore_the_box_as_it_was_made_and_refuse_what_it_cannot_change() {
    let Some(fake) = fake("memory_snapshots_restore_the_box", |_| {}).await else {
        return;
    };
    let p: Arc<dyn Provider> = Arc::new(
        ModalProvider::new(ModalOptions {
            memory_snapshots: true,
            ..options(&fake)
        })
        .unwrap(),
    );
    let b = p
        .create(
            &Spec {
                isolation: Some("vm".into()),
                network: Some(Network::None),
                ..spec()
            },
            &ctx(),
        )
        .await
        .unwrap();
    sh(b.as_ref(), "echo in-memory > /workspace/m").await.unwrap();
    let s = p.snapshot(b.id(), "warm", &ctx()).await.unwrap();
    assert!(s.memory, "a memory snapshot");
    assert!(calls(&fake, "SandboxSnapshot") == 1 && calls(&fake, "SandboxSnapshotFs") == 0);
    assert!(
        p.snapshots(&ctx())
            .await
            .unwrap()
            .iter()
            .any(|s| s.name == "warm" && s.memory)
    );
    // It keeps its lifetime and what it was made with: ask anything else and it is refused.
    let e = p
        .create(
            &Spec {
                snapshot: Some("warm".into()),
                ..Spec::new(Duration::from_secs(60))
            },
            &ctx(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Invalid, "{e}");
    assert!(e.message().starts_with("spec.max_lifetime"), "{e}");
    let e = p
        .create(
            &Spec {
                snapshot: Some("warm".into()),
                cpus: Some(1.0),
                ..spec()
            },
            &ctx(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
    assert_eq!(calls(&fake, "SandboxRestore"), 0);
    let r = p
        .create(
            &Spec {
                snapshot: Some("warm".into()),
                labels: Labels::from([("team".into(), "a".into())]),
                ..spec()
            },
            &ctx(),
        )
        .await
        .unwrap();
    assert_eq!(calls(&fake, "SandboxRestore"), 1);
    assert_ne!(r.id(), b.id());
    assert_eq!(r.facts().snapshot.as_deref(), Some("warm"));
    assert_eq!(r.facts().isolation, "vm");
    assert_eq!(r.facts().network, None, "not kept with the snapshot: unknown");
    assert_eq!(r.labels().get("team").map(String::as_str), Some("a"));
    assert_eq!(
        sh(r.as_ref(), "cat /workspace/m").await.unwrap().stdout_text(),
        "in-memory\n"
    );
    assert!(p.delete_snapshot("warm", &ctx()).await.unwrap());
    assert!(p.snapshots(&ctx()).await.unwrap().is_empty());
    // A box made without them cannot take one: Modal refuses, and so does the provider.
    let plain = provider(&fake).create(&spec(), &ctx()).await.unwrap();
    let e = p.snapshot(plain.id(), "cold", &ctx()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Refused, "{e}");
    for x in [b, r, plain] {
        x.destroy(&ctx()).await.unwrap();
    }
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_stays_on_this_host() {
    let Some(fake) = fake("the_token_stays_on_this_host", |_| {}).await else {
        return;
    };
    let p = provider(&fake);
    let b = p
        .create(
            &Spec {
                env: [("VISIBLE".to_string(), "yes".to_string())].into(),
                ..spec()
            },
            &ctx(),
        )
        .await
        .unwrap();
    let out = sh(b.as_ref(), "env; cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n'")
        .await
        .unwrap();
    let seen = out.stdout_text() + &out.stderr_text();
    // Nor in a file the box can read: grep names any file that holds either.
    let script = format!("grep -rslF -e {TOKEN_SECRET} -e {TOKEN_ID} /workspace /root /tmp /etc 2>/dev/null; true");
    let files = sh(b.as_ref(), &script).await.unwrap();
    assert_eq!(files.stdout_text(), "", "files holding the token");
    assert!(seen.contains("VISIBLE=yes"), "the spec's env reaches the box: {seen}");
    assert!(!seen.contains(TOKEN_SECRET) && !seen.contains(TOKEN_ID), "{seen}");
    assert!(!format!("{:?}", b.facts()).contains(TOKEN_SECRET));
    // A wrong secret: the error names the variable's kind of failure, never the secret.
    let mut o = options(&fake);
    o.token_secret = Some(ApiKey::new("as-wrong-secret-0123"));
    let wrong = ModalProvider::new(o).unwrap();
    let e = wrong.create(&spec(), &ctx()).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::PermissionDenied, "{e}");
    assert!(
        !e.message().contains("as-wrong-secret") && !format!("{wrong:?}").contains("as-wrong-secret"),
        "{e}"
    );
    b.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

#[test]
fn a_provider_without_a_token_is_refused_naming_the_variables() {
    let e = ModalProvider::new(ModalOptions::default()).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Invalid);
    assert!(
        e.message().contains("MODAL_TOKEN_ID") && e.message().contains("MODAL_TOKEN_SECRET"),
        "{e}"
    );
}

mod view {
    //! Modal seen from outside the provider: Modal's own API called directly (the generated
    //! client of `agentbox-modal-proto`, never the provider's code), shared by the fake's and
    //! the live suites.

    use agentbox_core::SandboxId;
    use agentbox_modal_proto::client as pb;
    use agentbox_modal_proto::client::modal_client_client::ModalClientClient;
    use agentbox_modal_proto::task_command_router as tcr;
    use agentbox_modal_proto::task_command_router::task_command_router_client::TaskCommandRouterClient;
    use agentbox_testing::conformance::Outside;
    use async_trait::async_trait;
    use tonic::Request;
    use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

    /// A Modal client of the test's own.
    pub(crate) struct View {
        channel: Channel,
        token_id: String,
        token_secret: String,
    }

    impl View {
        pub(crate) fn new(server_url: &str, token_id: &str, token_secret: &str) -> Self {
            let mut e = Endpoint::from_shared(server_url.trim_end_matches('/').to_string()).unwrap();
            if server_url.starts_with("https://") {
                e = e.tls_config(ClientTlsConfig::new().with_native_roots()).unwrap();
            }
            View {
                channel: e.connect_lazy(),
                token_id: token_id.into(),
                token_secret: token_secret.into(),
            }
        }

        fn req<T>(&self, m: T) -> Request<T> {
            let mut r = Request::new(m);
            r.metadata_mut()
                .insert("x-modal-token-id", self.token_id.parse().unwrap());
            r.metadata_mut()
                .insert("x-modal-token-secret", self.token_secret.parse().unwrap());
            r.metadata_mut().insert("x-modal-client-type", "1".parse().unwrap());
            r.metadata_mut()
                .insert("x-modal-client-version", "1.6.4".parse().unwrap());
            r
        }

        fn client(&self) -> ModalClientClient<Channel> {
            ModalClientClient::new(self.channel.clone())
        }

        /// The sandbox's result, once it ended.
        pub(crate) async fn result(&self, sandbox_id: &str) -> Option<pb::GenericResult> {
            let w = self
                .client()
                .sandbox_wait(self.req(pb::SandboxWaitRequest {
                    sandbox_id: sandbox_id.into(),
                    timeout: 0.0,
                }))
                .await;
            match w {
                Ok(w) => w
                    .into_inner()
                    .result
                    .filter(|r| r.status != pb::generic_result::GenericStatus::Unspecified as i32),
                Err(s) if s.code() == tonic::Code::NotFound => Some(pb::GenericResult::default()),
                Err(s) => panic!("SandboxWait: {s}"),
            }
        }

        /// The sandbox's tags.
        #[allow(dead_code)] // Only the fake's suite changes a box's tags behind the provider.
        pub(crate) async fn tags(&self, sandbox_id: &str) -> std::collections::BTreeMap<String, String> {
            let r = self
                .client()
                .sandbox_tags_get(self.req(pb::SandboxTagsGetRequest {
                    sandbox_id: sandbox_id.into(),
                }))
                .await
                .unwrap()
                .into_inner();
            r.tags.into_iter().map(|t| (t.tag_name, t.tag_value)).collect()
        }

        /// Replace the sandbox's tags.
        #[allow(dead_code)] // Only the fake's suite changes a box's tags behind the provider.
        pub(crate) async fn set_tags(&self, sandbox_id: &str, tags: &std::collections::BTreeMap<String, String>) {
            self.client()
                .sandbox_tags_set(
                    self.req(pb::SandboxTagsSetRequest {
                        sandbox_id: sandbox_id.into(),
                        tags: tags
                            .iter()
                            .map(|(k, v)| pb::SandboxTag {
                                tag_name: k.clone(),
                                tag_value: v.clone(),
                            })
                            .collect(),
                        ..Default::default()
                    }),
                )
                .await
                .unwrap();
        }

        #[allow(dead_code)] // Only the fake's suite reads a sandbox's listing.
        /// The sandbox as Modal lists it (its timeout, tags…), if it is in `app_id`.
        pub(crate) async fn info(&self, app_id: &str, sandbox_id: &str) -> Option<pb::SandboxInfo> {
            let r = self
                .client()
                .sandbox_list(self.req(pb::SandboxListRequest {
                    app_id: app_id.into(),
                    include_finished: true,
                    ..Default::default()
                }))
                .await
                .unwrap()
                .into_inner();
            r.sandboxes.into_iter().find(|s| s.id == sandbox_id)
        }

        #[allow(dead_code)] // Only the fake's suite reads a sandbox's listing.
        /// The app's id by name (looked up, never made).
        pub(crate) async fn app_id(&self, name: &str) -> String {
            self.client()
                .app_get_or_create(self.req(pb::AppGetOrCreateRequest {
                    app_name: name.into(),
                    object_creation_type: pb::ObjectCreationType::Unspecified as i32,
                    ..Default::default()
                }))
                .await
                .unwrap()
                .into_inner()
                .app_id
        }

        /// Run `sh -c script` in the sandbox through its command router; its exit code.
        pub(crate) async fn sh(&self, sandbox_id: &str, script: &str, args: &[String]) -> Result<i32, tonic::Status> {
            let task_id = self
                .client()
                .sandbox_get_task_id(self.req(pb::SandboxGetTaskIdRequest {
                    sandbox_id: sandbox_id.into(),
                    timeout: Some(10.0),
                    wait_until_ready: false,
                }))
                .await?
                .into_inner()
                .task_id
                .unwrap_or_default();
            let access = self
                .client()
                .task_get_command_router_access(self.req(pb::TaskGetCommandRouterAccessRequest {
                    task_id: task_id.clone(),
                }))
                .await?
                .into_inner();
            let mut e = Endpoint::from_shared(access.url.clone()).unwrap();
            if access.url.starts_with("https://") {
                e = e.tls_config(ClientTlsConfig::new().with_native_roots()).unwrap();
            }
            let mut router = TaskCommandRouterClient::new(e.connect_lazy());
            let bearer: tonic::metadata::AsciiMetadataValue = format!("Bearer {}", access.jwt).parse().unwrap();
            fn with<T>(bearer: &tonic::metadata::AsciiMetadataValue, m: T) -> Request<T> {
                let mut r = Request::new(m);
                r.metadata_mut().insert("authorization", bearer.clone());
                r
            }
            static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let exec_id = format!(
                "view-{}-{}",
                std::process::id(),
                N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            );
            let mut command_args = vec!["sh".to_string(), "-c".into(), script.into(), "view".into()];
            command_args.extend(args.iter().cloned());
            router
                .task_exec_start(with(
                    &bearer,
                    tcr::TaskExecStartRequest {
                        task_id: task_id.clone(),
                        exec_id: exec_id.clone(),
                        command_args,
                        stdout_config: tcr::TaskExecStdoutConfig::Devnull as i32,
                        stderr_config: tcr::TaskExecStderrConfig::Devnull as i32,
                        ..Default::default()
                    },
                ))
                .await
                .unwrap();
            router
                .task_exec_stdin_write(with(
                    &bearer,
                    tcr::TaskExecStdinWriteRequest {
                        task_id: task_id.clone(),
                        exec_id: exec_id.clone(),
                        offset: 0,
                        data: vec![],
                        eof: true,
                    },
                ))
                .await
                .unwrap();
            let w = router
                .task_exec_wait(with(&bearer, tcr::TaskExecWaitRequest { task_id, exec_id }))
                .await?
                .into_inner();
            Ok(match w.exit_status {
                Some(tcr::task_exec_wait_response::ExitStatus::Code(c)) => c,
                Some(tcr::task_exec_wait_response::ExitStatus::Signal(s)) => 128 + s,
                None => panic!("TaskExecWait answered no exit"),
            })
        }
    }

    /// Whether any of `pids` runs and is not a zombie: exits 0 when one does.
    const ANY_ALIVE: &str = r#"for p; do
  st=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -c1)
  [ -n "$st" ] && [ "$st" != Z ] && exit 0
done
exit 1"#;

    #[async_trait]
    impl Outside for View {
        async fn ended(&self, id: &SandboxId) -> bool {
            self.result(id.name()).await.is_some()
        }

        async fn any_alive(&self, id: &SandboxId, pids: &[u32]) -> bool {
            if self.ended(id).await {
                return false;
            }
            let args: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
            // A sandbox that ended under the question runs nothing.
            self.sh(id.name(), ANY_ALIVE, &args).await.is_ok_and(|c| c == 0)
        }
    }
}

mod judged {
    //! The judge: Modal's own Python SDK (`modal` 1.6.x), which nobody here wrote, against the
    //! fake Modal. Where they disagree, the fake is wrong. The SDK looks up an app (and a missing
    //! one), sets its tags, makes sandboxes (env, blocked network, ports, a GPU, runtime `vm` with FUSE, a short timeout,
    //! an entrypoint that exits), execs in them (output and exit code, stdin, a few MiB of output,
    //! a read cut part way that it resumes, a program not found, poll, an exec timeout), sets and
    //! lists tags (paging past the fake's small page), snapshots a filesystem both ways and starts
    //! from it, reads tunnels, terminates, meets a sandbox ended behind its back and a wrong token
    //! (`tests/modal_judge.py`). `scripts/judge-clients modal` installs the SDK; `scripts/test` exports
    //! the venv's python as `AGENTBOX_TEST_MODAL_PYTHON`.

    use std::path::Path;
    use std::time::Duration;

    use agentbox_fakes::modal::{FakeModal, FakeModalOptions};
    use agentbox_testing::judge;

    /// The judge's whole run, bounded.
    const JUDGE_TIMEOUT: Duration = Duration::from_secs(600);
    /// The fake's page for the judge: the SDK pages past it.
    const LIST_PAGE: usize = 3;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_python_sdk_judges_the_fake() {
        let test = "the_python_sdk_judges_the_fake";
        let Some(py) = judge::python("modal", test) else {
            return;
        };
        agentbox_testing::runner::ensure();
        let (token_id, secret) = ("ak-judge0123", "as-judge-secret-0123456789");
        let fake = FakeModal::start(FakeModalOptions {
            token_id: token_id.into(),
            token_secret: secret.into(),
            rootfs: std::env::var_os("AGENTBOX_TEST_ROOTFS").map(Into::into),
            gpus: vec![("T4".into(), vec!["Tesla T4".into()])],
            list_page: LIST_PAGE,
            fuse: true,
            ..Default::default()
        })
        .await
        .expect("the fake starts");
        let dir = tempfile::tempdir().expect("a temp dir");
        let config = dir.path().join("modal.toml");
        std::fs::write(&config, "").expect("an empty config");
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests")
            .join("modal_judge.py");
        let mut command = tokio::process::Command::new(&py);
        command
            .arg(&script)
            .env("MODAL_SERVER_URL", fake.url())
            .env("MODAL_TOKEN_ID", token_id)
            .env("MODAL_TOKEN_SECRET", secret)
            .env("MODAL_CONFIG_PATH", &config)
            .env("MODAL_SANDBOX_V2", "0")
            .env("JUDGE_LIST_PAGE", LIST_PAGE.to_string())
            .env("HOME", dir.path())
            .env("NO_PROXY", "127.0.0.1")
            .env_remove("MODAL_PROFILE")
            .env_remove("MODAL_ENVIRONMENT")
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .env_remove("ALL_PROXY");
        let judged = judge::run(command, JUDGE_TIMEOUT, |line| {
            if line.starts_with("WAIT cut ") {
                // Two reads cut part way: the SDK resumes each from the offset it reached.
                fake.cut_stdio_after(65_536, 2);
            } else if let Some(id) = line.strip_prefix("WAIT end ") {
                assert!(fake.end_sandbox(id), "the sandbox to end runs");
            }
        })
        .await;
        judged.assert_steps(&[
            "app-lookup",
            "app-tags",
            "create",
            "exec",
            "env",
            "exec-env",
            "stdin",
            "large-output",
            "stdio-resume",
            "not-found",
            "exec-poll-timeout",
            "block-network",
            "tags",
            "list-tags",
            "list-paging",
            "snapshot-sdk",
            "snapshot-legacy",
            "snapshot-memory",
            "tunnels",
            "gpu",
            "fuse",
            "timeout",
            "entrypoint-exit",
            "terminate",
            "ended",
            "bad-token",
        ]);
        let log = fake.requests();
        let reads = log.iter().filter(|c| c.method == "TaskExecStdioRead").count();
        assert!(reads >= 4, "the SDK's stdio reads: {reads}");
        assert!(
            log.iter().any(|c| c.method == "SandboxList"),
            "the SDK listed sandboxes"
        );
        assert!(
            !log.iter().any(|c| format!("{c:?}").contains(secret)),
            "the secret was recorded"
        );
        let all = fake.sandboxes();
        assert!(all.len() > LIST_PAGE + 5, "sandboxes made: {}", all.len());
        fake.shutdown().await;
    }
}

mod live {
    //! Modal boxes against the real Modal: the conformance suite, and a VM with FUSE, only where
    //! `MODAL_TOKEN_ID` and `MODAL_TOKEN_SECRET` are set (see docs/modal.md). Without them it
    //! says loudly that it did not run; CI has no token and runs the fake's suite
    //! (`tests/modal.rs`). Its boxes belong to an app of its own (`agentbox-live-PID`, or
    //! `AGENTBOX_MODAL_APP`), and the suite checks that none is left running. Sandboxes are billed
    //! by the second.

    use std::sync::Arc;
    use std::time::Duration;

    use agentbox_core::{Ctx, Labels, Provider, Spec};
    use agentbox_providers::modal::{ModalOptions, ModalProvider};
    use agentbox_testing::conformance::{self, Options};

    use super::view::View;

    /// The options from the environment, or `None` (said loudly) where there is no token.
    fn live(test: &str) -> Option<ModalOptions> {
        if std::env::var("MODAL_TOKEN_ID").is_err() || std::env::var("MODAL_TOKEN_SECRET").is_err() {
            eprintln!(
                "\n!!!! {test}: MODAL_TOKEN_ID or MODAL_TOKEN_SECRET unset: this test did NOT run (it needs a Modal \
             account; see docs/modal.md) !!!!\n"
            );
            return None;
        }
        let mut o = ModalOptions::from_env().expect("the Modal variables read");
        if std::env::var("AGENTBOX_MODAL_APP").is_err() {
            o.app = format!("agentbox-live-{}", std::process::id());
        }
        Some(o)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn modal_boxes_on_the_real_modal_pass_the_conformance_suite() {
        let Some(o) = live("modal_boxes_on_the_real_modal_pass_the_conformance_suite") else {
            return;
        };
        let view = View::new(
            &o.server_url,
            o.token_id.as_deref().unwrap(),
            &std::env::var("MODAL_TOKEN_SECRET").unwrap(),
        );
        let make = o.clone();
        let report = conformance::run(
            conformance::factory(move || {
                let o = make.clone();
                async move { Arc::new(ModalProvider::new(o).unwrap()) as Arc<dyn Provider> }
            }),
            Options::new(
                "modal-live",
                Duration::from_secs(20),
                Duration::from_secs(60),
                Arc::new(view),
            ),
        )
        .await;
        // Whatever the report, nothing of the suite's is left running.
        let p = ModalProvider::new(o).unwrap();
        let ctx = Ctx::background().with_timeout(Duration::from_secs(120));
        for b in p.list(&Labels::new(), &ctx).await.expect("listing the suite's app") {
            eprintln!("modal live suite: ending {} left running", b.id());
            let _ = b.destroy(&ctx).await;
        }
        report.assert_all_passed();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_vm_with_fuse_on_the_real_modal_reads_its_facts_in_the_box() {
        let Some(o) = live("a_vm_with_fuse_on_the_real_modal_reads_its_facts_in_the_box") else {
            return;
        };
        let p = ModalProvider::new(o).unwrap();
        let ctx = Ctx::background().with_timeout(Duration::from_secs(300));
        let spec = Spec {
            capabilities: vec!["fuse".into()],
            ..Spec::new(Duration::from_secs(120))
        };
        let b = p.create(&spec, &ctx).await.expect("a VM with FUSE");
        let f = b.facts().clone();
        b.destroy(&ctx).await.unwrap();
        assert_eq!(f.isolation, "vm");
        assert_eq!(f.fuse, Some(true));
        assert!(f.ptrace_scope.is_some(), "{f:?}");
        assert!(f.started_at_ms.is_some(), "{f:?}");
    }
}

/// An answer a proxy or a broken network spoils (a message that is not protobuf, one cut in
/// half, an HTTP 502 with no gRPC status) is a typed error naming the call, never a panic or a
/// box the caller cannot see; the next call, the fault gone, works.
#[tokio::test]
async fn spoiled_grpc_answers_are_typed_errors() {
    use agentbox_fakes::faults::{Fault, Faults, Rule};
    let faults = Faults::new(1);
    let f = faults.clone();
    let Some(fake) = fake("spoiled_grpc_answers_are_typed_errors", |o| o.faults = Some(f)).await else {
        return;
    };
    let p = provider(&fake);
    let create = "/modal.client.ModalClient/SandboxCreate";
    for fault in [Fault::Malformed, Fault::Truncate, Fault::Drop, Fault::Status(502)] {
        faults.add(Rule::on("POST", create, fault.clone()).times(8));
        let before = faults.injected();
        let err = match p.create(&spec(), &ctx()).await {
            Ok(_) => panic!("{fault:?}: a create through a spoiled answer succeeded"),
            Err(e) => e,
        };
        assert!(faults.injected() > before, "{fault:?} was met");
        let text = err.to_string();
        assert!(
            text.contains("SandboxCreate") || text.contains("sandbox"),
            "{fault:?}: {text}"
        );
        faults.clear();
    }
    let b = p.create(&spec(), &ctx()).await.expect("the next create works");
    assert_eq!(sh(&*b, "echo ok").await.unwrap().stdout_text(), "ok\n");
    b.destroy(&ctx()).await.unwrap();
}

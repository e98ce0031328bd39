//! E2B boxes against the repository's fake E2B (`agentbox-fakes`), whose sandboxes really run
//! their programs in namespace boxes and whose API the `e2b` Python SDK judges (the fake's own
//! tests): the conformance suite (with sleep and wake as pause and resume, extend as E2B's
//! timeout), and the rules: a sandbox that dies mid-command is a typed error within the
//! idle deadline, a silent stream too, a caller that gives up kills the program in the box, the
//! network E2B read back, the plan's longest timeout, refusals, the key kept out of the box.

#![cfg(feature = "e2b")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentbox_core::{
    Ctx, ErrorCode, ExecOptions, FinishOptions, Finished, Network, NetworkFact, Provider, Sandbox, Spec, finish,
};
use agentbox_fakes::e2b::{FakeE2B, FakeE2BOptions};
use agentbox_providers::e2b::{ApiKey, E2bOptions, E2bProvider};
use agentbox_providers::helper::HelperCommand;
use agentbox_testing::conformance::{self, Options};
use agentbox_testing::services::rootfs;

#[path = "common/e2b_view.rs"]
mod e2b_view;
use e2b_view::View;

/// The fake's key. Not a secret: the fake's own.
const KEY: &str = "e2b_fake_key_for_tests_0123456789";

fn ctx() -> Ctx {
    Ctx::background().with_timeout(Duration::from_secs(120))
}

async fn fake(test: &str, setup: impl FnOnce(&mut FakeE2BOptions)) -> Option<FakeE2B> {
    let rootfs = rootfs(test)?;
    let mut o = FakeE2BOptions {
        rootfs: Some(rootfs.into()),
        api_key: KEY.into(),
        keepalive: Duration::from_secs(1),
        ..Default::default()
    };
    setup(&mut o);
    Some(FakeE2B::start(o).await.expect("the fake E2B starts"))
}

fn options(fake: &FakeE2B) -> E2bOptions {
    E2bOptions {
        api_url: fake.url(),
        sandbox_url: Some(fake.url()),
        api_key: Some(ApiKey::new(KEY)),
        // The fake's sandboxes write /workspace, /root and /tmp alone.
        workspace: "/workspace".into(),
        keepalive: Duration::from_secs(1),
        ..Default::default()
    }
}

fn provider(fake: &FakeE2B) -> Arc<dyn Provider> {
    Arc::new(E2bProvider::new(options(fake)).expect("the options are whole"))
}

fn view(fake: &FakeE2B) -> View {
    View::new(&fake.url(), Some(&fake.url()), "e2b.app", KEY)
}

fn spec() -> Spec {
    Spec::new(Duration::from_secs(600))
}

async fn sh(b: &dyn Sandbox, script: &str, ctx: &Ctx) -> agentbox_core::Result<Finished> {
    let argv = ["sh", "-c", script].map(String::from);
    let p = b.exec(&argv, &ExecOptions::default(), ctx).await?;
    finish(p, FinishOptions::default()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_boxes_pass_the_conformance_suite() {
    let Some(fake) = fake("e2b_boxes_pass_the_conformance_suite", |_| {}).await else {
        return;
    };
    let o = options(&fake);
    let report = conformance::run(
        conformance::factory(move || {
            let o = o.clone();
            async move { Arc::new(E2bProvider::new(o).unwrap()) as Arc<dyn Provider> }
        }),
        Options::new(
            "e2b",
            Duration::from_secs(4),
            Duration::from_secs(10),
            Arc::new(view(&fake)),
        ),
    )
    .await;
    report.assert_all_passed();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_that_dies_mid_command_is_an_error_within_the_idle_deadline_never_a_hang() {
    let Some(fake) = fake("a_sandbox_that_dies_mid_command", |_| {}).await else {
        return;
    };
    let p = provider(&fake);
    let b = p.create(&spec(), &ctx()).await.unwrap();
    let t = Instant::now();
    let run = {
        let b = b.clone();
        tokio::spawn(async move { sh(b.as_ref(), "sleep 60", &ctx()).await })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(fake.vanish(b.id().name()));
    let e = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("an answer, not a hang")
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Gone, "{e}");
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());

    // A stream that goes silent (no output, no keepalive): a timeout after three keepalives.
    let b = p.create(&spec(), &ctx()).await.unwrap();
    let run = {
        let b = b.clone();
        tokio::spawn(async move { sh(b.as_ref(), "sleep 60", &ctx()).await })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    fake.silence_keepalives(true);
    let t = Instant::now();
    let e = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("an answer, not a hang")
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Timeout, "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    fake.silence_keepalives(false);
    b.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_gives_up_kills_the_program_in_the_box() {
    let Some(fake) = fake("a_caller_that_gives_up_kills_the_program", |_| {}).await else {
        return;
    };
    let p = provider(&fake);
    let b = p.create(&spec(), &ctx()).await.unwrap();
    let short = Ctx::background().with_timeout(Duration::from_secs(1));
    let e = sh(b.as_ref(), "echo $$ > /tmp/pid; exec sleep 60", &short)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Timeout, "{e}");
    let pid = sh(b.as_ref(), "cat /tmp/pid", &ctx()).await.unwrap().stdout_text();
    let v = view(&fake);
    let until = Instant::now() + Duration::from_secs(10);
    while v
        .sh(b.id().name(), "kill -0 \"$1\" 2>/dev/null", &[pid.trim().to_string()])
        .await
        == Some(0)
    {
        assert!(Instant::now() < until, "the program runs on in the box");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_facts_are_what_e2b_read_back_and_the_lifetime_is_capped_by_the_plan() {
    let Some(fake) = fake("network_facts_are_what_e2b_read_back", |_| {}).await else {
        return;
    };
    let p = provider(&fake);
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
    let open = p.create(&spec(), &ctx()).await.unwrap();
    assert_ne!(open.facts().network, Some(NetworkFact::None));
    let allow = vec!["api.example.com".to_string(), "10.0.0.0/8".into()];
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
    assert_eq!(
        listed.facts().network,
        Some(NetworkFact::Allowlist(allow)),
        "as E2B read it back"
    );
    listed.destroy(&ctx()).await.unwrap();
    // Three days asked, the plan's hour given: the facts say E2B's end.
    let long = p
        .create(&Spec::new(Duration::from_secs(3 * 24 * 3600)), &ctx())
        .await
        .unwrap();
    let f = long.facts();
    let life = f.ends_at_ms.unwrap() - f.started_at_ms.unwrap();
    assert!((3_590_000..=3_610_000).contains(&life), "{life} ms");
    assert_eq!(f.isolation, "vm");
    // An extend past the plan is refused before any call.
    let e = p
        .extend(long.id(), f.started_at_ms.unwrap() + 2 * 3_600_000, &ctx())
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Invalid, "{e}");
    for b in [none, open, long] {
        b.destroy(&ctx()).await.unwrap();
    }
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_name_the_field_and_the_key_stays_on_this_host() {
    let Some(fake) = fake("refusals_and_the_key", |_| {}).await else {
        return;
    };
    let p = provider(&fake);
    for (what, s, code) in [
        (
            "gpu",
            Spec {
                gpu: Some("T4".into()),
                ..spec()
            },
            ErrorCode::Unsupported,
        ),
        (
            "isolation",
            Spec {
                isolation: Some("gvisor".into()),
                ..spec()
            },
            ErrorCode::Unsupported,
        ),
        (
            "the providers' namespace",
            Spec {
                labels: [("agentbox.x".to_string(), "1".to_string())].into(),
                ..spec()
            },
            ErrorCode::Invalid,
        ),
    ] {
        let e = p
            .create(&s, &ctx())
            .await
            .err()
            .unwrap_or_else(|| panic!("{what}: made"));
        assert_eq!(e.code(), code, "{what}: {e}");
    }
    assert!(fake.sandboxes().is_empty(), "nothing was made");
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
    let out = sh(b.as_ref(), "env", &ctx()).await.unwrap().stdout_text();
    assert!(out.contains("VISIBLE=yes"), "{out}");
    assert!(!out.contains(KEY), "{out}");
    let files = sh(
        b.as_ref(),
        &format!("grep -rslF -e {KEY} /workspace /root /tmp /etc 2>/dev/null; true"),
        &ctx(),
    )
    .await
    .unwrap();
    assert_eq!(files.stdout_text(), "");
    let mut o = options(&fake);
    o.api_key = Some(ApiKey::new("e2b_wrong_key_0123"));
    let e = E2bProvider::new(o)
        .unwrap()
        .create(&spec(), &ctx())
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), ErrorCode::PermissionDenied, "{e}");
    assert!(!e.message().contains("e2b_wrong_key"), "{e}");
    b.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_with_any_text_are_found_and_listed_boxes_run_programs() {
    let Some(fake) = fake("labels_with_any_text_are_found", |o| o.list_page_max = 1).await else {
        return;
    };
    let p = provider(&fake);
    let odd: agentbox_core::Labels = [("team".to_string(), "a&b=c+% d".to_string())].into();
    let b = p
        .create(
            &Spec {
                labels: odd.clone(),
                ..spec()
            },
            &ctx(),
        )
        .await
        .unwrap();
    let other = p.create(&spec(), &ctx()).await.unwrap();
    let found = p.list(&odd, &ctx()).await.unwrap();
    assert_eq!(
        found.iter().map(|b| b.id().clone()).collect::<Vec<_>>(),
        vec![b.id().clone()]
    );
    // A listed box is whole: envd's token, the network read back.
    assert_eq!(
        sh(found[0].as_ref(), "echo hi", &ctx()).await.unwrap().stdout_text(),
        "hi\n"
    );
    assert!(found[0].facts().network.is_some());
    assert_eq!(
        p.list(&agentbox_core::Labels::new(), &ctx()).await.unwrap().len(),
        2,
        "over pages of one"
    );
    // A sleeping box refuses files as it refuses programs.
    p.sleep(b.id(), &ctx()).await.unwrap();
    let e = b.upload("f", b"x", &ctx()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Refused, "{e}");
    let e = b.download("f", 10, &ctx()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Refused, "{e}");
    // An empty file moves too.
    other.upload("empty", b"", &ctx()).await.unwrap();
    assert_eq!(other.download("empty", 10, &ctx()).await.unwrap(), b"");
    b.destroy(&ctx()).await.unwrap();
    other.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
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

fn with_runner(fake_url: &str) -> E2bOptions {
    E2bOptions {
        api_url: fake_url.into(),
        sandbox_url: Some(fake_url.into()),
        api_key: Some(ApiKey::new(KEY)),
        workspace: "/workspace".into(),
        keepalive: Duration::from_secs(1),
        runner: Some(runner()),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_boxes_with_the_runner_pass_the_conformance_suite() {
    let Some(fake) = fake("e2b_boxes_with_the_runner_pass_the_conformance_suite", |_| {}).await else {
        return;
    };
    let o = with_runner(&fake.url());
    let report = conformance::run(
        conformance::factory(move || {
            let o = o.clone();
            async move { Arc::new(E2bProvider::new(o).unwrap()) as Arc<dyn Provider> }
        }),
        Options::new(
            "e2b",
            Duration::from_secs(4),
            Duration::from_secs(10),
            Arc::new(view(&fake)),
        ),
    )
    .await;
    report.assert_all_passed();
    fake.shutdown().await;
}

/// The variable that tells the child host process of `outlive_the_host` the fake's address.
const FAKE_URL_ENV: &str = "AGENTBOX_TEST_E2B_FAKE_URL";

/// Terminals, late readers and processes that outlive the host process that started them (a
/// second host attaches to them by handle), in E2B boxes through their runner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_runner_boxes_keep_their_processes() {
    let name = "e2b_runner_boxes_keep_their_processes";
    if agentbox_testing::reexec::part().is_some() {
        // The child host process: the parent's fake, a provider of its own.
        let url = std::env::var(FAKE_URL_ENV).expect("the parent names its fake");
        let p: Arc<dyn Provider> = Arc::new(E2bProvider::new(with_runner(&url)).unwrap());
        agentbox_testing::processes::outlive_the_host(name, &*p, &[])
            .await
            .unwrap();
        return;
    }
    let Some(fake) = fake(name, |_| {}).await else {
        return;
    };
    let p: Arc<dyn Provider> = Arc::new(E2bProvider::new(with_runner(&fake.url())).unwrap());
    agentbox_testing::processes::terminal(&*p).await.unwrap();
    agentbox_testing::processes::late_reader_told_the_gap(&*p)
        .await
        .unwrap();
    agentbox_testing::processes::outlive_the_host(name, &*p, &[(FAKE_URL_ENV, fake.url())])
        .await
        .unwrap();
    fake.shutdown().await;
}

/// The runner's token goes to it on stdin, so neither it nor the key is in any file or program
/// argument of the box; a second host's attach finds the runner that runs; a wake starts
/// another (a pause ended it); and a box whose runner cannot be reached (the fake's sandboxes
/// without internet access have no network its proxy reaches) is still a box, without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_token_stays_out_of_the_box_and_a_box_goes_on_without_its_runner() {
    let Some(fake) = fake("the_runner_token_stays_out_of_the_box", |_| {}).await else {
        return;
    };
    let p: Arc<dyn Provider> = Arc::new(E2bProvider::new(with_runner(&fake.url())).unwrap());
    let b = p.create(&spec(), &ctx()).await.unwrap();
    assert!(
        b.facts().runner.as_deref().is_some_and(|r| r.contains("E2B's proxy")),
        "{:?}",
        b.facts().runner
    );
    assert!(b.processes().is_some() && b.files().is_some());
    let seen = sh(
        b.as_ref(),
        "cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null | tr '\\0' ' '; \
         grep -rl . /tmp/agentbox /workspace /root 2>/dev/null | grep -v agentbox-runner | xargs cat",
        &ctx(),
    )
    .await
    .unwrap()
    .stdout_text();
    let token = {
        use hmac::{Hmac, KeyInit, Mac};
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(KEY.as_bytes()).unwrap();
        mac.update(b"agentbox-runner:");
        mac.update(b.id().name().as_bytes());
        mac.finalize()
            .into_bytes()
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect::<String>()
    };
    assert!(seen.contains("serve"), "the runner's argv is read: {seen}");
    assert!(!seen.contains(&token), "the runner's token is in the box");
    assert!(!seen.contains(KEY), "the key is in the box");
    // A second host attaches through the runner that runs.
    let q: Arc<dyn Provider> = Arc::new(E2bProvider::new(with_runner(&fake.url())).unwrap());
    let again = q.attach(b.id(), &ctx()).await.unwrap().expect("the box runs");
    assert_eq!(again.facts().runner, b.facts().runner);
    let runners = |b: Arc<dyn Sandbox>| async move {
        sh(b.as_ref(), "ls /tmp/agentbox | grep -c '^agentbox-runner-'", &ctx())
            .await
            .unwrap()
            .stdout_text()
    };
    assert_eq!(runners(again.clone()).await, "1\n", "the attach started no runner");
    // A pause ends the runner with every program; the wake starts another.
    p.sleep(b.id(), &ctx()).await.unwrap();
    let woke = p.wake(b.id(), &ctx()).await.unwrap();
    assert_eq!(
        sh(woke.as_ref(), "echo awake", &ctx()).await.unwrap().stdout_text(),
        "awake\n"
    );
    assert!(woke.processes().is_some());
    assert_eq!(runners(woke.clone()).await, "2\n", "the wake started a runner");
    woke.destroy(&ctx()).await.unwrap();
    // No network the fake's proxy reaches: a box all the same, without a runner.
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
    assert_eq!(none.facts().runner, None);
    assert!(none.processes().is_none());
    assert_eq!(
        sh(none.as_ref(), "echo hi", &ctx()).await.unwrap().stdout_text(),
        "hi\n"
    );
    none.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

//! E2B boxes against the repository's fake E2B (`agentbox-fakes`), whose sandboxes really run
//! their programs in namespace boxes and whose API the `e2b` Python SDK judges (the fake's own
//! tests): the conformance suite (with sleep and wake as pause and resume, extend as E2B's
//! timeout), and the issue's rules: a sandbox that dies mid-command is a typed error within the
//! idle deadline, a silent stream too, a caller that gives up kills the program in the box, the
//! network E2B read back, the plan's longest timeout, refusals, the key kept out of the box.
//!
//! All of E2B's proof is in this file: `view` reads E2B from outside the provider; the suites at
//! the top run on the fake; `judged` holds the fake to E2B's own Python SDK; `live` runs the
//! conformance suite on the real E2B, where `E2B_API_KEY` is set.

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

use view::View;

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

mod view {
    //! E2B seen from outside the provider: its REST API and envd called directly with reqwest,
    //! shared by the fake's and the live suites.

    use agentbox_core::SandboxId;
    use agentbox_testing::conformance::Outside;
    use async_trait::async_trait;
    use base64::Engine;
    use serde_json::{Value, json};

    pub(crate) struct View {
        http: reqwest::Client,
        api: String,
        sandbox_url: Option<String>,
        domain: String,
        key: String,
    }

    impl View {
        pub(crate) fn new(api: &str, sandbox_url: Option<&str>, domain: &str, key: &str) -> Self {
            let _ = rustls::crypto::ring::default_provider().install_default();
            View {
                http: reqwest::Client::builder().no_proxy().http1_only().build().unwrap(),
                api: api.trim_end_matches('/').into(),
                sandbox_url: sandbox_url.map(|u| u.trim_end_matches('/').to_string()),
                domain: domain.into(),
                key: key.into(),
            }
        }

        /// The sandbox's detail; `None` when E2B has no such sandbox.
        pub(crate) async fn detail(&self, id: &str) -> Option<Value> {
            let r = self
                .http
                .get(format!("{}/sandboxes/{id}", self.api))
                .header("X-API-KEY", &self.key)
                .send()
                .await
                .unwrap();
            if r.status() == 404 {
                return None;
            }
            assert!(r.status().is_success(), "GET /sandboxes/{id}: {}", r.status());
            Some(r.json().await.unwrap())
        }

        /// Run `sh -c script args…` through envd's process stream; its exit code, or `None` when
        /// the sandbox did not answer.
        pub(crate) async fn sh(&self, id: &str, script: &str, args: &[String]) -> Option<i64> {
            let d = self.detail(id).await?;
            let base = self
                .sandbox_url
                .clone()
                .unwrap_or_else(|| format!("https://49983-{id}.{}", self.domain));
            let mut argv = vec!["-c".to_string(), script.into(), "view".into()];
            argv.extend(args.iter().cloned());
            let body = serde_json::to_vec(&json!({"process": {"cmd": "/bin/sh", "args": argv}})).unwrap();
            let mut framed = vec![0u8];
            framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
            framed.extend_from_slice(&body);
            let mut r = self
                .http
                .post(format!("{base}/process.Process/Start"))
                .header("Content-Type", "application/connect+json")
                .header("Connect-Protocol-Version", "1")
                .header("E2b-Sandbox-Id", id)
                .header("E2b-Sandbox-Port", "49983")
                .header(
                    "Authorization",
                    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("root:")),
                )
                .header("X-Access-Token", d["envdAccessToken"].as_str().unwrap_or(""))
                .body(framed)
                .send()
                .await
                .ok()?;
            if !r.status().is_success() {
                return None;
            }
            let mut buf = Vec::new();
            while let Ok(Some(c)) = r.chunk().await {
                buf.extend_from_slice(&c);
            }
            let mut at = 0;
            while at + 5 <= buf.len() {
                let len = u32::from_be_bytes([buf[at + 1], buf[at + 2], buf[at + 3], buf[at + 4]]) as usize;
                let v: Value = serde_json::from_slice(&buf[at + 5..at + 5 + len]).ok()?;
                if let Some(end) = v.pointer("/event/end") {
                    return Some(end["exitCode"].as_i64().unwrap_or(-1));
                }
                at += 5 + len;
            }
            None
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
            self.detail(id.name()).await.is_none()
        }

        async fn any_alive(&self, id: &SandboxId, pids: &[u32]) -> bool {
            let args: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
            self.sh(id.name(), ANY_ALIVE, &args).await == Some(0)
        }
    }
}

mod judged {
    //! The judge: E2B's own Python SDK (`e2b` 2.x), which nobody here wrote, against the fake E2B.
    //! Where they disagree, the fake is wrong. The SDK makes a sandbox (metadata, envs, no
    //! internet), runs commands (exit codes, stdout and stderr, envs, cwd, user), reattaches to a
    //! background one by pid, writes its stdin and closes it, lists and kills commands, writes and
    //! reads files byte for byte and lists, makes, renames, stats and removes them, sets a timeout
    //! and reads it back, meets the plan's most, lists by metadata paging past the fake's small
    //! page, pauses and resumes (the files kept, the programs gone), meets a sandbox that vanishes
    //! mid-command, kills, and meets a wrong key (`tests/e2b_judge.py`). `scripts/judge-clients e2b`
    //! installs the SDK; `scripts/test` exports the venv's python as `AGENTBOX_TEST_E2B_PYTHON`.

    use std::time::Duration;

    use agentbox_fakes::e2b::{FakeE2B, FakeE2BOptions};
    use agentbox_testing::judge;
    use agentbox_testing::judge::e2b::{self, Sdk, Setup};

    /// The judge's whole run, bounded.
    const JUDGE_TIMEOUT: Duration = Duration::from_secs(600);
    /// The fake's page for the judge: the SDK pages past it.
    const LIST_PAGE: usize = 2;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_python_sdk_judges_the_fake() {
        let test = "the_python_sdk_judges_the_fake";
        let Some(py) = judge::python("e2b", test) else {
            return;
        };
        judge_the_fake(Sdk::Python(py), "root").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_npm_sdk_judges_the_fake() {
        let test = "the_npm_sdk_judges_the_fake";
        let Some(dir) = judge::node("e2b", test) else {
            return;
        };
        judge_the_fake(Sdk::Node(dir), "root").await;
    }

    /// The fake, judged by `sdk`'s judge: every step passed, the SDK's calls recorded (a
    /// command run as `user`), never the key, no sandbox left.
    async fn judge_the_fake(sdk: Sdk, user: &str) {
        agentbox_testing::runner::ensure();
        let key = "e2b_judge0123456789abcdef";
        let fake = FakeE2B::start(FakeE2BOptions {
            api_key: key.into(),
            rootfs: std::env::var_os("AGENTBOX_TEST_ROOTFS").map(Into::into),
            list_page_max: LIST_PAGE,
            ..Default::default()
        })
        .await
        .expect("the fake starts");
        let dir = tempfile::tempdir().expect("a temp dir");
        let url = fake.url();
        let command = e2b::command(
            &sdk,
            &Setup {
                url: &url,
                key,
                mode: "fake",
                list_page: LIST_PAGE,
                max_timeout_secs: 3600,
                home: dir.path(),
                ca: None,
            },
        );
        let judged = judge::run(command, JUDGE_TIMEOUT, |line| {
            if let Some(id) = line.strip_prefix("VANISH ") {
                assert!(fake.vanish(id), "the sandbox to vanish is there");
            }
        })
        .await;
        judged.assert_steps(e2b::STEPS);
        let log = fake.requests();
        for path in [
            "/v2/sandboxes",
            "/process.Process/Start",
            "/process.Process/Connect",
            "/files",
        ] {
            assert!(log.iter().any(|r| r.path == path), "the SDK called {path}");
        }
        assert!(
            log.iter().any(|r| r.user.as_deref() == Some(user)),
            "the asked user was recorded"
        );
        assert!(
            !log.iter().any(|r| format!("{r:?}").contains(key)),
            "the key was recorded"
        );
        assert!(fake.sandboxes().is_empty(), "left: {:?}", fake.sandboxes());
        fake.shutdown().await;
    }
}

mod live {
    //! E2B boxes against the real E2B: the conformance suite, only where `E2B_API_KEY` is set (see
    //! docs/e2b.md). Without it it says loudly that it did not run; CI has no key and runs the
    //! fake's suite (`tests/e2b.rs`). Whatever the report, it kills every box it left. Sandboxes
    //! are billed by the second.

    use std::sync::Arc;
    use std::time::Duration;

    use agentbox_core::{Ctx, Labels, Provider};
    use agentbox_providers::e2b::{E2bOptions, E2bProvider};
    use agentbox_testing::conformance::{self, Options};

    use super::view::View;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn e2b_boxes_on_the_real_e2b_pass_the_conformance_suite() {
        let Ok(key) = std::env::var("E2B_API_KEY") else {
            eprintln!(
                "\n!!!! e2b_boxes_on_the_real_e2b_pass_the_conformance_suite: E2B_API_KEY unset: this test did NOT run \
             (it needs an E2B account; see docs/e2b.md) !!!!\n"
            );
            return;
        };
        let o = E2bOptions::from_env().expect("the E2B variables read");
        let view = View::new(&o.api_url, o.sandbox_url.as_deref(), &o.domain, &key);
        let make = o.clone();
        // The suite's own label, so the sweep below touches no one else's sandbox.
        let mine = Labels::from([("live-run".to_string(), std::process::id().to_string())]);
        let mut options = Options::new(
            "e2b-live",
            Duration::from_secs(20),
            Duration::from_secs(60),
            Arc::new(view),
        );
        options.base.labels = mine.clone();
        let report = conformance::run(
            conformance::factory(move || {
                let o = make.clone();
                async move { Arc::new(E2bProvider::new(o).unwrap()) as Arc<dyn Provider> }
            }),
            options,
        )
        .await;
        let p = E2bProvider::new(o).unwrap();
        let ctx = Ctx::background().with_timeout(Duration::from_secs(120));
        for b in p.list(&mine, &ctx).await.expect("listing agentbox's sandboxes") {
            eprintln!("e2b live suite: killing {} left running", b.id());
            let _ = b.destroy(&ctx).await;
        }
        report.assert_all_passed();
    }
}

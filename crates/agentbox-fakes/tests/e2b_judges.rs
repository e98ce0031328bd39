//! The judge: E2B's own Python SDK (`e2b` 2.x), which nobody here wrote, against the fake E2B.
//! Where they disagree, the fake is wrong. The SDK makes a sandbox (metadata, envs, no
//! internet), runs commands (exit codes, stdout and stderr, envs, cwd, user), reattaches to a
//! background one by pid, writes its stdin and closes it, lists and kills commands, writes and
//! reads files byte for byte and lists, makes, renames, stats and removes them, sets a timeout
//! and reads it back, meets the plan's most, lists by metadata paging past the fake's small
//! page, pauses and resumes (the files kept, the programs gone), meets a sandbox that vanishes
//! mid-command, kills, and meets a wrong key (`tests/e2b_judge.py`). `scripts/judge-clients e2b`
//! installs the SDK; `scripts/test` exports the venv's python as `AGENTBOX_TEST_E2B_PYTHON`.

use std::path::Path;
use std::time::Duration;

use agentbox_fakes::e2b::{FakeE2B, FakeE2BOptions};
#[path = "common/judge.rs"]
mod judge;

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
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("e2b_judge.py");
    let mut command = tokio::process::Command::new(&py);
    command
        .arg(&script)
        .env("E2B_API_URL", fake.url())
        .env("E2B_SANDBOX_URL", fake.url())
        .env("E2B_API_KEY", key)
        .env("E2B_HTTP_VERSION", "1.1")
        .env("JUDGE_LIST_PAGE", LIST_PAGE.to_string())
        .env("HOME", dir.path())
        .env("NO_PROXY", "127.0.0.1")
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_ACCESS_TOKEN")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("ALL_PROXY");
    let judged = judge::run(command, JUDGE_TIMEOUT, |line| {
        if let Some(id) = line.strip_prefix("VANISH ") {
            assert!(fake.vanish(id), "the sandbox to vanish is there");
        }
    })
    .await;
    judged.assert_steps(&[
        "create",
        "run",
        "envs",
        "no-internet",
        "connect",
        "stdin",
        "list",
        "kill",
        "files-rw",
        "files-ops",
        "timeout",
        "timeout-max",
        "list-paging",
        "pause-resume",
        "vanish",
        "kill-sandbox",
        "bad-key",
    ]);
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
        log.iter().any(|r| r.user.as_deref() == Some("root")),
        "the asked user was recorded"
    );
    assert!(
        !log.iter().any(|r| format!("{r:?}").contains(key)),
        "the key was recorded"
    );
    assert!(fake.sandboxes().is_empty(), "left: {:?}", fake.sandboxes());
    fake.shutdown().await;
}

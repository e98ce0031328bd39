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
#[path = "common/judge.rs"]
mod judge;

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

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

#[path = "common/judge.rs"]
mod judge;

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

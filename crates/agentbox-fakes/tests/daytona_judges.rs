//! The judge: Daytona's own Python SDK (`daytona` 0.226.1), which nobody here wrote, against
//! the fake Daytona. Where the SDK and the fake disagree, the fake is wrong. Besides the SDK's
//! own walk, the judge makes every HTTP call the `daytona` provider makes, in the provider's
//! request shapes, through the SDK or its generated clients (`tests/daytona_judge.py`), so
//! the fake the provider is tested against answers those calls as Daytona's models read them.
//! `scripts/daytona-clients` installs it; `scripts/test` exports the venv's python as
//! `AGENTBOX_TEST_DAYTONA_PYTHON`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentbox_fakes::daytona::{FakeDaytona, FakeDaytonaOptions};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

const VAR: &str = "AGENTBOX_TEST_DAYTONA_PYTHON";
/// The judge's whole run, bounded.
const JUDGE_TIMEOUT: Duration = Duration::from_secs(360);

/// The SDK's python, or `None` after the loud notice (a failure under CI).
fn python(test: &str) -> Option<PathBuf> {
    if let Ok(p) = std::env::var(VAR)
        && !p.is_empty()
    {
        return Some(PathBuf::from(p));
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: CI needs {VAR} (scripts/test runs scripts/daytona-clients)");
    }
    eprintln!("\n!!!! {test}: {VAR} UNSET: this test did NOT run. Run scripts/daytona-clients and export it. !!!!\n");
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_judges_the_fake() {
    let test = "the_python_sdk_judges_the_fake";
    let Some(py) = python(test) else { return };
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
    let mut child = tokio::process::Command::new(&py)
        .arg(&script)
        .env("DAYTONA_API_URL", fake.api_url())
        .env("DAYTONA_API_KEY", key)
        .env("DAYTONA_USE_DEPRECATED_POLLING", "true")
        .env("NO_PROXY", "127.0.0.1")
        .env("JUDGE_RUNNER", &runner)
        .env_remove("DAYTONA_SERVER_URL")
        .env_remove("DAYTONA_JWT_TOKEN")
        .env_remove("DAYTONA_TARGET")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the judge starts");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut err = child.stderr.take().expect("stderr");
    let errs = tokio::spawn(async move {
        let mut s = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut err, &mut s).await;
        s
    });
    let mut said = String::new();
    let talk = async {
        while let Some(line) = lines.next_line().await.expect("reading the judge") {
            println!("{line}");
            said.push_str(&line);
            said.push('\n');
            if line == "WAIT throttle" {
                // The SDK's urllib3 retries a GET answered 429 with Retry-After, three times
                // (`RemoteDisconnectedRetry(total=3)`): the fourth 429 reaches the SDK.
                fake.throttle(4);
                stdin.write_all(b"go\n").await.expect("answering the judge");
                stdin.flush().await.expect("answering the judge");
            }
            if line == "WAIT fail-after-create" {
                fake.fail_after_next_create(503).expect("503 is an error status");
                stdin.write_all(b"go\n").await.expect("answering the judge");
                stdin.flush().await.expect("answering the judge");
            }
        }
    };
    tokio::time::timeout(JUDGE_TIMEOUT, talk)
        .await
        .expect("the judge ends within its time");
    let status = child.wait().await.expect("the judge's exit");
    let errs = errs.await.unwrap_or_default();
    assert!(status.success(), "the Python SDK judge failed:\n{said}\n{errs}");
    for step in [
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
    ] {
        assert!(
            said.lines().any(|l| l == format!("OK {step}")),
            "no `OK {step}` in:\n{said}\n{errs}"
        );
    }
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

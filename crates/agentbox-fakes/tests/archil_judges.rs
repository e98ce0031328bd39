//! The judge: Archil's own Python SDK (`archil` 0.18.0) and its generated client
//! (`archil-openapi` 0.0.61), which nobody here wrote, against the fake Archil. Where they and
//! the fake disagree, the fake is wrong. The SDK makes its disks, execs (one disk and several,
//! a subdirectory, read-only), objects (every byte value, HEAD, append, listings, deletes),
//! meets a delegation checkout, the exec limit's 504, scripted faults (its S3 retries), a
//! wrong key and missing objects, each raised as its ArchilApiError / ArchilS3Error; the
//! generated client parses every control-plane answer into its models with no field they do
//! not name (`tests/archil_judge.py`). `scripts/judge-clients archil` installs them; `scripts/test`
//! exports the venv's python as `AGENTBOX_TEST_ARCHIL_PYTHON`.

use std::path::Path;
use std::time::Duration;

use agentbox_fakes::archil::{FakeArchil, FakeArchilOptions};
#[path = "common/judge.rs"]
mod judge;

/// The judge's whole run, bounded.
const JUDGE_TIMEOUT: Duration = Duration::from_secs(300);
/// The fake's exec limit for the judge (its 504 step waits it out once).
const EXEC_LIMIT: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_judges_the_fake() {
    let test = "the_python_sdk_judges_the_fake";
    let Some(py) = judge::python("archil", test) else {
        return;
    };
    agentbox_testing::runner::ensure();
    let key = "judge-key-0123456789";
    let fake = FakeArchil::start(FakeArchilOptions {
        api_key: key.into(),
        exec_limit: EXEC_LIMIT,
        ..Default::default()
    })
    .await
    .expect("the fake starts");
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("archil_judge.py");
    let mut command = tokio::process::Command::new(&py);
    command
        .arg(&script)
        .env("ARCHIL_BASE_URL", fake.base_url())
        .env("ARCHIL_S3_BASE_URL", fake.s3_base_url())
        .env("ARCHIL_API_KEY", key)
        .env("JUDGE_EXEC_LIMIT_S", EXEC_LIMIT.as_secs().to_string())
        .env("NO_PROXY", "127.0.0.1")
        .env_remove("ARCHIL_REGION")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("ALL_PROXY");
    let judged = judge::run(command, JUDGE_TIMEOUT, |line| {
        if let Some(disk) = line.strip_prefix("WAIT faults ") {
            // Two 503s the SDK's S3 transport retries past, and one control-plane 500.
            fake.fail_next(
                "GET",
                &format!("/s3/{disk}/who"),
                503,
                "SlowDown",
                "scripted slow down",
                2,
            );
            fake.fail_next(
                "GET",
                &format!("/api/disks/{disk}"),
                500,
                "scripted_fault",
                "scripted",
                1,
            );
        }
    })
    .await;
    judged.assert_steps(&[
        "create",
        "list",
        "get",
        "exec",
        "exec-mounts",
        "put-get",
        "head",
        "append",
        "list-objects",
        "delete-objects",
        "checkout",
        "exec-timeout",
        "faults",
        "bad-key",
        "delete",
        "p-disks",
        "p-exec",
        "p-errors",
        "p-delete",
    ]);
    let log = fake.requests();
    // The SDK's requests as sent: its key in the header alone, its keys percent-encoded.
    assert!(
        log.iter()
            .any(|r| r.method == "PUT" && r.path.ends_with("/odd%20name/%C3%A9%3F%23%25.txt") && r.body == "text"),
        "the SDK's PUT of an odd key: {:?}",
        log.iter().filter(|r| r.method == "PUT").collect::<Vec<_>>()
    );
    assert!(
        log.iter()
            .any(|r| r.method == "GET" && r.path.contains("list-type=2") && r.path.contains("delimiter=%2F")),
        "the SDK's listing"
    );
    assert!(
        !log.iter().any(|r| r.path.contains(key) || r.body.contains(key)),
        "the key was recorded"
    );
    fake.shutdown().await;
}

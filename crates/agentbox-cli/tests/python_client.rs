//! The Python client (`clients/python`) judged from outside: its own suite (pytest) against a
//! real `agentbox serve` making namespace and Docker boxes, with two keys; and its format, lint
//! and type checks (ruff, mypy). `scripts/python-client` installs it and its tools in a venv;
//! `scripts/test` exports that venv's python as `AGENTBOX_TEST_CLIENT_PYTHON`.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

fn client_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients/python")
}

fn run(py: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(py).args(args).current_dir(client_dir()).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_python_client_is_formatted_linted_and_typed() {
    let Some(py) = agentbox_testing::services::path_from(
        "AGENTBOX_TEST_CLIENT_PYTHON",
        "scripts/python-client",
        "the_python_client_is_formatted_linted_and_typed",
    ) else {
        return;
    };
    for check in [
        &["-m", "ruff", "format", "--check", "."][..],
        &["-m", "ruff", "check", "."],
        &["-m", "mypy"],
    ] {
        let (ok, said) = run(&py, check);
        assert!(ok, "{}: {said}", check.join(" "));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_clients_suite_passes_against_a_real_server() {
    let test = "the_python_clients_suite_passes_against_a_real_server";
    let Some(py) = agentbox_testing::services::path_from("AGENTBOX_TEST_CLIENT_PYTHON", "scripts/python-client", test)
    else {
        return;
    };
    if !agentbox_testing::services::docker_available(test) {
        return;
    }
    agentbox_testing::runner::ensure();
    let home = tempfile::tempdir().unwrap();
    let (a, b) = (common::key(home.path(), "a"), common::key(home.path(), "b"));
    let (mut server, url) = common::serve(home.path(), "namespace").await;
    let mut suite = tokio::process::Command::new(&py);
    suite
        .args(["-m", "pytest", "-q", "-rs", "tests"])
        .current_dir(client_dir())
        .env("AGENTBOX_URL", &url)
        .env("AGENTBOX_TEST_KEY_A", &a)
        .env("AGENTBOX_TEST_KEY_B", &b)
        .env("AGENTBOX_TEST_PROVIDERS", "namespace,docker")
        .env_remove("AGENTBOX_KEY");
    let said = common::run_suite(&mut suite, "the Python client").await;
    assert!(!said.contains("skipped"), "nothing skipped: {said}");
    assert!(said.contains(" passed"), "{said}");
    server.start_kill().unwrap();
}

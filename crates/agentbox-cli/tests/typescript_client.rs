//! The TypeScript client (`clients/typescript`) judged from outside: its own suite (Node's test
//! runner) against a real `agentbox serve` making namespace and Docker boxes, with two keys, and
//! a service of the client's own on a private socket; and its type check, format and lint
//! (`tsc --noEmit`, Biome). `scripts/typescript-client` installs its packages and builds it;
//! `scripts/test` exports its directory as `AGENTBOX_TEST_CLIENT_TS`.

mod common;

#[test]
fn the_typescript_client_is_typed_formatted_and_linted() {
    let Some(dir) = agentbox_testing::services::path_from(
        "AGENTBOX_TEST_CLIENT_TS",
        "scripts/typescript-client",
        "the_typescript_client_is_typed_formatted_and_linted",
    ) else {
        return;
    };
    common::npm_check(std::path::Path::new(&dir));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_clients_suite_passes_against_a_real_server() {
    let test = "the_typescript_clients_suite_passes_against_a_real_server";
    let Some(dir) = agentbox_testing::services::path_from("AGENTBOX_TEST_CLIENT_TS", "scripts/typescript-client", test)
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
    let mut suite = tokio::process::Command::new("node");
    suite
        .args(["--test", "--test-concurrency=1", "test/"])
        .current_dir(&dir)
        .env("AGENTBOX_URL", &url)
        .env("AGENTBOX_TEST_KEY_A", &a)
        .env("AGENTBOX_TEST_KEY_B", &b)
        .env("AGENTBOX_TEST_PROVIDERS", "namespace,docker")
        .env("AGENTBOX_BIN", env!("CARGO_BIN_EXE_agentbox"))
        .env("AGENTBOX_HOME", home.path())
        .env_remove("AGENTBOX_KEY");
    let said = common::run_suite(&mut suite, "the TypeScript client").await;
    assert!(said.contains("# skipped 0") && said.contains("# fail 0"), "{said}");
    assert!(!said.contains("# pass 0"), "{said}");
    server.start_kill().unwrap();
}

//! The pi extension (`clients/pi`) judged by pi itself: its suite (Node's test runner) drives
//! real pi sessions (`@mariozechner/pi-coding-agent` from npm, pinned; pi-ai's faux model
//! scripted to call every tool) with the extension loaded, on namespace and Docker boxes and on
//! boxes of the fake E2B (and the session's life: status line, /agentbox, a lost box, /resume,
//! ! commands, an abort; and `pi -e` from pi's own command line), each through a service the extension starts itself from this build's
//! binary; and its type check, format and lint (`tsc`, Biome). `scripts/pi-extension` installs
//! its packages; `scripts/test` exports its directory as `AGENTBOX_TEST_PI`.

mod common;

use agentbox_fakes::e2b::{FakeE2B, FakeE2BOptions};

#[test]
fn the_pi_extension_is_typed_formatted_and_linted() {
    let Some(dir) = agentbox_testing::services::path_from(
        "AGENTBOX_TEST_PI",
        "scripts/pi-extension",
        "the_pi_extension_is_typed_formatted_and_linted",
    ) else {
        return;
    };
    common::npm_check(std::path::Path::new(&dir));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_itself_judges_its_tools_in_boxes() {
    let test = "pi_itself_judges_its_tools_in_boxes";
    let Some(dir) = agentbox_testing::services::path_from("AGENTBOX_TEST_PI", "scripts/pi-extension", test) else {
        return;
    };
    if !agentbox_testing::services::docker_available(test) {
        return;
    }
    let Some(rootfs) = agentbox_testing::services::rootfs(test) else {
        return;
    };
    agentbox_testing::runner::ensure();
    let key = "e2b_pi0123456789abcdefghij";
    let fake = FakeE2B::start(FakeE2BOptions {
        api_key: key.into(),
        rootfs: Some(rootfs.into()),
        ..Default::default()
    })
    .await
    .unwrap();
    let home = tempfile::tempdir().unwrap();
    let mut suite = tokio::process::Command::new("node");
    suite
        .args([
            "--test",
            "--test-concurrency=1",
            "test/pi.test.mjs",
            "test/lifecycle.test.mjs",
            "test/cli.test.mjs",
            "test/config.test.mjs",
        ])
        .current_dir(&dir)
        .env("AGENTBOX_TEST_PI_PROVIDERS", "namespace,docker,e2b")
        .env("AGENTBOX_BIN", env!("CARGO_BIN_EXE_agentbox"))
        .env("AGENTBOX_HOME", home.path())
        .env("E2B_API_URL", fake.url())
        .env("E2B_SANDBOX_URL", fake.url())
        .env("E2B_API_KEY", key)
        .env("AGENTBOX_E2B_WORKSPACE", "/workspace")
        .env_remove("AGENTBOX_URL")
        .env_remove("AGENTBOX_KEY");
    let said = common::run_suite(&mut suite, "the pi extension").await;
    assert!(said.contains("# skipped 0") && said.contains("# fail 0"), "{said}");
    assert!(
        said.contains("# pass 12"),
        "two judgements on each of three providers, four of a session's life, pi's command line, its config: {said}"
    );
}

/// The benchmark reports each side beside the other, and the memory figure (its numbers are
/// measured, never asserted: `node --expose-gc bench/tools.mjs` for the full run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pi_bench_measures_each_side_beside_pis_own() {
    let test = "the_pi_bench_measures_each_side_beside_pis_own";
    let Some(dir) = agentbox_testing::services::path_from("AGENTBOX_TEST_PI", "scripts/pi-extension", test) else {
        return;
    };
    agentbox_testing::runner::ensure();
    let home = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new("node")
        .args(["--expose-gc", "bench/tools.mjs"])
        .current_dir(&dir)
        .env("AGENTBOX_BIN", env!("CARGO_BIN_EXE_agentbox"))
        .env("AGENTBOX_HOME", home.path())
        .env("AGENTBOX_PI_BENCH_ROUNDS", "20")
        .env("AGENTBOX_PI_BENCH_CALLS", "200")
        .env_remove("AGENTBOX_URL")
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("{said}");
    for line in ["read: ", "bash: "] {
        let l = said
            .lines()
            .find(|l| l.starts_with(line))
            .unwrap_or_else(|| panic!("no {line}: {said}"));
        assert!(l.contains(" ms vs ") && l.contains("ratio "), "{l}");
    }
    assert!(said.contains("of heap added after 200 tool calls"), "{said}");
}

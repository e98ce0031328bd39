//! The page `agentbox serve` serves, driven in a real browser: Debian's Chromium, through
//! playwright-core, by the suite in `crates/agentbox-server/page/test/` (Node's test runner),
//! against a real server making namespace boxes, with three keys and a run made by the CLI.
//! The suite's screenshots go to `target/page-screenshots/`; its measurements are printed.
//!
//! `scripts/page-assets` installs the page's packages (xterm.js, which the binary embeds, and
//! the suite's) and `scripts/test` installs Chromium; they are exported as
//! `AGENTBOX_TEST_PAGE` and `AGENTBOX_TEST_CHROMIUM`.

mod common;

use std::path::{Path, PathBuf};

/// Where the suite leaves its screenshots: `target/page-screenshots` of this checkout.
fn shots() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/page-screenshots")
}

#[test]
fn the_page_is_typed_formatted_and_linted() {
    let Some(dir) = agentbox_testing::services::path_from(
        "AGENTBOX_TEST_PAGE",
        "scripts/page-assets",
        "the_page_is_typed_formatted_and_linted",
    ) else {
        return;
    };
    common::npm_check(Path::new(&dir));
}

/// The binary copied alone to a directory of its own, run from another: the page, its script
/// and its terminal come from inside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_alone_serves_the_page() {
    let test = "the_binary_alone_serves_the_page";
    // Without the page's packages the build embeds a stand-in for xterm.js: nothing to check.
    if agentbox_testing::services::path_from("AGENTBOX_TEST_PAGE", "scripts/page-assets", test).is_none() {
        return;
    }
    let alone = tempfile::tempdir().unwrap();
    let bin = alone.path().join("agentbox");
    std::fs::copy(env!("CARGO_BIN_EXE_agentbox"), &bin).unwrap();
    let home = tempfile::tempdir().unwrap();
    let mut command = tokio::process::Command::new(&bin);
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--provider", "local"])
        .current_dir(home.path());
    let mut server = common::started(&mut command, home.path());
    let url = common::serving_url(&mut server).await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    for (path, holds) in [
        ("/", "<title>agentbox</title>"),
        ("/page/app.js", "new WebSocket"),
        ("/page/app.css", ".row"),
        ("/page/xterm.mjs", "xterm.js authors"),
    ] {
        let r = http.get(format!("{url}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert!(
            r.headers()["content-security-policy"]
                .to_str()
                .unwrap()
                .contains("connect-src 'self'")
        );
        let body = r.text().await.unwrap();
        assert!(body.contains(holds), "{path} does not hold {holds:?}");
    }
    server.start_kill().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_passes_its_browser_suite() {
    let test = "the_page_passes_its_browser_suite";
    let Some(dir) = agentbox_testing::services::path_from("AGENTBOX_TEST_PAGE", "scripts/page-assets", test) else {
        return;
    };
    let Some(chromium) = agentbox_testing::services::path_from("AGENTBOX_TEST_CHROMIUM", "scripts/test", test) else {
        return;
    };
    agentbox_testing::runner::ensure();
    let home = common::Home::new();
    let h = home.0.path();
    let alice = common::key_with(h, "alice", &["--max-lifetime", "1h"]);
    let bob = common::key(h, "bob");
    let admin = common::key_with(h, "admin", &["--admin"]);

    // A run of two generations, its tool calls in the ledger (one failed), as the CLI makes them.
    home.ok(&["runs", "new", "r1"]);
    home.ok(&["runs", "release", "r1"]);
    home.ok(&["runs", "release", "r1"]);
    let id = home
        .ok(&["box", "create", "--provider", "namespace"])
        .trim()
        .to_string();
    for (tool, args) in [
        ("write", r#"{"path":"notes.txt","content":"one\n"}"#),
        ("bash", r#"{"command":"false"}"#),
        ("read", r#"{"path":"notes.txt"}"#),
    ] {
        // One of them fails (`false`): recorded all the same, which is what the ledger shows.
        let _ = home.run(&["tool", &id, tool, "--args", args, "--run", "r1"], b"");
    }
    home.ok(&["box", "rm", &id]);
    let status: serde_json::Value = serde_json::from_str(&home.ok(&["runs", "status", "r1"])).unwrap();
    assert_eq!(status["generations"].as_array().map(Vec::len), Some(2), "{status}");
    let ledger: Vec<serde_json::Value> = home
        .ok(&["ledger", "--run", "r1", "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(ledger.len(), 3, "{ledger:?}");
    let expected = h.join("expected.json");
    std::fs::write(
        &expected,
        serde_json::json!({"status": status, "ledger": ledger}).to_string(),
    )
    .unwrap();

    // What two boxes cost, as a receipts file holds it.
    let receipts = h.join("receipts.jsonl");
    std::fs::write(
        &receipts,
        "{\"box\":\"box-1\",\"provider\":\"modal\",\"kind\":\"gpu:T4\",\"from\":\"2026-12-01T10:00:00Z\",\"to\":\"2026-12-01T10:10:00Z\",\"seconds\":600.0,\"usd_per_second\":0.000164,\"cost_usd\":0.0984,\"source\":\"test\",\"priced\":\"2026-12-01\"}\n\
         {\"box\":\"box-2\",\"provider\":\"modal\",\"kind\":\"gpu:T4\",\"from\":\"2026-12-01T11:00:00Z\",\"to\":\"2026-12-01T11:05:00Z\",\"seconds\":300.0,\"usd_per_second\":0.000164,\"cost_usd\":0.0492,\"source\":\"test\",\"priced\":\"2026-12-01\"}\n",
    )
    .unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"));
    command.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--provider",
        "namespace",
        "--receipts",
    ]);
    command.arg(&receipts);
    let mut server = common::started(&mut command, h);
    let url = common::serving_url(&mut server).await;
    // The thousand boxes the list is measured with: local ones with no runner, a process each.
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"));
    command.args(["serve", "--listen", "127.0.0.1:0", "--provider", "local", "--no-runner"]);
    let mut many = common::started(&mut command, h);
    let many_url = common::serving_url(&mut many).await;
    let mut suite = tokio::process::Command::new("node");
    suite
        .args(["--test", "--test-concurrency=1", "test/"])
        .current_dir(&dir)
        .env("AGENTBOX_URL", &url)
        .env("AGENTBOX_KEY_ALICE", &alice)
        .env("AGENTBOX_KEY_BOB", &bob)
        .env("AGENTBOX_KEY_ADMIN", &admin)
        .env("AGENTBOX_PAGE_PROVIDER", "namespace")
        .env("AGENTBOX_PAGE_RUN", "r1")
        .env("AGENTBOX_PAGE_EXPECTED", &expected)
        .env("AGENTBOX_PAGE_SHOTS", shots())
        .env("AGENTBOX_PAGE_MANY", "1000")
        .env("AGENTBOX_URL_MANY", &many_url)
        .env("AGENTBOX_PAGE_SOAK_S", "20")
        .env("AGENTBOX_CHROMIUM", &chromium);
    let said = common::run_suite(&mut suite, "the page's browser suite").await;
    assert!(said.contains("# fail 0") && said.contains("# skipped 0"), "{said}");
    assert!(!said.contains("# pass 0"), "{said}");
    server.start_kill().unwrap();
    many.start_kill().unwrap();
}

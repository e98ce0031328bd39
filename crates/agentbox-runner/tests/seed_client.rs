//! The seed's own client (`runner-box.ts` and `runner-protocol.ts`, with only their types
//! removed: `tests/seed-client/`) against our runner, run by Node.js: protocol 2 is served
//! exactly as that client speaks it.

mod common;

use std::process::Command;

use common::*;
use serde_json::json;

fn node() -> Option<&'static str> {
    let ok = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some("node");
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("the seed client test needs Node.js (node), which this machine has; CI may not skip it");
    }
    eprintln!("\n!!!! the seed's client did NOT run: no node on this machine !!!!\n");
    None
}

#[test]
fn the_seeds_client_works_against_our_runner_unchanged() {
    let Some(node) = node() else { return };
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/seed-client/drive.mjs");
    let out = Command::new(node)
        .args([
            "--no-warnings",
            "--experimental-websocket",
            script,
            &format!("http://{}", r.addr),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["health"], json!({"protocol": 2, "pid": r.child.id()}));
    assert_eq!(got["run"], json!({"stdout": "out\n", "stderr": "err\n", "exitCode": 3}));
    assert_eq!(got["stdin"], json!({"stdout": "PIPED THROUGH\n", "exitCode": 0}));
    assert_eq!(got["kill"], 143);
    assert_eq!(got["abort"], 137);
    assert_eq!(got["badCwd"]["exitCode"], 127);
    assert!(
        got["badCwd"]["stderr"].as_str().unwrap().contains("no/such/dir"),
        "{got}"
    );
    assert_eq!(got["read"], json!([0, 1, 2, 255]));
    assert_eq!(got["readMissing"], serde_json::Value::Null);
    assert_eq!(got["stop"], 137);
    assert_eq!(got["after"], json!({"stdout": "again\n", "exitCode": 0}));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("seed/file.bin"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

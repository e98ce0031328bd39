//! Protocol 2, as the seed's client (`runner-box.ts`, `runner-protocol.ts`) speaks it: every
//! request and answer, every binary stream, byte for byte, over a real runner.

mod common;

use common::*;
use serde_json::json;

fn frame(id: u32, stream: u8, bytes: &[u8]) -> Vec<u8> {
    let mut f = id.to_be_bytes().to_vec();
    f.push(stream);
    f.extend_from_slice(bytes);
    f
}

#[tokio::test]
async fn health_answers_protocol_2_and_the_runner_pid() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let (status, body) = get(&r.addr, "/runner/health", "").await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v, json!({"protocol": 2, "pid": r.child.id()}));
    let (status, _) = get(&r.addr, "/health", "").await;
    assert!(status.starts_with("HTTP/1.1 404"), "{status}");
}

#[tokio::test]
async fn run_streams_stdout_and_stderr_frames_then_exit() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    send_text(
        &mut ws,
        json!({"op":"run","id":1,"command":"printf out; printf err >&2; exit 3","stdin":false}),
    )
    .await;
    let (frames, exit) = until(&mut ws, 1, "exit").await;
    assert_eq!(
        exit,
        json!({"op":"exit","id":1,"code":3}),
        "protocol 2's exit has no signal field"
    );
    assert_eq!(bytes_of(&frames, 1, 1), b"out");
    assert_eq!(bytes_of(&frames, 1, 2), b"err");
    // Every frame is exactly id, stream, bytes: no sequence numbers for a protocol-2 client.
    for f in &frames {
        match f {
            Got::Binary(b) => assert!(b == &frame(1, 1, b"out") || b == &frame(1, 2, b"err"), "{b:?}"),
            Got::Text(t) => panic!("a protocol-2 client got {t}"),
        }
    }
}

#[tokio::test]
async fn run_takes_cwd_env_and_a_shell_command_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    send_text(
        &mut ws,
        json!({"op":"run","id":2,"command":"echo \"$GREETING\" $(basename \"$PWD\") | tr a-z A-Z","cwd":"sub","env":{"GREETING":"hi"},"stdin":false}),
    )
    .await;
    let (frames, exit) = until(&mut ws, 2, "exit").await;
    assert_eq!(exit["code"], 0);
    assert_eq!(bytes_of(&frames, 2, 1), b"HI SUB\n");
}

#[tokio::test]
async fn stdin_frames_then_stdin_end_reach_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    send_text(
        &mut ws,
        json!({"op":"run","id":3,"command":"cat; echo end","stdin":true}),
    )
    .await;
    send_binary(&mut ws, frame(3, 0, b"hello ")).await;
    send_binary(&mut ws, frame(3, 0, b"world\n")).await;
    send_text(&mut ws, json!({"op":"stdin-end","id":3})).await;
    let (frames, exit) = until(&mut ws, 3, "exit").await;
    assert_eq!(exit["code"], 0);
    assert_eq!(bytes_of(&frames, 3, 1), b"hello world\nend\n");
}

#[tokio::test]
async fn without_stdin_the_process_reads_eof() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    send_text(
        &mut ws,
        json!({"op":"run","id":4,"command":"cat; echo eof","stdin":false}),
    )
    .await;
    let (frames, exit) = until(&mut ws, 4, "exit").await;
    assert_eq!(exit["code"], 0);
    assert_eq!(bytes_of(&frames, 4, 1), b"eof\n");
}

#[tokio::test]
async fn kill_signals_the_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    // The child of the shell is in the group too: a kill of the leader alone would leave it.
    send_text(
        &mut ws,
        json!({"op":"run","id":5,"command":"sleep 30 & echo $!; wait","stdin":false}),
    )
    .await;
    let Got::Binary(b) = next(&mut ws).await else {
        panic!("expected the sleeper's pid")
    };
    let pid: i32 = String::from_utf8_lossy(&b[5..]).trim().parse().unwrap();
    send_text(&mut ws, json!({"op":"kill","id":5,"signal":"SIGTERM"})).await;
    let (_, exit) = until(&mut ws, 5, "exit").await;
    assert_eq!(exit, json!({"op":"exit","id":5,"code":143}));
    let gone = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z "))
    });
    assert!(gone, "the group's other member {pid} outlived the kill");
}

#[tokio::test]
async fn write_then_read_a_file_and_read_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    send_text(&mut ws, json!({"op":"write","id":6,"path":"made/a.bin","mode":0o640})).await;
    let bytes: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    send_binary(&mut ws, frame(6, 3, &bytes)).await;
    assert_eq!(next(&mut ws).await, Got::Text(json!({"op":"ok","id":6})));
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(dir.path().join("made/a.bin")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o640);

    send_text(&mut ws, json!({"op":"read","id":7,"path":"made/a.bin"})).await;
    assert_eq!(next(&mut ws).await, Got::Binary(frame(7, 3, &bytes)));
    send_text(&mut ws, json!({"op":"read","id":8,"path":"nothing/here"})).await;
    assert_eq!(next(&mut ws).await, Got::Text(json!({"op":"absent","id":8})));
    // An empty file is a frame with no bytes, not absent.
    std::fs::write(dir.path().join("empty"), b"").unwrap();
    send_text(&mut ws, json!({"op":"read","id":9,"path":"empty"})).await;
    assert_eq!(next(&mut ws).await, Got::Binary(frame(9, 3, b"")));
}

#[tokio::test]
async fn a_failed_request_is_an_error_answer_with_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    send_text(
        &mut ws,
        json!({"op":"run","id":10,"command":"true","cwd":"no/such/dir","stdin":false}),
    )
    .await;
    let Got::Text(e) = next(&mut ws).await else { panic!() };
    assert_eq!((e["op"].as_str(), e["id"].as_u64()), (Some("error"), Some(10)));
    assert!(e["message"].as_str().unwrap().contains("no/such/dir"), "{e}");
    std::fs::create_dir(dir.path().join("adir")).unwrap();
    send_text(&mut ws, json!({"op":"read","id":11,"path":"adir"})).await;
    let Got::Text(e) = next(&mut ws).await else { panic!() };
    assert_eq!((e["op"].as_str(), e["id"].as_u64()), (Some("error"), Some(11)));
    send_text(&mut ws, json!({"op":"write","id":12,"path":"adir"})).await;
    send_binary(&mut ws, frame(12, 3, b"x")).await;
    let Got::Text(e) = next(&mut ws).await else { panic!() };
    assert_eq!((e["op"].as_str(), e["id"].as_u64()), (Some("error"), Some(12)));
}

#[tokio::test]
async fn malformed_frames_are_answered_and_the_connection_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    send_raw(&mut ws, "this is not json").await;
    let Got::Text(e) = next(&mut ws).await else { panic!() };
    assert_eq!(e["op"], "error");
    assert!(e.get("id").is_none(), "{e}");
    send_raw(&mut ws, r#"{"op":"dance","id":13}"#).await;
    let Got::Text(e) = next(&mut ws).await else { panic!() };
    assert_eq!((e["op"].as_str(), e["id"].as_u64()), (Some("error"), Some(13)));
    send_binary(&mut ws, vec![0, 0, 1]).await;
    let Got::Text(e) = next(&mut ws).await else { panic!() };
    assert_eq!(e["op"], "error");
    // Bytes for an id nobody started are dropped, unanswered.
    send_binary(&mut ws, frame(999, 0, b"stray")).await;
    send_binary(&mut ws, frame(998, 3, b"stray")).await;
    assert!(quiet(&mut ws, 300).await);
    send_text(
        &mut ws,
        json!({"op":"run","id":14,"command":"echo still","stdin":false}),
    )
    .await;
    let (frames, exit) = until(&mut ws, 14, "exit").await;
    assert_eq!(
        (exit["code"].as_i64(), bytes_of(&frames, 14, 1)),
        (Some(0), b"still\n".to_vec())
    );
}

#[tokio::test]
async fn stop_kills_every_process_and_answers_ok() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    let mut other = connect(&r.addr).await;
    send_text(&mut ws, json!({"op":"run","id":15,"command":"sleep 30","stdin":false})).await;
    send_text(
        &mut other,
        json!({"op":"run","id":1,"command":"sleep 30","stdin":false}),
    )
    .await;
    assert!(quiet(&mut ws, 200).await);
    send_text(&mut ws, json!({"op":"stop","id":16})).await;
    let mut answers = vec![next(&mut ws).await, next(&mut ws).await];
    answers.sort_by_key(|g| format!("{g:?}"));
    assert!(answers.contains(&Got::Text(json!({"op":"ok","id":16}))), "{answers:?}");
    assert!(
        answers.contains(&Got::Text(json!({"op":"exit","id":15,"code":137}))),
        "{answers:?}"
    );
    assert_eq!(
        next(&mut other).await,
        Got::Text(json!({"op":"exit","id":1,"code":137}))
    );
    // The runner serves on after a stop: the seed's client reconnects at its next call.
    send_text(&mut ws, json!({"op":"run","id":17,"command":"true","stdin":false})).await;
    assert_eq!(until(&mut ws, 17, "exit").await.1["code"], 0);
}

#[tokio::test]
async fn a_dropped_connection_kills_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    send_text(
        &mut ws,
        json!({"op":"run","id":1,"command":"sleep 1; echo done > finished","stdin":false}),
    )
    .await;
    assert!(quiet(&mut ws, 100).await);
    drop(ws);
    let done = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        std::fs::read_to_string(dir.path().join("finished")).is_ok_and(|s| s == "done\n")
    });
    assert!(done, "the process did not finish after its connection dropped");
}

#[tokio::test]
async fn extensions_are_refused_to_a_protocol_2_client() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    send_text(&mut ws, json!({"op":"stat","id":1,"path":"."})).await;
    let Got::Text(e) = next(&mut ws).await else { panic!() };
    assert_eq!(
        (e["op"].as_str(), e["id"].as_u64(), e["code"].as_str()),
        (Some("error"), Some(1), Some("unsupported"))
    );
    send_text(&mut ws, json!({"op":"run","id":2,"argv":["true"],"stdin":false})).await;
    let Got::Text(e) = next(&mut ws).await else { panic!() };
    assert_eq!((e["op"].as_str(), e["id"].as_u64()), (Some("error"), Some(2)));
}

/// `serve --help` prints the usage and exits 0 (it said `unknown argument "--help"`).
#[test]
fn serve_help_prints_the_usage() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentbox-runner"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("usage: agentbox-runner") && text.contains("--listen"),
        "{text}"
    );
}

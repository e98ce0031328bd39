//! Protocol 3, negotiated: argv, started handles, numbered output resumed after a dropped
//! connection, the bounds, the file operations; and the same messages over stdio and the relay.

mod common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use common::*;
use serde_json::{Value, json};

async fn hello(ws: &mut Socket) {
    send_text(ws, json!({"op":"hello","id":0,"protocol":3})).await;
    let Got::Text(h) = next(ws).await else { panic!() };
    assert_eq!(
        (h["op"].as_str(), h["protocol"].as_u64()),
        (Some("hello"), Some(3)),
        "{h}"
    );
}

/// Whether frames are numbered byte by byte from `from` with no gap and no overlap: each
/// frame's number is the one after the previous frame's last byte.
fn contiguous(got: &[(u64, u8, Vec<u8>)], from: u64) -> bool {
    let mut next = from;
    got.iter().all(|(seq, _, bytes)| {
        let ok = *seq == next;
        next = seq + bytes.len() as u64;
        ok
    })
}

/// (seq, stream, bytes) of protocol-3 output frames.
fn seq_frames(frames: &[Got]) -> Vec<(u64, u8, Vec<u8>)> {
    frames
        .iter()
        .filter_map(|f| match f {
            Got::Binary(b) if b.len() >= 13 => {
                Some((u64::from_be_bytes(b[5..13].try_into().unwrap()), b[4], b[13..].to_vec()))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn hello_grants_protocol_3_and_run_answers_started_then_numbered_output() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    send_text(
        &mut ws,
        json!({"op":"run","id":1,"argv":["sh","-c","echo a; echo b >&2; kill -TERM $$"],"stdin":false}),
    )
    .await;
    let Got::Text(s) = next(&mut ws).await else { panic!() };
    assert_eq!((s["op"].as_str(), s["id"].as_u64()), (Some("started"), Some(1)), "{s}");
    assert!(s["handle"].as_u64().unwrap() > 0 && s["pid"].as_u64().unwrap() > 0);
    let (frames, exit) = until(&mut ws, 1, "exit").await;
    assert_eq!(exit, json!({"op":"exit","id":1,"code":143,"signal":15}));
    let got = seq_frames(&frames);
    assert!(contiguous(&got, 0), "every byte numbered from 0 with no gap: {got:?}");
    let out: Vec<u8> = got.iter().filter(|g| g.1 == 1).flat_map(|g| g.2.clone()).collect();
    let err: Vec<u8> = got.iter().filter(|g| g.1 == 2).flat_map(|g| g.2.clone()).collect();
    assert_eq!((out, err), (b"a\n".to_vec(), b"b\n".to_vec()));
}

#[tokio::test]
async fn output_survives_a_dropped_connection_and_resumes_from_a_number() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    send_text(
        &mut ws,
        json!({"op":"run","id":1,"argv":["sh","-c","for i in 1 2 3 4 5 6; do echo $i; sleep 0.1; done"],"stdin":false}),
    )
    .await;
    let Got::Text(s) = next(&mut ws).await else { panic!() };
    let handle = s["handle"].as_u64().unwrap();
    let Got::Binary(first) = next(&mut ws).await else {
        panic!()
    };
    let (seq, _, bytes) = seq_frames(&[Got::Binary(first)])[0].clone();
    assert_eq!((seq, bytes), (0, b"1\n".to_vec()));
    drop(ws);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;

    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    send_text(&mut ws, json!({"op":"resume","id":7,"handle":handle,"after":2})).await;
    let Got::Text(res) = next(&mut ws).await else { panic!() };
    assert_eq!(
        (&res["op"], &res["id"], &res["from"], &res["handle"]),
        (&json!("resumed"), &json!(7), &json!(2), &json!(handle)),
        "{res}"
    );
    assert!(res["end"].as_u64().unwrap() >= 2, "what it had written then: {res}");
    let (frames, exit) = until(&mut ws, 7, "exit").await;
    assert_eq!(exit["code"], 0);
    let got = seq_frames(&frames);
    assert!(contiguous(&got, 2), "{got:?}");
    let rest: Vec<u8> = got.iter().flat_map(|g| g.2.clone()).collect();
    assert_eq!(rest, b"2\n3\n4\n5\n6\n");
    // Seen and forgotten: nothing left to resume.
    send_text(&mut ws, json!({"op":"forget","id":7})).await;
    // Protocol 3 answers a forget (it had no answer).
    assert_eq!(next(&mut ws).await, Got::Text(json!({"op":"ok","id":7})));
    send_text(&mut ws, json!({"op":"resume","id":8,"handle":handle,"after":0})).await;
    let Got::Text(e) = next(&mut ws).await else { panic!() };
    assert_eq!(
        (e["op"].as_str(), e["code"].as_str()),
        (Some("error"), Some("not_found")),
        "{e}"
    );
}

#[tokio::test]
async fn output_past_the_buffer_bound_waits_for_a_client_and_none_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&["--max-buffered", "4096"], dir.path());
    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    // 200 KB through a 4 KB buffer with nobody reading: the program must wait, not lose bytes.
    // (It starts writing once the connection has gone, so no chunk was in flight on it.)
    send_text(
        &mut ws,
        json!({"op":"run","id":1,"argv":["sh","-c","sleep 0.3; head -c 200000 /dev/zero | tr '\\0' x; echo; echo finished > done"],"stdin":false}),
    )
    .await;
    let Got::Text(s) = next(&mut ws).await else { panic!() };
    let handle = s["handle"].as_u64().unwrap();
    drop(ws);
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    assert!(!dir.path().join("done").exists(), "the program ran on past the bound");

    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    send_text(&mut ws, json!({"op":"resume","id":2,"handle":handle,"after":0})).await;
    let Got::Text(res) = next(&mut ws).await else { panic!() };
    assert_eq!(
        (&res["op"], &res["from"], &res["handle"]),
        (&json!("resumed"), &json!(0), &json!(handle)),
        "{res}"
    );
    assert_eq!(res["end"], 4096, "held at the 4 KB bound: {res}");
    let (frames, exit) = until(&mut ws, 2, "exit").await;
    assert_eq!(exit["code"], 0);
    let out: Vec<u8> = seq_frames(&frames).into_iter().flat_map(|g| g.2).collect();
    assert_eq!(out.len(), 200_001);
    assert!(dir.path().join("done").exists());
}

#[tokio::test]
async fn past_the_process_bound_run_is_too_large() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&["--max-processes", "2"], dir.path());
    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    for id in 1..=2 {
        send_text(&mut ws, json!({"op":"run","id":id,"argv":["sleep","30"],"stdin":false})).await;
        let Got::Text(s) = next(&mut ws).await else { panic!() };
        assert_eq!(s["op"], "started");
    }
    send_text(&mut ws, json!({"op":"run","id":3,"argv":["true"],"stdin":false})).await;
    let Got::Text(e) = next(&mut ws).await else { panic!() };
    assert_eq!(
        (e["id"].as_u64(), e["code"].as_str()),
        (Some(3), Some("too_large")),
        "{e}"
    );
    send_text(&mut ws, json!({"op":"stop","id":4})).await;
}

#[tokio::test]
async fn writes_waiting_for_their_bytes_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    for id in 1..=256u32 {
        send_text(&mut ws, json!({"op":"write","id":id,"path":"x"})).await;
    }
    assert!(quiet(&mut ws, 200).await, "256 may wait");
    send_text(&mut ws, json!({"op":"write","id":257,"path":"x"})).await;
    let Got::Text(e) = next(&mut ws).await else { panic!() };
    assert_eq!(
        (e["id"].as_u64(), e["code"].as_str()),
        (Some(257), Some("too_large")),
        "{e}"
    );
    // Their bytes arriving lets them finish.
    send_binary(&mut ws, [0, 0, 0, 1, 3, b'y'].to_vec()).await;
    assert_eq!(next(&mut ws).await, Got::Text(json!({"op":"ok","id":1})));
}

#[tokio::test]
async fn a_message_over_the_bound_is_answered_too_large() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    let big = "x".repeat(17 << 20);
    send_raw(&mut ws, &big).await;
    let Got::Text(e) = next(&mut ws).await else { panic!() };
    assert_eq!(
        (e["op"].as_str(), e["code"].as_str()),
        (Some("error"), Some("too_large")),
        "{e}"
    );
    // The connection goes on.
    send_text(&mut ws, json!({"op":"run","id":1,"command":"true","stdin":false})).await;
    assert_eq!(until(&mut ws, 1, "exit").await.1["code"], 0);
}

async fn ask(ws: &mut Socket, v: Value) -> Value {
    send_text(ws, v).await;
    let Got::Text(a) = next(ws).await else {
        panic!("a text answer")
    };
    a
}

#[tokio::test]
async fn file_operations_answer_as_the_system_calls_do() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    assert_eq!(
        ask(&mut ws, json!({"op":"mkdir","id":1,"path":"a/b","recursive":true})).await,
        json!({"op":"ok","id":1})
    );
    let e = ask(&mut ws, json!({"op":"mkdir","id":2,"path":"a"})).await;
    assert_eq!((e["code"].as_str(), e["errno"].as_i64()), (Some("EEXIST"), Some(17)));
    send_text(&mut ws, json!({"op":"append","id":3,"path":"a/f"})).await;
    send_binary(&mut ws, [0, 0, 0, 3, 3, b'h', b'i'].to_vec()).await;
    assert_eq!(next(&mut ws).await, Got::Text(json!({"op":"ok","id":3})));
    send_text(&mut ws, json!({"op":"append","id":4,"path":"a/f"})).await;
    send_binary(&mut ws, [0, 0, 0, 4, 3, b'!'].to_vec()).await;
    assert_eq!(next(&mut ws).await, Got::Text(json!({"op":"ok","id":4})));
    assert_eq!(std::fs::read(dir.path().join("a/f")).unwrap(), b"hi!");
    let s = ask(&mut ws, json!({"op":"stat","id":5,"path":"a/f"})).await;
    assert_eq!(
        (s["op"].as_str(), s["meta"]["kind"].as_str(), s["meta"]["size"].as_u64()),
        (Some("stat"), Some("file"), Some(3))
    );
    assert_eq!(
        ask(&mut ws, json!({"op":"truncate","id":6,"path":"a/f","size":1})).await,
        json!({"op":"ok","id":6})
    );
    send_text(&mut ws, json!({"op":"read","id":7,"path":"a/f","offset":0,"length":10})).await;
    assert_eq!(next(&mut ws).await, Got::Binary(vec![0, 0, 0, 7, 3, b'h']));
    std::os::unix::fs::symlink("f", dir.path().join("a/l")).unwrap();
    let l = ask(&mut ws, json!({"op":"list","id":8,"path":"a"})).await;
    let mut names: Vec<(String, String)> = l["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            ("b".into(), "dir".into()),
            ("f".into(), "file".into()),
            ("l".into(), "symlink".into())
        ]
    );
    assert_eq!(
        ask(&mut ws, json!({"op":"rename","id":9,"from":"a/f","to":"a/g"})).await,
        json!({"op":"ok","id":9})
    );
    let e = ask(&mut ws, json!({"op":"remove","id":10,"path":"a"})).await;
    assert_eq!(e["code"], "EISDIR");
    let e = ask(&mut ws, json!({"op":"stat","id":11,"path":"a/f"})).await;
    assert_eq!((e["code"].as_str(), e["errno"].as_i64()), (Some("ENOENT"), Some(2)));
    assert_eq!(
        ask(&mut ws, json!({"op":"remove","id":12,"path":"a/nothing","force":true})).await,
        json!({"op":"ok","id":12})
    );
    assert_eq!(
        ask(&mut ws, json!({"op":"remove","id":13,"path":"a","recursive":true})).await,
        json!({"op":"ok","id":13})
    );
    assert!(!dir.path().join("a").exists());
}

fn encode(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = ((payload.len() + 1) as u32).to_be_bytes().to_vec();
    out.push(kind);
    out.extend_from_slice(payload);
    out
}

fn read_message(r: &mut impl Read) -> (u8, Vec<u8>) {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    r.read_exact(&mut body).unwrap();
    (body[0], body[1..].to_vec())
}

/// Speak the length-prefixed transport to a child's stdin and stdout.
fn stdio_session(mut child: std::process::Child) {
    // Reads below block: a runner that stops answering is killed, and the reads fail.
    let pid = child.id() as i32;
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(30));
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid).unwrap(),
            rustix::process::Signal::KILL,
        );
    });
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    // A bad kind byte is answered, and the stream goes on.
    stdin.write_all(&encode(b'?', b"x")).unwrap();
    let (kind, body) = read_message(&mut stdout);
    let e: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!((kind, e["op"].as_str()), (b't', Some("error")), "{e}");
    stdin
        .write_all(&encode(
            b't',
            br#"{"op":"run","id":1,"command":"read x; echo got $x","stdin":true}"#,
        ))
        .unwrap();
    stdin
        .write_all(&encode(b'b', &[0, 0, 0, 1, 0, b'y', b'o', b'\n']))
        .unwrap();
    stdin.write_all(&encode(b't', br#"{"op":"stdin-end","id":1}"#)).unwrap();
    let mut out = Vec::new();
    loop {
        let (kind, body) = read_message(&mut stdout);
        if kind == b'b' {
            assert_eq!(&body[..5], &[0, 0, 0, 1, 1]);
            out.extend_from_slice(&body[5..]);
            continue;
        }
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v, json!({"op":"exit","id":1,"code":0}));
        break;
    }
    assert_eq!(out, b"got yo\n");
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn stdio_carries_the_same_messages_length_prefixed() {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(RUNNER)
        .arg("--stdio")
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    stdio_session(child);
}

#[test]
fn the_relay_reaches_a_runner_on_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("runner.sock");
    let out = Command::new(RUNNER)
        .args(["--listen", &format!("unix:{}", sock.display()), "--detach"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    let pid: i32 = said
        .lines()
        .find_map(|l| l.strip_prefix("ready "))
        .unwrap_or_else(|| panic!("{said}"))
        .parse()
        .unwrap();
    assert!(said.contains(&format!("listening unix:{}", sock.display())), "{said}");
    let child = Command::new(RUNNER)
        .args(["relay", &format!("unix:{}", sock.display())])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    stdio_session(child);
    // The detached runner is in a session of its own, and still serves.
    let sid = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = sid.rsplit(") ").next().unwrap().split(' ').collect();
    assert_eq!(fields[3], pid.to_string(), "the detached runner leads its session");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
}

#[tokio::test]
async fn a_token_guards_tcp_health_and_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(RUNNER)
        .args(["--listen", "127.0.0.1:0", "--token-stdin"])
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"s3cret\n").unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stderr.take().unwrap()), &mut line).unwrap();
    let r = Runner {
        addr: line
            .trim()
            .strip_prefix("agentbox-runner: listening ")
            .unwrap()
            .to_string(),
        child,
    };
    let (status, body) = get(&r.addr, "/runner/health", "").await;
    assert!(status.starts_with("HTTP/1.1 401"), "{status}");
    assert!(!body.contains("s3cret"));
    let (status, _) = get(&r.addr, "/runner/health", "authorization: Bearer wrong\r\n").await;
    assert!(status.starts_with("HTTP/1.1 401"), "{status}");
    let (status, _) = get(&r.addr, "/runner/health", "authorization: Bearer s3cret\r\n").await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    // The same token in agentbox's own header, for a path through a proxy that reads
    // Authorization as its own credential.
    let (status, _) = get(&r.addr, "/runner/health", "x-agentbox-runner-token: s3cret\r\n").await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let (status, _) = get(&r.addr, "/runner/health", "x-agentbox-runner-token: wrong\r\n").await;
    assert!(status.starts_with("HTTP/1.1 401"), "{status}");
    let tcp = tokio::net::TcpStream::connect(&r.addr).await.unwrap();
    assert!(
        tokio_tungstenite::client_async(format!("ws://{}/", r.addr), tcp)
            .await
            .is_err()
    );
}

/// Flow control: with a window, the runner sends no more of a process's output than the
/// window past what the client acknowledged, sends more as acks come, and lets go of nothing
/// sent but unacknowledged when the connection drops: a resume replays it.
#[tokio::test]
async fn a_window_holds_a_process_at_the_runner_until_its_reader_acks() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    let window = 256u64 << 10;
    send_text(&mut ws, json!({"op":"hello","id":0,"protocol":3,"window":window})).await;
    let Got::Text(h) = next(&mut ws).await else { panic!() };
    assert_eq!(h["window"].as_u64(), Some(window), "the window is granted: {h}");
    let total = 4u64 << 20;
    send_text(
        &mut ws,
        json!({"op":"run","id":1,"argv":["head","-c",total.to_string(),"/dev/zero"],"stdin":false}),
    )
    .await;
    let Got::Text(s) = next(&mut ws).await else { panic!() };
    let handle = s["handle"].as_u64().unwrap();
    // Take frames until the runner goes quiet: it stopped at the window.
    let mut got = 0u64;
    let mut last = 0u64;
    loop {
        match tokio::time::timeout(std::time::Duration::from_millis(500), next(&mut ws)).await {
            Ok(Got::Binary(b)) => {
                let (seq, _, bytes) = seq_frames(&[Got::Binary(b)])[0].clone();
                got += bytes.len() as u64;
                last = seq + bytes.len() as u64;
            }
            Ok(Got::Text(t)) => panic!("no answer before the window is acked: {t}"),
            Err(_) => break,
        }
    }
    assert_eq!(got, window, "held at the window: {got} bytes sent");
    // Drop with all of that unacknowledged, resume from the start: all of it comes again, and
    // acks let the rest through to the exit.
    drop(ws);
    let mut ws = connect(&r.addr).await;
    send_text(&mut ws, json!({"op":"hello","id":0,"protocol":3,"window":window})).await;
    let Got::Text(_) = next(&mut ws).await else { panic!() };
    send_text(&mut ws, json!({"op":"resume","id":2,"handle":handle,"after":0})).await;
    let Got::Text(res) = next(&mut ws).await else { panic!() };
    assert_eq!(
        (res["op"].as_str(), res["from"].as_u64()),
        (Some("resumed"), Some(0)),
        "nothing lost: {res}"
    );
    let mut bytes = 0u64;
    let mut seen = 0u64;
    loop {
        match next(&mut ws).await {
            Got::Binary(b) => {
                let (seq, stream, chunk) = seq_frames(&[Got::Binary(b)])[0].clone();
                assert_eq!(seq, seen, "no gap");
                seen = seq + chunk.len() as u64;
                bytes += chunk.len() as u64;
                send_text(&mut ws, json!({"op":"ack","id":2,"stream":stream,"seq":seen})).await;
            }
            Got::Text(t) => {
                assert_eq!((t["op"].as_str(), t["code"].as_i64()), (Some("exit"), Some(0)), "{t}");
                break;
            }
        }
    }
    assert!(seen >= last);
    assert_eq!(bytes, total, "every byte arrives once the reader acks");
}

/// Protocol 3 answers a kill: `ok` when it went to a process of the connection, `not_found`
/// naming the id when there is none (a kill had no answer either way).
#[tokio::test]
async fn a_kill_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    hello(&mut ws).await;
    send_text(&mut ws, json!({"op":"run","id":1,"argv":["sleep","30"],"stdin":false})).await;
    let Got::Text(s) = next(&mut ws).await else { panic!() };
    assert_eq!(s["op"], "started");
    send_text(&mut ws, json!({"op":"kill","id":1,"signal":"SIGTERM"})).await;
    let (_, ok) = until(&mut ws, 1, "ok").await;
    assert_eq!(ok, json!({"op":"ok","id":1}));
    let (_, exit) = until(&mut ws, 1, "exit").await;
    assert_eq!(
        (exit["code"].as_i64(), exit["signal"].as_i64()),
        (Some(143), Some(15)),
        "{exit}"
    );
    send_text(&mut ws, json!({"op":"kill","id":99})).await;
    let (_, e) = until(&mut ws, 99, "error").await;
    assert_eq!(e["code"], "not_found", "{e}");
    assert!(e["message"].as_str().unwrap().contains("99"), "{e}");
}

/// A stream whose reader has not acked yet (here stderr, never) does not hold up the other:
/// what the other's reader acked is freed even behind it, so the buffer never fills with taken
/// bytes and the pipes keep being read (they stopped, and both readers waited for ever).
#[tokio::test]
async fn an_unacked_stream_does_not_starve_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&["--max-buffered", "65536"], dir.path());
    let mut ws = connect(&r.addr).await;
    send_text(&mut ws, json!({"op":"hello","id":0,"protocol":3,"window":32768})).await;
    let Got::Text(_) = next(&mut ws).await else { panic!() };
    send_text(
        &mut ws,
        json!({"op":"run","id":1,"argv":["sh","-c","echo first >&2; head -c 1048576 /dev/zero"],"stdin":false}),
    )
    .await;
    let Got::Text(s) = next(&mut ws).await else { panic!() };
    assert_eq!(s["op"], "started");
    let mut out = 0u64;
    loop {
        match next(&mut ws).await {
            Got::Binary(b) => {
                let (seq, stream, chunk) = seq_frames(&[Got::Binary(b)])[0].clone();
                if stream == 1 {
                    out += chunk.len() as u64;
                    let end = seq + chunk.len() as u64;
                    send_text(&mut ws, json!({"op":"ack","id":1,"stream":1,"seq":end})).await;
                }
            }
            Got::Text(t) => {
                assert_eq!(t["op"], "exit", "{t}");
                break;
            }
        }
    }
    assert_eq!(out, 1 << 20, "all of stdout, with stderr never acked");
}

/// A resume starts with a free window: `after` is what the client already has, so bytes it
/// was sent before a drop that lost their acknowledgements are not charged to the new reader.
/// The drop here comes after exactly one window was read and before any ack: the resumed
/// reader is sent what follows with no ack first (it used to get nothing, forever).
#[tokio::test]
async fn a_resume_after_acks_lost_in_a_drop_starts_with_a_free_window() {
    let dir = tempfile::tempdir().unwrap();
    let r = start(&[], dir.path());
    let mut ws = connect(&r.addr).await;
    let window = 256u64 << 10;
    send_text(&mut ws, json!({"op":"hello","id":0,"protocol":3,"window":window})).await;
    let Got::Text(h) = next(&mut ws).await else { panic!() };
    assert_eq!(h["window"].as_u64(), Some(window), "the window is granted: {h}");
    let total = 8u64 << 20;
    send_text(
        &mut ws,
        json!({"op":"run","id":1,"argv":["head","-c",total.to_string(),"/dev/zero"],"stdin":false}),
    )
    .await;
    let Got::Text(s) = next(&mut ws).await else { panic!() };
    let handle = s["handle"].as_u64().unwrap();
    // Read the window's bytes, acknowledging none of them, then drop.
    let mut got = 0u64;
    while got < window {
        match next(&mut ws).await {
            Got::Binary(b) => {
                let (seq, _, bytes) = seq_frames(&[Got::Binary(b)])[0].clone();
                assert_eq!(seq, got, "no gap");
                got += bytes.len() as u64;
            }
            Got::Text(t) => panic!("no answer before the window is acked: {t}"),
        }
    }
    assert_eq!(got, window, "the runner sent one window");
    drop(ws);
    let mut ws = connect(&r.addr).await;
    send_text(&mut ws, json!({"op":"hello","id":0,"protocol":3,"window":window})).await;
    let Got::Text(_) = next(&mut ws).await else { panic!() };
    send_text(
        &mut ws,
        json!({"op":"resume","id":2,"handle":handle,"after":window,"hold":true}),
    )
    .await;
    let Got::Text(res) = next(&mut ws).await else { panic!() };
    assert_eq!(
        (res["op"].as_str(), res["from"].as_u64()),
        (Some("resumed"), Some(window)),
        "resumed where the client was: {res}"
    );
    // Before any ack: what follows `after` comes (within `next`'s deadline), one window of it.
    let Got::Binary(b) = next(&mut ws).await else {
        panic!("output after a resume, before any ack")
    };
    let (seq, stream, chunk) = seq_frames(&[Got::Binary(b)])[0].clone();
    assert_eq!(seq, window, "the replay starts at `after`");
    let mut seen = seq + chunk.len() as u64;
    send_text(&mut ws, json!({"op":"ack","id":2,"stream":stream,"seq":seen})).await;
    loop {
        match next(&mut ws).await {
            Got::Binary(b) => {
                let (seq, stream, chunk) = seq_frames(&[Got::Binary(b)])[0].clone();
                assert_eq!(seq, seen, "no gap");
                seen = seq + chunk.len() as u64;
                send_text(&mut ws, json!({"op":"ack","id":2,"stream":stream,"seq":seen})).await;
            }
            Got::Text(t) => {
                assert_eq!((t["op"].as_str(), t["code"].as_i64()), (Some("exit"), Some(0)), "{t}");
                break;
            }
        }
    }
    assert_eq!(seen, total, "every byte arrives, none twice");
}

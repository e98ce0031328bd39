//! Live streams over WebSockets, through a real WebSocket client: a process's output read
//! across a reconnect from its cursor with nothing lost or repeated, its stdin written through
//! the socket, a gap said, a terminal resized, frames out of protocol refused with a close
//! code, and another key's process unreachable before any upgrade.

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentbox_server::Keys;
use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use support::*;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

/// The next message, within 60 s: a JSON message, or the close frame's code.
async fn next(ws: &mut Ws) -> Result<Value, Option<CloseCode>> {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(60), ws.next())
            .await
            .expect("a message within 60 s");
        match m {
            Some(Ok(Message::Text(t))) => return Ok(serde_json::from_str(&t).unwrap()),
            Some(Ok(Message::Close(c))) => return Err(c.map(|c| c.code)),
            Some(Ok(_)) => continue,
            None | Some(Err(_)) => return Err(None),
        }
    }
}

fn bytes_of(m: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(m["data"].as_str().unwrap())
        .unwrap()
}

/// Output messages until the text read holds `want`: the text, and the cursor past it.
async fn read_until(ws: &mut Ws, want: &str) -> (String, u64) {
    let mut text = String::new();
    let mut cursor = 0;
    while !text.contains(want) {
        let m = next(ws)
            .await
            .unwrap_or_else(|c| panic!("closed ({c:?}) before {want:?}: {text:?}"));
        assert_eq!(m["type"], "output", "{m}");
        let b = bytes_of(&m);
        cursor = m["seq"].as_u64().unwrap() + b.len() as u64;
        text.push_str(&String::from_utf8_lossy(&b));
    }
    (text, cursor)
}

async fn send(ws: &mut Ws, m: Value) {
    ws.send(Message::text(m.to_string())).await.unwrap();
}

async fn make_box(s: &Server, key: &str) -> String {
    let (st, b) = call(s, Some(key), "POST", "/v1/boxes", Some(json!({"spec": spec(600_000)}))).await;
    assert_eq!(st, 201, "{b}");
    b["id"].as_str().unwrap().to_string()
}

async fn start_process(s: &Server, key: &str, id: &str, body: Value) -> u64 {
    let (st, b) = call(s, Some(key), "POST", &format!("/v1/boxes/{id}/processes"), Some(body)).await;
    assert_eq!(st, 201, "{b}");
    b["handle"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_survives_a_reconnect_from_its_cursor() {
    let keys = Arc::new(Keys::in_memory().unwrap());
    let (_, key) = keys.add("k", false, local()).await.unwrap();
    let (_, other) = keys.add("other", false, local()).await.unwrap();
    let s = start(keys, 1 << 20).await;
    let id = make_box(&s, &key).await;
    let script = "echo one; read x; echo got:$x; read y; echo three; exit 3";
    let h = start_process(&s, &key, &id, json!({"command": script})).await;
    let path = format!("/v1/boxes/{id}/processes/{h}/stream");

    // Another key's process is not there: refused before any upgrade.
    assert_eq!(ws_connect(&s, &other, &path).await.err(), Some(404));

    let mut ws = ws_connect(&s, &key, &path).await.unwrap();
    let (first, _) = read_until(&mut ws, "one\n").await;
    send(&mut ws, json!({"type": "stdin", "data": "hi\n"})).await;
    let (second, cursor) = read_until(&mut ws, "got:hi\n").await;
    // The client goes away mid-stream, and comes back from where it was.
    drop(ws);
    let mut ws = ws_connect(&s, &key, &format!("{path}?after={cursor}")).await.unwrap();
    send(
        &mut ws,
        json!({"type": "stdin", "data_base64": base64::engine::general_purpose::STANDARD.encode("x\n")}),
    )
    .await;
    let (third, _) = read_until(&mut ws, "three\n").await;
    assert_eq!(format!("{first}{second}{third}"), "one\ngot:hi\nthree\n");
    let exit = next(&mut ws).await.unwrap();
    assert_eq!(exit["type"], "exit", "{exit}");
    assert_eq!(exit["exit"]["status"]["code"], 3, "{exit}");
    assert_eq!(next(&mut ws).await.err(), Some(Some(CloseCode::Normal)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_says_the_gap_of_bytes_no_longer_kept() {
    let keys = Arc::new(Keys::in_memory().unwrap());
    let (_, key) = keys.add("k", false, local()).await.unwrap();
    let s = start(keys, 1 << 20).await;
    let id = make_box(&s, &key).await;
    // Far more than the box keeps of output nobody reads, then a last line.
    let h = start_process(
        &s,
        &key,
        &id,
        json!({"command": "head -c 20000000 /dev/zero; echo; echo last"}),
    )
    .await;
    let (st, b) = call(
        &s,
        Some(&key),
        "POST",
        &format!("/v1/boxes/{id}/processes/{h}/wait"),
        Some(json!({})),
    )
    .await;
    assert_eq!(st, 200, "{b}");
    let mut ws = ws_connect(&s, &key, &format!("/v1/boxes/{id}/processes/{h}/stream"))
        .await
        .unwrap();
    let gap = next(&mut ws).await.unwrap();
    assert_eq!(gap["type"], "gap", "{gap}");
    assert_eq!(gap["from"], 0, "{gap}");
    let to = gap["to"].as_u64().unwrap();
    assert!(to > 0 && to < 20_000_000, "{gap}");
    let (mut total, mut expect, mut tail) = (0u64, to, Vec::new());
    loop {
        let m = next(&mut ws).await.unwrap();
        if m["type"] == "exit" {
            assert_eq!(m["next"], 20_000_006, "{m}");
            break;
        }
        assert_eq!(m["type"], "output", "{m}");
        assert_eq!(m["seq"].as_u64().unwrap(), expect, "in order, nothing repeated: {m}");
        let b = bytes_of(&m);
        expect += b.len() as u64;
        total += b.len() as u64;
        tail.extend_from_slice(&b);
        tail = tail.split_off(tail.len().saturating_sub(16));
    }
    assert_eq!(to + total, 20_000_006);
    assert!(tail.ends_with(b"\nlast\n"), "{tail:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_is_resized_and_reattached_by_its_handle() {
    let keys = Arc::new(Keys::in_memory().unwrap());
    let (_, key) = keys.add("k", false, local()).await.unwrap();
    let s = start(keys, 1 << 20).await;
    let id = make_box(&s, &key).await;
    let command = "stty size; read x; stty size; echo done";
    let q = format!(
        "/v1/boxes/{id}/terminal?rows=30&cols=90&command={}",
        command.replace(' ', "%20").replace(';', "%3B")
    );
    let mut ws = ws_connect(&s, &key, &q).await.unwrap();
    let started = next(&mut ws).await.unwrap();
    assert_eq!(started["type"], "started", "{started}");
    let h = started["handle"].as_u64().unwrap();
    read_until(&mut ws, "30 90").await;
    send(&mut ws, json!({"type": "resize", "rows": 40, "cols": 100})).await;
    // A resize out of bounds is said, and the stream goes on.
    send(&mut ws, json!({"type": "resize", "rows": 0, "cols": 100})).await;
    let e = next(&mut ws).await.unwrap();
    assert_eq!(
        (e["type"].as_str(), e["code"].as_str()),
        (Some("error"), Some("invalid")),
        "{e}"
    );
    drop(ws);
    // The terminal's program outlived the socket: reattached by its handle, from the start.
    let mut ws = ws_connect(&s, &key, &format!("/v1/boxes/{id}/processes/{h}/stream"))
        .await
        .unwrap();
    read_until(&mut ws, "30 90").await;
    send(&mut ws, json!({"type": "stdin", "data": "\n"})).await;
    let (text, _) = read_until(&mut ws, "done").await;
    assert!(text.contains("40 100"), "{text:?}");
    loop {
        let m = next(&mut ws).await.unwrap();
        if m["type"] == "exit" {
            assert_eq!(m["exit"]["status"]["code"], 0, "{m}");
            break;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_out_of_protocol_are_refused_with_a_close_code() {
    let keys = Arc::new(Keys::in_memory().unwrap());
    let (_, key) = keys.add("k", false, local()).await.unwrap();
    let s = start(keys, 1 << 20).await;
    let id = make_box(&s, &key).await;
    let h = start_process(&s, &key, &id, json!({"command": "sleep 60"})).await;
    let path = format!("/v1/boxes/{id}/processes/{h}/stream");
    let cases: [(Message, CloseCode); 4] = [
        (Message::text("not json"), CloseCode::Policy),
        (Message::text(r#"{"type":"launch"}"#), CloseCode::Policy),
        (Message::binary(vec![1, 2, 3]), CloseCode::Unsupported),
        (Message::text("x".repeat(2 << 20)), CloseCode::Size),
    ];
    for (frame, code) in cases {
        let mut ws = ws_connect(&s, &key, &path).await.unwrap();
        // A frame too big may cut the connection before the client finishes sending it.
        let _ = ws.send(frame).await;
        let e = next(&mut ws).await.unwrap();
        assert_eq!(
            (e["type"].as_str(), e["code"].as_str()),
            (Some("error"), Some("invalid")),
            "{e}"
        );
        assert!(
            e["message"].as_str().unwrap().starts_with("a frame out of protocol"),
            "{e}"
        );
        assert_eq!(next(&mut ws).await.err(), Some(Some(code)));
    }
    // A plain GET of a terminal is refused before any program starts.
    let (st, b) = call(&s, Some(&key), "GET", &format!("/v1/boxes/{id}/terminal"), None).await;
    assert_eq!((st, code_of(&b)), (400, "invalid"), "{b}");
    let (_, listed) = call(&s, Some(&key), "GET", &format!("/v1/boxes/{id}/processes"), None).await;
    assert_eq!(listed.as_array().unwrap().len(), 1, "only the sleep: {listed}");
    // A plain GET of a stream is told what it lacks, in the one shape.
    let (st, b) = call(&s, Some(&key), "GET", &path, None).await;
    assert_eq!((st, code_of(&b)), (400, "invalid"), "{b}");
    assert!(b["message"].as_str().unwrap().contains("WebSocket"), "{b}");
    let (st, _) = call(
        &s,
        Some(&key),
        "POST",
        &format!("/v1/boxes/{id}/processes/{h}/signal"),
        Some(json!({"signal": "KILL"})),
    )
    .await;
    assert_eq!(st, 204);
}

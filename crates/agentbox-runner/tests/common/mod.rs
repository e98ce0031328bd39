//! A runner started for a test, and a raw client that speaks its wire format byte for byte.

#![allow(dead_code)]

use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message as Ws;

pub(crate) const RUNNER: &str = env!("CARGO_BIN_EXE_agentbox-runner");

/// A runner listening on a loopback port, killed when dropped.
pub(crate) struct Runner {
    pub child: Child,
    pub addr: String,
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `agentbox-runner --listen 127.0.0.1:0 extra…` in `cwd` and read where it listens.
pub(crate) fn start(extra: &[&str], cwd: &std::path::Path) -> Runner {
    let mut child = Command::new(RUNNER)
        .args(["--listen", "127.0.0.1:0"])
        .args(extra)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the runner");
    let mut line = String::new();
    std::io::BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("agentbox-runner: listening ")
        .unwrap_or_else(|| panic!("the runner said {line:?}"))
        .to_string();
    Runner { child, addr }
}

pub(crate) type Socket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// A WebSocket to the runner at `addr`, as the seed's client opens it (at `/`).
pub(crate) async fn connect(addr: &str) -> Socket {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}/"), tcp)
        .await
        .unwrap();
    ws
}

/// What came next from the runner.
#[derive(Debug, PartialEq)]
pub(crate) enum Got {
    Text(Value),
    Binary(Vec<u8>),
}

pub(crate) async fn send_text(ws: &mut Socket, v: Value) {
    ws.send(Ws::text(v.to_string())).await.unwrap();
}

pub(crate) async fn send_raw(ws: &mut Socket, t: &str) {
    ws.send(Ws::text(t.to_string())).await.unwrap();
}

pub(crate) async fn send_binary(ws: &mut Socket, b: Vec<u8>) {
    ws.send(Ws::binary(b)).await.unwrap();
}

/// The next text or binary message, within 20 s.
pub(crate) async fn next(ws: &mut Socket) -> Got {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("the runner answered within 20 s")
            .expect("the connection is open")
            .expect("a well-formed WebSocket message");
        match m {
            Ws::Text(t) => return Got::Text(serde_json::from_str(&t).expect("JSON text")),
            Ws::Binary(b) => return Got::Binary(b.to_vec()),
            _ => continue,
        }
    }
}

/// Whether nothing arrives within `ms`.
pub(crate) async fn quiet(ws: &mut Socket, ms: u64) -> bool {
    tokio::time::timeout(Duration::from_millis(ms), ws.next())
        .await
        .is_err()
}

/// Messages up to and including the text answer whose `op` is `op` for `id`.
pub(crate) async fn until(ws: &mut Socket, id: u32, op: &str) -> (Vec<Got>, Value) {
    let mut seen = Vec::new();
    loop {
        match next(ws).await {
            Got::Text(v) if v["id"] == id && v["op"] == op => return (seen, v),
            g => seen.push(g),
        }
    }
}

/// The bytes of `stream` for `id` among protocol-2 binary frames.
pub(crate) fn bytes_of(frames: &[Got], id: u32, stream: u8) -> Vec<u8> {
    let mut out = Vec::new();
    for f in frames {
        if let Got::Binary(b) = f
            && b.len() >= 5
            && u32::from_be_bytes(b[..4].try_into().unwrap()) == id
            && b[4] == stream
        {
            out.extend_from_slice(&b[5..]);
        }
    }
    out
}

/// A plain HTTP GET, answered as (status line, body).
pub(crate) async fn get(addr: &str, path: &str, extra: &str) -> (String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\n{extra}\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out.lines().next().unwrap_or_default().to_string();
    let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    (status, body)
}

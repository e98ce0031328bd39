//! The streaming subresources: a pod's log, and exec and port-forward over WebSockets.
//!
//! The WebSockets are tokio-tungstenite over hyper's upgrade, so the subprotocol is the
//! fake's to choose, in the client's order of preference: `v5.channel.k8s.io` (unless
//! `--no-v5`), `v4.channel.k8s.io`, `v3.channel.k8s.io`, `v2.channel.k8s.io` and
//! `channel.k8s.io` for exec; `v4.channel.k8s.io` and `portforward.k8s.io` (the bare binary
//! channel protocol) for port-forward. Frames are binary (text ones are read the same way,
//! as the Python client sends a str), their first byte the channel: 0 stdin, 1 stdout, 2
//! stderr, 3 status, 4 resize; v5's `[255, channel]` closes a channel (stdin's end).
//!
//! Backpressure: a program's output is read only as fast as the socket takes it (one
//! bounded queue of frames between the readers and the socket's writer), so a client that
//! stops reading stops the program at the runner's window; stdin is written as it comes,
//! the socket read no faster than the program takes it.
//!
//! Port-forward to a pod whose box shares this machine's network (a local box, or network
//! host) connects to 127.0.0.1:PORT; to a pod with a network of its own (a namespace box's
//! default, or none) it runs `bash -c 'exec 3<>/dev/tcp/127.0.0.1/PORT ...'` in
//! the box, which is inside the box's network namespace, and carries the bytes over that
//! program's stdin and stdout (so the image needs bash; a failed connect is answered on the
//! port's error channel with bash's message).

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, ExecOptions, Process, Sandbox, Tty};
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};

use crate::kube::api::{ApiResult, Flag, Query, Shared};
use crate::kube::kubelet::PodRun;
use crate::kube::status::ApiError;
use crate::kube::store::Kind;

/// The largest frame read from a client.
const MAX_FRAME: usize = 1 << 20;
/// How many frames may wait for the socket before the program's output is read no further.
const QUEUE: usize = 16;
/// How much of a program's output one frame carries.
const CHUNK: usize = 32 * 1024;

/// How long a finished session still reads what its client sends, waiting for it to close.
const LINGER: Duration = Duration::from_secs(5);

/// The pod, its run, and the container a request names, or the real server's refusal.
/// A running pod: its object, its run and its box.
type Running = (Value, Arc<PodRun>, Arc<dyn Sandbox>);

fn running(s: &Shared, ns: &str, name: &str, q: &Query) -> Result<Running, ApiError> {
    let pod = s
        .store
        .get(Kind::Pod, ns, name)
        .ok_or_else(|| Kind::Pod.not_found(name))?;
    let container = pod["spec"]["containers"][0]["name"].as_str().unwrap_or("").to_string();
    if let Some(c) = q.get("container").filter(|c| !c.is_empty())
        && c != container
    {
        return Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {name}"
        )));
    }
    let phase = pod["status"]["phase"].as_str().unwrap_or("");
    if matches!(phase, "Succeeded" | "Failed") {
        return Err(ApiError::bad_request(format!(
            "cannot exec into a container in a completed pod; current phase is {phase}"
        )));
    }
    let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
    let run = s.kubelet.run_of(uid);
    match run.as_ref().and_then(|r| r.sandbox().map(|b| (r.clone(), b))) {
        Some((run, b)) if phase == "Running" => Ok((pod, run, b)),
        _ => Err(ApiError::bad_request(format!("container not found ({container:?})"))),
    }
}

/// `GET .../log`: the first process's output as kept (the newest [`crate::kube::kubelet::LOG_BOUND`]
/// bytes), `tailLines` and `limitBytes` applied; `follow=true` streams until the container ends.
pub(crate) async fn log(s: &Arc<Shared>, ns: &str, name: &str, q: &Query) -> ApiResult {
    let pod = s
        .store
        .get(Kind::Pod, ns, name)
        .ok_or_else(|| Kind::Pod.not_found(name))?;
    let container = pod["spec"]["containers"][0]["name"].as_str().unwrap_or("").to_string();
    if let Some(c) = q.get("container").filter(|c| !c.is_empty())
        && c != container
    {
        return Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {name}"
        )));
    }
    let state = &pod["status"]["containerStatuses"][0]["state"];
    let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
    let run = s.kubelet.run_of(uid);
    let started = state.get("running").is_some() || state.get("terminated").is_some();
    let Some(run) = run.filter(|_| started) else {
        let reason = state["waiting"]["reason"].as_str().unwrap_or("ContainerCreating");
        return Err(ApiError::bad_request(format!(
            "container {container:?} in pod {name:?} is waiting to start: {reason}"
        )));
    };
    let tail = match q.get("tailLines").filter(|t| !t.is_empty()) {
        Some(t) => Some(
            t.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("tailLines: invalid value {t:?}")))?,
        ),
        None => None,
    };
    let limit = match q.get("limitBytes").filter(|t| !t.is_empty()) {
        Some(t) => Some(
            t.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("limitBytes: invalid value {t:?}")))?,
        ),
        None => None,
    };
    let mut bytes = run.log();
    if let Some(n) = tail {
        let mut cut = bytes.len();
        let mut seen = 0;
        let body = if bytes.ends_with(b"\n") {
            &bytes[..bytes.len() - 1]
        } else {
            &bytes[..]
        };
        for (i, b) in body.iter().enumerate().rev() {
            if *b == b'\n' {
                seen += 1;
                if seen == n {
                    cut = i + 1;
                    break;
                }
            }
        }
        if seen < n {
            cut = 0;
        }
        if n == 0 {
            cut = bytes.len();
        }
        bytes.drain(..cut);
    }
    if let Some(l) = limit {
        bytes.truncate(l);
    }
    let text = |b: Body| {
        let mut r = Response::new(b);
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        r
    };
    if !q.flag("follow")? || *run.ended.borrow() {
        return Ok(text(Body::from(bytes)));
    }
    // Follow: what is kept now, then what comes, until the container ends.
    let (tx, mut rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let mut sent = run.log().len();
    tokio::spawn(async move {
        if tx.send(Ok(Bytes::from(bytes))).await.is_err() {
            return;
        }
        let mut ended = run.ended.subscribe();
        loop {
            let changed = run.log_changed.notified();
            let now = run.log();
            // The log is a window: where it moved past what was sent, go on from its start.
            let from = sent.min(now.len());
            if now.len() > from && tx.send(Ok(Bytes::copy_from_slice(&now[from..]))).await.is_err() {
                return;
            }
            sent = now.len();
            if *ended.borrow_and_update() {
                return;
            }
            tokio::select! {
                _ = changed => {}
                _ = ended.changed() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = tx.closed() => return,
            }
        }
    });
    Ok(text(Body::from_stream(futures_util::stream::poll_fn(move |cx| {
        rx.poll_recv(cx)
    }))))
}

/// The client's subprotocols, in its order.
fn offered(h: &HeaderMap) -> Vec<String> {
    h.get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

use crate::http::is_websocket;

/// The 101 answer, and the upgraded socket once hyper hands it over.
fn upgrade(req: Request, protocol: &str) -> Result<(Response, hyper::upgrade::OnUpgrade), ApiError> {
    crate::http::upgrade(req, protocol).map_err(|e| match e {
        crate::http::UpgradeRefused::NoKey => ApiError::bad_request("Sec-WebSocket-Key is missing"),
        crate::http::UpgradeRefused::Internal(e) => ApiError::internal(e),
    })
}

/// The first protocol of the client's that the server speaks; none offered is the bare
/// `channel.k8s.io` (the real server's default), one offered but none spoken a 400.
fn pick(h: &HeaderMap, supported: &[&str]) -> Result<String, ApiError> {
    let offered = offered(h);
    if offered.is_empty() {
        return Ok(String::new());
    }
    offered
        .iter()
        .find(|p| supported.contains(&p.as_str()))
        .cloned()
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "requested protocol(s) are not supported: {offered:?}; supports {supported:?}"
            ))
        })
}

async fn socket(on: hyper::upgrade::OnUpgrade) -> Option<WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>> {
    let up = match tokio::time::timeout(Duration::from_secs(10), on).await {
        Ok(Ok(u)) => u,
        _ => return None,
    };
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_FRAME))
        .max_frame_size(Some(MAX_FRAME));
    Some(WebSocketStream::from_raw_socket(TokioIo::new(up), Role::Server, Some(config)).await)
}

/// Close 1000: a client (gorilla's, in client-go) reads it as the streams' end, where a
/// close with no code (1005) is an error.
fn normal_close() -> Message {
    Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }))
}

fn frame(channel: u8, data: &[u8]) -> Message {
    let mut v = Vec::with_capacity(data.len() + 1);
    v.push(channel);
    v.extend_from_slice(data);
    Message::binary(v)
}

/// `GET .../exec?command=..&stdin=&stdout=&stderr=&tty=`, upgraded to a WebSocket.
pub(crate) async fn exec(s: Arc<Shared>, ns: &str, name: &str, q: Query, req: Request) -> ApiResult {
    let (_, run, b) = running(&s, ns, name, &q)?;
    let argv = q.all("command");
    if argv.is_empty() {
        return Err(ApiError::bad_request("you must specify at least 1 command"));
    }
    let (stdin, stdout, stderr, tty) = (q.flag("stdin")?, q.flag("stdout")?, q.flag("stderr")?, q.flag("tty")?);
    if !(stdin || stdout || stderr) {
        return Err(ApiError::bad_request(
            "you must specify at least 1 of stdin, stdout, stderr",
        ));
    }
    if !is_websocket(req.headers()) {
        return Err(ApiError::bad_request(
            "Upgrade request required: the agentbox fake speaks exec over WebSockets only (no SPDY)",
        ));
    }
    let mut supported = vec![];
    if s.v5 {
        supported.push("v5.channel.k8s.io");
    }
    supported.extend([
        "v4.channel.k8s.io",
        "v3.channel.k8s.io",
        "v2.channel.k8s.io",
        "channel.k8s.io",
    ]);
    let protocol = pick(req.headers(), &supported)?;
    let (resp, on) = upgrade(req, &protocol)?;
    let opts = ExecOptions {
        cwd: run.working_dir.clone(),
        tty: tty.then_some(Tty {
            rows: 24,
            cols: 80,
            term: None,
        }),
        ..Default::default()
    };
    let pod = name.to_string();
    tokio::spawn(async move {
        let Some(ws) = socket(on).await else { return };
        session(ws, &protocol, b, argv, opts, (stdin, stdout, stderr && !tty)).await;
        tracing::debug!(pod, "exec ended");
    });
    Ok(resp)
}

/// The Status an exit sends on channel 3 (v4 and v5), or the text older versions send.
fn exit_status(code: Result<i32, String>) -> Value {
    match code {
        Ok(0) => json!({"metadata": {}, "status": "Success"}),
        Ok(n) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("command terminated with non-zero exit code: error executing command [...], exit code {n}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": n.to_string()}]},
        }),
        Err(why) => json!({
            "metadata": {},
            "status": "Failure",
            "message": why,
            "reason": "InternalError",
            "code": 500,
        }),
    }
}

async fn session(
    ws: WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>,
    protocol: &str,
    b: Arc<dyn Sandbox>,
    argv: Vec<String>,
    opts: ExecOptions,
    (want_in, want_out, want_err): (bool, bool, bool),
) {
    let v5 = protocol == "v5.channel.k8s.io";
    let json_status = v5 || protocol == "v4.channel.k8s.io";
    let (mut sink, mut from) = ws.split();
    let (tx, mut rx) = mpsc::channel::<Message>(QUEUE);
    let writer = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            let close = matches!(m, Message::Close(_));
            if sink.send(m).await.is_err() || close {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let ctx = Ctx::background();
    let finish = |code: Result<i32, String>| {
        let status = exit_status(code);
        if json_status {
            frame(3, &serde_json::to_vec(&status).unwrap_or_default())
        } else {
            frame(3, status["message"].as_str().unwrap_or("").as_bytes())
        }
    };
    let asked = std::time::Instant::now();
    let mut p: Process = match b.exec(&argv, &opts, &ctx).await {
        Ok(p) => p,
        Err(e) => {
            let _ = tx
                .send(finish(Err(format!("failed to exec in container: {}", e.message()))))
                .await;
            let _ = tx.send(normal_close()).await;
            drop(tx);
            let _ = writer.await;
            return;
        }
    };
    tracing::debug!(box_id = %b.id(), ms = asked.elapsed().as_millis() as u64, "exec started");
    let mut stdin = p.stdin.take();
    if !want_in && let Some(mut s) = stdin.take() {
        let _ = s.close().await;
    }
    let mut pumps = Vec::new();
    for (r, ch, want) in [(p.stdout.take(), 1u8, want_out), (p.stderr.take(), 2u8, want_err)] {
        let Some(mut r) = r else { continue };
        let tx = tx.clone();
        pumps.push(tokio::spawn(async move {
            let mut buf = vec![0u8; CHUNK];
            loop {
                match r.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        // Not asked for: read and dropped, so the program is not held up.
                        if want && tx.send(frame(ch, &buf[..n])).await.is_err() {
                            break;
                        }
                    }
                }
            }
        }));
    }
    let killer = p.killer();
    // The client's frames: stdin, resizes, v5's close. The socket's end ends the program.
    let reader = async {
        while let Some(m) = from.next().await {
            let data = match m {
                Ok(Message::Binary(d)) => d.to_vec(),
                Ok(Message::Text(t)) => t.as_bytes().to_vec(),
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(_) => continue,
            };
            let Some((&ch, rest)) = data.split_first() else {
                continue;
            };
            match ch {
                0 => {
                    if let Some(s) = stdin.as_mut()
                        && s.write_all(rest).await.is_err()
                    {
                        stdin = None;
                    }
                }
                4 => {
                    if let Ok(v) = serde_json::from_slice::<Value>(rest) {
                        let (w, h) = (v["Width"].as_u64().unwrap_or(0), v["Height"].as_u64().unwrap_or(0));
                        if w > 0 && h > 0 {
                            let _ = killer
                                .resize(h.min(u16::MAX as u64) as u16, w.min(u16::MAX as u64) as u16)
                                .await;
                        }
                    }
                }
                255 if v5 && rest.first() == Some(&0) => {
                    if let Some(mut s) = stdin.take() {
                        let _ = s.close().await;
                    }
                }
                _ => {}
            }
        }
    };
    let code = tokio::select! {
        w = p.wait() => w.map(|s| s.code).map_err(|e| e.message().to_string()),
        // The client went: the program goes too (its context's end kills it).
        _ = reader => { ctx.cancel(); Err("the client went".into()) }
        _ = tx.closed() => { ctx.cancel(); Err("the client went".into()) }
    };
    for pump in pumps {
        let _ = tokio::time::timeout(Duration::from_secs(5), pump).await;
    }
    let _ = tx.send(finish(code)).await;
    let _ = tx.send(normal_close()).await;
    drop(tx);
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    ctx.cancel();
    linger(from).await;
}

/// The closing handshake's end, as a real server's: read (and drop) what the client still
/// sends, its answering close, a late ping or stdin's end, until it closes, for at most
/// [`LINGER`]. A socket closed with bytes unread is answered with a reset, which the client
/// may read before the frames it was sent last.
async fn linger<S: futures_util::Stream + Unpin>(mut from: S) {
    let _ = tokio::time::timeout(LINGER, async { while from.next().await.is_some() {} }).await;
}

/// `GET .../portforward?ports=N[,M]`, upgraded to a WebSocket.
pub(crate) async fn port_forward(s: Arc<Shared>, ns: &str, name: &str, q: Query, req: Request) -> ApiResult {
    let (pod, _run, b) = running(&s, ns, name, &q)?;
    let mut ports: Vec<u16> = Vec::new();
    for p in q
        .all("ports")
        .iter()
        .flat_map(|v| v.split(',').map(str::trim).map(str::to_string).collect::<Vec<_>>())
    {
        match p.parse::<u16>() {
            Ok(n) if n > 0 => ports.push(n),
            _ => return Err(ApiError::bad_request(format!("invalid port: {p:?}"))),
        }
    }
    if ports.is_empty() {
        return Err(ApiError::bad_request("query parameter \"ports\" is required"));
    }
    if ports.len() > 64 {
        return Err(ApiError::bad_request("at most 64 ports at once"));
    }
    if !is_websocket(req.headers()) {
        return Err(ApiError::bad_request(
            "Upgrade request required: the agentbox fake speaks port-forward over WebSockets only (no SPDY)",
        ));
    }
    let protocol = pick(req.headers(), &["v4.channel.k8s.io", "portforward.k8s.io"])?;
    let (resp, on) = upgrade(req, &protocol)?;
    let own_network = !matches!(b.facts().network, Some(agentbox_core::NetworkFact::Host));
    let uid = pod["metadata"]["uid"].as_str().unwrap_or("").to_string();
    let pod_name = name.to_string();
    tokio::spawn(async move {
        let Some(ws) = socket(on).await else { return };
        forward(ws, ports, own_network, b, &pod_name, &uid).await;
    });
    Ok(resp)
}

/// One forwarded port's connection: a TCP stream, or a relay program in the box.
enum Conn {
    Tcp(tokio::net::TcpStream),
    Relay(Process, Ctx),
}

async fn connect(port: u16, own_network: bool, b: &Arc<dyn Sandbox>) -> Result<Conn, String> {
    if !own_network {
        return tokio::time::timeout(
            Duration::from_secs(10),
            tokio::net::TcpStream::connect(("127.0.0.1", port)),
        )
        .await
        .map_err(|_| format!("dial tcp4 127.0.0.1:{port}: i/o timeout"))?
        .map(Conn::Tcp)
        .map_err(|e| format!("dial tcp4 127.0.0.1:{port}: connect: {e}"));
    }
    let argv = [
        "bash".to_string(),
        "-c".to_string(),
        // The connect inside the box's network namespace; then both directions at once.
        "exec 3<>\"/dev/tcp/127.0.0.1/$0\" || exit 1; cat <&3 & cat >&3; wait".to_string(),
        port.to_string(),
    ];
    let ctx = Ctx::background();
    let p = b
        .exec(&argv, &ExecOptions::default(), &ctx)
        .await
        .map_err(|e| format!("starting the relay in the box: {}", e.message()))?;
    Ok(Conn::Relay(p, ctx))
}

async fn forward(
    ws: WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>,
    ports: Vec<u16>,
    own_network: bool,
    b: Arc<dyn Sandbox>,
    pod: &str,
    uid: &str,
) {
    let (mut sink, mut from) = ws.split();
    let (tx, mut rx) = mpsc::channel::<Message>(QUEUE);
    let writer = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            let close = matches!(m, Message::Close(_));
            if sink.send(m).await.is_err() || close {
                break;
            }
        }
        let _ = sink.close().await;
    });
    // Each channel opens with its port, little-endian.
    for (i, port) in ports.iter().enumerate() {
        for ch in [2 * i as u8, 2 * i as u8 + 1] {
            if tx.send(frame(ch, &port.to_le_bytes())).await.is_err() {
                return;
            }
        }
    }
    let mut inputs: Vec<Option<mpsc::Sender<Vec<u8>>>> = Vec::new();
    let mut pumps = Vec::new();
    let mut ctxs = Vec::new();
    for (i, port) in ports.iter().copied().enumerate() {
        let data_ch = 2 * i as u8;
        match connect(port, own_network, &b).await {
            Err(why) => {
                let msg = format!("error forwarding port {port} to pod {pod}, uid {uid}: {why}");
                let _ = tx.send(frame(data_ch + 1, msg.as_bytes())).await;
                inputs.push(None);
            }
            Ok(conn) => {
                let (in_tx, mut in_rx) = mpsc::channel::<Vec<u8>>(QUEUE);
                inputs.push(Some(in_tx));
                let tx = tx.clone();
                match conn {
                    Conn::Tcp(stream) => {
                        let (mut r, mut w) = stream.into_split();
                        pumps.push(tokio::spawn(async move {
                            let up = async {
                                while let Some(d) = in_rx.recv().await {
                                    if w.write_all(&d).await.is_err() {
                                        break;
                                    }
                                }
                                let _ = w.shutdown().await;
                                std::future::pending::<()>().await
                            };
                            let down = async {
                                let mut buf = vec![0u8; CHUNK];
                                while let Ok(n) = r.read(&mut buf).await {
                                    if n == 0 || tx.send(frame(data_ch, &buf[..n])).await.is_err() {
                                        break;
                                    }
                                }
                            };
                            tokio::select! { _ = up => {}, _ = down => {} }
                        }));
                    }
                    Conn::Relay(mut p, ctx) => {
                        let mut stdin = p.stdin.take();
                        let out = p.stdout.take();
                        let err = p.stderr.take();
                        ctxs.push(ctx);
                        pumps.push(tokio::spawn(async move {
                            let up = async {
                                while let Some(d) = in_rx.recv().await {
                                    let Some(s) = stdin.as_mut() else { break };
                                    if s.write_all(&d).await.is_err() {
                                        break;
                                    }
                                }
                                if let Some(mut s) = stdin.take() {
                                    let _ = s.close().await;
                                }
                                std::future::pending::<()>().await
                            };
                            let down = async {
                                if let Some(mut r) = out {
                                    let mut buf = vec![0u8; CHUNK];
                                    while let Ok(n) = r.read(&mut buf).await {
                                        if n == 0 || tx.send(frame(data_ch, &buf[..n])).await.is_err() {
                                            break;
                                        }
                                    }
                                }
                                // The relay's end: a failed connect says why on stderr.
                                let mut said = Vec::new();
                                if let Some(mut e) = err {
                                    let _ = tokio::time::timeout(
                                        Duration::from_secs(2),
                                        (&mut e).take(4096).read_to_end(&mut said),
                                    )
                                    .await;
                                }
                                let code = tokio::time::timeout(Duration::from_secs(2), p.wait()).await;
                                if !matches!(code, Ok(Ok(ref s)) if s.code == 0) && !said.is_empty() {
                                    let msg = format!(
                                        "error forwarding port {port}: {}",
                                        String::from_utf8_lossy(&said).trim()
                                    );
                                    let _ = tx.send(frame(data_ch + 1, msg.as_bytes())).await;
                                }
                            };
                            tokio::select! { _ = up => {}, _ = down => {} }
                        }));
                    }
                }
            }
        }
    }
    let all_done = async {
        for p in pumps {
            let _ = p.await;
        }
    };
    let reader = async {
        while let Some(m) = from.next().await {
            let data = match m {
                Ok(Message::Binary(d)) => d.to_vec(),
                Ok(Message::Text(t)) => t.as_bytes().to_vec(),
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(_) => continue,
            };
            let Some((&ch, rest)) = data.split_first() else {
                continue;
            };
            let i = (ch / 2) as usize;
            if ch % 2 == 0
                && !rest.is_empty()
                && let Some(Some(input)) = inputs.get(i)
                && input.send(rest.to_vec()).await.is_err()
            {
                inputs[i] = None;
            }
        }
        // The client closed: nothing more can reach it, so every connection ends.
    };
    tokio::select! {
        _ = all_done => {}
        _ = reader => {}
    }
    let _ = tx.send(normal_close()).await;
    drop(tx);
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    for c in ctxs {
        c.cancel();
    }
    linger(from).await;
}

//! Live streams over WebSockets: a process's output as it comes (from a byte cursor, so a
//! client that reconnects with `after` = the next byte it wants loses nothing the box still
//! keeps, and is told of a gap when it lost some), and terminals (a program started in a
//! terminal, streamed the same way; its keys go in as `stdin` messages, its size as `resize`).
//!
//! The output is read from the box's runner with long polls, so a stream costs the server a
//! task and a socket, not a thread. Messages are [`crate::ws::ServerMessage`] and
//! [`crate::ws::ClientMessage`].

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, ErrorCode, ExecOptions, Sandbox, Tty};
use axum::extract::{Path, Query, Request, State};
use axum::response::Response;
use base64::Engine;
use futures_util::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use schemars::JsonSchema;
use serde::Deserialize;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use super::boxes::{BoxPath, CALL_DEADLINE, reach};
use super::processes::{ProcessPath, processes, signal_of};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;
use crate::ws::{self, ClientMessage, ServerMessage, Socket};

/// How long a refused client is given to finish sending and close, and a client whose
/// program ended to close.
const LINGER: Duration = Duration::from_secs(5);
/// How often the server pings a stream's client.
const PING: Duration = Duration::from_secs(30);
/// A client that answers nothing (not even a ping) this long is gone: its stream ends.
const SILENT: Duration = Duration::from_secs(90);
/// How long one message may take to go out to a client.
const WRITE_DEADLINE: Duration = Duration::from_secs(30);
/// How long one poll of the box waits for output before asking again.
const POLL: Duration = Duration::from_secs(10);
/// The most bytes of output one poll takes (a message is at most this, base64'd).
const POLL_BYTES: usize = 256 << 10;

/// Where a stream starts.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamFrom {
    /// The number of the first byte wanted: 0, or where the last stream stopped.
    #[serde(default)]
    pub after: u64,
}

/// The terminal to open.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenTerminal {
    /// Rows (default 24).
    #[serde(default = "rows")]
    pub rows: u16,
    /// Columns (default 80).
    #[serde(default = "cols")]
    pub cols: u16,
    /// `TERM` for the program (default `xterm-256color`).
    #[serde(default)]
    pub term: Option<String>,
    /// A shell command to run in it (default: a login shell, `sh -l`).
    #[serde(default)]
    pub command: Option<String>,
    /// Its working directory (default the workspace).
    #[serde(default)]
    pub cwd: Option<String>,
}

fn rows() -> u16 {
    24
}
fn cols() -> u16 {
    80
}

/// `GET /v1/boxes/{id}/processes/{handle}/stream` (a WebSocket).
pub(crate) async fn stream(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<ProcessPath>,
    Query(q): Query<StreamFrom>,
    req: Request,
) -> Result<Response, ApiError> {
    let b = reach(&state, &key, &p.id).await?;
    processes(b.as_ref())?;
    tracing::info!(box_id = %b.id(), handle = p.handle, after = q.after, key = %key.name, "stream opened");
    let open = state.metrics.stream_opened();
    ws::upgrade(req, move |socket| async move {
        serve(socket, b, p.handle, q.after, None).await;
        drop(open);
    })
}

/// `GET /v1/boxes/{id}/terminal` (a WebSocket): a program in a terminal, started detached (so
/// a client that drops reattaches with the `started` handle), streamed from its first byte.
pub(crate) async fn terminal(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
    Query(q): Query<OpenTerminal>,
    req: Request,
) -> Result<Response, ApiError> {
    // Not an upgrade: refused before a program starts that no socket would ever reach.
    ws::check(&req)?;
    let b = reach(&state, &key, &p.id).await?;
    processes(b.as_ref())?;
    let argv = match q.command {
        Some(c) => vec!["sh".to_string(), "-c".to_string(), c],
        None => vec!["sh".to_string(), "-l".to_string()],
    };
    let opts = ExecOptions {
        cwd: q.cwd,
        tty: Some(Tty {
            rows: q.rows,
            cols: q.cols,
            term: q.term,
        }),
        detach: true,
        ..Default::default()
    };
    opts.validate(&argv)?;
    let process = b
        .exec(&argv, &opts, &Ctx::background().with_timeout(CALL_DEADLINE))
        .await?;
    let handle = process.handle().ok_or_else(|| {
        ApiError::new(
            ErrorCode::Unknown,
            format!("box {}: a detached terminal came back with no handle", b.id()),
        )
    })?;
    tracing::info!(box_id = %b.id(), handle, key = %key.name, "terminal opened");
    let open = state.metrics.stream_opened();
    // An upgrade that never completes drops this closure unrun: its program ends with it.
    let unclaimed = Unclaimed {
        b: Some(b.clone()),
        handle,
    };
    ws::upgrade(req, move |socket| async move {
        let mut claimed = unclaimed;
        claimed.b = None;
        serve(socket, b, handle, 0, Some(handle)).await;
        drop(open);
    })
}

/// A terminal's program no socket took: killed and forgotten when dropped still holding its box.
struct Unclaimed {
    b: Option<Arc<dyn Sandbox>>,
    handle: u64,
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        let (Some(b), handle) = (self.b.take(), self.handle) else {
            return;
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Some(p) = b.processes() {
                    let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
                    let _ = p.signal(handle, 9, &ctx).await;
                    // Its end read (what it printed dropped), then the box lets it go.
                    let mut after = 0;
                    for _ in 0..5 {
                        match p.read(handle, after, Duration::from_secs(2), POLL_BYTES, &ctx).await {
                            Ok(r) if r.exit.is_some() => break,
                            Ok(r) => after = r.next,
                            Err(_) => break,
                        }
                    }
                    let _ = p.forget(handle, &ctx).await;
                }
                tracing::info!(box_id = %b.id(), handle, "a terminal no socket took was ended");
            });
        }
    }
}

/// Serve one stream until the program ends, the client leaves, or a frame is out of protocol.
async fn serve(socket: Socket, b: Arc<dyn Sandbox>, handle: u64, after: u64, started: Option<u64>) {
    let (mut sink, mut incoming) = socket.split();
    let (tx, mut rx) = mpsc::channel::<Message>(16);
    // One writer: output and answers to the client's frames go out in order.
    let writer = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            let closing = matches!(m, Message::Close(_));
            // A client that stopped reading is let go, not waited for.
            match tokio::time::timeout(WRITE_DEADLINE, sink.send(m)).await {
                Ok(Ok(())) if !closing => {}
                _ => break,
            }
        }
        let _ = sink.flush().await;
        sink
    });
    if let Some(h) = started {
        let _ = tx.send(ServerMessage::Started { handle: h }.frame()).await;
    }
    let mut output = tokio::spawn(pump(b.clone(), handle, after, tx.clone()));
    let mut refused = false;
    let mut pumping = true;
    // Once the output is all sent (or cannot be), the client has LINGER to close.
    let mut ending: Option<tokio::time::Instant> = None;
    let mut ping = tokio::time::interval(PING);
    let mut heard = tokio::time::Instant::now();
    loop {
        let frame = tokio::select! {
            f = incoming.next() => f,
            _ = &mut output, if pumping => {
                pumping = false;
                ending = Some(tokio::time::Instant::now() + LINGER);
                continue;
            }
            _ = ping.tick() => {
                if heard.elapsed() > SILENT {
                    tracing::info!(box_id = %b.id(), handle, "stream closed: the client answered nothing for {} s", SILENT.as_secs());
                    break;
                }
                let _ = tx.try_send(Message::Ping(Vec::new().into()));
                continue;
            }
            _ = tokio::time::sleep_until(ending.unwrap_or_else(tokio::time::Instant::now)), if ending.is_some() => break,
        };
        let Some(frame) = frame else { break };
        heard = tokio::time::Instant::now();
        let answer = match frame {
            Ok(Message::Text(t)) => match ws::parse(t.as_bytes()) {
                Ok(m) => {
                    // A message that could not be done is said; the stream goes on.
                    if let Err(e) = apply(b.as_ref(), handle, m).await {
                        let _ = tx.send(ServerMessage::error(&e).frame()).await;
                    }
                    None
                }
                Err(e) => Some((e, CloseCode::Policy)),
            },
            Ok(Message::Binary(_)) => Some((
                ApiError::new(
                    ErrorCode::Invalid,
                    "a frame out of protocol: binary frames are not read (send JSON text)",
                ),
                CloseCode::Unsupported,
            )),
            Ok(Message::Close(_)) => break,
            Ok(_) => None,
            Err(e) => {
                let size = matches!(e, tokio_tungstenite::tungstenite::Error::Capacity(_));
                let e = ApiError::new(ErrorCode::Invalid, format!("a frame out of protocol: {e}"));
                Some((e, if size { CloseCode::Size } else { CloseCode::Protocol }))
            }
        };
        if let Some((e, code)) = answer {
            tracing::info!(box_id = %b.id(), handle, "stream closed: {}", e.message());
            let _ = tx.send(ServerMessage::error(&e).frame()).await;
            let _ = tx.send(close(code, "out of protocol")).await;
            refused = true;
            break;
        }
    }
    output.abort();
    drop(tx);
    let Ok(sink) = writer.await else { return };
    if refused && let Ok(mut socket) = incoming.reunite(sink) {
        linger(socket.get_mut()).await;
    }
}

/// Read and drop what the client still sends, until it closes or [`LINGER`] passes: a socket
/// closed with unread bytes is reset, and a reset can take the error and the close frame just
/// sent with it (a client still sending an oversized frame would never learn why).
async fn linger(io: &mut TokioIo<hyper::upgrade::Upgraded>) {
    let mut buf = vec![0u8; 64 << 10];
    let until = tokio::time::Instant::now() + LINGER;
    while let Ok(Ok(n)) = tokio::time::timeout_at(until, io.read(&mut buf)).await {
        if n == 0 {
            break;
        }
    }
}

fn close(code: CloseCode, reason: &'static str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

/// The output from `after` on, to the client, until the program's end.
async fn pump(b: Arc<dyn Sandbox>, handle: u64, mut after: u64, tx: mpsc::Sender<Message>) {
    let b64 = base64::engine::general_purpose::STANDARD;
    loop {
        let ctx = Ctx::background().with_timeout(POLL + CALL_DEADLINE);
        let read = match processes(b.as_ref()) {
            Ok(p) => p
                .read(handle, after, POLL, POLL_BYTES, &ctx)
                .await
                .map_err(ApiError::from),
            Err(e) => Err(e),
        };
        let read = match read {
            Ok(r) => r,
            Err(e) => {
                let _ = tx.send(ServerMessage::error(&e).frame()).await;
                let _ = tx.send(close(CloseCode::Error, "the box did not answer")).await;
                return;
            }
        };
        if let Some(from) = read.gap_from {
            let gap = ServerMessage::Gap { from: after, to: from };
            if tx.send(gap.frame()).await.is_err() {
                return;
            }
        }
        for c in read.chunks {
            let m = ServerMessage::Output {
                seq: c.seq,
                stream: c.stream,
                data: b64.encode(&c.bytes),
            };
            if tx.send(m.frame()).await.is_err() {
                return;
            }
        }
        after = read.next;
        if let Some(exit) = read.exit {
            let _ = tx.send(ServerMessage::Exit { exit, next: after }.frame()).await;
            let _ = tx.send(close(CloseCode::Normal, "the program ended")).await;
            return;
        }
    }
}

/// Do what a client's message asks.
async fn apply(b: &dyn Sandbox, handle: u64, m: ClientMessage) -> Result<(), ApiError> {
    let procs = processes(b)?;
    let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
    match m {
        ClientMessage::Stdin {
            data,
            data_base64,
            close,
        } => {
            let bytes = match data_base64 {
                Some(d) => base64::engine::general_purpose::STANDARD
                    .decode(d.as_bytes())
                    .map_err(|e| ApiError::new(ErrorCode::Invalid, format!("stdin data_base64: {e}")))?,
                None => data.into_bytes(),
            };
            procs.write(handle, &bytes, close, &ctx).await?;
        }
        ClientMessage::Resize { rows, cols } => procs.resize(handle, rows, cols, &ctx).await?,
        ClientMessage::Signal { signal } => procs.signal(handle, signal_of(&signal)?, &ctx).await?,
    }
    Ok(())
}

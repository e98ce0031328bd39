//! What carries a runner's messages: HTTP and WebSocket on TCP and unix sockets, length-prefixed
//! messages on a byte stream (stdio), and the relay from one to the other.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use agentbox_protocol::runner::{MAX_MESSAGE, Message, stream_len};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::{self, protocol::WebSocketConfig};

use super::conn::{self, Inbound};
use super::{Config, HEALTH, Listen, Runner, health_json};

/// Set in the environment of the copy a `--detach` runner starts, which announces itself on
/// stdout and then lets go of its stdio.
pub(crate) const DETACHED_ENV: &str = "AGENTBOX_RUNNER_DETACHED";
/// The largest HTTP request head read before a request is refused.
const MAX_HEAD: usize = 16 << 10;
/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// The WebSocket's own bound is twice the protocol's, so a message between the two is read,
/// answered `too_large`, and the connection goes on; past twice, the connection is closed.
fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(2 * MAX_MESSAGE))
        .max_frame_size(Some(2 * MAX_MESSAGE))
}

fn over_bound(len: usize) -> Inbound {
    Inbound::Bad(format!(
        "a message of {len} bytes is over the runner's {MAX_MESSAGE}-byte bound"
    ))
}

/// Serve until killed (listening), or until the stdio connection and its processes ended.
pub(crate) async fn serve(config: Config, runner: Arc<Runner>, detached: bool) -> Result<(), String> {
    let mut announce = Vec::new();
    for l in &config.listen {
        match l {
            Listen::Tcp(addr) => {
                let ln = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|e| format!("listening on {addr}: {e}"))?;
                let local = ln.local_addr().map_err(|e| e.to_string())?;
                announce.push(format!("listening {local}"));
                let runner = runner.clone();
                tokio::spawn(async move {
                    loop {
                        if let Ok((s, _)) = ln.accept().await {
                            let _ = s.set_nodelay(true);
                            tokio::spawn(http(s, runner.clone(), true));
                        }
                    }
                });
            }
            Listen::Unix(path) => {
                if tokio::net::UnixStream::connect(path).await.is_ok() {
                    return Err(format!("unix:{}: a runner already listens there", path.display()));
                }
                let _ = std::fs::remove_file(path);
                let ln = tokio::net::UnixListener::bind(path)
                    .map_err(|e| format!("listening on unix:{}: {e}", path.display()))?;
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                    .map_err(|e| format!("unix:{}: {e}", path.display()))?;
                announce.push(format!("listening unix:{}", path.display()));
                let runner = runner.clone();
                tokio::spawn(async move {
                    loop {
                        if let Ok((s, _)) = ln.accept().await {
                            tokio::spawn(http(s, runner.clone(), false));
                        }
                    }
                });
            }
        }
    }
    if detached {
        for line in &announce {
            println!("{line}");
        }
        println!("ready {}", std::process::id());
        let _ = std::io::Write::flush(&mut std::io::stdout());
        let null = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .map_err(|e| format!("/dev/null: {e}"))?;
        let _ = rustix::stdio::dup2_stdin(&null);
        let _ = rustix::stdio::dup2_stdout(&null);
        let _ = rustix::stdio::dup2_stderr(&null);
    } else {
        for line in &announce {
            eprintln!("agentbox-runner: {line}");
        }
    }
    if config.stdio {
        let (in_tx, in_rx) = mpsc::channel(16);
        let (out_tx, out_rx) = mpsc::channel(64);
        let reader = tokio::spawn(read_messages(tokio::io::stdin(), in_tx));
        let writer = tokio::spawn(write_messages(tokio::io::stdout(), out_rx));
        conn::serve(runner.clone(), in_rx, out_tx, true).await;
        reader.abort();
        let _ = writer.await;
        // A dropped connection ends no process: wait for them, unless others may still connect.
        if config.listen.is_empty() {
            while !runner.procs.lock().unwrap().is_empty() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            return Ok(());
        }
    }
    std::future::pending::<()>().await;
    Ok(())
}

/// Start a copy of this program without `--detach`, in a session of its own, pass on what it
/// announces, and return once it is ready.
pub(crate) fn detach() -> Result<(), String> {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--detach").collect();
    let mut cmd = std::process::Command::new(exe);
    cmd.args(&args)
        .env(DETACHED_ENV, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe
    // calls are sound: setsid is one, allocates nothing and touches no memory of this process.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| rustix::process::setsid().map(|_| ()).map_err(std::io::Error::from));
    }
    let mut child = cmd.spawn().map_err(|e| format!("starting the detached runner: {e}"))?;
    let stdout = child.stdout.take().ok_or("the detached runner has no stdout")?;
    for line in std::io::BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        println!("{line}");
        if line.starts_with("ready ") {
            return Ok(());
        }
    }
    let mut why = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut why);
    }
    let _ = child.wait();
    Err(format!("the detached runner ended before it was ready: {}", why.trim()))
}

/// One HTTP connection: health, or the upgrade to the runner's WebSocket.
async fn http<S>(mut s: S, runner: Arc<Runner>, need_token: bool)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let end = loop {
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if head.len() > MAX_HEAD {
            return respond(
                &mut s,
                "431 Request Header Fields Too Large",
                "the request head is over 16 KiB",
            )
            .await;
        }
        match tokio::time::timeout(HEAD_TIMEOUT, s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
            _ => return,
        }
    };
    let (path, upgrade, authorized) = {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        if !matches!(req.parse(&head[..end]), Ok(httparse::Status::Complete(_))) {
            return respond(&mut s, "400 Bad Request", "not an HTTP request").await;
        }
        let header = |name: &str| {
            req.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).into_owned())
        };
        let upgrade = header("upgrade").is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
        let authorized = match (&runner.token, need_token) {
            // `Authorization: Bearer`, or the same token in a header of agentbox's own for a
            // path through a proxy that reads Authorization as its own credential (Daytona's
            // preview proxy tries every bearer as a Daytona key).
            (Some(t), true) => {
                header("authorization").is_some_and(|a| same(a.as_bytes(), format!("Bearer {t}").as_bytes()))
                    || header(agentbox_protocol::runner::TOKEN_HEADER).is_some_and(|a| same(a.as_bytes(), t.as_bytes()))
            }
            _ => true,
        };
        let path = req.path.unwrap_or("/").split('?').next().unwrap_or("/").to_string();
        (path, upgrade, authorized)
    };
    if !authorized {
        return respond(&mut s, "401 Unauthorized", "the runner wants its bearer token").await;
    }
    if !upgrade {
        if path == HEALTH {
            let body = health_json();
            let msg = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(msg.as_bytes()).await;
            let _ = s.shutdown().await;
            return;
        }
        return respond(
            &mut s,
            "404 Not Found",
            "the runner answers its health and its WebSocket",
        )
        .await;
    }
    let s = Prefixed {
        pre: head,
        pos: 0,
        inner: s,
    };
    let Ok(ws) = tokio_tungstenite::accept_async_with_config(s, Some(ws_config())).await else {
        return;
    };
    websocket(ws, runner).await;
}

/// Compare without leaking where two byte strings differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn respond<S: AsyncWrite + Unpin>(s: &mut S, status: &str, body: &str) {
    let msg = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(msg.as_bytes()).await;
    let _ = s.shutdown().await;
}

/// Serve one WebSocket until either side closes it.
async fn websocket<S>(ws: tokio_tungstenite::WebSocketStream<S>, runner: Arc<Runner>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = ws.split();
    let (in_tx, in_rx) = mpsc::channel(16);
    let (out_tx, mut out_rx) = mpsc::channel::<Message>(64);
    let oversize = out_tx.clone();
    let reader = tokio::spawn(async move {
        while let Some(m) = stream.next().await {
            let inbound = match m {
                Ok(tungstenite::Message::Text(t)) if t.len() > MAX_MESSAGE => over_bound(t.len()),
                Ok(tungstenite::Message::Binary(b)) if b.len() > MAX_MESSAGE => over_bound(b.len()),
                Ok(tungstenite::Message::Text(t)) => Inbound::Message(Message::Text(t.to_string())),
                Ok(tungstenite::Message::Binary(b)) => Inbound::Message(Message::Binary(b.to_vec())),
                Ok(tungstenite::Message::Close(_)) => break,
                Ok(_) => continue,
                Err(tungstenite::Error::Capacity(e)) => {
                    // Past the bound the stream cannot go on: say why, then close.
                    let a = agentbox_protocol::runner::Answer::error(
                        None,
                        "too_large",
                        format!("a message over the runner's {MAX_MESSAGE}-byte bound: {e}"),
                    );
                    let _ = oversize.send(Message::Text(super::process::json(&a))).await;
                    break;
                }
                Err(_) => break,
            };
            if in_tx.send(inbound).await.is_err() {
                break;
            }
        }
    });
    let writer = tokio::spawn(async move {
        while let Some(m) = out_rx.recv().await {
            let m = match m {
                Message::Text(t) => tungstenite::Message::text(t),
                Message::Binary(b) => tungstenite::Message::binary(b),
            };
            if sink.send(m).await.is_err() {
                return;
            }
        }
        let _ = sink.close().await;
    });
    conn::serve(runner, in_rx, out_tx, false).await;
    reader.abort();
    let _ = writer.await;
}

/// Read length-prefixed messages until the stream ends or a length is over the bound (which
/// cannot be skipped: the stream is then out of step, and is answered and dropped).
pub(crate) async fn read_messages<R: AsyncRead + Unpin>(mut r: R, tx: mpsc::Sender<Inbound>) {
    loop {
        let mut prefix = [0u8; 4];
        if r.read_exact(&mut prefix).await.is_err() {
            return;
        }
        let n = match stream_len(prefix) {
            Ok(n) => n,
            Err(why) => {
                let _ = tx.send(Inbound::Bad(why)).await;
                return;
            }
        };
        let mut body = vec![0u8; n];
        if r.read_exact(&mut body).await.is_err() {
            return;
        }
        let inbound = match Message::decode(body) {
            Ok(m) => Inbound::Message(m),
            Err(why) => Inbound::Bad(why),
        };
        if tx.send(inbound).await.is_err() {
            return;
        }
    }
}

/// Write messages, length-prefixed, until the channel closes.
pub(crate) async fn write_messages<W: AsyncWrite + Unpin>(mut w: W, mut rx: mpsc::Receiver<Message>) {
    while let Some(m) = rx.recv().await {
        if w.write_all(&m.encode()).await.is_err() || w.flush().await.is_err() {
            return;
        }
    }
    let _ = w.shutdown().await;
}

/// `agentbox-runner relay unix:PATH`: carry length-prefixed messages on stdin and stdout to the
/// runner listening at PATH, and its answers back, until either side ends.
pub fn relay(target: &str) -> Result<(), String> {
    let path = target
        .strip_prefix("unix:")
        .ok_or_else(|| format!("relay {target:?}: name a runner's socket as unix:PATH"))?
        .to_string();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))?;
    rt.block_on(async move {
        let s = tokio::net::UnixStream::connect(&path)
            .await
            .map_err(|e| format!("relay: connecting to unix:{path}: {e}"))?;
        let (ws, _) = tokio_tungstenite::client_async_with_config("ws://runner/", s, Some(ws_config()))
            .await
            .map_err(|e| format!("relay: the runner at unix:{path} did not open a WebSocket: {e}"))?;
        let (mut sink, mut stream) = ws.split();
        let (in_tx, mut in_rx) = mpsc::channel(16);
        let (out_tx, out_rx) = mpsc::channel(64);
        let up = tokio::spawn(read_messages(tokio::io::stdin(), in_tx));
        let down = tokio::spawn(write_messages(tokio::io::stdout(), out_rx));
        let to_runner = async {
            while let Some(inbound) = in_rx.recv().await {
                let m = match inbound {
                    Inbound::Message(Message::Text(t)) => tungstenite::Message::text(t),
                    Inbound::Message(Message::Binary(b)) => tungstenite::Message::binary(b),
                    Inbound::Bad(why) => {
                        // Answered here, as the runner would: the stream goes on.
                        let a = agentbox_protocol::runner::Answer::error(None, "invalid", why);
                        let _ = out_tx.send(Message::Text(super::process::json(&a))).await;
                        continue;
                    }
                };
                if sink.send(m).await.is_err() {
                    break;
                }
            }
            let _ = sink.close().await;
        };
        let from_runner = async {
            while let Some(Ok(m)) = stream.next().await {
                let m = match m {
                    tungstenite::Message::Text(t) => Message::Text(t.to_string()),
                    tungstenite::Message::Binary(b) => Message::Binary(b.to_vec()),
                    tungstenite::Message::Close(_) => break,
                    _ => continue,
                };
                if out_tx.send(m).await.is_err() {
                    break;
                }
            }
        };
        tokio::select! {
            _ = to_runner => {}
            _ = from_runner => {}
        }
        up.abort();
        drop(out_tx);
        let _ = tokio::time::timeout(Duration::from_secs(5), down).await;
        Ok(())
    })
}

/// A stream whose first bytes were already read (an HTTP head), replayed before the rest.
struct Prefixed<S> {
    pre: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if self.pos < self.pre.len() {
            let n = (self.pre.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.pre[start..start + n]);
            self.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

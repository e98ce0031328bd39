//! How a client reaches a runner: a WebSocket over TCP (with a bearer token) or a unix socket,
//! or the length-prefixed stream of one long exec (`agentbox-runner relay`). Each gives the
//! same pair of message channels.

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Error, ExecOptions, Result, Sandbox};
use agentbox_protocol::runner::{MAX_MESSAGE, Message, stream_len};
use async_trait::async_trait;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest, protocol::WebSocketConfig};

/// How long a connection may take to open.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a TCP connection to a runner may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the client pings its runner.
const PING_EVERY: Duration = Duration::from_secs(3);
/// How long a runner may be silent (no answer, no pong) before its connection is dropped.
const SILENT: Duration = Duration::from_secs(10);

/// An open connection: messages out, messages in (ending when the connection drops).
pub struct Link {
    /// To the runner.
    pub tx: mpsc::Sender<Message>,
    /// From the runner.
    pub rx: mpsc::Receiver<Message>,
}

/// Opens connections to one runner.
#[async_trait]
pub trait Dial: Send + Sync + 'static {
    /// A new connection.
    async fn dial(&self, ctx: &Ctx) -> Result<Link>;
    /// Where, for messages (never a secret).
    fn describe(&self) -> String;
}

/// Where a runner listens, as the host reaches it.
#[derive(Clone)]
pub enum Address {
    /// `host:port`, with the bearer token its runner was started with.
    Tcp {
        /// `host:port`.
        addr: String,
        /// The token, sent as `Authorization: Bearer …`.
        token: Option<String>,
    },
    /// A unix socket's path on this machine.
    Unix(std::path::PathBuf),
}

impl std::fmt::Debug for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is never printed.
        f.write_str(&self.to_string())
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Tcp { addr, .. } => write!(f, "the runner at {addr}"),
            Address::Unix(p) => write!(f, "the runner at unix:{}", p.display()),
        }
    }
}

pub(crate) fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE))
}

#[async_trait]
impl Dial for Address {
    async fn dial(&self, ctx: &Ctx) -> Result<Link> {
        let open = async {
            match self {
                Address::Tcp { addr, token } => {
                    // A box's address that vanished with it answers nothing: give up soon.
                    let tcp = match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
                        Ok(r) => r.map_err(|e| Error::io(e, format!("connecting to {self}")))?,
                        Err(_) => {
                            return Err(Error::transfer_failed(format!(
                                "{self}: no connection within {}s",
                                CONNECT_TIMEOUT.as_secs()
                            )));
                        }
                    };
                    let _ = tcp.set_nodelay(true);
                    let mut req = format!("ws://{addr}/")
                        .into_client_request()
                        .map_err(|e| Error::invalid(format!("{self}: {e}")))?;
                    if let Some(t) = token {
                        let v = format!("Bearer {t}")
                            .parse()
                            .map_err(|_| Error::invalid("the runner's token is not a header value"))?;
                        req.headers_mut().insert("authorization", v);
                    }
                    let (ws, _) = tokio_tungstenite::client_async_with_config(req, tcp, Some(ws_config()))
                        .await
                        .map_err(|e| Error::transfer_failed(format!("{self} did not open its WebSocket: {e}")))?;
                    Ok(websocket(ws))
                }
                Address::Unix(p) => {
                    let s = tokio::net::UnixStream::connect(p)
                        .await
                        .map_err(|e| Error::io(e, format!("connecting to {self}")))?;
                    let (ws, _) = tokio_tungstenite::client_async_with_config("ws://runner/", s, Some(ws_config()))
                        .await
                        .map_err(|e| Error::transfer_failed(format!("{self} did not open its WebSocket: {e}")))?;
                    Ok(websocket(ws))
                }
            }
        };
        match ctx.run(tokio::time::timeout(OPEN_TIMEOUT, open)).await? {
            Ok(r) => r,
            Err(_) => Err(Error::timeout(format!(
                "{self} did not answer within {}s",
                OPEN_TIMEOUT.as_secs()
            ))),
        }
    }

    fn describe(&self) -> String {
        self.to_string()
    }
}

/// Both halves of a runner's WebSocket as a [`Link`], with pings and the silence check.
pub(crate) fn websocket<S>(ws: tokio_tungstenite::WebSocketStream<S>) -> Link
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = ws.split();
    let (to_tx, mut to_rx) = mpsc::channel::<Message>(64);
    let (from_tx, from_rx) = mpsc::channel::<Message>(64);
    // Anything heard from the runner, pongs included: a connection silent past SILENT is
    // dropped (an address that vanished with its box answers nothing, not even a reset).
    let heard = Arc::new(std::sync::Mutex::new(tokio::time::Instant::now()));
    let (dead_tx, mut dead_rx) = tokio::sync::oneshot::channel::<()>();
    let heard_w = heard.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PING_EVERY);
        tick.tick().await;
        loop {
            tokio::select! {
                m = to_rx.recv() => {
                    let Some(m) = m else { break };
                    let m = match m {
                        Message::Text(t) => tungstenite::Message::text(t),
                        Message::Binary(b) => tungstenite::Message::binary(b),
                    };
                    if sink.send(m).await.is_err() {
                        break;
                    }
                }
                _ = tick.tick() => {
                    if heard_w.lock().unwrap().elapsed() > SILENT {
                        break;
                    }
                    if sink.send(tungstenite::Message::Ping(Default::default())).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = dead_tx.send(());
        let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
    });
    tokio::spawn(async move {
        loop {
            let m = tokio::select! {
                m = stream.next() => m,
                _ = &mut dead_rx => break,
            };
            let Some(Ok(m)) = m else { break };
            *heard.lock().unwrap() = tokio::time::Instant::now();
            let m = match m {
                tungstenite::Message::Text(t) => Message::Text(t.to_string()),
                tungstenite::Message::Binary(b) => Message::Binary(b.to_vec()),
                tungstenite::Message::Close(_) => break,
                _ => continue,
            };
            if from_tx.send(m).await.is_err() {
                break;
            }
        }
    });
    Link { tx: to_tx, rx: from_rx }
}

/// A runner reached through one long exec in its box: `agentbox-runner relay unix:PATH`,
/// carrying length-prefixed messages on the exec's stdin and stdout. For boxes with no network.
pub struct Relay {
    /// The box the exec runs in.
    pub sandbox: Arc<dyn Sandbox>,
    /// The relay's argv in the box.
    pub argv: Vec<String>,
}

#[async_trait]
impl Dial for Relay {
    async fn dial(&self, ctx: &Ctx) -> Result<Link> {
        // The relay lives as long as the box: the connection, not a call, ends it.
        let mut p = self
            .sandbox
            .exec(&self.argv, &ExecOptions::default(), &Ctx::background())
            .await?;
        ctx.check()?;
        let mut stdin = p
            .stdin
            .take()
            .ok_or_else(|| Error::unknown("the relay's exec has no stdin"))?;
        let mut stdout = p
            .stdout
            .take()
            .ok_or_else(|| Error::unknown("the relay's exec has no stdout"))?;
        let (to_tx, mut to_rx) = mpsc::channel::<Message>(64);
        let (from_tx, from_rx) = mpsc::channel::<Message>(64);
        let killer = p.killer();
        tokio::spawn(async move {
            while let Some(m) = to_rx.recv().await {
                if stdin.write_all(&m.encode()).await.is_err() || stdin.flush().await.is_err() {
                    break;
                }
            }
            let _ = stdin.close().await;
            let _ = killer.signal(agentbox_core::SIGKILL).await;
        });
        tokio::spawn(async move {
            let _keep = p;
            loop {
                let mut prefix = [0u8; 4];
                if stdout.read_exact(&mut prefix).await.is_err() {
                    break;
                }
                let Ok(n) = stream_len(prefix) else { break };
                let mut body = vec![0u8; n];
                if stdout.read_exact(&mut body).await.is_err() {
                    break;
                }
                let Ok(m) = Message::decode(body) else { continue };
                if from_tx.send(m).await.is_err() {
                    break;
                }
            }
        });
        Ok(Link { tx: to_tx, rx: from_rx })
    }

    fn describe(&self) -> String {
        format!("the runner in box {} (through a relay exec)", self.sandbox.id())
    }
}

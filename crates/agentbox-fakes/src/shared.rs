//! What every fake's server needs alike: the plain-HTTP accept loop, a request's query as the
//! pairs it holds, a path segment's escapes decoded, a key compared in constant time, the
//! random ids vendors give their objects, the answer to a WebSocket upgrade, and a proxy's
//! forward of one request (upgrades included) to a port of a sandbox.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

/// Accept plain HTTP/1.1 connections (with upgrades: a log's WebSocket, a preview's) until
/// told to stop; each connection is a task, aborted at the stop.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            got = listener.accept() => {
                let (tcp, _) = match got {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let app = app.clone();
                conns.spawn(async move {
                    let svc = TowerToHyperService::new(app);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .with_upgrades()
                        .await;
                });
            }
        }
    }
    conns.abort_all();
}

/// A fake's server and what it owns, started and ended the same way by every fake: the task
/// serving its port, the signal that stops it, the tasks that run beside it (a clock,
/// controllers), and its directory, removed last (after the fake's boxes in it are ended).
pub(crate) struct Server {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    beside: Vec<tokio::task::JoinHandle<()>>,
    dir: Option<tempfile::TempDir>,
}

impl Server {
    /// Serve with `serve` (given the signal that stops it) on this runtime, owning `dir`.
    pub(crate) fn spawn<F>(
        serve: impl FnOnce(tokio::sync::oneshot::Receiver<()>) -> F,
        dir: tempfile::TempDir,
    ) -> Server
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        Server {
            stop: Some(stop),
            task: Some(tokio::spawn(serve(stopped))),
            beside: Vec::new(),
            dir: Some(dir),
        }
    }

    /// A task that ends with the server.
    pub(crate) fn beside(&mut self, task: tokio::task::JoinHandle<()>) {
        self.beside.push(task);
    }

    /// Stop serving and wait for it (at most five seconds); the tasks beside it end first.
    pub(crate) async fn stopped(&mut self) {
        self.signal();
        for t in self.beside.drain(..) {
            t.abort();
            let _ = t.await;
        }
        if let Some(s) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), s).await;
        }
    }

    /// Its directory, until removed.
    pub(crate) fn dir(&self) -> Option<&std::path::Path> {
        self.dir.as_ref().map(tempfile::TempDir::path)
    }

    /// Remove its directory (its boxes ended).
    pub(crate) fn remove_dir(&mut self) {
        if let Some(d) = self.dir.take() {
            let _ = d.close();
        }
    }

    /// Stop serving at once: the signal sent, its tasks aborted (for a fake's `Drop`, which
    /// cannot wait).
    pub(crate) fn halt(&mut self) {
        self.signal();
        for t in self.beside.drain(..) {
            t.abort();
        }
        if let Some(s) = self.task.take() {
            s.abort();
        }
    }

    fn signal(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// Dropped without [`Server::stopped`]: it stops serving, its tasks are aborted, and its
/// directory goes (a fake's own `Drop` ends its boxes first).
impl Drop for Server {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Compared in time that does not depend on where the two differ (a key against the one
/// expected).
pub(crate) fn same(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

/// A path segment with its `%XX` escapes decoded, byte for byte (a `%` not followed by two
/// hex digits is kept as it is; `+` is a plus in a path).
pub(crate) fn percent_decode(seg: &str) -> Vec<u8> {
    let b = seg.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push(h << 4 | l);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// The query's pairs, keys repeating (`states=a&states=b`, `command=a&command=b`), as the
/// vendors' clients send them.
pub(crate) struct Query(pub(crate) Vec<(String, String)>);

impl Query {
    pub(crate) fn of(req: &Request) -> Query {
        Query::of_uri(req.uri())
    }

    pub(crate) fn of_uri(uri: &axum::http::Uri) -> Query {
        Query(
            form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    pub(crate) fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str())
    }

    pub(crate) fn all(&self, k: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

/// A random RFC 4122 version-4 UUID, as Kubernetes gives every object and Daytona every
/// sandbox. A failing system RNG leaves zeros: ids need only be unique within one fake, which
/// each fake keeps by what it mixes in (a resourceVersion, a name).
pub(crate) fn uuid4() -> String {
    let mut b = [0u8; 16];
    let _ = getrandom::fill(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Whether a request asks to become a WebSocket (`Connection: upgrade`, `Upgrade: websocket`
/// and a key).
pub(crate) fn is_websocket(h: &HeaderMap) -> bool {
    let has = |name: header::HeaderName, word: &str| {
        h.get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(word))
    };
    has(header::CONNECTION, "upgrade") && has(header::UPGRADE, "websocket") && h.contains_key(header::SEC_WEBSOCKET_KEY)
}

/// Why a WebSocket upgrade was not answered, for each fake to say in its vendor's words.
pub(crate) enum UpgradeRefused {
    /// The client sent no `Sec-WebSocket-Key`.
    NoKey,
    /// A header of the answer could not be made.
    Internal(String),
}

/// The 101 answer to a WebSocket upgrade (with `protocol` as its subprotocol unless empty),
/// and the socket once hyper hands it over.
pub(crate) fn upgrade(
    mut req: Request,
    protocol: &str,
) -> Result<(Response, hyper::upgrade::OnUpgrade), UpgradeRefused> {
    let key = req
        .headers()
        .get(header::SEC_WEBSOCKET_KEY)
        .map(|k| derive_accept_key(k.as_bytes()))
        .ok_or(UpgradeRefused::NoKey)?;
    let on = hyper::upgrade::on(&mut req);
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    let value = |v: &str| HeaderValue::from_str(v).map_err(|e| UpgradeRefused::Internal(e.to_string()));
    h.insert(header::SEC_WEBSOCKET_ACCEPT, value(&key)?);
    if !protocol.is_empty() {
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, value(protocol)?);
    }
    Ok((r, on))
}

/// End a fake's boxes from its `Drop`, which cannot await: `end` runs on a thread with a
/// runtime of its own (at most 30 s) and is waited for, so no box outlives the fake.
pub(crate) fn end_on_own_runtime(end: impl std::future::Future<Output = ()> + Send + 'static) {
    let ended = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
            rt.block_on(async { tokio::time::timeout(std::time::Duration::from_secs(30), end).await })
                .ok();
        }
    });
    let _ = ended.join();
}

/// Forward `req` over `tcp` (a connection to a port of a sandbox) as `path` (with its query),
/// `Host` set to `host` and the headers `strip` (the proxy's own) left out; an upgrade (a
/// WebSocket) is then copied both ways as raw bytes. `Err` is the reason the port did not
/// answer, for the vendor's own 502.
pub(crate) async fn forward(
    tcp: tokio::net::TcpStream,
    mut req: Request,
    path: &str,
    host: &str,
    strip: &[&str],
) -> Result<Response, String> {
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let upgrading = req.headers().contains_key(header::UPGRADE);
    let down = upgrading.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    let query = parts.uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    parts.uri = format!("{path}{query}").parse().map_err(|e| format!("the path: {e}"))?;
    for h in strip {
        parts.headers.remove(*h);
    }
    if let Ok(h) = HeaderValue::from_str(host) {
        parts.headers.insert(header::HOST, h);
    }
    let mut resp = sender
        .send_request(hyper::Request::from_parts(parts, body))
        .await
        .map_err(|e| e.to_string())?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(down) = down
    {
        let up = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            if let (Ok(d), Ok(u)) = (down.await, up.await) {
                let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(d), &mut TokioIo::new(u)).await;
            }
        });
        let (parts, _) = resp.into_parts();
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    Ok(resp.map(Body::new))
}

/// Standard base64 with padding, as Go's `encoding/json` writes a `[]byte` and envd its output.
pub(crate) fn b64_encode(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

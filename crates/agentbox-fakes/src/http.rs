//! Requests as the fakes read them: a query's pairs, a path segment's escapes decoded, a
//! WebSocket upgrade answered, one request (upgrades included) forwarded to a port of a sandbox.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

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

//! The pieces of HTTP this crate reads and writes, shared with agentbox's fake vendors: a
//! query's pairs, a path segment's escapes decoded, one request (upgrades included) forwarded
//! to a port of a sandbox, keys compared in constant time, and base64 as Go writes it.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use hyper_util::rt::TokioIo;

/// A path segment with its `%XX` escapes decoded, byte for byte (a `%` not followed by two
/// hex digits is kept as it is; `+` is a plus in a path).
///
/// ```
/// assert_eq!(agentbox_e2b::http::percent_decode("a%20b%zz"), b"a b%zz");
/// ```
pub fn percent_decode(seg: &str) -> Vec<u8> {
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

/// The query's pairs, keys repeating (`state=a&state=b`, `command=a&command=b`), as the
/// vendors' clients send them.
///
/// ```
/// let q = agentbox_e2b::http::Query::of_uri(&"/x?a=1&a=2&b=%20".parse().unwrap());
/// assert_eq!(q.all("a"), ["1", "2"]);
/// assert_eq!(q.get("b"), Some(" "));
/// ```
pub struct Query(pub Vec<(String, String)>);

impl Query {
    /// The query of a request.
    pub fn of(req: &Request) -> Query {
        Query::of_uri(req.uri())
    }

    /// The query of a URI.
    pub fn of_uri(uri: &axum::http::Uri) -> Query {
        Query(
            form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// The first value of `k`.
    pub fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str())
    }

    /// Every value of `k`, in order.
    pub fn all(&self, k: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

/// Forward `req` over `tcp` (a connection to a port of a sandbox) as `path` (with its query),
/// `Host` set to `host` and the headers `strip` (the proxy's own) left out; an upgrade (a
/// WebSocket) is then copied both ways as raw bytes. `Err` is the reason the port did not
/// answer, for the vendor's own 502.
pub async fn forward(
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

/// Compared in time that does not depend on where the two differ (a key against the one
/// expected).
///
/// ```
/// assert!(agentbox_e2b::http::same("k", "k") && !agentbox_e2b::http::same("k", "j"));
/// ```
pub fn same(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

/// Whether `headers` show `token` in `name` (compared in constant time; a missing or
/// non-text header shows nothing).
///
/// ```
/// let mut h = axum::http::HeaderMap::new();
/// h.insert("x-access-token", "k".parse().unwrap());
/// assert!(agentbox_e2b::http::shows(&h, "x-access-token", "k"));
/// assert!(!agentbox_e2b::http::shows(&h, "e2b-traffic-access-token", "k"));
/// ```
pub fn shows(headers: &axum::http::HeaderMap, name: &str, token: &str) -> bool {
    let shown = headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
    same(shown, token)
}

/// Standard base64 with padding, as Go's `encoding/json` writes a `[]byte` and envd its output.
///
/// ```
/// assert_eq!(agentbox_e2b::http::b64_encode(b"hi"), "aGk=");
/// ```
pub fn b64_encode(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

//! Requests as the fakes read them: a WebSocket upgrade answered here; a query's pairs, a path
//! segment's escapes decoded and one request forwarded to a port of a sandbox are E2B's API's
//! own pieces (`agentbox_e2b::http`), used by every fake.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

pub(crate) use agentbox_e2b::http::{Query, percent_decode};

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

pub(crate) use agentbox_e2b::http::forward;

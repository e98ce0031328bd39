//! WebSockets: the upgrade answered here (over hyper's own upgrade, with the tungstenite the
//! workspace already builds, so no second WebSocket stack comes in through axum's `ws`), and
//! the frames of the service's streams.
//!
//! A stream speaks JSON text frames, one message each, tagged by `type` ([`ServerMessage`],
//! [`ClientMessage`]). A frame out of that protocol (binary, not JSON, an unknown type, over
//! [`MAX_FRAME`]) is answered with an `error` message and the socket closed with 1008 (policy)
//! or 1009 (too big): never dropped silently, never a panic.

use agentbox_core::{ErrorCode, ProcessState, Stream};
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

use crate::error::ApiError;

/// The largest frame (and message) a client may send: stdin goes in pieces this big.
pub const MAX_FRAME: usize = 1 << 20;

/// The socket of an upgraded request.
pub(crate) type Socket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// What the server sends on a stream.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMessage {
    /// A terminal's program was started: its handle, to reattach with after a reconnect.
    Started {
        /// The process's handle in the box.
        handle: u64,
    },
    /// Bytes of the program's output.
    Output {
        /// The number of its first byte: a client that reconnects asks for `after` = the
        /// last `seq` + its length.
        seq: u64,
        /// `stdout` or `stderr` (a terminal's output is all `stdout`).
        stream: Stream,
        /// The bytes, base64.
        data: String,
    },
    /// Bytes `from..to` were no longer kept when the stream reached them.
    Gap {
        /// The first byte lost.
        from: u64,
        /// The byte the output goes on from.
        to: u64,
    },
    /// The program ended and all its output was sent; the server closes the socket next.
    Exit {
        /// How it ended (as a read's `exit`).
        exit: ProcessState,
        /// The `after` of a read past the end.
        next: u64,
    },
    /// A message of the client's could not be done (the stream goes on), or the stream
    /// cannot go on (the server closes the socket next, with a close code saying which).
    Error {
        /// One of the contract's codes.
        code: String,
        /// What and why.
        message: String,
    },
}

/// What a client sends on a stream.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientMessage {
    /// Bytes for the program's stdin.
    Stdin {
        /// Text to write.
        #[serde(default)]
        data: String,
        /// The same bytes base64 (for bytes that are not text); give one of the two.
        #[serde(default)]
        data_base64: Option<String>,
        /// End its stdin after.
        #[serde(default)]
        close: bool,
    },
    /// The terminal's new size.
    Resize {
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
    /// A signal for the program's group: a number or a name (`INT`, `TERM`...).
    Signal {
        /// The signal.
        signal: serde_json::Value,
    },
}

impl ServerMessage {
    /// The message of an error.
    pub(crate) fn error(e: &ApiError) -> Self {
        ServerMessage::Error {
            code: e.code().as_str().to_string(),
            message: e.message().to_string(),
        }
    }

    pub(crate) fn frame(&self) -> tokio_tungstenite::tungstenite::Message {
        let text = serde_json::to_string(self).unwrap_or_else(|e| {
            format!(r#"{{"type":"error","code":"unknown","message":"a message could not be written: {e}"}}"#)
        });
        tokio_tungstenite::tungstenite::Message::text(text)
    }
}

/// A client's frame read as one of its messages, or why it is out of protocol.
pub(crate) fn parse(frame: &[u8]) -> Result<ClientMessage, ApiError> {
    serde_json::from_slice(frame).map_err(|e| {
        ApiError::new(
            ErrorCode::Invalid,
            format!("a frame out of protocol: {e} (send JSON: {{\"type\": \"stdin\" | \"resize\" | \"signal\", ...}})"),
        )
    })
}

/// Whether a request asks to become a WebSocket.
fn asks_for_websocket(h: &HeaderMap) -> bool {
    let has = |name: header::HeaderName, word: &str| {
        h.get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(word))
    };
    has(header::CONNECTION, "upgrade") && has(header::UPGRADE, "websocket")
}

/// The `Sec-WebSocket-Accept` of `req`, or why it is not an upgrade: checked before a route
/// does anything an upgrade that never comes would leave behind.
pub(crate) fn check(req: &Request) -> Result<String, ApiError> {
    if !asks_for_websocket(req.headers()) {
        return Err(ApiError::new(
            ErrorCode::Invalid,
            "this route is a WebSocket: send `Connection: Upgrade` and `Upgrade: websocket` (an HTTP/1.1 GET)",
        ));
    }
    req.headers()
        .get(header::SEC_WEBSOCKET_KEY)
        .map(|k| derive_accept_key(k.as_bytes()))
        .ok_or_else(|| ApiError::new(ErrorCode::Invalid, "Sec-WebSocket-Key: missing"))
}

/// The 101 answer to `req`'s upgrade, and a task given the socket once hyper hands it over.
/// A request that is not an upgrade is `invalid`, naming what it lacks.
pub(crate) fn upgrade<F, Fut>(mut req: Request, serve: F) -> Result<Response, ApiError>
where
    F: FnOnce(Socket) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let accept = check(&req)?;
    let offered_protocol = req
        .headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim() == crate::auth::WS_PROTOCOL);
    let on = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match on.await {
            Ok(upgraded) => {
                let config = WebSocketConfig::default()
                    .max_frame_size(Some(MAX_FRAME))
                    .max_message_size(Some(MAX_FRAME));
                let socket = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config)).await;
                serve(socket).await;
            }
            Err(e) => tracing::debug!("a WebSocket upgrade did not complete: {e}"),
        }
    });
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(
        header::SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(&accept).map_err(|e| ApiError::new(ErrorCode::Unknown, e.to_string()))?,
    );
    // A browser's socket that offered subprotocols fails unless one is chosen: this one, never
    // the one carrying its key.
    if offered_protocol {
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(crate::auth::WS_PROTOCOL),
        );
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_out_of_protocol_are_named() {
        assert!(matches!(
            parse(br#"{"type":"resize","rows":24,"cols":80}"#).unwrap(),
            ClientMessage::Resize { rows: 24, cols: 80 }
        ));
        for bad in [
            &b"hi"[..],
            br#"{"type":"nope"}"#,
            br#"{"type":"resize","rows":-1,"cols":2}"#,
            br#"{"type":"stdin","extra":1}"#,
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.code(), ErrorCode::Invalid);
            assert!(e.message().starts_with("a frame out of protocol"), "{}", e.message());
        }
    }
}

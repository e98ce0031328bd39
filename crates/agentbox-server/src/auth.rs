//! Who is calling: the key a request shows (`Authorization: Bearer <key>`, or a browser's
//! WebSocket's subprotocol [`WS_KEY_PREFIX`]), found in the store, or `unauthenticated`. A missing key and a wrong one take the same path (the hash of
//! what was sent is looked up either way) and the same answer's shape.

use std::sync::Arc;

use agentbox_core::ErrorCode;
use aide::generate::GenContext;
use aide::openapi::{Operation, SecurityRequirement};
use aide::operation::OperationInput;
use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;

use crate::error::ApiError;
use crate::keys::KeyInfo;
use crate::state::AppState;

/// The key of the request being answered.
pub(crate) struct Caller(pub(crate) KeyInfo);

/// The security scheme's name in the OpenAPI document.
pub(crate) const SCHEME: &str = "apiKey";

impl FromRequestParts<Arc<AppState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        let shown = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .or_else(|| key_of_websocket(&parts.headers));
        // Looked up either way, so a missing key costs what a wrong one does.
        let found = state.keys.find(shown.unwrap_or_default()).await?;
        match (shown, found) {
            (Some(_), Some(key)) => {
                if let Some(who) = parts.extensions.get::<crate::access::Who>() {
                    who.set(&key.name);
                }
                state.rates.take(&key)?;
                Ok(Caller(key))
            }
            (None, _) => Err(ApiError::new(
                ErrorCode::Unauthenticated,
                "no API key: send `Authorization: Bearer <key>` (`agentbox serve keys add NAME` makes one)",
            )),
            (Some(_), None) => Err(ApiError::new(
                ErrorCode::Unauthenticated,
                "the API key is not one this server holds",
            )),
        }
    }
}

/// The WebSocket subprotocol a browser's socket asks for (the server answers with it), beside
/// [`WS_KEY_PREFIX`] and its key.
pub const WS_PROTOCOL: &str = "agentbox";
/// A browser cannot set a WebSocket's headers, and a key never goes in a URL: a socket shows
/// its key as one more subprotocol, `agentbox.key.<key>`, which the server never echoes.
pub const WS_KEY_PREFIX: &str = "agentbox.key.";

/// The key a WebSocket upgrade shows as a subprotocol, if it does.
fn key_of_websocket(h: &axum::http::HeaderMap) -> Option<&str> {
    h.get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix(WS_KEY_PREFIX))
}

impl OperationInput for Caller {
    fn operation_input(_ctx: &mut GenContext, operation: &mut Operation) {
        let requirement: SecurityRequirement = [(SCHEME.to_string(), Vec::new())].into_iter().collect();
        if !operation.security.contains(&requirement) {
            operation.security.push(requirement);
        }
    }
}

//! The service's one error shape: `{"code": "...", "message": "..."}`, the code from the
//! contract's vocabulary ([`ErrorCode`]) and one HTTP status per code ([`status_of`]).
//!
//! Every answer that is not a success has this shape, whoever made it: a handler's
//! [`ApiError`], axum's own rejections (malformed JSON, a missing content type, a method the
//! route does not take), the router's 404, a body past its bound, a panic. [`one_shape`]
//! rewrites whatever is not already ours.

use agentbox_core::ErrorCode;
use aide::generate::GenContext;
use aide::openapi::{MediaType, Operation, Response as ApiResponse, SchemaObject, StatusCode as ApiStatus};
use aide::operation::OperationOutput;
use axum::body::Body;
use axum::http::{HeaderValue, Request, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What every failed request answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorBody {
    /// What kind of failure: `invalid`, `not_found`, `unauthenticated`... (one of the contract's
    /// codes). Branch on this, never on the message.
    pub code: String,
    /// What was wrong and why, naming the field or the path.
    pub message: String,
}

/// A failed request, answered as [`ErrorBody`] with [`status_of`] its code.
#[derive(Clone, Debug)]
pub struct ApiError {
    code: ErrorCode,
    message: String,
    /// Seconds, for `Retry-After` (a 429).
    retry_after: Option<u64>,
}

impl ApiError {
    /// An error of `code` saying `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// Ask the client to wait this many seconds before trying again.
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// Its code.
    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// What was wrong and why.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<agentbox_core::Error> for ApiError {
    fn from(e: agentbox_core::Error) -> Self {
        ApiError::new(e.code(), e.message())
    }
}

/// The one HTTP status of each code.
///
/// ```
/// use agentbox_core::ErrorCode;
/// assert_eq!(agentbox_server::error::status_of(ErrorCode::NotFound).as_u16(), 404);
/// assert_eq!(agentbox_server::error::status_of(ErrorCode::RateLimited).as_u16(), 429);
/// ```
pub fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::Invalid => StatusCode::BAD_REQUEST,
        ErrorCode::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorCode::PermissionDenied => StatusCode::FORBIDDEN,
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::Refused | ErrorCode::Fenced => StatusCode::CONFLICT,
        ErrorCode::Gone => StatusCode::GONE,
        ErrorCode::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::Unsupported | ErrorCode::Unsafe => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorCode::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        // A client that went away: what nginx answers it, for the logs' sake.
        ErrorCode::Aborted => StatusCode::from_u16(499).expect("499 is a status"),
        ErrorCode::TransferFailed => StatusCode::BAD_GATEWAY,
        ErrorCode::Timeout => StatusCode::GATEWAY_TIMEOUT,
        ErrorCode::Unknown => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The code of an answer someone else made with this status (axum's rejections, a 404 of the
/// router).
fn code_of(status: StatusCode) -> ErrorCode {
    match status.as_u16() {
        401 => ErrorCode::Unauthenticated,
        403 => ErrorCode::PermissionDenied,
        404 | 405 => ErrorCode::NotFound,
        408 | 504 => ErrorCode::Timeout,
        409 => ErrorCode::Refused,
        410 => ErrorCode::Gone,
        413 => ErrorCode::TooLarge,
        429 => ErrorCode::RateLimited,
        400..=499 => ErrorCode::Invalid,
        _ => ErrorCode::Unknown,
    }
}

/// The code of an answer of this status, for the metrics.
pub(crate) fn code_of_status(status: u16) -> ErrorCode {
    StatusCode::from_u16(status).map(code_of).unwrap_or(ErrorCode::Unknown)
}

/// Marks a response as already in the one shape.
#[derive(Clone, Copy)]
struct Shaped;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            code: self.code.as_str().to_string(),
            message: self.message,
        };
        let mut r = (status_of(self.code), axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r.extensions_mut().insert(Shaped);
        r
    }
}

impl OperationOutput for ApiError {
    type Inner = ErrorBody;

    fn operation_response(ctx: &mut GenContext, _operation: &mut Operation) -> Option<ApiResponse> {
        let schema = ctx.schema.subschema_for::<ErrorBody>();
        Some(ApiResponse {
            description: "The request failed: `code` says how (one HTTP status per code), `message` what and why."
                .into(),
            content: [(
                "application/json".into(),
                MediaType {
                    schema: Some(SchemaObject {
                        json_schema: schema,
                        example: None,
                        external_docs: None,
                    }),
                    ..Default::default()
                },
            )]
            .into_iter()
            .collect(),
            ..Default::default()
        })
    }

    fn inferred_responses(ctx: &mut GenContext, operation: &mut Operation) -> Vec<(Option<ApiStatus>, ApiResponse)> {
        Self::operation_response(ctx, operation)
            .map(|r| vec![(None, r)])
            .unwrap_or_default()
    }
}

/// The most of a foreign error's body read to make the message.
const FOREIGN_BODY_MAX: usize = 16 * 1024;

/// Middleware: any failed answer not made by [`ApiError`] is rewritten into the one shape,
/// its text (axum's rejection says what was wrong, and where) as the message.
pub(crate) async fn one_shape(request: Request<Body>, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|m| m.as_str().to_string());
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) || response.extensions().get::<Shaped>().is_some() {
        return response;
    }
    let retry = response.headers().get(header::RETRY_AFTER).cloned();
    let text = match axum::body::to_bytes(response.into_body(), FOREIGN_BODY_MAX).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_string(),
        Err(_) => String::new(),
    };
    let message = match status.as_u16() {
        404 => format!("{method} {path}: no such route"),
        405 => format!(
            "{method} {path}: this route does not take {method}{}",
            route
                .and_then(|r| crate::methods_of(&r))
                .map(|m| format!(" (it takes {m})"))
                .unwrap_or_default()
        ),
        413 => format!("{method} {path}: the body is larger than this server takes"),
        _ if text.is_empty() => format!("{method} {path}: {}", status.canonical_reason().unwrap_or("failed")),
        _ => format!("{method} {path}: {text}"),
    };
    // A body that stopped coming (tower-http's deadline between its pieces) fails axum's
    // read of it, which answers 400: it is the client's time that ran out.
    let code = if text.contains("within the designated timeout") {
        ErrorCode::Timeout
    } else {
        code_of(status)
    };
    let mut shaped = ApiError::new(code, message).into_response();
    if let Some(r) = retry {
        shaped.headers_mut().insert(header::RETRY_AFTER, r);
    }
    shaped
}

/// What a handler that panicked answers (the panic is logged, its text never sent).
pub(crate) fn panicked(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let what = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a panic without a message");
    tracing::error!(panic = what, "a request's handler panicked");
    ApiError::new(ErrorCode::Unknown, "the server failed while answering this request").into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_failure_status_and_every_failure_status_a_code() {
        for code in ErrorCode::ALL {
            let s = status_of(code);
            assert!(s.is_client_error() || s.is_server_error(), "{code:?}: {s}");
        }
        for s in 400..600u16 {
            let Ok(status) = StatusCode::from_u16(s) else { continue };
            let code = code_of(status);
            assert!(ErrorCode::ALL.contains(&code), "{s}");
        }
    }
}

//! Daytona's error envelopes: the API's (`apps/api/src/filters/all-exceptions.filter.ts`:
//! `{statusCode, message, code, error, source: "DAYTONA_API", path, timestamp, method}`), the
//! daemon's (the toolbox's `ErrorResponse`: the same without `error`, `source:
//! "DAYTONA_DAEMON"`) and the proxy's (`source: "DAYTONA_PROXY"`). The SDK picks its error
//! class from `(source, code)` first, then from the status (`daytona/common/errors.py`).

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

/// Which part of Daytona answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    Api,
    Daemon,
    Proxy,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Api => "DAYTONA_API",
            Source::Daemon => "DAYTONA_DAEMON",
            Source::Proxy => "DAYTONA_PROXY",
        }
    }
}

/// One refusal, made into its envelope once the request's method and path are known.
#[derive(Debug)]
pub(crate) struct DError {
    pub(crate) status: StatusCode,
    pub(crate) code: String,
    pub(crate) message: String,
    pub(crate) source: Source,
}

/// The throttler Daytona names in its rate-limit headers for an authenticated caller.
const THROTTLER: &str = "authenticated";

impl DError {
    pub(crate) fn new(status: u16, code: &str, message: impl Into<String>, source: Source) -> DError {
        DError {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            code: code.to_string(),
            message: message.into(),
            source,
        }
    }

    pub(crate) fn api(status: u16, code: &str, message: impl Into<String>) -> DError {
        DError::new(status, code, message, Source::Api)
    }

    pub(crate) fn daemon(status: u16, code: &str, message: impl Into<String>) -> DError {
        DError::new(status, code, message, Source::Daemon)
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> DError {
        DError::api(400, "BAD_REQUEST", message)
    }

    pub(crate) fn daemon_bad_request(message: impl Into<String>) -> DError {
        DError::daemon(400, "BAD_REQUEST", message)
    }

    pub(crate) fn sandbox_not_found(id: &str) -> DError {
        DError::api(
            404,
            "SANDBOX_NOT_FOUND",
            format!("Sandbox with ID or name {id} not found"),
        )
    }

    /// A lifecycle request while another change is under way (D190
    /// `exceptions/state-change-in-progress.exception.ts`).
    pub(crate) fn state_change_in_progress() -> DError {
        DError::api(409, "CONFLICT", "Sandbox state change in progress")
    }

    /// What a gateway answers when it gave up on a request the API then carried out: the
    /// status, its code and its reason, in the API's envelope.
    pub(crate) fn lost_answer(status: u16) -> DError {
        let st = StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        let reason = st.canonical_reason().unwrap_or("Error");
        let code: String = reason
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_uppercase()
                } else {
                    '_'
                }
            })
            .collect();
        DError::api(st.as_u16(), &code, reason)
    }

    pub(crate) fn unauthorized(source: Source) -> DError {
        DError::new(401, "UNAUTHORIZED", "Unauthorized", source)
    }

    pub(crate) fn rate_limited(source: Source) -> DError {
        DError::new(
            429,
            "RATE_LIMIT_EXCEEDED",
            "ThrottlerException: Too Many Requests",
            source,
        )
    }

    pub(crate) fn internal(message: impl Into<String>, source: Source) -> DError {
        DError::new(500, "INTERNAL_SERVER_ERROR", message, source)
    }

    /// The envelope as its source writes it.
    pub(crate) fn body(&self, method: &str, path: &str) -> Value {
        let mut v = json!({
            "statusCode": self.status.as_u16(),
            "message": self.message,
            "code": self.code,
            "source": self.source.name(),
            "path": path,
            "timestamp": crate::daytona::state::now_rfc3339(),
            "method": method,
        });
        if self.source != Source::Daemon {
            v["error"] = json!(self.status.canonical_reason().unwrap_or("Error"));
        }
        v
    }

    pub(crate) fn response(&self, method: &str, path: &str) -> Response {
        let mut r = json_response(self.status, &self.body(method, path));
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            let h = r.headers_mut();
            h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            for (k, v) in [("Limit", "100"), ("Remaining", "0"), ("Reset", "1")] {
                if let (Ok(name), Ok(val)) = (
                    header::HeaderName::try_from(format!("x-ratelimit-{}-{THROTTLER}", k.to_lowercase())),
                    HeaderValue::from_str(v),
                ) {
                    h.insert(name, val);
                }
            }
        }
        r
    }
}

pub(crate) fn json_response(status: StatusCode, v: &Value) -> Response {
    let mut r = Response::new(Body::from(serde_json::to_vec(v).unwrap_or_default()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    r
}

pub(crate) type DResult = Result<Response, DError>;

pub(crate) fn ok(v: Value) -> DResult {
    Ok(json_response(StatusCode::OK, &v))
}

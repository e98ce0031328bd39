//! Archil's two error shapes. The control plane answers `{"success": false, "error": MSG,
//! "code": CODE}` (the openapi's `ErrorResponse`; the SDK raises `ArchilApiError(error,
//! status, code)` from it, `_http.py`). The object API answers S3's XML `<Error>` with `Code`,
//! `Message` and `RequestId` (what `_s3xml.parse_error` reads into `ArchilS3Error`); a HEAD
//! answer has no body, as S3's has none.

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

/// A refusal of the control plane (`/api/...`).
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: String,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn new(status: u16, code: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            code: code.to_string(),
            message: message.into(),
        }
    }

    /// 400 `invalid_request`: the body or a parameter is malformed; the message names it.
    pub(crate) fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "invalid_request", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(404, "not_found", message)
    }

    pub(crate) fn unauthorized() -> ApiError {
        ApiError::new(
            401,
            "unauthorized",
            "Invalid or missing API key (Authorization: key-<KEY> or Bearer <KEY>)",
        )
    }

    pub(crate) fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "internal_error", message)
    }

    pub(crate) fn response(&self) -> Response {
        json_response(
            self.status,
            &json!({"success": false, "error": self.message, "code": self.code}),
        )
    }
}

pub(crate) type ApiResult = Result<Response, ApiError>;

pub(crate) fn json_response(status: StatusCode, v: &Value) -> Response {
    let mut r = Response::new(Body::from(serde_json::to_vec(v).unwrap_or_default()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// `{"success": true, "data": data}`.
pub(crate) fn ok(data: Value) -> ApiResult {
    Ok(json_response(StatusCode::OK, &json!({"success": true, "data": data})))
}

/// A refusal of the object API (`/s3/...`).
#[derive(Debug)]
pub(crate) struct S3Error {
    pub(crate) status: StatusCode,
    pub(crate) code: String,
    pub(crate) message: String,
}

impl S3Error {
    pub(crate) fn new(status: u16, code: &str, message: impl Into<String>) -> S3Error {
        S3Error {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            code: code.to_string(),
            message: message.into(),
        }
    }

    /// 400 `InvalidArgument`: a parameter, header or key the gateway cannot take.
    pub(crate) fn invalid(message: impl Into<String>) -> S3Error {
        S3Error::new(400, "InvalidArgument", message)
    }

    pub(crate) fn no_such_key(key: &str) -> S3Error {
        S3Error::new(404, "NoSuchKey", format!("The specified key does not exist: {key}"))
    }

    pub(crate) fn internal(message: impl Into<String>) -> S3Error {
        S3Error::new(500, "InternalError", message)
    }

    /// The XML answer; `head`: the status and headers alone.
    pub(crate) fn response(&self, head: bool) -> Response {
        let request_id = request_id();
        let body = if head {
            Body::empty()
        } else {
            Body::from(format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{}</Code><Message>{}</Message><RequestId>{}</RequestId></Error>",
                crate::archil::xml::escape(&self.code),
                crate::archil::xml::escape(&self.message),
                request_id
            ))
        };
        let mut r = Response::new(body);
        *r.status_mut() = self.status;
        let h = r.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/xml"));
        if let Ok(v) = HeaderValue::from_str(&request_id) {
            h.insert("x-amz-request-id", v);
        }
        r
    }
}

pub(crate) type S3Result = Result<Response, S3Error>;

/// An id for one answer, as S3 gives every request (16 hex digits, upper case as S3's).
pub(crate) fn request_id() -> String {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    b.iter().map(|x| format!("{x:02X}")).collect()
}

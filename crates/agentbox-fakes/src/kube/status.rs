//! metav1.Status: the one shape every Kubernetes API error has, and the codes clients branch
//! on (`reason`, `code`, `details.causes[].field`).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// An API error, answered as a metav1.Status with its HTTP code.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    pub(crate) details: Option<Value>,
    /// Seconds for a `Retry-After` header (429s).
    pub(crate) retry_after: Option<u32>,
}

/// One `details.causes` entry of a 422: the field and what is wrong with it.
#[derive(Debug, Clone)]
pub(crate) struct Cause {
    /// `FieldValueRequired`, `FieldValueInvalid`, `FieldValueNotSupported`, `FieldValueForbidden`...
    pub(crate) reason: &'static str,
    /// As the real server writes it: `Required value`, `Invalid value: "x": why`...
    pub(crate) message: String,
    /// `metadata.name`, `spec.containers[0].image`...
    pub(crate) field: String,
}

impl Cause {
    pub(crate) fn required(field: impl Into<String>) -> Cause {
        Cause {
            reason: "FieldValueRequired",
            message: "Required value".into(),
            field: field.into(),
        }
    }

    /// `value` is written as Go's `%#v` would for a string (quoted) or a number (bare).
    pub(crate) fn invalid(field: impl Into<String>, value: &Value, why: impl AsRef<str>) -> Cause {
        Cause {
            reason: "FieldValueInvalid",
            message: format!("Invalid value: {}: {}", shown(value), why.as_ref()),
            field: field.into(),
        }
    }

    pub(crate) fn not_supported(field: impl Into<String>, value: &Value, supported: &[&str]) -> Cause {
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        Cause {
            reason: "FieldValueNotSupported",
            message: format!(
                "Unsupported value: {}: supported values: {}",
                shown(value),
                list.join(", ")
            ),
            field: field.into(),
        }
    }

    pub(crate) fn forbidden(field: impl Into<String>, why: impl AsRef<str>) -> Cause {
        Cause {
            reason: "FieldValueForbidden",
            message: format!("Forbidden: {}", why.as_ref()),
            field: field.into(),
        }
    }

    /// `field: message`, as the Status's message lists it.
    fn line(&self) -> String {
        format!("{}: {}", self.field, self.message)
    }
}

fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Null => "null".into(),
        other => other.to_string(),
    }
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    pub(crate) fn unauthorized() -> ApiError {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    pub(crate) fn too_many_requests() -> ApiError {
        ApiError {
            details: Some(json!({"retryAfterSeconds": 1})),
            retry_after: Some(1),
            ..ApiError::new(429, "TooManyRequests", "Too many requests, please try again later.")
        }
    }

    /// `pods "x" not found`; `kind` is the resource (`pods`, `namespaces`), as the real server
    /// names it, with `group` where it has one.
    pub(crate) fn not_found(resource: &str, group: &str, name: &str) -> ApiError {
        let full = if group.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}.{group}")
        };
        let mut details = json!({"name": name, "kind": resource});
        if !group.is_empty() {
            details["group"] = json!(group);
        }
        ApiError {
            details: Some(details),
            ..ApiError::new(404, "NotFound", format!("{full} {name:?} not found"))
        }
    }

    /// A path the server does not serve: the real server's bare 404 Status.
    pub(crate) fn no_route() -> ApiError {
        ApiError {
            details: Some(json!({})),
            ..ApiError::new(404, "NotFound", "the server could not find the requested resource")
        }
    }

    pub(crate) fn already_exists(resource: &str, group: &str, name: &str) -> ApiError {
        let full = if group.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}.{group}")
        };
        let mut details = json!({"name": name, "kind": resource});
        if !group.is_empty() {
            details["group"] = json!(group);
        }
        ApiError {
            details: Some(details),
            ..ApiError::new(409, "AlreadyExists", format!("{full} {name:?} already exists"))
        }
    }

    /// 422 Invalid: `Pod "x" is invalid: field: why` (several in brackets), with the causes.
    pub(crate) fn invalid(kind: &str, group: &str, name: &str, causes: Vec<Cause>) -> ApiError {
        let lines: Vec<String> = causes.iter().map(Cause::line).collect();
        let said = if lines.len() == 1 {
            lines[0].clone()
        } else {
            format!("[{}]", lines.join(", "))
        };
        let mut details = json!({
            "name": name,
            "kind": kind,
            "causes": causes.iter().map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field})).collect::<Vec<_>>(),
        });
        if !group.is_empty() {
            details["group"] = json!(group);
        }
        // The message names the group-qualified kind (`Sandbox.agents.x-k8s.io`), as
        // schema.GroupKind's String does; details name the kind and group apart.
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        ApiError {
            details: Some(details),
            ..ApiError::new(422, "Invalid", format!("{qualified} {name:?} is invalid: {said}"))
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    pub(crate) fn unsupported_media_type(content_type: &str) -> ApiError {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {content_type:?})"
            ),
        )
    }

    pub(crate) fn method_not_allowed() -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    pub(crate) fn gone(message: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", message)
    }

    pub(crate) fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "InternalError", message)
    }

    /// The Status object itself (also what a watch's ERROR event carries).
    pub(crate) fn status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = json_response(code, &self.status());
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// A JSON body with the content type clients check before they decode.
pub(crate) fn json_response(code: StatusCode, v: &Value) -> Response {
    let body = serde_json::to_vec(v).unwrap_or_default();
    (
        code,
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        body,
    )
        .into_response()
}

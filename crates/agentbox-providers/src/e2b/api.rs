//! E2B's control plane (`X-API-KEY`): sandboxes made, read, listed, given a new timeout,
//! paused, resumed and killed. JSON over reqwest with the retry rule every vendor shares
//! (`crate::vendor::send`); E2B's error body (`{code, message}`) becomes our typed error.

use std::time::Duration;

use agentbox_core::{Ctx, Error, ErrorCode, Result};
use reqwest::Method;
use serde_json::Value;

use crate::vendor::{ApiKey, Sent, code_of_status, cut, read_capped};

pub(crate) const VENDOR: &str = "e2b";
/// The most of one answer read (a listing page of 100 sandboxes is far below it).
const MAX_ANSWER: usize = 8 << 20;

pub(crate) struct Api {
    pub http: reqwest::Client,
    pub base: String,
    pub key: ApiKey,
    pub timeout: Duration,
}

/// One answer: its status, the body as JSON (`Null` where empty), the next page's token.
pub(crate) struct Answer {
    pub status: u16,
    pub body: Value,
    pub next: Option<String>,
}

impl Api {
    /// `method path` with `body`, answered 2xx or an error naming `what`; 404 is answered
    /// (callers decide what a missing sandbox means).
    pub(crate) async fn call(
        &self,
        ctx: &Ctx,
        method: Method,
        path: &str,
        body: Option<&Value>,
        idempotent: bool,
        what: &str,
    ) -> Result<Answer> {
        let url = format!("{}{path}", self.base);
        let sent = crate::vendor::send(ctx, VENDOR, what, self.timeout, idempotent, || {
            let mut r = self
                .http
                .request(method.clone(), &url)
                .header("X-API-KEY", self.key.expose());
            if let Some(b) = body {
                r = r.json(b);
            }
            r
        })
        .await?;
        let r = match sent {
            Sent::Answer(r) => r,
            Sent::PastDeadline(r, wait) => {
                return Err(Error::refused(format!(
                    "e2b: {what}: E2B asked to wait {} s ({}), past the caller's deadline",
                    wait.as_secs(),
                    r.status()
                )));
            }
        };
        let status = r.status().as_u16();
        let next = r
            .headers()
            .get("x-next-token")
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(String::from);
        let bytes = read_capped(r, MAX_ANSWER, VENDOR, what).await?;
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        if (200..300).contains(&status) || status == 404 {
            return Ok(Answer { status, body, next });
        }
        Err(error(status, &body, what))
    }
}

/// E2B's error as ours: the status's code, E2B's own message (never the key).
pub(crate) fn error(status: u16, body: &Value, what: &str) -> Error {
    let message = body
        .get("message")
        .and_then(Value::as_str)
        .map(String::from)
        .unwrap_or_else(|| body.to_string());
    let code = match status {
        // E2B answers a create over the plan's limits, or a bad template, 400.
        400 => ErrorCode::Invalid,
        409 => ErrorCode::Refused,
        s => code_of_status(s),
    };
    Error::new(code, cut(format!("e2b: {what}: {message} (HTTP {status})")))
}

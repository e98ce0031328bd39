//! Daytona's REST API, as much of it as the provider speaks: the control plane under
//! `DAYTONA_API_URL` and each sandbox's toolbox under its `toolboxProxyUrl`. Every call has a
//! deadline, a throttled one (429, 503) is tried again after what `Retry-After` says while the
//! caller's context allows, and every error Daytona answers becomes one of ours carrying
//! Daytona's own message, never the key.

use std::collections::BTreeMap;
use std::time::Duration;

use agentbox_core::{Ctx, Error, Result};
use serde::Deserialize;
use serde::de::DeserializeOwned;

pub use crate::vendor::ApiKey;
use crate::vendor::{MAX_MESSAGE, Sent, code_of_status, cut};

/// The most of an answer's body read for JSON; more is a malformed answer.
pub(crate) const MAX_JSON: usize = 16 << 20;
/// The vendor, as errors name it.
const VENDOR: &str = "Daytona";

/// The HTTP client and the key, shared by the control plane and every toolbox.
#[derive(Clone)]
pub(crate) struct Api {
    http: reqwest::Client,
    base: String,
    key: ApiKey,
    request_timeout: Duration,
}

/// A sandbox as the API answers it (the fields the provider reads).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SandboxDto {
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub desired_state: Option<String>,
    #[serde(default)]
    pub error_reason: Option<String>,
    #[serde(default)]
    pub network_block_all: Option<bool>,
    /// A comma-separated string in the API's model; a list is read too.
    #[serde(default)]
    pub domain_allow_list: Option<serde_json::Value>,
    /// IPv4 CIDRs the sandbox may reach besides its domains (comma-separated).
    #[serde(default)]
    pub network_allow_list: Option<String>,
    #[serde(default)]
    pub disk: Option<f64>,
    #[serde(default)]
    pub cpu: Option<f64>,
    #[serde(default)]
    pub memory: Option<f64>,
    #[serde(default)]
    pub snapshot: Option<String>,
    #[serde(default)]
    pub sandbox_class: Option<String>,
    #[serde(default)]
    pub toolbox_proxy_url: Option<String>,
    #[serde(default)]
    pub auto_destroy_at: Option<String>,
    #[serde(default)]
    pub created_at: Option<String>,
}

impl SandboxDto {
    pub(crate) fn labels(&self) -> BTreeMap<String, String> {
        self.labels.clone().unwrap_or_default()
    }

    pub(crate) fn state(&self) -> &str {
        self.state.as_deref().unwrap_or("unknown")
    }
}

/// An RFC 3339 time as milliseconds since the epoch.
pub(crate) fn time_ms(s: &str) -> Option<u64> {
    let t: jiff::Timestamp = s.parse().ok()?;
    u64::try_from(t.as_millisecond()).ok()
}

/// Daytona's error body: `{statusCode, message, code, error}` (`message` may be a list, as
/// validation errors are).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ErrorBody {
    #[serde(default)]
    message: Option<serde_json::Value>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

/// An answer's status and text as one of our errors: `what` was being done, Daytona's words.
pub(crate) fn status_error(status: u16, body: &[u8], what: &str) -> Error {
    let b: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    let said = match &b.message {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(String::from).unwrap_or_else(|| v.to_string()))
            .collect::<Vec<_>>()
            .join("; "),
        Some(v) => v.to_string(),
        None => b
            .error
            .clone()
            .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(MAX_MESSAGE)]).into_owned()),
    };
    let said = cut(said);
    let code_said = b.code.map(|c| format!(", {c}")).unwrap_or_default();
    let msg = format!("{what}: Daytona answered {status}{code_said}: {}", said.trim());
    Error::new(code_of_status(status), msg)
}

impl Api {
    /// A client of the API at `base` (`https://app.daytona.io/api`).
    pub(crate) fn new(base: &str, key: ApiKey, connect_timeout: Duration, request_timeout: Duration) -> Result<Self> {
        let base = crate::vendor::base_url(base, VENDOR, "the Daytona API URL")?;
        Ok(Api {
            http: crate::vendor::client(VENDOR, connect_timeout)?,
            base,
            key,
            request_timeout,
        })
    }

    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub(crate) fn key(&self) -> &ApiKey {
        &self.key
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// The control plane's `path` (`/sandbox/ID`).
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Send what `build` makes (again on 429 and 503, while `ctx` allows), authorized,
    /// with the request deadline; the answer whatever its status.
    pub(crate) async fn send<F>(&self, ctx: &Ctx, what: &str, build: F) -> Result<reqwest::Response>
    where
        F: Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    {
        self.send_with(ctx, what, self.request_timeout, true, build).await
    }

    /// [`Api::send`] with a deadline of its own (a toolbox call that runs a program), and
    /// where the request is not `idempotent` (a create), a 503 answered at once rather than
    /// sent again (the first may have been done); a 429 is refused before any work and is
    /// always waited out.
    pub(crate) async fn send_with<F>(
        &self,
        ctx: &Ctx,
        what: &str,
        timeout: Duration,
        idempotent: bool,
        build: F,
    ) -> Result<reqwest::Response>
    where
        F: Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    {
        let build = || {
            build(&self.http)
                .bearer_auth(self.key.expose())
                .header("X-Daytona-Source", "agentbox")
        };
        match crate::vendor::send(ctx, VENDOR, what, timeout, idempotent, build).await? {
            Sent::Answer(r) => Ok(r),
            Sent::PastDeadline(r, wait) => {
                let status = r.status().as_u16();
                let body = read_capped(r, 64 << 10, what).await.unwrap_or_default();
                Err(status_error(status, &body, what).context(format!(
                    "Daytona asked to wait {}s, past this call's deadline",
                    wait.as_secs()
                )))
            }
        }
    }

    /// A JSON answer of a 2xx, else the answer's error.
    pub(crate) async fn json<T: DeserializeOwned, F>(&self, ctx: &Ctx, what: &str, build: F) -> Result<T>
    where
        F: Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    {
        let r = self.send(ctx, what, build).await?;
        decode(r, what).await
    }

    /// A 2xx answer's body dropped, else the answer's error.
    pub(crate) async fn ok<F>(&self, ctx: &Ctx, what: &str, build: F) -> Result<()>
    where
        F: Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    {
        let r = self.send(ctx, what, build).await?;
        let status = r.status().as_u16();
        let body = read_capped(r, MAX_JSON, what).await?;
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(status_error(status, &body, what))
        }
    }
}

/// A 2xx answer's JSON body, else its error.
pub(crate) async fn decode<T: DeserializeOwned>(r: reqwest::Response, what: &str) -> Result<T> {
    let status = r.status().as_u16();
    let body = read_capped(r, MAX_JSON, what).await?;
    if !(200..300).contains(&status) {
        return Err(status_error(status, &body, what));
    }
    serde_json::from_slice(&body)
        .map_err(|e| Error::unknown(format!("{what}: Daytona's answer is not what its API describes: {e}")))
}

/// At most `cap` bytes of an answer's body; a longer one is `too_large`.
pub(crate) async fn read_capped(r: reqwest::Response, cap: usize, what: &str) -> Result<Vec<u8>> {
    crate::vendor::read_capped(r, cap, VENDOR, what).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentbox_core::ErrorCode;

    #[test]
    fn errors_carry_daytonas_words_and_a_typed_code() {
        let e = status_error(
            404,
            br#"{"statusCode":404,"message":"Sandbox with ID x not found","code":"NOT_FOUND","source":"DAYTONA_API"}"#,
            "reading sandbox x",
        );
        assert_eq!(e.code(), ErrorCode::NotFound);
        assert!(e.message().contains("Sandbox with ID x not found"), "{e}");
        assert!(e.message().contains("NOT_FOUND"), "{e}");
        let e = status_error(
            400,
            br#"{"statusCode":400,"message":["name must be a string","cpu must be a number"]}"#,
            "creating",
        );
        assert_eq!(e.code(), ErrorCode::Invalid);
        assert!(
            e.message().contains("name must be a string; cpu must be a number"),
            "{e}"
        );
        assert_eq!(status_error(401, b"{}", "x").code(), ErrorCode::PermissionDenied);
        assert_eq!(status_error(429, b"", "x").code(), ErrorCode::Refused);
        assert_eq!(status_error(408, b"", "x").code(), ErrorCode::Timeout);
        // Not JSON: the text, cut short.
        let long = vec![b'x'; 5000];
        let e = status_error(502, &long, "x");
        assert_eq!(e.code(), ErrorCode::Unknown);
        assert!(e.message().len() < 800, "{}", e.message().len());
    }

    #[test]
    fn times_are_rfc3339() {
        assert_eq!(time_ms("1970-01-01T00:00:01.5Z"), Some(1500));
        assert_eq!(time_ms("2026-12-01T00:00:00+01:00"), time_ms("2026-11-30T23:00:00Z"));
        assert_eq!(time_ms("yesterday"), None);
    }
}

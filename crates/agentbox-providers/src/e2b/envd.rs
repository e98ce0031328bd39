//! envd, E2B's daemon in each sandbox: Connect RPC with JSON over HTTP/1.1 (unary calls, and
//! server streams of enveloped messages), and its file API.
//!
//! Every envd call names the sandbox (`E2b-Sandbox-Id`, `E2b-Sandbox-Port`: how E2B's proxy
//! and the SDK's `E2B_SANDBOX_URL` address it), shows the sandbox's access token
//! (`X-Access-Token`) and the user (`Authorization: Basic root:`). A stream asks envd for a
//! keepalive every [`Envd::keepalive`] and is given up when nothing (data or keepalive)
//! arrives for three of them: a sandbox that died mid-stream is an error within that, never a
//! hang.

use std::time::Duration;

use agentbox_core::{Ctx, Error, ErrorCode, Result};
use serde_json::Value;

use super::api::VENDOR;
use crate::vendor::{cut, read_capped};

/// envd's port, which the proxy is told in `E2b-Sandbox-Port`.
pub(crate) const PORT: u16 = 49983;
/// The largest envelope a stream may carry.
const MAX_ENVELOPE: usize = 16 << 20;
/// The longest one file may take to move (the caller's context bounds it too).
const FILE_TIMEOUT: Duration = Duration::from_secs(600);
/// Envelope flag of the stream's last message (its trailer).
const END_STREAM: u8 = 0x02;

#[derive(Clone)]
pub(crate) struct Envd {
    pub http: reqwest::Client,
    /// Where envd is reached (E2B's sandbox proxy, or `E2B_SANDBOX_URL`).
    pub base: String,
    pub sandbox_id: String,
    pub token: Option<crate::vendor::ApiKey>,
    pub keepalive: Duration,
    pub timeout: Duration,
}

impl Envd {
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("E2b-Sandbox-Id", &self.sandbox_id)
            .header("E2b-Sandbox-Port", PORT.to_string())
            // `root:` as the user envd runs the call as.
            .header("Authorization", "Basic cm9vdDo=");
        if let Some(t) = &self.token {
            r = r.header("X-Access-Token", t.expose());
        }
        r
    }

    /// A unary call: `rpc` (`/process.Process/SendInput`) with `body`, its answer.
    pub(crate) async fn unary(&self, ctx: &Ctx, rpc: &str, body: &Value) -> Result<Value> {
        let what = rpc.rsplit('/').next().unwrap_or(rpc);
        let r = ctx
            .run(
                self.request(reqwest::Method::POST, rpc)
                    .header("Content-Type", "application/json")
                    .header("Connect-Protocol-Version", "1")
                    .timeout(self.timeout)
                    .json(body)
                    .send(),
            )
            .await?
            .map_err(|e| crate::vendor::transport_error(&e, VENDOR, what, self.timeout))?;
        let status = r.status().as_u16();
        let bytes = read_capped(r, MAX_ENVELOPE, VENDOR, what).await?;
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status == 200 {
            return Ok(v);
        }
        Err(rpc_error(status, &v, what))
    }

    /// Open the server stream `rpc` with `body`.
    pub(crate) async fn stream(&self, ctx: &Ctx, rpc: &str, body: &Value) -> Result<Stream> {
        let what = rpc.rsplit('/').next().unwrap_or(rpc).to_string();
        let json = serde_json::to_vec(body).map_err(|e| Error::unknown(e.to_string()))?;
        let mut framed = Vec::with_capacity(json.len() + 5);
        framed.push(0);
        framed.extend_from_slice(&(json.len() as u32).to_be_bytes());
        framed.extend_from_slice(&json);
        // The answer's head within the call's deadline; the body then under the idle one.
        let send = self
            .request(reqwest::Method::POST, rpc)
            .header("Content-Type", "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .header("Keepalive-Ping-Interval", self.keepalive.as_secs().max(1).to_string())
            .body(framed)
            .send();
        let r = match ctx.run(tokio::time::timeout(self.timeout, send)).await? {
            Err(_) => {
                return Err(Error::timeout(format!(
                    "e2b: {what}: envd did not answer within {} s",
                    self.timeout.as_secs()
                )));
            }
            Ok(r) => r.map_err(|e| crate::vendor::transport_error(&e, VENDOR, &what, self.timeout))?,
        };
        let status = r.status().as_u16();
        if status != 200 {
            let bytes = read_capped(r, MAX_ENVELOPE, VENDOR, &what).await?;
            let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            return Err(rpc_error(status, &v, &what));
        }
        Ok(Stream {
            r,
            buf: Vec::new(),
            idle: self.keepalive * 3,
            what,
        })
    }

    /// Upload `data` to the absolute `path` (envd makes the parents).
    pub(crate) async fn upload(&self, ctx: &Ctx, path: &str, data: &[u8]) -> Result<()> {
        let part = reqwest::multipart::Part::bytes(data.to_vec())
            .file_name(path.to_string())
            .mime_str("application/octet-stream")
            .map_err(|e| Error::unknown(e.to_string()))?;
        let form = reqwest::multipart::Form::new().part("file", part);
        let r = ctx
            .run(
                self.request(reqwest::Method::POST, "/files")
                    .query(&[("path", path), ("username", "root")])
                    .timeout(FILE_TIMEOUT)
                    .multipart(form)
                    .send(),
            )
            .await?
            .map_err(|e| crate::vendor::transport_error(&e, VENDOR, "upload", FILE_TIMEOUT))?;
        let status = r.status().as_u16();
        let bytes = read_capped(r, 1 << 20, VENDOR, "upload").await?;
        if (200..300).contains(&status) {
            return Ok(());
        }
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Err(rpc_error(status, &v, &format!("writing {path}")))
    }

    /// Download the absolute `path`, at most `max` bytes.
    pub(crate) async fn download(&self, ctx: &Ctx, path: &str, max: usize) -> Result<Vec<u8>> {
        let r = ctx
            .run(
                self.request(reqwest::Method::GET, "/files")
                    .query(&[("path", path), ("username", "root")])
                    .timeout(FILE_TIMEOUT)
                    .send(),
            )
            .await?
            .map_err(|e| crate::vendor::transport_error(&e, VENDOR, "download", FILE_TIMEOUT))?;
        let status = r.status().as_u16();
        if status == 200 {
            return read_capped(r, max, VENDOR, &format!("reading {path}")).await;
        }
        let bytes = read_capped(r, 1 << 20, VENDOR, "download").await?;
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Err(rpc_error(status, &v, &format!("reading {path}")))
    }
}

/// An error of envd (Connect's `{code, message}`, or the proxy's `{code: 502, message}` for a
/// sandbox that is gone) as ours.
pub(crate) fn rpc_error(status: u16, v: &Value, what: &str) -> Error {
    let message = v.get("message").and_then(Value::as_str).unwrap_or("").to_string();
    let code = match v.get("code").and_then(Value::as_str) {
        Some("not_found") => ErrorCode::NotFound,
        Some("invalid_argument" | "out_of_range") => ErrorCode::Invalid,
        Some("unauthenticated" | "permission_denied") => ErrorCode::PermissionDenied,
        Some("deadline_exceeded") => ErrorCode::Timeout,
        Some("already_exists" | "failed_precondition" | "resource_exhausted") => ErrorCode::Refused,
        Some("unimplemented") => ErrorCode::Unsupported,
        Some("canceled") => ErrorCode::Aborted,
        _ if message.contains("was not found")
            && (status == 502 || v.get("code").and_then(Value::as_str) == Some("unavailable")) =>
        {
            ErrorCode::Gone
        }
        _ if status == 502 && message.contains("was not found") => ErrorCode::Gone,
        _ => crate::vendor::code_of_status(status),
    };
    Error::new(code, cut(format!("e2b: {what}: {message} (HTTP {status})")))
}

/// A server stream: its messages one by one.
pub(crate) struct Stream {
    r: reqwest::Response,
    buf: Vec<u8>,
    idle: Duration,
    what: String,
}

impl Stream {
    /// The next message; `None` at the stream's clean end. Nothing for three keepalives is an
    /// error (`timeout`), and so is a stream cut without its trailer (`unknown`).
    pub(crate) async fn next(&mut self) -> Result<Option<Value>> {
        loop {
            if self.buf.len() >= 5 {
                let flags = self.buf[0];
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
                if len > MAX_ENVELOPE {
                    return Err(Error::unknown(format!(
                        "e2b: {}: a message of {len} bytes, over the {MAX_ENVELOPE}-byte bound",
                        self.what
                    )));
                }
                if self.buf.len() >= 5 + len {
                    let body: Vec<u8> = self.buf.drain(..5 + len).skip(5).collect();
                    let v: Value = serde_json::from_slice(&body)
                        .map_err(|e| Error::unknown(format!("e2b: {}: a message that is not JSON: {e}", self.what)))?;
                    if flags & END_STREAM != 0 {
                        return match v.get("error") {
                            Some(e) => Err(rpc_error(500, e, &self.what)),
                            None => Ok(None),
                        };
                    }
                    return Ok(Some(v));
                }
            }
            match tokio::time::timeout(self.idle, self.r.chunk()).await {
                Err(_) => {
                    return Err(Error::timeout(format!(
                        "e2b: {}: nothing from the sandbox for {} s (no output, no keepalive)",
                        self.what,
                        self.idle.as_secs()
                    )));
                }
                Ok(Ok(Some(c))) => self.buf.extend_from_slice(&c),
                Ok(Ok(None)) => {
                    return Err(Error::unknown(format!(
                        "e2b: {}: the stream was cut before its end",
                        self.what
                    )));
                }
                Ok(Err(e)) => {
                    return Err(Error::unknown(format!(
                        "e2b: {}: the stream broke: {}",
                        self.what,
                        crate::vendor::chain(&e)
                    )));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_errors_map_to_typed_codes() {
        let v = serde_json::json!({"code": "not_found", "message": "process 7 not found"});
        assert_eq!(rpc_error(404, &v, "x").code(), ErrorCode::NotFound);
        let gone = serde_json::json!({"code": 502, "message": "The sandbox i1 was not found"});
        assert_eq!(rpc_error(502, &gone, "x").code(), ErrorCode::Gone);
        assert_eq!(rpc_error(401, &Value::Null, "x").code(), ErrorCode::PermissionDenied);
    }
}

//! envd, each running sandbox's own server (`spec/envd/envd.yaml`, `process.proto`,
//! `filesystem.proto`): Connect RPC with JSON over HTTP/1.1, and the HTTP file API.
//!
//! Connect: a unary call is `POST /pkg.Service/Method` with `Content-Type: application/json`,
//! its answer a JSON body (200) or an error `{code, message}` (`code` Connect's name, as
//! `not_found`) with the code's HTTP status. A server stream's request and answer are
//! `application/connect+json`: each message a 5-byte envelope (a flags byte, a big-endian
//! length) and its JSON; the answer is 200 and ends with an envelope of flags 2 holding `{}`
//! or `{"error": {code, message}}`. Messages are protobuf's JSON: fields in lowerCamelCase,
//! bytes as base64, enums by name, int64 as strings.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agentbox_core::{Ctx, FileError, FileMeta, FileType, Sandbox};
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Multipart, Request};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use crate::api::{error, json_response};
use crate::http::Query;
use crate::http::b64_encode;
use crate::state::{Ev, Launch, Proc, Sbx, Shared, St, lock, rfc3339, start_proc};

/// The largest RPC request.
const MAX_RPC: usize = 16 << 20;
/// The largest upload.
const MAX_UPLOAD: usize = 512 << 20;
/// How long a write to a program's stdin may wait for the program to read.
const STDIN_TIMEOUT: Duration = Duration::from_secs(30);
/// The most watchers one sandbox keeps.
const MAX_WATCHERS: usize = 64;
/// The largest download.
const MAX_DOWNLOAD: u64 = 512 << 20;
/// Where relative paths start, whoever asks, in a box that names no workspace.
const HOME: &str = "/root";
/// The most entries one ListDir answers.
const MAX_LISTED: usize = 100_000;
/// How long a file operation may take.
const FILE_TIMEOUT: Duration = Duration::from_secs(60);

type Frames = mpsc::Sender<Result<Bytes, std::io::Error>>;

/// A Connect error: its code's name and a message.
struct RpcError(&'static str, String);

impl RpcError {
    fn status(&self) -> u16 {
        match self.0 {
            "canceled" => 499,
            "invalid_argument" | "failed_precondition" | "out_of_range" => 400,
            "deadline_exceeded" => 504,
            "not_found" => 404,
            "already_exists" | "aborted" => 409,
            "permission_denied" => 403,
            "resource_exhausted" => 429,
            "unimplemented" => 501,
            "unavailable" => 503,
            "unauthenticated" => 401,
            _ => 500,
        }
    }

    fn json(&self) -> Value {
        json!({"code": self.0, "message": self.1})
    }

    fn unary(&self) -> Response {
        json_response(
            StatusCode::from_u16(self.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            &self.json(),
        )
    }
}

fn invalid(m: impl Into<String>) -> RpcError {
    RpcError("invalid_argument", m.into())
}

fn file_error(e: FileError, path: &str) -> RpcError {
    match e {
        FileError::Os(2) => RpcError("not_found", format!("path '{path}' does not exist")),
        FileError::Os(17) => RpcError("already_exists", format!("path '{path}' already exists")),
        FileError::Os(20) => invalid(format!("path '{path}' is not a directory")),
        FileError::Os(21) => invalid(format!("path '{path}' is a directory")),
        FileError::Os(1 | 13) => RpcError("permission_denied", format!("path '{path}': permission denied")),
        FileError::Os(39) => invalid(format!("path '{path}': directory not empty")),
        e @ FileError::Os(_) => RpcError("internal", format!("path '{path}': {e}")),
        FileError::Box(e) => RpcError("unavailable", format!("the sandbox: {e}")),
    }
}

/// Standard or URL-safe base64, padded or not, line breaks skipped.
pub(crate) fn b64_decode(s: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent)
            .with_decode_allow_trailing_bits(true),
    );
    let standard: String = s
        .chars()
        .filter(|c| *c != '\r' && *c != '\n')
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    engine.decode(standard).ok()
}

/// The user a request asks for (`Authorization: Basic base64(user:)`).
fn user_of(h: &HeaderMap) -> Option<String> {
    let v = h.get(header::AUTHORIZATION)?.to_str().ok()?;
    let raw = b64_decode(v.strip_prefix("Basic ")?.trim())?;
    let s = String::from_utf8(raw).ok()?;
    Some(s.split(':').next().unwrap_or("").to_string()).filter(|u| !u.is_empty())
}

/// Where a box's relative paths start: its workspace, where its programs start too (so a file
/// written as `x.txt` is the `x.txt` a command sees), else `/root`.
fn home_of(b: &dyn Sandbox) -> String {
    b.facts().workspace.clone().unwrap_or_else(|| HOME.to_string())
}

/// A path as envd takes it: relative ones, and `~`, from `home`.
fn resolve(home: &str, path: &str) -> String {
    let home = home.trim_end_matches('/');
    if path.starts_with('/') {
        path.to_string()
    } else if path.is_empty() || path == "~" {
        home.to_string()
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else {
        format!("{home}/{path}")
    }
}

fn parent(path: &str) -> Option<&str> {
    let p = path.trim_end_matches('/');
    let i = p.rfind('/')?;
    Some(if i == 0 { "/" } else { &p[..i] })
}

/// envd's port in every sandbox (the SDK's `envd_port`).
pub(crate) const PORT: u16 = 49983;

/// 502 as E2B's proxy answers for a sandbox it does not find running.
fn gone(id: &str) -> Response {
    json_response(
        StatusCode::BAD_GATEWAY,
        &json!({"code": 502, "message": format!("The sandbox {id} was not found"), "sandboxId": id}),
    )
}

pub(crate) async fn handle(s: Arc<Shared>, id: String, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let user = user_of(req.headers());
    s.record(method.as_str(), &path, Some(&id), user.as_deref());
    if let Some((status, message)) = s.fault(method.as_str(), &path) {
        return error(status, message);
    }
    let Some(x) = s.sandbox(&id) else {
        return gone(&id);
    };
    let Some(b) = x.running_box() else {
        return gone(&id);
    };
    let mut by_signature = false;
    if let Some(t) = &x.token
        && !crate::http::shows(req.headers(), "x-access-token", t)
    {
        // A file's URL may be signed instead (the SDKs' `download_url`, `upload_url`).
        if path == "/files" && req.headers().get("x-access-token").is_none() {
            let op = if method == Method::POST { "write" } else { "read" };
            if let Err(why) = signed(&Query::of(&req), op, t, now_secs()) {
                tracing::info!(sandbox = %id, op, "e2b: a signed file URL refused: {why}");
                return error(401, why);
            }
            by_signature = true;
        } else {
            let msg = "unauthorized access, please provide a valid access token or method signing if supported";
            return if path.starts_with("/files") || path == "/health" {
                error(401, msg)
            } else {
                RpcError("unauthenticated", msg.into()).unary()
            };
        }
    }
    match (&method, path.as_str()) {
        (&Method::GET, "/health") => {
            // The SDK's "is it running": a box ended elsewhere while idle ends its sandbox here.
            if crate::state::box_ended(b.as_ref()).await {
                tracing::info!(sandbox = %id, "e2b: the sandbox's box ended under it");
                s.remove(&id);
                return gone(&id);
            }
            let mut r = Response::new(Body::empty());
            *r.status_mut() = StatusCode::NO_CONTENT;
            r
        }
        (&Method::GET, "/files") => {
            let gzip = accepts_gzip(req.headers());
            download(b, Query::of(&req), gzip).await
        }
        (&Method::POST, "/files") => upload(b, req, by_signature).await,
        (&Method::POST, p) if p.starts_with("/process.Process/") || p.starts_with("/filesystem.Filesystem/") => {
            rpc(s, x, b, &p[1..], req).await
        }
        _ => error(404, format!("{method} {path}: no such route in envd")),
    }
}

/// Seconds since the epoch.
fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Whether a file URL's query is signed for `op` (`read` or `write`) with the sandbox's access
/// `token`, as the SDKs sign it: `signature` is `v1_` and the unpadded base64 of
/// `sha256("{path}:{op}:{username}:{token}")`, with `:{signature_expiration}` (seconds since the
/// epoch) before the hash when the URL expires; the path and user as the query gives them
/// (the user empty without `username`). The reason when it is not.
pub(crate) fn signed(q: &Query, op: &str, token: &str, now: u64) -> Result<(), String> {
    use base64::Engine as _;
    use sha2::Digest as _;
    let Some(signature) = q.get("signature") else {
        return Err("unauthorized access, please provide a valid access token or method signing if supported".into());
    };
    let path = q.get("path").unwrap_or("");
    let user = q.get("username").unwrap_or("");
    let raw = match q.get("signature_expiration") {
        Some(exp) => {
            let at: u64 = exp
                .parse()
                .map_err(|_| format!("signature_expiration {exp:?}: not seconds since the epoch"))?;
            if at < now {
                return Err("signature is already expired".into());
            }
            format!("{path}:{op}:{user}:{token}:{exp}")
        }
        None => format!("{path}:{op}:{user}:{token}"),
    };
    let want = format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(sha2::Sha256::digest(raw.as_bytes()))
    );
    if crate::http::same(signature, &want) {
        Ok(())
    } else {
        Err(format!(
            "invalid signature: not this sandbox's for {op} of {path:?} (the path, the operation, the user and the expiration are signed)"
        ))
    }
}

/// Whether a download may be gzipped: `Accept-Encoding` names `gzip` with a weight above 0.
fn accepts_gzip(h: &HeaderMap) -> bool {
    h.get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';');
            let name = parts.next().unwrap_or("").trim();
            let q = parts
                .find_map(|p| p.trim().strip_prefix("q="))
                .and_then(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            name.eq_ignore_ascii_case("gzip") && q > 0.0
        })
}

/// A gzip stream of `data`.
fn gzipped(data: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    let mut z = flate2::write::GzEncoder::new(Vec::with_capacity(data.len() / 2 + 64), flate2::Compression::fast());
    z.write_all(data)?;
    z.finish()
}

/// A gzip stream undone, refused past `max` bytes (a small body may unpack to a great deal).
fn gunzipped(data: &[u8], max: usize) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(data)
        .take(max as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("error decompressing request body: {e}"))?;
    if out.len() > max {
        return Err(format!("the decompressed body is past {max} bytes"));
    }
    Ok(out)
}

async fn download(b: Arc<dyn Sandbox>, q: Query, gzip: bool) -> Response {
    let home = home_of(b.as_ref());
    let Some(path) = q.get("path").map(|p| resolve(&home, p)) else {
        return error(400, "path: required");
    };
    let Some(f) = b.files() else {
        return error(500, "the box serves no files");
    };
    let ctx = Ctx::background().with_timeout(FILE_TIMEOUT);
    // Read whole: a file past the bound is refused before it is read, not held.
    if let Ok(m) = f.stat(&path, true, &ctx).await {
        if m.kind == FileType::Dir {
            return error(400, format!("path '{path}' is a directory"));
        }
        if m.size > MAX_DOWNLOAD {
            return error(
                400,
                format!(
                    "path '{path}' is {} bytes: more than {MAX_DOWNLOAD} are not served here",
                    m.size
                ),
            );
        }
    }
    match f.read(&path, &ctx).await {
        Ok(Some(data)) => {
            let (data, encoded) = match gzip {
                true => match gzipped(&data) {
                    Ok(z) => (z, true),
                    Err(e) => return error(500, format!("gzipping '{path}': {e}")),
                },
                false => (data, false),
            };
            let mut r = Response::new(Body::from(data));
            let h = r.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
            if encoded {
                h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            }
            r
        }
        Ok(None) => error(404, format!("path '{path}' does not exist")),
        Err(e) => {
            let e = file_error(e, &path);
            error(e.status(), e.1)
        }
    }
}

async fn write_file(b: &Arc<dyn Sandbox>, path: &str, data: &[u8]) -> Result<Value, Response> {
    let Some(f) = b.files() else {
        return Err(error(500, "the box serves no files"));
    };
    let ctx = Ctx::background().with_timeout(FILE_TIMEOUT);
    if let Some(dir) = parent(path) {
        match f.mkdir(dir, true, &ctx).await {
            Ok(()) | Err(FileError::Os(17)) => {}
            Err(e) => {
                let e = file_error(e, dir);
                return Err(error(e.status(), e.1));
            }
        }
    }
    if let Err(e) = f.write(path, data, false, &ctx).await {
        let e = file_error(e, path);
        return Err(error(e.status(), e.1));
    }
    let name = path.rsplit('/').next().unwrap_or("").to_string();
    Ok(json!({"path": path, "name": name, "type": "file"}))
}

/// An upload; `signed`: allowed by a signed URL, which signs its `path` alone, so every file
/// goes there and only one may be sent.
async fn upload(b: Arc<dyn Sandbox>, req: Request, signed: bool) -> Response {
    let q = Query::of(&req);
    let home = home_of(b.as_ref());
    let ctype = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let encoding = req
        .headers()
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|e| e.trim().to_ascii_lowercase());
    let req = match encoding.as_deref() {
        None | Some("") | Some("identity") => req,
        Some("gzip") => {
            let (mut parts, body) = req.into_parts();
            let packed = match axum::body::to_bytes(body, MAX_UPLOAD).await {
                Ok(d) => d,
                Err(e) => return error(400, format!("reading the body: {e}")),
            };
            let body = match gunzipped(&packed, MAX_UPLOAD) {
                Ok(b) => b,
                Err(e) => return error(400, e),
            };
            parts.headers.remove(header::CONTENT_ENCODING);
            parts.headers.remove(header::CONTENT_LENGTH);
            Request::from_parts(parts, Body::from(body))
        }
        Some(other) => {
            return error(
                400,
                format!("error decompressing request body: unsupported Content-Encoding: {other}, supported: [gzip]"),
            );
        }
    };
    let mut written = Vec::new();
    if ctype.starts_with("multipart/form-data") {
        let path = q.get("path").map(str::to_string);
        // Every part together bounded as the body is read: the router takes no bound of its own.
        let req = req.map(|b| Body::new(http_body_util::Limited::new(b, MAX_UPLOAD)));
        let mut m = match Multipart::from_request(req, &()).await {
            Ok(m) => m,
            Err(e) => return error(400, format!("the multipart body: {e}")),
        };
        let mut parts = Vec::new();
        loop {
            match m.next_field().await {
                Ok(Some(field)) => {
                    if field.name() != Some("file") {
                        continue;
                    }
                    let name = field.file_name().map(str::to_string);
                    match field.bytes().await {
                        Ok(data) => parts.push((name, data)),
                        Err(e) => return error(400, format!("the multipart body: {e}")),
                    }
                }
                Ok(None) => break,
                Err(e) => return error(400, format!("the multipart body: {e}")),
            }
        }
        if parts.is_empty() {
            return error(400, "no file in the multipart body");
        }
        let single = parts.len() == 1;
        if signed && (!single || path.is_none()) {
            return error(
                401,
                format!(
                    "a signed URL writes the one path it names; {} file(s) were sent, path {path:?}",
                    parts.len()
                ),
            );
        }
        for (name, data) in parts {
            let target = match (&path, name) {
                (Some(p), _) if single => resolve(&home, p),
                (_, Some(n)) if !n.is_empty() => resolve(&home, &n),
                _ => return error(400, "path: required (a query parameter, or each file's name)"),
            };
            match write_file(&b, &target, &data).await {
                Ok(v) => written.push(v),
                Err(r) => return r,
            }
        }
    } else {
        let Some(path) = q.get("path").map(|p| resolve(&home, p)) else {
            return error(400, "path: required with an octet-stream body");
        };
        let data = match axum::body::to_bytes(req.into_body(), MAX_UPLOAD).await {
            Ok(d) => d,
            Err(e) => return error(400, format!("reading the body: {e}")),
        };
        match write_file(&b, &path, &data).await {
            Ok(v) => written.push(v),
            Err(r) => return r,
        }
    }
    json_response(StatusCode::OK, &Value::Array(written))
}

/// One Connect call.
async fn rpc(s: Arc<Shared>, x: Arc<Sbx>, b: Arc<dyn Sandbox>, method: &str, req: Request) -> Response {
    let ctype = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    // Connect's JSON codec alone: the binary one (protobuf) is answered as Connect answers a
    // codec it lacks, naming the ones it has. E2B's SDKs speak JSON.
    let codec = ctype.split(';').next().unwrap_or("").trim();
    if !matches!(codec, "" | "application/json" | "application/connect+json") {
        let mut r = error(
            415,
            format!(
                "content-type {codec:?}: Connect's JSON codec alone is served here (application/json, application/connect+json)"
            ),
        );
        r.headers_mut().insert(
            header::HeaderName::from_static("accept-post"),
            HeaderValue::from_static("application/json, application/connect+json"),
        );
        return r;
    }
    let streaming = codec == "application/connect+json";
    let keepalive = req
        .headers()
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|n| *n > 0)
        .map(Duration::from_secs)
        .unwrap_or(s.keepalive);
    let deadline = req
        .headers()
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_millis);
    if method == "process.Process/StreamInput" {
        return stream_input(x, req).await;
    }
    let body = match axum::body::to_bytes(req.into_body(), MAX_RPC).await {
        Ok(b) => b,
        Err(e) => return invalid(format!("reading the request: {e}")).unary(),
    };
    let payload: &[u8] = if streaming {
        if body.len() < 5 {
            return stream_error(invalid("the request has no envelope"));
        }
        &body[5..]
    } else {
        &body
    };
    let v: Value = if payload.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(payload) {
            Ok(v) => v,
            Err(e) => {
                let e = invalid(format!("the request is not JSON: {e}"));
                return if streaming { stream_error(e) } else { e.unary() };
            }
        }
    };
    match method {
        "process.Process/Start" => start(&s, &x, b, &v, keepalive, deadline).await,
        "process.Process/Connect" => match find(&x, &v) {
            Ok(p) => {
                let rx = p.events.subscribe();
                stream(&s, &x, p.pid, rx, keepalive)
            }
            Err(e) => stream_error(e),
        },
        "filesystem.Filesystem/WatchDir" => watch_dir(&x, b, &v, keepalive).await,
        _ => match unary(&x, &b, method, &v).await {
            Ok(v) => json_response(StatusCode::OK, &v),
            Err(e) => e.unary(),
        },
    }
}

fn frame(flags: u8, v: &Value) -> Bytes {
    let payload = v.to_string().into_bytes();
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&payload);
    Bytes::from(out)
}

fn stream_response(rx: mpsc::Receiver<Result<Bytes, std::io::Error>>) -> Response {
    let body = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    let mut r = Response::new(Body::from_stream(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/connect+json"),
    );
    r
}

/// A stream that ends at once with an error.
fn stream_error(e: RpcError) -> Response {
    let (tx, rx) = mpsc::channel(2);
    let _ = tx.try_send(Ok(frame(2, &json!({"error": e.json()}))));
    stream_response(rx)
}

async fn start(
    s: &Arc<Shared>,
    x: &Arc<Sbx>,
    b: Arc<dyn Sandbox>,
    v: &Value,
    keepalive: Duration,
    deadline: Option<Duration>,
) -> Response {
    let tty = match v.get("pty") {
        None | Some(Value::Null) => None,
        Some(p) => match size_of(p) {
            Ok((rows, cols)) => Some(agentbox_core::Tty { rows, cols, term: None }),
            Err(e) => return stream_error(e),
        },
    };
    let p = v.get("process").cloned().unwrap_or(Value::Null);
    let Some(cmd) = p.get("cmd").and_then(Value::as_str).filter(|c| !c.is_empty()) else {
        return stream_error(invalid("process.cmd: required"));
    };
    let args: Vec<String> = p
        .get("args")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default();
    let envs: BTreeMap<String, String> = p
        .get("envs")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let cwd = p
        .get("cwd")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
        .map(|c| resolve(&home_of(b.as_ref()), c));
    let tag = v.get("tag").and_then(Value::as_str).map(str::to_string);
    let stdin = v.get("stdin").and_then(Value::as_bool).unwrap_or(false);
    if lock(&x.procs).len() >= crate::state::MAX_PROCS {
        return stream_error(RpcError(
            "resource_exhausted",
            format!(
                "the sandbox runs {} programs already: wait for one to end",
                crate::state::MAX_PROCS
            ),
        ));
    }
    let launch = Launch {
        cmd: cmd.to_string(),
        args,
        envs,
        cwd,
        tag,
        stdin,
        deadline,
        tty,
    };
    match start_proc(s, x, b, launch).await {
        Ok((p, rx)) => stream(s, x, p.pid, rx, keepalive),
        Err(e) => stream_error(invalid(format!("error starting process: {e}"))),
    }
}

fn event(e: Value) -> Value {
    json!({"event": e})
}

/// A process's event stream: `start`, then its `data` and `keepalive`s, then `end`; cut
/// without an end when the sandbox goes (pause, vanish, kill).
fn stream(s: &Shared, x: &Sbx, pid: u32, mut rx: broadcast::Receiver<Ev>, keepalive: Duration) -> Response {
    let (tx, out) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let mut cut = x.cut.subscribe();
    cut.borrow_and_update();
    let mut silence = s.silence.subscribe();
    let gone = x.state() != St::Running;
    tokio::spawn(async move {
        let send = |tx: &Frames, v: Value| {
            let tx = tx.clone();
            async move { tx.send(Ok(frame(0, &event(v)))).await.is_ok() }
        };
        if gone || !send(&tx, json!({"start": {"pid": pid}})).await {
            let _ = tx.send(Err(std::io::Error::other("the sandbox is gone"))).await;
            return;
        }
        let start = tokio::time::Instant::now() + keepalive;
        let mut tick = tokio::time::interval_at(start, keepalive);
        loop {
            let silent = *silence.borrow_and_update();
            tokio::select! {
                _ = cut.changed() => {
                    let _ = tx.send(Err(std::io::Error::other("the sandbox is gone"))).await;
                    return;
                }
                changed = silence.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = tx.closed() => return,
                ev = rx.recv(), if !silent => {
                    let ok = match ev {
                        Ok(Ev::Stdout(b)) => {
                            tick.reset();
                            send(&tx, json!({"data": {"stdout": b64_encode(&b)}})).await
                        }
                        Ok(Ev::Stderr(b)) => {
                            tick.reset();
                            send(&tx, json!({"data": {"stderr": b64_encode(&b)}})).await
                        }
                        Ok(Ev::Pty(b)) => {
                            tick.reset();
                            send(&tx, json!({"data": {"pty": b64_encode(&b)}})).await
                        }
                        Ok(Ev::End(e)) => {
                            if send(&tx, json!({"end": e})).await {
                                let _ = tx.send(Ok(frame(2, &json!({})))).await;
                            }
                            return;
                        }
                        Err(broadcast::error::RecvError::Lagged(_)) => true,
                        Err(broadcast::error::RecvError::Closed) => {
                            // Its sandbox went (the program's events end with it): cut, as
                            // the cut above would have.
                            if cut.has_changed().unwrap_or(true) {
                                let _ = tx.send(Err(std::io::Error::other("the sandbox is gone"))).await;
                            } else {
                                let _ = tx.send(Ok(frame(2, &json!({"error": {"code": "unknown", "message": "the process's events ended"}})))).await;
                            }
                            return;
                        }
                    };
                    if !ok {
                        return;
                    }
                }
                _ = tick.tick(), if !silent => {
                    if !send(&tx, json!({"keepalive": {}})).await {
                        return;
                    }
                }
            }
        }
    });
    stream_response(out)
}

fn find(x: &Sbx, v: &Value) -> Result<Arc<Proc>, RpcError> {
    let sel = v.get("process").cloned().unwrap_or(Value::Null);
    let procs = lock(&x.procs);
    if let Some(pid) = sel.get("pid").and_then(Value::as_u64) {
        return procs
            .get(&(pid as u32))
            .cloned()
            .ok_or_else(|| RpcError("not_found", format!("process with pid {pid} not found")));
    }
    if let Some(tag) = sel.get("tag").and_then(Value::as_str) {
        return procs
            .values()
            .find(|p| p.tag.as_deref() == Some(tag))
            .cloned()
            .ok_or_else(|| RpcError("not_found", format!("process with tag {tag} not found")));
    }
    Err(invalid("process: a pid or a tag"))
}

/// A PTY's `size {cols, rows}`: rows and columns, each 1 to 1000.
fn size_of(pty: &Value) -> Result<(u16, u16), RpcError> {
    let size = pty.get("size").ok_or_else(|| invalid("pty.size: required"))?;
    let dim = |k: &str| {
        size.get(k)
            .and_then(Value::as_u64)
            .filter(|n| (1..=1000).contains(n))
            .map(|n| n as u16)
            .ok_or_else(|| {
                invalid(format!(
                    "pty.size.{k}: {}: 1 to 1000",
                    size.get(k).unwrap_or(&Value::Null)
                ))
            })
    };
    Ok((dim("rows")?, dim("cols")?))
}

/// The signal a SendSignal names (by enum name or number).
fn signal_of(v: &Value) -> Result<i32, RpcError> {
    match v.get("signal") {
        Some(Value::String(s)) if s == "SIGNAL_SIGKILL" => Ok(9),
        Some(Value::String(s)) if s == "SIGNAL_SIGTERM" => Ok(15),
        Some(Value::Number(n)) if n.as_i64() == Some(9) || n.as_i64() == Some(15) => Ok(n.as_i64().unwrap_or(9) as i32),
        other => Err(invalid(format!("signal {other:?}: SIGNAL_SIGTERM or SIGNAL_SIGKILL"))),
    }
}

async fn write_stdin(p: &Proc, data: &[u8]) -> Result<(), RpcError> {
    use tokio::io::AsyncWriteExt;
    let mut w = p.stdin.lock().await;
    let Some(w) = w.as_mut() else {
        return Err(RpcError(
            "failed_precondition",
            "the process's stdin is not open".into(),
        ));
    };
    // A program that reads no input must not hold the call (nor its stdin's lock) forever.
    let written = tokio::time::timeout(STDIN_TIMEOUT, async {
        w.write_all(data).await?;
        w.flush().await
    })
    .await;
    match written {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(RpcError("internal", format!("writing stdin: {e}"))),
        Err(_) => Err(RpcError(
            "deadline_exceeded",
            format!("writing stdin: the program read none of it within {STDIN_TIMEOUT:?}"),
        )),
    }
}

fn input_of(v: &Value) -> Result<Vec<u8>, RpcError> {
    let input = v.get("input").cloned().unwrap_or(Value::Null);
    let s = input
        .get("stdin")
        .or_else(|| input.get("pty"))
        .and_then(Value::as_str)
        .unwrap_or("");
    b64_decode(s).ok_or_else(|| invalid("input: not base64"))
}

/// Go's `FileMode.String()` of a kind and permission bits.
fn permissions(kind: FileType, mode: u32) -> String {
    let mut s = String::from(match kind {
        FileType::Dir => "d",
        FileType::Symlink => "L",
        _ => "-",
    });
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    s
}

/// envd's `EntryInfo` of `path`, `m` its lstat. A symlink is reported as envd reports one:
/// the type and permission bits of what it finally points at (unspecified and 0 when that is
/// missing), `symlinkTarget` the path it resolves to (its own path when it resolves to
/// nothing), and its own size, time and `permissions` (`L...`).
async fn entry(b: &dyn Sandbox, path: &str, m: &FileMeta) -> Value {
    let type_name = |k: FileType| match k {
        FileType::File => "FILE_TYPE_FILE",
        FileType::Dir => "FILE_TYPE_DIRECTORY",
        FileType::Symlink | FileType::Other => "FILE_TYPE_UNSPECIFIED",
    };
    let name = path.trim_end_matches('/').rsplit('/').next().unwrap_or("").to_string();
    let (kind, mode, target) = if m.kind == FileType::Symlink {
        let ctx = Ctx::background().with_timeout(LINK_TIMEOUT);
        let followed = match b.files() {
            Some(f) => f.stat(path, true, &ctx).await.ok(),
            None => None,
        };
        let (kind, mode) = followed.map_or(("FILE_TYPE_UNSPECIFIED", 0), |t| (type_name(t.kind), t.mode & 0o777));
        (kind, mode, Some(resolved(b, path).await))
    } else {
        (type_name(m.kind), m.mode & 0o777, None)
    };
    let mut e = json!({
        "name": if name.is_empty() { m.name.clone() } else { name },
        "type": kind,
        "path": path,
        "size": m.size.to_string(),
        "mode": mode,
        "permissions": permissions(m.kind, m.mode & 0o777),
        "owner": "root",
        "group": "root",
        "modifiedTime": rfc3339(m.mtime_ms.max(0) as u64),
    });
    if let Some(t) = target {
        e["symlinkTarget"] = json!(t);
    }
    e
}

/// How long resolving a symlink's target may take.
const LINK_TIMEOUT: Duration = Duration::from_secs(10);

/// The path a symlink finally resolves to (`readlink -e` in the box), or its own path when it
/// resolves to nothing, as envd answers a broken link.
async fn resolved(b: &dyn Sandbox, path: &str) -> String {
    let argv = ["readlink", "-e", "--", path].map(str::to_string);
    let ctx = Ctx::background().with_timeout(LINK_TIMEOUT);
    let Ok(p) = b.exec(&argv, &Default::default(), &ctx).await else {
        return path.to_string();
    };
    let opts = agentbox_core::FinishOptions {
        max_output: 64 << 10,
        ..Default::default()
    };
    match agentbox_core::finish(p, opts).await {
        Ok(done) if done.status.success() => {
            let out = done.stdout_text();
            let t = out.trim_end_matches('\n');
            if t.starts_with('/') {
                t.to_string()
            } else {
                path.to_string()
            }
        }
        _ => path.to_string(),
    }
}

fn path_field(home: &str, v: &Value, field: &str) -> Result<String, RpcError> {
    v.get(field)
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
        .map(|p| resolve(home, p))
        .ok_or_else(|| invalid(format!("{field}: required")))
}

async fn unary(x: &Sbx, b: &Arc<dyn Sandbox>, method: &str, v: &Value) -> Result<Value, RpcError> {
    match method {
        "process.Process/List" => {
            let procs: Vec<Arc<Proc>> = lock(&x.procs).values().cloned().collect();
            let list: Vec<Value> = procs
                .iter()
                .map(|p| {
                    let mut i = json!({"config": p.config(), "pid": p.pid});
                    if let Some(t) = &p.tag {
                        i["tag"] = json!(t);
                    }
                    i
                })
                .collect();
            Ok(json!({"processes": list}))
        }
        "process.Process/SendInput" => {
            let p = find(x, v)?;
            write_stdin(&p, &input_of(v)?).await?;
            Ok(json!({}))
        }
        "process.Process/CloseStdin" => {
            let p = find(x, v)?;
            if let Some(mut w) = p.stdin.lock().await.take() {
                let _ = w.close().await;
            }
            Ok(json!({}))
        }
        "process.Process/SendSignal" => {
            let p = find(x, v)?;
            let sig = signal_of(v)?;
            p.signalled.store(sig as u32, Ordering::Relaxed);
            p.killer
                .signal(sig)
                .await
                .map_err(|e| RpcError("internal", format!("error sending signal: {e}")))?;
            Ok(json!({}))
        }
        "process.Process/Update" => {
            let p = find(x, v)?;
            if let Some(pty) = v.get("pty").filter(|p| !p.is_null()) {
                let (rows, cols) = size_of(pty)?;
                p.killer
                    .resize(rows, cols)
                    .await
                    .map_err(|e| RpcError("internal", format!("error resizing the terminal: {e}")))?;
            }
            Ok(json!({}))
        }
        "filesystem.Filesystem/CreateWatcher" => {
            if lock(&x.watchers).len() >= MAX_WATCHERS {
                return Err(RpcError(
                    "resource_exhausted",
                    format!("the sandbox keeps {MAX_WATCHERS} watchers already: remove one first"),
                ));
            }
            let (root, recursive, first) = watched(b, v).await?;
            let id = crate::state::random(b"abcdefghijklmnopqrstuvwxyz0123456789", 16);
            let w = crate::watch::Watcher::start(b.clone(), root, recursive, first);
            lock(&x.watchers).insert(id.clone(), w);
            Ok(json!({"watcherId": id}))
        }
        "filesystem.Filesystem/GetWatcherEvents" => {
            let id = v.get("watcherId").and_then(Value::as_str).unwrap_or("");
            let events = lock(&x.watchers)
                .get(id)
                .map(crate::watch::Watcher::drain)
                .ok_or_else(|| RpcError("not_found", format!("watcher with id {id} not found")))?;
            Ok(json!({"events": events}))
        }
        "filesystem.Filesystem/RemoveWatcher" => {
            let id = v.get("watcherId").and_then(Value::as_str).unwrap_or("");
            lock(&x.watchers)
                .remove(id)
                .ok_or_else(|| RpcError("not_found", format!("watcher with id {id} not found")))?;
            Ok(json!({}))
        }
        m if m.starts_with("filesystem.Filesystem/") => files(b, &m["filesystem.Filesystem/".len()..], v).await,
        _ => Err(RpcError(
            "unimplemented",
            format!("{method} is not served by agentbox's E2B API yet"),
        )),
    }
}

async fn files(b: &Arc<dyn Sandbox>, method: &str, v: &Value) -> Result<Value, RpcError> {
    let Some(f) = b.files() else {
        return Err(RpcError("internal", "the box serves no files".into()));
    };
    let ctx = Ctx::background().with_timeout(FILE_TIMEOUT);
    let home = home_of(b.as_ref());
    match method {
        "Stat" => {
            let path = path_field(&home, v, "path")?;
            let m = f.stat(&path, false, &ctx).await.map_err(|e| file_error(e, &path))?;
            Ok(json!({"entry": entry(b.as_ref(), &path, &m).await}))
        }
        "ListDir" => {
            let path = path_field(&home, v, "path")?;
            // envd: 0 is 1, and 1 the directory's own entries.
            let depth = v.get("depth").and_then(Value::as_u64).unwrap_or(1).max(1);
            let m = f.stat(&path, true, &ctx).await.map_err(|e| match e {
                FileError::Os(2) => RpcError("not_found", format!("path not found: {path}")),
                e => file_error(e, &path),
            })?;
            if m.kind != FileType::Dir {
                return Err(invalid(format!("path is not a directory: {path}")));
            }
            // Every entry down to `depth` (a symlinked directory listed, not entered), then in
            // the order envd walks: depth first, each directory's entries in byte order, each
            // directory followed by what is in it. That is the order of their paths compared
            // component by component.
            let mut found: Vec<(String, FileMeta)> = Vec::new();
            let mut todo = vec![(path.clone(), 1u64)];
            while let Some((dir, level)) = todo.pop() {
                let list = match f.list(&dir, &ctx).await {
                    Ok(l) => l,
                    // Gone since it was seen: skipped, as envd skips it.
                    Err(FileError::Os(2)) if dir != path => continue,
                    Err(e) => return Err(file_error(e, &dir)),
                };
                for m in list {
                    if found.len() >= MAX_LISTED {
                        return Err(RpcError(
                            "resource_exhausted",
                            format!("path {path}: more than {MAX_LISTED} entries to depth {depth}: ask less depth"),
                        ));
                    }
                    let p = format!("{}/{}", dir.trim_end_matches('/'), m.name);
                    if m.kind == FileType::Dir && level < depth {
                        todo.push((p.clone(), level + 1));
                    }
                    found.push((p, m));
                }
            }
            found.sort_by(|(a, _), (b, _)| a.split('/').map(str::as_bytes).cmp(b.split('/').map(str::as_bytes)));
            let mut entries = Vec::with_capacity(found.len());
            for (p, m) in &found {
                entries.push(entry(b.as_ref(), p, m).await);
            }
            Ok(json!({"entries": entries}))
        }
        "MakeDir" => {
            let path = path_field(&home, v, "path")?;
            match f.stat(&path, true, &ctx).await {
                Ok(m) if m.kind == FileType::Dir => {
                    return Err(RpcError("already_exists", format!("directory already exists: {path}")));
                }
                Ok(_) => {
                    return Err(invalid(format!(
                        "path already exists but it is not a directory: {path}"
                    )));
                }
                Err(_) => {}
            }
            f.mkdir(&path, true, &ctx).await.map_err(|e| file_error(e, &path))?;
            let m = f.stat(&path, false, &ctx).await.map_err(|e| file_error(e, &path))?;
            Ok(json!({"entry": entry(b.as_ref(), &path, &m).await}))
        }
        "Move" => {
            let from = path_field(&home, v, "source")?;
            let to = path_field(&home, v, "destination")?;
            if let Some(dir) = parent(&to) {
                match f.mkdir(dir, true, &ctx).await {
                    Ok(()) | Err(FileError::Os(17)) => {}
                    Err(e) => return Err(file_error(e, dir)),
                }
            }
            f.rename(&from, &to, &ctx).await.map_err(|e| file_error(e, &from))?;
            let m = f.stat(&to, false, &ctx).await.map_err(|e| file_error(e, &to))?;
            Ok(json!({"entry": entry(b.as_ref(), &to, &m).await}))
        }
        "Remove" => {
            let path = path_field(&home, v, "path")?;
            // As envd's RemoveAll: down the tree, and a missing path is no error.
            f.remove(&path, true, true, &ctx)
                .await
                .map_err(|e| file_error(e, &path))?;
            Ok(json!({}))
        }
        _ => Err(RpcError(
            "unimplemented",
            format!("filesystem.Filesystem/{method} is not served by agentbox's E2B API yet"),
        )),
    }
}

/// What a watch asks: its directory (which must be one), whether it goes down the tree, and
/// its first listing.
async fn watched(b: &Arc<dyn Sandbox>, v: &Value) -> Result<(String, bool, crate::watch::Seen), RpcError> {
    let root = path_field(&home_of(b.as_ref()), v, "path")?;
    let recursive = v.get("recursive").and_then(Value::as_bool).unwrap_or(false);
    if let Some(f) = b.files() {
        let ctx = Ctx::background().with_timeout(FILE_TIMEOUT);
        let m = f.stat(&root, true, &ctx).await.map_err(|e| file_error(e, &root))?;
        if m.kind != FileType::Dir {
            return Err(invalid(format!("path {root} not a directory")));
        }
    }
    let first = crate::watch::list(b.as_ref(), &root, recursive)
        .await
        .map_err(|e| file_error(e, &root))?;
    Ok((root, recursive, first))
}

/// WatchDir: `start`, then each poll's events as they come (`keepalive` after every quiet
/// interval), until the client goes or the sandbox does.
async fn watch_dir(x: &Sbx, b: Arc<dyn Sandbox>, v: &Value, keepalive: Duration) -> Response {
    let (root, recursive, first) = match watched(&b, v).await {
        Ok(w) => w,
        Err(e) => return stream_error(e),
    };
    let (tx, out) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let mut cut = x.cut.subscribe();
    cut.borrow_and_update();
    tokio::spawn(async move {
        // WatchDirResponse's oneof is its own fields (`start`, `filesystem`, `keepalive`),
        // not a process event's `event` wrapper.
        let send = |v: Value| {
            let tx = tx.clone();
            async move { tx.send(Ok(frame(0, &v))).await.is_ok() }
        };
        if !send(json!({"start": {}})).await {
            return;
        }
        let mut last = first;
        let mut quiet = Duration::ZERO;
        loop {
            tokio::select! {
                _ = cut.changed() => {
                    let _ = tx.send(Err(std::io::Error::other("the sandbox is gone"))).await;
                    return;
                }
                _ = tx.closed() => return,
                _ = tokio::time::sleep(crate::watch::POLL) => {}
            }
            quiet += crate::watch::POLL;
            let Ok(now) = crate::watch::list(b.as_ref(), &root, recursive).await else {
                continue;
            };
            for e in crate::watch::changes(&last, &now) {
                quiet = Duration::ZERO;
                if !send(json!({"filesystem": e})).await {
                    return;
                }
            }
            last = now;
            if quiet >= keepalive {
                quiet = Duration::ZERO;
                if !send(json!({"keepalive": {}})).await {
                    return;
                }
            }
        }
    });
    stream_response(out)
}

/// StreamInput: a client stream of `start {process}`, `data {input}` and `keepalive`
/// envelopes, each data written to the process's stdin as it comes.
async fn stream_input(x: Arc<Sbx>, req: Request) -> Response {
    let mut body = req.into_body().into_data_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut target: Option<Arc<Proc>> = None;
    let answer = |e: Option<RpcError>| {
        let (tx, rx) = mpsc::channel(4);
        match e {
            None => {
                let _ = tx.try_send(Ok(frame(0, &json!({}))));
                let _ = tx.try_send(Ok(frame(2, &json!({}))));
            }
            Some(e) => {
                let _ = tx.try_send(Ok(frame(2, &json!({"error": e.json()}))));
            }
        }
        stream_response(rx)
    };
    loop {
        while buf.len() >= 5 {
            let n = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
            if n > MAX_RPC {
                return answer(Some(invalid("an input message past 16 MiB")));
            }
            if buf.len() < 5 + n {
                break;
            }
            let msg: Value = match serde_json::from_slice(&buf[5..5 + n]) {
                Ok(v) => v,
                Err(e) => return answer(Some(invalid(format!("an input message is not JSON: {e}")))),
            };
            buf.drain(..5 + n);
            if let Some(start) = msg.get("start") {
                match find(&x, start) {
                    Ok(p) => target = Some(p),
                    Err(e) => return answer(Some(e)),
                }
            } else if let Some(data) = msg.get("data") {
                let Some(p) = &target else {
                    return answer(Some(invalid("data before start")));
                };
                let bytes = match input_of(data) {
                    Ok(b) => b,
                    Err(e) => return answer(Some(e)),
                };
                if let Err(e) = write_stdin(p, &bytes).await {
                    return answer(Some(e));
                }
            }
        }
        match body.next().await {
            Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
            Some(Err(e)) => return answer(Some(RpcError("canceled", format!("reading the input: {e}")))),
            None => break,
        }
    }
    answer(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Signatures as E2B's Python SDK makes them (`e2b.sandbox.signature.get_signature`, its
    /// output for these inputs), with and without an expiration, a user and a space in a path.
    #[test]
    fn a_file_url_signed_as_the_sdk_signs_it_is_taken_and_nothing_else() {
        let q = |pairs: &[(&str, &str)]| Query(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        let read = q(&[
            ("path", "/home/a b.txt"),
            ("signature", "v1_BkTU+n+1H7X1U7y68sgFIpP/874b0xtSLa4hVpfKT3M"),
        ]);
        assert_eq!(signed(&read, "read", "tok123", 0), Ok(()));
        assert!(
            signed(&read, "write", "tok123", 0)
                .unwrap_err()
                .contains("invalid signature")
        );
        assert!(signed(&read, "read", "tok124", 0).is_err());
        let write = q(&[
            ("path", "x.txt"),
            ("username", "user"),
            ("signature", "v1_0qluIAXLBA+BTmZTCkftSC6VI6aEvhc7ZKDnRNNKEfU"),
        ]);
        assert_eq!(signed(&write, "write", "tok123", 0), Ok(()));
        let expiring = q(&[
            ("path", "x.txt"),
            ("signature", "v1_Kxed81xNP/p7ZqOUi66nFA0pkwMPZp2nyGbsbMdq+vg"),
            ("signature_expiration", "1060"),
        ]);
        assert_eq!(signed(&expiring, "read", "tok123", 1060), Ok(()));
        assert_eq!(
            signed(&expiring, "read", "tok123", 1061),
            Err("signature is already expired".into())
        );
        let moved = q(&[
            ("path", "x.txt"),
            ("signature", "v1_Kxed81xNP/p7ZqOUi66nFA0pkwMPZp2nyGbsbMdq+vg"),
            ("signature_expiration", "9999"),
        ]);
        assert!(
            signed(&moved, "read", "tok123", 0).is_err(),
            "a later expiration is not signed"
        );
        assert!(signed(&q(&[("path", "x.txt")]), "read", "tok123", 0).is_err());
        assert!(
            signed(
                &q(&[("signature", "v1_x"), ("signature_expiration", "soon")]),
                "read",
                "t",
                0
            )
            .unwrap_err()
            .contains("signature_expiration")
        );
    }

    #[test]
    fn gzip_is_taken_by_weight_and_undone_within_a_bound() {
        let h = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
            h
        };
        assert!(accepts_gzip(&h("gzip, deflate")));
        assert!(accepts_gzip(&h("br;q=1, GZIP;q=0.5")));
        assert!(!accepts_gzip(&h("gzip;q=0")));
        assert!(!accepts_gzip(&h("identity")));
        assert!(!accepts_gzip(&HeaderMap::new()));
        let data = vec![7u8; 100_000];
        let z = gzipped(&data).unwrap();
        assert!(z.len() < 1000, "compressed: {}", z.len());
        assert_eq!(gunzipped(&z, 100_000).unwrap(), data);
        let past = gunzipped(&z, 99_999).unwrap_err();
        assert!(past.contains("past 99999 bytes"), "{past}");
        assert!(gunzipped(b"not gzip", 10).unwrap_err().contains("decompressing"));
    }
}

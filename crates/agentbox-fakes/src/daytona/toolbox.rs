//! The toolbox, under `/toolbox/{sandboxId}`: what the daemon in each sandbox serves through
//! Daytona's proxy (`daytona_toolbox_api_client`'s paths and models): `process/execute`,
//! sessions and their commands' logs (JSON, text, or followed over a WebSocket), bulk upload
//! and download of files, file info, and the home, work directory and version.
//!
//! Every file moves through the box's own upload and download (never by a host path).

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{ErrorCode, ExecOptions, Sandbox};
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Multipart, Request};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use futures_util::SinkExt;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};

use crate::daytona::Query;
use crate::daytona::error::{DError, DResult, json_response, ok};
use crate::daytona::session::Session;
use crate::daytona::state::{DAEMON_VERSION, Sbx, Shared, shell_of};

/// The most a bulk upload's body may carry.
pub(crate) const MAX_UPLOAD: usize = 512 << 20;
/// The most one file of a download may be.
const MAX_DOWNLOAD: u64 = 512 << 20;
/// The most output `process/execute` keeps.
const MAX_OUTPUT: usize = 64 << 20;
/// The boundary of a bulk download's answer (the daemon's, `download_files.go`).
const BOUNDARY: &str = "DAYTONA-FILE-BOUNDARY";
/// The home and working directory the box's programs get.
pub(crate) const HOME: &str = "/root";
pub(crate) const WORK_DIR: &str = "/workspace";
/// The SDK version from which the logs endpoint answers JSON (`pkg/session/common.go`).
const JSON_LOGS_FROM: (u64, u64, u64) = (0, 167, 0);

pub(crate) async fn route(s: &Arc<Shared>, sbx: &Arc<Sbx>, seg: &[&str], q: &Query, req: Request) -> DResult {
    let m = req.method().clone();
    let get = m == Method::GET;
    let post = m == Method::POST;
    let b = sbx
        .boxed()
        .ok_or_else(|| DError::internal("the sandbox has no box", crate::daytona::error::Source::Proxy))?;
    let _ = s;
    match seg {
        ["process", "execute"] if post => execute(sbx, b, body(req).await?).await,
        ["process", "session"] if get => ok(json!(sbx.sessions.list().iter().map(|x| x.json()).collect::<Vec<_>>())),
        ["process", "session"] if post => {
            let v = body(req).await?;
            let id = v["sessionId"]
                .as_str()
                .filter(|i| !i.is_empty())
                .ok_or_else(|| DError::daemon_bad_request("sessionId is required"))?;
            sbx.sessions.create(id, b, shell_of(&sbx.root)).await?;
            Ok(status(StatusCode::CREATED))
        }
        ["process", "session", sid] if get => ok(session(sbx, sid)?.json()),
        ["process", "session", sid] if m == Method::DELETE => {
            if sbx.sessions.delete(sid).await {
                Ok(status(StatusCode::NO_CONTENT))
            } else {
                Err(session_not_found(sid))
            }
        }
        ["process", "session", sid, "exec"] if post => {
            let sess = session(sbx, sid)?;
            let v = body(req).await?;
            let command = v["command"]
                .as_str()
                .filter(|c| !c.trim().is_empty())
                .ok_or_else(|| DError::daemon_bad_request("command is required"))?;
            let run_async = v["runAsync"].as_bool().or(v["async"].as_bool()).unwrap_or(false);
            let cmd = sess.exec(command, v["suppressInputEcho"].as_bool().unwrap_or(false))?;
            if run_async {
                return Ok(json_response(StatusCode::ACCEPTED, &json!({"cmdId": cmd.id})));
            }
            let exit = sess.wait(&cmd).await;
            let l = cmd.logs();
            let mut out = json!({
                "cmdId": cmd.id,
                "output": lossy(&l.output),
                "stdout": lossy(&l.stdout),
                "stderr": lossy(&l.stderr),
            });
            match exit {
                Some(c) => out["exitCode"] = json!(c),
                None => {
                    return Err(DError::daemon(
                        410,
                        "SESSION_ENDED",
                        format!("session {sid} ended before the command did"),
                    ));
                }
            }
            ok(out)
        }
        ["process", "session", sid, "command", cid] if get => {
            let cmd = command(&session(sbx, sid)?, cid)?;
            ok(cmd.json())
        }
        ["process", "session", sid, "command", cid, "input"] if post => {
            let sess = session(sbx, sid)?;
            let cmd = command(&sess, cid)?;
            let v = body(req).await?;
            let data = v["data"]
                .as_str()
                .ok_or_else(|| DError::daemon_bad_request("data is required"))?;
            sess.input(&cmd, data).await?;
            Ok(status(StatusCode::NO_CONTENT))
        }
        ["process", "session", sid, "command", cid, "logs"] if get => {
            let sess = session(sbx, sid)?;
            let cmd = command(&sess, cid)?;
            if q.get("follow") == Some("true") {
                if crate::daytona::is_websocket(req.headers()) {
                    return follow(cmd, req);
                }
                return Err(DError::daemon_bad_request("follow=true needs a WebSocket upgrade"));
            }
            let l = cmd.logs();
            if json_logs(&req) {
                return ok(json!({"output": lossy(&l.output), "stdout": lossy(&l.stdout), "stderr": lossy(&l.stderr)}));
            }
            let mut r = Response::new(Body::from(l.output));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            Ok(r)
        }
        ["files", "bulk-upload"] if post => upload(&b, req).await,
        ["files", "bulk-download"] if post => download_many(&b, body(req).await?).await,
        ["files", "download"] if get => {
            let path = q
                .get("path")
                .filter(|p| !p.is_empty())
                .ok_or_else(|| DError::daemon_bad_request("path is required"))?;
            match b.download(path, MAX_DOWNLOAD, &ctx()).await {
                Ok(data) => {
                    let mut r = Response::new(Body::from(data));
                    r.headers_mut().insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/octet-stream"),
                    );
                    Ok(r)
                }
                Err(e) => Err(file_error(path, &e)),
            }
        }
        ["files", "info"] if get => {
            let path = q
                .get("path")
                .filter(|p| !p.is_empty())
                .ok_or_else(|| DError::daemon_bad_request("path is required"))?;
            info(&b, path).await
        }
        ["user-home-dir"] if get => ok(json!({"dir": HOME})),
        ["work-dir"] if get => ok(json!({"dir": WORK_DIR})),
        ["version"] if get => ok(json!({"version": DAEMON_VERSION})),
        _ => Err(DError::daemon(
            404,
            "NOT_FOUND",
            format!("{m} /{} is not served by this fake's toolbox", seg.join("/")),
        )),
    }
}

fn ctx() -> agentbox_core::Ctx {
    agentbox_core::Ctx::background().with_timeout(Duration::from_secs(300))
}

fn status(s: StatusCode) -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = s;
    r
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

async fn body(req: Request) -> Result<Value, DError> {
    let bytes = axum::body::to_bytes(req.into_body(), 8 << 20)
        .await
        .map_err(|e| DError::daemon(413, "BAD_REQUEST", format!("reading the body: {e}")))?;
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| DError::daemon(400, "INVALID_REQUEST_BODY", format!("invalid JSON body: {e}")))
}

fn session_not_found(sid: &str) -> DError {
    DError::daemon(404, "NOT_FOUND", format!("session {sid} not found"))
}

fn session(sbx: &Sbx, sid: &str) -> Result<Arc<Session>, DError> {
    sbx.sessions.get(sid).ok_or_else(|| session_not_found(sid))
}

fn command(sess: &Arc<Session>, cid: &str) -> Result<Arc<crate::daytona::session::Cmd>, DError> {
    sess.command(cid)
        .ok_or_else(|| DError::daemon(404, "NOT_FOUND", format!("command {cid} not found")))
}

/// Whether the caller gets JSON logs: an `X-Daytona-SDK-Version` of 0.167.0 or later.
fn json_logs(req: &Request) -> bool {
    let Some(v) = req.headers().get("x-daytona-sdk-version").and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let nums: Vec<u64> = v
        .trim_start_matches('v')
        .split(['.', '-', '+'])
        .take(3)
        .map(|p| p.parse().unwrap_or(0))
        .collect();
    let t = (
        nums.first().copied().unwrap_or(0),
        nums.get(1).copied().unwrap_or(0),
        nums.get(2).copied().unwrap_or(0),
    );
    t >= JSON_LOGS_FROM
}

/// `process/execute`: the command given to the shell on its stdin, stdout and stderr one
/// pipe (as Go's `CombinedOutput`), 408 when `timeout` seconds pass (its process group
/// killed).
async fn execute(sbx: &Sbx, b: Arc<dyn Sandbox>, v: Value) -> DResult {
    let command = v["command"]
        .as_str()
        .or(v["code"].as_str())
        .ok_or_else(|| DError::daemon_bad_request("command is required"))?
        .to_string();
    let cwd = v["cwd"].as_str().filter(|c| !c.is_empty()).map(str::to_string);
    let mut env = std::collections::BTreeMap::new();
    if let Some(m) = v["envs"].as_object() {
        for (k, val) in m {
            let val = val
                .as_str()
                .ok_or_else(|| DError::daemon_bad_request(format!("envs.{k} must be a string")))?;
            env.insert(k.clone(), val.to_string());
        }
    }
    let timeout = match &v["timeout"] {
        Value::Null => None,
        t => match t.as_u64() {
            Some(0) => None,
            Some(n) => Some(Duration::from_secs(n)),
            None => {
                return Err(DError::daemon_bad_request(
                    "timeout must be a non-negative integer of seconds",
                ));
            }
        },
    };
    let opts = ExecOptions {
        cwd,
        env,
        ..Default::default()
    };
    let shell = shell_of(&sbx.root).to_string();
    let mut p = b
        .exec(&[shell], &opts, &agentbox_core::Ctx::background())
        .await
        .map_err(|e| {
            DError::daemon(
                400,
                "BAD_REQUEST",
                format!("the command could not start: {}", e.message()),
            )
        })?;
    let mut stdin = p.stdin.take();
    let readers: Vec<agentbox_core::ByteReader> = [p.stdout.take(), p.stderr.take()].into_iter().flatten().collect();
    let killer = p.killer();
    let run = async {
        if let Some(w) = stdin.as_mut() {
            let script = format!("exec 2>&1\n{command}\n");
            let _ = w.write_all(script.as_bytes()).await;
            let _ = w.close().await;
        }
        // Both pipes into one buffer as their bytes come (stderr is stdout's after the
        // script's first line, as one pipe is in the daemon).
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
        for mut r in readers {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut chunk = vec![0u8; 32 * 1024];
                loop {
                    match r.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if tx.send(chunk[..n].to_vec()).await.is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        }
        drop(tx);
        let mut buf = Vec::new();
        while let Some(b) = rx.recv().await {
            let room = MAX_OUTPUT.saturating_sub(buf.len());
            buf.extend_from_slice(&b[..b.len().min(room)]);
        }
        let code = p.wait().await.map(|s| s.code).unwrap_or(-1);
        (code, buf)
    };
    let (code, buf) = match timeout {
        None => run.await,
        Some(t) => match tokio::time::timeout(t, run).await {
            Ok(r) => r,
            Err(_) => {
                let _ = killer.signal(9).await;
                return Err(DError::daemon(
                    408,
                    "PROCESS_EXECUTION_TIMEOUT",
                    format!("command execution timeout after {} seconds", t.as_secs()),
                ));
            }
        },
    };
    ok(json!({"exitCode": code, "result": lossy(&buf)}))
}

/// `logs?follow=true`: a WebSocket carrying the log's bytes as binary frames, closed with
/// 1000 once the command has an exit code and everything was sent (`log_reader.go`).
fn follow(cmd: Arc<crate::daytona::session::Cmd>, req: Request) -> DResult {
    let (resp, on) = crate::daytona::upgrade(req)?;
    tokio::spawn(async move {
        let Ok(Ok(up)) = tokio::time::timeout(Duration::from_secs(10), on).await else {
            return;
        };
        let mut ws =
            tokio_tungstenite::WebSocketStream::from_raw_socket(hyper_util::rt::TokioIo::new(up), Role::Server, None)
                .await;
        let mut sent = 0usize;
        let mut changed = cmd.changed.subscribe();
        loop {
            let (more, ended) = cmd.output_from(sent);
            if !more.is_empty() {
                sent += more.len();
                if ws.send(Message::binary(more)).await.is_err() {
                    return;
                }
            }
            if ended {
                let _ = ws
                    .send(Message::Close(Some(CloseFrame {
                        code: CloseCode::Normal,
                        reason: "".into(),
                    })))
                    .await;
                let _ = tokio::time::timeout(Duration::from_secs(2), ws.close(None)).await;
                return;
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), changed.changed()).await;
        }
    });
    Ok(resp)
}

/// `files/bulk-upload`: multipart `files[i].path` and `files[i].file`, each file written
/// through the box (parents made).
async fn upload(b: &Arc<dyn Sandbox>, req: Request) -> DResult {
    let mut mp = Multipart::from_request(req, &())
        .await
        .map_err(|e| DError::daemon(400, "BAD_REQUEST", format!("a multipart body is required: {e}")))?;
    let mut paths: std::collections::BTreeMap<usize, String> = Default::default();
    let mut files: std::collections::BTreeMap<usize, Bytes> = Default::default();
    loop {
        let field = match mp.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                let st = e.status();
                return Err(DError::daemon(
                    st.as_u16(),
                    if st == StatusCode::PAYLOAD_TOO_LARGE {
                        "BAD_REQUEST"
                    } else {
                        "INVALID_REQUEST_BODY"
                    },
                    format!("reading the upload (at most {} MiB): {e}", MAX_UPLOAD >> 20),
                ));
            }
        };
        let name = field.name().unwrap_or("").to_string();
        let Some((idx, kind)) = upload_field(&name) else {
            continue;
        };
        let data = field.bytes().await.map_err(|e| {
            DError::daemon(
                e.status().as_u16(),
                "INVALID_REQUEST_BODY",
                format!("reading {name} (at most {} MiB in all): {e}", MAX_UPLOAD >> 20),
            )
        })?;
        if kind == "path" {
            paths.insert(idx, String::from_utf8_lossy(&data).into_owned());
        } else {
            files.insert(idx, data);
        }
    }
    let mut done = Vec::new();
    let mut errors = Vec::new();
    for (idx, data) in files {
        let Some(path) = paths.get(&idx) else {
            errors.push(format!("files[{idx}]: no files[{idx}].path"));
            continue;
        };
        match b.upload(path, &data, &ctx()).await {
            Ok(()) => done.push(json!({"path": path, "bytes": data.len()})),
            Err(e) => errors.push(format!("{path}: {}", e.message())),
        }
    }
    if !errors.is_empty() {
        return Ok(json_response(
            StatusCode::BAD_REQUEST,
            &json!({"errors": errors, "files": done}),
        ));
    }
    ok(json!({"files": done}))
}

/// `files[3].path` → (3, "path").
fn upload_field(name: &str) -> Option<(usize, &str)> {
    let rest = name.strip_prefix("files[")?;
    let (idx, kind) = rest.split_once("].")?;
    let idx = idx.parse().ok()?;
    matches!(kind, "path" | "file").then_some((idx, kind))
}

/// A failed file read as the daemon's ErrorResponse.
fn file_error(path: &str, e: &agentbox_core::Error) -> DError {
    let (status, code) = match e.code() {
        ErrorCode::NotFound => (404, "FILE_NOT_FOUND"),
        ErrorCode::PermissionDenied => (403, "FILE_ACCESS_DENIED"),
        ErrorCode::Invalid => (400, "INVALID_FILE_PATH"),
        _ => (500, "FILE_READ_FAILED"),
    };
    let what = match code {
        "FILE_NOT_FOUND" => "file not found".to_string(),
        _ => e.message().to_string(),
    };
    DError::daemon(status, code, format!("{path}: {what}"))
}

/// `files/bulk-download`: one multipart part per path, `file` or `error` (JSON), the closing
/// boundary last.
async fn download_many(b: &Arc<dyn Sandbox>, v: Value) -> DResult {
    let paths: Vec<String> = v["paths"]
        .as_array()
        .ok_or_else(|| DError::daemon_bad_request("paths is required"))?
        .iter()
        .map(|p| {
            p.as_str()
                .map(str::to_string)
                .ok_or_else(|| DError::daemon_bad_request("paths must be strings"))
        })
        .collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for path in &paths {
        let disp = |name: &str| {
            format!(
                "Content-Disposition: form-data; name=\"{name}\"; filename=\"{}\"; filename*=utf-8''{}\r\n",
                path.replace('\\', "\\\\").replace('"', "\\\""),
                pct(path)
            )
        };
        out.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
        match b.download(path, MAX_DOWNLOAD, &ctx()).await {
            Ok(data) => {
                out.extend_from_slice(disp("file").as_bytes());
                out.extend_from_slice(b"Content-Type: application/octet-stream\r\n\r\n");
                out.extend_from_slice(&data);
            }
            Err(e) => {
                let err = file_error(path, &e).body("POST", "/files/bulk-download");
                out.extend_from_slice(disp("error").as_bytes());
                out.extend_from_slice(b"Content-Type: application/json\r\n\r\n");
                out.extend_from_slice(err.to_string().as_bytes());
            }
        }
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    let mut r = Response::new(Body::from(out));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(&format!("multipart/form-data; boundary={BOUNDARY}"))
            .map_err(|e| DError::internal(e.to_string(), crate::daytona::error::Source::Daemon))?,
    );
    Ok(r)
}

/// RFC 5987's encoding of a filename* value.
fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `files/info`: the daemon's FileInfo.
async fn info(b: &Arc<dyn Sandbox>, path: &str) -> DResult {
    let Some(files) = b.files() else {
        return Err(DError::internal(
            "this box serves no file operations",
            crate::daytona::error::Source::Daemon,
        ));
    };
    let meta = files.stat(path, true, &ctx()).await.map_err(|e| match e {
        agentbox_core::FileError::Os(2) => DError::daemon(404, "FILE_NOT_FOUND", format!("{path}: file not found")),
        agentbox_core::FileError::Os(13) => {
            DError::daemon(403, "FILE_ACCESS_DENIED", format!("{path}: permission denied"))
        }
        other => DError::daemon(500, "FILE_READ_FAILED", format!("{path}: {other}")),
    })?;
    let is_dir = matches!(meta.kind, agentbox_core::FileType::Dir);
    let t = std::time::UNIX_EPOCH + Duration::from_millis(meta.mtime_ms.max(0) as u64);
    let perm = meta.mode & 0o7777;
    ok(json!({
        "name": meta.name,
        "path": path,
        "isDir": is_dir,
        "size": meta.size,
        "mode": mode_string(is_dir, perm),
        "permissions": format!("{perm:04o}"),
        "owner": "daytona",
        "group": "daytona",
        "modTime": crate::daytona::state::rfc3339(t),
        "modifiedAt": crate::daytona::state::rfc3339(t),
    }))
}

/// Go's `FileMode.String()`: `drwxr-xr-x`, `-rw-r--r--`.
fn mode_string(dir: bool, perm: u32) -> String {
    let mut s = String::from(if dir { "d" } else { "-" });
    for shift in [6, 3, 0] {
        let p = (perm >> shift) & 7;
        s.push(if p & 4 != 0 { 'r' } else { '-' });
        s.push(if p & 2 != 0 { 'w' } else { '-' });
        s.push(if p & 1 != 0 { 'x' } else { '-' });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upload_fields_and_modes_read_as_the_daemon_does() {
        assert_eq!(upload_field("files[12].path"), Some((12, "path")));
        assert_eq!(upload_field("files[0].file"), Some((0, "file")));
        assert_eq!(upload_field("files[x].file"), None);
        assert_eq!(upload_field("other"), None);
        assert_eq!(mode_string(true, 0o755), "drwxr-xr-x");
        assert_eq!(mode_string(false, 0o644), "-rw-r--r--");
        assert_eq!(pct("/tmp/a b\"é"), "%2Ftmp%2Fa%20b%22%C3%A9");
    }
}

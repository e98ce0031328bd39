//! Processes that outlive the request that started them, kept by the box's runner: start one
//! detached, list them, read its output from a byte cursor (`after=N`: a reader that comes back
//! later, or another client, goes on where it left off; bytes the box no longer kept are said
//! as a gap), write its stdin, signal it, wait for it, forget it. A box without a runner has no
//! processes of its own and answers `unsupported`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentbox_core::{
    Ctx, ErrorCode, ExecOptions, MAX_READ, MAX_READ_WAIT, ProcessInfo, ProcessState, Processes, Sandbox, Stream,
};
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use base64::Engine;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::boxes::{BoxPath, CALL_DEADLINE, reach};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;

/// A program to start detached.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartProcess {
    /// The program and its arguments. Give this or `command`.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// A shell command, run by `sh -c`. Give this or `argv`.
    #[serde(default)]
    pub command: Option<String>,
    /// Variables for it alone, over the box's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Its working directory; relative paths are taken from the box's workspace.
    #[serde(default)]
    pub cwd: Option<String>,
    /// The box ends it this many ms after it started, with no call from anyone.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Run it in a terminal of this size (its output is then one stream, `stdout`).
    #[serde(default)]
    pub tty: Option<TerminalSize>,
    /// A secret this service offers (`agentbox serve --secret`), by name, handed to the
    /// process alone on a pipe it inherits as descriptor 3 (named in its `AGENTBOX_SECRET_FD`).
    #[serde(default)]
    pub secret_fd: Option<String>,
}

/// A terminal's size.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TerminalSize {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
    /// `TERM` for the program (default `xterm-256color`).
    #[serde(default)]
    pub term: Option<String>,
}

/// A process started.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct Started {
    /// Its handle in the box: the path of every later call on it.
    pub handle: u64,
}

/// The path of one process.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
pub struct ProcessPath {
    /// The box's id.
    pub id: String,
    /// The process's handle.
    pub handle: u64,
}

/// Where to read from, and how long to wait for output.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadOutput {
    /// The number of the first byte wanted: 0, or the `next` of the last read.
    #[serde(default)]
    pub after: u64,
    /// How long to wait for some output when none is there yet (default 0, at most 300000).
    #[serde(default)]
    pub wait_ms: u64,
    /// The most bytes answered (default and most 8 MiB).
    #[serde(default)]
    pub max_bytes: Option<usize>,
}

/// Bytes of one stream.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct Chunk {
    /// The number of its first byte in the process's output.
    pub seq: u64,
    /// `stdout` or `stderr`.
    pub stream: Stream,
    /// The bytes as text (invalid UTF-8 replaced: use `data` for the bytes themselves).
    pub text: String,
    /// The bytes, base64.
    pub data: String,
}

/// What one read got.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct Output {
    /// The output from `after` on, in order.
    pub chunks: Vec<Chunk>,
    /// Set when bytes from `after` on were no longer kept: the number the output goes on from
    /// (bytes `after..gap_from` are lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gap_from: Option<u64>,
    /// The `after` of the next read.
    pub next: u64,
    /// How it ended, once it ended and all its output was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ProcessState>,
}

/// Bytes for a process's stdin.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteStdin {
    /// Text to write.
    #[serde(default)]
    pub data: String,
    /// End its stdin after.
    #[serde(default)]
    pub close: bool,
}

/// A signal to send.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendSignal {
    /// Its number (15) or name (`TERM`, `SIGKILL`, `INT`...).
    pub signal: serde_json::Value,
}

/// How long to wait for the end.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitFor {
    /// At most this many ms (default 60000, at most 3600000); past it, `timeout`.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

pub(crate) fn processes(b: &dyn Sandbox) -> Result<&dyn Processes, ApiError> {
    b.processes().ok_or_else(|| {
        ApiError::new(
            ErrorCode::Unsupported,
            format!(
                "box {}: it keeps no processes (it has no runner): run a program to its end with exec",
                b.id()
            ),
        )
    })
}

fn ctx() -> Ctx {
    Ctx::background().with_timeout(CALL_DEADLINE)
}

/// `POST /v1/boxes/{id}/processes`.
pub(crate) async fn start(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
    Json(body): Json<StartProcess>,
) -> Result<(StatusCode, Json<Started>), ApiError> {
    let argv = super::exec::argv_of(body.argv, body.command)?;
    let b = reach(&state, &key, &p.id).await?;
    processes(b.as_ref())?;
    let opts = ExecOptions {
        cwd: body.cwd,
        env: body.env,
        detach: true,
        timeout: body.timeout_ms.map(Duration::from_millis),
        tty: body.tty.map(|t| agentbox_core::Tty {
            rows: t.rows,
            cols: t.cols,
            term: t.term,
        }),
        secret_fd: body
            .secret_fd
            .as_deref()
            .map(|n| super::boxes::offered_fd(&state.secrets, n))
            .transpose()?,
    };
    opts.validate(&argv)?;
    let process = b.exec(&argv, &opts, &ctx()).await?;
    let handle = process.handle().ok_or_else(|| {
        ApiError::new(
            ErrorCode::Unknown,
            format!("box {}: a detached process came back with no handle", b.id()),
        )
    })?;
    tracing::info!(box_id = %b.id(), handle, key = %key.name, "process started");
    Ok((StatusCode::CREATED, Json(Started { handle })))
}

/// `GET /v1/boxes/{id}/processes`.
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
) -> Result<Json<Vec<ProcessInfo>>, ApiError> {
    let b = reach(&state, &key, &p.id).await?;
    Ok(Json(processes(b.as_ref())?.list(&ctx()).await?))
}

/// `GET /v1/boxes/{id}/processes/{handle}/output`.
pub(crate) async fn output(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<ProcessPath>,
    Query(q): Query<ReadOutput>,
) -> Result<Json<Output>, ApiError> {
    let wait = Duration::from_millis(q.wait_ms);
    if wait > MAX_READ_WAIT {
        return Err(ApiError::new(
            ErrorCode::Invalid,
            format!("wait_ms: {} is more than {}", q.wait_ms, MAX_READ_WAIT.as_millis()),
        ));
    }
    let max = q.max_bytes.unwrap_or(MAX_READ);
    if max == 0 || max > MAX_READ {
        return Err(ApiError::new(
            ErrorCode::Invalid,
            format!("max_bytes: {max} is not between 1 and {MAX_READ}"),
        ));
    }
    let b = reach(&state, &key, &p.id).await?;
    let ctx = Ctx::background().with_timeout(wait + CALL_DEADLINE);
    let read = processes(b.as_ref())?.read(p.handle, q.after, wait, max, &ctx).await?;
    let b64 = base64::engine::general_purpose::STANDARD;
    Ok(Json(Output {
        chunks: read
            .chunks
            .into_iter()
            .map(|c| Chunk {
                seq: c.seq,
                stream: c.stream,
                text: String::from_utf8_lossy(&c.bytes).into_owned(),
                data: b64.encode(&c.bytes),
            })
            .collect(),
        gap_from: read.gap_from,
        next: read.next,
        exit: read.exit,
    }))
}

/// `POST /v1/boxes/{id}/processes/{handle}/stdin`.
pub(crate) async fn stdin(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<ProcessPath>,
    Json(body): Json<WriteStdin>,
) -> Result<StatusCode, ApiError> {
    let b = reach(&state, &key, &p.id).await?;
    processes(b.as_ref())?
        .write(p.handle, body.data.as_bytes(), body.close, &ctx())
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The number of a signal named by number or name.
pub(crate) fn signal_of(v: &serde_json::Value) -> Result<i32, ApiError> {
    let bad = || {
        ApiError::new(
            ErrorCode::Invalid,
            format!("signal: {v} is not a signal (a number, or a name: TERM, KILL, INT, HUP...)"),
        )
    };
    if let Some(n) = v.as_i64() {
        return i32::try_from(n).ok().filter(|n| (1..=64).contains(n)).ok_or_else(bad);
    }
    let name = v.as_str().ok_or_else(bad)?.to_ascii_uppercase();
    let name = name.strip_prefix("SIG").unwrap_or(&name);
    agentbox_core::SIGNALS
        .iter()
        .find(|(n, _)| n.strip_prefix("SIG").unwrap_or(n) == name)
        .map(|(_, number)| *number)
        .ok_or_else(bad)
}

/// `POST /v1/boxes/{id}/processes/{handle}/signal`.
pub(crate) async fn signal(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<ProcessPath>,
    Json(body): Json<SendSignal>,
) -> Result<StatusCode, ApiError> {
    let number = signal_of(&body.signal)?;
    let b = reach(&state, &key, &p.id).await?;
    processes(b.as_ref())?.signal(p.handle, number, &ctx()).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/boxes/{id}/processes/{handle}/resize`.
pub(crate) async fn resize(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<ProcessPath>,
    Json(body): Json<TerminalSize>,
) -> Result<StatusCode, ApiError> {
    if body.term.is_some() {
        return Err(ApiError::new(
            ErrorCode::Invalid,
            "term: a terminal's name is set when it starts, not by a resize",
        ));
    }
    let b = reach(&state, &key, &p.id).await?;
    processes(b.as_ref())?
        .resize(p.handle, body.rows, body.cols, &ctx())
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/boxes/{id}/processes/{handle}/wait`: how it ended (its output read and dropped
/// along the way; read it first with `output` if it matters).
pub(crate) async fn wait(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<ProcessPath>,
    body: Option<Json<WaitFor>>,
) -> Result<Json<ProcessState>, ApiError> {
    let body = body.map(|Json(b)| b).unwrap_or_default();
    let limit = Duration::from_millis(body.timeout_ms.unwrap_or(60_000));
    if limit > Duration::from_secs(3600) {
        return Err(ApiError::new(ErrorCode::Invalid, "timeout_ms: at most 3600000"));
    }
    let b = reach(&state, &key, &p.id).await?;
    let procs = processes(b.as_ref())?;
    let until = Instant::now() + limit;
    let mut after = 0;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ApiError::new(
                ErrorCode::Timeout,
                format!("process {}: still running after {} ms", p.handle, limit.as_millis()),
            ));
        }
        let wait = left.min(Duration::from_secs(10));
        let ctx = Ctx::background().with_timeout(wait + CALL_DEADLINE);
        let read = procs.read(p.handle, after, wait, MAX_READ, &ctx).await?;
        if let Some(exit) = read.exit {
            return Ok(Json(exit));
        }
        after = read.next;
    }
}

/// `DELETE /v1/boxes/{id}/processes/{handle}`: the box forgets it (once it ended).
pub(crate) async fn forget(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<ProcessPath>,
) -> Result<StatusCode, ApiError> {
    let b = reach(&state, &key, &p.id).await?;
    processes(b.as_ref())?.forget(p.handle, &ctx()).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn signals_by_number_or_name() {
        assert_eq!(super::signal_of(&json!(15)).unwrap(), 15);
        assert_eq!(super::signal_of(&json!("TERM")).unwrap(), 15);
        assert_eq!(super::signal_of(&json!("sigkill")).unwrap(), 9);
        for bad in [json!(0), json!(99), json!("NOPE"), json!(null), json!(1.5)] {
            assert!(super::signal_of(&bad).is_err(), "{bad}");
        }
    }
}

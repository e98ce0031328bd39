//! `POST /v1/boxes/{id}/exec`: one program run to its end in one request: an argv or a shell
//! command, stdin, variables, a working directory and a timeout; stdout and stderr kept up to a
//! bound each, and what was cut said.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, ErrorCode, ExecOptions, FinishOptions, SIGKILL, finish_cut};
use axum::Json;
use axum::extract::{Path, State};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::boxes::{BoxPath, reach};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;

/// Output kept of each stream when a request names no bound.
pub const DEFAULT_MAX_OUTPUT: usize = 1 << 20;
/// The largest bound a request may name.
pub const MAX_OUTPUT: usize = 16 << 20;
/// The longest a program may run when a request names no timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// A program to run.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// The program and its arguments, run directly. Give this or `command`.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// A shell command, run by `sh -c`. Give this or `argv`.
    #[serde(default)]
    pub command: Option<String>,
    /// Text written to its stdin, which is then closed.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Variables for this program alone, over the box's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Its working directory; relative paths are taken from the box's workspace.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Milliseconds before it is killed and the request answers `timeout` (default 600000).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Bytes kept of stdout, and as many of stderr (default 1 MiB, at most 16 MiB); the rest
    /// is read, counted and dropped.
    #[serde(default)]
    pub max_output: Option<usize>,
    /// A secret this service offers (`agentbox serve --secret`), by name, handed to the
    /// program alone on a pipe it inherits as descriptor 3 (named in its
    /// `AGENTBOX_SECRET_FD`): never in its argv, environment or a file.
    #[serde(default)]
    pub secret_fd: Option<String>,
}

/// How a program ended and what it printed.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ExecResult {
    /// Its exit code; 128 + the signal for a program a signal ended.
    pub exit_code: i32,
    /// The signal that ended it, where the box knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Its stdout (invalid UTF-8 replaced), up to the bound.
    pub stdout: String,
    /// Its stderr (invalid UTF-8 replaced), up to the bound.
    pub stderr: String,
    /// Bytes of stdout past the bound, dropped.
    pub stdout_dropped: u64,
    /// Bytes of stderr past the bound, dropped.
    pub stderr_dropped: u64,
}

/// The program a request names: its `argv`, or its `command` run by `sh -c`; one of them.
pub(crate) fn argv_of(argv: Option<Vec<String>>, command: Option<String>) -> Result<Vec<String>, ApiError> {
    match (argv, command) {
        (Some(argv), None) => Ok(argv),
        (None, Some(command)) => Ok(vec!["sh".into(), "-c".into(), command]),
        (Some(_), Some(_)) => Err(ApiError::new(ErrorCode::Invalid, "argv, command: give one, not both")),
        (None, None) => Err(ApiError::new(ErrorCode::Invalid, "argv, command: give one")),
    }
}

/// `POST /v1/boxes/{id}/exec`.
pub(crate) async fn exec(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
    Json(body): Json<ExecRequest>,
) -> Result<Json<ExecResult>, ApiError> {
    let argv = argv_of(body.argv, body.command)?;
    let max_output = body.max_output.unwrap_or(DEFAULT_MAX_OUTPUT);
    if max_output > MAX_OUTPUT {
        return Err(ApiError::new(
            ErrorCode::Invalid,
            format!("max_output: {max_output} is more than {MAX_OUTPUT}"),
        ));
    }
    let timeout = match body.timeout_ms {
        Some(0) => return Err(ApiError::new(ErrorCode::Invalid, "timeout_ms: must be positive")),
        Some(ms) => Duration::from_millis(ms),
        None => DEFAULT_TIMEOUT,
    };
    let b = reach(&state, &key, &p.id).await?;
    let opts = ExecOptions {
        cwd: body.cwd,
        env: body.env,
        secret_fd: body
            .secret_fd
            .as_deref()
            .map(|n| super::boxes::offered_fd(&state.secrets, n))
            .transpose()?,
        ..Default::default()
    };
    opts.validate(&argv)?;
    // The exec's context governs the program: it lives as long as its timeout, and a little.
    let ctx = Ctx::background().with_timeout(timeout + super::boxes::CALL_DEADLINE);
    let process = b.exec(&argv, &opts, &ctx).await?;
    let killer = process.killer();
    let finish = finish_cut(
        process,
        FinishOptions {
            stdin: body.stdin.unwrap_or_default().into_bytes(),
            max_output,
        },
    );
    let (done, cut) = match tokio::time::timeout(timeout, finish).await {
        Ok(r) => r?,
        Err(_) => {
            let _ = killer.signal(SIGKILL).await;
            return Err(ApiError::new(
                ErrorCode::Timeout,
                format!(
                    "exec: the program ran past its {} ms and was killed",
                    timeout.as_millis()
                ),
            ));
        }
    };
    Ok(Json(ExecResult {
        exit_code: done.status.code,
        signal: done.status.signal,
        stdout: done.stdout_text(),
        stderr: done.stderr_text(),
        stdout_dropped: cut.stdout_dropped,
        stderr_dropped: cut.stderr_dropped,
    }))
}

//! `bash {command, timeout?, background?}`: stdout and stderr merged, the tail kept, the
//! whole output in a file of the environment when it is cut. With `background: true` the
//! command is started in a box that keeps processes and the call answers at once with its
//! handle, for the `process_*` tools. pi's own bash, without `background`, is [`PiBash`]:
//! what a client that asked for pi's seven tools alone is given.

use std::sync::{Arc, Mutex};

use agentbox_core::Ctx;
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::args::Seconds;
use super::truncate::{MAX_BYTES, MAX_LINES, tail};
use super::{ToolError, ToolResult, Typed};
use crate::{Command, ExecCode, ExecOptions, ExecutionEnv, Spill, StartOptions};

/// What a command is run behind: stderr is stdout for the whole command, so its output is
/// one stream in the order written.
pub(super) const MERGE: &str = "exec 2>&1\n";

/// pi's description of bash.
const PI_DESCRIPTION: &str = "Execute a bash command in the current working directory. Returns stdout and stderr. Output is truncated to the last 2000 lines or 50KB (whichever is hit first). If truncated, full output is saved to a temp file. Optionally provide a timeout in seconds.";

/// bash with `background`.
pub(super) struct Bash;

/// pi's bash: no `background`.
pub(super) struct PiBash;

/// `bash`'s arguments.
#[derive(Deserialize, JsonSchema)]
pub(super) struct BashArgs {
    /// Bash command to execute
    command: String,
    /// Timeout in seconds (optional, no default timeout)
    timeout: Option<Seconds>,
    /// Run it in the background: return at once with a handle for process_read, process_write and process_kill (default: false)
    background: Option<bool>,
}

/// pi's `bash` arguments.
#[derive(Deserialize, JsonSchema)]
pub(super) struct PiBashArgs {
    /// Bash command to execute
    command: String,
    /// Timeout in seconds (optional, no default timeout)
    timeout: Option<Seconds>,
}

#[async_trait]
impl Typed for Bash {
    type Args = BashArgs;
    const NAME: &'static str = "bash";
    const DESCRIPTION: &'static str = "Execute a bash command in the current working directory. Returns stdout and stderr. Output is truncated to the last 2000 lines or 50KB (whichever is hit first). If truncated, full output is saved to a temp file. Optionally provide a timeout in seconds. With background: true, the command starts and the call returns at once with a handle: read its output with process_read, write its stdin with process_write, stop it with process_kill (the timeout, if given, still ends it).";
    const READ_ONLY: bool = false;

    async fn call(&self, env: &dyn ExecutionEnv, args: BashArgs, ctx: &Ctx) -> Result<ToolResult, ToolError> {
        let timeout = args.timeout.map(|s| s.0);
        if args.background == Some(true) {
            return background(env, args.command, timeout, ctx).await;
        }
        foreground(env, args.command, timeout, ctx).await
    }
}

#[async_trait]
impl Typed for PiBash {
    type Args = PiBashArgs;
    const NAME: &'static str = "bash";
    const DESCRIPTION: &'static str = PI_DESCRIPTION;
    const READ_ONLY: bool = false;

    async fn call(&self, env: &dyn ExecutionEnv, args: PiBashArgs, ctx: &Ctx) -> Result<ToolResult, ToolError> {
        foreground(env, args.command, args.timeout.map(|s| s.0), ctx).await
    }
}

/// Start `command` in the background and answer its handle at once.
async fn background(
    env: &dyn ExecutionEnv,
    command: String,
    timeout: Option<f64>,
    ctx: &Ctx,
) -> Result<ToolResult, ToolError> {
    let opts = StartOptions {
        timeout,
        ..Default::default()
    };
    let handle = env
        .start(Command::Shell(format!("{MERGE}{command}")), opts, ctx)
        .await
        .map_err(|e| match e.code {
            ExecCode::Aborted => ToolError("Command aborted".into()),
            _ if e.message.starts_with("Working directory does not exist") => ToolError(e.message),
            _ => ToolError(format!("Could not start the command in the background: {}", e.message)),
        })?;
    let ends = timeout
        .map(|t| format!(" It is ended after {} seconds.", fmt_secs(t)))
        .unwrap_or_default();
    Ok(ToolResult::ok(
        format!(
            "Started in the background as process {handle}.{ends} Read its output with process_read {{\"handle\": {handle}}}; write its stdin with process_write, stop it with process_kill."
        ),
        json!({ "handle": handle }),
    ))
}

/// Run `command` and answer its output once it ended: pi's bash.
async fn foreground(
    env: &dyn ExecutionEnv,
    command: String,
    timeout: Option<f64>,
    ctx: &Ctx,
) -> Result<ToolResult, ToolError> {
    let merged = Arc::new(Mutex::new(String::new()));
    let sink = merged.clone();
    let opts = ExecOptions {
        timeout,
        on_output: Some(Arc::new(move |t: &str, _| {
            sink.lock().unwrap().push_str(t);
            Ok(())
        })),
        spill: Some(Spill {
            after_bytes: Some(MAX_BYTES as u64),
            after_lines: Some(MAX_LINES as u64),
        }),
        ..Default::default()
    };
    // One stream, in the order written: stderr is stdout for the whole command.
    let result = env.exec(Command::Shell(format!("{MERGE}{command}")), opts, ctx).await;
    let text = merged.lock().unwrap().clone();
    let t = tail(&text, MAX_LINES, MAX_BYTES);
    let mut output = if t.content.is_empty() {
        String::new()
    } else {
        t.content.clone()
    };
    let spill = result.as_ref().ok().and_then(|r| r.spill_path.clone());
    if t.truncated {
        let start = t.total_lines - t.output_lines + 1;
        let full = spill
            .as_deref()
            .map(|f| format!(" Full output: {f}"))
            .unwrap_or_default();
        output.push_str(&format!(
            "\n\n[Showing lines {start}-{} of {}.{full}]",
            t.total_lines, t.total_lines
        ));
    }
    let details = json!({ "fullOutputPath": spill, "truncation": if t.truncated { serde_json::to_value(&t).unwrap_or(Value::Null) } else { Value::Null } });
    let with = |tail_msg: String| {
        if output.is_empty() {
            tail_msg
        } else {
            format!("{output}\n\n{tail_msg}")
        }
    };
    match result {
        Ok(r) if r.exit_code == 0 => Ok(ToolResult::ok(
            if output.is_empty() {
                "(no output)".into()
            } else {
                output.clone()
            },
            details,
        )),
        Ok(r) => Err(ToolError(with(format!("Command exited with code {}", r.exit_code)))),
        Err(e) => Err(ToolError(match e.code {
            ExecCode::Timeout => with(format!(
                "Command timed out after {} seconds",
                timeout.map(fmt_secs).unwrap_or_default()
            )),
            ExecCode::Aborted => with("Command aborted".into()),
            _ if e.message.starts_with("Working directory does not exist") => e.message,
            _ => with(e.message),
        })),
    }
}

fn fmt_secs(t: f64) -> String {
    if t.fract() == 0.0 {
        format!("{}", t as u64)
    } else {
        format!("{t}")
    }
}

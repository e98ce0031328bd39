//! The command side of an environment: a command, its options, how it ended, and its errors
//! and their codes.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// What went wrong with running a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecCode {
    /// The caller cancelled.
    Aborted,
    /// The command's timeout passed.
    Timeout,
    /// No shell to run a command string.
    ShellUnavailable,
    /// The program could not be started (an empty argv, a box that is gone).
    SpawnError,
    /// The output callback failed.
    CallbackError,
    /// Anything else.
    Unknown,
}

/// A failed command.
#[derive(Clone, Debug)]
pub struct ExecError {
    /// The code.
    pub code: ExecCode,
    /// What failed and why.
    pub message: String,
    /// The kill of a stopped command was not confirmed: it may still run. Where the
    /// environment can reach it, it still tracks it so `cleanup` ends it; on a box without live
    /// processes nothing reaches a running command, and the message says until when it runs.
    pub kill_unconfirmed: bool,
    /// The provider's error underneath, when a box failed.
    pub cause: Option<agentbox_core::Error>,
}

impl ExecError {
    /// An error with a code and a message.
    pub fn new(code: ExecCode, message: impl Into<String>) -> Self {
        ExecError {
            code,
            message: message.into(),
            kill_unconfirmed: false,
            cause: None,
        }
    }
}

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The provider's error underneath, where a box failed, is the source: a host that logs the
/// chain sees both the hands' message and the box's.
impl std::error::Error for ExecError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause.as_ref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// A command: a string through the shell, or an argv run directly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Run by bash where the environment has it, else sh.
    Shell(String),
    /// argv[0] run directly.
    Argv(Vec<String>),
}

/// Which stream a piece of output came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// stdout.
    Stdout,
    /// stderr.
    Stderr,
}

/// Called with output as it arrives. An `Err` stops the command (`callback_error`).
pub type OnOutput = Arc<dyn Fn(&str, Stream) -> Result<(), String> + Send + Sync>;

/// Options of [`ExecutionEnv::exec`].
#[derive(Clone, Default)]
pub struct ExecOptions {
    /// The working directory; relative to the environment's cwd.
    pub cwd: Option<String>,
    /// Variables for the command alone (PATH included).
    pub env: BTreeMap<String, String>,
    /// Whether the command inherits the environment's own variables (default true).
    pub inherit_env: Option<bool>,
    /// Seconds before the command is stopped (`timeout`).
    pub timeout: Option<f64>,
    /// Output as it arrives.
    pub on_output: Option<OnOutput>,
    /// Past this many bytes or lines of output, the whole output goes to a file.
    pub spill: Option<Spill>,
    /// Deliver `on_output` in batches: at most one call per interval, each cut to its last
    /// bytes and lines (a rolling view). Without it, every chunk is passed as it arrives.
    pub window: Option<Window>,
}

/// Options of [`ExecutionEnv::start`]: a command that outlives the call that starts it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StartOptions {
    /// The working directory; relative to the environment's cwd.
    pub cwd: Option<String>,
    /// Variables for the command alone, over the environment's own.
    pub env: BTreeMap<String, String>,
    /// Seconds after which the box ends the command, whether or not anyone is still there.
    pub timeout: Option<f64>,
}

/// How [`ExecOptions::on_output`] is batched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Each batch keeps at most its last this many bytes (on a character boundary).
    pub max_bytes: Option<usize>,
    /// Each batch keeps at most its last this many lines.
    pub max_lines: Option<usize>,
    /// At most one call per this many milliseconds.
    pub interval_ms: u64,
}

/// When output is written to a spill file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spill {
    /// After this many bytes.
    pub after_bytes: Option<u64>,
    /// After this many lines.
    pub after_lines: Option<u64>,
}

/// How a command ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecOutcome {
    /// Its exit code; 128 + the signal for a command a signal ended.
    pub exit_code: i32,
    /// The file holding the whole output, when it was spilled.
    pub spill_path: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exec_error_names_its_cause_as_its_source() {
        let mut e = ExecError::new(ExecCode::Unknown, "the box failed");
        assert!(std::error::Error::source(&e).is_none());
        e.cause = Some(agentbox_core::Error::gone("box local:x ended"));
        let source = std::error::Error::source(&e).expect("the cause is the source");
        assert_eq!(source.to_string(), "gone: box local:x ended");
    }
}

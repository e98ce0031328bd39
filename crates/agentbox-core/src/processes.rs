//! The processes a box keeps: listed, read from a byte number, written, signalled, resized and
//! attached to by any host process, not only the one that started them.
//!
//! A box offers them where something in it keeps its programs (the runner):
//! [`crate::Sandbox::processes`]. Each process has a number in its box (its handle, which
//! [`crate::Process::handle`] answers to the caller that started it); with the box's id it
//! names the process from anywhere. Every byte a process writes has a number too: its place in
//! the process's output, stdout and stderr counted together from 0. The box keeps a bounded
//! tail; a reader that asks for bytes no longer kept is told where what it gets starts.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::ctx::Ctx;
use crate::error::Result;
use crate::process::{ExitStatus, Process};

/// The most bytes one [`Processes::read`] answers.
pub const MAX_READ: usize = 8 << 20;
/// The longest one [`Processes::read`] waits for output.
pub const MAX_READ_WAIT: Duration = Duration::from_secs(300);

/// How a process stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ProcessState {
    /// It runs.
    Running,
    /// It ended.
    Exited {
        /// How.
        status: ExitStatus,
    },
    /// Its timeout ended it (the box killed it).
    TimedOut {
        /// How it ended once killed.
        status: ExitStatus,
    },
}

/// One process of a box, as [`Processes::list`] answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ProcessInfo {
    /// Its number in the box.
    pub handle: u64,
    /// Its program and arguments (a long argv is cut, marked with `…`).
    pub argv: Vec<String>,
    /// Its pid in the box.
    pub pid: u32,
    /// When it started, in ms since the epoch.
    pub started_ms: i64,
    /// Running, or how it ended.
    #[serde(flatten)]
    pub state: ProcessState,
    /// It has a terminal.
    pub tty: bool,
    /// It was started detached.
    pub detach: bool,
    /// The number of the first output byte still kept.
    pub first: u64,
    /// How many bytes it wrote in all (the number its next byte will have).
    pub end: u64,
    /// How many readers it has now.
    pub readers: u32,
}

/// Which stream a chunk of output came on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// stdout (and a terminal's output).
    Stdout,
    /// stderr.
    Stderr,
}

/// Bytes of a process's output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputChunk {
    /// The number of its first byte.
    pub seq: u64,
    /// Its stream.
    pub stream: Stream,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// What one [`Processes::read`] got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputRead {
    /// The output, in order.
    pub chunks: Vec<OutputChunk>,
    /// Set when bytes from `after` on were no longer kept: the number the output went on
    /// from (bytes `after..gap_from` are lost).
    pub gap_from: Option<u64>,
    /// The number of the byte after the last one read: the `after` of the next read.
    pub next: u64,
    /// Set once the process ended and every byte of its output was read.
    pub exit: Option<ProcessState>,
}

/// The processes a box keeps. See the [module documentation](self).
///
/// ```no_run
/// # async fn f(b: &dyn agentbox_core::Sandbox) -> agentbox_core::Result<()> {
/// use std::time::Duration;
/// use agentbox_core::{Ctx, ExecOptions};
/// let ctx = Ctx::background();
/// let argv = vec!["sh".to_string(), "-c".to_string(), "echo hi; sleep 60".to_string()];
/// let opts = ExecOptions { detach: true, ..Default::default() };
/// let handle = b.exec(&argv, &opts, &ctx).await?.handle().expect("a box that keeps processes");
/// // Later, from any host process:
/// let ps = b.processes().expect("a box that keeps processes");
/// let got = ps.read(handle, 0, Duration::from_secs(5), 1 << 20, &ctx).await?;
/// assert_eq!(got.chunks[0].bytes, b"hi\n");
/// ps.signal(handle, agentbox_core::SIGTERM, &ctx).await?;
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Processes: Send + Sync {
    /// The box's processes, in the order they started: running ones, and ended ones not yet
    /// forgotten.
    async fn list(&self, ctx: &Ctx) -> Result<Vec<ProcessInfo>>;

    /// Up to `max_bytes` of a process's output from byte `after` on, waiting up to `wait` for
    /// some to come (answering as soon as some did, or the process ended). This reader does not
    /// hold the process up: what it does not read is kept only to the box's bound.
    /// `not_found` for a handle the box does not know.
    async fn read(&self, handle: u64, after: u64, wait: Duration, max_bytes: usize, ctx: &Ctx) -> Result<OutputRead>;

    /// The process as a [`Process`] again: its output from byte `after` on (a gap surfaces as
    /// an [`crate::OutputGap`] error on the read that meets it), its stdin, its terminal, its
    /// signals and its exit. While attached, this reader holds the process up as the caller
    /// that started it does. Dropping it lets go; the process runs on.
    async fn attach(&self, handle: u64, after: u64, ctx: &Ctx) -> Result<Process>;

    /// Write `data` to a process's stdin, then end it when `close`.
    async fn write(&self, handle: u64, data: &[u8], close: bool, ctx: &Ctx) -> Result<()>;

    /// Send `signal` to a process's group.
    async fn signal(&self, handle: u64, signal: i32, ctx: &Ctx) -> Result<()>;

    /// Set the size of a process's terminal: `unsupported` for one without.
    async fn resize(&self, handle: u64, rows: u16, cols: u16, ctx: &Ctx) -> Result<()>;

    /// Let the box free what it keeps of a process (at once if it ended, else once it does).
    /// Forgetting one that is gone is no error.
    async fn forget(&self, handle: u64, ctx: &Ctx) -> Result<()>;
}

//! An agent's hands: pi's `ExecutionEnv` (read, write, edit, list, stat, rename, watch,
//! exec…) on this machine ([`HostEnv`]) and over any box ([`BoxEnv`]), with the same values
//! and error codes; and the tools a model calls over either (see [`tools`]).
//!
//! This crate knows boxes only through the `agentbox-core` contract, and nothing of the
//! transport or runs.

pub mod boxenv;
mod env;
mod exec;
mod fs;
mod host;
pub mod output;
pub mod path;
pub mod tools;
pub mod watch;

pub use boxenv::{BoxEnv, end_left_commands};
pub use env::*;
pub use exec::*;
pub use fs::*;
pub use host::{GroupHook, HostEnv};
pub use watch::{Change, ChangeKind, WatchTarget};

/// Split text into lines on `\n` (a trailing newline ends the last line, it starts none),
/// keeping at most `max` of them.
pub(crate) fn path_lines(text: &str, max: Option<usize>) -> Vec<String> {
    let mut lines: Vec<String> = text
        .split_inclusive('\n')
        .map(|l| l.strip_suffix('\n').unwrap_or(l).to_string())
        .collect();
    if let Some(m) = max {
        lines.truncate(m);
    }
    lines
}

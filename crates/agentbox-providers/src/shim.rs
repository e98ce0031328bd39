//! The `sh` shim every program of a box without an exec API of its own starts behind (Docker
//! without the runner, Kubernetes): before the program runs, it writes one header line on
//! stdout: `\0agentbox <pid>` when it is about to `exec` the program (same pid), `\0agentbox
//! nocwd` or `\0agentbox noprog` when it cannot. The provider reads and strips that line, so
//! `exec` answers `not_found` like every other provider, and a kill can reach the program by
//! pid where the API has no way to signal an exec'd process.

// Docker reads its header itself (a terminal's starts with ESC there); the parser is kube's.
#![cfg_attr(not(feature = "kube"), allow(dead_code))]

use agentbox_core::{Error, ExitStatus, Result};
use tokio::sync::{Mutex, oneshot};

/// The shim: `sh -c SHIM agentbox-exec CWD PROGRAM ARGS…` (Docker's and Modal's, whose exec
/// APIs take the environment; kube's is [`SHIM_ENV`]).
#[cfg(any(feature = "docker", feature = "modal", feature = "e2b"))]
pub(crate) const SHIM: &str = r#"d=$1; shift
cd -- "$d" 2>/dev/null || { printf '\000agentbox nocwd\n'; exit 126; }
command -v -- "$1" >/dev/null 2>&1 || { printf '\000agentbox noprog\n'; exit 127; }
printf '\000agentbox %s\n' "$$"
exec "$@""#;

/// The shim for an exec API that takes no environment: `sh -c SHIM_ENV agentbox-exec CWD N
/// K1=V1 … KN=VN PROGRAM ARGS…`, exporting the N settings first.
pub(crate) const SHIM_ENV: &str = r#"d=$1; n=$2; shift 2
while [ "$n" -gt 0 ]; do export "$1"; shift; n=$((n - 1)); done
cd -- "$d" 2>/dev/null || { printf '\000agentbox nocwd\n'; exit 126; }
command -v -- "$1" >/dev/null 2>&1 || { printf '\000agentbox noprog\n'; exit 127; }
printf '\000agentbox %s\n' "$$"
exec "$@""#;

/// The exit of a program behind the shim, which its reader task sends once and
/// `ProcessControl::wait` takes once.
pub(crate) struct ExitSlot(Mutex<Option<oneshot::Receiver<Result<ExitStatus>>>>);

impl ExitSlot {
    /// The slot a reader task's `tx` fills.
    pub(crate) fn new(rx: oneshot::Receiver<Result<ExitStatus>>) -> Self {
        ExitSlot(Mutex::new(Some(rx)))
    }

    /// The exit, once; a second wait is an error.
    pub(crate) async fn wait(&self) -> Result<ExitStatus> {
        let Some(rx) = self.0.lock().await.take() else {
            return Err(Error::unknown("wait was called twice"));
        };
        rx.await
            .unwrap_or_else(|_| Err(Error::unknown("the exec's reader ended")))
    }
}

/// The longest header the shim writes.
const MAX_HEADER: usize = 64;

/// What the shim's header said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Header {
    /// The program starts with this pid.
    Pid(u32),
    /// The working directory does not exist.
    NoCwd,
    /// The program was not found.
    NoProg,
}

/// The header at the start of `out` and the bytes after it; `None` while the line is not
/// complete; an error when what came is no header.
pub(crate) fn split_header(out: &[u8]) -> Option<Result<(Header, &[u8])>> {
    let Some(nl) = out.iter().position(|&b| b == b'\n') else {
        return (out.len() > MAX_HEADER).then(|| Err(not_a_header(out)));
    };
    let line = String::from_utf8_lossy(&out[..nl]);
    let line = line.trim_end_matches('\r');
    let h = match line.strip_prefix("\0agentbox ") {
        Some("nocwd") => Header::NoCwd,
        Some("noprog") => Header::NoProg,
        Some(p) => match p.parse() {
            Ok(pid) => Header::Pid(pid),
            Err(_) => return Some(Err(not_a_header(out))),
        },
        None => return Some(Err(not_a_header(out))),
    };
    Some(Ok((h, &out[nl + 1..])))
}

fn not_a_header(out: &[u8]) -> Error {
    Error::unknown(format!(
        "the exec did not start: {:?}",
        String::from_utf8_lossy(&out[..out.len().min(MAX_HEADER)])
    ))
}

#[cfg(any(feature = "docker", feature = "kube", feature = "modal"))]
/// The directory a program starts in: `cwd` as given where absolute, else taken from the box's
/// `workspace` (the workspace itself where none is given). The rule every exec-API box shares.
pub(crate) fn exec_cwd(workspace: &str, cwd: Option<&str>) -> String {
    match cwd {
        None => workspace.to_string(),
        Some(c) if c.starts_with('/') => c.to_string(),
        Some(c) => format!("{}/{c}", workspace.trim_end_matches('/')),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_read_whole_and_the_rest_kept() {
        assert_eq!(
            split_header(b"\0agentbox 12\nhi").unwrap().unwrap(),
            (Header::Pid(12), &b"hi"[..])
        );
        assert_eq!(split_header(b"\0agentbox nocwd\n").unwrap().unwrap().0, Header::NoCwd);
        assert_eq!(split_header(b"\0agentbox noprog\n").unwrap().unwrap().0, Header::NoProg);
        assert!(split_header(b"\0agentbox 1").is_none());
        assert!(split_header(b"sh: not found\n").unwrap().is_err());
        assert!(split_header(&[b'x'; 100]).unwrap().is_err());
    }
}

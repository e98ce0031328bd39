//! A box's files served one message per operation, where a box has something in it that
//! serves them (the runner). Hands use it when a sandbox offers it ([`crate::Sandbox::files`]),
//! and fall back to one exec per operation when not.

use async_trait::async_trait;

use crate::ctx::Ctx;
use crate::error::Error;

/// What a path is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileType {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A socket, fifo or device.
    Other,
}

/// A path's metadata, as the box's own `lstat` (or `stat`) saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileMeta {
    /// The last component of the path (an entry's name in a listing).
    pub name: String,
    /// What it is.
    pub kind: FileType,
    /// Its length in bytes.
    pub size: u64,
    /// Its permission bits.
    pub mode: u32,
    /// Its modification time, in ms since the epoch.
    pub mtime_ms: i64,
}

/// Why a file operation failed: the system call's errno in the box, or the box's own failure
/// (gone, cut off, over a bound).
#[derive(Clone, Debug)]
pub enum FileError {
    /// The call failed in the box with this errno; its message is the host's for that errno.
    Os(i32),
    /// The box or the connection to it failed.
    Box(Error),
}

impl std::fmt::Display for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileError::Os(n) => write!(f, "{}", std::io::Error::from_raw_os_error(*n)),
            FileError::Box(e) => write!(f, "{e}"),
        }
    }
}

/// A box's files, each operation one message. Relative paths are taken from the box's
/// workspace. Every operation behaves as the same system call does on the host.
///
/// ```no_run
/// # async fn f(b: &dyn agentbox_core::Sandbox) {
/// use agentbox_core::Ctx;
/// if let Some(files) = b.files() {
///     files.write("notes.txt", b"hi", false, &Ctx::background()).await.unwrap();
///     assert_eq!(files.read("notes.txt", &Ctx::background()).await.unwrap(), Some(b"hi".to_vec()));
/// }
/// # }
/// ```
#[async_trait]
pub trait Files: Send + Sync {
    /// A file's bytes, or `None` when nothing is there.
    async fn read(&self, path: &str, ctx: &Ctx) -> Result<Option<Vec<u8>>, FileError>;
    /// Write (or append to) a file, making missing parent directories.
    async fn write(&self, path: &str, data: &[u8], append: bool, ctx: &Ctx) -> Result<(), FileError>;
    /// Cut or extend an existing file to `size` bytes.
    async fn truncate(&self, path: &str, size: u64, ctx: &Ctx) -> Result<(), FileError>;
    /// What a path is; with `follow`, what a link points at.
    async fn stat(&self, path: &str, follow: bool, ctx: &Ctx) -> Result<FileMeta, FileError>;
    /// A directory's entries, unsorted.
    async fn list(&self, path: &str, ctx: &Ctx) -> Result<Vec<FileMeta>, FileError>;
    /// Make a directory (and its parents, accepting one that exists, when `recursive`).
    async fn mkdir(&self, path: &str, recursive: bool, ctx: &Ctx) -> Result<(), FileError>;
    /// Remove a path; a directory only when `recursive`; a missing one is no error when `force`.
    async fn remove(&self, path: &str, recursive: bool, force: bool, ctx: &Ctx) -> Result<(), FileError>;
    /// rename(2).
    async fn rename(&self, from: &str, to: &str, ctx: &Ctx) -> Result<(), FileError>;
}

/// `path` as a path relative to `workspace`, normalized, for a box whose file calls reach only
/// its workspace: a relative path is taken from it, an absolute one must lie within it (else
/// `unsupported`, with `why`), `..` may not climb out of it and the workspace itself is no file
/// (`invalid`).
///
/// ```
/// use agentbox_core::{ErrorCode, within_workspace};
/// assert_eq!(within_workspace("a/./b/../c", "/w", "").unwrap(), "a/c");
/// assert_eq!(within_workspace("/w/x", "/w", "").unwrap(), "x");
/// assert_eq!(within_workspace("/etc/x", "/w", "").unwrap_err().code(), ErrorCode::Unsupported);
/// assert_eq!(within_workspace("../x", "/w", "").unwrap_err().code(), ErrorCode::Invalid);
/// ```
pub fn within_workspace(path: &str, workspace: &str, why: &str) -> crate::Result<String> {
    if path.is_empty() || path.contains('\0') {
        return Err(Error::invalid(format!(
            "path {path:?}: must be a non-empty path with no NUL"
        )));
    }
    let rel = if path.starts_with('/') {
        match path.strip_prefix(workspace) {
            Some(r) if r.is_empty() || r.starts_with('/') => r,
            _ => {
                return Err(Error::unsupported(format!(
                    "path {path:?}: outside the box's workspace {workspace}{why}"
                )));
            }
        }
    } else {
        path
    };
    let mut parts: Vec<&str> = Vec::new();
    for p in rel.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(Error::invalid(format!(
                        "path {path:?}: climbs out of the box's workspace"
                    )));
                }
            }
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Err(Error::invalid(format!(
            "path {path:?}: names the workspace itself, not a file"
        )));
    }
    Ok(parts.join("/"))
}

//! The runner path: where a box has a runner ([`agentbox_core::Sandbox::files`]), a file
//! operation is one message to it, answered by the box's own system call; a failure carries
//! that call's errno, mapped as the host's [`FsError::from_io`] maps it, or the box's loss.
//!
//! [`BoxEnv::one`] is the one way every file operation goes: this path when the box has a
//! runner, else the operation's fixed script ([`super::script`]).

use std::future::Future;
use std::pin::Pin;

use agentbox_core::{Ctx, ErrorCode, FileError, FileMeta, FileType, Files};

use super::BoxEnv;
use crate::path::{absolute, base_name};
use crate::{FileInfo, FileKind, FsCode, FsError};

/// Writes up to this size go through the runner in one message; larger ones by a script.
pub(super) const FAST_WRITE: usize = 8 << 20;

/// A message to the runner in flight, as `Files` returns it.
pub(super) type Message<'a, R> = Pin<Box<dyn Future<Output = Result<R, FileError>> + Send + 'a>>;

/// One file operation about to go: its absolute path and its contexts.
pub(super) struct Op {
    /// The path, absolute (the cwd's when relative).
    pub path: String,
    /// The caller's context with the operation's own deadline: what a message waits under.
    pub ctx: Ctx,
    /// The caller's own context: whether a deadline that passed was the caller's.
    pub caller: Ctx,
}

impl BoxEnv {
    /// An operation on `path`, refused before anything moves when the path holds a NUL or the
    /// box was found lost.
    pub(super) fn op(&self, path: &str, ctx: &Ctx) -> Result<Op, FsError> {
        let path = self.p(path)?;
        if let Some(why) = self.lost() {
            return Err(FsError::new(FsCode::Unknown, path, why));
        }
        Ok(Op {
            path,
            ctx: ctx.with_timeout(self.op_timeout),
            caller: ctx.clone(),
        })
    }

    /// The path absolute, refused when it holds a NUL (no script or message could carry it).
    pub(super) fn p(&self, path: &str) -> Result<String, FsError> {
        if path.contains('\0') {
            return Err(FsError::new(FsCode::Invalid, path, "a path holds a NUL byte"));
        }
        Ok(absolute(&self.cwd, path))
    }

    /// One file operation: one message to the box's runner where it has one (`message`, its
    /// answer turned into the value by `answer`), else one exec of its fixed script (`script`,
    /// which is not started otherwise). A file over what one message carries goes by the
    /// script too.
    pub(super) async fn one<'a, R, T>(
        &'a self,
        op: &'a Op,
        message: impl FnOnce(&'a dyn Files) -> Message<'a, R>,
        answer: impl FnOnce(R) -> Result<T, FsError>,
        script: impl Future<Output = Result<T, FsError>>,
    ) -> Result<T, FsError> {
        if let Some(files) = self.sandbox.files() {
            match message(files).await {
                Ok(r) => return answer(r),
                Err(FileError::Box(e)) if e.code() == ErrorCode::TooLarge => {}
                Err(e) => return Err(self.file_error(e, &op.path, &op.caller)),
            }
        }
        script.await
    }

    /// A runner's failure as the host's own call would fail (or as the box's loss, which
    /// sticks).
    pub(super) fn file_error(&self, e: FileError, path: &str, ctx: &Ctx) -> FsError {
        match e {
            FileError::Os(n) => FsError::from_io(&std::io::Error::from_raw_os_error(n), path),
            FileError::Box(e) => self.box_error(e, path, ctx),
        }
    }
}

/// A file's bytes as the runner read them: nothing there is the host's ENOENT.
pub(super) fn found(path: &str, bytes: Option<Vec<u8>>) -> Result<Vec<u8>, FsError> {
    bytes.ok_or_else(|| FsError::from_io(&rustix::io::Errno::NOENT.into(), path))
}

/// A runner's metadata as hands' `FileInfo`, as the host's `info_of` builds it.
pub(super) fn info_of_meta(path: &str, m: &FileMeta) -> FileInfo {
    FileInfo {
        name: base_name(path),
        path: path.to_string(),
        kind: match m.kind {
            FileType::Symlink => FileKind::Symlink,
            FileType::Dir => FileKind::Directory,
            FileType::File | FileType::Other => FileKind::File,
        },
        size: m.size,
        mtime_ms: m.mtime_ms,
    }
}

/// What a reader opened through the runner found: the link itself, what it names (when it
/// was followed) and the bytes (when they were read).
pub(super) struct Opened {
    pub link: FileMeta,
    pub target: Option<FileMeta>,
    pub bytes: Option<Vec<u8>>,
}

/// A reader's messages, as the host's reader makes its calls: the link itself; unless it is
/// a link that must not be followed, what it names; then, unless that is a directory or over
/// `max`, the bytes.
pub(super) fn open_reader<'a>(files: &'a dyn Files, op: &'a Op, no_follow: bool, max: u64) -> Message<'a, Opened> {
    Box::pin(async move {
        let link = files.stat(&op.path, false, &op.ctx).await?;
        let mut opened = Opened {
            link,
            target: None,
            bytes: None,
        };
        if no_follow && opened.link.kind == FileType::Symlink {
            return Ok(opened);
        }
        let target = if opened.link.kind == FileType::Symlink {
            files.stat(&op.path, true, &op.ctx).await?
        } else {
            opened.link.clone()
        };
        if target.kind != FileType::Dir && target.size <= max {
            opened.bytes = files.read(&op.path, &op.ctx).await?;
        }
        opened.target = Some(target);
        Ok(opened)
    })
}

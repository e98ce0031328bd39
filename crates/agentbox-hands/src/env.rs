//! The `ExecutionEnv` contract: an agent's file system and shell, the same on the host and
//! in any box (pi's `ExecutionEnv`; `docs/tools.md` says where a box differs).

use std::sync::Arc;

use agentbox_core::Ctx;
use async_trait::async_trait;

use crate::exec::{Command, ExecCode, ExecError, ExecOptions, ExecOutcome, StartOptions};
use crate::fs::{BinaryReader, DirReader, FileInfo, FsError, TextLineReader};
use crate::watch::{Change, WatchTarget, Watcher};

/// An agent's file system and shell. Every call takes a context and returns a result; none
/// panics. Paths are absolute or relative to [`ExecutionEnv::cwd`].
#[async_trait]
pub trait ExecutionEnv: Send + Sync {
    /// `host` for the host, `agentbox:<provider>:<box>` for a box.
    fn id(&self) -> String;
    /// The working directory.
    fn cwd(&self) -> String;
    /// `path` made absolute against the cwd, with `.` and `..` folded.
    fn absolute_path(&self, path: &str) -> String {
        crate::path::absolute(&self.cwd(), path)
    }
    /// Join segments with `/`, folding `.` and `..`.
    fn join_path(&self, parts: &[&str]) -> String {
        crate::path::join(parts)
    }

    /// A file's text (invalid UTF-8 replaced).
    async fn read_text_file(&self, path: &str, ctx: &Ctx) -> Result<String, FsError>;
    /// The first `max_lines` lines (all without one), without their newlines.
    async fn read_text_lines(&self, path: &str, max_lines: Option<usize>, ctx: &Ctx) -> Result<Vec<String>, FsError>;
    /// A file's bytes.
    async fn read_binary_file(&self, path: &str, ctx: &Ctx) -> Result<Vec<u8>, FsError>;
    /// A line reader over the file, read whole at open (refused above the reader bound).
    async fn open_text_line_reader(&self, path: &str, ctx: &Ctx) -> Result<TextLineReader, FsError> {
        let r = self.open_binary_reader(path, false, ctx).await?;
        Ok(TextLineReader::new(
            String::from_utf8_lossy(r.read(0, usize::MAX)).into_owned(),
        ))
    }
    /// A binary reader, read whole at open; `no_follow` refuses a symbolic link (`invalid`).
    async fn open_binary_reader(&self, path: &str, no_follow: bool, ctx: &Ctx) -> Result<BinaryReader, FsError>;

    /// Write a file whole, creating its parent directories.
    async fn write_file(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<(), FsError>;
    /// Append to a file, creating it and its parents.
    async fn append_file(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<(), FsError>;
    /// Cut or extend a file to `size` bytes.
    async fn truncate_file(&self, path: &str, size: u64, ctx: &Ctx) -> Result<(), FsError>;
    /// Make a file's contents durable (fsync).
    async fn flush_file(&self, path: &str, ctx: &Ctx) -> Result<(), FsError>;
    /// Rename `src` to `dst`, replacing `dst`.
    async fn rename_file(&self, src: &str, dst: &str, ctx: &Ctx) -> Result<(), FsError>;

    /// lstat.
    async fn file_info(&self, path: &str, ctx: &Ctx) -> Result<FileInfo, FsError>;
    /// A directory's entries, sorted by name.
    async fn list_dir(&self, path: &str, ctx: &Ctx) -> Result<Vec<FileInfo>, FsError>;
    /// A batched reader over [`ExecutionEnv::list_dir`].
    async fn open_dir_reader(&self, path: &str, ctx: &Ctx) -> Result<DirReader, FsError> {
        Ok(DirReader::new(self.list_dir(path, ctx).await?))
    }
    /// The path with every link resolved.
    async fn canonical_path(&self, path: &str, ctx: &Ctx) -> Result<String, FsError>;
    /// What a symbolic link names.
    async fn read_link(&self, path: &str, ctx: &Ctx) -> Result<String, FsError>;
    /// Whether anything (a dangling link too) is at `path`.
    async fn exists(&self, path: &str, ctx: &Ctx) -> Result<bool, FsError>;
    /// Make a directory (and its parents when `recursive`).
    async fn create_dir(&self, path: &str, recursive: bool, ctx: &Ctx) -> Result<(), FsError>;
    /// Remove a file, a link or an empty directory; a whole tree with `recursive`; nothing and
    /// no error for a missing path with `force`.
    async fn remove(&self, path: &str, recursive: bool, force: bool, ctx: &Ctx) -> Result<(), FsError>;
    /// A new directory under the environment's temporary directory.
    async fn create_temp_dir(&self, prefix: &str, ctx: &Ctx) -> Result<String, FsError>;
    /// A new empty file under the environment's temporary directory.
    async fn create_temp_file(&self, prefix: &str, suffix: &str, ctx: &Ctx) -> Result<String, FsError>;
    /// Watch paths; `on_change` is called for each change seen.
    async fn watch(
        &self,
        targets: Vec<WatchTarget>,
        on_change: Arc<dyn Fn(Change) + Send + Sync>,
        ctx: &Ctx,
    ) -> Result<Watcher, FsError>;

    /// Run a command. A string runs through the shell, an argv directly.
    async fn exec(&self, command: Command, opts: ExecOptions, ctx: &Ctx) -> Result<ExecOutcome, ExecError>;

    /// End every command still tracked and remove the temporary paths made.
    async fn cleanup(&self, ctx: &Ctx) -> Result<(), FsError>;

    /// Start a command that outlives this call (and this host process): it runs until it ends,
    /// is signalled, or its timeout passes, with its stdin open and its output kept by the box.
    /// Answers its handle in [`ExecutionEnv::processes`]. Only an environment whose box keeps
    /// processes can (a box with a runner); the others refuse with `spawn_error`, saying why.
    async fn start(&self, command: Command, opts: StartOptions, ctx: &Ctx) -> Result<u64, ExecError> {
        let _ = (command, opts, ctx);
        Err(ExecError::new(
            ExecCode::SpawnError,
            format!(
                "{}: this environment keeps no processes, so a command cannot outlive the call that starts it",
                self.id()
            ),
        ))
    }

    /// The processes the environment's box keeps (those [`ExecutionEnv::start`] started, and
    /// any other the box holds): read, written, signalled and listed by handle. `unsupported`,
    /// saying why, where the environment keeps none. Async and owned, so an environment that
    /// opens its box lazily can answer it.
    async fn processes(&self, ctx: &Ctx) -> agentbox_core::Result<Arc<dyn agentbox_core::Processes>> {
        let _ = ctx;
        Err(agentbox_core::Error::unsupported(format!(
            "{}: this environment keeps no processes",
            self.id()
        )))
    }
}

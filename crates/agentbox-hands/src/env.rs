//! The `ExecutionEnv` contract: an agent's file system and shell, the same on the host and
//! in any box (pi's `ExecutionEnv`; `docs/tools.md` says where a box differs).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use agentbox_core::Ctx;
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// What went wrong with a file operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsCode {
    /// The caller cancelled, or the operation's deadline passed.
    Aborted,
    /// ENOENT.
    NotFound,
    /// EACCES or EPERM.
    PermissionDenied,
    /// ENOTDIR.
    NotDirectory,
    /// EISDIR.
    IsDirectory,
    /// EINVAL, or a request that makes no sense (following a link with no_follow).
    Invalid,
    /// The environment cannot do this (a reader over its size bound).
    NotSupported,
    /// Anything else; the message says what.
    Unknown,
}

/// A failed file operation: a code, a message and the path it was about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsError {
    /// The code.
    pub code: FsCode,
    /// What failed and why.
    pub message: String,
    /// The path.
    pub path: Option<String>,
}

impl FsError {
    /// An error about `path`.
    pub fn new(code: FsCode, path: impl Into<String>, message: impl Into<String>) -> Self {
        FsError {
            code,
            message: message.into(),
            path: Some(path.into()),
        }
    }

    /// From an OS error, by errno, as pi maps it.
    pub fn from_io(e: &std::io::Error, path: &str) -> Self {
        use std::io::ErrorKind as K;
        let code = match e.kind() {
            K::NotFound => FsCode::NotFound,
            // EPERM and EACCES both.
            K::PermissionDenied => FsCode::PermissionDenied,
            K::NotADirectory => FsCode::NotDirectory,
            K::IsADirectory => FsCode::IsDirectory,
            K::InvalidInput => FsCode::Invalid,
            _ => FsCode::Unknown,
        };
        FsError::new(code, path, format!("{path}: {e}"))
    }
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for FsError {}

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

/// What a path is (as lstat sees it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// A regular file (or anything that is not a directory or a link).
    File,
    /// A directory.
    Directory,
    /// A symbolic link, not followed.
    Symlink,
}

/// One path's lstat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    /// The last segment.
    pub name: String,
    /// The path as asked, made absolute.
    pub path: String,
    /// What it is.
    pub kind: FileKind,
    /// Bytes.
    pub size: u64,
    /// Modification time in whole milliseconds since the epoch.
    pub mtime_ms: i64,
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

/// A file read whole when opened; later reads are served from that copy.
#[derive(Clone, Debug)]
pub struct BinaryReader {
    /// The file's lstat when it was opened.
    pub info: FileInfo,
    data: Vec<u8>,
}

impl BinaryReader {
    /// Wrap bytes read at open.
    pub fn new(info: FileInfo, data: Vec<u8>) -> Self {
        BinaryReader { info, data }
    }
    /// Up to `len` bytes from `offset` (fewer at the end, none past it).
    pub fn read(&self, offset: u64, len: usize) -> &[u8] {
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(self.data.len());
        let end = start.saturating_add(len).min(self.data.len());
        &self.data[start..end]
    }
    /// Each line with the byte offset it starts at, without its newline.
    pub fn scan_lines(&self) -> impl Iterator<Item = (u64, &[u8])> {
        let mut offset = 0u64;
        self.data.split_inclusive(|&b| b == b'\n').map(move |l| {
            let at = offset;
            offset += l.len() as u64;
            (at, l.strip_suffix(b"\n").unwrap_or(l))
        })
    }
}

/// A text file's lines, one at a time.
#[derive(Clone, Debug)]
pub struct TextLineReader {
    text: String,
    pos: usize,
}

impl TextLineReader {
    /// Over the text read at open.
    pub fn new(text: String) -> Self {
        TextLineReader { text, pos: 0 }
    }
    /// The next line and whether it ended with a newline; `None` at the end.
    pub fn next_line(&mut self) -> Option<(String, bool)> {
        if self.pos >= self.text.len() {
            return None;
        }
        let rest = &self.text[self.pos..];
        match rest.find('\n') {
            Some(i) => {
                self.pos += i + 1;
                Some((rest[..i].to_string(), true))
            }
            None => {
                self.pos = self.text.len();
                Some((rest.to_string(), false))
            }
        }
    }
}

/// A directory's entries, a batch at a time.
#[derive(Clone, Debug)]
pub struct DirReader {
    entries: Vec<FileInfo>,
    pos: usize,
}

impl DirReader {
    /// Over entries read at open.
    pub fn new(entries: Vec<FileInfo>) -> Self {
        DirReader { entries, pos: 0 }
    }
    /// Up to `max` entries, and whether the listing is done.
    pub fn next(&mut self, max: usize) -> (Vec<FileInfo>, bool) {
        let end = self.pos.saturating_add(max.max(1)).min(self.entries.len());
        let batch = self.entries[self.pos..end].to_vec();
        self.pos = end;
        (batch, self.pos >= self.entries.len())
    }
}

/// One thing to watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchTarget {
    /// The path.
    pub path: String,
    /// Its whole subtree.
    pub recursive: bool,
    /// Names (a segment) left out.
    pub exclude: Vec<String>,
}

/// A change a watcher saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The path that changed.
    pub path: String,
    /// `created`, `changed` or `removed`.
    pub kind: ChangeKind,
}

/// What happened to a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    /// It appeared.
    Created,
    /// Its kind, size or time changed.
    Changed,
    /// It went away.
    Removed,
}

/// The default bound of a reader: a file above it is refused before a byte moves.
pub const MAX_READER_BYTES: u64 = 64 << 20;

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
    ) -> Result<crate::watch::Watcher, FsError>;

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

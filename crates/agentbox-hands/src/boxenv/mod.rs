//! `BoxEnv`: the `ExecutionEnv` over any [`Sandbox`].
//!
//! Each file operation goes one way (`BoxEnv::one`, in `runner.rs`): where the box has a
//! runner ([`Sandbox::files`]) it is one message to it, answered by the box's own system call;
//! elsewhere, and for what the runner does not serve (canonical paths, links, temporaries,
//! watches), one exec of a fixed script (`script.rs`, `scripts.rs`) with the paths as
//! arguments. Commands (`exec.rs`) are the runner's own processes where it has one, and
//! started by the scripts where not. Every operation has a deadline, and so has the start of a
//! command. A box that ended or stopped answering is an error on that call and on every later
//! one.
//!
//! A box without live processes (`facts().live_processes` false: each exec one call that
//! answers once its command ended, with no stdin and no variables) is served another way
//! (`one_call.rs`): bytes by upload and download, commands run to their end with nothing to
//! track or kill, temporaries under the workspace.

mod exec;
mod kept;
mod one_call;
mod runner;
mod script;
pub(crate) mod scripts;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use agentbox_core::{Ctx, ErrorCode, FileType, Sandbox};
use async_trait::async_trait;

use crate::watch::Watcher;
use crate::*;

pub use exec::end_left_commands;
pub use one_call::WORKSPACE_TEMP_DIR;
use runner::{FAST_WRITE, Op, found, info_of_meta, open_reader};
pub use script::code_of;
use script::{kind_of_letter, parse_info, parse_records, refused_link, seconds_to_ms, text};

/// How long one file operation may take unless set otherwise.
pub const OP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a command may take to start.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The whole confirmation of a kill, a call in flight included.
pub const KILL_BUDGET: Duration = Duration::from_secs(10);

/// An agent's file system and shell in a box.
///
/// ```no_run
/// # async fn f(b: std::sync::Arc<dyn agentbox_core::Sandbox>) -> Result<(), Box<dyn std::error::Error>> {
/// use agentbox_core::Ctx;
/// use agentbox_hands::{BoxEnv, Command, ExecOptions, ExecutionEnv};
/// let env = BoxEnv::new(b);
/// env.write_file("notes/a.txt", b"hello", &Ctx::background()).await?;
/// let ran = env.exec(Command::Shell("wc -c notes/a.txt".into()), ExecOptions::default(), &Ctx::background()).await?;
/// # Ok(()) }
/// ```
pub struct BoxEnv {
    sandbox: Arc<dyn Sandbox>,
    cwd: String,
    op_timeout: Duration,
    max_reader_bytes: u64,
    /// Why the box was found lost, and the provider's error that said so (a `gone` of the
    /// environment's own where none did: a box that stopped answering).
    dead: Mutex<Option<(String, agentbox_core::Error)>>,
    /// Groups the scripts started and have not seen end.
    groups: Mutex<BTreeSet<u32>>,
    /// Commands the runner runs for this environment.
    commands: Mutex<exec::Commands>,
    /// The box's shell, once the runner path looked for it.
    shell: OnceLock<String>,
    /// The stdin of each command [`ExecutionEnv::start`] started, by handle: held so the
    /// command's stdin stays open for `process_write` (the runner client ends a process's
    /// stdin when the last writer of it is dropped), let go when a write closes it.
    stdins: kept::Stdins,
    temps: Mutex<BTreeSet<String>>,
}

impl BoxEnv {
    /// Over `sandbox`, with its workspace as the cwd.
    pub fn new(sandbox: Arc<dyn Sandbox>) -> Self {
        let cwd = sandbox.facts().workspace.clone().unwrap_or_else(|| "/".into());
        BoxEnv {
            sandbox,
            cwd,
            op_timeout: OP_TIMEOUT,
            max_reader_bytes: MAX_READER_BYTES,
            dead: Mutex::new(None),
            groups: Mutex::new(BTreeSet::new()),
            commands: Mutex::new(exec::Commands::default()),
            shell: OnceLock::new(),
            stdins: Default::default(),
            temps: Mutex::new(BTreeSet::new()),
        }
    }

    /// Another working directory (absolute).
    pub fn with_cwd(mut self, cwd: &str) -> Self {
        self.cwd = crate::path::normalize(cwd);
        self
    }

    /// Another deadline for each file operation.
    pub fn with_op_timeout(mut self, t: Duration) -> Self {
        self.op_timeout = t;
        self
    }

    /// Another reader bound.
    pub fn with_max_reader_bytes(mut self, max: u64) -> Self {
        self.max_reader_bytes = max;
        self
    }

    /// The box underneath.
    pub fn sandbox(&self) -> &Arc<dyn Sandbox> {
        &self.sandbox
    }

    /// Process groups this environment started by its scripts (a box with no runner) and has
    /// not seen end. A command over a runner leads a group the runner holds, not listed here.
    pub fn tracked_groups(&self) -> Vec<u32> {
        self.groups.lock().unwrap().iter().copied().collect()
    }

    /// Why the box was found lost (gone, or it stopped answering), once a call found it out:
    /// every later call fails with it.
    pub fn lost(&self) -> Option<String> {
        self.dead.lock().unwrap().as_ref().map(|(why, _)| why.clone())
    }

    /// The provider's error that found the box lost (code `gone`), once a call found it out:
    /// every later command's error carries it as its cause, not only the first's.
    pub fn lost_cause(&self) -> Option<agentbox_core::Error> {
        self.dead.lock().unwrap().as_ref().map(|(_, e)| e.clone())
    }

    /// A command's error for a lost box: code `unknown` (an execution has no `gone`), the
    /// provider's `gone` as its cause.
    fn lost_exec(&self) -> Option<crate::ExecError> {
        let (why, cause) = self.dead.lock().unwrap().clone()?;
        Some(crate::ExecError {
            cause: Some(cause),
            ..crate::ExecError::new(crate::ExecCode::Unknown, why)
        })
    }

    /// Mark the box lost for `why` (the first reason sticks): its cause a `gone` of its own.
    fn mark_lost(&self, why: String) -> String {
        let cause = agentbox_core::Error::gone(why.clone());
        self.mark_lost_by(why, cause)
    }

    /// Mark the box lost for `why`, found by the provider's `cause`.
    fn mark_lost_by(&self, why: String, cause: agentbox_core::Error) -> String {
        let mut d = self.dead.lock().unwrap();
        d.get_or_insert((why, cause)).0.clone()
    }

    /// A box's failure as an operation's: the caller's cancellation or deadline, a box that
    /// stopped answering or is gone (which sticks), a bound passed.
    fn box_error(&self, e: agentbox_core::Error, path: &str, ctx: &Ctx) -> FsError {
        match e.code() {
            ErrorCode::Aborted => FsError::new(FsCode::Aborted, path, "the operation was cancelled"),
            ErrorCode::Timeout if ctx.err().is_some() => {
                FsError::new(FsCode::Aborted, path, "the operation's deadline passed")
            }
            // A box that runs one call at a time may be running a command it could not stop
            // before this one: waiting past the deadline is no sign it is lost.
            ErrorCode::Timeout if self.one_call() => FsError::new(
                FsCode::Unknown,
                path,
                format!(
                    "box {} did not answer within {}s: it runs one call at a time, and a command before this one may still run to its own deadline; the operation was given up",
                    self.sandbox.id(),
                    self.op_timeout.as_secs()
                ),
            ),
            ErrorCode::Timeout => {
                let why = self.mark_lost(format!(
                    "box {} stopped answering: an operation took over {}s",
                    self.sandbox.id(),
                    self.op_timeout.as_secs()
                ));
                FsError::new(FsCode::Unknown, path, why)
            }
            ErrorCode::Gone => FsError::new(
                FsCode::Unknown,
                path,
                self.mark_lost_by(format!("box {} is gone: {e}", self.sandbox.id()), e.clone()),
            ),
            ErrorCode::TooLarge => FsError::new(FsCode::NotSupported, path, e.message().to_string()),
            _ => FsError::new(FsCode::Unknown, path, format!("box {}: {e}", self.sandbox.id())),
        }
    }

    /// A whole file's bytes; `text_ok`: the caller takes them as text, which a box without
    /// live processes can give of a file outside its workspace.
    async fn read_whole(&self, path: &str, text_ok: bool, ctx: &Ctx) -> Result<Vec<u8>, FsError> {
        let op = self.op(path, ctx)?;
        if self.one_call() {
            return self.read_one_call(&op, text_ok).await;
        }
        self.one(
            &op,
            |f| f.read(&op.path, &op.ctx),
            |b| found(&op.path, b),
            self.ok(scripts::READ, &[&op.path], vec![], ctx),
        )
        .await
    }

    /// Write or append, creating parent directories: by a message up to [`FAST_WRITE`] bytes.
    async fn put(&self, path: &str, data: &[u8], append: bool, ctx: &Ctx) -> Result<(), FsError> {
        let op = self.op(path, ctx)?;
        if self.one_call() {
            return self.put_one_call(&op, data, append).await;
        }
        let script = if append { scripts::APPEND } else { scripts::WRITE };
        let by_script = async { self.ok(script, &[&op.path], data.to_vec(), ctx).await.map(drop) };
        if data.len() > FAST_WRITE {
            return by_script.await;
        }
        self.one(&op, |f| f.write(&op.path, data, append, &op.ctx), Ok, by_script)
            .await
    }

    /// A binary reader by [`scripts::OPEN_READER`]: the checks and the bytes in one exec.
    async fn reader_by_script(&self, op: &Op, no_follow: bool, ctx: &Ctx) -> Result<BinaryReader, FsError> {
        let p = op.path.as_str();
        let (max, nf) = (self.max_reader_bytes.to_string(), if no_follow { "1" } else { "0" });
        let out = self
            .ok(scripts::OPEN_READER, &[p, &max, nf], vec![], ctx)
            .await
            .map_err(|e| refused_link(e, p, no_follow))?;
        let nl = out
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| FsError::new(FsCode::Unknown, p, "no stat line"))?;
        let info = parse_info(p, &String::from_utf8_lossy(&out[..nl]))?;
        Ok(BinaryReader::new(info, out[nl + 1..].to_vec()))
    }

    fn remember_temp(&self, out: Vec<u8>) -> String {
        let p = text(out).trim_end().to_string();
        self.temps.lock().unwrap().insert(p.clone());
        p
    }
}

#[async_trait]
impl ExecutionEnv for BoxEnv {
    fn id(&self) -> String {
        let id = self.sandbox.id();
        format!("agentbox:{}:{}", id.provider(), id.name())
    }

    fn cwd(&self) -> String {
        self.cwd.clone()
    }

    async fn read_text_file(&self, path: &str, ctx: &Ctx) -> Result<String, FsError> {
        Ok(text(self.read_whole(path, true, ctx).await?))
    }

    async fn read_text_lines(&self, path: &str, max_lines: Option<usize>, ctx: &Ctx) -> Result<Vec<String>, FsError> {
        let op = self.op(path, ctx)?;
        if self.one_call() && self.in_workspace(&op.path).is_some() {
            let bytes = self.read_one_call(&op, true).await?;
            return Ok(crate::path_lines(&text(bytes), max_lines));
        }
        let by_script = async {
            match max_lines {
                Some(n) => {
                    self.ok(scripts::READ_LINES, &[&op.path, &n.to_string()], vec![], ctx)
                        .await
                }
                None => self.ok(scripts::READ, &[&op.path], vec![], ctx).await,
            }
        };
        let bytes = self
            .one(&op, |f| f.read(&op.path, &op.ctx), |b| found(&op.path, b), by_script)
            .await?;
        Ok(crate::path_lines(&text(bytes), max_lines))
    }

    async fn read_binary_file(&self, path: &str, ctx: &Ctx) -> Result<Vec<u8>, FsError> {
        self.read_whole(path, false, ctx).await
    }

    /// As the default, but a box without live processes reads a file outside its workspace
    /// as text through a script's output, which a binary reader there may not.
    async fn open_text_line_reader(&self, path: &str, ctx: &Ctx) -> Result<TextLineReader, FsError> {
        let op = self.op(path, ctx)?;
        let r = if self.one_call() && self.in_workspace(&op.path).is_none() {
            self.reader_by_script(&op, false, ctx).await?
        } else {
            self.open_binary_reader(path, false, ctx).await?
        };
        Ok(TextLineReader::new(
            String::from_utf8_lossy(r.read(0, usize::MAX)).into_owned(),
        ))
    }

    async fn open_binary_reader(&self, path: &str, no_follow: bool, ctx: &Ctx) -> Result<BinaryReader, FsError> {
        let op = self.op(path, ctx)?;
        if self.one_call() {
            return self.reader_one_call(&op, no_follow).await;
        }
        let p = op.path.as_str();
        let max = self.max_reader_bytes;
        let refused_link = || FsError::new(FsCode::Invalid, p, format!("Refusing to follow a symbolic link: {p}"));
        // As the host's reader: the link itself, then what it names, then the bytes.
        let by_messages = |o: runner::Opened| {
            let Some(target) = o.target else {
                return Err(refused_link());
            };
            if target.kind == FileType::Dir {
                return Err(FsError::new(FsCode::IsDirectory, p, format!("{p}: Is a directory")));
            }
            if target.size > max {
                return Err(FsError::new(
                    FsCode::NotSupported,
                    p,
                    format!("{p}: {} bytes, over the reader's {max} bytes", target.size),
                ));
            }
            Ok(BinaryReader::new(info_of_meta(p, &o.link), found(p, o.bytes)?))
        };
        let by_script = self.reader_by_script(&op, no_follow, ctx);
        self.one(&op, |f| open_reader(f, &op, no_follow, max), by_messages, by_script)
            .await
    }

    async fn write_file(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<(), FsError> {
        self.put(path, data, false, ctx).await
    }

    async fn append_file(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<(), FsError> {
        self.put(path, data, true, ctx).await
    }

    async fn truncate_file(&self, path: &str, size: u64, ctx: &Ctx) -> Result<(), FsError> {
        let op = self.op(path, ctx)?;
        let by_script = async {
            self.ok(scripts::TRUNCATE, &[&op.path, &size.to_string()], vec![], ctx)
                .await
                .map(drop)
        };
        self.one(&op, |f| f.truncate(&op.path, size, &op.ctx), Ok, by_script)
            .await
    }

    async fn flush_file(&self, path: &str, ctx: &Ctx) -> Result<(), FsError> {
        let p = self.p(path)?;
        self.ok(scripts::FLUSH, &[&p], vec![], ctx).await.map(drop)
    }

    async fn rename_file(&self, src: &str, dst: &str, ctx: &Ctx) -> Result<(), FsError> {
        let (op, d) = (self.op(src, ctx)?, self.p(dst)?);
        let by_script = async { self.ok(scripts::RENAME, &[&op.path, &d], vec![], ctx).await.map(drop) };
        self.one(&op, |f| f.rename(&op.path, &d, &op.ctx), Ok, by_script).await
    }

    async fn file_info(&self, path: &str, ctx: &Ctx) -> Result<FileInfo, FsError> {
        let op = self.op(path, ctx)?;
        let by_script = async {
            let out = self.ok(scripts::INFO, &[&op.path], vec![], ctx).await?;
            parse_info(&op.path, String::from_utf8_lossy(&out).trim_end_matches('\n'))
        };
        self.one(
            &op,
            |f| f.stat(&op.path, false, &op.ctx),
            |m| Ok(info_of_meta(&op.path, &m)),
            by_script,
        )
        .await
    }

    async fn list_dir(&self, path: &str, ctx: &Ctx) -> Result<Vec<FileInfo>, FsError> {
        let op = self.op(path, ctx)?;
        let p = op.path.as_str();
        let by_messages = |listed: Vec<agentbox_core::FileMeta>| {
            Ok(listed
                .iter()
                .map(|m| {
                    let mut i = info_of_meta(&crate::path::join(&[p, &m.name]), m);
                    i.name = m.name.clone();
                    i
                })
                .collect::<Vec<_>>())
        };
        let by_script = async {
            let out = self.ok(scripts::LIST, &[p], vec![], ctx).await?;
            Ok(parse_records(&out, 4)
                .into_iter()
                .map(|r| FileInfo {
                    path: crate::path::join(&[p, &r[0]]),
                    name: r[0].clone(),
                    kind: kind_of_letter(&r[1]),
                    size: r[2].parse().unwrap_or(0),
                    mtime_ms: seconds_to_ms(&r[3]),
                })
                .collect())
        };
        let mut entries = self.one(&op, |f| f.list(p, &op.ctx), by_messages, by_script).await?;
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }

    async fn canonical_path(&self, path: &str, ctx: &Ctx) -> Result<String, FsError> {
        let p = self.p(path)?;
        let out = self.ok(scripts::CANONICAL, &[&p], vec![], ctx).await?;
        Ok(text(out).trim_end_matches('\0').to_string())
    }

    async fn read_link(&self, path: &str, ctx: &Ctx) -> Result<String, FsError> {
        let p = self.p(path)?;
        let out = self.ok(scripts::READ_LINK, &[&p], vec![], ctx).await?;
        Ok(text(out).trim_end_matches('\0').to_string())
    }

    async fn exists(&self, path: &str, ctx: &Ctx) -> Result<bool, FsError> {
        let op = self.op(path, ctx)?;
        let by_script = async {
            let out = self.ok(scripts::EXISTS, &[&op.path], vec![], ctx).await?;
            Ok(out.starts_with(b"yes"))
        };
        // A missing path (or one under a file) is no error: it does not exist.
        match self
            .one(&op, |f| f.stat(&op.path, false, &op.ctx), |_| Ok(true), by_script)
            .await
        {
            Err(e) if matches!(e.code, FsCode::NotFound | FsCode::NotDirectory) => Ok(false),
            r => r,
        }
    }

    async fn create_dir(&self, path: &str, recursive: bool, ctx: &Ctx) -> Result<(), FsError> {
        let op = self.op(path, ctx)?;
        let script = if recursive { scripts::MKDIR_P } else { scripts::MKDIR };
        let by_script = async { self.ok(script, &[&op.path], vec![], ctx).await.map(drop) };
        self.one(&op, |f| f.mkdir(&op.path, recursive, &op.ctx), Ok, by_script)
            .await
    }

    async fn remove(&self, path: &str, recursive: bool, force: bool, ctx: &Ctx) -> Result<(), FsError> {
        let op = self.op(path, ctx)?;
        let flags = match (recursive, force) {
            (true, true) => "rf",
            (true, false) => "r",
            (false, true) => "f",
            (false, false) => "-",
        };
        let by_script = async {
            self.ok(scripts::REMOVE, &[&op.path, flags], vec![], ctx)
                .await
                .map(drop)
        };
        self.one(&op, |f| f.remove(&op.path, recursive, force, &op.ctx), Ok, by_script)
            .await
    }

    async fn create_temp_dir(&self, prefix: &str, ctx: &Ctx) -> Result<String, FsError> {
        let out = match self.temp_base() {
            Some(base) => self.ok(scripts::TEMP_DIR_IN, &[&base, prefix], vec![], ctx).await?,
            None => self.ok(scripts::TEMP_DIR, &[prefix], vec![], ctx).await?,
        };
        Ok(self.remember_temp(out))
    }

    async fn create_temp_file(&self, prefix: &str, suffix: &str, ctx: &Ctx) -> Result<String, FsError> {
        let out = match self.temp_base() {
            Some(base) => {
                self.ok(scripts::TEMP_FILE_IN, &[&base, prefix, suffix], vec![], ctx)
                    .await?
            }
            None => self.ok(scripts::TEMP_FILE, &[prefix, suffix], vec![], ctx).await?,
        };
        Ok(self.remember_temp(out))
    }

    async fn watch(
        &self,
        targets: Vec<WatchTarget>,
        on_change: Arc<dyn Fn(Change) + Send + Sync>,
        _ctx: &Ctx,
    ) -> Result<Watcher, FsError> {
        let targets = crate::watch::absolute_targets(&self.cwd, targets);
        let env = Arc::new(BoxEnv::new(self.sandbox.clone()).with_cwd(&self.cwd));
        let snapshot: crate::watch::Snapshot = Arc::new(move || {
            let env = env.clone();
            let targets = targets.clone();
            Box::pin(async move { env.snapshot(&targets).await })
        });
        Ok(Watcher::start(snapshot, Duration::from_secs(1), on_change))
    }

    async fn exec(&self, command: Command, opts: ExecOptions, ctx: &Ctx) -> Result<ExecOutcome, ExecError> {
        self.run(command, opts, ctx).await
    }

    async fn start(&self, command: Command, opts: StartOptions, ctx: &Ctx) -> Result<u64, ExecError> {
        self.start_detached(command, opts, ctx).await
    }

    async fn processes(&self, _ctx: &Ctx) -> agentbox_core::Result<Arc<dyn agentbox_core::Processes>> {
        if let Some(why) = self.lost() {
            return Err(agentbox_core::Error::gone(why));
        }
        if self.sandbox.processes().is_none() {
            return Err(kept::no_runner(&*self.sandbox));
        }
        Ok(Arc::new(kept::Kept {
            sandbox: self.sandbox.clone(),
            stdins: self.stdins.clone(),
        }))
    }

    async fn cleanup(&self, ctx: &Ctx) -> Result<(), FsError> {
        for g in self.tracked_groups() {
            self.stop_group(g).await;
        }
        self.end_runner_commands().await;
        let temps: Vec<String> = std::mem::take(&mut *self.temps.lock().unwrap()).into_iter().collect();
        if !temps.is_empty() && self.lost().is_none() {
            let args: Vec<&str> = temps.iter().map(String::as_str).collect();
            self.ok(scripts::REMOVE_ALL, &args, vec![], ctx).await?;
        }
        Ok(())
    }
}

//! `BoxEnv`: the `ExecutionEnv` over any [`Sandbox`].
//!
//! Where the box has a runner ([`Sandbox::files`]), each file operation is one message to it,
//! answered by the box's own system call; elsewhere (and for what the runner does not serve:
//! canonical paths, links, temporaries, watches) every file operation and every command is one
//! exec of a fixed script ([`scripts`]) with the paths as arguments. Every operation has a deadline, and so has the start of a command.
//! A box that ended or stopped answering is an error on that call and on every later one.
//! Commands run in a process group of their own; a stop asks the group to end, kills it a
//! second later, and confirms from a second exec that no live process of it is left.

pub(crate) mod scripts;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentbox_core::{
    Ctx, ErrorCode, ExecOptions as BoxExecOptions, FileError, FileMeta, FileType, Files, FinishOptions, Finished,
    Sandbox, finish,
};
use async_trait::async_trait;
use tokio::io::AsyncReadExt;

use crate::env::*;
use crate::output::{Ran, run_command, stopped_message};
use crate::path::{absolute, base_name};
use crate::watch::{Seen, Watcher};

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
    dead: Mutex<Option<String>>,
    groups: Mutex<BTreeSet<u32>>,
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

    /// Process groups this environment started and has not seen end.
    pub fn tracked_groups(&self) -> Vec<u32> {
        self.groups.lock().unwrap().iter().copied().collect()
    }

    fn p(&self, path: &str) -> Result<String, FsError> {
        if path.contains('\0') {
            return Err(FsError::new(FsCode::Invalid, path, "a path holds a NUL byte"));
        }
        Ok(absolute(&self.cwd, path))
    }

    /// Why the box was found lost (gone, or it stopped answering), once a call found it out:
    /// every later call fails with it.
    pub fn lost(&self) -> Option<String> {
        self.dead.lock().unwrap().clone()
    }

    fn mark_lost(&self, why: String) -> String {
        let mut d = self.dead.lock().unwrap();
        d.get_or_insert(why).clone()
    }

    /// Run a script with its arguments; a box-level failure becomes an `FsError` and, when the
    /// box is gone or stopped answering, sticks.
    async fn script(
        &self,
        script: &str,
        args: &[&str],
        stdin: Vec<u8>,
        max_out: usize,
        ctx: &Ctx,
    ) -> Result<Finished, FsError> {
        let path = args.first().copied().unwrap_or_default();
        if let Some(why) = self.lost() {
            return Err(FsError::new(FsCode::Unknown, path, why));
        }
        let mut argv = vec!["sh".to_string(), "-c".into(), script.into(), "agentbox-hands".into()];
        argv.extend(args.iter().map(|a| a.to_string()));
        let opts = BoxExecOptions {
            cwd: None,
            env: BTreeMap::from([("LC_ALL".to_string(), "C".to_string())]),
        };
        let op = ctx.with_timeout(self.op_timeout);
        let r = match self.sandbox.exec(&argv, &opts, &op).await {
            Ok(p) => {
                finish(
                    p,
                    FinishOptions {
                        stdin,
                        max_output: max_out,
                    },
                )
                .await
            }
            Err(e) => Err(e),
        };
        r.map_err(|e| self.box_error(e, path, ctx))
    }

    fn box_error(&self, e: agentbox_core::Error, path: &str, ctx: &Ctx) -> FsError {
        match e.code() {
            ErrorCode::Aborted => FsError::new(FsCode::Aborted, path, "the operation was cancelled"),
            ErrorCode::Timeout if ctx.err().is_some() => {
                FsError::new(FsCode::Aborted, path, "the operation's deadline passed")
            }
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
                self.mark_lost(format!("box {} is gone: {e}", self.sandbox.id())),
            ),
            ErrorCode::TooLarge => FsError::new(FsCode::NotSupported, path, e.message().to_string()),
            _ => FsError::new(FsCode::Unknown, path, format!("box {}: {e}", self.sandbox.id())),
        }
    }

    /// The box's runner, when it has one: each file operation is then one message, and a
    /// failure carries the errno the box's system call gave.
    fn fast(&self) -> Option<&dyn Files> {
        self.sandbox.files()
    }

    /// The runner and the op's context, unless the box was lost (which sticks).
    fn fast_ctx(&self, path: &str, ctx: &Ctx) -> Result<(&dyn Files, Ctx), FsError> {
        if let Some(why) = self.lost() {
            return Err(FsError::new(FsCode::Unknown, path, why));
        }
        let files = self
            .fast()
            .ok_or_else(|| FsError::new(FsCode::Unknown, path, "the box has no runner"))?;
        Ok((files, ctx.with_timeout(self.op_timeout)))
    }

    /// A runner's answer as the host's own call would fail (or as the box's loss, which sticks).
    fn mapped<T>(&self, r: Result<T, FileError>, path: &str, ctx: &Ctx) -> Result<T, FsError> {
        match r {
            Ok(v) => Ok(v),
            Err(FileError::Os(n)) => Err(FsError::from_io(&std::io::Error::from_raw_os_error(n), path)),
            Err(FileError::Box(e)) => Err(self.box_error(e, path, ctx)),
        }
    }

    /// A whole file through the runner; `None` when it is over what one message carries.
    async fn fast_read(&self, p: &str, ctx: &Ctx) -> Result<Option<Vec<u8>>, FsError> {
        let r = self.mapped(
            {
                let (f, c) = self.fast_ctx(p, ctx)?;
                f.read(p, &c).await
            },
            p,
            ctx,
        );
        match r {
            Ok(Some(b)) => Ok(Some(b)),
            Ok(None) => Err(FsError::from_io(&std::io::Error::from_raw_os_error(2), p)),
            Err(e) if e.code == FsCode::NotSupported => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Run a script and require exit 0, mapping its stderr to a code.
    async fn ok(&self, script: &str, args: &[&str], stdin: Vec<u8>, ctx: &Ctx) -> Result<Vec<u8>, FsError> {
        let cap = usize::try_from(self.max_reader_bytes)
            .unwrap_or(usize::MAX)
            .saturating_add(4096);
        let out = self.script(script, args, stdin, cap, ctx).await?;
        if out.status.code == 0 {
            return Ok(out.stdout);
        }
        let text = out.stderr_text();
        let path = args.first().copied().unwrap_or_default();
        let message = text.trim().lines().last().unwrap_or("failed").to_string();
        Err(FsError::new(code_of(&text), path, message))
    }

    async fn snapshot(&self, targets: &[WatchTarget]) -> Option<Seen> {
        let mut seen = Seen::new();
        for t in targets {
            let depth = if t.recursive { "-1" } else { "1" };
            let out = self
                .ok(scripts::SNAPSHOT, &[depth, &t.path], vec![], &Ctx::background())
                .await
                .ok()?;
            for rec in parse_records(&out, 4) {
                let p = rec[0].clone();
                if crate::watch::excluded(&t.path, &p, &t.exclude) {
                    continue;
                }
                seen.insert(
                    p,
                    (
                        kind_of_letter(&rec[1]),
                        rec[2].parse().unwrap_or(0),
                        seconds_to_ms(&rec[3]),
                    ),
                );
            }
        }
        Some(seen)
    }

    /// Kill a group and confirm it is gone, trying again at 1, 2 and 4 s within 10 s.
    async fn stop_group(&self, pgid: u32) -> bool {
        let start = tokio::time::Instant::now();
        for wait in [0u64, 1, 2, 4] {
            let at = start + Duration::from_secs(wait);
            if at >= start + KILL_BUDGET {
                break;
            }
            tokio::time::sleep_until(at).await;
            let left = (start + KILL_BUDGET).saturating_duration_since(tokio::time::Instant::now());
            let ctx = Ctx::background().with_timeout(left);
            let argv: Vec<String> = ["sh", "-c", scripts::KILL_GROUP, "agentbox-kill", &pgid.to_string()]
                .map(String::from)
                .to_vec();
            let said = match self.sandbox.exec(&argv, &BoxExecOptions::default(), &ctx).await {
                Ok(p) => finish(p, FinishOptions::default()).await.ok().map(|f| f.stdout_text()),
                Err(_) => None,
            };
            if said.is_some_and(|s| s.trim() == "gone") {
                self.groups.lock().unwrap().remove(&pgid);
                return true;
            }
        }
        false
    }
}

/// Kill every command group a host that died left running in `sandbox`; the host that takes
/// a box over calls it once, before its first command. Returns the groups it killed.
pub async fn end_left_commands(sandbox: &dyn Sandbox, ctx: &Ctx) -> agentbox_core::Result<Vec<u32>> {
    let argv: Vec<String> = ["sh", "-c", scripts::END_LEFT, "agentbox-end-left"]
        .map(String::from)
        .to_vec();
    let p = sandbox.exec(&argv, &BoxExecOptions::default(), ctx).await?;
    let out = finish(p, FinishOptions::default()).await?;
    Ok(out
        .stdout_text()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect())
}

/// A failure's code from the text GNU tools print under `LC_ALL=C`.
pub fn code_of(stderr: &str) -> FsCode {
    let has = |s: &str| stderr.contains(s);
    if has("agentbox:symlink") || has("agentbox:invalid") {
        FsCode::Invalid
    } else if has("agentbox:too_large") {
        FsCode::NotSupported
    } else if has("agentbox:not_directory") || has("Not a directory") || has("cannot overwrite non-directory") {
        FsCode::NotDirectory
    } else if has("No such file or directory") {
        FsCode::NotFound
    } else if has("Is a directory") || has("cannot overwrite directory") {
        FsCode::IsDirectory
    } else if has("Permission denied") || has("Operation not permitted") {
        FsCode::PermissionDenied
    } else if has("Invalid argument") || has("subdirectory of itself") {
        FsCode::Invalid
    } else {
        FsCode::Unknown
    }
}

fn parse_records(bytes: &[u8], fields: usize) -> Vec<Vec<String>> {
    let parts: Vec<String> = bytes
        .split(|&b| b == 0)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    parts
        .chunks(fields)
        .filter(|c| c.len() == fields)
        .map(|c| c.to_vec())
        .collect()
}

fn kind_of_letter(l: &str) -> FileKind {
    match l {
        "d" => FileKind::Directory,
        "l" => FileKind::Symlink,
        _ => FileKind::File,
    }
}

fn kind_of_stat(s: &str) -> FileKind {
    match s {
        "directory" => FileKind::Directory,
        "symbolic link" => FileKind::Symlink,
        _ => FileKind::File,
    }
}

/// `1700000000.1234` seconds as whole milliseconds.
fn seconds_to_ms(s: &str) -> i64 {
    let (secs, frac) = s.split_once('.').unwrap_or((s, ""));
    let secs: i64 = secs.parse().unwrap_or(0);
    let ms: i64 = format!("{:0<3}", &frac[..frac.len().min(3)]).parse().unwrap_or(0);
    secs * 1000 + ms
}

fn parse_info(path: &str, line: &str) -> Result<FileInfo, FsError> {
    let bad = || FsError::new(FsCode::Unknown, path, format!("unexpected stat output {line:?}"));
    let mut parts = line.rsplitn(3, '|');
    let mtime = parts.next().ok_or_else(bad)?;
    let size = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
    let kind = kind_of_stat(parts.next().ok_or_else(bad)?);
    Ok(FileInfo {
        name: base_name(path),
        path: path.to_string(),
        kind,
        size,
        mtime_ms: seconds_to_ms(mtime),
    })
}

/// Writes up to this size go through the runner in one message; larger ones by a script.
const FAST_WRITE: usize = 8 << 20;

/// A runner's metadata as hands' `FileInfo`, as the host's `info_of` builds it.
fn info_of_meta(path: &str, m: &FileMeta) -> FileInfo {
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

fn text(b: Vec<u8>) -> String {
    String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
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
        Ok(text(self.read_binary_file(path, ctx).await?))
    }

    async fn read_text_lines(&self, path: &str, max_lines: Option<usize>, ctx: &Ctx) -> Result<Vec<String>, FsError> {
        let p = self.p(path)?;
        if self.fast().is_some()
            && let Some(b) = self.fast_read(&p, ctx).await?
        {
            return Ok(crate::path_lines(&text(b), max_lines));
        }
        let bytes = match max_lines {
            Some(n) => self.ok(scripts::READ_LINES, &[&p, &n.to_string()], vec![], ctx).await?,
            None => self.ok(scripts::READ, &[&p], vec![], ctx).await?,
        };
        Ok(crate::path_lines(&text(bytes), max_lines))
    }

    async fn read_binary_file(&self, path: &str, ctx: &Ctx) -> Result<Vec<u8>, FsError> {
        let p = self.p(path)?;
        if self.fast().is_some()
            && let Some(b) = self.fast_read(&p, ctx).await?
        {
            return Ok(b);
        }
        self.ok(scripts::READ, &[&p], vec![], ctx).await
    }

    async fn open_binary_reader(&self, path: &str, no_follow: bool, ctx: &Ctx) -> Result<BinaryReader, FsError> {
        let p = self.p(path)?;
        if self.fast().is_some() {
            // As the host's reader: the link itself, then what it names, then the bytes.
            let link = self.mapped(
                {
                    let (f, c) = self.fast_ctx(&p, ctx)?;
                    f.stat(&p, false, &c).await
                },
                &p,
                ctx,
            )?;
            if no_follow && link.kind == FileType::Symlink {
                return Err(FsError::new(
                    FsCode::Invalid,
                    &p,
                    format!("Refusing to follow a symbolic link: {p}"),
                ));
            }
            let target = self.mapped(
                {
                    let (f, c) = self.fast_ctx(&p, ctx)?;
                    f.stat(&p, true, &c).await
                },
                &p,
                ctx,
            )?;
            if target.kind == FileType::Dir {
                return Err(FsError::new(FsCode::IsDirectory, &p, format!("{p}: Is a directory")));
            }
            if target.size > self.max_reader_bytes {
                return Err(FsError::new(
                    FsCode::NotSupported,
                    &p,
                    format!(
                        "{p}: {} bytes, over the reader's {} bytes",
                        target.size, self.max_reader_bytes
                    ),
                ));
            }
            if let Some(data) = self.fast_read(&p, ctx).await? {
                return Ok(BinaryReader::new(info_of_meta(&p, &link), data));
            }
        }
        let max = self.max_reader_bytes.to_string();
        let nf = if no_follow { "1" } else { "0" };
        let out = self
            .ok(scripts::OPEN_READER, &[&p, &max, nf], vec![], ctx)
            .await
            .map_err(|mut e| {
                if e.code == FsCode::Invalid && no_follow {
                    e.message = format!("Refusing to follow a symbolic link: {p}");
                }
                e
            })?;
        let nl = out
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| FsError::new(FsCode::Unknown, &p, "no stat line"))?;
        let info = parse_info(&p, &String::from_utf8_lossy(&out[..nl]))?;
        Ok(BinaryReader::new(info, out[nl + 1..].to_vec()))
    }

    async fn write_file(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<(), FsError> {
        let p = self.p(path)?;
        if self.fast().is_some() && data.len() <= FAST_WRITE {
            return self.mapped(
                {
                    let (f, c) = self.fast_ctx(&p, ctx)?;
                    f.write(&p, data, false, &c).await
                },
                &p,
                ctx,
            );
        }
        self.ok(scripts::WRITE, &[&p], data.to_vec(), ctx).await.map(|_| ())
    }

    async fn append_file(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<(), FsError> {
        let p = self.p(path)?;
        if self.fast().is_some() && data.len() <= FAST_WRITE {
            return self.mapped(
                {
                    let (f, c) = self.fast_ctx(&p, ctx)?;
                    f.write(&p, data, true, &c).await
                },
                &p,
                ctx,
            );
        }
        self.ok(scripts::APPEND, &[&p], data.to_vec(), ctx).await.map(|_| ())
    }

    async fn truncate_file(&self, path: &str, size: u64, ctx: &Ctx) -> Result<(), FsError> {
        let p = self.p(path)?;
        if self.fast().is_some() {
            return self.mapped(
                {
                    let (f, c) = self.fast_ctx(&p, ctx)?;
                    f.truncate(&p, size, &c).await
                },
                &p,
                ctx,
            );
        }
        self.ok(scripts::TRUNCATE, &[&p, &size.to_string()], vec![], ctx)
            .await
            .map(|_| ())
    }

    async fn flush_file(&self, path: &str, ctx: &Ctx) -> Result<(), FsError> {
        let p = self.p(path)?;
        self.ok(scripts::FLUSH, &[&p], vec![], ctx).await.map(|_| ())
    }

    async fn rename_file(&self, src: &str, dst: &str, ctx: &Ctx) -> Result<(), FsError> {
        let (s, d) = (self.p(src)?, self.p(dst)?);
        if self.fast().is_some() {
            return self.mapped(
                {
                    let (f, c) = self.fast_ctx(&s, ctx)?;
                    f.rename(&s, &d, &c).await
                },
                &s,
                ctx,
            );
        }
        self.ok(scripts::RENAME, &[&s, &d], vec![], ctx).await.map(|_| ())
    }

    async fn file_info(&self, path: &str, ctx: &Ctx) -> Result<FileInfo, FsError> {
        let p = self.p(path)?;
        if self.fast().is_some() {
            let m = self.mapped(
                {
                    let (f, c) = self.fast_ctx(&p, ctx)?;
                    f.stat(&p, false, &c).await
                },
                &p,
                ctx,
            )?;
            return Ok(info_of_meta(&p, &m));
        }
        let out = self.ok(scripts::INFO, &[&p], vec![], ctx).await?;
        parse_info(&p, String::from_utf8_lossy(&out).trim_end_matches('\n'))
    }

    async fn list_dir(&self, path: &str, ctx: &Ctx) -> Result<Vec<FileInfo>, FsError> {
        let p = self.p(path)?;
        if self.fast().is_some() {
            let listed = self.mapped(
                {
                    let (f, c) = self.fast_ctx(&p, ctx)?;
                    f.list(&p, &c).await
                },
                &p,
                ctx,
            )?;
            let mut entries: Vec<FileInfo> = listed
                .iter()
                .map(|m| {
                    let mut i = info_of_meta(&crate::path::join(&[&p, &m.name]), m);
                    i.name = m.name.clone();
                    i
                })
                .collect();
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            return Ok(entries);
        }
        let out = self.ok(scripts::LIST, &[&p], vec![], ctx).await?;
        let mut entries: Vec<FileInfo> = parse_records(&out, 4)
            .into_iter()
            .map(|r| FileInfo {
                path: crate::path::join(&[&p, &r[0]]),
                name: r[0].clone(),
                kind: kind_of_letter(&r[1]),
                size: r[2].parse().unwrap_or(0),
                mtime_ms: seconds_to_ms(&r[3]),
            })
            .collect();
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
        let p = self.p(path)?;
        if self.fast().is_some() {
            return match self.mapped(
                {
                    let (f, c) = self.fast_ctx(&p, ctx)?;
                    f.stat(&p, false, &c).await
                },
                &p,
                ctx,
            ) {
                Ok(_) => Ok(true),
                Err(e) if matches!(e.code, FsCode::NotFound | FsCode::NotDirectory) => Ok(false),
                Err(e) => Err(e),
            };
        }
        let out = self.ok(scripts::EXISTS, &[&p], vec![], ctx).await?;
        Ok(out.starts_with(b"yes"))
    }

    async fn create_dir(&self, path: &str, recursive: bool, ctx: &Ctx) -> Result<(), FsError> {
        let p = self.p(path)?;
        if self.fast().is_some() {
            return self.mapped(
                {
                    let (f, c) = self.fast_ctx(&p, ctx)?;
                    f.mkdir(&p, recursive, &c).await
                },
                &p,
                ctx,
            );
        }
        let script = if recursive { scripts::MKDIR_P } else { scripts::MKDIR };
        self.ok(script, &[&p], vec![], ctx).await.map(|_| ())
    }

    async fn remove(&self, path: &str, recursive: bool, force: bool, ctx: &Ctx) -> Result<(), FsError> {
        let p = self.p(path)?;
        if self.fast().is_some() {
            return self.mapped(
                {
                    let (f, c) = self.fast_ctx(&p, ctx)?;
                    f.remove(&p, recursive, force, &c).await
                },
                &p,
                ctx,
            );
        }
        let flags = match (recursive, force) {
            (true, true) => "rf",
            (true, false) => "r",
            (false, true) => "f",
            (false, false) => "-",
        };
        self.ok(scripts::REMOVE, &[&p, flags], vec![], ctx).await.map(|_| ())
    }

    async fn create_temp_dir(&self, prefix: &str, ctx: &Ctx) -> Result<String, FsError> {
        let out = self.ok(scripts::TEMP_DIR, &[prefix], vec![], ctx).await?;
        let p = text(out).trim_end().to_string();
        self.temps.lock().unwrap().insert(p.clone());
        Ok(p)
    }

    async fn create_temp_file(&self, prefix: &str, suffix: &str, ctx: &Ctx) -> Result<String, FsError> {
        let out = self.ok(scripts::TEMP_FILE, &[prefix, suffix], vec![], ctx).await?;
        let p = text(out).trim_end().to_string();
        self.temps.lock().unwrap().insert(p.clone());
        Ok(p)
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
        if let Some(why) = self.lost() {
            return Err(ExecError::new(ExecCode::Unknown, why));
        }
        let mut argv = vec![
            "sh".to_string(),
            "-c".into(),
            scripts::OUTER.into(),
            "agentbox-cmd".into(),
            scripts::COMMAND.into(),
        ];
        match &command {
            Command::Argv(a) if a.is_empty() || a[0].is_empty() => {
                return Err(ExecError::new(ExecCode::SpawnError, "Empty argv: no program to run"));
            }
            Command::Argv(a) => {
                argv.push("argv".into());
                argv.push(absolute(&self.cwd, opts.cwd.as_deref().unwrap_or(".")));
                argv.extend(a.iter().cloned());
            }
            Command::Shell(s) => {
                argv.push("shell".into());
                argv.push(absolute(&self.cwd, opts.cwd.as_deref().unwrap_or(".")));
                argv.push(s.clone());
            }
        }
        let cwd = argv[6].clone();
        let mut env = BTreeMap::new();
        for (k, v) in &opts.env {
            if k == "PATH" {
                env.insert("AGENTBOX_CALLER_PATH".to_string(), v.clone());
            } else {
                env.insert(k.clone(), v.clone());
            }
        }
        if opts.inherit_env == Some(false) {
            env.insert("AGENTBOX_NOINHERIT".into(), "1".into());
            let keep: Vec<&str> = opts.env.keys().filter(|k| *k != "PATH").map(String::as_str).collect();
            env.insert("AGENTBOX_KEEP".into(), keep.join(" "));
        }
        let start_ctx = ctx.with_timeout(START_TIMEOUT);
        // The program runs under its own control below, not the start's deadline.
        let mut p = match self
            .sandbox
            .exec(&argv, &BoxExecOptions { cwd: None, env }, &Ctx::background())
            .await
        {
            Ok(p) => p,
            Err(e) if e.code() == ErrorCode::Gone => {
                let why = self.mark_lost(format!("box {} is gone: {e}", self.sandbox.id()));
                return Err(ExecError {
                    cause: Some(e),
                    ..ExecError::new(ExecCode::Unknown, why)
                });
            }
            Err(e) if e.code() == ErrorCode::NotFound => {
                return Err(ExecError::new(
                    ExecCode::SpawnError,
                    format!("the box cannot start commands (it needs setsid): {e}"),
                ));
            }
            Err(e) => {
                return Err(ExecError {
                    cause: Some(e.clone()),
                    ..ExecError::new(ExecCode::SpawnError, e.to_string())
                });
            }
        };
        drop(p.stdin.take()); // no input: the command reads EOF
        let mut stdout = p
            .stdout
            .take()
            .ok_or_else(|| ExecError::new(ExecCode::Unknown, "no stdout"))?;
        let mut header = Vec::new();
        let read_header = async {
            let mut b = [0u8; 1];
            while header.len() < 64 {
                match stdout.read(&mut b).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) if b[0] == b'\n' => break,
                    Ok(_) => header.push(b[0]),
                }
            }
        };
        if start_ctx.run(read_header).await.is_err() {
            let _ = p.kill().await;
            let why = self.mark_lost(format!(
                "box {} stopped answering: a command did not start within {}s",
                self.sandbox.id(),
                START_TIMEOUT.as_secs()
            ));
            return Err(ExecError::new(
                if ctx.err().is_some() {
                    ExecCode::Aborted
                } else {
                    ExecCode::Unknown
                },
                why,
            ));
        }
        let line = String::from_utf8_lossy(&header).into_owned();
        let pgid: u32 = match line.strip_prefix("\0agentbox-cmd ") {
            Some("nocwd") => {
                return Err(ExecError::new(
                    ExecCode::SpawnError,
                    format!("Working directory does not exist: {cwd}"),
                ));
            }
            Some("noprog") => {
                return Err(ExecError::new(
                    ExecCode::SpawnError,
                    format!(
                        "{}: program not found",
                        match &command {
                            Command::Argv(a) => a[0].clone(),
                            Command::Shell(_) => String::new(),
                        }
                    ),
                ));
            }
            Some("noshell") => {
                return Err(ExecError::new(
                    ExecCode::ShellUnavailable,
                    "the box has neither bash nor sh",
                ));
            }
            Some(g) => g
                .parse()
                .map_err(|_| ExecError::new(ExecCode::Unknown, format!("unexpected header {line:?}")))?,
            None => {
                let status = p.wait().await;
                if !matches!(
                    self.sandbox.status(&Ctx::background()).await,
                    Ok(agentbox_core::Status::Running)
                ) {
                    let why = self.mark_lost(format!("box {} is gone", self.sandbox.id()));
                    return Err(ExecError::new(ExecCode::Unknown, why));
                }
                return Err(ExecError::new(
                    ExecCode::SpawnError,
                    format!("the command did not start ({status:?})"),
                ));
            }
        };
        self.groups.lock().unwrap().insert(pgid);
        let stderr = p.stderr.take();
        let wait = async {
            p.wait()
                .await
                .map(|st| st.code)
                .map_err(|e| ExecError::new(ExecCode::Unknown, e.to_string()))
        };
        let ran = run_command(self, Some(stdout), stderr, wait, &opts, ctx).await;
        match ran {
            Ok(Ran::Exited(outcome)) => {
                self.groups.lock().unwrap().remove(&pgid);
                Ok(outcome)
            }
            Err(e) => {
                self.groups.lock().unwrap().remove(&pgid);
                Err(e)
            }
            Ok(Ran::Stopped { code, drain }) => {
                let confirmed = self.stop_group(pgid).await;
                // What the command printed as it was asked to end still reaches on_output.
                let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
                let what = stopped_message(code);
                if confirmed {
                    Err(ExecError::new(code, what))
                } else {
                    Err(ExecError {
                        kill_unconfirmed: true,
                        ..ExecError::new(
                            code,
                            format!("{what}, and its process group {pgid} could not be confirmed gone within 10s"),
                        )
                    })
                }
            }
        }
    }

    async fn cleanup(&self, ctx: &Ctx) -> Result<(), FsError> {
        for g in self.tracked_groups() {
            self.stop_group(g).await;
        }
        let temps: Vec<String> = std::mem::take(&mut *self.temps.lock().unwrap()).into_iter().collect();
        if !temps.is_empty() && self.lost().is_none() {
            let args: Vec<&str> = temps.iter().map(String::as_str).collect();
            self.ok(scripts::REMOVE_ALL, &args, vec![], ctx).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gnu_messages_map_to_codes() {
        assert_eq!(code_of("cat: x: No such file or directory"), FsCode::NotFound);
        assert_eq!(
            code_of("stat: cannot statx 'f/x': Not a directory"),
            FsCode::NotDirectory
        );
        assert_eq!(code_of("rm: cannot remove 'd': Is a directory"), FsCode::IsDirectory);
        assert_eq!(
            code_of("mv: cannot overwrite directory 'd' with non-directory"),
            FsCode::IsDirectory
        );
        assert_eq!(
            code_of("mv: cannot overwrite non-directory 'f' with directory 'd2'"),
            FsCode::NotDirectory
        );
        assert_eq!(code_of("tee: x: Permission denied"), FsCode::PermissionDenied);
        assert_eq!(
            code_of("mkdir: cannot create directory 'f': File exists"),
            FsCode::Unknown
        );
        assert_eq!(code_of("agentbox:too_large 99"), FsCode::NotSupported);
    }

    #[test]
    fn stat_lines_and_times_parse() {
        let i = parse_info("/w/a|b", "regular file|3|1796013729.906").unwrap();
        assert_eq!(
            (i.kind, i.size, i.mtime_ms, i.name.as_str()),
            (FileKind::File, 3, 1_796_013_729_906, "a|b")
        );
        assert_eq!(seconds_to_ms("5.1"), 5100);
        assert_eq!(seconds_to_ms("7"), 7000);
        assert_eq!(
            parse_info("/x", "directory|4096|1.000").unwrap().kind,
            FileKind::Directory
        );
    }
}

//! `HostEnv`: the reference `ExecutionEnv`, on this machine.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentbox_core::Ctx;
use async_trait::async_trait;

use crate::output::{Ran, run_command, stopped_message};
use crate::path::{absolute, base_name};
use crate::watch::{Seen, Watcher, excluded};
use crate::*;

/// The PATH a command gets when it inherits no environment and names none.
pub(crate) const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// This machine's file system and shell, rooted at a working directory.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use agentbox_core::Ctx;
/// use agentbox_hands::{Command, ExecOptions, ExecutionEnv, HostEnv};
/// let env = HostEnv::new("/tmp")?;
/// env.write_file("notes/a.txt", b"hello", &Ctx::background()).await?;
/// let done = env.exec(Command::Shell("wc -c notes/a.txt".into()), ExecOptions::default(), &Ctx::background()).await?;
/// assert_eq!(done.exit_code, 0);
/// # Ok(()) }
/// ```
pub struct HostEnv {
    cwd: String,
    temps: Mutex<BTreeSet<String>>,
    groups: Arc<Mutex<BTreeSet<i32>>>,
    max_reader_bytes: u64,
    group_hook: Option<GroupHook>,
}

/// Told of each command's process group: `(pgid, true)` once it started, `(pgid, false)` once
/// it ended. What a durable run writes down, so the next generation can end the programs of
/// a holder that lost its claim.
pub type GroupHook = Arc<dyn Fn(i32, bool) + Send + Sync>;

impl HostEnv {
    /// An environment whose cwd is `cwd` (absolute).
    pub fn new(cwd: impl Into<String>) -> Result<Self, FsError> {
        let cwd = cwd.into();
        if !cwd.starts_with('/') {
            return Err(FsError::new(
                FsCode::Invalid,
                &cwd,
                format!("cwd {cwd:?} must be absolute"),
            ));
        }
        Ok(HostEnv {
            cwd: crate::path::normalize(&cwd),
            temps: Mutex::new(BTreeSet::new()),
            groups: Arc::new(Mutex::new(BTreeSet::new())),
            max_reader_bytes: MAX_READER_BYTES,
            group_hook: None,
        })
    }

    /// The same, telling `hook` of each command's process group as it starts and ends.
    pub fn with_group_hook(mut self, hook: GroupHook) -> Self {
        self.group_hook = Some(hook);
        self
    }

    /// The same, with another reader bound.
    pub fn with_max_reader_bytes(mut self, max: u64) -> Self {
        self.max_reader_bytes = max;
        self
    }

    fn p(&self, path: &str) -> Result<String, FsError> {
        if path.contains('\0') {
            return Err(FsError::new(FsCode::Invalid, path, "a path holds a NUL byte"));
        }
        Ok(absolute(&self.cwd, path))
    }
}

fn aborted(path: &str) -> FsError {
    FsError::new(
        FsCode::Aborted,
        path,
        "the operation was cancelled or its deadline passed",
    )
}

async fn fs<T>(
    ctx: &Ctx,
    path: &str,
    fut: impl std::future::Future<Output = std::io::Result<T>>,
) -> Result<T, FsError> {
    match ctx.run(fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(FsError::from_io(&e, path)),
        Err(_) => Err(aborted(path)),
    }
}

/// An lstat as a [`FileInfo`].
pub(crate) fn info_of(path: &str, m: &std::fs::Metadata) -> FileInfo {
    let kind = if m.file_type().is_symlink() {
        FileKind::Symlink
    } else if m.is_dir() {
        FileKind::Directory
    } else {
        FileKind::File
    };
    FileInfo {
        name: base_name(path),
        path: path.to_string(),
        kind,
        size: m.len(),
        mtime_ms: m.mtime() * 1000 + m.mtime_nsec() / 1_000_000,
    }
}

/// Six random letters and digits from the kernel (`getrandom`), for a temporary's name; the
/// kernel's failure is an error naming the path, never a predictable name.
pub(crate) fn random_suffix(path: &str) -> Result<String, FsError> {
    let mut b = [0u8; 6];
    getrandom::fill(&mut b).map_err(|e| {
        FsError::new(
            FsCode::Unknown,
            path,
            format!("{path}: the kernel gave no random bytes: {e}"),
        )
    })?;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    Ok(b.iter()
        .map(|x| ALPHABET[*x as usize % ALPHABET.len()] as char)
        .collect())
}

#[async_trait]
impl ExecutionEnv for HostEnv {
    fn id(&self) -> String {
        "host".into()
    }

    fn cwd(&self) -> String {
        self.cwd.clone()
    }

    async fn read_text_file(&self, path: &str, ctx: &Ctx) -> Result<String, FsError> {
        let p = self.p(path)?;
        let b = fs(ctx, &p, tokio::fs::read(&p)).await?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }

    async fn read_text_lines(&self, path: &str, max_lines: Option<usize>, ctx: &Ctx) -> Result<Vec<String>, FsError> {
        let text = self.read_text_file(path, ctx).await?;
        Ok(crate::path_lines(&text, max_lines))
    }

    async fn read_binary_file(&self, path: &str, ctx: &Ctx) -> Result<Vec<u8>, FsError> {
        let p = self.p(path)?;
        fs(ctx, &p, tokio::fs::read(&p)).await
    }

    async fn open_binary_reader(&self, path: &str, no_follow: bool, ctx: &Ctx) -> Result<BinaryReader, FsError> {
        let p = self.p(path)?;
        let lmeta = fs(ctx, &p, tokio::fs::symlink_metadata(&p)).await?;
        if no_follow && lmeta.file_type().is_symlink() {
            return Err(FsError::new(
                FsCode::Invalid,
                &p,
                format!("Refusing to follow a symbolic link: {p}"),
            ));
        }
        let meta = fs(ctx, &p, tokio::fs::metadata(&p)).await?;
        if meta.is_dir() {
            return Err(FsError::new(FsCode::IsDirectory, &p, format!("{p}: Is a directory")));
        }
        if meta.len() > self.max_reader_bytes {
            return Err(FsError::new(
                FsCode::NotSupported,
                &p,
                format!(
                    "{p}: {} bytes, over the reader's {} bytes",
                    meta.len(),
                    self.max_reader_bytes
                ),
            ));
        }
        let data = fs(ctx, &p, tokio::fs::read(&p)).await?;
        Ok(BinaryReader::new(info_of(&p, &lmeta), data))
    }

    async fn write_file(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<(), FsError> {
        let p = self.p(path)?;
        if let Some(parent) = std::path::Path::new(&p).parent() {
            // A parent that cannot be made shows as the open's own error below.
            let _ = tokio::fs::create_dir_all(parent).await;
        }
        fs(ctx, &p, tokio::fs::write(&p, data)).await
    }

    async fn append_file(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<(), FsError> {
        use tokio::io::AsyncWriteExt;
        let p = self.p(path)?;
        if let Some(parent) = std::path::Path::new(&p).parent() {
            let _ = tokio::fs::create_dir_all(parent).await;
        }
        fs(ctx, &p, async {
            let mut f = tokio::fs::OpenOptions::new().append(true).create(true).open(&p).await?;
            f.write_all(data).await?;
            f.flush().await
        })
        .await
    }

    async fn truncate_file(&self, path: &str, size: u64, ctx: &Ctx) -> Result<(), FsError> {
        let p = self.p(path)?;
        fs(ctx, &p, async {
            let f = tokio::fs::OpenOptions::new().write(true).open(&p).await?;
            f.set_len(size).await
        })
        .await
    }

    async fn flush_file(&self, path: &str, ctx: &Ctx) -> Result<(), FsError> {
        let p = self.p(path)?;
        fs(ctx, &p, async { tokio::fs::File::open(&p).await?.sync_all().await }).await
    }

    async fn rename_file(&self, src: &str, dst: &str, ctx: &Ctx) -> Result<(), FsError> {
        let (s, d) = (self.p(src)?, self.p(dst)?);
        fs(ctx, &s, tokio::fs::rename(&s, &d)).await
    }

    async fn file_info(&self, path: &str, ctx: &Ctx) -> Result<FileInfo, FsError> {
        let p = self.p(path)?;
        let m = fs(ctx, &p, tokio::fs::symlink_metadata(&p)).await?;
        Ok(info_of(&p, &m))
    }

    async fn list_dir(&self, path: &str, ctx: &Ctx) -> Result<Vec<FileInfo>, FsError> {
        let p = self.p(path)?;
        let mut out = fs(ctx, &p, async {
            let mut rd = tokio::fs::read_dir(&p).await?;
            let mut out = Vec::new();
            while let Some(e) = rd.next_entry().await? {
                let name = e.file_name().to_string_lossy().into_owned();
                let full = crate::path::join(&[&p, &name]);
                if let Ok(m) = tokio::fs::symlink_metadata(e.path()).await {
                    let mut i = info_of(&full, &m);
                    i.name = name;
                    out.push(i);
                }
            }
            Ok(out)
        })
        .await?;
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn canonical_path(&self, path: &str, ctx: &Ctx) -> Result<String, FsError> {
        let p = self.p(path)?;
        let c = fs(ctx, &p, tokio::fs::canonicalize(&p)).await?;
        Ok(c.to_string_lossy().into_owned())
    }

    async fn read_link(&self, path: &str, ctx: &Ctx) -> Result<String, FsError> {
        let p = self.p(path)?;
        let t = fs(ctx, &p, tokio::fs::read_link(&p)).await?;
        Ok(t.to_string_lossy().into_owned())
    }

    async fn exists(&self, path: &str, ctx: &Ctx) -> Result<bool, FsError> {
        let p = self.p(path)?;
        match fs(ctx, &p, tokio::fs::symlink_metadata(&p)).await {
            Ok(_) => Ok(true),
            Err(e) if matches!(e.code, FsCode::NotFound | FsCode::NotDirectory) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn create_dir(&self, path: &str, recursive: bool, ctx: &Ctx) -> Result<(), FsError> {
        let p = self.p(path)?;
        if recursive {
            fs(ctx, &p, tokio::fs::create_dir_all(&p)).await
        } else {
            fs(ctx, &p, tokio::fs::create_dir(&p)).await
        }
    }

    async fn remove(&self, path: &str, recursive: bool, force: bool, ctx: &Ctx) -> Result<(), FsError> {
        let p = self.p(path)?;
        let m = match fs(ctx, &p, tokio::fs::symlink_metadata(&p)).await {
            Ok(m) => m,
            Err(e) if force && matches!(e.code, FsCode::NotFound | FsCode::NotDirectory) => return Ok(()),
            Err(e) => return Err(e),
        };
        if m.is_dir() {
            if !recursive {
                return Err(FsError::new(FsCode::IsDirectory, &p, format!("{p}: Is a directory")));
            }
            fs(ctx, &p, tokio::fs::remove_dir_all(&p)).await
        } else {
            fs(ctx, &p, tokio::fs::remove_file(&p)).await
        }
    }

    async fn create_temp_dir(&self, prefix: &str, ctx: &Ctx) -> Result<String, FsError> {
        let base = std::env::temp_dir().to_string_lossy().into_owned();
        for _ in 0..16 {
            let p = crate::path::join(&[&base, &format!("{prefix}{}", random_suffix(&base)?)]);
            match fs(ctx, &p, tokio::fs::create_dir(&p)).await {
                Ok(()) => {
                    self.temps.lock().unwrap().insert(p.clone());
                    return Ok(p);
                }
                Err(e) if e.code == FsCode::Unknown => continue,
                Err(e) => return Err(e),
            }
        }
        Err(FsError::new(FsCode::Unknown, base, "no free temporary name"))
    }

    async fn create_temp_file(&self, prefix: &str, suffix: &str, ctx: &Ctx) -> Result<String, FsError> {
        let base = std::env::temp_dir().to_string_lossy().into_owned();
        for _ in 0..16 {
            let p = crate::path::join(&[&base, &format!("{prefix}{}{suffix}", random_suffix(&base)?)]);
            let made = fs(
                ctx,
                &p,
                tokio::fs::OpenOptions::new().write(true).create_new(true).open(&p),
            )
            .await;
            match made {
                Ok(_) => {
                    self.temps.lock().unwrap().insert(p.clone());
                    return Ok(p);
                }
                Err(e) if e.code == FsCode::Unknown => continue,
                Err(e) => return Err(e),
            }
        }
        Err(FsError::new(FsCode::Unknown, base, "no free temporary name"))
    }

    async fn watch(
        &self,
        targets: Vec<WatchTarget>,
        on_change: Arc<dyn Fn(Change) + Send + Sync>,
        _ctx: &Ctx,
    ) -> Result<Watcher, FsError> {
        let targets = crate::watch::absolute_targets(&self.cwd, targets);
        let snapshot: crate::watch::Snapshot = Arc::new(move || {
            let targets = targets.clone();
            Box::pin(async move {
                tokio::task::spawn_blocking(move || Some(host_snapshot(&targets)))
                    .await
                    .ok()
                    .flatten()
            })
        });
        Ok(Watcher::start(snapshot, Duration::from_millis(250), on_change))
    }

    async fn exec(&self, command: Command, opts: ExecOptions, ctx: &Ctx) -> Result<ExecOutcome, ExecError> {
        let (program, args): (String, Vec<String>) = match &command {
            Command::Argv(a) if a.is_empty() || a[0].is_empty() => {
                return Err(ExecError::new(ExecCode::SpawnError, "Empty argv: no program to run"));
            }
            Command::Argv(a) => (a[0].clone(), a[1..].to_vec()),
            Command::Shell(s) => {
                let shell = ["/bin/bash", "/usr/bin/bash", "/bin/sh"]
                    .into_iter()
                    .find(|p| std::path::Path::new(p).exists())
                    .ok_or_else(|| ExecError::new(ExecCode::ShellUnavailable, "no bash or sh on this machine"))?;
                (shell.to_string(), vec!["-c".into(), s.clone()])
            }
        };
        let cwd = absolute(&self.cwd, opts.cwd.as_deref().unwrap_or("."));
        if !std::path::Path::new(&cwd).is_dir() {
            return Err(ExecError::new(
                ExecCode::SpawnError,
                format!("Working directory does not exist: {cwd}"),
            ));
        }
        let mut cmd = tokio::process::Command::new(&program);
        cmd.args(&args).current_dir(&cwd).process_group(0).kill_on_drop(false);
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if opts.inherit_env == Some(false) {
            cmd.env_clear();
            if !opts.env.contains_key("PATH") {
                cmd.env("PATH", DEFAULT_PATH);
            }
        }
        cmd.envs(&opts.env);
        let mut child = cmd
            .spawn()
            .map_err(|e| ExecError::new(ExecCode::SpawnError, format!("{program}: {e}")))?;
        let pgid = child.id().map(|p| p as i32).unwrap_or(0);
        self.groups.lock().unwrap().insert(pgid);
        if let Some(hook) = &self.group_hook {
            hook(pgid, true);
        }
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let wait = async {
            use std::os::unix::process::ExitStatusExt;
            let status = child
                .wait()
                .await
                .map_err(|e| ExecError::new(ExecCode::Unknown, e.to_string()))?;
            Ok(status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(-1))
        };
        let ran = run_command(self, stdout, stderr, wait, &opts, ctx).await;
        self.groups.lock().unwrap().remove(&pgid);
        let forget = || {
            if let Some(hook) = &self.group_hook {
                hook(pgid, false);
            }
        };
        match ran? {
            Ran::Exited(outcome) => {
                // A program the command left behind in its group still runs: the group stays
                // written down until it is gone.
                if !group_alive(pgid) {
                    forget();
                }
                Ok(outcome)
            }
            Ran::Stopped { code, drain } => {
                stop_group(pgid).await;
                forget();
                let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
                // What the command printed as it was asked to end still reaches on_output.
                let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
                Err(ExecError::new(code, stopped_message(code)))
            }
        }
    }

    async fn cleanup(&self, _ctx: &Ctx) -> Result<(), FsError> {
        let groups: Vec<i32> = std::mem::take(&mut *self.groups.lock().unwrap()).into_iter().collect();
        for g in groups {
            stop_group(g).await;
            if let Some(hook) = &self.group_hook {
                hook(g, false);
            }
        }
        let temps: Vec<String> = std::mem::take(&mut *self.temps.lock().unwrap()).into_iter().collect();
        for t in temps {
            let _ = tokio::fs::remove_dir_all(&t).await;
            let _ = tokio::fs::remove_file(&t).await;
        }
        Ok(())
    }

    async fn start(&self, _command: Command, _opts: StartOptions, _ctx: &Ctx) -> Result<u64, ExecError> {
        Err(ExecError::new(ExecCode::SpawnError, HOST_KEEPS_NONE))
    }

    async fn processes(&self, _ctx: &Ctx) -> agentbox_core::Result<Arc<dyn agentbox_core::Processes>> {
        Err(agentbox_core::Error::unsupported(HOST_KEEPS_NONE))
    }
}

/// Why the host refuses background commands: nothing on this machine keeps a command past the
/// call that started it (its process would be this host process's child, gone with it), and a
/// table of them here would not be the box's.
const HOST_KEEPS_NONE: &str =
    "the host environment keeps no processes: a command that runs in the background needs a box with a runner";

/// Whether any process is in group `pgid`.
fn group_alive(pgid: i32) -> bool {
    rustix::process::Pid::from_raw(pgid)
        .filter(|_| pgid > 1)
        .is_some_and(|p| rustix::process::test_kill_process_group(p).is_ok())
}

/// Ask a process group to end, and kill it a second later.
async fn stop_group(pgid: i32) {
    let Some(pid) = rustix::process::Pid::from_raw(pgid).filter(|_| pgid > 1) else {
        return;
    };
    let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::TERM);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
}

fn host_snapshot(targets: &[WatchTarget]) -> Seen {
    let mut seen = Seen::new();
    fn walk(root: &str, dir: &str, depth_left: Option<usize>, exclude: &[String], seen: &mut Seen) {
        let Ok(rd) = std::fs::read_dir(dir) else { return };
        for e in rd.flatten() {
            let p = crate::path::join(&[dir, &e.file_name().to_string_lossy()]);
            if excluded(root, &p, exclude) {
                continue;
            }
            if let Ok(m) = std::fs::symlink_metadata(&p) {
                let i = info_of(&p, &m);
                seen.insert(p.clone(), (i.kind, i.size, i.mtime_ms));
                if i.kind == FileKind::Directory && depth_left != Some(0) {
                    walk(root, &p, depth_left.map(|d| d - 1), exclude, seen);
                }
            }
        }
    }
    for t in targets {
        if let Ok(m) = std::fs::symlink_metadata(&t.path) {
            let i = info_of(&t.path, &m);
            seen.insert(t.path.clone(), (i.kind, i.size, i.mtime_ms));
            if i.kind == FileKind::Directory {
                walk(
                    &t.path,
                    &t.path,
                    if t.recursive { None } else { Some(0) },
                    &t.exclude,
                    &mut seen,
                );
            }
        }
    }
    seen
}

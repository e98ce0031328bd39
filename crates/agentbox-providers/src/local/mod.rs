//! Local boxes: a box is a directory on this machine, with no isolation.
//!
//! For development and tests. Each box is `<root>/boxes/<name>/` holding `record.json` (its
//! id, labels, spec and end time), a private `home/` and `tmp/`, the workspace `work/` where
//! programs start, and the socket of its **supervisor**: a detached process (see
//! `agentbox_runner::supervisor`) that every program of the box descends from. The supervisor
//! ends the box at its lifetime with no call from the host, killing every program, also one
//! that went to the background, called setsid or double-forked, then removes the directory.
//!
//! A program gets a fixed PATH (`/usr/local/bin:/usr/bin:/bin`, or [`LocalOptions::path`]),
//! `HOME` and `TMPDIR` inside the box, the spec's env and the exec's own variables, and
//! nothing of the host's environment.
//!
//! ```no_run
//! # async fn f() -> agentbox_core::Result<()> {
//! use std::time::Duration;
//! use agentbox_core::{finish, Ctx, ExecOptions, FinishOptions, Provider, Spec};
//! use agentbox_providers::{LocalOptions, LocalProvider};
//!
//! let provider = LocalProvider::new(LocalOptions::from_env()?)?;
//! let ctx = Ctx::background();
//! let b = provider.create(&Spec::new(Duration::from_secs(600)), &ctx).await?;
//! let p = b.exec(&["uname".into(), "-a".into()], &ExecOptions::default(), &ctx).await?;
//! println!("{}", finish(p, FinishOptions::default()).await?.stdout_text());
//! b.destroy(&ctx).await?;
//! # Ok(()) }
//! ```

mod lifecycle;
mod options;
mod process;
mod record;
mod sandbox;

pub use options::LocalOptions;
pub use sandbox::LocalSandbox;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{
    Ctx, Error, ErrorCode, Honours, Labels, Lifecycle, Provider, Result, Sandbox, SandboxId, Spec, check_spec, now_ms,
};
use agentbox_protocol::supervisor::{READY_PREFIX, Reply, Request, SOCKET_NAME};
use async_trait::async_trait;
use tokio::io::AsyncBufReadExt;

use crate::boxdir;
use crate::random::random_hex;
use crate::runner::{Address, RunnerSandbox};
use record::Record;

/// The provider's name and id prefix.
pub const NAME: &str = "local";

/// The PATH programs get unless [`LocalOptions::path`] says otherwise.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

pub use crate::home::{HOME_ENV, default_home};

/// The runner's socket in a box's directory.
const RUNNER_SOCKET: &str = "runner.sock";

/// How long a supervisor may take to say it serves.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Makes local boxes. See the [module documentation](self).
pub struct LocalProvider {
    opts: LocalOptions,
    boxes: PathBuf,
}

impl LocalProvider {
    /// A provider over `opts.root`, whose `boxes/` directory is made (mode 0700) if missing.
    pub fn new(opts: LocalOptions) -> Result<Self> {
        if opts.path.contains('\0') {
            return Err(Error::invalid("local path: holds a NUL byte"));
        }
        let boxes = crate::boxdir::make_boxes_dir(&opts.root, "boxes")?;
        Ok(LocalProvider { opts, boxes })
    }

    /// The directory boxes live in.
    pub fn boxes_dir(&self) -> &Path {
        &self.boxes
    }

    /// The box in `dir`: through its runner when it has one, whose runner is started again if
    /// it no longer answers (its processes then are gone with it).
    async fn sandbox(&self, dir: PathBuf, record: Record, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let (has_runner, asleep) = (record.runner, record.asleep);
        let local: Arc<dyn Sandbox> = Arc::new(LocalSandbox::new(dir.clone(), record, self.opts.path.clone()));
        if asleep {
            return Ok(crate::lifecycle::Asleep::new(local));
        }
        if !has_runner {
            return Ok(local);
        }
        let sock = dir.join(RUNNER_SOCKET);
        let b = RunnerSandbox::new(local.clone(), Arc::new(Address::Unix(sock.clone())));
        if b.check(ctx).await.is_err() {
            let mut program = vec![self.opts.supervisor.program.to_string_lossy().into_owned()];
            program.extend(self.opts.supervisor.args.iter().cloned());
            let started = crate::runner::start(
                local.as_ref(),
                &program,
                &[format!("unix:{}", sock.display())],
                None,
                ctx,
            )
            .await;
            match started {
                Ok(_) => b.check(ctx).await?,
                Err(e) => crate::runner::joined(&b, e, ctx).await?,
            }
        }
        Ok(Arc::new(b))
    }

    /// Read the record of `name`, handing back only a box that still runs. A box whose
    /// supervisor is gone is swept.
    fn find(&self, name: &str) -> Result<Option<(PathBuf, Record)>> {
        let dir = self.boxes.join(name);
        let record = match Record::read(&dir) {
            Ok(Some(r)) => r,
            Ok(None) => {
                sweep_if_orphan(&dir);
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        if record.supervisor_alive() {
            if record.ends_at_ms > now_ms() {
                return Ok(Some((dir, record)));
            }
            // Past its lifetime and still ending: not handed back, and the supervisor removes it.
            return Ok(None);
        }
        let _ = std::fs::remove_dir_all(&dir);
        Ok(None)
    }

    /// Refuse what a local box cannot be.
    fn check(&self, spec: &Spec) -> Result<()> {
        match &spec.network {
            Some(agentbox_core::Network::Allow(_)) => {
                return Err(Error::unsupported(
                    "spec.network: a local box cannot enforce an allowlist: its programs share this \
                     machine's network, so a program that ignores HTTP_PROXY would reach anything \
                     (a namespace box can)",
                ));
            }
            Some(agentbox_core::Network::None) => {
                return Err(Error::unsupported(
                    "spec.network: a local box cannot be cut off: its programs share this machine's \
                     network (a namespace or Docker box can)",
                ));
            }
            _ => {}
        }
        check_spec(spec, &self.honours(), NAME)
    }

    /// Make the box `key` (its directory's name and its id's) from `spec`: opened by `name`
    /// where it has one, its workspace and home copied from `seed` (a snapshot's directory or
    /// another box's) where given. `mkdir` of its directory fails for a key that exists, so
    /// two makes of one name never both succeed.
    async fn make(
        &self,
        key: &str,
        name: Option<&str>,
        seed: Option<&Path>,
        spec: &Spec,
        ctx: &Ctx,
    ) -> Result<Arc<dyn Sandbox>> {
        let t0 = std::time::Instant::now();
        ctx.check()?;
        let id = SandboxId::new(NAME, key)?;
        let dir = self.boxes.join(key);
        let mut builder = std::fs::DirBuilder::new();
        builder.mode(0o700);
        builder
            .create(&dir)
            .map_err(|e| Error::io(e, format!("creating {}", dir.display())))?;
        let made = async {
            for sub in ["home", "tmp", "work"] {
                match seed {
                    Some(from) if sub != "tmp" => {
                        // Off the runtime's threads: a box's files may be many.
                        let (src, dst) = (from.join(sub), dir.join(sub));
                        tokio::task::spawn_blocking(move || boxdir::copy_tree(&src, &dst))
                            .await
                            .map_err(|e| Error::unknown(format!("copying the box's {sub}: {e}")))?
                            .map_err(|e| e.context(format!("copying the box's {sub} from {}", from.display())))?;
                    }
                    _ => builder
                        .create(dir.join(sub))
                        .map_err(|e| Error::io(e, format!("creating the box's {sub}")))?,
                }
            }
            let created_at_ms = now_ms();
            let ends_at_ms = created_at_ms.saturating_add(spec.max_lifetime.as_millis() as u64);
            let (supervisor_pid, supervisor_start) = self.start_supervisor(&dir, ends_at_ms, ctx).await?;
            let record = Record {
                id: id.clone(),
                labels: spec.labels.clone(),
                spec: spec.clone(),
                created_at_ms,
                ends_at_ms,
                supervisor_pid,
                supervisor_start,
                runner: self.opts.runner,
                name: name.map(str::to_string),
                asleep: false,
                snapshot: spec.snapshot.clone(),
            };
            record.write(&dir)?;
            Ok::<_, Error>(record)
        }
        .await;
        let made = match made {
            Ok(record) => self.sandbox(dir.clone(), record, ctx).await,
            Err(e) => Err(e),
        };
        match made {
            Ok(b) => {
                tracing::info!(box_id = %b.id(), ms = t0.elapsed().as_millis() as u64, runner = b.facts().runner.is_some(), "created");
                Ok(b)
            }
            Err(e) => {
                // A supervisor that started removes the directory when told to end.
                let _ = ask_supervisor(&dir, Request::Destroy, Duration::from_secs(5)).await;
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    async fn start_supervisor(&self, dir: &Path, ends_at_ms: u64, ctx: &Ctx) -> Result<(i32, u64)> {
        let log_path = dir.join("supervisor.log");
        let log =
            std::fs::File::create(&log_path).map_err(|e| Error::io(e, format!("creating {}", log_path.display())))?;
        let sup = &self.opts.supervisor;
        let mut cmd = tokio::process::Command::new(&sup.program);
        cmd.args(&sup.args)
            .arg("supervise")
            .arg("--dir")
            .arg(dir)
            .arg("--deadline-ms")
            .arg(ends_at_ms.to_string())
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::from(log))
            .kill_on_drop(false);
        let mut child = cmd
            .spawn()
            .map_err(|e| Error::io(e, format!("starting the box supervisor {}", sup.program.display())))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| Error::unknown("the supervisor has no stdout"))?;
        let mut line = String::new();
        let mut reader = tokio::io::BufReader::new(stdout);
        let read = tokio::time::timeout(START_TIMEOUT, reader.read_line(&mut line));
        let outcome = ctx.run(read).await;
        let pid = match outcome {
            Ok(Ok(Ok(_))) => line
                .trim()
                .strip_prefix(READY_PREFIX)
                .and_then(|p| p.parse::<i32>().ok()),
            Ok(Err(_)) => None,
            Ok(Ok(Err(_))) => None,
            Err(e) => {
                let _ = child.start_kill();
                return Err(e);
            }
        };
        let Some(pid) = pid else {
            let _ = child.start_kill();
            let _ = child.wait().await;
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(Error::unknown(format!(
                "the box supervisor did not start within {}s: {}",
                START_TIMEOUT.as_secs(),
                log.trim()
            )));
        };
        // The child handle is dropped here; tokio reaps the supervisor when it exits, and if
        // this process dies first, init does.
        let start = agentbox_proc::stat(pid)
            .map(|s| s.start_time)
            .ok_or_else(|| Error::unknown("the box supervisor ended as it started"))?;
        Ok((pid, start))
    }
}

#[async_trait]
impl Provider for LocalProvider {
    fn name(&self) -> &str {
        NAME
    }

    fn honours(&self) -> Honours {
        Honours {
            isolation: vec!["none".into()],
            // Its programs share this machine's network whatever is asked: host is what it is.
            network_host: true,
            env: true,
            live_processes: true,
            snapshot: true,
            names: true,
            sleep: true,
            extend: true,
            relabel: true,
            snapshots: true,
            fork: true,
            ..Default::default()
        }
    }

    #[tracing::instrument(name = "create", skip_all, fields(provider = NAME))]
    async fn create(&self, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        self.check(spec)?;
        let seed = match &spec.snapshot {
            Some(s) => Some(lifecycle::snapshot_dir(self, s)?),
            None => None,
        };
        self.make(&random_hex(8)?, None, seed.as_deref(), spec, ctx).await
    }

    async fn attach(&self, id: &SandboxId, ctx: &Ctx) -> Result<Option<Arc<dyn Sandbox>>> {
        id.expect_provider(NAME)?;
        ctx.check()?;
        match self.find(id.name())? {
            Some((dir, record)) => Ok(Some(self.sandbox(dir, record, ctx).await?)),
            None => Ok(None),
        }
    }

    async fn list(&self, labels: &Labels, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        ctx.check()?;
        let mut out = Vec::new();
        for name in boxdir::names(&self.boxes)? {
            if let Ok(Some((dir, record))) = self.find(&name)
                && boxdir::labels_match(&record.labels, labels)
            {
                out.push(self.sandbox(dir, record, ctx).await?);
            }
        }
        Ok(out)
    }

    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        Some(self)
    }
}

/// Ask the supervisor of `dir` a control request (destroy, deadline, sleep, wake), within
/// `limit`. A destroy of a supervisor that does not answer is done: it has ended.
async fn ask_supervisor(dir: &Path, req: Request, limit: Duration) -> Result<()> {
    let sock = dir.join(SOCKET_NAME);
    let destroy = req == Request::Destroy;
    let stream = match tokio::net::UnixStream::connect(&sock).await {
        Ok(s) => s,
        Err(_) if destroy => return Ok(()),
        Err(e) => {
            return Err(Error::gone(format!(
                "the box's supervisor does not answer ({e}): it has ended"
            )));
        }
    };
    let (mut rd, mut wr) = stream.into_split();
    let what = format!("{req:?}").to_lowercase();
    let ask = async {
        use tokio::io::AsyncWriteExt;
        let bytes = agentbox_protocol::frame::encode(&req).map_err(|e| Error::unknown(e.to_string()))?;
        wr.write_all(&bytes)
            .await
            .map_err(|e| Error::io(e, format!("asking the supervisor: {what}")))?;
        match crate::frames::read_frame::<Reply>(&mut rd).await {
            Ok(Some(Reply::Ok)) => Ok(()),
            Ok(None) if destroy => Ok(()),
            Ok(None) => Err(Error::gone("the box's supervisor hung up: it has ended")),
            Ok(Some(Reply::Error { code, message })) => Err(Error::new(ErrorCode::from_wire(&code), message)),
            Ok(Some(other)) => Err(Error::unknown(format!("the supervisor answered {other:?} to {what}"))),
            Err(e) => Err(Error::io(e, "reading the supervisor's answer")),
        }
    };
    match tokio::time::timeout(limit, ask).await {
        Ok(r) => r,
        Err(_) => Err(Error::timeout(format!(
            "the box's supervisor did not answer {what} within {}s",
            limit.as_secs()
        ))),
    }
}

/// Remove a box directory that has no record and no live supervisor, once it is old enough
/// not to be a create under way.
fn sweep_if_orphan(dir: &Path) {
    if boxdir::is_old(dir) && !dir.join(SOCKET_NAME).exists() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

//! The runner client: a [`Sandbox`] whose commands and files go through the runner in the box
//! (`agentbox-runner`), one connection carrying them all. Providers start a runner in their
//! boxes on request and hand back a [`RunnerSandbox`] over the box they made: its lifetime,
//! status, endpoints and end stay the box's own; every exec is one message, every file
//! operation one message ([`agentbox_core::Files`]), and a dropped connection loses nothing.
//! The runner keeps the box's processes ([`agentbox_core::Processes`]): a terminal, a program
//! that outlives its caller, a deadline kept in the box, and any host process may list, read
//! and attach to them.
//!
//! ```no_run
//! # async fn f(inner: std::sync::Arc<dyn agentbox_core::Sandbox>) -> agentbox_core::Result<()> {
//! use std::sync::Arc;
//! use agentbox_core::{Ctx, Sandbox};
//! use agentbox_providers::runner::{Address, RunnerSandbox};
//! let addr = Address::Unix("/path/to/box/runner.sock".into());
//! let b = RunnerSandbox::new(inner, Arc::new(addr));
//! let p = b.exec(&["true".to_string()], &Default::default(), &Ctx::background()).await?;
//! # Ok(()) }
//! ```

mod client;
mod link;

use std::sync::Arc;

use agentbox_core::{
    Ctx, Endpoint, Error, ErrorCode, ExecOptions, Facts, FileError, Files, FinishOptions, Labels, Process, Result,
    Sandbox, SandboxId, Status, finish,
};
use async_trait::async_trait;

pub use client::{Client, REQUEST_TIMEOUT, drop_connections};
pub use link::{Address, Dial, Link, Relay};
#[cfg(feature = "vendor-runner")]
pub(crate) use link::{websocket as websocket_link, ws_config};

/// Where a runner started in a box listens, as it announced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Announced {
    /// Its TCP addresses (`0.0.0.0:7700`).
    pub tcp: Vec<String>,
    /// Its unix sockets' paths, in the box.
    pub unix: Vec<String>,
    /// Its pid in the box.
    pub pid: Option<u32>,
}

/// After [`start`] failed with `e`: where the runner's address was taken by another host
/// process starting the same box's runner at once (two opens of one name, an attach while the
/// box is made), wait up to five seconds for that runner to answer `r`; else `e`.
#[cfg(any(feature = "local", feature = "docker"))]
pub(crate) async fn joined(r: &RunnerSandbox, e: Error, ctx: &Ctx) -> Result<()> {
    if !e.message().contains("already listens") {
        return Err(e);
    }
    for _ in 0..50 {
        if r.check(ctx).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Err(e)
}

/// Start a runner in `inner`: `program args… --detach` (with the token on stdin when given),
/// which returns once the runner listens. The runner's cwd and environment are those of any
/// exec in the box, so its programs see what the box's own execs see.
pub async fn start(
    inner: &dyn Sandbox,
    program: &[String],
    listen: &[String],
    token: Option<&str>,
    ctx: &Ctx,
) -> Result<Announced> {
    let mut argv = program.to_vec();
    argv.push("serve".into());
    for l in listen {
        argv.push("--listen".into());
        argv.push(l.clone());
    }
    if token.is_some() {
        argv.push("--token-stdin".into());
    }
    argv.push("--detach".into());
    let p = inner
        .exec(
            &argv,
            &ExecOptions::default(),
            &ctx.with_timeout(std::time::Duration::from_secs(30)),
        )
        .await?;
    let stdin = token.map(|t| format!("{t}\n").into_bytes()).unwrap_or_default();
    let out = finish(
        p,
        FinishOptions {
            stdin,
            max_output: 64 << 10,
        },
    )
    .await?;
    if out.status.code != 0 {
        return Err(Error::unknown(format!(
            "the runner did not start in box {} (exit {}): {}",
            inner.id(),
            out.status.code,
            out.stderr_text().trim()
        )));
    }
    Announced::read(&out.stdout_text()).ok_or_else(|| {
        Error::unknown(format!(
            "the runner in box {} did not say it was ready: {:?}",
            inner.id(),
            out.stdout_text()
        ))
    })
}

impl Announced {
    /// What a runner started with `--detach` printed: its addresses and its pid; `None` where
    /// it never said it was ready.
    pub fn read(stdout: &str) -> Option<Announced> {
        let mut a = Announced::default();
        for line in stdout.lines() {
            if let Some(l) = line.strip_prefix("listening unix:") {
                a.unix.push(l.to_string());
            } else if let Some(l) = line.strip_prefix("listening ") {
                a.tcp.push(l.to_string());
            } else if let Some(p) = line.strip_prefix("ready ") {
                a.pid = p.trim().parse().ok();
            }
        }
        a.pid.is_some().then_some(a)
    }
}

/// A box whose commands and files go through its runner. See the [module documentation](self).
pub struct RunnerSandbox {
    inner: Arc<dyn Sandbox>,
    client: Arc<Client>,
    facts: Facts,
}

impl RunnerSandbox {
    /// Over `inner`, whose runner `dial` reaches. Nothing is opened until the first call.
    pub fn new(inner: Arc<dyn Sandbox>, dial: Arc<dyn Dial>) -> Self {
        let mut facts = inner.facts().clone();
        facts.runner = Some(dial.describe());
        let client = Client::new(dial);
        client.set_deadline(facts.ends_at_ms);
        RunnerSandbox { inner, client, facts }
    }

    /// Over `inner`, through a `client` the caller shares with it (a box whose own exec,
    /// upload and download already go through the same runner).
    pub fn with_client(inner: Arc<dyn Sandbox>, client: Arc<Client>) -> Self {
        let mut facts = inner.facts().clone();
        facts.runner = Some(client.describe());
        client.set_deadline(facts.ends_at_ms);
        RunnerSandbox { inner, client, facts }
    }

    /// The box under the runner.
    pub fn inner(&self) -> &Arc<dyn Sandbox> {
        &self.inner
    }

    /// The runner's client (for tests of a dropped connection, and ranged reads).
    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    async fn running(&self, ctx: &Ctx) -> bool {
        matches!(self.inner.status(ctx).await, Ok(Status::Running))
    }

    /// Whether the runner answers (a first connection is opened if there is none).
    pub async fn check(&self, ctx: &Ctx) -> Result<()> {
        self.client.connect(ctx).await?;
        if self.client.protocol_2_only() {
            return self.client.ping_protocol_2(ctx).await;
        }
        self.client
            .stat(".", false, ctx)
            .await
            .map(|_| ())
            .map_err(|e| match e {
                FileError::Box(e) => e,
                FileError::Os(n) => Error::unknown(format!(
                    "the runner's workspace: {}",
                    std::io::Error::from_raw_os_error(n)
                )),
            })
    }

    /// A failure of the runner as the caller should read it: a box that ended is `gone`.
    async fn lost(&self, e: Error, _ctx: &Ctx) -> Error {
        if matches!(e.code(), ErrorCode::Gone | ErrorCode::Aborted) {
            return e;
        }
        // Asked with a context of its own: a call whose deadline passed on a box that vanished
        // (its address then answers nothing) still learns the box has ended.
        let probe = Ctx::background().with_timeout(std::time::Duration::from_secs(10));
        match self.inner.status(&probe).await {
            Ok(Status::Ended) => Error::gone(format!("box {}: it has ended ({e})", self.id())),
            // A handle taken before the box slept: its runner is gone with its programs.
            Ok(Status::Sleeping) => crate::lifecycle::asleep_error(self.id()),
            _ => e,
        }
    }

    /// A download through a runner of protocol 2: one `read` of the whole file, which has no
    /// size to ask first. A file the runner cannot send in one message (or cannot read) goes by
    /// the box's own download, which bounds it.
    async fn download_whole(&self, path: &str, max_bytes: u64, ctx: &Ctx) -> Result<Vec<u8>> {
        match self.client.read(path, ctx).await {
            Ok(Some(b)) if b.len() as u64 <= max_bytes => Ok(b),
            Ok(Some(b)) => Err(Error::too_large(format!(
                "{path}: {} bytes, over the {max_bytes}-byte bound",
                b.len()
            ))),
            Ok(None) => Err(Error::not_found(format!("{path}: no such file"))),
            Err(FileError::Box(e)) if e.code() == ErrorCode::Gone => Err(e),
            Err(e) => {
                tracing::debug!(box_id = %self.id(), path, error = ?e, "the runner did not read the file: the box's own download instead");
                self.inner.download(path, max_bytes, ctx).await
            }
        }
    }

    async fn box_error(&self, e: FileError, path: &str, ctx: &Ctx) -> Error {
        match e {
            FileError::Box(e) => self.lost(e, ctx).await,
            FileError::Os(n) => Error::io(std::io::Error::from_raw_os_error(n), path),
        }
    }
}

#[async_trait]
impl Sandbox for RunnerSandbox {
    fn id(&self) -> &SandboxId {
        self.inner.id()
    }

    fn facts(&self) -> &Facts {
        &self.facts
    }

    fn labels(&self) -> &Labels {
        self.inner.labels()
    }

    async fn exec(&self, argv: &[String], opts: &ExecOptions, ctx: &Ctx) -> Result<Process> {
        // The program alone: its arguments and environment may hold what a log must not.
        tracing::debug!(box_id = %self.id(), program = argv.first().map(String::as_str).unwrap_or(""), "exec");
        opts.validate(argv)?;
        match self.client.exec(argv, opts, ctx).await {
            Ok(p) => Ok(p),
            // Its own refusals stand; anything else may be the box's end.
            Err(e)
                if matches!(
                    e.code(),
                    ErrorCode::NotFound | ErrorCode::PermissionDenied | ErrorCode::Invalid | ErrorCode::Aborted
                ) && self.running(ctx).await =>
            {
                Err(e)
            }
            Err(e) => Err(self.lost(e, ctx).await),
        }
    }

    async fn status(&self, ctx: &Ctx) -> Result<Status> {
        self.inner.status(ctx).await
    }

    async fn upload(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<()> {
        if data.len() as u64 > MAX_ONE_MESSAGE {
            return self.inner.upload(path, data, ctx).await;
        }
        match self.client.write(path, data, false, ctx).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.box_error(e, path, ctx).await),
        }
    }

    async fn download(&self, path: &str, max_bytes: u64, ctx: &Ctx) -> Result<Vec<u8>> {
        // Which protocol the runner speaks is known once it was reached.
        if let Err(e) = self.client.connect(ctx).await {
            return Err(self.lost(e, ctx).await);
        }
        if self.client.protocol_2_only() {
            return self.download_whole(path, max_bytes, ctx).await;
        }
        let m = match self.client.stat(path, true, ctx).await {
            Ok(m) => m,
            Err(e) => return Err(self.box_error(e, path, ctx).await),
        };
        if m.kind == agentbox_core::FileType::Dir {
            return Err(Error::invalid(format!("{path}: is a directory")));
        }
        if m.size > max_bytes {
            return Err(Error::too_large(format!(
                "{path}: {} bytes, over the {max_bytes}-byte bound",
                m.size
            )));
        }
        if m.size > MAX_ONE_MESSAGE {
            return self.inner.download(path, max_bytes, ctx).await;
        }
        let read = match self.client.read(path, ctx).await {
            Ok(r) => r,
            Err(e) => return Err(self.box_error(e, path, ctx).await),
        };
        match read {
            Some(b) if b.len() as u64 <= max_bytes => Ok(b),
            Some(_) => Err(Error::too_large(format!(
                "{path}: grew over the {max_bytes}-byte bound"
            ))),
            None => Err(Error::not_found(format!("{path}: no such file"))),
        }
    }

    async fn endpoint(&self, port: u16, ctx: &Ctx) -> Result<Endpoint> {
        self.inner.endpoint(port, ctx).await
    }

    async fn destroy(&self, ctx: &Ctx) -> Result<()> {
        self.inner.destroy(ctx).await?;
        // Every later call through this handle is `gone` at once, not a wait on an address
        // that no longer answers.
        self.client.close(format!("box {}: it was destroyed", self.id())).await;
        Ok(())
    }

    fn files(&self) -> Option<&dyn Files> {
        // A runner of protocol 2 reads and writes whole files only: the box's exec serves the
        // rest, as on a box with no runner.
        (!self.client.protocol_2_only()).then_some(self.client.as_ref() as &dyn Files)
    }

    fn processes(&self) -> Option<&dyn agentbox_core::Processes> {
        // Nothing of a runner of protocol 2 outlives its connection.
        (!self.client.protocol_2_only()).then_some(self.client.as_ref() as &dyn agentbox_core::Processes)
    }

    async fn net_refusals(&self, max: usize, ctx: &Ctx) -> Result<Vec<agentbox_core::NetRefusal>> {
        self.inner.net_refusals(max, ctx).await
    }
}

/// Files up to this size move in one message; larger ones by the box's own upload and download.
const MAX_ONE_MESSAGE: u64 = 8 << 20;

//! One namespace box, reached through its runner's unix socket.
//!
//! Every command goes through the runner (it is the box's only way in: the host never starts a
//! program in the box's namespaces itself), and so do uploads and downloads, in pieces for
//! large files. The host never touches the box's files by their host paths either: a box
//! could have put a symlink there, and the host would follow it with the host's authority.
//! With `runner_files`, the hands' file operations are runner messages too
//! ([`RunnerSandbox`]); without it they are programs in the box, the way a box with no runner
//! is served.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{
    Ctx, Endpoint, Error, ErrorCode, ExecOptions, Facts, FileError, Files, Labels, Process, Result, Sandbox, SandboxId,
    Status, now_ms,
};
use agentbox_protocol::namespace::SOCKET;
use async_trait::async_trait;

use super::{Record, remove_ended};
use crate::lifecycle::asleep_error;
use crate::runner::{Address, Client, RunnerSandbox};

/// Pieces of a large upload or download, one message each.
const PIECE: u64 = 4 << 20;

/// How long a destroy waits for the init to be gone.
const END_TIMEOUT: Duration = Duration::from_secs(5);

/// The box in `dir`, through its runner's file operations when its record says so.
pub(super) fn open(dir: PathBuf, record: Record) -> Arc<dyn Sandbox> {
    let dial = Arc::new(Address::Unix(dir.join("run").join(SOCKET)));
    let client = Client::new(dial.clone());
    let runner_files = record.runner_files;
    let mut facts = record.facts.clone();
    facts.runner = Some(crate::runner::Dial::describe(dial.as_ref()));
    let b: Arc<dyn Sandbox> = Arc::new(NamespaceSandbox {
        dir,
        record,
        facts,
        client: client.clone(),
    });
    if runner_files {
        Arc::new(RunnerSandbox::with_client(b, client))
    } else {
        b
    }
}

/// A namespace box. See the [module documentation](super).
pub struct NamespaceSandbox {
    dir: PathBuf,
    record: Record,
    facts: Facts,
    client: Arc<Client>,
}

impl NamespaceSandbox {
    /// The box's record as it is now (extend, sleep and wake change it after this handle was
    /// made), while it is still this box's.
    fn now(&self) -> Option<Record> {
        Record::read(&self.dir)
            .ok()
            .flatten()
            .filter(|r| r.same_box(&self.record))
    }

    fn running(&self) -> bool {
        self.now().is_some_and(|r| r.ends_at_ms > now_ms() && r.init_alive())
    }

    fn gone(&self) -> Error {
        Error::gone(format!("box {}: it has ended", self.record.id))
    }

    /// Awake and running; a sleeping box refuses, an ended one is gone.
    fn ensure_running(&self) -> Result<()> {
        match self.now() {
            Some(r) if r.ends_at_ms > now_ms() && r.init_alive() => {
                if r.asleep {
                    Err(asleep_error(&self.record.id))
                } else {
                    Ok(())
                }
            }
            _ => Err(self.gone()),
        }
    }

    fn file_error(&self, e: FileError, path: &str) -> Error {
        match e {
            FileError::Box(e) if !self.running() => Error::gone(format!("box {}: it has ended ({e})", self.record.id)),
            FileError::Box(e) => e,
            FileError::Os(n) => Error::io(std::io::Error::from_raw_os_error(n), path),
        }
    }
}

#[async_trait]
impl Sandbox for NamespaceSandbox {
    fn id(&self) -> &SandboxId {
        &self.record.id
    }

    fn facts(&self) -> &Facts {
        &self.facts
    }

    fn labels(&self) -> &Labels {
        &self.record.labels
    }

    async fn exec(&self, argv: &[String], opts: &ExecOptions, ctx: &Ctx) -> Result<Process> {
        // The program alone: its arguments and environment may hold what a log must not.
        tracing::debug!(box_id = %self.id(), program = argv.first().map(String::as_str).unwrap_or(""), "exec");
        opts.validate(argv)?;
        ctx.check()?;
        self.ensure_running()?;
        match self.client.exec(argv, opts, ctx).await {
            Ok(p) => Ok(p),
            Err(e) if e.code() == ErrorCode::Aborted => Err(e),
            // The box may have ended, or slept, under the call.
            Err(e) => Err(self.ensure_running().err().unwrap_or(e)),
        }
    }

    async fn status(&self, ctx: &Ctx) -> Result<Status> {
        ctx.check()?;
        Ok(match self.now() {
            Some(r) if r.ends_at_ms > now_ms() && r.init_alive() => {
                if r.asleep {
                    Status::Sleeping
                } else {
                    Status::Running
                }
            }
            _ => Status::Ended,
        })
    }

    async fn upload(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<()> {
        ctx.check()?;
        self.ensure_running()?;
        if let Some(parent) = std::path::Path::new(path).parent().and_then(|p| p.to_str())
            && !parent.is_empty()
        {
            self.client
                .mkdir(parent, true, ctx)
                .await
                .map_err(|e| self.file_error(e, parent))?;
        }
        if data.is_empty() {
            return self
                .client
                .write(path, data, false, ctx)
                .await
                .map_err(|e| self.file_error(e, path));
        }
        for (i, piece) in data.chunks(PIECE as usize).enumerate() {
            self.client
                .write(path, piece, i > 0, ctx)
                .await
                .map_err(|e| self.file_error(e, path))?;
        }
        Ok(())
    }

    async fn download(&self, path: &str, max_bytes: u64, ctx: &Ctx) -> Result<Vec<u8>> {
        ctx.check()?;
        self.ensure_running()?;
        let meta = self
            .client
            .stat(path, true, ctx)
            .await
            .map_err(|e| self.file_error(e, path))?;
        if meta.kind == agentbox_core::FileType::Dir {
            return Err(Error::invalid(format!("{path}: is a directory")));
        }
        if meta.size > max_bytes {
            return Err(Error::too_large(format!(
                "{path}: {} bytes, over the {max_bytes}-byte bound",
                meta.size
            )));
        }
        let mut out = Vec::with_capacity(meta.size as usize);
        loop {
            let piece = self
                .client
                .read_range(path, out.len() as u64, PIECE, ctx)
                .await
                .map_err(|e| self.file_error(e, path))?
                .ok_or_else(|| Error::not_found(format!("{path}: no such file")))?;
            let n = piece.len() as u64;
            out.extend_from_slice(&piece);
            if out.len() as u64 > max_bytes {
                return Err(Error::too_large(format!(
                    "{path}: grew over the {max_bytes}-byte bound"
                )));
            }
            if n < PIECE {
                return Ok(out);
            }
        }
    }

    async fn endpoint(&self, port: u16, ctx: &Ctx) -> Result<Endpoint> {
        ctx.check()?;
        self.ensure_running()?;
        if port == 0 {
            return Err(Error::invalid("endpoint: port 0 is not a port"));
        }
        if self.facts.network == Some(agentbox_core::NetworkFact::None) {
            return Err(Error::unsupported(format!(
                "endpoint {port}: box {} has no network",
                self.record.id
            )));
        }
        if self.facts.network != Some(agentbox_core::NetworkFact::Host) {
            // A network of its own: only a port asked for, through its keeper's listener.
            return match self.record.ports.get(&port) {
                Some(&host_port) => Ok(Endpoint {
                    host: "127.0.0.1".into(),
                    port: host_port,
                    url: None,
                }),
                None => Err(Error::unsupported(format!(
                    "box {}: port {port} was not asked for (spec.ports), and the box's network is its own",
                    self.record.id
                ))),
            };
        }
        // The box shares this machine's network: its listener is on this machine.
        Ok(Endpoint {
            host: "127.0.0.1".into(),
            port,
            url: None,
        })
    }

    async fn destroy(&self, ctx: &Ctx) -> Result<()> {
        tracing::info!(box_id = %self.id(), "destroying");
        ctx.check()?;
        if self.record.init_alive()
            && let Some(pid) = rustix::process::Pid::from_raw(self.record.init_pid)
        {
            // Pid 1 of the box's pid namespace: its end is the end of every program in it.
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        let t = tokio::time::Instant::now();
        while self.record.init_alive() {
            if t.elapsed() > END_TIMEOUT {
                return Err(Error::unknown(format!("box {}: its init did not end", self.record.id)));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        self.client
            .close(format!("box {}: it was destroyed", self.record.id))
            .await;
        remove_ended(&self.dir, &self.record);
        Ok(())
    }

    async fn net_refusals(&self, max: usize, ctx: &Ctx) -> Result<Vec<agentbox_core::NetRefusal>> {
        ctx.check()?;
        let log = self.dir.join(agentbox_protocol::namespace::EGRESS_LOG);
        crate::egress::refusals(
            super::proxied(self.record.spec.network.as_ref()),
            log,
            max,
            self.id().as_str(),
        )
        .await
    }

    fn files(&self) -> Option<&dyn Files> {
        None
    }
}

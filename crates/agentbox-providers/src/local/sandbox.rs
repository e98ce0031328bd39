//! A local box: a directory of this machine and a supervisor process that ends it at its
//! lifetime, with programs run as this user (nothing is isolated).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentbox_core::{
    Ctx, Endpoint, Error, ExecOptions, Facts, Labels, NetworkFact, Process, Result, Sandbox, SandboxId, Status, now_ms,
};
use agentbox_protocol::supervisor::{Request, SOCKET_NAME};
use async_trait::async_trait;

use super::record::Record;
use super::{NAME, ask_supervisor, process};

/// One local box.
pub struct LocalSandbox {
    dir: PathBuf,
    record: Record,
    facts: Facts,
    path: String,
}

impl LocalSandbox {
    pub(super) fn new(dir: PathBuf, record: Record, path: String) -> Self {
        let facts = Facts {
            provider: NAME.into(),
            isolation: "none".into(),
            network: Some(NetworkFact::Host),
            started_at_ms: Some(record.created_at_ms),
            ends_at_ms: Some(record.ends_at_ms),
            live_processes: true,
            name: record.name.clone(),
            sleep: Some("files".into()),
            sleep_clock: Some("counting".into()),
            snapshot: record.snapshot.clone(),
            secrets_via: Some("fd".into()),
            workspace: Some(dir.join("work").to_string_lossy().into_owned()),
            ..Default::default()
        };
        LocalSandbox {
            dir,
            record,
            facts,
            path,
        }
    }

    fn workspace(&self) -> PathBuf {
        self.dir.join("work")
    }

    fn running(&self) -> bool {
        self.record.ends_at_ms > now_ms() && self.record.supervisor_alive()
    }

    fn ensure_running(&self) -> Result<()> {
        if self.running() {
            Ok(())
        } else {
            Err(Error::gone(format!("box {}: it has ended", self.record.id)))
        }
    }

    /// A path in the box: absolute as given, relative from the workspace.
    fn resolve(&self, path: &str) -> Result<PathBuf> {
        if path.is_empty() || path.contains('\0') {
            return Err(Error::invalid(format!("path {path:?}: must be non-empty with no NUL")));
        }
        let p = Path::new(path);
        Ok(if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.workspace().join(p)
        })
    }

    fn env_for(&self, opts: &ExecOptions) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        env.insert("PATH".to_string(), self.path.clone());
        env.insert("HOME".into(), self.dir.join("home").to_string_lossy().into_owned());
        env.insert("TMPDIR".into(), self.dir.join("tmp").to_string_lossy().into_owned());
        env.extend(self.record.spec.env.clone());
        env.extend(opts.env.clone());
        env
    }
}

#[async_trait]
impl Sandbox for LocalSandbox {
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
        opts.refuse(
            false,
            false,
            false,
            "a local box made without its runner keeps no processes (make it with the runner, the default)",
        )?;
        ctx.check()?;
        self.ensure_running()?;
        let cwd = match &opts.cwd {
            Some(c) => self.resolve(c)?,
            None => self.workspace(),
        };
        let req = Request::Exec {
            argv: argv.to_vec(),
            env: self.env_for(opts),
            cwd: cwd.to_string_lossy().into_owned(),
        };
        process::start(&self.dir.join(SOCKET_NAME), req, ctx)
            .await
            .map_err(|e| {
                if self.running() {
                    e
                } else {
                    Error::gone(format!("box {}: it has ended", self.record.id))
                }
            })
    }

    async fn status(&self, ctx: &Ctx) -> Result<Status> {
        ctx.check()?;
        Ok(if self.running() { Status::Running } else { Status::Ended })
    }

    async fn upload(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<()> {
        ctx.check()?;
        self.ensure_running()?;
        let p = self.resolve(path)?;
        if let Some(parent) = p.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| Error::io(e, format!("creating {}", parent.display())))?;
        }
        ctx.run_result(async {
            tokio::fs::write(&p, data)
                .await
                .map_err(|e| Error::io(e, format!("writing {}", p.display())))
        })
        .await
    }

    async fn download(&self, path: &str, max_bytes: u64, ctx: &Ctx) -> Result<Vec<u8>> {
        ctx.check()?;
        self.ensure_running()?;
        let p = self.resolve(path)?;
        let meta = tokio::fs::metadata(&p)
            .await
            .map_err(|e| Error::io(e, format!("reading {}", p.display())))?;
        if meta.is_dir() {
            return Err(Error::invalid(format!("{}: is a directory", p.display())));
        }
        if meta.len() > max_bytes {
            return Err(Error::too_large(format!(
                "{}: {} bytes, over the {max_bytes}-byte bound",
                p.display(),
                meta.len()
            )));
        }
        ctx.run_result(async {
            use tokio::io::AsyncReadExt;
            let f = tokio::fs::File::open(&p)
                .await
                .map_err(|e| Error::io(e, format!("reading {}", p.display())))?;
            let mut buf = Vec::with_capacity(meta.len() as usize);
            // Bounded again while reading: the file may grow after the check.
            f.take(max_bytes + 1)
                .read_to_end(&mut buf)
                .await
                .map_err(|e| Error::io(e, format!("reading {}", p.display())))?;
            if buf.len() as u64 > max_bytes {
                return Err(Error::too_large(format!(
                    "{}: grew over the {max_bytes}-byte bound",
                    p.display()
                )));
            }
            Ok(buf)
        })
        .await
    }

    async fn endpoint(&self, port: u16, ctx: &Ctx) -> Result<Endpoint> {
        ctx.check()?;
        self.ensure_running()?;
        if port == 0 {
            return Err(Error::invalid("endpoint: port 0 is not a port"));
        }
        // No isolation: a program of the box listens on this machine itself.
        Ok(Endpoint {
            host: "127.0.0.1".into(),
            port,
            url: None,
        })
    }

    async fn destroy(&self, ctx: &Ctx) -> Result<()> {
        tracing::info!(box_id = %self.id(), "destroying");
        let limit = ctx.remaining().unwrap_or(DESTROY_TIMEOUT).min(DESTROY_TIMEOUT);
        ctx.run_result(ask_supervisor(&self.dir, Request::Destroy, limit))
            .await?;
        // The supervisor answers, then exits: give it a moment to be gone.
        let t = tokio::time::Instant::now();
        while self.record.supervisor_alive() {
            if t.elapsed() > Duration::from_secs(5) {
                return Err(Error::unknown(format!(
                    "box {}: its supervisor did not end",
                    self.record.id
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

/// How long a destroy may take when the caller's context has no deadline.
const DESTROY_TIMEOUT: Duration = Duration::from_secs(30);

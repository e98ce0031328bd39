//! What a case is given ([`Cx`]): the provider under test, wrapped so every box and snapshot it
//! makes is ended when the case ends, and the helpers the cases share.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentbox_core::{
    Ctx, ExecOptions, FinishOptions, Finished, Honours, Labels, Lifecycle, Process, Provider, Sandbox, SandboxId, Spec,
    Status, finish,
};
use async_trait::async_trait;
use tokio::io::AsyncBufReadExt;

use super::{CaseResult, Options, Suite};

/// What a case is given: the provider under test and the suite's options. Its providers
/// write down every box they make, so the suite ends each box when the case ends, however
/// it ends (passed, failed on any line, panicked, out of time): no case ends its own boxes.
pub(super) struct Cx {
    pub(super) suite: Arc<Suite>,
    pub(super) provider: Arc<dyn Provider>,
    pub(super) made: Made,
    /// The snapshots the case took, deleted when it ends.
    pub(super) snapshots: Arc<Mutex<Vec<String>>>,
}

/// The boxes a case made.
type Made = Arc<Mutex<Vec<Arc<dyn Sandbox>>>>;

/// The provider under test, writing down each box it makes.
struct Tracked {
    pub(super) inner: Arc<dyn Provider>,
    pub(super) made: Made,
}

/// The label every box of one run carries, valued with the run's tag.
pub(super) const TAG_LABEL: &str = "agentbox-conformance";

pub(super) fn unique_tag() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("c{}-{}", std::process::id(), nanos % 1_000_000_000)
}

pub(super) fn argv(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// A script that prints the state letter of pid $1, or nothing when it does not exist.
const STATE_OF: &str = "sed -n 's/.*) \\(.\\).*/\\1/p' /proc/$1/stat 2>/dev/null";

/// Starts three programs that leave the exec in three ways (background, setsid, double fork),
/// each appending its own pid to `pids`.
const SCATTER: &str = "
sh -c 'echo $$ >> pids; exec sleep 1000' >/dev/null 2>&1 &
setsid sh -c 'echo $$ >> pids; exec sleep 1000' >/dev/null 2>&1 &
( sh -c 'echo $$ >> pids; exec sleep 1000' >/dev/null 2>&1 & ) &
i=0; while [ \"$(wc -l < pids 2>/dev/null || echo 0)\" -lt 3 ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
cat pids
";

impl Cx {
    /// Whether the provider declares live processes.
    pub(super) fn live(&self) -> bool {
        self.suite.honours.live_processes
    }

    pub(super) fn spec(&self) -> Spec {
        let mut s = self.options().base.clone();
        s.labels.insert(TAG_LABEL.into(), self.suite.tag.clone());
        s
    }

    pub(super) async fn create(&self, spec: &Spec) -> Result<Arc<dyn Sandbox>, String> {
        let ctx = Ctx::background().with_timeout(Duration::from_secs(120));
        self.provider
            .create(spec, &ctx)
            .await
            .map_err(|e| format!("create: {e}"))
    }

    /// A new box of the suite's spec (ended by the suite when the case ends).
    pub(super) async fn new_box(&self) -> Result<Arc<dyn Sandbox>, String> {
        self.create(&self.spec()).await
    }

    pub(super) async fn sh(&self, b: &dyn Sandbox, script: &str) -> Result<Finished, String> {
        self.run_opts(b, &["sh", "-c", script], &ExecOptions::default(), Vec::new())
            .await
    }

    pub(super) async fn run_opts(
        &self,
        b: &dyn Sandbox,
        args: &[&str],
        opts: &ExecOptions,
        stdin: Vec<u8>,
    ) -> Result<Finished, String> {
        let ctx = Ctx::background().with_timeout(Duration::from_secs(90));
        let p = b
            .exec(&argv(args), opts, &ctx)
            .await
            .map_err(|e| format!("exec {args:?}: {e}"))?;
        finish(
            p,
            FinishOptions {
                stdin,
                max_output: 64 << 20,
            },
        )
        .await
        .map_err(|e| format!("finish {args:?}: {e}"))
    }

    pub(super) async fn alive_in_box(&self, b: &dyn Sandbox, pid: u32) -> Result<bool, String> {
        let out = self
            .run_opts(
                b,
                &["sh", "-c", STATE_OF, "sh", &pid.to_string()],
                &ExecOptions::default(),
                vec![],
            )
            .await?;
        let state = out.stdout_text().trim().to_string();
        Ok(!state.is_empty() && state != "Z" && state != "X")
    }

    /// Start `sh -c 'echo $$; exec sleep 30'` and read its pid.
    pub(super) async fn start_sleeper(&self, b: &dyn Sandbox, ctx: &Ctx) -> Result<(Process, u32), String> {
        let mut p = b
            .exec(
                &argv(&["sh", "-c", "echo $$; exec sleep 30"]),
                &ExecOptions::default(),
                ctx,
            )
            .await
            .map_err(|e| format!("exec: {e}"))?;
        let mut out = tokio::io::BufReader::new(p.stdout.take().ok_or("no stdout")?);
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(20), out.read_line(&mut line))
            .await
            .map_err(|_| "the sleeper printed no pid")?
            .map_err(|e| e.to_string())?;
        let pid = line
            .trim()
            .parse()
            .map_err(|_| format!("the sleeper printed {line:?}"))?;
        Ok((p, pid))
    }

    pub(super) async fn gone_soon(&self, b: &dyn Sandbox, pid: u32) -> CaseResult {
        for _ in 0..100 {
            if !self.alive_in_box(b, pid).await? {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!("program {pid} still runs 10s after its context ended"))
    }

    pub(super) async fn scatter(&self, b: &dyn Sandbox) -> Result<Vec<u32>, String> {
        let out = self.sh(b, SCATTER).await?;
        let pids: Vec<u32> = out
            .stdout_text()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        ensure!(
            pids.len() == 3,
            "the scattered programs reported {:?} ({})",
            out.stdout_text(),
            out.stderr_text()
        );
        for &pid in &pids {
            ensure!(
                self.alive_in_box(b, pid).await?,
                "scattered program {pid} is not running"
            );
        }
        Ok(pids)
    }
}

impl Cx {
    pub(super) fn new(suite: Arc<Suite>) -> Self {
        let made = Made::default();
        Cx {
            provider: Arc::new(Tracked {
                inner: suite.provider.clone(),
                made: made.clone(),
            }),
            made,
            suite,
            snapshots: Arc::default(),
        }
    }

    pub(super) fn options(&self) -> &Options {
        &self.suite.options
    }

    /// A fresh provider, as a new process would have (its boxes written down too).
    pub(super) async fn fresh(&self) -> Arc<dyn Provider> {
        Arc::new(Tracked {
            inner: (self.suite.make)().await,
            made: self.made.clone(),
        })
    }

    /// End every box the case made that has not ended; what went wrong doing so.
    pub(super) async fn end_boxes(&self) -> Vec<String> {
        let made = std::mem::take(&mut *self.made.lock().unwrap_or_else(|e| e.into_inner()));
        let mut errors = Vec::new();
        let snapshots = std::mem::take(&mut *self.snapshots.lock().unwrap_or_else(|e| e.into_inner()));
        for name in snapshots {
            let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
            if let Err(e) = self.suite.provider.delete_snapshot(&name, &ctx).await {
                errors.push(format!("delete of snapshot {name} after the case: {e}"));
            }
        }
        for b in made {
            let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
            if matches!(b.status(&ctx).await, Ok(Status::Ended)) {
                continue;
            }
            if let Err(e) = b.destroy(&ctx).await {
                errors.push(format!("destroy of {} after the case: {e}", b.id()));
            }
        }
        errors
    }
}

#[async_trait]
impl Provider for Tracked {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn honours(&self) -> Honours {
        self.inner.honours()
    }
    async fn create(&self, spec: &Spec, ctx: &Ctx) -> agentbox_core::Result<Arc<dyn Sandbox>> {
        let b = self.inner.create(spec, ctx).await?;
        self.made.lock().unwrap_or_else(|e| e.into_inner()).push(b.clone());
        Ok(b)
    }
    async fn attach(&self, id: &SandboxId, ctx: &Ctx) -> agentbox_core::Result<Option<Arc<dyn Sandbox>>> {
        self.inner.attach(id, ctx).await
    }
    async fn list(&self, labels: &Labels, ctx: &Ctx) -> agentbox_core::Result<Vec<Arc<dyn Sandbox>>> {
        self.inner.list(labels, ctx).await
    }

    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        Some(self)
    }
}

#[async_trait]
impl Lifecycle for Tracked {
    async fn open(&self, name: &str, spec: &Spec, ctx: &Ctx) -> agentbox_core::Result<Arc<dyn Sandbox>> {
        let b = self.inner.open(name, spec, ctx).await?;
        self.note(&b);
        Ok(b)
    }

    async fn discard(&self, name: &str, labels: &Labels, ctx: &Ctx) -> agentbox_core::Result<bool> {
        self.inner.discard(name, labels, ctx).await
    }

    async fn sleep(&self, id: &SandboxId, ctx: &Ctx) -> agentbox_core::Result<()> {
        self.inner.sleep(id, ctx).await
    }

    async fn wake(&self, id: &SandboxId, ctx: &Ctx) -> agentbox_core::Result<Arc<dyn Sandbox>> {
        self.inner.wake(id, ctx).await
    }

    async fn extend(&self, id: &SandboxId, ends_at_ms: u64, ctx: &Ctx) -> agentbox_core::Result<Arc<dyn Sandbox>> {
        self.inner.extend(id, ends_at_ms, ctx).await
    }

    async fn relabel(&self, id: &SandboxId, labels: &Labels, ctx: &Ctx) -> agentbox_core::Result<Arc<dyn Sandbox>> {
        self.inner.relabel(id, labels, ctx).await
    }

    async fn snapshot(&self, id: &SandboxId, name: &str, ctx: &Ctx) -> agentbox_core::Result<agentbox_core::Snapshot> {
        self.inner.snapshot(id, name, ctx).await
    }

    async fn snapshots(&self, ctx: &Ctx) -> agentbox_core::Result<Vec<agentbox_core::Snapshot>> {
        self.inner.snapshots(ctx).await
    }

    async fn delete_snapshot(&self, name: &str, ctx: &Ctx) -> agentbox_core::Result<bool> {
        self.inner.delete_snapshot(name, ctx).await
    }

    async fn fork(
        &self,
        id: &SandboxId,
        n: usize,
        spec: &Spec,
        ctx: &Ctx,
    ) -> agentbox_core::Result<Vec<Arc<dyn Sandbox>>> {
        let made = self.inner.fork(id, n, spec, ctx).await?;
        for b in &made {
            self.note(b);
        }
        Ok(made)
    }
}

impl Tracked {
    /// Write down a box made by other means than create (open, fork). A name's box made again
    /// after a discard has the same id: the newest handle is the one kept.
    pub(super) fn note(&self, b: &Arc<dyn Sandbox>) {
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        made.retain(|m| m.id() != b.id());
        made.push(b.clone());
    }
}

//! Runs in a directory: make, open (claim, next generation), release (seal), park, fork, list.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Error, ErrorCode, Result};
use agentbox_transport::Documents;

use crate::lease::Leases;
use crate::moves::{self, MoveRequest};
use crate::record::{Holder, RunRecord, RunStatus, read_status, sync_dir, write_record};
use crate::store::{Journal, RunDocuments, Store};

/// How a run is claimed.
#[derive(Clone)]
pub enum Claim {
    /// On one machine: the run directory's lock, which the kernel drops when the holder dies.
    Local,
    /// Across hosts: a PostgreSQL lease for this long (renew it with [`Run::renew`]).
    Lease(Arc<Leases>, Duration),
}

impl Claim {
    /// `local` or `lease`, for logs.
    fn kind(&self) -> &'static str {
        match self {
            Claim::Local => "local",
            Claim::Lease(..) => "lease",
        }
    }

    /// The store's journal: a lease means hosts share the disk, and WAL's index is memory
    /// only one machine shares.
    fn journal(&self) -> Journal {
        match self {
            Claim::Local => Journal::Wal,
            Claim::Lease(..) => Journal::Rollback,
        }
    }
}

/// The runs under one directory (`<root>/runs/<id>/`).
///
/// ```no_run
/// # async fn f() -> agentbox_core::Result<()> {
/// use agentbox_runs::Runs;
/// let runs = Runs::new("/data");
/// runs.create(Some("r1"))?;
/// let run = runs.open("r1").await?; // generation 1
/// run.store().append("user", &serde_json::json!("hello"))?;
/// run.release().await?; // sealed; the next open is generation 2, here or elsewhere
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Runs {
    root: PathBuf,
    claim: Claim,
    host: String,
    driver: Option<String>,
}

/// A run this process holds.
pub struct Run {
    dir: PathBuf,
    record: RunRecord,
    store: Arc<Store>,
    previous: Option<Holder>,
    /// The holder before never let the run go ([`Run::took_over`]).
    took_over: bool,
    moved: Option<MoveRequest>,
    lock: Option<OwnedFd>,
    lease: Option<(Arc<Leases>, Duration)>,
}

/// Renews a lease while it lives ([`Run::keep_claim`]).
pub struct ClaimKeeper(tokio::task::JoinHandle<()>);

impl Drop for ClaimKeeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// This machine's name.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

fn now_ms() -> u64 {
    use agentbox_core::Clock;
    agentbox_core::SystemClock.now_ms()
}

/// A run id: 1 to 64 letters, digits, `-`, `_` or `.`, not starting with `.`.
pub fn check_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "run id {id:?}: 1 to 64 letters, digits, '-', '_' or '.', not starting with '.'"
        )))
    }
}

/// A new run's id: `run-` and 12 hex digits from the kernel (`getrandom`), whose failure is an
/// error, never a predictable id.
fn random_id() -> Result<String> {
    let mut b = [0u8; 6];
    getrandom::fill(&mut b)
        .map_err(|e| Error::unknown(format!("the kernel gave no random bytes for a run id: {e}")))?;
    Ok(format!(
        "run-{}",
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    ))
}

impl Runs {
    /// Runs under `root`, claimed on this machine.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Runs {
            root: root.into(),
            claim: Claim::Local,
            host: host_name(),
            driver: None,
        }
    }

    /// Runs under `root` (a disk several hosts share), claimed by PostgreSQL leases.
    pub fn with_leases(root: impl Into<PathBuf>, leases: Arc<Leases>, ttl: Duration) -> Self {
        Runs {
            root: root.into(),
            claim: Claim::Lease(leases, ttl),
            host: host_name(),
            driver: None,
        }
    }

    /// Name this host (tests of a hand-off play two hosts on one machine).
    pub fn as_host(mut self, host: &str) -> Self {
        self.host = host.to_string();
        self
    }

    /// Say these runs are opened by a generation driver `driver` started (`local`, `docker`,
    /// `kube`): an open completes a move asked to that driver, and no other.
    pub fn started_by(mut self, driver: &str) -> Self {
        self.driver = Some(driver.to_string());
        self
    }

    /// The directory of run `id`.
    pub fn dir(&self, id: &str) -> PathBuf {
        self.root.join("runs").join(id)
    }

    /// Make a run (a new id when none is given): its directory, workspace and record.
    pub fn create(&self, id: Option<&str>) -> Result<RunRecord> {
        let id = match id {
            Some(id) => id.to_string(),
            None => random_id()?,
        };
        check_id(&id)?;
        let runs = self.root.join("runs");
        std::fs::create_dir_all(&runs).map_err(|e| Error::io(e, format!("making {}", runs.display())))?;
        let dir = self.dir(&id);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(Error::refused(format!("run {id} already exists at {}", dir.display())));
            }
            Err(e) => return Err(Error::io(e, format!("making {}", dir.display()))),
        }
        std::fs::create_dir(dir.join("workspace")).map_err(|e| Error::io(e, "making the workspace"))?;
        let record = RunRecord {
            id,
            status: RunStatus::New,
            generation: 0,
            holder: None,
            parent: None,
            deadline_ms: None,
        };
        write_record(&dir, &record)?;
        sync_dir(&runs)?;
        Ok(record)
    }

    /// Open run `id`: claim it, and hold it as the next generation. A run another holds is
    /// `refused`, naming the holder.
    #[tracing::instrument(name = "run.open", skip(self), fields(claim = self.claim.kind()))]
    pub async fn open(&self, id: &str) -> Result<Run> {
        check_id(id)?;
        let dir = self.dir(id);
        let before = read_status(&dir).map_err(|e| match e.code() {
            ErrorCode::NotFound => Error::not_found(format!("run {id}: no such run under {}", self.root.display())),
            _ => e,
        })?;
        let holder = Holder {
            host: self.host.clone(),
            pid: std::process::id(),
            since_ms: now_ms(),
        };
        let (lock, lease, generation) = match &self.claim {
            Claim::Local => {
                let lock = lock_dir(&dir, &before)?;
                // Read again under the lock: the holder before may have released meanwhile.
                let now = read_status(&dir)?;
                (Some(lock), None, now.generation + 1)
            }
            Claim::Lease(leases, ttl) => {
                let who = format!("pid {} on {}", holder.pid, holder.host);
                let g = leases.claim(id, &who, *ttl).await?;
                (None, Some((leases.clone(), *ttl)), g)
            }
        };
        tracing::debug!(generation, "claimed");
        let before = read_status(&dir)?;
        let store = match Store::take(&dir.join("store.db"), generation, self.claim.journal()) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                // Claimed but not taken: the lease goes back at once rather than when it runs out.
                if let Some((leases, _)) = &lease {
                    let _ = leases.release(id, generation).await;
                }
                return Err(e);
            }
        };
        // The fence is this generation's: no program an earlier holder started in the
        // workspace goes on past it (a holder that died, or whose lease ran out, left them).
        let ended = crate::programs::end_earlier(&dir, generation).await;
        if ended > 0 {
            tracing::warn!(generation, ended, "ended the programs an earlier holder left running");
        }
        // This generation is where a move asked of the last one lands, when it was started by
        // the driver the move named: the request is done.
        let moved = match &self.driver {
            Some(d) => moves::done(&dir, d),
            None => None,
        };
        let record = RunRecord {
            id: id.to_string(),
            status: RunStatus::Open,
            generation,
            holder: Some(holder),
            parent: before.parent.clone(),
            deadline_ms: None,
        };
        write_record(&dir, &record)?;
        if let Some(h) = &record.holder {
            crate::history::opened(&dir, generation, &h.host, h.pid, h.since_ms, self.driver.as_deref());
        }
        tracing::info!(generation, previous = ?before.holder.as_ref().map(|h| h.to_string()), "run opened");
        Ok(Run {
            dir,
            record,
            store,
            took_over: before.status == RunStatus::Open,
            previous: before.holder,
            moved,
            lock,
            lease,
        })
    }

    /// [`Runs::open`], trying again while the run is held (`refused`) until `wait` has passed:
    /// for the next host of a run whose last holder died, whose lease has yet to run out.
    pub async fn open_within(&self, id: &str, wait: Duration) -> Result<Run> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match self.open(id).await {
                Err(e) if e.code() == ErrorCode::Refused && tokio::time::Instant::now() < deadline => {
                    tracing::debug!(run = id, "held; trying again");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                r => return r,
            }
        }
    }

    /// This host's name, as holders record it.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Every run, by id.
    pub fn list(&self) -> Result<Vec<RunRecord>> {
        let runs = self.root.join("runs");
        let entries = match std::fs::read_dir(&runs) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(Error::io(e, format!("listing {}", runs.display()))),
        };
        let mut out: Vec<RunRecord> = entries.flatten().filter_map(|e| read_status(&e.path()).ok()).collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// Parked runs whose deadline has come.
    pub fn due(&self, now_ms: u64) -> Result<Vec<RunRecord>> {
        Ok(self
            .list()?
            .into_iter()
            .filter(|r| r.status == RunStatus::Parked && r.deadline_ms.is_some_and(|d| d <= now_ms))
            .collect())
    }

    /// Fork sealed run `id` into `n` new runs (`<id>.fork-1`…, or the ids given), each with its
    /// parent recorded and its own copy of the store and the workspace, to continue on its own.
    pub fn fork(&self, id: &str, n: usize) -> Result<Vec<String>> {
        check_id(id)?;
        if n == 0 || n > 1000 {
            return Err(Error::invalid(format!("fork: {n} forks: 1 to 1000")));
        }
        let src = self.dir(id);
        let parent = read_status(&src)?;
        if !matches!(parent.status, RunStatus::Sealed | RunStatus::Parked) {
            return Err(Error::refused(format!(
                "fork: run {id} is {:?}: only a sealed run is forked (release it first)",
                parent.status
            )));
        }
        // The parent may be opened meanwhile: hold its lock while copying.
        let _lock = lock_dir(&src, &parent)?;
        let mut made = Vec::new();
        let mut k = 1;
        while made.len() < n {
            let child = format!("{id}.fork-{k}");
            k += 1;
            if self.dir(&child).exists() {
                continue;
            }
            check_id(&child)?;
            let dir = self.dir(&child);
            std::fs::create_dir(&dir).map_err(|e| Error::io(e, format!("making {}", dir.display())))?;
            let copied = (|| {
                if src.join("store.db").exists() {
                    std::fs::copy(src.join("store.db"), dir.join("store.db"))
                        .map_err(|e| Error::io(e, "copying the store"))?;
                }
                copy_tree(&src.join("workspace"), &dir.join("workspace"))?;
                write_record(
                    &dir,
                    &RunRecord {
                        id: child.clone(),
                        status: RunStatus::Sealed,
                        generation: parent.generation,
                        holder: None,
                        parent: Some(id.to_string()),
                        deadline_ms: None,
                    },
                )
            })();
            if let Err(e) = copied {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
            made.push(child);
        }
        sync_dir(&self.root.join("runs"))?;
        Ok(made)
    }
}

/// Take the run directory's lock, or say who holds it.
fn lock_dir(dir: &Path, record: &RunRecord) -> Result<OwnedFd> {
    let path = dir.join("claim.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(e, format!("opening {}", path.display())))?;
    let fd: OwnedFd = f.into();
    // A lock just let go may still be held for a moment by a child this process forked as it
    // held it (a program started between the fork and its exec shares the descriptor): a
    // refusal is only believed once it lasted 100 ms.
    let mut tries = 0;
    let locked = loop {
        match rustix::fs::flock(&fd, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Err(rustix::io::Errno::WOULDBLOCK) if tries < 20 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            r => break r,
        }
    };
    match locked {
        Ok(()) => Ok(fd),
        Err(rustix::io::Errno::WOULDBLOCK) => {
            let who = read_status(dir)
                .ok()
                .and_then(|r| r.holder)
                .or_else(|| record.holder.clone())
                .map(|h| h.to_string())
                .unwrap_or_else(|| "another process".into());
            tracing::debug!(run = %record.id, holder = %who, "claim refused");
            Err(Error::refused(format!("run {}: held by {who}", record.id)))
        }
        Err(e) => Err(Error::io(e.into(), format!("locking {}", path.display()))),
    }
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).map_err(|e| Error::io(e, format!("making {}", to.display())))?;
    let entries = match std::fs::read_dir(from) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(e, format!("listing {}", from.display()))),
    };
    for e in entries {
        let e = e.map_err(|e| Error::io(e, format!("listing {}", from.display())))?;
        let ft = e.file_type().map_err(|e| Error::io(e, "reading a file type"))?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if ft.is_dir() {
            copy_tree(&src, &dst)?;
        } else if ft.is_symlink() {
            let target = std::fs::read_link(&src).map_err(|e| Error::io(e, format!("reading {}", src.display())))?;
            std::os::unix::fs::symlink(target, &dst).map_err(|e| Error::io(e, format!("making {}", dst.display())))?;
        } else if ft.is_file() {
            std::fs::copy(&src, &dst).map_err(|e| Error::io(e, format!("copying {}", src.display())))?;
        }
    }
    Ok(())
}

impl Run {
    /// The run's record as this holder wrote it.
    pub fn record(&self) -> &RunRecord {
        &self.record
    }
    /// The generation this holder is.
    pub fn generation(&self) -> u64 {
        self.record.generation
    }
    /// The run's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// The agent's workspace.
    pub fn workspace(&self) -> PathBuf {
        self.dir.join("workspace")
    }
    /// The host's environment in the run's workspace, its programs written down so that the
    /// next generation ends them if this one loses its claim ([`crate::programs`]).
    pub fn host_env(&self) -> Result<agentbox_hands::HostEnv> {
        let env = agentbox_hands::HostEnv::new(self.workspace().to_string_lossy())
            .map_err(|e| Error::invalid(format!("the run's workspace: {e}")))?;
        Ok(env.with_group_hook(crate::programs::hook(&self.dir, self.record.generation)))
    }

    /// The run's store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }
    /// The session's documents, in the store (each write fenced).
    pub fn documents(&self) -> Arc<dyn Documents> {
        Arc::new(RunDocuments(self.store.clone()))
    }
    /// Who held the run before this generation (for the agent to be told it moved).
    pub fn previous(&self) -> Option<&Holder> {
        self.previous.as_ref()
    }

    /// Whether this generation took the run from a holder that never let it go (it died, or
    /// its lease ran out): what that holder left running in the run's boxes must end before
    /// this generation's first step ([`agentbox_transport::Transport::end_left_programs`], the
    /// transport's session being the run's id). A run let go at a step boundary keeps its
    /// boxes' programs: a program started to outlive its caller outlives a hand-off too.
    pub fn took_over(&self) -> bool {
        self.took_over
    }

    /// The move the last generation let the run go for, which this one completed.
    pub fn moved(&self) -> Option<&MoveRequest> {
        self.moved.as_ref()
    }

    /// A move asked of this holder ([`moves::ask`]), to honour at its next step boundary.
    pub fn move_asked(&self) -> Result<Option<MoveRequest>> {
        moves::asked(&self.dir)
    }

    /// Keep a lease claim alive: renewed every third of its length until the guard is
    /// dropped. A renewal that finds the claim taken is logged and ends the renewals; the
    /// holder's next write then fails `fenced`. A local claim needs none (`None`).
    pub fn keep_claim(&self) -> Option<ClaimKeeper> {
        let (leases, ttl) = self.lease.clone()?;
        let (id, generation) = (self.record.id.clone(), self.record.generation);
        let dir = self.dir.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(ttl / 3).await;
                match leases.renew(&id, generation, ttl).await {
                    Ok(()) => {}
                    Err(e) if e.code() == ErrorCode::Fenced => {
                        tracing::error!(run = %id, generation, "{}", e.message());
                        // Its programs must not change the run's files any more.
                        crate::programs::end(&dir, generation).await;
                        return;
                    }
                    // A renewal that failed otherwise (the server unreachable a moment) is
                    // tried again; the lease's own length is the bound.
                    Err(e) => tracing::warn!(run = %id, generation, "renewing the lease: {e}"),
                }
            }
        });
        Some(ClaimKeeper(task))
    }

    /// Extend a lease claim; a local claim needs none.
    pub async fn renew(&self) -> Result<()> {
        match &self.lease {
            Some((leases, ttl)) => leases.renew(&self.record.id, self.record.generation, *ttl).await,
            None => Ok(()),
        }
    }

    /// Seal the run (store checkpointed and synced, status sealed) and give up the claim.
    pub async fn release(self) -> Result<RunRecord> {
        self.let_go(RunStatus::Sealed, None).await
    }

    /// Release the run until `deadline_ms`, when a supervisor (`agentbox runs supervise`)
    /// starts it again.
    pub async fn park(self, deadline_ms: u64) -> Result<RunRecord> {
        self.let_go(RunStatus::Parked, Some(deadline_ms)).await
    }

    #[tracing::instrument(name = "run.release", skip(self), fields(run = %self.record.id, generation = self.record.generation))]
    async fn let_go(mut self, status: RunStatus, deadline_ms: Option<u64>) -> Result<RunRecord> {
        // A holder that lost its claim writes nothing, its record included: the fence is
        // checked and run.json written as one step, under the store's write lock, so no next
        // generation takes the fence between them (its record would be overwritten).
        // The store is sealed first (checkpointed whole into its file), so a record that says
        // sealed never names a store whose last writes are still in its WAL.
        self.store.fenced(|_| Ok(()))?;
        self.store.seal()?;
        self.record.status = status;
        self.record.deadline_ms = deadline_ms;
        let (dir, record) = (self.dir.clone(), self.record.clone());
        self.store.fenced_with(|| write_record(&dir, &record))?;
        // Told before the claim goes, so the next generation's line comes after it.
        let how = match status {
            RunStatus::Parked => "parked",
            _ => "sealed",
        };
        crate::history::ended(&self.dir, self.record.generation, how, now_ms());
        if let Some((leases, _)) = &self.lease {
            leases.release(&self.record.id, self.record.generation).await?;
        }
        drop(self.lock.take());
        tracing::info!(status = ?self.record.status, "run released");
        Ok(self.record.clone())
    }
}

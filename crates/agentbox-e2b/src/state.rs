//! What the control plane and envd share: the sandboxes (their records, their box, their
//! programs), the scripted faults, the log of requests, and a sandbox's life: its timeout, pause
//! and resume, kill.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Not as _;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentbox_core::{Ctx, Killer, Provider, Sandbox, Stdin};
use axum::body::Bytes;
use serde_json::Value;
use tokio::sync::{broadcast, watch};

use crate::{Ask, Backend, Caller, Made, RecordedRequest};

/// How many requests the log keeps (the oldest let go).
const MAX_RECORDED: usize = 10_000;
/// How long making, sleeping, waking or ending a box may take.
pub(crate) const BOX_TIMEOUT: Duration = Duration::from_secs(30);
/// How long past its end a running sandbox's box may live on its own (this crate ends it at
/// the end; the margin bounds a box whose server died).
const BOX_MARGIN: Duration = Duration::from_secs(120);
/// How long a paused sandbox's box (its files) is kept.
pub(crate) const PAUSED_KEPT: Duration = Duration::from_secs(24 * 3600);
/// How long an output stream is still read once its program exited (a program it left in
/// the background may hold the pipe open).
const OUTPUT_GRACE: Duration = Duration::from_secs(1);
/// How many events a stream may fall behind a program's output before it skips some: each a
/// read of its pipe, at most 32 KiB, held while a client does not read. Fewer lost output a
/// slow client of 16 MiB kept up with (the conformance suite's); backpressure in place of the
/// skip is the fix, not yet made.
const EVENTS_BEHIND: usize = 4096;
/// The most programs one sandbox runs at once through envd.
pub(crate) const MAX_PROCS: usize = 64;
/// How long starting a program may take.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The envd version sandboxes report: close_stdin (0.5.2) and octet-stream uploads (0.5.7),
/// not file metadata (0.6.2).
pub(crate) const ENVD_VERSION: &str = "0.5.7";

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) use agentbox_core::now_ms;

/// RFC 3339 in UTC with milliseconds, as E2B's times.
pub(crate) fn rfc3339(ms: u64) -> String {
    agentbox_core::rfc3339(i64::try_from(ms).unwrap_or(i64::MAX))
}

/// `n` random characters of `alphabet`.
pub(crate) fn random(alphabet: &[u8], n: usize) -> String {
    let mut b = vec![0u8; n];
    let _ = getrandom::fill(&mut b);
    b.iter()
        .map(|x| alphabet[*x as usize % alphabet.len()] as char)
        .collect()
}

/// A sandbox's environment as envd gives its programs one: `E2B_SANDBOX`, `E2B_SANDBOX_ID`
/// and `E2B_TEMPLATE_ID`, then the create's `envVars` over them.
fn env_of(id: &str, a: &Asked) -> BTreeMap<String, String> {
    let mut env = BTreeMap::from([
        ("E2B_SANDBOX".to_string(), "true".to_string()),
        ("E2B_SANDBOX_ID".to_string(), id.to_string()),
        ("E2B_TEMPLATE_ID".to_string(), a.template_id.clone()),
    ]);
    env.extend(a.env.clone());
    env
}

/// A fault scripted by [`crate::E2b::fail_next`].
pub(crate) struct Fault {
    pub(crate) method: String,
    pub(crate) path_prefix: String,
    pub(crate) status: u16,
    pub(crate) message: String,
    pub(crate) left: usize,
}

pub(crate) struct Shared {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) keepalive: Duration,
    pub(crate) max_timeout: Duration,
    pub(crate) list_page_max: usize,
    pub(crate) always_secure: bool,
    /// [`crate::E2bOptions::domain`].
    pub(crate) domain: Option<String>,
    pub(crate) sandboxes: Mutex<BTreeMap<String, Arc<Sbx>>>,
    pub(crate) seq: AtomicU64,
    pub(crate) next_pid: AtomicU32,
    pub(crate) faults: Mutex<Vec<Fault>>,
    pub(crate) requests: Mutex<VecDeque<RecordedRequest>>,
    /// `silence_keepalives`: streams send nothing while true.
    pub(crate) silence: watch::Sender<bool>,
}

impl Shared {
    pub(crate) fn record(&self, method: &str, path: &str, sandbox_id: Option<&str>, user: Option<&str>) {
        let mut r = lock(&self.requests);
        if r.len() >= MAX_RECORDED {
            r.pop_front();
        }
        r.push_back(RecordedRequest {
            method: method.to_string(),
            path: path.to_string(),
            sandbox_id: sandbox_id.filter(|s| !s.is_empty()).map(str::to_string),
            user: user.map(str::to_string),
        });
    }

    /// The scripted fault this request meets, if any (spending one of its count).
    pub(crate) fn fault(&self, method: &str, path: &str) -> Option<(u16, String)> {
        let mut f = lock(&self.faults);
        let i = f.iter().position(|x| {
            (x.method == "*" || x.method.eq_ignore_ascii_case(method)) && path.starts_with(&x.path_prefix)
        })?;
        let hit = (f[i].status, f[i].message.clone());
        f[i].left -= 1;
        if f[i].left == 0 {
            f.remove(i);
        }
        Some(hit)
    }

    pub(crate) fn sandbox(&self, id: &str) -> Option<Arc<Sbx>> {
        lock(&self.sandboxes).get(id).cloned()
    }

    /// Sandbox `id` if `caller` may see it: its own, or any for an admin. Another key's
    /// sandbox is as one that does not exist.
    pub(crate) fn owned(&self, caller: &Caller, id: &str) -> Option<Arc<Sbx>> {
        self.sandbox(id).filter(|x| caller.admin || x.owner == caller.id)
    }

    /// What the backend is asked for sandbox `id`'s box, as `a` asked, its timeout `lifetime`
    /// (the box lives a margin longer).
    pub(crate) fn ask(&self, id: &str, a: &Asked, lifetime: Duration) -> Ask {
        Ask {
            sandbox_id: id.to_string(),
            template: a.template_id.clone(),
            lifetime: lifetime + BOX_MARGIN,
            network: a.box_network.clone(),
            env: env_of(id, a),
        }
    }

    /// Keep a sandbox made: its record, and its supervisor, which ends it `timeout` seconds
    /// from now.
    pub(crate) fn keep(self: &Arc<Self>, id: String, a: Asked, timeout: u64, made: Made) -> Arc<Sbx> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let x = Arc::new(Sbx::new(id.clone(), seq, a, now_ms() + timeout * 1000, made));
        lock(&self.sandboxes).insert(id, x.clone());
        supervise(self.clone(), x.clone());
        x
    }

    /// End a sandbox now: out of the records, its streams cut, its box destroyed by the task
    /// returned (`None`: it was not there).
    pub(crate) fn remove(&self, id: &str) -> Option<tokio::task::JoinHandle<()>> {
        let x = lock(&self.sandboxes).remove(id)?;
        Some(x.end_everything(St::Gone))
    }

    /// End every sandbox's box (the server shuts down), each within [`BOX_TIMEOUT`].
    pub(crate) async fn end_all(&self) {
        let ids: Vec<String> = lock(&self.sandboxes).keys().cloned().collect();
        let ending: Vec<_> = ids.iter().filter_map(|id| self.remove(id)).collect();
        for e in ending {
            let _ = e.await;
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum St {
    Running,
    Paused,
    Gone,
}

impl St {
    pub(crate) fn name(self) -> &'static str {
        match self {
            St::Running => "running",
            St::Paused => "paused",
            St::Gone => "killed",
        }
    }
}

/// What a create asked of a sandbox.
#[derive(Clone)]
pub(crate) struct Asked {
    /// The caller that made it ([`Caller::id`]).
    pub(crate) owner: String,
    pub(crate) template_id: String,
    pub(crate) metadata: BTreeMap<String, String>,
    /// Its box's environment (`envVars`).
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) allow_internet: Option<bool>,
    /// The network config as asked (answered back).
    pub(crate) network: Option<Value>,
    /// The network its box was given.
    pub(crate) box_network: Option<agentbox_core::Network>,
    pub(crate) auto_pause: bool,
    /// envd demands its access token.
    pub(crate) secure: bool,
    /// Its owner's longest lifetime: how long a pause keeps it, at most.
    pub(crate) max_lifetime: Option<Duration>,
}

/// One sandbox.
pub(crate) struct Sbx {
    pub(crate) id: String,
    /// The caller that made it ([`Caller::id`]).
    pub(crate) owner: String,
    pub(crate) seq: u64,
    pub(crate) client_id: String,
    pub(crate) template_id: String,
    pub(crate) alias: Option<String>,
    pub(crate) started_ms: u64,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) env: BTreeMap<String, String>,
    /// envd's access token (`X-Access-Token`), for a secure sandbox.
    pub(crate) token: Option<String>,
    /// The token its ports demand (`e2b-traffic-access-token`), when its network was asked
    /// `allowPublicTraffic: false`.
    pub(crate) traffic_token: Option<String>,
    pub(crate) allow_internet: Option<bool>,
    /// The network config as asked (recorded, answered back).
    pub(crate) network: Option<Value>,
    pub(crate) box_network: Option<agentbox_core::Network>,
    pub(crate) auto_pause: bool,
    pub(crate) max_lifetime: Option<Duration>,
    /// The provider its box is of: its pause is this provider's sleep, its resume the wake.
    pub(crate) provider: Arc<dyn Provider>,
    /// When it ends (ms since the epoch); a change wakes its supervisor.
    pub(crate) end_ms: watch::Sender<u64>,
    pub(crate) state: Mutex<St>,
    pub(crate) boxed: Mutex<Option<Arc<dyn Sandbox>>>,
    /// Lifecycle calls one at a time.
    pub(crate) op: tokio::sync::Mutex<()>,
    pub(crate) procs: Mutex<BTreeMap<u32, Arc<Proc>>>,
    /// Its watchers (the watcher API), by id; each polls until it is dropped.
    pub(crate) watchers: Mutex<BTreeMap<String, crate::watch::Watcher>>,
    /// Bumped to cut every open stream of it mid-way (pause, vanish, kill).
    pub(crate) cut: watch::Sender<u64>,
    /// Its metrics' samples, oldest first (`metrics`).
    pub(crate) samples: Mutex<VecDeque<crate::metrics::Sample>>,
}

impl Sbx {
    /// A sandbox `id` of `made`, as `a` asked, ending at `end_ms`.
    pub(crate) fn new(id: String, seq: u64, a: Asked, end_ms: u64, made: Made) -> Sbx {
        Sbx {
            id,
            owner: a.owner,
            seq,
            client_id: random(b"0123456789abcdef", 8),
            template_id: a.template_id,
            alias: None,
            started_ms: now_ms(),
            metadata: a.metadata,
            env: a.env,
            token: a.secure.then(|| random(b"0123456789abcdef", 32)),
            traffic_token: crate::api::public_traffic(a.network.as_ref())
                .not()
                .then(|| random(b"0123456789abcdef", 32)),
            allow_internet: a.allow_internet,
            network: a.network,
            box_network: a.box_network,
            auto_pause: a.auto_pause,
            max_lifetime: a.max_lifetime,
            provider: made.provider,
            end_ms: watch::channel(end_ms).0,
            state: Mutex::new(St::Running),
            boxed: Mutex::new(Some(made.sandbox)),
            op: tokio::sync::Mutex::new(()),
            procs: Mutex::new(BTreeMap::new()),
            watchers: Mutex::new(BTreeMap::new()),
            cut: watch::channel(0).0,
            samples: Mutex::new(VecDeque::new()),
        }
    }

    /// What it was asked as: a fork is asked the same.
    pub(crate) fn asked(&self) -> Asked {
        Asked {
            owner: self.owner.clone(),
            template_id: self.template_id.clone(),
            metadata: self.metadata.clone(),
            env: self.env.clone(),
            allow_internet: self.allow_internet,
            network: self.network.clone(),
            box_network: self.box_network.clone(),
            auto_pause: self.auto_pause,
            secure: self.token.is_some(),
            max_lifetime: self.max_lifetime,
        }
    }

    /// Its box and provider, while it runs.
    pub(crate) fn made(&self) -> Option<Made> {
        Some(Made {
            provider: self.provider.clone(),
            sandbox: self.running_box()?,
        })
    }

    pub(crate) fn state(&self) -> St {
        *lock(&self.state)
    }

    fn set_state(&self, s: St) {
        *lock(&self.state) = s;
        // Wakes the supervisor.
        self.end_ms.send_modify(|_| {});
    }

    pub(crate) fn running_box(&self) -> Option<Arc<dyn Sandbox>> {
        if self.state() != St::Running {
            return None;
        }
        lock(&self.boxed).clone()
    }

    /// Cut its streams, forget its programs and watchers, and destroy its box on the task
    /// returned.
    fn end_everything(&self, st: St) -> tokio::task::JoinHandle<()> {
        self.set_state(st);
        self.cut.send_modify(|n| *n += 1);
        lock(&self.procs).clear();
        lock(&self.watchers).clear();
        let b = lock(&self.boxed).take();
        let id = self.id.clone();
        tokio::spawn(async move {
            let Some(b) = b else { return };
            if let Err(e) = b.destroy(&Ctx::background().with_timeout(BOX_TIMEOUT)).await {
                tracing::warn!(sandbox = %id, error = %e, "ending a sandbox's box");
            }
        })
    }

    /// Pause: its programs ended (the box sleeps), its files kept, its streams cut. False when
    /// it was not running.
    pub(crate) async fn pause(&self) -> agentbox_core::Result<bool> {
        if self.state() != St::Running {
            return Ok(false);
        }
        let Some(b) = lock(&self.boxed).clone() else {
            return Ok(false);
        };
        // Refused before anything is touched: a sandbox its provider cannot pause runs on, its
        // programs and streams as they were.
        if !self.provider.honours().sleep {
            return Err(agentbox_core::refuse(self.provider.name(), "sleep"));
        }
        let ctx = Ctx::background().with_timeout(BOX_TIMEOUT);
        *lock(&self.state) = St::Paused;
        self.cut.send_modify(|n| *n += 1);
        lock(&self.procs).clear();
        lock(&self.watchers).clear();
        if let Err(e) = self.provider.sleep(b.id(), &ctx).await {
            // Its programs were ended; the box is the provider's to say. Running again, so
            // the sandbox is not left paused over a box that runs.
            *lock(&self.state) = St::Running;
            self.end_ms.send_modify(|_| {});
            return Err(agentbox_core::Error::new(
                e.code(),
                format!("pausing the sandbox: {}", e.message()),
            ));
        }
        // Kept a day, or its owner's longest lifetime if shorter; then it ends (the supervisor).
        let kept_for = self.max_lifetime.map_or(PAUSED_KEPT, |m| m.min(PAUSED_KEPT));
        let kept = now_ms() + kept_for.as_millis() as u64;
        if let Err(e) = self.provider.extend(b.id(), kept, &ctx).await {
            tracing::warn!(sandbox = %self.id, error = %e, "keeping a paused sandbox's box");
        }
        self.end_ms.send_replace(kept);
        Ok(true)
    }

    /// Resume a paused sandbox until `end_ms`: a fresh box over the same files.
    pub(crate) async fn resume(&self, end_ms: u64) -> agentbox_core::Result<()> {
        let Some(b) = lock(&self.boxed).clone() else {
            return Err(agentbox_core::Error::not_found("the sandbox's box is gone"));
        };
        let ctx = Ctx::background().with_timeout(BOX_TIMEOUT);
        let woke = self
            .provider
            .wake(b.id(), &ctx)
            .await
            .map_err(|e| agentbox_core::Error::new(e.code(), format!("resuming the sandbox: {}", e.message())))?;
        let _ = self
            .provider
            .extend(b.id(), end_ms + BOX_MARGIN.as_millis() as u64, &ctx)
            .await;
        *lock(&self.boxed) = Some(woke);
        *lock(&self.state) = St::Running;
        self.end_ms.send_replace(end_ms);
        Ok(())
    }

    /// A new end for a running sandbox (its box's own end follows).
    pub(crate) async fn set_end(&self, end_ms: u64) {
        if let Some(b) = self.running_box() {
            let until = end_ms + BOX_MARGIN.as_millis() as u64;
            if let Err(e) = self
                .provider
                .extend(b.id(), until, &Ctx::background().with_timeout(BOX_TIMEOUT))
                .await
            {
                tracing::warn!(sandbox = %self.id, error = %e, "extending a sandbox's box");
            }
        }
        self.end_ms.send_replace(end_ms);
    }
}

/// How often a sandbox running programs has its box's status asked: a box ended elsewhere
/// (through agentbox's own API, by its provider) makes the sandbox gone, its streams cut, so
/// no stream waits on a program that can no longer end.
const LIVENESS_EVERY: Duration = Duration::from_secs(3);

/// Watch a sandbox's end: at it, a running sandbox is killed (or paused, with autoPause); and,
/// while it runs programs, that its box still runs.
pub(crate) fn supervise(s: Arc<Shared>, x: Arc<Sbx>) {
    tokio::spawn(async move {
        let mut rx = x.end_ms.subscribe();
        loop {
            let end = *rx.borrow_and_update();
            match x.state() {
                St::Gone => return,
                // Paused: kept until its end (set by the pause), then gone, its record too.
                St::Paused => {
                    let wait = Duration::from_millis(end.saturating_sub(now_ms()));
                    tokio::select! {
                        changed = rx.changed() => {
                            if changed.is_err() {
                                return;
                            }
                        }
                        _ = tokio::time::sleep(wait) => {
                            let _held = x.op.lock().await;
                            if *x.end_ms.borrow() == end && x.state() == St::Paused {
                                tracing::info!(sandbox = %x.id, "e2b: a paused sandbox's time is up");
                                s.remove(&x.id);
                                return;
                            }
                        }
                    }
                    continue;
                }
                St::Running => {}
            }
            let wait = Duration::from_millis(end.saturating_sub(now_ms()));
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = tokio::time::sleep(LIVENESS_EVERY) => {
                    let Some(b) = x.running_box() else { continue };
                    if lock(&x.procs).is_empty() || !box_ended(b.as_ref()).await {
                        continue;
                    }
                    let _held = x.op.lock().await;
                    if x.state() == St::Running {
                        tracing::info!(sandbox = %x.id, box_id = %b.id(), "e2b: the sandbox's box ended under it");
                        s.remove(&x.id);
                        return;
                    }
                }
                _ = tokio::time::sleep(wait) => {
                    let _held = x.op.lock().await;
                    if *x.end_ms.borrow() != end || x.state() != St::Running {
                        continue;
                    }
                    if x.auto_pause {
                        if let Err(e) = x.pause().await {
                            tracing::warn!(sandbox = %x.id, error = %e, "auto-pausing at the timeout");
                            s.remove(&x.id);
                            return;
                        }
                    } else {
                        tracing::info!(sandbox = %x.id, "timed out");
                        s.remove(&x.id);
                        return;
                    }
                }
            }
        }
    });
}

/// One output event of a program, as its streams see it.
#[derive(Clone, Debug)]
pub(crate) enum Ev {
    Stdout(Bytes),
    /// A terminal's output.
    Pty(Bytes),
    Stderr(Bytes),
    /// Its end event (`exitCode`, `exited`, `status`, `error`).
    End(Value),
}

/// One program of a sandbox.
pub(crate) struct Proc {
    pub(crate) pid: u32,
    pub(crate) cmd: String,
    pub(crate) args: Vec<String>,
    pub(crate) envs: BTreeMap<String, String>,
    pub(crate) cwd: Option<String>,
    pub(crate) tag: Option<String>,
    pub(crate) events: broadcast::Sender<Ev>,
    pub(crate) stdin: tokio::sync::Mutex<Option<Stdin>>,
    pub(crate) killer: Killer,
    /// The signal sent to it last (to tell a kill from an exit 128+n).
    pub(crate) signalled: AtomicU32,
}

impl Proc {
    pub(crate) fn config(&self) -> Value {
        let mut c = serde_json::json!({"cmd": self.cmd, "args": self.args, "envs": self.envs});
        if let Some(cwd) = &self.cwd {
            c["cwd"] = Value::String(cwd.clone());
        }
        c
    }
}

/// What a Start asks of a program.
pub(crate) struct Launch {
    pub(crate) cmd: String,
    pub(crate) args: Vec<String>,
    pub(crate) envs: BTreeMap<String, String>,
    pub(crate) cwd: Option<String>,
    pub(crate) tag: Option<String>,
    /// Its stdin kept open for SendInput (a terminal's always is).
    pub(crate) stdin: bool,
    /// Killed at this, from its start (`Connect-Timeout-Ms`).
    pub(crate) deadline: Option<Duration>,
    /// Run in a terminal of this size: its output is `pty` data, its input the terminal's.
    pub(crate) tty: Option<agentbox_core::Tty>,
}

/// Start a program in a sandbox's box: its pid and the receiver its start stream reads.
pub(crate) async fn start_proc(
    s: &Arc<Shared>,
    x: &Arc<Sbx>,
    b: Arc<dyn Sandbox>,
    l: Launch,
) -> Result<(Arc<Proc>, broadcast::Receiver<Ev>), String> {
    let Launch {
        cmd,
        args,
        envs,
        cwd,
        tag,
        stdin,
        deadline,
        tty,
    } = l;
    let pty = tty.is_some();
    let mut argv = vec![cmd.clone()];
    argv.extend(args.iter().cloned());
    let opts = agentbox_core::ExecOptions {
        cwd: cwd.clone(),
        env: envs.clone(),
        tty,
        ..Default::default()
    };
    let mut p = b
        .exec(&argv, &opts, &Ctx::background().with_timeout(START_TIMEOUT))
        .await
        .map_err(|e| e.message().to_string())?;
    let mut input = p.stdin.take();
    if !stdin
        && !pty
        && let Some(mut i) = input.take()
    {
        let _ = i.close().await;
    }
    let (events, rx) = broadcast::channel(EVENTS_BEHIND);
    let pid = s.next_pid.fetch_add(1, Ordering::Relaxed);
    let proc = Arc::new(Proc {
        pid,
        cmd,
        args,
        envs,
        cwd,
        tag,
        events,
        stdin: tokio::sync::Mutex::new(input),
        killer: p.killer(),
        signalled: AtomicU32::new(0),
    });
    lock(&x.procs).insert(pid, proc.clone());
    let mut pumps = tokio::task::JoinSet::new();
    for (r, out) in [(p.stdout.take(), true), (p.stderr.take(), false)] {
        let Some(mut r) = r else { continue };
        let tx = proc.events.clone();
        pumps.spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut chunk = vec![0u8; 32 << 10];
            loop {
                match r.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let b = Bytes::copy_from_slice(&chunk[..n]);
                        let _ = tx.send(match (pty, out) {
                            (true, _) => Ev::Pty(b),
                            (false, true) => Ev::Stdout(b),
                            (false, false) => Ev::Stderr(b),
                        });
                    }
                }
            }
        });
    }
    let me = proc.clone();
    let sbx = x.clone();
    let shared = s.clone();
    tokio::spawn(async move {
        let deadline = async {
            match deadline {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(deadline);
        let mut timed_out = false;
        let st = loop {
            tokio::select! {
                st = p.wait() => break st,
                _ = &mut deadline, if !timed_out => {
                    timed_out = true;
                    me.signalled.store(9, Ordering::Relaxed);
                    let _ = me.killer.signal(9).await;
                }
            }
        };
        let _ = tokio::time::timeout(OUTPUT_GRACE, async { while pumps.join_next().await.is_some() {} }).await;
        pumps.abort_all();
        let sent = me.signalled.load(Ordering::Relaxed) as i32;
        // Killed by no one here: if its box ended with it (ended elsewhere), the sandbox is
        // gone and this was no exit (the supervisor's check, for a program its box's end left
        // hanging, would come too late for one its box's end killed).
        let unasked = sent == 0 && st.as_ref().map_or(true, |st| st.signal.is_some() || st.code >= 128);
        if unasked && sbx.state() == St::Running && box_ended(b.as_ref()).await {
            tracing::info!(sandbox = %sbx.id, "e2b: the sandbox's box ended under a program");
            shared.remove(&sbx.id);
            return;
        }
        let (code, signal) = match &st {
            Ok(st) => (
                st.code,
                st.signal.or((sent != 0 && st.code == 128 + sent).then_some(sent)),
            ),
            Err(_) => (137, Some(9)),
        };
        let end = match signal {
            Some(sig) => serde_json::json!({
                "exitCode": -1,
                "exited": false,
                "status": format!("signal: {}", signal_name(sig)),
            }),
            None => serde_json::json!({
                "exitCode": code,
                "exited": true,
                "status": format!("exit status {code}"),
            }),
        };
        lock(&sbx.procs).remove(&me.pid);
        let _ = me.events.send(Ev::End(end));
    });
    Ok((proc, rx))
}

/// Whether a box has ended: its provider says so, or finds no such box. A provider that does
/// not answer (a slow engine, a vendor's bad minute) has not ended it: the next check asks again.
pub(crate) async fn box_ended(b: &dyn Sandbox) -> bool {
    let ctx = Ctx::background().with_timeout(Duration::from_secs(5));
    match b.status(&ctx).await {
        Ok(agentbox_core::Status::Ended) => true,
        Ok(_) => false,
        Err(e) => matches!(
            e.code(),
            agentbox_core::ErrorCode::NotFound | agentbox_core::ErrorCode::Gone
        ),
    }
}

/// Go's name of a signal, as envd's status says it (`signal: killed`).
fn signal_name(sig: i32) -> String {
    match sig {
        1 => "hangup".into(),
        2 => "interrupt".into(),
        9 => "killed".into(),
        15 => "terminated".into(),
        n => format!("signal {n}"),
    }
}

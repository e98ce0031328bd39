//! The fake provider: a [`Provider`] that does what a test scripts and writes down every call
//! it was asked, so a test of a host (anything built on a box) asserts what the host asked and
//! how it behaves when a provider misbehaves, with no machine, key or network.
//!
//! A fake box is either in memory (its programs are functions a test registers with
//! [`FakeProvider::program`], its files a map, its lifetime on a [`FakeClock`]), or, made
//! [`FakeProvider::over`] a real provider, that provider's box with the script on top: then it
//! passes the conformance suite wherever its script lets it, so a test written against the fake
//! holds on a real provider.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use std::time::Duration;
//! use agentbox_core::{Ctx, ErrorCode, Provider, Spec};
//! use agentbox_testing::fake::{FakeProvider, Match, Op, Outcome};
//! let fake = FakeProvider::new("fake");
//! fake.on(Match::op(Op::Create), Outcome::Fail(ErrorCode::Unknown, "no capacity".into()), Some(1));
//! let ctx = Ctx::background();
//! let first = fake.create(&Spec::new(Duration::from_secs(60)), &ctx).await;
//! assert_eq!(first.err().map(|e| e.code()), Some(ErrorCode::Unknown));
//! assert!(fake.create(&Spec::new(Duration::from_secs(60)), &ctx).await.is_ok());
//! assert_eq!(fake.calls().len(), 2);
//! # });
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentbox_core::{
    Clock, Ctx, Endpoint, Error, ErrorCode, ExecOptions, ExitStatus, Facts, Honours, Labels, Lifecycle, NetworkFact,
    Process, ProcessControl, Provider, Result, SIGKILL, Sandbox, SandboxId, Spec, Status, check_spec,
};
use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::Notify;

/// Time that moves only when a test says ([`FakeClock::advance`]), or the system's.
pub struct FakeClock {
    manual: bool,
    ms: AtomicU64,
    moved: Notify,
}

impl FakeClock {
    /// A clock at `start_ms` that moves only by [`FakeClock::advance`].
    pub fn manual(start_ms: u64) -> Arc<Self> {
        Arc::new(FakeClock {
            manual: true,
            ms: AtomicU64::new(start_ms),
            moved: Notify::new(),
        })
    }

    /// The system's clock.
    pub fn real() -> Arc<Self> {
        Arc::new(FakeClock {
            manual: false,
            ms: AtomicU64::new(0),
            moved: Notify::new(),
        })
    }

    /// Move a manual clock on by `d`, waking whatever waits on it.
    pub fn advance(&self, d: Duration) {
        self.ms.fetch_add(d.as_millis() as u64, Ordering::SeqCst);
        self.moved.notify_waiters();
    }

    /// Wait until the clock reads `at_ms` or later.
    pub async fn wait_until(&self, at_ms: u64) {
        if !self.manual {
            let now = self.now_ms();
            if at_ms > now {
                tokio::time::sleep(Duration::from_millis(at_ms - now)).await;
            }
            return;
        }
        loop {
            let moved = self.moved.notified();
            if self.now_ms() >= at_ms {
                return;
            }
            moved.await;
        }
    }
}

impl Clock for FakeClock {
    fn now_ms(&self) -> u64 {
        if self.manual {
            self.ms.load(Ordering::SeqCst)
        } else {
            agentbox_core::SystemClock.now_ms()
        }
    }

    fn sleep_until(&self, at_ms: u64) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(self.wait_until(at_ms))
    }
}

/// A provider call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `Provider::create`.
    Create,
    /// `Provider::attach`.
    Attach,
    /// `Provider::list`.
    List,
    /// `Sandbox::exec`.
    Exec,
    /// `Sandbox::status`.
    Status,
    /// `Sandbox::upload`.
    Upload,
    /// `Sandbox::download`.
    Download,
    /// `Sandbox::destroy`.
    Destroy,
    /// `Lifecycle::extend`.
    Extend,
    /// `Lifecycle::relabel`.
    Relabel,
}

/// One call as the fake saw it. Variables are recorded by name, never by value.
#[derive(Clone, Debug)]
pub struct Call {
    /// Its place among every call, from 1.
    pub seq: u64,
    /// What was asked.
    pub op: Op,
    /// The box it was about.
    pub box_id: Option<String>,
    /// An exec's argv.
    pub argv: Vec<String>,
    /// An exec's (or a spec's) variable names.
    pub env_names: Vec<String>,
    /// The bytes written to an exec's stdin, or uploaded.
    pub bytes: Vec<u8>,
    /// A file's path.
    pub path: Option<String>,
    /// A create's spec.
    pub spec: Option<Spec>,
    /// `ok`, or the error code it answered.
    pub result: String,
    /// The label of the script rule that decided it.
    pub rule: Option<String>,
}

/// Which calls a rule decides.
#[derive(Clone, Default)]
pub struct Match {
    /// The call's op.
    pub op: Option<Op>,
    /// The box it is about.
    pub box_id: Option<String>,
    /// The nth call of that op (from 1).
    pub nth: Option<u64>,
    /// An exec whose program (argv[0]) is this.
    pub command: Option<String>,
    /// Any other test over the call.
    #[allow(clippy::type_complexity)]
    pub when: Option<Arc<dyn Fn(&Call) -> bool + Send + Sync>>,
}

impl Match {
    /// Every call of `op`.
    pub fn op(op: Op) -> Self {
        Match {
            op: Some(op),
            ..Default::default()
        }
    }

    /// Execs of `program`.
    pub fn command(program: &str) -> Self {
        Match {
            op: Some(Op::Exec),
            command: Some(program.into()),
            ..Default::default()
        }
    }

    fn matches(&self, c: &Call, nth: u64) -> bool {
        self.op.is_none_or(|o| o == c.op)
            && self.box_id.as_ref().is_none_or(|b| c.box_id.as_ref() == Some(b))
            && self.nth.is_none_or(|n| n == nth)
            && self.command.as_ref().is_none_or(|p| c.argv.first() == Some(p))
            && self.when.as_ref().is_none_or(|f| f(c))
    }
}

/// What a rule makes of a call.
#[derive(Clone, Debug)]
pub enum Outcome {
    /// Fail with this code and message.
    Fail(ErrorCode, String),
    /// Fail with this code and message, as a call never made (`Error::not_made`): one a
    /// provider's queue let go before it was sent.
    NotMade(ErrorCode, String),
    /// Answer after this long on the clock, then as usual.
    Delay(Duration),
    /// Never answer: the call ends when its context does.
    Hang,
    /// An exec whose stdin never delivers EOF (the `docker exec -i` fault).
    LoseStdinEof,
    /// An exec whose output never arrives (its streams end empty).
    DropOutput,
    /// An exec whose output is cut after this many bytes a stream.
    TruncateOutput(usize),
    /// An exec that runs nothing and exits with this code.
    Exit(i32),
    /// The box goes away while the exec runs: the exec fails `gone`, and so does every later call.
    GoneMidExec,
    /// Refuse: `refused`, with this reason.
    Refuse(String),
    /// A create that fails with this code and message after the box was made: the box exists,
    /// `list` finds it and it ends at its lifetime (the seed's `leakBox`). What a host must
    /// clean up when a provider's answer was lost.
    FailLeakingBox(ErrorCode, String),
}

struct Rule {
    matcher: Match,
    outcome: Outcome,
    left: Option<usize>,
    label: String,
}

/// What a registered program is given.
pub struct ProgramCall {
    /// Its argv.
    pub argv: Vec<String>,
    /// Its environment (the spec's and the exec's).
    pub env: BTreeMap<String, String>,
    /// Everything written to its stdin, once it ended.
    pub stdin: Vec<u8>,
    /// The box's files, which it may change.
    pub files: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
}

/// What a registered program gives back.
#[derive(Clone, Debug, Default)]
pub struct ProgramOutput {
    /// Its exit code.
    pub code: i32,
    /// Its stdout.
    pub stdout: Vec<u8>,
    /// Its stderr.
    pub stderr: Vec<u8>,
}

type ProgramFn = Arc<dyn Fn(ProgramCall) -> Pin<Box<dyn Future<Output = ProgramOutput> + Send>> + Send + Sync>;

/// Facts a preset gives every box.
#[derive(Clone, Debug)]
pub struct Preset {
    /// The isolation the boxes report.
    pub isolation: String,
    /// Extra facts.
    pub fuse: Option<bool>,
    /// The ptrace scope the boxes report.
    pub ptrace_scope: Option<i32>,
    /// Whether programs keep running between calls and take stdin.
    pub live_processes: bool,
    /// Billed by the exec call, not by the second.
    pub billed_per_call: bool,
}

impl Preset {
    /// A VM with FUSE and a ptrace scope, as Modal's sandboxes are.
    pub fn modal_like() -> Self {
        Preset {
            isolation: "vm".into(),
            fuse: Some(true),
            ptrace_scope: Some(1),
            live_processes: true,
            billed_per_call: false,
        }
    }
    /// A container with no FUSE and a ptrace scope of 0, as Daytona's are.
    pub fn daytona_like() -> Self {
        Preset {
            isolation: "container".into(),
            fuse: Some(false),
            ptrace_scope: Some(0),
            live_processes: true,
            billed_per_call: false,
        }
    }
    /// A VM per call over a directory, with no live processes, billed by the call, as Archil's
    /// exec boxes are.
    pub fn archil_like() -> Self {
        Preset {
            isolation: "vm".into(),
            fuse: None,
            ptrace_scope: None,
            live_processes: false,
            billed_per_call: true,
        }
    }
}

struct FakeBox {
    spec: Spec,
    created_ms: u64,
    ends_ms: u64,
    gone: bool,
    files: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
    backing: Option<Arc<dyn Sandbox>>,
}

struct State {
    name: String,
    clock: Arc<FakeClock>,
    preset: Option<Preset>,
    backing: Option<Arc<dyn Provider>>,
    boxes: Mutex<BTreeMap<String, FakeBox>>,
    calls: Mutex<Vec<Call>>,
    counts: Mutex<BTreeMap<String, u64>>,
    rules: Mutex<Vec<Rule>>,
    programs: Mutex<Vec<(String, ProgramFn)>>,
    next: AtomicU64,
    /// Whether `extend` and `relabel` are honoured (in-memory boxes; over a real provider,
    /// that provider's honours say).
    lifecycle: Mutex<(bool, bool)>,
}

/// The fake provider. See the [module documentation](self). Clones share everything, as
/// fresh providers over one vendor account would.
#[derive(Clone)]
pub struct FakeProvider {
    s: Arc<State>,
}

impl FakeProvider {
    /// An in-memory fake named `name` (its ids are `name:fake-N`), on the system's clock.
    pub fn new(name: &str) -> Self {
        Self::build(name, None, FakeClock::real(), None)
    }

    /// An in-memory fake on `clock`, whose boxes report `preset`'s facts.
    pub fn with(name: &str, clock: Arc<FakeClock>, preset: Option<Preset>) -> Self {
        Self::build(name, None, clock, preset)
    }

    /// A fake over a real provider: its boxes are `backing`'s, with the script on top.
    pub fn over(backing: Arc<dyn Provider>) -> Self {
        let name = backing.name().to_string();
        Self::build(&name, Some(backing), FakeClock::real(), None)
    }

    fn build(name: &str, backing: Option<Arc<dyn Provider>>, clock: Arc<FakeClock>, preset: Option<Preset>) -> Self {
        FakeProvider {
            s: Arc::new(State {
                name: name.to_string(),
                clock,
                preset,
                backing,
                boxes: Mutex::new(BTreeMap::new()),
                calls: Mutex::new(Vec::new()),
                counts: Mutex::new(BTreeMap::new()),
                rules: Mutex::new(Vec::new()),
                programs: Mutex::new(Vec::new()),
                next: AtomicU64::new(1),
                lifecycle: Mutex::new((true, true)),
            }),
        }
    }

    /// Whether in-memory boxes honour `extend` and `relabel` (both do unless a test says
    /// otherwise here, to play a provider that cannot).
    pub fn set_lifecycle(&self, extend: bool, relabel: bool) {
        *self.s.lifecycle.lock().unwrap() = (extend, relabel);
    }

    /// The clock its lifetimes and delays run on.
    pub fn clock(&self) -> Arc<FakeClock> {
        self.s.clock.clone()
    }

    /// Decide calls that `matcher` matches with `outcome`, `times` times (always when `None`).
    /// The first rule that matches decides. Returns the rule's label.
    pub fn on(&self, matcher: Match, outcome: Outcome, times: Option<usize>) -> String {
        let mut rules = self.s.rules.lock().unwrap();
        let label = format!("rule-{}", rules.len() + 1);
        rules.push(Rule {
            matcher,
            outcome,
            left: times,
            label: label.clone(),
        });
        label
    }

    /// Run `f` for execs of `program` (argv[0]) in in-memory boxes.
    pub fn program<F, Fut>(&self, program: &str, f: F)
    where
        F: Fn(ProgramCall) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ProgramOutput> + Send + 'static,
    {
        let f: ProgramFn = Arc::new(move |c| Box::pin(f(c)));
        self.s.programs.lock().unwrap().push((program.to_string(), f));
    }

    /// Every call, in the order seen.
    pub fn calls(&self) -> Vec<Call> {
        self.s.calls.lock().unwrap().clone()
    }

    /// The calls of `op`.
    pub fn calls_of(&self, op: Op) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.op == op).collect()
    }

    /// Where `marker` appears in anything recorded: argv, stdin or uploaded bytes, paths, env
    /// names, labels, the spec. Empty when nowhere.
    pub fn leaks(&self, marker: &str) -> Vec<String> {
        let mut out = Vec::new();
        for c in self.calls() {
            let at = |what: &str| format!("call {} ({:?}): {what}", c.seq, c.op);
            if c.argv.iter().any(|a| a.contains(marker)) {
                out.push(at("argv"));
            }
            if String::from_utf8_lossy(&c.bytes).contains(marker) {
                out.push(at("bytes"));
            }
            if c.path.as_ref().is_some_and(|p| p.contains(marker)) {
                out.push(at("path"));
            }
            if c.env_names.iter().any(|n| n.contains(marker)) {
                out.push(at("env"));
            }
            if let Some(spec) = &c.spec
                && serde_json::to_string(spec).is_ok_and(|t| t.contains(marker))
            {
                out.push(at("spec"));
            }
        }
        out
    }

    /// End a box behind its host's back, as a vendor's sweep would.
    pub async fn end_box(&self, id: &SandboxId) {
        let backing = {
            let mut boxes = self.s.boxes.lock().unwrap();
            boxes.get_mut(id.name()).and_then(|b| {
                b.gone = true;
                b.backing.clone()
            })
        };
        if let Some(b) = backing {
            let _ = b.destroy(&Ctx::background()).await;
        }
    }

    /// Whether the box has ended, as the vendor's own table says (no call is recorded).
    pub fn ended(&self, id: &SandboxId) -> bool {
        let now = self.s.clock.now_ms();
        self.s
            .boxes
            .lock()
            .unwrap()
            .get(id.name())
            .is_none_or(|b| b.gone || b.ends_ms <= now)
    }

    /// Record a call and find the rule that decides it.
    fn begin(&self, mut call: Call) -> (u64, Option<Outcome>) {
        let nth = {
            let mut counts = self.s.counts.lock().unwrap();
            let n = counts.entry(format!("{:?}", call.op)).or_default();
            *n += 1;
            *n
        };
        let mut decided = None;
        {
            let mut rules = self.s.rules.lock().unwrap();
            for r in rules.iter_mut() {
                if r.left != Some(0) && r.matcher.matches(&call, nth) {
                    if let Some(l) = r.left.as_mut() {
                        *l -= 1;
                    }
                    call.rule = Some(r.label.clone());
                    decided = Some(r.outcome.clone());
                    break;
                }
            }
        }
        let mut calls = self.s.calls.lock().unwrap();
        call.seq = calls.len() as u64 + 1;
        let seq = call.seq;
        calls.push(call);
        (seq, decided)
    }

    fn finish(&self, seq: u64, result: &Result<impl Sized>) {
        let r = match result {
            Ok(_) => "ok".to_string(),
            Err(e) => e.code().as_str().to_string(),
        };
        if let Some(c) = self.s.calls.lock().unwrap().get_mut(seq as usize - 1) {
            c.result = r;
        }
    }

    /// Apply what every op shares: fail, refuse, delay, hang.
    async fn common(&self, outcome: &Option<Outcome>, ctx: &Ctx) -> Result<()> {
        match outcome {
            Some(Outcome::Fail(code, msg)) => Err(Error::new(*code, msg.clone())),
            Some(Outcome::NotMade(code, msg)) => Err(Error::new(*code, msg.clone()).not_made()),
            Some(Outcome::Refuse(why)) => Err(Error::refused(why.clone())),
            Some(Outcome::Delay(d)) => {
                let at = self.s.clock.now_ms() + d.as_millis() as u64;
                ctx.run(self.s.clock.wait_until(at)).await
            }
            Some(Outcome::Hang) => Err(ctx.done().await),
            _ => Ok(()),
        }
    }

    fn call(op: Op) -> Call {
        Call {
            seq: 0,
            op,
            box_id: None,
            argv: vec![],
            env_names: vec![],
            bytes: vec![],
            path: None,
            spec: None,
            result: String::new(),
            rule: None,
        }
    }

    fn facts_of(&self, b: &FakeBox) -> Facts {
        let preset = self.s.preset.clone();
        Facts {
            provider: self.s.name.clone(),
            isolation: preset
                .as_ref()
                .map(|p| p.isolation.clone())
                .unwrap_or_else(|| "fake".into()),
            network: Some(NetworkFact::Open),
            started_at_ms: Some(b.created_ms),
            ends_at_ms: Some(b.ends_ms),
            live_processes: preset.as_ref().is_none_or(|p| p.live_processes),
            billed_per_call: preset.as_ref().is_some_and(|p| p.billed_per_call),
            fuse: preset.as_ref().and_then(|p| p.fuse),
            ptrace_scope: preset.as_ref().and_then(|p| p.ptrace_scope),
            gpu: b.spec.gpu.clone(),
            workspace: Some("/workspace".into()),
            ..Default::default()
        }
    }

    fn handle(&self, name: &str) -> Option<Arc<dyn Sandbox>> {
        let boxes = self.s.boxes.lock().unwrap();
        let b = boxes.get(name)?;
        let facts = match &b.backing {
            Some(real) => real.facts().clone(),
            None => self.facts_of(b),
        };
        Some(Arc::new(FakeSandbox {
            fake: self.clone(),
            id: SandboxId::new(&self.s.name, name).ok()?,
            labels: b.spec.labels.clone(),
            facts,
            backing: b.backing.clone(),
            files: b.files.clone(),
        }))
    }

    fn live(&self, name: &str) -> bool {
        let now = self.s.clock.now_ms();
        self.s
            .boxes
            .lock()
            .unwrap()
            .get(name)
            .is_some_and(|b| !b.gone && b.ends_ms > now)
    }
}

#[async_trait]
impl Provider for FakeProvider {
    fn name(&self) -> &str {
        &self.s.name
    }

    fn honours(&self) -> Honours {
        let (extend, relabel) = *self.s.lifecycle.lock().unwrap();
        match &self.s.backing {
            // What the fake forwards of the backing's lifecycle (extend and relabel) and no
            // more: the rest it would refuse, so it must not declare it.
            Some(b) => Honours {
                names: false,
                sleep: false,
                snapshot: false,
                snapshots: false,
                fork: false,
                ..b.honours()
            },
            None => Honours {
                image: true,
                cpus: true,
                memory: true,
                gpu: true,
                isolation: vec![
                    self.s
                        .preset
                        .as_ref()
                        .map(|p| p.isolation.clone())
                        .unwrap_or_else(|| "fake".into()),
                ],
                env: true,
                live_processes: true,
                extend,
                relabel,
                ..Default::default()
            },
        }
    }

    async fn create(&self, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let mut call = Self::call(Op::Create);
        call.spec = Some(spec.clone());
        call.env_names = spec.env.keys().cloned().collect();
        let (seq, outcome) = self.begin(call);
        let r = async {
            check_spec(spec, &self.honours(), &self.s.name)?;
            self.common(&outcome, ctx).await?;
            let backing = match &self.s.backing {
                Some(p) => Some(p.create(spec, ctx).await?),
                None => None,
            };
            let name = match &backing {
                Some(b) => b.id().name().to_string(),
                None => format!("fake-{}", self.s.next.fetch_add(1, Ordering::SeqCst)),
            };
            let now = self.s.clock.now_ms();
            self.s.boxes.lock().unwrap().insert(
                name.clone(),
                FakeBox {
                    spec: spec.clone(),
                    created_ms: now,
                    ends_ms: now + spec.max_lifetime.as_millis() as u64,
                    gone: false,
                    files: Arc::new(Mutex::new(BTreeMap::new())),
                    backing,
                },
            );
            if let Some(p) = self.s.calls.lock().unwrap().get_mut(seq as usize - 1) {
                p.box_id = Some(name.clone());
            }
            if let Some(Outcome::FailLeakingBox(code, msg)) = &outcome {
                return Err(Error::new(*code, msg.clone()));
            }
            self.handle(&name)
                .ok_or_else(|| Error::unknown("the fake lost a box it just made"))
        }
        .await;
        self.finish(seq, &r);
        r
    }

    async fn attach(&self, id: &SandboxId, ctx: &Ctx) -> Result<Option<Arc<dyn Sandbox>>> {
        let mut call = Self::call(Op::Attach);
        call.box_id = Some(id.name().to_string());
        let (seq, outcome) = self.begin(call);
        let r = async {
            id.expect_provider(&self.s.name)?;
            self.common(&outcome, ctx).await?;
            if let Some(p) = &self.s.backing {
                // A box the fake did not make (another process's fake) is the backing's to find.
                let found = p.attach(id, ctx).await?;
                let known = self.s.boxes.lock().unwrap().contains_key(id.name());
                return Ok(match (found, known) {
                    (Some(b), false) => Some(b),
                    (Some(_), true) if !self.live(id.name()) => None,
                    (Some(_), true) => self.handle(id.name()),
                    (None, _) => None,
                });
            }
            Ok(if self.live(id.name()) {
                self.handle(id.name())
            } else {
                None
            })
        }
        .await;
        self.finish(seq, &r);
        r
    }

    async fn list(&self, labels: &Labels, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        let (seq, outcome) = self.begin(Self::call(Op::List));
        let r = async {
            self.common(&outcome, ctx).await?;
            if let Some(p) = &self.s.backing {
                return p.list(labels, ctx).await;
            }
            let names: Vec<String> = self
                .s
                .boxes
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, b)| labels.iter().all(|(k, v)| b.spec.labels.get(k) == Some(v)))
                .map(|(n, _)| n.clone())
                .collect();
            Ok(names
                .into_iter()
                .filter(|n| self.live(n))
                .filter_map(|n| self.handle(&n))
                .collect())
        }
        .await;
        self.finish(seq, &r);
        r
    }

    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        Some(self)
    }
}

#[async_trait]
impl Lifecycle for FakeProvider {
    async fn extend(&self, id: &SandboxId, ends_at_ms: u64, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let mut call = Self::call(Op::Extend);
        call.box_id = Some(id.name().to_string());
        let (seq, outcome) = self.begin(call);
        let r = async {
            id.expect_provider(&self.s.name)?;
            if !self.honours().extend {
                return Err(agentbox_core::refuse(&self.s.name, "extend"));
            }
            agentbox_core::check_deadline(ends_at_ms, self.s.clock.now_ms())?;
            self.common(&outcome, ctx).await?;
            if !self.live(id.name()) {
                return Err(Error::gone(format!("box {id}: it has ended")));
            }
            if let Some(p) = &self.s.backing {
                let b = p.extend(id, ends_at_ms, ctx).await?;
                if let Some(f) = self.s.boxes.lock().unwrap().get_mut(id.name()) {
                    f.backing = Some(b);
                }
            }
            if let Some(b) = self.s.boxes.lock().unwrap().get_mut(id.name()) {
                b.ends_ms = ends_at_ms;
            }
            self.handle(id.name())
                .ok_or_else(|| Error::gone(format!("box {id}: it has ended")))
        }
        .await;
        self.finish(seq, &r);
        r
    }

    async fn relabel(&self, id: &SandboxId, labels: &Labels, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let mut call = Self::call(Op::Relabel);
        call.box_id = Some(id.name().to_string());
        let (seq, outcome) = self.begin(call);
        let r = async {
            id.expect_provider(&self.s.name)?;
            if !self.honours().relabel {
                return Err(agentbox_core::refuse(&self.s.name, "relabel"));
            }
            agentbox_core::validate_labels(labels)?;
            self.common(&outcome, ctx).await?;
            if !self.live(id.name()) {
                return Err(Error::gone(format!("box {id}: it has ended")));
            }
            if let Some(p) = &self.s.backing {
                let b = p.relabel(id, labels, ctx).await?;
                if let Some(f) = self.s.boxes.lock().unwrap().get_mut(id.name()) {
                    f.backing = Some(b);
                }
            }
            if let Some(b) = self.s.boxes.lock().unwrap().get_mut(id.name()) {
                b.spec.labels = labels.clone();
            }
            self.handle(id.name())
                .ok_or_else(|| Error::gone(format!("box {id}: it has ended")))
        }
        .await;
        self.finish(seq, &r);
        r
    }
}

struct FakeSandbox {
    fake: FakeProvider,
    id: SandboxId,
    labels: Labels,
    facts: Facts,
    backing: Option<Arc<dyn Sandbox>>,
    files: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
}

impl FakeSandbox {
    fn ensure_live(&self) -> Result<()> {
        if self.fake.live(self.id.name()) {
            Ok(())
        } else {
            Err(Error::gone(format!("box {}: it has ended", self.id)))
        }
    }

    fn call(&self, op: Op) -> Call {
        let mut c = FakeProvider::call(op);
        c.box_id = Some(self.id.name().to_string());
        c
    }
}

/// A program the fake runs itself: its exit comes from a task.
struct Synthetic {
    exit: tokio::sync::Mutex<Option<tokio::sync::oneshot::Receiver<Result<ExitStatus>>>>,
    kill: Notify,
}

#[async_trait]
impl ProcessControl for Synthetic {
    async fn wait(&self) -> Result<ExitStatus> {
        let rx = self.exit.lock().await.take();
        match rx {
            Some(rx) => rx
                .await
                .unwrap_or_else(|_| Err(Error::unknown("the fake program vanished"))),
            None => Err(Error::unknown("wait called twice")),
        }
    }
    async fn signal(&self, _signal: i32) -> Result<()> {
        self.kill.notify_one();
        Ok(())
    }
}

/// A reader that yields at most `left` bytes of `inner`.
struct Cut<R> {
    inner: R,
    left: usize,
}

impl<R: AsyncRead + Unpin> AsyncRead for Cut<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.left == 0 {
            // The rest is read and dropped, so the program never blocks on a full pipe.
            let mut sink = [0u8; 8192];
            let mut b = tokio::io::ReadBuf::new(&mut sink);
            return match Pin::new(&mut self.inner).poll_read(cx, &mut b) {
                std::task::Poll::Ready(Ok(())) if !b.filled().is_empty() => {
                    cx.waker().wake_by_ref();
                    std::task::Poll::Pending
                }
                other => other,
            };
        }
        let want = self.left.min(buf.remaining());
        let mut tmp = vec![0u8; want];
        let mut b = tokio::io::ReadBuf::new(&mut tmp);
        let r = Pin::new(&mut self.inner).poll_read(cx, &mut b);
        if let std::task::Poll::Ready(Ok(())) = &r {
            let n = b.filled().len();
            buf.put_slice(&tmp[..n]);
            self.left -= n;
        }
        r
    }
}

/// A stdin whose shutdown is swallowed: the program never reads EOF.
struct NoEof<W> {
    inner: W,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for NoEof<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[async_trait]
impl Sandbox for FakeSandbox {
    fn id(&self) -> &SandboxId {
        &self.id
    }
    fn facts(&self) -> &Facts {
        &self.facts
    }
    fn labels(&self) -> &Labels {
        &self.labels
    }

    async fn exec(&self, argv: &[String], opts: &ExecOptions, ctx: &Ctx) -> Result<Process> {
        let mut call = self.call(Op::Exec);
        call.argv = argv.to_vec();
        call.env_names = opts.env.keys().cloned().collect();
        let (seq, outcome) = self.fake.begin(call);
        let r = self.exec_decided(argv, opts, outcome, seq, ctx).await;
        self.fake.finish(seq, &r);
        r
    }

    async fn status(&self, ctx: &Ctx) -> Result<Status> {
        let (seq, outcome) = self.fake.begin(self.call(Op::Status));
        let r = async {
            self.fake.common(&outcome, ctx).await?;
            Ok(if self.fake.live(self.id.name()) {
                Status::Running
            } else {
                Status::Ended
            })
        }
        .await;
        self.fake.finish(seq, &r);
        r
    }

    async fn upload(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<()> {
        let mut call = self.call(Op::Upload);
        call.path = Some(path.into());
        call.bytes = data.to_vec();
        let (seq, outcome) = self.fake.begin(call);
        let r = async {
            self.ensure_live()?;
            self.fake.common(&outcome, ctx).await?;
            match &self.backing {
                Some(b) => b.upload(path, data, ctx).await,
                None => {
                    self.files.lock().unwrap().insert(path.to_string(), data.to_vec());
                    Ok(())
                }
            }
        }
        .await;
        self.fake.finish(seq, &r);
        r
    }

    async fn download(&self, path: &str, max_bytes: u64, ctx: &Ctx) -> Result<Vec<u8>> {
        let mut call = self.call(Op::Download);
        call.path = Some(path.into());
        let (seq, outcome) = self.fake.begin(call);
        let r = async {
            self.ensure_live()?;
            self.fake.common(&outcome, ctx).await?;
            match &self.backing {
                Some(b) => b.download(path, max_bytes, ctx).await,
                None => {
                    let data = self
                        .files
                        .lock()
                        .unwrap()
                        .get(path)
                        .cloned()
                        .ok_or_else(|| Error::not_found(format!("{path}: no such file")))?;
                    if data.len() as u64 > max_bytes {
                        return Err(Error::too_large(format!("{path}: over the {max_bytes}-byte bound")));
                    }
                    Ok(data)
                }
            }
        }
        .await;
        self.fake.finish(seq, &r);
        r
    }

    async fn endpoint(&self, port: u16, ctx: &Ctx) -> Result<Endpoint> {
        self.ensure_live()?;
        match &self.backing {
            Some(b) => b.endpoint(port, ctx).await,
            None => Err(Error::unsupported("fake boxes expose no port")),
        }
    }

    async fn destroy(&self, ctx: &Ctx) -> Result<()> {
        let (seq, outcome) = self.fake.begin(self.call(Op::Destroy));
        let r = async {
            self.fake.common(&outcome, ctx).await?;
            if let Some(b) = &self.backing {
                b.destroy(ctx).await?;
            }
            if let Some(b) = self.fake.s.boxes.lock().unwrap().get_mut(self.id.name()) {
                b.gone = true;
            }
            Ok(())
        }
        .await;
        self.fake.finish(seq, &r);
        r
    }

    fn files(&self) -> Option<&dyn agentbox_core::Files> {
        self.backing.as_ref().and_then(|b| b.files())
    }
}

impl FakeSandbox {
    async fn exec_decided(
        &self,
        argv: &[String],
        opts: &ExecOptions,
        outcome: Option<Outcome>,
        seq: u64,
        ctx: &Ctx,
    ) -> Result<Process> {
        opts.validate(argv)?;
        self.ensure_live()?;
        self.fake.common(&outcome, ctx).await?;
        if let Some(Outcome::Exit(code)) = outcome {
            return Ok(synthetic(
                Ok(ProgramOutput {
                    code,
                    ..Default::default()
                }),
                None,
                ctx,
            ));
        }
        if let Some(b) = &self.backing {
            let mut p = b.exec(argv, opts, ctx).await?;
            match &outcome {
                Some(Outcome::DropOutput) => {
                    p.stdout = p.stdout.take().map(|r| Box::pin(Cut { inner: r, left: 0 }) as _);
                    p.stderr = p.stderr.take().map(|r| Box::pin(Cut { inner: r, left: 0 }) as _);
                }
                Some(Outcome::TruncateOutput(n)) => {
                    let n = *n;
                    p.stdout = p.stdout.take().map(|r| Box::pin(Cut { inner: r, left: n }) as _);
                    p.stderr = p.stderr.take().map(|r| Box::pin(Cut { inner: r, left: n }) as _);
                }
                Some(Outcome::LoseStdinEof) => {
                    // Keep the writer, never pass its shutdown on.
                    if let Some(mut s) = p.stdin.take() {
                        let (w, mut r) = tokio::io::duplex(64 << 10);
                        tokio::spawn(async move {
                            let _ = tokio::io::copy(&mut r, &mut s).await;
                            std::future::pending::<()>().await;
                            drop(s);
                        });
                        p.stdin = Some(agentbox_core::Stdin::new(Box::pin(NoEof { inner: w })));
                    }
                }
                Some(Outcome::GoneMidExec) => {
                    let fake = self.fake.clone();
                    let id = self.id.clone();
                    let killer = p.killer();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        let _ = killer.signal(SIGKILL).await;
                        fake.end_box(&id).await;
                    });
                }
                _ => {}
            }
            return Ok(p);
        }
        // In memory: a registered program, or 127.
        let program = self
            .fake
            .s
            .programs
            .lock()
            .unwrap()
            .iter()
            .find(|(name, _)| argv.first() == Some(name))
            .map(|(_, f)| f.clone());
        let mut env = BTreeMap::new();
        if let Some(b) = self.fake.s.boxes.lock().unwrap().get(self.id.name()) {
            env.extend(b.spec.env.clone());
        }
        env.extend(opts.env.clone());
        let gone_mid = matches!(outcome, Some(Outcome::GoneMidExec));
        let cut = match outcome {
            Some(Outcome::DropOutput) => Some(0),
            Some(Outcome::TruncateOutput(n)) => Some(n),
            _ => None,
        };
        let lose_eof = matches!(outcome, Some(Outcome::LoseStdinEof));
        let (stdin_w, mut stdin_r) = tokio::io::duplex(64 << 10);
        let argv = argv.to_vec();
        let files = self.files.clone();
        let fake = self.fake.clone();
        let id = self.id.clone();
        let run = async move {
            let mut stdin = Vec::new();
            if !lose_eof {
                let _ = stdin_r.read_to_end(&mut stdin).await;
            } else {
                std::future::pending::<()>().await;
            }
            if gone_mid {
                fake.end_box(&id).await;
                return Err(Error::gone(format!("box {id}: it went away while the program ran")));
            }
            Ok(match program {
                Some(f) => {
                    f(ProgramCall {
                        argv,
                        env,
                        stdin,
                        files,
                    })
                    .await
                }
                None => ProgramOutput {
                    code: 127,
                    stdout: vec![],
                    stderr: format!("{}: not found\n", argv[0]).into_bytes(),
                },
            })
        };
        let _ = seq;
        let stdin: agentbox_core::ByteWriter = if lose_eof {
            Box::pin(NoEof { inner: stdin_w })
        } else {
            Box::pin(stdin_w)
        };
        Ok(synthetic_async(run, Some(stdin), cut, ctx))
    }
}

fn synthetic(out: Result<ProgramOutput>, stdin: Option<agentbox_core::ByteWriter>, ctx: &Ctx) -> Process {
    synthetic_async(async move { out }, stdin, None, ctx)
}

/// A process whose program is `run`: its output is delivered when it ends; a signal ends it
/// with 128 + 9.
fn synthetic_async(
    run: impl Future<Output = Result<ProgramOutput>> + Send + 'static,
    stdin: Option<agentbox_core::ByteWriter>,
    cut: Option<usize>,
    ctx: &Ctx,
) -> Process {
    let (exit_tx, exit_rx) = tokio::sync::oneshot::channel();
    let (mut out_w, out_r) = tokio::io::duplex(1 << 20);
    let (mut err_w, err_r) = tokio::io::duplex(1 << 20);
    let control = Arc::new(Synthetic {
        exit: tokio::sync::Mutex::new(Some(exit_rx)),
        kill: Notify::new(),
    });
    let c = control.clone();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let r = tokio::select! {
            r = run => r,
            _ = c.kill.notified() => Ok(ProgramOutput { code: 128 + SIGKILL, ..Default::default() }),
        };
        let status = match r {
            Ok(o) => {
                let (mut so, mut se) = (o.stdout, o.stderr);
                if let Some(n) = cut {
                    so.truncate(n);
                    se.truncate(n);
                }
                let _ = out_w.write_all(&so).await;
                let _ = err_w.write_all(&se).await;
                Ok(if o.code > 128 && o.code < 160 {
                    ExitStatus::signaled(o.code - 128)
                } else {
                    ExitStatus::exited(o.code)
                })
            }
            Err(e) => Err(e),
        };
        drop(out_w);
        drop(err_w);
        let _ = exit_tx.send(status);
    });
    Process::new(stdin, Some(Box::pin(out_r)), Some(Box::pin(err_r)), control, ctx)
}

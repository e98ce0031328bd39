//! One behaviour suite for every provider, the way object_store and OpenDAL run one suite
//! against every backend.
//!
//! A provider's tests call [`run`] with a factory of providers and [`Options`], then
//! [`Report::assert_all_passed`]. Every case is one function in [`CASES`], which declares what
//! it [`Need`]s of the provider; a case runs where the provider's `honours()` declares all of
//! them. Where it declares one missing, the options must say why (`without_live_processes`,
//! `without_env`): the cases that need it are left out with that reason, and a case of its own
//! checks the reason holds (the facts say so, and the provider refuses what it cannot do).
//! With no reason given, those cases fail.
//!
//! Whether a box ended, and whether its programs still run, is asked of [`Outside`], never of
//! the provider under test.
//!
//! ```no_run
//! # async fn f(outside: std::sync::Arc<dyn agentbox_testing::conformance::Outside>,
//! #            make: fn() -> std::sync::Arc<dyn agentbox_core::Provider>) {
//! use std::time::Duration;
//! use agentbox_testing::conformance::{factory, run, Options};
//! let options = Options::new("my boxes", Duration::from_secs(3), Duration::from_secs(5), outside);
//! run(factory(move || async move { make() }), options).await.assert_all_passed();
//! # }
//! ```

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentbox_core::{
    Ctx, ErrorCode, ExecOptions, FinishOptions, Finished, Honours, Labels, Lifecycle, Network, PortKind, PortSpec,
    Process, Provider, Sandbox, SandboxId, Spec, Status, finish,
};
use async_trait::async_trait;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// Makes a fresh provider (a new client, as a new process would have).
pub type Factory = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Arc<dyn Provider>> + Send>> + Send + Sync>;

/// Wrap an async closure as a [`Factory`].
pub fn factory<F, Fut>(f: F) -> Factory
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Arc<dyn Provider>> + Send + 'static,
{
    Arc::new(move || Box::pin(f()))
}

/// A view of boxes from outside the provider under test: the vendor's own API, the host's
/// process table, the Docker engine.
#[async_trait]
pub trait Outside: Send + Sync {
    /// Whether the box has ended and its resources are gone.
    async fn ended(&self, id: &SandboxId) -> bool;
    /// Whether any of these programs of the box (pids as the box itself reports them) still
    /// runs. A zombie does not run.
    async fn any_alive(&self, id: &SandboxId, pids: &[u32]) -> bool;
}

/// How to run the suite against one provider.
#[derive(Clone)]
pub struct Options {
    /// The provider's name in the report.
    pub name: String,
    /// The spec every box starts from (an image, for instance). Its lifetime is replaced.
    pub base: Spec,
    /// The lifetime of the box the lifetime case leaves alone.
    pub lifetime: Duration,
    /// How long past that lifetime the provider may take to end it.
    pub grace: Duration,
    /// Asks whether a box ended, from outside the provider.
    pub outside: Arc<dyn Outside>,
    /// Why the provider keeps no program running between calls and takes no stdin (its
    /// `honours().live_processes` is false). Checked by the case `without_live_processes`.
    pub without_live_processes: Option<String>,
    /// Why the provider's boxes carry no environment (its `honours().env` is false). Checked
    /// by the case `without_env`.
    pub without_env: Option<String>,
    /// Run only the cases of these names (a test of the suite itself, or one case chased on
    /// its own); every other is reported left out, so [`Report::assert_all_passed`] fails.
    pub only: Option<Vec<String>>,
}

impl Options {
    /// Options with a lifetime and grace for the lifetime case and everything else default.
    pub fn new(name: &str, lifetime: Duration, grace: Duration, outside: Arc<dyn Outside>) -> Self {
        Options {
            name: name.into(),
            base: Spec::new(Duration::from_secs(600)),
            lifetime,
            grace,
            outside,
            without_live_processes: None,
            without_env: None,
            only: None,
        }
    }
}

/// What a case needs of a provider beyond making a box, running a program in it and moving
/// files. Each is a capability the provider declares in its `Honours`; one it declares
/// missing needs a reason in [`Options`], which a case of its own checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Need {
    /// Programs keep running between calls and take stdin (`Honours::live_processes`).
    LiveProcesses,
    /// A spec's env reaches the box's programs (`Honours::env`).
    Env,
    /// Boxes by name (`Honours::names`).
    Names,
    /// Sleep and wake (`Honours::sleep`).
    Sleep,
    /// A deadline moved (`Honours::extend`).
    Extend,
    /// Labels changed (`Honours::relabel`).
    Relabel,
    /// Snapshots taken, and boxes made from them (`Honours::snapshots` and `snapshot`).
    Snapshots,
    /// Forks (`Honours::fork`).
    Fork,
}

/// Why a lifecycle case is left out where the provider does not declare its operation: a
/// provider need not have one, and `undeclared_lifecycle_is_refused` checks it refuses it.
const UNDECLARED: &str = "not declared in honours(); undeclared_lifecycle_is_refused checks it is refused";

impl Need {
    /// Whether `honours` declares it.
    fn declared(self, honours: &Honours) -> bool {
        match self {
            Need::LiveProcesses => honours.live_processes,
            Need::Env => honours.env,
            Need::Names => honours.names,
            Need::Sleep => honours.sleep,
            Need::Extend => honours.extend,
            Need::Relabel => honours.relabel,
            Need::Snapshots => honours.snapshots && honours.snapshot,
            Need::Fork => honours.fork,
        }
    }

    /// The lifecycle's needs: none needs a reason to be absent.
    const LIFECYCLE: [Need; 6] = [
        Need::Names,
        Need::Sleep,
        Need::Extend,
        Need::Relabel,
        Need::Snapshots,
        Need::Fork,
    ];

    /// The reason the options give for its absence.
    fn reason(self, options: &Options) -> Option<&str> {
        match self {
            Need::LiveProcesses => options.without_live_processes.as_deref(),
            Need::Env => options.without_env.as_deref(),
            _ => Some(UNDECLARED),
        }
    }

    /// The field of `Honours` that declares it.
    fn field(self) -> &'static str {
        match self {
            Need::LiveProcesses => "live_processes",
            Need::Env => "env",
            Need::Names => "names",
            Need::Sleep => "sleep",
            Need::Extend => "extend",
            Need::Relabel => "relabel",
            Need::Snapshots => "snapshots",
            Need::Fork => "fork",
        }
    }

    /// The field of [`Options`] that gives the reason for its absence.
    fn option(self) -> &'static str {
        match self {
            Need::LiveProcesses => "without_live_processes",
            Need::Env => "without_env",
            _ => "(none: lifecycle operations need no reason)",
        }
    }
}

/// How one case went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It passed.
    Passed,
    /// It failed, and why.
    Failed(String),
    /// It did not run, and why: a need the provider lacks (with the reason the options give,
    /// which a case of its own checks), or [`Options::only`].
    LeftOut(String),
}

/// The outcome of every case.
#[derive(Clone, Debug)]
pub struct Report {
    /// The provider's name.
    pub name: String,
    /// Each case by name, in the order of [`CASES`].
    pub cases: Vec<(String, Outcome, Duration)>,
}

/// What a case's `LeftOut` says when [`Options::only`] left it out.
const NOT_CHOSEN: &str = "not among Options::only";

impl Report {
    /// The names of the failed cases.
    pub fn failed(&self) -> Vec<&str> {
        self.cases
            .iter()
            .filter(|(_, o, _)| matches!(o, Outcome::Failed(_)))
            .map(|(n, _, _)| n.as_str())
            .collect()
    }

    /// Print the report and panic unless every case passed, or was left out for a need the
    /// provider declares it lacks (whose reason its own case then checked). A case
    /// [`Options::only`] left out fails it: a report of some cases is not a provider's pass.
    pub fn assert_all_passed(&self) {
        let mut text = format!("conformance of {}:\n", self.name);
        for (name, outcome, took) in &self.cases {
            let line = match outcome {
                Outcome::Passed => format!("  ok      {name} ({:.1}s)\n", took.as_secs_f64()),
                Outcome::Failed(why) => format!("  FAILED  {name}: {why}\n"),
                Outcome::LeftOut(why) => format!("  left out {name}: {why}\n"),
            };
            text.push_str(&line);
        }
        eprint!("{text}");
        assert!(self.failed().is_empty(), "{text}");
        let unchosen: Vec<&str> = self
            .cases
            .iter()
            .filter(|(_, o, _)| matches!(o, Outcome::LeftOut(why) if why == NOT_CHOSEN))
            .map(|(n, _, _)| n.as_str())
            .collect();
        assert!(
            unchosen.is_empty(),
            "{}: Options::only left out {unchosen:?}\n{text}",
            self.name
        );
    }
}

type CaseResult = Result<(), String>;

/// A case's run, borrowing what it is given.
type CaseFuture<'a> = Pin<Box<dyn Future<Output = CaseResult> + Send + 'a>>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// When a case runs.
#[derive(Clone, Copy, Debug)]
pub enum Gate {
    /// Where the provider declares every one of these (none: always).
    Needs(&'static [Need]),
    /// Where the provider declares it lacks this, or the options say it does: the case checks
    /// that the reason holds.
    Lacks(Need),
}

/// One case: its name (its function's), when it runs, and the function.
pub struct Case {
    name: &'static str,
    gate: Gate,
    /// It runs beside the others rather than in turn (the lifetime case waits a lifetime).
    beside: bool,
    run: for<'a> fn(&'a Cx) -> CaseFuture<'a>,
}

impl Case {
    /// Its name in the report.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// When it runs.
    pub fn gate(&self) -> Gate {
        self.gate
    }
}

/// A [`Case`] of the function `$f`, named after it, so a name can never differ from its case.
macro_rules! case {
    ($f:ident) => {
        case!($f, Gate::Needs(&[]))
    };
    ($f:ident, $gate:expr) => {
        Case {
            name: stringify!($f),
            gate: $gate,
            beside: false,
            run: |cx| Box::pin($f(cx)),
        }
    };
    ($f:ident, $gate:expr, beside) => {
        Case {
            name: stringify!($f),
            gate: $gate,
            beside: true,
            run: |cx| Box::pin($f(cx)),
        }
    };
}

const LIVE: Gate = Gate::Needs(&[Need::LiveProcesses]);

mod lifecycle;
use lifecycle::{
    a_sleeping_box_ends_at_its_deadline, extend_moves_the_deadline, fork_children_diverge, many_names_at_once,
    names_open_and_discard, relabel_replaces_the_host_labels, sleep_keeps_files_and_wakes, snapshot_and_make_from_it,
    undeclared_lifecycle_is_refused,
};

/// Every case, in the order [`run`] reports them: adding a case is one line here (a case
/// function not listed is dead code, which `clippy -D warnings` refuses).
pub static CASES: &[Case] = &[
    case!(
        lifetime_ends_the_box_with_no_call_from_the_host,
        Gate::Needs(&[]),
        beside
    ),
    case!(create_exec_destroy),
    case!(exit_codes_and_signals),
    case!(stdin_round_trip_and_eof, LIVE),
    case!(stdout_and_stderr_kept_apart),
    case!(sixteen_mib_of_output_without_deadlock),
    case!(host_environment_invisible_spec_env_visible, Gate::Needs(&[Need::Env])),
    case!(labels_and_list),
    case!(attach_from_a_fresh_provider),
    case!(concurrent_execs, LIVE),
    case!(abort_and_deadline_through_ctx, LIVE),
    case!(kill_ends_the_program, LIVE),
    case!(destroy_ends_every_program, LIVE),
    case!(typed_refusals),
    case!(upload_and_download),
    case!(working_directory),
    case!(a_missing_program),
    case!(without_live_processes, Gate::Lacks(Need::LiveProcesses)),
    case!(without_env, Gate::Lacks(Need::Env)),
    case!(names_open_and_discard, Gate::Needs(&[Need::Names])),
    case!(many_names_at_once, Gate::Needs(&[Need::Names])),
    case!(sleep_keeps_files_and_wakes, Gate::Needs(&[Need::Sleep])),
    case!(a_sleeping_box_ends_at_its_deadline, Gate::Needs(&[Need::Sleep]), beside),
    case!(extend_moves_the_deadline, Gate::Needs(&[Need::Extend]), beside),
    case!(relabel_replaces_the_host_labels, Gate::Needs(&[Need::Relabel])),
    case!(snapshot_and_make_from_it, Gate::Needs(&[Need::Snapshots])),
    case!(fork_children_diverge, Gate::Needs(&[Need::Fork])),
    case!(undeclared_lifecycle_is_refused),
];

/// No case may take forever: three minutes is far past any of them.
const CASE_LIMIT: Duration = Duration::from_secs(180);

/// Run every case against boxes of `make`'s providers.
pub async fn run(make: Factory, options: Options) -> Report {
    let provider = make().await;
    let honours = provider.honours();
    let suite = Arc::new(Suite {
        make,
        provider,
        honours,
        options,
        tag: unique_tag(),
    });
    let mut cases: Vec<(String, Outcome, Duration)> = Vec::new();
    if let Some(only) = &suite.options.only {
        for name in only {
            if !CASES.iter().any(|c| c.name == name) {
                cases.push((
                    name.clone(),
                    Outcome::Failed(format!("Options::only names no case {name:?}")),
                    Duration::ZERO,
                ));
            }
        }
    }
    // A case that runs beside the others starts first and is reported in its place.
    let mut beside = Vec::new();
    let mut slots: Vec<Option<(String, Outcome, Duration)>> = Vec::new();
    for case in CASES {
        let (name, plan) = suite.plan(case);
        match plan {
            Plan::Skip => slots.push(None),
            Plan::Report(outcome) => slots.push(Some((name, outcome, Duration::ZERO))),
            Plan::Run if case.beside => {
                let s = suite.clone();
                beside.push((slots.len(), name, tokio::spawn(async move { timed(s, case).await })));
                slots.push(None);
            }
            Plan::Run => {
                let (outcome, took) = timed(suite.clone(), case).await;
                slots.push(Some((name, outcome, took)));
            }
        }
    }
    for (at, name, task) in beside {
        let (outcome, took) = task
            .await
            .unwrap_or_else(|e| (Outcome::Failed(format!("the case panicked: {e}")), Duration::ZERO));
        slots[at] = Some((name, outcome, took));
    }
    cases.extend(slots.into_iter().flatten());
    if let Some(left) = suite.sweep().await {
        cases.push(("no_box_outlives_its_case".into(), Outcome::Failed(left), Duration::ZERO));
    }
    Report {
        name: suite.options.name.clone(),
        cases,
    }
}

/// What the suite does with a case.
enum Plan {
    /// Nothing: a check of a need the provider has, and the options do not deny.
    Skip,
    /// Report this without running it.
    Report(Outcome),
    /// Run it.
    Run,
}

struct Suite {
    make: Factory,
    provider: Arc<dyn Provider>,
    honours: Honours,
    options: Options,
    tag: String,
}

impl Suite {
    /// End any box of this run still listed once every case ended (one whose create a case's
    /// time limit cut short, say), and say which; `None` when there was none.
    async fn sweep(&self) -> Option<String> {
        let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
        let labels: Labels = [(TAG_LABEL.to_string(), self.tag.clone())].into();
        let left = match self.provider.list(&labels, &ctx).await {
            Ok(left) => left,
            Err(e) => return Some(format!("listing this run's boxes at its end: {e}")),
        };
        if left.is_empty() {
            return None;
        }
        let mut ids = Vec::new();
        for b in left {
            let _ = b.destroy(&ctx).await;
            ids.push(b.id().to_string());
        }
        Some(format!("boxes still ran after every case had ended: {ids:?}"))
    }

    /// The case's name in the report, and what to do with it.
    fn plan(&self, case: &Case) -> (String, Plan) {
        let chosen = self
            .options
            .only
            .as_ref()
            .is_none_or(|o| o.iter().any(|n| n == case.name));
        match case.gate {
            Gate::Needs(needs) => {
                let name = case.name.to_string();
                if !chosen {
                    return (name, Plan::Report(Outcome::LeftOut(NOT_CHOSEN.into())));
                }
                for &need in needs {
                    if need.declared(&self.honours) {
                        continue;
                    }
                    let outcome = match need.reason(&self.options) {
                        Some(why) => Outcome::LeftOut(why.into()),
                        None => Outcome::Failed(format!(
                            "needs {0}, which {1}'s honours() says it lacks, and Options::{2} gives no reason",
                            need.field(),
                            self.options.name,
                            need.option()
                        )),
                    };
                    return (name, Plan::Report(outcome));
                }
                (name, Plan::Run)
            }
            Gate::Lacks(need) => {
                let why = need.reason(&self.options);
                if need.declared(&self.honours) && why.is_none() {
                    return (case.name.to_string(), Plan::Skip);
                }
                let name = match why {
                    Some(why) => format!("{}: {why}", case.name),
                    None => case.name.to_string(),
                };
                if !chosen {
                    return (name, Plan::Report(Outcome::LeftOut(NOT_CHOSEN.into())));
                }
                (name, Plan::Run)
            }
        }
    }
}

/// Run one case, bounded by [`CASE_LIMIT`], and how long it took.
async fn timed(suite: Arc<Suite>, case: &'static Case) -> (Outcome, Duration) {
    let t = Instant::now();
    let cx = Arc::new(Cx::new(suite));
    let c = cx.clone();
    let mut task = tokio::spawn(async move { (case.run)(&c).await });
    let outcome = match tokio::time::timeout(CASE_LIMIT, &mut task).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(format!("the case panicked: {e}")),
        Err(_) => {
            task.abort();
            let _ = task.await;
            Err(format!("{} did not finish within {CASE_LIMIT:?}", case.name))
        }
    };
    let ended = cx.end_boxes().await;
    let outcome = match (outcome, ended.is_empty()) {
        (Ok(()), true) => Outcome::Passed,
        (Ok(()), false) => Outcome::Failed(ended.join("; ")),
        (Err(why), true) => Outcome::Failed(why),
        (Err(why), false) => Outcome::Failed(format!("{why}; {}", ended.join("; "))),
    };
    (outcome, t.elapsed())
}

/// What a case is given: the provider under test and the suite's options. Its providers
/// write down every box they make, so the suite ends each box when the case ends, however
/// it ends (passed, failed on any line, panicked, out of time): no case ends its own boxes.
struct Cx {
    suite: Arc<Suite>,
    provider: Arc<dyn Provider>,
    made: Made,
    /// The snapshots the case took, deleted when it ends.
    snapshots: Arc<Mutex<Vec<String>>>,
}

/// The boxes a case made.
type Made = Arc<Mutex<Vec<Arc<dyn Sandbox>>>>;

impl Cx {
    fn new(suite: Arc<Suite>) -> Self {
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

    fn options(&self) -> &Options {
        &self.suite.options
    }

    /// A fresh provider, as a new process would have (its boxes written down too).
    async fn fresh(&self) -> Arc<dyn Provider> {
        Arc::new(Tracked {
            inner: (self.suite.make)().await,
            made: self.made.clone(),
        })
    }

    /// End every box the case made that has not ended; what went wrong doing so.
    async fn end_boxes(&self) -> Vec<String> {
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

/// The provider under test, writing down each box it makes.
struct Tracked {
    inner: Arc<dyn Provider>,
    made: Made,
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
    fn note(&self, b: &Arc<dyn Sandbox>) {
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        made.retain(|m| m.id() != b.id());
        made.push(b.clone());
    }
}

/// The label every box of one run carries, valued with the run's tag.
const TAG_LABEL: &str = "agentbox-conformance";

fn unique_tag() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("c{}-{}", std::process::id(), nanos % 1_000_000_000)
}

fn argv(args: &[&str]) -> Vec<String> {
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
    fn live(&self) -> bool {
        self.suite.honours.live_processes
    }

    fn spec(&self) -> Spec {
        let mut s = self.options().base.clone();
        s.labels.insert(TAG_LABEL.into(), self.suite.tag.clone());
        s
    }

    async fn create(&self, spec: &Spec) -> Result<Arc<dyn Sandbox>, String> {
        let ctx = Ctx::background().with_timeout(Duration::from_secs(120));
        self.provider
            .create(spec, &ctx)
            .await
            .map_err(|e| format!("create: {e}"))
    }

    /// A new box of the suite's spec (ended by the suite when the case ends).
    async fn new_box(&self) -> Result<Arc<dyn Sandbox>, String> {
        self.create(&self.spec()).await
    }

    async fn sh(&self, b: &dyn Sandbox, script: &str) -> Result<Finished, String> {
        self.run_opts(b, &["sh", "-c", script], &ExecOptions::default(), Vec::new())
            .await
    }

    async fn run_opts(
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

    async fn alive_in_box(&self, b: &dyn Sandbox, pid: u32) -> Result<bool, String> {
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
    async fn start_sleeper(&self, b: &dyn Sandbox, ctx: &Ctx) -> Result<(Process, u32), String> {
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

    async fn gone_soon(&self, b: &dyn Sandbox, pid: u32) -> CaseResult {
        for _ in 0..100 {
            if !self.alive_in_box(b, pid).await? {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!("program {pid} still runs 10s after its context ended"))
    }

    async fn scatter(&self, b: &dyn Sandbox) -> Result<Vec<u32>, String> {
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

/// A box ends at its lifetime with every program it started, though the host never calls again
/// (it may have died): the provider, not the host, keeps the bound.
async fn lifetime_ends_the_box_with_no_call_from_the_host(cx: &Cx) -> CaseResult {
    // A label of its own, so the list below asks of this box alone, not of the boxes other
    // cases make and end meanwhile.
    let mut spec = cx.spec().label("conformance-case", "lifetime");
    spec.max_lifetime = cx.options().lifetime;
    let t = Instant::now();
    let b = cx.create(&spec).await?;
    let id = b.id().clone();
    let pids = if cx.live() { cx.scatter(&*b).await? } else { vec![] };
    // No call from the host from here on (the suite's record of the box calls nothing until
    // the case ends).
    drop(b);
    let limit = cx.options().lifetime + cx.options().grace;
    loop {
        let ended = cx.options().outside.ended(&id).await;
        let alive = !pids.is_empty() && cx.options().outside.any_alive(&id, &pids).await;
        if ended && !alive {
            break;
        }
        ensure!(
            t.elapsed() < limit,
            "{:.1}s after create (lifetime {:?}, grace {:?}), outside says ended={ended}, programs alive={alive}",
            t.elapsed().as_secs_f64(),
            cx.options().lifetime,
            cx.options().grace
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    ensure!(
        t.elapsed() + Duration::from_millis(500) >= cx.options().lifetime,
        "the box ended after {:?}, before its lifetime {:?}",
        t.elapsed(),
        cx.options().lifetime
    );
    let fresh = cx.fresh().await;
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    ensure!(
        fresh.attach(&id, &ctx).await.map_err(|e| e.to_string())?.is_none(),
        "attach handed back an ended box"
    );
    let listed = fresh.list(&spec.labels, &ctx).await.map_err(|e| e.to_string())?;
    ensure!(!listed.iter().any(|b| b.id() == &id), "list handed back an ended box");
    Ok(())
}

/// The life of a box: its id and facts name the provider, a program runs, and once destroyed
/// it reads ended, refuses work `gone`, destroys again quietly, and attach finds nothing.
async fn create_exec_destroy(cx: &Cx) -> CaseResult {
    let b = cx.create(&cx.spec()).await?;
    ensure!(
        b.id().provider() == cx.provider.name(),
        "id {} does not carry the provider {}",
        b.id(),
        cx.provider.name()
    );
    ensure!(
        b.facts().provider == cx.provider.name(),
        "facts name provider {:?}",
        b.facts().provider
    );
    let out = cx
        .run_opts(&*b, &["echo", "hello", "box"], &ExecOptions::default(), vec![])
        .await?;
    ensure!(out.status.code == 0, "echo exited {}", out.status.code);
    ensure!(out.stdout == b"hello box\n", "echo printed {:?}", out.stdout_text());
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    ensure!(
        matches!(b.status(&ctx).await, Ok(Status::Running)),
        "a new box is not running"
    );
    b.destroy(&ctx).await.map_err(|e| format!("destroy: {e}"))?;
    ensure!(
        matches!(b.status(&ctx).await, Ok(Status::Ended)),
        "a destroyed box does not read ended"
    );
    match b.exec(&argv(&["true"]), &ExecOptions::default(), &ctx).await {
        Err(e) if e.code() == ErrorCode::Gone => {}
        Err(e) => return Err(format!("exec on a destroyed box: {e}, expected gone")),
        Ok(_) => return Err("exec on a destroyed box started a program".into()),
    }
    match b.upload("x", b"1", &ctx).await {
        Err(e) if e.code() == ErrorCode::Gone => {}
        other => return Err(format!("upload to a destroyed box answered {other:?}, expected gone")),
    }
    b.destroy(&ctx)
        .await
        .map_err(|e| format!("a second destroy failed: {e}"))?;
    let again = cx
        .provider
        .attach(b.id(), &ctx)
        .await
        .map_err(|e| format!("attach: {e}"))?;
    ensure!(again.is_none(), "attach handed back a destroyed box");
    ensure!(
        cx.options().outside.ended(b.id()).await,
        "outside, the destroyed box has not ended"
    );
    Ok(())
}

/// An exit code comes back as the program gave it, and a signal as 128 plus its number.
async fn exit_codes_and_signals(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    for (script, want) in [
        ("exit 0", 0),
        ("exit 3", 3),
        ("exit 255", 255),
        ("kill -TERM $$", 143),
        ("kill -KILL $$", 137),
    ] {
        let out = cx.sh(&*b, script).await?;
        ensure!(
            out.status.code == want,
            "`{script}` gave {}, expected {want}",
            out.status.code
        );
    }
    let out = cx.sh(&*b, "kill -TERM $$").await?;
    ensure!(
        matches!(out.status.signal, None | Some(15)),
        "signal reported as {:?}",
        out.status.signal
    );
    Ok(())
}

/// Stdin streams while open (a line comes back before EOF), EOF is never lost, and every
/// byte value passes.
async fn stdin_round_trip_and_eof(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    // Streaming: a line goes in and comes back while stdin is still open.
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let mut p = b
        .exec(&argv(&["cat"]), &ExecOptions::default(), &ctx)
        .await
        .map_err(|e| e.to_string())?;
    let mut stdin = p.stdin.take().ok_or("no stdin")?;
    let mut lines = tokio::io::BufReader::new(p.stdout.take().ok_or("no stdout")?);
    stdin.write_all(b"ping\n").await.map_err(|e| e.to_string())?;
    stdin.flush().await.map_err(|e| e.to_string())?;
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(20), lines.read_line(&mut line))
        .await
        .map_err(|_| "cat did not echo a line while stdin was open")?
        .map_err(|e| e.to_string())?;
    ensure!(line == "ping\n", "cat echoed {line:?}");
    stdin.close().await.map_err(|e| e.to_string())?;
    let st = p.wait().await.map_err(|e| format!("cat after EOF: {e}"))?;
    ensure!(st.code == 0, "cat exited {}", st.code);

    // An empty stdin still ends: the EOF is not lost.
    for _ in 0..5 {
        let out = cx.run_opts(&*b, &["cat"], &ExecOptions::default(), vec![]).await?;
        ensure!(
            out.status.code == 0 && out.stdout.is_empty(),
            "cat of an empty stdin gave {:?}",
            out
        );
    }
    // Every byte value, a MiB of them.
    let data: Vec<u8> = (0..(1 << 20))
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let out = cx
        .run_opts(&*b, &["cat"], &ExecOptions::default(), data.clone())
        .await?;
    ensure!(
        out.stdout == data,
        "1 MiB through cat came back as {} different bytes",
        out.stdout.len()
    );
    Ok(())
}

/// Stdout and stderr arrive apart, each in order.
async fn stdout_and_stderr_kept_apart(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    let out = cx.sh(&*b, "echo out; echo err >&2; echo out2; echo err2 >&2").await?;
    ensure!(out.stdout == b"out\nout2\n", "stdout was {:?}", out.stdout_text());
    ensure!(out.stderr == b"err\nerr2\n", "stderr was {:?}", out.stderr_text());
    Ok(())
}

/// 16 MiB on each stream at once: both are read as they come, so neither blocks the other.
async fn sixteen_mib_of_output_without_deadlock(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    let script = "head -c 16777216 /dev/zero | tr '\\0' a & head -c 16777216 /dev/zero | tr '\\0' b >&2; wait";
    let out = cx.sh(&*b, script).await?;
    ensure!(out.status.code == 0, "exited {}", out.status.code);
    ensure!(out.stdout.len() == 16 << 20, "stdout had {} bytes", out.stdout.len());
    ensure!(out.stderr.len() == 16 << 20, "stderr had {} bytes", out.stderr.len());
    ensure!(
        out.stdout.iter().all(|&c| c == b'a'),
        "stdout holds bytes of stderr or garbage"
    );
    ensure!(
        out.stderr.iter().all(|&c| c == b'b'),
        "stderr holds bytes of stdout or garbage"
    );
    Ok(())
}

/// None of the host's variables reach a box; the spec's and the exec's do, as given, and an
/// exec's reach only that exec.
async fn host_environment_invisible_spec_env_visible(cx: &Cx) -> CaseResult {
    let value = "spaces, 'quotes', \"dq\", $dollar and ✓";
    let mut spec = cx.spec();
    spec.env.insert("AGENTBOX_CONFORMANCE_SPEC".into(), value.into());
    let b = cx.create(&spec).await?;
    let out = cx.run_opts(&*b, &["env"], &ExecOptions::default(), vec![]).await?;
    let text = out.stdout_text();
    let names: BTreeSet<&str> = text.lines().filter_map(|l| l.split_once('=').map(|(k, _)| k)).collect();
    // Names a box may have of its own whatever the host has.
    let own = [
        "PATH", "HOME", "TMPDIR", "PWD", "SHLVL", "_", "HOSTNAME", "LANG", "TERM", "USER", "LOGNAME", "SHELL", "OLDPWD",
    ];
    let leaked: Vec<String> = std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| !own.contains(&k.as_str()) && !k.starts_with("LC_") && names.contains(k.as_str()))
        .collect();
    ensure!(leaked.is_empty(), "the box sees the host's variables {leaked:?}");
    ensure!(
        text.lines().any(|l| l == format!("AGENTBOX_CONFORMANCE_SPEC={value}")),
        "the spec's env is not visible as given: {text:?}"
    );
    let mut opts = ExecOptions::default();
    opts.env.insert("AGENTBOX_CONFORMANCE_EXEC".into(), "per-exec".into());
    let out = cx
        .run_opts(&*b, &["sh", "-c", "echo \"$AGENTBOX_CONFORMANCE_EXEC\""], &opts, vec![])
        .await?;
    ensure!(
        out.stdout == b"per-exec\n",
        "the exec's env is not visible: {:?}",
        out.stdout_text()
    );
    let out = cx.sh(&*b, "echo \"${AGENTBOX_CONFORMANCE_EXEC-unset}\"").await?;
    ensure!(
        out.stdout == b"unset\n",
        "one exec's env reached the next: {:?}",
        out.stdout_text()
    );
    Ok(())
}

/// List finds boxes by every label asked, hands back the host's labels without the provider's
/// own, and forgets a destroyed box.
async fn labels_and_list(cx: &Cx) -> CaseResult {
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let run = format!("{}-list", cx.suite.tag);
    let mk = |n: &str| {
        let mut s = cx.spec();
        s.labels.insert("conformance-run".into(), run.clone());
        s.labels.insert("n".into(), n.into());
        s
    };
    let b1 = cx.create(&mk("1")).await?;
    let b2 = cx.create(&mk("2")).await?;
    let by = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Labels>()
    };
    let ids = |l: Vec<Arc<dyn Sandbox>>| l.iter().map(|b| b.id().clone()).collect::<BTreeSet<_>>();
    let both = cx
        .provider
        .list(&by(&[("conformance-run", &run)]), &ctx)
        .await
        .map_err(|e| format!("list: {e}"))?;
    ensure!(
        ids(both.clone()) == [b1.id().clone(), b2.id().clone()].into(),
        "list by run gave {:?}",
        ids(both)
    );
    let one = cx
        .provider
        .list(&by(&[("conformance-run", &run), ("n", "1")]), &ctx)
        .await
        .map_err(|e| e.to_string())?;
    ensure!(
        ids(one.clone()) == [b1.id().clone()].into(),
        "list by run and n=1 gave {:?}",
        ids(one.clone())
    );
    ensure!(
        one[0].labels() == &mk("1").labels,
        "a listed box's labels are {:?}",
        one[0].labels()
    );
    ensure!(
        !b1.labels().keys().any(|k| agentbox_core::is_reserved_label(k)),
        "the provider's own labels leak into the host's: {:?}",
        b1.labels()
    );
    let none = cx
        .provider
        .list(&by(&[("conformance-run", &run), ("n", "3")]), &ctx)
        .await
        .map_err(|e| e.to_string())?;
    ensure!(none.is_empty(), "list by a label no box has gave {} boxes", none.len());
    b2.destroy(&ctx).await.map_err(|e| e.to_string())?;
    let after = cx
        .provider
        .list(&by(&[("conformance-run", &run)]), &ctx)
        .await
        .map_err(|e| e.to_string())?;
    ensure!(
        ids(after.clone()) == [b1.id().clone()].into(),
        "after a destroy, list gave {:?}",
        ids(after)
    );
    Ok(())
}

/// A new provider (a new process) finds a box by id, runs in it and destroys it; attach of a
/// destroyed or unknown box is none, of another provider's id invalid.
async fn attach_from_a_fresh_provider(cx: &Cx) -> CaseResult {
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let b = cx.create(&cx.spec().label("attach", "yes")).await?;
    let fresh = cx.fresh().await;
    let a = fresh
        .attach(b.id(), &ctx)
        .await
        .map_err(|e| format!("attach: {e}"))?
        .ok_or("attach found no box")?;
    ensure!(a.id() == b.id(), "attach handed back {}", a.id());
    ensure!(
        a.labels() == b.labels(),
        "attach's labels {:?} differ from {:?}",
        a.labels(),
        b.labels()
    );
    let out = cx
        .run_opts(&*a, &["echo", "attached"], &ExecOptions::default(), vec![])
        .await?;
    ensure!(
        out.stdout == b"attached\n",
        "exec through the attached box printed {:?}",
        out.stdout_text()
    );
    a.destroy(&ctx)
        .await
        .map_err(|e| format!("destroy through attach: {e}"))?;
    ensure!(
        matches!(b.status(&ctx).await, Ok(Status::Ended)),
        "the first handle does not see the destroy"
    );
    ensure!(
        fresh.attach(b.id(), &ctx).await.map_err(|e| e.to_string())?.is_none(),
        "attach found a destroyed box"
    );
    let missing = agentbox_core::SandboxId::new(fresh.name(), "conformance-nosuchbox").map_err(|e| e.to_string())?;
    ensure!(
        fresh.attach(&missing, &ctx).await.map_err(|e| e.to_string())?.is_none(),
        "attach found a box that never was"
    );
    let foreign = agentbox_core::SandboxId::new("another-provider", "x").map_err(|e| e.to_string())?;
    match fresh.attach(&foreign, &ctx).await {
        Err(e) if e.code() == ErrorCode::Invalid => {}
        other => {
            return Err(format!(
                "attach of another provider's id answered {:?}, expected invalid",
                other.map(|o| o.is_some())
            ));
        }
    }
    Ok(())
}

/// Eight execs run in one box at once. No clock tells: each marks that it started, then waits
/// in the box until all eight marks are there, so each waits for a mark only a later exec
/// makes. Execs run one after another never get there; the deadline only bounds how long
/// such a provider is waited for. It needs live processes: eight programs alive together.
async fn concurrent_execs(cx: &Cx) -> CaseResult {
    const N: usize = 8;
    const WAIT: Duration = Duration::from_secs(30);
    /// `$1` marks its start in `started/`, then waits for `$2` marks.
    const SCRIPT: &str = "mkdir -p started && : > started/$1 && \
        while [ \"$(ls started | wc -l)\" -lt $2 ]; do sleep 0.02; done; echo $1";
    let b = cx.new_box().await?;
    // One deadline for all: a provider that runs them one at a time is told so within it.
    let ctx = Ctx::background().with_timeout(WAIT);
    let runs = (0..N).map(|i| {
        let (b, ctx) = (b.clone(), ctx.clone());
        async move {
            let (n, total) = (i.to_string(), N.to_string());
            let args = argv(&["sh", "-c", SCRIPT, "sh", &n, &total]);
            let out = match b.exec(&args, &ExecOptions::default(), &ctx).await {
                Ok(p) => finish(p, FinishOptions::default()).await,
                Err(e) => Err(e),
            };
            match out {
                Ok(out) => {
                    ensure!(
                        out.status.code == 0 && out.stdout_text() == format!("{i}\n"),
                        "exec {i} exited {} printing {:?} ({})",
                        out.status.code,
                        out.stdout_text(),
                        out.stderr_text()
                    );
                    Ok(())
                }
                Err(e) if matches!(e.code(), ErrorCode::Timeout | ErrorCode::Aborted) => Err(format!(
                    "exec {i} did not see all {N} execs started within {WAIT:?} ({e}): they ran, \
                     if at all, not all at once"
                )),
                Err(e) => Err(format!("exec {i}: {e}")),
            }
        }
    });
    for r in futures_join_all(runs).await {
        r?;
    }
    Ok(())
}

/// A program is governed by its exec's context: a deadline or a cancel ends it, and a context
/// already ended starts nothing.
async fn abort_and_deadline_through_ctx(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    // A deadline ends the program and wait answers timeout.
    let ctx = Ctx::background().with_timeout(Duration::from_millis(1500));
    let (mut p, pid) = cx.start_sleeper(&*b, &ctx).await?;
    let t = Instant::now();
    match p.wait().await {
        Err(e) if e.code() == ErrorCode::Timeout => {}
        other => return Err(format!("wait past the deadline answered {other:?}, expected timeout")),
    }
    ensure!(
        t.elapsed() < Duration::from_secs(15),
        "the deadline took {:?} to end the wait",
        t.elapsed()
    );
    cx.gone_soon(&*b, pid).await?;

    // A cancel ends the program and wait answers aborted.
    let ctx = Ctx::background();
    let (mut p, pid) = cx.start_sleeper(&*b, &ctx).await?;
    let c = ctx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        c.cancel();
    });
    match p.wait().await {
        Err(e) if e.code() == ErrorCode::Aborted => {}
        other => return Err(format!("wait after a cancel answered {other:?}, expected aborted")),
    }
    cx.gone_soon(&*b, pid).await?;

    // A context that already ended starts nothing.
    let dead = Ctx::background();
    dead.cancel();
    match b.exec(&argv(&["true"]), &ExecOptions::default(), &dead).await {
        Err(e) if e.code() == ErrorCode::Aborted => {}
        Err(e) => return Err(format!("exec with a cancelled context: {e}, expected aborted")),
        Ok(_) => return Err("exec with a cancelled context started a program".into()),
    }
    match cx.provider.create(&cx.spec(), &dead).await {
        Err(e) if e.code() == ErrorCode::Aborted => {}
        Err(e) => return Err(format!("create with a cancelled context: {e}, expected aborted")),
        Ok(_) => return Err("create with a cancelled context made a box".into()),
    }
    Ok(())
}

/// Kill ends the program, which exits 137.
async fn kill_ends_the_program(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let (mut p, pid) = cx.start_sleeper(&*b, &ctx).await?;
    p.kill().await.map_err(|e| format!("kill: {e}"))?;
    let st = p.wait().await.map_err(|e| format!("wait after kill: {e}"))?;
    ensure!(st.code == 137, "a killed program exited {}", st.code);
    cx.gone_soon(&*b, pid).await
}

/// Destroy ends every program of the box, also those that left the exec (background, setsid,
/// double fork), as seen from outside.
async fn destroy_ends_every_program(cx: &Cx) -> CaseResult {
    let b = cx.create(&cx.spec()).await?;
    let pids = cx.scatter(&*b).await?;
    ensure!(
        cx.options().outside.any_alive(b.id(), &pids).await,
        "outside, the scattered programs {pids:?} are not seen running"
    );
    b.destroy(&Ctx::background().with_timeout(Duration::from_secs(60)))
        .await
        .map_err(|e| format!("destroy: {e}"))?;
    for _ in 0..50 {
        if !cx.options().outside.any_alive(b.id(), &pids).await && cx.options().outside.ended(b.id()).await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "5s after destroy, outside sees programs {pids:?} or the box still"
    ))
}

/// A spec the provider cannot honour is refused `unsupported` and a malformed one `invalid`,
/// each naming the field, before anything is made.
async fn typed_refusals(cx: &Cx) -> CaseResult {
    let honours = cx.provider.honours();
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let expect = |spec: Spec, code: ErrorCode, field: &'static str| {
        let ctx = ctx.clone();
        async move {
            match cx.provider.create(&spec, &ctx).await {
                Err(e) if e.code() == code && e.message().contains(field) => Ok(()),
                Err(e) => Err(format!(
                    "a spec with {field} answered {e}, expected {code} naming {field}"
                )),
                Ok(_) => Err(format!("a spec with {field} made a box, expected {code}")),
            }
        }
    };
    let with = |f: &dyn Fn(&mut Spec)| {
        let mut s = cx.spec();
        f(&mut s);
        s
    };
    expect(
        with(&|s| s.max_lifetime = Duration::ZERO),
        ErrorCode::Invalid,
        "max_lifetime",
    )
    .await?;
    expect(
        with(&|s| drop(s.labels.insert("agentbox.mine".into(), "1".into()))),
        ErrorCode::Invalid,
        "labels",
    )
    .await?;
    expect(
        with(&|s| drop(s.env.insert("NOT-A-NAME".into(), "1".into()))),
        ErrorCode::Invalid,
        "env",
    )
    .await?;
    let u = ErrorCode::Unsupported;
    if !honours.snapshot {
        expect(with(&|s| s.snapshot = Some("snap".into())), u, "snapshot").await?;
    }
    if !honours.image {
        expect(with(&|s| s.image = Some("debian".into())), u, "image").await?;
    }
    if !honours.cpus {
        expect(with(&|s| s.cpus = Some(1.0)), u, "cpus").await?;
    }
    if !honours.memory {
        expect(with(&|s| s.memory_mb = Some(512)), u, "memory_mb").await?;
    }
    if !honours.gpu {
        expect(with(&|s| s.gpu = Some("T4".into())), u, "gpu").await?;
    }
    if !honours.region {
        expect(with(&|s| s.region = Some("eu-west".into())), u, "region").await?;
    }
    expect(
        with(&|s| s.isolation = Some("conformance-no-such-isolation".into())),
        u,
        "isolation",
    )
    .await?;
    if !honours.network_none {
        expect(with(&|s| s.network = Some(Network::None)), u, "network").await?;
    }
    if !honours.network_allowlist {
        expect(
            with(&|s| s.network = Some(Network::Allow(vec!["example.com".into()]))),
            u,
            "network",
        )
        .await?;
    }
    if !honours.ports {
        expect(
            with(&|s| {
                s.ports.push(PortSpec {
                    port: 8080,
                    kind: PortKind::Tcp,
                })
            }),
            u,
            "ports",
        )
        .await?;
    }
    if !honours.capabilities.iter().any(|c| c == "fuse") {
        expect(with(&|s| s.capabilities.push("fuse".into())), u, "capabilities").await?;
    }
    if !honours.mounts {
        let m = agentbox_core::Mount {
            source: "/tmp".into(),
            target: "/mnt/x".into(),
            read_only: true,
        };
        expect(with(&|s| s.mounts.push(m.clone())), u, "mounts").await?;
    }
    if !honours.workspace {
        expect(with(&|s| s.workspace = Some("/workspace".into())), u, "workspace").await?;
    }
    // Argv is checked too.
    let b = cx.new_box().await?;
    match b.exec(&[], &ExecOptions::default(), &Ctx::background()).await {
        Err(e) if e.code() == ErrorCode::Invalid => Ok(()),
        Err(e) => Err(format!("an empty argv answered {e}, expected invalid")),
        Ok(_) => Err("an empty argv started a program".into()),
    }
}

/// Upload and download carry every byte value, make parent directories, replace a file, and
/// answer `not_found` and `too_large`.
async fn upload_and_download(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let data: Vec<u8> = (0..(1 << 20)).map(|i: u32| (i % 251) as u8).collect();
    b.upload("conf/sub/every-byte.bin", &data, &ctx)
        .await
        .map_err(|e| format!("upload: {e}"))?;
    let back = b
        .download("conf/sub/every-byte.bin", 2 << 20, &ctx)
        .await
        .map_err(|e| format!("download: {e}"))?;
    ensure!(
        back == data,
        "download gave {} bytes that differ from the upload",
        back.len()
    );
    let out = cx.sh(&*b, "wc -c < conf/sub/every-byte.bin").await?;
    ensure!(
        out.stdout_text().trim() == "1048576",
        "a program sees {:?} bytes of the upload",
        out.stdout_text()
    );
    b.upload("conf/sub/every-byte.bin", b"short", &ctx)
        .await
        .map_err(|e| format!("second upload: {e}"))?;
    let back = b
        .download("conf/sub/every-byte.bin", 100, &ctx)
        .await
        .map_err(|e| e.to_string())?;
    ensure!(
        back == b"short",
        "an upload over a file left {:?}",
        String::from_utf8_lossy(&back)
    );
    match b.download("conf/none", 100, &ctx).await {
        Err(e) if e.code() == ErrorCode::NotFound => {}
        other => {
            return Err(format!(
                "download of a missing file answered {:?}, expected not_found",
                other.map(|v| v.len())
            ));
        }
    }
    match b.download("conf/sub/every-byte.bin", 3, &ctx).await {
        Err(e) if e.code() == ErrorCode::TooLarge => {}
        other => {
            return Err(format!(
                "download over its bound answered {:?}, expected too_large",
                other.map(|v| v.len())
            ));
        }
    }
    Ok(())
}

/// A program starts in the exec's cwd, relative to the workspace or absolute; a missing one is
/// `not_found`.
async fn working_directory(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    b.upload("wd/inner/f", b"x", &ctx).await.map_err(|e| e.to_string())?;
    let opts = ExecOptions {
        cwd: Some("wd/inner".into()),
        ..Default::default()
    };
    let out = cx.run_opts(&*b, &["sh", "-c", "pwd; cat f"], &opts, vec![]).await?;
    let text = out.stdout_text();
    ensure!(text.ends_with("/wd/inner\nx"), "a relative cwd gave {text:?}");
    let opts = ExecOptions {
        cwd: Some("/".into()),
        ..Default::default()
    };
    let out = cx.run_opts(&*b, &["pwd"], &opts, vec![]).await?;
    ensure!(out.stdout == b"/\n", "cwd / gave {:?}", out.stdout_text());
    let opts = ExecOptions {
        cwd: Some("wd/no-such-dir".into()),
        ..Default::default()
    };
    match b.exec(&argv(&["pwd"]), &opts, &ctx).await {
        Err(e) if e.code() == ErrorCode::NotFound => Ok(()),
        Err(e) => Err(format!("a missing cwd answered {e}, expected not_found")),
        Ok(_) => Err("a missing cwd started a program".into()),
    }
}

/// A program that does not exist is `not_found`, or exit code 127.
async fn a_missing_program(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    match b
        .exec(
            &argv(&["agentbox-conformance-no-such-program"]),
            &ExecOptions::default(),
            &ctx,
        )
        .await
    {
        Err(e) if e.code() == ErrorCode::NotFound => Ok(()),
        Err(e) => Err(format!("a missing program answered {e}, expected not_found")),
        Ok(p) => {
            let out = finish(p, FinishOptions::default()).await.map_err(|e| e.to_string())?;
            ensure!(
                out.status.code == 127,
                "a missing program exited {}, expected not_found or 127",
                out.status.code
            );
            Ok(())
        }
    }
}

/// Where the provider says it keeps no program running between calls: that holds. Its
/// `honours()` and every box's facts say so, and a program's stdin is refused.
async fn without_live_processes(cx: &Cx) -> CaseResult {
    lacks(cx, Need::LiveProcesses)?;
    let b = cx.new_box().await?;
    ensure!(
        !b.facts().live_processes,
        "the facts say live_processes, but honours() and the options say the provider has none"
    );
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let mut p = b
        .exec(&argv(&["cat"]), &ExecOptions::default(), &ctx)
        .await
        .map_err(|e| e.to_string())?;
    match p.stdin.as_mut() {
        None => Ok(()),
        Some(stdin) => match stdin.write_all(b"x").await {
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => Ok(()),
            other => Err(format!(
                "stdin of a box without live processes answered {other:?}, expected unsupported"
            )),
        },
    }
}

/// Where the provider says its boxes carry no environment: that holds. Its `honours()` says
/// so, and a spec with env is refused `unsupported`, naming env.
async fn without_env(cx: &Cx) -> CaseResult {
    lacks(cx, Need::Env)?;
    let spec = cx.spec().env("AGENTBOX_CONFORMANCE", "1");
    match cx.provider.create(&spec, &Ctx::background()).await {
        Err(e) if e.code() == ErrorCode::Unsupported && e.message().contains("env") => Ok(()),
        Err(e) => Err(format!("a spec with env answered {e}, expected unsupported naming env")),
        Ok(_) => Err("a spec with env made a box, but the options say boxes carry none".into()),
    }
}

/// The first check of a need's absence: the provider's `honours()` does not declare it
/// (options that leave out what the provider says it has are wrong, not a reason).
fn lacks(cx: &Cx, need: Need) -> CaseResult {
    ensure!(
        !need.declared(&cx.suite.honours),
        "Options::{} says {:?}, but honours() declares {}",
        need.option(),
        need.reason(cx.options()).unwrap_or_default(),
        need.field()
    );
    Ok(())
}

/// Await every future, concurrently, in order.
async fn futures_join_all<F: Future>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let futs: Vec<_> = futs.into_iter().map(Box::pin).collect();
    let mut out = Vec::with_capacity(futs.len());
    let mut pending: Vec<_> = futs.into_iter().map(Some).collect();
    let mut results: Vec<Option<F::Output>> = (0..pending.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (i, slot) in pending.iter_mut().enumerate() {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => {
                        results[i] = Some(v);
                        *slot = None;
                    }
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.extend(results.into_iter().flatten());
    out
}

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

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentbox_core::{Ctx, Honours, Labels, Provider, SandboxId, Spec};
use async_trait::async_trait;

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

mod boxes;
mod cx;
mod files;
mod lifecycle;
mod programs;
mod refusals;

use boxes::{
    attach_from_a_fresh_provider, create_exec_destroy, destroy_ends_every_program, labels_and_list,
    lifetime_ends_the_box_with_no_call_from_the_host,
};
use cx::{Cx, TAG_LABEL, unique_tag};
use files::upload_and_download;
use lifecycle::{
    a_sleeping_box_ends_at_its_deadline, extend_moves_the_deadline, fork_children_diverge, many_names_at_once,
    names_open_and_discard, relabel_replaces_the_host_labels, sleep_keeps_files_and_wakes, snapshot_and_make_from_it,
    undeclared_lifecycle_is_refused,
};
use programs::{
    a_missing_program, abort_and_deadline_through_ctx, concurrent_execs, exit_codes_and_signals,
    host_environment_invisible_spec_env_visible, kill_ends_the_program, sixteen_mib_of_output_without_deadlock,
    stdin_round_trip_and_eof, stdout_and_stderr_kept_apart, without_env, without_live_processes, working_directory,
};
use refusals::typed_refusals;

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

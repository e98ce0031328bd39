//! The conformance suite itself: what gates its cases, and that it fails a provider that
//! misbehaves (each over local boxes, through a wrapper that changes one thing).

use std::collections::BTreeSet;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{
    Ctx, Endpoint, ExecOptions, ExitStatus, Facts, FinishOptions, Honours, Labels, Lifecycle, Process, ProcessControl,
    Provider, Result, Sandbox, SandboxId, Spec, Status, finish,
};
use agentbox_providers::{LocalOptions, LocalProvider};
use agentbox_testing::conformance::{self, CASES, Options, Outcome, Outside, Report};
use agentbox_testing::fake::{FakeProvider, Match, Op, Outcome as FakeOutcome};
use agentbox_testing::outside::LocalView;
use async_trait::async_trait;

fn local(root: &Path) -> Arc<dyn Provider> {
    agentbox_testing::runner::ensure();
    Arc::new(LocalProvider::new(LocalOptions::at(root).unwrap()).unwrap())
}

/// How [`Changed`] changes the provider under it.
#[derive(Clone, Copy, Default)]
struct Changes {
    /// Keep no program running between calls: each exec runs to its end before `exec`
    /// returns (its output then replayed, no stdin), and honours and facts say so, as a
    /// provider with no live processes would.
    batch: bool,
    /// One exec at a time in a box: the next starts once the last ended (each runs to its end
    /// before `exec` returns, as with `batch`).
    one_at_a_time: bool,
    /// A box's `facts()` panics (after `create` made it).
    facts_panic: bool,
}

const BATCH: Changes = Changes {
    batch: true,
    one_at_a_time: false,
    facts_panic: false,
};

/// A provider over local boxes with [`Changes`].
struct Changed {
    inner: Arc<dyn Provider>,
    changes: Changes,
}

impl Changed {
    fn wrap(&self, b: Arc<dyn Sandbox>) -> Arc<dyn Sandbox> {
        let mut facts = b.facts().clone();
        facts.live_processes &= !self.changes.batch;
        Arc::new(ChangedBox {
            inner: b,
            facts,
            changes: self.changes,
            turn: tokio::sync::Mutex::new(()),
        })
    }
}

#[async_trait]
impl Provider for Changed {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn honours(&self) -> Honours {
        let h = self.inner.honours();
        Honours {
            live_processes: h.live_processes && !self.changes.batch,
            ..h
        }
    }
    async fn create(&self, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        Ok(self.wrap(self.inner.create(spec, ctx).await?))
    }
    async fn attach(&self, id: &SandboxId, ctx: &Ctx) -> Result<Option<Arc<dyn Sandbox>>> {
        Ok(self.inner.attach(id, ctx).await?.map(|b| self.wrap(b)))
    }
    async fn list(&self, labels: &Labels, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        Ok(self
            .inner
            .list(labels, ctx)
            .await?
            .into_iter()
            .map(|b| self.wrap(b))
            .collect())
    }
}

struct ChangedBox {
    inner: Arc<dyn Sandbox>,
    facts: Facts,
    changes: Changes,
    /// Held through an exec when execs run one at a time.
    turn: tokio::sync::Mutex<()>,
}

/// A program that already ended.
struct Ended(ExitStatus);

#[async_trait]
impl ProcessControl for Ended {
    async fn wait(&self) -> Result<ExitStatus> {
        Ok(self.0)
    }
    async fn signal(&self, _signal: i32) -> Result<()> {
        Ok(())
    }
}

#[async_trait]
impl Sandbox for ChangedBox {
    fn id(&self) -> &SandboxId {
        self.inner.id()
    }
    fn facts(&self) -> &Facts {
        assert!(!self.changes.facts_panic, "facts() panics, as the test asked");
        &self.facts
    }
    fn labels(&self) -> &Labels {
        self.inner.labels()
    }
    async fn exec(&self, argv: &[String], opts: &ExecOptions, ctx: &Ctx) -> Result<Process> {
        let _turn = match self.changes.one_at_a_time {
            true => Some(ctx.run(self.turn.lock()).await?),
            false => None,
        };
        let p = self.inner.exec(argv, opts, ctx).await?;
        if !self.changes.batch && !self.changes.one_at_a_time {
            return Ok(p);
        }
        // Run to its end (holding the turn, when execs take turns).
        let out = finish(
            p,
            FinishOptions {
                stdin: vec![],
                max_output: 64 << 20,
            },
        )
        .await?;
        Ok(Process::new(
            None,
            Some(Box::pin(Cursor::new(out.stdout))),
            Some(Box::pin(Cursor::new(out.stderr))),
            Arc::new(Ended(out.status)),
            ctx,
        ))
    }
    async fn status(&self, ctx: &Ctx) -> Result<Status> {
        self.inner.status(ctx).await
    }
    async fn upload(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<()> {
        self.inner.upload(path, data, ctx).await
    }
    async fn download(&self, path: &str, max_bytes: u64, ctx: &Ctx) -> Result<Vec<u8>> {
        self.inner.download(path, max_bytes, ctx).await
    }
    async fn endpoint(&self, port: u16, ctx: &Ctx) -> Result<Endpoint> {
        self.inner.endpoint(port, ctx).await
    }
    async fn destroy(&self, ctx: &Ctx) -> Result<()> {
        self.inner.destroy(ctx).await
    }
}

/// Local boxes under `root`, through [`Changed`] when `changes` is given.
fn factory(root: PathBuf, changes: Option<Changes>) -> conformance::Factory {
    conformance::factory(move || {
        let root = root.clone();
        async move {
            let inner = local(&root);
            match changes {
                Some(changes) => Arc::new(Changed { inner, changes }) as Arc<dyn Provider>,
                None => inner,
            }
        }
    })
}

fn options(name: &str, root: &Path, only: &[&str]) -> Options {
    let mut o = Options::new(
        name,
        Duration::from_secs(3),
        Duration::from_secs(4),
        Arc::new(LocalView {
            boxes: root.join("boxes"),
        }),
    );
    o.only = Some(only.iter().map(|s| s.to_string()).collect());
    o
}

fn outcome<'r>(report: &'r Report, name: &str) -> &'r Outcome {
    report
        .cases
        .iter()
        .find(|(n, _, _)| n == name)
        .map(|(_, o, _)| o)
        .unwrap_or_else(|| panic!("no case {name} in {:?}", report.cases))
}

fn failed_saying(report: &Report, name: &str, words: &str) {
    match outcome(report, name) {
        Outcome::Failed(why) if why.contains(words) => {}
        other => panic!("{name}: {other:?}, expected a failure saying {words:?}"),
    }
}

#[test]
fn every_case_has_a_name_of_its_own() {
    let names: BTreeSet<&str> = CASES.iter().map(|c| c.name()).collect();
    assert_eq!(names.len(), CASES.len(), "two cases share a name");
    assert!(names.contains("concurrent_execs") && names.contains("without_live_processes"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_need_the_provider_lacks_with_no_reason_given_fails_the_cases_that_need_it() {
    let root = tempfile::tempdir().unwrap();
    let only = [
        "stdin_round_trip_and_eof",
        "kill_ends_the_program",
        "exit_codes_and_signals",
        "without_live_processes",
    ];
    let report = conformance::run(
        factory(root.path().into(), Some(BATCH)),
        options("batch, no reason", root.path(), &only),
    )
    .await;
    for name in ["stdin_round_trip_and_eof", "kill_ends_the_program"] {
        failed_saying(&report, name, "Options::without_live_processes gives no reason");
    }
    assert_eq!(outcome(&report, "exit_codes_and_signals"), &Outcome::Passed);
    // The check of the lack runs though no reason was given (and holds here).
    assert_eq!(outcome(&report, "without_live_processes"), &Outcome::Passed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lack_with_its_reason_leaves_its_cases_out_and_the_reason_is_checked() {
    let root = tempfile::tempdir().unwrap();
    let only = [
        "stdin_round_trip_and_eof",
        "kill_ends_the_program",
        "exit_codes_and_signals",
        "without_live_processes",
    ];
    let mut o = options("batch", root.path(), &only);
    o.without_live_processes = Some("each exec runs to its end".into());
    let report = conformance::run(factory(root.path().into(), Some(BATCH)), o).await;
    for name in ["stdin_round_trip_and_eof", "kill_ends_the_program"] {
        assert_eq!(
            outcome(&report, name),
            &Outcome::LeftOut("each exec runs to its end".into())
        );
    }
    assert_eq!(outcome(&report, "exit_codes_and_signals"), &Outcome::Passed);
    assert_eq!(
        outcome(&report, "without_live_processes: each exec runs to its end"),
        &Outcome::Passed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reason_for_lacking_what_the_provider_declares_is_refused_and_its_cases_still_run() {
    let root = tempfile::tempdir().unwrap();
    let mut o = options(
        "local",
        root.path(),
        &["kill_ends_the_program", "without_live_processes"],
    );
    o.without_live_processes = Some("because".into());
    let report = conformance::run(factory(root.path().into(), None), o).await;
    assert_eq!(outcome(&report, "kill_ends_the_program"), &Outcome::Passed);
    failed_saying(
        &report,
        "without_live_processes: because",
        "but honours() declares live_processes",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_of_some_cases_is_not_a_pass_and_an_unknown_case_fails() {
    let root = tempfile::tempdir().unwrap();
    let report = conformance::run(
        factory(root.path().into(), None),
        options("local", root.path(), &["a_missing_program"]),
    )
    .await;
    assert_eq!(outcome(&report, "a_missing_program"), &Outcome::Passed);
    assert!(report.failed().is_empty(), "{:?}", report.cases);
    let all = std::panic::catch_unwind(|| report.assert_all_passed());
    assert!(all.is_err(), "a report Options::only cut short passed");

    let report = conformance::run(
        factory(root.path().into(), None),
        options("local", root.path(), &["no_such_case"]),
    )
    .await;
    failed_saying(&report, "no_such_case", "names no case");
}

/// An outside view that never sees a program run.
struct Blind;

#[async_trait]
impl Outside for Blind {
    async fn ended(&self, _id: &SandboxId) -> bool {
        true
    }
    async fn any_alive(&self, _id: &SandboxId, _pids: &[u32]) -> bool {
        false
    }
}

/// The boxes alive under `root`, as a provider of its own lists them.
async fn alive(root: &Path) -> Vec<String> {
    let listed = local(root).list(&Labels::new(), &Ctx::background()).await.unwrap();
    listed.iter().map(|b| b.id().to_string()).collect()
}

/// Every box of the run has ended, each by the end of its own case (none was left for the
/// sweep at the end of the run).
async fn every_box_ended_with_its_case(root: &Path, report: &Report) {
    assert_eq!(alive(root).await, Vec::<String>::new(), "{:?}", report.cases);
    assert!(
        report.cases.iter().all(|(n, _, _)| n != "no_box_outlives_its_case"),
        "{:?}",
        report.cases
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_case_that_fails_between_its_create_and_its_destroy_still_ends_its_box() {
    let root = tempfile::tempdir().unwrap();
    // Echo's output is lost: create_exec_destroy fails between its create and its destroy.
    let fake = FakeProvider::over(local(root.path()));
    fake.on(Match::command("echo"), FakeOutcome::DropOutput, None);
    let f = fake.clone();
    let report = conformance::run(
        conformance::factory(move || {
            let f = f.clone();
            async move { Arc::new(f) as Arc<dyn Provider> }
        }),
        options("fake over local, echo mute", root.path(), &["create_exec_destroy"]),
    )
    .await;
    failed_saying(&report, "create_exec_destroy", "echo printed");
    every_box_ended_with_its_case(root.path(), &report).await;
    let made = fake.calls_of(Op::Create);
    assert_eq!(made.len(), 1);
    let id = SandboxId::new("local", made[0].box_id.as_deref().unwrap()).unwrap();
    assert!(fake.ended(&id), "{id} was never destroyed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_case_whose_check_fails_before_it_destroys_still_ends_its_box() {
    let root = tempfile::tempdir().unwrap();
    // The outside sees nothing run, so destroy's case fails before it destroys.
    let mut o = options("local, seen by the blind", root.path(), &["destroy_ends_every_program"]);
    o.outside = Arc::new(Blind);
    let report = conformance::run(factory(root.path().into(), None), o).await;
    failed_saying(&report, "destroy_ends_every_program", "not seen running");
    every_box_ended_with_its_case(root.path(), &report).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_case_that_panics_still_ends_its_box() {
    let root = tempfile::tempdir().unwrap();
    let changes = Changes {
        facts_panic: true,
        ..Changes::default()
    };
    let report = conformance::run(
        factory(root.path().into(), Some(changes)),
        options("local, facts panic", root.path(), &["create_exec_destroy"]),
    )
    .await;
    failed_saying(&report, "create_exec_destroy", "panicked");
    every_box_ended_with_its_case(root.path(), &report).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execs_run_one_after_another_fail_concurrent_execs() {
    let root = tempfile::tempdir().unwrap();
    let serial = Changes {
        one_at_a_time: true,
        ..Changes::default()
    };
    let report = conformance::run(
        factory(root.path().into(), Some(serial)),
        options("local, one exec at a time", root.path(), &["concurrent_execs"]),
    )
    .await;
    failed_saying(&report, "concurrent_execs", "not all at once");
    every_box_ended_with_its_case(root.path(), &report).await;
    // The same boxes with execs at once pass: it is the order that fails.
    let report = conformance::run(
        factory(root.path().into(), Some(Changes::default())),
        options("local through the wrapper", root.path(), &["concurrent_execs"]),
    )
    .await;
    assert_eq!(outcome(&report, "concurrent_execs"), &Outcome::Passed);
}

/// How [`Lying`] lies about the lifecycle of the local boxes under it.
#[derive(Clone, Copy, Default, PartialEq)]
enum Lie {
    /// None: every operation reaches the boxes.
    #[default]
    None,
    /// `extend` answers the box with its deadline unmoved.
    Extend,
    /// `sleep` answers Ok and does nothing.
    Sleep,
    /// `fork` answers new boxes that lack the forked box's files.
    Fork,
    /// `honours()` declares no snapshots, yet taking one works.
    UndeclaredSnapshots,
}

/// Local boxes whose lifecycle passes through, but for one [`Lie`].
struct Lying {
    inner: Arc<dyn Provider>,
    lie: Lie,
}

#[async_trait]
impl Provider for Lying {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn honours(&self) -> Honours {
        let h = self.inner.honours();
        Honours {
            snapshots: h.snapshots && self.lie != Lie::UndeclaredSnapshots,
            ..h
        }
    }
    async fn create(&self, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        self.inner.create(spec, ctx).await
    }
    async fn attach(&self, id: &SandboxId, ctx: &Ctx) -> Result<Option<Arc<dyn Sandbox>>> {
        self.inner.attach(id, ctx).await
    }
    async fn list(&self, labels: &Labels, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        self.inner.list(labels, ctx).await
    }

    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        Some(self)
    }
}

#[async_trait]
impl Lifecycle for Lying {
    async fn sleep(&self, id: &SandboxId, ctx: &Ctx) -> Result<()> {
        match self.lie {
            Lie::Sleep => Ok(()),
            _ => self.inner.sleep(id, ctx).await,
        }
    }

    async fn wake(&self, id: &SandboxId, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        self.inner.wake(id, ctx).await
    }

    async fn extend(&self, id: &SandboxId, ends_at_ms: u64, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        match self.lie {
            Lie::Extend => Ok(self.inner.attach(id, ctx).await?.expect("the box runs")),
            _ => self.inner.extend(id, ends_at_ms, ctx).await,
        }
    }

    async fn snapshot(&self, id: &SandboxId, name: &str, ctx: &Ctx) -> Result<agentbox_core::Snapshot> {
        self.inner.snapshot(id, name, ctx).await
    }

    async fn delete_snapshot(&self, name: &str, ctx: &Ctx) -> Result<bool> {
        self.inner.delete_snapshot(name, ctx).await
    }

    async fn fork(&self, id: &SandboxId, n: usize, spec: &Spec, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        if self.lie != Lie::Fork {
            return self.inner.fork(id, n, spec, ctx).await;
        }
        agentbox_core::check_fork_count(n)?;
        let mut made = Vec::new();
        for _ in 0..n {
            made.push(self.inner.create(spec, ctx).await?);
        }
        Ok(made)
    }
}

fn lying(root: PathBuf, lie: Lie) -> conformance::Factory {
    conformance::factory(move || {
        let root = root.clone();
        async move {
            Arc::new(Lying {
                inner: local(&root),
                lie,
            }) as Arc<dyn Provider>
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lifecycle_that_lies_fails_its_case() {
    let root = tempfile::tempdir().unwrap();
    for (lie, case, words) in [
        (Lie::Extend, "extend_moves_the_deadline", "facts say it ends at"),
        (Lie::Sleep, "sleep_keeps_files_and_wakes", "status is Running"),
        (Lie::Fork, "fork_children_diverge", "lacks the parent's file"),
        (
            Lie::UndeclaredSnapshots,
            "undeclared_lifecycle_is_refused",
            "honours().snapshots is false",
        ),
    ] {
        let report = conformance::run(
            lying(root.path().into(), lie),
            options("local, lying", root.path(), &[case]),
        )
        .await;
        failed_saying(&report, case, words);
        every_box_ended_with_its_case(root.path(), &report).await;
    }
    // Told no lie, the same wrapper passes them.
    let cases = [
        "extend_moves_the_deadline",
        "sleep_keeps_files_and_wakes",
        "fork_children_diverge",
        "undeclared_lifecycle_is_refused",
    ];
    let report = conformance::run(
        lying(root.path().into(), Lie::None),
        options("local, truthful", root.path(), &cases),
    )
    .await;
    for case in cases {
        assert_eq!(outcome(&report, case), &Outcome::Passed, "{case}");
    }
}

//! The conformance suite itself: what gates its cases, and that it fails a provider that
//! misbehaves (each over local boxes, through a wrapper that changes one thing).

use std::collections::BTreeSet;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{
    Ctx, Endpoint, ExecOptions, ExitStatus, Facts, FinishOptions, Honours, Labels, Process, ProcessControl, Provider,
    Result, Sandbox, SandboxId, Spec, Status, finish,
};
use agentbox_providers::{LocalOptions, LocalProvider};
use agentbox_testing::conformance::{self, CASES, Options, Outcome, Report};
use agentbox_testing::outside::LocalView;
use async_trait::async_trait;

fn local(root: &Path) -> Arc<dyn Provider> {
    Arc::new(LocalProvider::new(LocalOptions::at(root).expect("the agentbox-runner binary")).unwrap())
}

/// How [`Batch`] changes the provider under it.
#[derive(Clone, Copy, Default)]
struct Changes {
    /// One exec at a time in a box: the next starts once the last ended.
    one_at_a_time: bool,
}

/// A provider over local boxes that keeps no program running between calls: each exec runs
/// to its end before `exec` returns (its output then replayed, no stdin), and its honours and
/// facts say so, as a provider with no live processes would.
struct Batch {
    inner: Arc<dyn Provider>,
    changes: Changes,
}

impl Batch {
    fn wrap(&self, b: Arc<dyn Sandbox>) -> Arc<dyn Sandbox> {
        let mut facts = b.facts().clone();
        facts.live_processes = false;
        Arc::new(BatchBox {
            inner: b,
            facts,
            changes: self.changes,
            turn: tokio::sync::Mutex::new(()),
        })
    }
}

#[async_trait]
impl Provider for Batch {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn honours(&self) -> Honours {
        Honours {
            live_processes: false,
            ..self.inner.honours()
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

struct BatchBox {
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
impl Sandbox for BatchBox {
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
        let _turn = match self.changes.one_at_a_time {
            true => Some(ctx.run(self.turn.lock()).await?),
            false => None,
        };
        let p = self.inner.exec(argv, opts, ctx).await?;
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

/// Local boxes under `root`, through [`Batch`] when `changes` is given.
fn factory(root: PathBuf, changes: Option<Changes>) -> conformance::Factory {
    conformance::factory(move || {
        let root = root.clone();
        async move {
            let inner = local(&root);
            match changes {
                Some(changes) => Arc::new(Batch { inner, changes }) as Arc<dyn Provider>,
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
        factory(root.path().into(), Some(Changes::default())),
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
    let report = conformance::run(factory(root.path().into(), Some(Changes::default())), o).await;
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

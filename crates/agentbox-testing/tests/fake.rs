//! The fake provider: what each scripted outcome does, what it records, and the conformance
//! suite passing over it (on a real provider, with no rule scripted).

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, ErrorCode, ExecOptions, FinishOptions, Provider, SandboxId, Spec, Status, finish};
use agentbox_providers::{LocalOptions, LocalProvider};
use agentbox_testing::conformance::{self, Options, Outside};
use agentbox_testing::fake::{FakeClock, FakeProvider, Match, Op, Outcome, Preset, ProgramOutput};
use agentbox_testing::outside::running;
use async_trait::async_trait;

fn argv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

fn echo_fake() -> FakeProvider {
    let fake = FakeProvider::with("fake", FakeClock::manual(1_000_000), Some(Preset::modal_like()));
    fake.program("echo", |c| async move {
        ProgramOutput {
            code: 0,
            stdout: format!("{}\n{}", c.argv[1..].join(" "), String::from_utf8_lossy(&c.stdin)).into_bytes(),
            stderr: b"to stderr".to_vec(),
        }
    });
    fake
}

#[tokio::test]
async fn programs_files_and_lifetimes_on_the_fake_clock() {
    let fake = echo_fake();
    let ctx = Ctx::background();
    let b = fake.create(&Spec::new(Duration::from_secs(60)), &ctx).await.unwrap();
    assert_eq!(b.facts().isolation, "vm");
    assert_eq!(b.facts().fuse, Some(true));
    let out = finish(
        b.exec(&argv(&["echo", "hi"]), &ExecOptions::default(), &ctx)
            .await
            .unwrap(),
        FinishOptions {
            stdin: b"in".to_vec(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        (out.status.code, out.stdout_text(), out.stderr_text()),
        (0, "hi\nin".into(), "to stderr".into())
    );
    let missing = finish(
        b.exec(&argv(&["nope"]), &ExecOptions::default(), &ctx).await.unwrap(),
        FinishOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(missing.status.code, 127);
    b.upload("f", b"bytes", &ctx).await.unwrap();
    assert_eq!(b.download("f", 100, &ctx).await.unwrap(), b"bytes");
    assert_eq!(b.download("f", 2, &ctx).await.unwrap_err().code(), ErrorCode::TooLarge);
    // Time moves only when the test says.
    fake.clock().advance(Duration::from_secs(59));
    assert_eq!(b.status(&ctx).await.unwrap(), Status::Running);
    fake.clock().advance(Duration::from_secs(1));
    assert_eq!(b.status(&ctx).await.unwrap(), Status::Ended);
    assert_eq!(
        b.exec(&argv(&["echo"]), &ExecOptions::default(), &ctx)
            .await
            .err()
            .map(|e| e.code()),
        Some(ErrorCode::Gone)
    );
    assert!(fake.attach(b.id(), &ctx).await.unwrap().is_none());
}

#[tokio::test]
async fn every_call_is_recorded_with_env_names_never_values_and_leaks_are_found() {
    let fake = echo_fake();
    let ctx = Ctx::background();
    let spec = Spec::new(Duration::from_secs(60)).label("session", "s-1");
    let b = fake.create(&spec, &ctx).await.unwrap();
    let mut opts = ExecOptions::default();
    opts.env.insert("API_MODE".into(), "s3cr3t-value".into());
    let p = b.exec(&argv(&["echo", "visible"]), &opts, &ctx).await.unwrap();
    finish(
        p,
        FinishOptions {
            stdin: b"typed-token".to_vec(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    b.upload("/tmp/x", b"uploaded-token", &ctx).await.unwrap();
    let calls = fake.calls();
    let ops: Vec<Op> = calls.iter().map(|c| c.op).collect();
    assert_eq!(ops, [Op::Create, Op::Exec, Op::Upload]);
    assert_eq!(calls[1].env_names, ["API_MODE"]);
    assert!(fake.leaks("s3cr3t-value").is_empty(), "env values are never recorded");
    assert_eq!(fake.leaks("uploaded-token").len(), 1);
    assert_eq!(fake.leaks("visible").len(), 1);
    assert_eq!(fake.leaks("s-1").len(), 1, "the spec's labels are recorded");
    assert!(fake.leaks("never-seen").is_empty());
}

#[tokio::test]
async fn scripted_outcomes() {
    let fake = echo_fake();
    let ctx = Ctx::background();
    // A typed failure, once; then as usual.
    let label = fake.on(
        Match::op(Op::Create),
        Outcome::Fail(ErrorCode::Unknown, "capacity".into()),
        Some(1),
    );
    let e = fake
        .create(&Spec::new(Duration::from_secs(60)), &ctx)
        .await
        .err()
        .unwrap();
    assert_eq!((e.code(), e.message()), (ErrorCode::Unknown, "capacity"));
    assert_eq!(fake.calls()[0].rule.as_deref(), Some(label.as_str()));
    assert_eq!(fake.calls()[0].result, "unknown");
    let b = fake.create(&Spec::new(Duration::from_secs(600)), &ctx).await.unwrap();
    // A refusal.
    fake.on(Match::command("rm"), Outcome::Refuse("not here".into()), Some(1));
    assert_eq!(
        b.exec(&argv(&["rm"]), &ExecOptions::default(), &ctx)
            .await
            .err()
            .map(|e| e.code()),
        Some(ErrorCode::Refused)
    );
    // A scripted exit runs nothing.
    fake.on(Match::command("make"), Outcome::Exit(2), Some(1));
    let out = finish(
        b.exec(&argv(&["make"]), &ExecOptions::default(), &ctx).await.unwrap(),
        FinishOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(out.status.code, 2);
    // Dropped and truncated output.
    fake.on(Match::command("echo"), Outcome::DropOutput, Some(1));
    let out = finish(
        b.exec(&argv(&["echo", "gone"]), &ExecOptions::default(), &ctx)
            .await
            .unwrap(),
        FinishOptions::default(),
    )
    .await
    .unwrap();
    assert!(out.stdout.is_empty() && out.stderr.is_empty());
    fake.on(Match::command("echo"), Outcome::TruncateOutput(3), Some(1));
    let out = finish(
        b.exec(&argv(&["echo", "abcdef"]), &ExecOptions::default(), &ctx)
            .await
            .unwrap(),
        FinishOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(out.stdout, b"abc");
    // A hang ends on the call's deadline.
    fake.on(Match::op(Op::Status), Outcome::Hang, Some(1));
    let e = b
        .status(&ctx.with_timeout(Duration::from_millis(100)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Timeout);
    // A lost end of stdin: the program waits for EOF until its context ends.
    fake.on(Match::command("echo"), Outcome::LoseStdinEof, Some(1));
    let p = b
        .exec(
            &argv(&["echo"]),
            &ExecOptions::default(),
            &ctx.with_timeout(Duration::from_millis(200)),
        )
        .await
        .unwrap();
    let e = finish(p, FinishOptions::default()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Timeout);
    // A delay runs on the fake clock.
    fake.on(Match::op(Op::Status), Outcome::Delay(Duration::from_secs(30)), Some(1));
    let waiting = {
        let b = b.clone();
        tokio::spawn(async move { b.status(&Ctx::background()).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiting.is_finished(), "waits for the clock");
    fake.clock().advance(Duration::from_secs(30));
    assert_eq!(waiting.await.unwrap().unwrap(), Status::Running);
    // The box goes away mid-exec: that exec and every later call fail gone.
    fake.on(Match::command("echo"), Outcome::GoneMidExec, Some(1));
    let p = b.exec(&argv(&["echo"]), &ExecOptions::default(), &ctx).await.unwrap();
    assert_eq!(
        finish(p, FinishOptions::default()).await.unwrap_err().code(),
        ErrorCode::Gone
    );
    assert_eq!(b.status(&ctx).await.unwrap(), Status::Ended);
    // Matching by nth call.
    fake.on(
        Match {
            op: Some(Op::Create),
            nth: Some(4),
            ..Default::default()
        },
        Outcome::Fail(ErrorCode::TooLarge, "fourth".into()),
        None,
    );
    assert!(fake.create(&Spec::new(Duration::from_secs(1)), &ctx).await.is_ok());
    assert_eq!(
        fake.create(&Spec::new(Duration::from_secs(1)), &ctx)
            .await
            .err()
            .unwrap()
            .code(),
        ErrorCode::TooLarge
    );
}

/// The fake's own table, and this machine's processes.
struct FakeView(FakeProvider);

#[async_trait]
impl Outside for FakeView {
    async fn ended(&self, id: &SandboxId) -> bool {
        self.0.ended(id)
    }
    async fn any_alive(&self, _id: &SandboxId, pids: &[u32]) -> bool {
        pids.iter().any(|&p| running(p))
    }
}

/// A create that fails after the box was made (the seed's `leakBox`): the caller sees the
/// error, and the box is there all the same, listed with its labels until its lifetime ends.
#[tokio::test]
async fn a_create_can_fail_and_leave_its_box_behind() {
    let fake = echo_fake();
    let ctx = Ctx::background();
    fake.on(
        Match::op(Op::Create),
        Outcome::FailLeakingBox(ErrorCode::Unknown, "the answer was lost".into()),
        Some(1),
    );
    let spec = Spec::new(Duration::from_secs(60)).label("session", "s1");
    let e = fake.create(&spec, &ctx).await.expect_err("the create fails");
    assert_eq!((e.code(), e.message()), (ErrorCode::Unknown, "the answer was lost"));
    let calls = fake.calls_of(Op::Create);
    assert_eq!(calls[0].result, "unknown");
    let leaked = calls[0].box_id.clone().expect("the failed create made a box");
    let listed = fake.list(&spec.labels, &ctx).await.unwrap();
    assert_eq!(listed.len(), 1, "list finds it");
    assert_eq!(listed[0].id().name(), leaked);
    assert_eq!(listed[0].status(&ctx).await.unwrap(), Status::Running);
    // The next create is not scripted: a second box, and the leaked one is still there.
    fake.create(&spec, &ctx).await.unwrap();
    assert_eq!(fake.list(&spec.labels, &ctx).await.unwrap().len(), 2);
    fake.clock().advance(Duration::from_secs(60));
    assert!(
        fake.list(&spec.labels, &ctx).await.unwrap().is_empty(),
        "its lifetime ends it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_real_provider_with_nothing_scripted_it_passes_the_conformance_suite() {
    let home = tempfile::tempdir().unwrap();
    agentbox_testing::runner::ensure();
    let local = LocalProvider::new(LocalOptions::at(home.path()).unwrap()).unwrap();
    let fake = FakeProvider::over(Arc::new(local));
    let options = Options::new(
        "fake over local",
        Duration::from_secs(3),
        Duration::from_secs(4),
        Arc::new(FakeView(fake.clone())),
    );
    let f = fake.clone();
    let report = conformance::run(
        conformance::factory(move || {
            let f = f.clone();
            async move { Arc::new(f) as Arc<dyn Provider> }
        }),
        options,
    )
    .await;
    report.assert_all_passed();
    assert!(fake.calls().len() > 50, "every call went through the fake");
}

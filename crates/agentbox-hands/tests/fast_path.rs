//! BoxEnv's fast path: on a box with a runner, file operations are messages to the runner and
//! start no process in the box (the fake provider, over a local box with a runner, counts the
//! execs); on a box without one, each is an exec.

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Provider, Spec};
use agentbox_hands::{BoxEnv, ExecutionEnv};
use agentbox_providers::{LocalOptions, LocalProvider};
use agentbox_testing::fake::{FakeProvider, Op};

async fn file_ops(env: &BoxEnv, ctx: &Ctx) {
    env.write_file("d/a.txt", b"one", ctx).await.unwrap();
    env.append_file("d/a.txt", b" two", ctx).await.unwrap();
    assert_eq!(env.read_text_file("d/a.txt", ctx).await.unwrap(), "one two");
    assert_eq!(env.file_info("d/a.txt", ctx).await.unwrap().size, 7);
    assert_eq!(env.list_dir("d", ctx).await.unwrap().len(), 1);
    env.rename_file("d/a.txt", "d/b.txt", ctx).await.unwrap();
    env.truncate_file("d/b.txt", 3, ctx).await.unwrap();
    assert!(env.exists("d/b.txt", ctx).await.unwrap());
    env.create_dir("e/f", true, ctx).await.unwrap();
    env.remove("d", true, false, ctx).await.unwrap();
    assert!(!env.exists("d", ctx).await.unwrap());
}

async fn execs_for_file_ops(runner: bool) -> usize {
    let home = tempfile::tempdir().unwrap();
    agentbox_testing::runner::ensure();
    let mut opts = LocalOptions::at(home.path()).unwrap();
    opts.runner = runner;
    let fake = FakeProvider::over(Arc::new(LocalProvider::new(opts).unwrap()));
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let b = fake.create(&Spec::new(Duration::from_secs(120)), &ctx).await.unwrap();
    assert_eq!(b.files().is_some(), runner);
    let env = BoxEnv::new(b.clone());
    let before = fake.calls_of(Op::Exec).len();
    file_ops(&env, &ctx).await;
    let execs = fake.calls_of(Op::Exec).len() - before;
    b.destroy(&ctx).await.unwrap();
    execs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_runner_file_operations_start_no_process() {
    assert_eq!(execs_for_file_ops(true).await, 0);
    // The same operations without a runner: a process each.
    assert!(execs_for_file_ops(false).await >= 10);
}

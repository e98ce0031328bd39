//! Namespace boxes against the conformance suite (with and without the runner's file
//! operations), and boxes whose creator was SIGKILLed.

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, ExecOptions, FinishOptions, Provider, Spec, finish};
use agentbox_providers::helper::HelperCommand;
use agentbox_providers::namespace::{NamespaceOptions, NamespaceProvider};
use agentbox_testing::conformance::{self, Options};
use agentbox_testing::outside::NamespaceView;

fn options(root: &std::path::Path, runner_files: bool) -> NamespaceOptions {
    NamespaceOptions {
        runner_files,
        ..NamespaceOptions {
            runner: HelperCommand::new(agentbox_testing::runner::ensure(), vec![]),
            ..NamespaceOptions::at(root).unwrap()
        }
    }
}

fn provider(root: &std::path::Path, runner_files: bool) -> Arc<dyn Provider> {
    Arc::new(NamespaceProvider::new(options(root, runner_files)).unwrap())
}

async fn conformance(runner_files: bool, name: &str) {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().to_path_buf();
    let outside = Arc::new(NamespaceView {
        boxes: path.join("namespace"),
    });
    let options = Options::new(name, Duration::from_secs(3), Duration::from_secs(4), outside);
    let report = conformance::run(
        conformance::factory(move || {
            let path = path.clone();
            async move { provider(&path, runner_files) }
        }),
        options,
    )
    .await;
    report.assert_all_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_boxes_pass_the_conformance_suite() {
    conformance(true, "namespace").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_boxes_without_the_runners_file_operations_pass_the_conformance_suite() {
    conformance(false, "namespace, files by programs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_box_runs_a_program_as_its_own_root_with_no_capability() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path(), true);
    let ctx = Ctx::background();
    let b = p.create(&Spec::new(Duration::from_secs(60)), &ctx).await.unwrap();
    eprintln!("{:#?}", b.facts());
    let proc = b
        .exec(
            &[
                "sh".into(),
                "-c".into(),
                "id -u; pwd; grep -E 'CapEff|NoNewPrivs|Seccomp:' /proc/self/status; echo $$".into(),
            ],
            &ExecOptions::default(),
            &ctx,
        )
        .await
        .unwrap();
    let out = finish(proc, FinishOptions::default()).await.unwrap();
    eprintln!("{} {}", out.stdout_text(), out.stderr_text());
    let text = out.stdout_text();
    assert!(text.starts_with("0\n/workspace\n"), "{text}");
    assert!(text.contains("CapEff:\t0000000000000000"), "{text}");
    b.destroy(&ctx).await.unwrap();
}

//! The one-binary install: with `agentbox` alone (no `agentbox-runner` beside it), `agentbox`
//! is every part of the runner a box needs. The namespace and Docker providers are given the
//! helper the CLI gives them in that install (`agentbox runner`, [`HelperCommand`] with
//! `["runner"]`), and their conformance and isolation suites run whole: the namespace box's
//! keeper, init and runner, a Docker box's init, runner, relay and egress proxy, and the probes
//! inside both are `agentbox` started under the runner's name.

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::Provider;
use agentbox_providers::docker::{DockerOptions, DockerProvider, RUNNER_IN_BOX};
use agentbox_providers::helper::HelperCommand;
use agentbox_providers::namespace::{NamespaceOptions, NamespaceProvider};
use agentbox_testing::outside::{DockerCli, NamespaceView};
use agentbox_testing::services::docker_available;
use agentbox_testing::{conformance, isolation};

/// `agentbox`, copied alone into a directory of its own, as the CLI passes itself to
/// providers. The directory lives as long as the test.
fn agentbox_alone() -> (tempfile::TempDir, HelperCommand) {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("agentbox");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_agentbox"), &exe).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_agentbox"), &exe).unwrap();
    }
    assert!(!dir.path().join("agentbox-runner").exists());
    (dir, HelperCommand::new(exe, vec!["runner".into()]))
}

fn namespace(root: &std::path::Path, runner: &HelperCommand) -> Arc<dyn Provider> {
    let opts = NamespaceOptions {
        runner: runner.clone(),
        ..NamespaceOptions::at(root).unwrap()
    };
    Arc::new(NamespaceProvider::new(opts).unwrap())
}

async fn docker(runner: &HelperCommand) -> Arc<dyn Provider> {
    let opts = DockerOptions {
        runner: Some(runner.clone()),
        ..DockerOptions::default()
    };
    Arc::new(DockerProvider::new(opts).await.expect("the Docker daemon answers"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_boxes_with_agentbox_alone_pass_the_conformance_and_isolation_suites() {
    let (_bin, runner) = agentbox_alone();
    let root = tempfile::tempdir().unwrap();
    let path = root.path().to_path_buf();
    let outside = Arc::new(NamespaceView {
        boxes: path.join("namespace"),
    });
    let options = conformance::Options::new(
        "namespace, agentbox alone",
        Duration::from_secs(3),
        Duration::from_secs(4),
        outside,
    );
    let made = runner.clone();
    let report = conformance::run(
        conformance::factory(move || {
            let (path, runner) = (path.clone(), made.clone());
            async move { namespace(&path, &runner) }
        }),
        options,
    )
    .await;
    report.assert_all_passed();

    let report = isolation::run(
        namespace(root.path(), &runner),
        isolation::Options::new("namespace, agentbox alone", agentbox_protocol::namespace::RUNNER),
    )
    .await;
    report.assert_all_held_but(&[(
        "memory_unbounded",
        "cgroup v1 here: memory is refused in specs and the limits fact says so",
    )]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_boxes_with_agentbox_alone_pass_the_conformance_and_isolation_suites() {
    if !docker_available("docker_boxes_with_agentbox_alone_pass_the_conformance_and_isolation_suites") {
        return;
    }
    let (_bin, runner) = agentbox_alone();
    let options = conformance::Options::new(
        "docker, agentbox alone",
        Duration::from_secs(5),
        Duration::from_secs(10),
        Arc::new(DockerCli),
    );
    let made = runner.clone();
    let report = conformance::run(
        conformance::factory(move || {
            let runner = made.clone();
            async move { docker(&runner).await }
        }),
        options,
    )
    .await;
    report.assert_all_passed();

    let report = isolation::run(
        docker(&runner).await,
        isolation::Options::new("docker, agentbox alone", RUNNER_IN_BOX),
    )
    .await;
    report.assert_all_held();
}

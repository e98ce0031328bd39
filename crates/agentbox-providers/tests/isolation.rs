//! The isolation suite against every isolating provider on this machine, and its control: a
//! local box, which isolates nothing, must breach most of the same cases.

use std::sync::Arc;

use agentbox_core::Provider;
use agentbox_providers::docker::{DockerOptions, DockerProvider, RUNNER_IN_BOX};
use agentbox_providers::helper::HelperCommand;
use agentbox_providers::{LocalOptions, LocalProvider};
use agentbox_testing::isolation::{self, Options};
use agentbox_testing::services::docker_available;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_docker_box_holds_every_case() {
    if !docker_available("a_default_docker_box_holds_every_case") {
        return;
    }
    let opts = DockerOptions {
        runner: Some(HelperCommand::new(agentbox_testing::runner::ensure(), vec![])),
        ..DockerOptions::default()
    };
    let p: Arc<dyn Provider> = Arc::new(DockerProvider::new(opts).await.expect("the Docker daemon answers"));
    let report = isolation::run(p, Options::new("docker", RUNNER_IN_BOX)).await;
    eprintln!("{report:#?}");
    report.assert_all_held();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_box_that_keeps_its_capabilities_says_so_and_breaches_those_cases() {
    if !docker_available("a_docker_box_that_keeps_its_capabilities_says_so_and_breaches_those_cases") {
        return;
    }
    let opts = DockerOptions {
        runner: Some(HelperCommand::new(agentbox_testing::runner::ensure(), vec![])),
        keep_capabilities: true,
        ..DockerOptions::default()
    };
    let p: Arc<dyn Provider> = Arc::new(DockerProvider::new(opts).await.expect("the Docker daemon answers"));
    let report = isolation::run(p, Options::new("docker, capabilities kept", RUNNER_IN_BOX)).await;
    let verdict = |name: &str| report.cases.iter().find(|c| c.0 == name).map(|c| c.1.clone()).unwrap();
    assert!(
        matches!(verdict("capabilities_held"), isolation::Verdict::Breach(_)),
        "{report:?}"
    );
    assert!(
        matches!(verdict("privileges_gained_by_exec"), isolation::Verdict::Breach(_)),
        "{report:?}"
    );
    // The profile still refuses io_uring and new namespaces, capabilities or not.
    assert_eq!(verdict("io_uring_set_up"), isolation::Verdict::Held, "{report:?}");
    assert_eq!(verdict("host_file_by_path"), isolation::Verdict::Held, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_box_breaches_most_cases_as_the_control() {
    let root = tempfile::tempdir().unwrap();
    let runner = agentbox_testing::runner::ensure();
    let p: Arc<dyn Provider> = Arc::new(LocalProvider::new(LocalOptions::at(root.path()).unwrap()).unwrap());
    let report = isolation::run(p, Options::new("local", &runner.to_string_lossy())).await;
    eprintln!("{report:#?}");
    report.assert_mostly_breached();
}

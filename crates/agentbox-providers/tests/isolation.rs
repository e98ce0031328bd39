//! The isolation suite against every isolating provider on this machine (Docker, namespace, and
//! kube over the fake API server), and its control: a local box, which isolates nothing, must
//! breach most of the same cases.

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
    assert_eq!(verdict("user_namespace_made"), isolation::Verdict::Held, "{report:?}");
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

fn namespace_provider(root: &std::path::Path) -> Arc<dyn Provider> {
    use agentbox_providers::namespace::{NamespaceOptions, NamespaceProvider};
    let opts = NamespaceOptions {
        runner: HelperCommand::new(agentbox_testing::runner::ensure(), vec![]),
        ..NamespaceOptions::at(root).unwrap()
    };
    Arc::new(NamespaceProvider::new(opts).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_box_holds_every_case_but_memory_which_it_states_it_does_not_bound() {
    let root = tempfile::tempdir().unwrap();
    let p = namespace_provider(root.path());
    let report = isolation::run(p, Options::new("namespace", agentbox_protocol::namespace::RUNNER)).await;
    eprintln!("{report:#?}");
    report.assert_all_held_but(&[(
        "memory_unbounded",
        "cgroup v1 here: memory is refused in specs and the limits fact says so",
    )]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_box_reaches_the_hosts_loopback_and_interfaces_only_with_network_host() {
    use agentbox_core::{Ctx, Network, NetworkFact, Spec};
    let root = tempfile::tempdir().unwrap();
    let p = namespace_provider(root.path());
    let ctx = Ctx::background();
    let spec = |network| Spec {
        network,
        ..Spec::new(std::time::Duration::from_secs(60))
    };
    let none = p.create(&spec(Some(Network::None)), &ctx).await.unwrap();
    assert_eq!(
        none.facts().interfaces.as_deref(),
        Some(&["lo".to_string()][..]),
        "{:?}",
        none.facts()
    );
    // No policy: a network of its own, out through the egress proxy, this machine kept out.
    let default = p.create(&spec(None), &ctx).await.unwrap();
    assert_eq!(
        default.facts().network,
        Some(NetworkFact::Public),
        "{:?}",
        default.facts()
    );
    for b in [&none, &default] {
        assert_eq!(isolation::loopback_reached(b.as_ref()).await, isolation::Verdict::Held);
        assert_eq!(isolation::interfaces_seen(b.as_ref()).await, isolation::Verdict::Held);
    }
    // The control: the same cases breach a box that shares this machine's network, asked for
    // outright.
    let host = p.create(&spec(Some(Network::Host)), &ctx).await.unwrap();
    assert_eq!(host.facts().network, Some(NetworkFact::Host));
    assert!(matches!(
        isolation::loopback_reached(host.as_ref()).await,
        isolation::Verdict::Breach(_)
    ));
    assert!(matches!(
        isolation::interfaces_seen(host.as_ref()).await,
        isolation::Verdict::Breach(_)
    ));
    for b in [none, default, host] {
        b.destroy(&ctx).await.unwrap();
    }
}

/// A pod of the fake Kubernetes API server (whose kubelet runs each pod as a namespace box,
/// under the pod's hardened spec): the same cases, through the kube provider's exec and its
/// runner's probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kube_box_holds_every_case_but_memory_which_the_fake_kubelet_does_not_bound() {
    use agentbox_fakes::kube::{FakeKube, FakeKubeOptions};
    use agentbox_providers::kube::{KubeOptions, KubeProvider};
    let Some(rootfs) = agentbox_testing::services::rootfs(
        "a_kube_box_holds_every_case_but_memory_which_the_fake_kubelet_does_not_bound",
    ) else {
        return;
    };
    let fake = FakeKube::start(FakeKubeOptions {
        rootfs: Some(rootfs.into()),
        ..Default::default()
    })
    .await
    .expect("the fake API server starts");
    let opts = KubeOptions {
        kubeconfig: Some(fake.kubeconfig().to_path_buf()),
        runner: Some(HelperCommand::new(agentbox_testing::runner::ensure(), vec![])),
        ..Default::default()
    };
    let p: Arc<dyn Provider> = Arc::new(KubeProvider::new(opts).await.expect("the kubeconfig reads"));
    let report = isolation::run(p, Options::new("kube", "/agentbox/agentbox-runner")).await;
    eprintln!("{report:#?}");
    report.assert_all_held_but(&[
        (
            "memory_unbounded",
            "the fake kubelet runs pods as namespace boxes and bounds no memory (a real kubelet's cgroup does)",
        ),
        (
            "fork_bomb_unbounded",
            "a pod states no pids limit (a node's kubelet sets its own, which the pod cannot read)",
        ),
    ]);
}

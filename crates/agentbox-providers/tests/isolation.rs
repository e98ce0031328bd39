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

/// A Docker box run by gVisor's runsc: its programs meet gVisor's kernel, not this machine's,
/// and every case that guards this machine holds; the facts say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gvisor_docker_box_holds_every_case_of_this_machine() {
    if !agentbox_testing::services::gvisor_available("a_gvisor_docker_box_holds_every_case_of_this_machine") {
        return;
    }
    let opts = DockerOptions {
        runner: Some(HelperCommand::new(agentbox_testing::runner::ensure(), vec![])),
        ..DockerOptions::default()
    };
    let p: Arc<dyn Provider> = Arc::new(DockerProvider::new(opts).await.expect("the Docker daemon answers"));
    let mut options = Options::new("docker, gvisor", RUNNER_IN_BOX);
    options.spec.isolation = Some("gvisor".into());
    // gVisor's ptrace platform (the one these machines run: no nested virtualisation) makes
    // every system call a trap, so filling the memory limit or the process table does not end
    // within the cases' minutes; both bounds are the engine's cgroup, as for any Docker box.
    let slow = "gVisor's ptrace platform makes every system call a trap: it does not end in the case's time";
    options.left_out = vec![("memory_unbounded", slow.into()), ("fork_bomb_unbounded", slow.into())];
    let b = p
        .create(&options.spec, &agentbox_core::Ctx::background())
        .await
        .expect("a gVisor box");
    assert_eq!(b.facts().isolation, "gvisor");
    let kernel = agentbox_testing::sh(b.as_ref(), "dmesg | head -n 1; uname -r").await;
    assert!(
        kernel.stdout_text().starts_with("[    0.000000] Starting gVisor...\n"),
        "{}",
        kernel.stdout_text()
    );
    b.destroy(&agentbox_core::Ctx::background()).await.unwrap();
    // It has no network of its own: the open one is refused, naming why.
    let mut open = options.spec.clone();
    open.network = Some(agentbox_core::Network::Open);
    match p.create(&open, &agentbox_core::Ctx::background()).await {
        Ok(b) => panic!("a gVisor box with the open network was made: {}", b.id()),
        Err(e) => assert!(e.message().contains("--network=none"), "{e}"),
    }
    let report = isolation::run(p, options).await;
    eprintln!("{report:#?}");
    let verdict = |name: &str| report.cases.iter().find(|c| c.0 == name).map(|c| c.1.clone()).unwrap();
    // io_uring and new user namespaces are gVisor's own, served by its kernel in user space:
    // what those cases guard (this machine's kernel's code) is out of the box's reach.
    for case in ["io_uring_set_up", "user_namespace_made"] {
        assert!(
            matches!(verdict(case), isolation::Verdict::Breach(_)),
            "{case}: {report:?}"
        );
    }
    let others = isolation::Report {
        name: report.name.clone(),
        cases: report
            .cases
            .iter()
            .filter(|(n, _)| !["io_uring_set_up", "user_namespace_made"].contains(n))
            .cloned()
            .collect(),
    };
    others.assert_all_held_but(&[
        (
            "privileges_gained_by_exec",
            "gVisor's /proc/self/status states no NoNewPrivs",
        ),
        ("memory_unbounded", slow),
        ("fork_bomb_unbounded", slow),
    ]);
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

/// A namespace box sees this machine's `/` (read-only), where every daemon's socket is, yet
/// reaches none of them: not a socket made after the box started, in a directory no box masks,
/// with the network shared or with none. Its own unix sockets, in its `/tmp` and
/// `/workspace`, still work, stream and datagram, and so do its own abstract ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_box_reaches_no_host_unix_socket_and_its_own_still_work() {
    use agentbox_core::{Ctx, ExecOptions, FinishOptions, Network, Spec, finish};
    let root = tempfile::tempdir().unwrap();
    let p = namespace_provider(root.path());
    let ctx = Ctx::background();
    let runner = agentbox_protocol::namespace::RUNNER;
    for network in [None, Some(Network::None)] {
        let b = p
            .create(
                &Spec {
                    network: network.clone(),
                    ..Spec::new(std::time::Duration::from_secs(120))
                },
                &ctx,
            )
            .await
            .unwrap();
        assert_eq!(
            isolation::host_socket_reached(b.as_ref(), runner).await,
            isolation::Verdict::Held,
            "network {network:?}"
        );
        assert_eq!(
            isolation::host_abstract_socket_reached(b.as_ref(), runner).await,
            isolation::Verdict::Held,
            "network {network:?}"
        );
        for dir in ["/tmp", "/workspace"] {
            let argv: Vec<String> = vec![runner.into(), "probe".into(), format!("unix-self:{dir}")];
            let run = b
                .exec(
                    &argv,
                    &ExecOptions::default(),
                    &ctx.with_timeout(std::time::Duration::from_secs(30)),
                )
                .await
                .unwrap();
            let f = finish(run, FinishOptions::default()).await.unwrap();
            assert_eq!(
                f.status.code,
                0,
                "the box's own sockets in {dir} (network {network:?}): {}{}",
                f.stdout_text(),
                f.stderr_text()
            );
        }
        b.destroy(&ctx).await.unwrap();
    }
}

/// With its unix socket supervisor gone, a namespace box's unix calls fail (the kernel answers
/// ENOSYS) rather than go through unchecked: its own socket is no longer reached, and neither
/// is the host's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_box_whose_unix_socket_supervisor_is_gone_reaches_no_unix_socket() {
    use agentbox_core::{Ctx, ExecOptions, FinishOptions, Network, Spec, finish};
    let root = tempfile::tempdir().unwrap();
    let p = namespace_provider(root.path());
    let ctx = Ctx::background();
    let runner = agentbox_protocol::namespace::RUNNER;
    let b = p
        .create(
            &Spec {
                network: Some(Network::None),
                ..Spec::new(std::time::Duration::from_secs(120))
            },
            &ctx,
        )
        .await
        .unwrap();
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root.path().join("namespace").join(b.id().name()).join("record.json")).unwrap(),
    )
    .unwrap();
    let init = record["init_pid"].as_u64().unwrap() as u32;
    let status_field = |pid: u32, field: &str| -> Option<String> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        s.lines()
            .find_map(|l| l.strip_prefix(field))
            .map(|v| v.trim().to_string())
    };
    let keeper: u32 = status_field(init, "PPid:").unwrap().parse().unwrap();
    // The keeper's children: the init and the supervisor.
    let children = std::fs::read_to_string(format!("/proc/{keeper}/task/{keeper}/children")).unwrap();
    let supervisor: Vec<u32> = children
        .split_whitespace()
        .map(|c| c.parse().unwrap())
        .filter(|c| *c != init)
        .collect();
    assert_eq!(supervisor.len(), 1, "the keeper's children: {children:?}, init {init}");
    let supervisor = supervisor[0];
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(supervisor as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    // Dead (a zombie the keeper never reaps, or gone): its descriptors are closed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while status_field(supervisor, "State:").is_some_and(|s| !s.starts_with('Z')) {
        assert!(std::time::Instant::now() < deadline, "the supervisor did not die");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let argv: Vec<String> = vec![runner.into(), "probe".into(), "unix-self:/tmp".into()];
    let run = b
        .exec(
            &argv,
            &ExecOptions::default(),
            &ctx.with_timeout(std::time::Duration::from_secs(30)),
        )
        .await
        .unwrap();
    let f = finish(run, FinishOptions::default()).await.unwrap();
    assert_eq!(f.status.code, 3, "{}{}", f.stdout_text(), f.stderr_text());
    let expected = std::io::Error::from_raw_os_error(rustix::io::Errno::NOSYS.raw_os_error()).to_string();
    assert!(
        f.stdout_text().contains(&expected),
        "{} (expected {expected})",
        f.stdout_text()
    );
    assert_eq!(
        isolation::host_socket_reached(b.as_ref(), runner).await,
        isolation::Verdict::Held
    );
    b.destroy(&ctx).await.unwrap();
}

/// A socket is the box's to reach when it is on a mount the box may write, or one its spec
/// gave it: in a directory of the host's given as a mount, read-only or not, the host's socket
/// is reached (the user shared that directory, as a bind of a socket shares it with a Docker
/// container, `:ro` or not); in one of the host's the spec did not give (seen through the
/// host's read-only root), it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_box_reaches_a_socket_in_a_mount_its_spec_gave_read_only_or_not_and_no_other() {
    use agentbox_core::{Ctx, ExecOptions, FinishOptions, Mount, Spec, finish};
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let p = namespace_provider(root.path());
    let ctx = Ctx::background();
    let runner = agentbox_protocol::namespace::RUNNER;
    let (rw, ro) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Not given: under /var/tmp, which the box sees through this machine's root.
    let other = tempfile::Builder::new().tempdir_in("/var/tmp").unwrap();
    for d in [&rw, &ro, &other] {
        // The box's root is another id of the host's when the host is root: let it search.
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mount = |d: &tempfile::TempDir, target: &str, read_only: bool| Mount {
        source: d.path().canonicalize().unwrap().to_string_lossy().into_owned(),
        target: target.into(),
        read_only,
    };
    let spec = Spec {
        mounts: vec![mount(&rw, "/workspace/rw", false), mount(&ro, "/workspace/ro", true)],
        ..Spec::new(std::time::Duration::from_secs(120))
    };
    let b = p.create(&spec, &ctx).await.unwrap();
    // Made after the box started.
    let listen = |d: &tempfile::TempDir| {
        let path = d.path().join("s.sock");
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        l.set_nonblocking(true).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
        l
    };
    let (rw_listener, ro_listener, other_listener) = (listen(&rw), listen(&ro), listen(&other));
    let probe = |target: &str| {
        let argv: Vec<String> = vec![runner.into(), "probe".into(), format!("unix-connect:{target}/s.sock")];
        let b = b.clone();
        let ctx = ctx.with_timeout(std::time::Duration::from_secs(30));
        async move {
            let run = b.exec(&argv, &ExecOptions::default(), &ctx).await.unwrap();
            let f = finish(run, FinishOptions::default()).await.unwrap();
            (f.status.code, f.stdout_text())
        }
    };
    let (code, out) = probe("/workspace/rw").await;
    assert_eq!(code, 0, "the writable mount's socket: {out}");
    assert!(
        rw_listener.accept().is_ok(),
        "the host's listener in the writable mount got nothing"
    );
    let (code, out) = probe("/workspace/ro").await;
    assert_eq!(code, 0, "the read-only mount's socket: {out}");
    assert!(
        ro_listener.accept().is_ok(),
        "the host's listener in the read-only mount got nothing"
    );
    let (code, out) = probe(&other.path().to_string_lossy()).await;
    assert_eq!(code, 3, "a socket the spec did not give: {out}");
    let denied = std::io::Error::from_raw_os_error(rustix::io::Errno::ACCESS.raw_os_error()).to_string();
    assert!(out.contains(&denied), "{out} (expected {denied})");
    assert!(
        other_listener.accept().is_err(),
        "the host's listener the spec did not give was reached"
    );
    b.destroy(&ctx).await.unwrap();
}

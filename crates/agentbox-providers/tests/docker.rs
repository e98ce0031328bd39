//! Docker boxes against a real engine: the conformance suite, a holder SIGKILLed, the options.

use std::io::{BufRead, BufReader};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentbox_core::{Ctx, ErrorCode, ExecOptions, Mount, Network, Provider, SandboxId, Spec};
use agentbox_providers::docker::{DockerOptions, DockerProvider, NamedVolume};
use agentbox_testing::conformance::{self, Options};
use agentbox_testing::outside::{DockerCli, container_running, docker};
use agentbox_testing::reexec;
use agentbox_testing::services::docker_available;
use agentbox_testing::sh;

async fn provider(opts: DockerOptions) -> Arc<dyn Provider> {
    Arc::new(DockerProvider::new(opts).await.expect("the Docker daemon answers"))
}

fn ctx() -> Ctx {
    Ctx::background().with_timeout(Duration::from_secs(120))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_boxes_pass_the_conformance_suite() {
    if !docker_available("docker_boxes_pass_the_conformance_suite") {
        return;
    }
    let options = Options::new(
        "docker",
        Duration::from_secs(5),
        Duration::from_secs(10),
        Arc::new(DockerCli),
    );
    let report = conformance::run(
        conformance::factory(|| async { provider(DockerOptions::default()).await }),
        options,
    )
    .await;
    report.assert_all_passed();
}

/// The holder's part, in a child the test below SIGKILLs: make two boxes, print their ids,
/// wait to be killed.
async fn docker_holder() {
    let p = provider(DockerOptions::default()).await;
    for _ in 0..2 {
        let b = p
            .create(&Spec::new(Duration::from_secs(5)).label("holder", "sigkill"), &ctx())
            .await
            .unwrap();
        // A program running under an exec when the holder dies.
        let _held = b
            .exec(
                &["sleep".into(), "1000".into()],
                &ExecOptions::default(),
                &Ctx::background(),
            )
            .await
            .unwrap();
        println!("\nBOX {}", b.id());
        std::mem::forget(_held);
    }
    println!("\nREADY");
    tokio::time::sleep(Duration::from_secs(600)).await;
}

#[test]
fn a_process_holding_docker_boxes_is_sigkilled_and_the_engine_ends_them() {
    const TEST: &str = "a_process_holding_docker_boxes_is_sigkilled_and_the_engine_ends_them";
    if reexec::part().as_deref() == Some("holder") {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(docker_holder());
        reexec::done();
    }
    if !docker_available(TEST) {
        return;
    }
    let mut child = reexec::child(TEST, "holder")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let mut names = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(id) = line.strip_prefix("BOX ") {
            names.push(id.parse::<SandboxId>().unwrap().name().to_string());
        } else if line.starts_with("READY") {
            break;
        }
    }
    assert_eq!(names.len(), 2, "the holder made two boxes");
    assert!(names.iter().all(|n| container_running(n)), "both run before the kill");
    child.kill().unwrap();
    child.wait().unwrap();
    loop {
        let left: Vec<_> = names
            .iter()
            .filter(|n| docker(&["inspect", n.as_str()]).is_some())
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5 + 15),
            "{:?} after create, containers {left:?} still exist",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_from_options_and_spec_are_applied_and_reported() {
    if !docker_available("limits_from_options_and_spec_are_applied_and_reported") {
        return;
    }
    let opts = DockerOptions {
        cpus: Some(1.5),
        memory_bytes: Some(256 << 20),
        pids_limit: Some(64),
        ..Default::default()
    };
    let p = provider(opts).await;
    let b = p.create(&Spec::new(Duration::from_secs(120)), &ctx()).await.unwrap();
    let f = b.facts().clone();
    assert_eq!((f.cpus, f.memory_mb, f.pids_limit), (Some(1.5), Some(256), Some(64)));
    let name = b.id().name().to_string();
    let hc = docker(&["inspect", "--format", "{{.HostConfig.CpuQuota}} {{.HostConfig.CpuPeriod}} {{.HostConfig.Memory}} {{.HostConfig.MemorySwap}} {{.HostConfig.PidsLimit}}", &name]).unwrap();
    assert_eq!(hc, format!("150000 100000 {m} {m} 64", m = 256 << 20));
    // The pids limit holds in the box.
    let out = sh(
        &*b,
        "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max",
    )
    .await;
    assert_eq!(
        out.stdout_text().trim(),
        "64",
        "the pids limit as the box sees it: {out:?}"
    );
    b.destroy(&ctx()).await.unwrap();

    // A spec's own cpus and memory win over the options.
    let mut spec = Spec::new(Duration::from_secs(120));
    spec.cpus = Some(0.5);
    spec.memory_mb = Some(128);
    let b = p.create(&spec, &ctx()).await.unwrap();
    assert_eq!((b.facts().cpus, b.facts().memory_mb), (Some(0.5), Some(128)));
    b.destroy(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_none_binds_user_and_refusals() {
    if !docker_available("network_none_binds_user_and_refusals") {
        return;
    }
    let p = provider(DockerOptions {
        user: Some("1234:2345".into()),
        ..Default::default()
    })
    .await;

    let mut spec = Spec::new(Duration::from_secs(120));
    spec.network = Some(Network::None);
    let host_dir = tempfile::tempdir().unwrap();
    let src = std::fs::canonicalize(host_dir.path())
        .unwrap()
        .to_string_lossy()
        .into_owned();
    std::fs::write(host_dir.path().join("seen.txt"), "from the host\n").unwrap();
    std::fs::set_permissions(host_dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    spec.mounts.push(Mount {
        source: src.clone(),
        target: "/mnt/host".into(),
        read_only: false,
    });
    let b = p.create(&spec, &ctx()).await.unwrap();
    assert_eq!(b.facts().network(), agentbox_core::KnownNetwork::None);
    assert!(b.facts().no_port_exposed());
    assert_eq!(b.facts().mounts, spec.mounts);
    let out = sh(&*b, "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '").await;
    assert_eq!(out.stdout_text().trim(), "lo", "a network-none box sees only lo");
    let out = sh(
        &*b,
        "id -u; id -g; cat /mnt/host/seen.txt; echo made > /mnt/host/made.txt; touch w && echo ws-ok",
    )
    .await;
    assert_eq!(
        out.stdout_text(),
        "1234\n2345\nfrom the host\nws-ok\n",
        "{}",
        out.stderr_text()
    );
    let meta = std::fs::metadata(host_dir.path().join("made.txt")).unwrap();
    assert_eq!(
        (
            std::os::unix::fs::MetadataExt::uid(&meta),
            std::os::unix::fs::MetadataExt::gid(&meta)
        ),
        (1234, 2345),
        "a file the box wrote in the bind is the configured user's"
    );
    assert_eq!(b.endpoint(80, &ctx()).await.unwrap_err().code(), ErrorCode::Unsupported);
    b.destroy(&ctx()).await.unwrap();

    let refused = |f: &dyn Fn(&mut Spec)| {
        let mut s = Spec::new(Duration::from_secs(60));
        f(&mut s);
        s
    };
    for (spec, code, field) in [
        (
            // Docker boxes start from snapshots it took: one it never took is not found.
            refused(&|s| s.snapshot = Some("x".into())),
            ErrorCode::NotFound,
            "snapshot",
        ),
        (
            refused(&|s| s.region = Some("eu".into())),
            ErrorCode::Unsupported,
            "region",
        ),
        (
            refused(&|s| s.isolation = Some("vm".into())),
            ErrorCode::Unsupported,
            "isolation",
        ),
        (
            refused(&|s| s.network = Some(Network::Allow(vec!["example.com".into()]))),
            ErrorCode::Unsupported,
            "network",
        ),
        (
            refused(&|s| {
                s.mounts.push(Mount {
                    source: "/nonexistent-agentbox".into(),
                    target: "/m".into(),
                    read_only: true,
                })
            }),
            ErrorCode::NotFound,
            "mounts.source",
        ),
        (
            refused(&|s| {
                s.mounts.push(Mount {
                    source: "/usr/../usr".into(),
                    target: "/m".into(),
                    read_only: true,
                })
            }),
            ErrorCode::Invalid,
            "mounts.source",
        ),
        (
            refused(&|s| s.image = Some("agentbox-no-such-image:1".into())),
            ErrorCode::NotFound,
            "image",
        ),
    ] {
        let e = match p.create(&spec, &ctx()).await {
            Err(e) => e,
            Ok(b) => {
                let _ = b.destroy(&ctx()).await;
                panic!("{field}: a box was made");
            }
        };
        assert_eq!(e.code(), code, "{field}: {e}");
        assert!(e.message().contains(field), "{field}: {e}");
    }
    // This engine has no GPU runtime: a GPU is refused by the engine, never ignored, and
    // nothing is left behind.
    let mut gpu = Spec::new(Duration::from_secs(60)).label("gpu-test", "1");
    gpu.gpu = Some("any".into());
    if docker(&["info", "--format", "{{json .Runtimes}}"]).is_some_and(|r| !r.contains("nvidia")) {
        assert!(
            p.create(&gpu, &ctx()).await.is_err(),
            "a gpu box on an engine without GPUs"
        );
        assert_eq!(
            docker(&["ps", "-aq", "--filter", "label=gpu-test=1"]).as_deref(),
            Some(""),
            "no container left"
        );
    }

    let mut isolated = Spec::new(Duration::from_secs(60));
    isolated.isolation = Some("container".into());
    let b = p.create(&isolated, &ctx()).await.unwrap();
    b.destroy(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_capabilities_and_volumes() {
    if !docker_available("dropped_capabilities_and_volumes") {
        return;
    }
    let volume = "agentbox-test-volume";
    let _ = docker(&["volume", "create", volume]);
    let opts = DockerOptions {
        volumes: vec![NamedVolume {
            name: volume.into(),
            target: "/run/shared".into(),
            read_only: false,
        }],
        ..Default::default()
    };
    let dropped = provider(opts).await;
    let b = dropped
        .create(&Spec::new(Duration::from_secs(120)), &ctx())
        .await
        .unwrap();
    let out = sh(
        &*b,
        "grep CapEff /proc/self/status; mknod /tmp/dev c 1 3 2>&1; echo x > /run/shared/f && echo vol-ok",
    )
    .await;
    let text = out.stdout_text();
    assert!(text.contains("CapEff:\t0000000000000000"), "{text}");
    assert!(
        text.contains("Operation not permitted") && text.contains("vol-ok"),
        "{text}"
    );
    b.destroy(&ctx()).await.unwrap();

    // A box made with Docker's capabilities kept is found again as it is, and says so.
    let plain = provider(DockerOptions {
        keep_capabilities: true,
        ..Default::default()
    })
    .await
    .create(&Spec::new(Duration::from_secs(120)), &ctx())
    .await
    .unwrap();
    let again = dropped.attach(plain.id(), &ctx()).await.unwrap().expect("found again");
    assert_eq!(again.facts().capabilities.as_deref(), Some("docker-default"));
    assert_eq!(again.facts().no_new_privs, Some(false));
    again.destroy(&ctx()).await.unwrap();

    // A bind on a volume's target is refused.
    let mut s = Spec::new(Duration::from_secs(60));
    s.mounts.push(Mount {
        source: "/tmp".into(),
        target: "/run/shared".into(),
        read_only: true,
    });
    assert_eq!(dropped.create(&s, &ctx()).await.unwrap_err().code(), ErrorCode::Invalid);
    let _ = docker(&["volume", "rm", volume]);
}

#[test]
fn a_remote_daemon_binds_nothing() {
    const TEST: &str = "a_remote_daemon_binds_nothing";
    if reexec::part().as_deref() == Some("remote") {
        // The remote daemon is never reached: honours() and the spec check come first.
        println!("\nLOCAL {}", agentbox_providers::docker::daemon::is_local());
        reexec::done();
    }
    // A child, so that DOCKER_HOST names a remote daemon in its environment alone.
    let out = reexec::child(TEST, "remote")
        .env("DOCKER_HOST", "tcp://192.0.2.1:2375")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("LOCAL false"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The default box keeps no capability, cannot gain privileges by exec, runs under agentbox's
/// seccomp profile and has pids and memory limits, each stated in its facts and read back in
/// the box (the engine's defaults were 14 capabilities, no_new_privs off, io_uring allowed and
/// no limits at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_box_is_hardened_and_says_so() {
    if !docker_available("the_default_box_is_hardened_and_says_so") {
        return;
    }
    let b = provider(DockerOptions::default())
        .await
        .create(&Spec::new(Duration::from_secs(120)), &ctx())
        .await
        .unwrap();
    let f = b.facts();
    assert_eq!(f.capabilities.as_deref(), Some("none"), "{f:?}");
    assert_eq!(f.no_new_privs, Some(true), "{f:?}");
    assert_eq!(f.seccomp.as_deref(), Some("agentbox"), "{f:?}");
    assert_eq!(
        f.pids_limit,
        Some(agentbox_providers::docker::DEFAULT_PIDS_LIMIT as u64),
        "{f:?}"
    );
    let mb = f.memory_mb.expect("a default memory limit");
    assert!(mb > 0 && mb <= 4096, "at most 4 GiB: {mb}");
    let text = sh(&*b, "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/pids/pids.max 2>/dev/null").await.stdout_text();
    assert!(text.contains("CapEff:\t0000000000000000"), "{text}");
    assert!(
        text.contains("NoNewPrivs:\t1") && text.contains("Seccomp:\t2"),
        "{text}"
    );
    assert!(
        text.contains(&agentbox_providers::docker::DEFAULT_PIDS_LIMIT.to_string()),
        "{text}"
    );
    b.destroy(&ctx()).await.unwrap();
    // A spec's memory and the options' pids limit win over the defaults.
    let mut spec = Spec::new(Duration::from_secs(120));
    spec.memory_mb = Some(300);
    let b = provider(DockerOptions {
        pids_limit: Some(77),
        ..Default::default()
    })
    .await
    .create(&spec, &ctx())
    .await
    .unwrap();
    assert_eq!((b.facts().memory_mb, b.facts().pids_limit), (Some(300), Some(77)));
    b.destroy(&ctx()).await.unwrap();
}

/// With every capability dropped, a box of another user still gets its workspace: the engine
/// gives it its owner before the box starts (a chown in the box failed with EPERM).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_box_owns_its_workspace_with_no_capabilities() {
    if !docker_available("a_user_box_owns_its_workspace_with_no_capabilities") {
        return;
    }
    let b = provider(DockerOptions {
        user: Some("1000:1000".into()),
        ..Default::default()
    })
    .await
    .create(&Spec::new(Duration::from_secs(120)), &ctx())
    .await
    .expect("a box of user 1000 with no capabilities is made");
    assert_eq!(b.facts().capabilities.as_deref(), Some("none"));
    let text = sh(
        &*b,
        "id -u; stat -c '%u:%g %a' /workspace; echo hi > /workspace/f && cat /workspace/f",
    )
    .await
    .stdout_text();
    assert_eq!(text, "1000\n1000:1000 755\nhi\n");
    b.destroy(&ctx()).await.unwrap();
}

/// A disk bound is given where the engine enforces one, and refused, naming why, elsewhere
/// (overlay2 enforces a size only over xfs with project quotas).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_bound_is_enforced_or_refused_naming_why() {
    if !docker_available("a_disk_bound_is_enforced_or_refused_naming_why") {
        return;
    }
    let backing = docker(&["info", "--format", "{{json .DriverStatus}}"]).unwrap_or_default();
    let p = provider(DockerOptions {
        disk_bytes: Some(512 << 20),
        ..Default::default()
    })
    .await;
    match p.create(&Spec::new(Duration::from_secs(120)), &ctx()).await {
        Ok(b) => {
            assert!(backing.contains("xfs"), "a size was taken on {backing}");
            b.destroy(&ctx()).await.unwrap();
        }
        Err(e) => {
            assert!(!backing.contains("xfs"), "{e}");
            assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
            assert!(
                e.message().contains("docker disk") && e.message().contains("xfs"),
                "{e}"
            );
        }
    }
}

/// A Docker box without a runner gives a terminal through the engine's own tty exec, resized
/// through the engine; it keeps no processes, so it refuses detach and timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_tty_exec_is_a_terminal_and_detach_is_refused() {
    if !docker_available("the_engines_tty_exec_is_a_terminal_and_detach_is_refused") {
        return;
    }
    let p = provider(DockerOptions::default()).await;
    agentbox_testing::processes::terminal(&*p).await.unwrap();
    agentbox_testing::processes::curses_output_whole(&*p).await.unwrap();
    agentbox_testing::processes::refused_without_processes(&*p)
        .await
        .unwrap();
}

/// Open Docker boxes are on agentbox's own network with inter-container traffic off: a box
/// reaches its own listener by its address, and another box cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boxes_do_not_reach_each_other() {
    if !docker_available("boxes_do_not_reach_each_other") {
        return;
    }
    let p = provider(DockerOptions::default()).await;
    let spec = Spec::new(Duration::from_secs(120));
    let a = p.create(&spec, &ctx()).await.unwrap();
    let b = p.create(&spec, &ctx()).await.unwrap();
    for one in [&a, &b] {
        let name = one.id().to_string();
        let container = name.split_once(':').map_or(name.as_str(), |(_, c)| c);
        assert_eq!(
            docker(&["inspect", "--format", "{{.HostConfig.NetworkMode}}", container]).as_deref(),
            Some(agentbox_providers::docker::BOX_NETWORK),
            "{name}"
        );
    }
    agentbox_testing::greeter(&*a, "0.0.0.0", 8080).await;
    let ip = sh(&*a, "hostname -i").await.stdout_text().trim().to_string();
    assert!(ip.parse::<std::net::Ipv4Addr>().is_ok(), "box a's address: {ip:?}");
    let fetch = format!(
        "for i in $(seq 50); do timeout 3 bash -c 'exec 3<>/dev/tcp/{ip}/8080 && cat <&3' 2>/dev/null && exit 0; \
         sleep 0.1; done; exit 1"
    );
    // The control: the listener answers on the box's address, from the box itself.
    let own = sh(&*a, &fetch).await;
    assert_eq!(
        own.stdout_text(),
        "port 8080\n",
        "box a reaches itself: {}",
        own.stderr_text()
    );
    // Another box, on the same network, does not reach it.
    let other = sh(
        &*b,
        &format!("timeout 5 bash -c 'exec 3<>/dev/tcp/{ip}/8080 && cat <&3'"),
    )
    .await;
    assert_ne!(other.status.code, 0, "box b reached box a: {}", other.stdout_text());
    assert_eq!(other.stdout_text(), "");
    a.destroy(&ctx()).await.unwrap();
    b.destroy(&ctx()).await.unwrap();
}

/// An allowlist is enforced through agentbox's init in the box (its bridge to the egress
/// proxy): a box made without the runner refuses one, naming why; the proxy's variables are
/// the provider's to set. (The allowlist itself: `tests/egress.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowlist_needs_the_runner_and_owns_the_proxy_variables() {
    if !docker_available("an_allowlist_needs_the_runner_and_owns_the_proxy_variables") {
        return;
    }
    let mut spec = Spec::new(Duration::from_secs(60));
    spec.network = Some(Network::Allow(vec!["example.com".into()]));
    let bare = provider(DockerOptions::default()).await;
    let e = match bare.create(&spec, &ctx()).await {
        Ok(b) => panic!("a box without the runner took an allowlist: {}", b.id()),
        Err(e) => e,
    };
    assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
    assert!(e.message().contains("without the runner"), "{e}");
    let with = provider(DockerOptions {
        runner: Some(agentbox_providers::helper::HelperCommand::new(
            agentbox_testing::runner::ensure(),
            vec![],
        )),
        ..DockerOptions::default()
    })
    .await;
    spec.env.insert("http_proxy".into(), "http://elsewhere:1".into());
    let e = match with.create(&spec, &ctx()).await {
        Ok(b) => panic!("http_proxy was taken: {}", b.id()),
        Err(e) => e,
    };
    assert_eq!(e.code(), ErrorCode::Invalid, "{e}");
    assert!(e.message().contains("spec.env.http_proxy"), "{e}");
}

/// A port asked for as tcp is published on this machine's loopback: `endpoint` gives it and a
/// listener in the box answers there; a port not asked for has no endpoint; https is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_port_answers_from_the_host_and_no_other_does() {
    if !docker_available("a_tcp_port_answers_from_the_host_and_no_other_does") {
        return;
    }
    let p = provider(DockerOptions::default()).await;
    let mut spec = Spec::new(Duration::from_secs(120));
    spec.ports = vec![agentbox_core::PortSpec {
        port: 8080,
        kind: agentbox_core::PortKind::Tcp,
    }];
    let b = p.create(&spec, &ctx()).await.unwrap();
    assert_eq!(
        b.facts().ports,
        Some(vec![agentbox_core::PortFact {
            port: 8080,
            kind: agentbox_core::PortKind::Tcp
        }])
    );
    for port in [8080, 8081] {
        agentbox_testing::greeter(&*b, "0.0.0.0", port).await;
    }
    let e = b.endpoint(8080, &ctx()).await.unwrap();
    assert_eq!(e.host, "127.0.0.1");
    assert!(e.url.is_none());
    let mut said = String::new();
    for _ in 0..50 {
        if let Ok(mut c) = std::net::TcpStream::connect((e.host.as_str(), e.port)) {
            use std::io::Read;
            said.clear();
            let _ = c.read_to_string(&mut said);
            if !said.is_empty() {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(said, "port 8080\n");
    let e = b.endpoint(8081, &ctx()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
    assert!(e.message().contains("not asked for"), "{e}");
    b.destroy(&ctx()).await.unwrap();

    spec.ports[0].kind = agentbox_core::PortKind::Https;
    let e = match p.create(&spec, &ctx()).await {
        Ok(b) => panic!("an https port was taken: {}", b.id()),
        Err(e) => e,
    };
    assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
    assert!(e.message().contains("no certificate"), "{e}");
}

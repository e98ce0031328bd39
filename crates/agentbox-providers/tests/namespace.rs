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
async fn namespace_boxes_with_a_rootfs_root_pass_the_conformance_suite() {
    let Some(rootfs) =
        agentbox_testing::services::rootfs("namespace_boxes_with_a_rootfs_root_pass_the_conformance_suite")
    else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let path = root.path().to_path_buf();
    let outside = Arc::new(NamespaceView {
        boxes: path.join("namespace"),
    });
    let mut options = Options::new(
        "namespace, rootfs",
        Duration::from_secs(3),
        Duration::from_secs(4),
        outside,
    );
    options.base.image = Some(rootfs.clone());
    let report = conformance::run(
        conformance::factory(move || {
            let path = path.clone();
            async move { provider(&path, true) }
        }),
        options,
    )
    .await;
    report.assert_all_passed();
    // The box sees the image, not this machine: its own Debian release file, no host checkout.
    let p = provider(root.path(), true);
    let ctx = Ctx::background();
    let b = p
        .create(
            &Spec {
                image: Some(rootfs.clone()),
                ..Spec::new(Duration::from_secs(60))
            },
            &ctx,
        )
        .await
        .unwrap();
    assert_eq!(b.facts().root.as_deref(), Some("rootfs"));
    let here = std::env::current_dir().unwrap();
    let (code, out) = sh(
        b.as_ref(),
        &format!("test -e '{}' || echo absent; ls /usr/bin | wc -l", here.display()),
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("absent\n"),
        "the host's checkout is not in a rootfs box: {out}"
    );
    // Bad images are refused, naming the field.
    for bad in ["debian:12", "/nonexistent/rootfs", "/etc"] {
        let spec = Spec {
            image: Some(bad.into()),
            ..Spec::new(Duration::from_secs(60))
        };
        let e = p.create(&spec, &ctx).await.err().unwrap();
        assert_eq!(e.code(), agentbox_core::ErrorCode::Invalid, "{bad}: {e}");
        assert!(e.message().contains("spec.image"), "{bad}: {e}");
    }
    b.destroy(&ctx).await.unwrap();
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
    // Its home is its own and writable, also where the host user's own home (masked in the
    // box) is /root, the box's home's place.
    let (code, out) = sh(b.as_ref(), "echo mine > /root/f && cat /root/f && echo \"$HOME\"").await;
    assert_eq!((code, out.as_str()), (0, "mine\n/root\n"), "{out}");
    b.destroy(&ctx).await.unwrap();
}

/// `sh -c script` in `b`: its exit code and its stdout and stderr together.
async fn sh(b: &dyn agentbox_core::Sandbox, script: &str) -> (i32, String) {
    let out = agentbox_testing::sh(b, script).await;
    (out.status.code, format!("{}{}", out.stdout_text(), out.stderr_text()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seccomp_refuses_what_it_says_and_the_process_limit_stops_a_fork_bomb() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path(), true);
    let ctx = Ctx::background();
    let b = p.create(&Spec::new(Duration::from_secs(120)), &ctx).await.unwrap();
    let runner = agentbox_protocol::namespace::RUNNER;
    for probe in [
        "ptrace",
        "keyctl",
        "io_uring",
        "mount",
        "user-namespace",
        "mount-namespace",
    ] {
        let (code, out) = sh(b.as_ref(), &format!("{runner} probe {probe}")).await;
        assert_eq!(code, 3, "{probe}: {out}");
        assert!(out.contains("refused: "), "{probe}: {out}");
    }
    // The same probes are allowed on the host (as root, where this test runs in CI), so the
    // refusals above are the box's.
    if rustix::process::geteuid().is_root() {
        for probe in ["ptrace", "keyctl", "mount-namespace"] {
            let out = std::process::Command::new(agentbox_testing::runner::ensure())
                .args(["probe", probe])
                .output()
                .unwrap();
            assert!(out.status.success(), "{probe} on the host: {:?}", out);
        }
    }
    // A fork bomb meets RLIMIT_NPROC: a fork is refused (dash then gives up the script), and
    // the box goes on. Every sleep that started counted itself first.
    let limit = b.facts().pids_limit.unwrap();
    let (code, out) = sh(
        b.as_ref(),
        &format!(
            "i=0; while [ $i -lt {} ]; do sleep 8 & i=$((i+1)); echo $i > /tmp/forks; done",
            limit + 64
        ),
    )
    .await;
    assert_ne!(code, 0, "the bomb must be refused a fork: {out}");
    // Once the sleeps are gone, the box runs programs again. They sleep long enough that all
    // are alive at once even on a loaded machine (2 s was too short beside a CI run).
    tokio::time::sleep(Duration::from_secs(9)).await;
    let (_, forks) = sh(b.as_ref(), "cat /tmp/forks").await;
    let started: u64 = forks.trim().parse().unwrap_or(0);
    assert!(
        started > 100 && started < limit,
        "{started} forks before the refusal: {out}"
    );
    b.destroy(&ctx).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setuid_root_program_gives_the_box_no_privilege_and_the_hosts_homes_and_sockets_are_masked() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("NOT RUN: only root can make a setuid-root program to try (CI runs this as root)");
        assert!(std::env::var_os("CI").is_none(), "CI runs this test as root");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path(), true);
    let ctx = Ctx::background();
    let b = p.create(&Spec::new(Duration::from_secs(60)), &ctx).await.unwrap();
    // A setuid-root copy of cat, put in the workspace by the host: on the host it reads
    // /etc/shadow for anyone; in the box it must not.
    let work = root.path().join("namespace").join(b.id().name()).join("work");
    let cat = work.join("suidcat");
    std::fs::copy("/bin/cat", &cat).unwrap();
    std::os::unix::fs::chown(&cat, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&cat, std::os::unix::fs::PermissionsExt::from_mode(0o4755)).unwrap();
    let (code, out) = sh(b.as_ref(), "./suidcat /etc/shadow").await;
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("Permission denied"), "{out}");
    assert_eq!(
        sh(b.as_ref(), "ls -A /home").await,
        (0, String::new()),
        "every home masked"
    );
    assert_eq!(
        sh(b.as_ref(), "ls -A /root").await,
        (0, String::new()),
        "/root is the box's own"
    );
    let (_, run) = sh(b.as_ref(), "ls -A /run").await;
    assert_eq!(run, "agentbox\nagentbox-runner\n", "no daemon's socket under /run");
    // The runner's socket, and the way out to its egress proxy (the default network's).
    let (_, run) = sh(b.as_ref(), "ls -A /run/agentbox").await;
    assert_eq!(run, "egress.sock\nrunner.sock\n");
    b.destroy(&ctx).await.unwrap();
}

/// Boxes made by the creator of the test below, which it SIGKILLs.
const BOXES: usize = 100;
const LIFETIME: Duration = Duration::from_secs(5);

async fn creator(root: &std::path::Path) {
    let p = provider(root, true);
    let ctx = Ctx::background();
    for _ in 0..BOXES {
        let b = p.create(&Spec::new(LIFETIME), &ctx).await.unwrap();
        // A program in the background, one in a session of its own, and one still under the
        // exec when the creator dies.
        let (code, out) = sh(
            b.as_ref(),
            "sleep 1000 >/dev/null 2>&1 & setsid sleep 1000 >/dev/null 2>&1 & echo ok",
        )
        .await;
        assert_eq!((code, out.as_str()), (0, "ok\n"));
        let _held = b
            .exec(&["sleep".into(), "1000".into()], &ExecOptions::default(), &ctx)
            .await
            .unwrap();
        std::mem::forget(_held);
        // After a newline: the test harness may have left its own line open.
        println!("\nBOX {}", b.id());
    }
    println!("READY");
    tokio::time::sleep(Duration::from_secs(600)).await;
}

#[test]
fn a_hundred_boxes_whose_creator_was_sigkilled_end_with_every_program_at_their_lifetime() {
    use agentbox_testing::reexec;
    use std::io::BufRead;
    const TEST: &str = "a_hundred_boxes_whose_creator_was_sigkilled_end_with_every_program_at_their_lifetime";
    if reexec::part().as_deref() == Some("creator") {
        let root = std::env::var_os("AGENTBOX_TEST_CREATOR_ROOT").expect("the parent names the root");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(creator(std::path::Path::new(&root)));
        reexec::done();
    }
    let root = tempfile::tempdir().unwrap();
    let mut child = reexec::child(TEST, "creator")
        .env("AGENTBOX_TEST_CREATOR_ROOT", root.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let boxes = root.path().join("namespace");
    let mut namespaces = Vec::new();
    for line in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(id) = line.strip_prefix("BOX ") {
            let name = id.rsplit(':').next().unwrap().to_string();
            let record: serde_json::Value =
                serde_json::from_slice(&std::fs::read(boxes.join(&name).join("record.json")).unwrap()).unwrap();
            let ns = record["facts"]["namespaces"]["pid"].as_u64().unwrap();
            let init = record["init_pid"].as_u64().unwrap() as u32;
            // Five programs at least: init, runner, and the three started above.
            assert!(NamespaceView::members(ns, init).len() >= 5, "box {name}'s programs run");
            namespaces.push((name, (ns, init), record["ends_at_ms"].as_u64().unwrap()));
        } else if line.contains("READY") {
            break;
        }
    }
    assert_eq!(namespaces.len(), BOXES, "the creator made every box");
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Another process (this one) finds a box by id and runs a program in it: the last made,
    // whose lifetime has the most left (making a hundred can take longer than one lifetime on
    // a loaded machine, and the first may have ended already).
    let id: agentbox_core::SandboxId = format!("namespace:{}", namespaces[BOXES - 1].0).parse().unwrap();
    rt.block_on(async {
        let b = provider(root.path(), true)
            .attach(&id, &Ctx::background())
            .await
            .unwrap()
            .expect("attached");
        assert_eq!(sh(b.as_ref(), "echo here").await, (0, "here\n".to_string()));
    });
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let last_end = namespaces.iter().map(|n| n.2).max().unwrap();
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    // Nothing ends early: the creator's death is not the boxes' end.
    assert!(
        namespaces
            .iter()
            .filter(|n| n.2 > now() + 500)
            .all(|n| !NamespaceView::members(n.1.0, n.1.1).is_empty())
    );
    loop {
        let alive: Vec<&String> = namespaces
            .iter()
            .filter(|n| !NamespaceView::members(n.1.0, n.1.1).is_empty())
            .map(|n| &n.0)
            .collect();
        if alive.is_empty() {
            break;
        }
        assert!(
            now() < last_end + 3000,
            "{} boxes still have programs 3 s past their lifetime: {alive:?}",
            alive.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // And the next listing finds none and leaves no directory behind.
    let listed = rt
        .block_on(provider(root.path(), true).list(&Default::default(), &Ctx::background()))
        .unwrap();
    assert!(listed.is_empty());
    let left: Vec<_> = std::fs::read_dir(&boxes).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agentbox_home_is_masked_wherever_it_is() {
    // A home outside every fixed mask (/tmp, /home, /root, /run): agentbox's own files there,
    // other boxes' and local boxes' supervisor sockets, must still be out of the box's sight.
    let root = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::set_permissions(root.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(root.path().join("marker"), "agentbox's own\n").unwrap();
    let p = provider(root.path(), true);
    let ctx = Ctx::background();
    let b = p.create(&Spec::new(Duration::from_secs(60)), &ctx).await.unwrap();
    let (code, out) = sh(b.as_ref(), &format!("ls -A '{}'", root.path().display())).await;
    assert_eq!((code, out.as_str()), (0, ""), "agentbox's home is empty in the box");
    b.destroy(&ctx).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_specs_mounts_are_bound_where_asked_read_only_or_not_and_an_impossible_one_is_refused() {
    use agentbox_core::Mount;
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("in.txt"), "from the host\n").unwrap();
    let out = tempfile::tempdir().unwrap();
    // The box's root is another id of the host's when the host is root: let it write here.
    std::fs::set_permissions(out.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let p = provider(root.path(), true);
    let ctx = Ctx::background();
    let spec = Spec {
        mounts: vec![
            Mount {
                source: data.path().to_string_lossy().into_owned(),
                target: "/data".into(),
                read_only: true,
            },
            Mount {
                source: out.path().to_string_lossy().into_owned(),
                target: "/workspace/out".into(),
                read_only: false,
            },
        ],
        ..Spec::new(Duration::from_secs(60))
    };
    let b = p.create(&spec, &ctx).await.unwrap();
    assert_eq!(b.facts().mounts, spec.mounts);
    assert_eq!(sh(b.as_ref(), "cat /data/in.txt").await, (0, "from the host\n".into()));
    let (code, said) = sh(b.as_ref(), "echo x > /data/new 2>&1").await;
    assert_ne!(code, 0, "a read-only mount refuses writes: {said}");
    assert_eq!(sh(b.as_ref(), "echo made > out/made.txt").await.0, 0);
    assert_eq!(std::fs::read_to_string(out.path().join("made.txt")).unwrap(), "made\n");
    b.destroy(&ctx).await.unwrap();
    // A target under the read-only root that does not exist cannot be made: a clear refusal.
    let bad = Spec {
        mounts: vec![Mount {
            source: data.path().to_string_lossy().into_owned(),
            target: "/usr/no-such-dir".into(),
            read_only: true,
        }],
        ..Spec::new(Duration::from_secs(60))
    };
    let e = p.create(&bad, &ctx).await.err().unwrap();
    assert!(e.message().contains("mount target /usr/no-such-dir"), "{e}");
    assert!(
        std::fs::read_dir(root.path().join("namespace"))
            .unwrap()
            .next()
            .is_none(),
        "nothing left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn landlock_keeps_a_box_from_the_hosts_abstract_sockets_and_a_box_without_it_reaches_them() {
    use std::os::linux::net::SocketAddrExt;
    // Abstract unix sockets belong to the net namespace, which a box with network host shares
    // with this machine: only landlock's scope stands between the box and them.
    let name = format!("agentbox-landlock-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    let root = tempfile::tempdir().unwrap();
    let ctx = Ctx::background();
    let probe = format!("{} probe abstract-unix:{name}", agentbox_protocol::namespace::RUNNER);
    for landlock in [true, false] {
        let p: Arc<dyn Provider> = Arc::new(
            NamespaceProvider::new(NamespaceOptions {
                landlock,
                ..options(root.path(), true)
            })
            .unwrap(),
        );
        let host = Spec {
            network: Some(agentbox_core::Network::Host),
            ..Spec::new(Duration::from_secs(60))
        };
        let b = p.create(&host, &ctx).await.unwrap();
        let fact = b.facts().landlock.clone().unwrap_or_default();
        let (code, out) = sh(b.as_ref(), &probe).await;
        if landlock {
            assert!(fact.starts_with("abi "), "{fact}");
            assert_eq!(code, 3, "refused with landlock: {out}");
        } else {
            assert!(fact.starts_with("none"), "{fact}");
            assert_eq!(code, 0, "the control reaches the socket: {out}");
        }
        b.destroy(&ctx).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_dies_is_started_again_by_the_init_and_the_box_goes_on() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path(), true);
    let ctx = Ctx::background();
    let b = p.create(&Spec::new(Duration::from_secs(60)), &ctx).await.unwrap();
    let runner_pid = |out: &str| out.trim().to_string();
    let (_, first) = sh(b.as_ref(), "echo $PPID").await;
    // The program's parent is the runner: kill it, as a program of the box may.
    let kill = ["sh".to_string(), "-c".into(), "kill -9 $PPID".into()];
    let _ = b.exec(&kill, &ExecOptions::default(), &ctx).await;
    let t = std::time::Instant::now();
    let second = loop {
        let attempt = ctx.with_timeout(Duration::from_secs(2));
        let argv = ["sh".to_string(), "-c".into(), "echo $PPID".into()];
        if let Ok(proc) = b.exec(&argv, &ExecOptions::default(), &attempt).await
            && let Ok(out) = finish(proc, FinishOptions::default()).await
            && out.status.code == 0
        {
            break out.stdout_text();
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no runner answered again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_ne!(runner_pid(&first), runner_pid(&second), "a new runner serves the box");
    assert_eq!(b.status(&ctx).await.unwrap(), agentbox_core::Status::Running);
    b.destroy(&ctx).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpus_and_memory_are_refused_on_this_machine_and_the_facts_say_why() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path(), true);
    let ctx = Ctx::background();
    for spec in [
        Spec {
            cpus: Some(1.0),
            ..Spec::new(Duration::from_secs(60))
        },
        Spec {
            memory_mb: Some(256),
            ..Spec::new(Duration::from_secs(60))
        },
    ] {
        let e = p.create(&spec, &ctx).await.err().unwrap();
        assert_eq!(e.code(), agentbox_core::ErrorCode::Unsupported, "{e}");
        assert!(e.message().contains("cgroup"), "{e}");
    }
    let b = p.create(&Spec::new(Duration::from_secs(60)), &ctx).await.unwrap();
    let limits = &b.facts().limits;
    assert!(limits["memory"].starts_with("unsupported: "), "{limits:?}");
    assert!(limits["cpus"].starts_with("unsupported: "), "{limits:?}");
    assert_eq!(
        limits["processes"],
        format!("RLIMIT_NPROC {}", b.facts().pids_limit.unwrap())
    );
    b.destroy(&ctx).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_user_namespaces_are_refused_the_error_names_the_sysctl() {
    // A user namespace of its own whose user.max_user_namespaces is 0: there, the keeper's
    // unshare is refused as it is on a machine with that sysctl at 0.
    let root = tempfile::tempdir().unwrap();
    let runner = agentbox_testing::runner::ensure();
    let script = "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$0\" \"$@\"";
    if rustix::process::geteuid().is_root() {
        // A root host's keeper reads the box's directory as root of this machine, which it is
        // no longer inside the user namespace this test puts it in: the case is an ordinary
        // user's, and scripts/test runs it as one.
        eprintln!("NOT RUN as root: scripts/test runs this case as its ordinary user");
        return;
    }
    let mut argv: Vec<String> = vec![];
    argv.extend(["unshare", "--user", "--map-root-user", "sh", "-c", script].map(String::from));
    argv.push(runner.to_string_lossy().into_owned());
    let opts = NamespaceOptions {
        runner: HelperCommand::new(argv.remove(0), argv),
        ..options(root.path(), true)
    };
    let p = NamespaceProvider::new(opts).unwrap();
    let e = p
        .create(&Spec::new(Duration::from_secs(60)), &Ctx::background())
        .await
        .err()
        .unwrap();
    assert!(e.message().contains("unshare"), "{e}");
    assert!(e.message().contains("max_user_namespaces is 0"), "{e}");
    assert!(
        std::fs::read_dir(root.path().join("namespace"))
            .unwrap()
            .next()
            .is_none(),
        "nothing left"
    );
}

fn drops() -> agentbox_testing::processes::DropConnections {
    Arc::new(|name: String| Box::pin(async move { agentbox_providers::runner::drop_connections(&name).await }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_in_a_namespace_box() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path(), true);
    agentbox_testing::processes::terminal(&*p).await.unwrap();
    agentbox_testing::processes::curses_output_whole(&*p).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_drops_lose_no_byte_in_a_namespace_box() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path(), true);
    agentbox_testing::processes::drops_lose_nothing(&*p, drops(), false)
        .await
        .unwrap();
    agentbox_testing::processes::drops_lose_nothing(&*p, drops(), true)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_reader_is_told_the_gap_in_a_namespace_box() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path(), true);
    agentbox_testing::processes::late_reader_told_the_gap(&*p)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_processes_outlive_the_host_process_that_started_them() {
    // The child host process makes its provider on its parent's root.
    const ROOT: &str = "AGENTBOX_TEST_NAMESPACE_ROOT";
    let keep = tempfile::tempdir().unwrap();
    let root = match (agentbox_testing::reexec::part(), std::env::var(ROOT)) {
        (Some(_), Ok(r)) => std::path::PathBuf::from(r),
        _ => keep.path().to_path_buf(),
    };
    let p = provider(&root, true);
    let env = [(ROOT, root.display().to_string())];
    agentbox_testing::processes::outlive_the_host(
        "namespace_processes_outlive_the_host_process_that_started_them",
        &*p,
        &env,
    )
    .await
    .unwrap();
}

/// The probe for user namespaces runs once per runner and process: the CLI's choice of a
/// default provider and the provider's make both ask, and the second is answered from the
/// first (a runner that logs each start counts them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_user_namespace_probe_runs_once_per_runner() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("starts");
    let runner = agentbox_testing::runner::ensure();
    let counted = HelperCommand::new(
        "/bin/sh",
        vec![
            "-c".into(),
            format!("echo start >> '{}'; exec '{}' \"$@\"", log.display(), runner.display()),
            "sh".into(),
        ],
    );
    for _ in 0..3 {
        agentbox_providers::namespace::available(&counted).await.unwrap();
    }
    let starts = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        starts.lines().count(),
        1,
        "the probe ran {} times",
        starts.lines().count()
    );
}

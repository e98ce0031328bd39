//! What the environments promise beyond single file operations: commands (groups, stops,
//! variables), readers, watchers, clean-up, and a box that dies or stops answering.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentbox_core::{
    Ctx, Endpoint, ExecOptions as BoxExecOptions, Facts, Labels, Process, Provider, Sandbox, SandboxId, Spec, Status,
};
use agentbox_hands::*;
use agentbox_providers::docker::{DockerOptions, DockerProvider};
use agentbox_providers::{LocalOptions, LocalProvider};
use async_trait::async_trait;

/// An environment under test: its name, the environment, and the box under it (none for the host).
type Under = (String, Arc<dyn ExecutionEnv>, Option<Arc<dyn Sandbox>>);

struct Envs {
    _home: tempfile::TempDir,
    _host_dir: tempfile::TempDir,
    list: Vec<Under>,
}

async fn envs(spec_env: &[(&str, &str)]) -> Envs {
    let home = tempfile::tempdir().unwrap();
    let host_dir = tempfile::tempdir().unwrap();
    let mut spec = Spec::new(Duration::from_secs(600));
    for (k, v) in spec_env {
        spec.env.insert(k.to_string(), v.to_string());
    }
    let mut list: Vec<Under> = vec![(
        "host".into(),
        Arc::new(HostEnv::new(host_dir.path().to_string_lossy()).unwrap()),
        None,
    )];
    agentbox_testing::runner::ensure();
    let lp = LocalProvider::new(LocalOptions::at(home.path()).unwrap()).unwrap();
    let b = lp.create(&spec, &Ctx::background()).await.unwrap();
    list.push(("local".into(), Arc::new(BoxEnv::new(b.clone())), Some(b)));
    let mut with_runner = LocalOptions::at(home.path()).unwrap();
    with_runner.runner = true;
    let b = LocalProvider::new(with_runner)
        .unwrap()
        .create(&spec, &Ctx::background())
        .await
        .unwrap();
    assert!(b.files().is_some(), "a local box made with a runner has one");
    list.push(("local runner".into(), Arc::new(BoxEnv::new(b.clone())), Some(b)));
    let b = protocol_2_box(home.path(), &spec).await;
    list.push((
        "local protocol-2 runner".into(),
        Arc::new(BoxEnv::new(b.clone())),
        Some(b),
    ));
    if agentbox_testing::services::docker_available("hands behaviour on a Docker box") {
        let dp = DockerProvider::new(DockerOptions::default()).await.unwrap();
        let b = dp.create(&spec, &Ctx::background()).await.unwrap();
        list.push(("docker".into(), Arc::new(BoxEnv::new(b.clone())), Some(b)));
        let drp = DockerProvider::new(DockerOptions {
            runner: Some(agentbox_providers::helper::HelperCommand::discover().unwrap()),
            ..DockerOptions::default()
        })
        .await
        .unwrap();
        let b = drp.create(&spec, &Ctx::background()).await.unwrap();
        assert!(b.files().is_some(), "a Docker box made with a runner has one");
        list.push(("docker runner".into(), Arc::new(BoxEnv::new(b.clone())), Some(b)));
    }
    Envs {
        _home: home,
        _host_dir: host_dir,
        list,
    }
}

impl Drop for Envs {
    fn drop(&mut self) {
        for (_, _, b) in &self.list {
            if let Some(b) = b.clone() {
                let _ = std::thread::spawn(move || {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap()
                        .block_on(b.destroy(&Ctx::background()))
                })
                .join();
            }
        }
    }
}

#[path = "common/protocol_2.rs"]
mod common_protocol_2;
use common_protocol_2::protocol_2_box;
#[path = "common/sink.rs"]
mod common_sink;
use common_sink::sink;

async fn sh(env: &dyn ExecutionEnv, script: &str) -> (i32, String) {
    let (out, opts) = sink();
    let r = env
        .exec(Command::Shell(script.into()), opts, &Ctx::background())
        .await
        .unwrap();
    let text = out.lock().unwrap().clone();
    (r.exit_code, text)
}

/// Whether pid runs in the environment (a zombie does not).
async fn running(env: &dyn ExecutionEnv, pid: &str) -> bool {
    let (_, s) = sh(
        env,
        &format!("sed -n 's/.*) \\(.\\).*/\\1/p' /proc/{pid}/stat 2>/dev/null"),
    )
    .await;
    let s = s.trim();
    !s.is_empty() && s != "Z"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_or_an_abort_ends_the_whole_group_after_asking_first() {
    let e = envs(&[]).await;
    for (name, env, _) in &e.list {
        let env = &**env;
        // Timeout: the command and what it left in the background end.
        let (out, mut opts) = sink();
        opts.timeout = Some(1.0);
        let t = Instant::now();
        let script =
            "trap 'echo asked-to-end; exit 0' TERM; sleep 300 >/dev/null 2>&1 & echo $! > bgpid; sleep 300 & wait";
        let err = env
            .exec(Command::Shell(script.into()), opts, &Ctx::background())
            .await
            .unwrap_err();
        assert_eq!(err.code, ExecCode::Timeout, "{name}: {err}");
        assert!(!err.kill_unconfirmed, "{name}");
        assert!(
            t.elapsed() < Duration::from_secs(8),
            "{name}: the stop took {:?}",
            t.elapsed()
        );
        assert!(
            out.lock().unwrap().contains("asked-to-end"),
            "{name}: the group was asked to end first"
        );
        let bg = env.read_text_file("bgpid", &Ctx::background()).await.unwrap();
        assert!(
            !running(env, bg.trim()).await,
            "{name}: a program the command left in the background still runs"
        );

        // Abort through the context.
        let ctx = Ctx::background();
        let c = ctx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            c.cancel();
        });
        let err = env
            .exec(Command::Shell("sleep 300".into()), ExecOptions::default(), &ctx)
            .await
            .unwrap_err();
        assert_eq!(err.code, ExecCode::Aborted, "{name}");

        // A group that ignores the request to end is killed a second later, children too.
        let opts = ExecOptions {
            timeout: Some(1.0),
            ..Default::default()
        };
        let t = Instant::now();
        let script = "trap '' TERM; sleep 300 >/dev/null 2>&1 & echo $! > deaf; sleep 300";
        let err = env
            .exec(Command::Shell(script.into()), opts, &Ctx::background())
            .await
            .unwrap_err();
        assert_eq!(err.code, ExecCode::Timeout, "{name}: {err}");
        assert!(!err.kill_unconfirmed, "{name}: {err}");
        assert!(
            t.elapsed() >= Duration::from_secs(2),
            "{name}: killed only after asking"
        );
        let deaf = env.read_text_file("deaf", &Ctx::background()).await.unwrap();
        assert!(
            !running(env, deaf.trim()).await,
            "{name}: a child that ignored TERM still runs"
        );
    }
}

/// The bash tool in a box with a runner: its command is the runner's own child, leading its
/// own group (no wrapper process between them), and a timeout still ends what it started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_runner_the_bash_tool_is_the_runners_own_process_and_its_timeout_ends_the_tree() {
    let e = envs(&[]).await;
    let mut runners = 0;
    for (name, env, b) in &e.list {
        if b.as_ref().is_none_or(|b| b.files().is_none()) {
            continue;
        }
        runners += 1;
        let env = &**env;
        let ctx = Ctx::background();
        let r = tools::call(
            "bash",
            env,
            serde_json::json!({"command": "read -r s < /proc/$$/stat; set -- ${s##*) }; echo \"$(cat /proc/$PPID/comm) $3 $$\""}),
            &ctx,
        )
        .await;
        let said = r.text();
        let words: Vec<&str> = said.split_whitespace().collect();
        assert_eq!(words.len(), 3, "{name}: {said}");
        assert_eq!(words[0], "agentbox-runner", "{name}: the command's parent");
        assert_eq!(words[1], words[2], "{name}: the command leads its group");

        let r = tools::call(
            "bash",
            env,
            serde_json::json!({"command": "sleep 300 & echo $! > bg-child; echo started; sleep 300", "timeout": 1}),
            &ctx,
        )
        .await;
        assert!(r.is_error, "{name}");
        assert!(
            r.text().ends_with("Command timed out after 1 seconds"),
            "{name}: {}",
            r.text()
        );
        let bg = env.read_text_file("bg-child", &ctx).await.unwrap();
        assert!(
            !running(env, bg.trim()).await,
            "{name}: the background child outlived the timeout"
        );
    }
    assert!(runners >= 1, "a box with a runner was tried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variables_paths_argv_and_exit_codes() {
    let e = envs(&[("BOX_SETTING", "from-spec")]).await;
    for (name, env, b) in &e.list {
        let env = &**env;
        let ctx = Ctx::background();
        // The caller's variables, PATH included, reach the command alone.
        let (out, mut opts) = sink();
        opts.env.insert("CALLER".into(), "yes".into());
        opts.env.insert("PATH".into(), "/nonexistent".into());
        let r = env
            .exec(Command::Shell("echo \"$CALLER $PATH\"".into()), opts, &ctx)
            .await
            .unwrap();
        assert_eq!(
            (r.exit_code, out.lock().unwrap().as_str()),
            (0, "yes /nonexistent\n"),
            "{name}"
        );
        assert_eq!(sh(env, "echo \"${CALLER-unset}\"").await.1, "unset\n", "{name}");

        // inherit_env false: the caller's variables and a default PATH, nothing else.
        let (out, mut opts) = sink();
        opts.inherit_env = Some(false);
        opts.env.insert("ONLY".into(), "this".into());
        let script = "echo \"$ONLY ${BOX_SETTING-unset} $PATH\"; env | cut -d= -f1 | grep -v -e '^PWD$' -e '^SHLVL$' -e '^_$' -e '^OLDPWD$' | sort | tr '\\n' ' '";
        env.exec(Command::Shell(script.into()), opts, &ctx).await.unwrap();
        assert_eq!(
            out.lock().unwrap().as_str(),
            "this unset /usr/local/bin:/usr/bin:/bin\nONLY PATH ",
            "{name}"
        );
        if b.is_some() {
            assert_eq!(
                sh(env, "echo $BOX_SETTING").await.1,
                "from-spec\n",
                "{name}: inherited by default"
            );
        }

        // argv runs argv[0] directly, arguments untouched.
        let (out, opts) = sink();
        let argv = vec![
            "printf".to_string(),
            "%s|".into(),
            "a b".into(),
            "$HOME".into(),
            "'q'".into(),
        ];
        env.exec(Command::Argv(argv), opts, &ctx).await.unwrap();
        assert_eq!(out.lock().unwrap().as_str(), "a b|$HOME|'q'|", "{name}");
        let err = env
            .exec(Command::Argv(vec![]), ExecOptions::default(), &ctx)
            .await
            .unwrap_err();
        assert_eq!(
            (err.code, err.message.as_str()),
            (ExecCode::SpawnError, "Empty argv: no program to run"),
            "{name}"
        );
        let err = env
            .exec(
                Command::Argv(vec!["agentbox-no-such".into()]),
                ExecOptions::default(),
                &ctx,
            )
            .await
            .unwrap_err();
        assert_eq!(err.code, ExecCode::SpawnError, "{name}");

        // 128 + signal; a missing working directory.
        assert_eq!(sh(env, "kill -KILL $$").await.0, 137, "{name}");
        let opts = ExecOptions {
            cwd: Some("no/such/dir".into()),
            ..Default::default()
        };
        let err = env.exec(Command::Shell("true".into()), opts, &ctx).await.unwrap_err();
        assert_eq!(err.code, ExecCode::SpawnError, "{name}");
        assert!(
            err.message.starts_with("Working directory does not exist: "),
            "{name}: {}",
            err.message
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_past_the_spill_threshold_goes_whole_to_a_file() {
    let e = envs(&[]).await;
    for (name, env, _) in &e.list {
        let env = &**env;
        let (out, mut opts) = sink();
        opts.spill = Some(Spill {
            after_bytes: Some(50_000),
            after_lines: None,
        });
        let r = env
            .exec(Command::Shell("seq 1 30000".into()), opts, &Ctx::background())
            .await
            .unwrap();
        let spilled = r.spill_path.expect("spilled");
        let whole = env.read_text_file(&spilled, &Ctx::background()).await.unwrap();
        assert_eq!(whole, *out.lock().unwrap(), "{name}");
        assert!(whole.ends_with("29999\n30000\n"), "{name}");
        let (_, opts) = sink();
        let r = env
            .exec(
                Command::Shell("seq 1 10".into()),
                ExecOptions {
                    spill: Some(Spill {
                        after_bytes: Some(50_000),
                        after_lines: None,
                    }),
                    ..opts
                },
                &Ctx::background(),
            )
            .await
            .unwrap();
        assert_eq!(r.spill_path, None, "{name}");
        // A window: batched, each batch the tail.
        let calls = Arc::new(Mutex::new(Vec::<String>::new()));
        let c = calls.clone();
        let opts = ExecOptions {
            on_output: Some(Arc::new(move |t: &str, _| {
                c.lock().unwrap().push(t.to_string());
                Ok(())
            })),
            window: Some(Window {
                max_bytes: None,
                max_lines: Some(3),
                interval_ms: 60_000,
            }),
            ..Default::default()
        };
        env.exec(Command::Shell("seq 1 1000".into()), opts, &Ctx::background())
            .await
            .unwrap();
        assert_eq!(*calls.lock().unwrap(), vec!["998\n999\n1000\n".to_string()], "{name}");
        env.cleanup(&Ctx::background()).await.unwrap();
        assert!(
            !env.exists(&spilled, &Ctx::background()).await.unwrap(),
            "{name}: cleanup removes temporary files"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_are_bounded_and_refuse_links_when_asked() {
    let home = tempfile::tempdir().unwrap();
    agentbox_testing::runner::ensure();
    let lp = LocalProvider::new(LocalOptions::at(home.path()).unwrap()).unwrap();
    let b = lp
        .create(&Spec::new(Duration::from_secs(300)), &Ctx::background())
        .await
        .unwrap();
    let host_dir = tempfile::tempdir().unwrap();
    let envs: Vec<Arc<dyn ExecutionEnv>> = vec![
        Arc::new(
            HostEnv::new(host_dir.path().to_string_lossy())
                .unwrap()
                .with_max_reader_bytes(1000),
        ),
        Arc::new(BoxEnv::new(b.clone()).with_max_reader_bytes(1000)),
    ];
    let ctx = Ctx::background();
    for env in envs {
        env.write_file("big", &[b'x'; 1001], &ctx).await.unwrap();
        env.write_file("small", b"one\ntwo\nthree", &ctx).await.unwrap();
        let e = env.open_binary_reader("big", false, &ctx).await.unwrap_err();
        assert_eq!(e.code, FsCode::NotSupported, "{}", env.id());
        let r = env.open_binary_reader("small", false, &ctx).await.unwrap();
        assert_eq!(r.read(4, 3), b"two");
        assert_eq!(
            r.scan_lines().map(|(o, l)| (o, l.to_vec())).collect::<Vec<_>>()[2],
            (8, b"three".to_vec())
        );
        let mut lines = env.open_text_line_reader("small", &ctx).await.unwrap();
        assert_eq!(lines.next_line(), Some(("one".into(), true)));
        lines.next_line();
        assert_eq!(lines.next_line(), Some(("three".into(), false)));
        assert_eq!(lines.next_line(), None);
        env.exec(
            Command::Argv(vec!["ln".into(), "-s".into(), "small".into(), "link".into()]),
            ExecOptions::default(),
            &ctx,
        )
        .await
        .unwrap();
        let e = env.open_binary_reader("link", true, &ctx).await.unwrap_err();
        assert_eq!(e.code, FsCode::Invalid);
        assert!(
            e.message.starts_with("Refusing to follow a symbolic link"),
            "{}",
            e.message
        );
        assert_eq!(
            env.open_binary_reader("link", false, &ctx).await.unwrap().read(0, 3),
            b"one"
        );
        assert_eq!(
            env.read_text_lines("small", Some(2), &ctx).await.unwrap(),
            vec!["one", "two"]
        );
    }
    b.destroy(&ctx).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_sees_changes() {
    let e = envs(&[]).await;
    for (name, env, _) in &e.list {
        let ctx = Ctx::background();
        env.create_dir("w/sub", true, &ctx).await.unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let target = WatchTarget {
            path: "w".into(),
            recursive: true,
            exclude: vec!["skip".into()],
        };
        let watcher = env
            .watch(vec![target], Arc::new(move |c| s.lock().unwrap().push(c)), &ctx)
            .await
            .unwrap();
        assert_eq!(watcher.mode, watch::WatchMode::Polling);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        env.write_file("w/sub/new.txt", b"1", &ctx).await.unwrap();
        env.write_file("w/skip/ignored.txt", b"1", &ctx).await.unwrap();
        let t = Instant::now();
        loop {
            let got = seen.lock().unwrap().clone();
            if got
                .iter()
                .any(|c| c.path.ends_with("w/sub/new.txt") && c.kind == ChangeKind::Created)
            {
                assert!(!got.iter().any(|c| c.path.contains("skip")), "{name}: {got:?}");
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "{name}: saw {got:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        watcher.close();
    }
}

/// A box whose kill execs can be made to fail and whose execs can be made to hang.
struct Faulty {
    inner: Arc<dyn Sandbox>,
    fail_kills: AtomicBool,
    hang: AtomicBool,
}

#[async_trait]
impl Sandbox for Faulty {
    fn id(&self) -> &SandboxId {
        self.inner.id()
    }
    fn facts(&self) -> &Facts {
        self.inner.facts()
    }
    fn labels(&self) -> &Labels {
        self.inner.labels()
    }
    async fn exec(&self, argv: &[String], opts: &BoxExecOptions, ctx: &Ctx) -> agentbox_core::Result<Process> {
        if self.hang.load(Ordering::SeqCst) {
            return Err(ctx.done().await);
        }
        if self.fail_kills.load(Ordering::SeqCst) && argv.iter().any(|a| a == "agentbox-kill") {
            return Err(agentbox_core::Error::unknown("scripted: the kill exec fails"));
        }
        self.inner.exec(argv, opts, ctx).await
    }
    async fn status(&self, ctx: &Ctx) -> agentbox_core::Result<Status> {
        self.inner.status(ctx).await
    }
    async fn upload(&self, p: &str, d: &[u8], ctx: &Ctx) -> agentbox_core::Result<()> {
        self.inner.upload(p, d, ctx).await
    }
    async fn download(&self, p: &str, m: u64, ctx: &Ctx) -> agentbox_core::Result<Vec<u8>> {
        self.inner.download(p, m, ctx).await
    }
    async fn endpoint(&self, port: u16, ctx: &Ctx) -> agentbox_core::Result<Endpoint> {
        self.inner.endpoint(port, ctx).await
    }
    async fn destroy(&self, ctx: &Ctx) -> agentbox_core::Result<()> {
        self.inner.destroy(ctx).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_kill_is_an_error_and_cleanup_ends_the_group() {
    let home = tempfile::tempdir().unwrap();
    agentbox_testing::runner::ensure();
    let lp = LocalProvider::new(LocalOptions::at(home.path()).unwrap()).unwrap();
    let inner = lp
        .create(&Spec::new(Duration::from_secs(300)), &Ctx::background())
        .await
        .unwrap();
    let faulty = Arc::new(Faulty {
        inner: inner.clone(),
        fail_kills: AtomicBool::new(true),
        hang: AtomicBool::new(false),
    });
    let env = BoxEnv::new(faulty.clone());
    let t = Instant::now();
    let opts = ExecOptions {
        timeout: Some(0.5),
        ..Default::default()
    };
    let err = env
        .exec(
            Command::Shell("echo $$ > leader; exec sleep 300".into()),
            opts,
            &Ctx::background(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, ExecCode::Timeout);
    assert!(err.kill_unconfirmed, "{err}");
    assert!(err.message.contains("could not be confirmed"), "{}", err.message);
    assert!(
        t.elapsed() < Duration::from_secs(13),
        "the confirmation is bounded by 10s: {:?}",
        t.elapsed()
    );
    let groups = env.tracked_groups();
    assert_eq!(groups.len(), 1, "the command stays tracked");
    let leader = env.read_text_file("leader", &Ctx::background()).await.unwrap();
    assert!(running(&env, leader.trim()).await);
    faulty.fail_kills.store(false, Ordering::SeqCst);
    env.cleanup(&Ctx::background()).await.unwrap();
    assert!(env.tracked_groups().is_empty());
    assert!(!running(&env, leader.trim()).await, "cleanup ended it");

    // A box that stops answering is an error on that call and every later one.
    let env = BoxEnv::new(faulty.clone()).with_op_timeout(Duration::from_millis(300));
    faulty.hang.store(true, Ordering::SeqCst);
    let e = env.read_text_file("leader", &Ctx::background()).await.unwrap_err();
    assert!(e.message.contains("stopped answering"), "{}", e.message);
    faulty.hang.store(false, Ordering::SeqCst);
    let e2 = env.read_text_file("leader", &Ctx::background()).await.unwrap_err();
    assert_eq!(e2.message, e.message, "the reason sticks");
    let e3 = env
        .exec(
            Command::Shell("true".into()),
            ExecOptions::default(),
            &Ctx::background(),
        )
        .await
        .unwrap_err();
    assert!(e3.message.contains("stopped answering"));
    inner.destroy(&Ctx::background()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_box_fails_every_call_and_a_new_host_ends_what_a_dead_one_left() {
    let e = envs(&[]).await;
    for (name, _, b) in &e.list {
        let Some(b) = b else { continue };
        // A host starts a command and dies: the command runs on in the box.
        let first = Arc::new(BoxEnv::new(b.clone()));
        let f = first.clone();
        let task = tokio::spawn(async move {
            let _ = f
                .exec(
                    Command::Shell("echo $$ > left-pid; exec sleep 300".into()),
                    ExecOptions::default(),
                    &Ctx::background(),
                )
                .await;
        });
        let next = BoxEnv::new(b.clone());
        let ctx = Ctx::background();
        let t = Instant::now();
        while !next.exists("left-pid", &ctx).await.unwrap() {
            assert!(t.elapsed() < Duration::from_secs(10));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        task.abort();
        drop(first);
        let pid = next.read_text_file("left-pid", &ctx).await.unwrap();
        assert!(running(&next, pid.trim()).await, "{name}: the left command runs on");
        if b.files().is_none() {
            let ended = end_left_commands(&**b, &ctx).await.unwrap();
            assert_eq!(ended, vec![pid.trim().parse::<u32>().unwrap()], "{name}");
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(!running(&next, pid.trim()).await, "{name}: ended");
            assert!(
                end_left_commands(&**b, &ctx).await.unwrap().is_empty(),
                "{name}: nothing left twice"
            );
        } else {
            // A command over a runner is the runner's process, which the scripts never wrote
            // down: the box's end below ends it.
            assert!(end_left_commands(&**b, &ctx).await.unwrap().is_empty(), "{name}");
        }

        // The box ends behind the environment's back.
        b.destroy(&ctx).await.unwrap();
        let e1 = next.read_text_file("left-pid", &ctx).await.unwrap_err();
        assert!(e1.message.contains("gone"), "{name}: {}", e1.message);
        let e2 = next
            .exec(Command::Shell("true".into()), ExecOptions::default(), &ctx)
            .await
            .unwrap_err();
        assert_eq!(e2.code, ExecCode::Unknown, "{name}");
        assert!(e2.message.contains("gone"), "{name}: {}", e2.message);
        // Every later call carries the provider's `gone` as its cause, not only the first
        // that found it out (here a file read).
        for _ in 0..2 {
            let again = next
                .exec(Command::Shell("true".into()), ExecOptions::default(), &ctx)
                .await
                .unwrap_err();
            let cause = again.cause.as_ref().expect("a lost box's cause");
            assert_eq!(cause.code(), agentbox_core::ErrorCode::Gone, "{name}: {cause}");
            assert_eq!(
                Some(cause.to_string()),
                next.lost_cause().map(|c| c.to_string()),
                "{name}"
            );
            assert_eq!(again.message, e2.message, "{name}");
        }
    }
}

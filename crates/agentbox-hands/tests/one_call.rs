//! `BoxEnv` over a box without live processes: each exec one call that answers once its
//! command ended, no stdin, no per-call variables, no kill (Archil's exec), played by
//! `agentbox_testing::one_call::OneCall` over a local box. Files move by upload and download,
//! every byte exact; commands run to their end under their own deadline; what cannot be done is
//! refused saying why.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentbox_core::{Ctx, Provider, Sandbox, Spec};
use agentbox_hands::boxenv::WORKSPACE_TEMP_DIR;
use agentbox_hands::*;
use agentbox_providers::{LocalOptions, LocalProvider};
use agentbox_testing::one_call::{Calls, OneCall};

/// A one-call box over a fresh local box, and an environment over it.
struct Under {
    _home: tempfile::TempDir,
    inner: Arc<dyn Sandbox>,
    one: Arc<OneCall>,
    env: Arc<BoxEnv>,
}

impl Under {
    async fn new(limit: Option<Duration>) -> Under {
        agentbox_testing::runner::ensure();
        let home = tempfile::tempdir().unwrap();
        let lp = LocalProvider::new(LocalOptions::at(home.path()).unwrap()).unwrap();
        let inner = lp
            .create(&Spec::new(Duration::from_secs(300)), &Ctx::background())
            .await
            .unwrap();
        let one = Arc::new(match limit {
            Some(l) => OneCall::with_limit(inner.clone(), l).unwrap(),
            None => OneCall::new(inner.clone()).unwrap(),
        });
        let env = Arc::new(BoxEnv::new(one.clone()));
        Under {
            _home: home,
            inner,
            one,
            env,
        }
    }

    fn calls(&self) -> Calls {
        self.one.calls()
    }

    fn workspace(&self) -> String {
        self.inner.facts().workspace.clone().unwrap()
    }
}

impl Drop for Under {
    fn drop(&mut self) {
        let b = self.inner.clone();
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

/// The calls made since `before`.
fn since(before: Calls, now: Calls) -> Calls {
    Calls {
        execs: now.execs - before.execs,
        uploads: now.uploads - before.uploads,
        downloads: now.downloads - before.downloads,
    }
}

#[path = "common/sink.rs"]
mod common_sink;
use common_sink::sink;

async fn sh(env: &dyn ExecutionEnv, script: &str) -> (i32, String) {
    let (out, opts) = sink();
    let r = env
        .exec(Command::Shell(script.into()), opts, &Ctx::background())
        .await
        .unwrap_or_else(|e| panic!("{script}: {e}"));
    let text = out.lock().unwrap().clone();
    (r.exit_code, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_byte_value_goes_by_upload_and_download_exactly() {
    let u = Under::new(None).await;
    let env = &*u.env;
    let ctx = Ctx::background();
    assert!(!u.one.facts().live_processes && u.one.files().is_none() && u.one.processes().is_none());
    let bytes: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();

    let before = u.calls();
    env.write_file("bin/all", &bytes, &ctx).await.unwrap();
    assert_eq!(
        since(before, u.calls()),
        Calls {
            execs: 0,
            uploads: 1,
            downloads: 0
        },
        "a write is one upload, its bytes never on a stdin"
    );
    let seen = u.inner.download("bin/all", 1 << 20, &ctx).await.unwrap();
    assert_eq!(seen, bytes, "the box holds every byte as written");

    let before = u.calls();
    assert_eq!(env.read_binary_file("bin/all", &ctx).await.unwrap(), bytes);
    assert_eq!(
        since(before, u.calls()),
        Calls {
            execs: 0,
            uploads: 0,
            downloads: 1
        }
    );
    assert_eq!(
        env.read_text_file("bin/all", &ctx).await.unwrap(),
        String::from_utf8_lossy(&bytes)
    );
    let abs = format!("{}/bin/all", u.workspace());
    assert_eq!(
        env.read_binary_file(&abs, &ctx).await.unwrap(),
        bytes,
        "an absolute path within the workspace"
    );

    // A reader: the checks by one script, the bytes by one download.
    let before = u.calls();
    let r = env.open_binary_reader("bin/all", false, &ctx).await.unwrap();
    assert_eq!(r.read(0, usize::MAX), &bytes[..]);
    assert_eq!((r.info.kind, r.info.size), (FileKind::File, 512));
    assert_eq!(
        since(before, u.calls()),
        Calls {
            execs: 1,
            uploads: 0,
            downloads: 1
        }
    );
    let (code, out) = sh(env, "wc -c < bin/all").await;
    assert_eq!((code, out.trim()), (0, "512"));

    // The file's own failures read as the host's.
    assert_eq!(
        env.read_binary_file("nope", &ctx).await.unwrap_err().code,
        FsCode::NotFound
    );
    assert_eq!(
        env.read_text_file("bin", &ctx).await.unwrap_err().code,
        FsCode::IsDirectory
    );
    assert_eq!(
        env.read_text_file("bin/all/x", &ctx).await.unwrap_err().code,
        FsCode::NotDirectory
    );
    assert_eq!(
        env.write_file("bin", b"x", &ctx).await.unwrap_err().code,
        FsCode::IsDirectory
    );
    assert_eq!(
        env.write_file("bin/all/x", b"x", &ctx).await.unwrap_err().code,
        FsCode::NotDirectory
    );
    assert!(
        !env.exists("bin/all/x", &ctx).await.unwrap(),
        "a failed write leaves nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_keeps_the_change_of_a_command_queued_beside_it() {
    let u = Under::new(None).await;
    let ctx = Ctx::background();
    u.env.write_file("log", b"start\n", &ctx).await.unwrap();
    let env = u.env.clone();
    let command = tokio::spawn(async move {
        env.exec(
            Command::Shell("sleep 1; echo command >> log".into()),
            ExecOptions::default(),
            &Ctx::background(),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = u.calls();
    let t = Instant::now();
    u.env.append_file("log", b"appended \xff\n", &ctx).await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "the append waited for the command before it: {:?}",
        t.elapsed()
    );
    let append = since(before, u.calls());
    assert_eq!(command.await.unwrap().unwrap().exit_code, 0);
    assert_eq!(
        u.env.read_binary_file("log", &ctx).await.unwrap(),
        b"start\ncommand\nappended \xff\n",
        "both changes are kept, every byte exact"
    );
    assert_eq!(
        append,
        Calls {
            execs: 1,
            uploads: 1,
            downloads: 0
        },
        "an append is one upload and one command, never a read of the whole"
    );
    let left = u.env.list_dir(WORKSPACE_TEMP_DIR, &ctx).await.unwrap();
    assert!(left.is_empty(), "the append's own file is gone: {left:?}");

    // An append creates the file and its parents, as the host's does.
    u.env.append_file("new/dir/f", b"x", &ctx).await.unwrap();
    assert_eq!(u.env.read_text_file("new/dir/f", &ctx).await.unwrap(), "x");
    assert_eq!(
        u.env.append_file("new", b"x", &ctx).await.unwrap_err().code,
        FsCode::IsDirectory
    );
    u.env.cleanup(&ctx).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_refuses_a_file_past_its_bound_before_a_download() {
    let u = Under::new(None).await;
    let env = BoxEnv::new(u.one.clone()).with_max_reader_bytes(1000);
    let ctx = Ctx::background();
    env.write_file("big", &[b'x'; 1001], &ctx).await.unwrap();
    env.write_file("small", b"one\ntwo\nthree", &ctx).await.unwrap();

    let before = u.calls();
    let e = env.open_binary_reader("big", false, &ctx).await.unwrap_err();
    assert_eq!(e.code, FsCode::NotSupported, "{e}");
    assert_eq!(since(before, u.calls()).downloads, 0, "no download was asked");
    let e = env.open_text_line_reader("big", &ctx).await.unwrap_err();
    assert_eq!(e.code, FsCode::NotSupported);
    assert_eq!(since(before, u.calls()).downloads, 0);
    // A whole read asks the download within the bound, which the box refuses unread.
    assert_eq!(
        env.read_binary_file("big", &ctx).await.unwrap_err().code,
        FsCode::NotSupported
    );

    let r = env.open_binary_reader("small", false, &ctx).await.unwrap();
    assert_eq!(r.read(4, 3), b"two");
    let mut lines = env.open_text_line_reader("small", &ctx).await.unwrap();
    assert_eq!(lines.next_line(), Some(("one".into(), true)));
    env.exec(
        Command::Argv(vec!["ln".into(), "-s".into(), "small".into(), "link".into()]),
        ExecOptions::default(),
        &ctx,
    )
    .await
    .unwrap();
    let before = u.calls();
    let e = env.open_binary_reader("link", true, &ctx).await.unwrap_err();
    assert_eq!(e.code, FsCode::Invalid);
    assert!(
        e.message.starts_with("Refusing to follow a symbolic link"),
        "{}",
        e.message
    );
    assert_eq!(since(before, u.calls()).downloads, 0);
    let r = env.open_binary_reader("link", false, &ctx).await.unwrap();
    assert_eq!((r.info.kind, r.read(0, 3)), (FileKind::Symlink, &b"one"[..]));
    assert_eq!(
        env.open_binary_reader("dir-none", false, &ctx).await.unwrap_err().code,
        FsCode::NotFound
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_the_workspace_a_file_is_read_as_text_and_never_written() {
    let u = Under::new(None).await;
    let env = &*u.env;
    let ctx = Ctx::background();
    let (_, dir) = sh(
        env,
        "printf 'outside \\377\\nsecond\\n' > \"$TMPDIR/out.txt\"; printf %s \"$TMPDIR\"",
    )
    .await;
    let path = format!("{dir}/out.txt");
    assert!(!path.starts_with(&u.workspace()), "{path} is outside the workspace");

    let before = u.calls();
    assert_eq!(
        env.read_text_file(&path, &ctx).await.unwrap(),
        "outside \u{fffd}\nsecond\n"
    );
    assert_eq!(
        env.read_text_lines(&path, Some(1), &ctx).await.unwrap(),
        vec!["outside \u{fffd}"]
    );
    let mut lines = env.open_text_line_reader(&path, &ctx).await.unwrap();
    assert_eq!(lines.next_line(), Some(("outside \u{fffd}".into(), true)));
    assert_eq!(since(before, u.calls()).downloads, 0, "read by a script's output");

    for e in [
        env.read_binary_file(&path, &ctx).await.unwrap_err(),
        env.open_binary_reader(&path, false, &ctx).await.unwrap_err(),
    ] {
        assert_eq!(e.code, FsCode::NotSupported, "{e}");
        assert!(
            e.message.contains(&path) && e.message.contains("workspace") && e.message.contains("text"),
            "{}",
            e.message
        );
    }
    let before = u.calls();
    for e in [
        env.write_file(&path, b"new", &ctx).await.unwrap_err(),
        env.append_file(&path, b"new", &ctx).await.unwrap_err(),
        env.write_file("../outside-too", b"new", &ctx).await.unwrap_err(),
    ] {
        assert_eq!(e.code, FsCode::NotSupported, "{e}");
        assert!(
            e.message.contains("outside the workspace") && e.message.contains("upload"),
            "{}",
            e.message
        );
    }
    assert_eq!(
        since(before, u.calls()),
        Calls::default(),
        "a refused write asks nothing of the box"
    );
    assert_eq!(
        env.read_text_file(&path, &ctx).await.unwrap(),
        "outside \u{fffd}\nsecond\n",
        "unchanged"
    );
    // Commands reach it as they reach anything of the box.
    let (_, out) = sh(env, &format!("wc -l < '{path}'")).await;
    assert_eq!(out.trim(), "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_call_variable_is_refused_as_a_spawn_error() {
    let u = Under::new(None).await;
    let ctx = Ctx::background();
    for name in ["CALLER", "PATH"] {
        let before = u.calls();
        let mut opts = ExecOptions::default();
        opts.env.insert(name.into(), "x".into());
        let e = u.env.exec(Command::Shell("true".into()), opts, &ctx).await.unwrap_err();
        assert_eq!(e.code, ExecCode::SpawnError, "{name}: {e}");
        assert!(
            e.message.contains(name) && e.message.contains("env") && e.message.contains("live_processes: false"),
            "{}",
            e.message
        );
        assert_eq!(since(before, u.calls()).execs, 0, "nothing was sent");
    }
    // Set in the command itself, they reach it.
    assert_eq!(sh(&*u.env, "CALLER=yes; echo $CALLER").await.1, "yes\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_is_a_download_and_an_upload() {
    let u = Under::new(None).await;
    let ctx = Ctx::background();
    u.env.write_file("f.txt", b"one\ntwo\n", &ctx).await.unwrap();
    let before = u.calls();
    let r = tools::call(
        "edit",
        &*u.env,
        serde_json::json!({"path": "f.txt", "edits": [{"oldText": "two", "newText": "2"}]}),
        &ctx,
    )
    .await;
    assert!(!r.is_error, "{}", r.text());
    let c = since(before, u.calls());
    assert_eq!(u.env.read_text_file("f.txt", &ctx).await.unwrap(), "one\n2\n");
    assert_eq!((c.uploads, c.downloads), (1, 1), "{c:?}");
    let r = tools::call(
        "write",
        &*u.env,
        serde_json::json!({"path": "w/new.txt", "content": "hello"}),
        &ctx,
    )
    .await;
    assert!(!r.is_error, "{}", r.text());
    let r = tools::call("read", &*u.env, serde_json::json!({"path": "w/new.txt"}), &ctx).await;
    assert_eq!(r.text(), "hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_ends_at_its_own_deadline_and_one_given_up_runs_on() {
    let u = Under::new(None).await;
    let env = &*u.env;
    let ctx = Ctx::background();

    // The caller's timeout is the command's own deadline: the box ends it.
    let (out, mut opts) = sink();
    opts.timeout = Some(1.0);
    let t = Instant::now();
    let e = env
        .exec(Command::Shell("echo before; sleep 30".into()), opts, &ctx)
        .await
        .unwrap_err();
    assert_eq!(e.code, ExecCode::Timeout, "{e}");
    assert!(!e.kill_unconfirmed, "the box's own deadline ended it: {e}");
    assert!(e.message.contains("ended it"), "{}", e.message);
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    assert_eq!(*out.lock().unwrap(), "before\n", "what it printed before still arrives");

    // An abort answers at once; the command, which nothing can reach, runs on, and the next
    // call waits for it.
    let abort = Ctx::background();
    let a = abort.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        a.cancel();
    });
    let t = Instant::now();
    let e = env
        .exec(
            Command::Shell("sleep 2; echo late > late.txt".into()),
            ExecOptions::default(),
            &abort,
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, ExecCode::Aborted, "{e}");
    assert!(e.kill_unconfirmed, "{e}");
    assert!(
        e.message.contains("could not be stopped") && e.message.contains("runs on"),
        "{}",
        e.message
    );
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "answered at once: {:?}",
        t.elapsed()
    );
    assert_eq!(
        env.read_text_file("late.txt", &ctx).await.unwrap(),
        "late\n",
        "the next call waited for it"
    );
    assert!(t.elapsed() >= Duration::from_millis(1900), "{:?}", t.elapsed());

    // A caller that gives up before its turn never has its command run.
    let env2 = u.env.clone();
    let first = tokio::spawn(async move {
        env2.exec(
            Command::Shell("sleep 2".into()),
            ExecOptions::default(),
            &Ctx::background(),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let e = env
        .exec(
            Command::Shell("touch never-ran".into()),
            ExecOptions::default(),
            &Ctx::background().with_timeout(Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, ExecCode::Timeout, "{e}");
    assert!(e.message.contains("never run"), "{}", e.message);
    assert_eq!(first.await.unwrap().unwrap().exit_code, 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!env.exists("never-ran", &ctx).await.unwrap(), "it never ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_past_the_bound_of_one_call_ends_at_the_bound() {
    let u = Under::new(Some(Duration::from_secs(2))).await;
    assert_eq!(u.one.facts().max_exec_ms, Some(2000));
    let opts = ExecOptions {
        timeout: Some(20.0),
        ..Default::default()
    };
    let t = Instant::now();
    let e = u
        .env
        .exec(Command::Shell("sleep 30".into()), opts, &Ctx::background())
        .await
        .unwrap_err();
    assert_eq!(e.code, ExecCode::Timeout, "{e}");
    assert!(e.message.contains("bound on one call, 2 seconds"), "{}", e.message);
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    // The operations' own deadlines stay within the bound too.
    assert!(u.env.write_file("f", b"x", &Ctx::background()).await.is_ok());
    assert!(u.env.exists("f", &Ctx::background()).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_run_in_place_and_say_why_they_cannot() {
    let u = Under::new(None).await;
    let env = &*u.env;
    let ctx = Ctx::background();
    // argv runs argv[0] directly, arguments untouched; stdin is closed.
    let (out, opts) = sink();
    let argv = vec!["printf".to_string(), "%s|".into(), "a b".into(), "$HOME".into()];
    env.exec(Command::Argv(argv), opts, &ctx).await.unwrap();
    assert_eq!(out.lock().unwrap().as_str(), "a b|$HOME|");
    assert_eq!(sh(env, "cat; echo read-eof").await, (0, "read-eof\n".into()));
    assert_eq!(sh(env, "exit 3").await.0, 3);
    assert_eq!(sh(env, "kill -KILL $$").await.0, 137);
    env.create_dir("sub", false, &ctx).await.unwrap();
    let (out, mut opts) = sink();
    opts.cwd = Some("sub".into());
    env.exec(Command::Shell("pwd".into()), opts, &ctx).await.unwrap();
    assert_eq!(out.lock().unwrap().trim_end(), format!("{}/sub", u.workspace()));

    // inherit_env false: none of the box's variables, a default PATH.
    let (out, mut opts) = sink();
    opts.inherit_env = Some(false);
    env.exec(Command::Shell("echo \"${HOME-unset} $PATH\"".into()), opts, &ctx)
        .await
        .unwrap();
    assert_eq!(out.lock().unwrap().as_str(), "unset /usr/local/bin:/usr/bin:/bin\n");

    let e = env
        .exec(
            Command::Argv(vec!["agentbox-no-such".into()]),
            ExecOptions::default(),
            &ctx,
        )
        .await
        .unwrap_err();
    assert_eq!(
        (e.code, e.message.as_str()),
        (ExecCode::SpawnError, "agentbox-no-such: program not found")
    );
    let opts = ExecOptions {
        cwd: Some("no/such/dir".into()),
        ..Default::default()
    };
    let e = env.exec(Command::Shell("true".into()), opts, &ctx).await.unwrap_err();
    assert_eq!(e.code, ExecCode::SpawnError);
    assert!(
        e.message.starts_with("Working directory does not exist: "),
        "{}",
        e.message
    );
    let r = tools::call(
        "bash",
        env,
        serde_json::json!({"command": "echo out; echo err >&2; exit 2"}),
        &ctx,
    )
    .await;
    assert!(r.is_error);
    let said = r.text();
    assert!(
        said.starts_with("out\nerr") && said.ends_with("Command exited with code 2"),
        "{said}"
    );
    assert!(env.tracked_groups().is_empty(), "nothing is tracked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_runs_in_the_background() {
    let u = Under::new(None).await;
    let env = &*u.env;
    let ctx = Ctx::background();
    let e = env
        .start(Command::Shell("sleep 10".into()), StartOptions::default(), &ctx)
        .await
        .unwrap_err();
    assert_eq!(e.code, ExecCode::SpawnError);
    assert!(e.message.contains("live_processes: false"), "{}", e.message);
    let e = env.processes(&ctx).await.err().expect("no processes");
    assert_eq!(e.code(), agentbox_core::ErrorCode::Unsupported);
    let r = tools::call(
        "process_write",
        env,
        serde_json::json!({"handle": 1, "text": "x"}),
        &ctx,
    )
    .await;
    assert!(r.is_error);
    assert!(
        r.text().starts_with("No processes here: box ") && r.text().contains("nothing takes input"),
        "{}",
        r.text()
    );
    let r = tools::call(
        "bash",
        env,
        serde_json::json!({"command": "sleep 10", "background": true}),
        &ctx,
    )
    .await;
    assert!(r.is_error);
    assert!(
        r.text()
            .starts_with("Could not start the command in the background: box "),
        "{}",
        r.text()
    );
    assert_eq!(u.calls().execs, 0, "nothing was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temporaries_and_spilled_output_go_under_the_workspace() {
    let u = Under::new(None).await;
    let env = &*u.env;
    let ctx = Ctx::background();
    let under = format!("{}/{WORKSPACE_TEMP_DIR}/", u.workspace());
    let f = env.create_temp_file("t-", ".txt", &ctx).await.unwrap();
    assert!(f.starts_with(&under) && f.ends_with(".txt"), "{f}");
    env.write_file(&f, b"kept", &ctx).await.unwrap();
    let d = env.create_temp_dir("d-", &ctx).await.unwrap();
    assert!(d.starts_with(&under), "{d}");
    env.write_file(&format!("{d}/inner"), b"x", &ctx).await.unwrap();

    let (out, mut opts) = sink();
    opts.spill = Some(Spill {
        after_bytes: Some(50_000),
        after_lines: None,
    });
    let r = env
        .exec(Command::Shell("seq 1 30000".into()), opts, &ctx)
        .await
        .unwrap();
    let spilled = r.spill_path.expect("spilled");
    assert!(spilled.starts_with(&under), "{spilled}");
    let whole = env.read_text_file(&spilled, &ctx).await.unwrap();
    assert_eq!(whole, *out.lock().unwrap());
    assert!(whole.ends_with("29999\n30000\n"));

    env.cleanup(&ctx).await.unwrap();
    for p in [&f, &d, &spilled] {
        assert!(!env.exists(p, &ctx).await.unwrap(), "cleanup removed {p}");
    }
}

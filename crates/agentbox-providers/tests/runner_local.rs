//! Local boxes through their runner: the conformance suite, one message per exec and file
//! operation, and output that arrives whole across a dropped connection.

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, ExecOptions, FinishOptions, Provider, Sandbox, Spec, finish};
use agentbox_providers::runner::RunnerSandbox;
use agentbox_providers::{LocalOptions, LocalProvider};
use agentbox_testing::conformance::{self, Options};
use agentbox_testing::outside::LocalView;

/// A local box made without a runner, and the runner binary, for a test that starts (and
/// kills) the box's runner itself.
async fn bare_box(root: &std::path::Path, ctx: &Ctx) -> (Arc<dyn Sandbox>, std::path::PathBuf) {
    let runner = agentbox_testing::runner::ensure();
    let mut opts = LocalOptions::at(root).unwrap();
    opts.runner = false;
    let local = LocalProvider::new(opts).unwrap();
    let inner = local.create(&Spec::new(Duration::from_secs(60)), ctx).await.unwrap();
    (inner, runner)
}

fn provider(root: &std::path::Path) -> Arc<dyn Provider> {
    agentbox_testing::runner::ensure();
    let mut opts = LocalOptions::at(root).unwrap();
    opts.runner = true;
    Arc::new(LocalProvider::new(opts).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_boxes_through_their_runner_pass_the_conformance_suite() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().to_path_buf();
    let outside = Arc::new(LocalView {
        boxes: path.join("boxes"),
    });
    let options = Options::new("local+runner", Duration::from_secs(3), Duration::from_secs(4), outside);
    let report = conformance::run(
        conformance::factory(move || {
            let path = path.clone();
            async move { provider(&path) }
        }),
        options,
    )
    .await;
    report.assert_all_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_box_made_with_a_runner_says_so_and_serves_its_files() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path());
    let ctx = Ctx::background();
    let b = p.create(&Spec::new(Duration::from_secs(60)), &ctx).await.unwrap();
    assert!(
        b.facts().runner.as_deref().is_some_and(|r| r.contains("runner.sock")),
        "{:?}",
        b.facts().runner
    );
    let files = b.files().expect("a runner box serves its files");
    files.write("a/b.txt", b"hello", false, &ctx).await.unwrap();
    assert_eq!(files.read("a/b.txt", &ctx).await.unwrap(), Some(b"hello".to_vec()));
    assert_eq!(b.download("a/b.txt", 100, &ctx).await.unwrap(), b"hello");
    let ws = b.facts().workspace.clone().unwrap();
    assert_eq!(std::fs::read(format!("{ws}/a/b.txt")).unwrap(), b"hello");
    // Found again by a new provider (a new host process): still through the runner.
    let again = provider(root.path()).attach(b.id(), &ctx).await.unwrap().unwrap();
    assert!(again.files().is_some());
    assert_eq!(
        again.files().unwrap().read("a/b.txt", &ctx).await.unwrap(),
        Some(b"hello".to_vec())
    );
    b.destroy(&ctx).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_arrives_whole_across_a_dropped_connection() {
    let root = tempfile::tempdir().unwrap();
    let ctx = Ctx::background();
    let (inner, runner) = bare_box(root.path(), &ctx).await;
    // The same runner the provider would start, reached on its socket.
    let sock = root.path().join("boxes").join(inner.id().name()).join("runner.sock");
    let program = vec![runner.to_string_lossy().into_owned()];
    agentbox_providers::runner::start(
        inner.as_ref(),
        &program,
        &[format!("unix:{}", sock.display())],
        None,
        &ctx,
    )
    .await
    .unwrap();
    let b = RunnerSandbox::new(inner.clone(), Arc::new(agentbox_providers::runner::Address::Unix(sock)));
    let script = "for i in $(seq 1 20); do echo line $i; sleep 0.05; done";
    let argv: Vec<String> = ["sh", "-c", script].iter().map(|s| s.to_string()).collect();
    let p = b.exec(&argv, &ExecOptions::default(), &ctx).await.unwrap();
    let client = b.client().clone();
    let dropper = tokio::spawn(async move {
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            client.drop_connection().await;
        }
    });
    let out = finish(p, FinishOptions::default()).await.unwrap();
    dropper.await.unwrap();
    let want: String = (1..=20).map(|i| format!("line {i}\n")).collect();
    assert_eq!(out.stdout_text(), want);
    assert_eq!(out.status.code, 0);
    inner.destroy(&ctx).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_starts_the_runner_again_when_it_died() {
    let root = tempfile::tempdir().unwrap();
    let ctx = Ctx::background();
    let b = provider(root.path())
        .create(&Spec::new(Duration::from_secs(60)), &ctx)
        .await
        .unwrap();
    b.files().unwrap().write("kept", b"1", false, &ctx).await.unwrap();
    let sock = root.path().join("boxes").join(b.id().name()).join("runner.sock");
    let sock = sock.to_string_lossy().into_owned();
    let runners: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(&sock))
        })
        .collect();
    assert_eq!(runners.len(), 1, "one runner serves the box");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(runners[0]).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    for _ in 0..100 {
        if std::fs::read_to_string(format!("/proc/{}/stat", runners[0])).map_or(true, |s| s.contains(") Z ")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = provider(root.path()).attach(b.id(), &ctx).await.unwrap().unwrap();
    assert_eq!(
        again.files().unwrap().read("kept", &ctx).await.unwrap(),
        Some(b"1".to_vec())
    );
    b.destroy(&ctx).await.unwrap();
}

/// One slow reader never holds up its siblings: a process whose output nobody reads (far more
/// than any window or buffer) must not stop another process's exit or a file read of the same
/// box, which share its one connection to the runner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_holds_up_only_its_own_process() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path());
    let ctx = Ctx::background();
    let b = p.create(&Spec::new(Duration::from_secs(60)), &ctx).await.unwrap();
    let files = b.files().expect("a runner box serves its files");
    files.write("note.txt", b"still here", false, &ctx).await.unwrap();
    // 64 MiB of output that nobody reads: the stdout reader is kept, never polled.
    let flood = b
        .exec(
            &[
                "sh".into(),
                "-c".into(),
                "head -c 67108864 /dev/zero; echo done >&2".into(),
            ],
            &ExecOptions::default(),
            &ctx,
        )
        .await
        .unwrap();
    // Give the flood time to fill every buffer between the runner and the reader.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let within = Ctx::background().with_timeout(Duration::from_secs(20));
    let other = b
        .exec(
            &["sh".into(), "-c".into(), "echo sibling; exit 7".into()],
            &ExecOptions::default(),
            &within,
        )
        .await
        .expect("a sibling starts while the flood is unread");
    let done = finish(other, FinishOptions::default())
        .await
        .expect("the sibling's exit arrives");
    assert_eq!((done.status.code, done.stdout_text().as_str()), (7, "sibling\n"));
    let read = tokio::time::timeout(Duration::from_secs(20), files.read("note.txt", &ctx))
        .await
        .expect("a file read is answered while the flood is unread")
        .unwrap();
    assert_eq!(read, Some(b"still here".to_vec()));
    // The flood was held up, not lost: read now, it arrives whole.
    let flood = finish(
        flood,
        FinishOptions {
            max_output: 80 << 20,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(flood.stdout.len(), 64 << 20);
    assert_eq!(flood.stderr_text(), "done\n");
    b.destroy(&ctx).await.unwrap();
}

fn drops() -> agentbox_testing::processes::DropConnections {
    Arc::new(|name: String| Box::pin(async move { agentbox_providers::runner::drop_connections(&name).await }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_through_the_runner() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path());
    agentbox_testing::processes::terminal(&*p).await.unwrap();
    agentbox_testing::processes::curses_output_whole(&*p).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_drops_lose_no_byte_of_a_slow_or_a_flat_out_writer() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path());
    agentbox_testing::processes::drops_lose_nothing(&*p, drops(), false)
        .await
        .unwrap();
    agentbox_testing::processes::drops_lose_nothing(&*p, drops(), true)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_reader_is_told_the_gap() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path());
    agentbox_testing::processes::late_reader_told_the_gap(&*p)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_outlive_the_host_process_that_started_them() {
    // The child host process makes its provider on its parent's root.
    const ROOT: &str = "AGENTBOX_TEST_LOCAL_ROOT";
    let keep = tempfile::tempdir().unwrap();
    let root = match (agentbox_testing::reexec::part(), std::env::var(ROOT)) {
        (Some(_), Ok(r)) => std::path::PathBuf::from(r),
        _ => keep.path().to_path_buf(),
    };
    let p = provider(&root);
    let env = [(ROOT, root.display().to_string())];
    agentbox_testing::processes::outlive_the_host("processes_outlive_the_host_process_that_started_them", &*p, &env)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_box_without_its_runner_refuses_detach_and_timeout() {
    let root = tempfile::tempdir().unwrap();
    agentbox_testing::runner::ensure();
    let mut opts = LocalOptions::at(root.path()).unwrap();
    opts.runner = false;
    let p: Arc<dyn Provider> = Arc::new(LocalProvider::new(opts).unwrap());
    agentbox_testing::processes::refused_without_processes(&*p)
        .await
        .unwrap();
}

/// A runner whose bound is under the window the client asks is granted that bound, and the
/// client acknowledges within it: 2 MiB through a 100 KB runner arrive whole (the client
/// waited for 256 KiB before its first ack, which the runner never sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_with_a_small_bound_is_read_to_the_end() {
    let root = tempfile::tempdir().unwrap();
    let ctx = Ctx::background();
    let (inner, runner) = bare_box(root.path(), &ctx).await;
    let sock = root.path().join("boxes").join(inner.id().name()).join("small.sock");
    let mut argv = vec![runner.to_string_lossy().into_owned()];
    argv.extend(["serve", "--max-buffered", "100000", "--listen"].map(String::from));
    argv.push(format!("unix:{}", sock.display()));
    argv.push("--detach".into());
    let p = inner.exec(&argv, &ExecOptions::default(), &ctx).await.unwrap();
    let started = finish(p, FinishOptions::default()).await.unwrap();
    assert_eq!(started.status.code, 0, "{}", started.stderr_text());
    let b = RunnerSandbox::new(inner.clone(), Arc::new(agentbox_providers::runner::Address::Unix(sock)));
    let script = "head -c 2097152 /dev/zero; i=0; while [ $i -lt 2000 ]; do printf o; printf e >&2; i=$((i+1)); done";
    let argv: Vec<String> = ["sh", "-c", script].iter().map(|s| s.to_string()).collect();
    let p = b.exec(&argv, &ExecOptions::default(), &ctx).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), finish(p, FinishOptions::default()))
        .await
        .expect("the output came within 60 s")
        .unwrap();
    assert_eq!(out.stdout.len(), 2097152 + 2000);
    assert_eq!(out.stderr.len(), 2000);
    inner.destroy(&ctx).await.unwrap();
}

/// A runner started again in a box (the old one killed) is another runner: a client's
/// processes ended with the old one, and their handles name nothing of the new one's. The
/// client's wait answers `gone` (it resumed the handle on the new runner, and read another
/// process's output and exit as its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_started_again_is_not_taken_for_the_old_one() {
    let root = tempfile::tempdir().unwrap();
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let (inner, runner) = bare_box(root.path(), &ctx).await;
    let sock = root.path().join("boxes").join(inner.id().name()).join("again.sock");
    let program = vec![runner.to_string_lossy().into_owned()];
    let listen = [format!("unix:{}", sock.display())];
    let first = agentbox_providers::runner::start(inner.as_ref(), &program, &listen, None, &ctx)
        .await
        .unwrap();
    let b = RunnerSandbox::new(
        inner.clone(),
        Arc::new(agentbox_providers::runner::Address::Unix(sock.clone())),
    );
    let argv = |s: &str| vec!["sh".to_string(), "-c".into(), s.to_string()];
    let mut mine = b.exec(&argv("sleep 30"), &ExecOptions::default(), &ctx).await.unwrap();
    assert_eq!(mine.handle(), Some(1));
    // The runner dies; another is started on the same socket, and runs a process of its own,
    // which takes handle 1 there.
    let pid = first.pid.unwrap();
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status();
    let _ = std::fs::remove_file(&sock);
    agentbox_providers::runner::start(inner.as_ref(), &program, &listen, None, &ctx)
        .await
        .unwrap();
    let other = RunnerSandbox::new(inner.clone(), Arc::new(agentbox_providers::runner::Address::Unix(sock)));
    let theirs = other
        .exec(&argv("echo theirs; sleep 2"), &ExecOptions::default(), &ctx)
        .await
        .unwrap();
    assert_eq!(theirs.handle(), Some(1));
    let mut out = Vec::new();
    let reader = mine.stdout.take().unwrap();
    let got = tokio::time::timeout(Duration::from_secs(30), async {
        let _ = agentbox_core::read_bounded(Some(reader), 1 << 20, "stdout")
            .await
            .map(|b| out = b);
        mine.wait().await
    })
    .await
    .expect("the old process's wait answered");
    match got {
        Err(e) if e.code() == agentbox_core::ErrorCode::Gone => {}
        other => panic!(
            "the old runner's process reads {other:?} and {:?}",
            String::from_utf8_lossy(&out)
        ),
    }
    assert!(
        out.is_empty(),
        "another process's output: {:?}",
        String::from_utf8_lossy(&out)
    );
    drop(theirs);
    inner.destroy(&ctx).await.unwrap();
}

/// A runner of protocol 2 alone (the seed's: `hello` refused), started in `inner` on `sock`.
async fn protocol_2_runner(inner: &Arc<dyn Sandbox>, runner: &std::path::Path, sock: &std::path::Path, ctx: &Ctx) {
    let mut argv = vec![runner.to_string_lossy().into_owned()];
    argv.extend(["serve", "--protocol", "2", "--listen"].map(String::from));
    argv.push(format!("unix:{}", sock.display()));
    argv.push("--detach".into());
    let p = inner.exec(&argv, &ExecOptions::default(), ctx).await.unwrap();
    let started = finish(p, FinishOptions::default()).await.unwrap();
    assert_eq!(started.status.code, 0, "{}", started.stderr_text());
}

/// A box whose runner speaks protocol 2 only is driven with what that protocol offers, not
/// refused: a command with its directory, variables, stdin, output and exit; a signal; whole
/// files both ways. What protocol 2 has no message for is refused naming it, and the box
/// hands out no files or processes, so callers go by its exec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_of_protocol_2_alone_is_driven_with_what_protocol_2_offers() {
    let root = tempfile::tempdir().unwrap();
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let (inner, runner) = bare_box(root.path(), &ctx).await;
    let sock = root.path().join("boxes").join(inner.id().name()).join("p2.sock");
    protocol_2_runner(&inner, &runner, &sock, &ctx).await;
    let b = RunnerSandbox::new(inner.clone(), Arc::new(agentbox_providers::runner::Address::Unix(sock)));
    b.check(&ctx).await.expect("a protocol-2 runner answers");
    assert!(b.client().protocol_2_only());
    assert!(b.files().is_none() && b.processes().is_none());

    // A command: its directory, its variables, its stdin, both streams and the exit code;
    // every word of argv as it was.
    let ws = b.facts().workspace.clone().unwrap();
    std::fs::create_dir(format!("{ws}/sub")).unwrap();
    let argv: Vec<String> = [
        "sh",
        "-c",
        r#"read l; printf '%s|%s|%s|%s\n' "$l" "$X" "$(basename "$PWD")" "$1"; echo e >&2; exit 3"#,
        "sh",
        "it's a 'word'",
    ]
    .map(String::from)
    .to_vec();
    let opts = ExecOptions {
        cwd: Some("sub".into()),
        env: [("X".to_string(), "x".to_string())].into(),
        ..Default::default()
    };
    let p = b.exec(&argv, &opts, &ctx).await.unwrap();
    assert_eq!(p.handle(), None, "protocol 2 names no process past its connection");
    let out = finish(
        p,
        FinishOptions {
            stdin: b"line\n".to_vec(),
            max_output: 1 << 20,
        },
    )
    .await
    .unwrap();
    assert_eq!(
        (out.status.code, out.stdout_text().as_str(), out.stderr_text().as_str()),
        (3, "line|x|sub|it's a 'word'\n", "e\n")
    );

    // A megabyte of output arrives whole and in order.
    let argv: Vec<String> = ["sh", "-c", "seq 1 150000"].map(String::from).to_vec();
    let out = finish(
        b.exec(&argv, &ExecOptions::default(), &ctx).await.unwrap(),
        FinishOptions {
            stdin: Vec::new(),
            max_output: 4 << 20,
        },
    )
    .await
    .unwrap();
    let want: String = (1..=150000).map(|n| format!("{n}\n")).collect();
    assert!(out.stdout_text() == want, "{} bytes of seq's output", out.stdout.len());

    // A signal reaches the program.
    let argv: Vec<String> = ["sleep", "30"].map(String::from).to_vec();
    let mut p = b.exec(&argv, &ExecOptions::default(), &ctx).await.unwrap();
    p.signal(15).await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), p.wait())
        .await
        .expect("the signal ended sleep")
        .unwrap();
    assert_eq!(status.code, 143);

    // What protocol 2 has no message for is refused, naming it.
    let tty = ExecOptions {
        tty: Some(agentbox_core::Tty {
            rows: 24,
            cols: 80,
            term: None,
        }),
        ..Default::default()
    };
    let Err(e) = b.exec(&argv, &tty, &ctx).await else {
        panic!("a terminal through protocol 2")
    };
    assert_eq!(e.code(), agentbox_core::ErrorCode::Unsupported);
    assert!(e.message().contains("tty") && e.message().contains("protocol 2"), "{e}");
    let e = agentbox_core::Files::stat(b.client().as_ref(), "sub", false, &ctx)
        .await
        .unwrap_err();
    assert!(format!("{e:?}").contains("protocol 2"), "{e:?}");

    // Whole files, both ways.
    b.upload("f.bin", &[0, 1, 2, 255], &ctx).await.unwrap();
    assert_eq!(std::fs::read(format!("{ws}/f.bin")).unwrap(), [0, 1, 2, 255]);
    assert_eq!(b.download("f.bin", 10, &ctx).await.unwrap(), [0, 1, 2, 255]);
    assert_eq!(
        b.download("f.bin", 3, &ctx).await.unwrap_err().code(),
        agentbox_core::ErrorCode::TooLarge
    );
    assert_eq!(
        b.download("none", 10, &ctx).await.unwrap_err().code(),
        agentbox_core::ErrorCode::NotFound
    );

    // A drop cannot be resumed: the process's wait hears of it, never a second run.
    let argv: Vec<String> = ["sh", "-c", "sleep 2; echo once >> ran"].map(String::from).to_vec();
    let mut p = b.exec(&argv, &ExecOptions::default(), &ctx).await.unwrap();
    b.client().drop_connection().await;
    let e = tokio::time::timeout(Duration::from_secs(10), p.wait())
        .await
        .expect("the drop reached the wait")
        .unwrap_err();
    assert_eq!(e.code(), agentbox_core::ErrorCode::Gone, "{e}");
    assert!(e.message().contains("protocol 2"), "{e}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let argv: Vec<String> = ["cat", "ran"].map(String::from).to_vec();
    let out = finish(
        b.exec(&argv, &ExecOptions::default(), &ctx).await.unwrap(),
        FinishOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        out.stdout_text(),
        "once\n",
        "the next call reconnects; nothing ran twice"
    );
    inner.destroy(&ctx).await.unwrap();
}

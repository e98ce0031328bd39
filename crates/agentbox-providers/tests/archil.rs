//! Archil exec boxes against the repository's fake Archil (`agentbox-fakes`), whose exec calls
//! really run each command in a fresh namespace box over a directory that stands for the disk,
//! and whose API the `archil` Python SDK judges (in `judged` below): the conformance suite
//! with exactly the seed's left-out cases (no live processes, no env), and each of the seed's
//! Archil rules: the refusals, the 300 s limit and the command's own deadline, exit 124, text
//! output, one command at a time across processes, uploads that wait, destroy and the sweep,
//! the lifetime checked by every call, a caller that gives up, errors in Archil's words, the
//! key kept out of the disk.
//!
//! All of Archil's proof is in this file: `view` reads Archil from outside the provider; the suites
//! at the top run on the fake; `judged` holds the fake to Archil's own Python SDK; `live` runs the
//! conformance suite on the real Archil, where `ARCHIL_API_KEY` is set.

#![cfg(feature = "archil")]

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{
    Ctx, ErrorCode, ExecOptions, FinishOptions, Finished, Labels, Network, Provider, Sandbox, Spec, Status, Tty, finish,
};
use agentbox_fakes::archil::{FakeArchil, FakeArchilOptions};
use agentbox_providers::archil::{ApiKey, ArchilOptions, ArchilProvider};
use agentbox_testing::conformance::{self, Options};
use agentbox_testing::services::rootfs;

use view::View;

/// The fake's key. Not a secret: the fake's own.
const KEY: &str = "archil-fake-key-for-tests-0123456789";

fn ctx() -> Ctx {
    Ctx::background().with_timeout(Duration::from_secs(120))
}

/// The fake Archil with one work disk, its exec calls on the test rootfs and its limit of one
/// call `limit`; `None` (after a loud notice, or a panic under CI) where this machine has no
/// rootfs.
async fn fake(test: &str, limit: Duration) -> Option<(FakeArchil, String)> {
    let rootfs = rootfs(test)?;
    let fake = FakeArchil::start(FakeArchilOptions {
        rootfs: Some(rootfs.into()),
        api_key: KEY.into(),
        exec_limit: limit,
        ..Default::default()
    })
    .await
    .expect("the fake Archil starts");
    let disk = fake.create_disk("agent-work").expect("the fake makes a disk");
    Some((fake, disk))
}

/// Options for the fake: its limit `limit`, the command's own deadline a second short of it.
fn options(fake: &FakeArchil, disk: &str, limit: Duration) -> ArchilOptions {
    ArchilOptions {
        base_url: fake.base_url(),
        s3_base_url: fake.s3_base_url(),
        region: Some("aws-us-east-1".into()),
        api_key: Some(ApiKey::new(KEY)),
        disk: Some(disk.into()),
        exec_limit: limit,
        own_deadline: limit - Duration::from_secs(1),
        ..Default::default()
    }
}

fn provider(o: ArchilOptions) -> Arc<dyn Provider> {
    Arc::new(ArchilProvider::new(o).expect("the options are whole"))
}

fn spec() -> Spec {
    Spec::new(Duration::from_secs(600))
}

fn argv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// `sh -c script`, run to its end. Takes its script and context by value too, so a test can
/// start one and join it later.
async fn sh(
    b: &dyn Sandbox,
    script: impl AsRef<str>,
    ctx: impl std::borrow::Borrow<Ctx>,
) -> agentbox_core::Result<Finished> {
    let p = b
        .exec(
            &argv(&["sh", "-c", script.as_ref()]),
            &ExecOptions::default(),
            ctx.borrow(),
        )
        .await?;
    finish(p, FinishOptions::default()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archil_boxes_pass_the_conformance_suite_with_the_seeds_left_out_cases() {
    let limit = Duration::from_secs(60);
    let Some((fake, disk)) = fake("archil_boxes_pass_the_conformance_suite", limit).await else {
        return;
    };
    let opts = options(&fake, &disk, limit);
    let outside = Arc::new(View::new(&fake.s3_base_url(), &disk, KEY));
    let mut options = Options::new("archil", Duration::from_secs(4), Duration::from_secs(10), outside);
    options.without_live_processes = Some(NO_LIVE_PROCESSES.into());
    options.without_env = Some(NO_ENV.into());
    let report = conformance::run(
        conformance::factory(move || {
            let opts = opts.clone();
            async move { provider(opts) }
        }),
        options,
    )
    .await;
    report.assert_all_passed();
    // Exactly the seed's left-out cases: those that need a live process or env, and the
    // lifecycle this box does not declare (names, sleep, extend, snapshots, forks).
    let left_out: Vec<(&str, &str)> = report
        .cases
        .iter()
        .filter_map(|(n, o, _)| match o {
            conformance::Outcome::LeftOut(why) => Some((n.as_str(), why.as_str())),
            _ => None,
        })
        .collect();
    let want: Vec<(&str, &str)> = LEFT_OUT
        .iter()
        .map(|(n, need)| {
            let why = match need {
                Need::LiveProcesses => NO_LIVE_PROCESSES,
                Need::Env => NO_ENV,
                Need::Lifecycle => "not declared in honours(); undeclared_lifecycle_is_refused checks it is refused",
            };
            (*n, why)
        })
        .collect();
    assert_eq!(left_out, want, "the cases left out, and why, are not the seed's");
    fake.shutdown().await;
}

/// Why a conformance case is left out of an Archil box's run.
enum Need {
    /// A program alive between calls, or its input (the seed's "no live processes").
    LiveProcesses,
    /// A variable set for every program (the seed's "no env").
    Env,
    /// Lifecycle this box does not declare (and refuses: a case of its own checks).
    Lifecycle,
}

/// The conformance cases an Archil box leaves out, exactly, in the suite's order.
const LEFT_OUT: &[(&str, Need)] = &[
    ("stdin_round_trip_and_eof", Need::LiveProcesses),
    ("host_environment_invisible_spec_env_visible", Need::Env),
    ("concurrent_execs", Need::LiveProcesses),
    ("abort_and_deadline_through_ctx", Need::LiveProcesses),
    ("kill_ends_the_program", Need::LiveProcesses),
    ("destroy_ends_every_program", Need::LiveProcesses),
    ("names_open_and_discard", Need::Lifecycle),
    ("many_names_at_once", Need::Lifecycle),
    ("sleep_keeps_files_and_wakes", Need::Lifecycle),
    ("a_sleeping_box_ends_at_its_deadline", Need::Lifecycle),
    ("extend_moves_the_deadline", Need::Lifecycle),
    ("relabel_replaces_the_host_labels", Need::Lifecycle),
    ("snapshot_and_make_from_it", Need::Lifecycle),
    ("fork_children_diverge", Need::Lifecycle),
];

const NO_LIVE_PROCESSES: &str = "each command is one Archil exec call that answers when the command ended: no \
                                 program runs between calls, and the call carries no input";
const NO_ENV: &str = "Archil's exec carries only the command: a value could ride only in the command or on the \
                      disk, where every command on it can read it";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_refusals_name_the_field_and_call_nothing() {
    let limit = Duration::from_secs(30);
    let Some((fake, disk)) = fake("the_seeds_refusals_name_the_field_and_call_nothing", limit).await else {
        return;
    };
    let p = provider(options(&fake, &disk, limit));
    let before = fake.requests().len();
    let mut labelled = spec();
    labelled.labels.insert("agentbox.provider".into(), "x".into());
    let cases: Vec<(&str, Spec, ErrorCode)> = vec![
        (
            "gpu",
            Spec {
                gpu: Some("T4".into()),
                ..spec()
            },
            ErrorCode::Unsupported,
        ),
        (
            "snapshot",
            Spec {
                snapshot: Some("s".into()),
                ..spec()
            },
            ErrorCode::Unsupported,
        ),
        (
            "workspace",
            Spec {
                workspace: Some("/w".into()),
                ..spec()
            },
            ErrorCode::Unsupported,
        ),
        (
            "isolation",
            Spec {
                isolation: Some("container".into()),
                ..spec()
            },
            ErrorCode::Unsupported,
        ),
        (
            "cpus",
            Spec {
                cpus: Some(3.0),
                ..spec()
            },
            ErrorCode::Unsupported,
        ),
        (
            "memory_mb",
            Spec {
                memory_mb: Some(3939),
                ..spec()
            },
            ErrorCode::Unsupported,
        ),
        ("env", spec().env("A", "1"), ErrorCode::Unsupported),
        (
            "network",
            Spec {
                network: Some(Network::None),
                ..spec()
            },
            ErrorCode::Unsupported,
        ),
        ("agentbox.provider", labelled, ErrorCode::Invalid),
        ("lifetime", Spec::new(Duration::ZERO), ErrorCode::Invalid),
    ];
    for (field, s, code) in cases {
        let e = p
            .create(&s, &ctx())
            .await
            .err()
            .unwrap_or_else(|| panic!("{field}: made a box"));
        assert_eq!(e.code(), code, "{field}: {e}");
        assert!(e.message().contains(field), "{field}: {e}");
    }
    assert_eq!(fake.requests().len(), before, "a refused spec called Archil");
    // What the container has is taken: 2 vCPU and 3938 MiB.
    let b = p
        .create(
            &Spec {
                cpus: Some(2.0),
                memory_mb: Some(3938),
                isolation: Some("vm".into()),
                ..spec()
            },
            &ctx(),
        )
        .await
        .unwrap();
    let f = b.facts();
    assert!(!f.live_processes);
    assert_eq!(f.max_exec_ms, Some(limit.as_millis() as u64));
    assert_eq!(
        (f.cpus, f.memory_mb, f.isolation.as_str()),
        (Some(2.0), Some(3938), "vm")
    );
    assert!(f.started_at_ms.is_some() && f.ends_at_ms.is_some());
    b.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_the_own_deadline_and_exit_124_are_timeouts() {
    let limit = Duration::from_secs(4);
    let Some((fake, disk)) = fake("the_limit_the_own_deadline_and_exit_124_are_timeouts", limit).await else {
        return;
    };
    let p = provider(options(&fake, &disk, limit));
    let b = p.create(&spec(), &ctx()).await.unwrap();
    // Over the limit of one call: refused before any call.
    let over = ExecOptions {
        timeout: Some(limit + Duration::from_millis(1)),
        ..Default::default()
    };
    let e = b.exec(&argv(&["true"]), &over, &ctx()).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::Invalid, "{e}");
    // No timeout asked: the command's own deadline (a second short of the limit) ends it in the
    // container, before the platform cuts the call.
    let e = sh(&*b, "sleep 30", &ctx()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Timeout, "{e}");
    assert!(e.message().contains("124"), "{e}");
    // An exec's own timeout.
    let one = ExecOptions {
        timeout: Some(Duration::from_secs(1)),
        ..Default::default()
    };
    let p2 = b.exec(&argv(&["sleep", "20"]), &one, &ctx()).await.unwrap();
    let e = finish(p2, FinishOptions::default()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Timeout);
    assert!(
        e.message().contains("deadline of 1.0s"),
        "the exec's own timeout was not its deadline: {e}"
    );
    // A command that ignores TERM is killed 2 s after it, and that is a timeout too.
    let p3 = b
        .exec(&argv(&["sh", "-c", "trap '' TERM; sleep 30"]), &one, &ctx())
        .await
        .unwrap();
    let e = finish(p3, FinishOptions::default()).await.unwrap_err();
    assert!(e.code() == ErrorCode::Timeout && e.message().contains("137"), "{e}");
    // Exit 124 is read as a timeout too, as the seed says.
    assert_eq!(
        sh(&*b, "exit 124", &ctx()).await.unwrap_err().code(),
        ErrorCode::Timeout
    );
    // And the box still works after each.
    assert_eq!(sh(&*b, "echo ok", &ctx()).await.unwrap().stdout, b"ok\n");
    b.destroy(&ctx()).await.unwrap();

    // Archil's own numbers, by default: 300 s a call in the facts, a command's own deadline of
    // 295 s, a queue of 60 s, and destroy's wait of 5 s, as each call sent them.
    let defaults = ArchilOptions {
        exec_limit: ArchilOptions::default().exec_limit,
        own_deadline: ArchilOptions::default().own_deadline,
        ..options(&fake, &disk, limit)
    };
    let b = provider(defaults).create(&spec(), &ctx()).await.unwrap();
    assert_eq!(b.facts().max_exec_ms, Some(300_000));
    // Billed by the call: a receipt prices it per call, never per second.
    assert!(b.facts().billed_per_call);
    assert!(!b.facts().live_processes);
    let e = b
        .exec(
            &argv(&["true"]),
            &ExecOptions {
                timeout: Some(Duration::from_millis(300_001)),
                ..Default::default()
            },
            &ctx(),
        )
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), ErrorCode::Invalid, "{e}");
    let background = Ctx::background();
    sh(&*b, "true", &background).await.unwrap();
    b.destroy(&ctx()).await.unwrap();
    let execs: Vec<serde_json::Value> = fake
        .requests()
        .iter()
        .filter(|r| r.path.starts_with("/api/exec"))
        .map(|r| serde_json::from_str(&r.body).unwrap())
        .collect();
    let (run, remove) = (&execs[execs.len() - 2], &execs[execs.len() - 1]);
    let command = run["command"].as_str().unwrap();
    assert!(
        command.contains("exec timeout -k 2 295.000 'sh' '-c' 'true'"),
        "{command}"
    );
    assert_eq!(run["disks"]["box"]["queueMs"], 60_000);
    assert_eq!(run["disks"]["box"]["subdirectory"], format!("boxes/{}", b.id().name()));
    assert_eq!(remove["disks"]["boxes"]["queueMs"], 5_000);
    assert_eq!(remove["disks"]["boxes"]["checkoutPaths"][0], b.id().name());
    fake.shutdown().await;
}

/// An archil box's exec takes no stdin, so its facts say bulk data moves as files: a seed
/// uploads its archive and unpacks it there, a pull has the box pack into a file and downloads
/// it, through the same extractor; the transfer's files are gone after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_and_a_pull_move_as_files() {
    let limit = Duration::from_secs(30);
    let Some((fake, disk)) = fake("a_seed_and_a_pull_move_as_files", limit).await else {
        return;
    };
    let p = provider(options(&fake, &disk, limit));
    let b = p.create(&spec(), &ctx()).await.unwrap();
    assert_eq!(b.facts().bulk, Some(agentbox_core::Bulk::Files));
    let host = tempfile::tempdir().unwrap();
    let h = host.path();
    std::fs::create_dir_all(h.join("src")).unwrap();
    std::fs::write(h.join("src/a.txt"), "alpha\n").unwrap();
    std::fs::write(h.join("b.bin"), (0..=255u8).collect::<Vec<u8>>()).unwrap();
    let to = "/mnt/archil/run".to_string();
    let to = format!("{}/run", b.facts().workspace.clone().unwrap_or(to));
    let seeded = agentbox_sync::seed_dir(
        &*b,
        &agentbox_sync::SeedOptions {
            from: h.to_path_buf(),
            to: to.clone(),
            ..Default::default()
        },
        &ctx(),
    )
    .await
    .unwrap()
    .whole()
    .unwrap();
    assert_eq!(seeded.sent, 3);
    assert!(seeded.mark.entries["src/a.txt"].sha256.is_some());
    let out = sh(&*b, format!("cat {to}/src/a.txt; wc -c < {to}/b.bin"), &ctx())
        .await
        .unwrap();
    assert_eq!(out.stdout_text(), "alpha\n256\n");

    sh(
        &*b,
        format!("echo beta > {to}/src/a.txt; echo new > {to}/c.txt"),
        &ctx(),
    )
    .await
    .unwrap();
    let pulled = agentbox_sync::pull_dir(
        &*b,
        &agentbox_sync::PullOptions {
            from: to.clone(),
            to: h.to_path_buf(),
            since: Some(seeded.mark),
            ..Default::default()
        },
        &ctx(),
    )
    .await
    .unwrap();
    assert!(pulled.receipt.stopped.is_none(), "{:?}", pulled.receipt);
    assert!(pulled.copy_failed.is_empty(), "{:?}", pulled.copy_failed);
    assert_eq!(std::fs::read_to_string(h.join("src/a.txt")).unwrap(), "beta\n");
    assert_eq!(std::fs::read_to_string(h.join("c.txt")).unwrap(), "new\n");
    let left = sh(&*b, "ls -A | grep -c agentbox-transfer || true", &ctx())
        .await
        .unwrap();
    assert_eq!(left.stdout_text().trim(), "0", "the transfer's files are removed");
    b.destroy(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_is_text_options_it_cannot_give_are_refused_and_bytes_move_exactly() {
    let limit = Duration::from_secs(30);
    let Some((fake, disk)) = fake("output_is_text", limit).await else {
        return;
    };
    let p = provider(options(&fake, &disk, limit));
    let b = p.create(&spec(), &ctx()).await.unwrap();
    let out = sh(&*b, r"printf 'a\377b'", &ctx()).await.unwrap();
    assert_eq!(out.stdout_text(), "a\u{FFFD}b");
    let all: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    b.upload("bin/all", &all, &ctx()).await.unwrap();
    assert_eq!(b.download("bin/all", 1 << 20, &ctx()).await.unwrap(), all);
    let out = sh(&*b, "wc -c < bin/all", &ctx()).await.unwrap();
    assert_eq!(out.stdout_text().trim(), "70000");
    // Over its bound: refused before a byte moves (no GET of it reached Archil).
    let gets = || {
        fake.requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path.ends_with("/bin/all"))
            .count()
    };
    let before = gets();
    let e = b.download("bin/all", 100, &ctx()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::TooLarge, "{e}");
    assert_eq!(gets(), before, "the file over the bound was read");
    // Outside the workspace, or climbing out of it: refused.
    assert_eq!(
        b.upload("/etc/x", b"x", &ctx()).await.unwrap_err().code(),
        ErrorCode::Unsupported
    );
    assert_eq!(
        b.upload("../x", b"x", &ctx()).await.unwrap_err().code(),
        ErrorCode::Invalid
    );
    // What the box cannot give, each named.
    let env = ExecOptions {
        env: [("A".to_string(), "1".to_string())].into(),
        ..Default::default()
    };
    let e = b.exec(&argv(&["true"]), &env, &ctx()).await.err().unwrap();
    assert!(e.code() == ErrorCode::Unsupported && e.message().contains("env"), "{e}");
    for (what, o) in [
        (
            "tty",
            ExecOptions {
                tty: Some(Tty::default()),
                ..Default::default()
            },
        ),
        (
            "detach",
            ExecOptions {
                detach: true,
                ..Default::default()
            },
        ),
    ] {
        let e = b.exec(&argv(&["true"]), &o, &ctx()).await.err().unwrap();
        assert!(
            e.code() == ErrorCode::Unsupported && e.message().contains(what),
            "{what}: {e}"
        );
    }
    assert_eq!(b.endpoint(80, &ctx()).await.unwrap_err().code(), ErrorCode::Unsupported);
    b.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_command_at_a_time_per_box_across_processes() {
    let limit = Duration::from_secs(30);
    let Some((fake, disk)) = fake("one_command_at_a_time_per_box_across_processes", limit).await else {
        return;
    };
    let o = options(&fake, &disk, limit);
    let b = provider(o.clone()).create(&spec(), &ctx()).await.unwrap();
    // A second "process": a provider of its own, the box attached by id, so the two share no
    // queue of this process's: only Archil's checkout keeps them apart.
    let other = provider(o.clone()).attach(b.id(), &ctx()).await.unwrap().unwrap();
    let script = |n: &str| format!("echo start-{n} >> log; sleep 1; echo end-{n} >> log");
    let (x, y) = tokio::join!(sh(&*b, script("a"), ctx()), sh(&*other, script("b"), ctx()));
    x.unwrap();
    y.unwrap();
    let log = String::from_utf8(b.download("log", 1 << 10, &ctx()).await.unwrap()).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 4, "{log}");
    let first = &lines[0][6..];
    assert_eq!(lines[1], format!("end-{first}"), "the two commands overlapped: {log}");
    // A caller's context is the command's deadline, counted from when its turn came: a wait
    // behind another command comes off it.
    let hold = sh(&*b, "sleep 3", ctx());
    let late = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        sh(&*b, "sleep 31", Ctx::background().with_timeout(Duration::from_secs(5))).await
    };
    let (held, late) = tokio::join!(hold, late);
    held.unwrap();
    assert_eq!(late.unwrap_err().code(), ErrorCode::Timeout);
    let sent = fake.requests();
    let body = &sent
        .iter()
        .rev()
        .find(|r| r.body.contains("sleep 31"))
        .expect("the late call was sent")
        .body;
    let secs: f64 = body
        .split("timeout -k 2 ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        secs < 4.0,
        "the command was given {secs}s though its caller had waited 3 s for its turn"
    );
    // The queue is bounded: a process that waits past it is refused, naming why.
    let short = provider(ArchilOptions {
        queue: Duration::from_millis(500),
        ..o.clone()
    });
    let impatient = short.attach(b.id(), &ctx()).await.unwrap().unwrap();
    let hold = sh(&*b, "sleep 4", ctx());
    let refused = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        sh(&*impatient, "true", &ctx()).await
    };
    let (held, refused) = tokio::join!(hold, refused);
    held.unwrap();
    let e = refused.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Refused, "{e}");
    // An upload takes no checkout: it waits while another process's command holds the
    // directory, and lands after it.
    let hold = sh(&*b, "sleep 3; echo held > mark", ctx());
    let upload = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        other.upload("mark", b"uploaded\n", &ctx()).await
    };
    let (held, uploaded) = tokio::join!(hold, upload);
    held.unwrap();
    uploaded.unwrap();
    assert_eq!(b.download("mark", 100, &ctx()).await.unwrap(), b"uploaded\n");
    b.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_gives_up_is_answered_at_once_and_the_next_call_waits() {
    let limit = Duration::from_secs(30);
    let Some((fake, disk)) = fake("a_caller_that_gives_up", limit).await else {
        return;
    };
    let p = provider(options(&fake, &disk, limit));
    let b = p.create(&spec(), &ctx()).await.unwrap();
    let execs = || {
        fake.requests()
            .iter()
            .filter(|r| r.path.starts_with("/api/exec"))
            .count()
    };
    let before = execs();
    // The caller gives up (an abort, half a second in); the command cannot be stopped and runs
    // on. (A caller's deadline would have been the command's own: it would have ended with it.)
    let gives_up = |after: u64| {
        let c = Ctx::background();
        let cancel = c.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(after)).await;
            cancel.cancel();
        });
        c
    };
    let started = std::time::Instant::now();
    let e = sh(&*b, "sleep 2; echo done > f", gives_up(500)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Aborted, "{e}");
    assert!(e.message().contains("runs on"), "{e}");
    assert!(!e.is_not_made(), "a call sent and given up on was made: {e}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the caller was kept {:?}",
        started.elapsed()
    );
    // A call asked while it runs, whose caller gives up before its turn, is never sent.
    let e = sh(&*b, "echo never > g", gives_up(300)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Aborted, "{e}");
    assert!(
        e.is_not_made(),
        "a call never sent is marked so (receipts do not count it): {e}"
    );
    // The next call waits for the first command, and sees what it wrote.
    assert_eq!(sh(&*b, "cat f; ls", &ctx()).await.unwrap().stdout_text(), "done\nf\n");
    assert_eq!(
        execs() - before,
        2,
        "the call whose caller gave up before its turn was sent"
    );
    b.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_ends_the_box_for_every_client_and_a_list_sweeps_what_is_left() {
    let limit = Duration::from_secs(30);
    let Some((fake, disk)) = fake("destroy_ends_the_box_for_every_client", limit).await else {
        return;
    };
    let o = options(&fake, &disk, limit);
    let p = provider(ArchilOptions {
        destroy_wait: Duration::from_millis(300),
        ..o.clone()
    });
    let dir = fake.disk_dir(&disk);
    let b = p.create(&spec(), &ctx()).await.unwrap();
    let other = provider(o.clone()).attach(b.id(), &ctx()).await.unwrap().unwrap();
    let boxdir = dir.join("boxes").join(b.id().name());
    assert!(boxdir.is_dir());
    // A command of another process holds the directory while the box is destroyed: the record
    // goes at once (the box ended for every client), the directory stays for the sweep.
    let running = tokio::spawn({
        let other = other.clone();
        async move { sh(&*other, "sleep 2; echo x > late", &ctx()).await }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    b.destroy(&ctx()).await.unwrap();
    assert!(
        !dir.join("boxes.records")
            .join(format!("{}.json", b.id().name()))
            .exists()
    );
    assert_eq!(other.status(&ctx()).await.unwrap(), Status::Ended);
    assert_eq!(
        other.upload("x", b"x", &ctx()).await.unwrap_err().code(),
        ErrorCode::Gone
    );
    let _ = running.await;
    assert!(boxdir.is_dir(), "the held directory was removed while its command ran");
    // A directory with no record (this one, and one a killed maker left) is swept by a list.
    let orphan = dir.join("boxes").join("0123456789abcdef");
    std::fs::create_dir_all(&orphan).unwrap();
    assert!(p.list(&Labels::new(), &ctx()).await.unwrap().is_empty());
    assert!(
        !boxdir.exists() && !orphan.exists(),
        "a list left a directory with no record"
    );
    // What is not a box's directory by its name is never taken for one: a name a command made
    // to be read by a shell, or a user's own directory.
    for other in ["*", "not-a-box", "0123456789ABCDEF"] {
        std::fs::create_dir_all(dir.join("boxes").join(other).join("keep")).unwrap();
    }
    assert!(p.list(&Labels::new(), &ctx()).await.unwrap().is_empty());
    for other in ["*", "not-a-box", "0123456789ABCDEF"] {
        assert!(
            dir.join("boxes").join(other).join("keep").is_dir(),
            "a list swept {other:?}"
        );
    }
    // Destroying again is no error; attach finds nothing.
    b.destroy(&ctx()).await.unwrap();
    assert!(p.attach(b.id(), &ctx()).await.unwrap().is_none());
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lifetime_is_checked_by_every_call_that_looks_at_the_box() {
    let limit = Duration::from_secs(30);
    let Some((fake, disk)) = fake("a_lifetime_is_checked_by_every_call", limit).await else {
        return;
    };
    let p = provider(options(&fake, &disk, limit));
    let dir = fake.disk_dir(&disk);
    let mut labels = Labels::new();
    labels.insert("case".into(), "lifetime".into());
    // Each way of looking at a box finds it ended past its lifetime and removes it.
    for look in ["status", "exec", "upload", "download", "attach", "list"] {
        let s = Spec {
            labels: labels.clone(),
            ..Spec::new(Duration::from_secs(4))
        };
        let b = p.create(&s, &ctx()).await.unwrap();
        b.upload("f", b"x", &ctx()).await.unwrap();
        let boxdir = dir.join("boxes").join(b.id().name());
        assert!(boxdir.join("f").is_file());
        tokio::time::sleep(Duration::from_millis(4200)).await;
        // Nothing ended it meanwhile: Archil has no timer.
        assert!(boxdir.is_dir(), "{look}: the directory went with no call");
        match look {
            "status" => assert_eq!(b.status(&ctx()).await.unwrap(), Status::Ended),
            "exec" => assert_eq!(sh(&*b, "true", &ctx()).await.unwrap_err().code(), ErrorCode::Gone),
            "upload" => assert_eq!(b.upload("g", b"", &ctx()).await.unwrap_err().code(), ErrorCode::Gone),
            "download" => assert_eq!(b.download("f", 10, &ctx()).await.unwrap_err().code(), ErrorCode::Gone),
            "attach" => assert!(p.attach(b.id(), &ctx()).await.unwrap().is_none()),
            _ => assert!(p.list(&labels, &ctx()).await.unwrap().is_empty()),
        }
        assert!(!boxdir.exists(), "{look}: the ended box's directory is still there");
        assert!(
            !dir.join("boxes.records")
                .join(format!("{}.json", b.id().name()))
                .exists(),
            "{look}"
        );
    }
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_in_archils_words_and_the_key_stays_on_this_host() {
    let limit = Duration::from_secs(30);
    let Some((fake, disk)) = fake("errors_are_in_archils_words", limit).await else {
        return;
    };
    let o = options(&fake, &disk, limit);
    let wrong = provider(ArchilOptions {
        api_key: Some(ApiKey::new("not-the-key")),
        ..o.clone()
    });
    let e = wrong.create(&spec(), &ctx()).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::PermissionDenied, "{e}");
    assert!(!e.message().contains("not-the-key"), "{e}");
    let missing = provider(ArchilOptions {
        disk: Some("no-such-disk".into()),
        ..o.clone()
    });
    assert_eq!(
        missing.create(&spec(), &ctx()).await.err().unwrap().code(),
        ErrorCode::NotFound
    );
    // A disk named by name is found.
    let by_name = provider(ArchilOptions {
        disk: Some("agent-work".into()),
        ..o.clone()
    });
    let b = by_name.create(&spec(), &ctx()).await.unwrap();
    fake.fail_next("POST", "/api/exec", 500, "internal", "the exec fleet is on fire", 1);
    let e = sh(&*b, "true", &ctx()).await.unwrap_err();
    assert!(e.message().contains("the exec fleet is on fire"), "{e}");
    assert_eq!(sh(&*b, "echo again", &ctx()).await.unwrap().stdout, b"again\n");
    // The key is in no request body, no command, no file of the disk.
    assert!(
        fake.requests().iter().all(|r| !r.body.contains(KEY)),
        "a request carried the key"
    );
    let out = sh(
        &*b,
        "grep -r archil-fake-key /mnt/archil /proc/self/environ 2>/dev/null | wc -l",
        &ctx(),
    )
    .await
    .unwrap();
    assert_eq!(out.stdout_text().trim(), "0");
    let on_disk = std::process::Command::new("grep")
        .args(["-r", "-l", KEY])
        .arg(fake.disk_dir(&disk))
        .output()
        .unwrap();
    assert!(
        on_disk.stdout.is_empty(),
        "the key is on the disk: {}",
        String::from_utf8_lossy(&on_disk.stdout)
    );
    b.destroy(&ctx()).await.unwrap();
    fake.shutdown().await;
}

mod view {
    //! Archil seen from outside the provider, shared by the fake's and the live suites.

    use agentbox_core::SandboxId;
    use agentbox_testing::conformance::Outside;
    use async_trait::async_trait;

    /// A box's record read through Archil's object API directly, not through the provider. A box
    /// has ended when its record is gone or its end has passed: Archil runs nothing between calls,
    /// so an ended box holds no machine, only its directory, which the next call that looks at
    /// the box removes (attach and list, which the lifetime case then calls). No program of an
    /// archil box outlives its call, so none is ever alive here.
    pub(crate) struct View {
        http: reqwest::Client,
        s3: String,
        disk: String,
        key: String,
    }

    impl View {
        pub(crate) fn new(s3: &str, disk: &str, key: &str) -> Self {
            // The provider brings its own TLS; a client of the test's needs a process default.
            let _ = rustls::crypto::ring::default_provider().install_default();
            View {
                http: reqwest::Client::builder().no_proxy().build().unwrap(),
                s3: s3.trim_end_matches('/').to_string(),
                disk: disk.to_string(),
                key: key.to_string(),
            }
        }

        /// The box's record as the disk holds it; `None` where there is none.
        pub(crate) async fn record(&self, id: &SandboxId) -> Option<serde_json::Value> {
            let r = self
                .http
                .get(format!("{}/{}/boxes.records/{}.json", self.s3, self.disk, id.name()))
                .header("Authorization", format!("key-{}", self.key))
                .send()
                .await
                .unwrap();
            if r.status() == 404 {
                return None;
            }
            assert!(r.status().is_success(), "reading a record: {}", r.status());
            Some(serde_json::from_slice(&r.bytes().await.unwrap()).unwrap())
        }
    }

    #[async_trait]
    impl Outside for View {
        async fn ended(&self, id: &SandboxId) -> bool {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64;
            match self.record(id).await {
                None => true,
                Some(r) => r["ends_at_ms"].as_u64().is_none_or(|end| end <= now),
            }
        }

        async fn any_alive(&self, _id: &SandboxId, _pids: &[u32]) -> bool {
            false
        }
    }
}

mod judged {
    //! The judge: Archil's own Python SDK (`archil` 0.18.0) and its generated client
    //! (`archil-openapi` 0.0.61), which nobody here wrote, against the fake Archil. Where they and
    //! the fake disagree, the fake is wrong. The SDK makes its disks, execs (one disk and several,
    //! a subdirectory, read-only), objects (every byte value, HEAD, append, listings, deletes),
    //! meets a delegation checkout, the exec limit's 504, scripted faults (its S3 retries), a
    //! wrong key and missing objects, each raised as its ArchilApiError / ArchilS3Error; the
    //! generated client parses every control-plane answer into its models with no field they do
    //! not name (`tests/archil_judge.py`). `scripts/judge-clients archil` installs them; `scripts/test`
    //! exports the venv's python as `AGENTBOX_TEST_ARCHIL_PYTHON`.

    use std::path::Path;
    use std::time::Duration;

    use agentbox_fakes::archil::{FakeArchil, FakeArchilOptions};
    use agentbox_testing::judge;

    /// The judge's whole run, bounded.
    const JUDGE_TIMEOUT: Duration = Duration::from_secs(300);
    /// The fake's exec limit for the judge (its 504 step waits it out once).
    const EXEC_LIMIT: Duration = Duration::from_secs(5);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_python_sdk_judges_the_fake() {
        let test = "the_python_sdk_judges_the_fake";
        let Some(py) = judge::python("archil", test) else {
            return;
        };
        agentbox_testing::runner::ensure();
        let key = "judge-key-0123456789";
        let fake = FakeArchil::start(FakeArchilOptions {
            api_key: key.into(),
            exec_limit: EXEC_LIMIT,
            ..Default::default()
        })
        .await
        .expect("the fake starts");
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests")
            .join("archil_judge.py");
        let mut command = tokio::process::Command::new(&py);
        command
            .arg(&script)
            .env("ARCHIL_BASE_URL", fake.base_url())
            .env("ARCHIL_S3_BASE_URL", fake.s3_base_url())
            .env("ARCHIL_API_KEY", key)
            .env("JUDGE_EXEC_LIMIT_S", EXEC_LIMIT.as_secs().to_string())
            .env("NO_PROXY", "127.0.0.1")
            .env_remove("ARCHIL_REGION")
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .env_remove("ALL_PROXY");
        let judged = judge::run(command, JUDGE_TIMEOUT, |line| {
            if let Some(disk) = line.strip_prefix("WAIT faults ") {
                // Two 503s the SDK's S3 transport retries past, and one control-plane 500.
                fake.fail_next(
                    "GET",
                    &format!("/s3/{disk}/who"),
                    503,
                    "SlowDown",
                    "scripted slow down",
                    2,
                );
                fake.fail_next(
                    "GET",
                    &format!("/api/disks/{disk}"),
                    500,
                    "scripted_fault",
                    "scripted",
                    1,
                );
            }
        })
        .await;
        judged.assert_steps(&[
            "create",
            "list",
            "get",
            "exec",
            "exec-mounts",
            "put-get",
            "head",
            "append",
            "list-objects",
            "delete-objects",
            "checkout",
            "exec-timeout",
            "faults",
            "bad-key",
            "delete",
            "p-disks",
            "p-exec",
            "p-errors",
            "p-delete",
        ]);
        let log = fake.requests();
        // The SDK's requests as sent: its key in the header alone, its keys percent-encoded.
        assert!(
            log.iter()
                .any(|r| r.method == "PUT" && r.path.ends_with("/odd%20name/%C3%A9%3F%23%25.txt") && r.body == "text"),
            "the SDK's PUT of an odd key: {:?}",
            log.iter().filter(|r| r.method == "PUT").collect::<Vec<_>>()
        );
        assert!(
            log.iter()
                .any(|r| r.method == "GET" && r.path.contains("list-type=2") && r.path.contains("delimiter=%2F")),
            "the SDK's listing"
        );
        assert!(
            !log.iter().any(|r| r.path.contains(key) || r.body.contains(key)),
            "the key was recorded"
        );
        fake.shutdown().await;
    }
}

mod live {
    //! Archil exec boxes against the real Archil: the conformance suite, only where
    //! `ARCHIL_API_KEY` is set (with `ARCHIL_REGION`, else `aws-us-east-1`, or `ARCHIL_BASE_URL`;
    //! see docs/archil.md). Without a key it says loudly that it did not run; CI has no key and runs
    //! the fake's suite (`tests/archil.rs`). It makes a disk of its own, runs the suite on it,
    //! deletes it and checks that none is left. Each exec is a paid call.

    use std::sync::Arc;
    use std::time::Duration;

    use agentbox_core::Provider;
    use agentbox_providers::archil::{ArchilOptions, ArchilProvider};
    use agentbox_testing::conformance::{self, Options};
    use serde_json::Value;

    use super::view::View;

    /// The control plane, spoken directly for what the provider never does: make and delete disks.
    struct Control {
        http: reqwest::Client,
        base: String,
        key: String,
    }

    impl Control {
        async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
            let mut r = self
                .http
                .request(method, format!("{}{path}", self.base))
                .header("Authorization", format!("key-{}", self.key.trim_start_matches("key-")))
                .timeout(Duration::from_secs(60));
            if let Some(b) = body {
                r = r.json(&b);
            }
            let r = r.send().await.expect("Archil answers");
            let status = r.status();
            let v: Value = r.json().await.unwrap_or(Value::Null);
            assert!(status.is_success() && v["success"] == true, "{path}: {status} {v}");
            v
        }
    }

    /// Deletes the suite's disk when dropped, so a panic anywhere after it was made (a case, an
    /// assertion, a factory) leaves no paid disk behind.
    struct DiskGuard {
        base: String,
        key: String,
        disk: String,
    }

    impl Drop for DiskGuard {
        fn drop(&mut self) {
            let (base, key, disk) = (self.base.clone(), self.key.clone(), self.disk.clone());
            // A thread of its own with its own runtime: drop may run inside the test's runtime.
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let answer = rt.block_on(async {
                    reqwest::Client::builder()
                        .no_proxy()
                        .build()
                        .unwrap()
                        .delete(format!("{base}/api/disks/{disk}"))
                        .header("Authorization", format!("key-{}", key.trim_start_matches("key-")))
                        .timeout(Duration::from_secs(60))
                        .send()
                        .await
                        .map(|r| r.status().to_string())
                        .unwrap_or_else(|e| e.to_string())
                });
                eprintln!("archil live suite: deleting disk {disk}: {answer}");
            })
            .join();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn archil_boxes_on_the_real_archil_pass_the_conformance_suite() {
        let Ok(key) = std::env::var("ARCHIL_API_KEY") else {
            eprintln!(
                "\n!!!! archil_boxes_on_the_real_archil_pass_the_conformance_suite: ARCHIL_API_KEY unset: this test did \
             NOT run (it needs an Archil account; see docs/archil.md) !!!!\n"
            );
            return;
        };
        let mut opts = ArchilOptions::from_vars(|k| match k {
            "ARCHIL_REGION" => std::env::var(k).ok().or_else(|| Some("aws-us-east-1".into())),
            _ => std::env::var(k).ok().filter(|v| !v.is_empty()),
        })
        .expect("the Archil variables read");
        let _ = rustls::crypto::ring::default_provider().install_default();
        let control = Control {
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            base: opts.base_url.trim_end_matches('/').to_string(),
            key: key.clone(),
        };
        let name = format!("agentbox-live-{}", std::process::id());
        let made = control
            .call(
                reqwest::Method::POST,
                "/api/disks",
                Some(serde_json::json!({ "name": name })),
            )
            .await;
        let disk = made["data"]["diskId"].as_str().expect("a disk id").to_string();
        let guard = DiskGuard {
            base: control.base.clone(),
            key: key.clone(),
            disk: disk.clone(),
        };
        // A new disk takes a while to be available.
        let t = std::time::Instant::now();
        loop {
            let d = control
                .call(reqwest::Method::GET, &format!("/api/disks/{disk}"), None)
                .await;
            if d["data"]["status"] == "available" {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(300),
                "disk {disk} not available after 300 s: {d}"
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        opts.disk = Some(disk.clone());
        let view = View::new(&opts.s3_base_url, &disk, &key);
        let mut options = Options::new(
            "archil-live",
            Duration::from_secs(20),
            Duration::from_secs(60),
            Arc::new(view),
        );
        options.without_live_processes =
            Some("each command is one Archil exec call; no program runs between calls, and it takes no input".into());
        options.without_env = Some("Archil's exec carries only the command".into());
        let make = opts.clone();
        let report = conformance::run(
            conformance::factory(move || {
                let o = make.clone();
                async move { Arc::new(ArchilProvider::new(o).unwrap()) as Arc<dyn Provider> }
            }),
            options,
        )
        .await;
        // Whatever the report, delete the disk and check that it is gone.
        drop(guard);
        let listed = control
            .call(reqwest::Method::GET, &format!("/api/disks?name={name}"), None)
            .await;
        let left: Vec<&Value> = listed["data"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|d| d["id"] == disk.as_str() && d["status"] != "deleting" && d["status"] != "deleted")
                    .collect()
            })
            .unwrap_or_default();
        assert!(left.is_empty(), "the suite's disk is left: {left:?}");
        report.assert_all_passed();
    }
}

//! Runs: claim, refusal naming the holder, generations, seal, fence, crash safety (a writer
//! SIGKILLed mid-commit), fork, park, reading from outside, hand-off; and PostgreSQL leases
//! across two processes.

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::ErrorCode;
use agentbox_runs::lease::Leases;
use agentbox_runs::{Journal, RunStatus, Runs, Store, read_status};
use agentbox_testing::reexec;
use serde_json::json;

#[tokio::test]
async fn one_holder_at_a_time_and_each_open_is_the_next_generation() {
    let root = tempfile::tempdir().unwrap();
    let runs = Runs::new(root.path());
    let made = runs.create(Some("r1")).unwrap();
    assert_eq!((made.status, made.generation), (RunStatus::New, 0));
    assert_eq!(runs.create(Some("r1")).unwrap_err().code(), ErrorCode::Refused);
    assert_eq!(runs.create(Some("../x")).unwrap_err().code(), ErrorCode::Invalid);

    let first = runs.open("r1").await.unwrap();
    assert_eq!(first.generation(), 1);
    first.store().append("user", &json!({"text": "hello"})).unwrap();
    // A second claim is refused, naming the holder.
    let e = runs.open("r1").await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::Refused);
    assert!(e.message().contains(&format!("pid {}", std::process::id())), "{e}");
    // Read from outside, with no claim.
    let outside = read_status(&runs.dir("r1")).unwrap();
    assert_eq!((outside.status, outside.generation), (RunStatus::Open, 1));
    assert!(outside.holder.is_some());

    let sealed = first.release().await.unwrap();
    assert_eq!(sealed.status, RunStatus::Sealed);
    let second = runs.open("r1").await.unwrap();
    assert_eq!(second.generation(), 2);
    let kept = second.store().messages().unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].generation, 1);
    second.release().await.unwrap();
    assert_eq!(runs.open("nothing").await.err().unwrap().code(), ErrorCode::NotFound);
    let listed: Vec<String> = runs.list().unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(listed, ["r1"]);
}

#[tokio::test]
async fn a_holder_whose_claim_was_taken_cannot_write() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("store.db");
    let old = Store::take(&path, 1, Journal::Wal).unwrap();
    old.append("user", &json!("before")).unwrap();
    // Another host opened the run (its lease expired here): generation 2 takes the fence.
    let new = Store::take(&path, 2, Journal::Wal).unwrap();
    let e = old.append("user", &json!("lost?")).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Fenced, "{e}");
    assert_eq!(old.put_task("t", &json!(1)).unwrap_err().code(), ErrorCode::Fenced);
    new.append("assistant", &json!("after")).unwrap();
    let texts: Vec<_> = new.messages().unwrap().into_iter().map(|m| m.content).collect();
    assert_eq!(
        texts,
        [json!("before"), json!("after")],
        "the fenced write left nothing"
    );
    // A generation not past the store's is refused.
    assert_eq!(
        Store::take(&path, 2, Journal::Wal).err().unwrap().code(),
        ErrorCode::Fenced
    );
}

/// The writer's part, in a child the crash test SIGKILLs: hold the run and append messages,
/// saying each one acknowledged, until killed.
async fn writer(root: &std::path::Path) {
    let runs = Runs::new(root);
    let run = runs.open("crash").await.unwrap();
    let mut out = std::io::stdout();
    for i in 0.. {
        let seq = run
            .store()
            .append("user", &json!({"n": i, "pad": "x".repeat(2000)}))
            .unwrap();
        writeln!(out, "acked {seq}").unwrap();
        out.flush().unwrap();
    }
}

#[tokio::test]
async fn an_acknowledged_commit_survives_a_writer_killed_mid_commit() {
    const TEST: &str = "an_acknowledged_commit_survives_a_writer_killed_mid_commit";
    if reexec::part().as_deref() == Some("writer") {
        let root = std::env::var_os("AGENTBOX_TEST_WRITER_ROOT").expect("the parent names the root");
        writer(std::path::Path::new(&root)).await;
        reexec::done();
    }
    let root = tempfile::tempdir().unwrap();
    let runs = Runs::new(root.path());
    runs.create(Some("crash")).unwrap();
    for round in 0..3 {
        let mut child = reexec::child(TEST, "writer")
            .env("AGENTBOX_TEST_WRITER_ROOT", root.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut acked = 0i64;
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        while let Some(Ok(l)) = lines.next() {
            if let Some(n) = l.strip_prefix("acked ") {
                acked = n.parse().unwrap();
                if acked >= 150 * (round + 1) {
                    break;
                }
            }
        }
        // Killed while it commits the next one.
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(acked > 0, "the writer acknowledged nothing");
        let run = runs.open("crash").await.unwrap();
        let kept = run.store().messages().unwrap();
        let last = kept.last().map(|m| m.seq).unwrap_or(0);
        assert!(last >= acked, "round {round}: {acked} acknowledged, {last} kept");
        // Every kept seq is there once, in order: the store opened at a commit.
        assert!(kept.windows(2).all(|w| w[1].seq == w[0].seq + 1));
        run.release().await.unwrap();
    }
}

#[tokio::test]
async fn fork_copies_a_sealed_run_into_runs_that_go_on_alone() {
    let root = tempfile::tempdir().unwrap();
    let runs = Runs::new(root.path());
    runs.create(Some("p")).unwrap();
    let run = runs.open("p").await.unwrap();
    run.store().append("user", &json!("shared past")).unwrap();
    std::fs::write(run.workspace().join("notes.txt"), "parent's").unwrap();
    // Only a sealed run forks.
    assert_eq!(runs.fork("p", 2).unwrap_err().code(), ErrorCode::Refused);
    run.release().await.unwrap();
    let kids = runs.fork("p", 2).unwrap();
    assert_eq!(kids, ["p.fork-1", "p.fork-2"]);
    for (i, kid) in kids.iter().enumerate() {
        let rec = read_status(&runs.dir(kid)).unwrap();
        assert_eq!((rec.parent.as_deref(), rec.status), (Some("p"), RunStatus::Sealed));
        let k = runs.open(kid).await.unwrap();
        assert_eq!(k.store().messages().unwrap().len(), 1);
        assert_eq!(
            std::fs::read_to_string(k.workspace().join("notes.txt")).unwrap(),
            "parent's"
        );
        k.store().append("user", &json!(format!("child {i}"))).unwrap();
        k.release().await.unwrap();
    }
    let parent = runs.open("p").await.unwrap();
    assert_eq!(
        parent.store().messages().unwrap().len(),
        1,
        "the children went on alone"
    );
    parent.release().await.unwrap();
    assert_eq!(runs.fork("p", 0).unwrap_err().code(), ErrorCode::Invalid);
}

#[tokio::test]
async fn a_parked_run_is_due_at_its_deadline() {
    let root = tempfile::tempdir().unwrap();
    let runs = Runs::new(root.path());
    runs.create(Some("w")).unwrap();
    let run = runs.open("w").await.unwrap();
    let parked = run.park(1_000).await.unwrap();
    assert_eq!((parked.status, parked.deadline_ms), (RunStatus::Parked, Some(1_000)));
    assert!(runs.due(999).unwrap().is_empty());
    assert_eq!(runs.due(1_000).unwrap().len(), 1);
    let again = runs.open("w").await.unwrap();
    assert_eq!(again.record().deadline_ms, None);
    again.release().await.unwrap();
}

#[tokio::test]
async fn a_hand_off_tells_the_agent_it_moved() {
    let root = tempfile::tempdir().unwrap();
    let a = Runs::new(root.path()).as_host("host-a");
    let b = Runs::new(root.path()).as_host("host-b");
    a.create(Some("h")).unwrap();
    let run = a.open("h").await.unwrap();
    assert_eq!(agentbox_runs::agent::note_move(&run, "host-a").unwrap(), None);
    run.release().await.unwrap();
    let run = b.open("h").await.unwrap();
    let note = agentbox_runs::agent::note_move(&run, "host-b").unwrap().unwrap();
    assert!(
        note.contains("host-a") && note.contains("host-b") && note.contains("generation 2"),
        "{note}"
    );
    assert_eq!(run.store().messages().unwrap().last().unwrap().role, "system");
    run.release().await.unwrap();
}

/// The second host's part, in a child of the lease test: claim the run through PostgreSQL,
/// say so, then write when told.
async fn lease_holder(root: &std::path::Path, conn: &str) {
    let leases = Arc::new(Leases::connect(conn).await.unwrap());
    let runs = Runs::with_leases(root, leases, Duration::from_secs(2)).as_host("host-child");
    let run = runs.open("leased").await.unwrap();
    println!("claimed {}", run.generation());
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    match run.store().append("user", &json!("from the child")) {
        Ok(_) => println!("wrote"),
        Err(e) if e.code() == ErrorCode::Fenced => println!("fenced"),
        Err(e) => println!("error {e}"),
    }
    match run.renew().await {
        Err(e) if e.code() == ErrorCode::Fenced => println!("renew fenced"),
        other => println!("renew {other:?}"),
    }
}

#[tokio::test]
async fn postgres_leases_across_two_processes_fence_the_one_that_lost() {
    const TEST: &str = "postgres_leases_across_two_processes_fence_the_one_that_lost";
    if reexec::part().as_deref() == Some("lease-holder") {
        let root = std::env::var_os("AGENTBOX_TEST_LEASE_ROOT").expect("the parent names the root");
        let conn = std::env::var("AGENTBOX_TEST_LEASE_CONN").expect("the parent names the server");
        lease_holder(std::path::Path::new(&root), &conn).await;
        reexec::done();
    }
    let Some(conn) = agentbox_testing::services::postgres(TEST) else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let leases = Arc::new(Leases::connect(&conn).await.unwrap());
    let runs = Runs::with_leases(root.path(), leases.clone(), Duration::from_secs(30)).as_host("host-parent");
    let _ = runs.create(Some("leased")).unwrap();
    let mut child = reexec::child(TEST, "lease-holder")
        .env("AGENTBOX_TEST_LEASE_ROOT", root.path())
        .env("AGENTBOX_TEST_LEASE_CONN", &conn)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let claimed = loop {
        let l = lines.next().unwrap().unwrap();
        // The harness's "test ... " line has no newline: the word may follow it.
        if let Some(at) = l.find("claimed ") {
            break l[at + 8..].trim().parse::<u64>().unwrap();
        }
    };
    // Held by the child: refused, naming it.
    let e = runs.open("leased").await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::Refused);
    assert!(e.message().contains("host-child"), "{e}");
    // Its 2 s lease runs out; the parent's claim is the next generation.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let run = runs.open("leased").await.unwrap();
    assert_eq!(run.generation(), claimed + 1);
    // The child, which still believes it holds the run, writes: fenced, nothing written.
    child.stdin.take().unwrap().write_all(b"write\n").unwrap();
    let said: Vec<String> = lines.map(|l| l.unwrap()).collect();
    child.wait().unwrap();
    assert!(said.iter().any(|l| l.trim() == "fenced"), "{said:?}");
    assert!(said.iter().any(|l| l.trim() == "renew fenced"), "{said:?}");
    assert!(
        run.store()
            .messages()
            .unwrap()
            .iter()
            .all(|m| m.content != json!("from the child"))
    );
    run.store().append("user", &json!("from the parent")).unwrap();
    run.release().await.unwrap();
}

#[tokio::test]
async fn the_sessions_documents_in_the_store_are_fenced_too() {
    use agentbox_runs::store::RunDocuments;
    use agentbox_transport::Documents;
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("store.db");
    let old = RunDocuments(Arc::new(Store::take(&path, 1, Journal::Wal).unwrap()));
    old.put("s", "transport.boxes/session/a", &json!({"id": "local:1"}))
        .await
        .unwrap();
    let new = RunDocuments(Arc::new(Store::take(&path, 2, Journal::Wal).unwrap()));
    let e = old
        .put("s", "transport.boxes/session/a", &json!({"id": "local:2"}))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::Fenced);
    assert_eq!(
        old.delete("s", "transport.boxes/session/a").await.unwrap_err().code(),
        ErrorCode::Fenced
    );
    assert_eq!(
        new.get("s", "transport.boxes/session/a").await.unwrap(),
        Some(json!({"id": "local:1"}))
    );
    assert_eq!(new.list("s", "transport.boxes/").await.unwrap().len(), 1);
}

/// The files of a run's directory, by name.
fn names(dir: &std::path::Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    n.sort();
    n
}

#[tokio::test]
async fn release_leaves_one_store_file_that_needs_nothing_of_this_host() {
    let root = tempfile::tempdir().unwrap();
    let runs = Runs::new(root.path());
    runs.create(Some("w")).unwrap();
    let run = runs.open("w").await.unwrap();
    run.store().append("user", &json!("kept")).unwrap();
    let dir = runs.dir("w");
    // Held on one machine: WAL, its log and index beside the store.
    assert!(names(&dir).contains(&"store.db-wal".to_string()), "{:?}", names(&dir));
    let store = run.store().clone();
    run.release().await.unwrap();
    // Released: the log checkpointed into the store and gone, the store whole on its own (the
    // generations' timeline beside it).
    assert_eq!(
        names(&dir),
        ["claim.lock", "generations.jsonl", "run.json", "store.db", "workspace"]
    );
    // The released holder's store writes nothing more, even through a handle it kept.
    assert_eq!(
        store.append("user", &json!("late")).unwrap_err().code(),
        ErrorCode::Fenced
    );
    drop(store);
    // Copied alone (as another host reads the disk), the store has every message.
    let copy = tempfile::tempdir().unwrap();
    std::fs::copy(dir.join("store.db"), copy.path().join("store.db")).unwrap();
    let outside = Store::read(&copy.path().join("store.db")).unwrap();
    assert_eq!(outside.messages().unwrap().len(), 1);
    // Reading from outside wrote nothing, not even a journal.
    assert_eq!(names(copy.path()), ["store.db"]);
}

#[tokio::test]
async fn a_run_shared_by_hosts_keeps_a_rollback_journal() {
    let Some(conn) = agentbox_testing::services::postgres("a_run_shared_by_hosts_keeps_a_rollback_journal") else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let leases = Arc::new(Leases::connect(&conn).await.unwrap());
    let runs = Runs::with_leases(root.path(), leases, Duration::from_secs(30));
    let id = format!("shared-{}", std::process::id());
    runs.create(Some(&id)).unwrap();
    let run = runs.open(&id).await.unwrap();
    run.store().append("user", &json!("one")).unwrap();
    // No WAL: a host with no memory shared with this one can take over.
    assert!(
        !names(&runs.dir(&id))
            .iter()
            .any(|n| n.ends_with("-wal") || n.ends_with("-shm"))
    );
    let keeper = run.keep_claim().expect("a lease is kept alive");
    drop(keeper);
    run.release().await.unwrap();
    assert_eq!(
        names(&runs.dir(&id)),
        ["generations.jsonl", "run.json", "store.db", "workspace"]
    );
}

#[tokio::test]
async fn a_move_is_asked_in_the_run_and_done_by_the_next_generation() {
    let root = tempfile::tempdir().unwrap();
    let here = Runs::new(root.path()).as_host("laptop");
    let there = Runs::new(root.path()).as_host("container-1").started_by("docker");
    here.create(Some("m")).unwrap();
    let run = here.open("m").await.unwrap();
    assert_eq!(run.move_asked().unwrap(), None);
    let dir = here.dir("m");
    assert_eq!(
        agentbox_runs::moves::ask(&dir, "not a driver", "laptop")
            .unwrap_err()
            .code(),
        ErrorCode::Invalid
    );
    let asked = agentbox_runs::moves::ask(&dir, "docker", "laptop").unwrap();
    assert_eq!(run.move_asked().unwrap(), Some(asked.clone()));
    run.release().await.unwrap();
    // An open not started by the driver the move named leaves the request alone.
    let plain = here.open("m").await.unwrap();
    assert_eq!(plain.moved(), None);
    assert_eq!(plain.move_asked().unwrap(), Some(asked.clone()));
    plain.release().await.unwrap();
    let run = there.open("m").await.unwrap();
    assert_eq!(run.moved(), Some(&asked));
    // Done: the request is gone, and the agent is told where it runs now.
    assert_eq!(agentbox_runs::moves::asked(&dir).unwrap(), None);
    let note = agentbox_runs::agent::note_move(&run, "container-1").unwrap().unwrap();
    assert!(
        note.contains("from host laptop to host container-1") && note.contains("move to docker"),
        "{note}"
    );
    // A request that is not one is an error naming the file, never "no move"; the next open
    // by a driver removes it rather than fail.
    std::fs::write(dir.join("move.json"), b"{oops").unwrap();
    let e = run.move_asked().unwrap_err();
    assert!(e.message().contains("move.json"), "{e}");
    run.release().await.unwrap();
    let run = there.open("m").await.unwrap();
    assert_eq!((run.moved(), run.move_asked().unwrap()), (None, None));
}

/// A holder that lost its claim changes no file of the run: the program its tool call left
/// writing in the workspace is ended when the next generation claims, before that generation's
/// first step; and a stale holder's release neither writes run.json nor seals over the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holders_programs_end_before_the_next_generation_steps() {
    use agentbox_core::Ctx;
    use agentbox_hands::{Command, ExecOptions, ExecutionEnv};
    let root = tempfile::tempdir().unwrap();
    let runs = Runs::new(root.path());
    runs.create(Some("w")).unwrap();
    let stale = runs.open("w").await.unwrap();
    let env = stale.host_env().unwrap();
    let log = stale.workspace().join("log");
    // A tool call whose program writes on, as a holder that dies leaves it.
    let tool = tokio::spawn(async move {
        env.exec(
            Command::Shell("while :; do echo x >> log; sleep 0.02; done".into()),
            ExecOptions::default(),
            &Ctx::background(),
        )
        .await
    });
    let size = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let t = std::time::Instant::now();
    while size(&log) == 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "the writer never wrote");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Generation 1's file, named for this machine: a line for the writer's group.
    let written = || {
        std::fs::read_dir(runs.dir("w").join("programs"))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("1."))
                    .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default().lines().count())
                    .sum::<usize>()
            })
            .unwrap_or(0)
    };
    assert_eq!(written(), 1, "generation 1 wrote its program down");
    // The holder dies (its claim goes with it); its program does not.
    drop(stale);
    let before = size(&log);
    let t = std::time::Instant::now();
    while size(&log) == before {
        assert!(t.elapsed() < Duration::from_secs(10), "the writer stopped by itself");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let next = runs.open("w").await.unwrap();
    assert_eq!(next.generation(), 2);
    let at_claim = std::fs::read(&log).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        std::fs::read(&log).unwrap(),
        at_claim,
        "nothing the old writer does after the claim reaches the workspace"
    );
    let ended = tool.await.unwrap();
    assert!(
        ended.is_err() || ended.as_ref().is_ok_and(|o| o.exit_code != 0),
        "{ended:?}"
    );
    assert_eq!(written(), 0, "forgotten once ended");
    assert!(
        !runs.dir("w").join("programs").exists(),
        "no directory once none is written down"
    );

    // A holder whose fence was taken (here by a store opened as generation 3, as another
    // host's would be) cannot release: run.json stays what the run's holder wrote.
    let record = read_status(&runs.dir("w")).unwrap();
    let _taken = Store::take(&runs.dir("w").join("store.db"), 3, Journal::Wal).unwrap();
    assert_eq!(next.release().await.unwrap_err().code(), ErrorCode::Fenced);
    assert_eq!(read_status(&runs.dir("w")).unwrap(), record, "run.json untouched");
}

/// The box half of the fence: a holder that dies leaves a program writing in the run's box
/// (a runner box, the process kept past its caller); the next generation, having taken the
/// run over, ends it through the transport before its first step. A run let go at a step
/// boundary keeps its box's programs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holders_box_programs_end_before_the_next_generation_steps() {
    use agentbox_core::{Ctx, Provider};
    use agentbox_hands::{Command, StartOptions};
    use agentbox_transport::{Transport, TransportConfig, TransportHost};
    let root = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    agentbox_testing::runner::ensure();
    let mut opts = agentbox_providers::LocalOptions::at(home.path()).unwrap();
    opts.runner = true;
    let local: Arc<dyn Provider> = Arc::new(agentbox_providers::LocalProvider::new(opts).unwrap());
    let transport_of = |run: &agentbox_runs::Run| {
        let config = TransportConfig::from_toml(
            "hands = \"sandbox\"\n[environments.sandbox]\nprovider = \"local\"\nmax_lifetime = \"10m\"\n",
        )
        .unwrap();
        Transport::new(
            config,
            TransportHost {
                providers: [("local".to_string(), local.clone())].into(),
                documents: run.documents(),
                session: "b".into(),
                labels: Default::default(),
                on_lost: None,
                prepare: None,
            },
        )
        .unwrap()
    };
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let runs = Runs::new(root.path());
    runs.create(Some("b")).unwrap();
    let stale = runs.open("b").await.unwrap();
    assert!(!stale.took_over(), "a new run is taken from nobody");
    let t1 = transport_of(&stale);
    let env = t1.env("chat").unwrap();
    let writer = "while :; do echo x >> log; sleep 0.02; done";
    env.start(Command::Shell(writer.into()), StartOptions::default(), &ctx)
        .await
        .unwrap();
    let ws = env.cwd().to_string();
    let log = std::path::Path::new(&ws).join("log");
    let size = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let grows = async || {
        let before = size(&log);
        let t = std::time::Instant::now();
        while size(&log) == before {
            if t.elapsed() > Duration::from_secs(10) {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    };
    assert!(grows().await, "the writer writes");
    // The holder dies: its claim goes, its box and the program in it stay.
    drop((env, t1, stale));
    assert!(grows().await, "the writer outlives its holder");

    let next = runs.open("b").await.unwrap();
    assert!(next.took_over(), "the last holder never let go");
    let t2 = transport_of(&next);
    assert_eq!(t2.end_left_programs(&ctx).await.unwrap(), 1);
    let at_claim = std::fs::read(&log).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        std::fs::read(&log).unwrap(),
        at_claim,
        "nothing the old writer does after the claim reaches the box"
    );
    // The same box serves the next generation.
    let env = t2.env("chat").unwrap();
    assert_eq!(env.read_binary_file("log", &ctx).await.unwrap(), at_claim);

    // Let go at a step boundary, a program kept past its caller goes on into the next
    // generation, which took the run from nobody.
    env.start(Command::Shell(writer.into()), StartOptions::default(), &ctx)
        .await
        .unwrap();
    // The transport holds the run's documents, which the release seals.
    drop((env, t2));
    next.release().await.unwrap();
    let after = runs.open("b").await.unwrap();
    assert!(!after.took_over());
    assert!(grows().await, "a hand-off keeps the box's programs");
    let t3 = transport_of(&after);
    t3.destroy(&ctx).await.unwrap();
    after.release().await.unwrap();
}

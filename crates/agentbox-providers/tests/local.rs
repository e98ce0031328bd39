//! Local boxes against the conformance suite, and a box whose creator (a child of the test,
//! see `agentbox_testing::reexec`) was SIGKILLed.

use std::io::{BufRead, BufReader};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentbox_core::{Ctx, ExecOptions, FinishOptions, Provider, SandboxId, Spec, finish};
use agentbox_providers::{LocalOptions, LocalProvider};
use agentbox_testing::conformance::{self, Options};
use agentbox_testing::outside::{LocalView, running};
use agentbox_testing::reexec;

fn provider(root: &std::path::Path) -> Arc<dyn Provider> {
    agentbox_testing::runner::ensure();
    Arc::new(LocalProvider::new(LocalOptions::at(root).unwrap()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_boxes_pass_the_conformance_suite() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().to_path_buf();
    let outside = Arc::new(LocalView {
        boxes: path.join("boxes"),
    });
    let options = Options::new("local", Duration::from_secs(3), Duration::from_secs(4), outside);
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

/// The creator's part, in a child the test below SIGKILLs: make a box, scatter programs in
/// it, print the box's id and the pids, then wait to be killed.
async fn creator(root: &std::path::Path) {
    let p = provider(root);
    let ctx = Ctx::background();
    let b = p.create(&Spec::new(Duration::from_secs(3)), &ctx).await.unwrap();
    let script = "sleep 1000 >/dev/null 2>&1 & echo $!; setsid sh -c 'echo $$ > p2; exec sleep 1000' >/dev/null 2>&1 & \
                  ( sh -c 'echo $$ > p3; exec sleep 1000' >/dev/null 2>&1 & ) ; \
                  while [ ! -s p2 ] || [ ! -s p3 ]; do sleep 0.05; done; cat p2 p3";
    let proc = b
        .exec(
            &["sh".into(), "-c".into(), script.into()],
            &ExecOptions::default(),
            &ctx,
        )
        .await
        .unwrap();
    let out = finish(proc, FinishOptions::default()).await.unwrap();
    // A program still running under the exec when the creator dies.
    let _held = b
        .exec(&["sleep".into(), "1000".into()], &ExecOptions::default(), &ctx)
        .await
        .unwrap();
    println!("\nBOX {}", b.id());
    for l in out.stdout_text().lines() {
        println!("PID {l}");
    }
    println!("READY");
    tokio::time::sleep(Duration::from_secs(600)).await;
}

#[test]
fn a_box_whose_creator_was_sigkilled_ends_with_every_program_within_its_lifetime() {
    const TEST: &str = "a_box_whose_creator_was_sigkilled_ends_with_every_program_within_its_lifetime";
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
    let t = Instant::now();
    let mut id = None;
    let mut pids = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(i) = line.strip_prefix("BOX ") {
            id = Some(i.parse::<SandboxId>().unwrap());
        } else if let Some(p) = line.strip_prefix("PID ") {
            pids.push(p.trim().parse::<u32>().unwrap());
        } else if line.contains("READY") {
            break;
        }
    }
    let id = id.expect("the creator made a box");
    assert_eq!(pids.len(), 3, "three programs scattered: {pids:?}");
    assert!(pids.iter().all(|&p| running(p)), "the scattered programs run");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let dir = root.path().join("boxes").join(id.name());
    loop {
        let alive: Vec<_> = pids.iter().filter(|&&p| running(p)).collect();
        if alive.is_empty() && !dir.exists() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(3 + 5),
            "{:?} after create the box dir exists={} and programs {alive:?} run",
            t.elapsed(),
            dir.exists()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Changes of one box at once on a runtime of one thread: each waits for the box's lock
/// without holding the thread, so all of them end. (A blocking lock hangs that runtime for
/// good, so it runs on a thread of its own that the test waits for with a deadline.)
#[test]
fn changes_of_one_box_at_once_never_hang_the_runtime() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().to_path_buf();
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let p = provider(&path);
            let ctx = Ctx::background();
            let b = p.create(&Spec::new(Duration::from_secs(120)), &ctx).await.unwrap();
            let id = b.id().clone();
            let later = now_ms() + 300_000;
            let labels = agentbox_core::Labels::from([("k".to_string(), "v".to_string())]);
            let (slept, a, r, a2) = tokio::join!(
                p.sleep(&id, &ctx),
                p.extend(&id, later, &ctx),
                p.relabel(&id, &labels, &ctx),
                p.extend(&id, later + 1000, &ctx),
            );
            let woken = p.wake(&id, &ctx).await;
            let _ = done.send((
                slept.is_ok(),
                a.is_ok(),
                r.is_ok(),
                a2.is_ok(),
                woken.map(|b| (b.labels().clone(), b.facts().ends_at_ms)),
            ));
            let _ = b.destroy(&ctx).await;
        });
    });
    let (slept, a, r, a2, woken) = ended
        .recv_timeout(Duration::from_secs(60))
        .expect("four changes of one box ended within a minute");
    assert!(slept && a && r && a2, "each change succeeded: {slept} {a} {r} {a2}");
    let (labels, ends) = woken.unwrap();
    assert_eq!(
        labels,
        agentbox_core::Labels::from([("k".to_string(), "v".to_string())])
    );
    assert!(ends >= Some(now_ms() + 200_000), "the deadline moved: {ends:?}");
}

/// A sleep whose caller gave up after the supervisor slept the box leaves the record saying
/// awake: a wake still wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_wakes_a_box_whose_record_missed_its_sleep() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path());
    let ctx = Ctx::background();
    let b = p.create(&Spec::new(Duration::from_secs(120)), &ctx).await.unwrap();
    let id = b.id().clone();
    p.sleep(&id, &ctx).await.unwrap();
    let record = root.path().join("boxes").join(id.name()).join("record.json");
    let mut r: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    r["asleep"] = serde_json::Value::Bool(false);
    std::fs::write(&record, serde_json::to_vec(&r).unwrap()).unwrap();
    let b = p.wake(&id, &ctx).await.unwrap();
    let out = finish(
        b.exec(&["echo".into(), "awake".into()], &ExecOptions::default(), &ctx)
            .await
            .unwrap(),
        FinishOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(out.stdout_text().trim(), "awake");
    b.destroy(&ctx).await.unwrap();
}

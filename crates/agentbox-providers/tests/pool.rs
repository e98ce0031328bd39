//! The warm pool: boxes handed out at once, never twice, indistinguishable from the inner
//! provider's own; refilled, kept alive, retried with backoff; and nothing left behind by a
//! host that was SIGKILLed. Over the fake provider (scripted faults, a provider that cannot
//! extend or relabel) and over real local boxes.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Clock, Ctx, ErrorCode, Labels, Lifecycle, Provider, Sandbox, Spec, Status, finish};
use agentbox_providers::pool::{POOL_LABEL, Pool, PoolOptions};
use agentbox_providers::{LocalOptions, LocalProvider};
use agentbox_testing::fake::{FakeProvider, Match, Op, Outcome};
use agentbox_testing::reexec;

fn ctx() -> Ctx {
    Ctx::background().with_timeout(Duration::from_secs(120))
}

fn opts(size: usize, idle: Duration) -> PoolOptions {
    PoolOptions {
        size,
        idle_lifetime: idle,
        retry_min: Duration::from_millis(200),
        retry_max: Duration::from_secs(2),
        call_timeout: Duration::from_secs(60),
    }
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn local(root: &std::path::Path) -> Arc<dyn Provider> {
    agentbox_testing::runner::ensure();
    Arc::new(LocalProvider::new(LocalOptions::at(root).unwrap()).unwrap())
}

/// A pool of `size` ready boxes (idle lifetime `idle` seconds) over a fake provider that
/// `setup` prepares, of a spec of 60 s, warmed.
async fn warm_fake(setup: impl FnOnce(&FakeProvider), size: usize, idle: u64) -> (FakeProvider, Pool) {
    let fake = FakeProvider::new("fake");
    setup(&fake);
    let pool = Pool::new(
        Arc::new(fake.clone()),
        Spec::new(Duration::from_secs(60)),
        opts(size, Duration::from_secs(idle)),
    )
    .unwrap();
    pool.warm(&ctx()).await.unwrap();
    (fake, pool)
}

/// Wait (at most `within`) until `f` holds.
async fn until(within: Duration, what: &str, mut f: impl AsyncFnMut() -> bool) {
    let end = tokio::time::Instant::now() + within;
    while !f().await {
        assert!(tokio::time::Instant::now() < end, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// 50 creates at once from a pool of 4: 50 boxes, no two the same, each the caller's (each
/// labelled its own where the provider can relabel a box; else with the pool spec's labels,
/// the only ones a ready box can be handed out with).
async fn fifty_distinct(pool: Arc<Pool>) -> Vec<Arc<dyn Sandbox>> {
    let spec = Spec::new(Duration::from_secs(60));
    let relabel = pool.honours().relabel;
    let mut tasks = Vec::new();
    for i in 0..50 {
        let spec = if relabel {
            spec.clone().label("task", i.to_string())
        } else {
            spec.clone()
        };
        let pool = pool.clone();
        tasks.push(tokio::spawn(
            async move { (pool.create(&spec, &ctx()).await, spec.labels) },
        ));
    }
    let mut boxes = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        let (b, asked) = t.await.unwrap();
        let b = b.unwrap();
        assert_eq!(b.labels(), &asked, "box {i}'s labels");
        boxes.push(b);
    }
    let ids: HashSet<String> = boxes.iter().map(|b| b.id().to_string()).collect();
    assert_eq!(ids.len(), 50, "50 creates answered {} distinct boxes", ids.len());
    boxes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_creates_from_a_pool_of_four_are_fifty_boxes() {
    let fake = FakeProvider::new("fake");
    let pool = Arc::new(
        Pool::new(
            Arc::new(fake.clone()),
            Spec::new(Duration::from_secs(60)),
            opts(4, Duration::from_secs(60)),
        )
        .unwrap(),
    );
    pool.warm(&ctx()).await.unwrap();
    let boxes = fifty_distinct(pool.clone()).await;
    // Each hand-out relabelled a box of its own: none went out twice.
    let handed: Vec<String> = fake
        .calls_of(Op::Relabel)
        .into_iter()
        .filter_map(|c| c.box_id)
        .collect();
    let distinct: HashSet<&String> = handed.iter().collect();
    assert!(handed.len() >= 4, "{handed:?}");
    assert_eq!(distinct.len(), handed.len(), "a box handed out twice: {handed:?}");
    for b in &boxes {
        assert!(!fake.ended(b.id()), "{} ended", b.id());
    }
    // The pool fills again after the hand-outs, to its size and no more: every create was a
    // hand-out (whose box the pool made again) or a make of its own, so 54 makes in all.
    pool.warm(&ctx()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(pool.ready(), 4);
    assert_eq!(fake.calls_of(Op::Create).len(), 54);
    pool.close(&ctx()).await.unwrap();
}

/// A create that comes while the pool's first boxes are still being made (an MCP session's
/// first call, made as its pool starts) takes one of them rather than make a box more beside
/// them: a pool of 2 and a first call make 2 boxes, not 3, and the call's box is the pool's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_while_the_pool_fills_takes_a_box_being_made() {
    let fake = FakeProvider::new("fake");
    // The pool's makes are still under way when the creates come.
    fake.on(
        Match::op(Op::Create),
        Outcome::Delay(Duration::from_millis(300)),
        Some(2),
    );
    let pool = Arc::new(
        Pool::new(
            Arc::new(fake.clone()),
            Spec::new(Duration::from_secs(60)),
            opts(2, Duration::from_secs(60)),
        )
        .unwrap(),
    );
    let first = pool
        .create(&Spec::new(Duration::from_secs(60)).label("task", "first"), &ctx())
        .await
        .unwrap();
    assert_eq!(first.labels(), &labels(&[("task", "first")]));
    let creates = fake.calls_of(Op::Create);
    let own: Vec<_> = creates
        .iter()
        .filter(|c| c.spec.as_ref().is_some_and(|s| !s.labels.contains_key(POOL_LABEL)))
        .collect();
    assert!(own.is_empty(), "the first call made a box of its own: {own:?}");
    let pools: Vec<&str> = creates.iter().filter_map(|c| c.box_id.as_deref()).collect();
    assert!(
        pools.contains(&first.id().name()),
        "the first call's box {} is one the pool made: {pools:?}",
        first.id()
    );
    pool.close(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_box_is_the_callers_with_its_lifetime_and_labels() {
    let fake = FakeProvider::new("fake");
    let inner: Arc<dyn Provider> = Arc::new(fake.clone());
    let spec = Spec::new(Duration::from_secs(600)).env("MODE", "x");
    let pool = Pool::new(inner.clone(), spec.clone(), opts(2, Duration::from_secs(30))).unwrap();
    pool.warm(&ctx()).await.unwrap();
    // Ready boxes are nobody's: not listed, not attached, through the pool.
    let ready = inner.list(&Labels::new(), &ctx()).await.unwrap();
    assert_eq!(ready.len(), 2);
    for r in &ready {
        assert_eq!(r.labels().get(POOL_LABEL).map(String::as_str), Some(pool.id()));
        assert!(pool.attach(r.id(), &ctx()).await.unwrap().is_none());
    }
    assert!(pool.list(&Labels::new(), &ctx()).await.unwrap().is_empty());

    let ask = spec.clone().label("task", "7");
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let b = pool.create(&ask, &ctx()).await.unwrap();
    assert!(ready.iter().any(|r| r.id() == b.id()), "the box was not a ready one");
    let plain = inner.create(&ask, &ctx()).await.unwrap();
    assert_eq!(b.labels(), plain.labels());
    let ends = b.facts().ends_at_ms.unwrap();
    assert!(
        ends >= before + 600_000 && ends <= before + 605_000,
        "ends at {ends}, asked {before} + 600 s"
    );
    // Its facts are the inner's (the deadline as asked), as a box the inner made.
    let mut f = b.facts().clone();
    let mut g = plain.facts().clone();
    for x in [&mut f, &mut g] {
        x.started_at_ms = None;
        x.ends_at_ms = None;
    }
    assert_eq!(f, g);
    // Found as the caller's: listed by its labels, attached through the pool and the inner.
    let listed = pool.list(&labels(&[("task", "7")]), &ctx()).await.unwrap();
    let ids: HashSet<String> = listed.iter().map(|b| b.id().to_string()).collect();
    assert_eq!(ids, HashSet::from([b.id().to_string(), plain.id().to_string()]));
    let again = pool
        .attach(b.id(), &ctx())
        .await
        .unwrap()
        .expect("attach a handed-out box");
    assert_eq!(again.labels(), b.labels());
    assert_eq!(again.facts().ends_at_ms, b.facts().ends_at_ms);
    // A spec that differs elsewhere is the inner's create; the pool's label is refused.
    let mut other = spec.clone();
    other.cpus = Some(2.0);
    let o = pool.create(&other, &ctx()).await.unwrap();
    assert!(!ready.iter().any(|r| r.id() == o.id()));
    let e = pool
        .create(&spec.clone().label(POOL_LABEL, "x"), &ctx())
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), ErrorCode::Invalid);
    assert!(e.message().contains(POOL_LABEL), "{e}");

    // Closed: the ready boxes end, handed-out ones do not.
    pool.close(&ctx()).await.unwrap();
    let left: Vec<_> = inner.list(&Labels::new(), &ctx()).await.unwrap();
    assert!(left.iter().all(|l| !l.labels().contains_key(POOL_LABEL)), "{left:?}");
    assert_eq!(b.status(&ctx()).await.unwrap(), Status::Running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_extend_a_ready_box_serves_only_an_ask_its_deadline_meets() {
    let (fake, pool) = warm_fake(|f| f.set_lifecycle(false, true), 1, 20).await;
    let long = pool.create(&Spec::new(Duration::from_secs(600)), &ctx()).await.unwrap();
    assert_eq!(pool.ready(), 1, "a box with 20 s left was handed out for 600 s");
    assert!(long.facts().ends_at_ms.unwrap() > fake.clock().now_ms() + 500_000);
    // A box with 20 s left would outlive an ask of 5 s: made for it instead.
    let five = pool.create(&Spec::new(Duration::from_secs(5)), &ctx()).await.unwrap();
    assert_eq!(pool.ready(), 1, "a box with 20 s left was handed out for 5 s");
    assert!(five.facts().ends_at_ms.unwrap() <= fake.clock().now_ms() + 5_000);
    let short = pool.create(&Spec::new(Duration::from_secs(20)), &ctx()).await.unwrap();
    assert!(
        fake.calls_of(Op::Relabel)
            .iter()
            .any(|c| c.box_id.as_deref() == Some(short.id().name()))
    );
    assert!(fake.calls_of(Op::Extend).is_empty());
    pool.close(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_relabel_a_ready_box_serves_only_the_pool_specs_labels() {
    let fake = FakeProvider::new("fake");
    fake.set_lifecycle(true, false);
    let spec = Spec::new(Duration::from_secs(60)).label("team", "a");
    let pool = Pool::new(Arc::new(fake.clone()), spec.clone(), opts(1, Duration::from_secs(20))).unwrap();
    pool.warm(&ctx()).await.unwrap();
    let r = fake.list(&Labels::new(), &ctx()).await.unwrap();
    assert_eq!(r[0].labels(), &spec.labels, "a label that could not be taken off");
    let other = pool.create(&spec.clone().label("task", "1"), &ctx()).await.unwrap();
    assert_ne!(other.id(), r[0].id());
    let same = pool.create(&spec, &ctx()).await.unwrap();
    assert_eq!(same.id(), r[0].id());
    assert_eq!(same.labels(), &spec.labels);
    pool.close(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_box_that_fails_its_hand_out_is_destroyed_and_the_next_tried() {
    let (fake, pool) = warm_fake(|_| {}, 3, 60).await;
    let ready = fake.list(&Labels::new(), &ctx()).await.unwrap();
    assert_eq!(ready.len(), 3);
    // One ended behind the pool's back, one refuses its extend.
    fake.end_box(ready[0].id()).await;
    fake.on(
        Match {
            op: Some(Op::Extend),
            box_id: Some(ready[1].id().name().to_string()),
            ..Default::default()
        },
        Outcome::Fail(ErrorCode::Unknown, "engine hiccup".into()),
        None,
    );
    // The pool tries its ready boxes in the order their makes finished, not the list's, and
    // each create stops at the first that serves: two creates try all three (refills queue
    // behind them), and neither hands out a bad one.
    let mut handed = Vec::new();
    for _ in 0..2 {
        let b = pool.create(&Spec::new(Duration::from_secs(60)), &ctx()).await.unwrap();
        assert!(b.labels().is_empty());
        handed.push(b.id().clone());
    }
    assert!(
        handed.contains(ready[2].id()),
        "the good ready box is handed out: {handed:?}"
    );
    assert!(
        !handed.contains(ready[0].id()) && !handed.contains(ready[1].id()),
        "{handed:?}"
    );
    until(Duration::from_secs(10), "the failed boxes destroyed", async || {
        fake.ended(ready[0].id()) && fake.ended(ready[1].id())
    })
    .await;
    pool.close(&ctx()).await.unwrap();
}

/// A create dropped part way through its hand-out (a timeout around it): the box it took is
/// ended, not left in no one's hands past the pool's close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_dropped_mid_hand_out_leaves_no_box() {
    let (fake, pool) = warm_fake(|_| {}, 1, 60).await;
    let ready = fake.list(&Labels::new(), &ctx()).await.unwrap();
    assert_eq!(ready.len(), 1);
    fake.on(
        Match {
            op: Some(Op::Relabel),
            ..Default::default()
        },
        Outcome::Hang,
        None,
    );
    let cut = tokio::time::timeout(
        Duration::from_millis(200),
        pool.create(&Spec::new(Duration::from_secs(60)).label("task", "1"), &ctx()),
    )
    .await;
    assert!(cut.is_err(), "the hand-out hangs, so the timeout cuts the create");
    until(
        Duration::from_secs(10),
        "the box taken by the dropped create ended",
        async || fake.ended(ready[0].id()),
    )
    .await;
    pool.close(&ctx()).await.unwrap();
}

/// A ready box is the pool's until it is handed out: no one moves its deadline, sleeps it or
/// forks it through the pool (it would outlive a dead host, or be handed out asleep), and a
/// spec carrying the pool's label is refused wherever a spec is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_box_is_not_the_callers_to_change() {
    let (fake, pool) = warm_fake(|_| {}, 1, 60).await;
    let ready = fake.list(&Labels::new(), &ctx()).await.unwrap();
    let id = ready[0].id().clone();
    let later = fake.clock().now_ms() + 30 * 24 * 3_600_000;
    for (what, e) in [
        ("extend", pool.extend(&id, later, &ctx()).await.map(|_| ()).unwrap_err()),
        ("sleep", pool.sleep(&id, &ctx()).await.unwrap_err()),
        (
            "relabel",
            pool.relabel(&id, &Labels::new(), &ctx()).await.map(|_| ()).unwrap_err(),
        ),
        (
            "fork",
            pool.fork(&id, 1, &Spec::new(Duration::from_secs(60)), &ctx())
                .await
                .map(|_| ())
                .unwrap_err(),
        ),
    ] {
        assert_eq!(e.code(), ErrorCode::NotFound, "{what}: {e}");
    }
    assert!(fake.calls_of(Op::Extend).is_empty(), "no extend reached the ready box");
    let marked = Spec::new(Duration::from_secs(60)).label(agentbox_providers::pool::POOL_LABEL, "x");
    let e = pool.open("named", &marked, &ctx()).await.map(|_| ()).unwrap_err();
    assert_eq!(e.code(), ErrorCode::Invalid, "{e}");
    pool.close(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_makes_are_retried_with_backoff_not_in_a_loop() {
    let fake = FakeProvider::new("fake");
    fake.on(
        Match::op(Op::Create),
        Outcome::Fail(ErrorCode::Unknown, "no capacity".into()),
        None,
    );
    let pool = Pool::new(
        Arc::new(fake.clone()),
        Spec::new(Duration::from_secs(60)),
        opts(4, Duration::from_secs(60)),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    // 4 at once, then after 0.2, 0.4, 0.8, 1.6 s: at most 5 rounds of at most 4.
    let tries = fake.calls_of(Op::Create).len();
    assert!((5..=20).contains(&tries), "{tries} makes in 3 s");
    // A create meanwhile is the inner's (which fails as the inner does).
    let e = pool
        .create(&Spec::new(Duration::from_secs(60)), &ctx())
        .await
        .err()
        .unwrap();
    assert_eq!(e.message(), "no capacity");
    pool.close(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_boxes_are_kept_alive_past_their_idle_lifetime() {
    let (fake, pool) = warm_fake(|_| {}, 2, 2).await;
    let first = fake.list(&Labels::new(), &ctx()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    for b in &first {
        assert!(!fake.ended(b.id()), "{} ended in the pool", b.id());
    }
    assert!(fake.calls_of(Op::Extend).len() >= 4, "{:?}", fake.calls_of(Op::Extend));
    assert_eq!(fake.calls_of(Op::Create).len(), 2);
    pool.close(&ctx()).await.unwrap();
    for b in &first {
        assert!(fake.ended(b.id()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_extend_ready_boxes_are_replaced_before_they_end() {
    let (fake, pool) = warm_fake(|f| f.set_lifecycle(false, true), 1, 2).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        fake.calls_of(Op::Create).len() >= 3,
        "{:?}",
        fake.calls_of(Op::Create).len()
    );
    assert_eq!(pool.ready(), 1);
    let b = pool
        .create(&Spec::new(Duration::from_millis(500)), &ctx())
        .await
        .unwrap();
    assert_eq!(b.status(&ctx()).await.unwrap(), Status::Running);
    pool.close(&ctx()).await.unwrap();
}

#[tokio::test]
async fn a_pool_refuses_what_it_cannot_keep() {
    let inner: Arc<dyn Provider> = Arc::new(FakeProvider::new("fake"));
    let spec = Spec::new(Duration::from_secs(60));
    let e = Pool::new(inner.clone(), spec.clone(), opts(65, Duration::from_secs(60)))
        .err()
        .unwrap();
    assert!(e.message().contains("pool.size"), "{e}");
    let e = Pool::new(inner.clone(), spec.clone(), opts(1, Duration::ZERO))
        .err()
        .unwrap();
    assert!(e.message().contains("pool.idle_lifetime"), "{e}");
    let mut gpu = spec.clone();
    gpu.ports.push(agentbox_core::PortSpec {
        port: 80,
        kind: agentbox_core::PortKind::Tcp,
    });
    let e = Pool::new(inner.clone(), gpu, opts(1, Duration::from_secs(60)))
        .err()
        .unwrap();
    assert_eq!(e.code(), ErrorCode::Unsupported);
    assert!(e.message().contains("spec.ports"), "{e}");
    let e = Pool::new(inner, spec.label(POOL_LABEL, "x"), opts(1, Duration::from_secs(60)))
        .err()
        .unwrap();
    assert!(e.message().contains(POOL_LABEL), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_boxes_from_a_pool_of_four_under_fifty_creates() {
    let root = tempfile::tempdir().unwrap();
    let inner = local(root.path());
    // Long enough to cover the ask where local boxes cannot be extended.
    let pool = Arc::new(
        Pool::new(
            inner.clone(),
            Spec::new(Duration::from_secs(60)),
            opts(4, Duration::from_secs(300)),
        )
        .unwrap(),
    );
    pool.warm(&ctx()).await.unwrap();
    let ready: HashSet<String> = inner
        .list(&Labels::new(), &ctx())
        .await
        .unwrap()
        .iter()
        .map(|b| b.id().to_string())
        .collect();
    let boxes = fifty_distinct(pool.clone()).await;
    let pooled = boxes.iter().filter(|b| ready.contains(b.id().as_str())).count();
    assert!(pooled >= 1, "no box came from the pool");
    for b in &boxes {
        assert_eq!(b.status(&ctx()).await.unwrap(), Status::Running);
    }
    // A pooled box and a made one look alike: labels, facts (times and places aside).
    let p = boxes.iter().find(|b| ready.contains(b.id().as_str())).unwrap();
    let m = boxes.iter().find(|b| !ready.contains(b.id().as_str())).unwrap();
    let strip = |b: &Arc<dyn Sandbox>| {
        let mut f = b.facts().clone();
        f.started_at_ms = None;
        f.ends_at_ms = None;
        f.workspace = None;
        f.runner = None;
        f
    };
    assert_eq!(strip(p), strip(m));
    assert_eq!(p.labels().len(), m.labels().len());
    assert!(!p.labels().contains_key(POOL_LABEL));
    let listed = pool.list(&Labels::new(), &ctx()).await.unwrap();
    assert_eq!(listed.len(), 50, "the pool's list answers the 50 and no ready box");
    pool.close(&ctx()).await.unwrap();
    for b in &boxes {
        b.destroy(&ctx()).await.unwrap();
    }
    assert!(
        inner.list(&Labels::new(), &ctx()).await.unwrap().is_empty(),
        "the close left ready boxes"
    );
}

/// The variable that tells the pool's child host where its boxes live.
const ROOT_ENV: &str = "AGENTBOX_TEST_POOL_ROOT";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_whose_host_was_sigkilled_leaves_none_behind() {
    const TEST: &str = "a_pool_whose_host_was_sigkilled_leaves_none_behind";
    let idle = Duration::from_secs(4);
    if reexec::part().as_deref() == Some("host") {
        let root = std::env::var(ROOT_ENV).unwrap();
        let pool = Pool::new(local(root.as_ref()), Spec::new(Duration::from_secs(60)), opts(3, idle)).unwrap();
        pool.warm(&ctx()).await.unwrap();
        // Past half the idle lifetime, so the boxes have been kept alive once.
        tokio::time::sleep(idle / 2 + Duration::from_millis(500)).await;
        let ids: Vec<String> = local(root.as_ref())
            .list(&Labels::new(), &ctx())
            .await
            .unwrap()
            .iter()
            .map(|b| b.id().to_string())
            .collect();
        println!("warm {}", ids.join(" "));
        tokio::time::sleep(Duration::from_secs(300)).await;
        reexec::done();
    }
    let root = tempfile::tempdir().unwrap();
    let mut child = reexec::child(TEST, "host")
        .env(ROOT_ENV, root.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut r = std::io::BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return line;
            }
            if let Some(at) = line.find("warm ") {
                return line[at..].trim().to_string();
            }
        }
    });
    let line = tokio::time::timeout(Duration::from_secs(120), line)
        .await
        .expect("the child said nothing in 120 s")
        .unwrap();
    let said: Vec<String> = line
        .strip_prefix("warm ")
        .unwrap_or_else(|| panic!("the child said {line:?}"))
        .split_whitespace()
        .map(String::from)
        .collect();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let killed = std::time::Instant::now();
    assert!(said.len() >= 3, "the child's pool held {said:?}");
    // A fresh host: the boxes are there, none of them handed out...
    let fresh = local(root.path());
    let left = fresh.list(&Labels::new(), &ctx()).await.unwrap();
    assert!(left.len() >= 3, "the dead pool's ready boxes: {left:?}");
    if fresh.honours().relabel {
        assert!(left.iter().all(|b| b.labels().contains_key(POOL_LABEL)), "{left:?}");
    }
    // ...and every box the dead host made ends by the idle lifetime, with no call from any host.
    until(
        idle + Duration::from_secs(5),
        "the dead pool's boxes ended",
        async || fresh.list(&Labels::new(), &ctx()).await.unwrap().is_empty(),
    )
    .await;
    assert!(killed.elapsed() <= idle + Duration::from_secs(5));
    for id in said.iter().chain(
        left.iter()
            .map(|b| b.id().as_str().to_string())
            .collect::<Vec<_>>()
            .iter(),
    ) {
        let id: agentbox_core::SandboxId = id.parse().unwrap();
        assert!(
            fresh.attach(&id, &ctx()).await.unwrap().is_none(),
            "{id} is still found"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_local_boxes_passes_the_conformance_suite() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().to_path_buf();
    let outside = Arc::new(agentbox_testing::outside::LocalView {
        boxes: path.join("boxes"),
    });
    let options = agentbox_testing::conformance::Options::new(
        "local+pool",
        Duration::from_secs(3),
        Duration::from_secs(4),
        outside,
    );
    let report = agentbox_testing::conformance::run(
        agentbox_testing::conformance::factory(move || {
            let path = path.clone();
            async move {
                let pool = Pool::new(
                    local(&path),
                    Spec::new(Duration::from_secs(60)),
                    opts(2, Duration::from_secs(20)),
                );
                Arc::new(pool.unwrap()) as Arc<dyn Provider>
            }
        }),
        options,
    )
    .await;
    report.assert_all_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_docker_boxes_are_the_callers_and_the_rest_end_at_close() {
    use agentbox_providers::docker::{DockerOptions, DockerProvider};
    use agentbox_providers::helper::HelperCommand;
    if !agentbox_testing::services::docker_available("pooled_docker_boxes_are_the_callers_and_the_rest_end_at_close") {
        return;
    }
    let opts = DockerOptions {
        runner: Some(HelperCommand::new(agentbox_testing::runner::ensure(), vec![])),
        ..DockerOptions::default()
    };
    let inner: Arc<dyn Provider> = Arc::new(DockerProvider::new(opts).await.expect("the Docker engine answers"));
    let mark = format!("pool-test-{}", std::process::id());
    let spec = Spec::new(Duration::from_secs(120)).label("pool-test", &mark);
    let pool = Pool::new(inner.clone(), spec.clone(), opts_docker()).unwrap();
    pool.warm(&ctx()).await.unwrap();
    let ready = inner.list(&labels(&[(POOL_LABEL, pool.id())]), &ctx()).await.unwrap();
    assert_eq!(ready.len(), 2, "{ready:?}");
    let ask = spec.clone().label("task", "1");
    let b = pool.create(&ask, &ctx()).await.unwrap();
    assert!(ready.iter().any(|r| r.id() == b.id()), "not a ready box");
    let plain = inner.create(&ask, &ctx()).await.unwrap();
    assert_eq!(b.labels(), plain.labels());
    let strip = |b: &Arc<dyn Sandbox>| {
        let mut f = b.facts().clone();
        f.started_at_ms = None;
        f.ends_at_ms = None;
        f.runner = None;
        // Each box's own file of this machine (its deadline) is named after it.
        for m in &mut f.mounts {
            m.source = m.source.replace(b.id().name(), "BOX");
        }
        f
    };
    assert_eq!(strip(&b), strip(&plain));
    let (e1, e2) = (b.facts().ends_at_ms.unwrap(), plain.facts().ends_at_ms.unwrap());
    assert!(e1.abs_diff(e2) < 10_000, "pooled ends at {e1}, made at {e2}");
    // A fresh host finds it as the caller's, and the pool lists it, not its ready boxes.
    let again = inner.attach(b.id(), &ctx()).await.unwrap().expect("found again");
    assert_eq!(again.labels(), b.labels());
    let listed: HashSet<String> = pool
        .list(&labels(&[("pool-test", &mark)]), &ctx())
        .await
        .unwrap()
        .iter()
        .map(|b| b.id().to_string())
        .collect();
    assert_eq!(listed, HashSet::from([b.id().to_string(), plain.id().to_string()]));
    let p = finish(
        b.exec(&["true".into()], &agentbox_core::ExecOptions::default(), &ctx())
            .await
            .unwrap(),
        agentbox_core::FinishOptions::default(),
    )
    .await
    .unwrap();
    assert!(p.status.success());
    pool.close(&ctx()).await.unwrap();
    let left = inner.list(&labels(&[("pool-test", &mark)]), &ctx()).await.unwrap();
    let left: HashSet<String> = left.iter().map(|b| b.id().to_string()).collect();
    assert_eq!(
        left,
        HashSet::from([b.id().to_string(), plain.id().to_string()]),
        "the close left ready boxes"
    );
    b.destroy(&ctx()).await.unwrap();
    plain.destroy(&ctx()).await.unwrap();
}

fn opts_docker() -> PoolOptions {
    PoolOptions {
        size: 2,
        ..opts(2, Duration::from_secs(60))
    }
}

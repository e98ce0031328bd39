//! Docker boxes' lifecycle against a real engine, beyond the conformance suite's cases: a box
//! extended past its first deadline by a host that is then SIGKILLed, a sleeping box woken
//! with its files, a box that cannot move its own deadline, and forks that leave no image.

use std::io::{BufRead, BufReader};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentbox_core::{Ctx, Provider, SandboxId, Spec, Status};
use agentbox_providers::docker::{DockerOptions, DockerProvider};
use agentbox_providers::helper::HelperCommand;
use agentbox_testing::outside::{container_running, docker};
use agentbox_testing::reexec;
use agentbox_testing::services::docker_available;
use agentbox_testing::sh;

fn with_runner() -> DockerOptions {
    DockerOptions {
        runner: Some(HelperCommand::new(agentbox_testing::runner::ensure(), vec![])),
        ..DockerOptions::default()
    }
}

async fn provider() -> Arc<dyn Provider> {
    Arc::new(
        DockerProvider::new(with_runner())
            .await
            .expect("the Docker daemon answers"),
    )
}

fn ctx() -> Ctx {
    Ctx::background().with_timeout(Duration::from_secs(120))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The host's part: make a box of 4 s, move its deadline to 16 s from now, say so, and wait
/// to be killed.
async fn extending_host() {
    let p = provider().await;
    let b = p
        .create(
            &Spec::new(Duration::from_secs(4)).label("lifecycle", "extend-host"),
            &ctx(),
        )
        .await
        .unwrap();
    let b = p.extend(b.id(), now_ms() + 16_000, &ctx()).await.unwrap();
    println!("\nBOX {} {}", b.id(), b.facts().ends_at_ms.unwrap());
    println!("\nREADY");
    tokio::time::sleep(Duration::from_secs(600)).await;
}

#[test]
fn an_extended_box_outlives_its_first_deadline_and_its_host_and_ends_at_the_new_one() {
    const TEST: &str = "an_extended_box_outlives_its_first_deadline_and_its_host_and_ends_at_the_new_one";
    if reexec::part().as_deref() == Some("host") {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(extending_host());
        reexec::done();
    }
    if !docker_available(TEST) {
        return;
    }
    let mut child = reexec::child(TEST, "host")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let mut found = None;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("BOX ") {
            let (id, ends) = rest.split_once(' ').unwrap();
            found = Some((id.parse::<SandboxId>().unwrap(), ends.parse::<u64>().unwrap()));
        } else if line.starts_with("READY") {
            break;
        }
    }
    let (id, ends_at) = found.expect("the host made a box");
    child.kill().unwrap();
    child.wait().unwrap();
    let name = id.name().to_string();
    // Past the first deadline (4 s) and a grace: alive, with no host.
    std::thread::sleep(Duration::from_secs(9).saturating_sub(t.elapsed()));
    assert!(container_running(&name), "the box ended at its first deadline");
    // At the new one it ends, and the engine removes it.
    loop {
        if docker(&["inspect", &name]).is_none() {
            break;
        }
        assert!(
            now_ms() < ends_at + 10_000,
            "the box still exists 10 s past its new deadline"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(now_ms() + 1_500 >= ends_at, "the box ended before its new deadline");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_box_keeps_only_its_init_and_is_woken_with_its_files() {
    if !docker_available("a_sleeping_box_keeps_only_its_init_and_is_woken_with_its_files") {
        return;
    }
    let p = provider().await;
    let b = p.create(&Spec::new(Duration::from_secs(300)), &ctx()).await.unwrap();
    let id = b.id().clone();
    sh(&*b, "echo kept > file; (sleep 1000 &)").await;
    p.sleep(&id, &ctx()).await.unwrap();
    // Only the init is left: every other process (the runner, the sleeper) ended.
    let mut left = String::new();
    for _ in 0..40 {
        left = docker(&["top", id.name(), "-o", "pid,args"]).unwrap_or_default();
        if left.lines().count() == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(
        left.lines().count(),
        2,
        "a sleeping box runs more than its init:\n{left}"
    );
    assert!(left.contains("agentbox-runner init"), "{left}");
    let fresh = provider().await;
    let asleep = fresh.attach(&id, &ctx()).await.unwrap().unwrap();
    assert_eq!(asleep.status(&ctx()).await.unwrap(), Status::Sleeping);
    assert!(asleep.files().is_none(), "a sleeping box serves no files");
    let woken = fresh.wake(&id, &ctx()).await.unwrap();
    assert!(
        woken.facts().runner.is_some(),
        "woken, it goes through its runner again"
    );
    assert_eq!(sh(&*woken, "cat file").await.stdout_text().trim(), "kept");
    let procs = sh(&*woken, "ps -eo args").await.stdout_text();
    assert!(
        !procs.contains("sleep 1000"),
        "the sleeper outlived the sleep:\n{procs}"
    );
    woken.destroy(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_box_cannot_move_its_own_deadline() {
    if !docker_available("a_box_cannot_move_its_own_deadline") {
        return;
    }
    let p = provider().await;
    let b = p.create(&Spec::new(Duration::from_secs(300)), &ctx()).await.unwrap();
    let out = sh(
        &*b,
        "echo 99999999999999 > /run/agentbox-deadline; echo $?; kill -HUP 1; echo sent",
    )
    .await;
    let text = out.stdout_text();
    assert!(
        text.lines().next().is_some_and(|l| l != "0"),
        "the box wrote its deadline: {text}"
    );
    let again = provider().await.attach(b.id(), &ctx()).await.unwrap().unwrap();
    assert_eq!(again.facts().ends_at_ms, b.facts().ends_at_ms);
    b.destroy(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_and_deleted_snapshots_leave_no_image_once_their_boxes_end() {
    if !docker_available("forks_and_deleted_snapshots_leave_no_image_once_their_boxes_end") {
        return;
    }
    let p = provider().await;
    let b = p.create(&Spec::new(Duration::from_secs(300)), &ctx()).await.unwrap();
    let name = format!("gc-{}", now_ms());
    p.snapshot(b.id(), &name, &ctx()).await.unwrap();
    let mut from = Spec::new(Duration::from_secs(300));
    from.snapshot = Some(name.clone());
    let child = p.create(&from, &ctx()).await.unwrap();
    let kids = p
        .fork(b.id(), 2, &Spec::new(Duration::from_secs(300)), &ctx())
        .await
        .unwrap();
    assert!(p.delete_snapshot(&name, &ctx()).await.unwrap());
    // In use, the images stay (untagged) under the boxes made from them.
    assert_eq!(sh(&*child, "echo up").await.stdout_text().trim(), "up");
    for k in kids.iter().chain([&child, &b]) {
        k.destroy(&ctx()).await.unwrap();
    }
    p.list(&Default::default(), &ctx()).await.unwrap();
    let left = docker(&[
        "images",
        "-q",
        "--filter",
        "dangling=true",
        "--filter",
        &format!("label=agentbox.snapshot.from={}", b.id()),
    ])
    .unwrap_or_default();
    assert!(left.trim().is_empty(), "images of {} left: {left}", b.id());
    let tagged = docker(&["images", "-q", "agentbox-fork"]).unwrap_or_default();
    assert!(tagged.trim().is_empty(), "a fork's image is still tagged: {tagged}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_snapshots_of_one_name_at_once_are_one_snapshot_and_one_refusal() {
    if !docker_available("two_snapshots_of_one_name_at_once_are_one_snapshot_and_one_refusal") {
        return;
    }
    let p = provider().await;
    let (c, spec) = (ctx(), Spec::new(Duration::from_secs(300)));
    let (a, b) = tokio::join!(p.create(&spec, &c), p.create(&spec, &c));
    let (a, b) = (a.unwrap(), b.unwrap());
    let name = format!("race-{}", now_ms());
    let (x, y) = tokio::join!(p.snapshot(a.id(), &name, &c), p.snapshot(b.id(), &name, &c));
    let (won, lost) = match (x, y) {
        (Ok(s), Err(e)) => ((s, a.id().clone()), e),
        (Err(e), Ok(s)) => ((s, b.id().clone()), e),
        other => panic!("two snapshots of one name at once answered {other:?}"),
    };
    assert_eq!(lost.code(), agentbox_core::ErrorCode::Refused, "{lost}");
    let kept = p.snapshots(&ctx()).await.unwrap();
    let kept = kept.iter().find(|s| s.name == name).expect("the snapshot is kept");
    assert_eq!(kept.from.as_ref(), Some(&won.1), "the one kept is the winner's");
    assert!(p.delete_snapshot(&name, &ctx()).await.unwrap());
    a.destroy(&ctx()).await.unwrap();
    b.destroy(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_box_another_home_made_is_not_slept_or_relabelled_here() {
    if !docker_available("a_box_another_home_made_is_not_slept_or_relabelled_here") {
        return;
    }
    let p = provider().await;
    let b = p.create(&Spec::new(Duration::from_secs(300)), &ctx()).await.unwrap();
    // This home without the box's deadline file is another home, as far as the box goes.
    let home = agentbox_providers::home::default_home().unwrap().join("docker");
    let file = home.join(format!("{}.deadline", b.id().name()));
    let aside = home.join(format!("{}.deadline.aside", b.id().name()));
    std::fs::rename(&file, &aside).unwrap();
    let labels = agentbox_core::Labels::from([("k".to_string(), "v".to_string())]);
    let relabel = p.relabel(b.id(), &labels, &ctx()).await;
    let sleep = p.sleep(b.id(), &ctx()).await;
    let extend = p.extend(b.id(), now_ms() + 600_000, &ctx()).await;
    std::fs::rename(&aside, &file).unwrap();
    for (what, e) in [
        ("relabel", relabel.map(|_| ()).unwrap_err()),
        ("sleep", sleep.unwrap_err()),
        ("extend", extend.map(|_| ()).unwrap_err()),
    ] {
        assert_eq!(e.code(), agentbox_core::ErrorCode::Refused, "{what}: {e}");
        assert!(e.message().contains("deadline file"), "{what}: {e}");
    }
    b.destroy(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleep_and_a_wake_at_once_leave_a_box_that_is_what_it_says() {
    if !docker_available("a_sleep_and_a_wake_at_once_leave_a_box_that_is_what_it_says") {
        return;
    }
    let p = provider().await;
    let b = p.create(&Spec::new(Duration::from_secs(300)), &ctx()).await.unwrap();
    let id = b.id().clone();
    for round in 0..4 {
        let c = ctx();
        let (slept, woken) = tokio::join!(p.sleep(&id, &c), p.wake(&id, &c));
        slept.unwrap();
        woken.unwrap();
        let now = provider().await.attach(&id, &ctx()).await.unwrap().unwrap();
        match now.status(&ctx()).await.unwrap() {
            Status::Running => assert_eq!(sh(&*now, "echo up").await.stdout_text().trim(), "up", "round {round}"),
            Status::Sleeping => {
                p.wake(&id, &ctx()).await.unwrap();
            }
            other => panic!("round {round}: {other:?}"),
        }
    }
    let woken = p.wake(&id, &ctx()).await.unwrap();
    assert_eq!(sh(&*woken, "echo up").await.stdout_text().trim(), "up");
    woken.destroy(&ctx()).await.unwrap();
}

//! The lifecycle's cases: names, sleep and wake, a moved deadline, labels changed, snapshots
//! and forks. Each runs where the provider's `honours()` declares its operation; one case
//! checks that every operation it does not declare is refused `unsupported`.

use std::time::{Duration, Instant};

use agentbox_core::{Ctx, ErrorCode, Labels, Sandbox, Status};

use super::{CaseResult, Cx, Need, futures_join_all};

fn ctx() -> Ctx {
    Ctx::background().with_timeout(Duration::from_secs(120))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A name no other run or case uses (names are DNS labels: lowercase, digits, `-`).
fn unique_name(cx: &Cx, what: &str) -> String {
    let tag: String = cx
        .suite
        .tag
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_lowercase();
    let mut name = format!("{what}-{tag}");
    name.truncate(63);
    name.trim_end_matches('-').to_string()
}

async fn read(cx: &Cx, b: &dyn Sandbox, path: &str) -> Result<String, String> {
    let out = cx.sh(b, &format!("cat {path} 2>/dev/null || echo absent")).await?;
    Ok(out.stdout_text().trim().to_string())
}

async fn write(cx: &Cx, b: &dyn Sandbox, path: &str, text: &str) -> CaseResult {
    let out = cx.sh(b, &format!("printf %s '{text}' > {path}")).await?;
    ensure!(out.status.code == 0, "writing {path}: {}", out.stderr_text());
    Ok(())
}

/// A box opened by name is one box: opened again it is the same (with its files), opened at
/// once by two callers it is one, under other labels it is another; discarded, the next open
/// finds it empty; a bad name is refused `invalid`.
pub(super) async fn names_open_and_discard(cx: &Cx) -> CaseResult {
    let name = unique_name(cx, "named");
    let spec = cx.spec();
    let c = ctx();
    let (a, b) = tokio::join!(cx.provider.open(&name, &spec, &c), cx.provider.open(&name, &spec, &c));
    let (a, b) = (
        a.map_err(|e| format!("open: {e}"))?,
        b.map_err(|e| format!("open: {e}"))?,
    );
    ensure!(
        a.id() == b.id(),
        "two opens of {name:?} at once answered {} and {}",
        a.id(),
        b.id()
    );
    ensure!(
        a.facts().name.as_deref() == Some(name.as_str()),
        "the facts' name is {:?}, not {name:?}",
        a.facts().name
    );
    ensure!(a.labels() == &spec.labels, "the box's labels are {:?}", a.labels());
    write(cx, &*a, "kept", "one").await?;
    let again = cx
        .fresh()
        .await
        .open(&name, &spec, &ctx())
        .await
        .map_err(|e| format!("open again: {e}"))?;
    ensure!(
        again.id() == a.id(),
        "opened again by a fresh provider: {} is not {}",
        again.id(),
        a.id()
    );
    ensure!(read(cx, &*again, "kept").await? == "one", "the file was not kept");
    let other = spec.clone().label("conformance-case", "other-labels");
    let elsewhere = cx
        .provider
        .open(&name, &other, &ctx())
        .await
        .map_err(|e| format!("open: {e}"))?;
    ensure!(
        elsewhere.id() != a.id(),
        "the same name under other labels answered the same box"
    );

    let fresh = cx.fresh().await;
    ensure!(
        fresh
            .discard(&name, &spec.labels, &ctx())
            .await
            .map_err(|e| format!("discard: {e}"))?,
        "discard of an open box said there was none"
    );
    ensure!(
        fresh.attach(a.id(), &ctx()).await.map_err(|e| e.to_string())?.is_none(),
        "a discarded box is still attached"
    );
    ensure!(
        !fresh
            .discard(&name, &spec.labels, &ctx())
            .await
            .map_err(|e| format!("discard: {e}"))?,
        "a second discard said there was a box"
    );
    let anew = cx
        .provider
        .open(&name, &spec, &ctx())
        .await
        .map_err(|e| format!("open after discard: {e}"))?;
    ensure!(
        read(cx, &*anew, "kept").await? == "absent",
        "a discarded box's file is back"
    );
    ensure!(
        cx.provider
            .open(&name, &other, &ctx())
            .await
            .map_err(|e| e.to_string())?
            .id()
            == elsewhere.id(),
        "the other labels' box was discarded with this one"
    );
    for bad in ["Bad_Name", "", "-x"] {
        match cx.provider.open(bad, &spec, &ctx()).await {
            Err(e) if e.code() == ErrorCode::Invalid => {}
            Err(e) => return Err(format!("open {bad:?} answered {e}, expected invalid")),
            Ok(_) => return Err(format!("open {bad:?} made a box")),
        }
    }
    Ok(())
}

/// A box put to sleep keeps its files and loses its programs; a fresh provider lists and
/// attaches it as sleeping, and it refuses programs until woken; woken, it works with its
/// files. Its facts say what a sleep keeps and how its clock runs.
pub(super) async fn sleep_keeps_files_and_wakes(cx: &Cx) -> CaseResult {
    let spec = cx.spec().label("conformance-case", "sleep");
    let b = cx.create(&spec).await?;
    let id = b.id().clone();
    ensure!(
        matches!(b.facts().sleep.as_deref(), Some("files" | "frozen")),
        "facts.sleep is {:?}, expected files or frozen",
        b.facts().sleep
    );
    ensure!(
        matches!(b.facts().sleep_clock.as_deref(), Some("counting" | "paused")),
        "facts.sleep_clock is {:?}, expected counting or paused",
        b.facts().sleep_clock
    );
    write(cx, &*b, "kept", "before sleep").await?;
    let pid = if cx.live() {
        let (sleeper, pid) = cx.start_sleeper(&*b, &ctx()).await?;
        drop(sleeper);
        Some(pid)
    } else {
        None
    };
    cx.provider
        .sleep(&id, &ctx())
        .await
        .map_err(|e| format!("sleep: {e}"))?;
    cx.provider
        .sleep(&id, &ctx())
        .await
        .map_err(|e| format!("a second sleep: {e}"))?;

    let fresh = cx.fresh().await;
    let asleep = fresh
        .attach(&id, &ctx())
        .await
        .map_err(|e| e.to_string())?
        .ok_or("a sleeping box is not found by attach")?;
    let status = asleep.status(&ctx()).await.map_err(|e| e.to_string())?;
    ensure!(status == Status::Sleeping, "a sleeping box's status is {status:?}");
    let listed = fresh.list(&spec.labels, &ctx()).await.map_err(|e| e.to_string())?;
    ensure!(listed.iter().any(|l| l.id() == &id), "list leaves a sleeping box out");
    match asleep
        .exec(&super::cx::argv(&["true"]), &Default::default(), &ctx())
        .await
    {
        Err(e) if e.code() == ErrorCode::Refused => {}
        Err(e) => return Err(format!("exec in a sleeping box answered {e}, expected refused")),
        Ok(_) => return Err("a sleeping box ran a program".into()),
    }
    if let Some(pid) = pid
        && b.facts().sleep.as_deref() == Some("files")
        && cx.options().outside.any_alive(&id, &[pid]).await
    {
        return Err(format!(
            "program {pid} still runs in a box whose sleep keeps files only"
        ));
    }

    let woken = fresh.wake(&id, &ctx()).await.map_err(|e| format!("wake: {e}"))?;
    ensure!(woken.id() == &id, "wake answered {}", woken.id());
    let status = woken.status(&ctx()).await.map_err(|e| e.to_string())?;
    ensure!(status == Status::Running, "a woken box's status is {status:?}");
    ensure!(
        read(cx, &*woken, "kept").await? == "before sleep",
        "the file was not kept through the sleep"
    );
    let again = fresh
        .wake(&id, &ctx())
        .await
        .map_err(|e| format!("waking an awake box: {e}"))?;
    ensure!(again.id() == &id, "waking an awake box answered another");
    Ok(())
}

/// A sleeping box whose clock counts still ends at its deadline with no call from the host.
pub(super) async fn a_sleeping_box_ends_at_its_deadline(cx: &Cx) -> CaseResult {
    let mut spec = cx.spec().label("conformance-case", "sleep-deadline");
    spec.max_lifetime = cx.options().lifetime;
    let t = Instant::now();
    let b = cx.create(&spec).await?;
    let id = b.id().clone();
    let counting = b.facts().sleep_clock.as_deref() == Some("counting");
    cx.provider
        .sleep(&id, &ctx())
        .await
        .map_err(|e| format!("sleep: {e}"))?;
    drop(b);
    if !counting {
        // A paused clock: the box is still there after its lifetime, asleep.
        tokio::time::sleep(cx.options().lifetime + cx.options().grace).await;
        ensure!(
            !cx.options().outside.ended(&id).await,
            "a sleeping box with a paused clock ended"
        );
        return Ok(());
    }
    let limit = cx.options().lifetime + cx.options().grace;
    while !cx.options().outside.ended(&id).await {
        ensure!(
            t.elapsed() < limit,
            "a sleeping box still exists {:.1}s after create (lifetime {:?}, grace {:?})",
            t.elapsed().as_secs_f64(),
            cx.options().lifetime,
            cx.options().grace
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// A box extended past its first deadline is alive after it and ends at the new one, with
/// no call from the host in between; one whose deadline is moved earlier ends then; a
/// deadline in the past is refused `invalid`.
pub(super) async fn extend_moves_the_deadline(cx: &Cx) -> CaseResult {
    let (life, grace) = (cx.options().lifetime, cx.options().grace);
    let mut spec = cx.spec().label("conformance-case", "extend");
    spec.max_lifetime = life;
    let t = Instant::now();
    let b = cx.create(&spec).await?;
    let id = b.id().clone();
    // Past the first deadline and its grace by one more lifetime.
    let new_deadline = now_ms() + (life + grace + life).as_millis() as u64;
    let extended = cx
        .provider
        .extend(&id, new_deadline, &ctx())
        .await
        .map_err(|e| format!("extend: {e}"))?;
    let said = extended.facts().ends_at_ms.unwrap_or(0);
    ensure!(
        said.abs_diff(new_deadline) <= 1000,
        "the extended box's facts say it ends at {said}, not {new_deadline}"
    );

    // Earlier: a long-lived box brought in to end within one lifetime.
    let mut long = cx.spec().label("conformance-case", "extend-earlier");
    long.max_lifetime = Duration::from_secs(600);
    let early = cx.create(&long).await?;
    let early_id = early.id().clone();
    let t_early = Instant::now();
    cx.provider
        .extend(&early_id, now_ms() + life.as_millis() as u64, &ctx())
        .await
        .map_err(|e| format!("extend earlier: {e}"))?;
    drop(early);

    match cx.provider.extend(&id, now_ms().saturating_sub(1000), &ctx()).await {
        Err(e) if e.code() == ErrorCode::Invalid => {}
        Err(e) => return Err(format!("a deadline in the past answered {e}, expected invalid")),
        Ok(_) => return Err("a deadline in the past was taken".into()),
    }

    // Past the first deadline and its grace: still alive.
    tokio::time::sleep((life + grace).saturating_sub(t.elapsed())).await;
    ensure!(
        !cx.options().outside.ended(&id).await,
        "the extended box ended at its first deadline"
    );
    let out = cx.sh(&*extended, "echo alive").await?;
    ensure!(
        out.stdout_text().trim() == "alive",
        "the extended box answered {:?}",
        out.stdout_text()
    );
    drop(extended);
    ensure!(
        cx.options().outside.ended(&early_id).await || t_early.elapsed() < life + grace,
        "the box moved earlier still exists {:.1}s later",
        t_early.elapsed().as_secs_f64()
    );
    while !cx.options().outside.ended(&early_id).await {
        ensure!(
            t_early.elapsed() < life + grace,
            "the box moved earlier still exists {:.1}s later (lifetime {life:?}, grace {grace:?})",
            t_early.elapsed().as_secs_f64()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // No call from the host from here on: it ends at the new deadline.
    let end = Duration::from_millis(new_deadline.saturating_sub(now_ms()));
    let t_end = Instant::now();
    while !cx.options().outside.ended(&id).await {
        ensure!(
            t_end.elapsed() < end + grace,
            "the extended box still exists {:.1}s past its new deadline",
            t_end.elapsed().as_secs_f64() - end.as_secs_f64()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    ensure!(
        t_end.elapsed() + Duration::from_millis(1500) >= end,
        "the extended box ended {:?} before its new deadline",
        end - t_end.elapsed()
    );
    Ok(())
}

/// A box's host labels replaced: the answered handle, a fresh attach and list by label all
/// say the new ones; a label in the providers' namespace is refused `invalid`.
pub(super) async fn relabel_replaces_the_host_labels(cx: &Cx) -> CaseResult {
    let spec = cx.spec().label("conformance-case", "relabel");
    let b = cx.create(&spec).await?;
    let mut labels = cx.spec().labels;
    labels.insert("conformance-case".into(), "relabelled".into());
    let changed = cx
        .provider
        .relabel(b.id(), &labels, &ctx())
        .await
        .map_err(|e| format!("relabel: {e}"))?;
    ensure!(
        changed.labels() == &labels,
        "the answered box's labels are {:?}",
        changed.labels()
    );
    let fresh = cx.fresh().await;
    let found = fresh
        .attach(b.id(), &ctx())
        .await
        .map_err(|e| e.to_string())?
        .ok_or("the relabelled box is not found")?;
    ensure!(
        found.labels() == &labels,
        "attached, its labels are {:?}",
        found.labels()
    );
    let by_new = fresh.list(&labels, &ctx()).await.map_err(|e| e.to_string())?;
    ensure!(
        by_new.iter().any(|x| x.id() == b.id()),
        "list by the new labels leaves it out"
    );
    let by_old = fresh.list(&spec.labels, &ctx()).await.map_err(|e| e.to_string())?;
    ensure!(
        !by_old.iter().any(|x| x.id() == b.id()),
        "list by the old labels still finds it"
    );
    let bad: Labels = [("agentbox.provider".to_string(), "x".to_string())].into();
    match cx.provider.relabel(b.id(), &bad, &ctx()).await {
        Err(e) if e.code() == ErrorCode::Invalid => Ok(()),
        Err(e) => Err(format!("a reserved label answered {e}, expected invalid")),
        Ok(_) => Err("a label in the providers' namespace was taken".into()),
    }
}

/// A snapshot keeps a box's files as they were: a box made from it has them (and says so in
/// its facts), later changes of either stay apart; one name is one snapshot; deleted, it
/// makes nothing.
pub(super) async fn snapshot_and_make_from_it(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    write(cx, &*b, "kept", "at the snapshot").await?;
    let name = unique_name(cx, "snap");
    cx.snapshots
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(name.clone());
    let snap = cx
        .provider
        .snapshot(b.id(), &name, &ctx())
        .await
        .map_err(|e| format!("snapshot: {e}"))?;
    ensure!(snap.name == name, "the snapshot is named {:?}", snap.name);
    match cx.provider.snapshot(b.id(), &name, &ctx()).await {
        Err(e) if e.code() == ErrorCode::Refused => {}
        Err(e) => return Err(format!("a second snapshot of one name answered {e}, expected refused")),
        Ok(_) => return Err("a second snapshot of one name was taken".into()),
    }
    let listed = cx
        .fresh()
        .await
        .snapshots(&ctx())
        .await
        .map_err(|e| format!("snapshots: {e}"))?;
    ensure!(listed.iter().any(|s| s.name == name), "snapshots() leaves {name:?} out");
    write(cx, &*b, "kept", "after the snapshot").await?;

    let mut spec = cx.spec();
    spec.snapshot = Some(name.clone());
    let made = cx.create(&spec).await?;
    ensure!(
        made.facts().snapshot.as_deref() == Some(name.as_str()),
        "a box made from a snapshot has facts.snapshot {:?}",
        made.facts().snapshot
    );
    ensure!(
        read(cx, &*made, "kept").await? == "at the snapshot",
        "a box made from the snapshot does not hold the file as it was"
    );
    write(cx, &*made, "kept", "changed in the copy").await?;
    ensure!(
        read(cx, &*b, "kept").await? == "after the snapshot",
        "a change in the copy reached the box"
    );

    ensure!(
        cx.provider
            .delete_snapshot(&name, &ctx())
            .await
            .map_err(|e| format!("delete_snapshot: {e}"))?,
        "delete_snapshot said there was none"
    );
    ensure!(
        !cx.provider
            .delete_snapshot(&name, &ctx())
            .await
            .map_err(|e| format!("delete_snapshot: {e}"))?,
        "a second delete_snapshot said there was one"
    );
    match cx.provider.create(&spec, &ctx()).await {
        Err(e) if e.code() == ErrorCode::NotFound => {}
        Err(e) => {
            return Err(format!(
                "a create from a deleted snapshot answered {e}, expected not_found"
            ));
        }
        Ok(b) => {
            let _ = b.destroy(&ctx()).await;
            return Err("a create from a deleted snapshot made a box".into());
        }
    }
    match cx.provider.snapshot(b.id(), "Not A Name", &ctx()).await {
        Err(e) if e.code() == ErrorCode::Invalid => Ok(()),
        Err(e) => Err(format!("a bad snapshot name answered {e}, expected invalid")),
        Ok(_) => Err("a bad snapshot name was taken".into()),
    }
}

/// A fork's boxes start with the box's files and diverge from then on: a change in one
/// reaches neither the box forked nor its siblings.
pub(super) async fn fork_children_diverge(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    write(cx, &*b, "kept", "parent").await?;
    let kids = cx
        .provider
        .fork(b.id(), 2, &cx.spec(), &ctx())
        .await
        .map_err(|e| format!("fork: {e}"))?;
    ensure!(kids.len() == 2, "a fork of 2 made {}", kids.len());
    ensure!(
        kids[0].id() != kids[1].id() && kids.iter().all(|k| k.id() != b.id()),
        "a fork's boxes are not each their own: {:?}",
        kids.iter().map(|k| k.id().to_string()).collect::<Vec<_>>()
    );
    for k in &kids {
        ensure!(
            read(cx, &**k, "kept").await? == "parent",
            "a forked box lacks the parent's file"
        );
    }
    write(cx, &*kids[0], "kept", "child zero").await?;
    ensure!(
        read(cx, &*kids[1], "kept").await? == "parent",
        "a change in one child reached its sibling"
    );
    ensure!(
        read(cx, &*b, "kept").await? == "parent",
        "a change in a child reached the parent"
    );
    write(cx, &*b, "kept", "parent later").await?;
    ensure!(
        read(cx, &*kids[0], "kept").await? == "child zero",
        "a change in the parent reached a child"
    );
    for n in [0, agentbox_core::MAX_FORK + 1] {
        match cx.provider.fork(b.id(), n, &cx.spec(), &ctx()).await {
            Err(e) if e.code() == ErrorCode::Invalid => {}
            Err(e) => return Err(format!("a fork of {n} answered {e}, expected invalid")),
            Ok(_) => return Err(format!("a fork of {n} made boxes")),
        }
    }
    Ok(())
}

/// Every operation the provider does not declare is refused `unsupported`, naming it: a
/// caller that asks first and one that tries meet the same answer.
pub(super) async fn undeclared_lifecycle_is_refused(cx: &Cx) -> CaseResult {
    let h = &cx.suite.honours;
    if Need::LIFECYCLE.iter().all(|n| n.declared(h)) && h.snapshot {
        return Ok(());
    }
    let b = cx.new_box().await?;
    let id = b.id().clone();
    let p = &cx.provider;
    let spec = cx.spec();
    let name = unique_name(cx, "undeclared");
    // Only what is undeclared is tried: a declared operation would do its work (a snapshot
    // made here would outlive the suite).
    let mut tried: Vec<(&str, Option<agentbox_core::Error>)> = Vec::new();
    let err = |r: Result<(), agentbox_core::Error>| r.err();
    if !h.names {
        tried.push(("names", err(p.open(&name, &spec, &ctx()).await.map(|_| ()))));
        tried.push(("names", err(p.discard(&name, &spec.labels, &ctx()).await.map(|_| ()))));
    }
    if !h.sleep {
        tried.push(("sleep", err(p.sleep(&id, &ctx()).await)));
        tried.push(("sleep", err(p.wake(&id, &ctx()).await.map(|_| ()))));
    }
    if !h.extend {
        tried.push((
            "extend",
            err(p.extend(&id, now_ms() + 600_000, &ctx()).await.map(|_| ())),
        ));
    }
    if !h.relabel {
        tried.push(("relabel", err(p.relabel(&id, &spec.labels, &ctx()).await.map(|_| ()))));
    }
    if !h.snapshots {
        tried.push(("snapshots", err(p.snapshot(&id, &name, &ctx()).await.map(|_| ()))));
        tried.push(("snapshots", err(p.snapshots(&ctx()).await.map(|_| ()))));
    }
    if !h.fork {
        tried.push(("fork", err(p.fork(&id, 1, &spec, &ctx()).await.map(|_| ()))));
    }
    for (field, e) in tried {
        match e {
            Some(e) if e.code() == ErrorCode::Unsupported => {}
            Some(e) => return Err(format!("honours().{field} is false, but the operation answered {e}")),
            None => return Err(format!("honours().{field} is false, but the operation succeeded")),
        }
    }
    if !h.snapshot {
        let mut spec = cx.spec();
        spec.snapshot = Some(name);
        match p.create(&spec, &ctx()).await {
            Err(e) if e.code() == ErrorCode::Unsupported && e.message().contains("snapshot") => {}
            Err(e) => {
                return Err(format!(
                    "honours().snapshot is false, but a spec's snapshot answered {e}"
                ));
            }
            Ok(_) => return Err("honours().snapshot is false, but a spec's snapshot made a box".into()),
        }
    }
    Ok(())
}

/// Many names opened at once each answer one box of their own: the make of one name never
/// holds up another's.
pub(super) async fn many_names_at_once(cx: &Cx) -> CaseResult {
    let spec = cx.spec().label("conformance-case", "many-names");
    let names: Vec<String> = (0..4).map(|i| unique_name(cx, &format!("many{i}"))).collect();
    let c = ctx();
    let opened = futures_join_all(names.iter().map(|n| cx.provider.open(n, &spec, &c))).await;
    let mut ids = std::collections::BTreeSet::new();
    for (n, b) in names.iter().zip(opened) {
        let b = b.map_err(|e| format!("open {n}: {e}"))?;
        ensure!(ids.insert(b.id().clone()), "two names answered one box {}", b.id());
    }
    Ok(())
}

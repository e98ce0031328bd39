//! The cases of a box's life and finding it: its lifetime ends it with no call from the host,
//! create → exec → destroy, labels and list, attach from a fresh provider, destroy ends every
//! program.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentbox_core::{Ctx, ErrorCode, ExecOptions, Labels, Sandbox, Status};

use super::CaseResult;
use super::cx::{Cx, argv};

/// A box ends at its lifetime with every program it started, though the host never calls again
/// (it may have died): the provider, not the host, keeps the bound.
pub(super) async fn lifetime_ends_the_box_with_no_call_from_the_host(cx: &Cx) -> CaseResult {
    // A label of its own, so the list below asks of this box alone, not of the boxes other
    // cases make and end meanwhile.
    let mut spec = cx.spec().label("conformance-case", "lifetime");
    spec.max_lifetime = cx.options().lifetime;
    let t = Instant::now();
    let b = cx.create(&spec).await?;
    let id = b.id().clone();
    let pids = if cx.live() { cx.scatter(&*b).await? } else { vec![] };
    // No call from the host from here on (the suite's record of the box calls nothing until
    // the case ends).
    drop(b);
    let limit = cx.options().lifetime + cx.options().grace;
    loop {
        let ended = cx.options().outside.ended(&id).await;
        let alive = !pids.is_empty() && cx.options().outside.any_alive(&id, &pids).await;
        if ended && !alive {
            break;
        }
        ensure!(
            t.elapsed() < limit,
            "{:.1}s after create (lifetime {:?}, grace {:?}), outside says ended={ended}, programs alive={alive}",
            t.elapsed().as_secs_f64(),
            cx.options().lifetime,
            cx.options().grace
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    ensure!(
        t.elapsed() + Duration::from_millis(500) >= cx.options().lifetime,
        "the box ended after {:?}, before its lifetime {:?}",
        t.elapsed(),
        cx.options().lifetime
    );
    let fresh = cx.fresh().await;
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    ensure!(
        fresh.attach(&id, &ctx).await.map_err(|e| e.to_string())?.is_none(),
        "attach handed back an ended box"
    );
    let listed = fresh.list(&spec.labels, &ctx).await.map_err(|e| e.to_string())?;
    ensure!(!listed.iter().any(|b| b.id() == &id), "list handed back an ended box");
    Ok(())
}

/// The life of a box: its id and facts name the provider, a program runs, and once destroyed
/// it reads ended, refuses work `gone`, destroys again quietly, and attach finds nothing.
pub(super) async fn create_exec_destroy(cx: &Cx) -> CaseResult {
    let b = cx.create(&cx.spec()).await?;
    ensure!(
        b.id().provider() == cx.provider.name(),
        "id {} does not carry the provider {}",
        b.id(),
        cx.provider.name()
    );
    ensure!(
        b.facts().provider == cx.provider.name(),
        "facts name provider {:?}",
        b.facts().provider
    );
    let out = cx
        .run_opts(&*b, &["echo", "hello", "box"], &ExecOptions::default(), vec![])
        .await?;
    ensure!(out.status.code == 0, "echo exited {}", out.status.code);
    ensure!(out.stdout == b"hello box\n", "echo printed {:?}", out.stdout_text());
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    ensure!(
        matches!(b.status(&ctx).await, Ok(Status::Running)),
        "a new box is not running"
    );
    b.destroy(&ctx).await.map_err(|e| format!("destroy: {e}"))?;
    ensure!(
        matches!(b.status(&ctx).await, Ok(Status::Ended)),
        "a destroyed box does not read ended"
    );
    match b.exec(&argv(&["true"]), &ExecOptions::default(), &ctx).await {
        Err(e) if e.code() == ErrorCode::Gone => {}
        Err(e) => return Err(format!("exec on a destroyed box: {e}, expected gone")),
        Ok(_) => return Err("exec on a destroyed box started a program".into()),
    }
    match b.upload("x", b"1", &ctx).await {
        Err(e) if e.code() == ErrorCode::Gone => {}
        other => return Err(format!("upload to a destroyed box answered {other:?}, expected gone")),
    }
    b.destroy(&ctx)
        .await
        .map_err(|e| format!("a second destroy failed: {e}"))?;
    let again = cx
        .provider
        .attach(b.id(), &ctx)
        .await
        .map_err(|e| format!("attach: {e}"))?;
    ensure!(again.is_none(), "attach handed back a destroyed box");
    ensure!(
        cx.options().outside.ended(b.id()).await,
        "outside, the destroyed box has not ended"
    );
    Ok(())
}

/// List finds boxes by every label asked, hands back the host's labels without the provider's
/// own, and forgets a destroyed box.
pub(super) async fn labels_and_list(cx: &Cx) -> CaseResult {
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let run = format!("{}-list", cx.suite.tag);
    let mk = |n: &str| {
        let mut s = cx.spec();
        s.labels.insert("conformance-run".into(), run.clone());
        s.labels.insert("n".into(), n.into());
        s
    };
    let b1 = cx.create(&mk("1")).await?;
    let b2 = cx.create(&mk("2")).await?;
    let by = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Labels>()
    };
    let ids = |l: Vec<Arc<dyn Sandbox>>| l.iter().map(|b| b.id().clone()).collect::<BTreeSet<_>>();
    let both = cx
        .provider
        .list(&by(&[("conformance-run", &run)]), &ctx)
        .await
        .map_err(|e| format!("list: {e}"))?;
    ensure!(
        ids(both.clone()) == [b1.id().clone(), b2.id().clone()].into(),
        "list by run gave {:?}",
        ids(both)
    );
    let one = cx
        .provider
        .list(&by(&[("conformance-run", &run), ("n", "1")]), &ctx)
        .await
        .map_err(|e| e.to_string())?;
    ensure!(
        ids(one.clone()) == [b1.id().clone()].into(),
        "list by run and n=1 gave {:?}",
        ids(one.clone())
    );
    ensure!(
        one[0].labels() == &mk("1").labels,
        "a listed box's labels are {:?}",
        one[0].labels()
    );
    ensure!(
        !b1.labels().keys().any(|k| agentbox_core::is_reserved_label(k)),
        "the provider's own labels leak into the host's: {:?}",
        b1.labels()
    );
    let none = cx
        .provider
        .list(&by(&[("conformance-run", &run), ("n", "3")]), &ctx)
        .await
        .map_err(|e| e.to_string())?;
    ensure!(none.is_empty(), "list by a label no box has gave {} boxes", none.len());
    b2.destroy(&ctx).await.map_err(|e| e.to_string())?;
    let after = cx
        .provider
        .list(&by(&[("conformance-run", &run)]), &ctx)
        .await
        .map_err(|e| e.to_string())?;
    ensure!(
        ids(after.clone()) == [b1.id().clone()].into(),
        "after a destroy, list gave {:?}",
        ids(after)
    );
    Ok(())
}

/// A new provider (a new process) finds a box by id, runs in it and destroys it; attach of a
/// destroyed or unknown box is none, of another provider's id invalid.
pub(super) async fn attach_from_a_fresh_provider(cx: &Cx) -> CaseResult {
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let b = cx.create(&cx.spec().label("attach", "yes")).await?;
    let fresh = cx.fresh().await;
    let a = fresh
        .attach(b.id(), &ctx)
        .await
        .map_err(|e| format!("attach: {e}"))?
        .ok_or("attach found no box")?;
    ensure!(a.id() == b.id(), "attach handed back {}", a.id());
    ensure!(
        a.labels() == b.labels(),
        "attach's labels {:?} differ from {:?}",
        a.labels(),
        b.labels()
    );
    let out = cx
        .run_opts(&*a, &["echo", "attached"], &ExecOptions::default(), vec![])
        .await?;
    ensure!(
        out.stdout == b"attached\n",
        "exec through the attached box printed {:?}",
        out.stdout_text()
    );
    a.destroy(&ctx)
        .await
        .map_err(|e| format!("destroy through attach: {e}"))?;
    ensure!(
        matches!(b.status(&ctx).await, Ok(Status::Ended)),
        "the first handle does not see the destroy"
    );
    ensure!(
        fresh.attach(b.id(), &ctx).await.map_err(|e| e.to_string())?.is_none(),
        "attach found a destroyed box"
    );
    let missing = agentbox_core::SandboxId::new(fresh.name(), "conformance-nosuchbox").map_err(|e| e.to_string())?;
    ensure!(
        fresh.attach(&missing, &ctx).await.map_err(|e| e.to_string())?.is_none(),
        "attach found a box that never was"
    );
    let foreign = agentbox_core::SandboxId::new("another-provider", "x").map_err(|e| e.to_string())?;
    match fresh.attach(&foreign, &ctx).await {
        Err(e) if e.code() == ErrorCode::Invalid => {}
        other => {
            return Err(format!(
                "attach of another provider's id answered {:?}, expected invalid",
                other.map(|o| o.is_some())
            ));
        }
    }
    Ok(())
}

/// Destroy ends every program of the box, also those that left the exec (background, setsid,
/// double fork), as seen from outside.
pub(super) async fn destroy_ends_every_program(cx: &Cx) -> CaseResult {
    let b = cx.create(&cx.spec()).await?;
    let pids = cx.scatter(&*b).await?;
    ensure!(
        cx.options().outside.any_alive(b.id(), &pids).await,
        "outside, the scattered programs {pids:?} are not seen running"
    );
    b.destroy(&Ctx::background().with_timeout(Duration::from_secs(60)))
        .await
        .map_err(|e| format!("destroy: {e}"))?;
    for _ in 0..50 {
        if !cx.options().outside.any_alive(b.id(), &pids).await && cx.options().outside.ended(b.id()).await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "5s after destroy, outside sees programs {pids:?} or the box still"
    ))
}

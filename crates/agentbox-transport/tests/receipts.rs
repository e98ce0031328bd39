//! Receipts over in-memory fake boxes on a clock the test moves: one per box when it ends
//! (destroyed, found ended by status, found gone by attach), at the host's prices, labels
//! numbered on after a restart, none for a box with no price.

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Clock, Ctx, ExecOptions, FinishOptions, Spec, finish};
use agentbox_testing::fake::{FakeClock, FakeProvider, Preset, ProgramOutput};
use agentbox_transport::receipts::{Hooks, Price, Receipts, receipt_in, totals};
use serde_json::Value;

fn price(provider: &str, kind: &str, per_s: Option<f64>, per_call: Option<f64>) -> Price {
    Price {
        provider: provider.into(),
        kind: kind.into(),
        usd_per_second: per_s,
        usd_per_call: per_call,
        source: "https://example.invalid/pricing".into(),
        priced: "2026-11-30".into(),
    }
}

/// The receipts a file holds: each line a live line, `source: transport`, `kind: box.receipt`,
/// whose `data` is the receipt.
fn lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let line: Value = serde_json::from_str(l).unwrap();
            assert_eq!(
                (line["source"].as_str(), line["kind"].as_str()),
                (Some("transport"), Some("box.receipt")),
                "{line}"
            );
            assert_eq!(line["at"], line["data"]["to"], "the line is dated when the box ended");
            line["data"].clone()
        })
        .collect()
}

#[tokio::test]
async fn each_box_gets_one_receipt_when_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("receipts.jsonl");
    let clock = FakeClock::manual(1_796_000_000_000);
    let modal = FakeProvider::with("modal", clock.clone(), Some(Preset::modal_like()));
    let archil = FakeProvider::with("archil", clock.clone(), Some(Preset::archil_like()));
    let prices = vec![
        price("modal", "vm", Some(0.0001), None),
        price("archil", "vm", None, Some(0.002)),
    ];
    let receipts = Receipts::open_with_clock(&path, prices, clock.clone()).unwrap();
    let m = receipts.wrap(Arc::new(modal.clone()));
    let d = receipts.wrap(Arc::new(archil.clone()));
    archil.program("true", |_| async { ProgramOutput::default() });
    let ctx = Ctx::background();

    // Destroyed through the ledger after 90 s: 90 × 0.0001.
    let a = m.create(&Spec::new(Duration::from_secs(600)), &ctx).await.unwrap();
    clock.advance(Duration::from_secs(90));
    a.destroy(&ctx).await.unwrap();
    a.destroy(&ctx).await.ok();
    // Billed per call: three execs, whatever their time.
    let b = d.create(&Spec::new(Duration::from_secs(600)), &ctx).await.unwrap();
    for _ in 0..3 {
        let p = b
            .exec(&["true".to_string()], &ExecOptions::default(), &ctx)
            .await
            .unwrap();
        finish(p, FinishOptions::default()).await.unwrap();
    }
    assert!(
        b.exec(&[], &ExecOptions::default(), &ctx).await.is_err(),
        "refused before it is made: not counted"
    );
    // Refused by the box itself before the call is made (an option it cannot give): not
    // counted either.
    archil.on(
        agentbox_testing::fake::Match::op(agentbox_testing::fake::Op::Exec),
        agentbox_testing::fake::Outcome::Fail(agentbox_core::ErrorCode::Unsupported, "exec tty: no".into()),
        Some(1),
    );
    let e = b
        .exec(&["true".to_string()], &ExecOptions::default(), &ctx)
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), agentbox_core::ErrorCode::Unsupported, "{e}");
    // Given up on in the box's queue before it was sent: never made, not counted. Given up on
    // once made: counted (the fourth call).
    use agentbox_testing::fake::{Match, Op, Outcome};
    archil.on(
        Match::op(Op::Exec),
        Outcome::NotMade(agentbox_core::ErrorCode::Aborted, "before its turn".into()),
        Some(1),
    );
    assert!(
        b.exec(&["true".to_string()], &ExecOptions::default(), &ctx)
            .await
            .is_err()
    );
    archil.on(
        Match::op(Op::Exec),
        Outcome::Fail(agentbox_core::ErrorCode::Aborted, "while it ran".into()),
        Some(1),
    );
    assert!(
        b.exec(&["true".to_string()], &ExecOptions::default(), &ctx)
            .await
            .is_err()
    );
    clock.advance(Duration::from_secs(10));
    b.destroy(&ctx).await.unwrap();
    // Found ended by status: its lifetime ran out on the clock.
    let c = m.create(&Spec::new(Duration::from_secs(30)), &ctx).await.unwrap();
    clock.advance(Duration::from_secs(45));
    assert_eq!(c.status(&ctx).await.unwrap(), agentbox_core::Status::Ended);
    // Found gone by attach: the vendor swept it.
    let e = m.create(&Spec::new(Duration::from_secs(600)), &ctx).await.unwrap();
    clock.advance(Duration::from_secs(5));
    modal.end_box(e.id()).await;
    assert!(m.attach(e.id(), &ctx).await.unwrap().is_none());

    let got = lines(&path);
    assert_eq!(got.len(), 4, "{got:#?}");
    assert_eq!(got[0]["box"], "box-1");
    assert_eq!(got[0]["provider"], "modal");
    assert_eq!(got[0]["kind"], "vm");
    assert_eq!(got[0]["seconds"], 90.0);
    assert!((got[0]["cost_usd"].as_f64().unwrap() - 0.009).abs() < 1e-12);
    assert_eq!(got[0]["usd_per_second"], 0.0001);
    assert!(got[0].get("usd_per_call").is_none() && got[0].get("calls").is_none());
    assert_eq!(got[0]["from"], "2026-11-30T00:53:20.000Z");
    assert_eq!(got[0]["source"], "https://example.invalid/pricing");
    assert_eq!(got[1]["box"], "box-2");
    assert_eq!(got[1]["calls"], 4);
    assert_eq!(got[1]["usd_per_call"], 0.002);
    assert!(got[1].get("usd_per_second").is_none(), "absent, never 0");
    assert_eq!(got[1]["cost_usd"], 0.008);
    assert_eq!(got[2]["box"], "box-3");
    assert_eq!(got[2]["seconds"], 45.0);
    assert_eq!(got[3]["box"], "box-4");
    assert_eq!(got[3]["seconds"], 5.0);

    // A box with no price gets no receipt, but a label; a restart numbers on past the file's.
    let unpriced = FakeProvider::with("e2b", clock.clone(), None);
    let again =
        Receipts::open_with_clock(&path, vec![price("modal", "vm", Some(0.0001), None)], clock.clone()).unwrap();
    let u = again.wrap(Arc::new(unpriced));
    let x = u.create(&Spec::new(Duration::from_secs(60)), &ctx).await.unwrap();
    x.destroy(&ctx).await.unwrap();
    let m2 = again.wrap(Arc::new(modal.clone()));
    let y = m2.create(&Spec::new(Duration::from_secs(60)), &ctx).await.unwrap();
    clock.advance(Duration::from_secs(1));
    y.destroy(&ctx).await.unwrap();
    let got = lines(&path);
    assert_eq!(got.len(), 5);
    assert_eq!(got[4]["box"], "box-6", "box-5 was the unpriced one");

    let t = totals(&path).unwrap();
    let modal_vm = t.iter().find(|t| t.provider == "modal").unwrap();
    assert_eq!((modal_vm.boxes, modal_vm.seconds), (4, 141.0));
    let _ = clock.now_ms();
}

/// A box billed per call (an Archil exec box) never gets a per-second price, nor a box billed
/// by the second a per-call one: its cost stays unknown rather than wrong.
#[tokio::test]
async fn a_price_that_bills_the_other_way_is_never_applied() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("receipts.jsonl");
    let clock = FakeClock::manual(1_796_000_000_000);
    let archil = FakeProvider::with("archil", clock.clone(), Some(Preset::archil_like()));
    let modal = FakeProvider::with("modal", clock.clone(), Some(Preset::modal_like()));
    let prices = vec![
        price("archil", "vm", Some(0.5), None),
        price("modal", "vm", None, Some(0.5)),
    ];
    let receipts = Receipts::open_with_clock(&path, prices, clock.clone()).unwrap();
    let ctx = Ctx::background();
    for p in [receipts.wrap(Arc::new(archil)), receipts.wrap(Arc::new(modal))] {
        let b = p.create(&Spec::new(Duration::from_secs(60)), &ctx).await.unwrap();
        clock.advance(Duration::from_secs(10));
        b.destroy(&ctx).await.unwrap();
    }
    assert!(lines(&path).is_empty(), "{:#?}", lines(&path));
    // With both prices given, each box takes the one that bills it its way.
    let prices = vec![
        price("archil", "vm", Some(0.5), None),
        price("archil", "vm", None, Some(0.25)),
    ];
    let receipts = Receipts::open_with_clock(&path, prices, clock.clone()).unwrap();
    let archil = FakeProvider::with("archil", clock.clone(), Some(Preset::archil_like()));
    archil.program("true", |_| async { ProgramOutput::default() });
    let a = receipts.wrap(Arc::new(archil));
    let b = a.create(&Spec::new(Duration::from_secs(60)), &ctx).await.unwrap();
    let p = b
        .exec(&["true".to_string()], &ExecOptions::default(), &ctx)
        .await
        .unwrap();
    finish(p, FinishOptions::default()).await.unwrap();
    clock.advance(Duration::from_secs(30));
    b.destroy(&ctx).await.unwrap();
    let got = lines(&path);
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0]["calls"].as_u64(), got[0]["usd_per_call"].as_f64()),
        (Some(1), Some(0.25))
    );
    assert!(got[0].get("usd_per_second").is_none(), "{:#?}", got[0]);
}

#[test]
fn a_price_must_say_how_it_bills() {
    let dir = tempfile::tempdir().unwrap();
    let bad = price("modal", "vm", Some(1.0), Some(1.0));
    let e = Receipts::open(&dir.path().join("r.jsonl"), vec![bad]).err().unwrap();
    assert!(e.message().contains("exactly one"), "{e}");
    std::fs::write(dir.path().join("broken.jsonl"), "{\"box\":\"box-1\"}\nnot json\n").unwrap();
    let e = totals(&dir.path().join("broken.jsonl")).unwrap_err();
    assert!(e.message().contains("line 1") || e.message().contains("line 2"), "{e}");
}

#[tokio::test]
async fn boxes_opened_and_forked_through_receipts_are_receipted_and_the_lifecycle_passes_through() {
    agentbox_testing::runner::ensure();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("receipts.jsonl");
    let local =
        agentbox_providers::LocalProvider::new(agentbox_providers::LocalOptions::at(dir.path()).unwrap()).unwrap();
    let prices = vec![price("local", "none", Some(0.001), None)];
    let receipts = Receipts::open(&path, prices).unwrap();
    let p = receipts.wrap(Arc::new(local));
    let ctx = Ctx::background();
    let spec = Spec::new(Duration::from_secs(600));
    let named = p.open("receipted", &spec, &ctx).await.unwrap();
    let again = p.open("receipted", &spec, &ctx).await.unwrap();
    assert_eq!(named.id(), again.id());
    let kids = p.fork(named.id(), 2, &spec, &ctx).await.unwrap();
    let later = p
        .extend(named.id(), named.facts().ends_at_ms.unwrap() + 60_000, &ctx)
        .await
        .unwrap();
    assert_eq!(
        later.facts().ends_at_ms,
        Some(named.facts().ends_at_ms.unwrap() + 60_000)
    );
    for b in kids.iter().chain([&later]) {
        b.destroy(&ctx).await.unwrap();
    }
    let written = lines(&path);
    assert_eq!(
        written.len(),
        3,
        "one receipt for the named box and one per forked box: {written:?}"
    );
}

/// The host's hooks: `label(made)` is called once per box with its own request and facts (so
/// boxes asked for together get the labels their requests name, whatever order they come back
/// in), and `kind_of` names the kind the prices are looked up by.
#[tokio::test]
async fn a_host_labels_its_boxes_from_their_requests_and_names_their_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("receipts.jsonl");
    let clock = FakeClock::manual(1_796_000_000_000);
    let modal = FakeProvider::with("modal", clock.clone(), Some(Preset::modal_like()));
    let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = calls.clone();
    let hooks = Hooks {
        clock: Some(clock.clone()),
        label: Some(Arc::new(move |made| {
            seen.lock().unwrap().push((
                made.provider.to_string(),
                made.kind.to_string(),
                made.facts.isolation.clone(),
            ));
            format!("task-{}", made.spec.labels["task"])
        })),
        kind_of: Some(Arc::new(|provider, facts| {
            (provider == "modal").then(|| format!("{provider}-{}", facts.isolation))
        })),
    };
    // Modal-like boxes are `vm` by their facts: the host's kind is its own.
    let kind = "modal-vm".to_string();
    let receipts = Receipts::open_with(&path, vec![price("modal", &kind, Some(0.5), None)], hooks).unwrap();
    let m = receipts.wrap(Arc::new(modal.clone()));
    let ctx = Ctx::background();
    let (sa, sb) = (
        Spec::new(Duration::from_secs(600)).label("task", "a"),
        Spec::new(Duration::from_secs(600)).label("task", "b"),
    );
    let (a, b) = tokio::join!(m.create(&sa, &ctx), m.create(&sb, &ctx));
    clock.advance(Duration::from_secs(2));
    // Ended in the other order than they were asked for.
    b.unwrap().destroy(&ctx).await.unwrap();
    a.unwrap().destroy(&ctx).await.unwrap();
    let got = lines(&path);
    let labels: Vec<_> = got.iter().map(|r| r["box"].as_str().unwrap().to_string()).collect();
    assert_eq!(labels, ["task-b", "task-a"]);
    assert!(
        got.iter().all(|r| r["kind"] == kind.as_str() && r["cost_usd"] == 1.0),
        "{got:#?}"
    );
    let calls = calls.lock().unwrap();
    assert_eq!(calls.len(), 2, "once per box");
    assert!(calls.iter().all(|(p, k, _)| p == "modal" && *k == kind), "{calls:?}");

    // The totals read the envelope, and files of the older flat shape too; a recording's
    // other lines are passed over.
    let t = totals(&path).unwrap();
    assert_eq!((t.len(), t[0].boxes, t[0].usd), (1, 2, 2.0));
    let flat = dir.path().join("flat.jsonl");
    std::fs::write(
        &flat,
        "{\"box\":\"box-1\",\"provider\":\"modal\",\"kind\":\"vm\",\"seconds\":3,\"cost_usd\":0.25}\n\
         {\"source\":\"agent\",\"kind\":\"turn.end\",\"data\":{}}\n",
    )
    .unwrap();
    let t = totals(&flat).unwrap();
    assert_eq!((t.len(), t[0].boxes, t[0].usd), (1, 1, 0.25));
    // A receipt's line that holds no receipt is an error, never a cost left out.
    let broken = dir.path().join("broken.jsonl");
    std::fs::write(
        &broken,
        "{\"source\":\"transport\",\"kind\":\"box.receipt\",\"data\":null}\n",
    )
    .unwrap();
    let e = totals(&broken).unwrap_err();
    assert!(
        e.message().contains("line 1") && e.message().contains("box.receipt"),
        "{e}"
    );
    let line: Value = serde_json::from_str(std::fs::read_to_string(&path).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(receipt_in(&line).unwrap()["box"], "task-b");
}

//! This host's runs, ledger and receipts through the service: an admin key reads a run's
//! record, its tool calls, the calls on a target and what boxes cost; any other key is refused.

mod support;

use std::sync::Arc;

use agentbox_server::{Keys, Limits};
use agentbox_transport::ledger::{JsonlLedger, LedgerStore, Record};
use serde_json::json;
use support::*;

fn call_record(run: &str, seq: u64, op: &str, target: &str, ok: bool) -> Record {
    Record {
        run: run.into(),
        seq,
        kind: "op.called".into(),
        op: op.into(),
        target: Some(target.into()),
        at: 1_700_000_000_000 + seq,
        ok,
        error: (!ok).then(|| "exit 1".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_ledger_and_receipts_are_an_admins_to_read() {
    let keys = Arc::new(Keys::in_memory().unwrap());
    let (_, admin) = keys.add("root", true, Limits::default()).await.unwrap();
    let (_, plain) = keys.add("k", false, local()).await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let runs = agentbox_runs::Runs::new(home.path());
    runs.create(Some("r1")).unwrap();
    {
        let run = runs.open("r1").await.unwrap();
        run.release().await.unwrap();
    }
    let ledger_dir = home.path().join("ledger");
    let ledger = Arc::new(JsonlLedger::open(&ledger_dir).unwrap());
    for r in [
        call_record("r1", 1, "write", "/work/a.txt", true),
        call_record("r1", 2, "bash", "local:b1", false),
        call_record("r1", 3, "edit", "/work/a.txt", true),
    ] {
        ledger.append(&r).await.unwrap();
    }
    let receipts = home.path().join("receipts.jsonl");
    std::fs::write(
        &receipts,
        "{\"box\":\"box-1\",\"provider\":\"local\",\"kind\":\"box\",\"seconds\":10.0,\"cost_usd\":0.0}\n\
         {\"source\":\"transport\",\"kind\":\"box.receipt\",\"at\":\"2026-12-01T00:00:05Z\",\
         \"data\":{\"box\":\"box-2\",\"provider\":\"local\",\"kind\":\"box\",\"seconds\":5.0,\"cost_usd\":0.0}}\n",
    )
    .unwrap();
    let s = start_with(keys, 1 << 20, home.path(), |o| {
        o.runs_root = Some(home.path().to_path_buf());
        o.ledger = Some(ledger.clone());
        o.receipts = Some(receipts.clone());
    })
    .await;
    let a = Some(admin.as_str());

    let (st, listed) = call(&s, a, "GET", "/v1/runs", None).await;
    assert_eq!(st, 200, "{listed}");
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    let (st, run) = call(&s, a, "GET", "/v1/runs/r1", None).await;
    assert_eq!(
        (st, &run["id"], &run["generation"]),
        (200, &json!("r1"), &json!(1)),
        "{run}"
    );
    // Its generations as a timeline: the one open, sealed, on this host.
    let gens = run["generations"].as_array().unwrap();
    assert_eq!(gens.len(), 1, "{run}");
    assert_eq!(
        (&gens[0]["generation"], &gens[0]["ended"], &gens[0]["host"]),
        (&json!(1), &json!("sealed"), &json!(agentbox_runs::run::host_name())),
        "{run}"
    );
    let (st, missing) = call(&s, a, "GET", "/v1/runs/nope", None).await;
    assert_eq!((st, code_of(&missing)), (404, "not_found"), "{missing}");
    let (st, bad) = call(&s, a, "GET", "/v1/runs/..%2Fx", None).await;
    assert_eq!((st, code_of(&bad)), (400, "invalid"), "{bad}");

    let (st, calls) = call(&s, a, "GET", "/v1/runs/r1/ledger", None).await;
    assert_eq!(st, 200, "{calls}");
    let ops: Vec<&str> = calls
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["op"].as_str().unwrap())
        .collect();
    assert_eq!(ops, ["write", "bash", "edit"]);
    let (st, on) = call(&s, a, "GET", "/v1/ledger?target=/work/a.txt&limit=1", None).await;
    assert_eq!(st, 200, "{on}");
    assert_eq!(on.as_array().unwrap().len(), 1, "{on}");
    assert_eq!(on[0]["seq"], 3, "newest first: {on}");
    let (st, bad) = call(&s, a, "GET", "/v1/ledger?target=x&limit=0", None).await;
    assert_eq!((st, code_of(&bad)), (400, "invalid"), "{bad}");

    let (st, totals) = call(&s, a, "GET", "/v1/receipts", None).await;
    assert_eq!(st, 200, "{totals}");
    assert_eq!(
        totals,
        json!([{"provider": "local", "kind": "box", "boxes": 2, "seconds": 15.0, "cost_usd": 0.0}])
    );

    // Each box's receipt, newest first, bounded.
    let (st, each) = call(&s, a, "GET", "/v1/receipts/boxes?limit=1", None).await;
    assert_eq!(st, 200, "{each}");
    assert_eq!(
        each.as_array()
            .unwrap()
            .iter()
            .map(|r| r["box"].clone())
            .collect::<Vec<_>>(),
        [json!("box-2")]
    );
    let (st, bad) = call(&s, a, "GET", "/v1/receipts/boxes?limit=0", None).await;
    assert_eq!((st, code_of(&bad)), (400, "invalid"), "{bad}");

    for path in [
        "/v1/runs",
        "/v1/runs/r1",
        "/v1/runs/r1/ledger",
        "/v1/ledger?target=x",
        "/v1/receipts",
        "/v1/receipts/boxes",
    ] {
        let (st, refused) = call(&s, Some(&plain), "GET", path, None).await;
        assert_eq!((st, code_of(&refused)), (403, "permission_denied"), "{path}: {refused}");
    }
}

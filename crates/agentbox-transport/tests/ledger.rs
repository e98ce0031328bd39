//! One behaviour suite for every ledger store: JSONL, SQLite, PostgreSQL (a real server that
//! scripts/test starts), memory.

use std::sync::Arc;

use agentbox_core::Ctx;
use agentbox_hands::HostEnv;
use agentbox_transport::ledger::{
    JsonlLedger, LedgerStore, MemoryLedger, PostgresLedger, Record, Recorder, SqliteLedger,
};

fn rec(run: &str, seq: u64, target: &str, at: u64) -> Record {
    Record {
        run: run.into(),
        seq,
        kind: "op.called".into(),
        op: "write".into(),
        target: Some(target.into()),
        at,
        ok: true,
        error: None,
    }
}

/// The suite: every store reads a run in seq order and a target newest first across runs.
async fn suite(store: Arc<dyn LedgerStore>, tag: &str) {
    let (r1, r2) = (format!("{tag}-run-1"), format!("{tag}-run-2"));
    let t = format!("/work/{tag}/a.txt");
    // Appended out of order: read puts them in seq order.
    store.append(&rec(&r1, 2, &t, 2_000)).await.unwrap();
    store.append(&rec(&r1, 1, &t, 1_000)).await.unwrap();
    store.append(&rec(&r1, 3, "/elsewhere", 3_000)).await.unwrap();
    store.append(&rec(&r2, 1, &t, 5_000)).await.unwrap();
    store.append(&rec(&r2, 2, &t, 5_000)).await.unwrap();
    let seqs: Vec<u64> = store.read(&r1).await.unwrap().iter().map(|r| r.seq).collect();
    assert_eq!(seqs, [1, 2, 3], "{tag}");
    let got: Vec<(String, u64)> = store
        .read_by_target(&t, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.run, r.seq))
        .collect();
    assert_eq!(
        got,
        [(r2.clone(), 2), (r2.clone(), 1), (r1.clone(), 2), (r1.clone(), 1)],
        "{tag}: newest first"
    );
    assert_eq!(store.read_by_target(&t, 2).await.unwrap().len(), 2, "{tag}: limited");
    assert!(store.read("nobody").await.unwrap().is_empty());
    assert!(
        store.append(&rec("../escape", 1, &t, 1)).await.is_err(),
        "{tag}: a run id is checked"
    );
    // A recorder numbers on past what the store holds, and records each call's target and outcome.
    let dir = tempfile::tempdir().unwrap();
    let env = HostEnv::new(dir.path().to_string_lossy()).unwrap();
    let recorder = Recorder::open(store.clone(), &r1).await.unwrap();
    let ctx = Ctx::background();
    let ok = recorder
        .call(
            "write",
            &env,
            serde_json::json!({"path": "notes.txt", "content": "hi"}),
            &ctx,
        )
        .await
        .unwrap();
    assert!(!ok.is_error);
    let bad = recorder
        .call("read", &env, serde_json::json!({"path": "missing.txt"}), &ctx)
        .await
        .unwrap();
    assert!(bad.is_error);
    recorder
        .call("bash", &env, serde_json::json!({"command": "true"}), &ctx)
        .await
        .unwrap();
    let run = store.read(&r1).await.unwrap();
    let last: Vec<(u64, &str, bool)> = run[3..].iter().map(|r| (r.seq, r.op.as_str(), r.ok)).collect();
    assert_eq!(
        last,
        [(4, "write", true), (5, "read", false), (6, "bash", true)],
        "{tag}"
    );
    let written = format!("{}/notes.txt", dir.path().display());
    assert_eq!(run[3].target.as_deref(), Some(written.as_str()));
    assert!(run[4].error.as_deref().is_some_and(|e| e.contains("missing.txt")));
    assert_eq!(run[5].target.as_deref(), Some("host"));
    assert_eq!(store.read_by_target(&written, 5).await.unwrap().len(), 1);
}

#[tokio::test]
async fn memory() {
    suite(Arc::new(MemoryLedger::default()), "memory").await;
}

#[tokio::test]
async fn jsonl() {
    let dir = tempfile::tempdir().unwrap();
    suite(Arc::new(JsonlLedger::open(dir.path()).unwrap()), "jsonl").await;
    // A last line cut short by a crash was never acknowledged, and is skipped.
    let path = dir.path().join("jsonl-run-1.jsonl");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("{\"run\":\"jsonl-run-1\",\"se");
    std::fs::write(&path, text).unwrap();
    let store = JsonlLedger::open(dir.path()).unwrap();
    assert_eq!(store.read("jsonl-run-1").await.unwrap().len(), 6);
}

#[tokio::test]
async fn sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    suite(Arc::new(SqliteLedger::open(&path).unwrap()), "sqlite").await;
    // Reopened, it holds the same.
    assert_eq!(
        SqliteLedger::open(&path)
            .unwrap()
            .read("sqlite-run-1")
            .await
            .unwrap()
            .len(),
        6
    );
}

#[tokio::test]
async fn postgres() {
    let Some(conn) = agentbox_testing::services::postgres("ledger::postgres") else {
        return;
    };
    let tag = format!("pg{}", std::process::id());
    suite(Arc::new(PostgresLedger::connect(&conn).await.unwrap()), &tag).await;
    // A second connection (another host) reads what the first wrote.
    let other = PostgresLedger::connect(&conn).await.unwrap();
    assert_eq!(other.read(&format!("{tag}-run-1")).await.unwrap().len(), 6);
}

#[tokio::test]
async fn postgres_a_connection_that_ended_says_why() {
    let Some(conn) = agentbox_testing::services::postgres("ledger::postgres_a_connection_that_ended_says_why") else {
        return;
    };
    let name = format!("agentbox-ended-{}", std::process::id());
    let ledger = PostgresLedger::connect(&format!("{conn} application_name={name}"))
        .await
        .unwrap();
    ledger.append(&rec(&format!("{name}-run"), 1, "/t", 1)).await.unwrap();
    // The server ends the ledger's backend, as an administrator or a failover would.
    let (admin, c) = tokio_postgres::connect(&conn, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(c);
    let ended = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&name],
        )
        .await
        .unwrap();
    assert_eq!(ended.len(), 1, "one backend of the ledger's");
    // The call in flight hears the server's reason; every call after it must still read it.
    let mut errors = Vec::new();
    for _ in 0..100 {
        match ledger.append(&rec(&format!("{name}-run"), 2, "/t", 2)).await {
            Ok(()) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            Err(e) => errors.push(e),
        }
        if errors.len() >= 2 {
            break;
        }
    }
    let e = errors.last().expect("appending on a terminated connection fails");
    assert!(errors.len() >= 2, "{errors:?}");
    // Whichever the client heard first, the server's FATAL or the socket's failure, a call
    // after the end says it, not a bare "connection closed".
    let why = e
        .message()
        .split_once("the connection to PostgreSQL ended: ")
        .map(|(_, why)| why.to_string())
        .unwrap_or_else(|| panic!("a call after the end says the connection ended: {errors:?}"));
    assert!(
        why.contains("terminating connection") || why.contains("communicating with the server: "),
        "the reason is named: {errors:?}"
    );
}

/// A record names its fields as the workflow ledger does (`type`, `seq`, `op`, `target`, `at`),
/// its run as `run`, and reads one that names it `runId`.
#[test]
fn a_record_has_the_workflow_ledgers_field_names() {
    let r = rec("r1", 3, "/workspace/a.txt", 1_800_000_000_000);
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"run": "r1", "seq": 3, "type": "op.called", "op": "write",
            "target": "/workspace/a.txt", "at": 1_800_000_000_000u64, "ok": true})
    );
    let theirs = serde_json::json!({"runId": "r1", "seq": 3, "type": "op.called", "op": "write",
        "target": "/workspace/a.txt", "at": 1_800_000_000_000u64, "ok": true});
    assert_eq!(serde_json::from_value::<Record>(theirs).unwrap(), r);
}

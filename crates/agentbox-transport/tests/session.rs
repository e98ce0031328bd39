//! A scripted session (a fixed sequence of tool calls over a transport) end to end, over local
//! and Docker boxes: host A makes the box and releases it; host B (a restart: new transport,
//! new receipts, new recorder over the same files) finds the box again, goes on, destroys the
//! session, and makes one more box of its own. Then the receipts and the ledger are checked.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use agentbox_core::{Ctx, Provider};
use agentbox_hands::ExecutionEnv;
use agentbox_providers::docker::{DockerOptions, DockerProvider};
use agentbox_providers::{LocalOptions, LocalProvider};
use agentbox_transport::ledger::{LedgerStore, Recorder, SqliteLedger};
use agentbox_transport::receipts::{Price, Receipts};
use agentbox_transport::{SqliteDocuments, Transport, TransportConfig, TransportHost};
use serde_json::json;

struct Files<'a> {
    dir: &'a Path,
}

impl Files<'_> {
    fn docs(&self) -> Arc<SqliteDocuments> {
        Arc::new(SqliteDocuments::open(&self.dir.join("session.db")).unwrap())
    }
    fn ledger(&self) -> Arc<dyn LedgerStore> {
        Arc::new(SqliteLedger::open(&self.dir.join("ledger.db")).unwrap())
    }
    fn receipts(&self, provider: &str, kind: &str) -> Arc<Receipts> {
        let price = Price {
            provider: provider.into(),
            kind: kind.into(),
            usd_per_second: Some(0.001),
            usd_per_call: None,
            source: "the test's own".into(),
            priced: "2026-11-30".into(),
        };
        Receipts::open(&self.dir.join("receipts.jsonl"), vec![price]).unwrap()
    }
}

fn transport(provider: Arc<dyn Provider>, docs: Arc<SqliteDocuments>) -> Transport {
    let config = format!(
        "hands = \"sandbox\"\n[environments.sandbox]\nprovider = \"{}\"\nmax_lifetime = \"10m\"\n",
        provider.name()
    );
    Transport::new(
        TransportConfig::from_toml(&config).unwrap(),
        TransportHost {
            providers: BTreeMap::from([(provider.name().to_string(), provider)]),
            documents: docs,
            session: "scripted".into(),
            labels: BTreeMap::from([("session".to_string(), "scripted".to_string())]),
            on_lost: None,
            prepare: None,
        },
    )
    .unwrap()
}

async fn call(r: &Recorder, env: &dyn ExecutionEnv, tool: &str, args: serde_json::Value) -> String {
    let out = r.call(tool, env, args, &Ctx::background()).await.unwrap();
    assert!(!out.is_error, "{tool}: {}", out.text());
    out.text()
}

async fn scripted(make: impl Fn() -> Arc<dyn Provider>, kind: &str) {
    let dir = tempfile::tempdir().unwrap();
    let f = Files { dir: dir.path() };
    let name = make().name().to_string();

    // Host A.
    let receipts = f.receipts(&name, kind);
    let t = transport(receipts.wrap(make()), f.docs());
    let env = t.env("chat").unwrap();
    let rec = Recorder::open(f.ledger(), "scripted").await.unwrap();
    call(
        &rec,
        &*env,
        "write",
        json!({"path": "notes.md", "content": "alpha\nbeta\n"}),
    )
    .await;
    call(
        &rec,
        &*env,
        "edit",
        json!({"path": "notes.md", "edits": [{"oldText": "beta", "newText": "gamma"}]}),
    )
    .await;
    let counted = call(&rec, &*env, "bash", json!({"command": "wc -l < notes.md"})).await;
    assert_eq!(counted.trim(), "2");
    let box_a = env.id();
    t.release();
    drop((t, env, rec, receipts));

    // Host B: a restart over the same documents, receipts and ledger.
    let receipts = f.receipts(&name, kind);
    let t = transport(receipts.wrap(make()), f.docs());
    let env = t.env("chat").unwrap();
    let rec = Recorder::open(f.ledger(), "scripted").await.unwrap();
    let text = call(&rec, &*env, "read", json!({"path": "notes.md"})).await;
    assert!(text.contains("alpha") && text.contains("gamma"), "{text}");
    assert_eq!(env.id(), box_a, "the restart found its box again");
    call(&rec, &*env, "ls", json!({})).await;
    let ended = t.destroy(&Ctx::background()).await.unwrap();
    assert_eq!(ended.len(), 1);
    // A call after the session's boxes ended gets a box of host B's own.
    call(&rec, &*env, "write", json!({"path": "after.txt", "content": "new box"})).await;
    let box_b = env.id();
    assert_ne!(box_b, box_a);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(t.destroy(&Ctx::background()).await.unwrap().len(), 1);

    // Receipts: the box host A made is A's to receipt (A released it): none. Host B's box: one.
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(dir.path().join("receipts.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    let r = agentbox_transport::receipts::receipt_in(&lines[0]).expect("a box.receipt line");
    assert_eq!(
        (r["box"].as_str(), r["provider"].as_str(), r["kind"].as_str()),
        (Some("box-1"), Some(name.as_str()), Some(kind))
    );
    let seconds = r["seconds"].as_f64().unwrap();
    assert!(seconds >= 1.0, "{r}");
    assert!((r["cost_usd"].as_f64().unwrap() - seconds * 0.001).abs() < 1e-9, "{r}");

    // Ledger: one run, numbered across the restart, each call with its target and outcome.
    let run = f.ledger().read("scripted").await.unwrap();
    let ops: Vec<(u64, &str, bool)> = run.iter().map(|r| (r.seq, r.op.as_str(), r.ok)).collect();
    assert_eq!(
        ops,
        [
            (1, "write", true),
            (2, "edit", true),
            (3, "bash", true),
            (4, "read", true),
            (5, "ls", true),
            (6, "write", true)
        ]
    );
    let notes = run[0].target.clone().unwrap();
    assert!(notes.starts_with('/') && notes.ends_with("/notes.md"), "{notes}");
    assert_eq!(run[2].target.as_deref(), Some(box_a.as_str()));
    let history = f.ledger().read_by_target(&notes, 10).await.unwrap();
    let seqs: Vec<u64> = history.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, [4, 2, 1], "newest first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_session_over_local_boxes() {
    agentbox_testing::runner::ensure();
    let home = tempfile::tempdir().unwrap();
    let root = home.path().to_path_buf();
    scripted(
        move || Arc::new(LocalProvider::new(LocalOptions::at(&root).unwrap()).unwrap()) as Arc<dyn Provider>,
        "none",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_session_over_docker_boxes() {
    if !agentbox_testing::services::docker_available("a_scripted_session_over_docker_boxes") {
        return;
    }
    let make = || {
        let rt = tokio::runtime::Handle::current();
        let p = std::thread::spawn(move || rt.block_on(DockerProvider::new(DockerOptions::default())))
            .join()
            .unwrap()
            .unwrap();
        Arc::new(p) as Arc<dyn Provider>
    };
    scripted(make, "container").await;
}

//! Nothing lives only in a server's memory: two servers over one PostgreSQL key store (and one
//! provider) serve the same keys and the same boxes, and a server started after another
//! stopped finds every box again, and a process's output goes on from the cursor read through
//! the first. A key's request rate is answered 429 with `Retry-After`.

mod support;

use std::sync::Arc;

use agentbox_server::{Keys, Limits};
use serde_json::json;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_over_one_postgres_serve_the_same_keys_and_boxes() {
    let Some(conn) = agentbox_testing::services::postgres("replicas::two_servers_over_one_postgres") else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let first = Arc::new(Keys::postgres(&conn).await.unwrap());
    // Names unique to this run: the database outlives it.
    let run = format!("{:x}", std::process::id());
    let (_, a) = first.add(&format!("a-{run}"), false, local()).await.unwrap();
    let (_, b) = first.add(&format!("b-{run}"), false, local()).await.unwrap();
    let one = start_in(first.clone(), 1 << 20, home.path()).await;
    let two = start_in(Arc::new(Keys::postgres(&conn).await.unwrap()), 1 << 20, home.path()).await;

    let (st, made) = call(
        &one,
        Some(&a),
        "POST",
        "/v1/boxes",
        Some(json!({"spec": spec(600_000)})),
    )
    .await;
    assert_eq!(st, 201, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    // The other replica knows the key and reaches its box; the other key does not.
    let (st, ran) = call(
        &two,
        Some(&a),
        "POST",
        &format!("/v1/boxes/{id}/exec"),
        Some(json!({"command": "echo hi"})),
    )
    .await;
    assert_eq!((st, ran["stdout"].as_str()), (200, Some("hi\n")), "{ran}");
    let (st, _) = call(&two, Some(&b), "GET", &format!("/v1/boxes/{id}"), None).await;
    assert_eq!(st, 404);

    // A process's output read part way through one server...
    let (st, p) = call(
        &one,
        Some(&a),
        "POST",
        &format!("/v1/boxes/{id}/processes"),
        Some(json!({"command": "echo before; read x; echo after:$x"})),
    )
    .await;
    assert_eq!(st, 201, "{p}");
    let h = p["handle"].as_u64().unwrap();
    let procs = format!("/v1/boxes/{id}/processes/{h}");
    let (_, before) = call(
        &one,
        Some(&a),
        "GET",
        &format!("{procs}/output?after=0&wait_ms=30000"),
        None,
    )
    .await;
    assert_eq!(before["chunks"][0]["text"], "before\n", "{before}");
    let cursor = before["next"].as_u64().unwrap();

    // A server that stops leaves the box running; the next one finds it.
    one.stop().await;
    let three = start_in(Arc::new(Keys::postgres(&conn).await.unwrap()), 1 << 20, home.path()).await;
    let (st, listed) = call(&three, Some(&a), "GET", "/v1/boxes", None).await;
    assert_eq!(st, 200, "{listed}");
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["id"], id.as_str());
    // ...goes on from its cursor through the next, nothing repeated.
    let (st, _) = call(
        &three,
        Some(&a),
        "POST",
        &format!("{procs}/stdin"),
        Some(json!({"data": "x\n"})),
    )
    .await;
    assert_eq!(st, 204);
    let (_, rest) = call(
        &three,
        Some(&a),
        "GET",
        &format!("{procs}/output?after={cursor}&wait_ms=30000"),
        None,
    )
    .await;
    assert_eq!(rest["chunks"][0]["text"], "after:x\n", "{rest}");

    // A key removed through one replica is gone for all.
    assert!(first.remove(&format!("a-{run}")).await.unwrap());
    let (st, b2) = call(&two, Some(&a), "GET", "/v1/boxes", None).await;
    assert_eq!((st, code_of(&b2)), (401, "unauthenticated"), "{b2}");
    assert!(first.remove(&format!("b-{run}")).await.unwrap());
    let keys = Keys::open(&home.path().join("k.db")).unwrap();
    let (_, admin) = keys.add("root", true, Limits::default()).await.unwrap();
    let four = start_in(Arc::new(keys), 1 << 20, home.path()).await;
    let (st, _) = call(&four, Some(&admin), "DELETE", &format!("/v1/boxes/{id}"), None).await;
    assert_eq!(st, 204);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_request_rate_is_answered_429_with_retry_after() {
    let keys = Arc::new(Keys::in_memory().unwrap());
    let limited = Limits {
        requests_per_minute: Some(3),
        ..local()
    };
    let (_, key) = keys.add("slow", false, limited).await.unwrap();
    let (_, other) = keys.add("other", false, local()).await.unwrap();
    let s = start(keys, 1 << 20).await;
    for _ in 0..3 {
        let (st, b) = call(&s, Some(&key), "GET", "/v1/boxes", None).await;
        assert_eq!(st, 200, "{b}");
    }
    let (st, b, retry) = call_with(&s, Some(&key), "GET", "/v1/boxes", None).await;
    assert_eq!((st, code_of(&b)), (429, "rate_limited"), "{b}");
    let retry: u64 = retry.expect("Retry-After").parse().unwrap();
    assert!((1..=20).contains(&retry), "{retry}");
    // Another key is not slowed by it.
    let (st, _) = call(&s, Some(&other), "GET", "/v1/boxes", None).await;
    assert_eq!(st, 200);
}

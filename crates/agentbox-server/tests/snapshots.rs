//! Snapshots and forks through the service: a snapshot's name is its key's own (another key
//! neither lists, uses nor deletes it), a box made from one holds its files, and a fork's
//! boxes belong to the key that forked, within its limits.

mod support;

use std::sync::Arc;

use agentbox_server::{Keys, Limits};
use serde_json::{Value, json};
use support::*;

async fn make(s: &Server, key: &str, spec: Value) -> (u16, Value) {
    call(s, Some(key), "POST", "/v1/boxes", Some(json!({"spec": spec}))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_are_a_keys_own_and_forks_belong_to_the_key_that_forked() {
    let keys = Arc::new(Keys::in_memory().unwrap());
    let limited = Limits {
        max_boxes: Some(3),
        ..local()
    };
    let (_, a) = keys.add("a", false, limited).await.unwrap();
    let (_, b) = keys.add("b", false, local()).await.unwrap();
    let s = start(keys, 1 << 20).await;
    let (st, made) = make(&s, &a, spec(600_000)).await;
    assert_eq!(st, 201, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    run_in(&s, &a, &id, "echo kept > f.txt").await;

    let (st, snap) = call(
        &s,
        Some(&a),
        "POST",
        &format!("/v1/boxes/{id}/snapshots"),
        Some(json!({"name": "base"})),
    )
    .await;
    assert_eq!(st, 201, "{snap}");
    assert_eq!(
        (snap["name"].as_str(), snap["provider"].as_str()),
        (Some("base"), Some("local")),
        "{snap}"
    );
    let (st, again) = call(
        &s,
        Some(&a),
        "POST",
        &format!("/v1/boxes/{id}/snapshots"),
        Some(json!({"name": "base"})),
    )
    .await;
    assert_eq!((st, code_of(&again)), (409, "refused"), "{again}");
    let (st, bad) = call(
        &s,
        Some(&a),
        "POST",
        &format!("/v1/boxes/{id}/snapshots"),
        Some(json!({"name": "Not_A_Label"})),
    )
    .await;
    assert_eq!((st, code_of(&bad)), (400, "invalid"), "{bad}");

    // The other key sees none of it, and cannot start from it by either name.
    let (_, listed) = call(&s, Some(&b), "GET", "/v1/snapshots", None).await;
    assert_eq!(listed, json!([]));
    let (_, listed) = call(&s, Some(&a), "GET", "/v1/snapshots?provider=local", None).await;
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["name"], "base");
    let (st, refused) = make(&s, &b, json!({"max_lifetime_ms": 600_000, "snapshot": "base"})).await;
    assert_eq!(st, 404, "{refused}");
    let full = format!("s-{}-base", keys_id_of(&s, &a).await);
    let (st, refused) = make(&s, &b, json!({"max_lifetime_ms": 600_000, "snapshot": full})).await;
    assert_eq!((st, code_of(&refused)), (404, "not_found"), "{refused}");
    let (st, refused) = call(&s, Some(&b), "DELETE", "/v1/snapshots/local/base", None).await;
    assert_eq!((st, code_of(&refused)), (404, "not_found"), "{refused}");

    // Its key starts a box from it.
    let (st, from) = make(&s, &a, json!({"max_lifetime_ms": 600_000, "snapshot": "base"})).await;
    assert_eq!(st, 201, "{from}");
    let from_id = from["id"].as_str().unwrap().to_string();
    assert_eq!(run_in(&s, &a, &from_id, "cat f.txt").await, "kept\n");

    // A fork past the key's most is refused; one within it belongs to the key.
    let (st, past) = call(
        &s,
        Some(&a),
        "POST",
        &format!("/v1/boxes/{id}/fork"),
        Some(json!({"n": 2, "spec": spec(600_000)})),
    )
    .await;
    assert_eq!((st, code_of(&past)), (429, "rate_limited"), "{past}");
    run_in(&s, &a, &id, "echo changed > f.txt").await;
    let (st, forks) = call(
        &s,
        Some(&a),
        "POST",
        &format!("/v1/boxes/{id}/fork"),
        Some(json!({"spec": spec(600_000)})),
    )
    .await;
    assert_eq!(st, 201, "{forks}");
    let fork_id = forks[0]["id"].as_str().unwrap().to_string();
    assert_eq!(run_in(&s, &a, &fork_id, "cat f.txt").await, "changed\n");
    let (st, _) = call(&s, Some(&b), "GET", &format!("/v1/boxes/{fork_id}"), None).await;
    assert_eq!(st, 404);
    let (st, refused) = call(
        &s,
        Some(&b),
        "POST",
        &format!("/v1/boxes/{id}/fork"),
        Some(json!({"spec": spec(600_000)})),
    )
    .await;
    assert_eq!((st, code_of(&refused)), (404, "not_found"), "{refused}");

    let (st, _) = call(&s, Some(&a), "DELETE", "/v1/snapshots/local/base", None).await;
    assert_eq!(st, 204);
    let (st, gone) = call(&s, Some(&a), "DELETE", "/v1/snapshots/local/base", None).await;
    assert_eq!((st, code_of(&gone)), (404, "not_found"), "{gone}");
}

/// The id of `key` as its boxes' owner label shows it.
async fn keys_id_of(s: &Server, key: &str) -> String {
    let (_, boxes) = call(s, Some(key), "GET", "/v1/boxes", None).await;
    boxes[0]["labels"]["agentbox-server.owner"]
        .as_str()
        .unwrap()
        .to_string()
}

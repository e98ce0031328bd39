//! The fake Daytona's own rules, asked over plain HTTP: the key, the throttle, a create whose
//! answer is lost, the label index that trails each query shape on its own schedule, the soft
//! delete and `desiredState`, ttl (re-anchored when set later), autoStop and autoDelete on the
//! fake's clock, validation, networkBlockAll, a bulk download's error part, a hung toolbox,
//! preview links, and volumes.

use std::time::{Duration, Instant};

use agentbox_fakes::daytona::{FakeDaytona, FakeDaytonaOptions};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;
use common::http::{self, Answer};

const KEY: &str = "rules-key";

async fn fake(test: &str, tweak: impl FnOnce(&mut FakeDaytonaOptions)) -> Option<FakeDaytona> {
    let rootfs = agentbox_testing::services::rootfs(test)?;
    agentbox_testing::runner::ensure();
    let mut o = FakeDaytonaOptions {
        rootfs: Some(rootfs.into()),
        api_key: KEY.into(),
        index_lag: Duration::from_millis(300),
        ..Default::default()
    };
    tweak(&mut o);
    Some(FakeDaytona::start(o).await.expect("the fake starts"))
}

/// One request, read to its end within 30 s.
async fn call_with(
    d: &FakeDaytona,
    key: Option<&str>,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    body: Option<&Value>,
) -> Answer {
    let body = body.map(|b| serde_json::to_vec(b).unwrap()).unwrap_or_default();
    let bearer = key.map(|k| format!("Bearer {k}"));
    let mut headers: Vec<(&str, &str)> = bearer.iter().map(|b| ("authorization", b.as_str())).collect();
    headers.extend_from_slice(extra);
    headers.push(("content-type", "application/json"));
    http::request(d.addr(), method, path, &headers, body, Duration::from_secs(30)).await
}

async fn call(d: &FakeDaytona, method: &str, path: &str, body: Option<&Value>) -> Answer {
    call_with(d, Some(KEY), method, path, &[], body).await
}

async fn create(d: &FakeDaytona, body: Value) -> Value {
    let a = call(d, "POST", "/api/sandbox", Some(&body)).await;
    assert_eq!(a.status, 200, "create: {}", String::from_utf8_lossy(&a.body));
    a.json()
}

/// Poll `f` every 50 ms until it holds, at most `within`; how long it took.
async fn until(within: Duration, what: &str, mut f: impl AsyncFnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    loop {
        if f().await {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn fnv1a(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for x in b {
        h ^= *x as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// A `labels` query for `{key: value}` whose shape trails by `mult` lags.
fn shape(value: &str, mult: u64) -> String {
    (0..1000)
        .map(|i| format!(r#"{{"k{i}":"{value}"}}"#))
        .find(|q| 1 + fnv1a(q.as_bytes()) % 3 == mult)
        .unwrap()
}

fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_the_key_is_refused_in_the_envelope() {
    let Some(d) = fake("a_request_without_the_key_is_refused_in_the_envelope", |_| {}).await else {
        return;
    };
    for (key, path) in [
        (None, "/api/sandbox"),
        (Some("wrong"), "/api/sandbox"),
        (None, "/toolbox/x/version"),
    ] {
        let a = call_with(&d, key, "GET", path, &[], None).await;
        assert_eq!(a.status, 401, "{path}");
        let e = a.json();
        assert_eq!(e["statusCode"], 401);
        assert_eq!(e["code"], "UNAUTHORIZED");
        for f in ["message", "source", "path", "timestamp", "method"] {
            assert!(e[f].is_string(), "{f} in {e}");
        }
        assert_eq!(e["path"], path);
    }
    let a = call(&d, "GET", "/api/sandbox/nope", None).await;
    assert_eq!((a.status, a.json()["code"].clone()), (404, json!("SANDBOX_NOT_FOUND")));
    assert_eq!(a.json()["source"], "DAYTONA_API");
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttle_and_fail_next_answer_as_told() {
    let Some(d) = fake("throttle_and_fail_next_answer_as_told", |_| {}).await else {
        return;
    };
    d.throttle(2);
    for _ in 0..2 {
        let a = call(&d, "GET", "/api/sandbox", None).await;
        assert_eq!(a.status, 429);
        assert_eq!(a.header("retry-after"), Some("1"));
        assert!(
            a.header("x-ratelimit-remaining-authenticated").is_some(),
            "{:?}",
            a.headers
        );
        assert_eq!(a.json()["code"], "RATE_LIMIT_EXCEEDED");
    }
    assert_eq!(call(&d, "GET", "/api/sandbox", None).await.status, 200);
    // throttle sets the count left (it does not add to it): the second call replaces the
    // first, and 0 ends a throttle.
    d.throttle(5);
    d.throttle(1);
    assert_eq!(call(&d, "GET", "/api/sandbox", None).await.status, 429);
    assert_eq!(call(&d, "GET", "/api/sandbox", None).await.status, 200);
    d.throttle(3);
    d.throttle(0);
    assert_eq!(call(&d, "GET", "/api/sandbox", None).await.status, 200);
    d.fail_next(503, "SERVICE_UNAVAILABLE", "maintenance", 1);
    let a = call(&d, "GET", "/api/sandbox", None).await;
    assert_eq!((a.status, a.json()["message"].clone()), (503, json!("maintenance")));
    assert_eq!(call(&d, "GET", "/api/sandbox", None).await.status, 200);
    d.shutdown().await;
}

/// How many of this machine's processes have `pattern` in their command line (a box's
/// processes are this machine's, in namespaces of their own).
fn processes_with(pattern: &str) -> usize {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
                .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
                .filter(|c| String::from_utf8_lossy(c).replace('\0', " ").contains(pattern))
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_answer_is_lost_still_made_its_sandbox() {
    let Some(d) = fake("a_create_whose_answer_is_lost_still_made_its_sandbox", |_| {}).await else {
        return;
    };
    let e = d.fail_after_next_create(200).unwrap_err();
    assert!(e.contains("fail_after_next_create") && e.contains("200"), "{e}");
    d.fail_after_next_create(503).unwrap();
    // Another request does not spend it.
    assert_eq!(call(&d, "GET", "/api/sandbox", None).await.status, 200);
    let a = call(&d, "POST", "/api/sandbox", Some(&json!({"name": "lost"}))).await;
    let body = a.json();
    assert_eq!(
        (a.status, &body["statusCode"], &body["code"], &body["source"]),
        (503, &json!(503), &json!("SERVICE_UNAVAILABLE"), &json!("DAYTONA_API")),
        "{body}"
    );
    // The sandbox was made all the same, and started.
    let got = call(&d, "GET", "/api/sandbox/lost", None).await;
    assert_eq!((got.status, got.json()["state"].clone()), (200, json!("started")));
    assert_eq!(d.sandboxes().len(), 1);
    // Spent: the next create is answered.
    create(&d, json!({"name": "answered"})).await;
    // A refused create spends it too, answering its own refusal.
    d.fail_after_next_create(504).unwrap();
    let a = call(&d, "POST", "/api/sandbox", Some(&json!({"cpu": 2}))).await;
    assert_eq!(a.status, 400, "{}", String::from_utf8_lossy(&a.body));
    create(&d, json!({"name": "after"})).await;
    assert_eq!(d.sandboxes().len(), 3);
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_is_soft_until_its_lag_and_every_answer_has_a_desired_state() {
    let lag = Duration::from_millis(1500);
    let Some(d) = fake(
        "a_delete_is_soft_until_its_lag_and_every_answer_has_a_desired_state",
        |o| o.delete_lag = lag,
    )
    .await
    else {
        return;
    };
    let desired = |v: &Value| (v["state"].clone(), v["desiredState"].clone());
    let sb = create(&d, json!({"name": "soft", "autoStopInterval": 0})).await;
    let id = sb["id"].as_str().unwrap().to_string();
    let api = |p: &str| format!("/api/sandbox/{id}{p}");
    assert_eq!(desired(&sb), (json!("started"), json!("started")));
    let a = call(&d, "POST", &api("/stop"), None).await.json();
    assert_eq!(desired(&a), (json!("stopped"), json!("stopped")));
    let a = call(&d, "POST", &api("/archive"), None).await.json();
    assert_eq!(desired(&a), (json!("archived"), json!("archived")));
    let a = call(&d, "POST", &api("/start"), None).await.json();
    assert_eq!(desired(&a), (json!("started"), json!("started")));
    tokio::time::sleep(Duration::from_millis(300 * 3)).await;
    let listed = call(&d, "GET", "/api/sandbox", None).await.json();
    assert_eq!(desired(&listed["items"][0]), (json!("started"), json!("started")));
    // A program in the box, to see the delete end it.
    let mark = format!("sleep 31{}", std::process::id() % 1000);
    let a = call(
        &d,
        "POST",
        &format!("/toolbox/{id}/process/execute"),
        Some(&json!({"command": format!("nohup {mark} >/dev/null 2>&1 &")})),
    )
    .await;
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
    until(Duration::from_secs(5), "the program in the box", async || {
        processes_with(&mark) > 0
    })
    .await;

    // The delete answers at once: the record renamed, destroying, destroyed desired.
    let t0 = Instant::now();
    let a = call(&d, "DELETE", &api(""), None).await;
    assert_eq!(a.status, 200);
    let del = a.json();
    assert_eq!(del["id"], id.as_str());
    assert_eq!(desired(&del), (json!("destroying"), json!("destroyed")));
    let renamed = del["name"].as_str().unwrap().to_string();
    let ms = renamed
        .strip_prefix("DESTROYED_soft_")
        .and_then(|ms| ms.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("the deleted sandbox's name {renamed:?}"));
    assert!(ms > 1_700_000_000_000, "{renamed}");
    // Read by id, the record is there; its old name is free at once.
    let got = call(&d, "GET", &api(""), None).await;
    assert_eq!(got.status, 200);
    assert_eq!(
        (desired(&got.json()), got.json()["name"].clone()),
        ((json!("destroying"), json!("destroyed")), json!(renamed))
    );
    let by_name = call(&d, "GET", "/api/sandbox/soft", None).await;
    assert_eq!(
        (by_name.status, by_name.json()["code"].clone()),
        (404, json!("SANDBOX_NOT_FOUND"))
    );
    let again = create(&d, json!({"name": "soft"})).await;
    assert_ne!(again["id"], id.as_str());
    // A second delete, or any lifecycle change, while it is pending: 409.
    for (m, p) in [
        ("DELETE", ""),
        ("POST", "/stop"),
        ("POST", "/start"),
        ("POST", "/archive"),
    ] {
        let a = call(&d, m, &api(p), None).await;
        let body = a.json();
        assert_eq!(
            (a.status, &body["code"], &body["message"]),
            (409, &json!("CONFLICT"), &json!("Sandbox state change in progress")),
            "{m} {p}: {body}"
        );
    }
    // Its toolbox is gone with its box, whose programs end at once.
    let a = call(
        &d,
        "POST",
        &format!("/toolbox/{id}/process/execute"),
        Some(&json!({"command": "true"})),
    )
    .await;
    assert_eq!(a.status, 400, "{}", String::from_utf8_lossy(&a.body));
    until(Duration::from_secs(5), "the box's end", async || {
        processes_with(&mark) == 0
    })
    .await;
    assert!(
        t0.elapsed() < lag,
        "the box ended only after the lag: {:?}",
        t0.elapsed()
    );
    let view = d
        .sandboxes()
        .into_iter()
        .find(|v| v.id == id)
        .expect("the pending record");
    assert_eq!(
        (view.state.as_str(), view.desired_state.as_str(), view.name.as_str()),
        ("destroying", "destroyed", renamed.as_str())
    );
    // After the lag: destroyed, 404, gone from the fake's sandboxes.
    until(Duration::from_secs(10), "the destroy", async || {
        call(&d, "GET", &api(""), None).await.status == 404
    })
    .await;
    assert!(
        t0.elapsed() >= lag,
        "destroyed after {:?}, before the lag",
        t0.elapsed()
    );
    assert!(d.sandboxes().iter().all(|v| v.id != id), "{:?}", d.sandboxes());
    assert_eq!(call(&d, "DELETE", &api(""), None).await.status, 404);
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_label_index_trails_each_query_shape_on_its_own_schedule() {
    // No delete lag: a delete destroys before it answers (the soft delete has its own test).
    let Some(d) = fake("the_label_index_trails_each_query_shape_on_its_own_schedule", |o| {
        o.delete_lag = Duration::ZERO
    })
    .await
    else {
        return;
    };
    let lag = Duration::from_millis(300);
    let (fast, slow) = (shape("v", 1), shape("v", 3));
    let key_of = |q: &str| {
        serde_json::from_str::<Value>(q)
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .next()
            .unwrap()
            .clone()
    };
    let labels = json!({key_of(&fast): "v", key_of(&slow): "v"});
    let t0 = Instant::now();
    let sb = create(&d, json!({"labels": labels})).await;
    let id = sb["id"].as_str().unwrap().to_string();
    let seen = async |q: &str| -> bool {
        let a = call(&d, "GET", &format!("/api/sandbox?labels={}", enc(q)), None).await;
        assert_eq!(a.status, 200);
        a.json()["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["id"] == id.as_str())
    };
    until(Duration::from_secs(5), "the fast shape", async || seen(&fast).await).await;
    let fast_at = t0.elapsed();
    assert!(
        fast_at >= lag,
        "the fast shape saw the sandbox after {fast_at:?}, before the lag"
    );
    assert!(
        !seen(&slow).await || t0.elapsed() >= lag * 3,
        "the slow shape saw it with the fast one"
    );
    until(Duration::from_secs(5), "the slow shape", async || seen(&slow).await).await;
    assert!(
        t0.elapsed() >= lag * 3,
        "the slow shape saw it after {:?}",
        t0.elapsed()
    );
    assert!(d.list_queries().contains(&Some(fast.clone())), "{:?}", d.list_queries());
    // A label change trails too: the old value is still found, the new one not yet.
    let t1 = Instant::now();
    let a = call(
        &d,
        "PUT",
        &format!("/api/sandbox/{id}/labels"),
        Some(&json!({"labels": {key_of(&fast): "w"}})),
    )
    .await;
    assert_eq!((a.status, a.json()["labels"][key_of(&fast)].clone()), (200, json!("w")));
    let fast_w = fast.replace("\"v\"", "\"w\"");
    let mult = 1 + fnv1a(fast_w.as_bytes()) % 3;
    if t1.elapsed() < lag {
        assert!(seen(&fast).await, "the index dropped the old labels before its lag");
    }
    until(Duration::from_secs(5), "the new label", async || seen(&fast_w).await).await;
    assert!(
        t1.elapsed() >= lag * mult as u32,
        "the new label showed after {:?}",
        t1.elapsed()
    );
    // Paging: one a page, the cursor to the next, null at the end.
    create(&d, json!({})).await;
    tokio::time::sleep(lag * 3).await;
    let a = call(&d, "GET", "/api/sandbox?limit=1", None).await.json();
    assert_eq!(a["items"].as_array().unwrap().len(), 1);
    let cursor = a["nextCursor"].as_str().expect("a next cursor").to_string();
    let b = call(
        &d,
        "GET",
        &format!("/api/sandbox?limit=1&cursor={}", enc(&cursor)),
        None,
    )
    .await
    .json();
    assert_eq!(b["items"].as_array().unwrap().len(), 1);
    assert_ne!(a["items"][0]["id"], b["items"][0]["id"]);
    assert!(b["nextCursor"].is_null(), "{b}");
    assert_eq!(call(&d, "GET", "/api/sandbox?limit=201", None).await.status, 400);
    // A destroyed sandbox leaves the index at once.
    assert_eq!(
        call(&d, "DELETE", &format!("/api/sandbox/{id}"), None).await.json()["state"],
        "destroyed"
    );
    assert!(!seen(&fast_w).await, "a destroyed sandbox is still listed");
    assert_eq!(call(&d, "GET", &format!("/api/sandbox/{id}"), None).await.status, 404);
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_ends_a_stopped_sandbox_and_auto_delete_follows_a_stop() {
    let minute = Duration::from_millis(500);
    let Some(d) = fake("ttl_ends_a_stopped_sandbox_and_auto_delete_follows_a_stop", |o| {
        o.minute = minute
    })
    .await
    else {
        return;
    };
    // ttl: 2 of the API's minutes from creation, whatever the state.
    let sb = create(&d, json!({"ttlMinutes": 2, "autoStopInterval": 0})).await;
    let id = sb["id"].as_str().unwrap().to_string();
    let created: jiff::Timestamp = sb["createdAt"].as_str().unwrap().parse().unwrap();
    let ends: jiff::Timestamp = sb["autoDestroyAt"].as_str().unwrap().parse().unwrap();
    assert_eq!(ends.duration_since(created), jiff::SignedDuration::from_millis(1000));
    let t0 = Instant::now();
    assert_eq!(
        call(&d, "POST", &format!("/api/sandbox/{id}/stop"), None).await.json()["state"],
        "stopped"
    );
    let took = until(Duration::from_secs(10), "ttl's end", async || {
        call(&d, "GET", &format!("/api/sandbox/{id}"), None).await.status == 404
    })
    .await;
    assert!(
        t0.elapsed() >= Duration::from_millis(800),
        "ended after {took:?}, before its ttl"
    );
    assert!(d.sandboxes().is_empty(), "{:?}", d.sandboxes());
    // autoDelete 1: destroyed a minute after its stop; 0: at once.
    let sb = create(&d, json!({"autoDeleteInterval": 1, "autoStopInterval": 0})).await;
    let id = sb["id"].as_str().unwrap().to_string();
    call(&d, "POST", &format!("/api/sandbox/{id}/stop"), None).await;
    let t0 = Instant::now();
    until(Duration::from_secs(10), "autoDelete", async || {
        call(&d, "GET", &format!("/api/sandbox/{id}"), None).await.status == 404
    })
    .await;
    assert!(
        t0.elapsed() >= minute - Duration::from_millis(100),
        "deleted after {:?}",
        t0.elapsed()
    );
    // autoDelete 0 is an ephemeral sandbox: its stop is a delete, answered at once, the
    // record destroying until the delete lag (1 s) has passed.
    let sb = create(&d, json!({"autoDeleteInterval": 0})).await;
    let id = sb["id"].as_str().unwrap().to_string();
    let a = call(&d, "POST", &format!("/api/sandbox/{id}/stop"), None).await.json();
    assert_eq!(
        (&a["state"], &a["desiredState"]),
        (&json!("destroying"), &json!("destroyed"))
    );
    until(Duration::from_secs(10), "the ephemeral sandbox's destroy", async || {
        call(&d, "GET", &format!("/api/sandbox/{id}"), None).await.status == 404
    })
    .await;
    // autoStop 1: stopped after a minute with no toolbox request.
    let sb = create(&d, json!({"autoStopInterval": 1})).await;
    let id = sb["id"].as_str().unwrap().to_string();
    until(Duration::from_secs(10), "autoStop", async || {
        call(&d, "GET", &format!("/api/sandbox/{id}"), None).await.json()["state"] == "stopped"
    })
    .await;
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_set_later_counts_from_its_request() {
    let minute = Duration::from_millis(500);
    let Some(d) = fake("a_ttl_set_later_counts_from_its_request", |o| o.minute = minute).await else {
        return;
    };
    let sb = create(&d, json!({"ttlMinutes": 4, "autoStopInterval": 0})).await;
    let id = sb["id"].as_str().unwrap().to_string();
    let time = |v: &Value, f: &str| v[f].as_str().unwrap().parse::<jiff::Timestamp>().unwrap();
    assert_eq!(
        time(&sb, "autoDestroyAt").duration_since(time(&sb, "createdAt")),
        jiff::SignedDuration::from_millis(2000)
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    // The API re-anchors a ttl set later at the request (`set_ttl`: "re-anchored from the
    // current time"): 4 minutes from now, not from the creation.
    let asked = jiff::Timestamp::now();
    let t0 = Instant::now();
    let a = call(&d, "POST", &format!("/api/sandbox/{id}/ttl/4"), None).await;
    assert_eq!(a.status, 200);
    let ends = time(&a.json(), "autoDestroyAt");
    assert!(
        ends >= asked + jiff::SignedDuration::from_millis(1999),
        "autoDestroyAt {ends} is not 4 minutes after the request at {asked}"
    );
    assert!(
        ends <= jiff::Timestamp::now() + jiff::SignedDuration::from_millis(2000),
        "{ends}"
    );
    until(Duration::from_secs(10), "the ttl's end", async || {
        call(&d, "GET", &format!("/api/sandbox/{id}"), None).await.status == 404
    })
    .await;
    assert!(
        t0.elapsed() >= Duration::from_millis(1900),
        "ended {:?} after the ttl was set to 2 s from then",
        t0.elapsed()
    );
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_are_validated_as_the_api_does() {
    let Some(d) = fake("creates_are_validated_as_the_api_does", |o| {
        o.network_unenforced = false
    })
    .await
    else {
        return;
    };
    let refused = async |body: Value| {
        let a = call(&d, "POST", "/api/sandbox", Some(&body)).await;
        (a.status, a.json()["message"].as_str().unwrap_or("").to_string())
    };
    let (st, msg) = refused(json!({"snapshot": "daytonaio/sandbox:0.5.0", "cpu": 2})).await;
    assert_eq!(
        (st, msg.as_str()),
        (400, "Cannot specify Sandbox resources when using a snapshot")
    );
    assert_eq!(refused(json!({"snapshot": "no-such"})).await.0, 400);
    assert_eq!(refused(json!({"domainAllowList": "not a domain"})).await.0, 400);
    assert_eq!(refused(json!({"networkAllowList": "10.0.0.0/8,bad"})).await.0, 400);
    let sb = create(
        &d,
        json!({"name": "taken", "networkBlockAll": true, "domainAllowList": "*.pypi.org,github.com"}),
    )
    .await;
    assert_eq!(refused(json!({"name": "taken"})).await.0, 409);
    assert_eq!(sb["networkBlockAll"], true);
    assert_eq!(sb["domainAllowList"], "*.pypi.org,github.com");
    // networkBlockAll is enforced: the box's network has loopback alone.
    let id = sb["id"].as_str().unwrap();
    let a = call(
        &d,
        "POST",
        &format!("/toolbox/{id}/process/execute"),
        Some(&json!({"command": "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"})),
    )
    .await;
    assert_eq!(a.json()["result"], "lo\n", "{}", a.json());
    let snap = call(&d, "GET", "/api/snapshots/daytonaio%2Fsandbox:0.5.0", None).await;
    assert_eq!((snap.status, snap.json()["cpu"].clone()), (200, json!(1)));
    d.shutdown().await;
    // An organization without network settings: the create succeeds, reads back open.
    let Some(d) = fake("creates_are_validated_as_the_api_does", |o| o.network_unenforced = true).await else {
        return;
    };
    let sb = create(&d, json!({"networkBlockAll": true, "domainAllowList": "github.com"})).await;
    assert_eq!(sb["networkBlockAll"], false);
    assert!(sb.get("domainAllowList").is_none(), "{sb}");
    let id = sb["id"].as_str().unwrap();
    let a = call(
        &d,
        "POST",
        &format!("/api/sandbox/{id}/network-settings"),
        Some(&json!({"networkBlockAll": true})),
    )
    .await;
    assert_eq!(a.status, 400);
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_download_names_a_missing_file_in_an_error_part() {
    let Some(d) = fake("a_bulk_download_names_a_missing_file_in_an_error_part", |_| {}).await else {
        return;
    };
    let id = create(&d, json!({})).await["id"].as_str().unwrap().to_string();
    call(
        &d,
        "POST",
        &format!("/toolbox/{id}/process/execute"),
        Some(&json!({"command": "printf 'a\\0b' > /tmp/there"})),
    )
    .await;
    let a = call(
        &d,
        "POST",
        &format!("/toolbox/{id}/files/bulk-download"),
        Some(&json!({"paths": ["/tmp/there", "/tmp/missing"]})),
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(
        a.header("content-type"),
        Some("multipart/form-data; boundary=DAYTONA-FILE-BOUNDARY")
    );
    let body = a.body;
    let text = String::from_utf8_lossy(&body);
    assert!(body.windows(3).any(|w| w == b"a\0b"), "{text}");
    assert!(text.contains("name=\"file\"; filename=\"/tmp/there\""), "{text}");
    assert!(text.contains("name=\"error\"; filename=\"/tmp/missing\""), "{text}");
    assert!(text.contains("\"code\":\"FILE_NOT_FOUND\""), "{text}");
    assert!(text.ends_with("--DAYTONA-FILE-BOUNDARY--\r\n"), "{text}");
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_toolbox_answers_nothing_until_released() {
    let Some(d) = fake("a_hung_toolbox_answers_nothing_until_released", |_| {}).await else {
        return;
    };
    let id = create(&d, json!({})).await["id"].as_str().unwrap().to_string();
    d.hang_toolbox(true);
    let d = std::sync::Arc::new(d);
    let asking = {
        let (d, id) = (d.clone(), id.clone());
        tokio::spawn(async move { call(&d, "GET", &format!("/toolbox/{id}/version"), None).await.status })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!asking.is_finished(), "a hung toolbox answered");
    // The API still answers.
    assert_eq!(call(&d, "GET", &format!("/api/sandbox/{id}"), None).await.status, 200);
    d.hang_toolbox(false);
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), asking)
            .await
            .unwrap()
            .unwrap(),
        200
    );
    // A stopped sandbox's toolbox: 400 from the proxy.
    call(&d, "POST", &format!("/api/sandbox/{id}/stop"), None).await;
    let a = call(&d, "GET", &format!("/toolbox/{id}/version"), None).await;
    assert_eq!((a.status, a.json()["source"].clone()), (400, json!("DAYTONA_PROXY")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_link_forwards_with_its_token_alone() {
    let Some(d) = fake("a_preview_link_forwards_with_its_token_alone", |_| {}).await else {
        return;
    };
    let id = create(&d, json!({})).await["id"].as_str().unwrap().to_string();
    // The box shares this machine's network: a listener here is what its port would be.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).into_owned();
                let line = head.lines().next().unwrap_or("").to_string();
                let leaked = head.to_lowercase().contains("x-daytona-preview-token");
                let body = format!("{line} leaked={leaked}");
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    let link = call(&d, "GET", &format!("/api/sandbox/{id}/ports/{port}/preview-url"), None)
        .await
        .json();
    let token = link["token"].as_str().unwrap().to_string();
    let path = link["url"]
        .as_str()
        .unwrap()
        .split_once(&d.addr().to_string())
        .unwrap()
        .1
        .to_string();
    assert_eq!(path, format!("/preview/{id}/{port}"));
    assert_eq!(
        call_with(&d, None, "GET", &format!("{path}/x"), &[], None).await.status,
        401
    );
    assert_eq!(
        call_with(
            &d,
            None,
            "GET",
            &format!("{path}/x"),
            &[("X-Daytona-Preview-Token", "wrong")],
            None
        )
        .await
        .status,
        403
    );
    let a = call_with(
        &d,
        None,
        "GET",
        &format!("{path}/x/y?q=1"),
        &[("X-Daytona-Preview-Token", &token)],
        None,
    )
    .await;
    assert_eq!(
        (a.status, String::from_utf8_lossy(&a.body).into_owned()),
        (200, "GET /x/y?q=1 HTTP/1.1 leaked=false".to_string())
    );
    d.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_keep_their_shell_and_execute_kills_its_group_at_the_timeout() {
    let Some(d) = fake(
        "sessions_keep_their_shell_and_execute_kills_its_group_at_the_timeout",
        |_| {},
    )
    .await
    else {
        return;
    };
    let id = create(&d, json!({})).await["id"].as_str().unwrap().to_string();
    let tb = |p: &str| format!("/toolbox/{id}{p}");
    let exec = async |cmd: &str| {
        call(&d, "POST", &tb("/process/execute"), Some(&json!({"command": cmd})))
            .await
            .json()
    };
    // A timeout: 408, and the command's children are gone with it.
    let a = call(
        &d,
        "POST",
        &tb("/process/execute"),
        Some(&json!({"command": "sleep 97 & sleep 98", "timeout": 1})),
    )
    .await;
    assert_eq!(
        (a.status, a.json()["code"].clone()),
        (408, json!("PROCESS_EXECUTION_TIMEOUT"))
    );
    let count =
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c 'sleep 9[78]' || true";
    assert_eq!(
        exec(count).await["result"],
        "0\n",
        "the timed-out command's group outlived it"
    );
    // A session: cd and exports persist; a daemonized program outlives its command.
    assert_eq!(
        call(&d, "POST", &tb("/process/session"), Some(&json!({"sessionId": "s"})))
            .await
            .status,
        201
    );
    assert_eq!(
        call(&d, "POST", &tb("/process/session"), Some(&json!({"sessionId": "s"})))
            .await
            .status,
        409
    );
    let run = async |cmd: &str, run_async: bool| {
        call(
            &d,
            "POST",
            &tb("/process/session/s/exec"),
            Some(&json!({"command": cmd, "runAsync": run_async})),
        )
        .await
    };
    assert_eq!(run("cd /tmp && export V=kept", false).await.json()["exitCode"], 0);
    let a = run("nohup sleep 96 > /dev/null 2>&1 & echo started", false)
        .await
        .json();
    assert_eq!(
        (a["exitCode"].clone(), a["stdout"].clone()),
        (json!(0), json!("started\n"))
    );
    let a = run("echo $V $(pwd); echo warn >&2; false", false).await.json();
    assert_eq!(a["stdout"], "kept /tmp\n");
    assert_eq!(a["stderr"], "warn\n");
    assert_eq!(a["exitCode"], 1);
    // Each line labelled with its stream; the two streams' order is as their pipes deliver.
    let mut lines: Vec<&str> = a["output"].as_str().unwrap().lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        ["\u{1}\u{1}\u{1}kept /tmp", "\u{2}\u{2}\u{2}warn"],
        "{}",
        a["output"]
    );
    let count96 =
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c 'sleep 9[6]' || true";
    assert_eq!(
        exec(count96).await["result"],
        "1\n",
        "the daemonized program ended with its command"
    );
    // An async command: 202, no exit code while it runs, text logs for a caller without the
    // SDK's version.
    let a = run("echo one; sleep 1; echo two", true).await;
    assert_eq!(a.status, 202);
    let cid = a.json()["cmdId"].as_str().unwrap().to_string();
    let c = call(&d, "GET", &tb(&format!("/process/session/s/command/{cid}")), None)
        .await
        .json();
    assert!(c.get("exitCode").is_none(), "{c}");
    let logs = tb(&format!("/process/session/s/command/{cid}/logs"));
    until(Duration::from_secs(10), "the async command's end", async || {
        call(&d, "GET", &tb(&format!("/process/session/s/command/{cid}")), None)
            .await
            .json()["exitCode"]
            == 0
    })
    .await;
    let text = call(&d, "GET", &logs, None).await;
    assert!(text.header("content-type").unwrap().starts_with("text/plain"));
    assert_eq!(text.body, b"\x01\x01\x01one\n\x01\x01\x01two\n");
    let j = call_with(
        &d,
        Some(KEY),
        "GET",
        &logs,
        &[("X-Daytona-SDK-Version", "0.226.1")],
        None,
    )
    .await
    .json();
    assert_eq!(j["stdout"], "one\ntwo\n");
    // Input after the end: 410.
    let a = call(
        &d,
        "POST",
        &tb(&format!("/process/session/s/command/{cid}/input")),
        Some(&json!({"data": "x"})),
    )
    .await;
    assert_eq!(a.status, 410);
    // Deleting the session ends its running command.
    run("sleep 95", true).await;
    assert_eq!(call(&d, "DELETE", &tb("/process/session/s"), None).await.status, 204);
    assert_eq!(call(&d, "GET", &tb("/process/session/s"), None).await.status, 404);
    let count95 =
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c 'sleep 9[5]' || true";
    assert_eq!(
        exec(count95).await["result"],
        "0\n",
        "a deleted session's command runs on"
    );
    d.shutdown().await;
}

/// Volumes: one is mountable only once ready; a create naming a missing volume, a relative
/// mount path or one path twice is refused making nothing; a volume a sandbox mounts is not
/// deleted; a deleted volume's name is free again, empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_are_mounted_once_ready_and_kept_while_mounted() {
    let test = "volumes_are_mounted_once_ready_and_kept_while_mounted";
    let Some(d) = fake(test, |o| o.volume_lag = Duration::from_millis(800)).await else {
        return;
    };
    let v = call(&d, "POST", "/api/volumes", Some(&json!({"name": "v1"}))).await;
    assert_eq!(v.status, 200, "{}", String::from_utf8_lossy(&v.body));
    let v = v.json();
    assert_eq!(v["state"], "pending_create");
    let id = v["id"].as_str().unwrap().to_string();
    let mount = |path: &str| json!({"volumes": [{"volumeId": "v1", "mountPath": path}]});
    let early = call(&d, "POST", "/api/sandbox", Some(&mount("/data"))).await;
    assert_eq!(early.status, 400, "{}", String::from_utf8_lossy(&early.body));
    assert!(String::from_utf8_lossy(&early.body).contains("not in a ready state"));
    until(Duration::from_secs(10), "the volume is ready", async || {
        call(&d, "GET", &format!("/api/volumes/{id}"), None).await.json()["state"] == "ready"
    })
    .await;
    for (body, why) in [
        (
            json!({"volumes": [{"volumeId": "none", "mountPath": "/data"}]}),
            "Volume none not found",
        ),
        (mount("data"), "an absolute path"),
        (
            json!({"volumes": [{"volumeId": "v1", "mountPath": "/a"}, {"volumeId": id, "mountPath": "/a"}]}),
            "given twice",
        ),
    ] {
        let a = call(&d, "POST", "/api/sandbox", Some(&body)).await;
        assert!(
            a.status == 400 || a.status == 404,
            "{body}: {}",
            String::from_utf8_lossy(&a.body)
        );
        assert!(
            String::from_utf8_lossy(&a.body).contains(why),
            "{body}: {}",
            String::from_utf8_lossy(&a.body)
        );
    }
    assert!(d.sandboxes().is_empty(), "a refused create made a sandbox");
    let sb = create(&d, mount("/data")).await;
    assert_eq!(sb["volumes"], json!([{"volumeId": id, "mountPath": "/data"}]));
    std::fs::write(d.volume_dir("v1").unwrap().join("f"), "x").unwrap();
    let busy = call(&d, "DELETE", &format!("/api/volumes/{id}"), None).await;
    assert_eq!(busy.status, 409, "{}", String::from_utf8_lossy(&busy.body));
    let sid = sb["id"].as_str().unwrap().to_string();
    assert_eq!(
        call(&d, "DELETE", &format!("/api/sandbox/{sid}"), None).await.status,
        200
    );
    assert_eq!(
        call(&d, "DELETE", &format!("/api/volumes/{id}"), None).await.status,
        200
    );
    assert_eq!(call(&d, "GET", "/api/volumes/by-name/v1", None).await.status, 404);
    assert!(d.volume_dir("v1").is_none());
    let again = call(&d, "POST", "/api/volumes", Some(&json!({"name": "v1"}))).await;
    assert_eq!(again.status, 200);
    assert!(
        std::fs::read_dir(d.volume_dir("v1").unwrap()).unwrap().next().is_none(),
        "a volume made again under a deleted one's name starts empty"
    );
    d.shutdown().await;
}

//! The service over real local boxes, through a real HTTP client: every failure in the one
//! shape, a box made, run in and ended, ownership between keys and each key's limits, and the
//! OpenAPI document the server serves being the one in the repository.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentbox_server::{Keys, Limits};
use serde_json::{Value, json};
mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_failure_is_one_shape_with_one_status_per_code() {
    let keys = Arc::new(Keys::in_memory().unwrap());
    let (_, key) = keys.add("k", false, local()).await.unwrap();
    let s = start(keys, 4096).await;
    let k = Some(key.as_str());
    let (st, b) = call(&s, None, "GET", "/v1/boxes", None).await;
    assert_eq!((st, code_of(&b)), (401, "unauthenticated"), "{b}");
    let (st, b) = call(&s, Some("abk_not-a-key"), "GET", "/v1/boxes", None).await;
    assert_eq!((st, code_of(&b)), (401, "unauthenticated"), "{b}");
    let (st, b) = call(&s, k, "GET", "/v1/no-such-route", None).await;
    assert_eq!((st, code_of(&b)), (404, "not_found"), "{b}");
    let (st, b) = call(&s, k, "PUT", "/v1/boxes", None).await;
    assert_eq!((st, code_of(&b)), (404, "not_found"), "{b}");
    assert!(
        b["message"].as_str().unwrap().contains("GET"),
        "the methods it takes: {b}"
    );
    let (st, b, _) = call_with(&s, k, "POST", "/v1/boxes", Some(b"{\"spec\": ".to_vec())).await;
    assert_eq!((st, code_of(&b)), (400, "invalid"), "{b}");
    let (st, b) = call(
        &s,
        k,
        "POST",
        "/v1/boxes",
        Some(json!({"spec": spec(60_000), "colour": "red"})),
    )
    .await;
    assert_eq!((st, code_of(&b)), (400, "invalid"), "{b}");
    assert!(
        b["message"].as_str().unwrap().contains("colour"),
        "names the field: {b}"
    );
    let (st, b) = call(
        &s,
        k,
        "POST",
        "/v1/boxes",
        Some(json!({"spec": {"max_lifetime_ms": 1000, "cpus": "many"}})),
    )
    .await;
    assert_eq!((st, code_of(&b)), (400, "invalid"), "{b}");
    assert!(b["message"].as_str().unwrap().contains("cpus"), "names the field: {b}");
    let big = format!(
        "{{\"spec\": {{\"max_lifetime_ms\": 1000, \"image\": \"{}\"}}}}",
        "x".repeat(8192)
    );
    let (st, b, _) = call_with(&s, k, "POST", "/v1/boxes", Some(big.into_bytes())).await;
    assert_eq!((st, code_of(&b)), (413, "too_large"), "{b}");
    let (st, b) = call(&s, k, "GET", "/v1/boxes/no-colon", None).await;
    assert_eq!((st, code_of(&b)), (400, "invalid"), "{b}");
    let (st, b) = call(&s, k, "GET", "/v1/boxes/local:0123456789abcdef", None).await;
    assert_eq!((st, code_of(&b)), (404, "not_found"), "{b}");
    let (st, b) = call(
        &s,
        k,
        "POST",
        "/v1/boxes",
        Some(json!({"provider": "teleport", "spec": spec(1000)})),
    )
    .await;
    assert_eq!((st, code_of(&b)), (400, "invalid"), "{b}");
    assert!(
        b["message"].as_str().unwrap().contains("local"),
        "lists the providers: {b}"
    );
    let (st, b) = call(&s, None, "GET", "/healthz", None).await;
    assert_eq!((st, b), (200, json!({"status": "ok"})));
    let (st, b) = call(&s, None, "GET", "/readyz", None).await;
    assert_eq!((st, &b["status"]), (200, &json!("ready")), "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_box_is_made_run_in_and_ended() {
    let keys = Arc::new(Keys::in_memory().unwrap());
    let (info, key) = keys.add("k", false, local()).await.unwrap();
    let s = start(keys, 1 << 20).await;
    let k = Some(key.as_str());
    let (st, providers) = call(&s, k, "GET", "/v1/providers", None).await;
    assert_eq!(st, 200, "{providers}");
    let local = providers
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "local")
        .expect("local is listed");
    assert_eq!(
        (&local["available"], &local["default"]),
        (&json!(true), &json!(true)),
        "{local}"
    );
    assert_eq!(local["honours"]["live_processes"], json!(true), "{local}");

    let (st, made) = call(
        &s,
        k,
        "POST",
        "/v1/boxes",
        Some(json!({"spec": {"max_lifetime_ms": 600_000, "env": {"MODE": "served"}}})),
    )
    .await;
    assert_eq!(st, 201, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("local:"), "{made}");
    assert_eq!(
        made["labels"][agentbox_server::OWNER_LABEL],
        json!(info.id),
        "owned by the key's id"
    );
    assert!(!made.to_string().contains(&key), "the key itself is nowhere in a box");
    let (st, got) = call(&s, k, "GET", &format!("/v1/boxes/{id}"), None).await;
    assert_eq!((st, &got["status"]), (200, &json!("running")), "{got}");
    let (st, listed) = call(&s, k, "GET", "/v1/boxes", None).await;
    assert_eq!(st, 200);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");

    let exec = format!("/v1/boxes/{id}/exec");
    let (st, r) = call(
        &s,
        k,
        "POST",
        &exec,
        Some(json!({"argv": ["sh", "-c", "echo $MODE; echo oops >&2; exit 3"]})),
    )
    .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(
        (&r["exit_code"], &r["stdout"], &r["stderr"]),
        (&json!(3), &json!("served\n"), &json!("oops\n"))
    );
    let (_, r) = call(
        &s,
        k,
        "POST",
        &exec,
        Some(json!({"command": "tr a-z A-Z", "stdin": "quiet"})),
    )
    .await;
    assert_eq!(r["stdout"], json!("QUIET"), "{r}");
    let (_, r) = call(
        &s,
        k,
        "POST",
        &exec,
        Some(json!({"command": "pwd", "cwd": "sub/dir", "env": {"X": "1"}})),
    )
    .await;
    assert!(
        r["exit_code"] != json!(0) || r["stdout"].as_str().unwrap().ends_with("sub/dir\n"),
        "{r}"
    );
    let (_, r) = call(
        &s,
        k,
        "POST",
        &exec,
        Some(json!({"command": "seq 1 100000", "max_output": 16})),
    )
    .await;
    assert_eq!(
        (&r["exit_code"], &r["stdout"]),
        (&json!(0), &json!("1\n2\n3\n4\n5\n6\n7\n8\n")),
        "{r}"
    );
    assert!(r["stdout_dropped"].as_u64().unwrap() > 500_000, "the cut is said: {r}");
    let (st, r) = call(
        &s,
        k,
        "POST",
        &exec,
        Some(json!({"command": "sleep 30", "timeout_ms": 300})),
    )
    .await;
    assert_eq!((st, code_of(&r)), (504, "timeout"), "{r}");
    let (st, r) = call(&s, k, "POST", &exec, Some(json!({"argv": ["true"], "command": "true"}))).await;
    assert_eq!((st, code_of(&r)), (400, "invalid"), "{r}");
    let (st, r) = call(&s, k, "POST", &exec, Some(json!({"argv": ["/no/such/program"]}))).await;
    assert!(
        st == 404 || r["exit_code"] == json!(127),
        "a program not found: {st} {r}"
    );

    let (st, gone) = call(&s, k, "DELETE", &format!("/v1/boxes/{id}"), None).await;
    assert_eq!((st, gone), (204, Value::Null));
    let (st, b) = call(&s, k, "GET", &format!("/v1/boxes/{id}"), None).await;
    assert_eq!((st, code_of(&b)), (404, "not_found"), "{b}");
    let (_, listed) = call(&s, k, "GET", "/v1/boxes", None).await;
    assert_eq!(listed, json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reaches_only_its_own_boxes_within_its_limits() {
    let keys = Arc::new(Keys::in_memory().unwrap());
    let (_, a) = keys.add("a", false, local()).await.unwrap();
    let (_, b) = keys.add("b", false, local()).await.unwrap();
    let (_, admin) = keys.add("root", true, Limits::default()).await.unwrap();
    let (_, short) = keys
        .add(
            "short",
            false,
            Limits {
                max_boxes: Some(1),
                max_lifetime: Some(Duration::from_secs(60)),
                providers: Some(vec!["local".into()]),
                requests_per_minute: None,
            },
        )
        .await
        .unwrap();
    let (_, unnamed) = keys.add("unnamed", false, Limits::default()).await.unwrap();
    let (_, docker_only) = keys
        .add(
            "docker-only",
            false,
            Limits {
                providers: Some(vec!["docker".into()]),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let s = start(keys, 1 << 20).await;
    let (st, made) = call(&s, Some(&a), "POST", "/v1/boxes", Some(json!({"spec": spec(600_000)}))).await;
    assert_eq!(st, 201, "{made}");
    let path = format!("/v1/boxes/{}", made["id"].as_str().unwrap());
    // Another key's box is as a box that does not exist, whatever the call.
    for (method, p, body) in [
        ("GET", path.clone(), None),
        ("DELETE", path.clone(), None),
        ("POST", format!("{path}/exec"), Some(json!({"command": "true"}))),
        ("GET", format!("{path}/files?path=x"), None),
        ("GET", format!("{path}/files/list?path=."), None),
        ("POST", format!("{path}/tools/bash"), Some(json!({"command": "true"}))),
        ("GET", format!("{path}/processes"), None),
        ("POST", format!("{path}/processes"), Some(json!({"command": "true"}))),
        ("POST", format!("{path}/sleep"), None),
        ("POST", format!("{path}/wake"), None),
        ("POST", format!("{path}/extend"), Some(json!({"by_ms": 1000}))),
    ] {
        let (st, r) = call(&s, Some(&b), method, &p, body).await;
        assert_eq!((st, code_of(&r)), (404, "not_found"), "{method} {p}: {r}");
    }
    let (_, listed) = call(&s, Some(&b), "GET", "/v1/boxes", None).await;
    assert_eq!(listed, json!([]), "b lists none of a's");
    let (st, _) = call(&s, Some(&admin), "GET", &path, None).await;
    assert_eq!(st, 200, "an admin key reaches every box");
    // Local boxes only: this machine's other providers (its Docker engine) hold other tests' boxes.
    let (_, listed) = call(&s, Some(&admin), "GET", "/v1/boxes?provider=local", None).await;
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    let (st, r) = call(
        &s,
        Some(&a),
        "POST",
        "/v1/boxes",
        Some(json!({"spec": {"max_lifetime_ms": 1000, "labels": {agentbox_server::OWNER_LABEL: "someone"}}})),
    )
    .await;
    assert_eq!((st, code_of(&r)), (400, "invalid"), "no spec names its owner: {r}");

    // A box of a provider the key may not use is as one that does not exist.
    let (st, r) = call(&s, Some(&docker_only), "GET", &path, None).await;
    assert_eq!((st, code_of(&r)), (404, "not_found"), "{r}");
    // Local boxes isolate nothing: a key that does not name them may not use them.
    let (_, plain) = {
        let (st, r) = call(
            &s,
            Some(&unnamed),
            "POST",
            "/v1/boxes",
            Some(json!({"provider": "local", "spec": spec(1000)})),
        )
        .await;
        (st, r)
    };
    assert_eq!(code_of(&plain), "permission_denied", "{plain}");
    assert!(
        plain["message"].as_str().unwrap().contains("isolate nothing"),
        "{plain}"
    );

    // Limits: a lifetime past the key's, a provider it may not use, more boxes than it may own.
    let (st, r) = call(
        &s,
        Some(&short),
        "POST",
        "/v1/boxes",
        Some(json!({"spec": spec(600_000)})),
    )
    .await;
    assert_eq!((st, code_of(&r)), (403, "permission_denied"), "{r}");
    let (st, r) = call(
        &s,
        Some(&docker_only),
        "POST",
        "/v1/boxes",
        Some(json!({"provider": "local", "spec": spec(1000)})),
    )
    .await;
    assert_eq!((st, code_of(&r)), (403, "permission_denied"), "{r}");
    let (st, one) = call(
        &s,
        Some(&short),
        "POST",
        "/v1/boxes",
        Some(json!({"spec": spec(30_000)})),
    )
    .await;
    assert_eq!(st, 201, "{one}");
    let (st, r, retry) = call_with(
        &s,
        Some(&short),
        "POST",
        "/v1/boxes",
        Some(json!({"spec": spec(30_000)}).to_string().into_bytes()),
    )
    .await;
    assert_eq!((st, code_of(&r)), (429, "rate_limited"), "{r}");
    assert!(retry.is_some_and(|s| s.parse::<u64>().is_ok()), "with Retry-After");
    let (st, r) = call(
        &s,
        Some(&short),
        "POST",
        "/v1/boxes/open",
        Some(json!({"name": "n", "spec": spec(30_000)})),
    )
    .await;
    assert_eq!(
        (st, code_of(&r)),
        (429, "rate_limited"),
        "an open at the most makes nothing: {r}"
    );
    for (key, id) in [(&a, &made["id"]), (&short, &one["id"])] {
        let (st, _) = call(
            &s,
            Some(key),
            "DELETE",
            &format!("/v1/boxes/{}", id.as_str().unwrap()),
            None,
        )
        .await;
        assert_eq!(st, 204);
    }
}

/// The document in the repository (`crates/agentbox-server/openapi.json`), which clients are
/// written against. `AGENTBOX_WRITE_OPENAPI=1` writes it anew after a change to the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_openapi_document_is_the_one_in_the_repository() {
    let keys = Arc::new(Keys::in_memory().unwrap());
    let s = start(keys, 1 << 20).await;
    let (st, served) = call(&s, None, "GET", "/v1/openapi.json", None).await;
    assert_eq!(st, 200);
    assert_eq!(served["openapi"], json!("3.1.0"));
    for (path, method) in [
        ("/v1/providers", "get"),
        ("/v1/boxes", "post"),
        ("/v1/boxes", "get"),
        ("/v1/boxes/{id}", "get"),
        ("/v1/boxes/{id}", "delete"),
        ("/v1/boxes/{id}/exec", "post"),
        ("/v1/boxes/{id}/files", "get"),
        ("/v1/boxes/{id}/files", "put"),
        ("/v1/boxes/{id}/files", "delete"),
        ("/v1/boxes/{id}/files/stat", "get"),
        ("/v1/boxes/{id}/files/list", "get"),
        ("/v1/boxes/{id}/files/mkdir", "post"),
        ("/v1/boxes/{id}/files/rename", "post"),
        ("/v1/tools", "get"),
        ("/v1/boxes/open", "post"),
        ("/v1/boxes/{id}/processes", "post"),
        ("/v1/boxes/{id}/processes", "get"),
        ("/v1/boxes/{id}/processes/{handle}", "delete"),
        ("/v1/boxes/{id}/processes/{handle}/output", "get"),
        ("/v1/boxes/{id}/processes/{handle}/stdin", "post"),
        ("/v1/boxes/{id}/processes/{handle}/signal", "post"),
        ("/v1/boxes/{id}/processes/{handle}/wait", "post"),
        ("/v1/boxes/{id}/sleep", "post"),
        ("/v1/boxes/{id}/wake", "post"),
        ("/v1/boxes/{id}/extend", "post"),
        ("/v1/boxes/{id}/tools/{name}", "post"),
    ] {
        let op = &served["paths"][path][method];
        assert!(op.is_object(), "{method} {path} is documented");
        assert_eq!(
            op["security"],
            json!([{"apiKey": []}]),
            "{method} {path} asks for a key"
        );
    }
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("openapi.json");
    let pretty = serde_json::to_string_pretty(&served).unwrap() + "\n";
    if std::env::var_os("AGENTBOX_WRITE_OPENAPI").is_some() {
        std::fs::write(&file, &pretty).unwrap();
    }
    let kept = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        kept == pretty,
        "{} is not what the server serves: run `AGENTBOX_WRITE_OPENAPI=1 cargo test -p agentbox-server --test api` \
         and commit it (with the clients' change, if the API changed)",
        file.display()
    );
}

/// A request answered with bytes: the status and the body as it came.
async fn raw(s: &Server, key: &str, method: &str, path: &str, body: Option<&[u8]>) -> (u16, Vec<u8>) {
    let mut r = s
        .http
        .request(method.parse().unwrap(), format!("{}{path}", s.url))
        .bearer_auth(key);
    if let Some(b) = body {
        r = r.header("content-type", "application/octet-stream").body(b.to_vec());
    }
    let answer = r.send().await.unwrap();
    (answer.status().as_u16(), answer.bytes().await.unwrap().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_and_tools_on_a_box() {
    let keys = Arc::new(Keys::in_memory().unwrap());
    let (_, key) = keys.add("k", false, local()).await.unwrap();
    let s = start(keys, 1 << 20).await;
    let k = Some(key.as_str());
    let (st, made) = call(&s, k, "POST", "/v1/boxes", Some(json!({"spec": spec(600_000)}))).await;
    assert_eq!(st, 201, "{made}");
    let b = format!("/v1/boxes/{}", made["id"].as_str().unwrap());
    let bytes: Vec<u8> = (0..=255u8).chain(b"hello\n".iter().copied()).collect();
    let (st, _) = raw(&s, &key, "PUT", &format!("{b}/files?path=notes/a.bin"), Some(&bytes)).await;
    assert_eq!(st, 204);
    let (st, back) = raw(&s, &key, "GET", &format!("{b}/files?path=notes/a.bin"), None).await;
    assert_eq!((st, back), (200, bytes.clone()), "byte for byte");
    let (st, info) = call(&s, k, "GET", &format!("{b}/files/stat?path=notes/a.bin"), None).await;
    assert_eq!(
        (st, &info["kind"], &info["size"]),
        (200, &json!("file"), &json!(bytes.len())),
        "{info}"
    );
    let (_, listed) = call(&s, k, "GET", &format!("{b}/files/list?path=notes"), None).await;
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    let (st, _) = call(
        &s,
        k,
        "POST",
        &format!("{b}/files/mkdir"),
        Some(json!({"path": "d/e", "recursive": true})),
    )
    .await;
    assert_eq!(st, 204);
    let (st, _) = call(
        &s,
        k,
        "POST",
        &format!("{b}/files/rename"),
        Some(json!({"from": "notes/a.bin", "to": "d/e/b.bin"})),
    )
    .await;
    assert_eq!(st, 204);
    let (_, back) = raw(&s, &key, "GET", &format!("{b}/files?path=d/e/b.bin"), None).await;
    assert_eq!(back, bytes);
    let (st, r) = call(&s, k, "GET", &format!("{b}/files/stat?path=notes/a.bin"), None).await;
    assert_eq!((st, code_of(&r)), (404, "not_found"), "{r}");
    let (st, r) = call(&s, k, "GET", &format!("{b}/files/stat?path=../outside"), None).await;
    assert_eq!((st, code_of(&r)), (400, "invalid"), "{r}");
    assert!(r["message"].as_str().unwrap().contains("climbs out"), "{r}");
    let (st, r) = call(&s, k, "GET", &format!("{b}/files/stat"), None).await;
    assert_eq!((st, code_of(&r)), (400, "invalid"), "a missing path is named: {r}");
    let (st, r) = call(&s, k, "DELETE", &format!("{b}/files?path=d"), None).await;
    assert_ne!(st, 204, "a directory with entries needs recursive: {r}");
    let (st, _) = call(&s, k, "DELETE", &format!("{b}/files?path=d&recursive=true"), None).await;
    assert_eq!(st, 204);
    let (st, _) = call(&s, k, "GET", &format!("{b}/files/stat?path=d"), None).await;
    assert_eq!(st, 404);

    let (st, tools) = call(&s, k, "GET", "/v1/tools", None).await;
    assert_eq!(st, 200);
    let bash = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "bash")
        .expect("bash is listed");
    assert_eq!(
        bash["parameters"]["properties"]["command"]["type"],
        json!("string"),
        "{bash}"
    );
    let (st, r) = call(
        &s,
        k,
        "POST",
        &format!("{b}/tools/bash"),
        Some(json!({"command": "echo from-the-tool"})),
    )
    .await;
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["isError"], json!(false), "{r}");
    assert!(
        r["content"][0]["text"].as_str().unwrap().contains("from-the-tool"),
        "{r}"
    );
    let (st, r) = call(
        &s,
        k,
        "POST",
        &format!("{b}/tools/write"),
        Some(json!({"path": "t.txt", "content": "x\n"})),
    )
    .await;
    assert_eq!((st, &r["isError"]), (200, &json!(false)), "{r}");
    let (_, back) = raw(&s, &key, "GET", &format!("{b}/files?path=t.txt"), None).await;
    assert_eq!(back, b"x\n");
    let (st, r) = call(
        &s,
        k,
        "POST",
        &format!("{b}/tools/read"),
        Some(json!({"path": "no/such.txt"})),
    )
    .await;
    assert_eq!(
        (st, &r["isError"]),
        (200, &json!(true)),
        "a tool's failure is a result the model reads: {r}"
    );
    let (st, r) = call(&s, k, "POST", &format!("{b}/tools/teleport"), Some(json!({}))).await;
    assert_eq!((st, code_of(&r)), (404, "not_found"), "{r}");
    assert!(r["message"].as_str().unwrap().contains("bash"), "lists the tools: {r}");
    let (st, _) = call(&s, k, "DELETE", &b, None).await;
    assert_eq!(st, 204);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_by_name_sleep_wake_and_extend_within_the_keys_limits() {
    let keys = Arc::new(Keys::in_memory().unwrap());
    let (_, a) = keys.add("a", false, local()).await.unwrap();
    let (_, b) = keys.add("b", false, local()).await.unwrap();
    let (_, short) = keys
        .add(
            "short",
            false,
            Limits {
                max_lifetime: Some(Duration::from_secs(120)),
                ..local()
            },
        )
        .await
        .unwrap();
    let s = start(keys, 1 << 20).await;
    let open = |spec_ms: u64| Some(json!({"name": "dev", "spec": spec(spec_ms)}));
    let (st, first) = call(&s, Some(&a), "POST", "/v1/boxes/open", open(600_000)).await;
    assert_eq!(st, 200, "{first}");
    let (_, again) = call(&s, Some(&a), "POST", "/v1/boxes/open", open(600_000)).await;
    assert_eq!(again["id"], first["id"], "the same name opens the same box");
    let (_, theirs) = call(&s, Some(&b), "POST", "/v1/boxes/open", open(600_000)).await;
    assert_ne!(theirs["id"], first["id"], "a name is the key's own");
    let path = format!("/v1/boxes/{}", first["id"].as_str().unwrap());

    let (st, _) = call(&s, Some(&a), "POST", &format!("{path}/sleep"), None).await;
    assert_eq!(st, 204);
    let (_, got) = call(&s, Some(&a), "GET", &path, None).await;
    assert_eq!(got["status"], json!("sleeping"), "{got}");
    let (st, r) = call(
        &s,
        Some(&a),
        "POST",
        &format!("{path}/exec"),
        Some(json!({"command": "true"})),
    )
    .await;
    assert!(st >= 400, "a sleeping box runs nothing: {st} {r}");
    let (st, woken) = call(&s, Some(&a), "POST", &format!("{path}/wake"), None).await;
    assert_eq!(st, 200, "{woken}");
    let (_, r) = call(
        &s,
        Some(&a),
        "POST",
        &format!("{path}/exec"),
        Some(json!({"command": "echo awake"})),
    )
    .await;
    assert_eq!(r["stdout"], json!("awake\n"), "{r}");
    let (st, r) = call(&s, Some(&b), "POST", &format!("{path}/sleep"), None).await;
    assert_eq!((st, code_of(&r)), (404, "not_found"), "another key's box: {r}");

    let before = woken["facts"]["ends_at_ms"].as_u64().unwrap();
    let (st, moved) = call(
        &s,
        Some(&a),
        "POST",
        &format!("{path}/extend"),
        Some(json!({"by_ms": 60_000})),
    )
    .await;
    assert_eq!(st, 200, "{moved}");
    assert_eq!(
        moved["facts"]["ends_at_ms"].as_u64().unwrap(),
        before + 60_000,
        "{moved}"
    );
    let (st, r) = call(&s, Some(&a), "POST", &format!("{path}/extend"), Some(json!({}))).await;
    assert_eq!((st, code_of(&r)), (400, "invalid"), "{r}");

    let (st, mine) = call(&s, Some(&short), "POST", "/v1/boxes/open", open(60_000)).await;
    assert_eq!(st, 200, "{mine}");
    let short_path = format!("/v1/boxes/{}", mine["id"].as_str().unwrap());
    let (st, r) = call(
        &s,
        Some(&short),
        "POST",
        &format!("{short_path}/extend"),
        Some(json!({"by_ms": 600_000})),
    )
    .await;
    assert_eq!(
        (st, code_of(&r)),
        (403, "permission_denied"),
        "past the key's longest lifetime: {r}"
    );
    for (key, p) in [(&a, &path), (&short, &short_path)] {
        assert_eq!(call(&s, Some(key), "DELETE", p, None).await.0, 204);
    }
    let theirs = format!("/v1/boxes/{}", theirs["id"].as_str().unwrap());
    assert_eq!(call(&s, Some(&b), "DELETE", &theirs, None).await.0, 204);
}

/// The output of `handle` from `after` until it holds `want` (within 30 s): the text, and the
/// next cursor.
async fn read_until(s: &Server, key: &str, procs: &str, handle: u64, after: u64, want: &str) -> (String, u64) {
    let mut text = String::new();
    let mut next = after;
    for _ in 0..30 {
        let (st, out) = call(
            s,
            Some(key),
            "GET",
            &format!("{procs}/{handle}/output?after={next}&wait_ms=1000"),
            None,
        )
        .await;
        assert_eq!(st, 200, "{out}");
        for c in out["chunks"].as_array().unwrap() {
            text.push_str(c["text"].as_str().unwrap());
        }
        next = out["next"].as_u64().unwrap();
        if text.contains(want) {
            return (text, next);
        }
    }
    panic!("no {want:?} in {text:?} within 30 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_process_is_read_from_a_cursor_written_signalled_and_waited_for() {
    let keys = Arc::new(Keys::in_memory().unwrap());
    let (_, key) = keys.add("k", false, local()).await.unwrap();
    let s = start(keys, 1 << 20).await;
    let k = Some(key.as_str());
    let (_, made) = call(&s, k, "POST", "/v1/boxes", Some(json!({"spec": spec(600_000)}))).await;
    let procs = format!("/v1/boxes/{}/processes", made["id"].as_str().unwrap());
    let (st, started) = call(
        &s,
        k,
        "POST",
        &procs,
        Some(json!({"command": "echo first; read line; echo got $line; exit 3"})),
    )
    .await;
    assert_eq!(st, 201, "{started}");
    let h = started["handle"].as_u64().unwrap();
    let (text, next) = read_until(&s, &key, &procs, h, 0, "first\n").await;
    assert_eq!((text.as_str(), next), ("first\n", 6));
    let (st, _) = call(
        &s,
        k,
        "POST",
        &format!("{procs}/{h}/stdin"),
        Some(json!({"data": "hello\n", "close": true})),
    )
    .await;
    assert_eq!(st, 204);
    let (text, _) = read_until(&s, &key, &procs, h, next, "got hello").await;
    assert_eq!(text, "got hello\n", "from the cursor on, nothing before it");
    let (st, ended) = call(
        &s,
        k,
        "POST",
        &format!("{procs}/{h}/wait"),
        Some(json!({"timeout_ms": 30_000})),
    )
    .await;
    assert_eq!(
        (st, &ended["state"], &ended["status"]["code"]),
        (200, &json!("exited"), &json!(3)),
        "{ended}"
    );
    let (_, again) = call(&s, k, "GET", &format!("{procs}/{h}/output?after=0"), None).await;
    let whole: String = again["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        whole, "first\ngot hello\n",
        "a reader that comes back reads from any cursor: {again}"
    );
    assert_eq!(again["exit"]["state"], json!("exited"), "{again}");

    let (_, sleeper) = call(&s, k, "POST", &procs, Some(json!({"argv": ["sleep", "300"]}))).await;
    let sh = sleeper["handle"].as_u64().unwrap();
    let (_, listed) = call(&s, k, "GET", &procs, None).await;
    let handles: Vec<u64> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["handle"].as_u64().unwrap())
        .collect();
    assert!(handles.contains(&h) && handles.contains(&sh), "{listed}");
    let (st, r) = call(
        &s,
        k,
        "POST",
        &format!("{procs}/{sh}/signal"),
        Some(json!({"signal": "NOPE"})),
    )
    .await;
    assert_eq!((st, code_of(&r)), (400, "invalid"), "{r}");
    let (st, _) = call(
        &s,
        k,
        "POST",
        &format!("{procs}/{sh}/signal"),
        Some(json!({"signal": "TERM"})),
    )
    .await;
    assert_eq!(st, 204);
    // A wait with no body waits its default minute.
    let (_, ended) = call(&s, k, "POST", &format!("{procs}/{sh}/wait"), None).await;
    assert_eq!(ended["status"]["signal"], json!(15), "{ended}");
    let (st, r) = call(
        &s,
        k,
        "POST",
        &format!("{procs}/{sh}/wait"),
        Some(json!({"timeout_ms": 7_200_000})),
    )
    .await;
    assert_eq!((st, code_of(&r)), (400, "invalid"), "{r}");
    let (st, r) = call(&s, k, "GET", &format!("{procs}/999999/output"), None).await;
    assert_eq!((st, code_of(&r)), (404, "not_found"), "{r}");
    let (st, _) = call(&s, k, "DELETE", &format!("{procs}/{h}"), None).await;
    assert_eq!(st, 204);
    let (st, _) = call(
        &s,
        k,
        "DELETE",
        &format!("/v1/boxes/{}", made["id"].as_str().unwrap()),
        None,
    )
    .await;
    assert_eq!(st, 204);
}

/// A client that sends its headers a byte at a time is cut off at the headers' deadline; the
/// server goes on answering others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_are_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let keys = Arc::new(Keys::in_memory().unwrap());
    let s = start(keys, 1 << 20).await;
    let addr = s.url.trim_start_matches("http://").to_string();
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let cut = tokio::time::timeout(agentbox_server::HEADER_DEADLINE * 3, async {
        let mut buf = [0u8; 1024];
        loop {
            // A byte every second: never a whole request.
            if slow.write_all(b"X").await.is_err() {
                return;
            }
            match tokio::time::timeout(Duration::from_secs(1), slow.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return,
                Ok(Ok(_)) => return,
                Err(_) => {}
            }
        }
    })
    .await;
    assert!(cut.is_ok(), "the slow client was cut off");
    let (st, _) = call(&s, None, "GET", "/healthz", None).await;
    assert_eq!(st, 200, "the others are answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_coming_is_a_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let keys = Arc::new(Keys::in_memory().unwrap());
    let (_, key) = keys.add("k", false, local()).await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let s = start_with(keys, 1 << 20, home.path(), |o| {
        o.body_deadline = Duration::from_secs(1);
    })
    .await;
    let addr = s.url.trim_start_matches("http://").to_string();
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/boxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"spec\""
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    // The rest never comes: the answer does, within the deadline and a margin.
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), slow.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "answered and closed");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 504"), "{text}");
    let body: Value = serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(code_of(&body), "timeout", "{body}");
}

/// A create may ask only for the secrets `agentbox serve --secret` offers, with their source
/// and among their hosts: a key never has the server read another of its variables or files,
/// or send a value elsewhere. What is offered reaches the provider, which keeps the value out
/// of the box (namespace) or refuses where it cannot (local).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_asks_only_for_the_secrets_the_server_offers() {
    let values = tempfile::tempdir().unwrap();
    let file = values.path().join("gh");
    std::fs::write(&file, "ghp_the-served-value\n").unwrap();
    let from = format!("file:{}", file.display());
    let keys = Arc::new(Keys::in_memory().unwrap());
    let limits = Limits {
        providers: Some(vec!["local".into(), "namespace".into()]),
        ..Default::default()
    };
    let (_, a) = keys.add("a", false, limits).await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let offered = agentbox_core::SecretSpec {
        name: "GH".into(),
        from: from.clone(),
        hosts: vec!["api.github.com".into(), "uploads.github.com".into()],
    };
    let s = start_with(keys, 1 << 20, home.path(), |o| o.secrets = vec![offered]).await;
    let create = |provider: &str, secret: Value| {
        let mut spec = spec(60_000);
        spec["secrets"] = json!([secret]);
        json!({ "provider": provider, "spec": spec })
    };
    for (secret, word) in [
        (
            json!({"name": "AWS", "from": "env:AWS_SECRET_ACCESS_KEY", "hosts": ["evil.example"]}),
            "offers no secret AWS",
        ),
        (
            json!({"name": "GH", "from": "env:HOME", "hosts": ["api.github.com"]}),
            "comes from",
        ),
        (
            json!({"name": "GH", "from": from, "hosts": ["evil.example"]}),
            "not evil.example",
        ),
    ] {
        let (st, r) = call(
            &s,
            Some(&a),
            "POST",
            "/v1/boxes",
            Some(create("namespace", secret.clone())),
        )
        .await;
        assert_eq!((st, code_of(&r)), (403, "permission_denied"), "{secret}: {r}");
        assert!(r.to_string().contains(word), "{secret}: {r}");
    }
    let asked = json!({"name": "GH", "from": from, "hosts": ["api.github.com"]});
    let (_, r) = call(&s, Some(&a), "POST", "/v1/boxes", Some(create("local", asked.clone()))).await;
    assert_eq!(code_of(&r), "unsupported", "{r}");
    assert!(r.to_string().contains("spec.secrets"), "{r}");
    let (st, made) = call(&s, Some(&a), "POST", "/v1/boxes", Some(create("namespace", asked))).await;
    assert_eq!(st, 201, "{made}");
    assert_eq!(made["facts"]["secrets"], json!(["GH"]));
    assert!(!made.to_string().contains("the-served-value"), "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    let said = run_in(&s, &a, &id, "printf %s \"$GH\"").await;
    assert!(said.starts_with("agentbox-placeholder-"), "{said}");
    // One program gets the value itself on its descriptor, by the offered name alone.
    let exec = format!("/v1/boxes/{id}/exec");
    let (st, r) = call(
        &s,
        Some(&a),
        "POST",
        &exec,
        Some(json!({"command": "cat <&3; echo \" fd=$AGENTBOX_SECRET_FD\"", "secret_fd": "GH"})),
    )
    .await;
    assert_eq!(st, 200, "{r}");
    // Exactly as the file holds it, its newline too.
    assert_eq!(r["stdout"], "ghp_the-served-value\n fd=3\n", "{r}");
    let (st, r) = call(
        &s,
        Some(&a),
        "POST",
        &exec,
        Some(json!({"command": "true", "secret_fd": "HOME"})),
    )
    .await;
    assert_eq!((st, code_of(&r)), (403, "permission_denied"), "{r}");
    let (st, _) = call(&s, Some(&a), "DELETE", &format!("/v1/boxes/{id}"), None).await;
    assert_eq!(st, 204);
    s.stop().await;
}

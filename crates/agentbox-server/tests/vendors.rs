//! The API over the vendors' boxes, each against its fake (E2B, Daytona, Modal: their own
//! APIs, their sandboxes namespace boxes of this machine): a box made, run in, its files
//! written and read, a tool called, a detached process streamed (where the box has a runner to
//! keep it; Modal's has none, which the service says), and the box ended, through the service
//! exactly as on local boxes.

mod support;

use std::sync::Arc;
use std::time::Duration;

use agentbox_fakes::daytona::{FakeDaytona, FakeDaytonaOptions};
use agentbox_fakes::e2b::{FakeE2B, FakeE2BOptions};
use agentbox_fakes::modal::{FakeModal, FakeModalOptions};
use agentbox_server::{Keys, Limits};
use futures_util::StreamExt;
use serde_json::{Value, json};
use support::*;

/// Everything the service offers a box of `provider`, through the service.
async fn through_the_service(provider: &str, vars: &[(&str, String)], keeps_processes: bool) {
    let keys = Arc::new(Keys::in_memory().unwrap());
    let limits = Limits {
        providers: Some(vec![provider.to_string()]),
        ..Default::default()
    };
    let (_, key) = keys.add("k", false, limits).await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let s = start_over(keys, 1 << 20, home.path(), vars, |o| {
        o.default_provider = provider.into()
    })
    .await;
    let k = Some(key.as_str());
    let (st, listed) = call(&s, k, "GET", "/v1/providers", None).await;
    assert_eq!(st, 200);
    let mine = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == provider)
        .unwrap();
    assert_eq!(mine["available"], true, "{mine}");

    let (st, made) = call(&s, k, "POST", "/v1/boxes", Some(json!({"spec": spec(600_000)}))).await;
    assert_eq!(st, 201, "{provider}: {made}");
    let id = made["id"].as_str().unwrap().to_string();
    assert!(id.starts_with(&format!("{provider}:")), "{id}");
    let (st, ran) = call(
        &s,
        k,
        "POST",
        &format!("/v1/boxes/{id}/exec"),
        Some(json!({"command": "echo hi; exit 3"})),
    )
    .await;
    assert_eq!(
        (st, ran["exit_code"].as_i64(), ran["stdout"].as_str()),
        (200, Some(3), Some("hi\n")),
        "{provider}: {ran}"
    );
    let file = format!("{}/v1/boxes/{id}/files?path=notes/a.txt", s.url);
    let put = s
        .http
        .put(&file)
        .bearer_auth(&key)
        .body("written")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status().as_u16(), 204, "{provider}");
    let got = s.http.get(&file).bearer_auth(&key).send().await.unwrap();
    assert_eq!(got.bytes().await.unwrap().as_ref(), b"written", "{provider}");
    let (st, tool) = call(
        &s,
        k,
        "POST",
        &format!("/v1/boxes/{id}/tools/bash"),
        Some(json!({"command": "cat notes/a.txt"})),
    )
    .await;
    assert_eq!(st, 200, "{provider}: {tool}");
    assert_eq!(tool["isError"], false, "{provider}: {tool}");
    assert!(
        tool["content"][0]["text"].as_str().unwrap().contains("written"),
        "{provider}: {tool}"
    );

    // A detached process, streamed to its end; a box with no runner to keep it says so.
    let (st, p) = call(
        &s,
        k,
        "POST",
        &format!("/v1/boxes/{id}/processes"),
        Some(json!({"command": "echo one; echo two"})),
    )
    .await;
    if !keeps_processes {
        assert_eq!((st, code_of(&p)), (422, "unsupported"), "{provider}: {p}");
        assert!(p["message"].as_str().unwrap().contains("no runner"), "{provider}: {p}");
        let (st, _) = call(&s, k, "DELETE", &format!("/v1/boxes/{id}"), None).await;
        assert_eq!(st, 204, "{provider}");
        return;
    }
    assert_eq!(st, 201, "{provider}: {p}");
    let h = p["handle"].as_u64().unwrap();
    let mut ws = ws_connect(&s, &key, &format!("/v1/boxes/{id}/processes/{h}/stream"))
        .await
        .unwrap();
    let mut text = String::new();
    let exit = loop {
        let m = tokio::time::timeout(Duration::from_secs(60), ws.next())
            .await
            .expect("a message")
            .unwrap()
            .unwrap();
        let tokio_tungstenite::tungstenite::Message::Text(t) = m else {
            continue;
        };
        let v: Value = serde_json::from_str(&t).unwrap();
        match v["type"].as_str().unwrap() {
            "output" => {
                use base64::Engine;
                let b = base64::engine::general_purpose::STANDARD
                    .decode(v["data"].as_str().unwrap())
                    .unwrap();
                text.push_str(&String::from_utf8_lossy(&b));
            }
            "exit" => break v,
            other => panic!("{provider}: {other}: {v}"),
        }
    };
    assert_eq!(text, "one\ntwo\n", "{provider}");
    assert_eq!(exit["exit"]["status"]["code"], 0, "{provider}: {exit}");

    let (st, _) = call(&s, k, "DELETE", &format!("/v1/boxes/{id}"), None).await;
    assert_eq!(st, 204, "{provider}");
    let (st, gone) = call(&s, k, "GET", &format!("/v1/boxes/{id}"), None).await;
    assert!(st == 404 || gone["status"] == "ended", "{provider}: {st} {gone}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_boxes_through_the_service() {
    let Some(rootfs) = agentbox_testing::services::rootfs("e2b_boxes_through_the_service") else {
        return;
    };
    let key = "e2b_service0123456789abcdef";
    let fake = FakeE2B::start(FakeE2BOptions {
        api_key: key.into(),
        rootfs: Some(rootfs.into()),
        ..Default::default()
    })
    .await
    .unwrap();
    let vars = [
        ("E2B_API_URL", fake.url()),
        ("E2B_SANDBOX_URL", fake.url()),
        ("E2B_API_KEY", key.into()),
        // The fake's sandboxes write /workspace, /root and /tmp alone (no /home/user).
        ("AGENTBOX_E2B_WORKSPACE", "/workspace".into()),
    ];
    through_the_service("e2b", &vars, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daytona_boxes_through_the_service() {
    let Some(rootfs) = agentbox_testing::services::rootfs("daytona_boxes_through_the_service") else {
        return;
    };
    let key = "dtn_service0123456789abcdef";
    let fake = FakeDaytona::start(FakeDaytonaOptions {
        api_key: key.into(),
        rootfs: Some(rootfs.into()),
        index_lag: Duration::from_millis(300),
        ..Default::default()
    })
    .await
    .unwrap();
    let vars = [("DAYTONA_API_URL", fake.api_url()), ("DAYTONA_API_KEY", key.into())];
    through_the_service("daytona", &vars, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modal_boxes_through_the_service() {
    let Some(rootfs) = agentbox_testing::services::rootfs("modal_boxes_through_the_service") else {
        return;
    };
    let (id, secret) = ("ak-service", "as-service-secret");
    let fake = FakeModal::start(FakeModalOptions {
        token_id: id.into(),
        token_secret: secret.into(),
        rootfs: Some(rootfs.into()),
        ..Default::default()
    })
    .await
    .unwrap();
    let vars = [
        ("MODAL_SERVER_URL", fake.url()),
        ("MODAL_TOKEN_ID", id.into()),
        ("MODAL_TOKEN_SECRET", secret.into()),
    ];
    // Modal's boxes take no runner: no detached processes.
    through_the_service("modal", &vars, false).await;
}

//! `/metrics` as Prometheus reads it: requests by route template and outcome, latency, tool
//! calls, streams open and the service's boxes by provider and state; an admin key's alone.

mod support;

use std::sync::Arc;

use agentbox_server::{Keys, Limits};
use serde_json::json;
use support::*;

async fn scrape(s: &Server, key: &str) -> (u16, String, String) {
    let r = s
        .http
        .get(format!("{}/metrics", s.url))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    let ct = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (r.status().as_u16(), ct, r.text().await.unwrap())
}

/// The value of the sample `name{labels}` (labels as written, in order), if there is one.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .split(' ')
            .next()?
            .parse()
            .ok()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_tools_streams_and_boxes() {
    let keys = Arc::new(Keys::in_memory().unwrap());
    let (_, key) = keys.add("k", false, local()).await.unwrap();
    let (_, admin) = keys.add("root", true, Limits::default()).await.unwrap();
    let s = start(keys, 1 << 20).await;
    let (st, made) = call(
        &s,
        Some(&key),
        "POST",
        "/v1/boxes",
        Some(json!({"spec": spec(600_000)})),
    )
    .await;
    assert_eq!(st, 201, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    for _ in 0..2 {
        let (st, _) = call(
            &s,
            Some(&key),
            "POST",
            &format!("/v1/boxes/{id}/exec"),
            Some(json!({"command": "true"})),
        )
        .await;
        assert_eq!(st, 200);
    }
    let (st, _) = call(&s, Some(&key), "GET", "/v1/boxes/local:nope", None).await;
    assert_eq!(st, 404);
    // Methods a client makes up are one label value, not one each.
    for m in ["BREW", "WHEN"] {
        let r = s
            .http
            .request(
                reqwest::Method::from_bytes(m.as_bytes()).unwrap(),
                format!("{}/nowhere", s.url),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 404);
    }
    let (st, _) = call(
        &s,
        Some(&key),
        "POST",
        &format!("/v1/boxes/{id}/tools/bash"),
        Some(json!({"command": "exit 3"})),
    )
    .await;
    assert_eq!(st, 200);
    let (st, _) = call(
        &s,
        Some(&key),
        "POST",
        &format!("/v1/boxes/{id}/tools/read"),
        Some(json!({"path": "/etc/hostname"})),
    )
    .await;
    assert_eq!(st, 200);
    let (st, p) = call(
        &s,
        Some(&key),
        "POST",
        &format!("/v1/boxes/{id}/processes"),
        Some(json!({"command": "sleep 60"})),
    )
    .await;
    assert_eq!(st, 201, "{p}");
    let h = p["handle"].as_u64().unwrap();

    // A stream open while the scrape runs.
    let ws = ws_connect(&s, &key, &format!("/v1/boxes/{id}/processes/{h}/stream"))
        .await
        .unwrap();

    let (st, _, _) = scrape(&s, &key).await;
    assert_eq!(st, 403, "an admin key's alone");
    let (st, ct, text) = scrape(&s, &admin).await;
    assert_eq!(st, 200, "{text}");
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    assert!(text.ends_with("# EOF\n"), "{text}");
    let exec = r#"agentbox_http_requests_total{method="POST",route="/v1/boxes/{id}/exec",code="ok"}"#;
    assert_eq!(sample(&text, exec), Some(2.0), "{text}");
    let missing = r#"agentbox_http_requests_total{method="GET",route="/v1/boxes/{id}",code="not_found"}"#;
    assert_eq!(sample(&text, missing), Some(1.0), "{text}");
    let refused = r#"agentbox_http_requests_total{method="GET",route="/metrics",code="permission_denied"}"#;
    assert_eq!(sample(&text, refused), Some(1.0), "{text}");
    assert!(!text.contains("local:"), "no box's id in a label: {text}");
    let other = r#"agentbox_http_requests_total{method="OTHER",route="unmatched",code="not_found"}"#;
    assert_eq!(sample(&text, other), Some(2.0), "{text}");
    assert!(!text.contains("BREW"), "{text}");
    let took = r#"agentbox_http_request_duration_seconds_count{method="POST",route="/v1/boxes/{id}/exec"}"#;
    assert_eq!(sample(&text, took), Some(2.0), "{text}");
    assert_eq!(
        sample(&text, r#"agentbox_tool_calls_total{tool="bash",outcome="tool_error"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"agentbox_tool_calls_total{tool="read",outcome="ok"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(sample(&text, "agentbox_streams_open"), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, r#"agentbox_boxes{provider="local",state="running"}"#),
        Some(1.0),
        "{text}"
    );

    drop(ws);
    let (st, _) = call(&s, Some(&key), "DELETE", &format!("/v1/boxes/{id}"), None).await;
    assert_eq!(st, 204);
    // The stream ends with its box; the next scrape counts neither.
    let mut text = String::new();
    for _ in 0..100 {
        text = scrape(&s, &admin).await.2;
        if sample(&text, "agentbox_streams_open") == Some(0.0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(sample(&text, "agentbox_streams_open"), Some(0.0), "{text}");
    assert_eq!(
        sample(&text, r#"agentbox_boxes{provider="local",state="running"}"#),
        None,
        "{text}"
    );
}

//! What the fake's tests share: a fake with the test rootfs, and one HTTP/1.1 request over
//! plain TCP through hyper's client (`http`; the fake runs without TLS here: these tests judge
//! its answers, the judges test the TLS that kubectl needs).

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use agentbox_fakes::kube::{FakeKube, FakeKubeOptions};
use serde_json::Value;

pub mod http;
pub use http::Answer;

/// A fake over the test rootfs (`AGENTBOX_TEST_ROOTFS`), or `None` after the loud notice
/// (a failure under CI) when there is none.
pub async fn fake(test: &str, tweak: impl FnOnce(&mut FakeKubeOptions)) -> Option<FakeKube> {
    let rootfs = agentbox_testing::services::rootfs(test)?;
    let mut opts = FakeKubeOptions {
        rootfs: Some(rootfs.into()),
        runner: Some(agentbox_testing::runner::ensure()),
        namespaces: vec!["team-a".into()],
        tls: false,
        ..Default::default()
    };
    tweak(&mut opts);
    Some(FakeKube::start(opts).await.expect("the fake starts"))
}

/// One request with the fake's token (or `token`) on a connection of its own, read to its end.
pub async fn call_as(
    kube: &FakeKube,
    token: Option<&str>,
    method: &str,
    path: &str,
    ct: &str,
    body: Option<&Value>,
) -> Answer {
    let body = body.map(|b| serde_json::to_vec(b).unwrap()).unwrap_or_default();
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![];
    if let Some(b) = &bearer {
        headers.push(("authorization", b.as_str()));
    }
    if !body.is_empty() {
        headers.push(("content-type", ct));
    }
    http::request(kube.addr(), method, path, &headers, body, Duration::from_secs(30)).await
}

pub async fn call(kube: &FakeKube, method: &str, path: &str, body: Option<&Value>) -> Answer {
    call_as(kube, Some(kube.token()), method, path, "application/json", body).await
}

pub async fn patch(kube: &FakeKube, path: &str, ct: &str, body: &Value) -> Answer {
    call_as(kube, Some(kube.token()), "PATCH", path, ct, Some(body)).await
}

/// A pod running `command` in the test image.
pub fn pod(name: &str, labels: Value, command: &[&str]) -> Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "debian:bookworm", "command": command}],
        },
    })
}

//! What the fake's tests share: a fake with the test rootfs, and a small HTTP/1.1 client
//! over plain TCP (the fake runs without TLS here: these tests judge its answers, the judges
//! test the TLS that kubectl needs).

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use agentbox_fakes::kube::{FakeKube, FakeKubeOptions};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One request with the fake's token (or `token`), `Connection: close`, read to its end.
pub async fn call_as(
    kube: &FakeKube,
    token: Option<&str>,
    method: &str,
    path: &str,
    ct: &str,
    body: Option<&Value>,
) -> Answer {
    let mut s = tokio::net::TcpStream::connect(kube.addr()).await.unwrap();
    let body = body.map(|b| serde_json::to_vec(b).unwrap()).unwrap_or_default();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
        kube.addr()
    );
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if !body.is_empty() {
        req.push_str(&format!("Content-Type: {ct}\r\nContent-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    s.write_all(&body).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut raw))
        .await
        .expect("the fake answers within 30 s")
        .unwrap();
    parse(&raw)
}

pub async fn call(kube: &FakeKube, method: &str, path: &str, body: Option<&Value>) -> Answer {
    call_as(kube, Some(kube.token()), method, path, "application/json", body).await
}

pub async fn patch(kube: &FakeKube, path: &str, ct: &str, body: &Value) -> Answer {
    call_as(kube, Some(kube.token()), "PATCH", path, ct, Some(body)).await
}

fn parse(raw: &[u8]) -> Answer {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a header block");
    let head = String::from_utf8_lossy(&raw[..end]).to_string();
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"))
    {
        let mut out = Vec::new();
        let mut rest = &body[..];
        while let Some(nl) = rest.windows(2).position(|w| w == b"\r\n") {
            let n = usize::from_str_radix(String::from_utf8_lossy(&rest[..nl]).trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            out.extend_from_slice(&rest[nl + 2..nl + 2 + n]);
            rest = &rest[nl + 2 + n + 2..];
        }
        body = out;
    }
    Answer { status, headers, body }
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

//! E2B seen from outside the provider: its REST API and envd called directly with reqwest,
//! shared by the fake's and the live suites.

use agentbox_core::SandboxId;
use agentbox_testing::conformance::Outside;
use async_trait::async_trait;
use base64::Engine;
use serde_json::{Value, json};

pub(crate) struct View {
    http: reqwest::Client,
    api: String,
    sandbox_url: Option<String>,
    domain: String,
    key: String,
}

impl View {
    pub(crate) fn new(api: &str, sandbox_url: Option<&str>, domain: &str, key: &str) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        View {
            http: reqwest::Client::builder().no_proxy().http1_only().build().unwrap(),
            api: api.trim_end_matches('/').into(),
            sandbox_url: sandbox_url.map(|u| u.trim_end_matches('/').to_string()),
            domain: domain.into(),
            key: key.into(),
        }
    }

    /// The sandbox's detail; `None` when E2B has no such sandbox.
    pub(crate) async fn detail(&self, id: &str) -> Option<Value> {
        let r = self
            .http
            .get(format!("{}/sandboxes/{id}", self.api))
            .header("X-API-KEY", &self.key)
            .send()
            .await
            .unwrap();
        if r.status() == 404 {
            return None;
        }
        assert!(r.status().is_success(), "GET /sandboxes/{id}: {}", r.status());
        Some(r.json().await.unwrap())
    }

    /// Run `sh -c script args…` through envd's process stream; its exit code, or `None` when
    /// the sandbox did not answer.
    pub(crate) async fn sh(&self, id: &str, script: &str, args: &[String]) -> Option<i64> {
        let d = self.detail(id).await?;
        let base = self
            .sandbox_url
            .clone()
            .unwrap_or_else(|| format!("https://49983-{id}.{}", self.domain));
        let mut argv = vec!["-c".to_string(), script.into(), "view".into()];
        argv.extend(args.iter().cloned());
        let body = serde_json::to_vec(&json!({"process": {"cmd": "/bin/sh", "args": argv}})).unwrap();
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
        framed.extend_from_slice(&body);
        let mut r = self
            .http
            .post(format!("{base}/process.Process/Start"))
            .header("Content-Type", "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .header("E2b-Sandbox-Id", id)
            .header("E2b-Sandbox-Port", "49983")
            .header(
                "Authorization",
                format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("root:")),
            )
            .header("X-Access-Token", d["envdAccessToken"].as_str().unwrap_or(""))
            .body(framed)
            .send()
            .await
            .ok()?;
        if !r.status().is_success() {
            return None;
        }
        let mut buf = Vec::new();
        while let Ok(Some(c)) = r.chunk().await {
            buf.extend_from_slice(&c);
        }
        let mut at = 0;
        while at + 5 <= buf.len() {
            let len = u32::from_be_bytes([buf[at + 1], buf[at + 2], buf[at + 3], buf[at + 4]]) as usize;
            let v: Value = serde_json::from_slice(&buf[at + 5..at + 5 + len]).ok()?;
            if let Some(end) = v.pointer("/event/end") {
                return Some(end["exitCode"].as_i64().unwrap_or(-1));
            }
            at += 5 + len;
        }
        None
    }
}

/// Whether any of `pids` runs and is not a zombie: exits 0 when one does.
const ANY_ALIVE: &str = r#"for p; do
  st=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -c1)
  [ -n "$st" ] && [ "$st" != Z ] && exit 0
done
exit 1"#;

#[async_trait]
impl Outside for View {
    async fn ended(&self, id: &SandboxId) -> bool {
        self.detail(id.name()).await.is_none()
    }

    async fn any_alive(&self, id: &SandboxId, pids: &[u32]) -> bool {
        let args: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
        self.sh(id.name(), ANY_ALIVE, &args).await == Some(0)
    }
}

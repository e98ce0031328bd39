//! Daytona seen from outside the provider, shared by the fake's and the live suites.

use agentbox_core::SandboxId;
use agentbox_testing::conformance::Outside;
use async_trait::async_trait;

/// Daytona's sandboxes seen through its API directly, not through the provider: a box has
/// ended when its sandbox is gone or not started; a pid is alive while `/proc/PID/stat` in the
/// sandbox says so (a toolbox call of this view's own).
pub(crate) struct View {
    http: reqwest::Client,
    api: String,
    key: String,
}

impl View {
    pub(crate) fn new(api: &str, key: &str) -> Self {
        // The provider brings its own TLS; a client of the test's needs a process default.
        let _ = rustls::crypto::ring::default_provider().install_default();
        View {
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            api: api.to_string(),
            key: key.to_string(),
        }
    }

    pub(crate) async fn state(&self, id: &SandboxId) -> Option<String> {
        let r = self
            .http
            .get(format!("{}/sandbox/{}", self.api, id.name()))
            .bearer_auth(&self.key)
            .send()
            .await
            .unwrap();
        if r.status() == 404 {
            return None;
        }
        let v: serde_json::Value = r.json().await.unwrap();
        v["state"].as_str().map(String::from)
    }

    /// Run `script` in the sandbox by the toolbox, as a client of the API would.
    pub(crate) async fn run(&self, id: &SandboxId, script: &str) -> (i64, String) {
        let v: serde_json::Value = self
            .http
            .get(format!("{}/sandbox/{}", self.api, id.name()))
            .bearer_auth(&self.key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let tb = v["toolboxProxyUrl"].as_str().unwrap().to_string();
        let r: serde_json::Value = self
            .http
            .post(format!("{tb}/{}/process/execute", id.name()))
            .bearer_auth(&self.key)
            .json(&serde_json::json!({"command": script, "timeout": 30}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        (
            r["exitCode"].as_i64().unwrap_or(-1),
            r["result"].as_str().unwrap_or_default().to_string(),
        )
    }
}

#[async_trait]
impl Outside for View {
    async fn ended(&self, id: &SandboxId) -> bool {
        !matches!(self.state(id).await.as_deref(), Some("started") | Some("starting"))
    }

    async fn any_alive(&self, id: &SandboxId, pids: &[u32]) -> bool {
        if self.ended(id).await {
            return false;
        }
        for pid in pids {
            let (_, out) = self
                .run(
                    id,
                    &format!("sed -n 's/.*) \\(.\\).*/\\1/p' /proc/{pid}/stat 2>/dev/null"),
                )
                .await;
            let state = out.trim();
            if !state.is_empty() && state != "Z" && state != "X" {
                return true;
            }
        }
        false
    }
}

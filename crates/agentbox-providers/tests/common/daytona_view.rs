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

    /// The sandbox as the API answers it; `None` where it answers 404.
    pub(crate) async fn read(&self, id: &SandboxId) -> Option<serde_json::Value> {
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
        Some(r.json().await.unwrap())
    }

    /// Replace the sandbox's labels, as another client of the API would.
    #[allow(dead_code)] // Only the fake's suite changes a box behind the provider's back.
    pub(crate) async fn put_labels(&self, id: &SandboxId, labels: &serde_json::Value) {
        let r = self
            .http
            .put(format!("{}/sandbox/{}/labels", self.api, id.name()))
            .bearer_auth(&self.key)
            .json(&serde_json::json!({ "labels": labels }))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
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
    /// Gone, destroyed or being destroyed; a stopped (sleeping) sandbox has not ended.
    async fn ended(&self, id: &SandboxId) -> bool {
        match self.read(id).await {
            None => true,
            Some(v) => {
                v["desiredState"] == "destroyed"
                    || matches!(
                        v["state"].as_str(),
                        Some("destroyed" | "destroying" | "error" | "build_failed")
                    )
            }
        }
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

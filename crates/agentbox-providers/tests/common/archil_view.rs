//! Archil seen from outside the provider, shared by the fake's and the live suites.

use agentbox_core::SandboxId;
use agentbox_testing::conformance::Outside;
use async_trait::async_trait;

/// A box's record read through Archil's object API directly, not through the provider. A box
/// has ended when its record is gone or its end has passed: Archil runs nothing between calls,
/// so an ended box holds no machine, only its directory, which the next call that looks at
/// the box removes (attach and list, which the lifetime case then calls). No program of an
/// archil box outlives its call, so none is ever alive here.
pub(crate) struct View {
    http: reqwest::Client,
    s3: String,
    disk: String,
    key: String,
}

impl View {
    pub(crate) fn new(s3: &str, disk: &str, key: &str) -> Self {
        // The provider brings its own TLS; a client of the test's needs a process default.
        let _ = rustls::crypto::ring::default_provider().install_default();
        View {
            http: reqwest::Client::builder().no_proxy().build().unwrap(),
            s3: s3.trim_end_matches('/').to_string(),
            disk: disk.to_string(),
            key: key.to_string(),
        }
    }

    /// The box's record as the disk holds it; `None` where there is none.
    pub(crate) async fn record(&self, id: &SandboxId) -> Option<serde_json::Value> {
        let r = self
            .http
            .get(format!("{}/{}/boxes.records/{}.json", self.s3, self.disk, id.name()))
            .header("Authorization", format!("key-{}", self.key))
            .send()
            .await
            .unwrap();
        if r.status() == 404 {
            return None;
        }
        assert!(r.status().is_success(), "reading a record: {}", r.status());
        Some(serde_json::from_slice(&r.bytes().await.unwrap()).unwrap())
    }
}

#[async_trait]
impl Outside for View {
    async fn ended(&self, id: &SandboxId) -> bool {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        match self.record(id).await {
            None => true,
            Some(r) => r["ends_at_ms"].as_u64().is_none_or(|end| end <= now),
        }
    }

    async fn any_alive(&self, _id: &SandboxId, _pids: &[u32]) -> bool {
        false
    }
}

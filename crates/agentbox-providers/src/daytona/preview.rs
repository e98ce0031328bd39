//! The runner in a sandbox, reached through the sandbox's preview URL: Daytona's proxy to a
//! port of the sandbox, authorized by the sandbox's preview token. The WebSocket is an HTTP/1.1
//! upgrade through the same client as the API (its TLS, its deadlines).

use std::time::Duration;

use agentbox_core::{Ctx, Error, Result};
use async_trait::async_trait;

use super::api::Api;
use crate::runner::{Dial, Link};

/// How long the upgrade may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// A runner behind a preview URL, which each dial asks the API for (with the sandbox's
/// preview token), so a listed box costs no call until it is used.
pub(crate) struct PreviewDial {
    pub(crate) api: Api,
    /// Daytona's id of the sandbox.
    pub(crate) sandbox: String,
    /// The runner's port in the sandbox.
    pub(crate) port: u16,
    /// The runner's own bearer token.
    pub(crate) runner_token: String,
}

#[derive(serde::Deserialize)]
struct Preview {
    url: String,
    #[serde(default)]
    token: Option<String>,
}

#[async_trait]
impl Dial for PreviewDial {
    async fn dial(&self, ctx: &Ctx) -> Result<Link> {
        let open = async {
            let what = format!(
                "reading the preview URL of port {} of sandbox {}",
                self.port, self.sandbox
            );
            let url = self
                .api
                .url(&format!("/sandbox/{}/ports/{}/preview-url", self.sandbox, self.port));
            let p: Preview = self.api.json(ctx, &what, |c| c.get(&url)).await?;
            let request = self
                .api
                .http()
                .get(&p.url)
                .header("X-Daytona-Preview-Token", p.token.as_deref().unwrap_or_default())
                .header("X-Daytona-Skip-Preview-Warning", "true");
            crate::vendor::runner_websocket(request, &self.runner_token, &self.describe()).await
        };
        match ctx.run(tokio::time::timeout(OPEN_TIMEOUT, open)).await? {
            Ok(r) => r,
            Err(_) => Err(Error::timeout(format!(
                "{} did not answer within {}s",
                self.describe(),
                OPEN_TIMEOUT.as_secs()
            ))),
        }
    }

    fn describe(&self) -> String {
        format!(
            "the runner in Daytona sandbox {} (port {}, through its preview URL)",
            self.sandbox, self.port
        )
    }
}

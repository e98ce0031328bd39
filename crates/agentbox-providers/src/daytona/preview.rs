//! The runner in a sandbox, reached through the sandbox's preview URL: Daytona's proxy to a
//! port of the sandbox, authorized by the sandbox's preview token. The WebSocket is an HTTP/1.1
//! upgrade through the same client as the API (its TLS, its deadlines).

use std::time::Duration;

use agentbox_core::{Ctx, Error, Result};
use async_trait::async_trait;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::api::Api;
use crate::runner::{Dial, Link, websocket_link};

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
        let key = generate_key();
        let open = async {
            let what = format!(
                "reading the preview URL of port {} of sandbox {}",
                self.port, self.sandbox
            );
            let url = self
                .api
                .url(&format!("/sandbox/{}/ports/{}/preview-url", self.sandbox, self.port));
            let p: Preview = self.api.json(ctx, &what, |c| c.get(&url)).await?;
            let r = self
                .api
                .http()
                .get(&p.url)
                .header("Connection", "Upgrade")
                .header("Upgrade", "websocket")
                .header("Sec-WebSocket-Version", "13")
                .header("Sec-WebSocket-Key", &key)
                .header("X-Daytona-Preview-Token", p.token.as_deref().unwrap_or_default())
                .header("X-Daytona-Skip-Preview-Warning", "true")
                // Not Authorization: Daytona's proxy tries every bearer as a Daytona credential.
                .header(agentbox_protocol::runner::TOKEN_HEADER, &self.runner_token)
                .send()
                .await
                .map_err(|e| Error::transfer_failed(format!("{}: {e}", self.describe())))?;
            if r.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
                let status = r.status().as_u16();
                let body = super::api::read_capped(r, 64 << 10, "the preview's answer")
                    .await
                    .unwrap_or_default();
                return Err(Error::transfer_failed(format!(
                    "{}: the preview URL answered {status}, not a WebSocket: {}",
                    self.describe(),
                    String::from_utf8_lossy(&body[..body.len().min(300)]).trim()
                )));
            }
            let accept = r
                .headers()
                .get("sec-websocket-accept")
                .and_then(|v| v.to_str().ok())
                .map(String::from);
            if accept.as_deref() != Some(derive_accept_key(key.as_bytes()).as_str()) {
                return Err(Error::transfer_failed(format!(
                    "{}: the upgrade's Sec-WebSocket-Accept is wrong",
                    self.describe()
                )));
            }
            let io = r
                .upgrade()
                .await
                .map_err(|e| Error::transfer_failed(format!("{}: {e}", self.describe())))?;
            let ws =
                tokio_tungstenite::WebSocketStream::from_raw_socket(io, Role::Client, Some(crate::runner::ws_config()))
                    .await;
            Ok(websocket_link(ws))
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

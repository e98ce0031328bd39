//! The lifecycle E2B boxes have beyond create and destroy: sleep, wake, extend (the contract's
//! [`Lifecycle`]; every other operation is refused).

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Error, ErrorCode, Lifecycle, Result, Sandbox, SandboxId, check_deadline};
use async_trait::async_trait;
use reqwest::Method;
use serde_json::json;

use super::{E2bProvider, NAME, Runner, TAG_LIFETIME};

#[async_trait]
impl Lifecycle for E2bProvider {
    async fn sleep(&self, id: &SandboxId, ctx: &Ctx) -> Result<()> {
        id.expect_provider(NAME)?;
        let a = self
            .api
            .call(
                ctx,
                Method::POST,
                &format!("/sandboxes/{}/pause", id.name()),
                Some(&json!({"memory": false})),
                true,
                "POST /sandboxes/{id}/pause",
            )
            .await;
        match a {
            Ok(a) if a.status == 404 => Err(Error::gone(format!("sleep: box {id} has ended"))),
            Ok(_) => Ok(()),
            // 409 is E2B's "paused already"; a throttled pause is refused as it was.
            Err(e) if e.code() == ErrorCode::Refused && e.message().ends_with("(HTTP 409)") => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn wake(&self, id: &SandboxId, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        id.expect_provider(NAME)?;
        let meta = self.read_metadata(id.name(), ctx).await?;
        if meta.get("agentbox").map(String::as_str) != Some("1") {
            return Err(Error::gone(format!("wake: box {id} has ended")));
        }
        let secs: u64 = meta
            .get(TAG_LIFETIME)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| self.lifetime_secs(self.o.max_lifetime));
        let a = self
            .api
            .call(
                ctx,
                Method::POST,
                &format!("/v2/sandboxes/{}/connect", id.name()),
                Some(&json!({"timeout": secs})),
                true,
                "POST /v2/sandboxes/{id}/connect",
            )
            .await?;
        if a.status == 404 {
            return Err(Error::gone(format!("wake: box {id} has ended")));
        }
        self.read_boxed(id.name(), Runner::Fresh, ctx)
            .await?
            .ok_or_else(|| Error::gone(format!("wake: box {id} ended as it woke")))
    }

    async fn extend(&self, id: &SandboxId, ends_at_ms: u64, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        id.expect_provider(NAME)?;
        let now = agentbox_core::now_ms();
        check_deadline(ends_at_ms, now)?;
        let secs = (ends_at_ms - now).div_ceil(1000);
        if Duration::from_secs(secs) > self.o.max_lifetime {
            return Err(Error::invalid(format!(
                "extend: {secs} s from now is past E2B's longest timeout on this plan, {} s",
                self.o.max_lifetime.as_secs()
            )));
        }
        let a = self
            .api
            .call(
                ctx,
                Method::POST,
                &format!("/sandboxes/{}/timeout", id.name()),
                Some(&json!({"timeout": secs})),
                true,
                "POST /sandboxes/{id}/timeout",
            )
            .await?;
        if a.status == 404 {
            return Err(Error::gone(format!("extend: box {id} has ended")));
        }
        self.read_boxed(id.name(), Runner::Lazily, ctx)
            .await?
            .ok_or_else(|| Error::gone(format!("extend: box {id} has ended")))
    }
}

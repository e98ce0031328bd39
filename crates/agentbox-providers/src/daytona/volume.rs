//! The Daytona volumes a provider's boxes mount ([`DaytonaOptions::volumes`]): each found by
//! its name, made when there is none, and waited on until it is ready, before a create names
//! it (a create naming a volume that is not ready is refused by Daytona).
//!
//! [`DaytonaOptions::volumes`]: super::DaytonaOptions::volumes

use std::time::Duration;

use agentbox_core::{Ctx, Error, ErrorCode, Result};
use serde::Deserialize;
use serde_json::json;

use super::api::Api;

/// How long a volume may take to become ready.
pub(crate) const READY_WITHIN: Duration = Duration::from_secs(120);

/// A Daytona volume mounted in every box a provider makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeMount {
    /// The volume's name: made when there is none.
    pub name: String,
    /// Where the box sees it: an absolute path.
    pub mount_path: String,
}

impl VolumeMount {
    /// Whether the name and the path are ones Daytona takes, naming what is wrong.
    pub fn validate(&self) -> Result<()> {
        let n = &self.name;
        if n.is_empty()
            || n.len() > 255
            || n.starts_with('.')
            || !n.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(Error::invalid(format!(
                "volume {n:?}: a name of 1 to 255 letters, digits, '-', '_' and '.', not starting with '.'"
            )));
        }
        let p = &self.mount_path;
        if !p.starts_with('/') || p == "/" || p.split('/').any(|c| c == "..") {
            return Err(Error::invalid(format!(
                "volume {n}: mount path {p:?}: an absolute path other than /, with no '..'"
            )));
        }
        Ok(())
    }
}

/// A volume as the API answers it (the fields read here).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VolumeDto {
    id: String,
    state: String,
    #[serde(default)]
    error_reason: Option<String>,
}

/// The id of the volume `name`, made if there is none, once it is ready.
pub(crate) async fn ready(api: &Api, name: &str, ctx: &Ctx) -> Result<String> {
    let ctx = ctx.with_timeout(READY_WITHIN);
    let by_name = api.url(&format!("/volumes/by-name/{name}"));
    let what = format!("reading volume {name}");
    let mut v: VolumeDto = match api.json(&ctx, &what, |c| c.get(&by_name)).await {
        Ok(v) => v,
        Err(e) if e.code() == ErrorCode::NotFound => {
            let url = api.url("/volumes");
            let body = json!({ "name": name });
            match api
                .json(&ctx, &format!("creating volume {name}"), |c| c.post(&url).json(&body))
                .await
            {
                Ok(v) => {
                    tracing::info!(volume = name, "daytona: volume created");
                    v
                }
                // Made by another host meanwhile (Daytona answers a taken name 400), or the
                // answer lost: it is there if a read finds it, else the create's error stands.
                Err(e) => match api.json(&ctx, &what, |c| c.get(&by_name)).await {
                    Ok(v) => v,
                    Err(_) => return Err(e),
                },
            }
        }
        Err(e) => return Err(e),
    };
    let mut pause = Duration::from_millis(100);
    loop {
        match v.state.as_str() {
            "ready" => return Ok(v.id),
            "error" | "deleted" | "deleting" | "pending_delete" => {
                return Err(Error::unknown(format!(
                    "volume {name} is {}{}: it cannot be mounted",
                    v.state,
                    v.error_reason.map(|r| format!(" ({r})")).unwrap_or_default()
                )));
            }
            _ => {}
        }
        if ctx.remaining().is_some_and(|r| r <= pause) {
            return Err(Error::timeout(format!(
                "volume {name} was still {} after {}s",
                v.state,
                READY_WITHIN.as_secs()
            )));
        }
        ctx.run(tokio::time::sleep(pause)).await?;
        pause = (pause * 2).min(Duration::from_secs(2));
        v = api.json(&ctx, &what, |c| c.get(&by_name)).await?;
    }
}

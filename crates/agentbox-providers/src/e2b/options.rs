//! What a e2b provider is made with: [`E2bOptions`], its defaults, and where it reads them from the
//! environment.

use std::time::Duration;

use agentbox_core::Result;

use super::{ApiKey, PLAN_MAX_LIFETIME, WORKSPACE};
use crate::helper::HelperCommand;

/// How the provider reaches E2B.
#[derive(Clone, Debug)]
pub struct E2bOptions {
    /// E2B's API (`E2B_API_URL`, else `https://api.<domain>`).
    pub api_url: String,
    /// envd of every sandbox, where E2B's proxy is not used (`E2B_SANDBOX_URL`).
    pub sandbox_url: Option<String>,
    /// E2B's domain (`E2B_DOMAIN`, else `e2b.app`).
    pub domain: String,
    /// The API key (`E2B_API_KEY`).
    pub api_key: Option<ApiKey>,
    /// The template boxes are made from (`AGENTBOX_E2B_TEMPLATE`, else `base`).
    pub template: String,
    /// The plan's longest timeout: a longer lifetime is capped to it (and says so in facts).
    pub max_lifetime: Duration,
    /// Where programs start (and relative paths are taken from): `AGENTBOX_E2B_WORKSPACE`,
    /// else the base template's user's home, `/home/user` (a template of your own may have
    /// another).
    pub workspace: String,
    /// How often envd is asked for a keepalive on a stream; three missed are a dead stream.
    pub keepalive: Duration,
    /// How long a connection to E2B may take to open.
    pub connect_timeout: Duration,
    /// The deadline of one call that is not a stream.
    pub request_timeout: Duration,
    /// A static `agentbox-runner` of this machine's, uploaded into each sandbox: the box's
    /// processes then outlive their caller and can be reattached from any host, and its files
    /// move one message per operation. `None`: every program lives as long as its envd stream.
    pub runner: Option<HelperCommand>,
}

impl Default for E2bOptions {
    fn default() -> Self {
        E2bOptions {
            api_url: "https://api.e2b.app".into(),
            sandbox_url: None,
            domain: "e2b.app".into(),
            api_key: None,
            template: "base".into(),
            max_lifetime: PLAN_MAX_LIFETIME,
            workspace: WORKSPACE.into(),
            keepalive: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            runner: None,
        }
    }
}

impl E2bOptions {
    /// The defaults, with what the `e2b` SDK reads (`E2B_API_KEY`, `E2B_DOMAIN`, `E2B_API_URL`,
    /// `E2B_SANDBOX_URL`), the template (`AGENTBOX_E2B_TEMPLATE`) and the workspace
    /// (`AGENTBOX_E2B_WORKSPACE`).
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// [`E2bOptions::from_env`] over `var`.
    ///
    /// ```
    /// use agentbox_providers::e2b::E2bOptions;
    /// let o = E2bOptions::from_vars(|k| (k == "E2B_DOMAIN").then(|| "e2b.dev".to_string())).unwrap();
    /// assert_eq!(o.api_url, "https://api.e2b.dev");
    /// ```
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let d = E2bOptions::default();
        let domain = var("E2B_DOMAIN").unwrap_or(d.domain.clone());
        Ok(E2bOptions {
            api_url: var("E2B_API_URL").unwrap_or_else(|| format!("https://api.{domain}")),
            sandbox_url: var("E2B_SANDBOX_URL"),
            api_key: var("E2B_API_KEY").map(ApiKey::new),
            template: var("AGENTBOX_E2B_TEMPLATE").unwrap_or(d.template.clone()),
            workspace: var("AGENTBOX_E2B_WORKSPACE").unwrap_or(d.workspace.clone()),
            domain,
            ..d
        })
    }
}

//! E2B's API served by the service (`agentbox_e2b`) over its own keys and providers: an
//! `X-API-KEY` is one of this server's API keys (its rate, its most boxes, its longest
//! lifetime and its providers as on `/v1`), and a sandbox is a box of the provider its
//! template maps to, owned by the key that made it, so it is also seen, counted and ended
//! through `/v1/boxes`.

use std::collections::BTreeMap;
use std::sync::Arc;

use agentbox_core::{Ctx, ErrorCode, Spec};
use agentbox_e2b::{Ask, Backend, Caller, Made, Refusal};

use crate::api::boxes::{allowed_spec, room_for};
use crate::error::{ApiError, status_of};
use crate::keys::KeyInfo;
use crate::state::AppState;

/// The label on every box made through E2B's API, its value the sandbox's E2B id: such a box is
/// also an E2B sandbox of this server's, for as long as this server runs.
pub const SANDBOX_LABEL: &str = "agentbox-server.e2b";

/// How long making a sandbox's box may take.
const MAKE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

/// What an E2B template is on this server: a provider, and the image (or rootfs) its boxes
/// start from (`None`: the provider's own default).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    /// The provider (`None`: the server's default provider).
    pub provider: Option<String>,
    /// The image, rootfs or snapshot a box starts from, as the provider reads `spec.image`.
    pub image: Option<String>,
}

impl std::str::FromStr for Template {
    type Err = String;

    /// `PROVIDER`, or `PROVIDER:IMAGE` (the image may hold colons: `docker:debian:13`).
    ///
    /// ```
    /// let t: agentbox_server::e2b::Template = "docker:debian:13".parse().unwrap();
    /// assert_eq!((t.provider.as_deref(), t.image.as_deref()), (Some("docker"), Some("debian:13")));
    /// ```
    fn from_str(s: &str) -> Result<Self, String> {
        let (provider, image) = match s.split_once(':') {
            Some((p, i)) => (p, Some(i)),
            None => (s, None),
        };
        agentbox_providers::registry::find(provider).map_err(|e| e.message().to_string())?;
        if image.is_some_and(str::is_empty) {
            return Err(format!("{s:?}: an empty image (say PROVIDER alone for its default)"));
        }
        Ok(Template {
            provider: Some(provider.to_string()),
            image: image.map(str::to_string),
        })
    }
}

/// The templates a server maps: each name to a provider and image. `base` (the SDKs' default
/// template) is the default provider's default box unless it is mapped.
pub type Templates = BTreeMap<String, Template>;

/// The backend of the service's E2B API.
pub(crate) struct ServiceBackend {
    pub(crate) state: Arc<AppState>,
    pub(crate) templates: Templates,
}

fn refusal(e: ApiError) -> Refusal {
    Refusal::new(status_of(e.code()).as_u16(), e.message())
}

#[async_trait::async_trait]
impl Backend for ServiceBackend {
    async fn caller(&self, api_key: &str, extensions: &axum::http::Extensions) -> Result<Caller, Refusal> {
        let key = self
            .state
            .keys
            .find(api_key)
            .await
            .map_err(|e| refusal(e.into()))?
            .ok_or_else(|| Refusal::new(401, "Invalid API key: not one this server holds"))?;
        if let Some(who) = extensions.get::<crate::access::Who>() {
            who.set(&key.name);
        }
        self.state.rates.take(&key).map_err(refusal)?;
        Ok(Caller {
            id: key.id.clone(),
            admin: key.admin,
            record: Arc::new(key),
        })
    }

    async fn make(&self, caller: &Caller, ask: &Ask) -> Result<Made, Refusal> {
        let Some(key) = caller.record.downcast_ref::<KeyInfo>() else {
            return Err(Refusal::new(500, "the caller is not one of this server's keys"));
        };
        let template = match self.templates.get(&ask.template) {
            Some(t) => t.clone(),
            None if ask.template == "base" => Template {
                provider: None,
                image: None,
            },
            None => {
                return Err(Refusal::new(
                    404,
                    format!(
                        "template '{}' not found: this server maps {} (agentbox serve --e2b-template NAME=PROVIDER[:IMAGE])",
                        ask.template,
                        self.names()
                    ),
                ));
            }
        };
        let name = template
            .provider
            .clone()
            .unwrap_or_else(|| self.state.default_provider.clone());
        let mut spec = Spec::new(ask.lifetime);
        spec.image = template.image.clone();
        spec.network = ask.network.clone();
        spec.env = ask.env.clone();
        let mut spec = allowed_spec(key, &name, spec).map_err(refusal)?;
        spec.labels.insert(SANDBOX_LABEL.to_string(), ask.sandbox_id.clone());
        let _counted = self.state.key_lock(&key.id).await;
        room_for(&self.state, key, 1, |_| false).await.map_err(refusal)?;
        let provider = self.state.provider(&name).await.map_err(|e| refusal(e.into()))?;
        let ctx = Ctx::background().with_timeout(MAKE_DEADLINE);
        let sandbox = provider.create(&spec, &ctx).await.map_err(|e| {
            let status = match e.code() {
                ErrorCode::Invalid | ErrorCode::Unsupported => 400,
                _ => 500,
            };
            Refusal::new(status, format!("the sandbox could not be made: {}", e.message()))
        })?;
        tracing::info!(box_id = %sandbox.id(), key = %key.name, template = %ask.template, "e2b: sandbox made");
        Ok(Made { provider, sandbox })
    }
}

impl ServiceBackend {
    /// The templates this server maps, for a refusal.
    fn names(&self) -> String {
        let mut names: Vec<&str> = self.templates.keys().map(String::as_str).collect();
        if !self.templates.contains_key("base") {
            names.push("base");
        }
        names.sort_unstable();
        names.join(", ")
    }
}

/// E2B's API over `state`'s keys and providers. Every sandbox demands its envd token: envd's
/// calls carry no API key.
pub(crate) fn api(state: Arc<AppState>) -> agentbox_e2b::E2b {
    let templates = state.e2b_templates.clone();
    let options = agentbox_e2b::E2bOptions {
        always_secure: true,
        // A key's own longest lifetime is checked as on /v1; E2B's Pro plan's longest here.
        max_timeout: std::time::Duration::from_secs(24 * 3600),
        ..Default::default()
    };
    agentbox_e2b::E2b::new(Arc::new(ServiceBackend { state, templates }), options)
        .unwrap_or_else(|e| unreachable!("the default E2B options are valid: {e}"))
}

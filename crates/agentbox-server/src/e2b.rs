//! E2B's API served by the service (`agentbox_e2b`) over its own keys and providers: an
//! `X-API-KEY` is one of this server's API keys (its rate, its most boxes, its longest
//! lifetime and its providers as on `/v1`), and a sandbox is a box of the provider its
//! template maps to, owned by the key that made it, so it is also seen, counted and ended
//! through `/v1/boxes`.

use std::collections::BTreeMap;
use std::sync::Arc;

use agentbox_core::{Ctx, ErrorCode, SandboxId, Spec};
/// A domain of E2B's domain mode ([`crate::ServerOptions::e2b_domain`]).
pub use agentbox_e2b::Domain;
use agentbox_e2b::{Ask, Backend, Caller, Made, Refusal};
use agentbox_providers::registry;

use crate::api::boxes::{CALL_DEADLINE, allowed_spec, may_use, room_for};
use crate::api::snapshots::{full_name, prefix};
use crate::error::{ApiError, status_of};
use crate::keys::KeyInfo;
use crate::state::AppState;

/// The label on every box made through E2B's API, its value the sandbox's E2B id: such a box is
/// also an E2B sandbox of this server's, for as long as this server runs.
pub const SANDBOX_LABEL: &str = "agentbox-server.e2b";

/// How long making a sandbox's box may take.
const MAKE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

/// What an E2B template is on this server: a provider, the image (or rootfs) its boxes start
/// from (`None`: the provider's own default), and where its programs start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    /// The provider (`None`: the server's default provider).
    pub provider: Option<String>,
    /// The image, rootfs or snapshot a box starts from, as the provider reads `spec.image`.
    pub image: Option<String>,
    /// The box's workspace (`spec.workspace`): where programs start and relative paths are
    /// taken from, as E2B's template user's home (`/home/user`); `None`: the provider's.
    pub workspace: Option<String>,
}

impl std::str::FromStr for Template {
    type Err = String;

    /// `PROVIDER`, or `PROVIDER:IMAGE` (the image may hold colons: `docker:debian:13`), then
    /// optionally `,workspace=DIR`.
    ///
    /// ```
    /// let t: agentbox_server::e2b::Template = "docker:debian:13".parse().unwrap();
    /// assert_eq!((t.provider.as_deref(), t.image.as_deref()), (Some("docker"), Some("debian:13")));
    /// let t: agentbox_server::e2b::Template =
    ///     "docker:agentbox-e2b-base:bookworm,workspace=/home/user".parse().unwrap();
    /// assert_eq!(t.workspace.as_deref(), Some("/home/user"));
    /// ```
    fn from_str(s: &str) -> Result<Self, String> {
        let (s, workspace) = match s.split_once(',') {
            Some((t, rest)) => {
                let dir = rest
                    .strip_prefix("workspace=")
                    .ok_or_else(|| format!("{rest:?}: not workspace=DIR"))?;
                if !agentbox_core::is_normal_absolute(dir) {
                    return Err(format!("workspace {dir:?}: not a normal absolute path"));
                }
                (t, Some(dir.to_string()))
            }
            None => (s, None),
        };
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
            workspace,
        })
    }
}

/// The templates a server maps: each name to a provider and image. `base` (the SDKs' default
/// template) is the default provider's default box unless it is mapped.
pub type Templates = BTreeMap<String, Template>;

/// The ports of a sandbox reached through E2B's proxy unless the server names others: the
/// usual ones of web servers and notebooks (3000, 5000, 5173 for Vite, 7860 for Gradio, 8000,
/// 8080, 8501 for Streamlit, 8888 for Jupyter, 9000) and 49999, E2B's code interpreter's.
pub const PORTS: [u16; 10] = [3000, 5000, 5173, 7860, 8000, 8080, 8501, 8888, 9000, 49999];

/// The backend of the service's E2B API.
pub(crate) struct ServiceBackend {
    pub(crate) state: Arc<AppState>,
    pub(crate) templates: Templates,
}

/// The service's error in E2B's words: its status, except that what a provider cannot do is
/// E2B's answer to a feature it lacks (501), not the service's 422.
fn refusal(e: ApiError) -> Refusal {
    let status = match e.code() {
        ErrorCode::Unsupported => 501,
        code => status_of(code).as_u16(),
    };
    Refusal::new(status, e.message())
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
            max_lifetime: key.limits.max_lifetime,
            record: Arc::new(key),
        })
    }

    async fn make(&self, caller: &Caller, ask: &Ask) -> Result<Made, Refusal> {
        let key = key_of(caller)?;
        let (name, mut spec) = self.placed(key, ask).await?;
        spec.image = match &spec.snapshot {
            Some(_) => None,
            None => spec.image,
        };
        let _counted = self.state.key_lock(&key.id).await;
        room_for(&self.state, key, 1, |_| false).await.map_err(refusal)?;
        let provider = self.state.provider(&name).await.map_err(|e| refusal(e.into()))?;
        let ctx = Ctx::background().with_timeout(MAKE_DEADLINE);
        let sandbox = provider.create(&spec, &ctx).await.map_err(not_made)?;
        tracing::info!(box_id = %sandbox.id(), key = %key.name, template = %ask.template, "e2b: sandbox made");
        Ok(Made { provider, sandbox })
    }

    async fn snapshot(&self, caller: &Caller, of: &Made, name: &str) -> Result<(), Refusal> {
        let key = key_of(caller)?;
        let full = full_name(key, name).map_err(refusal)?;
        let ctx = Ctx::background().with_timeout(MAKE_DEADLINE);
        of.provider
            .snapshot(of.sandbox.id(), &full, &ctx)
            .await
            .map_err(|e| refusal(e.into()))?;
        Ok(())
    }

    async fn snapshots(&self, caller: &Caller) -> Result<Vec<(String, Option<SandboxId>)>, Refusal> {
        let key = key_of(caller)?;
        let mine = prefix(key);
        let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
        let mut out = Vec::new();
        for p in self.snapshot_providers(key).await {
            for s in p.snapshots(&ctx).await.map_err(|e| refusal(e.into()))? {
                if let Some(name) = s.name.strip_prefix(&mine) {
                    out.push((name.to_string(), s.from));
                }
            }
        }
        Ok(out)
    }

    async fn delete_snapshot(&self, caller: &Caller, name: &str) -> Result<bool, Refusal> {
        let key = key_of(caller)?;
        let Ok(full) = full_name(key, name) else {
            return Ok(false);
        };
        let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
        let mut deleted = false;
        for p in self.snapshot_providers(key).await {
            deleted |= p.delete_snapshot(&full, &ctx).await.map_err(|e| refusal(e.into()))?;
        }
        Ok(deleted)
    }

    async fn fork(&self, caller: &Caller, of: &Made, asks: &[Ask]) -> Result<Vec<Made>, Refusal> {
        let key = key_of(caller)?;
        if !of.provider.honours().fork {
            return Err(refusal(agentbox_core::refuse(of.provider.name(), "fork").into()));
        }
        let provider_name = of.sandbox.id().provider().to_string();
        let mut specs = Vec::with_capacity(asks.len());
        for ask in asks {
            let mut spec = Spec::new(ask.lifetime);
            spec.network = ask.network.clone();
            spec.env = ask.env.clone();
            self.with_ports(&provider_name, &mut spec).await;
            let mut spec = allowed_spec(key, &provider_name, &[], spec).map_err(refusal)?;
            spec.labels.insert(SANDBOX_LABEL.to_string(), ask.sandbox_id.clone());
            specs.push(spec);
        }
        let _counted = self.state.key_lock(&key.id).await;
        room_for(&self.state, key, asks.len(), |_| false)
            .await
            .map_err(refusal)?;
        let ctx = Ctx::background().with_timeout(MAKE_DEADLINE);
        let mut made: Vec<Made> = Vec::new();
        // One at a time, each with its own sandbox's label; all or none.
        for spec in &specs {
            match of.provider.fork(of.sandbox.id(), 1, spec, &ctx).await {
                Ok(boxes) => made.extend(boxes.into_iter().map(|sandbox| Made {
                    provider: of.provider.clone(),
                    sandbox,
                })),
                Err(e) => {
                    // A context of its own: the fork's may be what ran out.
                    let undo = Ctx::background().with_timeout(std::time::Duration::from_secs(30));
                    for m in made {
                        let _ = m.sandbox.destroy(&undo).await;
                    }
                    return Err(not_made(e));
                }
            }
        }
        tracing::info!(box_id = %of.sandbox.id(), n = made.len(), key = %key.name, "e2b: sandbox forked");
        Ok(made)
    }
}

/// The server's key behind an E2B caller.
fn key_of(caller: &Caller) -> Result<&KeyInfo, Refusal> {
    caller
        .record
        .downcast_ref::<KeyInfo>()
        .ok_or_else(|| Refusal::new(500, "the caller is not one of this server's keys"))
}

/// A box the provider did not make, in E2B's words.
fn not_made(e: agentbox_core::Error) -> Refusal {
    let status = match e.code() {
        ErrorCode::Invalid | ErrorCode::Unsupported => 400,
        ErrorCode::NotFound => 404,
        _ => 500,
    };
    Refusal::new(status, format!("the sandbox could not be made: {}", e.message()))
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

    /// The providers `key` may use that keep snapshots, made.
    async fn snapshot_providers(&self, key: &KeyInfo) -> Vec<Arc<dyn agentbox_core::Provider>> {
        let mut out = Vec::new();
        for name in registry::names() {
            if may_use(key, name).is_err() {
                continue;
            }
            if let Ok(p) = self.state.provider(name).await
                && p.honours().snapshots
            {
                out.push(p);
            }
        }
        out
    }

    /// The provider and spec of `ask`'s box: its template mapped, or the key's own snapshot of
    /// that name, or `base`.
    async fn placed(&self, key: &KeyInfo, ask: &Ask) -> Result<(String, Spec), Refusal> {
        let mut spec = Spec::new(ask.lifetime);
        spec.network = ask.network.clone();
        spec.env = ask.env.clone();
        let name = match self.templates.get(&ask.template) {
            Some(t) => {
                spec.image = t.image.clone();
                spec.workspace = t.workspace.clone();
                t.provider
                    .clone()
                    .unwrap_or_else(|| self.state.default_provider.clone())
            }
            None if ask.template == "base" => self.state.default_provider.clone(),
            None => match self.snapshot_of(key, &ask.template).await? {
                Some(provider) => {
                    spec.snapshot = Some(full_name(key, &ask.template).map_err(refusal)?);
                    provider
                }
                None => {
                    return Err(Refusal::new(
                        404,
                        format!(
                            "template '{}' not found: neither a snapshot of this key's nor a template this server \
                             maps ({}; agentbox serve --e2b-template NAME=PROVIDER[:IMAGE])",
                            ask.template,
                            self.names()
                        ),
                    ));
                }
            },
        };
        self.with_ports(&name, &mut spec).await;
        let mut spec = allowed_spec(key, &name, &[], spec).map_err(refusal)?;
        spec.labels.insert(SANDBOX_LABEL.to_string(), ask.sandbox_id.clone());
        Ok((name, spec))
    }

    /// The ports a sandbox's box forwards ([`ServerOptions::e2b_ports`]), on a provider that
    /// reaches a box's port only when its spec asks for it, and for a box whose network is
    /// not restricted. E2B reaches any port of a sandbox; a box with a network of its own is
    /// reached at a port its spec named. A restricted box is asked for none: a Docker box with
    /// an allowlist has loopback alone, and no port can be published from it.
    ///
    /// [`ServerOptions::e2b_ports`]: crate::ServerOptions::e2b_ports
    async fn with_ports(&self, provider: &str, spec: &mut Spec) {
        if spec.network.is_some() {
            return;
        }
        if let Ok(p) = self.state.provider(provider).await
            && p.honours().ports
        {
            spec.ports = self
                .state
                .e2b_ports
                .iter()
                .map(|&port| agentbox_core::PortSpec {
                    port,
                    kind: agentbox_core::PortKind::Tcp,
                })
                .collect();
        }
    }

    /// The provider that keeps `key`'s snapshot `name`, if one does.
    async fn snapshot_of(&self, key: &KeyInfo, name: &str) -> Result<Option<String>, Refusal> {
        let Ok(full) = full_name(key, name) else {
            return Ok(None);
        };
        let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
        for p in self.snapshot_providers(key).await {
            if p.snapshots(&ctx)
                .await
                .map_err(|e| refusal(e.into()))?
                .iter()
                .any(|s| s.name == full)
            {
                return Ok(Some(p.name().to_string()));
            }
        }
        Ok(None)
    }
}

/// E2B's API over `state`'s keys and providers. Every sandbox demands its envd token: envd's
/// calls carry no API key.
pub(crate) fn api(state: Arc<AppState>) -> agentbox_e2b::E2b {
    let templates = state.e2b_templates.clone();
    let options = agentbox_e2b::E2bOptions {
        always_secure: true,
        domain: state.e2b_domain.clone(),
        // A key's own longest lifetime is checked as on /v1; E2B's Pro plan's longest here.
        max_timeout: std::time::Duration::from_secs(24 * 3600),
        ..Default::default()
    };
    agentbox_e2b::E2b::new(Arc::new(ServiceBackend { state, templates }), options)
        .unwrap_or_else(|e| unreachable!("the default E2B options are valid: {e}"))
}

//! What every request shares: the keys, and the providers made from the registry (each made
//! once, at its first use, and kept).

use std::collections::HashMap;
use std::sync::Arc;

use agentbox_core::{Error, Provider, Result, Sandbox};
use agentbox_providers::registry::{self, Environment, Options};

use crate::keys::Keys;

/// The label the service writes on every box it makes: the id of the key that made it (never
/// the key). A spec may not set it.
pub const OWNER_LABEL: &str = "agentbox-server.owner";

/// How a server is set up. See [`crate::router`].
pub struct ServerOptions {
    /// Who may call it.
    pub keys: Arc<Keys>,
    /// The variables and helper program providers are made from.
    pub environment: Environment,
    /// How providers make boxes (a runner in each where they can, by default).
    pub provider_options: Options,
    /// The provider a create that names none uses.
    pub default_provider: String,
    /// The largest request body taken, in bytes (a larger one is answered 413).
    pub max_body: usize,
    /// How long a client may take between two pieces of a request's body before the request
    /// fails with `timeout` ([`crate::BODY_DEADLINE`] by default).
    pub body_deadline: std::time::Duration,
    /// Where this host's runs live (`<root>/runs/<id>`); `None`: the environment's home.
    pub runs_root: Option<std::path::PathBuf>,
    /// The ledger `/v1/ledger` reads; `None`: the JSON lines under the home's `ledger`.
    pub ledger: Option<Arc<dyn agentbox_transport::ledger::LedgerStore>>,
    /// The receipts file `/v1/receipts` adds up; `None`: none is read.
    pub receipts: Option<std::path::PathBuf>,
    /// The E2B templates [`crate::Service::e2b`] maps, each to a provider and image.
    pub e2b_templates: crate::e2b::Templates,
    /// The domain of E2B's domain mode (`E2B_DOMAIN`); `None`: one URL, sandboxes named by
    /// header.
    pub e2b_domain: Option<agentbox_e2b::Domain>,
    /// The ports of a sandbox E2B's proxy reaches (`get_host(port)`), on a provider that
    /// forwards only the ports a box's spec names (namespace and Docker boxes with a network
    /// of their own): [`crate::e2b::PORTS`] unless set.
    pub e2b_ports: Vec<u16>,
    /// The secrets a create may ask for (`agentbox serve --secret`): a request's `spec.secrets`
    /// may name only these, each with its source as given here and hosts among its hosts, so a
    /// key can never have this server read another of its variables or files, or send a value
    /// elsewhere.
    pub secrets: Vec<agentbox_core::SecretSpec>,
}

impl ServerOptions {
    /// A server over `keys` with the registry's providers on this process's variables, the
    /// default provider `local`, and 16 MiB bodies.
    pub fn new(keys: Arc<Keys>) -> Self {
        ServerOptions {
            keys,
            environment: Environment::from_process(),
            provider_options: Options::default(),
            default_provider: "local".into(),
            max_body: 16 << 20,
            body_deadline: crate::BODY_DEADLINE,
            runs_root: None,
            ledger: None,
            receipts: None,
            e2b_templates: Default::default(),
            e2b_domain: None,
            e2b_ports: crate::e2b::PORTS.to_vec(),
            secrets: Vec::new(),
        }
    }
}

/// How long a provider that could not be made answers its failure before it is tried again.
pub(crate) const FAILED_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// A provider made, or why it was not.
#[derive(Default)]
struct Slot {
    made: Option<Arc<dyn Provider>>,
    failed: Option<(std::time::Instant, Error)>,
}

pub(crate) struct AppState {
    pub(crate) keys: Arc<Keys>,
    pub(crate) e2b_templates: crate::e2b::Templates,
    pub(crate) e2b_domain: Option<agentbox_e2b::Domain>,
    pub(crate) e2b_ports: Vec<u16>,
    pub(crate) default_provider: String,
    /// The secrets a create may ask for: see [`ServerOptions::secrets`].
    pub(crate) secrets: Vec<agentbox_core::SecretSpec>,
    environment: Environment,
    provider_options: Options,
    /// Each provider's slot, locked alone: one provider slow to make stalls nothing else.
    providers: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<Slot>>>>,
    /// One lock per key, held while a key's boxes are counted and one is made.
    key_locks: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Each key's request rate.
    pub(crate) rates: crate::rate::Rates,
    runs_root: Option<std::path::PathBuf>,
    ledger: std::sync::Mutex<Option<Arc<dyn agentbox_transport::ledger::LedgerStore>>>,
    receipts: Option<std::path::PathBuf>,
    /// What `/metrics` shows.
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    /// The MCP sessions and whose each is.
    pub(crate) mcp: crate::mcp::Sessions,
    /// Boxes reached lately, by id. See [`AppState::cached_box`].
    boxes: std::sync::Mutex<HashMap<String, Kept>>,
    /// Bumped when this server makes, ends or changes a box: the live views list again at
    /// once instead of at their next tick.
    pub(crate) changes: tokio::sync::watch::Sender<u64>,
    /// Set when the server stops: the live views end, so the drain does not wait on them.
    pub(crate) ending: Arc<tokio::sync::watch::Sender<bool>>,
    /// Counts [`AppState::forget_box`]: see [`AppState::keep_box`].
    forgets: std::sync::atomic::AtomicU64,
    /// Each box's status as last asked, and when: the live views ask each box at most every
    /// [`STATUS_KEPT_FOR`], and a box this server changes is asked again at once.
    statuses: std::sync::Mutex<HashMap<String, (String, std::time::Instant)>>,
}

/// How long a box's status, as the live views show it, is kept before it is asked again.
pub(crate) const STATUS_KEPT_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// A box reached, and when.
type Kept = (Arc<dyn Sandbox>, std::time::Instant);

/// How long a box reached is kept for the next call on it.
pub(crate) const BOX_KEPT_FOR: std::time::Duration = std::time::Duration::from_secs(30);
/// The most boxes kept at once.
const MAX_KEPT: usize = 4096;

impl AppState {
    pub(crate) fn new(o: ServerOptions) -> Self {
        AppState {
            keys: o.keys,
            e2b_templates: o.e2b_templates,
            e2b_domain: o.e2b_domain,
            e2b_ports: o.e2b_ports,
            default_provider: o.default_provider,
            secrets: o.secrets,
            environment: o.environment,
            provider_options: o.provider_options,
            providers: std::sync::Mutex::new(HashMap::new()),
            key_locks: std::sync::Mutex::new(HashMap::new()),
            rates: Default::default(),
            runs_root: o.runs_root,
            ledger: std::sync::Mutex::new(o.ledger),
            receipts: o.receipts,
            metrics: Default::default(),
            mcp: Default::default(),
            boxes: Default::default(),
            changes: tokio::sync::watch::Sender::new(0),
            forgets: Default::default(),
            ending: Arc::new(tokio::sync::watch::Sender::new(false)),
            statuses: Default::default(),
        }
    }

    /// Say a box was made, ended or changed: the live views look again now.
    pub(crate) fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The status of box `id` as asked within [`STATUS_KEPT_FOR`], if it was.
    pub(crate) fn kept_status(&self, id: &str) -> Option<String> {
        let kept = self.statuses.lock().unwrap_or_else(|p| p.into_inner());
        kept.get(id)
            .filter(|(_, at)| at.elapsed() < STATUS_KEPT_FOR)
            .map(|(s, _)| s.clone())
    }

    /// Keep the status of box `id`, asked just now; boxes no longer listed are let go.
    pub(crate) fn keep_status(&self, id: &str, status: &str) {
        let mut kept = self.statuses.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() >= 4 * MAX_KEPT {
            kept.retain(|_, (_, at)| at.elapsed() < STATUS_KEPT_FOR);
        }
        kept.insert(id.to_string(), (status.to_string(), std::time::Instant::now()));
    }

    /// The lock of key `id`: its boxes counted and one made under it, so two requests at once
    /// cannot pass the key's most boxes.
    pub(crate) async fn key_lock(&self, id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = self
            .key_locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.to_string())
            .or_default()
            .clone();
        lock.lock_owned().await
    }

    /// The box `id` as it was reached within [`BOX_KEPT_FOR`], if it was. A box's handle
    /// keeps what it connected (its runner's connection, its API client), so the calls of an
    /// agent's turn, one after another, reuse it instead of attaching anew each time. Ownership
    /// is checked by the caller on every call, handle kept or not; a box this server ends,
    /// sleeps, wakes or extends is let go ([`AppState::forget_box`]). One ended elsewhere
    /// answers its provider's error until it is let go.
    pub(crate) fn cached_box(&self, id: &str) -> Option<Arc<dyn Sandbox>> {
        let mut kept = self.boxes.lock().unwrap_or_else(|p| p.into_inner());
        match kept.get(id) {
            Some((b, at)) if at.elapsed() < BOX_KEPT_FOR => Some(b.clone()),
            Some(_) => {
                kept.remove(id);
                None
            }
            None => None,
        }
    }

    /// How many boxes were let go so far: read before attaching to a box, and given to
    /// [`AppState::keep_box`], so a handle attached while its box was changed is not kept.
    pub(crate) fn forgotten(&self) -> u64 {
        self.forgets.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Keep `b`, reached just now, unless a box was let go since `seen` ([`AppState::forgotten`]):
    /// a handle attached while its box was extended or slept would keep its old facts.
    pub(crate) fn keep_box(&self, b: &Arc<dyn Sandbox>, seen: u64) {
        let mut kept = self.boxes.lock().unwrap_or_else(|p| p.into_inner());
        if self.forgotten() != seen {
            return;
        }
        // Handles past their time let go now (each may hold a connection), not when asked for.
        kept.retain(|_, (_, at)| at.elapsed() < BOX_KEPT_FOR);
        if kept.len() >= MAX_KEPT {
            kept.clear();
        }
        kept.insert(b.id().to_string(), (b.clone(), std::time::Instant::now()));
    }

    /// Let the box `id` go: the next call attaches to it anew, and the live views look again.
    pub(crate) fn forget_box(&self, id: &str) {
        let mut kept = self.boxes.lock().unwrap_or_else(|p| p.into_inner());
        self.forgets.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        kept.remove(id);
        drop(kept);
        self.statuses.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        self.changed();
    }

    /// Let the box `id` go now and again when the guard drops: for a call that changes the box
    /// (sleep, wake, extend, end), so a handle another request attached meanwhile, holding
    /// what the box was, is not the one kept after it ([`AppState::keep_box`]).
    pub(crate) fn changing<'a>(&'a self, id: &'a str) -> Changing<'a> {
        self.forget_box(id);
        Changing { state: self, id }
    }

    /// Where this host's runs live.
    pub(crate) fn runs_root(&self) -> Result<std::path::PathBuf> {
        match &self.runs_root {
            Some(r) => Ok(r.clone()),
            None => self.environment.home(),
        }
    }

    /// The ledger: the one given, else the JSON lines under the home's `ledger` (opened once).
    pub(crate) fn ledger(&self) -> Result<Arc<dyn agentbox_transport::ledger::LedgerStore>> {
        let mut held = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = held.as_ref() {
            return Ok(l.clone());
        }
        let dir = self.environment.home()?.join("ledger");
        let opened: Arc<dyn agentbox_transport::ledger::LedgerStore> =
            Arc::new(agentbox_transport::ledger::JsonlLedger::open(&dir)?);
        *held = Some(opened.clone());
        Ok(opened)
    }

    /// The receipts file, if the server reads one.
    pub(crate) fn receipts(&self) -> Option<std::path::PathBuf> {
        self.receipts.clone()
    }

    /// The providers made so far, by name.
    pub(crate) fn made_providers(&self) -> Vec<(String, Arc<dyn Provider>)> {
        let slots: Vec<(String, Arc<tokio::sync::Mutex<Slot>>)> = self
            .providers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(n, s)| (n.clone(), s.clone()))
            .collect();
        slots
            .into_iter()
            .filter_map(|(n, s)| Some((n, s.try_lock().ok()?.made.clone()?)))
            .collect()
    }

    /// The provider called `name`, made at its first use and kept; a failure is answered again
    /// for [`FAILED_FOR`] before the next try.
    pub(crate) async fn provider(&self, name: &str) -> Result<Arc<dyn Provider>> {
        let entry = registry::find(name)?;
        let slot = self
            .providers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(entry.name.to_string())
            .or_default()
            .clone();
        let mut slot = slot.lock().await;
        if let Some(p) = &slot.made {
            return Ok(p.clone());
        }
        if let Some((at, e)) = &slot.failed
            && at.elapsed() < FAILED_FOR
        {
            return Err(e.clone());
        }
        match entry.make(&self.provider_options, &self.environment).await {
            Ok(p) => {
                tracing::info!(provider = entry.name, "provider made");
                slot.made = Some(p.clone());
                slot.failed = None;
                Ok(p)
            }
            Err(e) => {
                let e = Error::new(e.code(), format!("provider {name}: {}", e.message()));
                tracing::info!(provider = entry.name, "provider not made: {}", e.message());
                slot.failed = Some((std::time::Instant::now(), e.clone()));
                Err(e)
            }
        }
    }
}

/// A box being changed: see [`AppState::changing`].
pub(crate) struct Changing<'a> {
    state: &'a AppState,
    id: &'a str,
}

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        self.state.forget_box(self.id);
    }
}

//! [`Transport`]: where each conversation's tools run.
//!
//! `env(conversation)` hands out a lazy [`ExecutionEnv`]: its cwd is `.` and its id ends in
//! `:unopened` until its box exists, and the box is made at its first file operation or
//! command. The box's id is written to the session's documents before any tool runs in it, so
//! a transport opened later over the same documents attaches to that box; concurrent first uses
//! share one creation. A box that cannot be made, or that ended behind the session's back, is
//! that call's error (with the provider's code), and the next call asks for a box again;
//! `on_lost` fires once for a lost box, however many calls find it out.
//!
//! A host may ready each new box before any tool runs in it ([`TransportHost::prepare`]: the
//! MCP server seeds a workspace there), and end one conversation's boxes when it leaves
//! ([`Transport::end`]) while the others go on.
//!
//! An environment with `pool = N` makes its boxes through a warm pool
//! ([`agentbox_providers::pool::Pool`]) of N ready boxes of its spec, so a conversation's first
//! call takes a ready box instead of waiting for one to start.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentbox_core::{Ctx, Error, ErrorCode, Labels, Provider, Result, Sandbox, SandboxId, check_spec};
use agentbox_hands::watch::Watcher;
use agentbox_hands::{
    BinaryReader, BoxEnv, Change, Command, ExecCode, ExecError, ExecOptions, ExecOutcome, ExecutionEnv, FileInfo,
    FsCode, FsError, StartOptions, WatchTarget,
};
use async_trait::async_trait;
use serde_json::json;

use agentbox_providers::pool::{Pool, PoolOptions};

use crate::config::{Scope, TransportConfig};
use crate::documents::Documents;

/// The prefix of the session documents that name boxes: `transport.boxes/<scope>/<env>`.
pub const BOXES_DOC: &str = "transport.boxes/";
/// The conversation document that holds its assigned role: `transport.hands/<conversation>`.
pub const HANDS_DOC: &str = "transport.hands/";

/// A box a transport found lost (ended behind the session's back).
#[derive(Clone, Debug)]
pub struct Lost {
    /// The box.
    pub id: SandboxId,
    /// The environment it served.
    pub environment: String,
    /// What the call that found it out was told.
    pub why: String,
}

/// How long making a box (and readying it) may take when the call asking for it has no
/// sooner deadline.
pub const MAKE_DEADLINE: Duration = Duration::from_secs(300);

/// Readies a box the transport has just made, before any tool runs in it (seeds a workspace,
/// say). An error ends the box and is the error of the call that asked for it.
pub type Prepare = Arc<dyn Fn(Arc<BoxEnv>, Ctx) -> Pin<Box<dyn Future<Output = Result<()>> + Send>> + Send + Sync>;

/// What the host gives a transport.
#[derive(Clone)]
pub struct TransportHost {
    /// The providers the host serves, by the name environments give (`local`, `docker`).
    pub providers: BTreeMap<String, Arc<dyn Provider>>,
    /// The session's documents.
    pub documents: Arc<dyn Documents>,
    /// The session these documents and boxes belong to.
    pub session: String,
    /// Labels put on every box the transport makes (a session id, say), over the environment's.
    pub labels: Labels,
    /// Called once for each box found lost.
    pub on_lost: Option<Arc<dyn Fn(Lost) + Send + Sync>>,
    /// Called for each box the transport makes (not for one found again through the
    /// documents), before any tool runs in it.
    pub prepare: Option<Prepare>,
}

/// Where a session's conversations run their tools. See the [module documentation](self).
///
/// ```no_run
/// # async fn f(host: agentbox_transport::TransportHost) -> agentbox_core::Result<()> {
/// use agentbox_core::Ctx;
/// use agentbox_transport::{Transport, TransportConfig};
/// let config = TransportConfig::from_toml("hands = \"sandbox\"\n[environments.sandbox]\nprovider = \"local\"")?;
/// let transport = Transport::new(config, host)?;
/// let env = transport.env("conversation-1").expect("the config names hands");
/// env.write_file("notes.txt", b"hi", &Ctx::background()).await.ok(); // the box is made here
/// transport.destroy(&Ctx::background()).await?;
/// # Ok(()) }
/// ```
pub struct Transport {
    inner: Arc<Inner>,
}

struct Inner {
    config: TransportConfig,
    host: TransportHost,
    /// The warm pools of the environments that ask for one, by environment.
    pools: BTreeMap<String, Arc<Pool>>,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    lost_seen: Mutex<HashSet<String>>,
}

/// One box's place: the box once made, behind a lock that makes concurrent first uses share
/// one creation.
#[derive(Default)]
struct Slot {
    open: tokio::sync::Mutex<Option<Arc<BoxEnv>>>,
    now: Mutex<Option<Arc<BoxEnv>>>,
}

impl Transport {
    /// A transport for `config`, refusing at start what the host cannot serve: an environment
    /// whose provider the host did not pass, or whose spec that provider cannot honour. An
    /// environment with a pool starts filling it now (which needs a tokio runtime).
    pub fn new(config: TransportConfig, host: TransportHost) -> Result<Self> {
        let mut pools = BTreeMap::new();
        for (name, env) in &config.environments {
            // A `local` environment the host passed no provider for is the host's own: its
            // conversations get no environment from the transport ([`Transport::env`]).
            if env.provider == LOCAL && !host.providers.contains_key(LOCAL) {
                continue;
            }
            let Some(p) = host.providers.get(&env.provider) else {
                let passed: Vec<&str> = host.providers.keys().map(String::as_str).collect();
                // A name agentbox has not heard of is most likely a typo: list agentbox's.
                let known = match agentbox_providers::registry::find(&env.provider) {
                    Ok(_) => String::new(),
                    Err(_) => format!("; agentbox's providers: {}", agentbox_providers::registry::choices()),
                };
                return Err(Error::unsupported(format!(
                    "transport config: environments.{name}.provider: {:?} is not a provider this host passed ({}{known})",
                    env.provider,
                    if passed.is_empty() {
                        "it passed none".to_string()
                    } else {
                        format!("it passed {}", passed.join(", "))
                    }
                )));
            };
            check_spec(&env.spec, &p.honours(), &env.provider)
                .map_err(|e| e.context(format!("transport config: environments.{name}")))?;
            if env.pool > 0 {
                let opts = PoolOptions {
                    size: env.pool,
                    ..Default::default()
                };
                let pool = Pool::new(p.clone(), env.spec.clone(), opts)
                    .map_err(|e| e.context(format!("transport config: environments.{name}.pool")))?;
                pools.insert(name.clone(), Arc::new(pool));
            }
        }
        tracing::debug!(
            session = %host.session,
            environments = config.environments.len(),
            scope = ?config.scope,
            "transport ready"
        );
        Ok(Transport {
            inner: Arc::new(Inner {
                config,
                host,
                pools,
                slots: Mutex::new(HashMap::new()),
                lost_seen: Mutex::new(HashSet::new()),
            }),
        })
    }

    /// The conversation's environment, or `None` when the host's own should serve: the config
    /// names no hands, or its hands are a `local` environment and the host passed no `local`
    /// provider. Nothing is made until its first operation.
    ///
    /// ```no_run
    /// # fn f(t: &agentbox_transport::Transport, own: std::sync::Arc<dyn agentbox_hands::ExecutionEnv>) {
    /// let env = t.env("conversation-1").unwrap_or(own); // the host's own environment behind it
    /// # }
    /// ```
    pub fn env(&self, conversation: &str) -> Option<Arc<dyn ExecutionEnv>> {
        let hands = self.inner.config.hands.as_ref()?;
        if self.inner.hosts_itself(&hands.default) {
            tracing::debug!(conversation, environment = %hands.default, "the host's own environment (no local provider passed)");
            return None;
        }
        tracing::debug!(conversation, "environment made (its box comes at its first call)");
        Some(Arc::new(LazyEnv {
            inner: self.inner.clone(),
            conversation: conversation.to_string(),
        }))
    }

    /// Point a conversation's tools at a role or any declared environment, from its next call.
    /// Kept as a conversation document; a fork (a new conversation) starts on the default.
    pub async fn assign(&self, conversation: &str, role: &str) -> Result<()> {
        let Some(env) = self.inner.config.resolve(role) else {
            return Err(Error::invalid(format!(
                "assign: {role:?} is neither a role nor a declared environment"
            )));
        };
        if self.inner.hosts_itself(env) {
            return Err(Error::unsupported(format!(
                "assign: {role:?} is the local environment {env:?}, which this host serves itself (it passed no local provider): a conversation's environment cannot move to the host"
            )));
        }
        // A default the host serves itself gives a conversation no environment of the
        // transport's (`env` is `None`), so there is nothing to point elsewhere.
        if let Some(h) = &self.inner.config.hands
            && self.inner.hosts_itself(&h.default)
        {
            return Err(Error::unsupported(format!(
                "assign: the default environment {:?} is this host's own (it passed no local provider), so a conversation has no environment of the transport's to point at {role:?}",
                h.default
            )));
        }
        self.inner
            .host
            .documents
            .put(
                &self.inner.host.session,
                &format!("{HANDS_DOC}{conversation}"),
                &json!(role),
            )
            .await
    }

    /// Wait until every environment's pool holds its ready boxes (or `ctx` ends).
    pub async fn warm(&self, ctx: &Ctx) -> Result<()> {
        for (name, pool) in &self.inner.pools {
            pool.warm(ctx)
                .await
                .map_err(|e| e.context(format!("environment {name}")))?;
        }
        Ok(())
    }

    /// Destroy the ready boxes of every environment's pool, which stop refilling (boxes handed
    /// out are the session's and left alone). Dropping the transport does the same, best effort.
    pub async fn close_pools(&self, ctx: &Ctx) -> Result<()> {
        let mut first = None;
        for (name, pool) in &self.inner.pools {
            if let Err(e) = pool.close(ctx).await {
                first.get_or_insert(e.context(format!("environment {name}")));
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Forget the boxes and leave them running, for a host that opens the session again (a box
    /// nobody comes back to ends at its lifetime).
    pub fn release(&self) {
        self.inner.slots.lock().unwrap().clear();
    }

    /// End every box of the session, also those only the documents still name, and forget them.
    /// Returns the boxes ended.
    pub async fn destroy(&self, ctx: &Ctx) -> Result<Vec<SandboxId>> {
        self.release();
        self.inner.end_named(BOXES_DOC, ctx).await
    }

    /// End every program left running in the boxes the session's documents name, the boxes
    /// kept: what a holder whose claim was taken (it died, or its lease ran out) left behind,
    /// ended before the next holder's first step. A box with a runner has each running process
    /// killed; one without has the command groups its scripts wrote down killed
    /// ([`agentbox_hands::end_left_commands`]). A box that is gone has nothing to end. Returns
    /// how many programs (processes or groups) were ended.
    pub async fn end_left_programs(&self, ctx: &Ctx) -> Result<usize> {
        let h = &self.inner.host;
        let mut ended = 0;
        for (_, value) in h.documents.list(&h.session, BOXES_DOC).await? {
            let Some(id) = value
                .get("id")
                .and_then(|v| v.as_str())
                .and_then(|s| s.parse::<SandboxId>().ok())
            else {
                continue;
            };
            let p = h.providers.get(id.provider()).ok_or_else(|| {
                Error::unsupported(format!(
                    "ending what a holder left in box {id}: it is a {} box and this host passed no such provider",
                    id.provider()
                ))
            })?;
            let Some(b) = p.attach(&id, ctx).await? else { continue };
            let running = |all: Vec<agentbox_core::ProcessInfo>| {
                all.into_iter()
                    .filter(|p| matches!(p.state, agentbox_core::ProcessState::Running))
                    .map(|p| p.handle)
                    .collect::<Vec<u64>>()
            };
            // A runner reached for the first time may turn out to keep no processes (it
            // speaks protocol 2 alone): the box's scripts' groups are then what there is.
            let listed = match b.processes() {
                Some(ps) => match ps.list(ctx).await {
                    Ok(all) => Some((ps, all)),
                    Err(e) if e.code() == ErrorCode::Unsupported => None,
                    Err(e) => return Err(e.context(format!("listing the programs of box {id}"))),
                },
                None => None,
            };
            let n = match listed {
                Some((ps, all)) => {
                    let mut killed = Vec::new();
                    for handle in running(all) {
                        match ps.signal(handle, 9, ctx).await {
                            Ok(()) => killed.push(handle),
                            // Ended meanwhile.
                            Err(e) if e.code() == ErrorCode::NotFound => {}
                            Err(e) => return Err(e.context(format!("ending a program in box {id}"))),
                        }
                    }
                    // Gone before the next holder's first step, not only signalled.
                    let until = tokio::time::Instant::now() + Duration::from_secs(5);
                    loop {
                        let left = running(ps.list(ctx).await?);
                        let still: Vec<&u64> = killed.iter().filter(|h| left.contains(h)).collect();
                        if still.is_empty() {
                            break;
                        }
                        if tokio::time::Instant::now() >= until {
                            return Err(Error::timeout(format!(
                                "box {id}: the programs {still:?} a holder left were killed and still run after 5s"
                            )));
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    killed.len()
                }
                None => agentbox_hands::end_left_commands(&*b, ctx).await?.len(),
            };
            if n > 0 {
                tracing::warn!(box_id = %id, ended = n, "ended the programs a holder left running in the box");
            }
            ended += n;
        }
        Ok(ended)
    }

    /// End the boxes of one conversation that is leaving (with scope `session`, the session's
    /// boxes, which it shares: every box), and forget them; the other conversations' boxes go
    /// on. Returns the boxes ended.
    pub async fn end(&self, conversation: &str, ctx: &Ctx) -> Result<Vec<SandboxId>> {
        let prefix = self.inner.scope_prefix(conversation);
        self.inner.slots.lock().unwrap().retain(|k, _| !k.starts_with(&prefix));
        self.inner.end_named(&prefix, ctx).await
    }

    /// The box a conversation's calls run in now, if one is open.
    pub fn opened(&self, conversation: &str) -> Option<Arc<BoxEnv>> {
        self.inner.current(conversation)
    }
}

/// The provider name of the host's own machine.
const LOCAL: &str = "local";

impl Inner {
    /// Whether the environment `name` is served by the host itself: a `local` environment the
    /// host passed no `local` provider for.
    fn hosts_itself(&self, name: &str) -> bool {
        self.config
            .environments
            .get(name)
            .is_some_and(|e| e.provider == LOCAL && !self.host.providers.contains_key(LOCAL))
    }

    /// End every box the documents name under `prefix`, and remove their documents.
    async fn end_named(&self, prefix: &str, ctx: &Ctx) -> Result<Vec<SandboxId>> {
        let h = &self.host;
        let named = h.documents.list(&h.session, prefix).await?;
        let mut ended = Vec::new();
        let mut first_error = None;
        for (key, value) in named {
            let Some(id) = value
                .get("id")
                .and_then(|v| v.as_str())
                .and_then(|s| s.parse::<SandboxId>().ok())
            else {
                h.documents.delete(&h.session, &key).await?;
                continue;
            };
            let Some(p) = h.providers.get(id.provider()) else {
                first_error.get_or_insert(Error::unsupported(format!(
                    "destroy: box {id} is a {} box and this host passed no such provider",
                    id.provider()
                )));
                continue;
            };
            match p.attach(&id, ctx).await {
                Ok(Some(b)) => match b.destroy(ctx).await {
                    Ok(()) => {
                        tracing::info!(box_id = %id, "box ended");
                        ended.push(id)
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                        continue;
                    }
                },
                Ok(None) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                    continue;
                }
            }
            h.documents.delete(&h.session, &key).await?;
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(ended),
        }
    }

    /// The prefix of the documents (and slots) of the boxes a conversation's calls may use.
    fn scope_prefix(&self, conversation: &str) -> String {
        match self.config.scope {
            Scope::Session => format!("{BOXES_DOC}session/"),
            Scope::Conversation => format!("{BOXES_DOC}conversation/{conversation}/"),
        }
    }

    /// The box open now for a conversation, if any (for the synchronous id and cwd). Any
    /// open box of its scope: the assigned one is found at the next call.
    fn current(&self, conversation: &str) -> Option<Arc<BoxEnv>> {
        let prefix = self.scope_prefix(conversation);
        let slots = self.slots.lock().unwrap();
        slots
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .find_map(|(_, s)| s.now.lock().unwrap().clone())
    }

    /// The environment a conversation's next call runs in.
    async fn target(&self, conversation: &str) -> Result<String> {
        let hands = self
            .config
            .hands
            .as_ref()
            .ok_or_else(|| Error::invalid("the transport config names no hands"))?;
        let assigned = self
            .host
            .documents
            .get(&self.host.session, &format!("{HANDS_DOC}{conversation}"))
            .await?;
        let role = assigned.as_ref().and_then(|v| v.as_str());
        Ok(match role.and_then(|r| self.config.resolve(r)) {
            Some(env) => env.to_string(),
            None => hands.default.clone(),
        })
    }

    fn doc_key(&self, conversation: &str, env: &str) -> String {
        format!("{}{env}", self.scope_prefix(conversation))
    }

    fn slot(&self, key: &str) -> Arc<Slot> {
        self.slots.lock().unwrap().entry(key.to_string()).or_default().clone()
    }

    /// The box for this call: the one open, else the one the documents name, else a new one
    /// (its id written down before it is used).
    async fn open(&self, conversation: &str, ctx: &Ctx) -> Result<(Arc<BoxEnv>, String, Arc<Slot>)> {
        let env_name = self.target(conversation).await?;
        let key = self.doc_key(conversation, &env_name);
        let slot = self.slot(&key);
        let mut open = slot.open.lock().await;
        if let Some(env) = open.as_ref() {
            return Ok((env.clone(), env_name, slot.clone()));
        }
        let environment = &self.config.environments[&env_name];
        let provider = self.host.providers.get(&environment.provider).ok_or_else(|| {
            Error::unsupported(format!(
                "no provider {:?} for environment {env_name}",
                environment.provider
            ))
        })?;
        let h = &self.host;
        let named = h.documents.get(&h.session, &key).await?;
        let mut found: Option<Arc<dyn Sandbox>> = None;
        if let Some(id) = named
            .as_ref()
            .and_then(|v| v.get("id")?.as_str()?.parse::<SandboxId>().ok())
            && id.provider() == provider.name()
        {
            found = provider.attach(&id, ctx).await?;
        }
        let mut made = false;
        let sandbox = match found {
            Some(b) => {
                tracing::info!(box_id = %b.id(), environment = %env_name, "box found through the session's documents");
                b
            }
            None => {
                let mut spec = environment.spec.clone();
                spec.labels.extend(h.labels.clone());
                let maker: &dyn Provider = match self.pools.get(&env_name) {
                    Some(pool) => &**pool,
                    None => &**provider,
                };
                let ctx = &ctx.with_timeout(MAKE_DEADLINE);
                let b = maker.create(&spec, ctx).await.map_err(|e| {
                    tracing::warn!(environment = %env_name, code = %e.code(), "no box: {}", e.message());
                    Error::new(e.code(), format!("environment {env_name}: no box: {}", e.message()))
                })?;
                tracing::info!(
                    box_id = %b.id(),
                    environment = %env_name,
                    runner = b.facts().runner.is_some(),
                    "box made"
                );
                let doc = json!({"id": b.id().to_string(), "environment": env_name});
                if let Err(e) = h.documents.put(&h.session, &key, &doc).await {
                    // Unrecorded, the box would be nobody's: end it now.
                    let _ = b.destroy(ctx).await;
                    return Err(e.context("writing the box's id to the session's documents"));
                }
                made = true;
                b
            }
        };
        let env = Arc::new(BoxEnv::new(sandbox));
        if made && let Some(prepare) = &h.prepare {
            let ctx = ctx.with_timeout(MAKE_DEADLINE);
            if let Err(e) = prepare(env.clone(), ctx.clone()).await {
                let b = env.sandbox();
                tracing::warn!(box_id = %b.id(), environment = %env_name, "the host could not ready the box: {e}");
                // The call may have been cancelled: the box ends on a context of its own.
                let _ = b
                    .destroy(&Ctx::background().with_timeout(Duration::from_secs(60)))
                    .await;
                let _ = h.documents.delete(&h.session, &key).await;
                return Err(e);
            }
        }
        *open = Some(env.clone());
        *slot.now.lock().unwrap() = Some(env.clone());
        Ok((env, env_name, slot.clone()))
    }

    /// After a call: a box the call found lost is forgotten (the next call asks for a box
    /// again) and reported once.
    async fn after(&self, env: &Arc<BoxEnv>, env_name: &str, slot: &Slot) {
        let Some(why) = env.lost() else { return };
        {
            let mut open = slot.open.lock().await;
            if open.as_ref().is_some_and(|e| Arc::ptr_eq(e, env)) {
                *open = None;
                *slot.now.lock().unwrap() = None;
            }
        }
        let id = env.sandbox().id().clone();
        let first = self.lost_seen.lock().unwrap().insert(id.to_string());
        if first {
            tracing::warn!(box_id = %id, environment = env_name, "box lost: {why}");
        }
        if first && let Some(f) = &self.host.on_lost {
            f(Lost {
                id,
                environment: env_name.to_string(),
                why,
            });
        }
    }
}

/// A conversation's environment, whose box is made at its first operation.
struct LazyEnv {
    inner: Arc<Inner>,
    conversation: String,
}

fn fs_error(e: Error) -> FsError {
    let code = match e.code() {
        ErrorCode::Aborted | ErrorCode::Timeout => FsCode::Aborted,
        _ => FsCode::Unknown,
    };
    FsError::new(code, "", format!("{}: {}", e.code().as_str(), e.message()))
}

fn same(e: Error) -> Error {
    e
}

fn exec_error(e: Error) -> ExecError {
    let code = match e.code() {
        ErrorCode::Aborted => ExecCode::Aborted,
        ErrorCode::Timeout => ExecCode::Timeout,
        _ => ExecCode::Unknown,
    };
    ExecError::new(code, format!("{}: {}", e.code().as_str(), e.message()))
}

impl LazyEnv {
    /// The box open now, if any (for the synchronous id and cwd).
    fn current(&self) -> Option<Arc<BoxEnv>> {
        self.inner.current(&self.conversation)
    }
}

/// Run one call on the conversation's box, opening it first, and learn from the call whether
/// the box was lost.
macro_rules! through {
    ($self:ident, $ctx:ident, $err:ident, |$env:ident| $call:expr) => {{
        let (env, name, slot) = $self.inner.open(&$self.conversation, $ctx).await.map_err($err)?;
        let r = {
            let $env = &env;
            $call.await
        };
        $self.inner.after(&env, &name, &slot).await;
        r
    }};
}

#[async_trait]
impl ExecutionEnv for LazyEnv {
    fn id(&self) -> String {
        match self.current() {
            Some(env) => env.id(),
            None => format!("transport:{}:unopened", self.conversation),
        }
    }

    fn cwd(&self) -> String {
        self.current().map(|e| e.cwd()).unwrap_or_else(|| ".".into())
    }

    async fn read_text_file(&self, path: &str, ctx: &Ctx) -> std::result::Result<String, FsError> {
        through!(self, ctx, fs_error, |e| e.read_text_file(path, ctx))
    }
    async fn read_text_lines(
        &self,
        path: &str,
        max: Option<usize>,
        ctx: &Ctx,
    ) -> std::result::Result<Vec<String>, FsError> {
        through!(self, ctx, fs_error, |e| e.read_text_lines(path, max, ctx))
    }
    async fn read_binary_file(&self, path: &str, ctx: &Ctx) -> std::result::Result<Vec<u8>, FsError> {
        through!(self, ctx, fs_error, |e| e.read_binary_file(path, ctx))
    }
    async fn open_binary_reader(&self, path: &str, nf: bool, ctx: &Ctx) -> std::result::Result<BinaryReader, FsError> {
        through!(self, ctx, fs_error, |e| e.open_binary_reader(path, nf, ctx))
    }
    async fn write_file(&self, path: &str, data: &[u8], ctx: &Ctx) -> std::result::Result<(), FsError> {
        through!(self, ctx, fs_error, |e| e.write_file(path, data, ctx))
    }
    async fn append_file(&self, path: &str, data: &[u8], ctx: &Ctx) -> std::result::Result<(), FsError> {
        through!(self, ctx, fs_error, |e| e.append_file(path, data, ctx))
    }
    async fn truncate_file(&self, path: &str, size: u64, ctx: &Ctx) -> std::result::Result<(), FsError> {
        through!(self, ctx, fs_error, |e| e.truncate_file(path, size, ctx))
    }
    async fn flush_file(&self, path: &str, ctx: &Ctx) -> std::result::Result<(), FsError> {
        through!(self, ctx, fs_error, |e| e.flush_file(path, ctx))
    }
    async fn rename_file(&self, src: &str, dst: &str, ctx: &Ctx) -> std::result::Result<(), FsError> {
        through!(self, ctx, fs_error, |e| e.rename_file(src, dst, ctx))
    }
    async fn file_info(&self, path: &str, ctx: &Ctx) -> std::result::Result<FileInfo, FsError> {
        through!(self, ctx, fs_error, |e| e.file_info(path, ctx))
    }
    async fn list_dir(&self, path: &str, ctx: &Ctx) -> std::result::Result<Vec<FileInfo>, FsError> {
        through!(self, ctx, fs_error, |e| e.list_dir(path, ctx))
    }
    async fn canonical_path(&self, path: &str, ctx: &Ctx) -> std::result::Result<String, FsError> {
        through!(self, ctx, fs_error, |e| e.canonical_path(path, ctx))
    }
    async fn read_link(&self, path: &str, ctx: &Ctx) -> std::result::Result<String, FsError> {
        through!(self, ctx, fs_error, |e| e.read_link(path, ctx))
    }
    async fn exists(&self, path: &str, ctx: &Ctx) -> std::result::Result<bool, FsError> {
        through!(self, ctx, fs_error, |e| e.exists(path, ctx))
    }
    async fn create_dir(&self, path: &str, recursive: bool, ctx: &Ctx) -> std::result::Result<(), FsError> {
        through!(self, ctx, fs_error, |e| e.create_dir(path, recursive, ctx))
    }
    async fn remove(&self, path: &str, recursive: bool, force: bool, ctx: &Ctx) -> std::result::Result<(), FsError> {
        through!(self, ctx, fs_error, |e| e.remove(path, recursive, force, ctx))
    }
    async fn create_temp_dir(&self, prefix: &str, ctx: &Ctx) -> std::result::Result<String, FsError> {
        through!(self, ctx, fs_error, |e| e.create_temp_dir(prefix, ctx))
    }
    async fn create_temp_file(&self, prefix: &str, suffix: &str, ctx: &Ctx) -> std::result::Result<String, FsError> {
        through!(self, ctx, fs_error, |e| e.create_temp_file(prefix, suffix, ctx))
    }
    async fn watch(
        &self,
        targets: Vec<WatchTarget>,
        on_change: Arc<dyn Fn(Change) + Send + Sync>,
        ctx: &Ctx,
    ) -> std::result::Result<Watcher, FsError> {
        through!(self, ctx, fs_error, |e| e.watch(targets, on_change, ctx))
    }
    async fn exec(
        &self,
        command: Command,
        opts: ExecOptions,
        ctx: &Ctx,
    ) -> std::result::Result<ExecOutcome, ExecError> {
        through!(self, ctx, exec_error, |e| e.exec(command, opts, ctx))
    }
    async fn start(&self, command: Command, opts: StartOptions, ctx: &Ctx) -> std::result::Result<u64, ExecError> {
        through!(self, ctx, exec_error, |e| e.start(command, opts, ctx))
    }
    async fn processes(&self, ctx: &Ctx) -> Result<Arc<dyn agentbox_core::Processes>> {
        // The conversation's box (opened if it is not yet): its processes outlive this call.
        through!(self, ctx, same, |e| e.processes(ctx))
    }
    async fn cleanup(&self, ctx: &Ctx) -> std::result::Result<(), FsError> {
        // Nothing to clean in a box never made.
        let Some(env) = self.current() else { return Ok(()) };
        env.cleanup(ctx).await
    }
}

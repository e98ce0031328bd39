//! Daytona boxes: a Daytona sandbox per box, over Daytona's own REST API (`reqwest` over
//! rustls) and the toolbox daemon in each sandbox.
//!
//! What Daytona keeps, and so what the provider promises:
//! - **Lifetime:** `ttlMinutes`, which Daytona counts from creation whatever the sandbox's
//!   state and ends with no call from the host. The create reads it back (`autoDestroyAt`)
//!   and refuses a Daytona that did not take it, deleting the sandbox: a box whose end is
//!   only an idle timer is never called one whose lifetime is enforced. Minutes are Daytona's
//!   unit, so the end is the asked lifetime rounded up to the minute, and the facts say the
//!   real end. Auto-stop is off (an agent thinking for 20 minutes is not idle).
//! - **Size:** the snapshot's. A spec naming cpus, memory or a GPU is refused: name a snapshot.
//! - **Network:** `network: none` is `networkBlockAll`, and a domain allowlist is
//!   `domainAllowList`; each is reported only once the sandbox's own read carries it, else the
//!   sandbox is deleted and the create refused (an organization whose tier keeps its own
//!   network policy). A CIDR is refused.
//! - **Listing:** Daytona's label index trails a create and answers each query shape on its
//!   own schedule, so a list asks for the provider's own label alone and filters the host's
//!   labels itself, and a create returns only once that listing shows the box.
//! - **Workspace:** `/tmp/workspace` unless the spec names one; one the sandbox's user may not
//!   make is made with `sudo -n` and given to that user, and a snapshot without passwordless
//!   sudo fails the create, naming the path.
//! - **Programs:** toolbox session commands, their input and output spooled in files of the
//!   sandbox (see `exec`). With [`DaytonaOptions::runner`] the runner binary is uploaded and
//!   reached through the sandbox's preview URL, so a tool call is one message.
//! - **Sleep and wake** are stop and start: files kept, programs gone, the lifetime counting.
//!   [`DaytonaProvider::archive`] moves a stopped sandbox to Daytona's cold storage.
//!
//! The key is read from [`DaytonaOptions::api_key`] or `DAYTONA_API_KEY`, stays on this host,
//! and is never logged, put in an error, or given to a box.
//!
//! ```no_run
//! # async fn f() -> agentbox_core::Result<()> {
//! use std::time::Duration;
//! use agentbox_core::{Ctx, Provider, Spec};
//! use agentbox_providers::daytona::{DaytonaOptions, DaytonaProvider};
//! // DAYTONA_API_KEY (and DAYTONA_API_URL, DAYTONA_TARGET) as the daytona SDK reads them.
//! let provider = DaytonaProvider::new(DaytonaOptions::from_env()?)?;
//! let b = provider.create(&Spec::new(Duration::from_secs(600)), &Ctx::background()).await?;
//! b.destroy(&Ctx::background()).await?;
//! # Ok(()) }
//! ```

mod api;
mod exec;
mod lifecycle;
mod options;
mod preview;
mod sandbox;
mod toolbox;
mod volume;

pub use options::DaytonaOptions;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{
    Ctx, Error, ErrorCode, Facts, Honours, Labels, Lifecycle, Network, NetworkFact, Provider, Result, Sandbox,
    SandboxId, Spec, check_spec, now_ms,
};
use async_trait::async_trait;
use serde_json::json;

pub use api::ApiKey;
pub use sandbox::DaytonaSandbox;
pub use volume::VolumeMount;

use crate::lifecycle::Asleep;
use crate::random::random_hex;
use crate::runner::RunnerSandbox;
use api::{Api, SandboxDto, time_ms};
use exec::Tuning;
use preview::PreviewDial;
use toolbox::Toolbox;

/// The provider's name and id prefix.
pub const NAME: &str = "daytona";

/// Where the API is unless `DAYTONA_API_URL` says otherwise (the SDK's default).
pub const DEFAULT_API_URL: &str = "https://app.daytona.io/api";

/// Where programs start unless a spec names a workspace.
pub const DEFAULT_WORKSPACE: &str = "/tmp/workspace";

/// The variables [`DaytonaOptions::from_env`] reads.
pub const VARIABLES: [&str; 6] = [
    "DAYTONA_API_URL",
    "DAYTONA_SERVER_URL",
    "DAYTONA_API_KEY",
    "DAYTONA_JWT_TOKEN",
    "DAYTONA_TARGET",
    "AGENTBOX_DAYTONA_SNAPSHOT",
];

/// The most domains Daytona's allow list takes.
pub const MAX_DOMAINS: usize = 10;

const LABEL_PROVIDER: &str = "agentbox.provider";
const LABEL_BOX: &str = "agentbox.box";
const LABEL_NAME: &str = "agentbox.name";
/// The box's workspace, where the spec named one.
const LABEL_WORKSPACE: &str = "agentbox.workspace";
/// One make's own random mark, so a make that got no answer finds its own sandbox.
const LABEL_MAKE: &str = "agentbox.make";
/// Until when (ms since the epoch) the box's maker may take to mark it ready.
const LABEL_MAKING_UNTIL: &str = "agentbox.making-until";
/// Set once the box is whole: its workspace made, its runner started.
const LABEL_READY: &str = "agentbox.ready";
/// The port the box's runner listens on, reached through the port's preview URL.
const LABEL_RUNNER_PORT: &str = "agentbox.runner-port";

/// Where the runner binary is written in the sandbox.
const RUNNER_IN_BOX: &str = "/tmp/agentbox/agentbox-runner";

/// The most sandboxes one list reads.
const MAX_LISTED: usize = 10_000;
/// One page of a list.
const LIST_PAGE: u32 = 200;

/// Daytona's sandboxes as boxes. See the [module documentation](self).
pub struct DaytonaProvider {
    api: Api,
    opts: DaytonaOptions,
    runner_bytes: tokio::sync::OnceCell<Arc<Vec<u8>>>,
}

/// Why a make did not give a box.
enum Made {
    /// The name is taken: another host's make of the same name.
    Exists,
    Failed(Error),
}

/// Whether a box's runner is proven before it is handed out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Runner {
    /// Checked, and started again where it does not answer (attach, open, wake).
    Checked,
    /// Trusted: its first call finds out (a list of many boxes).
    Lazily,
}

impl DaytonaProvider {
    /// A provider over the API `opts` names. Refused without a key.
    pub fn new(opts: DaytonaOptions) -> Result<Self> {
        let key = opts.api_key.clone().ok_or_else(|| {
            Error::invalid("the Daytona provider needs an API key: set DAYTONA_API_KEY (or DaytonaOptions::api_key)")
        })?;
        if opts.minute.is_zero() {
            return Err(Error::invalid("DaytonaOptions::minute: must be longer than zero"));
        }
        for v in &opts.volumes {
            v.validate().map_err(|e| e.context("DaytonaOptions::volumes"))?;
        }
        let api = Api::new(&opts.api_url, key, opts.connect_timeout, opts.request_timeout)?;
        Ok(DaytonaProvider {
            api,
            opts,
            runner_bytes: Default::default(),
        })
    }

    fn id_of(&self, sandbox: &str) -> Result<SandboxId> {
        SandboxId::new(NAME, sandbox)
    }

    fn daytona_id<'a>(&self, id: &'a SandboxId) -> Result<&'a str> {
        id.expect_provider(NAME)?;
        Ok(id.name())
    }

    fn tuning(&self) -> Tuning {
        Tuning {
            poll: self.opts.poll,
            silent: self.opts.silent,
            start: Duration::from_secs(30),
        }
    }

    /// Daytona's minutes for `ms`, rounded up (at least one).
    fn minutes(&self, ms: u64) -> u64 {
        let m = self.opts.minute.as_millis().max(1) as u64;
        ms.div_ceil(m).max(1)
    }

    /// What create and open refuse beyond `check_spec`, in Daytona's terms.
    fn check(&self, spec: &Spec) -> Result<()> {
        for (field, set) in [
            ("cpus", spec.cpus.is_some()),
            ("memory_mb", spec.memory_mb.is_some()),
            ("gpu", spec.gpu.is_some()),
        ] {
            if set {
                return Err(Error::unsupported(format!(
                    "spec.{field}: a Daytona box's size is its snapshot's; choose the size by naming a snapshot"
                )));
            }
        }
        if spec.image.is_some() {
            return Err(Error::unsupported(
                "spec.image: Daytona boxes start from a snapshot; name one in spec.snapshot",
            ));
        }
        check_spec(spec, &self.honours(), NAME)?;
        if let Some(Network::Allow(hosts)) = &spec.network {
            agentbox_core::Allowlist::parse(hosts)?.refuse(false, "Daytona's domain allow list")?;
            domains(hosts)?;
        }
        Ok(())
    }

    /// The create request's body; `volumes` the ids of [`DaytonaOptions::volumes`], in order.
    fn body(&self, name: &str, labels: &Labels, spec: &Spec, volumes: &[String]) -> serde_json::Value {
        let ttl = self.minutes(spec.max_lifetime.as_millis() as u64);
        let mut b = json!({
            "name": name,
            "env": spec.env,
            "labels": labels,
            "public": false,
            "autoStopInterval": 0,
            "autoDeleteInterval": -1,
            "ttlMinutes": ttl,
        });
        if let Some(s) = spec.snapshot.as_ref().or(self.opts.snapshot.as_ref()) {
            b["snapshot"] = json!(s);
        }
        if let Some(t) = &self.opts.target {
            b["target"] = json!(t);
        }
        if !volumes.is_empty() {
            b["volumes"] = self
                .opts
                .volumes
                .iter()
                .zip(volumes)
                .map(|(v, id)| json!({ "volumeId": id, "mountPath": v.mount_path }))
                .collect();
        }
        match &spec.network {
            Some(Network::None) => b["networkBlockAll"] = json!(true),
            Some(Network::Allow(hosts)) => {
                let mut seen = std::collections::BTreeSet::new();
                let mut hosts = hosts.clone();
                hosts.retain(|h| seen.insert(h.to_ascii_lowercase()));
                b["domainAllowList"] = json!(hosts.join(","))
            }
            _ => {}
        }
        b
    }

    /// Make sandbox `name` for `spec`: started, verified, its workspace made, listed.
    async fn make(
        &self,
        name: &str,
        key: &str,
        box_name: Option<&str>,
        spec: &Spec,
        ctx: &Ctx,
    ) -> std::result::Result<Arc<dyn Sandbox>, Made> {
        let mut labels = spec.labels.clone();
        labels.insert(LABEL_PROVIDER.into(), NAME.into());
        labels.insert(LABEL_BOX.into(), key.into());
        // This make's own mark: a name is any open's of it, this is no other make's.
        let nonce = random_hex(8).map_err(Made::Failed)?;
        labels.insert(LABEL_MAKE.into(), nonce.clone());
        if let Some(n) = box_name {
            labels.insert(LABEL_NAME.into(), n.into());
        }
        if let Some(w) = &spec.workspace {
            labels.insert(LABEL_WORKSPACE.into(), w.clone());
        }
        // Past this, a box still not marked ready lost its maker: another open may delete it.
        let budget = self.opts.start_timeout + self.opts.index_timeout + Duration::from_secs(120);
        labels.insert(
            LABEL_MAKING_UNTIL.into(),
            (now_ms() + budget.as_millis() as u64).to_string(),
        );
        let mut volumes = Vec::new();
        for v in &self.opts.volumes {
            volumes.push(volume::ready(&self.api, &v.name, ctx).await.map_err(Made::Failed)?);
        }
        let body = self.body(name, &labels, spec, &volumes);
        let url = self.api.url("/sandbox");
        // Not sent again on a 503: the first may have made it (a 409 would then hide it).
        let sent = self
            .api
            .send_with(ctx, "creating a sandbox", self.opts.request_timeout, false, |c| {
                c.post(&url).json(&body)
            })
            .await;
        let r = match sent {
            Ok(r) => r,
            Err(e) => {
                // No answer (a timeout, a cancel, a dropped connection): it may exist anyway.
                self.sweep_unanswered(name, &nonce).await;
                return Err(Made::Failed(e));
            }
        };
        if r.status().as_u16() == 409 && box_name.is_some() {
            return Err(Made::Exists);
        }
        let status = r.status().as_u16();
        let dto: SandboxDto = match api::decode(r, "creating a sandbox").await {
            Ok(d) => d,
            Err(e) => {
                if status >= 500 {
                    self.sweep_unanswered(name, &nonce).await;
                }
                return Err(Made::Failed(e));
            }
        };
        tracing::info!(sandbox = %dto.id, name, "sandbox created");
        // The make ends before its making deadline, which other hosts go by.
        let own = ctx.with_timeout(budget.saturating_sub(Duration::from_secs(30)));
        match self.finish_make(dto, spec, box_name.is_some(), &own).await {
            Ok(b) => Ok(b),
            Err((id, e)) => {
                tracing::warn!(sandbox = %id, error = %e, "a sandbox that failed its create is deleted");
                // Deleted before the error answers; where Daytona keeps it busy, afterwards.
                let bg = Ctx::background().with_timeout(Duration::from_secs(30));
                if delete_sandbox(&self.api, &id, &bg).await.is_err() {
                    self.delete_later(id);
                }
                Err(Made::Failed(e))
            }
        }
    }

    /// After a create that got no answer: the sandbox named `name` is deleted where it exists
    /// and carries this make's `nonce`. Looked for here for about 15 s (the caller's error waits
    /// for it, so a process that exits next leaves nothing), then no more.
    async fn sweep_unanswered(&self, name: &str, nonce: &str) {
        let ctx = Ctx::background().with_timeout(Duration::from_secs(45));
        for _ in 0..5 {
            match get_sandbox(&self.api, name, &ctx).await {
                Ok(Some(d)) if d.labels().get(LABEL_MAKE).map(String::as_str) == Some(nonce) => {
                    tracing::warn!(sandbox = %d.id, "a create that got no answer made a sandbox: deleting it");
                    if let Err(e) = delete_sandbox(&self.api, &d.id, &ctx).await {
                        tracing::warn!(sandbox = %d.id, error = %e, "it was not deleted; its lifetime will end it");
                    }
                    return;
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "looking for a sandbox a create may have made"),
            }
            if ctx.run(tokio::time::sleep(Duration::from_secs(3))).await.is_err() {
                return;
            }
        }
    }

    /// Delete sandbox `id` in the background, waiting out a state change in progress.
    fn delete_later(&self, id: String) {
        let api = self.api.clone();
        tokio::spawn(async move {
            let ctx = Ctx::background().with_timeout(Duration::from_secs(300));
            if let Err(e) = delete_sandbox(&api, &id, &ctx).await {
                tracing::warn!(sandbox = %id, error = %e, "a failed sandbox was not deleted; its lifetime will end it");
            }
        });
    }

    async fn finish_make(
        &self,
        dto: SandboxDto,
        spec: &Spec,
        named: bool,
        ctx: &Ctx,
    ) -> std::result::Result<Arc<dyn Sandbox>, (String, Error)> {
        let id = dto.id.clone();
        let fail = |e: Error| (id.clone(), e);
        let dto = self.wait_started(dto, ctx).await.map_err(fail)?;
        let network = verify(&dto, spec, self.opts.minute).map_err(fail)?;
        match dto.sandbox_class.as_deref() {
            None | Some("container") | Some("linux-vm") => {}
            Some(other) => {
                return Err(fail(Error::unsupported(format!(
                    "spec.snapshot: sandbox {} is of class {other:?}; agentbox runs in linux containers and VMs",
                    dto.id
                ))));
            }
        }
        if spec.isolation.as_deref() == Some("vm") && dto.sandbox_class.as_deref() != Some("linux-vm") {
            return Err(fail(Error::unsupported(format!(
                "spec.isolation: vm needs a linux-vm snapshot; sandbox {} is {:?}",
                dto.id,
                dto.sandbox_class.as_deref().unwrap_or("a container")
            ))));
        }
        let workspace = spec.workspace.clone().unwrap_or_else(|| DEFAULT_WORKSPACE.into());
        let b = self.boxed(&dto, network.clone(), &workspace).map_err(fail)?;
        make_workspace(&b, &workspace, ctx).await.map_err(fail)?;
        let b = Arc::new(b);
        let mut labels = dto.labels();
        let out: Arc<dyn Sandbox> = if self.opts.runner.is_some() {
            let (r, port) = self.install_runner(b, &dto, ctx).await.map_err(fail)?;
            labels.insert(LABEL_RUNNER_PORT.into(), port.to_string());
            r
        } else {
            b
        };
        // Ready: another host's open of the same name hands it out only now, and the label
        // index has to show it so, whatever shape a list asks in.
        labels.insert(LABEL_READY.into(), "1".into());
        labels.remove(LABEL_MAKING_UNTIL);
        put_labels(&self.api, &dto.id, &labels, ctx).await.map_err(fail)?;
        // Held to the maker's own deadline: past it another host may take the box for one
        // whose maker went away.
        let ready = async {
            get_sandbox(&self.api, &dto.id, ctx)
                .await?
                .filter(|d| sandbox::status_of(d) != agentbox_core::Status::Ended)
                .ok_or_else(|| Error::gone(format!("sandbox {}: it was deleted as it was made", dto.id)))?;
            self.await_index(&dto.id, &labels, &[LABEL_MAKING_UNTIL.to_string()], ctx)
                .await
        };
        match ready.await {
            Ok(()) => Ok(out),
            // Marked ready, a named box may be another host's already: never deleted now.
            Err(e) if named && e.code() == ErrorCode::Timeout => {
                tracing::warn!(sandbox = %dto.id, error = %e, "the label index lags: a list may not show the box yet");
                Ok(out)
            }
            Err(e) => Err(fail(e)),
        }
    }

    /// Once no sandbox that has not ended answers to `name` (a deleted one gives its name up).
    async fn await_name_free(&self, name: &str, ctx: &Ctx) -> Result<()> {
        for _ in 0..300 {
            match get_sandbox(&self.api, name, ctx).await? {
                None => return Ok(()),
                Some(d)
                    if sandbox::status_of(&d) == agentbox_core::Status::Ended && d.name.as_deref() != Some(name) =>
                {
                    return Ok(());
                }
                Some(_) => ctx.run(tokio::time::sleep(Duration::from_millis(200))).await?,
            }
        }
        Err(Error::timeout(format!(
            "sandbox {name}: it was deleted but kept its name for 60s"
        )))
    }

    /// The sandbox once its maker marked it ready; `None` where it went away meanwhile (its
    /// make failed) or its maker is gone (past its making deadline: then it is deleted here).
    async fn await_ready(&self, mut d: SandboxDto, ctx: &Ctx) -> Result<Option<SandboxDto>> {
        let t = tokio::time::Instant::now();
        let limit = self.opts.start_timeout + self.opts.index_timeout + Duration::from_secs(120);
        while !d.labels().contains_key(LABEL_READY) {
            if sandbox::status_of(&d) == agentbox_core::Status::Ended {
                return Ok(None);
            }
            if maker_gone(&d) {
                tracing::warn!(sandbox = %d.id, "a box whose maker went away before it was ready: deleting it");
                delete_sandbox(&self.api, &d.id, ctx).await?;
                return Ok(None);
            }
            if t.elapsed() > limit {
                return Err(Error::timeout(format!(
                    "sandbox {}: another host's make of it did not finish within {}s",
                    d.id,
                    limit.as_secs()
                )));
            }
            ctx.run(tokio::time::sleep(Duration::from_millis(200))).await?;
            match get_sandbox(&self.api, &d.id, ctx).await? {
                Some(n) => d = n,
                None => return Ok(None),
            }
        }
        Ok(Some(d))
    }

    /// The sandbox once it is `started`; a create that ended in error answers Daytona's reason.
    async fn wait_started(&self, mut dto: SandboxDto, ctx: &Ctx) -> Result<SandboxDto> {
        let t = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(100);
        loop {
            match dto.state() {
                "started" => return Ok(dto),
                "error" | "build_failed" | "destroyed" | "destroying" => {
                    return Err(Error::unknown(format!(
                        "sandbox {} did not start: it is {} ({})",
                        dto.id,
                        dto.state(),
                        dto.error_reason.as_deref().unwrap_or("Daytona gave no reason")
                    )));
                }
                _ => {}
            }
            if t.elapsed() > self.opts.start_timeout {
                return Err(Error::timeout(format!(
                    "sandbox {} did not start within {}s (it is {})",
                    dto.id,
                    self.opts.start_timeout.as_secs(),
                    dto.state()
                )));
            }
            ctx.run(tokio::time::sleep(pause)).await?;
            pause = (pause * 2).min(Duration::from_secs(1));
            dto = get_sandbox(&self.api, &dto.id, ctx)
                .await?
                .ok_or_else(|| Error::gone(format!("sandbox {} vanished as it started", dto.id)))?;
        }
    }

    /// Once the label index shows sandbox `id` under the provider's own label, with `labels`.
    /// Once the label index shows sandbox `id` with `labels` (each key at its value) and none
    /// of `removed`: what this call wrote, whatever another writer added beside it.
    async fn await_index(
        &self,
        id: &str,
        labels: &BTreeMap<String, String>,
        removed: &[String],
        ctx: &Ctx,
    ) -> Result<()> {
        let t = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(100);
        let shows = |d: &SandboxDto| {
            let have = d.labels();
            d.id == id
                && labels.iter().all(|(k, v)| have.get(k) == Some(v))
                && removed.iter().all(|k| !have.contains_key(k))
        };
        loop {
            if self.list_all(ctx).await?.iter().any(shows) {
                tracing::debug!(sandbox = %id, waited_ms = t.elapsed().as_millis() as u64, "the label index shows the box");
                return Ok(());
            }
            if t.elapsed() > self.opts.index_timeout {
                return Err(Error::timeout(format!(
                    "sandbox {id}: Daytona's label index did not show it within {}s",
                    self.opts.index_timeout.as_secs()
                )));
            }
            ctx.run(tokio::time::sleep(pause)).await?;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// Every sandbox of this provider's, by its own label alone (the index answers each query
    /// shape on its own schedule; one shape keeps creates and lists in step).
    async fn list_all(&self, ctx: &Ctx) -> Result<Vec<SandboxDto>> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Page {
            Paged {
                items: Vec<SandboxDto>,
                #[serde(default, rename = "nextCursor")]
                next_cursor: Option<String>,
            },
            Plain(Vec<SandboxDto>),
        }
        let labels = serde_json::to_string(&BTreeMap::from([(LABEL_PROVIDER, NAME)])).unwrap_or_default();
        let url = self.api.url("/sandbox");
        let mut out: Vec<SandboxDto> = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut q: Vec<(&str, String)> = vec![("labels", labels.clone()), ("limit", LIST_PAGE.to_string())];
            if let Some(c) = &cursor {
                q.push(("cursor", c.clone()));
            }
            let page: Page = self
                .api
                .json(ctx, "listing sandboxes", |c| c.get(&url).query(&q))
                .await?;
            let (items, next) = match page {
                Page::Paged { items, next_cursor } => (items, next_cursor),
                Page::Plain(items) => (items, None),
            };
            out.extend(items);
            if out.len() > MAX_LISTED {
                return Err(Error::too_large(format!(
                    "list: over {MAX_LISTED} of agentbox's sandboxes in this organization"
                )));
            }
            match next.filter(|c| !c.is_empty()) {
                Some(c) if Some(&c) != cursor.as_ref() => cursor = Some(c),
                _ => return Ok(out),
            }
        }
    }

    /// The facts and handle of a sandbox as the API answers it.
    fn boxed(&self, dto: &SandboxDto, network: Option<NetworkFact>, workspace: &str) -> Result<DaytonaSandbox> {
        let proxy = dto
            .toolbox_proxy_url
            .as_deref()
            .filter(|u| !u.is_empty())
            .ok_or_else(|| Error::unknown(format!("sandbox {}: Daytona gave no toolboxProxyUrl", dto.id)))?;
        let all = dto.labels();
        let labels: Labels = all
            .iter()
            .filter(|(k, _)| !agentbox_core::is_reserved_label(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let isolation = if dto.sandbox_class.as_deref() == Some("linux-vm") {
            "vm"
        } else {
            "container"
        };
        let facts = Facts {
            provider: NAME.into(),
            isolation: isolation.into(),
            cpus: dto.cpu,
            memory_mb: dto.memory.map(|gb| (gb * 1024.0).round() as u64),
            disk_gb: dto.disk.map(|gb| gb.round() as u64),
            network,
            started_at_ms: dto.created_at.as_deref().and_then(time_ms),
            ends_at_ms: dto.auto_destroy_at.as_deref().and_then(time_ms),
            live_processes: true,
            name: all.get(LABEL_NAME).cloned(),
            sleep: Some("files".into()),
            sleep_clock: Some("counting".into()),
            snapshot: dto.snapshot.clone(),
            workspace: Some(workspace.to_string()),
            ..Default::default()
        };
        Ok(DaytonaSandbox {
            api: self.api.clone(),
            toolbox: Toolbox::new(self.api.clone(), proxy, &dto.id),
            id: self.id_of(&dto.id)?,
            sandbox: dto.id.clone(),
            facts,
            labels,
            workspace: workspace.to_string(),
            tuning: self.tuning(),
        })
    }

    /// A sandbox found (attach, open, list) as a box: asleep, or awake with its runner.
    async fn sandbox_of(&self, dto: &SandboxDto, runner: Runner, ctx: &Ctx) -> Result<Option<Arc<dyn Sandbox>>> {
        let status = sandbox::status_of(dto);
        if status == agentbox_core::Status::Ended {
            return Ok(None);
        }
        let labels = dto.labels();
        if labels.get(LABEL_PROVIDER).map(String::as_str) != Some(NAME) {
            return Ok(None);
        }
        if !labels.contains_key(LABEL_READY) {
            // Another host is still making it (its runner, its workspace): not a box yet.
            return Ok(None);
        }
        let network = read_network(dto);
        let workspace = labels
            .get(LABEL_WORKSPACE)
            .cloned()
            .unwrap_or_else(|| DEFAULT_WORKSPACE.into());
        let b = Arc::new(self.boxed(dto, network, &workspace)?);
        if status == agentbox_core::Status::Sleeping {
            return Ok(Some(Asleep::new(b)));
        }
        if self.opts.runner.is_none() {
            return Ok(Some(b));
        }
        if let Some(port) = labels.get(LABEL_RUNNER_PORT).and_then(|p| p.parse::<u16>().ok()) {
            let r = RunnerSandbox::new(b.clone(), Arc::new(self.dial(&dto.id, port)));
            if runner == Runner::Lazily || r.check(ctx).await.is_ok() {
                return Ok(Some(Arc::new(r)));
            }
            tracing::info!(sandbox = %dto.id, port, "the box's runner does not answer: starting another");
        }
        if runner == Runner::Lazily {
            // A list starts nothing: a box with no runner is handed out as it is.
            return Ok(Some(b));
        }
        let (r, port) = self.install_runner(b, dto, ctx).await?;
        // The labels as they are now (a read of the sandbox, not a lagging index), with the
        // port: a relabel made meanwhile is kept.
        let mut labels = get_sandbox(&self.api, &dto.id, ctx)
            .await?
            .ok_or_else(|| Error::gone(format!("sandbox {}: it ended as its runner started", dto.id)))?
            .labels();
        labels.insert(LABEL_RUNNER_PORT.into(), port.to_string());
        put_labels(&self.api, &dto.id, &labels, ctx).await?;
        Ok(Some(r))
    }

    fn dial(&self, sandbox: &str, port: u16) -> PreviewDial {
        PreviewDial {
            api: self.api.clone(),
            sandbox: sandbox.to_string(),
            port,
            runner_token: self.runner_token(sandbox),
        }
    }

    /// The runner's bearer token for `sandbox` (see [`crate::vendor::runner_token`]).
    fn runner_token(&self, sandbox: &str) -> String {
        crate::vendor::runner_token(self.api.key(), sandbox)
    }

    /// Upload this machine's runner into the sandbox, start it on a port of its own, and hand
    /// out the box through it.
    async fn install_runner(
        &self,
        b: Arc<DaytonaSandbox>,
        dto: &SandboxDto,
        ctx: &Ctx,
    ) -> Result<(Arc<dyn Sandbox>, u16)> {
        let Some(helper) = &self.opts.runner else {
            return Err(Error::unknown("no runner to install"));
        };
        let bytes = self
            .runner_bytes
            .get_or_try_init(|| async {
                tokio::fs::read(&helper.program)
                    .await
                    .map(Arc::new)
                    .map_err(|e| Error::io(e, format!("reading the runner {}", helper.program.display())))
            })
            .await?
            .clone();
        // A path of its own: a runner of an earlier start may still run from the last one.
        let path = format!("{RUNNER_IN_BOX}-{}", random_hex(4)?);
        b.toolbox
            .upload(ctx, "writing the runner in the sandbox", &[(path.clone(), &bytes[..])])
            .await?;
        let token = self.runner_token(&dto.id);
        let mut last = None;
        for _ in 0..6 {
            // Preview URLs reach ports 3000 to 9999; a port taken is tried again elsewhere.
            let mut r = [0u8; 2];
            getrandom::fill(&mut r).map_err(|e| Error::unknown(format!("the kernel gave no random bytes: {e}")))?;
            let port = 3000 + u16::from_le_bytes(r) % 7000;
            match self.start_runner(&b, &path, &helper.args, port, &token, ctx).await {
                Ok(()) => {
                    let r = RunnerSandbox::new(b.clone(), Arc::new(self.dial(&dto.id, port)));
                    r.check(ctx).await?;
                    tracing::info!(sandbox = %dto.id, port, "runner started");
                    return Ok((Arc::new(r), port));
                }
                Err(e) if e.message().contains("already listens") || e.message().contains("in use") => {
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::unknown("the runner found no free port")))
    }

    /// Start the runner at `path` on `port`, detached, in the workspace: a session command
    /// whose stdin (a pipe; never a file of the box) gets the token.
    async fn start_runner(
        &self,
        b: &DaytonaSandbox,
        path: &str,
        args: &[String],
        port: u16,
        token: &str,
        ctx: &Ctx,
    ) -> Result<()> {
        let mut words = vec![
            "sh".to_string(),
            "-c".into(),
            r#"cd -- "$1" && shift && chmod 755 "$1" && exec "$@""#.into(),
            "agentbox-runner".into(),
            b.workspace.clone(),
            path.to_string(),
        ];
        words.extend(args.iter().cloned());
        words.extend(
            [
                "serve",
                "--listen",
                &format!("0.0.0.0:{port}"),
                "--token-stdin",
                "--detach",
            ]
            .map(String::from),
        );
        let command = words.iter().map(|w| exec::sq(w)).collect::<Vec<_>>().join(" ");
        let sid = format!("agentbox-runner-{}", random_hex(6)?);
        b.toolbox.create_session(ctx, &sid).await?;
        let started = async {
            let cmd = b.toolbox.start_command(ctx, &sid, &command).await?;
            // A daemon may take the input only once the command runs: asked again, briefly.
            let mut tries = 0;
            loop {
                match b.toolbox.send_input(ctx, &sid, &cmd, token).await {
                    Ok(()) => break,
                    Err(e) if matches!(e.code(), ErrorCode::Invalid | ErrorCode::Unknown) && tries < 50 => {
                        tries += 1;
                        ctx.run(tokio::time::sleep(Duration::from_millis(100))).await?;
                    }
                    Err(e) => return Err(e),
                }
            }
            let t = tokio::time::Instant::now();
            let code = loop {
                if let Some(c) = b.toolbox.command_exit(ctx, &sid, &cmd).await? {
                    break c;
                }
                if t.elapsed() > Duration::from_secs(30) {
                    return Err(Error::timeout(format!(
                        "the runner did not start in sandbox {} within 30s",
                        b.sandbox
                    )));
                }
                ctx.run(tokio::time::sleep(Duration::from_millis(100))).await?;
            };
            let (out, err) = b.toolbox.command_logs(ctx, &sid, &cmd).await?;
            if code != 0 {
                return Err(Error::unknown(format!(
                    "the runner did not start in sandbox {} (exit {code}): {}",
                    b.sandbox,
                    err.trim()
                )));
            }
            crate::runner::Announced::read(&out).ok_or_else(|| {
                Error::unknown(format!(
                    "the runner in sandbox {} did not say it was ready: {out:?}",
                    b.sandbox
                ))
            })?;
            Ok(())
        };
        let r = started.await;
        let _ = b
            .toolbox
            .delete_session(&Ctx::background().with_timeout(Duration::from_secs(20)), &sid)
            .await;
        r
    }

    /// The sandbox behind `id`, where it exists and is agentbox's.
    async fn get(&self, id: &SandboxId, ctx: &Ctx) -> Result<Option<SandboxDto>> {
        let sandbox = self.daytona_id(id)?;
        Ok(get_sandbox(&self.api, sandbox, ctx)
            .await?
            .filter(|d| d.labels().get(LABEL_PROVIDER).map(String::as_str) == Some(NAME)))
    }

    /// The sandbox `id` in a state other than ended, else `gone`.
    async fn live(&self, id: &SandboxId, ctx: &Ctx) -> Result<SandboxDto> {
        self.get(id, ctx)
            .await?
            .filter(|d| sandbox::status_of(d) != agentbox_core::Status::Ended)
            .ok_or_else(|| Error::gone(format!("box {id}: it has ended")))
    }

    /// Move a stopped (sleeping) box to Daytona's archive: its files kept in cold storage, a
    /// wake slower. A box that runs is refused: sleep it first.
    ///
    /// ```no_run
    /// # async fn f(p: &agentbox_providers::daytona::DaytonaProvider, id: &agentbox_core::SandboxId) -> agentbox_core::Result<()> {
    /// use agentbox_core::{Ctx, Lifecycle};
    /// p.sleep(id, &Ctx::background()).await?;
    /// p.archive(id, &Ctx::background()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn archive(&self, id: &SandboxId, ctx: &Ctx) -> Result<()> {
        let d = self.live(id, ctx).await?;
        if d.state() == "started" {
            return Err(Error::refused(format!("archive {id}: it runs; sleep it first")));
        }
        let url = self.api.url(&format!("/sandbox/{}/archive", d.id));
        self.api.ok(ctx, "archiving the sandbox", |c| c.post(&url)).await?;
        self.await_state(&d.id, &["archived"], ctx).await?;
        tracing::info!(box_id = %id, "archived");
        Ok(())
    }

    /// The sandbox once it is in one of `want`.
    async fn await_state(&self, sandbox: &str, want: &[&str], ctx: &Ctx) -> Result<SandboxDto> {
        let t = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(100);
        loop {
            let d = get_sandbox(&self.api, sandbox, ctx)
                .await?
                .ok_or_else(|| Error::gone(format!("sandbox {sandbox}: it has ended")))?;
            if want.contains(&d.state()) {
                return Ok(d);
            }
            if matches!(d.state(), "error" | "destroyed" | "destroying" | "build_failed") {
                return Err(Error::gone(format!(
                    "sandbox {sandbox} is {} ({})",
                    d.state(),
                    d.error_reason.as_deref().unwrap_or("no reason given")
                )));
            }
            if t.elapsed() > self.opts.start_timeout {
                return Err(Error::timeout(format!(
                    "sandbox {sandbox} was not {} within {}s (it is {})",
                    want.join(" or "),
                    self.opts.start_timeout.as_secs(),
                    d.state()
                )));
            }
            ctx.run(tokio::time::sleep(pause)).await?;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }
}

/// Whether a box not yet ready is past its maker's deadline: its maker went away.
fn maker_gone(d: &SandboxDto) -> bool {
    let labels = d.labels();
    !labels.contains_key(LABEL_READY)
        && labels
            .get(LABEL_MAKING_UNTIL)
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|until| now_ms() > until)
}

/// The network a sandbox's own read says it has: `none` only where Daytona blocked it, an
/// allowlist only where its list is there; otherwise unknown.
fn read_network(dto: &SandboxDto) -> Option<NetworkFact> {
    if dto.network_block_all == Some(true) {
        return Some(NetworkFact::None);
    }
    // CIDRs it may reach besides: more than a domain list says, so unknown.
    if !cidrs(dto).is_empty() {
        return None;
    }
    let listed = allow_list(dto)?;
    (!listed.is_empty()).then_some(NetworkFact::Allowlist(listed))
}

/// The CIDRs of a sandbox's `networkAllowList`.
fn cidrs(dto: &SandboxDto) -> Vec<&str> {
    dto.network_allow_list
        .as_deref()
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

/// The domains of a sandbox's `domainAllowList` (a comma-separated string, or a list of hosts);
/// `None` for a value that is neither.
fn allow_list(dto: &SandboxDto) -> Option<Vec<String>> {
    match dto.domain_allow_list.as_ref()? {
        serde_json::Value::String(s) => Some(
            s.split(',')
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
                .collect(),
        ),
        serde_json::Value::Array(a) => a.iter().map(|v| v.as_str().map(String::from)).collect(),
        serde_json::Value::Null => Some(Vec::new()),
        _ => None,
    }
}

/// The network the spec asked for, as the sandbox's own read confirms it; else `unsupported`
/// (the create deletes the sandbox).
fn verify(dto: &SandboxDto, spec: &Spec, minute: Duration) -> Result<Option<NetworkFact>> {
    let Some(end) = dto.auto_destroy_at.as_deref().and_then(time_ms) else {
        return Err(Error::unsupported(format!(
            "spec.max_lifetime: sandbox {} came back with no autoDestroyAt, so this Daytona does not end it at its \
             lifetime (ttlMinutes); only idle timers would, and a box's lifetime must be enforced",
            dto.id
        )));
    };
    // The end Daytona keeps is the lifetime asked, rounded up to its minute, from creation:
    // later than that (an organization's own default, say) is not the lifetime asked.
    if let Some(created) = dto.created_at.as_deref().and_then(time_ms) {
        let m = minute.as_millis().max(1) as u64;
        let asked = (spec.max_lifetime.as_millis() as u64).div_ceil(m) * m;
        if end > created + asked + m {
            return Err(Error::unsupported(format!(
                "spec.max_lifetime: sandbox {} would end at {end} ms since the epoch, later than the {} s asked \
                 from its creation at {created}: this Daytona does not keep the lifetime asked",
                dto.id,
                spec.max_lifetime.as_secs()
            )));
        }
    }
    match &spec.network {
        Some(Network::None) => {
            if dto.network_block_all != Some(true) {
                return Err(Error::unsupported(format!(
                    "spec.network: none: sandbox {} reads back networkBlockAll {:?}; this organization's tier keeps \
                     its own network policy",
                    dto.id, dto.network_block_all
                )));
            }
            Ok(Some(NetworkFact::None))
        }
        Some(Network::Allow(hosts)) => {
            let mut want: Vec<String> = hosts.iter().map(|h| h.to_ascii_lowercase()).collect();
            want.sort();
            let got = allow_list(dto).map(|mut l| {
                l.iter_mut().for_each(|h| *h = h.to_ascii_lowercase());
                l.sort();
                l
            });
            want.dedup();
            if got.as_ref() != Some(&want) || !cidrs(dto).is_empty() {
                return Err(Error::unsupported(format!(
                    "spec.network: the allowlist: sandbox {} reads back domainAllowList {:?} and networkAllowList \
                     {:?}, not the domains asked alone; this organization's tier keeps its own network policy",
                    dto.id, dto.domain_allow_list, dto.network_allow_list
                )));
            }
            Ok(Some(NetworkFact::Allowlist(hosts.clone())))
        }
        _ => Ok(read_network(dto)),
    }
}

/// An allowlist as Daytona's domain list takes it: domains (a leading `*.` allowed), at most
/// [`MAX_DOMAINS`]; a CIDR or an address is refused.
fn domains(hosts: &[String]) -> Result<()> {
    if hosts.is_empty() {
        return Err(Error::invalid("spec.network: an allowlist names at least one domain"));
    }
    if hosts.len() > MAX_DOMAINS {
        return Err(Error::unsupported(format!(
            "spec.network: {} domains; Daytona's domain allow list takes at most {MAX_DOMAINS}",
            hosts.len()
        )));
    }
    for h in hosts {
        let bare = h.strip_prefix("*.").unwrap_or(h);
        if h.contains('/') || bare.parse::<std::net::IpAddr>().is_ok() {
            return Err(Error::unsupported(format!(
                "spec.network: {h:?} is an address or CIDR; Daytona boxes take an allowlist of domains only"
            )));
        }
        let ok = !bare.is_empty()
            && bare.len() <= 253
            && bare.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !ok {
            return Err(Error::invalid(format!("spec.network: {h:?} is not a domain")));
        }
    }
    Ok(())
}

/// Make the workspace, with `sudo -n` where the sandbox's user may not, and prove it writable.
async fn make_workspace(b: &DaytonaSandbox, workspace: &str, ctx: &Ctx) -> Result<()> {
    let w = exec::sq(workspace);
    let script = format!(
        r#"w={w}
if ! mkdir -p "$w" 2>/dev/null || ! [ -w "$w" ]; then
  sudo -n mkdir -p "$w" && sudo -n chown "$(id -u):$(id -g)" "$w" || exit 3
fi
[ -d "$w" ] && [ -w "$w" ] || exit 4"#
    );
    let r = b.toolbox.execute(ctx, "making the workspace", &script, 60).await?;
    match r.exit() {
        0 => Ok(()),
        3 => Err(Error::unsupported(format!(
            "spec.workspace: {workspace}: the sandbox's user cannot make it and `sudo -n` failed (a snapshot \
             without passwordless sudo): {}",
            r.result.trim()
        ))),
        code => Err(Error::unsupported(format!(
            "spec.workspace: {workspace}: not a directory the sandbox's user can write (exit {code}): {}",
            r.result.trim()
        ))),
    }
}

/// A sandbox by id or name; `None` where Daytona has none (or only its destroyed record).
pub(crate) async fn get_sandbox(api: &Api, sandbox: &str, ctx: &Ctx) -> Result<Option<SandboxDto>> {
    let url = api.url(&format!("/sandbox/{sandbox}"));
    match api
        .json::<SandboxDto, _>(ctx, &format!("reading sandbox {sandbox}"), |c| c.get(&url))
        .await
    {
        Ok(d) if d.state() == "destroyed" => Ok(None),
        Ok(d) => Ok(Some(d)),
        Err(e) if e.code() == ErrorCode::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Delete a sandbox; absent, or already being deleted, is done. A sandbox in the middle of
/// another change (409: starting, say) is asked again, for at most a minute.
pub(crate) async fn delete_sandbox(api: &Api, sandbox: &str, ctx: &Ctx) -> Result<()> {
    let url = api.url(&format!("/sandbox/{sandbox}"));
    for _ in 0..60 {
        match api
            .ok(ctx, &format!("deleting sandbox {sandbox}"), |c| c.delete(&url))
            .await
        {
            Ok(()) => return Ok(()),
            Err(e) if e.code() == ErrorCode::NotFound => return Ok(()),
            Err(e) if e.code() == ErrorCode::Refused => match get_sandbox(api, sandbox, ctx).await? {
                None => return Ok(()),
                Some(d) if d.desired_state.as_deref() == Some("destroyed") => return Ok(()),
                Some(_) => ctx.run(tokio::time::sleep(Duration::from_secs(1))).await?,
            },
            Err(e) => return Err(e),
        }
    }
    Err(Error::timeout(format!(
        "deleting sandbox {sandbox}: Daytona kept answering that a change is in progress for 60s"
    )))
}

/// Replace a sandbox's labels (the API replaces them all).
async fn put_labels(api: &Api, sandbox: &str, labels: &BTreeMap<String, String>, ctx: &Ctx) -> Result<()> {
    let url = api.url(&format!("/sandbox/{sandbox}/labels"));
    let body = json!({ "labels": labels });
    api.ok(ctx, "labelling the sandbox", |c| c.put(&url).json(&body)).await
}

#[async_trait]
impl Provider for DaytonaProvider {
    fn name(&self) -> &str {
        NAME
    }

    fn honours(&self) -> Honours {
        Honours {
            snapshot: true,
            isolation: vec!["container".into(), "vm".into()],
            network_none: true,
            network_allowlist: true,
            workspace: true,
            env: true,
            live_processes: true,
            names: true,
            sleep: true,
            extend: true,
            relabel: true,
            ..Default::default()
        }
    }

    #[tracing::instrument(name = "create", skip_all, fields(provider = NAME))]
    async fn create(&self, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        ctx.check()?;
        self.check(spec)?;
        let key = random_hex(8)?;
        match self.make(&format!("agentbox-{key}"), &key, None, spec, ctx).await {
            Ok(b) => Ok(b),
            Err(Made::Failed(e)) => Err(e),
            Err(Made::Exists) => Err(Error::refused(format!("sandbox agentbox-{key} exists already"))),
        }
    }

    async fn attach(&self, id: &SandboxId, ctx: &Ctx) -> Result<Option<Arc<dyn Sandbox>>> {
        match self.get(id, ctx).await? {
            Some(d) => self.sandbox_of(&d, Runner::Checked, ctx).await,
            None => Ok(None),
        }
    }

    async fn list(&self, labels: &Labels, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        let mut out = Vec::new();
        for d in self.list_all(ctx).await? {
            let have = d.labels();
            if !labels.iter().all(|(k, v)| have.get(k) == Some(v)) {
                continue;
            }
            if matches!(d.state(), "error" | "build_failed") || maker_gone(&d) {
                // A sandbox that failed, or whose maker went away before it was whole, is
                // deleted here, once its own read (not the lagging index) says so: nothing is
                // left behind.
                let sweep = Ctx::background().with_timeout(Duration::from_secs(10));
                if let Ok(Some(fresh)) = get_sandbox(&self.api, &d.id, &sweep).await
                    && (matches!(fresh.state(), "error" | "build_failed") || maker_gone(&fresh))
                {
                    tracing::info!(sandbox = %d.id, state = fresh.state(), "deleting a failed sandbox");
                    if let Err(e) = delete_sandbox(&self.api, &d.id, &sweep).await {
                        tracing::warn!(sandbox = %d.id, error = %e, "a failed sandbox was not deleted");
                    }
                }
                continue;
            }
            match self.sandbox_of(&d, Runner::Lazily, ctx).await {
                Ok(Some(b)) => out.push(b),
                Ok(None) => {}
                // One sandbox Daytona answers oddly does not hide the others.
                Err(e) if ctx.check().is_ok() => {
                    tracing::warn!(sandbox = %d.id, error = %e, "a sandbox left out of the list");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allowlist_is_domains_only() {
        let v = |h: &[&str]| domains(&h.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        v(&["api.example.com", "*.pypi.org"]).unwrap();
        let e = v(&["10.0.0.0/8"]).unwrap_err();
        assert_eq!(e.code(), ErrorCode::Unsupported);
        assert!(e.message().contains("CIDR"), "{e}");
        assert_eq!(v(&["1.2.3.4"]).unwrap_err().code(), ErrorCode::Unsupported);
        assert_eq!(v(&["bad host"]).unwrap_err().code(), ErrorCode::Invalid);
        let many: Vec<String> = (0..11).map(|i| format!("h{i}.example.com")).collect();
        assert_eq!(domains(&many).unwrap_err().code(), ErrorCode::Unsupported);
    }

    #[test]
    fn the_environment_is_read_as_the_sdk_reads_it() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        let o = DaytonaOptions::from_vars(env(&[
            ("DAYTONA_SERVER_URL", "http://x/api"),
            ("DAYTONA_API_KEY", "k"),
            ("DAYTONA_TARGET", "eu"),
        ]))
        .unwrap();
        assert_eq!(o.api_url, "http://x/api");
        assert_eq!(o.target.as_deref(), Some("eu"));
        assert!(o.api_key.is_some());
        let o = DaytonaOptions::from_vars(env(&[
            ("DAYTONA_API_URL", "http://a"),
            ("DAYTONA_SERVER_URL", "http://b"),
        ]))
        .unwrap();
        assert_eq!(o.api_url, "http://a");
        assert!(DaytonaProvider::new(o).is_err(), "no key, no provider");
        assert!(DaytonaOptions::from_vars(env(&[("DAYTONA_JWT_TOKEN", "t")])).is_err());
    }

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn a_lifetime_daytona_would_not_keep_is_refused() {
        let dto = |end: &str| -> SandboxDto {
            serde_json::from_value(json!({"id": "s", "createdAt": "2030-01-01T00:00:00Z", "autoDestroyAt": end}))
                .unwrap()
        };
        let spec = Spec::new(Duration::from_secs(90));
        // 90 s is two minutes.
        verify(&dto("2030-01-01T00:02:00Z"), &spec, MINUTE).unwrap();
        let e = verify(&dto("2030-01-01T01:00:00Z"), &spec, MINUTE).unwrap_err();
        assert_eq!(e.code(), ErrorCode::Unsupported);
        assert!(e.message().contains("later than"), "{e}");
    }

    #[test]
    fn cidrs_beside_the_domains_are_not_an_allowlist_of_domains() {
        let d: SandboxDto = serde_json::from_value(json!({"id": "s", "autoDestroyAt": "2030-01-01T00:00:00Z",
            "domainAllowList": "a.com", "networkAllowList": "10.0.0.0/8"}))
        .unwrap();
        assert_eq!(read_network(&d), None);
        let spec = Spec {
            network: Some(Network::Allow(vec!["a.com".into()])),
            ..Spec::new(Duration::from_secs(60))
        };
        assert_eq!(verify(&d, &spec, MINUTE).unwrap_err().code(), ErrorCode::Unsupported);
    }

    #[test]
    fn a_network_is_what_the_read_says() {
        let dto = |v: serde_json::Value| -> SandboxDto { serde_json::from_value(v).unwrap() };
        let base = json!({"id": "s", "autoDestroyAt": "2030-01-01T00:00:00Z"});
        let mut none = base.clone();
        none["networkBlockAll"] = json!(false);
        let spec = |n: Network| Spec {
            network: Some(n),
            ..Spec::new(Duration::from_secs(60))
        };
        assert_eq!(
            verify(&dto(none.clone()), &spec(Network::None), MINUTE)
                .unwrap_err()
                .code(),
            ErrorCode::Unsupported
        );
        none["networkBlockAll"] = json!(true);
        assert_eq!(
            verify(&dto(none), &spec(Network::None), MINUTE).unwrap(),
            Some(NetworkFact::None)
        );
        let allow = spec(Network::Allow(vec!["a.com".into(), "*.b.org".into()]));
        for (read, ok) in [
            (json!("*.b.org,a.com"), true),
            (json!(["a.com", "*.b.org"]), true),
            (json!("a.com"), false),
            (json!(7), false),
            (serde_json::Value::Null, false),
        ] {
            let mut d = base.clone();
            d["domainAllowList"] = read.clone();
            assert_eq!(verify(&dto(d), &allow, MINUTE).is_ok(), ok, "{read}");
        }
        let no_ttl = dto(json!({"id": "s"}));
        let e = verify(&no_ttl, &Spec::new(Duration::from_secs(60)), MINUTE).unwrap_err();
        assert!(e.message().contains("autoDestroyAt"), "{e}");
    }
}

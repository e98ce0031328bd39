//! Modal boxes: a box is a Modal sandbox (gVisor by default, or a VM), made and run through
//! Modal's own gRPC API (the client service and each sandbox's command router, compiled from
//! Modal's protocol files in `agentbox-modal-proto`).
//!
//! What the provider promises, and how:
//! - **Lifetime** is Modal's own `timeout_secs`, the spec's lifetime rounded up to whole
//!   seconds and capped at 24 hours ([`MAX_LIFETIME`]; `facts.ends_at_ms` says the capped
//!   end). Modal ends the sandbox when it passes, whatever becomes of this host.
//! - **Isolation** `gvisor` (the default: Modal's standard sandbox) or `vm` (a VM with its own
//!   kernel); any other is refused `unsupported`. `capabilities: [fuse]` implies `vm`, and is
//!   refused with `gvisor` (`unsupported`) and with a GPU (`invalid`).
//! - **A GPU** (`T4`, `A100-80GB:2`, `H100!`…) on the default sandbox only: with `vm` it is
//!   refused `invalid`. `facts.gpu` is what `nvidia-smi` names in the box (one name for
//!   identical cards, each model in the order first seen joined by ` + ` for a mixed box); a
//!   box that asked for a GPU and names none is ended and the create fails.
//! - **FUSE** is verified in the box: `/dev/fuse` a character device root opens. A box that
//!   fails it is ended and the create fails, naming what is missing.
//! - **Network** `none` (blocked), an allowlist of domains (`*.` wildcards) and IPv4 CIDRs
//!   (Modal's own allowlist, which Modal enforces), or open; a malformed entry, an empty list
//!   and ports with `none` are refused `invalid` before any call.
//! - **Ports** are Modal's tunnels: a bare port is TLS (an `https` URL), `tcp` a raw socket;
//!   [`Sandbox::endpoint`] answers Modal's address, never the
//!   sandbox's id.
//! - **Programs** run through the command router: output read from a byte offset and resumed
//!   where a stream breaks, stdin a stream with an explicit end written in 512 KiB chunks, a
//!   deadline Modal enforces (`ExecOptions::timeout`), kill by pid through a second exec (see
//!   `exec`). `facts.secrets_via` is `fd`: a program's stdin is a real pipe.
//! - **Facts read in the box** at create and again at attach: the GPU, FUSE, the workspace's
//!   size in whole GiB (left out over a PiB, gVisor's claim) and `kernel.yama.ptrace_scope`
//!   (0 where the file does not exist). `started_at_ms` is when the create was asked.
//! - **Attach never fails a live sandbox and never ends it.** The facts are read again, up to
//!   three tries; if every try errs, the hardware measured at create (GPU, FUSE, disk; kept in
//!   a tag, which nothing in the box can write) stands in, while the security facts (ptrace
//!   scope, network, ports) are left out, unknown. A box with no measured hardware kept fails
//!   the attach (it keeps running: try again), and so does a workspace that cannot be set up.
//!   A sandbox that ended, or is not this provider's, is `None`.
//! - **Labels** are sandbox tags (each key and value 1 to 63 of `[A-Za-z0-9._-]`, as Modal
//!   takes them); the providers' namespace `agentbox` is refused `invalid`, and every box
//!   carries the tag `agentbox=1`. `list` asks Modal for the tags; `relabel` replaces them.
//! - **Snapshots** are Modal's filesystem snapshots (an image), named in the app's tags; a
//!   spec's `snapshot` starts a box from one, and a fork's boxes start from one taken for it.
//!   With [`ModalOptions::memory_snapshots`], boxes are made able to take memory snapshots and
//!   a snapshot is of the memory too (`SandboxSnapshot`); a box made from one is restored
//!   (`SandboxRestore`), keeping the lifetime and isolation it was made with.
//!
//! The token (`MODAL_TOKEN_ID`, `MODAL_TOKEN_SECRET`, read as the `modal` client reads them)
//! stays on this host: the secret is a sensitive header, never logged, never in an error,
//! never given to a box.
//!
//! ```no_run
//! # async fn f() -> agentbox_core::Result<()> {
//! use std::time::Duration;
//! use agentbox_core::{Ctx, Provider, Spec};
//! use agentbox_providers::modal::{ModalOptions, ModalProvider};
//! // MODAL_TOKEN_ID, MODAL_TOKEN_SECRET (and MODAL_SERVER_URL for a fake Modal).
//! let provider = ModalProvider::new(ModalOptions::from_env()?)?;
//! let mut spec = Spec::new(Duration::from_secs(600));
//! spec.isolation = Some("vm".into());
//! let b = provider.create(&spec, &Ctx::background()).await?;
//! b.upload("notes.txt", b"hello", &Ctx::background()).await?;
//! b.destroy(&Ctx::background()).await?;
//! # Ok(()) }
//! ```

mod api;
mod exec;
mod lifecycle;
mod options;
mod probe;
mod sandbox;
mod tags;

pub use options::ModalOptions;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{
    Ctx, Error, ErrorCode, Facts, Honours, Labels, Lifecycle, Network, NetworkFact, PortFact, PortKind, Provider,
    Result, Sandbox, SandboxId, Spec, check_spec,
};
use agentbox_modal_proto::client as pb;
use async_trait::async_trait;

pub use crate::vendor::ApiKey;
pub use sandbox::ModalSandbox;

use api::{Api, CALL_TIMEOUT, Token, call};
use exec::{Task, ended_result};
use probe::Probed;

/// The provider's name and id prefix.
pub const NAME: &str = "modal";

/// The variables [`ModalOptions::from_env`] reads: the `modal` client's own, and the app's
/// name.
pub const VARIABLES: [&str; 6] = [
    "MODAL_SERVER_URL",
    "MODAL_TOKEN_ID",
    "MODAL_TOKEN_SECRET",
    "MODAL_ENVIRONMENT",
    "AGENTBOX_MODAL_APP",
    "AGENTBOX_MODAL_MEMORY_SNAPSHOTS",
];

/// Modal's API, where `MODAL_SERVER_URL` names no other.
pub const DEFAULT_SERVER_URL: &str = "https://api.modal.com";
/// The longest lifetime Modal gives a sandbox.
pub const MAX_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// The image a spec that names none gets.
pub const DEFAULT_IMAGE: &str = "debian:bookworm-slim";
/// Where programs start, where the spec names no workspace.
pub const WORKSPACE: &str = "/workspace";

/// Tags of the provider's own (see `tags`).
const TAG_ISOLATION: &str = "agentbox.iso";
const TAG_STARTED: &str = "agentbox.at";
const TAG_ENDS: &str = "agentbox.end";
const TAG_CPUS: &str = "agentbox.mcpu";
const TAG_MEMORY: &str = "agentbox.mem";
const TAG_NETWORK: &str = "agentbox.net";
const TAG_ALLOW: &str = "agentbox.allow";
const TAG_PORTS: &str = "agentbox.ports";
const TAG_WORKSPACE: &str = "agentbox.ws";
const TAG_SNAPSHOT: &str = "agentbox.snap";
/// The hardware the create measured: `agentbox.hw` (`1` once measured), `.gpu`, `.fuse`,
/// `.disk`.
const TAG_HW: &str = "agentbox.hw";
const TAG_HW_GPU: &str = "agentbox.hw.gpu";
const TAG_HW_FUSE: &str = "agentbox.hw.fuse";
const TAG_HW_DISK: &str = "agentbox.hw.disk";
/// App tags naming snapshots: `agentbox.snapshot.NAME` = the image's id.
const APP_TAG_SNAPSHOT: &str = "agentbox.snapshot.";

/// Makes Modal sandboxes.
pub struct ModalProvider {
    o: ModalOptions,
    api: Arc<Api>,
    app_id: tokio::sync::OnceCell<String>,
}

impl std::fmt::Debug for ModalProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModalProvider")
            .field("server_url", &self.o.server_url)
            .field("app", &self.o.app)
            .finish_non_exhaustive()
    }
}

impl ModalProvider {
    /// A provider over `o`. Nothing is asked of Modal until the first call; a missing token
    /// is refused here, naming the variable.
    pub fn new(o: ModalOptions) -> Result<Self> {
        let (Some(id), Some(secret)) = (o.token_id.clone(), o.token_secret.clone()) else {
            return Err(Error::invalid(
                "MODAL_TOKEN_ID and MODAL_TOKEN_SECRET: a Modal token is needed (modal token new, or the dashboard's \
                 API tokens)",
            ));
        };
        if o.app.is_empty() || !tags::fits(&o.app) {
            return Err(Error::invalid(format!(
                "AGENTBOX_MODAL_APP {:?}: an app name is 1 to 63 letters, digits, '.', '-' or '_'",
                o.app
            )));
        }
        let api = Api::new(
            o.server_url.trim_end_matches('/'),
            &Token { id, secret },
            o.connect_timeout,
        )?;
        Ok(ModalProvider {
            o,
            api: Arc::new(api),
            app_id: tokio::sync::OnceCell::new(),
        })
    }

    fn environment(&self) -> String {
        self.o.environment.clone().unwrap_or_default()
    }

    /// The app's id, made when missing (once per provider).
    async fn app(&self, ctx: &Ctx) -> Result<String> {
        self.app_id
            .get_or_try_init(|| async {
                let a = call(ctx, "AppGetOrCreate", CALL_TIMEOUT, true, || {
                    let mut c = self.api.client();
                    let req = pb::AppGetOrCreateRequest {
                        app_name: self.o.app.clone(),
                        environment_name: self.environment(),
                        object_creation_type: pb::ObjectCreationType::CreateIfMissing as i32,
                    };
                    async move { c.app_get_or_create(req).await }
                })
                .await?;
                tracing::debug!(app = %self.o.app, app_id = %a.app_id, "modal: app");
                Ok::<_, Error>(a.app_id)
            })
            .await
            .cloned()
    }

    /// Refuse what Modal cannot give, beyond what [`check_spec`] refuses.
    fn refuse(&self, spec: &Spec) -> Result<()> {
        tags::check_labels(&spec.labels)?;
        let fuse = spec.capabilities.iter().any(|c| c == "fuse");
        let iso = spec.isolation.as_deref();
        if spec.gpu.is_some() && (iso == Some("vm") || fuse) {
            return Err(Error::invalid(if fuse {
                "spec.gpu: a GPU is served on Modal's default sandbox only, and capabilities fuse needs a VM"
            } else {
                "spec.gpu: a GPU is served on Modal's default sandbox only, not with isolation vm"
            }));
        }
        if fuse && iso == Some("gvisor") {
            return Err(Error::unsupported(
                "spec.capabilities: fuse needs a VM (isolation vm); gVisor gives no /dev/fuse",
            ));
        }
        if let Some(g) = &spec.gpu {
            gpu_config(g)?;
        }
        // What the tags must keep of the spec fits them (checked before any call).
        let mut scratch = BTreeMap::new();
        if let Some(Network::Allow(list)) = &spec.network {
            agentbox_core::Allowlist::parse(list)?.refuse(true, "Modal's CIDR and domain allowlist")?;
            tags::put(&mut scratch, TAG_ALLOW, &list.join(",")).map_err(|_| {
                Error::invalid(format!(
                    "spec.network.allow: {} entries are more than a Modal box can keep in its tags (at most about \
                     {} bytes, escaped)",
                    list.len(),
                    tags::MAX * tags::MAX_PARTS / 3
                ))
            })?;
        }
        tags::put(&mut scratch, TAG_PORTS, &ports_tag(spec)).map_err(|_| {
            Error::invalid(format!(
                "spec.ports: {} ports are more than a Modal box can keep",
                spec.ports.len()
            ))
        })?;
        if let Some(w) = &spec.workspace
            && !w.starts_with('/')
        {
            return Err(Error::invalid(format!(
                "spec.workspace {w:?}: must be an absolute path"
            )));
        }
        Ok(())
    }

    /// The image of `spec`: a snapshot's, or one built from a registry reference.
    async fn image(&self, spec: &Spec, app_id: &str, ctx: &Ctx) -> Result<String> {
        if let Some(name) = &spec.snapshot {
            return match self.snapshot_kept(name, ctx).await? {
                Some(Kept::Files(image)) => Ok(image),
                Some(Kept::Memory { .. }) => Err(Error::unknown(format!(
                    "spec.snapshot {name:?}: a memory snapshot, restored rather than built on"
                ))),
                None => Err(Error::not_found(format!(
                    "spec.snapshot: there is no snapshot {name:?}"
                ))),
            };
        }
        let reference = spec.image.clone().unwrap_or_else(|| self.o.default_image.clone());
        let r = call(ctx, "ImageGetOrCreate", CALL_TIMEOUT, true, || {
            let mut c = self.api.client();
            let req = pb::ImageGetOrCreateRequest {
                image: Some(pb::Image {
                    dockerfile_commands: vec![format!("FROM {reference}")],
                    ..Default::default()
                }),
                app_id: app_id.to_string(),
                ..Default::default()
            };
            async move { c.image_get_or_create(req).await }
        })
        .await?;
        let mut result = r.result;
        let mut last_entry = String::new();
        // A build under way: follow it until it ends (the create's deadline bounds it).
        while result
            .as_ref()
            .is_none_or(|r| r.status == pb::generic_result::GenericStatus::Unspecified as i32)
        {
            let mut stream = call(ctx, "ImageJoinStreaming", CALL_TIMEOUT, true, || {
                let mut c = self.api.client();
                let req = pb::ImageJoinStreamingRequest {
                    image_id: r.image_id.clone(),
                    timeout: 55.0,
                    last_entry_id: last_entry.clone(),
                    include_logs_for_finished: false,
                };
                async move { c.image_join_streaming(req).await }
            })
            .await?;
            while let Some(m) = ctx
                .run(async {
                    stream
                        .message()
                        .await
                        .map_err(|s| api::status_error("ImageJoinStreaming", &s))
                })
                .await??
            {
                if !m.entry_id.is_empty() {
                    last_entry = m.entry_id.clone();
                }
                if m.result.is_some() {
                    result = m.result;
                    break;
                }
                if m.eof {
                    break;
                }
            }
            if result
                .as_ref()
                .is_none_or(|r| r.status == pb::generic_result::GenericStatus::Unspecified as i32)
            {
                ctx.run(tokio::time::sleep(Duration::from_millis(500))).await?;
            }
        }
        let result = result.unwrap_or_default();
        if result.status != pb::generic_result::GenericStatus::Success as i32 {
            return Err(Error::invalid(format!(
                "spec.image {reference:?}: Modal could not build it: {}",
                crate::vendor::cut(result.exception)
            )));
        }
        Ok(r.image_id)
    }

    /// The spec's env as the `modal` client carries a sandbox's env: a secret of the app's own
    /// (`Secret.from_dict`), which the sandbox names.
    async fn env_secret(&self, spec: &Spec, app_id: &str, ctx: &Ctx) -> Result<String> {
        let r = call(ctx, "SecretGetOrCreate", CALL_TIMEOUT, true, || {
            let mut c = self.api.client();
            let req = pb::SecretGetOrCreateRequest {
                object_creation_type: pb::ObjectCreationType::AnonymousOwnedByApp as i32,
                env_dict: spec.env.clone().into_iter().collect(),
                app_id: app_id.to_string(),
                environment_name: self.environment(),
                ..Default::default()
            };
            async move { c.secret_get_or_create(req).await }
        })
        .await?;
        Ok(r.secret_id)
    }

    /// Make the sandbox and wait for its task.
    async fn make(&self, spec: &Spec, image: Option<&str>, ctx: &Ctx) -> Result<ModalSandbox> {
        let app_id = self.app(ctx).await?;
        let image_id = match image {
            Some(i) => i.to_string(),
            None => self.image(spec, &app_id, ctx).await?,
        };
        let fuse = spec.capabilities.iter().any(|c| c == "fuse");
        let isolation = if fuse {
            "vm".to_string()
        } else {
            spec.isolation.clone().unwrap_or_else(|| "gvisor".into())
        };
        let secs = spec.max_lifetime.min(MAX_LIFETIME).as_secs_f64().ceil().max(1.0) as u64;
        let started_at_ms = agentbox_core::now_ms();
        let ends_at_ms = started_at_ms + secs * 1000;
        let workspace = spec.workspace.clone().unwrap_or_else(|| WORKSPACE.to_string());

        let mut t: BTreeMap<String, String> = spec.labels.clone().into_iter().collect();
        t.insert(tags::MARK.into(), "1".into());
        t.insert(TAG_ISOLATION.into(), isolation.clone());
        t.insert(TAG_STARTED.into(), started_at_ms.to_string());
        t.insert(TAG_ENDS.into(), ends_at_ms.to_string());
        if let Some(c) = spec.cpus {
            t.insert(TAG_CPUS.into(), ((c * 1000.0).round() as u64).to_string());
        }
        if let Some(m) = spec.memory_mb {
            t.insert(TAG_MEMORY.into(), m.to_string());
        }
        match &spec.network {
            None | Some(Network::Open) => t.insert(TAG_NETWORK.into(), "open".into()),
            // host is refused by check_spec; were it ever to reach here, blocked.
            Some(Network::None | Network::Host) => t.insert(TAG_NETWORK.into(), "none".into()),
            Some(Network::Allow(list)) => {
                tags::put(&mut t, TAG_ALLOW, &list.join(","))?;
                t.insert(TAG_NETWORK.into(), "allow".into())
            }
        };
        tags::put(&mut t, TAG_PORTS, &ports_tag(spec))?;
        tags::put(&mut t, TAG_WORKSPACE, &workspace)?;
        if let Some(s) = &spec.snapshot {
            t.insert(TAG_SNAPSHOT.into(), s.clone());
        }

        let mut definition = definition(spec, image_id, secs as u32, &isolation, self.o.memory_snapshots);
        if !spec.env.is_empty() {
            definition.secret_ids.push(self.env_secret(spec, &app_id, ctx).await?);
        }
        let created = call(ctx, "SandboxCreate", CALL_TIMEOUT, false, || {
            let mut c = self.api.client();
            let req = pb::SandboxCreateRequest {
                app_id: app_id.clone(),
                definition: Some(definition.clone()),
                environment_name: self.environment(),
                tags: api::tags(t.clone()),
            };
            async move { c.sandbox_create(req).await }
        })
        .await?;
        let sandbox_id = created.sandbox_id;
        tracing::info!(sandbox = %sandbox_id, isolation, lifetime_s = secs, "modal: sandbox made");
        let made = async {
            let task_id = self.task_of(&sandbox_id, ctx).await?;
            let id = SandboxId::new(NAME, &sandbox_id)?;
            let mut b = ModalSandbox {
                id,
                facts: Facts::default(),
                labels: spec.labels.clone(),
                task: Task {
                    api: self.api.clone(),
                    sandbox_id: sandbox_id.clone(),
                    task_id,
                },
                workspace: workspace.clone(),
                ports: spec.ports.iter().map(|p| (p.port, p.kind)).collect(),
            };
            setup_workspace(&b, ctx).await?;
            let probed = probe::probe(&b, &workspace, ctx).await?;
            if spec.gpu.is_some() && probed.gpu.is_none() {
                return Err(Error::refused(format!(
                    "spec.gpu: asked for {:?}, but nvidia-smi in the sandbox names no GPU (the box was ended)",
                    spec.gpu.as_deref().unwrap_or_default()
                )));
            }
            if fuse && !probed.fuse {
                return Err(Error::unsupported(
                    "spec.capabilities: fuse: /dev/fuse in the VM is not a character device root can open (the box \
                     was ended)",
                ));
            }
            // The hardware measured, kept where nothing in the box can write it.
            let mut with_hw = t.clone();
            hw_tags(&mut with_hw, &probed)?;
            self.set_tags(&sandbox_id, &with_hw, ctx).await?;
            b.facts = facts_of(&with_hw, Some(&probed))
                .ok_or_else(|| Error::unknown("modal: the tags just set do not read back"))?;
            Ok(b)
        }
        .await;
        match made {
            Ok(b) => Ok(b),
            Err(e) => {
                // Nothing half-made is left running.
                self.terminate(&sandbox_id).await;
                Err(e)
            }
        }
    }

    /// The task of a sandbox: waited for while it starts; `gone` when it ended first.
    async fn task_of(&self, sandbox_id: &str, ctx: &Ctx) -> Result<String> {
        loop {
            let r = call(ctx, "SandboxGetTaskId", CALL_TIMEOUT, true, || {
                let mut c = self.api.client();
                let req = pb::SandboxGetTaskIdRequest {
                    sandbox_id: sandbox_id.to_string(),
                    timeout: Some(50.0),
                    wait_until_ready: true,
                };
                async move { c.sandbox_get_task_id(req).await }
            })
            .await?;
            if let Some(t) = r.task_id.filter(|t| !t.is_empty()) {
                return Ok(t);
            }
            if let Some(res) = ended_result(r.task_result.as_ref()) {
                return Err(Error::gone(format!(
                    "modal: sandbox {sandbox_id} ended before it started: {}",
                    crate::vendor::cut(res.exception.clone())
                )));
            }
            // Not scheduled yet: ask again after a pause, as the `modal` client does.
            ctx.run(tokio::time::sleep(Duration::from_millis(500))).await?;
        }
    }

    async fn set_tags(&self, sandbox_id: &str, t: &BTreeMap<String, String>, ctx: &Ctx) -> Result<()> {
        call(ctx, "SandboxTagsSet", CALL_TIMEOUT, true, || {
            let mut c = self.api.client();
            let req = pb::SandboxTagsSetRequest {
                environment_name: self.environment(),
                sandbox_id: sandbox_id.to_string(),
                tags: api::tags(t.clone()),
            };
            async move { c.sandbox_tags_set(req).await }
        })
        .await
        .map(|_| ())
    }

    async fn get_tags(&self, sandbox_id: &str, ctx: &Ctx) -> Result<BTreeMap<String, String>> {
        let r = call(ctx, "SandboxTagsGet", CALL_TIMEOUT, true, || {
            let mut c = self.api.client();
            let req = pb::SandboxTagsGetRequest {
                sandbox_id: sandbox_id.to_string(),
            };
            async move { c.sandbox_tags_get(req).await }
        })
        .await?;
        Ok(r.tags.into_iter().map(|t| (t.tag_name, t.tag_value)).collect())
    }

    /// End a sandbox, best effort (a make that failed part way).
    async fn terminate(&self, sandbox_id: &str) {
        let ctx = Ctx::background().with_timeout(CALL_TIMEOUT);
        let r = call(&ctx, "SandboxTerminate", CALL_TIMEOUT, true, || {
            let mut c = self.api.client();
            let req = pb::SandboxTerminateRequest {
                sandbox_id: sandbox_id.to_string(),
            };
            async move { c.sandbox_terminate(req).await }
        })
        .await;
        if let Err(e) = r {
            tracing::warn!(sandbox = sandbox_id, "modal: ending a sandbox whose make failed: {e}");
        }
    }

    /// Whether the sandbox runs, and its task.
    async fn running_task(&self, sandbox_id: &str, ctx: &Ctx) -> Result<Option<String>> {
        let w = call(ctx, "SandboxWait", CALL_TIMEOUT, true, || {
            let mut c = self.api.client();
            let req = pb::SandboxWaitRequest {
                sandbox_id: sandbox_id.to_string(),
                timeout: 0.0,
            };
            async move { c.sandbox_wait(req).await }
        })
        .await;
        match w {
            Ok(w) if ended_result(w.result.as_ref()).is_some() => return Ok(None),
            Ok(_) => {}
            Err(e) if matches!(e.code(), ErrorCode::NotFound | ErrorCode::Invalid) => return Ok(None),
            Err(e) => return Err(e),
        }
        match self.task_of(sandbox_id, ctx).await {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.code() == ErrorCode::Gone => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A handle on a listed or attached sandbox from its tags, its facts `probed` where read.
    fn handle(
        &self,
        sandbox_id: &str,
        task_id: String,
        t: &BTreeMap<String, String>,
        probed: Option<&Probed>,
    ) -> Result<Option<ModalSandbox>> {
        let Some(facts) = facts_of(t, probed) else {
            return Ok(None);
        };
        Ok(Some(ModalSandbox {
            id: SandboxId::new(NAME, sandbox_id)?,
            workspace: facts.workspace.clone().unwrap_or_else(|| WORKSPACE.into()),
            ports: tags::get(t, TAG_PORTS)
                .and_then(|p| parse_ports(&p))
                .unwrap_or_default(),
            facts,
            labels: tags::labels_of(t),
            task: Task {
                api: self.api.clone(),
                sandbox_id: sandbox_id.to_string(),
                task_id,
            },
        }))
    }

    /// The snapshots named in the app's tags: name → image id.
    async fn snapshot_tags(&self, ctx: &Ctx) -> Result<(String, BTreeMap<String, String>)> {
        let app_id = self.app(ctx).await?;
        let r = call(ctx, "AppGetTags", CALL_TIMEOUT, true, || {
            let mut c = self.api.client();
            let req = pb::AppGetTagsRequest { app_id: app_id.clone() };
            async move { c.app_get_tags(req).await }
        })
        .await?;
        Ok((app_id, r.tags.into_iter().collect()))
    }

    /// Modal's filesystem snapshot of a box: an image of its files as they are now.
    async fn snapshot_fs(&self, id: &SandboxId, what: &str, ctx: &Ctx) -> Result<String> {
        let r = call(ctx, "SandboxSnapshotFs", Duration::from_secs(300), false, || {
            let mut c = self.api.client();
            let req = pb::SandboxSnapshotFsRequest {
                sandbox_id: id.name().to_string(),
                timeout: 290.0,
            };
            async move { c.sandbox_snapshot_fs(req).await }
        })
        .await?;
        let ok = r
            .result
            .as_ref()
            .is_some_and(|r| r.status == pb::generic_result::GenericStatus::Success as i32);
        if !ok || r.image_id.is_empty() {
            return Err(Error::unknown(format!(
                "{what}: Modal could not snapshot box {id}: {}",
                crate::vendor::cut(r.result.map(|r| r.exception).unwrap_or_default())
            )));
        }
        Ok(r.image_id)
    }

    async fn snapshot_kept(&self, name: &str, ctx: &Ctx) -> Result<Option<Kept>> {
        let (_, t) = self.snapshot_tags(ctx).await?;
        Ok(t.get(&format!("{APP_TAG_SNAPSHOT}{name}")).and_then(|v| Kept::parse(v)))
    }

    /// A memory snapshot of the box: Modal's `SandboxSnapshot`, waited for.
    async fn snapshot_memory(&self, id: &SandboxId, ctx: &Ctx) -> Result<Kept> {
        let t = self.get_tags(id.name(), ctx).await?;
        let num = |k: &str| t.get(k).and_then(|v| v.parse::<u64>().ok());
        let (Some(start), Some(end)) = (num(TAG_STARTED), num(TAG_ENDS)) else {
            return Err(Error::not_found(format!("snapshot: box {id} is not one of agentbox's")));
        };
        if tags::get(&t, TAG_WORKSPACE).as_deref() != Some(WORKSPACE) {
            return Err(Error::unsupported(format!(
                "snapshot: a memory snapshot keeps boxes of the default workspace {WORKSPACE} alone"
            )));
        }
        let isolation = t.get(TAG_ISOLATION).cloned().unwrap_or_else(|| "gvisor".into());
        let r = call(ctx, "SandboxSnapshot", CALL_TIMEOUT, false, || {
            let mut c = self.api.client();
            let req = pb::SandboxSnapshotRequest {
                sandbox_id: id.name().to_string(),
            };
            async move { c.sandbox_snapshot(req).await }
        })
        .await?;
        let until = tokio::time::Instant::now() + Duration::from_secs(300);
        loop {
            let w = call(ctx, "SandboxSnapshotWait", CALL_TIMEOUT, true, || {
                let mut c = self.api.client();
                let req = pb::SandboxSnapshotWaitRequest {
                    snapshot_id: r.snapshot_id.clone(),
                    timeout: 55.0,
                };
                async move { c.sandbox_snapshot_wait(req).await }
            })
            .await?;
            match w.result {
                Some(res) if res.status == pb::generic_result::GenericStatus::Success as i32 => break,
                Some(res)
                    if res.status != pb::generic_result::GenericStatus::Unspecified as i32
                        && res.status != pb::generic_result::GenericStatus::Timeout as i32 =>
                {
                    return Err(Error::unknown(format!(
                        "snapshot: Modal could not snapshot box {id}'s memory: {}",
                        crate::vendor::cut(res.exception)
                    )));
                }
                _ if tokio::time::Instant::now() >= until => {
                    return Err(Error::timeout(format!(
                        "snapshot: box {id}'s memory snapshot did not finish within 300 s"
                    )));
                }
                _ => {}
            }
        }
        Ok(Kept::Memory {
            id: r.snapshot_id,
            secs: end.saturating_sub(start) / 1000,
            isolation,
        })
    }

    /// A box restored from the memory snapshot `name`: the sandbox as it was, its programs where
    /// they were. It keeps what it was made with, so a spec may ask only its lifetime (the one
    /// it was made with) and labels.
    async fn restore(
        &self,
        spec: &Spec,
        name: &str,
        id: &str,
        secs: u64,
        isolation: &str,
        ctx: &Ctx,
    ) -> Result<ModalSandbox> {
        let asked = Spec {
            max_lifetime: spec.max_lifetime,
            labels: spec.labels.clone(),
            snapshot: spec.snapshot.clone(),
            ..Default::default()
        };
        if &asked != spec {
            return Err(Error::unsupported(format!(
                "spec: a box restored from the memory snapshot {name:?} is the box it was taken of; ask only its \
                 lifetime and labels"
            )));
        }
        let want = spec.max_lifetime.min(MAX_LIFETIME).as_secs_f64().ceil().max(1.0) as u64;
        if want != secs {
            return Err(Error::invalid(format!(
                "spec.max_lifetime: a box restored from the memory snapshot {name:?} keeps the lifetime it was made \
                 with, {secs} s"
            )));
        }
        let r = call(ctx, "SandboxRestore", CALL_TIMEOUT, false, || {
            let mut c = self.api.client();
            let req = pb::SandboxRestoreRequest {
                snapshot_id: id.to_string(),
                ..Default::default()
            };
            async move { c.sandbox_restore(req).await }
        })
        .await?;
        let sandbox_id = r.sandbox_id;
        let started_at_ms = agentbox_core::now_ms();
        let mut t: BTreeMap<String, String> = spec.labels.clone().into_iter().collect();
        t.insert(tags::MARK.into(), "1".into());
        t.insert(TAG_ISOLATION.into(), isolation.to_string());
        t.insert(TAG_STARTED.into(), started_at_ms.to_string());
        t.insert(TAG_ENDS.into(), (started_at_ms + secs * 1000).to_string());
        tags::put(&mut t, TAG_WORKSPACE, WORKSPACE)?;
        t.insert(TAG_SNAPSHOT.into(), name.to_string());
        let made = async {
            let task_id = self.task_of(&sandbox_id, ctx).await?;
            let mut b = ModalSandbox {
                id: SandboxId::new(NAME, &sandbox_id)?,
                facts: Facts::default(),
                labels: spec.labels.clone(),
                task: Task {
                    api: self.api.clone(),
                    sandbox_id: sandbox_id.clone(),
                    task_id,
                },
                workspace: WORKSPACE.to_string(),
                ports: Vec::new(),
            };
            let probed = probe::probe(&b, WORKSPACE, ctx).await?;
            hw_tags(&mut t, &probed)?;
            self.set_tags(&sandbox_id, &t, ctx).await?;
            // The network and ports it was made with are not kept with the snapshot: unknown.
            b.facts = facts_of(&t, Some(&probed))
                .ok_or_else(|| Error::unknown("modal: the tags just set do not read back"))?;
            Ok(b)
        }
        .await;
        match made {
            Ok(b) => {
                tracing::info!(sandbox = %sandbox_id, snapshot = name, "modal: sandbox restored from memory");
                Ok(b)
            }
            Err(e) => {
                self.terminate(&sandbox_id).await;
                Err(e)
            }
        }
    }

    async fn set_app_tags(&self, app_id: &str, t: BTreeMap<String, String>, ctx: &Ctx) -> Result<()> {
        call(ctx, "AppSetTags", CALL_TIMEOUT, true, || {
            let mut c = self.api.client();
            let req = pb::AppSetTagsRequest {
                app_id: app_id.to_string(),
                tags: t.clone().into_iter().collect(),
            };
            async move { c.app_set_tags(req).await }
        })
        .await
        .map(|_| ())
    }
}

/// What a snapshot's name stands for, kept as the value of its app tag.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Kept {
    /// A filesystem snapshot: `fs.IMAGE`.
    Files(String),
    /// A memory snapshot: `mem.ID.SECONDS.ISOLATION`, with the lifetime and isolation of the
    /// box it was taken of, which a box restored from it keeps.
    Memory { id: String, secs: u64, isolation: String },
}

impl Kept {
    fn to_tag(&self) -> String {
        match self {
            Kept::Files(image) => format!("fs.{image}"),
            Kept::Memory { id, secs, isolation } => format!("mem.{id}.{secs}.{isolation}"),
        }
    }

    fn parse(v: &str) -> Option<Kept> {
        if let Some(image) = v.strip_prefix("fs.") {
            return (!image.is_empty() && !image.contains('.')).then(|| Kept::Files(image.to_string()));
        }
        let mut parts = v.strip_prefix("mem.")?.split('.');
        let (id, secs, isolation) = (parts.next()?, parts.next()?.parse().ok()?, parts.next()?);
        (parts.next().is_none() && !id.is_empty() && matches!(isolation, "gvisor" | "vm")).then(|| Kept::Memory {
            id: id.to_string(),
            secs,
            isolation: isolation.to_string(),
        })
    }
}

/// Make the workspace (a box made from a snapshot has it already).
async fn setup_workspace(b: &ModalSandbox, ctx: &Ctx) -> Result<()> {
    let argv = ["mkdir", "-p", "--", &b.workspace].map(String::from);
    let opts = agentbox_core::ExecOptions {
        cwd: Some("/".into()),
        ..Default::default()
    };
    let p = b.exec(&argv, &opts, ctx).await?;
    let out = agentbox_core::finish(p, agentbox_core::FinishOptions::default()).await?;
    if out.status.code != 0 {
        return Err(Error::unknown(format!(
            "making the workspace {}: exit {}: {}",
            b.workspace,
            out.status.code,
            out.stderr_text().trim()
        )));
    }
    Ok(())
}

/// A GPU as Modal takes it: `TYPE` or `TYPE:COUNT` (the `modal` client's parse).
fn gpu_config(gpu: &str) -> Result<pb::GpuConfig> {
    let (kind, count) = match gpu.split_once(':') {
        Some((k, n)) => (
            k,
            n.parse::<u32>().ok().filter(|n| *n > 0).ok_or_else(|| {
                Error::invalid(format!(
                    "spec.gpu {gpu:?}: the count after ':' must be a whole number above 0"
                ))
            })?,
        ),
        None => (gpu, 1),
    };
    if kind.is_empty() || !kind.bytes().all(|b| b.is_ascii_alphanumeric() || b"-!_".contains(&b)) {
        return Err(Error::invalid(format!(
            "spec.gpu {gpu:?}: not a Modal GPU type (T4, A100-80GB, H100!…)"
        )));
    }
    Ok(pb::GpuConfig {
        gpu_type: kind.to_ascii_uppercase(),
        count,
        ..Default::default()
    })
}

/// The sandbox Modal is asked for.
fn definition(
    spec: &Spec,
    image_id: String,
    timeout_secs: u32,
    isolation: &str,
    memory_snapshots: bool,
) -> pb::Sandbox {
    let network_access = match &spec.network {
        None | Some(Network::Open) => pb::NetworkAccess {
            network_access_type: pb::network_access::NetworkAccessType::Open as i32,
            ..Default::default()
        },
        // host is refused by check_spec; were it ever to reach here, blocked.
        Some(Network::None | Network::Host) => pb::NetworkAccess {
            network_access_type: pb::network_access::NetworkAccessType::Blocked as i32,
            ..Default::default()
        },
        Some(Network::Allow(list)) => {
            let (cidrs, domains): (Vec<String>, Vec<String>) = list
                .iter()
                .cloned()
                .partition(|e| e.parse::<std::net::Ipv4Addr>().is_ok() || e.contains('/'));
            pb::NetworkAccess {
                network_access_type: pb::network_access::NetworkAccessType::Allowlist as i32,
                allowed_cidrs: cidrs
                    .into_iter()
                    .map(|c| if c.contains('/') { c } else { format!("{c}/32") })
                    .collect(),
                allowed_domains: domains,
            }
        }
    };
    let ports = spec
        .ports
        .iter()
        .map(|p| pb::PortSpec {
            port: u32::from(p.port),
            unencrypted: p.kind == PortKind::Tcp,
            tunnel_type: None,
        })
        .collect::<Vec<_>>();
    pb::Sandbox {
        entrypoint_args: ["sleep", "infinity"].map(String::from).to_vec(),
        image_id,
        timeout_secs,
        resources: Some(pb::Resources {
            milli_cpu: spec.cpus.map(|c| (c * 1000.0).round() as u32).unwrap_or_default(),
            memory_mb: spec
                .memory_mb
                .map(|m| m.min(u64::from(u32::MAX)) as u32)
                .unwrap_or_default(),
            gpu_config: spec.gpu.as_deref().and_then(|g| gpu_config(g).ok()),
            ..Default::default()
        }),
        block_network: spec.network == Some(Network::None),
        network_access: Some(network_access),
        open_ports_oneof: (!ports.is_empty())
            .then_some(pb::sandbox::OpenPortsOneof::OpenPorts(pb::PortSpecs { ports })),
        runtime: Some(isolation.to_string()),
        enable_snapshot: memory_snapshots,
        ..Default::default()
    }
}

/// `8080s.5432t`: each port and its kind (`s` https, `t` tcp).
fn ports_tag(spec: &Spec) -> String {
    if spec.ports.is_empty() {
        return "none".into();
    }
    spec.ports
        .iter()
        .map(|p| format!("{}{}", p.port, if p.kind == PortKind::Tcp { 't' } else { 's' }))
        .collect::<Vec<_>>()
        .join(".")
}

/// The ports [`ports_tag`] wrote; `None` for a tag that is not one it wrote (a tag changed by
/// hand reads as unknown, never as "no ports").
fn parse_ports(s: &str) -> Option<Vec<(u16, PortKind)>> {
    if s == "none" {
        return Some(Vec::new());
    }
    s.split('.')
        .map(|p| {
            let (n, kind) = if let Some(n) = p.strip_suffix('s') {
                (n, PortKind::Https)
            } else {
                (p.strip_suffix('t')?, PortKind::Tcp)
            };
            Some((n.parse().ok()?, kind))
        })
        .collect()
}

/// The hardware tags of what the probe measured.
fn hw_tags(t: &mut BTreeMap<String, String>, p: &Probed) -> Result<()> {
    t.insert(TAG_HW.into(), "1".into());
    if let Some(g) = &p.gpu {
        tags::put(t, TAG_HW_GPU, g)?;
    }
    t.insert(TAG_HW_FUSE.into(), if p.fuse { "1" } else { "0" }.into());
    if let Some(d) = p.disk_gb {
        t.insert(TAG_HW_DISK.into(), d.to_string());
    }
    Ok(())
}

/// A box's facts from its tags and, where the probe answered, what it read. `None` for a
/// sandbox that is not this provider's.
///
/// With a reading, every fact is given: the measured ones from it, the spec's (network,
/// ports, isolation, size) from the tags. Without one, only the hardware the create measured
/// stands in; the security facts (ptrace scope, network, ports) are left out, unknown.
fn facts_of(t: &BTreeMap<String, String>, probed: Option<&Probed>) -> Option<Facts> {
    if t.get(tags::MARK).map(String::as_str) != Some("1") {
        return None;
    }
    let num = |k: &str| t.get(k).and_then(|v| v.parse::<u64>().ok());
    let mut f = Facts {
        provider: NAME.into(),
        isolation: t.get(TAG_ISOLATION).cloned().unwrap_or_else(|| "gvisor".into()),
        cpus: num(TAG_CPUS).map(|m| m as f64 / 1000.0),
        memory_mb: num(TAG_MEMORY),
        started_at_ms: num(TAG_STARTED),
        ends_at_ms: num(TAG_ENDS),
        live_processes: true,
        secrets_via: Some("fd".into()),
        workspace: Some(tags::get(t, TAG_WORKSPACE).unwrap_or_else(|| WORKSPACE.into())),
        snapshot: t.get(TAG_SNAPSHOT).cloned(),
        ..Default::default()
    };
    match probed {
        Some(p) => {
            f.gpu = p.gpu.clone();
            f.fuse = Some(p.fuse);
            f.disk_gb = p.disk_gb;
            f.ptrace_scope = p.ptrace_scope;
            f.network = match t.get(TAG_NETWORK).map(String::as_str) {
                Some("open") => Some(NetworkFact::Open),
                Some("none") => Some(NetworkFact::None),
                Some("allow") => {
                    tags::get(t, TAG_ALLOW).map(|l| NetworkFact::Allowlist(l.split(',').map(String::from).collect()))
                }
                _ => None,
            };
            f.ports = tags::get(t, TAG_PORTS)
                .and_then(|p| parse_ports(&p))
                .map(|ports| ports.into_iter().map(|(port, kind)| PortFact { port, kind }).collect());
        }
        None => {
            f.gpu = tags::get(t, TAG_HW_GPU);
            f.fuse = t.get(TAG_HW_FUSE).map(|v| v == "1");
            f.disk_gb = num(TAG_HW_DISK);
        }
    }
    Some(f)
}

#[async_trait]
impl Provider for ModalProvider {
    fn name(&self) -> &str {
        NAME
    }

    fn honours(&self) -> Honours {
        Honours {
            image: true,
            snapshot: true,
            cpus: true,
            memory: true,
            gpu: true,
            isolation: vec!["gvisor".into(), "vm".into()],
            network_none: true,
            network_allowlist: true,
            ports: true,
            capabilities: vec!["fuse".into()],
            workspace: true,
            env: true,
            live_processes: true,
            relabel: true,
            snapshots: true,
            fork: true,
            ..Default::default()
        }
    }

    async fn create(&self, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        check_spec(spec, &self.honours(), NAME)?;
        self.refuse(spec)?;
        let ctx = ctx.with_timeout(self.o.create_timeout);
        if let Some(name) = &spec.snapshot
            && let Some(Kept::Memory { id, secs, isolation }) = self.snapshot_kept(name, &ctx).await?
        {
            return Ok(Arc::new(self.restore(spec, name, &id, secs, &isolation, &ctx).await?));
        }
        let b = self.make(spec, None, &ctx).await?;
        Ok(Arc::new(b))
    }

    async fn attach(&self, id: &SandboxId, ctx: &Ctx) -> Result<Option<Arc<dyn Sandbox>>> {
        id.expect_provider(NAME)?;
        let sandbox_id = id.name();
        let Some(task_id) = self.running_task(sandbox_id, ctx).await? else {
            return Ok(None);
        };
        let t = self.get_tags(sandbox_id, ctx).await?;
        let Some(mut b) = self.handle(sandbox_id, task_id, &t, None)? else {
            return Ok(None);
        };
        // The facts read again; every try failing leaves the hardware measured at create.
        let mut probed = None;
        for i in 0..self.o.attach_tries.max(1) {
            match probe::probe(&b, &b.workspace, ctx).await {
                Ok(p) => {
                    probed = Some(p);
                    break;
                }
                Err(e) => {
                    tracing::warn!(box_id = %id, try_ = i + 1, "modal: attach: reading the box's facts: {e}");
                    ctx.check()?;
                    if i + 1 < self.o.attach_tries {
                        tokio::time::sleep(self.o.attach_pause).await;
                    }
                }
            }
        }
        if probed.is_none() && t.get(TAG_HW).map(String::as_str) != Some("1") {
            return Err(Error::unknown(format!(
                "attach: box {id}: its facts could not be read in the box, and none were kept from its make (the \
                 box runs on; try again)"
            )));
        }
        setup_workspace(&b, ctx).await.map_err(|e| {
            Error::new(
                e.code(),
                format!("attach: box {id}: setting up its workspace: {}", e.message()),
            )
        })?;
        b.facts = facts_of(&t, probed.as_ref())
            .ok_or_else(|| Error::unknown("modal: the box's tags changed under attach"))?;
        Ok(Some(Arc::new(b)))
    }

    async fn list(&self, labels: &Labels, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        let app_id = self.app(ctx).await?;
        let mut want: BTreeMap<String, String> = labels.clone().into_iter().collect();
        want.insert(tags::MARK.into(), "1".into());
        let mut out: Vec<Arc<dyn Sandbox>> = Vec::new();
        let mut before = 0.0;
        loop {
            let page = call(ctx, "SandboxList", CALL_TIMEOUT, true, || {
                let mut c = self.api.client();
                let req = pb::SandboxListRequest {
                    app_id: app_id.clone(),
                    before_timestamp: before,
                    environment_name: self.environment(),
                    include_finished: false,
                    tags: api::tags(want.clone()),
                };
                async move { c.sandbox_list(req).await }
            })
            .await?;
            if page.sandboxes.is_empty() {
                break;
            }
            for s in &page.sandboxes {
                let t: BTreeMap<String, String> = s
                    .tags
                    .iter()
                    .map(|t| (t.tag_name.clone(), t.tag_value.clone()))
                    .collect();
                let ended = s
                    .task_info
                    .as_ref()
                    .and_then(|i| ended_result(i.result.as_ref()))
                    .is_some();
                let Some(task_id) = s.task_info.as_ref().map(|i| i.id.clone()).filter(|i| !i.is_empty()) else {
                    continue;
                };
                if ended || !labels.iter().all(|(k, v)| t.get(k) == Some(v)) {
                    continue;
                }
                if let Some(b) = self.handle(&s.id, task_id, &t, None)? {
                    out.push(Arc::new(b));
                }
            }
            let oldest = page
                .sandboxes
                .iter()
                .map(|s| s.created_at)
                .fold(f64::INFINITY, f64::min);
            if !(oldest.is_finite() && (before == 0.0 || oldest < before)) {
                break;
            }
            before = oldest;
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
    fn gpus_parse_as_the_modal_client_parses_them() {
        let g = gpu_config("a100-80gb:2").unwrap();
        assert_eq!((g.gpu_type.as_str(), g.count), ("A100-80GB", 2));
        assert_eq!(gpu_config("H100!").unwrap().gpu_type, "H100!");
        for bad in ["", "T4:0", "T4:x", "T 4"] {
            let e = gpu_config(bad).unwrap_err();
            assert_eq!(e.code(), ErrorCode::Invalid, "{bad:?}");
            assert!(e.message().starts_with("spec.gpu "), "{e}");
        }
    }

    #[test]
    fn a_snapshots_tag_reads_back_and_a_changed_one_reads_as_none() {
        for k in [
            Kept::Files("im-abc123".into()),
            Kept::Memory {
                id: "sn-xyz".into(),
                secs: 600,
                isolation: "vm".into(),
            },
        ] {
            assert!(tags::fits(&k.to_tag()), "{k:?}");
            assert_eq!(Kept::parse(&k.to_tag()), Some(k));
        }
        for bad in [
            "im-abc",
            "fs.",
            "mem.x.y.vm",
            "mem.x.5.kata",
            "mem.x.5.vm.extra",
            "fs.a.b",
        ] {
            assert_eq!(Kept::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn ports_round_trip_through_their_tag() {
        let mut spec = Spec::new(Duration::from_secs(60));
        spec.ports = vec![
            agentbox_core::PortSpec {
                port: 8080,
                kind: PortKind::Https,
            },
            agentbox_core::PortSpec {
                port: 5432,
                kind: PortKind::Tcp,
            },
        ];
        let t = ports_tag(&spec);
        assert_eq!(t, "8080s.5432t");
        assert!(tags::fits(&t));
        assert_eq!(
            parse_ports(&t),
            Some(vec![(8080, PortKind::Https), (5432, PortKind::Tcp)])
        );
        assert_eq!(parse_ports("none"), Some(vec![]));
        for bad in ["", "80", "80x", "ü", "80s.x"] {
            assert_eq!(parse_ports(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn without_a_reading_only_the_hardware_kept_stands_in() {
        let mut t = BTreeMap::from([
            (tags::MARK.to_string(), "1".to_string()),
            (TAG_NETWORK.to_string(), "none".to_string()),
            (TAG_PORTS.to_string(), "none".to_string()),
        ]);
        hw_tags(
            &mut t,
            &Probed {
                gpu: Some("NVIDIA T4".into()),
                fuse: true,
                disk_gb: Some(50),
                ptrace_scope: Some(1),
            },
        )
        .unwrap();
        let f = facts_of(&t, None).unwrap();
        assert_eq!(
            (f.gpu.as_deref(), f.fuse, f.disk_gb),
            (Some("NVIDIA T4"), Some(true), Some(50))
        );
        assert_eq!(
            (f.ptrace_scope, &f.network, &f.ports),
            (None, &None, &None),
            "security facts are unknown"
        );
        let read = facts_of(&t, Some(&Probed::default())).unwrap();
        assert_eq!(read.network, Some(NetworkFact::None));
        assert_eq!(read.ports, Some(vec![]));
        assert_eq!(read.gpu, None, "a reading that names no GPU is the fact");
        t.remove(tags::MARK);
        assert!(facts_of(&t, None).is_none(), "not this provider's");
    }
}

//! The two traits every provider fills: [`Provider`] makes and finds boxes, [`Sandbox`] is one.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::ctx::Ctx;
use crate::error::Result;
use crate::facts::Facts;
use crate::id::SandboxId;
use crate::lifecycle::{Lifecycle, Snapshot, refuse};
use crate::process::{ExecOptions, Process};
use crate::spec::{Honours, Labels, Spec};

/// Makes boxes, finds one again by id after a restart, and lists them by label.
///
/// A provider checks every spec with [`crate::check_spec`] against its [`Provider::honours`]
/// before it makes anything, and marks its own boxes with labels under `agentbox`.
///
/// ```no_run
/// # async fn f(provider: &dyn agentbox_core::Provider) -> agentbox_core::Result<()> {
/// use std::time::Duration;
/// use agentbox_core::{Ctx, Spec};
/// let ctx = Ctx::background();
/// let b = provider.create(&Spec::new(Duration::from_secs(600)), &ctx).await?;
/// let again = provider.attach(b.id(), &ctx).await?.expect("still running");
/// again.destroy(&ctx).await?;
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// The provider's name, the prefix of its box ids: `local`, `docker`...
    fn name(&self) -> &str;

    /// What this provider can honour, so a caller can ask before it creates.
    fn honours(&self) -> Honours;

    /// Make a box. Refuses a spec field it cannot honour (`unsupported`) or a malformed one
    /// (`invalid`), naming the field.
    async fn create(&self, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>>;

    /// Find a box by id. `None` for a box that does not exist or has ended; `invalid` for an
    /// id that is not this provider's.
    async fn attach(&self, id: &SandboxId, ctx: &Ctx) -> Result<Option<Arc<dyn Sandbox>>>;

    /// Every box of this provider that carries all of `labels` and has not ended: running, or
    /// asleep ([`Status::Sleeping`]).
    async fn list(&self, labels: &Labels, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>>;

    /// The lifecycle beyond create and destroy (names, sleep and wake, a moved deadline,
    /// snapshots, forks, labels changed after the make), for a provider whose platform has one:
    /// `Some(self)` from a provider that implements [`Lifecycle`] (in one file of its own),
    /// `None`, the default, from one that has none, whose every such operation is then refused
    /// `unsupported`. Callers reach it through the methods of `dyn Provider` below
    /// ([`Provider::lifecycle`] is found the way [`Sandbox::files`] is).
    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        None
    }
}

/// One running machine: a directory here, a container, a cloud sandbox.
///
/// A program in a box never receives the host process's environment: only the spec's env,
/// the exec's own variables and what the provider documents (PATH, HOME...).
#[async_trait]
pub trait Sandbox: Send + Sync + 'static {
    /// The box's id, carrying its provider.
    fn id(&self) -> &SandboxId;

    /// What the box got.
    fn facts(&self) -> &Facts;

    /// The host's labels on the box (without the provider's own).
    fn labels(&self) -> &Labels;

    /// Start `argv[0]` with the rest as arguments. The context governs the program: when it
    /// ends, the program is killed. A program that does not exist is `not_found`, here or,
    /// where the provider only learns it once started, as exit code 127.
    async fn exec(&self, argv: &[String], opts: &ExecOptions, ctx: &Ctx) -> Result<Process>;

    /// Whether the box still runs.
    async fn status(&self, ctx: &Ctx) -> Result<Status>;

    /// Write `data` to the file `path` in the box (relative to its workspace), creating the
    /// parent directories and replacing what was there.
    async fn upload(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<()>;

    /// Read the file `path` of the box whole. A file over `max_bytes` is refused `too_large`
    /// before a byte of it moves.
    async fn download(&self, path: &str, max_bytes: u64, ctx: &Ctx) -> Result<Vec<u8>>;

    /// How this machine reaches `port` in the box.
    async fn endpoint(&self, port: u16, ctx: &Ctx) -> Result<Endpoint>;

    /// End the box and every program in it. Destroying an ended box is no error.
    async fn destroy(&self, ctx: &Ctx) -> Result<()>;

    /// The box's files one message per operation, where something in the box serves them (a
    /// runner); `None` where each operation would be a process of its own.
    fn files(&self) -> Option<&dyn crate::files::Files> {
        None
    }

    /// The last `max` connections the box's egress proxy refused, oldest first: where the box's
    /// allowlist is enforced by agentbox's own proxy (a namespace box with `network: { allow }`).
    /// Elsewhere `unsupported`, naming the box.
    async fn net_refusals(&self, max: usize, ctx: &Ctx) -> Result<Vec<crate::NetRefusal>> {
        let _ = (max, ctx);
        Err(crate::Error::unsupported(format!(
            "box {}: no egress proxy of agentbox's guards it, so it records no refusal",
            self.id()
        )))
    }

    /// The processes the box keeps, where something in it keeps them (a runner): listed,
    /// read and attached to by any host process. `None` where a program lives only as long as
    /// the exec that started it; such a box refuses `detach` and `timeout` (`unsupported`).
    fn processes(&self) -> Option<&dyn crate::processes::Processes> {
        None
    }
}

/// Whether a box runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// It runs and takes execs.
    Running,
    /// It sleeps: its files are kept and it takes no exec until woken (`Lifecycle::wake`).
    Sleeping,
    /// It ended: destroyed, or its lifetime passed.
    Ended,
}

/// An address on which this machine reaches a port of a box.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Endpoint {
    /// A host name or address.
    pub host: String,
    /// The port.
    pub port: u16,
    /// An URL, for a port served over https.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// The lifecycle's operations on any provider: each goes to the provider's [`Lifecycle`] and is
/// refused `unsupported` (naming the operation and the provider) where it has none, so a
/// caller never asks which providers have one.
///
/// ```no_run
/// # async fn f(provider: &dyn agentbox_core::Provider, id: &agentbox_core::SandboxId) -> agentbox_core::Result<()> {
/// use agentbox_core::Ctx;
/// if provider.honours().sleep {
///     provider.sleep(id, &Ctx::background()).await?;
/// }
/// # Ok(()) }
/// ```
impl dyn Provider {
    fn lifecycle_for(&self, operation: &str) -> Result<&dyn Lifecycle> {
        self.lifecycle().ok_or_else(|| refuse(self.name(), operation))
    }

    /// [`Lifecycle::open`].
    pub async fn open(&self, name: &str, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        self.lifecycle_for("open")?.open(name, spec, ctx).await
    }

    /// [`Lifecycle::discard`].
    pub async fn discard(&self, name: &str, labels: &Labels, ctx: &Ctx) -> Result<bool> {
        self.lifecycle_for("discard")?.discard(name, labels, ctx).await
    }

    /// [`Lifecycle::sleep`].
    pub async fn sleep(&self, id: &SandboxId, ctx: &Ctx) -> Result<()> {
        self.lifecycle_for("sleep")?.sleep(id, ctx).await
    }

    /// [`Lifecycle::wake`].
    pub async fn wake(&self, id: &SandboxId, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        self.lifecycle_for("wake")?.wake(id, ctx).await
    }

    /// [`Lifecycle::extend`].
    pub async fn extend(&self, id: &SandboxId, ends_at_ms: u64, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        self.lifecycle_for("extend")?.extend(id, ends_at_ms, ctx).await
    }

    /// [`Lifecycle::relabel`].
    pub async fn relabel(&self, id: &SandboxId, labels: &Labels, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        self.lifecycle_for("relabel")?.relabel(id, labels, ctx).await
    }

    /// [`Lifecycle::snapshot`].
    pub async fn snapshot(&self, id: &SandboxId, name: &str, ctx: &Ctx) -> Result<Snapshot> {
        self.lifecycle_for("snapshot")?.snapshot(id, name, ctx).await
    }

    /// [`Lifecycle::snapshots`].
    pub async fn snapshots(&self, ctx: &Ctx) -> Result<Vec<Snapshot>> {
        self.lifecycle_for("snapshots")?.snapshots(ctx).await
    }

    /// [`Lifecycle::delete_snapshot`].
    pub async fn delete_snapshot(&self, name: &str, ctx: &Ctx) -> Result<bool> {
        self.lifecycle_for("delete_snapshot")?.delete_snapshot(name, ctx).await
    }

    /// [`Lifecycle::fork`].
    pub async fn fork(&self, id: &SandboxId, n: usize, spec: &Spec, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        self.lifecycle_for("fork")?.fork(id, n, spec, ctx).await
    }
}

impl std::fmt::Debug for dyn Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox").field("id", &self.id().as_str()).finish()
    }
}

//! The two traits every provider fills: [`Provider`] makes and finds boxes, [`Sandbox`] is one.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::ctx::Ctx;
use crate::error::Result;
use crate::facts::Facts;
use crate::id::SandboxId;
use crate::lifecycle::{Snapshot, refuse};
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

    // The lifecycle beyond create and destroy (see `lifecycle`): each declared in `Honours`,
    // each refused `unsupported` by default, so a provider fills what it can and no more.

    /// The box named `name` among this provider's boxes whose labels are exactly
    /// `spec.labels`: made from `spec` when there is none (or it ended), woken when it sleeps.
    /// Two opens of one name at once answer one box. `Honours::names`.
    async fn open(&self, name: &str, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let _ = (name, spec, ctx);
        Err(refuse(self.name(), "open"))
    }

    /// End the box named `name` (labels exactly `labels`) and delete whatever was kept of it:
    /// the next [`Provider::open`] finds none. `false` when there was none. `Honours::names`.
    async fn discard(&self, name: &str, labels: &Labels, ctx: &Ctx) -> Result<bool> {
        let _ = (name, labels, ctx);
        Err(refuse(self.name(), "discard"))
    }

    /// Put the box to sleep: its files are kept, its programs end (or are frozen, where the
    /// box's facts say `sleep: frozen`), and its lifetime goes on being enforced with no call
    /// from the host. A sleeping box is listed and attached as [`Status::Sleeping`] and
    /// refuses programs and files until woken. Sleeping a sleeping box is no error.
    /// `Honours::sleep`.
    async fn sleep(&self, id: &SandboxId, ctx: &Ctx) -> Result<()> {
        let _ = (id, ctx);
        Err(refuse(self.name(), "sleep"))
    }

    /// Wake a sleeping box (a running one is answered as it is). `gone` for a box that ended.
    /// `Honours::sleep`.
    async fn wake(&self, id: &SandboxId, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let _ = (id, ctx);
        Err(refuse(self.name(), "wake"))
    }

    /// Move the box's deadline to `ends_at_ms` (milliseconds since the Unix epoch), later or
    /// earlier, still enforced with no call from the host. Refuses a deadline that
    /// [`crate::check_deadline`] refuses. Answers the box with its new facts.
    /// `Honours::extend`.
    async fn extend(&self, id: &SandboxId, ends_at_ms: u64, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let _ = (id, ends_at_ms, ctx);
        Err(refuse(self.name(), "extend"))
    }

    /// Replace the host's labels of the box (the provider's own are kept). Answers the box with
    /// its new labels. `Honours::relabel`.
    async fn relabel(&self, id: &SandboxId, labels: &Labels, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let _ = (id, labels, ctx);
        Err(refuse(self.name(), "relabel"))
    }

    /// Keep the box's files (and its memory, where [`Snapshot::memory`] says so) under `name`,
    /// unique per provider: `refused` when one of that name exists. A spec naming it in
    /// `snapshot` makes boxes from it. `Honours::snapshots`.
    async fn snapshot(&self, id: &SandboxId, name: &str, ctx: &Ctx) -> Result<Snapshot> {
        let _ = (id, name, ctx);
        Err(refuse(self.name(), "snapshot"))
    }

    /// The snapshots this provider keeps. `Honours::snapshots`.
    async fn snapshots(&self, ctx: &Ctx) -> Result<Vec<Snapshot>> {
        let _ = ctx;
        Err(refuse(self.name(), "snapshots"))
    }

    /// Delete the snapshot `name`; `false` when there was none. Boxes made from it are not
    /// touched. `Honours::snapshots`.
    async fn delete_snapshot(&self, name: &str, ctx: &Ctx) -> Result<bool> {
        let _ = (name, ctx);
        Err(refuse(self.name(), "delete_snapshot"))
    }

    /// `n` new boxes made from `spec` holding the box's files as they are now, each on its own
    /// from then on (its own lifetime, its own changes). All or none: a fork that fails part
    /// way destroys the boxes it made. `spec.snapshot` must be unset. `Honours::fork`.
    async fn fork(&self, id: &SandboxId, n: usize, spec: &Spec, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        let _ = (id, n, spec, ctx);
        Err(refuse(self.name(), "fork"))
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
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// It runs and takes execs.
    Running,
    /// It sleeps: its files are kept and it takes no exec until woken (`Provider::wake`).
    Sleeping,
    /// It ended: destroyed, or its lifetime passed.
    Ended,
}

/// An address on which this machine reaches a port of a box.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// A host name or address.
    pub host: String,
    /// The port.
    pub port: u16,
    /// An URL, for a port served over https.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

impl std::fmt::Debug for dyn Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox").field("id", &self.id().as_str()).finish()
    }
}

//! The two traits every provider fills: [`Provider`] makes and finds boxes, [`Sandbox`] is one.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::ctx::Ctx;
use crate::error::Result;
use crate::facts::Facts;
use crate::id::SandboxId;
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

    /// Every running box of this provider that carries all of `labels`.
    async fn list(&self, labels: &Labels, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>>;
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

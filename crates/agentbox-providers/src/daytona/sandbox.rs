//! One Daytona sandbox as a box: its programs through the toolbox's session commands (see
//! `exec`), its files through the toolbox's file API, its state from the control plane.

use agentbox_core::{
    Ctx, Endpoint, Error, ErrorCode, ExecOptions, Facts, Labels, Process, Result, Sandbox, SandboxId, Status,
};
use async_trait::async_trait;

use super::api::{Api, SandboxDto};
use super::exec::{self, Tuning};
use super::toolbox::Toolbox;

/// One sandbox.
pub struct DaytonaSandbox {
    pub(super) api: Api,
    pub(super) toolbox: Toolbox,
    pub(super) id: SandboxId,
    /// Daytona's id of the sandbox.
    pub(super) sandbox: String,
    pub(super) facts: Facts,
    pub(super) labels: Labels,
    pub(super) workspace: String,
    pub(super) tuning: Tuning,
}

/// How a sandbox reads as a box's status. A delete is soft at first (the state stays, the
/// desired state is `destroyed` until Daytona gets to it): that box has ended.
pub(crate) fn status_of(d: &SandboxDto) -> Status {
    if d.desired_state.as_deref() == Some("destroyed") {
        return Status::Ended;
    }
    match d.state() {
        "stopped" | "stopping" | "archived" | "archiving" | "paused" | "pausing" => Status::Sleeping,
        "destroyed" | "destroying" | "error" | "build_failed" => Status::Ended,
        _ => Status::Running,
    }
}

impl DaytonaSandbox {
    /// Daytona's id of the sandbox.
    pub fn sandbox_id(&self) -> &str {
        &self.sandbox
    }

    /// `path` in the box: relative paths are taken from the workspace.
    fn absolute(&self, path: &str) -> Result<String> {
        if path.is_empty() || path.contains('\0') {
            return Err(Error::invalid(format!("path {path:?}: must be non-empty with no NUL")));
        }
        Ok(if path.starts_with('/') {
            path.to_string()
        } else {
            format!("{}/{path}", self.workspace.trim_end_matches('/'))
        })
    }

    pub(super) async fn read(&self, ctx: &Ctx) -> Result<Option<SandboxDto>> {
        super::get_sandbox(&self.api, &self.sandbox, ctx).await
    }

    /// A toolbox error as the caller should read it: where the sandbox has ended (its proxy
    /// answers 404 for it, or its toolbox refuses a sandbox that is not started), `gone`.
    async fn lost(&self, e: Error, ctx: &Ctx) -> Error {
        if !matches!(e.code(), ErrorCode::NotFound | ErrorCode::Invalid | ErrorCode::Refused) {
            return e;
        }
        match self.read(ctx).await {
            Ok(None) => Error::gone(format!("box {}: it has ended", self.id)),
            Ok(Some(d)) if status_of(&d) == Status::Ended => Error::gone(format!("box {}: it has ended", self.id)),
            Ok(Some(d)) if status_of(&d) == Status::Sleeping => crate::lifecycle::asleep_error(&self.id),
            _ => e,
        }
    }
}

#[async_trait]
impl Sandbox for DaytonaSandbox {
    fn id(&self) -> &SandboxId {
        &self.id
    }

    fn facts(&self) -> &Facts {
        &self.facts
    }

    fn labels(&self) -> &Labels {
        &self.labels
    }

    async fn exec(&self, argv: &[String], opts: &ExecOptions, ctx: &Ctx) -> Result<Process> {
        opts.validate(argv)?;
        opts.refuse(
            false,
            false,
            true,
            "a Daytona box without the runner has no terminal and keeps no program for another caller",
        )?;
        ctx.check()?;
        let cwd = match &opts.cwd {
            Some(c) => self.absolute(c)?,
            None => self.workspace.clone(),
        };
        match exec::start(&self.toolbox, argv, &cwd, opts, self.tuning, ctx).await {
            Ok(p) => Ok(p),
            // The spool's own not_found (a directory, a program) says so; the toolbox's is the box.
            Err(e) if e.message().starts_with("exec:") => Err(e),
            Err(e) => Err(self.lost(e, ctx).await),
        }
    }

    async fn status(&self, ctx: &Ctx) -> Result<Status> {
        Ok(match self.read(ctx).await? {
            Some(d) => status_of(&d),
            None => Status::Ended,
        })
    }

    async fn upload(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<()> {
        let abs = self.absolute(path)?;
        match self
            .toolbox
            .upload(ctx, &format!("writing {path} in the box"), &[(abs, data)])
            .await
        {
            Ok(()) => Ok(()),
            Err(e) => Err(self.lost(e, ctx).await),
        }
    }

    async fn download(&self, path: &str, max_bytes: u64, ctx: &Ctx) -> Result<Vec<u8>> {
        let abs = self.absolute(path)?;
        match self.toolbox.download(ctx, &abs, max_bytes).await {
            Ok(d) => Ok(d),
            Err(e) => match self.lost(e, ctx).await {
                e if e.code() == ErrorCode::NotFound => {
                    Err(Error::not_found(format!("{path}: no such file in the box")))
                }
                e => Err(e),
            },
        }
    }

    async fn endpoint(&self, port: u16, _ctx: &Ctx) -> Result<Endpoint> {
        Err(Error::unsupported(format!(
            "endpoint {port}: a Daytona box's ports are reached through preview URLs that need the sandbox's \
             token in a header, which an address cannot carry"
        )))
    }

    async fn destroy(&self, ctx: &Ctx) -> Result<()> {
        tracing::info!(box_id = %self.id, "destroying");
        super::delete_sandbox(&self.api, &self.sandbox, ctx).await
    }
}

//! One Modal box: a sandbox, its task (where programs run) and the facts its make measured.

use std::collections::HashMap;

use agentbox_core::{
    Ctx, Endpoint, Error, ErrorCode, ExecOptions, Facts, Labels, PortKind, Process, Result, Sandbox, SandboxId, Status,
};
use agentbox_modal_proto::client as pb;
use async_trait::async_trait;

use super::api::{self, CALL_TIMEOUT};
use super::exec::{Task, sandbox_runs};

/// A Modal sandbox as a box.
pub struct ModalSandbox {
    pub(crate) id: SandboxId,
    pub(crate) facts: Facts,
    pub(crate) labels: Labels,
    pub(crate) task: Task,
    pub(crate) workspace: String,
    /// The ports the spec exposed, and how.
    pub(crate) ports: Vec<(u16, PortKind)>,
}

#[async_trait]
impl Sandbox for ModalSandbox {
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
        // The program alone: its arguments and environment may hold what a log must not.
        tracing::debug!(box_id = %self.id, program = argv.first().map(String::as_str).unwrap_or(""), "exec");
        opts.validate(argv)?;
        opts.refuse(
            false,
            false,
            true,
            "a Modal exec has no terminal here, and the box keeps no processes for a later host to attach to",
        )?;
        ctx.check()?;
        let env: HashMap<String, String> = opts.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        self.task
            .exec(
                argv,
                &crate::shim::exec_cwd(&self.workspace, opts.cwd.as_deref()),
                env,
                opts.timeout,
                ctx,
            )
            .await
    }

    async fn status(&self, ctx: &Ctx) -> Result<Status> {
        Ok(if sandbox_runs(&self.task, ctx).await? {
            Status::Running
        } else {
            Status::Ended
        })
    }

    async fn upload(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<()> {
        crate::transfer::upload_by_exec(self, path, data, ctx).await
    }

    async fn download(&self, path: &str, max_bytes: u64, ctx: &Ctx) -> Result<Vec<u8>> {
        crate::transfer::download_by_exec(self, path, max_bytes, ctx).await
    }

    async fn endpoint(&self, port: u16, ctx: &Ctx) -> Result<Endpoint> {
        let Some((_, kind)) = self.ports.iter().find(|(p, _)| *p == port) else {
            return Err(Error::not_found(format!(
                "endpoint: port {port} of box {} is not exposed (its spec's ports: {:?})",
                self.id,
                self.ports.iter().map(|(p, _)| *p).collect::<Vec<_>>()
            )));
        };
        let id = self.task.sandbox_id.clone();
        let r = api::call(ctx, "SandboxGetTunnels", CALL_TIMEOUT, true, || {
            let mut c = self.task.api.client();
            let req = pb::SandboxGetTunnelsRequest {
                sandbox_id: id.clone(),
                timeout: 50.0,
            };
            async move { c.sandbox_get_tunnels(req).await }
        })
        .await?;
        // The call's own result: a timeout is Modal not having the tunnels ready in time.
        if r.result
            .as_ref()
            .is_some_and(|r| r.status == pb::generic_result::GenericStatus::Timeout as i32)
        {
            return Err(Error::timeout(format!(
                "endpoint: Modal had no tunnel for port {port} of box {} within 50 s",
                self.id
            )));
        }
        let t = r
            .tunnels
            .iter()
            .find(|t| t.container_port == u32::from(port))
            .ok_or_else(|| Error::unknown(format!("endpoint: Modal named no tunnel for port {port}")))?;
        let port_of = |p: u32| {
            u16::try_from(p).map_err(|_| Error::unknown(format!("endpoint: Modal answered port {p}, which is no port")))
        };
        match kind {
            PortKind::Https => {
                let p = port_of(t.port)?;
                let url = if p == 443 {
                    format!("https://{}", t.host)
                } else {
                    format!("https://{}:{p}", t.host)
                };
                Ok(Endpoint {
                    host: t.host.clone(),
                    port: p,
                    url: Some(url),
                })
            }
            PortKind::Tcp => match (&t.unencrypted_host, t.unencrypted_port) {
                (Some(h), Some(p)) => Ok(Endpoint {
                    host: h.clone(),
                    port: port_of(p)?,
                    url: None,
                }),
                _ => Err(Error::unknown(format!(
                    "endpoint: Modal named no raw TCP address for port {port}"
                ))),
            },
        }
    }

    async fn destroy(&self, ctx: &Ctx) -> Result<()> {
        let id = self.task.sandbox_id.clone();
        let r = api::call(ctx, "SandboxTerminate", CALL_TIMEOUT, true, || {
            let mut c = self.task.api.client();
            let req = pb::SandboxTerminateRequest { sandbox_id: id.clone() };
            async move { c.sandbox_terminate(req).await }
        })
        .await;
        self.task.api.forget(&self.task.task_id);
        match r {
            Ok(_) => {
                tracing::info!(box_id = %self.id, "modal: sandbox terminated");
                Ok(())
            }
            Err(e) if e.code() == ErrorCode::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

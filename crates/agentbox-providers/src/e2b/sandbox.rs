//! One E2B box: a sandbox, envd in it, the facts read back from E2B at its make.

use std::sync::Arc;

use agentbox_core::{Ctx, Endpoint, Error, ExecOptions, Facts, Labels, Process, Result, Sandbox, SandboxId, Status};
use async_trait::async_trait;
use reqwest::Method;
use serde_json::Value;

use super::api::Api;
use super::envd::Envd;

/// An E2B sandbox as a box.
pub struct E2bSandbox {
    pub(crate) id: SandboxId,
    pub(crate) facts: Facts,
    pub(crate) labels: Labels,
    pub(crate) api: Arc<Api>,
    pub(crate) envd: Envd,
    pub(crate) workspace: String,
}

impl E2bSandbox {
    fn path(&self, path: &str) -> Result<String> {
        if path.is_empty() || path.contains('\0') {
            return Err(Error::invalid(format!("path {path:?}: must be non-empty with no NUL")));
        }
        Ok(if path.starts_with('/') {
            path.to_string()
        } else {
            format!("{}/{path}", self.workspace.trim_end_matches('/'))
        })
    }
}

/// A sandbox's state as E2B answers it: `None` for one that is gone.
pub(crate) async fn state(api: &Api, sandbox_id: &str, ctx: &Ctx) -> Result<Option<(Status, Value)>> {
    let a = api
        .call(
            ctx,
            Method::GET,
            &format!("/sandboxes/{sandbox_id}"),
            None,
            true,
            "GET /sandboxes/{id}",
        )
        .await?;
    if a.status == 404 {
        return Ok(None);
    }
    let status = match a.body.get("state").and_then(Value::as_str) {
        Some("paused") => Status::Sleeping,
        _ => Status::Running,
    };
    Ok(Some((status, a.body)))
}

#[async_trait]
impl Sandbox for E2bSandbox {
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
            false,
            "an E2B program here lives as long as its stream, with no terminal, and a deadline is the caller's",
        )?;
        ctx.check()?;
        let cwd = match opts.cwd.as_deref() {
            None => self.workspace.clone(),
            Some(c) => self.path(c)?,
        };
        // The spec's env is the sandbox's own (E2B's envVars); the exec's rides its start.
        let r = super::exec::start(&self.envd, argv, &cwd, &opts.env, ctx).await;
        self.why_gone(r).await
    }

    async fn status(&self, ctx: &Ctx) -> Result<Status> {
        Ok(state(&self.api, self.id.name(), ctx)
            .await?
            .map_or(Status::Ended, |(s, _)| s))
    }

    async fn upload(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<()> {
        let p = self.path(path)?;
        let r = self.envd.upload(ctx, &p, data).await;
        self.why_gone(r).await
    }

    async fn download(&self, path: &str, max_bytes: u64, ctx: &Ctx) -> Result<Vec<u8>> {
        let r = self.download_file(path, max_bytes, ctx).await;
        self.why_gone(r).await
    }

    async fn endpoint(&self, port: u16, _ctx: &Ctx) -> Result<Endpoint> {
        Err(Error::not_found(format!(
            "endpoint: port {port} of box {}: E2B boxes here expose no ports",
            self.id
        )))
    }

    async fn destroy(&self, ctx: &Ctx) -> Result<()> {
        let a = self
            .api
            .call(
                ctx,
                Method::DELETE,
                &format!("/sandboxes/{}", self.id.name()),
                None,
                true,
                "DELETE /sandboxes/{id}",
            )
            .await?;
        tracing::info!(box_id = %self.id, status = a.status, "e2b: sandbox killed");
        Ok(())
    }
}

impl E2bSandbox {
    /// envd answers for a paused sandbox as for one that is gone: E2B says which.
    async fn why_gone<T>(&self, r: Result<T>) -> Result<T> {
        match r {
            Err(e) if e.code() == agentbox_core::ErrorCode::Gone => {
                let check = Ctx::background().with_timeout(crate::transfer::CONTROL_TIMEOUT);
                match state(&self.api, self.id.name(), &check).await {
                    Ok(Some((Status::Sleeping, _))) => Err(Error::refused(format!(
                        "box {} is asleep (paused); wake it first",
                        self.id
                    ))),
                    _ => Err(Error::gone(format!("box {}: its sandbox has ended", self.id))),
                }
            }
            r => r,
        }
    }

    async fn download_file(&self, path: &str, max_bytes: u64, ctx: &Ctx) -> Result<Vec<u8>> {
        let p = self.path(path)?;
        // The size first, so nothing over the bound moves.
        let st = self
            .envd
            .unary(ctx, "/filesystem.Filesystem/Stat", &serde_json::json!({"path": p}))
            .await
            .map_err(|e| {
                if e.code() == agentbox_core::ErrorCode::NotFound {
                    Error::not_found(format!("{path}: no such file in the box"))
                } else {
                    e
                }
            })?;
        let entry = st.get("entry").unwrap_or(&Value::Null);
        if entry.get("type").and_then(Value::as_str) == Some("FILE_TYPE_DIRECTORY") {
            return Err(Error::invalid(format!("{path}: is a directory")));
        }
        // Connect's JSON leaves a zero out: no size is an empty file.
        let size = match entry.get("size") {
            Some(Value::String(s)) => s.parse::<u64>().ok(),
            Some(v) => v.as_u64(),
            None => Some(0),
        }
        .ok_or_else(|| Error::unknown(format!("e2b: Stat of {path} named no size")))?;
        if size > max_bytes {
            return Err(Error::too_large(format!(
                "{path}: {size} bytes, over the {max_bytes}-byte bound"
            )));
        }
        let cap = usize::try_from(max_bytes).unwrap_or(usize::MAX);
        self.envd.download(ctx, &p, cap).await.map_err(|e| {
            if e.code() == agentbox_core::ErrorCode::TooLarge {
                Error::too_large(format!("{path}: grew over the {max_bytes}-byte bound"))
            } else {
                e
            }
        })
    }
}

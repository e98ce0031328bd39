//! One pod as a box: its programs over the exec WebSocket, its files through programs (a tar
//! on stdin where the stream cannot end stdin), its ports through port-forward.

use std::collections::HashMap;

use agentbox_core::{
    Ctx, Endpoint, Error, ExecOptions, Facts, FinishOptions, Labels, Process, Result, Sandbox, SandboxId, Status,
    finish,
};
use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tokio::net::TcpListener;

use super::exec::Target;
use super::pod::{self, Phase};
use crate::transfer::{download_by_exec, upload_by_exec};

/// One pod.
pub struct KubeSandbox {
    pub(super) api: Api<Pod>,
    pub(super) target: Target,
    pub(super) id: SandboxId,
    pub(super) facts: Facts,
    pub(super) labels: Labels,
    pub(super) workspace: String,
    /// Port-forward listeners on this machine, by the pod's port: each accepted connection is
    /// one port-forward stream. They end with this handle.
    forwards: std::sync::Mutex<HashMap<u16, (u16, tokio::task::JoinHandle<()>)>>,
    /// The agent-sandbox resources, where a Sandbox owns the pod: the box ends through it.
    owner: Option<std::sync::Arc<super::agent_sandbox::AgentSandbox>>,
}

impl Drop for KubeSandbox {
    fn drop(&mut self) {
        for (_, (_, t)) in self.forwards.lock().unwrap().drain() {
            t.abort();
        }
    }
}

impl KubeSandbox {
    pub(super) fn new(api: Api<Pod>, target: Target, id: SandboxId, facts: Facts, labels: Labels) -> Self {
        let workspace = facts
            .workspace
            .clone()
            .unwrap_or_else(|| super::DEFAULT_WORKSPACE.into());
        KubeSandbox {
            api,
            target,
            id,
            facts,
            labels,
            workspace,
            forwards: Default::default(),
            owner: None,
        }
    }

    /// The same box, ended through its agent-sandbox owner where it has one.
    pub(super) fn with_owner(mut self, owner: Option<std::sync::Arc<super::agent_sandbox::AgentSandbox>>) -> Self {
        self.owner = owner;
        self
    }

    /// The pod's name.
    pub fn pod(&self) -> &str {
        &self.target.pod
    }

    fn gone(&self) -> Error {
        Error::gone(format!("box {}: it has ended", self.id))
    }

    async fn phase(&self, ctx: &Ctx) -> Result<Phase> {
        match super::api::retry(ctx, "reading the pod", || self.api.get_opt(&self.target.pod)).await? {
            Some(p) => Ok(pod::phase(&p)),
            None => Ok(Phase::Ended),
        }
    }

    /// An upload as a tar on stdin, its length known (`head -c`), so stdin's end is not
    /// needed: the v4 stream cannot end stdin alone.
    async fn upload_tar(&self, path: &str, data: &[u8], mode: u32, ctx: &Ctx) -> Result<()> {
        let abs = if path.starts_with('/') {
            path.to_string()
        } else {
            format!("{}/{path}", self.workspace.trim_end_matches('/'))
        };
        let name = abs.trim_start_matches('/');
        if name.is_empty() || name.split('/').any(|c| c == "..") {
            return Err(Error::invalid(format!("upload {path:?}: not a file's path")));
        }
        let mut b = tar::Builder::new(Vec::with_capacity(data.len() + 2048));
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_mtime(agentbox_core::now_ms() / 1000);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, name, data)
            .map_err(|e| Error::invalid(format!("upload {path:?}: {e}")))?;
        let mut archive = b
            .into_inner()
            .map_err(|e| Error::unknown(format!("upload {path:?}: making its tar: {e}")))?;
        // Whole 10240-byte records, as GNU tar reads them: it stops at the archive's end.
        let rec = 10240;
        archive.resize(archive.len().div_ceil(rec) * rec, 0);
        // `head` ends tar's input after the archive's bytes, whatever tar reads past its end.
        let argv = [
            "sh",
            "-c",
            r#"head -c "$1" | tar -x -m --no-same-owner -f - -C /"#,
            "agentbox-upload",
            &archive.len().to_string(),
        ]
        .map(String::from);
        let p = self
            .target
            .exec(&argv, "/", &[], ctx)
            .await
            .map_err(|e| Error::new(e.code(), format!("writing {path} in the box: {}", e.message())))?;
        let out = finish(
            p,
            FinishOptions {
                stdin: archive,
                max_output: 64 * 1024,
            },
        )
        .await?;
        if out.status.code != 0 {
            return Err(Error::transfer_failed(format!(
                "writing {path} in the box: tar exited {}: {}",
                out.status.code,
                out.stderr_text().trim()
            )));
        }
        Ok(())
    }

    /// Write `data` to `path` with `mode`, by whichever way the server's stream allows.
    pub(super) async fn put(&self, path: &str, data: &[u8], mode: u32, ctx: &Ctx) -> Result<()> {
        if self.target.speaks_v5(ctx).await? && mode == 0o644 {
            upload_by_exec(self, path, data, ctx).await
        } else {
            self.upload_tar(path, data, mode, ctx).await
        }
    }

    async fn forward(&self, port: u16) -> Result<u16> {
        if let Some((local, t)) = self.forwards.lock().unwrap().get(&port)
            && !t.is_finished()
        {
            return Ok(*local);
        }
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| Error::io(e, "binding a port-forward listener on 127.0.0.1"))?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::io(e, "the port-forward listener's address"))?
            .port();
        let api = self.api.clone();
        let pod_name = self.target.pod.clone();
        let task = tokio::spawn(async move {
            // The connections are the listener's: aborting it (destroy, the handle dropped)
            // ends every one of them.
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((mut conn, peer)) = listener.accept().await {
                while conns.try_join_next().is_some() {}
                let api = api.clone();
                let pod_name = pod_name.clone();
                conns.spawn(async move {
                    let opened = tokio::time::timeout(super::exec::SILENT, api.portforward(&pod_name, &[port])).await;
                    let mut pf = match opened {
                        Ok(Ok(pf)) => pf,
                        Ok(Err(e)) => {
                            tracing::warn!(pod = %pod_name, port, %peer, error = %e, "port-forward refused");
                            return;
                        }
                        Err(_) => {
                            tracing::warn!(pod = %pod_name, port, "port-forward: no answer from the API server");
                            return;
                        }
                    };
                    let Some(mut upstream) = pf.take_stream(port) else {
                        return;
                    };
                    let err = pf.take_error(port);
                    let copied = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
                    drop(upstream);
                    if let Some(err) = err
                        && let Ok(Some(msg)) = tokio::time::timeout(std::time::Duration::from_secs(1), err).await
                    {
                        tracing::warn!(pod = %pod_name, port, error = %msg, "port-forward: the pod refused");
                    }
                    tracing::debug!(pod = %pod_name, port, ok = copied.is_ok(), "port-forward connection ended");
                    let _ = pf.join().await;
                });
            }
        });
        let mut forwards = self.forwards.lock().unwrap();
        // Another call made one meanwhile: that one serves, this one goes.
        if let Some((other, t)) = forwards.get(&port)
            && !t.is_finished()
        {
            task.abort();
            return Ok(*other);
        }
        if let Some((_, old)) = forwards.insert(port, (local, task)) {
            old.abort();
        }
        Ok(local)
    }
}

#[async_trait]
impl Sandbox for KubeSandbox {
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
            "a pod's exec lives as long as its stream: without the runner a kube box keeps no processes and has no terminal",
        )?;
        ctx.check()?;
        let cwd = crate::shim::exec_cwd(&self.workspace, opts.cwd.as_deref());
        let env: Vec<(String, String)> = opts.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        match self.target.exec(argv, &cwd, &env, ctx).await {
            Ok(p) => Ok(p),
            Err(e) if e.code() == agentbox_core::ErrorCode::NotFound => Err(e),
            Err(e) => match self
                .phase(&Ctx::background().with_timeout(crate::transfer::CONTROL_TIMEOUT))
                .await
            {
                Ok(Phase::Ended) => Err(self.gone()),
                _ => Err(e),
            },
        }
    }

    async fn status(&self, ctx: &Ctx) -> Result<Status> {
        Ok(match self.phase(ctx).await? {
            Phase::Running | Phase::Pending => Status::Running,
            Phase::Ended => Status::Ended,
        })
    }

    async fn upload(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<()> {
        self.put(path, data, 0o644, ctx).await
    }

    async fn download(&self, path: &str, max_bytes: u64, ctx: &Ctx) -> Result<Vec<u8>> {
        download_by_exec(self, path, max_bytes, ctx).await
    }

    async fn endpoint(&self, port: u16, ctx: &Ctx) -> Result<Endpoint> {
        if port == 0 {
            return Err(Error::invalid("endpoint: port 0 is not a port"));
        }
        if self.phase(ctx).await? == Phase::Ended {
            return Err(self.gone());
        }
        let local = self.forward(port).await?;
        Ok(Endpoint {
            host: "127.0.0.1".into(),
            port: local,
            url: None,
        })
    }

    async fn destroy(&self, ctx: &Ctx) -> Result<()> {
        // A Sandbox would make its pod again: it (or its claim) goes first.
        let mut r = match &self.owner {
            Some(asb) => asb.end(&self.target.pod, ctx).await,
            None => Ok(()),
        };
        if r.is_ok() {
            r = super::api::delete_pod(&self.api, &self.target.pod, ctx).await;
        }
        if r.is_ok() {
            // Its network policy, where it had one (absent is done).
            r = super::api::delete_policy(&self.target.client, &self.target.namespace, &self.target.pod, ctx).await;
        }
        for (_, (_, t)) in self.forwards.lock().unwrap().drain() {
            t.abort();
        }
        tracing::info!(box_id = %self.id, ok = r.is_ok(), "destroyed");
        r
    }
}

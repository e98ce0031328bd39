//! `modal.task_command_router.TaskCommandRouter`: execs in a sandbox's box (start, output from
//! any offset, stdin at offsets, wait, poll) and the filesystem snapshot the SDK takes through
//! it. Every call shows the task's JWT (`authorization: Bearer JWT`); an unknown task or exec
//! is `NOT_FOUND`, and so is any call for a task whose sandbox ended (the router lives with
//! its task: the SDK stops retrying on `NOT_FOUND`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, ErrorCode, ExecOptions};
use agentbox_modal_proto::client as api;
use agentbox_modal_proto::task_command_router as pb;
use agentbox_modal_proto::task_command_router::task_command_router_server::TaskCommandRouter;
use tokio::io::AsyncWriteExt;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use crate::modal::state::{Exec, Exit, Sbx, Shared, Sink, lock};

pub(crate) struct Router(pub(crate) Arc<Shared>);

type R<T> = Result<Response<T>, Status>;

/// The largest piece of output one message carries.
const CHUNK: usize = 1 << 20;

impl Router {
    /// The call's task, its JWT checked, its sandbox running.
    fn task<T>(&self, method: &str, r: &Request<T>, task_id: &str, exec_id: Option<&str>) -> Result<Arc<Sbx>, Status> {
        let sid = lock(&self.0.records).tasks.get(task_id).cloned();
        self.0.enter(method, sid.as_deref(), Some(task_id), exec_id)?;
        let sid = sid.ok_or_else(|| Status::not_found(format!("task {task_id} not found")))?;
        let x = self.0.sandbox(&sid)?;
        let shown = r
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !crate::ids::same(shown.trim(), &x.jwt) {
            return Err(Status::unauthenticated("invalid or missing JWT for this task"));
        }
        if x.result().is_some() {
            return Err(Status::not_found(format!("task {task_id} has finished")));
        }
        Ok(x)
    }

    fn exec(x: &Sbx, exec_id: &str) -> Result<Arc<Exec>, Status> {
        lock(&x.execs)
            .get(exec_id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("exec {exec_id} not found")))
    }

    /// Write `data` at `offset` of the exec's stdin (a repeat of bytes written is ignored, a
    /// gap refused); `eof` closes it.
    async fn stdin_at(e: &Exec, offset: u64, data: &[u8], eof: bool) -> Result<(), Status> {
        let mut i = e.stdin.lock().await;
        if offset > i.written {
            return Err(Status::invalid_argument(format!(
                "stdin offset {offset}: only {} bytes were written",
                i.written
            )));
        }
        let end = offset + data.len() as u64;
        if end > i.written {
            if i.closed {
                return Err(Status::failed_precondition("stdin is closed"));
            }
            let new = &data[(i.written - offset) as usize..];
            if let Some(w) = i.w.as_mut() {
                // A program that ended (or closed its stdin) drops what it is sent.
                if w.write_all(new).await.is_ok() {
                    let _ = w.flush().await;
                }
            }
            i.written = end;
        }
        if eof && !i.closed {
            i.closed = true;
            if let Some(mut w) = i.w.take() {
                let _ = w.close().await;
            }
        }
        Ok(())
    }
}

fn exit_status_wait(e: Exit) -> pb::task_exec_wait_response::ExitStatus {
    match e {
        Exit::Code(c) => pb::task_exec_wait_response::ExitStatus::Code(c),
        Exit::Signal(s) => pb::task_exec_wait_response::ExitStatus::Signal(s),
    }
}

fn exit_status_poll(e: Exit) -> pb::task_exec_poll_response::ExitStatus {
    match e {
        Exit::Code(c) => pb::task_exec_poll_response::ExitStatus::Code(c),
        Exit::Signal(s) => pb::task_exec_poll_response::ExitStatus::Signal(s),
    }
}

#[tonic::async_trait]
impl TaskCommandRouter for Router {
    async fn task_exec_start(&self, r: Request<pb::TaskExecStartRequest>) -> R<pb::TaskExecStartResponse> {
        let (task_id, exec_id) = (r.get_ref().task_id.clone(), r.get_ref().exec_id.clone());
        let x = self.task("TaskExecStart", &r, &task_id, Some(&exec_id))?;
        let q = r.into_inner();
        if q.exec_id.is_empty() {
            return Err(Status::invalid_argument("exec_id: required"));
        }
        if q.command_args.is_empty() {
            return Err(Status::invalid_argument("command_args: required"));
        }
        if q.pty_info.is_some() {
            return Err(Status::unimplemented("a PTY: not in this fake"));
        }
        let e = {
            let mut execs = lock(&x.execs);
            if execs.contains_key(&q.exec_id) {
                // The client's idempotency key: started already.
                return Ok(Response::new(pb::TaskExecStartResponse {}));
            }
            let e = Exec::new();
            execs.insert(q.exec_id.clone(), e.clone());
            e
        };
        let Some(b) = x.running_box() else {
            return Err(Status::not_found(format!("task {} has finished", q.task_id)));
        };
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        {
            let rec = lock(&self.0.records);
            for id in &q.secret_ids {
                let s = rec
                    .secrets
                    .get(id)
                    .ok_or_else(|| Status::not_found(format!("Secret {id} not found")))?;
                env.extend(s.clone());
            }
        }
        // What the `modal` client sends (1.6): each source in order, a stored secret by id or
        // the exec's own variables.
        for src in &q.secret_sources {
            match &src.source {
                Some(api::secret_source::Source::SecretId(id)) => {
                    let rec = lock(&self.0.records);
                    let s = rec
                        .secrets
                        .get(id)
                        .ok_or_else(|| Status::not_found(format!("Secret {id} not found")))?;
                    env.extend(s.clone());
                }
                Some(api::secret_source::Source::Env(m)) => env.extend(m.contents.clone()),
                None => {}
            }
        }
        env.extend(q.env.clone());
        let opts = ExecOptions {
            cwd: q
                .workdir
                .clone()
                .filter(|w| !w.is_empty())
                .or_else(|| x.workdir.clone()),
            env,
            ..Default::default()
        };
        let out = match q.stdout_config() {
            pb::TaskExecStdoutConfig::Pipe => Sink::Pipe,
            pb::TaskExecStdoutConfig::Devnull => Sink::DevNull,
        };
        let err = match q.stderr_config() {
            pb::TaskExecStderrConfig::Pipe => Sink::Pipe,
            pb::TaskExecStderrConfig::Devnull => Sink::DevNull,
            pb::TaskExecStderrConfig::Stdout => Sink::Stdout,
        };
        let timeout = q
            .timeout_secs
            .filter(|t| *t > 0)
            .map(|t| Duration::from_secs(u64::from(t)));
        match b.exec(&q.command_args, &opts, &Ctx::background()).await {
            Ok(p) => e.run(p, out, err, timeout).await,
            Err(er) if matches!(er.code(), ErrorCode::NotFound | ErrorCode::Invalid) => {
                // As a shell says it: the exec starts, and ends 127.
                e.failed(&format!("{}: {}\n", q.command_args[0], er.message()));
            }
            Err(er) => {
                lock(&x.execs).remove(&q.exec_id);
                return Err(Status::internal(format!("starting the command: {}", er.message())));
            }
        }
        Ok(Response::new(pb::TaskExecStartResponse {}))
    }

    async fn task_exec_stdio_read(
        &self,
        r: Request<pb::TaskExecStdioReadRequest>,
    ) -> R<BoxStream<pb::TaskExecStdioReadResponse>> {
        let (task_id, exec_id) = (r.get_ref().task_id.clone(), r.get_ref().exec_id.clone());
        let x = self.task("TaskExecStdioRead", &r, &task_id, Some(&exec_id))?;
        let q = r.into_inner();
        let e = Self::exec(&x, &q.exec_id)?;
        let buf = match q.file_descriptor() {
            pb::TaskExecStdioFileDescriptor::Stdout => e.out.clone(),
            pb::TaskExecStdioFileDescriptor::Stderr => e.err.clone(),
        };
        let cut = self.0.take_cut();
        struct St {
            buf: Arc<crate::modal::state::Buf>,
            pos: usize,
            sent: usize,
            cut: Option<usize>,
            done: bool,
        }
        let st = St {
            buf,
            pos: usize::try_from(q.offset).unwrap_or(usize::MAX),
            sent: 0,
            cut,
            done: false,
        };
        let stream = futures_util::stream::unfold(st, |mut st| async move {
            if st.done {
                return None;
            }
            loop {
                let buf = st.buf.clone();
                let mut rx = buf.bump.subscribe();
                {
                    let s = lock(&buf.state);
                    if let Some(c) = st.cut
                        && st.sent >= c
                    {
                        st.done = true;
                        return Some((Err(Status::unavailable("stream cut by the fake (cut_stdio_after)")), st));
                    }
                    if st.pos < s.bytes.len() {
                        let mut n = (s.bytes.len() - st.pos).min(CHUNK);
                        if let Some(c) = st.cut {
                            n = n.min(c - st.sent);
                        }
                        let data = s.bytes[st.pos..st.pos + n].to_vec();
                        st.pos += n;
                        st.sent += n;
                        return Some((Ok(pb::TaskExecStdioReadResponse { data }), st));
                    }
                    if s.over {
                        st.done = true;
                        return Some((
                            Err(Status::resource_exhausted(format!(
                                "the command wrote more than {} MiB to this stream",
                                crate::modal::state::MAX_OUTPUT >> 20
                            ))),
                            st,
                        ));
                    }
                    if s.eof {
                        return None;
                    }
                }
                if rx.changed().await.is_err() {
                    return None;
                }
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn task_exec_stdin_write(
        &self,
        r: Request<pb::TaskExecStdinWriteRequest>,
    ) -> R<pb::TaskExecStdinWriteResponse> {
        let (task_id, exec_id) = (r.get_ref().task_id.clone(), r.get_ref().exec_id.clone());
        let x = self.task("TaskExecStdinWrite", &r, &task_id, Some(&exec_id))?;
        let q = r.into_inner();
        let e = Self::exec(&x, &q.exec_id)?;
        Self::stdin_at(&e, q.offset, &q.data, q.eof).await?;
        Ok(Response::new(pb::TaskExecStdinWriteResponse {}))
    }

    async fn task_exec_stdin_write_stream(
        &self,
        r: Request<tonic::Streaming<pb::TaskExecStdinWriteStreamRequest>>,
    ) -> R<pb::TaskExecStdinWriteStreamResponse> {
        use pb::task_exec_stdin_write_stream_request::Payload;
        let auth = r.metadata().clone();
        let mut s = r.into_inner();
        let first = s
            .message()
            .await?
            .and_then(|m| m.payload)
            .ok_or_else(|| Status::invalid_argument("the stream must begin with `start`"))?;
        let Payload::Start(start) = first else {
            return Err(Status::invalid_argument("the stream must begin with `start`"));
        };
        let mut probe = Request::new(());
        *probe.metadata_mut() = auth;
        let x = self.task("TaskExecStdinWriteStream", &probe, &start.task_id, Some(&start.exec_id))?;
        let e = Self::exec(&x, &start.exec_id)?;
        let mut offset = start.offset;
        while let Some(m) = s.message().await? {
            match m.payload {
                Some(Payload::Data(d)) => {
                    Self::stdin_at(&e, offset, &d, false).await?;
                    offset += d.len() as u64;
                }
                Some(Payload::End(_)) => {
                    Self::stdin_at(&e, offset, &[], true).await?;
                    break;
                }
                Some(Payload::Start(_)) => return Err(Status::invalid_argument("`start` twice")),
                None => {}
            }
        }
        Ok(Response::new(pb::TaskExecStdinWriteStreamResponse {}))
    }

    async fn task_exec_stdin_status(
        &self,
        r: Request<pb::TaskExecStdinStatusRequest>,
    ) -> R<pb::TaskExecStdinStatusResponse> {
        let (task_id, exec_id) = (r.get_ref().task_id.clone(), r.get_ref().exec_id.clone());
        let x = self.task("TaskExecStdinStatus", &r, &task_id, Some(&exec_id))?;
        let e = Self::exec(&x, &exec_id)?;
        let i = e.stdin.lock().await;
        Ok(Response::new(pb::TaskExecStdinStatusResponse {
            num_bytes_written: i.written,
            closed: i.closed,
        }))
    }

    async fn task_exec_wait(&self, r: Request<pb::TaskExecWaitRequest>) -> R<pb::TaskExecWaitResponse> {
        let (task_id, exec_id) = (r.get_ref().task_id.clone(), r.get_ref().exec_id.clone());
        let x = self.task("TaskExecWait", &r, &task_id, Some(&exec_id))?;
        let e = Self::exec(&x, &exec_id)?;
        let mut rx = e.exit.subscribe();
        let mut ended = x.result.subscribe();
        let exited = tokio::select! {
            r = rx.wait_for(|v| v.is_some()) => r.is_ok(),
            _ = ended.wait_for(|v| v.is_some()) => false,
        };
        if !exited {
            // The box's end kills its programs: their exits come a moment later.
            let _ = tokio::time::timeout(Duration::from_secs(2), async {
                let _ = rx.wait_for(|v| v.is_some()).await;
            })
            .await;
        }
        match e.exit() {
            Some(ex) => Ok(Response::new(pb::TaskExecWaitResponse {
                exit_status: Some(exit_status_wait(ex)),
            })),
            None => Err(Status::not_found(format!("task {task_id} has finished"))),
        }
    }

    async fn task_exec_poll(&self, r: Request<pb::TaskExecPollRequest>) -> R<pb::TaskExecPollResponse> {
        let (task_id, exec_id) = (r.get_ref().task_id.clone(), r.get_ref().exec_id.clone());
        let x = self.task("TaskExecPoll", &r, &task_id, Some(&exec_id))?;
        let e = Self::exec(&x, &exec_id)?;
        Ok(Response::new(pb::TaskExecPollResponse {
            exit_status: e.exit().map(exit_status_poll),
        }))
    }

    async fn task_snapshot_filesystem(
        &self,
        r: Request<pb::TaskSnapshotFilesystemRequest>,
    ) -> R<pb::TaskSnapshotFilesystemResponse> {
        let task_id = r.get_ref().task_id.clone();
        let x = self.task("TaskSnapshotFilesystem", &r, &task_id, None)?;
        let image_id = crate::modal::client::snapshot_fs(&self.0, &x).await?;
        Ok(Response::new(pb::TaskSnapshotFilesystemResponse { image_id }))
    }
}

//! A program in a Modal box, through its task's command router.
//!
//! - **Start** (`TaskExecStart`) carries an exec id the provider makes, so a start tried again
//!   after a dropped answer starts nothing twice. The program runs behind the `sh` shim
//!   (`crate::shim`), whose header names its pid (Modal has no call to signal an exec: a kill
//!   is a second exec, `kill -s SIG PID`) or says the program or directory is missing.
//! - **Output** (`TaskExecStdioRead`) is read from a byte offset: a stream that breaks is
//!   opened again from the last byte received, so nothing is lost or repeated. A reader that
//!   cannot go on fails the caller's next read with an I/O error, never a short EOF.
//! - **Input** (`TaskExecStdinWrite`) goes in 512 KiB chunks, each at its offset, and ends with
//!   an explicit end of file (also when nothing was written). A close that fails while the
//!   program still runs is what `wait` answers: the program would wait for an EOF that never
//!   comes.
//! - **Wait** (`TaskExecWait`) is asked in turns of [`WAIT_TURN`]: between turns the sandbox is
//!   asked whether it still runs, so a box that ended under a program is `gone`, never a hang.
//! - **A deadline** (`ExecOptions::timeout`) is Modal's `timeout_secs`: the router ends the
//!   program with no call from the host.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentbox_core::{ByteReader, ByteWriter, Ctx, Error, ErrorCode, ExitStatus, Process, ProcessControl, Result};
use agentbox_modal_proto::{client as pb, task_command_router as tcr};
use async_trait::async_trait;
use bytes::Bytes;
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, oneshot};

use super::api::{self, CALL_TIMEOUT, Shared};
use crate::shim::{self, Header};

/// Stdin goes to the router in chunks of at most this many bytes.
pub(crate) const STDIN_CHUNK: usize = 512 * 1024;
/// How long a start waits for the shim's header.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// One `TaskExecWait` call waits at most this long before the sandbox is checked.
const WAIT_TURN: Duration = Duration::from_secs(50);
/// A stream reopened this many times in a row with no byte between is given up.
const MAX_REOPENS: u32 = 8;
/// Chunks of output held between the router and a slow reader.
const OUTPUT_CHUNKS: usize = 16;

/// The task of a running sandbox: where its programs run.
#[derive(Clone)]
pub(crate) struct Task {
    pub api: Shared,
    pub sandbox_id: String,
    pub task_id: String,
}

impl Task {
    /// A router call, asking for a fresh token once when the router refuses the one held.
    async fn router_call<T, F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        idempotent: bool,
        ctx: &Ctx,
        f: F,
    ) -> Result<T>
    where
        F: Fn(api::Router) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut fresh = false;
        loop {
            let router = self.api.router(&self.task_id, fresh, ctx).await?;
            match api::call(ctx, what, timeout, idempotent, || f(router.clone())).await {
                Err(e) if e.code() == ErrorCode::PermissionDenied && !fresh => fresh = true,
                r => return r,
            }
        }
    }

    /// Start `argv` in `cwd` with `env` added, under Modal's own deadline `timeout`.
    pub(crate) async fn exec(
        &self,
        argv: &[String],
        cwd: &str,
        env: std::collections::HashMap<String, String>,
        timeout: Option<Duration>,
        ctx: &Ctx,
    ) -> Result<Process> {
        let exec_id = crate::random::random_hex(16)?;
        // Modal's clock for the program's deadline starts when the start arrives, not when it
        // is answered.
        let began = Instant::now();
        let mut command_args = ["sh", "-c", shim::SHIM, "agentbox-exec", cwd]
            .map(String::from)
            .to_vec();
        command_args.extend(argv.iter().cloned());
        let timeout_secs = timeout.map(|t| t.as_secs_f64().ceil().max(1.0) as u32);
        let req = tcr::TaskExecStartRequest {
            task_id: self.task_id.clone(),
            exec_id: exec_id.clone(),
            command_args,
            stdout_config: tcr::TaskExecStdoutConfig::Pipe as i32,
            stderr_config: tcr::TaskExecStderrConfig::Pipe as i32,
            timeout_secs,
            // The exec's own variables as the `modal` client sends them: a source of their own.
            secret_sources: if env.is_empty() {
                Vec::new()
            } else {
                vec![pb::SecretSource {
                    source: Some(pb::secret_source::Source::Env(pb::StringMap {
                        contents: env.into_iter().collect(),
                    })),
                }]
            },
            ..Default::default()
        };
        // The same exec id every try: a start whose answer was lost starts nothing again.
        let started = self
            .router_call("TaskExecStart", CALL_TIMEOUT, true, ctx, |mut r| {
                let req = req.clone();
                async move { r.task_exec_start(req).await }
            })
            .await;
        if let Err(e) = started {
            // A task that is gone is a sandbox that ended: say so, as every provider does.
            if e.code() != ErrorCode::Aborted
                && !sandbox_runs(self, &Ctx::background().with_timeout(crate::transfer::CONTROL_TIMEOUT))
                    .await
                    .unwrap_or(true)
            {
                self.api.forget(&self.task_id);
                return Err(Error::gone(format!("modal: sandbox {} has ended", self.sandbox_id)));
            }
            return Err(e);
        }
        tracing::debug!(sandbox = %self.sandbox_id, exec_id, "modal: exec started");
        let failed = Arc::new(Failure::default());
        let (header_tx, header_rx) = oneshot::channel();
        let stdout = self.reader(
            &exec_id,
            tcr::TaskExecStdioFileDescriptor::Stdout,
            Some(header_tx),
            failed.clone(),
        );
        let stderr = self.reader(&exec_id, tcr::TaskExecStdioFileDescriptor::Stderr, None, failed.clone());
        let header = match tokio::time::timeout(START_TIMEOUT, ctx.run(header_rx)).await {
            Ok(r) => r?.map_err(|_| Error::unknown("modal: the exec's output ended before its shim spoke"))??,
            Err(_) => {
                return Err(Error::timeout(format!(
                    "modal: the program did not start within {} s",
                    START_TIMEOUT.as_secs()
                )));
            }
        };
        let pid = match header {
            Header::Pid(pid) => pid,
            Header::NoCwd => {
                return Err(Error::not_found(format!(
                    "working directory {cwd} does not exist in the box"
                )));
            }
            Header::NoProg => return Err(Error::not_found(format!("program {:?} not found in the box", argv[0]))),
        };
        let stdin = self.writer(&exec_id, failed.clone());
        let control = Arc::new(Control {
            task: self.clone(),
            exec_id,
            pid,
            ended: Arc::new(AtomicBool::new(false)),
            failed,
            timeout: timeout.map(|t| (began, t)),
        });
        Ok(Process::new(Some(stdin), Some(stdout), Some(stderr), control, ctx))
    }

    /// The reader of one of the program's streams: the router's stream from the last byte
    /// received, opened again where it breaks. The shim's header (on stdout) is taken off and
    /// sent to `header`.
    fn reader(
        &self,
        exec_id: &str,
        fd: tcr::TaskExecStdioFileDescriptor,
        header: Option<oneshot::Sender<Result<Header>>>,
        failed: Arc<Failure>,
    ) -> ByteReader {
        let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(OUTPUT_CHUNKS);
        let task = self.clone();
        let exec_id = exec_id.to_string();
        tokio::spawn(async move {
            let name = if fd == tcr::TaskExecStdioFileDescriptor::Stdout {
                "stdout"
            } else {
                "stderr"
            };
            let mut header = header;
            let mut line = Vec::new();
            let mut offset: u64 = 0;
            let mut reopens = 0;
            let ctx = Ctx::background();
            let outcome: Result<()> = 'read: loop {
                let req = tcr::TaskExecStdioReadRequest {
                    task_id: task.task_id.clone(),
                    exec_id: exec_id.clone(),
                    offset,
                    file_descriptor: fd as i32,
                };
                let opened = task
                    .router_call("TaskExecStdioRead", CALL_TIMEOUT, true, &ctx, |mut r| {
                        let req = req.clone();
                        async move { r.task_exec_stdio_read(req).await }
                    })
                    .await;
                let mut stream = match opened {
                    Ok(s) => s,
                    Err(e) if matches!(e.code(), ErrorCode::Unknown | ErrorCode::Timeout) && reopens < MAX_REOPENS => {
                        reopens += 1;
                        tokio::time::sleep(Duration::from_millis(100 << reopens.min(5))).await;
                        continue;
                    }
                    Err(e) => break Err(e),
                };
                loop {
                    match stream.message().await {
                        Ok(Some(m)) => {
                            if m.data.is_empty() {
                                continue;
                            }
                            reopens = 0;
                            offset += m.data.len() as u64;
                            let mut data = Bytes::from(m.data);
                            if let Some(h) = header.take() {
                                line.extend_from_slice(&data);
                                match shim::split_header(&line) {
                                    Some(Ok((hd, rest))) => {
                                        data = Bytes::copy_from_slice(rest);
                                        let _ = h.send(Ok(hd));
                                    }
                                    Some(Err(e)) => {
                                        let _ = h.send(Err(e));
                                        break 'read Ok(());
                                    }
                                    None => {
                                        header = Some(h);
                                        continue;
                                    }
                                }
                            }
                            // A reader that went away: keep reading to the end, so the
                            // stream's end is real for the others.
                            if !data.is_empty() && tx.send(Ok(data)).await.is_err() {
                                tracing::trace!(stream = name, "modal: output dropped by its reader");
                            }
                        }
                        Ok(None) => break 'read Ok(()),
                        Err(s) => {
                            let e = api::status_error("TaskExecStdioRead", &s);
                            if matches!(e.code(), ErrorCode::Unknown | ErrorCode::Aborted | ErrorCode::Timeout)
                                && reopens < MAX_REOPENS
                            {
                                reopens += 1;
                                tracing::debug!(
                                    stream = name,
                                    offset,
                                    reopens,
                                    "modal: output stream broke, reading again from its offset: {}",
                                    s.message()
                                );
                                tokio::time::sleep(Duration::from_millis(100 << reopens.min(5))).await;
                                continue 'read;
                            }
                            break 'read Err(e);
                        }
                    }
                }
            };
            if let Some(h) = header.take() {
                let _ = h.send(Err(match &outcome {
                    Err(e) => e.clone(),
                    Ok(()) => Error::unknown("the program's output ended before its shim spoke"),
                }));
            }
            if let Err(e) = outcome {
                tracing::warn!(stream = name, offset, "modal: reading the program's {name}: {e}");
                failed.set(e.clone());
                let _ = tx
                    .send(Err(std::io::Error::other(format!(
                        "reading the program's {name} from byte {offset}: {e}"
                    ))))
                    .await;
            }
        });
        let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) });
        Box::pin(tokio_util::io::StreamReader::new(stream))
    }

    /// The program's stdin: chunks written at their offsets, then the end.
    fn writer(&self, exec_id: &str, failed: Arc<Failure>) -> ByteWriter {
        let (w, mut r) = tokio::io::duplex(STDIN_CHUNK);
        let task = self.clone();
        let exec_id = exec_id.to_string();
        tokio::spawn(async move {
            let ctx = Ctx::background();
            let mut offset: u64 = 0;
            let mut buf = vec![0u8; STDIN_CHUNK];
            loop {
                let n: usize = r.read(&mut buf).await.unwrap_or_default();
                let req = tcr::TaskExecStdinWriteRequest {
                    task_id: task.task_id.clone(),
                    exec_id: exec_id.clone(),
                    offset,
                    data: buf[..n].to_vec(),
                    eof: n == 0,
                };
                // A write at its offset is safe to repeat: the router keeps what it has.
                let sent = task
                    .router_call("TaskExecStdinWrite", CALL_TIMEOUT, true, &ctx, |mut r| {
                        let req = req.clone();
                        async move { r.task_exec_stdin_write(req).await }
                    })
                    .await;
                if let Err(e) = sent {
                    failed.set_stdin(e);
                    return;
                }
                if n == 0 {
                    return;
                }
                offset += n as u64;
            }
        });
        Box::pin(w)
    }
}

/// What went wrong beside the program: its output could not be read whole, or its input's
/// end did not arrive.
struct Failure {
    output: Mutex<Option<Error>>,
    stdin: tokio::sync::watch::Sender<Option<Error>>,
}

impl Default for Failure {
    fn default() -> Self {
        Failure {
            output: Mutex::new(None),
            stdin: tokio::sync::watch::channel(None).0,
        }
    }
}

impl Failure {
    fn set(&self, e: Error) {
        self.output.lock().unwrap().get_or_insert(e);
    }

    fn set_stdin(&self, e: Error) {
        self.stdin.send_replace(Some(e));
    }
}

struct Control {
    task: Task,
    exec_id: String,
    pid: u32,
    ended: Arc<AtomicBool>,
    failed: Arc<Failure>,
    /// When the program started and Modal's deadline for it.
    timeout: Option<(Instant, Duration)>,
}

impl Control {
    /// The program's exit if it has ended, without waiting; `None` while it runs or when the
    /// router cannot say.
    async fn poll(&self) -> Option<ExitStatus> {
        let req = tcr::TaskExecPollRequest {
            task_id: self.task.task_id.clone(),
            exec_id: self.exec_id.clone(),
        };
        let r = self
            .task
            .router_call("TaskExecPoll", CALL_TIMEOUT, true, &Ctx::background(), |mut r| {
                let req = req.clone();
                async move { r.task_exec_poll(req).await }
            })
            .await
            .ok()?;
        match r.exit_status? {
            tcr::task_exec_poll_response::ExitStatus::Code(c) => Some(ExitStatus::exited(c)),
            tcr::task_exec_poll_response::ExitStatus::Signal(s) => Some(ExitStatus::signaled(s)),
        }
    }

    /// The program's exit, asked in turns, the sandbox checked between them.
    async fn exit(&self) -> Result<ExitStatus> {
        let ctx = Ctx::background();
        loop {
            let req = tcr::TaskExecWaitRequest {
                task_id: self.task.task_id.clone(),
                exec_id: self.exec_id.clone(),
            };
            let r = self
                .task
                .router_call("TaskExecWait", WAIT_TURN, true, &ctx, |mut r| {
                    let req = req.clone();
                    async move { r.task_exec_wait(req).await }
                })
                .await;
            match r {
                Ok(w) => {
                    return match w.exit_status {
                        Some(tcr::task_exec_wait_response::ExitStatus::Code(c)) => Ok(ExitStatus::exited(c)),
                        Some(tcr::task_exec_wait_response::ExitStatus::Signal(s)) => Ok(ExitStatus::signaled(s)),
                        None => Err(Error::unknown("modal: TaskExecWait answered no exit status")),
                    };
                }
                Err(e) if e.code() == ErrorCode::Timeout => {
                    if !sandbox_runs(&self.task, &ctx).await? {
                        return Err(Error::gone(format!(
                            "modal: sandbox {} ended while the program ran",
                            self.task.sandbox_id
                        )));
                    }
                }
                Err(e) if matches!(e.code(), ErrorCode::NotFound | ErrorCode::Unknown) => {
                    if !sandbox_runs(&self.task, &ctx).await? {
                        return Err(Error::gone(format!(
                            "modal: sandbox {} ended while the program ran",
                            self.task.sandbox_id
                        )));
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Whether the sandbox still runs (a wait of no time).
pub(crate) async fn sandbox_runs(task: &Task, ctx: &Ctx) -> Result<bool> {
    let id = task.sandbox_id.clone();
    let w = api::call(ctx, "SandboxWait", CALL_TIMEOUT, true, || {
        let mut c = task.api.client();
        let req = pb::SandboxWaitRequest {
            sandbox_id: id.clone(),
            timeout: 0.0,
        };
        async move { c.sandbox_wait(req).await }
    })
    .await?;
    Ok(ended_result(w.result.as_ref()).is_none())
}

/// The result of a sandbox that ended; `None` while it runs.
pub(crate) fn ended_result(r: Option<&pb::GenericResult>) -> Option<&pb::GenericResult> {
    r.filter(|r| r.status != pb::generic_result::GenericStatus::Unspecified as i32)
}

#[async_trait]
impl ProcessControl for Control {
    async fn wait(&self) -> Result<ExitStatus> {
        let exit = async {
            let r = self.exit().await;
            self.ended.store(true, Ordering::SeqCst);
            r
        };
        // A stdin end that did not arrive, with the program still running, is the answer:
        // the program would wait for it for ever. On a program that already exited it is
        // nothing.
        let mut stdin = self.failed.stdin.subscribe();
        let stdin_failed = async move {
            let got = stdin.wait_for(Option::is_some).await.map(|e| e.clone());
            match got {
                Ok(e) => e,
                Err(_) => std::future::pending().await,
            }
        };
        let status = tokio::select! {
            r = exit => r?,
            Some(e) = stdin_failed => match self.poll().await {
                Some(status) => status,
                None => {
                    return Err(Error::new(e.code(), format!("closing the program's stdin: {}", e.message())));
                }
            },
        };
        if let Some(e) = self.failed.output.lock().unwrap().clone() {
            return Err(e);
        }
        // Modal ends a program at its deadline with SIGKILL: that is a timeout, as every
        // provider answers one.
        if let Some((started, t)) = self.timeout
            && (status.signal == Some(9) || status.code == 137)
            && started.elapsed() >= t
        {
            return Err(Error::timeout(format!(
                "the program ran past its timeout of {} s and was ended",
                t.as_secs_f64()
            )));
        }
        Ok(status)
    }

    async fn signal(&self, signal: i32) -> Result<()> {
        if self.ended.load(Ordering::SeqCst) || !(1..=31).contains(&signal) {
            return Ok(());
        }
        // Modal has no call to signal an exec: a second exec sends it, by the shim's pid.
        // `kill` as the shell's builtin (an image need not have /bin/kill); a program already
        // gone is no error.
        let argv = [
            "sh",
            "-c",
            r#"kill -s "$1" "$2" 2>/dev/null || ! kill -0 "$2" 2>/dev/null"#,
            "agentbox-kill",
            &signal.to_string(),
            &self.pid.to_string(),
        ]
        .map(String::from);
        let ctx = Ctx::background().with_timeout(crate::transfer::CONTROL_TIMEOUT);
        let mut p = match self.task.exec(&argv, "/", Default::default(), None, &ctx).await {
            Ok(p) => p,
            Err(e) if matches!(e.code(), ErrorCode::Gone | ErrorCode::NotFound) => return Ok(()),
            Err(e) => return Err(e),
        };
        if let Some(mut i) = p.stdin.take() {
            let _ = i.close().await;
        }
        match p.wait().await {
            Ok(s) if s.code == 0 => Ok(()),
            Ok(s) => Err(Error::unknown(format!(
                "signal {signal} to pid {} in sandbox {}: kill exited {}",
                self.pid, self.task.sandbox_id, s.code
            ))),
            Err(e) if e.code() == ErrorCode::Gone => Ok(()),
            Err(e) => Err(e),
        }
    }
}

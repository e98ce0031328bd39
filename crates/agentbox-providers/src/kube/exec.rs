//! Programs in a pod, over the API server's `pods/exec` WebSocket.
//!
//! The stream protocol is `v5.channel.k8s.io` where the server speaks it and
//! `v4.channel.k8s.io` where it does not (kube-rs offers both; the server picks). Every binary
//! frame starts with its channel: 0 stdin, 1 stdout, 2 stderr, 3 the exit status (a
//! `metav1.Status`), 4 a terminal's size. Only v5 can end stdin alone (the frame `[255, 0]`);
//! over v4 a program's stdin never ends, so uploads go as a tar whose end the program reads
//! (see the sandbox's `upload`).
//!
//! Every program starts behind the same `sh` shim as a Docker box's (`crate::shim`): its
//! first line on stdout tells the program's pid (so a kill can reach it by a second exec) or
//! why it could not start. Each exec has its own WebSocket, so a caller that stops reading
//! one program's output holds up only that program (through the server's flow control),
//! never a sibling. A server that sends nothing at all, not even a pong, for [`SILENT`] ends
//! the program's wait with `timeout` rather than a hang.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use agentbox_core::{ByteWriter, Ctx, Error, ExitStatus, Process, ProcessControl, Result};
use async_trait::async_trait;
use futures_util::{SinkExt, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::AttachParams;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

use crate::shim::{self, Header};

/// How long the shim may take to write its header.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the API server may send nothing (no frame, no pong) while a program runs.
pub(super) const SILENT: Duration = Duration::from_secs(60);
/// How often a running exec pings the server.
const PING_EVERY: Duration = Duration::from_secs(20);
/// Bytes of each output stream held between the server and a slow reader.
const PIPE_BUFFER: usize = 256 * 1024;
/// The largest stdin frame sent.
const STDIN_CHUNK: usize = 64 * 1024;

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const STATUS: u8 = 3;
const CLOSE: u8 = 255;

/// Where programs run: one pod's container, through one client.
#[derive(Clone)]
pub(super) struct Target {
    pub(super) client: kube::Client,
    pub(super) namespace: String,
    pub(super) pod: String,
    /// Set once a server answered with v5 (`Some(true)`) or v4.
    pub(super) v5: Arc<std::sync::OnceLock<bool>>,
}

/// An open exec: the socket's halves, and whether stdin can end.
struct Opened {
    conn: kube::client::Connection,
    v5: bool,
}

impl Target {
    /// Open `argv` (as given, no shim) with stdin, stdout and stderr attached.
    async fn open(&self, argv: &[String], ctx: &Ctx) -> Result<Opened> {
        let ap = AttachParams {
            container: Some(super::pod::CONTAINER.into()),
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false,
            ..Default::default()
        };
        let req = kube::core::Request::new(format!("/api/v1/namespaces/{}/pods", self.namespace))
            .exec(&self.pod, argv.iter().map(String::as_str), &ap)
            .map_err(|e| Error::invalid(format!("exec in pod {}: {e}", self.pod)))?;
        let conn = match tokio::time::timeout(START_TIMEOUT, ctx.run(self.client.connect(req))).await {
            // The pod is gone: so is the box.
            Ok(r) => r?.map_err(|e| match &e {
                kube::Error::Api(s) if s.code == 404 => {
                    Error::gone(format!("exec in pod {}: the pod is gone ({})", self.pod, s.message))
                }
                _ => super::api::api_error(e, &format!("exec in pod {}", self.pod)),
            })?,
            Err(_) => {
                return Err(Error::timeout(format!(
                    "exec in pod {}: the API server did not open the stream in {} s",
                    self.pod,
                    START_TIMEOUT.as_secs()
                )));
            }
        };
        let v5 = conn.supports_stream_close();
        let _ = self.v5.set(v5);
        Ok(Opened { conn, v5 })
    }

    /// Whether the server speaks v5 (learned by opening `true` once if no exec has yet).
    pub(super) async fn speaks_v5(&self, ctx: &Ctx) -> Result<bool> {
        if let Some(v) = self.v5.get() {
            return Ok(*v);
        }
        let mut p = self.run_plain(&["true".to_string()], ctx).await?;
        let _ = p.wait().await;
        Ok(self.v5.get().copied().unwrap_or(false))
    }

    /// Run `argv` behind the shim, in `cwd`, with `env` added.
    pub(super) async fn exec(
        &self,
        argv: &[String],
        cwd: &str,
        env: &[(String, String)],
        ctx: &Ctx,
    ) -> Result<Process> {
        let mut cmd = vec![
            "sh".to_string(),
            "-c".into(),
            shim::SHIM_ENV.into(),
            "agentbox-exec".into(),
            cwd.into(),
            env.len().to_string(),
        ];
        // The API's exec takes no environment: the shim exports these before the program.
        cmd.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        cmd.extend(argv.iter().cloned());
        let opened = self.open(&cmd, ctx).await?;
        let (header_tx, header_rx) = oneshot::channel();
        let parts = start(opened, Some(header_tx), self.clone());
        let header = match tokio::time::timeout(START_TIMEOUT, ctx.run(header_rx)).await {
            Ok(r) => r?.map_err(|_| Error::unknown("the exec ended before its shim spoke"))??,
            Err(_) => {
                return Err(Error::timeout(format!(
                    "the program did not start within {} s",
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
        Ok(parts.process(Some(pid), ctx))
    }

    /// Run `argv` as given (no shim, no pid): for control programs.
    pub(super) async fn run_plain(&self, argv: &[String], ctx: &Ctx) -> Result<Process> {
        let opened = self.open(argv, ctx).await?;
        Ok(start(opened, None, self.clone()).process(None, ctx))
    }
}

/// The pieces of a started exec, before it becomes a [`Process`].
struct Parts {
    stdin: DuplexStream,
    stdout: DuplexStream,
    stderr: DuplexStream,
    exit: oneshot::Receiver<Result<ExitStatus>>,
    ended: Arc<AtomicBool>,
    target: Target,
}

impl Parts {
    fn process(self, pid: Option<u32>, ctx: &Ctx) -> Process {
        let control = Arc::new(Control {
            target: self.target,
            pid,
            ended: self.ended,
            exit: crate::shim::ExitSlot::new(self.exit),
        });
        let stdin: ByteWriter = Box::pin(self.stdin);
        Process::new(
            Some(stdin),
            Some(Box::pin(self.stdout)),
            Some(Box::pin(self.stderr)),
            control,
            ctx,
        )
    }
}

/// Start the exec's pumps: stdin to the socket, the socket to stdout, stderr and the status.
fn start(opened: Opened, header: Option<oneshot::Sender<Result<Header>>>, target: Target) -> Parts {
    let (sink, mut stream) = opened.conn.into_stream().split();
    let v5 = opened.v5;
    let (stdin_w, mut stdin_r) = tokio::io::duplex(STDIN_CHUNK);
    let (out_w, out_r) = tokio::io::duplex(PIPE_BUFFER);
    let (err_w, err_r) = tokio::io::duplex(PIPE_BUFFER);
    let (exit_tx, exit_rx) = oneshot::channel();
    let ended = Arc::new(AtomicBool::new(false));
    let (frames_tx, mut frames_rx) = mpsc::channel::<Message>(4);

    // The writer: stdin's bytes, its end (v5), and pings, until the reader is done (which
    // aborts it). It never closes the socket itself: a server reads a client's close as the
    // caller gone, and ends the program.
    let writer = tokio::spawn(async move {
        let mut sink = sink;
        let mut ping = tokio::time::interval(PING_EVERY);
        ping.reset();
        let mut open = true;
        loop {
            tokio::select! {
                m = frames_rx.recv(), if open => match m {
                    Some(m) => if sink.send(m).await.is_err() { break },
                    None => open = false,
                },
                _ = ping.tick() => if sink.send(Message::Ping(Vec::new().into())).await.is_err() { break },
            }
        }
    });
    let stdin_frames = frames_tx.clone();
    let stdin_task = tokio::spawn(async move {
        let mut buf = vec![0u8; STDIN_CHUNK];
        loop {
            match stdin_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let mut f = Vec::with_capacity(n + 1);
                    f.push(STDIN);
                    f.extend_from_slice(&buf[..n]);
                    if stdin_frames.send(Message::Binary(f.into())).await.is_err() {
                        return;
                    }
                }
            }
        }
        if v5 {
            let _ = stdin_frames.send(Message::Binary(vec![CLOSE, STDIN].into())).await;
        } else {
            // v4 cannot end stdin alone: closing the socket would end the program's output too.
            tracing::debug!("exec over v4.channel.k8s.io: the program's stdin stays open");
        }
    });
    drop(frames_tx);

    let flag = ended.clone();
    let pod = target.pod.clone();
    tokio::spawn(async move {
        let mut header = header;
        let mut line = Vec::new();
        let mut out = Some(out_w);
        let mut err = Some(err_w);
        let mut status: Option<Result<ExitStatus>> = None;
        let outcome = loop {
            let frame = match tokio::time::timeout(SILENT, stream.next()).await {
                Err(_) => {
                    break Err(Error::timeout(format!(
                        "exec in pod {pod}: the API server sent nothing for {} s",
                        SILENT.as_secs()
                    )));
                }
                Ok(None) => break Ok(()),
                Ok(Some(Err(e))) => break Err(Error::unknown(format!("exec in pod {pod}: the stream broke: {e}"))),
                Ok(Some(Ok(f))) => f,
            };
            let data = match frame {
                Message::Binary(b) => b,
                Message::Close(_) => break Ok(()),
                _ => continue,
            };
            let Some((&ch, body)) = data.split_first() else {
                continue;
            };
            match ch {
                STDOUT => {
                    if let Some(tx) = header.take() {
                        line.extend_from_slice(body);
                        match shim::split_header(&line) {
                            Some(Ok((h, rest))) => {
                                let rest = rest.to_vec();
                                let _ = tx.send(Ok(h));
                                put(&mut out, &rest).await;
                            }
                            Some(Err(e)) => {
                                let _ = tx.send(Err(e));
                                break Ok(());
                            }
                            None => header = Some(tx),
                        }
                    } else {
                        put(&mut out, body).await;
                    }
                }
                STDERR => put(&mut err, body).await,
                STATUS => status = Some(exit_of(body, &pod)),
                _ => {}
            }
        };
        stdin_task.abort();
        writer.abort();
        flag.store(true, Ordering::SeqCst);
        let result = exit_of_stream(outcome, status, &pod);
        if let Some(tx) = header.take() {
            let _ = tx.send(Err(match &result {
                Err(e) => e.clone(),
                Ok(s) => Error::unknown(format!("the exec ended (exit {}) before its shim spoke", s.code)),
            }));
        }
        let _ = exit_tx.send(result);
    });
    Parts {
        stdin: stdin_w,
        stdout: out_r,
        stderr: err_r,
        exit: exit_rx,
        ended,
        target,
    }
}

/// The exec's outcome from how its stream ended (`outcome`) and the status it sent, if any.
/// The status is the exec's last word, sent after all its output, so whatever befalls the
/// connection after it changes nothing: a server that closes with the client's late frames
/// unread (a ping, stdin's end) answers them with a reset, which is no failure of the program.
fn exit_of_stream(outcome: Result<()>, status: Option<Result<ExitStatus>>, pod: &str) -> Result<ExitStatus> {
    match (outcome, status) {
        (_, Some(s)) => s,
        (Err(e), None) => Err(e),
        (Ok(()), None) => Err(Error::gone(format!(
            "exec in pod {pod}: the stream ended with no exit status (the pod may have ended)"
        ))),
    }
}

/// Write to an output pipe whose reader may have gone: the stream is still read to its end,
/// so the exit status stays real.
async fn put(w: &mut Option<DuplexStream>, bytes: &[u8]) {
    if let Some(s) = w.as_mut()
        && !bytes.is_empty()
        && s.write_all(bytes).await.is_err()
    {
        *w = None;
    }
}

/// The exit status the status channel carried (a `metav1.Status`).
fn exit_of(body: &[u8], pod: &str) -> Result<ExitStatus> {
    let s: Status = serde_json::from_slice(body).map_err(|e| {
        Error::unknown(format!(
            "exec in pod {pod}: the status channel held no Status ({e}): {:?}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        ))
    })?;
    match s.status.as_deref() {
        Some("Success") => Ok(ExitStatus::exited(0)),
        _ if s.reason.as_deref() == Some("NonZeroExitCode") => {
            let code = s
                .details
                .as_ref()
                .and_then(|d| d.causes.as_ref())
                .and_then(|c| c.iter().find(|c| c.reason.as_deref() == Some("ExitCode")))
                .and_then(|c| c.message.as_deref())
                .and_then(|m| m.trim().parse::<i32>().ok())
                .ok_or_else(|| {
                    Error::unknown(format!(
                        "exec in pod {pod}: a non-zero exit without its code: {:?}",
                        s.message
                    ))
                })?;
            Ok(ExitStatus::exited(code))
        }
        _ => Err(Error::unknown(format!(
            "exec in pod {pod}: {} ({})",
            s.message.as_deref().unwrap_or("the server reported a failure"),
            s.reason.as_deref().unwrap_or("no reason")
        ))),
    }
}

struct Control {
    target: Target,
    pid: Option<u32>,
    ended: Arc<AtomicBool>,
    exit: crate::shim::ExitSlot,
}

#[async_trait]
impl ProcessControl for Control {
    async fn wait(&self) -> Result<ExitStatus> {
        self.exit.wait().await
    }

    async fn signal(&self, signal: i32) -> Result<()> {
        if self.ended.load(Ordering::SeqCst) || !(1..=31).contains(&signal) {
            return Ok(());
        }
        let Some(pid) = self.pid else {
            return Err(Error::unsupported("signal: this exec did not report its pid"));
        };
        // The API has no signal: a second exec sends it, by the pid the shim reported.
        let argv = ["kill", "-s", &signal.to_string(), &pid.to_string()].map(String::from);
        let ctx = Ctx::background().with_timeout(crate::transfer::CONTROL_TIMEOUT);
        match self.target.run_plain(&argv, &ctx).await {
            Ok(mut p) => {
                if let Some(mut i) = p.stdin.take() {
                    let _ = i.close().await;
                }
                match p.wait().await {
                    Ok(_) => Ok(()),
                    Err(e) if e.code() == agentbox_core::ErrorCode::Gone => Ok(()),
                    Err(e) => Err(e),
                }
            }
            // A pod that ended has ended its programs.
            Err(e)
                if matches!(
                    e.code(),
                    agentbox_core::ErrorCode::Gone | agentbox_core::ErrorCode::NotFound
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    async fn resize(&self, _rows: u16, _cols: u16) -> Result<()> {
        Err(Error::unsupported("resize: the program has no terminal"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_channel_gives_the_exit_code() {
        assert_eq!(exit_of(br#"{"metadata":{},"status":"Success"}"#, "p").unwrap().code, 0);
        let failed = br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: exit status 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#;
        assert_eq!(exit_of(failed, "p").unwrap().code, 3);
        let other = br#"{"metadata":{},"status":"Failure","message":"container not found","reason":"InternalError"}"#;
        assert!(
            exit_of(other, "p")
                .unwrap_err()
                .message()
                .contains("container not found")
        );
        assert!(exit_of(b"not json", "p").is_err());
        let no_code = br#"{"status":"Failure","reason":"NonZeroExitCode"}"#;
        assert!(exit_of(no_code, "p").is_err());
    }

    /// A stream that breaks after the status (a reset from a server that closed with a late
    /// ping unread) ends the exec with that status; one that breaks before it is the failure.
    #[test]
    fn a_stream_broken_after_the_status_keeps_the_status() {
        let broke = || {
            Err(Error::unknown(
                "exec in pod p: the stream broke: Connection reset by peer",
            ))
        };
        let exited = |code| {
            Some(exit_of(format!(r#"{{"status":"Failure","reason":"NonZeroExitCode","details":{{"causes":[{{"reason":"ExitCode","message":"{code}"}}]}}}}"#).as_bytes(), "p"))
        };
        assert_eq!(exit_of_stream(broke(), exited(3), "p").unwrap().code, 3);
        assert_eq!(exit_of_stream(Ok(()), exited(4), "p").unwrap().code, 4);
        assert!(
            exit_of_stream(broke(), None, "p")
                .unwrap_err()
                .message()
                .contains("the stream broke")
        );
        assert!(
            exit_of_stream(Ok(()), None, "p")
                .unwrap_err()
                .message()
                .contains("no exit status")
        );
    }
}

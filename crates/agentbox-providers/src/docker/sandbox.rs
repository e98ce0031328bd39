//! One Docker box, and its programs.
//!
//! Every program starts through the shim (`crate::shim`): `sh -c SHIM agentbox-exec CWD ARGV…`. Before the
//! program runs, the shim writes one header line on stdout: `\0agentbox <pid>` when it is
//! about to `exec` the program (same pid), `\0agentbox nocwd` or `\0agentbox noprog` when it
//! cannot. The provider reads and strips that line, so `exec` answers `not_found` like every
//! other provider, and a kill can reach the program by pid (Docker has no API to signal an
//! exec'd process).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use agentbox_core::{
    ByteWriter, Ctx, Endpoint, Error, ExecOptions, ExitStatus, Facts, Labels, Process, ProcessControl, Result, Sandbox,
    SandboxId, Status,
};
use async_trait::async_trait;
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::query_parameters::InspectContainerOptions;
use futures_util::StreamExt;
use tokio::io::{AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::sync::oneshot;

use super::{DockerOptions, NAME, is_not_found, remove_options};
use crate::transfer::{CONTROL_TIMEOUT, download_by_exec, upload_by_exec};

/// The exec shim. `$1` is the working directory, the rest is the program and its arguments.
pub(super) const SHIM: &str = crate::shim::SHIM;

/// How long the shim may take to write its header.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest header the shim writes.
const MAX_HEADER: usize = 64;
/// Bytes of each output stream held between Docker and a slow reader.
const PIPE_BUFFER: usize = 256 * 1024;

/// One Docker box.
pub struct DockerSandbox {
    docker: Docker,
    opts: Arc<DockerOptions>,
    name: String,
    id: SandboxId,
    facts: Facts,
    labels: Labels,
    workspace: String,
}

impl DockerSandbox {
    pub(super) fn new(
        docker: Docker,
        opts: Arc<DockerOptions>,
        name: String,
        facts: Facts,
        labels: Labels,
        workspace: String,
    ) -> Self {
        let id = SandboxId::new(NAME, &name).expect("container names we make are valid ids");
        DockerSandbox {
            docker,
            opts,
            name,
            id,
            facts,
            labels,
            workspace,
        }
    }

    async fn running(&self) -> Result<bool> {
        match self
            .docker
            .inspect_container(&self.name, None::<InspectContainerOptions>)
            .await
        {
            Ok(i) => Ok(i.state.and_then(|s| s.running).unwrap_or(false)),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(Error::unknown(format!("inspecting {}: {e}", self.name))),
        }
    }

    fn gone(&self) -> Error {
        Error::gone(format!("box {}: it has ended", self.id))
    }

    async fn start(&self, argv: &[String], opts: &ExecOptions, user: Option<&str>, ctx: &Ctx) -> Result<Process> {
        opts.validate(argv)?;
        opts.refuse(
            true,
            false,
            false,
            "a Docker box without its runner keeps no processes (the engine's exec lives as long as its caller)",
        )?;
        ctx.check()?;
        let cwd = crate::shim::exec_cwd(&self.workspace, opts.cwd.as_deref());
        let mut cmd = vec![
            "sh".to_string(),
            "-c".into(),
            // In a terminal the engine's stream has no frames, and bollard takes a first byte
            // under 3 for a frame's header: the header starts with ESC there instead. The shim
            // sizes its terminal before the program starts (this engine's API has no size at
            // create, and a resize after the start races the program).
            match &opts.tty {
                Some(t) => format!(
                    "stty rows {} cols {} 2>/dev/null; {}",
                    t.rows,
                    t.cols,
                    SHIM.replace("\\000agentbox", "\\033agentbox")
                ),
                None => SHIM.into(),
            },
            "agentbox-exec".into(),
            cwd.clone(),
        ];
        cmd.extend(argv.iter().cloned());
        // A terminal is the engine's own (its exec with a tty), sized once it started.
        let tty = opts.tty.clone();
        let mut env: Vec<String> = opts.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        if let Some(t) = &tty {
            env.push(format!("TERM={}", t.term.as_deref().unwrap_or("xterm-256color")));
        }
        let config = CreateExecOptions {
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(tty.is_some()),
            env: Some(env),
            cmd: Some(cmd),
            user: user.map(String::from).or_else(|| self.opts.user.clone()),
            working_dir: Some("/".into()),
            ..Default::default()
        };
        let created = match ctx.run(self.docker.create_exec(&self.name, config)).await? {
            Ok(c) => c,
            Err(e) if is_not_found(&e) => return Err(self.gone()),
            Err(e) if e.to_string().contains("is not running") => return Err(self.gone()),
            Err(e) => return Err(Error::unknown(format!("docker exec in {}: {e}", self.name))),
        };
        let start = StartExecOptions {
            detach: false,
            tty: tty.is_some(),
            output_capacity: Some(64 * 1024),
        };
        let (mut output, input) = match ctx.run(self.docker.start_exec(&created.id, Some(start))).await? {
            Ok(StartExecResults::Attached { output, input }) => (output, input),
            Ok(StartExecResults::Detached) => return Err(Error::unknown("docker started the exec detached")),
            Err(e) if e.to_string().contains("is not running") => return Err(self.gone()),
            Err(e) => return Err(Error::unknown(format!("starting the exec in {}: {e}", self.name))),
        };

        // Read the shim's header: everything up to its newline on stdout.
        let mut header = Vec::new();
        let mut early_err = Vec::new();
        let read_header = async {
            while !header.contains(&b'\n') {
                match output.next().await {
                    Some(Ok(LogOutput::StdOut { message })) | Some(Ok(LogOutput::Console { message })) => {
                        header.extend_from_slice(&message)
                    }
                    Some(Ok(LogOutput::StdErr { message })) => early_err.extend_from_slice(&message),
                    Some(Ok(LogOutput::StdIn { .. })) => {}
                    Some(Err(e)) => return Err(Error::unknown(format!("reading the exec's output: {e}"))),
                    None => break,
                }
                if header.len() > MAX_HEADER && !header[..MAX_HEADER].contains(&b'\n') {
                    break;
                }
            }
            Ok(())
        };
        match tokio::time::timeout(START_TIMEOUT, ctx.run_result(read_header)).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(Error::timeout(format!(
                    "the program did not start within {}s",
                    START_TIMEOUT.as_secs()
                )));
            }
        }
        let nl = header.iter().position(|&b| b == b'\n');
        // A terminal ends the line with "\r\n".
        let line = nl
            .map(|i| String::from_utf8_lossy(&header[..i]).trim_end_matches('\r').to_string())
            .unwrap_or_default();
        let rest = nl.map(|i| header[i + 1..].to_vec()).unwrap_or_default();
        let pid: u32 = match line
            .strip_prefix("\0agentbox ")
            .or_else(|| line.strip_prefix("\x1bagentbox "))
        {
            Some("nocwd") => {
                return Err(Error::not_found(format!(
                    "working directory {cwd} does not exist in the box"
                )));
            }
            Some("noprog") => return Err(Error::not_found(format!("program {:?} not found in the box", argv[0]))),
            Some(p) => p
                .parse()
                .map_err(|_| Error::unknown(format!("the exec shim wrote {line:?}")))?,
            None => {
                let said = String::from_utf8_lossy(if header.is_empty() { &early_err } else { &header });
                if !self.running().await.unwrap_or(true) {
                    return Err(self.gone());
                }
                return Err(Error::unknown(format!("the exec did not start: {}", said.trim())));
            }
        };

        let (out_w, out_r) = tokio::io::duplex(PIPE_BUFFER);
        let (err_w, err_r) = tokio::io::duplex(PIPE_BUFFER);
        let (tx, rx) = oneshot::channel();
        let ended = Arc::new(AtomicBool::new(false));
        let docker = self.docker.clone();
        let exec_id = created.id.clone();
        let flag = ended.clone();
        let box_name = self.name.clone();
        tokio::spawn(async move {
            let streamed = pump(output, rest, early_err, out_w, err_w).await;
            let status = match streamed {
                Ok(()) => exit_of(&docker, &exec_id, &box_name).await,
                Err(e) => Err(e),
            };
            flag.store(true, Ordering::SeqCst);
            let _ = tx.send(status);
        });
        let control = Arc::new(DockerControl {
            docker: self.docker.clone(),
            exec_id: tty.is_some().then(|| created.id.clone()),
            container: self.name.clone(),
            user: user.map(String::from).or_else(|| self.opts.user.clone()),
            pid,
            ended,
            exit: crate::shim::ExitSlot::new(rx),
        });
        let stdin: ByteWriter = if tty.is_some() {
            Box::pin(TtyKeys {
                inner: Some(input),
                eof_sent: false,
            })
        } else {
            Box::pin(ShutdownOnDrop(Some(input)))
        };
        Ok(Process::new(
            Some(stdin),
            Some(Box::pin(out_r)),
            Some(Box::pin(err_r)),
            control,
            ctx,
        ))
    }
}

/// Copy Docker's multiplexed output into two pipes, to its end. A reader that went away is
/// no reason to stop: the stream is read to its end so the exec's exit code stays real.
async fn pump(
    mut output: Pin<
        Box<dyn futures_util::Stream<Item = std::result::Result<LogOutput, bollard::errors::Error>> + Send>,
    >,
    first_out: Vec<u8>,
    first_err: Vec<u8>,
    out_w: DuplexStream,
    err_w: DuplexStream,
) -> Result<()> {
    let mut out = Some(out_w);
    let mut err = Some(err_w);
    async fn put(w: &mut Option<DuplexStream>, bytes: &[u8]) {
        if let Some(s) = w.as_mut()
            && !bytes.is_empty()
            && s.write_all(bytes).await.is_err()
        {
            *w = None;
        }
    }
    put(&mut out, &first_out).await;
    put(&mut err, &first_err).await;
    while let Some(item) = output.next().await {
        match item {
            Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => put(&mut out, &message).await,
            Ok(LogOutput::StdErr { message }) => put(&mut err, &message).await,
            Ok(LogOutput::StdIn { .. }) => {}
            Err(e) => return Err(Error::unknown(format!("reading the exec's output: {e}"))),
        }
    }
    Ok(())
}

/// Set the size of an exec's terminal.
async fn resize(docker: &Docker, exec_id: &str, rows: u16, cols: u16) -> Result<()> {
    let size = bollard::exec::ResizeExecOptions {
        height: rows,
        width: cols,
    };
    tokio::time::timeout(CONTROL_TIMEOUT, docker.resize_exec(exec_id, size))
        .await
        .map_err(|_| Error::timeout("the engine did not resize the terminal in time"))?
        .map_err(|e| Error::unknown(format!("resizing the exec's terminal: {e}")))
}

/// The exit code Docker recorded, once the exec is no longer running.
async fn exit_of(docker: &Docker, exec_id: &str, container: &str) -> Result<ExitStatus> {
    for _ in 0..200 {
        match docker.inspect_exec(exec_id).await {
            Ok(i) if i.running == Some(false) => {
                let code = i.exit_code.unwrap_or(-1);
                return Ok(ExitStatus::exited(i32::try_from(code).unwrap_or(-1)));
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(e) if is_not_found(&e) => {
                return Err(Error::gone(format!(
                    "box docker:{container} ended while the program ran"
                )));
            }
            Err(e) => return Err(Error::unknown(format!("inspecting the exec: {e}"))),
        }
    }
    Err(Error::unknown(
        "the exec's output ended but Docker still reports it running",
    ))
}

/// bollard keeps the exec's socket open through its read half, so dropping the writer does
/// not deliver EOF: a shutdown does. This writer shuts down when dropped, too.
struct ShutdownOnDrop(Option<Pin<Box<dyn AsyncWrite + Send>>>);

impl AsyncWrite for ShutdownOnDrop {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.0.as_mut() {
            Some(w) => w.as_mut().poll_write(cx, buf),
            None => Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into())),
        }
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.0.as_mut() {
            Some(w) => w.as_mut().poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = match self.0.as_mut() {
            Some(w) => w.as_mut().poll_shutdown(cx),
            None => return Poll::Ready(Ok(())),
        };
        if r.is_ready() {
            self.0 = None;
        }
        r
    }
}

impl Drop for ShutdownOnDrop {
    fn drop(&mut self) {
        if let Some(mut w) = self.0.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move {
                let _ = w.shutdown().await;
            });
        }
    }
}

/// A terminal's keys. Ending them types the end-of-file key (Ctrl-D), as a person would: a
/// tty exec whose input the engine sees closed loses the output the program writes after.
struct TtyKeys {
    inner: Option<Pin<Box<dyn AsyncWrite + Send>>>,
    eof_sent: bool,
}

impl AsyncWrite for TtyKeys {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.inner.as_mut() {
            Some(w) => w.as_mut().poll_write(cx, buf),
            None => Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into())),
        }
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.inner.as_mut() {
            Some(w) => w.as_mut().poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let Some(w) = this.inner.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        if !this.eof_sent {
            match w.as_mut().poll_write(cx, b"\x04") {
                Poll::Ready(Ok(_)) => this.eof_sent = true,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        let r = w.as_mut().poll_flush(cx);
        if r.is_ready() {
            this.inner = None;
        }
        r
    }
}

struct DockerControl {
    docker: Docker,
    /// The exec, when it has a terminal to resize.
    exec_id: Option<String>,
    container: String,
    user: Option<String>,
    pid: u32,
    ended: Arc<AtomicBool>,
    exit: crate::shim::ExitSlot,
}

#[async_trait]
impl ProcessControl for DockerControl {
    async fn wait(&self) -> Result<ExitStatus> {
        self.exit.wait().await
    }

    async fn signal(&self, signal: i32) -> Result<()> {
        if self.ended.load(Ordering::SeqCst) || !(1..=31).contains(&signal) {
            return Ok(());
        }
        // Docker cannot signal an exec: a second exec does, by the pid the shim reported.
        let config = CreateExecOptions {
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            cmd: Some(vec![
                "kill".into(),
                "-s".into(),
                signal.to_string(),
                self.pid.to_string(),
            ]),
            user: self.user.clone(),
            ..Default::default()
        };
        let run = async {
            let e = self.docker.create_exec(&self.container, config).await?;
            if let StartExecResults::Attached { mut output, .. } = self.docker.start_exec(&e.id, None).await? {
                while output.next().await.is_some() {}
            }
            Ok::<_, bollard::errors::Error>(())
        };
        match tokio::time::timeout(CONTROL_TIMEOUT, run).await {
            Ok(Ok(())) => Ok(()),
            // A box that ended has ended its programs.
            Ok(Err(e)) if is_not_found(&e) || e.to_string().contains("is not running") => Ok(()),
            Ok(Err(e)) => Err(Error::unknown(format!("signalling the program: {e}"))),
            Err(_) => Err(Error::timeout("signalling the program took over 30s")),
        }
    }

    async fn resize(&self, rows: u16, cols: u16) -> Result<()> {
        match &self.exec_id {
            Some(id) => resize(&self.docker, id, rows, cols).await,
            None => Err(Error::unsupported("resize: the program has no terminal")),
        }
    }
}

#[async_trait]
impl Sandbox for DockerSandbox {
    fn id(&self) -> &SandboxId {
        &self.id
    }

    fn facts(&self) -> &Facts {
        &self.facts
    }

    fn labels(&self) -> &Labels {
        &self.labels
    }

    async fn net_refusals(&self, max: usize, ctx: &Ctx) -> Result<Vec<agentbox_core::NetRefusal>> {
        ctx.check()?;
        let proxied = matches!(&self.facts.network, Some(agentbox_core::NetworkFact::Allowlist(_)));
        let log = super::state::refusals_path(&self.name)?;
        crate::egress::refusals(proxied, log, max, self.id.as_str()).await
    }

    async fn exec(&self, argv: &[String], opts: &ExecOptions, ctx: &Ctx) -> Result<Process> {
        // The program alone: its arguments and environment may hold what a log must not.
        tracing::debug!(box_id = %self.id(), program = argv.first().map(String::as_str).unwrap_or(""), "exec");
        self.start(argv, opts, None, ctx).await
    }

    async fn status(&self, ctx: &Ctx) -> Result<Status> {
        Ok(if ctx.run_result(self.running()).await? {
            Status::Running
        } else {
            Status::Ended
        })
    }

    async fn upload(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<()> {
        upload_by_exec(self, path, data, ctx).await
    }

    async fn download(&self, path: &str, max_bytes: u64, ctx: &Ctx) -> Result<Vec<u8>> {
        download_by_exec(self, path, max_bytes, ctx).await
    }

    async fn endpoint(&self, port: u16, ctx: &Ctx) -> Result<Endpoint> {
        if port == 0 {
            return Err(Error::invalid("endpoint: port 0 is not a port"));
        }
        let info = match ctx
            .run(
                self.docker
                    .inspect_container(&self.name, None::<InspectContainerOptions>),
            )
            .await?
        {
            Ok(i) => i,
            Err(e) if is_not_found(&e) => return Err(self.gone()),
            Err(e) => return Err(Error::unknown(format!("inspecting {}: {e}", self.name))),
        };
        // Only a port the spec asked for is reached, where the engine published it on this
        // machine's loopback.
        if !self.facts.ports.iter().flatten().any(|p| p.port == port) {
            return Err(Error::unsupported(format!(
                "box {}: port {port} was not asked for (spec.ports), so it is not published",
                self.id
            )));
        }
        let published = info
            .network_settings
            .and_then(|n| n.ports)
            .and_then(|mut ports| ports.remove(&format!("{port}/tcp")))
            .flatten()
            .into_iter()
            .flatten()
            .find(|b| b.host_ip.as_deref() == Some("127.0.0.1"))
            .and_then(|b| b.host_port?.parse::<u16>().ok());
        match published {
            Some(host_port) => Ok(Endpoint {
                host: "127.0.0.1".into(),
                port: host_port,
                url: None,
            }),
            None => Err(Error::unknown(format!(
                "box {}: the engine states no port of this machine's for its port {port}",
                self.id
            ))),
        }
    }

    async fn destroy(&self, ctx: &Ctx) -> Result<()> {
        let removed = match ctx
            .run(self.docker.remove_container(&self.name, Some(remove_options())))
            .await?
        {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            // Auto-removal already under way.
            Err(e) if e.to_string().contains("is already in progress") => Ok(()),
            Err(e) => Err(Error::unknown(format!("removing {}: {e}", self.name))),
        };
        if removed.is_ok()
            && let Ok(dir) = super::runner_dir(&self.name, false)
        {
            // Its runner's directory, where it had one; one left by a box that ended on its
            // own is swept by the next list.
            let _ = std::fs::remove_dir_all(dir);
            super::state::remove(&self.name);
        }
        tracing::info!(box_id = %self.id(), ok = removed.is_ok(), "destroyed");
        removed
    }
}

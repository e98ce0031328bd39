//! A process's I/O through the runner: starting it, its stdin carried as frames, its output
//! read as the runner sends it and acknowledged as it is taken (flow control), its signals and
//! its exit.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use agentbox_core::{Ctx, Error, ExecOptions, ExitStatus, Process, ProcessControl, Processes, Result};
use agentbox_protocol::runner::{Message, Request, STDERR, STDIN, STDOUT, Tty, frame};
use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tokio::sync::{mpsc, oneshot};

use super::{Chunk, Client, HELD_PER_STREAM, Proc, REQUEST_TIMEOUT, Sink, ack_every, send, wire_signal};

impl Client {
    /// Start `argv` in the box: one message, answered when it started.
    pub async fn exec(&self, argv: &[String], opts: &ExecOptions, ctx: &Ctx) -> Result<Process> {
        opts.validate(argv)?;
        // Which protocol the runner speaks is known once it was reached.
        self.link(ctx).await?;
        if self.protocol_2_only() {
            return self.exec_protocol_2(argv, opts, ctx).await;
        }
        let id = self.id();
        // A program that ends with its caller's context ends at the same time in the box,
        // whether or not this host is still there to kill it.
        let timeout = opts.timeout.or(if opts.detach { None } else { ctx.remaining() });
        let timeout_ms = timeout.map(|t| (t.as_millis() as u64).max(1));
        let req = Request::Run {
            id,
            command: None,
            argv: Some(argv.to_vec()),
            cwd: opts.cwd.clone(),
            env: (!opts.env.is_empty()).then(|| opts.env.clone()),
            stdin: true,
            key: Some(self.key(id)),
            tty: opts.tty.as_ref().map(|t| Tty {
                rows: t.rows,
                cols: t.cols,
                term: t.term.clone(),
            }),
            detach: opts.detach,
            timeout_ms,
            secret: opts.secret_fd.as_ref().map(|s| agentbox_protocol::runner::SecretFd {
                name: s.name.clone(),
                value: s.value.expose().to_string(),
            }),
        };
        let governing = if opts.detach { Ctx::background() } else { ctx.clone() };
        self.start(id, Some(req), None, 0, !opts.detach, timeout_ms, ctx, &governing)
            .await
    }

    /// Start `argv` through a runner of protocol 2: a command line for its shell, with its
    /// directory, environment and stdin. A terminal, a detached program, an in-box deadline
    /// and a secret descriptor have no message there, and are refused.
    async fn exec_protocol_2(&self, argv: &[String], opts: &ExecOptions, ctx: &Ctx) -> Result<Process> {
        opts.refuse(
            false,
            false,
            false,
            &format!("{} speaks protocol 2 only (the seed's runner)", self.describe()),
        )?;
        let id = self.id();
        let req = Request::Run {
            id,
            command: Some(crate::shell::command_line(argv)),
            argv: None,
            cwd: opts.cwd.clone(),
            env: (!opts.env.is_empty()).then(|| opts.env.clone()),
            stdin: true,
            key: None,
            tty: None,
            detach: false,
            timeout_ms: None,
            secret: None,
        };
        self.start(id, Some(req), None, 0, true, None, ctx, ctx).await
    }

    /// Register process `id` (to be run by `run`, or resumed at `resume` from byte `after`),
    /// send its request, and answer it once the runner said it started (or resumed it).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn start(
        &self,
        id: u32,
        run: Option<Request>,
        resume: Option<u64>,
        after: u64,
        forget: bool,
        timeout_ms: Option<u64>,
        ctx: &Ctx,
        governing: &Ctx,
    ) -> Result<Process> {
        let (tx, alive) = self.link_alive(ctx).await?;
        let legacy = self.protocol_2_only();
        if legacy && run.is_none() {
            return Err(self.refused_by_protocol_2("attach"));
        }
        // The runner was replaced by one of the other protocol after the request was made.
        if run.as_ref().is_some_and(|r| r.is_extended() == legacy) {
            return Err(Error::transfer_failed(format!(
                "{} was replaced by a runner of another protocol as the program started: start it again",
                self.describe()
            )));
        }
        let (out, out_rx) = sink();
        let (err, err_rx) = sink();
        let (acks, acks_rx) = mpsc::unbounded_channel();
        let (started_tx, started_rx) = oneshot::channel();
        let (exit_tx, exit_rx) = oneshot::channel();
        self.shared.lock().unwrap().procs.insert(
            id,
            Proc {
                handle: resume,
                run: run.clone(),
                last: after,
                out: out.clone(),
                err: err.clone(),
                acks: acks.clone(),
                // Protocol 2 answers no `started`: the process runs once the `run` went out,
                // and a refusal comes as its exit's error.
                started: (!legacy).then_some(started_tx),
                exit: Some(exit_tx),
                forget,
                timeout_ms,
            },
        );
        let req = match (run, resume) {
            (Some(r), _) => r,
            (None, handle) => Request::Resume {
                id,
                handle,
                key: None,
                after,
                hold: None,
                window: None,
            },
        };
        let started = async {
            send(&tx, &req).await?;
            if legacy {
                // No `started` will say the connection held: a drop before the process was
                // registered reaches nobody, so it is looked at here.
                if !alive.load(Ordering::SeqCst) {
                    return Err(self.dropped());
                }
                return Ok(None);
            }
            match ctx.run(tokio::time::timeout(REQUEST_TIMEOUT, started_rx)).await? {
                Ok(Ok(r)) => r.map(Some),
                Ok(Err(_)) => Err(self.dropped()),
                Err(_) => Err(Error::timeout(format!(
                    "{} did not start the program within 60s",
                    self.describe()
                ))),
            }
        }
        .await;
        let handle = match started {
            Ok(h) => h,
            Err(e) => {
                let was_run = self
                    .shared
                    .lock()
                    .unwrap()
                    .procs
                    .remove(&id)
                    .is_some_and(|p| p.run.is_some());
                // Given up on (a deadline, an abort, a drop): a program the runner may have
                // started anyway would run on with nobody to reach it; a reader would hold.
                if let Some(me) = self.me.upgrade() {
                    tokio::spawn(async move {
                        if was_run {
                            let _ = me
                                .tell(Request::Kill {
                                    id,
                                    signal: Some("SIGKILL".into()),
                                    handle: None,
                                })
                                .await;
                            if !legacy {
                                let _ = me.tell(Request::Forget { id, handle: None }).await;
                            }
                        } else {
                            let _ = me.tell(Request::Release { id }).await;
                        }
                    });
                }
                return Err(e);
            }
        };
        let me = self
            .me
            .upgrade()
            .ok_or_else(|| Error::unknown("the runner client is gone"))?;
        let (stdin_w, stdin_r) = tokio::io::duplex(64 << 10);
        // Stdin ends in the box when it is closed; dropped unclosed, it ends only for a
        // program this caller runs and holds (a detached one, or one attached to, keeps it
        // open for whoever writes next).
        let closed = Arc::new(AtomicBool::new(forget));
        tokio::spawn(pump_stdin(me.clone(), id, stdin_r, closed.clone()));
        let flow = self.flow.load(Ordering::Relaxed);
        if flow {
            tokio::spawn(pump_acks(me.clone(), id, acks_rx));
        }
        let acks = flow.then_some(acks);
        let granted = self.granted.load(Ordering::Relaxed);
        let control = Arc::new(Control {
            client: me,
            id,
            handle: handle.unwrap_or(0),
            exit: Mutex::new(Some(exit_rx)),
        });
        let p = Process::new(
            Some(Box::pin(StdinWriter { inner: stdin_w, closed })),
            Some(Box::pin(ChanReader::new(
                out_rx,
                out.room,
                STDOUT,
                acks.clone(),
                granted,
            ))),
            Some(Box::pin(ChanReader::new(err_rx, err.room, STDERR, acks, granted))),
            control,
            governing,
        );
        // A process of protocol 2 has no handle: nothing names it past this connection.
        Ok(match handle {
            Some(h) => p.with_handle(h),
            None => p,
        })
    }
}

/// A process's stdin, carried as frames; its end is `stdin-end`.
/// A process's stdin on its way to [`pump_stdin`]: shutting it down marks it closed, so its
/// end reaches the box (a drop alone ends it only where `closed` was set from the start).
struct StdinWriter {
    inner: tokio::io::DuplexStream,
    closed: Arc<AtomicBool>,
}

impl tokio::io::AsyncWrite for StdinWriter {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.closed.store(true, Ordering::SeqCst);
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

async fn pump_stdin(client: Arc<Client>, id: u32, mut r: tokio::io::DuplexStream, closed: Arc<AtomicBool>) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let Ok(tx) = client.link(&Ctx::background().with_timeout(REQUEST_TIMEOUT)).await else {
                    return;
                };
                if tx.send(Message::Binary(frame(id, STDIN, &buf[..n]))).await.is_err() {
                    return;
                }
            }
        }
    }
    if closed.load(Ordering::SeqCst) && client.shared.lock().unwrap().procs.contains_key(&id) {
        let _ = client.tell(Request::StdinEnd { id }).await;
    }
}

/// A stream's sink and its reader's end.
fn sink() -> (Sink, mpsc::UnboundedReceiver<Chunk>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let room = Arc::new(tokio::sync::Semaphore::new(HELD_PER_STREAM));
    (Sink { tx, room }, rx)
}

/// Tell the runner what a process's readers took, the latest of each stream at once.
async fn pump_acks(client: Arc<Client>, id: u32, mut rx: mpsc::UnboundedReceiver<(u8, u64)>) {
    while let Some(first) = rx.recv().await {
        let mut latest: [Option<u64>; 2] = [None, None];
        let mut note = |(stream, seq): (u8, u64)| {
            if let Some(slot) = latest.get_mut((stream as usize).wrapping_sub(1)) {
                *slot = Some(slot.map_or(seq, |s| s.max(seq)));
            }
        };
        note(first);
        while let Ok(more) = rx.try_recv() {
            note(more);
        }
        for (stream, seq) in [(STDOUT, latest[0]), (STDERR, latest[1])] {
            let Some(seq) = seq else { continue };
            if !client.shared.lock().unwrap().procs.contains_key(&id) {
                return;
            }
            if client.tell(Request::Ack { id, stream, seq }).await.is_err() {
                // A drop: nothing to send again. The resume on the next connection says
                // `after`, the next byte this client expects, and the runner counts every byte
                // before it as acknowledged (this one's among them), with a free window.
                break;
            }
        }
    }
}

struct Control {
    client: Arc<Client>,
    id: u32,
    handle: u64,
    exit: Mutex<Option<oneshot::Receiver<Result<ExitStatus>>>>,
}

#[async_trait]
impl ProcessControl for Control {
    async fn wait(&self) -> Result<ExitStatus> {
        let rx = self.exit.lock().unwrap().take();
        match rx {
            Some(rx) => rx.await.unwrap_or_else(|_| Err(self.client.dropped())),
            None => Err(Error::unknown("wait was called twice")),
        }
    }

    async fn signal(&self, signal: i32) -> Result<()> {
        let name = wire_signal(signal)?;
        if !self.client.shared.lock().unwrap().procs.contains_key(&self.id) {
            return Ok(());
        }
        self.client
            .tell(Request::Kill {
                id: self.id,
                signal: Some(name.to_string()),
                handle: None,
            })
            .await
    }

    async fn resize(&self, rows: u16, cols: u16) -> Result<()> {
        let ctx = Ctx::background().with_timeout(REQUEST_TIMEOUT);
        Processes::resize(self.client.as_ref(), self.handle, rows, cols, &ctx).await
    }
}

/// A process's output as a byte stream. What it takes is acknowledged to the runner (under
/// flow control), so the runner sends more of this stream only as it is read.
struct ChanReader {
    rx: mpsc::UnboundedReceiver<Chunk>,
    /// The stream's room, given back as chunks are taken (never its sender: the stream ends
    /// when the process's entry lets go of that).
    room: Arc<tokio::sync::Semaphore>,
    stream: u8,
    acks: Option<mpsc::UnboundedSender<(u8, u64)>>,
    buf: Vec<u8>,
    pos: usize,
    seq: u64,
    taken: u64,
    /// Acknowledge once this much was taken ([`ack_every`] of the granted window).
    every: u64,
}

impl ChanReader {
    fn new(
        rx: mpsc::UnboundedReceiver<Chunk>,
        room: Arc<tokio::sync::Semaphore>,
        stream: u8,
        acks: Option<mpsc::UnboundedSender<(u8, u64)>>,
        window: u64,
    ) -> Self {
        ChanReader {
            rx,
            room,
            stream,
            acks,
            buf: Vec::new(),
            pos: 0,
            seq: 0,
            taken: 0,
            every: ack_every(window),
        }
    }

    /// The chunk in `buf` was read whole.
    fn finished_chunk(&mut self) {
        self.taken += self.buf.len() as u64;
        self.buf = Vec::new();
        self.pos = 0;
        if self.taken >= self.every {
            self.ack();
        }
    }

    /// Tell the runner what was taken, if anything was since the last time.
    fn ack(&mut self) {
        if self.seq > 0
            && self.taken > 0
            && let Some(a) = &self.acks
        {
            let _ = a.send((self.stream, self.seq));
            self.taken = 0;
        }
    }
}

impl AsyncRead for ChanReader {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        loop {
            if self.pos < self.buf.len() {
                let n = (self.buf.len() - self.pos).min(out.remaining());
                let start = self.pos;
                out.put_slice(&self.buf[start..start + n]);
                self.pos += n;
                return Poll::Ready(Ok(()));
            }
            if !self.buf.is_empty() {
                self.finished_chunk();
            }
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(c)) => {
                    self.room.add_permits(c.held as usize);
                    self.seq = c.end;
                    self.buf = c.bytes;
                    self.pos = 0;
                    if let Some(g) = c.gap {
                        return Poll::Ready(Err(g.into()));
                    }
                }
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => {
                    // All that came was taken: say so now, since more may wait on it.
                    self.ack();
                    return Poll::Pending;
                }
            }
        }
    }
}

impl Drop for ChanReader {
    /// A reader dropped before its end lets go of what it held, and says so, so the runner
    /// does not hold the process up for a reader that is gone.
    fn drop(&mut self) {
        self.rx.close();
        while let Ok(c) = self.rx.try_recv() {
            self.room.add_permits(c.held as usize);
            self.seq = c.end;
        }
        // Everything it held, and all that came, counts as taken.
        self.taken = self.taken.max(1);
        self.ack();
    }
}

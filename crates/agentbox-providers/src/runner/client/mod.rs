//! The client of one runner: one connection at a time carrying every process and file
//! operation of a box, opened at the first call and again after a drop. A drop ends nothing:
//! the client reconnects at once while it has processes running and resumes each from the
//! last output byte it got, so a process's output arrives whole across the drop. A `run`
//! whose answer the drop lost is sent again under the same key, which the runner answers
//! with the process it started (never a second one). Output the runner says it let go
//! reaches the reader as an [`OutputGap`], never silently.
//!
//! It is also the box's [`Processes`](agentbox_core::Processes): any host process lists, reads,
//! writes, signals and attaches to the processes of the box through its own client.
//!
//! A runner that speaks protocol 2 alone (the seed's, which refuses `hello`) is driven with
//! what protocol 2 offers ([`Client::protocol_2_only`]): a process is run through the shell,
//! its stdin, output, signals and exit carried as that protocol carries them, and whole files
//! read and written. What it has no message for is refused `unsupported`, naming protocol 2,
//! and its box hands out no [`Files`](agentbox_core::Files) and no
//! [`Processes`](agentbox_core::Processes), so hands goes by the box's exec instead. Such a
//! runner ends nothing when a connection drops, but it cannot resume a process either: a drop
//! ends the wait of each process this client ran there with `gone`.
//!
//! This file holds the connection's state: opening it, asking and answering, and routing what
//! it brings; `exec` a process's I/O, `files` the box's files, `processes` the box's kept
//! processes.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use agentbox_core::{Ctx, Error, ErrorCode, ExitStatus, OutputChunk, OutputGap, Result, Stream};

use agentbox_protocol::runner::{
    Answer, EXTENDED, FILE, Message, ProcExit, Request, STDERR, STDOUT, frame, signal_name, unframe, unframe_seq,
};
use tokio::sync::{mpsc, oneshot};

use super::link::{Dial, Link};

mod exec;
mod files;
mod processes;

/// How long one request may wait for its answer unless its context says less.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the client keeps trying to reach its runner again after a drop, while processes
/// wait for their output.
const RECONNECT_FOR: Duration = Duration::from_secs(60);
/// The flow-control window asked of the runner: at most this many bytes of a process's
/// output sent and not yet taken by its reader. A reader that stops reading holds up its own
/// process at the runner, never this connection's other processes and file operations.
pub(super) const WINDOW: u64 = 1 << 20;
/// A reader acknowledges what it took once this much of the granted window has gathered, and
/// whenever it has taken all that came (so a small window, or a runner at its bound for
/// another reason, never waits on an acknowledgement the reader holds back).
fn ack_every(window: u64) -> u64 {
    (window / 4).max(1)
}
/// Bytes held per stream for a reader that has not taken them: room for a whole window and
/// the chunk in flight past it, so a runner that keeps its window never waits on it. A runner
/// without flow control (or one that ignores it) is bounded here instead, and then a slow
/// reader holds the connection up, as it did before flow control.
const HELD_PER_STREAM: usize = 2 * WINDOW as usize + (64 << 10);

enum Reply {
    Answer(Answer),
    File(Vec<u8>),
    Lost,
}

/// One chunk of a process's output on its way to the reader, or the news of a gap.
struct Chunk {
    /// The number one past its last byte (what the reader acknowledges once it took it).
    end: u64,
    bytes: Vec<u8>,
    /// Of its stream's room ([`HELD_PER_STREAM`]), given back when the reader takes it.
    held: u32,
    /// Output was let go before this chunk: the reader is told first.
    gap: Option<OutputGap>,
}

/// Where one stream of a process's output goes.
#[derive(Clone)]
struct Sink {
    tx: mpsc::UnboundedSender<Chunk>,
    room: Arc<tokio::sync::Semaphore>,
}

struct Proc {
    handle: Option<u64>,
    /// The `run` that starts it, sent again (same key) when a drop lost its answer; `None`
    /// for a process this client attached to.
    run: Option<Request>,
    /// The number of the next output byte it expects.
    last: u64,
    out: Sink,
    err: Sink,
    /// What readers took (stream, seq), for the runner: see [`WINDOW`].
    acks: mpsc::UnboundedSender<(u8, u64)>,
    started: Option<oneshot::Sender<Result<u64>>>,
    exit: Option<oneshot::Sender<Result<ExitStatus>>>,
    /// Forget it at the runner once its exit is seen (a process this client ran, not detached).
    forget: bool,
    /// The deadline it was given in the box, for the message when it passed.
    timeout_ms: Option<u64>,
}

/// What a reader that does not hold its process (a [`Processes::read`]) is sent.
enum Seen {
    /// Where the output goes on from; on the answer to the resume, also where it had reached
    /// and whether the process had ended.
    Resumed(u64, Option<(u64, bool)>),
    Output(OutputChunk),
    Exit(ProcExit),
    Error(Error),
}

#[derive(Default)]
struct Shared {
    waiting: HashMap<u32, oneshot::Sender<Reply>>,
    procs: HashMap<u32, Proc>,
    /// Readers that do not hold their process, by id.
    watching: HashMap<u32, mpsc::UnboundedSender<Seen>>,
}

struct Conn {
    tx: mpsc::Sender<Message>,
    alive: Arc<AtomicBool>,
}

/// An open connection's sender, and whether it is still the live one.
type Opened = (mpsc::Sender<Message>, Arc<AtomicBool>);

/// A connection to one runner, shared by every call on its box.
pub struct Client {
    dial: Arc<dyn Dial>,
    conn: tokio::sync::Mutex<Option<Conn>>,
    /// Whether the runner granted flow control (its hello carried a window).
    flow: AtomicBool,
    /// The window the runner granted (0 without flow control).
    granted: std::sync::atomic::AtomicU64,
    /// The pid of the runner last reached (0 before the first), which names it.
    runner_pid: AtomicU32,
    /// The runner refused `hello`: it speaks protocol 2 alone (see the module's documentation).
    protocol_2: AtomicBool,
    shared: Arc<Mutex<Shared>>,
    next_id: AtomicU32,
    me: Weak<Client>,
    closed: Mutex<Option<String>>,
    instance: std::sync::OnceLock<u32>,
    /// The box's deadline as last known, in ms since the epoch (0: unknown): a runner that
    /// cannot be reached again past it ended with its box, and a process's end says so.
    ends_at_ms: std::sync::atomic::AtomicU64,
}

/// Every client of this process, for [`drop_connections`].
static CLIENTS: Mutex<Vec<Weak<Client>>> = Mutex::new(Vec::new());

/// Close the current connection of every client in this process whose runner's address
/// holds `matching` (a box's name), as a network fault would: each reconnects and resumes its
/// processes (for tests of resumption through any provider).
#[doc(hidden)]
pub async fn drop_connections(matching: &str) {
    let live: Vec<Arc<Client>> = {
        let mut all = CLIENTS.lock().unwrap();
        all.retain(|c| c.strong_count() > 0);
        all.iter()
            .filter_map(Weak::upgrade)
            .filter(|c| c.describe().contains(matching))
            .collect()
    };
    for c in live {
        c.drop_connection().await;
    }
}

impl Client {
    /// A client that reaches its runner through `dial`. Nothing is opened until the first call.
    pub fn new(dial: Arc<dyn Dial>) -> Arc<Self> {
        let c = Client::make(dial);
        let mut all = CLIENTS.lock().unwrap();
        all.retain(|c| c.strong_count() > 0);
        all.push(Arc::downgrade(&c));
        c
    }

    fn make(dial: Arc<dyn Dial>) -> Arc<Self> {
        Arc::new_cyclic(|me| Client {
            dial,
            conn: tokio::sync::Mutex::new(None),
            flow: AtomicBool::new(false),
            granted: std::sync::atomic::AtomicU64::new(0),
            runner_pid: AtomicU32::new(0),
            protocol_2: AtomicBool::new(false),
            shared: Arc::new(Mutex::new(Shared::default())),
            next_id: AtomicU32::new(1),
            me: me.clone(),
            closed: Mutex::new(None),
            instance: std::sync::OnceLock::new(),
            ends_at_ms: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The box's deadline as its facts state it (`None`: unknown), for what a process that
    /// outlives it is told.
    pub fn set_deadline(&self, ends_at_ms: Option<u64>) {
        self.ends_at_ms.store(ends_at_ms.unwrap_or(0), Ordering::Relaxed);
    }

    /// The box's deadline when it has passed: the runner ended with its box.
    fn lifetime_passed(&self) -> Option<u64> {
        let ends = self.ends_at_ms.load(Ordering::Relaxed);
        (ends > 0 && agentbox_core::now_ms() >= ends).then_some(ends)
    }

    /// Where the runner is, for messages.
    pub fn describe(&self) -> String {
        self.dial.describe()
    }

    /// Whether the runner, as last reached, speaks protocol 2 alone (it refused `hello`).
    /// False before the first connection.
    pub fn protocol_2_only(&self) -> bool {
        self.protocol_2.load(Ordering::Relaxed)
    }

    /// What a protocol-2 runner cannot do, refused before anything is sent.
    fn refused_by_protocol_2(&self, what: &str) -> Error {
        Error::unsupported(format!(
            "{what}: {} speaks protocol 2 only (the seed's runner), which has no message for it",
            self.describe()
        ))
    }

    /// Open the connection if none is open (the runner's answer to `hello` is its first word).
    pub async fn connect(&self, ctx: &Ctx) -> Result<()> {
        self.link(ctx).await.map(|_| ())
    }

    fn id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A key for a `run` no other client of any host chooses: this process, this client, this id.
    fn key(&self, id: u32) -> String {
        static CLIENTS: AtomicU32 = AtomicU32::new(0);
        static BOOT: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
        let boot = BOOT.get_or_init(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        });
        let me = *self.instance.get_or_init(|| CLIENTS.fetch_add(1, Ordering::Relaxed));
        format!("{}-{boot:x}-{me}-{id}", std::process::id())
    }

    /// Close for good: every later call fails `gone` with `why`, and what waits is told so.
    pub async fn close(&self, why: String) {
        *self.closed.lock().unwrap() = Some(why.clone());
        *self.conn.lock().await = None;
        let mut sh = self.shared.lock().unwrap();
        for (_, w) in sh.waiting.drain() {
            let _ = w.send(Reply::Lost);
        }
        for (_, w) in sh.watching.drain() {
            let _ = w.send(Seen::Error(Error::gone(why.clone())));
        }
        drop(sh);
        self.lose_all(why);
    }

    /// Every process this client ran or attached to ended: each is told `gone` with `why`.
    fn lose_all(&self, why: String) {
        let mut sh = self.shared.lock().unwrap();
        for (_, mut p) in sh.procs.drain() {
            if let Some(x) = p.exit.take() {
                let _ = x.send(Err(Error::gone(why.clone())));
            }
            if let Some(s) = p.started.take() {
                let _ = s.send(Err(Error::gone(why.clone())));
            }
        }
    }

    /// Close the current connection, as a network fault would (for tests of resumption).
    #[doc(hidden)]
    pub async fn drop_connection(&self) {
        *self.conn.lock().await = None;
    }

    /// The current connection, opened (and its processes resumed) if there is none. Boxed,
    /// because the task that reads a connection calls it again after a drop.
    fn link<'a>(
        &'a self,
        ctx: &'a Ctx,
    ) -> Pin<Box<dyn std::future::Future<Output = Result<mpsc::Sender<Message>>> + Send + 'a>> {
        Box::pin(async move { self.open(ctx).await.map(|(tx, _)| tx) })
    }

    /// [`Client::link`], with the connection's liveness: a caller that registers a process
    /// after it got the connection learns whether that connection dropped meanwhile (its
    /// reader then never hears of the process).
    fn link_alive<'a>(
        &'a self,
        ctx: &'a Ctx,
    ) -> Pin<Box<dyn std::future::Future<Output = Result<Opened>> + Send + 'a>> {
        Box::pin(self.open(ctx))
    }

    async fn open(&self, ctx: &Ctx) -> Result<Opened> {
        if let Some(why) = self.closed.lock().unwrap().clone() {
            return Err(Error::gone(why));
        }
        let mut g = self.conn.lock().await;
        if let Some(c) = g.as_ref()
            && c.alive.load(Ordering::Relaxed)
        {
            return Ok((c.tx.clone(), c.alive.clone()));
        }
        *g = None;
        let Link { tx, mut rx } = self.dial.dial(ctx).await?;
        let hello = self.id();
        send(
            &tx,
            &Request::Hello {
                id: hello,
                protocol: EXTENDED,
                window: Some(WINDOW),
            },
        )
        .await?;
        let first = ctx
            .run(tokio::time::timeout(Duration::from_secs(30), rx.recv()))
            .await?;
        // The protocol this connection speaks: 2 where the runner refused hello.
        let legacy = match first {
            Ok(Some(Message::Text(t))) => match serde_json::from_str::<Answer>(&t) {
                Ok(Answer::Hello {
                    protocol, window, pid, ..
                }) if protocol >= EXTENDED => {
                    // Another runner than the last one (it died, and the box started a new
                    // one): the processes of this client ended with the old one, and their
                    // handles and keys mean nothing to the new one (a `run` sent again would
                    // run a second time).
                    let before = self.runner_pid.swap(pid, Ordering::SeqCst);
                    if before != 0 && before != pid {
                        tracing::warn!(runner = %self.describe(), old = before, new = pid, "the runner was started again: its processes are gone");
                        self.lose_all(format!(
                            "{} was started again (pid {before}, now {pid}): the processes it ran ended with it",
                            self.describe()
                        ));
                    }
                    if window.is_none() {
                        tracing::warn!(
                            runner = %self.describe(),
                            "the runner has no flow control (an older runner): a reader that stops reading holds up the connection"
                        );
                    }
                    self.flow.store(window.is_some(), Ordering::Relaxed);
                    self.granted.store(window.unwrap_or(0), Ordering::Relaxed);
                    false
                }
                Ok(Answer::Hello { protocol, .. }) => {
                    return Err(Error::unsupported(format!(
                        "{} speaks protocol {protocol}: agentbox needs {EXTENDED}",
                        self.describe()
                    )));
                }
                // Hello refused as a request it does not know (the error names the hello, or
                // nothing): a runner of protocol 2 alone (the seed's), driven with what that
                // protocol offers.
                Ok(Answer::Error { id, .. }) if id.is_none() || id == Some(hello) => {
                    self.flow.store(false, Ordering::Relaxed);
                    self.granted.store(0, Ordering::Relaxed);
                    true
                }
                _ => {
                    return Err(Error::unsupported(format!(
                        "{} answered hello with {t:?}, which is no answer of protocol 2 or 3",
                        self.describe()
                    )));
                }
            },
            Ok(_) => {
                return Err(Error::transfer_failed(format!(
                    "{} closed as it opened",
                    self.describe()
                )));
            }
            Err(_) => {
                return Err(Error::timeout(format!(
                    "{} did not answer hello within 30s",
                    self.describe()
                )));
            }
        };
        let was = self.protocol_2.swap(legacy, Ordering::SeqCst);
        if legacy && !was {
            tracing::info!(runner = %self.describe(), "the runner refused hello: it speaks protocol 2 only, and is driven with what that protocol offers");
        }
        if was != legacy {
            // Another runner than the last one: nothing this client ran there goes on here,
            // and a `run` of one protocol means nothing (or runs again) in the other.
            self.lose_all(format!(
                "{} was replaced by a runner of protocol {}: the processes the last one ran are not reached through it",
                self.describe(),
                if legacy { 2 } else { EXTENDED }
            ));
        }
        // Processes started before the drop: resume those that had started from the byte each
        // expects next (which acknowledges, at the runner, every byte before it: the window
        // starts free, whatever acks the drop lost), and send again the `run` of those whose answer was lost (its key makes
        // it the same process). Readers that do not hold theirs are told of the drop.
        type Resume = (u32, u64, u64);
        if legacy {
            // Nothing can be resumed, and a `run` sent again would run twice.
            self.lose_all(format!(
                "the connection to {} dropped, and a runner of protocol 2 cannot resume a process",
                self.describe()
            ));
        }
        let (again, resume, watching): (Vec<Request>, Vec<Resume>, Vec<_>) = {
            let mut sh = self.shared.lock().unwrap();
            let again = sh
                .procs
                .values()
                .filter(|p| p.handle.is_none())
                .filter_map(|p| p.run.clone())
                // Only a keyed `run` is the same process when sent again.
                .filter(|r| matches!(r, Request::Run { key: Some(_), .. }))
                .collect();
            let resume = sh
                .procs
                .iter()
                .filter_map(|(id, p)| Some((*id, p.handle?, p.last)))
                .collect();
            (again, resume, sh.watching.drain().collect())
        };
        for (_, w) in watching {
            let _ = w.send(Seen::Error(Error::transfer_failed(format!(
                "the connection to {} dropped",
                self.describe()
            ))));
        }
        for run in again {
            send(&tx, &run).await?;
        }
        for (id, handle, after) in resume {
            send(
                &tx,
                &Request::Resume {
                    id,
                    handle: Some(handle),
                    key: None,
                    after,
                    hold: None,
                    window: None,
                },
            )
            .await?;
        }
        let alive = Arc::new(AtomicBool::new(true));
        tokio::spawn(read(
            rx,
            self.shared.clone(),
            tx.downgrade(),
            alive.clone(),
            self.me.clone(),
            legacy,
        ));
        *g = Some(Conn {
            tx: tx.clone(),
            alive: alive.clone(),
        });
        Ok((tx, alive))
    }

    /// Send one request (and the file bytes that follow it) and wait for its answer.
    async fn ask(&self, req: impl FnOnce(u32) -> Request, bytes: Option<&[u8]>, ctx: &Ctx) -> Result<Reply> {
        self.ask_on(req, bytes.map(|b| (FILE, b)), ctx).await
    }

    /// [`Client::ask`] with the bytes that follow on a stream of the caller's choosing.
    async fn ask_on(&self, req: impl FnOnce(u32) -> Request, bytes: Option<(u8, &[u8])>, ctx: &Ctx) -> Result<Reply> {
        let tx = self.link(ctx).await?;
        let id = self.id();
        let req = req(id);
        if req.is_extended() && self.protocol_2_only() {
            return Err(self.refused_by_protocol_2(req.op()));
        }
        let (rtx, rrx) = oneshot::channel();
        self.shared.lock().unwrap().waiting.insert(id, rtx);
        let sent = async {
            send(&tx, &req).await?;
            if let Some((stream, b)) = bytes {
                tx.send(Message::Binary(frame(id, stream, b)))
                    .await
                    .map_err(|_| self.dropped())?;
            }
            Ok::<_, Error>(())
        }
        .await;
        if let Err(e) = sent {
            self.shared.lock().unwrap().waiting.remove(&id);
            return Err(e);
        }
        let wait = tokio::time::timeout(ctx.remaining().unwrap_or(REQUEST_TIMEOUT).min(REQUEST_TIMEOUT), rrx);
        let r = ctx.run(wait).await;
        self.shared.lock().unwrap().waiting.remove(&id);
        match r? {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(self.dropped()),
            Err(_) => Err(Error::timeout(format!(
                "{} did not answer within {}s",
                self.describe(),
                REQUEST_TIMEOUT.as_secs()
            ))),
        }
    }

    fn dropped(&self) -> Error {
        if let Some(why) = self.closed.lock().unwrap().clone() {
            return Error::gone(why);
        }
        Error::transfer_failed(format!("the connection to {} dropped", self.describe()))
    }

    async fn tell(&self, req: Request) -> Result<()> {
        let tx = self.link(&Ctx::background().with_timeout(REQUEST_TIMEOUT)).await?;
        send(&tx, &req).await
    }
}

async fn send(tx: &mpsc::Sender<Message>, req: &Request) -> Result<()> {
    let t = serde_json::to_string(req).map_err(|e| Error::unknown(format!("a request did not serialise: {e}")))?;
    tx.send(Message::Text(t))
        .await
        .map_err(|_| Error::transfer_failed("the connection to the runner dropped"))
}

/// Route what one connection brings until it drops; then, while processes wait, reconnect.
async fn read(
    mut rx: mpsc::Receiver<Message>,
    shared: Arc<Mutex<Shared>>,
    tx: mpsc::WeakSender<Message>,
    alive: Arc<AtomicBool>,
    client: Weak<Client>,
    protocol_2: bool,
) {
    while let Some(m) = rx.recv().await {
        match m {
            Message::Binary(b) => {
                let Some((id, stream, _)) = unframe(&b) else {
                    tracing::warn!(
                        bytes = b.len(),
                        "the runner sent a binary frame shorter than its header: dropped"
                    );
                    continue;
                };
                if stream == FILE {
                    if let Some(w) = shared.lock().unwrap().waiting.remove(&id) {
                        let _ = w.send(Reply::File(b[5..].to_vec()));
                    }
                    continue;
                }
                let (seq, bytes) = if protocol_2 {
                    // Protocol 2 numbers no byte: each frame follows the last.
                    let last = shared.lock().unwrap().procs.get(&id).map_or(0, |p| p.last);
                    (last, &b[5..])
                } else {
                    let Some((_, _, seq, bytes)) = unframe_seq(&b) else {
                        tracing::warn!(
                            id,
                            stream,
                            bytes = b.len(),
                            "the runner sent an output frame shorter than its header: dropped"
                        );
                        continue;
                    };
                    (seq, bytes)
                };
                // The stream's room first (it may wait for the reader), then, under the lock, the
                // check against the next byte expected and the hand-over at once: a connection
                // that dropped may still be applying its last frames while the next one replays
                // them, and only one order of application and delivery keeps the bytes in order.
                let sink = {
                    let mut sh = shared.lock().unwrap();
                    if let Some(w) = sh.watching.get(&id) {
                        let stream = if stream == STDERR {
                            Stream::Stderr
                        } else {
                            Stream::Stdout
                        };
                        let _ = w.send(Seen::Output(OutputChunk {
                            seq,
                            stream,
                            bytes: bytes.to_vec(),
                        }));
                        continue;
                    }
                    let Some(p) = sh.procs.get_mut(&id) else { continue };
                    // Bytes already got (replayed after a resume) are skipped.
                    if seq + bytes.len() as u64 <= p.last {
                        continue;
                    }
                    match stream {
                        STDOUT => p.out.clone(),
                        STDERR => p.err.clone(),
                        other => {
                            tracing::warn!(
                                id,
                                stream = other,
                                "the runner sent output on a stream that is not stdout or stderr: dropped"
                            );
                            continue;
                        }
                    }
                };
                // Bounded whatever the runner does; under flow control this never waits.
                let held = bytes.len().clamp(1, HELD_PER_STREAM) as u32;
                match sink.room.clone().acquire_many_owned(held).await {
                    Ok(p) => p.forget(),
                    Err(_) => continue,
                }
                let mut sh = shared.lock().unwrap();
                let Some(p) = sh.procs.get_mut(&id) else {
                    sink.room.add_permits(held as usize);
                    continue;
                };
                let end = seq + bytes.len() as u64;
                if end <= p.last {
                    // Another connection delivered these while this one waited for room.
                    sink.room.add_permits(held as usize);
                    continue;
                }
                // A frame past the next byte expected means bytes were lost, though the
                // runner did not say so: the reader is told all the same.
                let gap = (seq > p.last).then_some(OutputGap {
                    after: p.last,
                    from: seq,
                });
                let skip = p.last.saturating_sub(seq) as usize;
                p.last = end;
                let chunk = Chunk {
                    end,
                    bytes: bytes[skip..].to_vec(),
                    held,
                    gap,
                };
                // A reader that was dropped is no error: its bytes are let go, and taken as read.
                if sink.tx.send(chunk).is_err() {
                    sink.room.add_permits(held as usize);
                    let _ = p.acks.send((stream, end));
                }
            }
            Message::Text(t) => {
                let a = match serde_json::from_str::<Answer>(&t) {
                    Ok(a) => a,
                    Err(e) => {
                        let head: String = t.chars().take(120).collect();
                        tracing::warn!(error = %e, frame = %head, "the runner sent a text frame that is no answer: dropped");
                        continue;
                    }
                };
                route(&shared, a, &tx, protocol_2).await;
            }
        }
    }
    alive.store(false, Ordering::Relaxed);
    let (waiting, watching, running) = {
        let mut sh = shared.lock().unwrap();
        (
            std::mem::take(&mut sh.waiting),
            std::mem::take(&mut sh.watching),
            !sh.procs.is_empty(),
        )
    };
    for (_, w) in waiting {
        let _ = w.send(Reply::Lost);
    }
    for (_, w) in watching {
        let _ = w.send(Seen::Error(Error::transfer_failed(
            "the connection to the runner dropped",
        )));
    }
    if !running {
        return;
    }
    if protocol_2 {
        // Nothing to resume them with: each process's wait hears of the drop now.
        if let Some(c) = client.upgrade() {
            c.lose_all(format!(
                "the connection to {} dropped, and a runner of protocol 2 cannot resume a process",
                c.describe()
            ));
        }
        return;
    }
    // Processes wait for output and exits: reach the runner again now, not at the next call.
    let started = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(50);
    loop {
        let Some(c) = client.upgrade() else { return };
        if !alive_procs(&shared) {
            return;
        }
        match c.link(&Ctx::background().with_timeout(Duration::from_secs(10))).await {
            Ok(_) => return,
            Err(e)
                if started.elapsed() > RECONNECT_FOR
                    || e.code() == ErrorCode::Unsupported
                    || c.lifetime_passed().is_some() =>
            {
                // Past the box's deadline the runner ended with its box: that is the reason,
                // not the refused connection.
                let message = match c.lifetime_passed() {
                    Some(ends) => format!(
                        "the box reached its lifetime at {}, which ended the program ({})",
                        agentbox_core::rfc3339(i64::try_from(ends).unwrap_or(i64::MAX)),
                        c.describe()
                    ),
                    None => format!("the runner could not be reached again after a drop: {e}"),
                };
                let mut sh = shared.lock().unwrap();
                for (_, mut p) in sh.procs.drain() {
                    let why = Error::new(ErrorCode::Gone, message.clone());
                    if let Some(x) = p.exit.take() {
                        let _ = x.send(Err(why));
                    }
                }
                return;
            }
            Err(_) => {}
        }
        drop(c);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

fn alive_procs(shared: &Mutex<Shared>) -> bool {
    !shared.lock().unwrap().procs.is_empty()
}

async fn route(shared: &Mutex<Shared>, a: Answer, tx: &mpsc::WeakSender<Message>, protocol_2: bool) {
    // A reader that does not hold its process gets what concerns it as it comes.
    let id = match &a {
        Answer::Resumed { id, .. } | Answer::Exit { id, .. } | Answer::Error { id: Some(id), .. } => Some(*id),
        _ => None,
    };
    if let Some(id) = id {
        let sh = shared.lock().unwrap();
        if let Some(w) = sh.watching.get(&id) {
            let seen = match a {
                Answer::Resumed { from, end, ended, .. } => Seen::Resumed(from, end.map(|e| (e, ended))),
                Answer::Exit {
                    code, signal, timeout, ..
                } => Seen::Exit(ProcExit { code, signal, timeout }),
                Answer::Error { message, code, .. } => Seen::Error(Error::new(code_of(code.as_deref()), message)),
                _ => return,
            };
            let _ = w.send(seen);
            return;
        }
    }
    match a {
        Answer::Started { id, handle, .. } => {
            let mut sh = shared.lock().unwrap();
            if let Some(p) = sh.procs.get_mut(&id) {
                p.handle = Some(handle);
                if let Some(s) = p.started.take() {
                    let _ = s.send(Ok(handle));
                }
            }
        }
        Answer::Exit {
            id,
            code,
            signal,
            timeout,
        } => {
            let p = shared.lock().unwrap().procs.remove(&id);
            if let Some(mut p) = p {
                if let Some(x) = p.exit.take() {
                    let r = if timeout {
                        Err(Error::timeout(format!(
                            "the program passed its {} deadline in the box, which killed it (exit {code})",
                            p.timeout_ms
                                .map(|ms| format!("{}ms", ms))
                                .unwrap_or_else(|| "given".into())
                        )))
                    } else {
                        Ok(ExitStatus { code, signal })
                    };
                    let _ = x.send(r);
                }
                // Seen: the runner may let go of what it kept (a detached process's output
                // stays for whoever reads it next). Protocol 2 keeps nothing past the exit.
                if !protocol_2 && let Some(tx) = tx.upgrade() {
                    let req = if p.forget {
                        Request::Forget { id, handle: None }
                    } else {
                        Request::Release { id }
                    };
                    let _ = send(&tx, &req).await;
                }
            }
        }
        Answer::Resumed { id, from, handle, .. } => {
            let mut sh = shared.lock().unwrap();
            if let Some(p) = sh.procs.get_mut(&id) {
                if let Some(h) = handle {
                    p.handle = Some(h);
                }
                if let Some(s) = p.started.take() {
                    let _ = s.send(Ok(handle.unwrap_or_default()));
                }
                // The runner let go of output this reader had not got: both of its streams'
                // readers are told, before the bytes that follow.
                if from > p.last {
                    let gap = OutputGap { after: p.last, from };
                    p.last = from;
                    for sink in [&p.out, &p.err] {
                        let _ = sink.tx.send(Chunk {
                            end: from,
                            bytes: Vec::new(),
                            held: 0,
                            gap: Some(gap),
                        });
                    }
                }
            }
        }
        Answer::Error {
            id: Some(id),
            message,
            code,
            errno,
        } => {
            let mut sh = shared.lock().unwrap();
            if let Some(w) = sh.waiting.remove(&id) {
                let _ = w.send(Reply::Answer(Answer::Error {
                    id: Some(id),
                    message,
                    code,
                    errno,
                }));
            } else if let Some(mut p) = sh.procs.remove(&id) {
                let e = Error::new(code_of(code.as_deref()), message);
                if let Some(s) = p.started.take() {
                    let _ = s.send(Err(e));
                } else if let Some(x) = p.exit.take() {
                    // A protocol-2 `run` is never answered `started`: its refusal comes here.
                    let _ = x.send(Err(if protocol_2 {
                        e
                    } else {
                        Error::gone(format!("the runner lost the process: {e}"))
                    }));
                }
            }
        }
        Answer::Error { id: None, .. } => {}
        other => {
            let id = match &other {
                Answer::Absent { id }
                | Answer::Ok { id }
                | Answer::Hello { id, .. }
                | Answer::Stat { id, .. }
                | Answer::Entries { id, .. }
                | Answer::Processes { id, .. } => *id,
                _ => return,
            };
            if let Some(w) = shared.lock().unwrap().waiting.remove(&id) {
                let _ = w.send(Reply::Answer(other));
            }
        }
    }
}

/// A signal's name on the wire, or `invalid` for one the runner does not send.
fn wire_signal(signal: i32) -> Result<&'static str> {
    signal_name(signal).ok_or_else(|| Error::invalid(format!("signal {signal}: not one the runner sends")))
}

/// The contract's code for a runner's error code (its own names, or an errno's name).
fn code_of(code: Option<&str>) -> ErrorCode {
    ErrorCode::from_wire(code.unwrap_or("unknown"))
}

//! One process of the runner: a task that owns the child, its pipes and the numbered tail of
//! its output, and sends that output to whichever connection the process is attached to.
//!
//! A connection whose hello set a flow-control window gets at most that many bytes of the
//! process's output past what its reader acknowledged (`ack`, per stream), and nothing it was
//! sent is let go before it is acknowledged: a reader that stops reading holds up only this
//! process (its buffer fills, then its pipes), and one that drops and resumes loses nothing.
//!
//! A process outlives its connection. Started by a protocol-3 connection, it keeps up to
//! `max_buffered` bytes of output that no connection has taken, then stops reading its pipes
//! (the program blocks on a full pipe) until a client resumes it: nothing is lost. Started by a
//! protocol-2 connection, which cannot resume, its output goes nowhere once that connection
//! drops. Either way only `kill`, `stop` or its own exit ends it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use agentbox_protocol::runner::{Answer, Message, STDERR, STDOUT, frame, frame_seq};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Child;
use tokio::sync::mpsc;

/// How long output may still arrive after a process exits (a pipe's last bytes) before its
/// exit is answered. A program it left running that holds the pipe is not waited for.
const DRAIN: Duration = Duration::from_millis(100);

/// A connection's end that a process sends to.
#[derive(Clone)]
pub(super) struct Attachment {
    /// The connection's number in this runner.
    pub conn: u64,
    /// The id the process has on that connection.
    pub id: u32,
    /// Whether the connection speaks protocol 3 (numbered output frames, `signal` in `exit`).
    pub extended: bool,
    /// The connection's flow-control window: at most this many bytes sent and not yet
    /// acknowledged. `None`: the connection takes whatever comes.
    pub window: Option<u64>,
    /// The connection's outgoing messages.
    pub tx: mpsc::Sender<Message>,
}

/// What a connection asks of a process.
pub(super) enum Command {
    /// Send output to this connection from sequence number `after + 1` on, answering
    /// `resumed` first.
    Attach(Attachment, u64),
    /// The connection dropped.
    Detach(u64),
    /// The client saw the exit: free what is kept.
    Forget,
    /// The client's reader on connection `.0` took stream `.1` up to sequence number `.2`.
    Ack(u64, u8, u64),
}

/// The numbered tail of a process's output.
struct Output {
    chunks: VecDeque<(u64, u8, Vec<u8>)>,
    bytes: usize,
    next: u64,
    max: usize,
}

impl Output {
    fn last(&self) -> u64 {
        self.next - 1
    }
    fn first(&self) -> u64 {
        self.chunks.front().map(|c| c.0).unwrap_or(self.next)
    }
    fn push(&mut self, stream: u8, bytes: &[u8]) {
        self.bytes += bytes.len();
        self.chunks.push_back((self.next, stream, bytes.to_vec()));
        self.next += 1;
    }
    fn get(&self, seq: u64) -> Option<&(u64, u8, Vec<u8>)> {
        self.chunks.get(seq.checked_sub(self.first())? as usize)
    }
    fn get_mut(&mut self, seq: u64) -> Option<&mut (u64, u8, Vec<u8>)> {
        let i = seq.checked_sub(self.first())? as usize;
        self.chunks.get_mut(i)
    }
    /// Drop chunks up to `sent` while at or over the bound, so there is room to read again
    /// (all of them when nothing resumes).
    fn trim(&mut self, sent: u64, keep: bool) {
        while let Some(front) = self.chunks.front() {
            if front.0 > sent || (keep && self.bytes < self.max) {
                break;
            }
            self.bytes -= front.2.len();
            self.chunks.pop_front();
        }
    }
    fn room(&self) -> bool {
        self.bytes < self.max
    }
    /// Drop the chunks at the front that their stream's reader acknowledged.
    fn trim_acked(&mut self, acked: &Acked) {
        while let Some(front) = self.chunks.front() {
            if !acked.covers(front.0, front.1) {
                break;
            }
            self.bytes -= front.2.len();
            self.chunks.pop_front();
        }
    }
}

/// What a flow-controlled client acknowledged: per stream, the highest sequence number its
/// reader took, and the bytes sent that it has not.
#[derive(Default)]
struct Acked {
    out: u64,
    err: u64,
    unacked: u64,
}

impl Acked {
    fn of(&mut self, stream: u8) -> Option<&mut u64> {
        match stream {
            STDOUT => Some(&mut self.out),
            STDERR => Some(&mut self.err),
            _ => None,
        }
    }
    fn covers(&self, seq: u64, stream: u8) -> bool {
        match stream {
            STDOUT => seq <= self.out,
            STDERR => seq <= self.err,
            _ => true,
        }
    }
    /// Stream `stream` taken up to `seq` (of what was sent): free its bytes in the window and
    /// in the buffer. A chunk taken behind one of the other stream that is not yet taken is
    /// emptied in place (its number kept): left whole, such chunks could fill the buffer, stop
    /// the pipes, and starve the other reader of the bytes it waits for before it acks.
    fn ack(&mut self, out: &mut Output, stream: u8, seq: u64, sent: u64) {
        let seq = seq.min(sent);
        let Some(from) = self.of(stream).map(|a| *a + 1) else {
            return;
        };
        if seq < from {
            return;
        }
        for n in from.max(out.first())..=seq {
            if let Some((_, st, bytes)) = out.get_mut(n)
                && *st == stream
            {
                let len = bytes.len();
                self.unacked = self.unacked.saturating_sub(len as u64);
                *bytes = Vec::new();
                out.bytes -= len;
            }
        }
        if let Some(a) = self.of(stream) {
            *a = seq;
        }
    }
    /// After a resume from `sent`: what was sent and not acknowledged is in the window.
    fn recount(&mut self, out: &Output, sent: u64) {
        self.unacked = out
            .chunks
            .iter()
            .take_while(|c| c.0 <= sent)
            .filter(|c| !self.covers(c.0, c.1))
            .map(|c| c.2.len() as u64)
            .sum();
    }
}

/// The exit code and signal of a status.
fn code_of(st: std::process::ExitStatus) -> (i32, Option<i32>) {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(c), _) => (c, None),
        (None, Some(s)) => (128 + s, Some(s)),
        _ => (255, None),
    }
}

/// What the runner's table knows of a running process task.
pub(super) struct Handle {
    /// The task's commands.
    pub tx: mpsc::Sender<Command>,
    /// The process group to signal (the program leads it).
    pub pgid: i32,
    /// Whether it ended and a client was told: the first to go when the table is full.
    pub delivered: Arc<AtomicBool>,
    /// Its stdin's writer (`None` ends it), for whichever connection resumes it.
    pub stdin: Option<mpsc::Sender<Option<Vec<u8>>>>,
    /// Whether it ended and its exit went to its connection (or it has none): what `stop`
    /// waits for before it answers, so a client hears each exit before `ok`.
    pub settled: Arc<AtomicBool>,
}

/// What a process task starts from.
pub(super) struct Task {
    /// The program, spawned with piped stdout and stderr.
    pub child: Child,
    /// Started by a protocol-3 connection: its output is kept for a resume.
    pub resumable: bool,
    /// Output bytes kept that no client has taken.
    pub max_buffered: usize,
    /// The connection that started it.
    pub first: Attachment,
    /// Commands from connections.
    pub rx: mpsc::Receiver<Command>,
    /// Set once its exit went to a client.
    pub delivered: Arc<AtomicBool>,
    /// Set once it ended and its exit went out (or had nowhere to go).
    pub settled: Arc<AtomicBool>,
}

/// Run the process task until the process ended and its exit reached a client that keeps it
/// no longer (or it was forgotten). `done` runs last, to take it out of the runner's table.
pub(super) async fn run(task: Task, done: impl FnOnce()) {
    let Task {
        mut child,
        resumable,
        max_buffered,
        first,
        mut rx,
        delivered,
        settled,
    } = task;
    let mut stdout: Option<Box<dyn AsyncRead + Unpin + Send>> = child.stdout.take().map(|s| Box::new(s) as _);
    let mut stderr: Option<Box<dyn AsyncRead + Unpin + Send>> = child.stderr.take().map(|s| Box::new(s) as _);
    let mut out = Output {
        chunks: VecDeque::new(),
        bytes: 0,
        next: 1,
        max: max_buffered.max(1),
    };
    let mut at: Option<Attachment> = Some(first);
    let mut sent = 0u64;
    let mut exit: Option<(i32, Option<i32>)> = None;
    let mut exit_sent = false;
    let mut forgotten = false;
    let mut drain_until: Option<tokio::time::Instant> = None;
    let mut acked = Acked::default();
    // Whether the last client attached acknowledges what it takes: then nothing it was sent
    // is let go until it says so, attached or not.
    let mut flow = at.as_ref().is_some_and(|a| a.window.is_some());
    let mut ob = vec![0u8; 64 << 10];
    let mut eb = vec![0u8; 64 << 10];
    loop {
        let finished = exit.is_some() && stdout.is_none() && stderr.is_none();
        if finished && (exit_sent || at.is_none()) {
            settled.store(true, Ordering::Relaxed);
        }
        if finished && (forgotten || (exit_sent && !resumable) || (at.is_none() && !resumable)) {
            break;
        }
        // A flow-controlled client gets output while its window has room, and the exit once
        // every chunk went out.
        let window_room = at.as_ref().and_then(|a| a.window).is_none_or(|w| acked.unacked < w);
        let pending =
            at.is_some() && ((out.last() > sent && window_room) || (out.last() <= sent && finished && !exit_sent));
        // With nobody to resume it, output that no connection takes is let go.
        let keep = resumable;
        // Bounded for every attached client (a slow one holds the program up); output nobody
        // can ever resume is let go.
        let room = out.room() || (at.is_none() && !keep);
        let to = at.as_ref().map(|a| a.tx.clone());
        tokio::select! {
            cmd = rx.recv() => match cmd {
                None => forgotten = true,
                Some(Command::Forget) => forgotten = true,
                Some(Command::Detach(conn)) => {
                    if at.as_ref().is_some_and(|a| a.conn == conn) {
                        at = None;
                    }
                }
                Some(Command::Ack(conn, stream, seq)) => {
                    if at.as_ref().is_some_and(|a| a.conn == conn) {
                        acked.ack(&mut out, stream, seq, sent);
                    }
                }
                Some(Command::Attach(a, after)) => {
                    let from = (after + 1).max(out.first());
                    sent = from - 1;
                    exit_sent = false;
                    acked.recount(&out, sent);
                    flow = a.window.is_some();
                    let _ = a.tx.send(Message::Text(json(&Answer::Resumed { id: a.id, from }))).await;
                    at = Some(a);
                }
            },
            r = read_some(&mut stdout, &mut ob), if stdout.is_some() && room => match r {
                Some(n) => out.push(STDOUT, &ob[..n]),
                None => stdout = None,
            },
            r = read_some(&mut stderr, &mut eb), if stderr.is_some() && room => match r {
                Some(n) => out.push(STDERR, &eb[..n]),
                None => stderr = None,
            },
            st = child.wait(), if exit.is_none() => {
                exit = Some(st.map(code_of).unwrap_or((255, None)));
                drain_until = Some(tokio::time::Instant::now() + DRAIN);
            }
            _ = tokio::time::sleep_until(drain_until.unwrap_or_else(tokio::time::Instant::now)),
                if drain_until.is_some() && (stdout.is_some() || stderr.is_some()) => {
                stdout = None;
                stderr = None;
            }
            permit = reserve(to), if pending => match permit {
                Some(p) => {
                    let a = at.as_ref().expect("pending means attached");
                    if out.last() > sent {
                        let seq = sent + 1;
                        if let Some((_, stream, bytes)) = out.get(seq) {
                            if a.window.is_some() {
                                acked.unacked += bytes.len() as u64;
                            }
                            p.send(Message::Binary(if a.extended {
                                frame_seq(a.id, *stream, seq, bytes)
                            } else {
                                frame(a.id, *stream, bytes)
                            }));
                        }
                        sent = seq;
                    } else if let Some((code, signal)) = exit {
                        let signal = if a.extended { signal } else { None };
                        p.send(Message::Text(json(&Answer::Exit { id: a.id, code, signal })));
                        exit_sent = true;
                        delivered.store(true, Ordering::Relaxed);
                    }
                }
                None => at = None,
            },
        }
        if at.is_none() && !keep {
            sent = out.last();
        }
        if flow {
            // Kept until acknowledged: a reader that drops and resumes loses nothing.
            out.trim_acked(&acked);
        } else {
            out.trim(sent, keep);
        }
    }
    settled.store(true, Ordering::Relaxed);
    done();
}

async fn read_some(r: &mut Option<Box<dyn AsyncRead + Unpin + Send>>, buf: &mut [u8]) -> Option<usize> {
    match r.as_mut()?.read(buf).await {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}

async fn reserve(to: Option<mpsc::Sender<Message>>) -> Option<mpsc::OwnedPermit<Message>> {
    to?.reserve_owned().await.ok()
}

/// An answer as JSON text.
pub(super) fn json(a: &Answer) -> String {
    serde_json::to_string(a).unwrap_or_else(|_| r#"{"op":"error","message":"an answer did not serialise"}"#.into())
}

//! One process of the runner: the numbered tail of its output, shared by every connection that
//! reads it, and the tasks that fill and empty it.
//!
//! Every byte a process writes (stdout and stderr counted together, from 0) has a number. The
//! runner keeps the bytes no reader that *holds* the process has acknowledged, up to
//! `max_buffered`; at the bound it stops reading the process's pipes (the program blocks on a
//! full pipe) until a holder acknowledges more. So a holder that keeps up, drops and resumes
//! loses nothing however fast the program writes. Output nobody holds is kept as a ring of
//! the same bound: a reader that comes later, or one that does not hold and falls behind, is
//! told (`resumed`) where what follows starts.
//!
//! Who holds: each connection reading with `hold` (the one that ran the process, unless it
//! asked otherwise), and, for a process not started detached, the last holder that dropped
//! until another one comes (its acknowledgements are kept, so the same client resuming loses
//! nothing). A detached process is held only while someone holds it.
//!
//! Each reader has a task of its own ([`pump`]) that sends it what it has not been sent, within
//! its flow-control window, then the exit: one slow connection never holds up another. A
//! process outlives every connection: only `kill`, `stop`, its deadline or its own end ends it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentbox_protocol::runner::{Answer, Message, ProcExit, ProcInfo, STDERR, STDOUT, frame, frame_seq};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Child;
use tokio::sync::{mpsc, watch};

use super::pty::Pty;

/// How long output may still arrive after a process exits (a pipe's last bytes) before its
/// exit is answered. A program it left running that holds the pipe is not waited for.
const DRAIN: Duration = Duration::from_millis(100);
/// The most bytes of output one frame carries (and one chunk holds).
const MAX_FRAME: usize = 256 << 10;
/// The most chunks one process keeps: a program that alternates its streams a byte at a time
/// makes a chunk of each byte, and each costs more than its byte.
const MAX_CHUNKS: usize = 1 << 16;

/// A reader's key: its connection's number and the id the process has there.
pub(super) type ReaderKey = (u64, u32);

/// How a connection reads a process.
pub(super) struct Reading {
    /// The id the process has on that connection.
    pub id: u32,
    /// Whether the connection speaks protocol 3 (numbered frames, gaps, `signal` in `exit`).
    pub extended: bool,
    /// Whether this reader holds the process up (see the module documentation).
    pub hold: bool,
    /// At most this many bytes sent and not acknowledged; `None`: whatever the connection takes.
    pub window: Option<u64>,
    /// The connection's outgoing messages.
    pub tx: mpsc::Sender<Message>,
}

/// Per stream, the number one past the last byte its reader took.
#[derive(Clone, Copy, Debug, Default)]
struct Acks {
    out: u64,
    err: u64,
}

impl Acks {
    fn at(after: u64) -> Self {
        Acks { out: after, err: after }
    }
    fn of(&self, stream: u8) -> u64 {
        if stream == STDERR { self.err } else { self.out }
    }
    fn of_mut(&mut self, stream: u8) -> &mut u64 {
        if stream == STDERR { &mut self.err } else { &mut self.out }
    }
    /// Whether every byte of `c` was taken.
    fn covers(&self, c: &Chunk) -> bool {
        c.start + c.len <= self.of(c.stream)
    }
}

struct Reader {
    r: Reading,
    /// The number of the next byte to send.
    sent: u64,
    acks: Acks,
    /// Bytes sent and not acknowledged (under a window).
    unacked: u64,
    exit_sent: bool,
}

/// One read of a pipe: its first byte's number, its stream, its bytes. `gone`: emptied while
/// kept, to make room (its numbers stay, so a reader is told of the gap).
struct Chunk {
    start: u64,
    len: u64,
    stream: u8,
    bytes: Vec<u8>,
    gone: bool,
}

/// The numbered tail of a process's output.
struct Output {
    chunks: VecDeque<Chunk>,
    /// Bytes held (not gone).
    bytes: usize,
    /// The number the next byte will have.
    end: u64,
    max: usize,
}

impl Output {
    fn first(&self) -> u64 {
        self.chunks.front().map(|c| c.start).unwrap_or(self.end)
    }
    fn push(&mut self, stream: u8, bytes: &[u8]) {
        let len = bytes.len() as u64;
        // Readers count bytes, not chunks: a read that follows one of its stream joins it,
        // so a program writing a byte at a time does not make a chunk of each.
        if let Some(last) = self.chunks.back_mut()
            && last.stream == stream
            && !last.gone
            && last.bytes.len() + bytes.len() <= MAX_FRAME
        {
            last.bytes.extend_from_slice(bytes);
            last.len += len;
            self.end += len;
            self.bytes += bytes.len();
            return;
        }
        self.chunks.push_back(Chunk {
            start: self.end,
            len,
            stream,
            bytes: bytes.to_vec(),
            gone: false,
        });
        self.end += len;
        self.bytes += bytes.len();
    }
    /// The index of the chunk holding byte `n`.
    fn index(&self, n: u64) -> Option<usize> {
        let i = self.chunks.partition_point(|c| c.start + c.len <= n);
        (i < self.chunks.len() && self.chunks[i].start <= n).then_some(i)
    }
}

struct State {
    out: Output,
    readers: HashMap<ReaderKey, Reader>,
    /// The acknowledgements of a holder that dropped, kept for a process not started detached.
    ghost: Option<Acks>,
    exit: Option<ProcExit>,
    /// Ended, and its pipes read to their end.
    finished: bool,
    forgotten: bool,
    /// Its exit went to a reader.
    delivered: bool,
}

impl State {
    /// Whether no holder still needs `c`.
    fn free(&self, c: &Chunk) -> bool {
        self.ghost.is_none_or(|g| g.covers(c)) && self.readers.values().all(|r| !r.r.hold || r.acks.covers(c))
    }

    /// Let go of what no holder needs while the output is at its bound (the oldest bytes
    /// first, then taken chunks behind one still needed), and of emptied chunks at the front.
    /// Room is made for a read of up to half the bound (at most 64 KiB), so a ring keeps at
    /// least the other half. Answers how many bytes may be read now.
    fn make_room(&mut self) -> usize {
        let want = (self.out.max / 2).clamp(1, 64 << 10);
        let target = self.out.max - want;
        while let Some(front) = self.out.chunks.front() {
            if front.gone {
                self.out.chunks.pop_front();
                continue;
            }
            let crowded = self.out.chunks.len() >= MAX_CHUNKS;
            if (self.out.bytes <= target && !crowded) || !self.free(front) {
                break;
            }
            let cut = if crowded {
                front.bytes.len()
            } else {
                (self.out.bytes - target).min(front.bytes.len())
            };
            let c = self.out.chunks.front_mut().expect("a front chunk");
            if cut == c.bytes.len() {
                self.out.chunks.pop_front();
            } else {
                c.bytes.drain(..cut);
                c.start += cut as u64;
                c.len -= cut as u64;
            }
            self.out.bytes -= cut;
        }
        if self.out.bytes >= self.out.max {
            for i in 0..self.out.chunks.len() {
                if self.out.bytes <= target {
                    break;
                }
                let c = &self.out.chunks[i];
                if !c.gone && self.free(c) {
                    let c = &mut self.out.chunks[i];
                    self.out.bytes -= c.bytes.len();
                    c.bytes = Vec::new();
                    c.gone = true;
                }
            }
        }
        if self.out.chunks.len() >= MAX_CHUNKS {
            return 0;
        }
        self.out.max.saturating_sub(self.out.bytes)
    }
}

/// A process the runner holds.
pub(super) struct Proc {
    /// Its handle.
    pub handle: u64,
    /// The key its `run` carried.
    pub key: Option<String>,
    /// Its program and arguments.
    pub argv: Vec<String>,
    /// Its pid, which leads its process group.
    pub pid: u32,
    /// When it started, in ms since the epoch.
    pub started_ms: i64,
    /// Its terminal, if it has one.
    pub tty: Option<Arc<Pty>>,
    /// Started detached: nobody holds it once its holders left.
    pub detach: bool,
    /// Started by a protocol-3 connection: kept after its exit for a reader that comes later.
    pub resumable: bool,
    /// Its stdin's writer (`None` ends it, and once it ended), shared by its readers.
    pub stdin: Mutex<Option<mpsc::Sender<Option<Vec<u8>>>>>,
    state: Mutex<State>,
    changed: watch::Sender<u64>,
}

/// What a process is started with, besides its child.
pub(super) struct Start {
    pub handle: u64,
    pub key: Option<String>,
    pub argv: Vec<String>,
    pub tty: Option<Arc<Pty>>,
    pub detach: bool,
    pub resumable: bool,
    pub max_buffered: usize,
    pub stdin: Option<mpsc::Sender<Option<Vec<u8>>>>,
}

impl Proc {
    /// A process for `child`, whose pid leads its group.
    pub(super) fn new(s: Start, pid: u32) -> Arc<Proc> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        Arc::new(Proc {
            handle: s.handle,
            key: s.key,
            argv: s.argv,
            pid,
            started_ms: now,
            tty: s.tty,
            detach: s.detach,
            resumable: s.resumable,
            stdin: Mutex::new(s.stdin),
            state: Mutex::new(State {
                out: Output {
                    chunks: VecDeque::new(),
                    bytes: 0,
                    end: 0,
                    max: s.max_buffered.max(1),
                },
                readers: HashMap::new(),
                ghost: None,
                exit: None,
                finished: false,
                forgotten: false,
                delivered: false,
            }),
            changed: watch::channel(0).0,
        })
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Whether it ended and its exit went to a reader: the first to go when the table is full.
    pub(super) fn delivered(&self) -> bool {
        let st = self.state.lock().unwrap();
        st.finished && st.delivered
    }

    /// Whether it ended and every reader was sent its exit: what `stop` waits for.
    pub(super) fn settled(&self) -> bool {
        let st = self.state.lock().unwrap();
        st.finished && st.readers.values().all(|r| r.exit_sent)
    }

    /// How it stands, for `ps`.
    pub(super) fn info(&self) -> ProcInfo {
        let st = self.state.lock().unwrap();
        let mut argv = Vec::new();
        let mut room = agentbox_protocol::runner::MAX_PS_ARGV;
        for a in &self.argv {
            if a.len() > room {
                let mut cut = room;
                while !a.is_char_boundary(cut) {
                    cut -= 1;
                }
                argv.push(format!("{}…", &a[..cut]));
                break;
            }
            room -= a.len();
            argv.push(a.clone());
        }
        ProcInfo {
            handle: self.handle,
            key: self.key.clone(),
            argv,
            pid: self.pid,
            started_ms: self.started_ms,
            tty: self.tty.is_some(),
            detach: self.detach,
            exit: st.finished.then_some(st.exit).flatten(),
            first: st.out.first(),
            end: st.out.end,
            readers: st.readers.len() as u32,
        }
    }

    /// Read it on connection `conn` from byte `after` on, and start the reader's task, which
    /// first answers `resumed` with where the output that follows starts (past `after` when
    /// what was between is no longer kept) when `announce`. A reader already there under
    /// that key is replaced.
    pub(super) fn attach(self: &Arc<Self>, conn: u64, r: Reading, after: u64, announce: bool) {
        let key = (conn, r.id);
        let (id, tx) = (r.id, r.tx.clone());
        let (from, end, ended) = {
            let mut st = self.state.lock().unwrap();
            let from = after.max(st.out.first());
            // A holder that comes takes the place of one that dropped (if any). `after` is what
            // the client already has: the new reader starts with every byte before it taken
            // and a free window, whatever acknowledgements the drop lost (charging it the old
            // reader's unacknowledged bytes would hold it at a full window for acks that
            // never come).
            if r.hold {
                st.ghost = None;
            }
            st.readers.insert(
                key,
                Reader {
                    r,
                    sent: from,
                    acks: Acks::at(from),
                    unacked: 0,
                    exit_sent: false,
                },
            );
            (from, st.out.end, st.finished)
        };
        let lead = announce.then(|| {
            Message::Text(json(&Answer::Resumed {
                id,
                from,
                handle: Some(self.handle),
                end: Some(end),
                ended,
            }))
        });
        let p = self.clone();
        tokio::spawn(async move {
            if let Some(m) = lead
                && tx.send(m).await.is_err()
            {
                return p.detach(key, true);
            }
            pump(p, key).await
        });
    }

    /// Stop reading it on `conn` under `id`. A holder that dropped (`dropped`) still holds a
    /// process not started detached, until another holder comes.
    pub(super) fn detach(&self, key: ReaderKey, dropped: bool) {
        {
            let mut st = self.state.lock().unwrap();
            // The last holder to drop holds on as a ghost; while another holds, it needs none.
            if let Some(r) = st.readers.remove(&key)
                && dropped
                && r.r.hold
                && !self.detach
                && self.resumable
                && !r.exit_sent
                && !st.readers.values().any(|o| o.r.hold)
            {
                st.ghost = Some(r.acks);
            }
        }
        self.bump();
    }

    /// The reader `key` took `stream` up to byte `seq`.
    pub(super) fn ack(&self, key: ReaderKey, stream: u8, seq: u64) {
        {
            let mut st = self.state.lock().unwrap();
            let State { out, readers, .. } = &mut *st;
            let Some(r) = readers.get_mut(&key) else { return };
            let seq = seq.min(r.sent);
            let from = r.acks.of(stream);
            if seq <= from {
                return;
            }
            if r.r.window.is_some() {
                let taken: u64 = out
                    .chunks
                    .iter()
                    .skip(out.chunks.partition_point(|c| c.start + c.len <= from))
                    .take_while(|c| c.start < seq)
                    .filter(|c| c.stream == stream && !c.gone)
                    .map(|c| (c.start + c.len).min(seq) - c.start.max(from))
                    .sum();
                r.unacked = r.unacked.saturating_sub(taken);
            }
            *r.acks.of_mut(stream) = seq;
        }
        self.bump();
    }

    /// Forget it: now when it ended, else once it does. Answers whether it ended (then the
    /// caller takes it out of the runner's table at once, so nothing finds it after).
    pub(super) fn forget(&self) -> bool {
        let finished = {
            let mut st = self.state.lock().unwrap();
            st.forgotten = true;
            st.finished
        };
        self.bump();
        finished
    }
}

/// Send reader `key` what it has not been sent, within its window, then the exit; until it
/// is detached.
async fn pump(p: Arc<Proc>, key: ReaderKey) {
    let mut changed = p.changed.subscribe();
    loop {
        changed.borrow_and_update();
        let next = {
            let mut st = p.state.lock().unwrap();
            let State {
                out,
                readers,
                exit,
                finished,
                delivered,
                ..
            } = &mut *st;
            let Some(r) = readers.get_mut(&key) else { return };
            let was_sent = r.exit_sent;
            let msg = next_message(out, r, *exit, *finished);
            let exit_now = !was_sent && r.exit_sent;
            *delivered |= exit_now;
            // What a reader without a window was sent is taken: room for the pipes, as an
            // ack would make. An exit sent may let the process go.
            let look = exit_now || r.r.window.is_none();
            msg.map(|m| (m, r.r.tx.clone(), look))
        };
        match next {
            Some((m, tx, look)) => {
                if tx.send(m).await.is_err() {
                    p.detach(key, true);
                    return;
                }
                if look {
                    p.bump();
                }
            }
            None => {
                if changed.changed().await.is_err() {
                    return;
                }
            }
        }
    }
}

/// What reader `r` is to be sent next, if anything.
fn next_message(out: &Output, r: &mut Reader, exit: Option<ProcExit>, finished: bool) -> Option<Message> {
    let id = r.r.id;
    // It fell behind what is kept, or reached bytes that were let go: say where it goes on.
    let gap_to = if r.sent < out.first() {
        Some(out.first())
    } else {
        out.index(r.sent).and_then(|i| {
            let gone = out.chunks.iter().skip(i).take_while(|c| c.gone).last()?;
            Some(gone.start + gone.len)
        })
    };
    if let Some(from) = gap_to {
        r.sent = from;
        r.acks.out = r.acks.out.max(from);
        r.acks.err = r.acks.err.max(from);
        if r.r.extended {
            return Some(Message::Text(json(&Answer::Resumed {
                id,
                from,
                handle: None,
                end: None,
                ended: false,
            })));
        }
    }
    if r.r.window == Some(0) {
        // A reader that asked for no output waits only for the exit.
        r.sent = out.end;
        r.acks = Acks::at(r.sent);
    }
    if r.sent < out.end {
        let room = match r.r.window {
            Some(w) => w.saturating_sub(r.unacked) as usize,
            None => usize::MAX,
        };
        if room == 0 {
            return None;
        }
        let c = &out.chunks[out.index(r.sent)?];
        let off = (r.sent - c.start) as usize;
        let n = (c.bytes.len() - off).min(room).min(MAX_FRAME);
        let bytes = &c.bytes[off..off + n];
        let m = if r.r.extended {
            frame_seq(id, c.stream, r.sent, bytes)
        } else {
            frame(id, c.stream, bytes)
        };
        r.sent += n as u64;
        if r.r.window.is_some() {
            r.unacked += n as u64;
        } else {
            // A reader without a window acknowledges nothing: what went out is taken.
            r.acks = Acks::at(r.sent);
        }
        return Some(Message::Binary(m));
    }
    if finished
        && !r.exit_sent
        && let Some(e) = exit
    {
        r.exit_sent = true;
        let a = if r.r.extended {
            Answer::Exit {
                id,
                code: e.code,
                signal: e.signal,
                timeout: e.timeout,
            }
        } else {
            Answer::Exit {
                id,
                code: e.code,
                signal: None,
                timeout: false,
            }
        };
        return Some(Message::Text(json(&a)));
    }
    None
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

/// Output a process writes: its pipes, or its terminal.
pub(super) type Pipe = Box<dyn AsyncRead + Unpin + Send>;

/// Fill the process's output from its pipes until it ended and they did, killing its group at
/// `deadline`; then keep it until it is to be let go. `done` runs last, to take it out of the
/// runner's table.
pub(super) async fn run(
    p: Arc<Proc>,
    mut child: Child,
    mut stdout: Option<Pipe>,
    mut stderr: Option<Pipe>,
    deadline: Option<tokio::time::Instant>,
    done: impl FnOnce(),
) {
    let mut changed = p.changed.subscribe();
    let mut exit: Option<(i32, Option<i32>)> = None;
    let mut timed_out = false;
    let mut drain_until: Option<tokio::time::Instant> = None;
    let mut stalled = false;
    let mut ob = vec![0u8; 64 << 10];
    let mut eb = vec![0u8; 64 << 10];
    loop {
        changed.borrow_and_update();
        if let Some((code, signal)) = exit
            && stdout.is_none()
            && stderr.is_none()
        {
            let mut st = p.state.lock().unwrap();
            st.exit = Some(ProcExit {
                code,
                signal,
                timeout: timed_out,
            });
            st.finished = true;
            break;
        }
        let room = p.state.lock().unwrap().make_room().min(ob.len());
        // The drain counts only while there is room to read: at the bound it starts again
        // once room is made (after however long the holder took).
        if drain_until.is_some() {
            if room == 0 {
                stalled = true;
            } else if stalled {
                stalled = false;
                drain_until = Some(tokio::time::Instant::now() + DRAIN);
            }
        }
        tokio::select! {
            _ = changed.changed() => {}
            r = read_some(&mut stdout, &mut ob[..room.max(1)]), if stdout.is_some() && room > 0 => match r {
                Some(n) => {
                    p.state.lock().unwrap().out.push(STDOUT, &ob[..n]);
                    p.bump();
                    drain_until = drain_until.map(|_| tokio::time::Instant::now() + DRAIN);
                }
                None => stdout = None,
            },
            r = read_some(&mut stderr, &mut eb[..room.max(1)]), if stderr.is_some() && room > 0 => match r {
                Some(n) => {
                    p.state.lock().unwrap().out.push(STDERR, &eb[..n]);
                    p.bump();
                    drain_until = drain_until.map(|_| tokio::time::Instant::now() + DRAIN);
                }
                None => stderr = None,
            },
            st = child.wait(), if exit.is_none() => {
                exit = Some(st.map(code_of).unwrap_or((255, None)));
                drain_until = Some(tokio::time::Instant::now() + DRAIN);
            }
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)),
                if deadline.is_some() && exit.is_none() && !timed_out => {
                timed_out = true;
                kill_group(p.pid as i32, 9);
            }
            // Only once the pipes went quiet with room to read: at the bound, what is still in
            // them waits for a holder, as the program's earlier output did.
            _ = tokio::time::sleep_until(drain_until.unwrap_or_else(tokio::time::Instant::now)),
                if drain_until.is_some() && room > 0 && (stdout.is_some() || stderr.is_some()) => {
                stdout = None;
                stderr = None;
            }
        }
    }
    *p.stdin.lock().unwrap() = None;
    p.bump();
    // Kept until forgotten (a protocol-3 process, for whoever reads it next), or, for one that
    // cannot be resumed, until its exit went out or nobody reads it.
    // A forgotten one goes once each of its readers had its exit (or left).
    loop {
        {
            let st = p.state.lock().unwrap();
            let told = st.readers.values().all(|r| r.exit_sent);
            if (st.forgotten && told) || (!p.resumable && (st.delivered || st.readers.is_empty())) {
                break;
            }
        }
        if changed.changed().await.is_err() {
            break;
        }
    }
    {
        let mut st = p.state.lock().unwrap();
        st.readers.clear();
    }
    p.bump();
    done();
}

/// Signal a process group.
pub(super) fn kill_group(pgid: i32, sig: i32) {
    if let (Some(sig), Some(pid)) = (
        crate::supervisor::signal_from(sig),
        rustix::process::Pid::from_raw(pgid),
    ) {
        let _ = rustix::process::kill_process_group(pid, sig);
    }
}

async fn read_some(r: &mut Option<Pipe>, buf: &mut [u8]) -> Option<usize> {
    match r.as_mut()?.read(buf).await {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}

/// An answer as JSON text.
pub(super) fn json(a: &Answer) -> String {
    serde_json::to_string(a).unwrap_or_else(|_| r#"{"op":"error","message":"an answer did not serialise"}"#.into())
}

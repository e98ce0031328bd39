//! The runner's protocol: one connection per client carrying many processes and file
//! operations of a box.
//!
//! Protocol 2 is the seed's, byte for byte: text frames are JSON control, each carrying the
//! `id` of the process or request it is about; binary frames are `id` (u32, big-endian),
//! `stream` (u8: [`STDIN`], [`STDOUT`], [`STDERR`], [`FILE`]), then the bytes. A client that
//! says nothing more is a protocol-2 client and never sees anything else.
//!
//! Protocol 3 is negotiated: the client's first request is [`Request::Hello`] asking for
//! [`EXTENDED`], and the runner answers [`Answer::Hello`]. On such a connection:
//! - `run` may carry `argv` instead of `command`, and is answered [`Answer::Started`] with a
//!   `handle` that names the process across connections;
//! - output frames carry a sequence number after the stream byte ([`frame_seq`]), the runner
//!   keeps a bounded tail of each process's output, and [`Request::Resume`] on a later
//!   connection replays it from a number on; a dropped connection ends no process;
//! - `exit` also carries the `signal` that ended a process, and whether the deadline the
//!   `run` gave it (`timeout_ms`, kept by the runner) ended it;
//! - every byte of a process's output has a number: its place in the process's output, both
//!   streams counted together from 0; an output frame carries the number of its first byte;
//! - `run` may ask for a terminal (`tty`), for a process that no connection holds (`detach`),
//!   and carry a client-chosen `key`, which makes it idempotent: a `run` whose key the runner
//!   knows is answered `started` for that process, so a client that lost the answer in a drop
//!   sends it again;
//! - any connection may list the box's processes (`ps`), attach to one (`resume`, by handle or
//!   key; several readers at once each get all of its output), write its stdin (`input`),
//!   resize its terminal (`resize`), signal it (`kill` by handle) and `release` or `forget` it;
//! - the file operations hands need: `stat`, `list`, `mkdir`, `remove`, `rename`, `append`,
//!   `truncate`, `read` of a range.
//!
//! Over a byte stream with no WebSocket (the stdin and stdout of one long exec, a unix
//! socket), the same messages travel as [`Message`]s: a u32 big-endian length of what
//! follows, one kind byte ([`KIND_TEXT`] or [`KIND_BINARY`]), then the payload.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The port the runner listens on in a box.
pub const PORT: u16 = 7700;
/// Where the runner answers its health (not `/health`, which some vendors' edges answer
/// themselves).
pub const HEALTH_PATH: &str = "/runner/health";
/// A header that carries the runner's token in place of `Authorization: Bearer`, for a path
/// through a proxy that takes Authorization for its own credential.
pub const TOKEN_HEADER: &str = "x-agentbox-runner-token";
/// The protocol every runner speaks, and its health answers.
pub const PROTOCOL: u32 = 2;
/// The extended protocol a client asks for with [`Request::Hello`].
pub const EXTENDED: u32 = 3;

/// A binary frame's stream: a process's stdin.
pub const STDIN: u8 = 0;
/// A binary frame's stream: a process's stdout.
pub const STDOUT: u8 = 1;
/// A binary frame's stream: a process's stderr.
pub const STDERR: u8 = 2;
/// A binary frame's stream: a file read or written.
pub const FILE: u8 = 3;

/// The largest message either end accepts (16 MiB), text or binary, header included. A file
/// read or written in one frame must fit; larger files move by ranges.
pub const MAX_MESSAGE: usize = 16 << 20;

/// What the runner's health answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// The protocol it speaks ([`PROTOCOL`]).
    pub protocol: u32,
    /// Its pid, which a backend replacing it ends.
    pub pid: u32,
}

/// What the client says, as text. A `write`'s or `append`'s bytes follow it as the binary
/// frame `(id, FILE)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    /// Start a process: `command` through the shell (protocol 2), or `argv` (protocol 3).
    Run {
        /// The request's id, which its frames and answers carry.
        id: u32,
        /// A shell command line (`bash -c`, or `sh -c` where the box has no bash).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        command: Option<String>,
        /// A program and its arguments (protocol 3).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        argv: Option<Vec<String>>,
        /// The working directory; relative to the runner's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<String>,
        /// Variables over the runner's own environment.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        env: Option<BTreeMap<String, String>>,
        /// Whether stdin frames will follow; without, the process reads EOF.
        #[serde(default)]
        stdin: bool,
        /// The client's name for this run (protocol 3, at most [`MAX_KEY`] bytes): a `run`
        /// whose key names a process the runner holds is answered `started` for it, and the
        /// connection reads it as a `resume` from 0 would.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        /// A terminal for the process (protocol 3): its stdin, stdout and stderr are a pty's,
        /// its output comes on [`STDOUT`] alone.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tty: Option<Tty>,
        /// No connection holds the process (protocol 3): its output is kept as a ring of the
        /// runner's bound while nobody reads it (a reader that comes later is told where its
        /// replay starts), and it is never held up for a reader that left.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        detach: bool,
        /// The runner kills the process's group this many ms after it started, with or without
        /// a client, and its exit says `timeout` (protocol 3).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
        /// One secret for the process alone, on a pipe it inherits as descriptor 3 (named in
        /// its `AGENTBOX_SECRET_FD`): never in its argv, environment or a file (protocol 3).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secret: Option<SecretFd>,
    },
    /// The process's stdin ends.
    StdinEnd {
        /// The process's id.
        id: u32,
    },
    /// Send a signal (a name such as `SIGTERM`) to the process's group.
    Kill {
        /// The process's id on this connection, or the request's id when `handle` is given.
        id: u32,
        /// The signal's name; `SIGKILL` when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<String>,
        /// The process by its handle rather than by id (protocol 3).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        handle: Option<u64>,
    },
    /// Read a file: answered by the frame `(id, FILE)`, or `absent`.
    Read {
        /// The request's id.
        id: u32,
        /// The file.
        path: String,
        /// Where to start (protocol 3).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        offset: Option<u64>,
        /// At most this many bytes (protocol 3).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        length: Option<u64>,
    },
    /// Write a file from the frame `(id, FILE)` that follows: answered `ok`.
    Write {
        /// The request's id.
        id: u32,
        /// The file.
        path: String,
        /// Its permission bits when it is created.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<u32>,
    },
    /// Kill every process of the box: answered `ok`.
    Stop {
        /// The request's id.
        id: u32,
    },
    /// Ask for a protocol beyond 2.
    Hello {
        /// The request's id.
        id: u32,
        /// The protocol asked for.
        protocol: u32,
        /// Flow control (protocol 3): the client acknowledges each stream's output with
        /// [`Request::Ack`] as its reader takes it, and the runner sends at most this many
        /// bytes of a process's output that are not acknowledged. A reader that stops reading
        /// then holds up its own process at the runner (its bounded buffer, then its pipes),
        /// never the connection and the other processes on it. Absent: no flow control.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        window: Option<u64>,
    },
    /// A reader took a process's output on one stream up to byte number `seq` (on a
    /// connection whose hello set a window, or a resume that gave one): that much of the
    /// window is free again, and the runner may let go of what it kept of that stream up to
    /// there.
    Ack {
        /// The process's id.
        id: u32,
        /// The stream ([`STDOUT`] or [`STDERR`]).
        stream: u8,
        /// One past the number of the last byte of that stream taken: every byte of it before
        /// this number is taken.
        seq: u64,
    },
    /// Read a process (started on this connection or any other) under `id`: its output from
    /// byte `after` on, then its exit. Answered `resumed`. Any number of connections may read
    /// one process at once; each gets all of its output.
    Resume {
        /// The id the process takes on this connection.
        id: u32,
        /// The process's handle, from `started` or `ps`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        handle: Option<u64>,
        /// The process by the key its `run` carried, instead of its handle.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        /// How many bytes of its output the client already has (0 for none): the replay starts
        /// at that byte's number, and every byte before it counts as acknowledged, so the
        /// reader starts with its whole window free (acknowledgements a drop lost before it
        /// are never waited for).
        after: u64,
        /// Whether this reader holds the process up (true when absent): output it was sent is
        /// kept until it acknowledges it, and the process waits at the bound for it, also
        /// after a drop while the process was not started detached. A reader that does not
        /// hold is sent what is kept, and told (`resumed`) when it fell behind what is kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hold: Option<bool>,
        /// At most this many bytes sent to this reader and not acknowledged, instead of the
        /// connection's window (0: none at all, for a reader that only waits for the exit).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        window: Option<u64>,
    },
    /// Stop reading the process `id` on this connection (answered `ok`); it runs on.
    Release {
        /// The process's id on this connection.
        id: u32,
    },
    /// Forget a process whose exit the client saw: its kept output is freed, and `ps` no longer
    /// lists it. A running process is forgotten once it ends. Answered `ok`, also for a process
    /// the runner no longer knows (forgetting is idempotent).
    Forget {
        /// The process's id, or the request's id when `handle` is given.
        id: u32,
        /// The process by its handle rather than by id (protocol 3).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        handle: Option<u64>,
    },
    /// The box's processes: running, and ended ones not yet forgotten. Answered `processes`.
    Ps {
        /// The request's id.
        id: u32,
    },
    /// Write to a process's stdin by its handle: the bytes follow as the frame `(id, STDIN)`
    /// (empty for none), then stdin ends when `close`. Answered `ok` once they were queued.
    Input {
        /// The request's id.
        id: u32,
        /// The process's handle.
        handle: u64,
        /// End its stdin after these bytes.
        #[serde(default)]
        close: bool,
    },
    /// Set the size of a process's terminal (its foreground group gets SIGWINCH). Answered
    /// `ok`, or `unsupported` for a process without one.
    Resize {
        /// The process's id on this connection, or the request's id when `handle` is given.
        id: u32,
        /// The process by its handle rather than by id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        handle: Option<u64>,
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
    /// What a path is.
    Stat {
        /// The request's id.
        id: u32,
        /// The path.
        path: String,
        /// Describe a symbolic link's target rather than the link.
        #[serde(default)]
        follow: bool,
    },
    /// A directory's entries.
    List {
        /// The request's id.
        id: u32,
        /// The directory.
        path: String,
    },
    /// Make a directory.
    Mkdir {
        /// The request's id.
        id: u32,
        /// The directory.
        path: String,
        /// Make missing parents, and accept one that exists.
        #[serde(default)]
        recursive: bool,
    },
    /// Remove a file, link or directory.
    Remove {
        /// The request's id.
        id: u32,
        /// The path.
        path: String,
        /// Remove a directory with what it holds.
        #[serde(default)]
        recursive: bool,
        /// A missing path is no error.
        #[serde(default)]
        force: bool,
    },
    /// Rename `from` to `to` (rename(2)).
    Rename {
        /// The request's id.
        id: u32,
        /// The old path.
        from: String,
        /// The new path.
        to: String,
    },
    /// Append the frame `(id, FILE)` that follows to a file, made if missing.
    Append {
        /// The request's id.
        id: u32,
        /// The file.
        path: String,
    },
    /// Cut or extend a file to `size` bytes.
    Truncate {
        /// The request's id.
        id: u32,
        /// The file.
        path: String,
        /// Its new length.
        size: u64,
    },
}

impl Request {
    /// The id the request carries.
    pub fn id(&self) -> u32 {
        match self {
            Request::Run { id, .. }
            | Request::StdinEnd { id }
            | Request::Kill { id, .. }
            | Request::Read { id, .. }
            | Request::Write { id, .. }
            | Request::Stop { id }
            | Request::Hello { id, .. }
            | Request::Ack { id, .. }
            | Request::Resume { id, .. }
            | Request::Release { id }
            | Request::Forget { id, .. }
            | Request::Ps { id }
            | Request::Input { id, .. }
            | Request::Resize { id, .. }
            | Request::Stat { id, .. }
            | Request::List { id, .. }
            | Request::Mkdir { id, .. }
            | Request::Remove { id, .. }
            | Request::Rename { id, .. }
            | Request::Append { id, .. }
            | Request::Truncate { id, .. } => *id,
        }
    }

    /// Its `op`, as it travels.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Run { .. } => "run",
            Request::StdinEnd { .. } => "stdin-end",
            Request::Kill { .. } => "kill",
            Request::Read { .. } => "read",
            Request::Write { .. } => "write",
            Request::Stop { .. } => "stop",
            Request::Hello { .. } => "hello",
            Request::Ack { .. } => "ack",
            Request::Resume { .. } => "resume",
            Request::Release { .. } => "release",
            Request::Forget { .. } => "forget",
            Request::Ps { .. } => "ps",
            Request::Input { .. } => "input",
            Request::Resize { .. } => "resize",
            Request::Stat { .. } => "stat",
            Request::List { .. } => "list",
            Request::Mkdir { .. } => "mkdir",
            Request::Remove { .. } => "remove",
            Request::Rename { .. } => "rename",
            Request::Append { .. } => "append",
            Request::Truncate { .. } => "truncate",
        }
    }

    /// Whether only a protocol-3 connection may send it.
    pub fn is_extended(&self) -> bool {
        match self {
            Request::Run {
                argv,
                key,
                tty,
                detach,
                timeout_ms,
                ..
            } => argv.is_some() || key.is_some() || tty.is_some() || *detach || timeout_ms.is_some(),
            Request::Read { offset, length, .. } => offset.is_some() || length.is_some(),
            Request::Kill { handle, .. } => handle.is_some(),
            Request::StdinEnd { .. } | Request::Write { .. } | Request::Stop { .. } | Request::Hello { .. } => false,
            _ => true,
        }
    }
}

/// The longest key a `run` may carry.
pub const MAX_KEY: usize = 128;
/// The most bytes of a process's argv a `ps` answer carries (longer ones are cut, and say so).
pub const MAX_PS_ARGV: usize = 1024;
/// The largest terminal a `run` or `resize` may ask for, in rows and in columns.
pub const MAX_TTY: u16 = 4096;

/// A secret handed to one process on a descriptor: see `Request::Run`'s `secret`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretFd {
    /// The secret's name (`AGENTBOX_SECRET_NAME`).
    pub name: String,
    /// Its value: what the process reads on the descriptor, then EOF.
    pub value: String,
}

impl std::fmt::Debug for SecretFd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretFd")
            .field("name", &self.name)
            .field("value", &"<not shown>")
            .finish()
    }
}

/// A terminal a process runs in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tty {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
    /// `TERM` in the process's environment (`xterm-256color` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<String>,
}

/// How a process stands, as `ps` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcInfo {
    /// Its handle.
    pub handle: u64,
    /// The key its `run` carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Its program and arguments (cut to [`MAX_PS_ARGV`] bytes in all).
    pub argv: Vec<String>,
    /// Its pid in the box.
    pub pid: u32,
    /// When it started, in ms since the epoch.
    pub started_ms: i64,
    /// Whether it has a terminal.
    #[serde(default)]
    pub tty: bool,
    /// Whether it was started detached.
    #[serde(default)]
    pub detach: bool,
    /// Its exit, once it ended (and its output was read to the end by the runner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ProcExit>,
    /// The number of the first output byte still kept.
    pub first: u64,
    /// The number the next output byte will have: how many it wrote in all.
    pub end: u64,
    /// Connections reading it now.
    pub readers: u32,
}

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcExit {
    /// Its exit code: 128 + the signal for one a signal ended.
    pub code: i32,
    /// The signal that ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Whether its deadline (`timeout_ms`) ended it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timeout: bool,
}

/// What a path is, as `stat` answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// Anything else (a socket, a fifo, a device).
    Other,
}

/// One path's metadata.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// The entry's name (its last component).
    pub name: String,
    /// What it is.
    pub kind: Kind,
    /// Its length in bytes.
    pub size: u64,
    /// Its permission bits.
    pub mode: u32,
    /// Its modification time, in ms since the epoch.
    pub mtime_ms: i64,
}

/// What the runner answers, as text. A `read` that finds a file is answered by the frame
/// `(id, FILE)` instead.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Answer {
    /// A process ended.
    Exit {
        /// The process's id.
        id: u32,
        /// Its exit code: 128 + the signal for one a signal ended.
        code: i32,
        /// The signal that ended it (protocol 3).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
        /// Its deadline ended it (protocol 3).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        timeout: bool,
    },
    /// A `read` found no file.
    Absent {
        /// The request's id.
        id: u32,
    },
    /// A request succeeded.
    Ok {
        /// The request's id.
        id: u32,
    },
    /// A request failed, or a frame was not understood (then with no id).
    Error {
        /// The request's id, when the frame named one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<u32>,
        /// What went wrong, naming the field or path.
        message: String,
        /// A stable code (`invalid`, `not_found`, `too_large`, …) or an errno name
        /// (`ENOENT`, `EISDIR`, …) for a file operation.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<String>,
        /// The errno of a failed system call.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        errno: Option<i32>,
    },
    /// The protocol this connection now speaks.
    Hello {
        /// The request's id.
        id: u32,
        /// The protocol granted.
        protocol: u32,
        /// The runner's pid.
        pid: u32,
        /// The flow-control window granted (see [`Request::Hello`]); absent from a runner
        /// without flow control, whose client must then read every process as it comes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        window: Option<u64>,
    },
    /// A process started (protocol 3).
    Started {
        /// The process's id.
        id: u32,
        /// The name of the process across connections, for `resume`.
        handle: u64,
        /// Its pid in the box.
        pid: u32,
    },
    /// A resumed process's output follows from byte `from` on. Past `after` when output was
    /// let go (the process ran detached with nobody reading, or this reader does not hold it):
    /// the bytes between were lost to the bound. Sent again, mid-stream, to a reader that
    /// does not hold the process when it falls behind what is kept.
    Resumed {
        /// The process's id on this connection.
        id: u32,
        /// The number of the first byte that follows.
        from: u64,
        /// The process's handle (for a resume by key).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        handle: Option<u64>,
        /// On the answer to a `resume`: the number its output had reached then, so a reader
        /// knows what is already there to come (absent mid-stream).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        end: Option<u64>,
        /// On the answer to a `resume`: the process had ended then, so its exit follows its
        /// kept output at once.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        ended: bool,
    },
    /// A `ps`'s answer, in the order the processes started.
    Processes {
        /// The request's id.
        id: u32,
        /// The processes.
        processes: Vec<ProcInfo>,
    },
    /// A `stat`'s answer.
    Stat {
        /// The request's id.
        id: u32,
        /// The path's metadata.
        meta: Meta,
    },
    /// A `list`'s answer.
    Entries {
        /// The request's id.
        id: u32,
        /// The directory's entries, in the order the directory gave them.
        entries: Vec<Meta>,
    },
}

impl Answer {
    /// An error answer about `id`.
    pub fn error(id: Option<u32>, code: &str, message: impl Into<String>) -> Self {
        Answer::Error {
            id,
            message: message.into(),
            code: Some(code.to_string()),
            errno: None,
        }
    }
}

/// A binary frame, protocol 2: `id`, `stream`, then `bytes`.
///
/// ```
/// use agentbox_protocol::runner::{frame, unframe, STDOUT};
/// let f = frame(7, STDOUT, b"hi");
/// assert_eq!(f, [0, 0, 0, 7, 1, b'h', b'i']);
/// assert_eq!(unframe(&f), Some((7, STDOUT, &b"hi"[..])));
/// ```
pub fn frame(id: u32, stream: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + bytes.len());
    out.extend_from_slice(&id.to_be_bytes());
    out.push(stream);
    out.extend_from_slice(bytes);
    out
}

/// A binary frame's parts, or `None` for one shorter than its 5-byte header.
pub fn unframe(f: &[u8]) -> Option<(u32, u8, &[u8])> {
    if f.len() < 5 {
        return None;
    }
    Some((u32::from_be_bytes(f[..4].try_into().ok()?), f[4], &f[5..]))
}

/// An output frame on a protocol-3 connection: `id`, `stream`, the number of its first byte
/// in the process's output (u64, big-endian), then `bytes`.
pub fn frame_seq(id: u32, stream: u8, seq: u64, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(13 + bytes.len());
    out.extend_from_slice(&id.to_be_bytes());
    out.push(stream);
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(bytes);
    out
}

/// A protocol-3 output frame's parts, or `None` for one shorter than its 13-byte header.
pub fn unframe_seq(f: &[u8]) -> Option<(u32, u8, u64, &[u8])> {
    if f.len() < 13 {
        return None;
    }
    let id = u32::from_be_bytes(f[..4].try_into().ok()?);
    let seq = u64::from_be_bytes(f[5..13].try_into().ok()?);
    Some((id, f[4], seq, &f[13..]))
}

/// One message of a connection: what a WebSocket frame carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// JSON control.
    Text(String),
    /// A binary frame.
    Binary(Vec<u8>),
}

/// The kind byte of a text [`Message`] on a byte stream.
pub const KIND_TEXT: u8 = b't';
/// The kind byte of a binary [`Message`] on a byte stream.
pub const KIND_BINARY: u8 = b'b';

impl Message {
    /// The message as it travels on a byte stream: length, kind, payload.
    ///
    /// ```
    /// use agentbox_protocol::runner::{Message, stream_len};
    /// let m = Message::Text("{}".into());
    /// let bytes = m.encode();
    /// assert_eq!(stream_len(bytes[..4].try_into().unwrap()), Ok(3));
    /// assert_eq!(Message::decode(bytes[4..].to_vec()), Ok(m));
    /// ```
    pub fn encode(&self) -> Vec<u8> {
        let (kind, payload) = match self {
            Message::Text(t) => (KIND_TEXT, t.as_bytes()),
            Message::Binary(b) => (KIND_BINARY, b.as_slice()),
        };
        let mut out = Vec::with_capacity(5 + payload.len());
        out.extend_from_slice(&((payload.len() + 1) as u32).to_be_bytes());
        out.push(kind);
        out.extend_from_slice(payload);
        out
    }

    /// A message from the bytes after its length (kind and payload).
    pub fn decode(mut body: Vec<u8>) -> Result<Message, String> {
        if body.is_empty() {
            return Err("an empty message has no kind byte".into());
        }
        let kind = body.remove(0);
        match kind {
            KIND_TEXT => String::from_utf8(body)
                .map(Message::Text)
                .map_err(|_| "a text message is not UTF-8".into()),
            KIND_BINARY => Ok(Message::Binary(body)),
            other => Err(format!("kind byte {other:#04x} is neither text ('t') nor binary ('b')")),
        }
    }
}

/// The length a stream message's prefix announces, refused over [`MAX_MESSAGE`] before a
/// byte of it is read.
pub fn stream_len(prefix: [u8; 4]) -> Result<usize, String> {
    let n = u32::from_be_bytes(prefix) as usize;
    if n > MAX_MESSAGE {
        return Err(format!("a message of {n} bytes is over the {MAX_MESSAGE}-byte bound"));
    }
    Ok(n)
}

/// A signal's number from its name (`SIGTERM`, `TERM`), for the signals a runner sends.
pub fn signal_number(name: &str) -> Option<i32> {
    let bare = name.strip_prefix("SIG").unwrap_or(name);
    Some(match bare {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "ABRT" => 6,
        "KILL" => 9,
        "USR1" => 10,
        "SEGV" => 11,
        "USR2" => 12,
        "PIPE" => 13,
        "ALRM" => 14,
        "TERM" => 15,
        "CONT" => 18,
        "STOP" => 19,
        "TSTP" => 20,
        "WINCH" => 28,
        _ => return None,
    })
}

/// A signal's name from its number, for [`Request::Kill`].
pub fn signal_name(n: i32) -> Option<&'static str> {
    Some(match n {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        6 => "SIGABRT",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        18 => "SIGCONT",
        19 => "SIGSTOP",
        20 => "SIGTSTP",
        28 => "SIGWINCH",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_2_requests_parse_as_the_seed_sends_them() {
        let r: Request = serde_json::from_str(r#"{"op":"run","id":1,"command":"echo hi","stdin":false}"#).unwrap();
        assert!(
            matches!(r, Request::Run { id: 1, ref command, stdin: false, .. } if command.as_deref() == Some("echo hi"))
        );
        assert!(!r.is_extended());
        let r: Request = serde_json::from_str(r#"{"op":"kill","id":3,"signal":"SIGTERM"}"#).unwrap();
        assert_eq!(
            r,
            Request::Kill {
                id: 3,
                signal: Some("SIGTERM".into()),
                handle: None,
            }
        );
        assert_eq!(r.op(), "kill");
        let r: Request = serde_json::from_str(r#"{"op":"stdin-end","id":4}"#).unwrap();
        assert_eq!(r, Request::StdinEnd { id: 4 });
        assert_eq!(r.op(), "stdin-end");
        let r: Request = serde_json::from_str(r#"{"op":"write","id":5,"path":"a"}"#).unwrap();
        assert_eq!(
            r,
            Request::Write {
                id: 5,
                path: "a".into(),
                mode: None
            }
        );
    }

    #[test]
    fn answers_serialise_as_the_seed_reads_them() {
        let s = serde_json::to_string(&Answer::Exit {
            id: 1,
            code: 0,
            signal: None,
            timeout: false,
        })
        .unwrap();
        assert_eq!(s, r#"{"op":"exit","id":1,"code":0}"#);
        let s = serde_json::to_string(&Answer::Absent { id: 2 }).unwrap();
        assert_eq!(s, r#"{"op":"absent","id":2}"#);
        let s = serde_json::to_string(&Answer::Ok { id: 3 }).unwrap();
        assert_eq!(s, r#"{"op":"ok","id":3}"#);
        let s = serde_json::to_string(&Answer::Error {
            id: None,
            message: "m".into(),
            code: None,
            errno: None,
        })
        .unwrap();
        assert_eq!(s, r#"{"op":"error","message":"m"}"#);
    }

    #[test]
    fn short_frames_and_bad_kinds_are_refused() {
        assert_eq!(unframe(&[0, 0, 0, 1]), None);
        assert_eq!(unframe_seq(&frame(1, STDOUT, b"1234567")), None);
        assert!(Message::decode(vec![]).is_err());
        assert!(Message::decode(vec![b'x', 1]).is_err());
        assert!(Message::decode(vec![b't', 0xff]).is_err());
        assert!(stream_len(((MAX_MESSAGE + 1) as u32).to_be_bytes()).is_err());
    }

    #[test]
    fn signal_names_round_trip() {
        for n in [1, 2, 3, 6, 9, 10, 11, 12, 13, 14, 15, 18, 19, 20, 28] {
            assert_eq!(signal_number(signal_name(n).unwrap()), Some(n));
        }
        assert_eq!(signal_number("TERM"), Some(15));
        assert_eq!(signal_number("SIGNOPE"), None);
    }
}

//! The local box supervisor's protocol.
//!
//! A local box is served by one supervisor process: a child subreaper that owns the box's
//! lifetime and starts every program of the box, so that every program, also one that called
//! setsid or double-forked, stays its descendant and dies with the box. The host talks to it
//! over a unix socket in the box's directory, one connection per exec:
//!
//! 1. the host sends [`Request::Exec`] with the program's stdin, stdout and stderr attached
//!    as three file descriptors (SCM_RIGHTS), so output never passes through the supervisor;
//! 2. the supervisor answers [`Reply::Started`] or [`Reply::Error`];
//! 3. the host may send [`Request::Signal`] any number of times;
//! 4. the supervisor sends [`Reply::Exit`] when the program ends.
//!
//! A dropped connection does not end the program (as with `docker exec`); the box's end does.
//!
//! A connection may instead carry one control request ([`Request::Deadline`],
//! [`Request::Sleep`], [`Request::Wake`], [`Request::Destroy`], [`Request::Ping`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The socket's file name in the box directory.
pub const SOCKET_NAME: &str = "supervisor.sock";

/// The line the supervisor writes on its stdout once it serves: `ready <pid>`.
pub const READY_PREFIX: &str = "ready ";

/// What the host asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Start a program with exactly this environment, in `cwd`, on the three attached fds.
    Exec {
        /// The program and its arguments.
        argv: Vec<String>,
        /// The whole environment; nothing else is inherited.
        env: BTreeMap<String, String>,
        /// An absolute working directory.
        cwd: String,
    },
    /// Send a signal to the program this connection started.
    Signal {
        /// The signal number.
        signal: i32,
    },
    /// End every program, remove the box directory, and exit.
    Destroy,
    /// End the box at `deadline_ms` (milliseconds since the Unix epoch) instead, later or
    /// earlier. Answered [`Reply::Ok`].
    Deadline {
        /// The new deadline.
        deadline_ms: u64,
    },
    /// End every program and take no exec (each refused `refused`) until [`Request::Wake`]:
    /// the box sleeps, its files kept and its deadline still kept. Answered [`Reply::Ok`].
    Sleep,
    /// Take execs again. Answered [`Reply::Ok`].
    Wake,
    /// Answer [`Reply::Ok`].
    Ping,
}

/// What the supervisor answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// The program runs with this pid.
    Started {
        /// Its process id.
        pid: u32,
    },
    /// The program ended.
    Exit {
        /// Its exit code, 128 + signal when a signal ended it.
        code: i32,
        /// The signal that ended it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
    },
    /// The request failed.
    Error {
        /// An agentbox error code: `not_found`, `gone`, `invalid`...
        code: String,
        /// What failed and why.
        message: String,
    },
    /// Done.
    Ok,
}

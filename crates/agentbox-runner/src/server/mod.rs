//! The runner server: one connection for every process and file of a box.
//!
//! It listens on TCP or unix sockets (HTTP health at [`HEALTH_PATH`], a WebSocket on any other
//! path), or serves one connection over its own stdin and stdout ([`Config::stdio`]); `relay`
//! carries a byte stream to a runner's unix socket, so a box with no network still reaches a
//! runner whose processes outlive the exec that talks to it. The protocol is in
//! [`agentbox_protocol::runner`].
//!
//! ```no_run
//! let config = agentbox_runner::server::Config::from_args(&["--listen".into(), "127.0.0.1:7700".into()]).unwrap();
//! agentbox_runner::server::main(config).unwrap();
//! ```

mod conn;
mod files;
mod process;
mod pty;
mod transport;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use agentbox_protocol::runner::{Answer, HEALTH_PATH, PORT};

pub(crate) use transport::DETACHED_ENV;
pub use transport::relay;

/// Bounds on what one runner holds.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Processes known at once, running or ended and not yet forgotten.
    pub max_processes: usize,
    /// Output bytes kept per process: what its holders have not acknowledged, or the ring of
    /// what nobody holds.
    pub max_buffered: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_processes: 256,
            max_buffered: 4 << 20,
        }
    }
}

/// The most processes a runner may be told to hold (`--max-processes`).
pub const MAX_PROCESSES: usize = 4096;

/// Where the runner listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// A TCP address.
    Tcp(std::net::SocketAddr),
    /// A unix socket's path (made mode 0600).
    Unix(PathBuf),
}

impl std::str::FromStr for Listen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err("--listen unix: needs a path".into());
            }
            return Ok(Listen::Unix(p.into()));
        }
        s.parse()
            .map(Listen::Tcp)
            .map_err(|_| format!("--listen {s:?}: not an address such as 0.0.0.0:{PORT} or unix:/path"))
    }
}

/// How the runner serves.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// Sockets to listen on; with neither these nor `stdio`, `0.0.0.0:7700`.
    pub listen: Vec<Listen>,
    /// Serve one connection over stdin and stdout, as length-prefixed messages.
    pub stdio: bool,
    /// Print where it listens, then go on in the background in a session of its own.
    pub detach: bool,
    /// Read a bearer token from the first line of stdin, which every TCP client must send
    /// (`Authorization: Bearer …`). Unix sockets are guarded by their mode instead.
    pub token_stdin: bool,
    /// The bounds.
    pub limits: Limits,
    /// Speak protocol 2 alone, as a runner of the seed's does: `hello` is refused as a request
    /// it does not know (`--protocol 2`), so a client can be tested against such a runner.
    pub protocol_2_only: bool,
}

/// The usage line of `agentbox-runner serve`.
pub const USAGE: &str = "usage: agentbox-runner [serve] [--listen ADDR|unix:PATH]... [--stdio] [--detach] \
                         [--token-stdin] [--max-processes N] [--max-buffered BYTES] [--protocol 2|3]";

impl Config {
    /// Parse `serve`'s arguments.
    pub fn from_args(args: &[String]) -> Result<Config, String> {
        let mut c = Config::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = |name: &str| it.next().cloned().ok_or_else(|| format!("{name} needs a value"));
            match a.as_str() {
                "--listen" => c.listen.push(value("--listen")?.parse()?),
                "--stdio" => c.stdio = true,
                "--detach" => c.detach = true,
                "--token-stdin" => c.token_stdin = true,
                "--max-processes" => {
                    c.limits.max_processes = value("--max-processes")?
                        .parse()
                        .map_err(|_| "--max-processes: not a number".to_string())?
                }
                "--max-buffered" => {
                    c.limits.max_buffered = value("--max-buffered")?
                        .parse()
                        .map_err(|_| "--max-buffered: not a number of bytes".to_string())?
                }
                "--protocol" => match value("--protocol")?.as_str() {
                    "2" => c.protocol_2_only = true,
                    "3" => c.protocol_2_only = false,
                    v => return Err(format!("--protocol {v}: 2 (the seed's alone) or 3 (the default)")),
                },
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        if c.stdio && c.detach {
            return Err("--stdio and --detach: a detached runner has no stdio to serve".into());
        }
        if c.stdio && c.token_stdin {
            return Err("--stdio and --token-stdin: stdin carries the protocol".into());
        }
        if c.limits.max_processes == 0 || c.limits.max_buffered == 0 {
            return Err("--max-processes and --max-buffered must be over 0".into());
        }
        if c.limits.max_processes > MAX_PROCESSES {
            return Err(format!(
                "--max-processes {}: at most {MAX_PROCESSES} (one `ps` answer lists them all)",
                c.limits.max_processes
            ));
        }
        if c.listen.is_empty() && !c.stdio {
            c.listen
                .push(Listen::Tcp(std::net::SocketAddr::from(([0, 0, 0, 0], PORT))));
        }
        Ok(c)
    }
}

/// The runner's shared state: its processes, by handle.
pub(crate) struct Runner {
    limits: Limits,
    /// `hello` is refused: see [`Config::protocol_2_only`].
    protocol_2_only: bool,
    token: Option<String>,
    shell: String,
    procs: Mutex<HashMap<u64, Arc<process::Proc>>>,
    next_handle: AtomicU64,
    next_conn: AtomicU64,
}

impl Runner {
    fn new(limits: Limits, protocol_2_only: bool, token: Option<String>) -> Arc<Self> {
        let shell = if std::path::Path::new("/bin/bash").exists() {
            "/bin/bash"
        } else {
            "/bin/sh"
        };
        Arc::new(Runner {
            limits,
            protocol_2_only,
            token,
            shell: shell.into(),
            procs: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            next_conn: AtomicU64::new(1),
        })
    }

    /// A handle for a new process, or `too_large` when the table is full of running ones.
    /// Ended processes whose exit a client saw make room first.
    fn admit(&self, id: u32) -> Result<u64, Answer> {
        let mut procs = self.procs.lock().unwrap();
        if procs.len() >= self.limits.max_processes {
            let done: Vec<u64> = procs.iter().filter(|(_, p)| p.delivered()).map(|(k, _)| *k).collect();
            for k in done {
                if let Some(p) = procs.remove(&k) {
                    let _ = p.forget();
                }
            }
        }
        if procs.len() >= self.limits.max_processes {
            return Err(Answer::error(
                Some(id),
                "too_large",
                format!(
                    "run: the runner holds {} processes, its bound: wait for one to end, or forget ended ones",
                    procs.len()
                ),
            ));
        }
        Ok(self.next_handle.fetch_add(1, Ordering::Relaxed))
    }

    /// The process of `handle`.
    fn proc(&self, handle: u64) -> Option<Arc<process::Proc>> {
        self.procs.lock().unwrap().get(&handle).cloned()
    }

    /// The process whose `run` carried `key`.
    fn by_key(&self, key: &str) -> Option<Arc<process::Proc>> {
        self.procs
            .lock()
            .unwrap()
            .values()
            .find(|p| p.key.as_deref() == Some(key))
            .cloned()
    }

    /// Kill every process, and wait (up to 5 s) until each exit went out, so a client hears
    /// its processes' exits before `stop`'s answer.
    async fn stop_all(&self) {
        let all: Vec<Arc<process::Proc>> = self.procs.lock().unwrap().values().cloned().collect();
        for p in &all {
            process::kill_group(p.pid as i32, 9);
        }
        let until = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while tokio::time::Instant::now() < until && !all.iter().all(|p| p.settled()) {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}

/// Serve as `config` says; returns when a stdio runner's connection and processes ended
/// (a listening runner serves until it is killed).
pub fn main(config: Config) -> Result<(), String> {
    if config.detach {
        return transport::detach();
    }
    let detached = std::env::var_os(transport::DETACHED_ENV).is_some();
    if detached {
        // SAFETY: no other thread runs yet (the runtime is built below), so nothing reads the
        // environment while it changes. The variable must not reach the box's programs.
        #[allow(unsafe_code)]
        unsafe {
            std::env::remove_var(transport::DETACHED_ENV)
        };
    }
    let token = if config.token_stdin {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .map_err(|e| format!("reading the token from stdin: {e}"))?;
        let t = line.trim().to_string();
        if t.is_empty() {
            return Err("--token-stdin: the first line of stdin is empty".into());
        }
        Some(t)
    } else {
        None
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("starting the runtime: {e}"))?;
    let runner = Runner::new(config.limits, config.protocol_2_only, token);
    rt.block_on(transport::serve(config, runner, detached))
}

/// The health answer's body.
pub(crate) fn health_json() -> String {
    serde_json::json!({ "protocol": agentbox_protocol::runner::PROTOCOL, "pid": std::process::id() }).to_string()
}

/// The path health answers at (re-exported for the transports).
pub(crate) const HEALTH: &str = HEALTH_PATH;

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Result<Config, String> {
        Config::from_args(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn the_default_is_every_address_on_port_7700() {
        let c = args(&[]).unwrap();
        assert_eq!(c.listen, [Listen::Tcp("0.0.0.0:7700".parse().unwrap())]);
        assert!(!c.stdio);
        assert!(
            args(&["--stdio"]).unwrap().listen.is_empty(),
            "stdio alone listens nowhere"
        );
        let c = args(&["--listen", "127.0.0.1:9", "--listen", "unix:/tmp/r.sock"]).unwrap();
        assert_eq!(
            c.listen,
            [
                Listen::Tcp("127.0.0.1:9".parse().unwrap()),
                Listen::Unix("/tmp/r.sock".into())
            ]
        );
    }

    #[test]
    fn bad_arguments_name_themselves() {
        assert!(args(&["--listen", "nowhere"]).unwrap_err().contains("nowhere"));
        assert!(args(&["--listen"]).unwrap_err().contains("--listen"));
        assert!(args(&["--stdio", "--detach"]).unwrap_err().contains("--detach"));
        assert!(args(&["--max-processes", "0"]).unwrap_err().contains("--max-processes"));
        assert!(
            args(&["--max-buffered", "lots"])
                .unwrap_err()
                .contains("--max-buffered")
        );
        assert!(args(&["--listen", "unix:"]).unwrap_err().contains("unix:"));
        assert!(args(&["--protocol", "1"]).unwrap_err().contains("--protocol 1"));
        assert!(args(&["--protocol", "2"]).unwrap().protocol_2_only);
        // One `ps` answer lists every process: their number is bounded.
        assert!(args(&["--max-processes", "5000"]).unwrap_err().contains("at most 4096"));
    }
}

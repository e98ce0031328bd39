//! The local box supervisor: the one process every program of a local box descends from.
//!
//! It makes itself a child subreaper, so a program that double-forks or calls setsid is
//! reparented to it rather than to init, and stays findable. It owns the box's lifetime: at
//! the deadline, or when asked to destroy, it kills every descendant until a walk of /proc
//! finds none left, removes the box directory and exits. The host needs to be alive for none
//! of this. See `agentbox_protocol::supervisor` for the wire protocol.
//!
//! Threads and blocking calls, no async runtime: it serves one box, a handful of connections.

use std::collections::HashSet;
use std::io::{IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use agentbox_protocol::frame;
use agentbox_protocol::supervisor::{READY_PREFIX, Reply, Request, SOCKET_NAME};
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
use rustix::process::{Pid, Signal, WaitOptions};

/// How the supervisor is started.
#[derive(Clone, Debug)]
pub struct Config {
    /// The box directory; the socket is made in it and it is removed at the end.
    pub dir: PathBuf,
    /// When the box ends, in milliseconds since the Unix epoch.
    pub deadline_ms: u64,
}

impl Config {
    /// Parse `--dir D --deadline-ms N`.
    pub fn from_args(args: &[String]) -> Result<Config, String> {
        let mut dir = None;
        let mut deadline = None;
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--dir" => dir = it.next().map(PathBuf::from),
                "--deadline-ms" => {
                    let v = it.next().ok_or("--deadline-ms needs a value")?;
                    deadline = Some(
                        v.parse::<u64>()
                            .map_err(|_| format!("--deadline-ms: {v:?} is not a number"))?,
                    );
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        let dir = dir.ok_or("--dir is required")?;
        if !dir.is_absolute() {
            return Err("--dir must be an absolute path".into());
        }
        Ok(Config {
            dir,
            deadline_ms: deadline.ok_or("--deadline-ms is required")?,
        })
    }
}

struct State {
    /// The pids of programs started through an exec, each waited for by its own thread.
    execs: HashSet<i32>,
    /// Set once the box is ending: no new program starts.
    ending: bool,
    /// The box sleeps: no program starts until it wakes.
    asleep: bool,
    /// When the box ends; a [`Request::Deadline`] moves it and wakes the deadline's thread.
    deadline_ms: u64,
}

struct Supervisor {
    cfg: Config,
    me: i32,
    state: Mutex<State>,
    /// Signalled when the deadline moves.
    moved: Condvar,
}

/// Serve the box until it ends, then exit the process. Returns only on a setup failure.
pub fn run(cfg: Config) -> Result<std::convert::Infallible, String> {
    // A session of its own: no terminal's hangup or ^C reaches the box through the host.
    let _ = rustix::process::setsid();
    rustix::process::set_child_subreaper(Pid::from_raw(std::process::id() as i32))
        .map_err(|e| format!("cannot become the box's subreaper: {e}"))?;
    let sock = cfg.dir.join(SOCKET_NAME);
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock).map_err(|e| format!("binding {}: {e}", sock.display()))?;
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("chmod {}: {e}", sock.display()))?;

    let cfg_deadline = cfg.deadline_ms;
    let sup = Arc::new(Supervisor {
        me: std::process::id() as i32,
        cfg,
        state: Mutex::new(State {
            execs: HashSet::new(),
            ending: false,
            asleep: false,
            deadline_ms: cfg_deadline,
        }),
        moved: Condvar::new(),
    });

    {
        let sup = sup.clone();
        std::thread::spawn(move || {
            // Wait for the deadline as it stands, again each time it moves, on the monotonic
            // clock: a wall clock set back must not keep the box alive past its lifetime.
            let st = crate::deadline::wait(sup.state.lock().unwrap(), &sup.moved, |s| s.deadline_ms);
            drop(st);
            sup.end_box();
            std::process::exit(0);
        });
    }
    {
        let sup = sup.clone();
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(500));
                sup.reap_orphans();
            }
        });
    }

    // Tell the host we serve, then let go of its pipe so it sees the end of our stdout.
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{READY_PREFIX}{}", sup.me);
    let _ = out.flush();
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = rustix::stdio::dup2_stdout(&null);
    }

    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let sup = sup.clone();
        std::thread::spawn(move || sup.serve(conn));
    }
    Err("the listener stopped".into())
}

impl Supervisor {
    fn serve(self: &Arc<Self>, conn: UnixStream) {
        let (req, fds) = match recv_with_fds(&conn) {
            Ok(Some(x)) => x,
            Ok(None) => return,
            Err(e) => {
                let _ = frame::write_sync(&mut &conn, &error("invalid", &e));
                return;
            }
        };
        match req {
            Request::Ping => {
                let _ = frame::write_sync(&mut &conn, &Reply::Ok);
            }
            Request::Destroy => {
                self.end_box();
                let _ = frame::write_sync(&mut &conn, &Reply::Ok);
                std::process::exit(0);
            }
            Request::Deadline { deadline_ms } => {
                self.state.lock().unwrap().deadline_ms = deadline_ms;
                self.moved.notify_all();
                let _ = frame::write_sync(&mut &conn, &Reply::Ok);
            }
            Request::Sleep => {
                self.state.lock().unwrap().asleep = true;
                self.kill_descendants();
                let _ = frame::write_sync(&mut &conn, &Reply::Ok);
            }
            Request::Wake => {
                self.state.lock().unwrap().asleep = false;
                let _ = frame::write_sync(&mut &conn, &Reply::Ok);
            }
            Request::Signal { .. } => {
                let _ = frame::write_sync(
                    &mut &conn,
                    &error("invalid", "signal before any exec on this connection"),
                );
            }
            Request::Exec { argv, env, cwd } => self.exec(conn, argv, env, cwd, fds),
        }
    }

    fn exec(
        self: &Arc<Self>,
        conn: UnixStream,
        argv: Vec<String>,
        env: std::collections::BTreeMap<String, String>,
        cwd: String,
        fds: Vec<OwnedFd>,
    ) {
        let reply = |r: &Reply| frame::write_sync(&mut &conn, r);
        let Ok::<[OwnedFd; 3], _>([stdin, stdout, stderr]) = fds.try_into() else {
            let _ = reply(&error(
                "invalid",
                "an exec needs exactly three descriptors: stdin, stdout, stderr",
            ));
            return;
        };
        if argv.is_empty() {
            let _ = reply(&error("invalid", "argv is empty: no program to run"));
            return;
        }
        if !Path::new(&cwd).is_dir() {
            let _ = reply(&error("not_found", &format!("working directory {cwd} does not exist")));
            return;
        }
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env_clear()
            .envs(&env)
            .current_dir(&cwd)
            .stdin(Stdio::from(stdin))
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(stderr));
        // Spawn and register under the lock, so the orphan reaper never waits for an exec's
        // program (its own thread does), and nothing starts once the box is ending.
        let pid = {
            let mut st = self.state.lock().unwrap();
            if st.ending {
                let _ = reply(&error("gone", "the box is ending"));
                return;
            }
            if st.asleep {
                let _ = reply(&error("refused", "the box sleeps: wake it first"));
                return;
            }
            match cmd.spawn() {
                Ok(child) => {
                    let pid = child.id() as i32;
                    st.execs.insert(pid);
                    pid
                }
                Err(e) => {
                    let (code, why) = match e.kind() {
                        std::io::ErrorKind::NotFound => ("not_found", "not found"),
                        std::io::ErrorKind::PermissionDenied => ("permission_denied", "not executable"),
                        _ => ("unknown", "cannot be started"),
                    };
                    let _ = reply(&error(code, &format!("program {:?} {why}: {e}", argv[0])));
                    return;
                }
            }
        };
        drop(cmd); // closes our copies of the three descriptors
        let writer = Arc::new(Mutex::new(match conn.try_clone() {
            Ok(w) => w,
            Err(_) => return,
        }));
        let _ = frame::write_sync(&mut *writer.lock().unwrap(), &Reply::Started { pid: pid as u32 });

        let sup = self.clone();
        let exit_writer = writer.clone();
        std::thread::spawn(move || {
            let status = wait_for(pid);
            sup.state.lock().unwrap().execs.remove(&pid);
            let _ = frame::write_sync(&mut *exit_writer.lock().unwrap(), &status);
        });

        // Signals for this program, until the host hangs up. A hang-up does not end it.
        let mut r = &conn;
        while let Ok(Some(req)) = frame::read_sync::<Request>(&mut r) {
            match req {
                Request::Signal { signal } => {
                    let st = self.state.lock().unwrap();
                    // Only while it is ours and unreaped: its pid cannot have been reused.
                    if st.execs.contains(&pid)
                        && let Some(sig) = signal_from(signal)
                        && let Some(p) = Pid::from_raw(pid)
                    {
                        let _ = rustix::process::kill_process(p, sig);
                    }
                }
                _ => {
                    let _ = frame::write_sync(
                        &mut *writer.lock().unwrap(),
                        &error("invalid", "only signal requests follow an exec"),
                    );
                }
            }
        }
    }

    /// Kill every descendant until none is left, then remove the box directory.
    fn end_box(&self) {
        self.state.lock().unwrap().ending = true;
        self.kill_descendants();
        let _ = std::fs::remove_dir_all(&self.cfg.dir);
    }

    /// Kill every descendant until a walk of /proc finds none left (or ten seconds pass).
    fn kill_descendants(&self) {
        for _ in 0..2000 {
            let alive: Vec<_> = agentbox_proc::descendants(self.me)
                .into_iter()
                .filter(|p| !p.is_zombie())
                .collect();
            if alive.is_empty() {
                break;
            }
            for p in alive {
                if let Some(pid) = Pid::from_raw(p.pid) {
                    let _ = rustix::process::kill_process(pid, Signal::KILL);
                }
            }
            self.reap_orphans();
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Wait for the zombies reparented to us that no exec thread waits for.
    fn reap_orphans(&self) {
        // Its own children are all an orphan can be (it is their subreaper): read from its
        // threads' `children` files, not from a walk of every process, which a thousand
        // supervisors each doing twice a second turned into the machine's whole load.
        let children = agentbox_proc::children(self.me).unwrap_or_else(|| agentbox_proc::descendants(self.me));
        let st = self.state.lock().unwrap();
        for p in children {
            if p.ppid == self.me
                && p.is_zombie()
                && !st.execs.contains(&p.pid)
                && let Some(pid) = Pid::from_raw(p.pid)
            {
                let _ = rustix::process::waitpid(Some(pid), WaitOptions::NOHANG);
            }
        }
    }
}

fn wait_for(pid: i32) -> Reply {
    let Some(p) = Pid::from_raw(pid) else {
        return error("unknown", "bad pid");
    };
    loop {
        match rustix::process::waitpid(Some(p), WaitOptions::empty()) {
            Ok(Some((_, status))) => {
                if let Some(sig) = status.terminating_signal() {
                    return Reply::Exit {
                        code: 128 + sig,
                        signal: Some(sig),
                    };
                }
                if let Some(code) = status.exit_status() {
                    return Reply::Exit { code, signal: None };
                }
            }
            Ok(None) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return error("unknown", &format!("waiting for the program: {e}")),
        }
    }
}

/// The standard signals 1 to 31; the real-time ones belong to the C library. rustix's checked
/// constructor knows every one of them by name, so no unchecked conversion is needed.
pub(crate) fn signal_from(n: i32) -> Option<Signal> {
    Signal::from_named_raw(n)
}

fn error(code: &str, message: &str) -> Reply {
    Reply::Error {
        code: code.into(),
        message: message.into(),
    }
}

/// Read one request frame, taking the descriptors that ride with its first bytes.
fn recv_with_fds(conn: &UnixStream) -> Result<Option<(Request, Vec<OwnedFd>)>, String> {
    let mut prefix = [0u8; 4];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let mut fds = Vec::new();
    let mut got = 0;
    while got < 4 {
        let msg = rustix::net::recvmsg(
            conn,
            &mut [IoSliceMut::new(&mut prefix[got..])],
            &mut cmsg,
            RecvFlags::CMSG_CLOEXEC,
        )
        .map_err(|e| format!("reading a request: {e}"))?;
        for m in cmsg.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = m {
                fds.extend(rights);
            }
        }
        if msg.bytes == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err("the request was cut short".into())
            };
        }
        got += msg.bytes;
    }
    let mut r = conn;
    let n = frame::body_len(prefix).map_err(|e| e.to_string())?;
    let mut body = vec![0u8; n];
    r.read_exact(&mut body).map_err(|e| format!("reading a request: {e}"))?;
    let req = frame::decode(&body).map_err(|e| e.to_string())?;
    Ok(Some((req, fds)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_checked() {
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert!(Config::from_args(&args("--dir /b --deadline-ms 5")).is_ok());
        assert!(Config::from_args(&args("--dir b --deadline-ms 5")).is_err());
        assert!(Config::from_args(&args("--dir /b")).is_err());
        assert!(Config::from_args(&args("--dir /b --deadline-ms x")).is_err());
        assert!(Config::from_args(&args("--dir /b --deadline-ms 5 --what")).is_err());
    }

    #[test]
    fn every_standard_signal_converts_and_nothing_else() {
        for n in 1..=31 {
            assert_eq!(signal_from(n).map(Signal::as_raw), Some(n), "signal {n}");
        }
        for n in [0, -1, 32, 34, 64, 65] {
            assert!(signal_from(n).is_none(), "signal {n}");
        }
    }
}

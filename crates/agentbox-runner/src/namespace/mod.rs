//! A namespace box, built from inside: the keeper and the init.
//!
//! `agentbox-runner namespace DIR` is the **keeper**. It reads `DIR/box.json`
//! ([`agentbox_protocol::namespace::BoxConfig`]), unshares a user, mount, pid, ipc, uts and
//! cgroup namespace (and a net namespace of its own unless the box's network is `host`: with
//! `network: none` it has loopback alone, otherwise loopback and the bridge to the egress
//! proxy), waits while the host writes its
//! id maps, then starts the box's **init** (`agentbox-runner namespace-init DIR`, pid 1 of the
//! new pid namespace) and waits for it to end, then exits. It stays outside the
//! box's pid namespace, so no program of the box can see or signal it. Before the pid
//! namespace it forks the box's unix socket supervisor ([`sockets`]), which answers every
//! `connect`, `sendmsg`, `sendmmsg` and addressed `sendto` of the box so that no socket of
//! this machine's is reached.
//!
//! The init builds the box's file system ([`fs`]), hardens itself ([`harden`]: rlimits,
//! no_new_privs, landlock, every capability dropped, seccomp), starts the runner (pid 2, which
//! inherits all of it, as does every program the runner starts) and then reaps orphans until
//! the box's deadline, when it exits: the kernel then kills every program of the pid
//! namespace, whether or not the host is alive. A runner that dies is started again, a few
//! times at most.
//!
//! The init also serves a control socket ([`CONTROL`]) in the box's directory on the host,
//! bound before the pivot and so outside everything the box can reach: the host moves the
//! deadline there (`Deadline`, later or earlier, which the deadline's thread then keeps),
//! sleeps the box (`Sleep`: every process but the init killed, no runner started again, the
//! deadline still kept) and wakes it (`Wake`: a runner started, answered once it listens).
//! Only the host can ask: the socket's path is not in the box's mount tree, the listening
//! socket cannot be reopened through `/proc/1/fd` (and `pidfd_getfd` is refused by seccomp),
//! and the init answers a peer inside its pid namespace `refused` (see [`from_outside`]).
//!
//! bubblewrap could do most of the file system, but Debian's bwrap (0.8) has no overlay flags
//! and no seccomp from a profile we write, and a second program to find and trust in every box;
//! these calls are few, each one a rustix call or one syscall, so they live here.

mod fs;
mod harden;
mod ports;
mod sockets;

use std::io::{BufRead, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use agentbox_protocol::frame;
use agentbox_protocol::namespace::{
    BoxConfig, CONFIG_FILE, CONTROL, ERROR_PREFIX, INIT_PREFIX, MAPPED, PORTS_PREFIX, READY_PREFIX, RUN_DIR, RUNNER,
    SOCKET, UNSHARED, WORKSPACE,
};
use agentbox_protocol::supervisor::{Reply, Request};
use rustix::process::{Pid, WaitOptions};
use rustix::thread::UnshareFlags;

/// How many times the init starts a runner that died before it ends the box.
const RUNNER_RESTARTS: u32 = 5;

/// The box's config in `dir`: at most 1 MiB, valid, and naming `dir` as its own.
pub(crate) fn read_config(dir: &Path) -> Result<BoxConfig, String> {
    let path = dir.join(CONFIG_FILE);
    let bytes = std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    if bytes.len() > 1 << 20 {
        return Err(format!("{}: over 1 MiB, not a box config", path.display()));
    }
    let c: BoxConfig =
        serde_json::from_slice(&bytes).map_err(|e| format!("{}: not a box config: {e}", path.display()))?;
    c.validate()?;
    if Path::new(&c.dir) != dir {
        return Err(format!(
            "{}: names the directory {}, not its own",
            path.display(),
            c.dir
        ));
    }
    Ok(c)
}

/// The arguments this program was started with before `subcommand` (`["runner"]` when it is
/// the `agentbox` binary), so it can start itself again the same way.
fn prefix(subcommand: &str) -> Vec<String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().position(|a| a == subcommand) {
        Some(i) => args[..i].to_vec(),
        None => vec![],
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The keeper (see the [module documentation](self)). Returns only on a failure, which it has
/// also said on stdout.
pub fn keeper(dir: &Path) -> Result<std::convert::Infallible, String> {
    let r = keeper_inner(dir);
    if let Err(e) = &r {
        say(&format!("{ERROR_PREFIX}{e}"));
    }
    r
}

fn keeper_inner(dir: &Path) -> Result<std::convert::Infallible, String> {
    let cfg = read_config(dir)?;
    // A session of its own: no terminal's hangup or ^C reaches the box through the host.
    let _ = rustix::process::setsid();
    let mut flags = UnshareFlags::NEWUSER
        | UnshareFlags::NEWNS
        | UnshareFlags::NEWPID
        | UnshareFlags::NEWIPC
        | UnshareFlags::NEWUTS
        | UnshareFlags::NEWCGROUP;
    if cfg.network_none || cfg.egress.is_some() {
        flags |= UnshareFlags::NEWNET;
    }
    let host_network = sockets::net_namespace();
    // The egress proxy, started while this process is still in the host's network (and its
    // user), so it resolves and connects from there. Its stdin is held until this process
    // exits, which is the box's end; then it ends too.
    let _proxy = match &cfg.egress {
        Some(e) => {
            // A box with secrets: the host's first line is their plan, for the proxy alone.
            let secrets = if e.secrets.is_empty() {
                None
            } else {
                let mut line = String::new();
                std::io::stdin()
                    .lock()
                    .take(1 << 20)
                    .read_line(&mut line)
                    .map_err(|e| format!("reading the box's secrets: {e}"))?;
                Some(line)
            };
            Some(start_egress(dir, secrets)?)
        }
        None => None,
    };
    // The box's ports: listened on in the host's network, forwarded from the box's.
    let ports = ports::listen(&cfg.ports)?;
    if !ports.is_empty() {
        say(&format!("{PORTS_PREFIX}{}", ports::line(&ports)?));
    }
    // SAFETY: unshare's hazard is CLONE_FILES with other threads holding descriptors; it is not
    // asked for, and this program has started no thread.
    #[allow(unsafe_code)]
    unsafe { rustix::thread::unshare_unsafe(flags - UnshareFlags::NEWPID) }.map_err(explain_unshare)?;
    // The unix socket supervisor ([`sockets`]): a process of the box's user, mount and network
    // namespaces, but of this machine's pid namespace (so, made before the new one, it has
    // threads and no program of the box sees it).
    let given: Vec<String> = cfg.mounts.iter().map(|m| m.target.clone()).collect();
    let mut supervisor = sockets::Supervisor::start(host_network, given)?;
    // SAFETY: as above.
    #[allow(unsafe_code)]
    unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWPID) }.map_err(explain_unshare)?;
    say(UNSHARED);
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| format!("waiting for the id maps: {e}"))?;
    if line.trim() != MAPPED {
        return Err(format!(
            "the host did not map the box's ids (it said {:?})",
            line.trim()
        ));
    }
    // What the init must reach on the host: opened here, where the host user's own
    // permissions still apply (a root host's box is another id of the host's, which may not
    // search the directories its box lives under), and handed down as descriptors.
    let handles = Handles::open(&cfg)?;
    // The init's stdin is a socket pair: its config goes down, and its unix socket filter's
    // listener comes back up, to the supervisor.
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    // The init is root of the box's user namespace (the one id the host mapped), so it holds
    // every capability there until it drops them.
    let init = Command::new(&exe)
        .args(prefix("namespace"))
        .arg("namespace-init")
        .arg(dir)
        .env_clear()
        .uid(0)
        .gid(0)
        .stdin(supervisor.init_stdin()?)
        .spawn()
        .map_err(|e| format!("starting the box's init: {e}"))?;
    {
        let to_init = supervisor.init_config();
        let config = serde_json::to_string(&cfg).map_err(|e| e.to_string())?;
        let fds = serde_json::to_string(&handles.numbers()).map_err(|e| e.to_string())?;
        writeln!(to_init, "{config}\n{fds}").map_err(|e| format!("handing the init its config: {e}"))?;
    }
    drop(handles);
    drop(supervisor);
    let pid = init.id();
    say(&format!("{INIT_PREFIX}{pid}"));
    // The init talks to the host on this same pipe; the keeper lets go of it.
    to_dev_null();
    if let Some(p) = Pid::from_raw(pid as i32) {
        // With ports, the keeper carries their connections until the init ends; the init is
        // its child and not yet reaped, so its pid names it.
        if !ports.is_empty() {
            match rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) {
                Ok(init) => {
                    if let Err(e) = ports::serve_until(ports, init) {
                        eprintln!("agentbox-runner namespace: the box's ports: {e}");
                    }
                }
                Err(e) => eprintln!("agentbox-runner namespace: watching the init for the ports: {e}"),
            }
        }
        while let Err(rustix::io::Errno::INTR) = rustix::process::waitpid(Some(p), WaitOptions::empty()) {}
    }
    // The box's directory is left to the host (the next attach, list or open that finds the
    // box ended removes it): the init's pivot moved this process's root too (one mount
    // namespace), so the host's path to it is not this process's to reach any more.
    std::process::exit(0)
}

/// Start `agentbox-runner egress DIR`, hand it the box's `secrets` line (if any) on its stdin,
/// and wait for it to listen; its stdin, to hold.
fn start_egress(dir: &Path, secrets: Option<String>) -> Result<std::process::ChildStdin, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let mut proxy = Command::new(&exe)
        .args(prefix("namespace"))
        .arg("egress")
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the egress proxy: {e}"))?;
    let mut stdin = proxy.stdin.take().ok_or("the egress proxy has no stdin")?;
    if let Some(mut line) = secrets {
        let written = stdin.write_all(line.as_bytes()).and_then(|()| stdin.flush());
        // This process's copy of the values goes now; the proxy holds its own.
        line.clear();
        written.map_err(|e| format!("handing the egress proxy the box's secrets: {e}"))?;
    }
    let stdout = proxy.stdout.take().ok_or("the egress proxy has no stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| format!("waiting for the egress proxy: {e}"))?;
    if line.trim() != agentbox_protocol::namespace::EGRESS_READY {
        let _ = proxy.kill();
        let _ = proxy.wait();
        return Err(format!("the egress proxy did not start: {}", line.trim()));
    }
    Ok(stdin)
}

fn explain_unshare(e: rustix::io::Errno) -> String {
    let mut why = format!("unshare: {e}");
    if e == rustix::io::Errno::PERM || e == rustix::io::Errno::NOSPC {
        for (path, hint) in [
            ("/proc/sys/kernel/unprivileged_userns_clone", "must be 1"),
            ("/proc/sys/user/max_user_namespaces", "must be over 0"),
            (
                "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
                "must be 0 (or an AppArmor profile must allow agentbox-runner)",
            ),
        ] {
            if let Ok(v) = std::fs::read_to_string(path) {
                why.push_str(&format!(
                    "; {} is {} ({hint})",
                    path.trim_start_matches("/proc/sys/"),
                    v.trim()
                ));
            }
        }
    }
    why
}

fn to_dev_null() {
    if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        let _ = rustix::stdio::dup2_stdout(&null);
    }
}

/// The init (see the [module documentation](self)). Returns only on a failure, which it has
/// also said on stdout.
pub fn init(dir: &Path) -> Result<std::convert::Infallible, String> {
    let r = init_inner(dir);
    if let Err(e) = &r {
        say(&format!("{ERROR_PREFIX}{e}"));
    }
    r
}

fn init_inner(dir: &Path) -> Result<std::convert::Infallible, String> {
    if std::process::id() != 1 {
        return Err("namespace-init must be the first process of a new pid namespace".into());
    }
    let (cfg, fds) = read_from_keeper()?;
    if Path::new(&cfg.dir) != dir {
        return Err(format!("the keeper's config names {}, not {}", cfg.dir, dir.display()));
    }
    harden::drop_host_groups();
    // The control socket, in the box's directory on the host, bound before the pivot leaves
    // that directory unreachable: the listening socket is all the init keeps of it (a socket
    // cannot be opened again through /proc/1/fd, and seccomp refuses pidfd_getfd).
    let control = std::os::unix::net::UnixListener::bind(format!("/proc/self/fd/{}/{CONTROL}", fds.dir))
        .map_err(|e| format!("binding the control socket: {e}"))?;
    fs::build(&cfg, &fds)?;
    rustix::system::sethostname(cfg.name.as_bytes()).map_err(|e| format!("sethostname: {e}"))?;
    // The bridge to the egress proxy: loopback up and its port bound while the init still may;
    // its thread started once the init is hardened, so it runs as hardened as the rest.
    let bridge = match &cfg.egress {
        Some(e) => {
            harden::loopback_up()?;
            Some(crate::egress::listen(e.port)?)
        }
        None => None,
    };
    let landlock = harden::apply(&cfg)?;
    sockets::hand_over(sockets::confine()?)?;
    if let Some(l) = bridge {
        std::thread::Builder::new()
            .name("egress-bridge".into())
            .spawn(move || crate::egress::bridge(l, crate::egress::namespace_socket()))
            .map_err(|e| format!("starting the egress bridge: {e}"))?;
    }
    let prefix = prefix("namespace-init");
    let runner = start_runner(&cfg, &prefix)?;
    let init = std::sync::Arc::new(Init {
        deadline_ms: std::sync::Mutex::new(cfg.deadline_ms),
        st: std::sync::Mutex::new(State {
            asleep: false,
            runner: Some(runner),
            restarts: 0,
        }),
        moved: std::sync::Condvar::new(),
        cfg,
        prefix,
    });
    {
        let init = init.clone();
        std::thread::spawn(move || init.watch_deadline());
    }
    {
        let init = init.clone();
        std::thread::spawn(move || init.serve(control));
    }
    say(&format!("{READY_PREFIX}{landlock}"));
    to_dev_null();
    init.reap()
}

/// The init's state, shared by its threads: the deadline's, the control socket's and the
/// reaper (the main thread).
struct Init {
    cfg: BoxConfig,
    prefix: Vec<String>,
    /// When the box ends; [`Request::Deadline`] moves it. A lock of its own, held only to read
    /// or set it: the deadline's thread never waits for a runner's start.
    deadline_ms: std::sync::Mutex<u64>,
    /// Signalled when the deadline moves.
    moved: std::sync::Condvar,
    st: std::sync::Mutex<State>,
}

struct State {
    /// The box sleeps: its programs were ended and no runner is started until it wakes.
    asleep: bool,
    /// The runner's pid, while one runs.
    runner: Option<u32>,
    /// How many times a runner that died was started again.
    restarts: u32,
}

impl Init {
    /// Exit at the deadline as it stands, waiting again each time it moves: pid 1 exits and
    /// the kernel kills every program of the box, whether or not the host is alive, asleep or
    /// not.
    fn watch_deadline(&self) -> ! {
        // On the monotonic clock: a wall clock set back must not keep the box alive.
        let deadline = self.deadline_ms.lock().unwrap_or_else(|p| p.into_inner());
        let _ended = crate::deadline::wait(deadline, &self.moved, |d| *d);
        std::process::exit(0);
    }

    /// Reap every orphan until the box ends; start a runner that died again, a few times at
    /// most, unless the box sleeps.
    fn reap(&self) -> ! {
        loop {
            match rustix::process::wait(WaitOptions::empty()) {
                Ok(Some((pid, _))) => {
                    let pid = pid.as_raw_nonzero().get() as u32;
                    let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
                    if st.runner != Some(pid) {
                        continue;
                    }
                    st.runner = None;
                    if st.asleep {
                        continue;
                    }
                    if st.restarts >= RUNNER_RESTARTS {
                        eprintln!(
                            "agentbox-runner namespace-init: the runner died {} times; the box ends",
                            st.restarts
                        );
                        std::process::exit(1);
                    }
                    st.restarts += 1;
                    std::thread::sleep(Duration::from_millis(100));
                    // Under the lock: a wake or a sleep waits for this start, and the reaper
                    // knows the new runner's pid before it can reap it.
                    match start_runner(&self.cfg, &self.prefix) {
                        Ok(pid) => st.runner = Some(pid),
                        Err(e) => {
                            eprintln!("agentbox-runner namespace-init: {e}; the box ends");
                            std::process::exit(1);
                        }
                    }
                }
                Ok(None) => {}
                Err(rustix::io::Errno::INTR) => {}
                // No child at all (a sleeping box, or a runner about to start): nothing to
                // reap yet; never busy-wait.
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Serve the control socket: one request a connection, from the host only.
    fn serve(&self, control: std::os::unix::net::UnixListener) {
        for conn in control.incoming() {
            let Ok(mut conn) = conn else { continue };
            // A connection stuck half way must not hold the socket for ever.
            let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = conn.set_write_timeout(Some(Duration::from_secs(10)));
            // Read first, so that a refused peer reads its refusal rather than a reset.
            let req = match frame::read_sync::<Request>(&mut conn) {
                Ok(Some(req)) => req,
                _ => continue,
            };
            let reply = if from_outside(&conn) {
                self.answer(req)
            } else {
                Reply::Error {
                    code: "refused".into(),
                    message: "the box's control takes no request from a program of the box".into(),
                }
            };
            let _ = frame::write_sync(&mut conn, &reply);
        }
    }

    fn answer(&self, req: Request) -> Reply {
        match req {
            Request::Deadline { deadline_ms } => {
                *self.deadline_ms.lock().unwrap_or_else(|p| p.into_inner()) = deadline_ms;
                self.moved.notify_all();
                Reply::Ok
            }
            Request::Sleep => {
                {
                    let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
                    st.asleep = true;
                }
                match kill_all_but_me() {
                    Ok(()) => Reply::Ok,
                    Err(e) => Reply::Error {
                        code: "unknown".into(),
                        message: e,
                    },
                }
            }
            Request::Wake => {
                let mut st = self.st.lock().unwrap_or_else(|p| p.into_inner());
                st.asleep = false;
                if st.runner.is_some() {
                    return Reply::Ok;
                }
                match start_runner(&self.cfg, &self.prefix) {
                    Ok(pid) => {
                        st.runner = Some(pid);
                        Reply::Ok
                    }
                    Err(e) => Reply::Error {
                        code: "unknown".into(),
                        message: format!("waking the box: {e}"),
                    },
                }
            }
            Request::Ping => Reply::Ok,
            other => Reply::Error {
                code: "invalid".into(),
                message: format!("the box's control takes deadline, sleep, wake and ping, not {other:?}"),
            },
        }
    }
}

/// The peer is no process of the box's pid namespace: the kernel names a peer outside it pid
/// 0 (in the init's namespace it has no pid). Only the host connects from there; the path is
/// not in the box's mount tree either, so this is the second of two locks.
fn from_outside(conn: &std::os::unix::net::UnixStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: -1,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a live local of that size,
    // on a descriptor this function borrows for the call.
    #[allow(unsafe_code)]
    let r = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    r == 0 && cred.pid == 0
}

/// End every process of the box but the init, until none is left (or ten seconds pass): what a
/// sleep keeps is the files. `kill(-1)` from pid 1 reaches every other process of its pid
/// namespace; the reaper collects them, and `ESRCH` says none is left.
fn kill_all_but_me() -> Result<(), String> {
    for _ in 0..2000 {
        // SAFETY: a plain syscall with no pointer argument.
        #[allow(unsafe_code)]
        let r = unsafe { libc::kill(-1, libc::SIGKILL) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::ESRCH) {
                Ok(())
            } else {
                Err(format!("ending the box's programs: {e}"))
            };
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Err("ending the box's programs: some were still alive after 10 s".into())
}

/// Descriptors of what the init binds from the host, open across its exec.
struct Handles {
    dir: std::os::fd::OwnedFd,
    rootfs: Option<std::os::fd::OwnedFd>,
    mounts: Vec<std::os::fd::OwnedFd>,
}

impl Handles {
    fn open(cfg: &BoxConfig) -> Result<Handles, String> {
        use rustix::fs::{Mode, OFlags};
        let open = |p: &str| rustix::fs::open(p, OFlags::PATH, Mode::empty()).map_err(|e| format!("opening {p}: {e}"));
        Ok(Handles {
            dir: open(&cfg.dir)?,
            rootfs: match &cfg.root {
                agentbox_protocol::namespace::Root::Rootfs(p) => Some(open(p)?),
                agentbox_protocol::namespace::Root::Host => None,
            },
            mounts: cfg.mounts.iter().map(|m| open(&m.source)).collect::<Result<_, _>>()?,
        })
    }

    fn numbers(&self) -> fs::Fds {
        use std::os::fd::AsRawFd;
        fs::Fds {
            dir: self.dir.as_raw_fd(),
            rootfs: self.rootfs.as_ref().map(|f| f.as_raw_fd()),
            mounts: self.mounts.iter().map(|f| f.as_raw_fd()).collect(),
        }
    }
}

/// The config and descriptors the keeper wrote on the init's stdin.
fn read_from_keeper() -> Result<(BoxConfig, fs::Fds), String> {
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    let mut next = |what: &str| -> Result<String, String> {
        line.clear();
        (&mut stdin)
            .take(1 << 20)
            .read_line(&mut line)
            .map_err(|e| format!("reading the {what} from the keeper: {e}"))?;
        Ok(line.clone())
    };
    let cfg: BoxConfig = serde_json::from_str(&next("config")?).map_err(|e| format!("the keeper's config: {e}"))?;
    cfg.validate()?;
    let fds: fs::Fds =
        serde_json::from_str(&next("descriptors")?).map_err(|e| format!("the keeper's descriptors: {e}"))?;
    if fds.mounts.len() != cfg.mounts.len() {
        return Err("the keeper's descriptors do not match its mounts".into());
    }
    Ok((cfg, fds))
}

/// Start the runner on the box's socket and wait until it listens; its pid.
fn start_runner(cfg: &BoxConfig, prefix: &[String]) -> Result<u32, String> {
    let socket = PathBuf::from(RUN_DIR).join(SOCKET);
    let _ = std::fs::remove_file(&socket);
    let mut child = Command::new(RUNNER)
        .args(prefix)
        .arg("serve")
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .env_clear()
        .envs(&cfg.env)
        .env(crate::server::DETACHED_ENV, "1")
        .current_dir(WORKSPACE)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the runner: {e}"))?;
    let pid = child.id();
    let out = child.stdout.take().ok_or("the runner has no stdout")?;
    for line in std::io::BufReader::new(out).lines() {
        let line = line.map_err(|e| format!("reading the runner: {e}"))?;
        if line.starts_with("ready ") {
            // The child handle is dropped unwaited: the init's loop reaps it.
            return Ok(pid);
        }
    }
    let _ = child.wait();
    Err("the runner ended before it listened (its log is the box's box.log)".into())
}

//! The egress of a namespace box with an allowlist: the proxy on the host, and the bridge to it
//! in the box.
//!
//! `agentbox-runner egress DIR` is the **proxy** (`agentbox_egress`): started by the box's
//! keeper before it leaves the host's network, so it resolves and connects from there. It binds
//! [`EGRESS_SOCKET`] in the box directory's `run/` (which the box sees at `/run/agentbox`),
//! says [`EGRESS_READY`], appends each refusal to [`EGRESS_LOG`] in the box's directory (which
//! the box does not see), and ends when its stdin does: the keeper holds the other end until the
//! box ends.
//!
//! The **bridge** is a thread of the box's init: it listens on `127.0.0.1:PORT` in the box's own
//! network (loopback alone) and carries each connection to the proxy's socket, so that what a
//! program reaches through `HTTP_PROXY` is the proxy, and nothing else is reachable at all.

use std::io::{BufRead, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentbox_core::Allowlist;
use agentbox_egress::{Interceptor, Policy, Proxy, RefusalLog, SecretPlan, Secrets, SystemResolver};
use agentbox_protocol::namespace::{EGRESS_LOG, EGRESS_READY, EGRESS_SOCKET, RUN_DIR};

/// The most connections one box's proxy carries at once.
const MAX_CONNECTIONS: usize = 256;
/// The pause after a failed accept (out of descriptors, say), so it is not retried in a spin.
pub(crate) const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

/// How many refusal lines go to stderr in one second, at most.
#[derive(Default)]
struct LineBudget(std::sync::Mutex<(u64, u32)>);

impl LineBudget {
    fn allow(&self) -> bool {
        let second = crate::init::now_ms() / 1000;
        let mut b = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if b.0 != second {
            *b = (second, 0);
        }
        b.1 += 1;
        b.1 <= 5
    }
}

/// How large the refusal log grows before it is turned over.
const LOG_MAX: u64 = 1 << 20;
/// The buffer of each direction of a bridged connection.
const BRIDGE_BUFFER: usize = 256 << 10;

/// The proxy of a namespace box (see the [module documentation](self)); the exit code.
pub fn run(dir: &Path) -> i32 {
    exit_code(plan_of_box(dir).and_then(serve))
}

/// The proxy of a container box: `egress --socket PATH --log PATH --deadline-file PATH
/// --allow ENTRY...`, started detached by the host beside the container. It binds the socket
/// (in the box's runner directory, which the container sees), appends refusals to the log
/// (outside it), and ends when the deadline file says the box's time is up or is gone (the
/// box was destroyed: its files went with it).
pub fn run_args(args: &[String]) -> i32 {
    exit_code(plan_of_args(args).and_then(serve))
}

fn exit_code(r: Result<(), String>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("agentbox-runner egress: {e}");
            let _ = writeln!(std::io::stdout(), "error {e}");
            1
        }
    }
}

/// What one proxy serves, and until when.
struct Plan {
    allow: Allowlist,
    socket: PathBuf,
    log: PathBuf,
    until: Until,
    /// The box has secrets: their plan is the first line of stdin.
    secrets: bool,
}

enum Until {
    /// Its stdin ends (the namespace box's keeper holds the other end).
    StdinEnds,
    /// The deadline in this file passes, or the file is gone.
    Deadline(PathBuf),
}

/// The plan of a namespace box: its config in `dir`.
fn plan_of_box(dir: &Path) -> Result<Plan, String> {
    // The keeper's own reading: bounded, validated, and naming this directory.
    let cfg = crate::namespace::read_config(dir)?;
    let egress = cfg.egress.ok_or("the box's config asks for no egress")?;
    Ok(Plan {
        allow: Allowlist::parse(&egress.allow).map_err(|e| e.to_string())?,
        socket: dir.join("run").join(EGRESS_SOCKET),
        log: dir.join(EGRESS_LOG),
        until: Until::StdinEnds,
        secrets: !egress.secrets.is_empty(),
    })
}

/// The plan `--socket PATH --log PATH --deadline-file PATH --allow ENTRY...` gives.
fn plan_of_args(args: &[String]) -> Result<Plan, String> {
    const USAGE: &str = "usage: agentbox-runner egress --socket PATH --log PATH --deadline-file PATH \
         [--secrets-on-stdin] --allow ENTRY [--allow ENTRY]...";
    let (mut socket, mut log, mut deadline, mut allow) = (None, None, None, Vec::new());
    let mut secrets = false;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--secrets-on-stdin" {
            secrets = true;
            continue;
        }
        let value = it.next().ok_or_else(|| format!("{flag} wants a value; {USAGE}"))?;
        let path = || {
            value
                .starts_with('/')
                .then(|| PathBuf::from(value))
                .ok_or_else(|| format!("{flag} {value:?}: not an absolute path"))
        };
        match flag.as_str() {
            "--socket" => socket = Some(path()?),
            "--log" => log = Some(path()?),
            "--deadline-file" => deadline = Some(path()?),
            "--allow" => allow.push(value.clone()),
            other => return Err(format!("{other}: no such flag; {USAGE}")),
        }
    }
    let (Some(socket), Some(log), Some(deadline)) = (socket, log, deadline) else {
        return Err(USAGE.into());
    };
    Ok(Plan {
        allow: Allowlist::parse(&allow).map_err(|e| e.to_string())?,
        socket,
        log,
        until: Until::Deadline(deadline),
        secrets,
    })
}

/// The device and inode of the file at `path`, to tell one socket bound there from the next.
fn socket_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

fn serve(plan: Plan) -> Result<(), String> {
    let Plan {
        allow,
        socket,
        log,
        until,
        secrets,
    } = plan;
    let _ = std::fs::remove_file(&socket);
    // The secrets first, before anything listens: a box is never served without them.
    let intercept = if secrets { Some(take_secrets(&socket)?) } else { None };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("starting the proxy's runtime: {e}"))?;
    rt.block_on(async move {
        let listener =
            tokio::net::UnixListener::bind(&socket).map_err(|e| format!("binding {}: {e}", socket.display()))?;
        // The box's user is another id of the host's: it must be able to connect.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))
            .map_err(|e| format!("opening {} to the box: {e}", socket.display()))?;
        // The socket this proxy bound, to remove at its end only if it is still there: a box
        // made again under the same name has a new proxy bound at the same path by then.
        let bound = socket_identity(&socket);
        let log = RefusalLog::new(log, LOG_MAX);
        let lines = LineBudget::default();
        // At most this many connections at once: a box cannot take this machine's memory or
        // descriptors through its proxy.
        let room = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        let proxy = Proxy::new(
            Policy::new(allow),
            Arc::new(SystemResolver),
            Arc::new(move |r| {
                // A line on stderr too (the namespace box's log, the Docker box's proxy file),
                // at most a few a second, so a box looping on a refused host cannot fill this
                // machine's disk through them; the refusal log itself is turned over.
                if lines.allow() {
                    let address = r.address.as_deref().map(|a| format!(" ({a})")).unwrap_or_default();
                    eprintln!(
                        "agentbox-runner egress: refused {}:{}{address}: {}",
                        r.host, r.port, r.rule
                    );
                }
                let _ = log.append(&r);
            }),
        );
        let proxy = match intercept {
            Some(i) => proxy.with_secrets(i),
            None => proxy,
        };
        println!("{EGRESS_READY}");
        let _ = std::io::stdout().flush();
        let mut ended = match until {
            Until::StdinEnds => tokio::task::spawn_blocking(|| {
                let mut sink = [0u8; 64];
                while std::io::stdin().read(&mut sink).is_ok_and(|n| n > 0) {}
            }),
            Until::Deadline(file) => tokio::spawn(async move {
                loop {
                    match crate::init::read_deadline(&file) {
                        Some(d) if crate::init::now_ms() < d => {}
                        _ => return,
                    }
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            }),
        };
        loop {
            tokio::select! {
                _ = &mut ended => {
                    if bound.is_some() && socket_identity(&socket) == bound {
                        let _ = std::fs::remove_file(&socket);
                    }
                    return Ok(());
                }
                got = listener.accept() => {
                    let Ok((conn, _)) = got else {
                        // Out of descriptors, say: wait rather than spin.
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    };
                    let Ok(permit) = room.clone().try_acquire_owned() else {
                        // Full: the connection is closed unanswered.
                        continue;
                    };
                    let proxy = proxy.clone();
                    tokio::spawn(async move {
                        let _ = proxy.serve(conn).await;
                        drop(permit);
                    });
                }
            }
        }
    })
}

/// The longest secrets line taken (16 secrets of 16 KiB, with room for their JSON).
const MAX_SECRETS_LINE: u64 = 1 << 20;

/// Read the box's secrets (one JSON line on stdin: [`SecretPlan`]), make the box's authority,
/// and write its certificate beside `socket` for the box to trust. The line is read through
/// stdin's shared buffer, so what follows it (the namespace box's keeper holding stdin open)
/// is read by the same handle later.
fn take_secrets(socket: &Path) -> Result<Arc<Interceptor>, String> {
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .take(MAX_SECRETS_LINE)
        .read_line(&mut line)
        .map_err(|e| format!("reading the box's secrets: {e}"))?;
    let plan: SecretPlan = serde_json::from_str(line.trim_end()).map_err(|e| {
        format!(
            "the box's secrets are not a plan (line {}, column {})",
            e.line(),
            e.column()
        )
    })?;
    line.clear();
    let secrets = Secrets::new(plan)?;
    let intercept = Interceptor::new(secrets, Interceptor::machine_roots()?)?;
    let ca = socket.with_file_name(agentbox_protocol::namespace::EGRESS_CA);
    let _ = std::fs::remove_file(&ca);
    std::fs::write(&ca, intercept.ca_pem()).map_err(|e| format!("writing {}: {e}", ca.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ca, std::fs::Permissions::from_mode(0o644))
        .map_err(|e| format!("opening {} to the box: {e}", ca.display()))?;
    Ok(Arc::new(intercept))
}

/// The bridge's listener on `127.0.0.1:port`, made while the init may still bind it.
pub fn listen(port: u16) -> Result<TcpListener, String> {
    TcpListener::bind(("127.0.0.1", port)).map_err(|e| format!("the egress bridge on 127.0.0.1:{port}: {e}"))
}

/// The proxy's socket as a namespace box sees it.
pub fn namespace_socket() -> PathBuf {
    PathBuf::from(format!("{RUN_DIR}/{EGRESS_SOCKET}"))
}

/// Carry each connection to `listener` to the proxy's `socket` in the box, for ever (a thread
/// of the init's).
pub fn bridge(listener: TcpListener, socket: PathBuf) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else {
            std::thread::sleep(ACCEPT_BACKOFF);
            continue;
        };
        let socket = socket.clone();
        let _ = std::thread::Builder::new()
            .name("egress-bridge".into())
            .spawn(move || carry(conn, &socket));
    }
}

/// One connection to the proxy.
fn carry(conn: TcpStream, socket: &Path) {
    let Ok(up) = UnixStream::connect(socket) else {
        return;
    };
    let _ = conn.set_nodelay(true);
    both_ways(conn, up);
}

/// A stream [`both_ways`] carries: a second handle of it, and its writing half shut.
pub(crate) trait Duplex: Read + Write + Send + Sized + 'static {
    /// Another handle of the same stream.
    fn another(&self) -> std::io::Result<Self>;
    /// No more is written to it.
    fn shut_write(&self);
}

impl Duplex for TcpStream {
    fn another(&self) -> std::io::Result<Self> {
        self.try_clone()
    }
    fn shut_write(&self) {
        let _ = self.shutdown(std::net::Shutdown::Write);
    }
}

impl Duplex for UnixStream {
    fn another(&self) -> std::io::Result<Self> {
        self.try_clone()
    }
    fn shut_write(&self) {
        let _ = self.shutdown(std::net::Shutdown::Write);
    }
}

/// Carry `a` and `b` into each other until both ends are done: each direction a thread, each
/// destination shut for writing when its source ends (so a half-close travels through).
pub(crate) fn both_ways<A: Duplex, B: Duplex>(a: A, b: B) {
    let (Ok(a2), Ok(b2)) = (a.another(), b.another()) else {
        return;
    };
    let there = std::thread::Builder::new()
        .name("carry".into())
        .spawn(move || pump(a2, b2));
    pump(b, a);
    if let Ok(t) = there {
        let _ = t.join();
    }
}

fn pump<R: Duplex, W: Duplex>(mut from: R, mut to: W) {
    let mut buf = vec![0u8; BRIDGE_BUFFER];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    to.shut_write();
}

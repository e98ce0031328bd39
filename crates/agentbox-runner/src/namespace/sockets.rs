//! No host unix socket reachable from the box: `connect(2)`, and `sendto(2)` with an address,
//! answered by a supervisor outside the box.
//!
//! A host-root box sees this machine's `/` read-only, and a read-only mount, file permissions
//! and landlock (to ABI 6) all leave `connect` to a pathname socket open: PostgreSQL's socket
//! under `/var/tmp`, a Nix daemon's, anything outside the masked directories. So the init adds
//! one more seccomp filter ([`confine`], a small hand-written BPF program: seccompiler has no
//! user-notification action) that sends every `connect`, and every `sendto` whose address
//! (argument 4) is not null, to a supervisor, and hands the filter's listener over its stdin,
//! a socket pair ([`hand_over`]). The supervisor ([`Supervisor`]) is a child the keeper forks
//! after it unshared the box's user, mount and network namespaces and before the pid one:
//! under no filter, in this machine's pid namespace (no program of the box can see, signal or
//! trace it; a sleeping box's `kill(-1)` does not reach it), ending with the keeper. For each
//! call:
//!
//! - it takes the caller's socket (`pidfd_open` + `pidfd_getfd`) and reads its family from the
//!   socket itself (`SO_DOMAIN`), never from the caller's memory: anything but AF_UNIX is let
//!   through (`CONTINUE`), whatever the address says, since the kernel refuses a unix address
//!   on such a socket;
//! - for an AF_UNIX socket it reads the address once (`process_vm_readv`) and acts on that
//!   copy itself, so rewriting the address after the check changes nothing: a pathname is
//!   opened `O_PATH` with `openat2` (`RESOLVE_IN_ROOT` in the caller's root, or from its
//!   working directory), allowed only when it is a socket on a mount that is writable in the
//!   box (its own `/tmp`, `/workspace`, `/root`, `/run`, `/dev/shm`, writable `--mount`s), or
//!   on a mount the spec asked for, read-only or not (a socket directory given on purpose;
//!   this machine's root is bound read-only, and is neither), and then connected (or sent to) through
//!   `/proc/self/fd/N` of that very descriptor, so a symlink swapped after the check changes
//!   nothing either; a refused one answers `EACCES` and is logged on the box's log;
//! - an abstract address is connected by the supervisor too when the box has a network
//!   namespace of its own (the supervisor's); in a box that shares this machine's network the
//!   call is let through, and landlock's scope decides, as before (there, a program that
//!   rewrites the address between the check and the kernel's read could still name a path);
//! - the caller gets the supervisor's result, `0` or the byte count, or `-errno`.
//!
//! It fails closed: with the supervisor gone, the kernel answers every such call `ENOSYS`.
//! What it leaves: `sendmsg`/`sendmmsg` with an address (a datagram to a host datagram socket,
//! such as a syslog socket, a box could still send; stream and seqpacket sockets cannot be
//! reached that way), and a server in the box sees the supervisor, not the caller, as the
//! peer of a connection made this way (`SO_PEERCRED` names no pid of the box).

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// At most this many calls are served on threads of their own at once (a `connect` may block
/// on a full backlog); past it, calls are served in turn.
const MAX_WORKERS: usize = 64;

/// A datagram longer than this is not carried (the kernel's own limit is lower).
const MAX_DATAGRAM: usize = 4 << 20;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

/// x86_64's x32 system calls carry this bit; the filter refuses them (their numbers differ).
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGE_K: u16 = 0x35;
const BPF_RET_K: u16 = 0x06;

fn op(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The filter: `connect`, and `sendto` with a non-null address, to the supervisor; every
/// other call allowed (the other filters refuse what they refuse); another architecture's
/// calls kill the process, x32's are refused.
fn program() -> Vec<libc::sock_filter> {
    // seccomp_data: nr at 0, arch at 4, args from 16, 8 bytes each (little endian: low first).
    let arg4_lo = 16 + 4 * 8;
    vec![
        /* 0 */ op(BPF_LD_W_ABS, 0, 0, 4),
        /* 1 */ op(BPF_JEQ_K, 1, 0, AUDIT_ARCH),
        /* 2 */ op(BPF_RET_K, 0, 0, libc::SECCOMP_RET_KILL_PROCESS),
        /* 3 */ op(BPF_LD_W_ABS, 0, 0, 0),
        /* 4 */ op(BPF_JGE_K, 0, 1, X32_SYSCALL_BIT),
        /* 5 */ op(BPF_RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        /* 6 */ op(BPF_JEQ_K, 6, 0, libc::SYS_connect as u32),
        /* 7 */ op(BPF_JEQ_K, 1, 0, libc::SYS_sendto as u32),
        /* 8 */ op(BPF_RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
        /* 9 */ op(BPF_LD_W_ABS, 0, 0, arg4_lo),
        /* 10 */ op(BPF_JEQ_K, 0, 2, 0),
        /* 11 */ op(BPF_LD_W_ABS, 0, 0, arg4_lo + 4),
        /* 12 */ op(BPF_JEQ_K, 1, 0, 0),
        /* 13 */ op(BPF_RET_K, 0, 0, libc::SECCOMP_RET_USER_NOTIF),
        /* 14 */ op(BPF_RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Install the filter on this process (no_new_privs must be set): its listener.
pub(super) fn confine() -> Result<OwnedFd, String> {
    let mut prog = program();
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    let mut last = 0;
    // A waiting caller can be ended by SIGKILL alone once its call is read, so another signal
    // never makes the supervisor connect twice; a kernel without that flag (before 5.19) is asked
    // without it.
    for flags in [
        libc::SECCOMP_FILTER_FLAG_NEW_LISTENER | libc::SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV,
        libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
    ] {
        // SAFETY: `fprog` points at `prog`, alive for the call; the kernel copies the program.
        #[allow(unsafe_code)]
        let fd = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                flags,
                &fprog as *const libc::sock_fprog,
            )
        };
        if fd >= 0 {
            // SAFETY: the kernel just made this descriptor (close-on-exec) for this process.
            #[allow(unsafe_code)]
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
        last = last_errno();
        if last != libc::EINVAL {
            break;
        }
    }
    Err(format!(
        "the unix socket filter (seccomp user notification): {}",
        std::io::Error::from_raw_os_error(last)
    ))
}

/// Send `listener` to the supervisor over stdin (a socket pair the keeper made), then put
/// `/dev/null` in stdin's place and close the listener: no program of the box may hold it.
pub(super) fn hand_over(listener: OwnedFd) -> Result<(), String> {
    send_fd(0, listener.as_raw_fd()).map_err(|e| format!("handing the unix socket filter to its supervisor: {e}"))?;
    drop(listener);
    let null = std::fs::File::open("/dev/null").map_err(|e| format!("opening /dev/null: {e}"))?;
    rustix::stdio::dup2_stdin(&null).map_err(|e| format!("stdin to /dev/null: {e}"))?;
    Ok(())
}

fn send_fd(over: RawFd, fd: RawFd) -> std::io::Result<()> {
    let mut byte = [0u8; 1];
    // SAFETY: every pointer is to a live local sized as the header says; CMSG_* compute
    // offsets inside `space`, which CMSG_SPACE sized for one descriptor.
    #[allow(unsafe_code)]
    unsafe {
        let mut space = [0u8; 64];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = space.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        if libc::sendmsg(over, &msg, libc::MSG_NOSIGNAL) != 1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn recv_fd(from: RawFd) -> std::io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    // SAFETY: as in `send_fd`; a descriptor read from the header was made for this process
    // by the kernel (MSG_CMSG_CLOEXEC) and is owned from here on.
    #[allow(unsafe_code)]
    unsafe {
        let mut space = [0u8; 64];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = space.as_mut_ptr().cast();
        msg.msg_controllen = space.len() as _;
        let n = libc::recvmsg(from, &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let c = libc::CMSG_FIRSTHDR(&msg);
        if n == 0 || c.is_null() || (*c).cmsg_level != libc::SOL_SOCKET || (*c).cmsg_type != libc::SCM_RIGHTS {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the init sent no descriptor",
            ));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>());
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// The inode of this process's network namespace, to tell whether the box got one of its own.
pub(super) fn net_namespace() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/net").ok().map(|m| m.ino())
}

/// The supervisor, a child of the keeper's forked before the keeper's pid namespace: the
/// socket pair that is the init's stdin (the config goes down, the listener comes back), and
/// this machine's `/proc`, opened before the init's pivot leaves it unreachable (the box's
/// own `/proc` numbers processes in the box's pid namespace; the kernel names a caller in the
/// supervisor's). It ends with the keeper (PR_SET_PDEATHSIG), which is the box's end.
pub(super) struct Supervisor {
    ours: UnixStream,
    theirs: Option<UnixStream>,
}

impl Supervisor {
    /// Fork the supervisor; `host_network` is [`net_namespace`] before the keeper unshared,
    /// `given` the targets of the spec's mounts (whose sockets the spec gave the box, read-only
    /// or not). The keeper must have no other thread (one is forked).
    pub(super) fn start(host_network: Option<u64>, given: Vec<String>) -> Result<Supervisor, String> {
        let (ours, theirs) = UnixStream::pair().map_err(|e| format!("a socket pair for the init: {e}"))?;
        let proc = rustix::fs::open(
            "/proc",
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| format!("opening /proc: {e}"))?;
        let own_network = host_network.is_some() && net_namespace() != host_network;
        let keeper = std::process::id() as libc::pid_t;
        // SAFETY: the keeper is one thread (its caller says so), so the child may go on with
        // anything; it never returns from this branch.
        #[allow(unsafe_code)]
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(format!(
                "forking the unix socket supervisor: {}",
                std::io::Error::last_os_error()
            ));
        }
        if pid == 0 {
            drop(theirs);
            // SAFETY: prctl on this process's own parent-death signal, no pointer.
            #[allow(unsafe_code)]
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
            }
            if rustix::process::getppid().map(|p| p.as_raw_nonzero().get()) != Some(keeper) {
                std::process::exit(0);
            }
            // The host reads the keeper's stdout and writes its stdin: none of the supervisor's.
            if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
                let _ = rustix::stdio::dup2_stdin(&null);
                let _ = rustix::stdio::dup2_stdout(&null);
            }
            supervise(ours, proc, own_network, &given);
            std::process::exit(0);
        }
        drop(proc);
        Ok(Supervisor {
            ours,
            theirs: Some(theirs),
        })
    }

    /// The init's stdin: its end of the pair.
    pub(super) fn init_stdin(&mut self) -> Result<std::process::Stdio, String> {
        let end = self.theirs.take().ok_or("the init's end was taken already")?;
        Ok(std::process::Stdio::from(OwnedFd::from(end)))
    }

    /// Write to the init (its config), on the pair: the init reads it from its stdin.
    pub(super) fn init_config(&mut self) -> &mut impl Write {
        &mut self.ours
    }
}

/// The supervisor's life: take the init's listener, once it sends it, and serve it.
fn supervise(ours: UnixStream, proc: OwnedFd, own_network: bool, given: &[String]) {
    let listener = match recv_fd(ours.as_raw_fd()) {
        Ok(l) => l,
        // The init ended before it hardened: it said why to the host.
        Err(_) => return,
    };
    drop(ours);
    // The init sends its listener once the box's mounts are made, and it has pivoted into
    // the box's root, which is this process's too: each spec mount's target is its bind.
    let given_mounts = given
        .iter()
        .filter_map(|t| {
            rustix::fs::statx(
                rustix::fs::CWD,
                t.as_str(),
                rustix::fs::AtFlags::empty(),
                rustix::fs::StatxFlags::MNT_ID,
            )
            .ok()
        })
        .map(|st| st.stx_mnt_id)
        .collect();
    let s = Arc::new(Serve {
        listener,
        proc,
        own_network,
        given_mounts,
        workers: AtomicUsize::new(0),
    });
    if let Err(e) = s.run() {
        eprintln!(
            "agentbox-runner namespace: the unix socket supervisor stopped: {e}; the box's connect and sendto now fail (ENOSYS)"
        );
    }
}

struct Serve {
    listener: OwnedFd,
    proc: OwnedFd,
    own_network: bool,
    /// The mounts the spec asked for (`--mount`), by mount id: their sockets are the box's to
    /// reach, read-only or not.
    given_mounts: Vec<u64>,
    workers: AtomicUsize,
}

/// One call, as the kernel reported it.
#[derive(Clone, Copy)]
struct Call {
    id: u64,
    pid: u32,
    sendto: bool,
    args: [u64; 6],
}

enum Answer {
    Continue,
    Result(i64),
    Errno(i32),
}

/// A thread that connects on a caller's behalf: a working directory of its own, this
/// process's descriptor table in this machine's `/proc`, so `N` names descriptor N.
fn enter_fd_dir(proc: &OwnedFd) -> Result<(), String> {
    // SAFETY: unshare(CLONE_FS) gives this thread its own root and working directory; no
    // pointer argument.
    #[allow(unsafe_code)]
    if unsafe { libc::unshare(libc::CLONE_FS) } != 0 {
        return Err(format!("unshare(CLONE_FS): {}", std::io::Error::last_os_error()));
    }
    let dir = rustix::fs::openat(
        proc,
        "self/fd",
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| format!("opening /proc/self/fd: {e}"))?;
    rustix::process::fchdir(&dir).map_err(|e| format!("entering /proc/self/fd: {e}"))
}

impl Serve {
    fn run(self: &Arc<Self>) -> Result<(), String> {
        enter_fd_dir(&self.proc)?;
        loop {
            // SAFETY: a zeroed seccomp_notif, as NOTIF_RECV requires, filled by the kernel.
            #[allow(unsafe_code)]
            let req = unsafe {
                let mut req: libc::seccomp_notif = std::mem::zeroed();
                if libc::ioctl(self.listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_RECV, &mut req) != 0 {
                    match last_errno() {
                        // Interrupted, or the caller died before it was read.
                        libc::EINTR | libc::ENOENT => continue,
                        e => return Err(format!("reading a call: {}", std::io::Error::from_raw_os_error(e))),
                    }
                }
                req
            };
            let call = Call {
                id: req.id,
                pid: req.pid,
                sendto: req.data.nr as libc::c_long == libc::SYS_sendto,
                args: req.data.args,
            };
            self.serve(call);
        }
    }

    fn serve(self: &Arc<Self>, call: Call) {
        let Some((pidfd, socket)) = self.socket_of(&call) else {
            return;
        };
        if domain(&socket) != Some(libc::AF_UNIX) {
            // Not a unix socket (or no socket): the kernel refuses a unix address on it.
            self.answer(&call, Answer::Continue);
            return;
        }
        if self.workers.fetch_add(1, Ordering::AcqRel) >= MAX_WORKERS {
            self.workers.fetch_sub(1, Ordering::AcqRel);
            let a = self.unix(&call, &socket);
            self.answer(&call, a);
            return;
        }
        let me = self.clone();
        let spawned = std::thread::Builder::new().name("unix-connect".into()).spawn(move || {
            let _pidfd = pidfd;
            let a = match enter_fd_dir(&me.proc) {
                Ok(()) => me.unix(&call, &socket),
                Err(e) => {
                    eprintln!("agentbox-runner namespace: {e}");
                    Answer::Errno(libc::EAGAIN)
                }
            };
            me.answer(&call, a);
            me.workers.fetch_sub(1, Ordering::AcqRel);
        });
        if spawned.is_err() {
            self.workers.fetch_sub(1, Ordering::AcqRel);
            self.answer(&call, Answer::Errno(libc::EAGAIN));
        }
    }

    /// The caller's pidfd and its socket (a copy of the descriptor), or `None` when the call
    /// is gone (answered here when it is not).
    fn socket_of(&self, call: &Call) -> Option<(OwnedFd, OwnedFd)> {
        let pidfd = match pidfd_open(&self.proc, call.pid) {
            Ok(p) => p,
            Err(_) => {
                self.answer(call, Answer::Errno(libc::EAGAIN));
                return None;
            }
        };
        // The pid named the caller when it was read; still waiting, it still does.
        if !self.valid(call) {
            return None;
        }
        let fd = call.args[0] as i32;
        // SAFETY: pidfd_getfd returns a new descriptor (close-on-exec) of this process, owned
        // from here on.
        #[allow(unsafe_code)]
        let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
        if r < 0 {
            // EBADF for a bad descriptor, as the call itself would say.
            self.answer(call, Answer::Errno(last_errno()));
            return None;
        }
        #[allow(unsafe_code)]
        Some((pidfd, unsafe { OwnedFd::from_raw_fd(r as RawFd) }))
    }

    fn valid(&self, call: &Call) -> bool {
        let mut id = call.id;
        // SAFETY: NOTIF_ID_VALID reads one u64 from a live local.
        #[allow(unsafe_code)]
        let r = unsafe { libc::ioctl(self.listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &mut id) };
        r == 0
    }

    fn answer(&self, call: &Call, a: Answer) {
        let (val, error, flags) = match a {
            Answer::Continue => (0, 0, libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32),
            Answer::Result(v) => (v, 0, 0),
            Answer::Errno(e) => (0, -e, 0),
        };
        let mut resp = libc::seccomp_notif_resp {
            id: call.id,
            val,
            error,
            flags,
        };
        // SAFETY: NOTIF_SEND reads a seccomp_notif_resp from a live local. A caller that died
        // meanwhile makes it fail with ENOENT, which changes nothing.
        #[allow(unsafe_code)]
        unsafe {
            libc::ioctl(self.listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_SEND, &mut resp);
        }
    }

    /// A call on a unix socket: checked and made here.
    fn unix(&self, call: &Call, socket: &OwnedFd) -> Answer {
        let (addr_ptr, addr_len) = if call.sendto {
            (call.args[4], call.args[5])
        } else {
            (call.args[1], call.args[2])
        };
        let max = std::mem::size_of::<libc::sockaddr_un>();
        if addr_len as u32 as usize > max || (addr_len as u32 as i32) < 0 {
            return Answer::Errno(libc::EINVAL);
        }
        let mut addr = vec![0u8; addr_len as u32 as usize];
        if let Err(e) = read_memory(call.pid, addr_ptr, &mut addr) {
            return Answer::Errno(e);
        }
        let data = if call.sendto {
            let len = call.args[2] as usize;
            if len > MAX_DATAGRAM {
                return Answer::Errno(libc::EMSGSIZE);
            }
            let mut buf = vec![0u8; len];
            if let Err(e) = read_memory(call.pid, call.args[1], &mut buf) {
                return Answer::Errno(e);
            }
            Some(buf)
        } else {
            None
        };
        let family = addr.get(..2).map(|f| u16::from_ne_bytes([f[0], f[1]]));
        let target = if family != Some(libc::AF_UNIX as u16) || addr.len() <= 2 {
            // No name (or no unix family): the kernel says what it says, to this copy.
            Target::Copy
        } else if addr[2] == 0 {
            if !self.own_network {
                // This machine's network, shared: landlock's scope decides.
                return Answer::Continue;
            }
            Target::Copy
        } else {
            let end = addr[2..].iter().position(|b| *b == 0).map_or(addr.len(), |i| i + 2);
            let path = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&addr[2..end]);
            match self.open_socket(call.pid, path) {
                Ok(opened) => Target::Opened(opened),
                Err(e) => return Answer::Errno(e),
            }
        };
        // Everything read from the caller: still the same call?
        if !self.valid(call) {
            return Answer::Errno(libc::EINTR);
        }
        let r = match &target {
            Target::Copy => act(socket, &addr, data.as_deref(), call),
            Target::Opened(fd) => {
                let mut via = Vec::from((libc::AF_UNIX as u16).to_ne_bytes());
                via.extend_from_slice(fd.as_raw_fd().to_string().as_bytes());
                via.push(0);
                act(socket, &via, data.as_deref(), call)
            }
        };
        match r {
            Ok(n) => Answer::Result(n),
            Err(e) => Answer::Errno(e),
        }
    }

    /// `path`, as the caller names it, opened O_PATH: a socket on a mount the box may write.
    fn open_socket(&self, pid: u32, path: &std::ffi::OsStr) -> Result<OwnedFd, i32> {
        let absolute = path.as_encoded_bytes().first() == Some(&b'/');
        let base = rustix::fs::openat(
            &self.proc,
            format!("{pid}/{}", if absolute { "root" } else { "cwd" }),
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| e.raw_os_error())?;
        // SAFETY: open_how is plain integers; zero is its default for each.
        #[allow(unsafe_code)]
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
        // A relative path starts at the caller's working directory, whose `..` and absolute
        // links reach this process's root, which is the box's (one pivot).
        how.resolve = if absolute { libc::RESOLVE_IN_ROOT } else { 0 };
        let c = std::ffi::CString::new(path.as_encoded_bytes()).map_err(|_| libc::EINVAL)?;
        // SAFETY: openat2 reads `c` and `how`, live locals, and returns a new descriptor.
        #[allow(unsafe_code)]
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                base.as_raw_fd(),
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd < 0 {
            return Err(last_errno());
        }
        // SAFETY: the kernel just made this descriptor for this process.
        #[allow(unsafe_code)]
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let st = rustix::fs::fstat(&fd).map_err(|e| e.raw_os_error())?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Socket {
            // What the kernel says of a path that is no socket.
            return Err(libc::ECONNREFUSED);
        }
        let fs = rustix::fs::fstatfs(&fd).map_err(|e| e.raw_os_error())?;
        let given = || {
            rustix::fs::statx(&fd, "", rustix::fs::AtFlags::EMPTY_PATH, rustix::fs::StatxFlags::MNT_ID)
                .is_ok_and(|st| self.given_mounts.contains(&st.stx_mnt_id))
        };
        if fs.f_flags as u64 & libc::ST_RDONLY != 0 && !given() {
            eprintln!(
                "agentbox-runner namespace: refused a box's connect to the unix socket {} (pid {pid} of this machine): it is not the box's (a read-only mount)",
                path.to_string_lossy()
            );
            return Err(libc::EACCES);
        }
        Ok(fd)
    }
}

enum Target {
    /// The caller's own address, as read.
    Copy,
    /// A socket opened here, connected through `/proc/self/fd/N` (this thread's working
    /// directory).
    Opened(OwnedFd),
}

/// `connect`, or `sendto` with `data`, on `socket` to the address `addr`: the count sent (or
/// 0), or the errno.
fn act(socket: &OwnedFd, addr: &[u8], data: Option<&[u8]>, call: &Call) -> Result<i64, i32> {
    // SAFETY: `addr` and `data` are live slices whose lengths are passed with them.
    #[allow(unsafe_code)]
    let r = unsafe {
        match data {
            None => libc::connect(socket.as_raw_fd(), addr.as_ptr().cast(), addr.len() as libc::socklen_t) as i64,
            Some(d) => libc::sendto(
                socket.as_raw_fd(),
                d.as_ptr().cast(),
                d.len(),
                (call.args[3] as i32) | libc::MSG_NOSIGNAL,
                addr.as_ptr().cast(),
                addr.len() as libc::socklen_t,
            ) as i64,
        }
    };
    if r < 0 { Err(last_errno()) } else { Ok(r) }
}

fn domain(socket: &OwnedFd) -> Option<i32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `v`, a live local.
    #[allow(unsafe_code)]
    let r = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_DOMAIN,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(v)
}

fn pidfd_open(proc: &OwnedFd, pid: u32) -> Result<OwnedFd, i32> {
    let open = |pid: u32, flags: libc::c_uint| {
        // SAFETY: pidfd_open takes no pointer and returns a new descriptor.
        #[allow(unsafe_code)]
        let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, flags) };
        if r < 0 {
            return Err(last_errno());
        }
        // SAFETY: the kernel just made this descriptor for this process.
        #[allow(unsafe_code)]
        Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
    };
    // The caller is a thread: PIDFD_THREAD names it (Linux 6.9); an older kernel takes its
    // process's (the descriptor table the threads share).
    match open(pid, libc::PIDFD_THREAD) {
        Err(libc::EINVAL) => {}
        r => return r,
    }
    match open(pid, 0) {
        Err(libc::EINVAL) => {}
        r => return r,
    }
    let status = rustix::fs::openat(
        proc,
        format!("{pid}/status"),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| e.raw_os_error())?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::fs::File::from(status), &mut text).map_err(|_| libc::EIO)?;
    let tgid = text
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or(libc::ESRCH)?;
    open(tgid, 0)
}

/// Read `buf.len()` bytes at `at` in `pid`'s memory; the errno the caller's own call would
/// give for a bad pointer (EFAULT) otherwise.
fn read_memory(pid: u32, at: u64, buf: &mut [u8]) -> Result<(), i32> {
    if buf.is_empty() {
        return Ok(());
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: at as usize as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: the local iovec covers `buf`, which the call writes; the remote one is only read
    // by the kernel, in the other process.
    #[allow(unsafe_code)]
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n as usize == buf.len() {
        Ok(())
    } else {
        Err(libc::EFAULT)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_filter_jumps_stay_inside_the_program() {
        let p = super::program();
        for (i, op) in p.iter().enumerate() {
            if op.code & 0x07 == 0x05 {
                assert!(i + 1 + (op.jt as usize) < p.len(), "{i}");
                assert!(i + 1 + (op.jf as usize) < p.len(), "{i}");
            }
        }
        assert_eq!(p.last().map(|o| o.code), Some(super::BPF_RET_K));
    }
}

//! No host unix socket reachable from the box: `connect(2)`, `sendto(2)` with an address,
//! `sendmsg(2)` and `sendmmsg(2)`, made by a supervisor outside the box.
//!
//! A host-root box sees this machine's `/` read-only, and a read-only mount, file permissions
//! and landlock (to ABI 6) all leave `connect` to a pathname socket open: PostgreSQL's socket
//! under `/var/tmp`, a Nix daemon's, anything outside the masked directories. So the init adds
//! one more seccomp filter ([`confine`], a small hand-written BPF program: seccompiler has no
//! user-notification action) that sends every `connect`, `sendmsg` and `sendmmsg`, and every
//! `sendto` whose address (argument 4) is not null, to a supervisor, and hands the filter's
//! listener over its stdin, a socket pair ([`hand_over`]). The supervisor ([`Supervisor`]) is a
//! child the keeper forks after it unshared the box's user, mount and network namespaces and
//! before the pid one: under no filter, in this machine's pid namespace (no program of the box
//! can see, signal or trace it; a sleeping box's `kill(-1)` does not reach it), ending with the
//! keeper. For each call:
//!
//! - it takes the caller's socket (`pidfd_open` + `pidfd_getfd`: the same open socket, not a
//!   descriptor number another thread could reuse) and reads what the call names from the
//!   caller's memory once (`process_vm_readv`): the address, the bytes sent, a message's
//!   control data (whose descriptors, `SCM_RIGHTS`, are taken from the caller the same way);
//! - it makes the call itself on that socket, with those copies, so rewriting the caller's
//!   memory or descriptor table after the check changes nothing. Only a unix socket's address
//!   is checked (the kernel refuses a unix address on any other socket, and the family is the
//!   socket's own, read with `SO_DOMAIN`): a pathname is opened `O_PATH` with `openat2`
//!   (`RESOLVE_IN_ROOT` in the caller's root, or from its working directory), allowed only
//!   when it is a socket on a mount that is writable in the box (its own `/tmp`, `/workspace`,
//!   `/root`, `/run`, `/dev/shm`, writable `--mount`s), or on a mount the spec asked for,
//!   read-only or not (a socket directory given on purpose; this machine's root is bound
//!   read-only, and is neither), and then reached through `/proc/self/fd/N` of that very
//!   descriptor, so a symlink swapped after the check changes nothing either; a refused one
//!   answers `EACCES` and is logged on the box's log;
//! - an abstract address is reached by the supervisor too when the box has a network
//!   namespace of its own (the supervisor's; abstract names belong to a network namespace); in
//!   a box that shares this machine's network the call is let through, and landlock's scope
//!   decides, as before (there, a program that rewrites the address between the check and the
//!   kernel's read could still name a path);
//! - the caller gets the supervisor's result, `0` or the byte count, or `-errno`; a send that
//!   meets a closed peer also signals the caller `SIGPIPE` unless it said `MSG_NOSIGNAL`. A call
//!   that may block is made on a thread of its own (at most [`MAX_WORKERS`] at once).
//!
//! It fails closed: with the supervisor gone, the kernel answers every such call `ENOSYS`.
//! What differs from the kernel's own call: a server in the box sees the supervisor, not the
//! caller, as the peer of a unix connection made this way (`SO_PEERCRED` names no pid of the
//! box), `SCM_CREDENTIALS` are checked against the supervisor (and so refused), and a send
//! carries at most [`MAX_DATAGRAM`] bytes at a time (a stream's send is then short).

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// At most this many calls are served on threads of their own at once (a `connect` may block
/// on a full backlog); past it, calls are served in turn.
const MAX_WORKERS: usize = 64;

/// A send carries at most this many bytes: a longer datagram is refused `EMSGSIZE` (the
/// kernel's own limit is lower), a stream's send is short.
const MAX_DATAGRAM: usize = 1 << 20;

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

/// The filter: `connect`, `sendto` with a non-null address, `sendmsg` and `sendmmsg` (whose
/// addresses are in memory a filter cannot read) to the supervisor; every other call allowed
/// (the other filters refuse what they refuse); another architecture's calls kill the
/// process, x32's are refused.
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
        /* 6 */ op(BPF_JEQ_K, 8, 0, libc::SYS_connect as u32),
        /* 7 */ op(BPF_JEQ_K, 3, 0, libc::SYS_sendto as u32),
        /* 8 */ op(BPF_JEQ_K, 6, 0, libc::SYS_sendmsg as u32),
        /* 9 */ op(BPF_JEQ_K, 5, 0, libc::SYS_sendmmsg as u32),
        /* 10 */ op(BPF_RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
        /* 11 */ op(BPF_LD_W_ABS, 0, 0, arg4_lo),
        /* 12 */ op(BPF_JEQ_K, 0, 2, 0),
        /* 13 */ op(BPF_LD_W_ABS, 0, 0, arg4_lo + 4),
        /* 14 */ op(BPF_JEQ_K, 1, 0, 0),
        /* 15 */ op(BPF_RET_K, 0, 0, libc::SECCOMP_RET_USER_NOTIF),
        /* 16 */ op(BPF_RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
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

/// Hand `listener` to the supervisor over stdin (a socket pair the keeper made), then put
/// `/dev/null` in stdin's place and close the listener: no program of the box may hold it.
///
/// The filter is on by now and sends every `sendmsg` to the supervisor, which has no listener
/// yet, so the descriptor is not sent (`SCM_RIGHTS`): its number is written, and the supervisor
/// takes it (`pidfd_getfd`) from this process, which the kernel names to it with the write
/// (`SO_PASSCRED`), then answers one byte.
pub(super) fn hand_over(listener: OwnedFd) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("handing the unix socket filter to its supervisor: {e}");
    let mut stdin = std::mem::ManuallyDrop::new(
        // SAFETY: fd 0 is the pair's end, open for the whole call; ManuallyDrop leaves it open.
        #[allow(unsafe_code)]
        unsafe {
            std::fs::File::from_raw_fd(0)
        },
    );
    stdin.write_all(&listener.as_raw_fd().to_ne_bytes()).map_err(fail)?;
    let mut ack = [0u8; 1];
    std::io::Read::read_exact(&mut *stdin, &mut ack).map_err(fail)?;
    drop(listener);
    let null = std::fs::File::open("/dev/null").map_err(|e| format!("opening /dev/null: {e}"))?;
    rustix::stdio::dup2_stdin(&null).map_err(|e| format!("stdin to /dev/null: {e}"))?;
    Ok(())
}

/// The init's listener, taken from it: its number read from `from` with the sender's
/// credentials (`SO_PASSCRED`, set before the init started), the descriptor taken by pid; one
/// byte answered once it is taken.
fn take_listener(from: &UnixStream, proc: &OwnedFd) -> std::io::Result<OwnedFd> {
    let mut number = [0u8; 4];
    // SAFETY: every pointer is to a live local sized as the header says; CMSG_* stay inside
    // `space`, and the credentials are read from inside the one message the kernel wrote.
    #[allow(unsafe_code)]
    let pid = unsafe {
        let mut space = [0u64; 8];
        let mut iov = libc::iovec {
            iov_base: number.as_mut_ptr().cast(),
            iov_len: number.len(),
        };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = space.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&space) as _;
        let n = libc::recvmsg(from.as_raw_fd(), &mut msg, libc::MSG_WAITALL | libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let c = libc::CMSG_FIRSTHDR(&msg);
        if n != 4 || c.is_null() || (*c).cmsg_level != libc::SOL_SOCKET || (*c).cmsg_type != libc::SCM_CREDENTIALS {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the init sent no descriptor number",
            ));
        }
        std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::ucred>()).pid
    };
    let pidfd = pidfd_open(proc, pid as u32).map_err(std::io::Error::from_raw_os_error)?;
    // SAFETY: pidfd_getfd returns a new descriptor (close-on-exec) of this process.
    #[allow(unsafe_code)]
    let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), i32::from_ne_bytes(number), 0) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just made this descriptor for this process.
    #[allow(unsafe_code)]
    let listener = unsafe { OwnedFd::from_raw_fd(r as RawFd) };
    (&*from).write_all(&[1])?;
    Ok(listener)
}

/// Ask the kernel to name the sender of each message `socket` receives (`SO_PASSCRED`).
fn pass_credentials(socket: &UnixStream) -> std::io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: setsockopt reads one c_int from a live local.
    #[allow(unsafe_code)]
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
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
        // Before the init can write: the message that names its listener names the init too.
        pass_credentials(&ours).map_err(|e| format!("SO_PASSCRED on the init's socket pair: {e}"))?;
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
    let listener = match take_listener(&ours, &proc) {
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
    kind: Kind,
    args: [u64; 6],
}

/// The calls the filter sends here.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `connect(fd, addr, len)`.
    Connect,
    /// `sendto(fd, buf, len, flags, addr, addr_len)` with an address.
    SendTo,
    /// `sendmsg(fd, msg, flags)`.
    SendMsg,
    /// `sendmmsg(fd, msgvec, vlen, flags)`.
    SendMmsg,
}

impl Kind {
    fn of(nr: libc::c_long) -> Option<Kind> {
        Some(match nr {
            libc::SYS_connect => Kind::Connect,
            libc::SYS_sendto => Kind::SendTo,
            libc::SYS_sendmsg => Kind::SendMsg,
            libc::SYS_sendmmsg => Kind::SendMmsg,
            _ => return None,
        })
    }
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
            let Some(kind) = Kind::of(req.data.nr as libc::c_long) else {
                // The filter sends no other call; answer one anyway rather than leave it waiting.
                let call = Call {
                    id: req.id,
                    pid: req.pid,
                    kind: Kind::Connect,
                    args: req.data.args,
                };
                self.answer(&call, Answer::Errno(libc::ENOSYS));
                continue;
            };
            let call = Call {
                id: req.id,
                pid: req.pid,
                kind,
                args: req.data.args,
            };
            self.serve(call);
        }
    }

    fn serve(self: &Arc<Self>, call: Call) {
        let Some((pidfd, socket)) = self.socket_of(&call) else {
            return;
        };
        // A call that cannot block is made on this thread; one that can (a connect waiting on
        // a full backlog, a send on a full buffer) on a thread of its own, up to a bound.
        let flags = match call.kind {
            Kind::Connect => 0,
            Kind::SendTo | Kind::SendMmsg => call.args[3] as i32,
            Kind::SendMsg => call.args[2] as i32,
        };
        let nonblocking = flags & libc::MSG_DONTWAIT != 0
            || rustix::fs::fcntl_getfl(&socket).is_ok_and(|f| f.contains(rustix::fs::OFlags::NONBLOCK));
        if nonblocking || self.workers.fetch_add(1, Ordering::AcqRel) >= MAX_WORKERS {
            if !nonblocking {
                self.workers.fetch_sub(1, Ordering::AcqRel);
            }
            let a = self.on_behalf(&call, &pidfd, &socket);
            self.answer(&call, a);
            return;
        }
        let me = self.clone();
        let spawned = std::thread::Builder::new().name("socket-call".into()).spawn(move || {
            let a = match enter_fd_dir(&me.proc) {
                Ok(()) => me.on_behalf(&call, &pidfd, &socket),
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

    /// The call, made here on the caller's socket (the same open socket, so what it does is
    /// done to the caller's), with what was read from the caller's memory once: the answer.
    fn on_behalf(&self, call: &Call, pidfd: &OwnedFd, socket: &OwnedFd) -> Answer {
        let on = On {
            unix: domain(socket) == Some(libc::AF_UNIX),
            stream: sock_type(socket) == Some(libc::SOCK_STREAM),
            socket,
            pidfd,
        };
        let r = match call.kind {
            Kind::Connect => self.connect(call, &on),
            Kind::SendTo => self.send_to(call, &on),
            Kind::SendMsg => self
                .send_msg(call, &on, call.args[1], call.args[2] as i32)
                .map(|n| n as i64),
            Kind::SendMmsg => self.send_mmsg(call, &on),
        };
        match r {
            Ok(n) => Answer::Result(n),
            Err(Refusal::Errno(e)) => Answer::Errno(e),
            Err(Refusal::LetThrough) => Answer::Continue,
        }
    }

    /// `connect(fd, addr, len)`.
    fn connect(&self, call: &Call, on: &On) -> Result<i64, Refusal> {
        let addr = read_address(call.pid, call.args[1], call.args[2])?;
        let target = self.resolve(call.pid, on.unix, &addr)?;
        self.still(call)?;
        let a = target.address(&addr);
        // SAFETY: `a` is a live slice whose length is passed with it.
        #[allow(unsafe_code)]
        let r = unsafe { libc::connect(on.socket.as_raw_fd(), a.as_ptr().cast(), a.len() as libc::socklen_t) };
        if r < 0 { Err(last_errno().into()) } else { Ok(0) }
    }

    /// `sendto(fd, buf, len, flags, addr, addr_len)`.
    fn send_to(&self, call: &Call, on: &On) -> Result<i64, Refusal> {
        let addr = read_address(call.pid, call.args[4], call.args[5])?;
        let data = read_data(call.pid, &[(call.args[1], call.args[2])], on.stream)?;
        let target = self.resolve(call.pid, on.unix, &addr)?;
        self.still(call)?;
        let a = target.address(&addr);
        let flags = call.args[3] as i32;
        // SAFETY: `data` and `a` are live slices whose lengths are passed with them.
        #[allow(unsafe_code)]
        let r = unsafe {
            libc::sendto(
                on.socket.as_raw_fd(),
                data.as_ptr().cast(),
                data.len(),
                flags | libc::MSG_NOSIGNAL,
                a.as_ptr().cast(),
                a.len() as libc::socklen_t,
            )
        };
        sent(r, flags, on)
    }

    /// `sendmsg(fd, msg, flags)` with the `msghdr` at `at` in the caller's memory: its name,
    /// its data (gathered into one buffer) and its control messages, whose descriptors
    /// (`SCM_RIGHTS`) are the caller's, taken here.
    fn send_msg(&self, call: &Call, on: &On, at: u64, flags: i32) -> Result<usize, Refusal> {
        let mut raw = [0u8; std::mem::size_of::<libc::msghdr>()];
        read_memory(call.pid, at, &mut raw)?;
        // SAFETY: msghdr is plain integers and pointers; any bytes are a value of it (its
        // pointers are the caller's, only ever read through process_vm_readv).
        #[allow(unsafe_code)]
        let m: libc::msghdr = unsafe { std::ptr::read_unaligned(raw.as_ptr().cast()) };
        let addr = if m.msg_name.is_null() {
            Vec::new()
        } else {
            read_address(call.pid, m.msg_name as u64, m.msg_namelen as u64)?
        };
        let count = m.msg_iovlen as usize;
        if count > UIO_MAXIOV {
            return Err(libc::EMSGSIZE.into());
        }
        let mut iovs = vec![0u8; count * std::mem::size_of::<libc::iovec>()];
        read_memory(call.pid, m.msg_iov as u64, &mut iovs)?;
        let parts: Vec<(u64, u64)> = iovs
            .chunks_exact(std::mem::size_of::<libc::iovec>())
            .map(|c| {
                let word = |i: usize| u64::from_ne_bytes(c[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
                (word(0), word(1))
            })
            .collect();
        let mut data = read_data(call.pid, &parts, on.stream)?;
        let control_len = m.msg_controllen as usize;
        if control_len > MAX_CONTROL {
            return Err(libc::ENOBUFS.into());
        }
        // u64s: control messages are aligned to 8 bytes.
        let mut control = vec![0u64; control_len.div_ceil(8)];
        {
            // SAFETY: the u64 buffer viewed as its bytes, for the read.
            #[allow(unsafe_code)]
            let bytes = unsafe { std::slice::from_raw_parts_mut(control.as_mut_ptr().cast::<u8>(), control_len) };
            read_memory(call.pid, m.msg_control as u64, bytes)?;
        }
        let _taken = take_rights(on.pidfd, &mut control, control_len)?;
        let target = self.resolve(call.pid, on.unix, &addr)?;
        self.still(call)?;
        let mut a = target.address(&addr);
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr().cast(),
            iov_len: data.len(),
        };
        // SAFETY: a zeroed msghdr is empty; every pointer set below is to a live local whose
        // length is set with it.
        #[allow(unsafe_code)]
        let r = unsafe {
            let mut local: libc::msghdr = std::mem::zeroed();
            if !a.is_empty() {
                local.msg_name = a.as_mut_ptr().cast();
                local.msg_namelen = a.len() as libc::socklen_t;
            }
            local.msg_iov = &mut iov;
            local.msg_iovlen = 1;
            if control_len > 0 {
                local.msg_control = control.as_mut_ptr().cast();
                local.msg_controllen = control_len as _;
            }
            libc::sendmsg(on.socket.as_raw_fd(), &local, flags | libc::MSG_NOSIGNAL)
        };
        sent(r, flags, on).map(|n| n as usize)
    }

    /// `sendmmsg(fd, msgvec, vlen, flags)`: each message in turn, as `sendmsg`; each count sent
    /// written back to its `msg_len`, as the kernel does. An error after the first message ends
    /// the call with the count sent so far.
    fn send_mmsg(&self, call: &Call, on: &On) -> Result<i64, Refusal> {
        let (vec, flags) = (call.args[1], call.args[3] as i32);
        let vlen = (call.args[2] as u32 as usize).min(UIO_MAXIOV);
        let size = std::mem::size_of::<libc::mmsghdr>() as u64;
        let len_at = std::mem::offset_of!(libc::mmsghdr, msg_len) as u64;
        let mut done = 0;
        for i in 0..vlen as u64 {
            let at = vec + i * size;
            let r = self
                .send_msg(call, on, at, flags)
                .and_then(|n| write_memory(call.pid, at + len_at, &(n as u32).to_ne_bytes()).map_err(Refusal::from));
            match r {
                Ok(()) => done += 1,
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(done)
    }

    /// The call still waits (nothing read from the caller's memory could have come from
    /// another call); `EINTR` otherwise, an answer no one reads.
    fn still(&self, call: &Call) -> Result<(), Refusal> {
        if self.valid(call) {
            Ok(())
        } else {
            Err(libc::EINTR.into())
        }
    }

    /// Where an address read from the caller goes: as read, for any socket but a unix one (the
    /// kernel refuses a unix address there, and the socket is the caller's very socket, not
    /// its descriptor number); for a unix socket, a pathname opened here and checked.
    fn resolve(&self, pid: u32, unix: bool, addr: &[u8]) -> Result<Target, Refusal> {
        let family = addr.get(..2).map(|f| u16::from_ne_bytes([f[0], f[1]]));
        if !unix || family != Some(libc::AF_UNIX as u16) || addr.len() <= 2 {
            // No name (or no unix family): the kernel says what it says, to this copy.
            return Ok(Target::Copy);
        }
        if addr[2] == 0 {
            if !self.own_network {
                // This machine's network, shared: landlock's scope decides.
                return Err(Refusal::LetThrough);
            }
            return Ok(Target::Copy);
        }
        let end = addr[2..].iter().position(|b| *b == 0).map_or(addr.len(), |i| i + 2);
        let path = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&addr[2..end]);
        Ok(Target::Opened(self.open_socket(pid, path)?))
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

impl Target {
    /// The address the call is made to: `addr` as read, or `/proc/self/fd/N` by its name
    /// relative to this thread's working directory.
    fn address(&self, addr: &[u8]) -> Vec<u8> {
        match self {
            Target::Copy => addr.to_vec(),
            Target::Opened(fd) => {
                let mut via = Vec::from((libc::AF_UNIX as u16).to_ne_bytes());
                via.extend_from_slice(fd.as_raw_fd().to_string().as_bytes());
                via.push(0);
                via
            }
        }
    }
}

/// Why a call is not made here.
enum Refusal {
    /// The errno the caller gets.
    Errno(i32),
    /// Let the kernel make the call as the caller asked (an abstract address where this
    /// machine's network is shared).
    LetThrough,
}

impl From<i32> for Refusal {
    fn from(e: i32) -> Self {
        Refusal::Errno(e)
    }
}

/// What a call is made on.
struct On<'a> {
    socket: &'a OwnedFd,
    pidfd: &'a OwnedFd,
    unix: bool,
    stream: bool,
}

/// A send's result: the count, or the errno; a broken pipe also signals the caller `SIGPIPE`
/// unless it asked for `MSG_NOSIGNAL` (the send here never raises it in the supervisor).
fn sent(r: isize, flags: i32, on: &On) -> Result<i64, Refusal> {
    if r >= 0 {
        return Ok(r as i64);
    }
    let e = last_errno();
    if e == libc::EPIPE && flags & libc::MSG_NOSIGNAL == 0 {
        // SAFETY: pidfd_send_signal takes the pidfd and no info pointer.
        #[allow(unsafe_code)]
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                on.pidfd.as_raw_fd(),
                libc::SIGPIPE,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            );
        }
    }
    Err(e.into())
}

/// The kernel's bound on a message's `iovec`s (and `sendmmsg`'s messages).
const UIO_MAXIOV: usize = 1024;

/// Control messages longer than this are not carried (the kernel's `optmem_max` is lower).
const MAX_CONTROL: usize = 1 << 20;

/// The address at `ptr`, `len` bytes, read from the caller: as the kernel checks it, at most a
/// `sockaddr_storage`; empty for a zero length.
fn read_address(pid: u32, ptr: u64, len: u64) -> Result<Vec<u8>, Refusal> {
    let len = len as u32 as i32;
    if len < 0 || len as usize > std::mem::size_of::<libc::sockaddr_storage>() {
        return Err(libc::EINVAL.into());
    }
    let mut addr = vec![0u8; len as usize];
    read_memory(pid, ptr, &mut addr)?;
    Ok(addr)
}

/// The bytes of `parts` (address, length) read from the caller, in order: at most
/// [`MAX_DATAGRAM`]; past it a stream socket's send is short (as a send may be), any other's
/// is refused `EMSGSIZE`.
fn read_data(pid: u32, parts: &[(u64, u64)], stream: bool) -> Result<Vec<u8>, Refusal> {
    let mut data = Vec::new();
    for &(at, len) in parts {
        let room = MAX_DATAGRAM - data.len();
        let take = if len as usize > room {
            if !stream {
                return Err(libc::EMSGSIZE.into());
            }
            room
        } else {
            len as usize
        };
        let from = data.len();
        data.resize(from + take, 0);
        read_memory(pid, at, &mut data[from..])?;
        if take < len as usize {
            break;
        }
    }
    Ok(data)
}

/// Each descriptor an `SCM_RIGHTS` message of `control` names, the caller's, replaced in place
/// by a copy of it taken here (`pidfd_getfd`); the copies, to hold until the send is made.
fn take_rights(pidfd: &OwnedFd, control: &mut [u64], len: usize) -> Result<Vec<OwnedFd>, Refusal> {
    let mut taken = Vec::new();
    if len == 0 {
        return Ok(taken);
    }
    // SAFETY: a zeroed msghdr pointing at `control`, `len` bytes of it; CMSG_* walk headers
    // inside it and stop at its end; each descriptor is read and written inside its message's
    // data, which CMSG_LEN bounds.
    #[allow(unsafe_code)]
    unsafe {
        let mut m: libc::msghdr = std::mem::zeroed();
        m.msg_control = control.as_mut_ptr().cast();
        m.msg_controllen = len as _;
        let mut c = libc::CMSG_FIRSTHDR(&m);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let header = libc::CMSG_LEN(0) as usize;
                let count = ((*c).cmsg_len as usize).saturating_sub(header) / std::mem::size_of::<RawFd>();
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..count {
                    let theirs = std::ptr::read_unaligned(data.add(i));
                    let r = libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), theirs, 0);
                    if r < 0 {
                        return Err(libc::EBADF.into());
                    }
                    let ours = OwnedFd::from_raw_fd(r as RawFd);
                    std::ptr::write_unaligned(data.add(i), ours.as_raw_fd());
                    taken.push(ours);
                }
            }
            c = libc::CMSG_NXTHDR(&m, c);
        }
    }
    Ok(taken)
}

fn sock_type(socket: &OwnedFd) -> Option<i32> {
    sock_option(socket, libc::SO_TYPE)
}

fn domain(socket: &OwnedFd) -> Option<i32> {
    sock_option(socket, libc::SO_DOMAIN)
}

/// An integer socket option of `SOL_SOCKET`.
fn sock_option(socket: &OwnedFd, name: i32) -> Option<i32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `v`, a live local.
    #[allow(unsafe_code)]
    let r = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            name,
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

/// Write `buf` at `at` in `pid`'s memory (a count the kernel would have written there).
fn write_memory(pid: u32, at: u64, buf: &[u8]) -> Result<(), i32> {
    let local = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: at as usize as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: the local iovec covers `buf`, which the call only reads; the remote one is
    // written by the kernel, in the other process.
    #[allow(unsafe_code)]
    let n = unsafe { libc::process_vm_writev(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n as usize == buf.len() {
        Ok(())
    } else {
        Err(libc::EFAULT)
    }
}

#[cfg(test)]
mod tests {
    /// What the filter answers for system call `nr` with argument 4 `arg4`, run as the
    /// kernel runs it (the four instructions it uses).
    fn verdict(nr: i64, arg4: u64) -> u32 {
        let p = super::program();
        let mut data = [0u8; 64];
        data[..4].copy_from_slice(&(nr as u32).to_le_bytes());
        data[4..8].copy_from_slice(&super::AUDIT_ARCH.to_le_bytes());
        data[48..56].copy_from_slice(&arg4.to_le_bytes());
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let op = p[pc];
            pc += 1;
            match op.code {
                super::BPF_LD_W_ABS => {
                    let k = op.k as usize;
                    acc = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                }
                super::BPF_JEQ_K => pc += if acc == op.k { op.jt } else { op.jf } as usize,
                super::BPF_JGE_K => pc += if acc >= op.k { op.jt } else { op.jf } as usize,
                super::BPF_RET_K => return op.k,
                c => panic!("instruction {c:#x}"),
            }
        }
    }

    #[test]
    fn the_filter_sends_what_may_name_an_address_and_allows_the_rest() {
        let notify = libc::SECCOMP_RET_USER_NOTIF;
        assert_eq!(verdict(libc::SYS_connect, 0), notify);
        assert_eq!(verdict(libc::SYS_sendmsg, 0), notify);
        assert_eq!(verdict(libc::SYS_sendmmsg, 0), notify);
        assert_eq!(verdict(libc::SYS_sendto, 0x7fff_0000_1000), notify);
        assert_eq!(verdict(libc::SYS_sendto, 0x1000), notify);
        assert_eq!(verdict(libc::SYS_sendto, 0x7fff_0000_0000), notify);
        assert_eq!(verdict(libc::SYS_sendto, 0), libc::SECCOMP_RET_ALLOW);
        assert_eq!(verdict(libc::SYS_write, 0), libc::SECCOMP_RET_ALLOW);
        assert_eq!(verdict(libc::SYS_recvmsg, 0), libc::SECCOMP_RET_ALLOW);
        assert_eq!(
            verdict(libc::SYS_connect | super::X32_SYSCALL_BIT as i64, 0),
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32
        );
    }

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

//! `agentbox-runner probe NAME`: try one thing a box should not be able to do, and say whether
//! the kernel let it. The isolation suite runs it in a box (the runner binary is there already,
//! and a box image need have no compiler or interpreter to make these calls).
//!
//! Exit 0 and `allowed` when the call succeeded; exit 3 and `refused: <error>` when the kernel
//! refused it; 2 for a name it does not know. Each probe undoes nothing, so each runs in a
//! process of its own that exits straight after.

/// The probes, by name, and what each tries.
pub const PROBES: &[(&str, &str)] = &[
    ("io_uring", "io_uring_setup with 8 entries"),
    (
        "user-namespace",
        "unshare(CLONE_NEWUSER): a user namespace, the door to namespaced root",
    ),
    ("mount-namespace", "unshare(CLONE_NEWNS): a mount namespace of its own"),
    (
        "ptrace",
        "ptrace(PTRACE_TRACEME): to be traced, the first step of tracing anything",
    ),
    (
        "keyctl",
        "keyctl(KEYCTL_GET_KEYRING_ID) of the session keyring: the kernel's keyrings are not namespaced",
    ),
    ("mount", "mount a tmpfs on /tmp"),
    (
        "abstract-unix:NAME",
        "connect to the abstract unix socket NAME: a socket outside the box's landlock domain",
    ),
    (
        "unix-connect:PATH",
        "connect a stream socket to the unix socket at PATH: a socket the box did not make",
    ),
    (
        "unix-sendto:PATH",
        "send a datagram with sendto to the unix socket at PATH: a socket the box did not make",
    ),
    (
        "unix-sendmsg:PATH",
        "send a datagram with sendmsg, the address in its message, to the unix socket at PATH: a socket the box did not make",
    ),
    (
        "unix-sendmmsg:PATH",
        "send two datagrams with sendmmsg to the unix socket at PATH: a socket the box did not make",
    ),
    (
        "unix-self:DIR",
        "make a stream and a datagram unix socket in DIR, and an abstract one, and reach each (`allowed` is what a box \
         must be able to do)",
    ),
    (
        "egress:PORT",
        "ask the egress proxy at 127.0.0.1:PORT to answer, then connect past it to the internet: \
         `allowed` only when the proxy answers, the box's network has loopback alone and every \
         direct connect fails",
    ),
];

/// Addresses a direct connect is tried to by the `egress` probe: any of them reached means the
/// box has a way out that is not the proxy.
const OUTSIDE: [&str; 3] = ["1.1.1.1:443", "192.0.2.1:80", "[2606:4700:4700::1111]:443"];

/// Run the probe `name`; the exit code as above.
pub fn run(name: &str) -> i32 {
    if let Some(port) = name.strip_prefix("egress:") {
        return match egress(port) {
            Ok(()) => {
                println!("allowed");
                0
            }
            Err(why) => {
                println!("refused: {why}");
                3
            }
        };
    }
    let result = match name {
        "io_uring" => {
            let mut params = rustix::io_uring::io_uring_params::default();
            // SAFETY: the parameters are zeroed as the kernel asks, and the ring's fd is
            // closed unmapped when it drops: nothing is read from or written to it.
            #[allow(unsafe_code)]
            unsafe { rustix::io_uring::io_uring_setup(8, &mut params) }.map(drop)
        }
        "user-namespace" => {
            // SAFETY: this process is one thread that exits right after; nothing in it relies
            // on the namespaces it had.
            #[allow(unsafe_code)]
            unsafe {
                rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWUSER)
            }
        }
        "mount-namespace" => {
            // SAFETY: as above.
            #[allow(unsafe_code)]
            unsafe {
                rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS)
            }
        }
        "ptrace" => {
            // SAFETY: PTRACE_TRACEME takes no pointer; the process exits right after.
            #[allow(unsafe_code)]
            let r = unsafe { libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) };
            errno_of(r)
        }
        "keyctl" => {
            // SAFETY: KEYCTL_GET_KEYRING_ID with a special keyring id and create=0 passes no
            // pointer.
            #[allow(unsafe_code)]
            let r = unsafe { libc::syscall(libc::SYS_keyctl, 0, libc::KEY_SPEC_SESSION_KEYRING, 0) };
            errno_of(r)
        }
        "mount" => rustix::mount::mount("tmpfs", "/tmp", "tmpfs", rustix::mount::MountFlags::empty(), None),
        other if other.starts_with("unix-connect:") => {
            std::os::unix::net::UnixStream::connect(&other["unix-connect:".len()..])
                .map(drop)
                .map_err(|e| rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::INVAL))
        }
        other if other.starts_with("unix-sendto:") => std::os::unix::net::UnixDatagram::unbound()
            .and_then(|s| s.send_to(b"agentbox-probe", &other["unix-sendto:".len()..]))
            .map(drop)
            .map_err(|e| rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::INVAL)),
        other if other.starts_with("unix-sendmsg:") => send_msgs(&other["unix-sendmsg:".len()..], 1),
        other if other.starts_with("unix-sendmmsg:") => send_msgs(&other["unix-sendmmsg:".len()..], 2),
        other if other.starts_with("unix-self:") => {
            return match unix_self(std::path::Path::new(&other["unix-self:".len()..])) {
                Ok(()) => {
                    println!("allowed");
                    0
                }
                Err(why) => {
                    println!("refused: {why}");
                    3
                }
            };
        }
        other if other.starts_with("abstract-unix:") => {
            use std::os::linux::net::SocketAddrExt;
            let name = &other["abstract-unix:".len()..];
            std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
                .and_then(|a| std::os::unix::net::UnixStream::connect_addr(&a))
                .map(drop)
                .map_err(|e| rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::INVAL))
        }
        other => {
            let names: Vec<&str> = PROBES.iter().map(|p| p.0).collect();
            eprintln!("agentbox-runner probe: {other:?} is not a probe ({})", names.join(", "));
            return 2;
        }
    };
    match result {
        Ok(()) => {
            println!("allowed");
            0
        }
        Err(e) => {
            println!("refused: {e}");
            3
        }
    }
}

/// A libc call's result as rustix's: `Err` with errno when it returned -1.
fn errno_of<T: Into<i64>>(r: T) -> rustix::io::Result<()> {
    if r.into() == -1 {
        Err(rustix::io::Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(rustix::io::Errno::INVAL))
    } else {
        Ok(())
    }
}

/// `count` datagrams to the unix socket at `path` from an unbound socket, the address in each
/// message: one `sendmsg`, or one `sendmmsg` of them all; `Ok` when every one was sent.
fn send_msgs(path: &str, count: usize) -> rustix::io::Result<()> {
    use std::os::fd::AsRawFd;
    let s = std::os::unix::net::UnixDatagram::unbound()
        .map_err(|e| rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::INVAL))?;
    // SAFETY: a zeroed sockaddr_un is valid; the path is copied into it within its bound.
    #[allow(unsafe_code)]
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if path.len() >= addr.sun_path.len() {
        return Err(rustix::io::Errno::NAMETOOLONG);
    }
    for (d, b) in addr.sun_path.iter_mut().zip(path.as_bytes()) {
        *d = *b as libc::c_char;
    }
    let mut body = *b"agentbox-probe";
    let mut iov = libc::iovec {
        iov_base: body.as_mut_ptr().cast(),
        iov_len: body.len(),
    };
    // SAFETY: each msghdr points at `addr` and `iov`, live locals whose sizes are given with
    // them; sendmsg and sendmmsg only read them (sendmmsg writes each msg_len, in `msgs`).
    #[allow(unsafe_code)]
    let sent = unsafe {
        let mut msgs: Vec<libc::mmsghdr> = (0..count)
            .map(|_| {
                let mut m: libc::mmsghdr = std::mem::zeroed();
                m.msg_hdr.msg_name = (&mut addr as *mut libc::sockaddr_un).cast();
                m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                m.msg_hdr.msg_iov = &mut iov;
                m.msg_hdr.msg_iovlen = 1;
                m
            })
            .collect();
        if count == 1 {
            (libc::sendmsg(s.as_raw_fd(), &msgs[0].msg_hdr, 0) >= 0) as i64
        } else {
            libc::sendmmsg(s.as_raw_fd(), msgs.as_mut_ptr(), count as u32, 0) as i64
        }
    };
    if sent < 0 || (sent == 0 && count == 1) {
        return errno_of(-1);
    }
    if sent as usize != count {
        return Err(rustix::io::Errno::AGAIN);
    }
    Ok(())
}

/// The `unix-self:DIR` probe: a stream socket and a datagram socket made in `dir`, each
/// reached by a connect (and a write) and a sendto from another socket of this process.
fn unix_self(dir: &std::path::Path) -> Result<(), String> {
    use std::io::{Read, Write};
    use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
    let stream = dir.join(format!("agentbox-probe-{}.sock", std::process::id()));
    let dgram = dir.join(format!("agentbox-probe-{}.dgram", std::process::id()));
    let _ = std::fs::remove_file(&stream);
    let _ = std::fs::remove_file(&dgram);
    let r = (|| {
        let l = UnixListener::bind(&stream).map_err(|e| format!("binding {}: {e}", stream.display()))?;
        let mut c = UnixStream::connect(&stream).map_err(|e| format!("connecting {}: {e}", stream.display()))?;
        c.write_all(b"hi").map_err(|e| format!("writing: {e}"))?;
        let (mut s, _) = l.accept().map_err(|e| format!("accepting: {e}"))?;
        let mut got = [0u8; 2];
        s.read_exact(&mut got).map_err(|e| format!("reading: {e}"))?;
        let d = UnixDatagram::bind(&dgram).map_err(|e| format!("binding {}: {e}", dgram.display()))?;
        let n = UnixDatagram::unbound()
            .and_then(|u| u.send_to(b"hello", &dgram))
            .map_err(|e| format!("sendto {}: {e}", dgram.display()))?;
        let mut buf = [0u8; 16];
        let m = d.recv(&mut buf).map_err(|e| format!("receiving: {e}"))?;
        if &got != b"hi" || n != 5 || &buf[..m] != b"hello" {
            return Err(format!("the bytes did not arrive whole ({n} sent, {m} received)"));
        }
        let dgram_path = dgram.to_string_lossy();
        send_msgs(&dgram_path, 1).map_err(|e| format!("sendmsg {dgram_path}: {e}"))?;
        send_msgs(&dgram_path, 2).map_err(|e| format!("sendmmsg {dgram_path}: {e}"))?;
        for i in 0..3 {
            let m = d
                .recv(&mut buf)
                .map_err(|e| format!("receiving datagram {i} of sendmsg and sendmmsg: {e}"))?;
            if &buf[..m] != b"agentbox-probe" {
                return Err(format!(
                    "datagram {i} of sendmsg and sendmmsg arrived as {:?}",
                    &buf[..m]
                ));
            }
        }
        pass_descriptor()?;
        use std::os::linux::net::SocketAddrExt;
        let name = format!("agentbox-probe-{}", std::process::id());
        let a = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .map_err(|e| format!("the abstract name @{name}: {e}"))?;
        let l = UnixListener::bind_addr(&a).map_err(|e| format!("binding @{name}: {e}"))?;
        UnixStream::connect_addr(&a).map_err(|e| format!("connecting @{name}: {e}"))?;
        l.accept().map_err(|e| format!("accepting on @{name}: {e}"))?;
        Ok(())
    })();
    let _ = std::fs::remove_file(&stream);
    let _ = std::fs::remove_file(&dgram);
    r
}

/// A pipe's write end sent over a connected pair of stream sockets (`sendmsg` with
/// `SCM_RIGHTS`), received, and written through: the bytes come out of the pipe.
fn pass_descriptor() -> Result<(), String> {
    use std::io::{Read, Write};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let (a, b) = std::os::unix::net::UnixStream::pair().map_err(|e| format!("a socket pair: {e}"))?;
    let (mut reader, writer) = std::io::pipe().map_err(|e| format!("a pipe: {e}"))?;
    let mut byte = [b'x'];
    // SAFETY: as in the runner's own descriptor passing: every pointer is to a live local
    // sized as its header says, and CMSG_* stay inside `space`.
    #[allow(unsafe_code)]
    let received = unsafe {
        let mut space = [0u64; 8];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = space.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(4) as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(4) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<i32>(), writer.as_raw_fd());
        if libc::sendmsg(a.as_raw_fd(), &msg, 0) != 1 {
            return Err(format!(
                "sendmsg with a descriptor: {}",
                std::io::Error::last_os_error()
            ));
        }
        drop(writer);
        space = [0; 8];
        msg.msg_controllen = std::mem::size_of_val(&space) as _;
        if libc::recvmsg(b.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) != 1 {
            return Err(format!("recvmsg of a descriptor: {}", std::io::Error::last_os_error()));
        }
        let c = libc::CMSG_FIRSTHDR(&msg);
        if c.is_null() || (*c).cmsg_type != libc::SCM_RIGHTS {
            return Err("the descriptor sent with sendmsg did not arrive".into());
        }
        OwnedFd::from_raw_fd(std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<i32>()))
    };
    std::fs::File::from(received)
        .write_all(b"through")
        .map_err(|e| format!("writing through the descriptor received: {e}"))?;
    let mut got = [0u8; 7];
    reader
        .read_exact(&mut got)
        .map_err(|e| format!("reading the pipe: {e}"))?;
    if &got != b"through" {
        return Err(format!("the pipe gave {got:?}"));
    }
    Ok(())
}

/// The `egress:PORT` probe: the proxy answers its own path, and nothing outside is reached
/// without it.
fn egress(port: &str) -> Result<(), String> {
    use std::io::{Read, Write};
    use std::time::Duration;
    let port: u16 = port.parse().map_err(|_| format!("{port:?} is not a port"))?;
    let mut c =
        std::net::TcpStream::connect_timeout(&(std::net::Ipv4Addr::LOCALHOST, port).into(), Duration::from_secs(5))
            .map_err(|e| format!("the proxy at 127.0.0.1:{port}: {e}"))?;
    c.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    c.write_all(format!("GET {} HTTP/1.1\r\nHost: proxy\r\n\r\n", agentbox_egress::PROBE_PATH).as_bytes())
        .map_err(|e| format!("asking the proxy: {e}"))?;
    let mut answer = Vec::new();
    let _ = c.take(4096).read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    if !answer.starts_with("HTTP/1.1 200") || !answer.contains("agentbox egress proxy") {
        return Err(format!(
            "127.0.0.1:{port} is not the egress proxy: {:?}",
            answer.lines().next().unwrap_or("")
        ));
    }
    // The box's network holds loopback alone (so nothing is reached but through the proxy,
    // whether or not this machine reaches the internet), and a direct connect out fails.
    let dev = std::fs::read_to_string("/proc/net/dev").map_err(|e| format!("reading /proc/net/dev: {e}"))?;
    let others: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim()))
        .filter(|name| *name != "lo")
        .collect();
    if !others.is_empty() {
        return Err(format!(
            "the box's network has interfaces besides loopback: {}",
            others.join(", ")
        ));
    }
    for to in OUTSIDE {
        let addr: std::net::SocketAddr = to.parse().map_err(|e| format!("{to}: {e}"))?;
        if std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok() {
            return Err(format!("a direct connect to {to} succeeded"));
        }
    }
    Ok(())
}

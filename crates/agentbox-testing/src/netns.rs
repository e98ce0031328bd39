//! Tests that need a network of their own: servers on made-up addresses, names that resolve
//! where the test says, and a second "host" reached over a cable, all without touching this
//! machine's own network or its `/etc/hosts`.
//!
//! [`isolated`] runs the test again (as a [`crate::reexec`] child) under `unshare --user
//! --map-root-user --net --mount`: in that child the test is root of a user namespace whose
//! network holds only loopback, and whose mounts are its own. There, [`hosts`] puts a hosts
//! file of the test's over `/etc/hosts`, and [`Peer`] makes a second network namespace joined
//! to the first by a veth pair, with threads that run inside it (a server "on the internet").
//!
//! ```no_run
//! use agentbox_testing::netns::{self, Peer};
//! #[test]
//! fn a_client_reaches_a_server_on_another_host() {
//!     if !netns::isolated("a_client_reaches_a_server_on_another_host") {
//!         return; // the scenario ran in the child (or could not, and said so)
//!     }
//!     let peer = Peer::new("198.51.100.1/24", "198.51.100.7/24");
//!     let listener = peer
//!         .run(|| std::net::TcpListener::bind("198.51.100.7:80").unwrap())
//!         .join()
//!         .unwrap();
//!     std::net::TcpStream::connect("198.51.100.7:80").unwrap();
//! #   drop(listener);
//! }
//! ```
//!
//! A machine that cannot make the namespaces (no `unshare`, or unprivileged user namespaces
//! off) says so loudly and the test does not run; under CI (`CI=true`) it fails instead.

use std::os::fd::AsFd;
use std::process::{Child, Command, Stdio};

use crate::reexec;

/// The part a child plays in its namespaces.
const PART: &str = "netns";

/// Whether this process is the test's child in namespaces of its own (go on with the scenario);
/// otherwise run the test `test` again there, wait for it, check it passed, and answer false.
///
/// In the child, loopback is up and nothing else is there.
///
/// Panics when the child fails, or when a child finds itself sharing its parent's network
/// (so no test ever changes an interface of this machine's).
pub fn isolated(test: &str) -> bool {
    if reexec::part().as_deref() == Some(PART) {
        let parent = std::os::unix::process::parent_id();
        let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
        assert!(
            ns("self").is_some() && ns("self") != ns(&parent.to_string()),
            "{test}: told to play {PART} but this process shares its parent's network"
        );
        ip(&["link", "set", "lo", "up"]);
        return true;
    }
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("finding this test binary to run it again: {e}"));
    let child = reexec::child(test, PART);
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "--net", "--mount", "--"])
        .arg(exe)
        .args(child.get_args())
        .envs(child.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .stdin(Stdio::null())
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => return skip(test, &format!("unshare did not run: {e}")),
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Shown with the parent's output (on a failure, or under --nocapture).
    eprintln!("--- {test} in its namespaces ---\n{text}--- end of {test} ---");
    if !out.status.success() && text.contains("unshare failed") {
        return skip(test, &text);
    }
    assert!(out.status.success(), "{test} in its namespaces:\n{text}");
    assert!(
        text.contains("1 passed"),
        "{test} ran nothing in its namespaces:\n{text}"
    );
    false
}

fn skip(test: &str, why: &str) -> bool {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: CI needs network namespaces of the test's own: {why}");
    }
    eprintln!("\n!!!! {test}: NO NETWORK NAMESPACE ({why}): this test did NOT run. !!!!\n");
    false
}

/// Run `ip` with `args`; panics when it fails.
fn ip(args: &[&str]) {
    let st = Command::new("ip")
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("running ip {args:?}: {e}"));
    assert!(st.success(), "ip {args:?} failed");
}

/// Make `/etc/hosts` read `entries` (`(name, address)`) for this process and what it starts
/// (in the child's own mounts: see [`isolated`]).
///
/// Panics outside an [`isolated`] child, so no test replaces this machine's hosts file.
pub fn hosts(entries: &[(&str, &str)]) {
    assert_eq!(
        reexec::part().as_deref(),
        Some(PART),
        "netns::hosts outside a test's own namespaces"
    );
    let mut text = String::from("127.0.0.1 localhost\n::1 localhost\n");
    for (name, addr) in entries {
        text.push_str(&format!("{addr} {name}\n"));
    }
    let path = std::env::temp_dir().join(format!("agentbox-test-hosts-{}", std::process::id()));
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    let st = Command::new("mount")
        .arg("--bind")
        .arg(&path)
        .arg("/etc/hosts")
        .status()
        .unwrap_or_else(|e| panic!("running mount: {e}"));
    assert!(st.success(), "mount --bind {} /etc/hosts failed", path.display());
}

/// The system's bundle of roots, which TLS clients of this machine trust.
pub const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Make this machine's roots ([`SYSTEM_ROOTS`]) hold `pem` too, for this process and what it
/// starts (in the child's own mounts: see [`isolated`]): an authority of the test's is then
/// trusted as a public one would be.
///
/// Panics outside an [`isolated`] child, so no test changes this machine's roots.
pub fn roots(pem: &str) {
    assert_eq!(
        reexec::part().as_deref(),
        Some(PART),
        "netns::roots outside a test's own namespaces"
    );
    let mut text = std::fs::read_to_string(SYSTEM_ROOTS).unwrap_or_default();
    text.push('\n');
    text.push_str(pem);
    let path = std::env::temp_dir().join(format!("agentbox-test-roots-{}", std::process::id()));
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    let st = Command::new("mount")
        .arg("--bind")
        .arg(&path)
        .arg(SYSTEM_ROOTS)
        .status()
        .unwrap_or_else(|e| panic!("running mount: {e}"));
    assert!(st.success(), "mount --bind {} {SYSTEM_ROOTS} failed", path.display());
}

/// A second network namespace joined to this process's by a veth pair: another host on one
/// cable. Ended (its holder killed) when dropped.
pub struct Peer {
    holder: Child,
    ns: std::fs::File,
}

impl Peer {
    /// A peer with address `there` (a CIDR: `198.51.100.7/24`), this side of the cable having
    /// `here`.
    ///
    /// Panics outside an [`isolated`] child, or when the namespace or the cable cannot be made.
    pub fn new(here: &str, there: &str) -> Peer {
        assert_eq!(
            reexec::part().as_deref(),
            Some(PART),
            "netns::Peer outside a test's own namespaces"
        );
        let holder = Command::new("unshare")
            .args(["--net", "--", "sleep", "3600"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting the peer's namespace: {e}"));
        let pid = holder.id().to_string();
        let mine = std::fs::read_link("/proc/self/ns/net").ok();
        let path = format!("/proc/{pid}/ns/net");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_link(&path).ok() == mine {
            assert!(
                std::time::Instant::now() < deadline,
                "the peer's namespace was not made in 10 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
        let link = format!("veth{pid}");
        ip(&[
            "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", &pid,
        ]);
        ip(&["addr", "add", here, "dev", &link]);
        ip(&["link", "set", &link, "up"]);
        let peer = Peer { holder, ns };
        let (there, pid2) = (there.to_string(), pid.clone());
        peer.run(move || {
            ip(&["link", "set", "lo", "up"]);
            ip(&["addr", "add", &there, "dev", "eth0"]);
            ip(&["link", "set", "eth0", "up"]);
        })
        .join()
        .unwrap_or_else(|_| panic!("setting up the peer {pid2}"));
        peer
    }

    /// Run `f` on a thread in the peer's network: sockets it makes are the peer's, and stay
    /// so wherever they are then used.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> std::thread::JoinHandle<T> {
        let ns = self.ns.try_clone().expect("duplicating the peer's namespace");
        std::thread::spawn(move || {
            rustix::thread::move_into_link_name_space(ns.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network))
                .expect("entering the peer's network");
            f()
        })
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

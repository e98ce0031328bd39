//! `agentbox-runner init`: the first process of a container box, whose deadline can move.
//!
//! A container ends when its first process does. Docker boxes used to start `sleep
//! <lifetime>`, which no one can extend; this init reads the box's deadline from a file the
//! host bind-mounts read-only (so no program of the box can change it), reads it again when
//! told (`SIGHUP`, which the host sends through the engine) and every two seconds besides, and
//! exits at the deadline, ending the container with no call from the host. As pid 1 it also
//! reaps the orphans reparented to it, and on `SIGUSR1` it kills every other process of the
//! box: the box sleeps, its files kept, its deadline still kept.
//!
//! One thread, no runtime: every signal it acts on is blocked and taken with `sigtimedwait`,
//! so nothing runs in a signal handler.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The longest the init goes without reading its deadline again.
const POLL: Duration = Duration::from_secs(2);

/// How the init is started: `init --deadline-file PATH [--egress-port PORT --egress-socket
/// PATH]`.
#[derive(Clone, Debug)]
pub struct Config {
    /// The file that holds the deadline, as decimal milliseconds since the Unix epoch.
    pub deadline_file: PathBuf,
    /// For a box with an allowlist: the port of the box's loopback its programs are told to
    /// use as their proxy, and the egress proxy's socket each connection to it is carried to.
    pub egress: Option<(u16, PathBuf)>,
}

impl Config {
    /// Parse `--deadline-file PATH [--egress-port PORT --egress-socket PATH]`.
    pub fn from_args(args: &[String]) -> Result<Config, String> {
        const USAGE: &str = "usage: agentbox-runner init --deadline-file /ABSOLUTE/PATH \
                             [--egress-port PORT --egress-socket /ABSOLUTE/PATH]";
        let (mut deadline, mut port, mut socket) = (None, None, None);
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let value = it.next().ok_or(USAGE)?;
            match flag.as_str() {
                "--deadline-file" if value.starts_with('/') => deadline = Some(PathBuf::from(value)),
                "--egress-socket" if value.starts_with('/') => socket = Some(PathBuf::from(value)),
                "--egress-port" => {
                    port = Some(
                        value
                            .parse::<u16>()
                            .ok()
                            .filter(|p| *p > 0)
                            .ok_or(format!("--egress-port {value:?}: not a port"))?,
                    )
                }
                _ => return Err(USAGE.into()),
            }
        }
        let egress = match (port, socket) {
            (Some(p), Some(s)) => Some((p, s)),
            (None, None) => None,
            _ => return Err(format!("--egress-port and --egress-socket go together; {USAGE}")),
        };
        Ok(Config {
            deadline_file: deadline.ok_or(USAGE)?,
            egress,
        })
    }
}

/// The deadline in `path`: decimal milliseconds, surrounding whitespace and leading zeros
/// allowed. `None` for a file that cannot be read or holds anything else.
pub fn read_deadline(path: &Path) -> Option<u64> {
    let mut text = String::new();
    use std::io::Read;
    std::fs::File::open(path)
        .ok()?
        .take(64)
        .read_to_string(&mut text)
        .ok()?;
    text.trim().parse().ok()
}

pub(crate) use agentbox_core::now_ms;

/// Run the init until the deadline; returns the exit code. A deadline that cannot be read at
/// the start is no box: it exits at once (1), never runs unbounded.
pub fn run(cfg: Config) -> i32 {
    let Some(mut deadline) = read_deadline(&cfg.deadline_file) else {
        eprintln!(
            "agentbox-runner init: no deadline in {}: the box ends now",
            cfg.deadline_file.display()
        );
        return 1;
    };
    let set = signals();
    // The bridge to the egress proxy: a thread of pid 1 (the signals it takes stay blocked in
    // it, so they wait for the loop below), which a sleep does not kill.
    if let Some((port, socket)) = cfg.egress {
        match crate::egress::listen(port) {
            Ok(l) => {
                if let Err(e) = std::thread::Builder::new()
                    .name("egress-bridge".into())
                    .spawn(move || crate::egress::bridge(l, socket))
                {
                    eprintln!("agentbox-runner init: starting the egress bridge: {e}: the box ends");
                    return 1;
                }
            }
            Err(e) => {
                eprintln!("agentbox-runner init: {e}: the box ends");
                return 1;
            }
        }
    }
    loop {
        reap();
        let now = now_ms();
        if now >= deadline {
            eprintln!("agentbox-runner init: the deadline {deadline} passed: the box ends");
            return 0;
        }
        let wait = Duration::from_millis(deadline - now).min(POLL);
        match wait_for(&set, wait) {
            Some(libc::SIGTERM | libc::SIGINT) => {
                eprintln!("agentbox-runner init: told to stop: the box ends");
                return 0;
            }
            Some(libc::SIGUSR1) => {
                // SAFETY: kill(2) with pid -1 signals every process this one may signal but
                // itself; no memory is shared with the call.
                #[allow(unsafe_code)]
                unsafe {
                    libc::kill(-1, libc::SIGKILL)
                };
                eprintln!("agentbox-runner init: asleep: every other process was killed");
            }
            _ => {}
        }
        // Every wake, whatever woke it (SIGHUP, a child, the poll): the deadline may have
        // moved. A file that cannot be read keeps the last deadline read.
        if let Some(d) = read_deadline(&cfg.deadline_file)
            && d != deadline
        {
            eprintln!("agentbox-runner init: the deadline moved from {deadline} to {d}");
            deadline = d;
        }
    }
}

/// Block the signals the init acts on, so they wait for [`wait_for`].
fn signals() -> libc::sigset_t {
    #[allow(unsafe_code)]
    // SAFETY: sigemptyset/sigaddset write the set we own; pthread_sigmask changes this one
    // thread's mask, the only thread there is.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGHUP, libc::SIGUSR1, libc::SIGTERM, libc::SIGINT, libc::SIGCHLD] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// The next of `set`'s signals within `wait`; `None` when none came.
fn wait_for(set: &libc::sigset_t, wait: Duration) -> Option<i32> {
    let ts = libc::timespec {
        tv_sec: wait.as_secs() as libc::time_t,
        tv_nsec: wait.subsec_nanos() as libc::c_long,
    };
    // SAFETY: the set and timespec live across the call; no siginfo is asked for.
    #[allow(unsafe_code)]
    let s = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) };
    (s > 0).then_some(s)
}

/// Wait for every child that ended: orphans reparented to pid 1 are its to reap.
fn reap() {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status we own.
        #[allow(unsafe_code)]
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_egress_flags_go_together_and_name_what_is_wrong() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let c = Config::from_args(&args(&["--deadline-file", "/d"])).unwrap();
        assert_eq!((c.deadline_file, c.egress), (PathBuf::from("/d"), None));
        let c = Config::from_args(&args(&[
            "--deadline-file",
            "/d",
            "--egress-port",
            "3128",
            "--egress-socket",
            "/run/agentbox/egress.sock",
        ]))
        .unwrap();
        assert_eq!(c.egress, Some((3128, PathBuf::from("/run/agentbox/egress.sock"))));
        let e = Config::from_args(&args(&["--deadline-file", "/d", "--egress-port", "3128"])).unwrap_err();
        assert!(e.contains("go together"), "{e}");
        let e = Config::from_args(&args(&[
            "--deadline-file",
            "/d",
            "--egress-port",
            "0",
            "--egress-socket",
            "/s",
        ]))
        .unwrap_err();
        assert!(e.contains("not a port"), "{e}");
        assert!(Config::from_args(&args(&["--egress-port", "3128", "--egress-socket", "/s"])).is_err());
        assert!(Config::from_args(&args(&["--deadline-file", "relative"])).is_err());
    }

    #[test]
    fn deadlines_are_read_as_written_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("deadline");
        std::fs::write(&p, "00000001700000000000\n").unwrap();
        assert_eq!(read_deadline(&p), Some(1_700_000_000_000));
        for bad in ["", "soon", "-1", "1e9", &"9".repeat(40)] {
            std::fs::write(&p, bad).unwrap();
            assert_eq!(read_deadline(&p), None, "{bad:?}");
        }
        assert_eq!(read_deadline(&dir.path().join("missing")), None);
    }

    #[test]
    fn arguments_are_one_absolute_file() {
        let ok = Config::from_args(&["--deadline-file".into(), "/run/d".into()]).unwrap();
        assert_eq!(ok.deadline_file, PathBuf::from("/run/d"));
        assert!(Config::from_args(&["--deadline-file".into(), "d".into()]).is_err());
        assert!(Config::from_args(&[]).is_err());
    }
}

//! The isolation suite: what a program in a box must not be able to do to, or see of, the
//! machine it runs on, tried from inside the box, one case each.
//!
//! Every isolating provider (Docker now; namespace and Kubernetes boxes as they come) runs the
//! same cases through [`run`] and must hold them all ([`Report::assert_all_held`]). Each case
//! can fail: run against a local box, which isolates nothing, most of them report a breach,
//! and that run is the suite's control ([`Report::assert_mostly_breached`]).
//!
//! The host side of each case is real: a file in this machine's temporary directory that no
//! box was given, a process of this machine's with a secret in its environment. Probes that
//! need a system call a shell cannot make (`io_uring_setup`, `unshare`) run the runner
//! binary's `probe` subcommand in the box ([`Options::probe`]).
//!
//! ```no_run
//! # async fn f(provider: std::sync::Arc<dyn agentbox_core::Provider>) {
//! use agentbox_testing::isolation::{self, Options};
//! let options = Options::new("docker", "/opt/agentbox/agentbox-runner");
//! isolation::run(provider, options).await.assert_all_held();
//! # }
//! ```

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, ExecOptions, FinishOptions, Provider, Sandbox, Spec, finish};

/// How to run the suite against one provider.
pub struct Options {
    /// The provider's name, for the report.
    pub name: String,
    /// The path, in the box, of an `agentbox-runner` binary (for its `probe` subcommand).
    pub probe: String,
    /// The spec of the box the cases run in.
    pub spec: Spec,
    /// Cases not tried, each with why: reported [`Verdict::NotRun`] with that reason, for a
    /// box where they cannot finish in their time (say why in the caller).
    pub left_out: Vec<(&'static str, String)>,
}

impl Options {
    /// Options for `name`, whose boxes hold an `agentbox-runner` at `probe`.
    pub fn new(name: &str, probe: &str) -> Self {
        Options {
            name: name.into(),
            probe: probe.into(),
            spec: Spec::new(Duration::from_secs(300)).label("agentbox-isolation", "1"),
            left_out: Vec::new(),
        }
    }
}

/// What one case found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The box could not do it.
    Held,
    /// The box did it: what it saw or did.
    Breach(String),
    /// The case could not be tried in this box (why); neither held nor breached.
    NotRun(String),
}

/// Every case's verdict.
#[derive(Debug)]
pub struct Report {
    /// The provider's name.
    pub name: String,
    /// `(case, verdict)`, in the suite's order.
    pub cases: Vec<(&'static str, Verdict)>,
}

impl Report {
    /// Panic, naming each case, unless every case held (none breached, none left unrun).
    pub fn assert_all_held(&self) {
        let bad: Vec<String> = self
            .cases
            .iter()
            .filter(|(_, v)| *v != Verdict::Held)
            .map(|(n, v)| format!("{n}: {v:?}"))
            .collect();
        assert!(bad.is_empty(), "{}: isolation not held:\n{}", self.name, bad.join("\n"));
    }

    /// Panic unless every case held but `left_out`, each of which must not have run (a box
    /// that states it has no such bound, say), with the reason the caller gives.
    pub fn assert_all_held_but(&self, left_out: &[(&str, &str)]) {
        let bad: Vec<String> = self
            .cases
            .iter()
            .filter(|(n, v)| match left_out.iter().find(|(l, _)| l == n) {
                Some(_) => !matches!(v, Verdict::NotRun(_)),
                None => *v != Verdict::Held,
            })
            .map(|(n, v)| format!("{n}: {v:?}"))
            .collect();
        assert!(
            bad.is_empty(),
            "{}: isolation not held (left out, with reasons: {left_out:?}):\n{}",
            self.name,
            bad.join("\n")
        );
    }

    /// Panic unless more than half the cases that ran breached: the control, on a box that
    /// isolates nothing, proving the cases can fail.
    pub fn assert_mostly_breached(&self) {
        let ran: Vec<_> = self
            .cases
            .iter()
            .filter(|(_, v)| !matches!(v, Verdict::NotRun(_)))
            .collect();
        let breached = ran.iter().filter(|(_, v)| matches!(v, Verdict::Breach(_))).count();
        assert!(
            breached * 2 > ran.len(),
            "{}: the control breached only {breached} of {} cases: {:?}",
            self.name,
            ran.len(),
            self.cases
        );
    }
}

/// The cases, in order. Each is one function of [`Probe`]; a new case is one line here.
const CASES: &[(&str, Case)] = &[
    ("host_file_by_path", |p| Box::pin(p.host_file_by_path())),
    ("host_file_through_proc_1_root", |p| {
        Box::pin(p.host_file_through_proc_1_root())
    }),
    ("host_process_seen", |p| Box::pin(p.host_process_seen())),
    ("host_process_signalled", |p| Box::pin(p.host_process_signalled())),
    ("host_environment_read", |p| Box::pin(p.host_environment_read())),
    ("host_home_read", |p| Box::pin(p.host_home_read())),
    ("daemon_socket_reachable", |p| Box::pin(p.daemon_socket_reachable())),
    ("host_loopback_reached", |p| Box::pin(loopback_reached(p.b.as_ref()))),
    ("host_interfaces_seen", |p| Box::pin(interfaces_seen(p.b.as_ref()))),
    ("host_socket_made_after_the_box_reached", |p| {
        Box::pin(host_socket_reached(p.b.as_ref(), &p.runner))
    }),
    ("host_abstract_socket_reached", |p| {
        Box::pin(host_abstract_socket_reached(p.b.as_ref(), &p.runner))
    }),
    ("capabilities_held", |p| Box::pin(p.capabilities_held())),
    ("privileges_gained_by_exec", |p| Box::pin(p.privileges_gained_by_exec())),
    ("io_uring_set_up", |p| Box::pin(p.io_uring_set_up())),
    ("user_namespace_made", |p| Box::pin(p.user_namespace_made())),
    ("memory_unbounded", |p| Box::pin(p.memory_unbounded())),
    // Last: its children hold the box's process table for a few seconds.
    ("fork_bomb_unbounded", |p| Box::pin(p.fork_bomb_unbounded())),
];

type Case = for<'a> fn(&'a Probe) -> std::pin::Pin<Box<dyn std::future::Future<Output = Verdict> + Send + 'a>>;

/// Run every case in one box of `provider`, ending the box and the host's side after.
pub async fn run(provider: Arc<dyn Provider>, options: Options) -> Report {
    let ctx = Ctx::background().with_timeout(Duration::from_secs(120));
    let b = provider
        .create(&options.spec, &ctx)
        .await
        .unwrap_or_else(|e| panic!("{}: the isolation suite's box: {e}", options.name));
    let host = HostSide::new();
    let probe = Probe {
        b: b.clone(),
        host,
        runner: options.probe.clone(),
    };
    let mut cases = Vec::new();
    for (name, case) in CASES {
        let v = match options.left_out.iter().find(|(n, _)| n == name) {
            Some((_, why)) => Verdict::NotRun(format!("left out: {why}")),
            None => case(&probe).await,
        };
        cases.push((*name, v));
    }
    drop(probe);
    let _ = b
        .destroy(&Ctx::background().with_timeout(Duration::from_secs(60)))
        .await;
    Report {
        name: options.name,
        cases,
    }
}

/// This machine's side of the cases: a secret file no box was given, and a process with a
/// secret in its environment. Both end when it drops.
struct HostSide {
    dir: std::path::PathBuf,
    /// A file holding the secret in this user's home, where this machine lets it be made.
    home_file: Option<std::path::PathBuf>,
    file: String,
    secret: String,
    sleeper: std::process::Child,
}

/// The marker the host's process carries in its argv, written so that a search for it does not
/// find its own argv (`3599.424[2]` matches `3599.4242`, not itself).
const SLEEPER_ARG: &str = "3599.4242";
const SLEEPER_PATTERN: &str = "3599\\.424[2]";

impl HostSide {
    fn new() -> Self {
        let secret = format!("agentbox-isolation-secret-{}-{}", std::process::id(), unique());
        let dir = std::env::temp_dir().join(format!("agentbox-isolation-{}-{}", std::process::id(), unique()));
        std::fs::create_dir_all(&dir).expect("the host's marker directory");
        let file = dir.join("secret");
        std::fs::write(&file, &secret).expect("the host's marker file");
        let sleeper = std::process::Command::new("sleep")
            .arg(SLEEPER_ARG)
            .env_clear()
            .env("AGENTBOX_ISOLATION_SECRET", &secret)
            .spawn()
            .expect("the host's marker process (sleep)");
        let home_file = std::env::var_os("HOME")
            .map(|h| std::path::PathBuf::from(h).join(format!(".agentbox-isolation-{}", unique())))
            .filter(|f| std::fs::write(f, &secret).is_ok());
        HostSide {
            file: file.to_string_lossy().into_owned(),
            home_file,
            dir,
            secret,
            sleeper,
        }
    }
}

impl Drop for HostSide {
    fn drop(&mut self) {
        let _ = self.sleeper.kill();
        let _ = self.sleeper.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(f) = &self.home_file {
            let _ = std::fs::remove_file(f);
        }
    }
}

fn unique() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

struct Probe {
    b: Arc<dyn Sandbox>,
    host: HostSide,
    runner: String,
}

/// What one shell script in the box printed, and its exit code.
struct Ran {
    code: i32,
    out: String,
}

impl Probe {
    async fn sh(&self, script: &str, limit: Duration) -> Result<Ran, String> {
        let ctx = Ctx::background().with_timeout(limit);
        let argv = vec!["sh".to_string(), "-c".to_string(), script.to_string()];
        let p = self
            .b
            .exec(&argv, &ExecOptions::default(), &ctx)
            .await
            .map_err(|e| format!("exec: {e}"))?;
        let f = finish(p, FinishOptions::default())
            .await
            .map_err(|e| format!("finish: {e}"))?;
        Ok(Ran {
            code: f.status.code,
            out: format!("{}{}", f.stdout_text(), f.stderr_text()),
        })
    }

    /// A case whose script shows the breach by printing the host's secret.
    async fn secret_shown(&self, script: &str) -> Verdict {
        match self.sh(script, Duration::from_secs(30)).await {
            Ok(r) if r.out.contains(&self.host.secret) => {
                Verdict::Breach(format!("read the host's secret: {}", r.out.trim()))
            }
            Ok(_) => Verdict::Held,
            Err(e) => Verdict::NotRun(e),
        }
    }

    async fn host_file_by_path(&self) -> Verdict {
        self.secret_shown(&format!("cat '{}' 2>&1", self.host.file)).await
    }

    async fn host_file_through_proc_1_root(&self) -> Verdict {
        self.secret_shown(&format!("cat '/proc/1/root{}' 2>&1", self.host.file))
            .await
    }

    async fn host_home_read(&self) -> Verdict {
        let Some(f) = &self.host.home_file else {
            return Verdict::NotRun("no file could be made in this user's $HOME".into());
        };
        self.secret_shown(&format!("cat '{}' 2>&1", f.display())).await
    }

    async fn host_environment_read(&self) -> Verdict {
        let pid = self.host.sleeper.id();
        self.secret_shown(&format!("tr '\\0' '\\n' < /proc/{pid}/environ 2>&1; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < \"$f\"; done 2>/dev/null | grep -F AGENTBOX_ISOLATION_SECRET"))
            .await
    }

    async fn host_process_seen(&self) -> Verdict {
        let script = format!("grep -l '{SLEEPER_PATTERN}' /proc/[0-9]*/cmdline 2>/dev/null");
        match self.sh(&script, Duration::from_secs(30)).await {
            Ok(r) if !r.out.trim().is_empty() => Verdict::Breach(format!("saw the host's process: {}", r.out.trim())),
            Ok(_) => Verdict::Held,
            Err(e) => Verdict::NotRun(e),
        }
    }

    async fn host_process_signalled(&self) -> Verdict {
        let pid = self.host.sleeper.id();
        match self.sh(&format!("kill -0 {pid} 2>&1"), Duration::from_secs(30)).await {
            Ok(r) if r.code == 0 => Verdict::Breach(format!("signalled the host's process {pid}")),
            Ok(_) => Verdict::Held,
            Err(e) => Verdict::NotRun(e),
        }
    }

    async fn daemon_socket_reachable(&self) -> Verdict {
        let script = "for s in /var/run/docker.sock /run/docker.sock /run/containerd/containerd.sock /var/run/docker/containerd/containerd.sock; do [ -S \"$s\" ] && echo \"$s\"; done; true";
        match self.sh(script, Duration::from_secs(30)).await {
            Ok(r) if !r.out.trim().is_empty() => Verdict::Breach(format!("a daemon's socket: {}", r.out.trim())),
            Ok(_) => Verdict::Held,
            Err(e) => Verdict::NotRun(e),
        }
    }

    async fn status_field(&self, field: &str) -> Result<String, String> {
        let r = self
            .sh(&format!("grep '^{field}:' /proc/self/status"), Duration::from_secs(30))
            .await?;
        r.out
            .split_once(':')
            .map(|(_, v)| v.trim().to_string())
            .ok_or_else(|| format!("/proc/self/status has no {field}: {}", r.out))
    }

    async fn capabilities_held(&self) -> Verdict {
        match self.status_field("CapEff").await {
            Ok(v) if v.trim_start_matches('0').is_empty() => Verdict::Held,
            Ok(v) => Verdict::Breach(format!("CapEff {v}")),
            Err(e) => Verdict::NotRun(e),
        }
    }

    async fn privileges_gained_by_exec(&self) -> Verdict {
        match self.status_field("NoNewPrivs").await {
            Ok(v) if v == "1" => Verdict::Held,
            Ok(v) => Verdict::Breach(format!(
                "NoNewPrivs {v}: a setuid program would gain its owner's rights"
            )),
            Err(e) => Verdict::NotRun(e),
        }
    }

    async fn probe(&self, name: &str) -> Verdict {
        match self
            .sh(&format!("'{}' probe {name}", self.runner), Duration::from_secs(30))
            .await
        {
            Ok(r) if r.code == 0 => Verdict::Breach(format!("{name}: {}", r.out.trim())),
            Ok(r) if r.code == 3 => Verdict::Held,
            Ok(r) => Verdict::NotRun(format!("the probe did not run (exit {}): {}", r.code, r.out.trim())),
            Err(e) => Verdict::NotRun(e),
        }
    }

    async fn io_uring_set_up(&self) -> Verdict {
        self.probe("io_uring").await
    }

    async fn user_namespace_made(&self) -> Verdict {
        self.probe("user-namespace").await
    }

    async fn fork_bomb_unbounded(&self) -> Verdict {
        let Some(limit) = self.b.facts().pids_limit else {
            return Verdict::NotRun("the box states no pids limit, so none is tried on this machine".into());
        };
        let n = limit + 64;
        // Each child sleeps, so all are alive at once; a fork the limit refuses ends the loop.
        let script =
            format!("i=0; while [ $i -lt {n} ]; do sleep 5 & i=$((i+1)); done 2>/dev/null; echo \"started $i\"; wait");
        match self.sh(&script, Duration::from_secs(120)).await {
            Ok(r) if r.out.contains(&format!("started {n}")) => {
                Verdict::Breach(format!("{n} processes started past the stated limit of {limit}"))
            }
            Ok(_) => Verdict::Held,
            Err(e) => Verdict::NotRun(e),
        }
    }

    async fn memory_unbounded(&self) -> Verdict {
        let Some(mb) = self.b.facts().memory_mb else {
            return Verdict::NotRun("the box states no memory limit, so none is tried on this machine".into());
        };
        let want = mb + 256;
        // A shell variable that grows past the limit: the kernel must stop it.
        let script = format!("x=$(head -c {want}M /dev/zero | tr '\\0' a); echo \"held ${{#x}} bytes\"");
        match self.sh(&script, Duration::from_secs(240)).await {
            Ok(r) if r.code == 0 && r.out.contains("held") => {
                Verdict::Breach(format!("held {want} MiB past the stated limit of {mb} MiB"))
            }
            Ok(_) => Verdict::Held,
            // The allocation outran the case's deadline: nothing stopped it in time to say.
            Err(e) if e.contains("timeout") => Verdict::NotRun(e),
            // The kernel ended the program (or what carried it): the limit held.
            Err(_) => Verdict::Held,
        }
    }
}

/// Whether a program of `b` lists this machine's network interfaces (`/sys/class/net`): an
/// interface is this machine's when both its name and its hardware address are, so a box's
/// own `eth0` (a veth end, with an address of its own) is not taken for the host's.
pub async fn interfaces_seen(b: &dyn Sandbox) -> Verdict {
    let host = interfaces_of_this_machine();
    if host.is_empty() {
        return Verdict::NotRun("this machine has no interface but loopback".into());
    }
    let script =
        r#"for i in /sys/class/net/*; do [ -e "$i/address" ] && echo "${i##*/} $(cat "$i/address")"; done; true"#;
    let ctx = Ctx::background().with_timeout(Duration::from_secs(30));
    let argv = vec!["sh".to_string(), "-c".to_string(), script.to_string()];
    let ran = match b.exec(&argv, &ExecOptions::default(), &ctx).await {
        Ok(p) => finish(p, FinishOptions::default()).await,
        Err(e) => return Verdict::NotRun(format!("exec: {e}")),
    };
    match ran {
        Ok(f) => {
            let out = f.stdout_text();
            let seen: Vec<&str> = out.lines().filter(|l| host.iter().any(|h| h == l.trim())).collect();
            if seen.is_empty() {
                Verdict::Held
            } else {
                Verdict::Breach(format!("this machine's interfaces: {}", seen.join(", ")))
            }
        }
        Err(e) => Verdict::NotRun(format!("finish: {e}")),
    }
}

/// This machine's interfaces but loopback, each as `NAME ADDRESS` (`/sys/class/net`).
fn interfaces_of_this_machine() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/sys/class/net") else {
        return vec![];
    };
    dir.flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let address = std::fs::read_to_string(e.path().join("address")).ok()?;
            (name != "lo").then(|| format!("{name} {}", address.trim()))
        })
        .collect()
}

/// Whether a program of `b` reaches a server on this machine's loopback: a TCP listener the
/// host opens for the call, which the box tries directly with bash's `/dev/tcp` and, where the
/// box is told of a proxy (`HTTP_PROXY`), through it with a `CONNECT`. The listener's own word
/// decides: a connection it accepted from anywhere is a breach.
pub async fn loopback_reached(b: &dyn Sandbox) -> Verdict {
    let listener = match std::net::TcpListener::bind("127.0.0.1:0") {
        Ok(l) => l,
        Err(e) => return Verdict::NotRun(format!("no listener on the host's loopback: {e}")),
    };
    if let Err(e) = listener.set_nonblocking(true) {
        return Verdict::NotRun(format!("the host's listener: {e}"));
    }
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    // The proxy's address from `http://HOST:PORT`, asked to connect to the host's listener.
    let via_proxy = r#"p="${HTTP_PROXY:-$http_proxy}"; p="${p#http://}"; p="${p%/}"
if [ -n "$p" ]; then
  bash -c 'exec 3<>"/dev/tcp/${1%:*}/${1##*:}" && printf "CONNECT 127.0.0.1:%s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" "$2" >&3 && head -c 12 <&3' sh "$p" PORT 2>&1
  echo
fi"#
    .replace("PORT", &port.to_string());
    let script = format!(
        "command -v bash >/dev/null || {{ echo no-bash; exit 9; }}; bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}' 2>&1 && echo connected\n{via_proxy}"
    );
    let ctx = Ctx::background().with_timeout(Duration::from_secs(30));
    let argv = vec!["sh".to_string(), "-c".to_string(), script];
    let ran = match b.exec(&argv, &ExecOptions::default(), &ctx).await {
        Ok(p) => finish(p, FinishOptions::default()).await,
        Err(e) => return Verdict::NotRun(format!("exec: {e}")),
    };
    let accepted = listener.accept().is_ok();
    match ran {
        Ok(f) if f.status.code == 9 => Verdict::NotRun("the box has no bash".into()),
        Ok(f) if accepted || f.stdout_text().contains("connected") => Verdict::Breach(format!(
            "connected to 127.0.0.1:{port} of the host: {}",
            f.stdout_text().trim()
        )),
        Ok(_) => Verdict::Held,
        Err(e) => Verdict::NotRun(format!("finish: {e}")),
    }
}

/// Run `script` in `b` with `sh -c`: its exit code and its output, both streams.
async fn sh_in(b: &dyn Sandbox, script: String) -> Result<(i32, String), String> {
    let ctx = Ctx::background().with_timeout(Duration::from_secs(30));
    let argv = vec!["sh".to_string(), "-c".to_string(), script];
    let p = b
        .exec(&argv, &ExecOptions::default(), &ctx)
        .await
        .map_err(|e| format!("exec: {e}"))?;
    let f = finish(p, FinishOptions::default())
        .await
        .map_err(|e| format!("finish: {e}"))?;
    Ok((f.status.code, format!("{}{}", f.stdout_text(), f.stderr_text())))
}

/// Whether a program of `b` reaches a unix socket this machine makes after the box started,
/// in a directory of this machine's no box masks (a new one under `/var/tmp`): a stream
/// socket it connects to and a datagram socket it sends to (with `sendto`, `sendmsg` and
/// `sendmmsg`, each naming the address), with the runner's probes at
/// `runner` in the box. Breached when either probe says so or the host's side got anything;
/// the sockets are mode 0777, so only the box's isolation stands in the way.
pub async fn host_socket_reached(b: &dyn Sandbox, runner: &str) -> Verdict {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::path::PathBuf::from("/var/tmp").join(format!(
        "agentbox-isolation-sockets-{}-{}",
        std::process::id(),
        unique()
    ));
    struct Remove(std::path::PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    if let Err(e) = std::fs::create_dir(&dir) {
        return Verdict::NotRun(format!("making {}: {e}", dir.display()));
    }
    let _remove = Remove(dir.clone());
    let stream = dir.join("stream.sock");
    let dgram = dir.join("dgram.sock");
    let made = (|| {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        let l = std::os::unix::net::UnixListener::bind(&stream)?;
        l.set_nonblocking(true)?;
        let d = std::os::unix::net::UnixDatagram::bind(&dgram)?;
        d.set_nonblocking(true)?;
        for p in [&stream, &dgram] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777))?;
        }
        Ok::<_, std::io::Error>((l, d))
    })();
    let (listener, datagrams) = match made {
        Ok(x) => x,
        Err(e) => return Verdict::NotRun(format!("the host's sockets in {}: {e}", dir.display())),
    };
    // Every call that can name a socket's address: a connect, and a datagram sent each way.
    let probes = ["connect", "sendto", "sendmsg", "sendmmsg"];
    let script = probes
        .iter()
        .map(|p| {
            let target = if *p == "connect" { &stream } else { &dgram };
            format!("'{runner}' probe 'unix-{p}:{}'; echo \"{p}=$?\"", target.display())
        })
        .collect::<Vec<_>>()
        .join("; ");
    let ran = sh_in(b, script).await;
    let accepted = listener.accept().is_ok();
    let received = datagrams.recv(&mut [0u8; 64]).is_ok();
    match ran {
        _ if accepted || received => Verdict::Breach(format!(
            "the host's socket in {} got {}",
            dir.display(),
            if accepted { "a connection" } else { "a datagram" }
        )),
        Ok((_, out)) if probes.iter().any(|p| out.contains(&format!("{p}=0"))) => {
            Verdict::Breach(format!("reached a socket of the host's: {}", out.trim()))
        }
        Ok((_, out)) if probes.iter().all(|p| out.contains(&format!("{p}=3"))) => Verdict::Held,
        Ok((_, out)) => Verdict::NotRun(format!("the probes did not run: {}", out.trim())),
        Err(e) => Verdict::NotRun(e),
    }
}

/// Whether a program of `b` reaches an abstract unix socket this machine listens on (made
/// for the call), with the runner's probe at `runner` in the box.
pub async fn host_abstract_socket_reached(b: &dyn Sandbox, runner: &str) -> Verdict {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("agentbox-isolation-{}-{}", std::process::id(), unique());
    let listener = match std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .and_then(|a| std::os::unix::net::UnixListener::bind_addr(&a))
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
    {
        Ok(l) => l,
        Err(e) => return Verdict::NotRun(format!("the host's abstract socket @{name}: {e}")),
    };
    let ran = sh_in(b, format!("'{runner}' probe 'abstract-unix:{name}'")).await;
    let accepted = listener.accept().is_ok();
    match ran {
        _ if accepted => Verdict::Breach(format!("the host's abstract socket @{name} got a connection")),
        Ok((0, out)) => Verdict::Breach(format!("reached @{name}: {}", out.trim())),
        Ok((3, _)) => Verdict::Held,
        Ok((code, out)) => Verdict::NotRun(format!("the probe did not run (exit {code}): {}", out.trim())),
        Err(e) => Verdict::NotRun(e),
    }
}

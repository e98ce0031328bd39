//! Namespace boxes: isolated by Linux namespaces alone, with no daemon, made in milliseconds.
//!
//! Each box is `<root>/namespace/<name>/` on the host: `box.json` (what the box is built
//! from), `record.json` (its id, labels, spec, end, facts, name and whether it sleeps, read by
//! attach and list from any process, changed under `record.lock`), `control.sock` (the init's,
//! for the host alone: see `control`), `box.log`, and the directories bound into the box:
//! `work/` at `/workspace`, `home/` at `/root`, `tmp/` at `/tmp` and `run/` at `/run/agentbox`,
//! where the runner's socket is. The box itself is built by `agentbox-runner namespace DIR` (see that crate's
//! `namespace` module): a user, mount, pid, ipc, uts and cgroup namespace, and a net
//! namespace with loopback only for `network: none`; its init is the runner binary, pid 1,
//! which ends the box at its lifetime whether or not the host is alive. The lifecycle beyond
//! create and destroy (names, sleep, extend, relabel, snapshots, forks) is `lifecycle`'s.
//!
//! The box's user is root of its own user namespace, mapped to one id of the host's: the
//! host user's own when it is not root, else [`NamespaceOptions::host_id`] (so no file of the
//! host's root is the box's, and the process limit applies). It holds no capability, runs
//! with no_new_privs, landlock where the kernel has it, and a seccomp filter. The host reads
//! the capabilities, no_new_privs, the filter and the namespaces back from `/proc/<init>` and
//! refuses a box where any is missing; landlock, which `/proc` does not show, is the init's
//! word (said before any program of the box runs), stated in the facts: a kernel without it
//! still makes boxes.
//!
//! ```no_run
//! # async fn f() -> agentbox_core::Result<()> {
//! use std::time::Duration;
//! use agentbox_core::{finish, Ctx, ExecOptions, FinishOptions, Provider, Spec};
//! use agentbox_providers::namespace::{NamespaceOptions, NamespaceProvider};
//!
//! let provider = NamespaceProvider::new(NamespaceOptions::from_env()?)?;
//! let ctx = Ctx::background();
//! let b = provider.create(&Spec::new(Duration::from_secs(600)), &ctx).await?;
//! let p = b.exec(&["id".into()], &ExecOptions::default(), &ctx).await?;
//! println!("{}", finish(p, FinishOptions::default()).await?.stdout_text());
//! b.destroy(&ctx).await?;
//! # Ok(()) }
//! ```

mod control;
mod facts;
mod lifecycle;
mod options;
mod record;
mod sandbox;

pub use options::NamespaceOptions;
use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{
    Ctx, Error, Honours, Labels, Lifecycle, Network, Provider, Result, Sandbox, SandboxId, Spec, check_spec, now_ms,
};
use agentbox_protocol::namespace::{
    Bind, BoxConfig, CONFIG_FILE, ERROR_PREFIX, HOME, INIT_PREFIX, MAPPED, READY_PREFIX, Root, UNSHARED, WORKSPACE,
};
use async_trait::async_trait;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::atomic::write_atomic;
use crate::boxdir::{self, remove_tree};
use crate::helper::HelperCommand;
use crate::lifecycle::Asleep;
use crate::random::random_hex;
pub(crate) use lifecycle::Seed;
pub(crate) use record::Record;
pub use sandbox::NamespaceSandbox;

/// The provider's name and id prefix.
pub const NAME: &str = "namespace";

/// The PATH programs get.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The host id a root host maps the box's root to, unless told otherwise.
pub const DEFAULT_HOST_ID: u32 = 100_000;

/// The process bound of a box unless told otherwise.
pub const DEFAULT_MAX_PROCESSES: u64 = 1024;

/// How long making a box may take before it is given up.
const START_TIMEOUT: Duration = Duration::from_secs(10);
pub use crate::egress::EGRESS_PORT;

/// Whether namespace boxes can be made on this machine, and if not, why (the sysctl, the
/// kernel feature or the missing binary), from a probe that costs one short process: once per
/// runner and process (the CLI's choice of a default provider and the provider's own make
/// both ask; the answer does not change while the process runs).
pub async fn available(runner: &HelperCommand) -> Result<()> {
    type Answers = std::sync::Mutex<
        Vec<(
            HelperCommand,
            std::result::Result<(), (agentbox_core::ErrorCode, String)>,
        )>,
    >;
    static ANSWERS: std::sync::OnceLock<Answers> = std::sync::OnceLock::new();
    let answers = ANSWERS.get_or_init(Default::default);
    let known = |answers: &Answers| {
        answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|(r, _)| r == runner)
            .map(|(_, a)| a.clone())
    };
    if let Some(a) = known(answers) {
        return a.map_err(|(code, message)| Error::new(code, message));
    }
    let answer = probe_user_namespaces(runner).await;
    // A timeout is this moment's, not the machine's: asked again next time.
    if answer
        .as_ref()
        .is_err_and(|e| e.code() == agentbox_core::ErrorCode::Timeout)
    {
        return answer;
    }
    let kept = answer
        .as_ref()
        .map(|_| ())
        .map_err(|e| (e.code(), e.message().to_string()));
    answers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((runner.clone(), kept));
    answer
}

/// [`available`]'s probe: `RUNNER probe user-namespace`, run now.
async fn probe_user_namespaces(runner: &HelperCommand) -> Result<()> {
    let out = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::process::Command::new(&runner.program)
            .args(&runner.args)
            .args(["probe", "user-namespace"])
            .env_clear()
            .stdin(std::process::Stdio::null())
            .output(),
    )
    .await
    .map_err(|_| Error::timeout("probing for user namespaces: no answer in 5 s"))?
    .map_err(|e| Error::io(e, format!("running {}", runner.program.display())))?;
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.code() != Some(3) {
        // Not the kernel's refusal: the runner could not run the probe at all (an old runner
        // without it, say).
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(Error::unsupported(format!(
            "namespace boxes: {} could not probe for user namespaces ({}): {}",
            runner.program.display(),
            out.status,
            if err.is_empty() { said } else { err }
        )));
    }
    let mut why = format!("user namespaces are not available here ({said})");
    for (path, hint) in [
        ("/proc/sys/kernel/unprivileged_userns_clone", "1"),
        ("/proc/sys/user/max_user_namespaces", "over 0"),
        ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "0"),
    ] {
        if let Ok(v) = std::fs::read_to_string(path) {
            why.push_str(&format!(
                "; sysctl {} is {} (needs {hint})",
                path.trim_start_matches("/proc/sys/").replace('/', "."),
                v.trim()
            ));
        }
    }
    Err(Error::unsupported(why))
}

/// Makes namespace boxes. See the [module documentation](self).
pub struct NamespaceProvider {
    opts: NamespaceOptions,
    boxes: PathBuf,
}

impl NamespaceProvider {
    /// A provider over `opts.root`, whose `namespace/` directory is made (mode 0700) if missing.
    pub fn new(opts: NamespaceOptions) -> Result<Self> {
        if opts.max_processes == 0 {
            return Err(Error::invalid("namespace max_processes: 0 would let no program start"));
        }
        let boxes = crate::boxdir::make_boxes_dir(&opts.root, "namespace")?;
        Ok(NamespaceProvider { opts, boxes })
    }

    /// The directory boxes live in.
    pub fn boxes_dir(&self) -> &Path {
        &self.boxes
    }

    /// The host's user and group that own what a box's root writes (the ids its root maps
    /// to): for a directory of the host's that boxes are to write in, as a bind.
    pub fn box_owner(&self) -> (u32, u32) {
        let (uid, gid, _) = self.host_ids();
        (uid, gid)
    }

    /// The host ids the box's root maps to: this user's own, or for root the configured one
    /// where this user namespace has it (root of a namespace mapping only itself, as in a
    /// rootless container, maps its own ids as any user does).
    fn host_ids(&self) -> (u32, u32, bool) {
        let uid = rustix::process::geteuid().as_raw();
        let gid = rustix::process::getegid().as_raw();
        let id = self.opts.host_id;
        if uid == 0 && mapped("uid_map", id) && mapped("gid_map", id) {
            (id, id, true)
        } else {
            (uid, gid, false)
        }
    }

    fn root_of(spec: &Spec) -> Result<Root> {
        let Some(image) = &spec.image else {
            return Ok(Root::Host);
        };
        let p = Path::new(image);
        if !p.is_absolute() {
            return Err(Error::invalid(format!(
                "spec.image {image:?}: a namespace box's image is a directory holding a root file system, \
                 named by its absolute path"
            )));
        }
        let canon = std::fs::canonicalize(p)
            .map_err(|e| Error::invalid(format!("spec.image {image:?}: not a directory here: {e}")))?;
        if !canon.is_dir() || !canon.join("bin").exists() {
            return Err(Error::invalid(format!(
                "spec.image {image:?}: not a root file system (a directory with bin/ in it)"
            )));
        }
        Ok(Root::Rootfs(canon.to_string_lossy().into_owned()))
    }

    fn check(&self, spec: &Spec) -> Result<()> {
        if spec.cpus.is_some() || spec.memory_mb.is_some() {
            let field = if spec.cpus.is_some() { "cpus" } else { "memory_mb" };
            return Err(Error::unsupported(format!(
                "spec.{field}: namespace boxes bound cpu and memory only through cgroup v2, and {}",
                facts::cgroup_v2_state()
            )));
        }
        crate::egress::check_env(spec, proxied(spec.network.as_ref()))?;
        crate::egress::check_secrets(spec, proxied(spec.network.as_ref()))?;
        if let Some(p) = spec.ports.iter().find(|p| p.kind == agentbox_core::PortKind::Https) {
            return Err(Error::unsupported(format!(
                "spec.ports: port {} asks for https (a bare number does), and agentbox has no \
                 certificate for a box on this machine; ask for {{ port: {}, kind: tcp }}",
                p.port, p.port
            )));
        }
        match (&spec.network, spec.ports.is_empty()) {
            (Some(Network::Host), false) => {
                return Err(Error::unsupported(
                    "spec.ports: a box with network host shares this machine's network, so every port \
                     it listens on is this machine's already, asked for or not; a box with a network \
                     of its own (the default) has only the ports asked for forwarded",
                ));
            }
            (Some(Network::None), false) => {
                return Err(Error::unsupported(
                    "spec.ports: a box with network none has loopback alone and no keeper's listener \
                     to forward a port through; give it the default network or an allowlist",
                ));
            }
            _ => {}
        }
        if spec.ports.len() > agentbox_protocol::namespace::MAX_PORTS {
            return Err(Error::invalid(format!(
                "spec.ports: {} ports, at most {}",
                spec.ports.len(),
                agentbox_protocol::namespace::MAX_PORTS
            )));
        }
        if let Some(i) = &spec.isolation
            && i != NAME
        {
            return Err(Error::unsupported(format!(
                "spec.isolation {i:?}: namespace boxes are isolated by namespaces only"
            )));
        }
        check_spec(spec, &self.honours(), NAME)?;
        for m in &spec.mounts {
            if !Path::new(&m.source).exists() {
                return Err(Error::invalid(format!(
                    "spec.mounts: source {}: no such path",
                    m.source
                )));
            }
        }
        Ok(())
    }

    fn config(
        &self,
        name: &str,
        dir: &Path,
        spec: &Spec,
        ends_at_ms: u64,
        secrets: Option<&crate::egress::BoxSecrets>,
    ) -> Result<BoxConfig> {
        let mut env = BTreeMap::new();
        env.insert("PATH".to_string(), DEFAULT_PATH.to_string());
        env.insert("HOME".into(), HOME.into());
        env.insert("TMPDIR".into(), "/tmp".into());
        env.insert("USER".into(), "root".into());
        env.insert("LANG".into(), "C.UTF-8".into());
        env.extend(spec.env.clone());
        let egress = match &spec.network {
            Some(Network::None | Network::Host) => None,
            Some(Network::Allow(list)) => Some(list.clone()),
            // No policy, or open: the internet through the proxy, this machine kept out.
            None | Some(Network::Open) => Some(vec!["*".to_string()]),
        }
        .map(|allow| {
            env.extend(crate::egress::proxy_env());
            if let Some(s) = secrets {
                env.extend(s.env.clone());
            }
            agentbox_protocol::namespace::Egress {
                port: EGRESS_PORT,
                allow,
                secrets: secrets.map(|s| s.names.clone()).unwrap_or_default(),
            }
        });
        let cfg = BoxConfig {
            name: name.to_string(),
            dir: dir.to_string_lossy().into_owned(),
            root: Self::root_of(spec)?,
            deadline_ms: ends_at_ms,
            network_none: matches!(spec.network, Some(Network::None)),
            mounts: spec
                .mounts
                .iter()
                .map(|m| Bind {
                    source: m.source.clone(),
                    target: m.target.clone(),
                    read_only: m.read_only,
                })
                .collect(),
            env,
            max_processes: Some(self.opts.max_processes),
            landlock: self.opts.landlock,
            masks: self.masks(),
            egress,
            ports: spec.ports.iter().map(|p| p.port).collect(),
        };
        cfg.validate()
            .map_err(|e| Error::invalid(format!("namespace box: {e}")))?;
        Ok(cfg)
    }

    /// What a `host` root hides beyond its fixed masks: agentbox's home (other boxes, local
    /// boxes' supervisor sockets, the runner key) and this user's home, wherever they are.
    fn masks(&self) -> Vec<String> {
        let root = std::fs::canonicalize(&self.opts.root).unwrap_or_else(|_| self.opts.root.clone());
        let mut masks = vec![root.to_string_lossy().into_owned()];
        if let Some(home) = std::env::var_os("HOME").map(PathBuf::from)
            && home.is_absolute()
            && home != Path::new("/")
        {
            masks.push(home.to_string_lossy().into_owned());
        }
        masks.retain(|m| !m.contains('\0') && !m.split('/').any(|c| c == ".."));
        masks
    }

    /// Make the box's directory: `None` when it is there already (another open of its name
    /// made it first). Its record's lock is taken at once and answered, to be held until the
    /// record is written, so an open that finds the directory waits for this make rather than
    /// taking it for one that died.
    fn make_dir(&self, dir: &Path, uid: u32, gid: u32, root: bool) -> Result<Option<record::Locked>> {
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(None),
            Err(e) => return Err(Error::io(e, format!("creating {}", dir.display()))),
        }
        let lock = record::try_lock_new(&dir.join(record::LOCK))?;
        if root {
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))
                .map_err(|e| Error::io(e, format!("giving the box {}", dir.display())))?;
        }
        Ok(Some(lock))
    }

    /// Make the box's directories in `dir`, owned by the box's host id: `work/` and `home/`
    /// copied from `seed` where there is one, else empty.
    fn make_dirs(dir: &Path, uid: u32, gid: u32, root: bool, seed: Option<&Seed>) -> Result<()> {
        let mut b = std::fs::DirBuilder::new();
        b.mode(0o700);
        for sub in ["work", "home", "tmp", "run", "root"] {
            let p = dir.join(sub);
            let from = seed.map(|s| match sub {
                "work" => Some(&s.work),
                "home" => Some(&s.home),
                _ => None,
            });
            match from.flatten() {
                Some(from) => {
                    boxdir::copy_tree(from, &p)
                        .map_err(|e| Error::new(e.code(), format!("seeding the box's {sub}: {}", e.message())))?;
                    if root {
                        chown_tree(&p, uid, gid)?;
                    }
                }
                None => {
                    b.create(&p)
                        .map_err(|e| Error::io(e, format!("creating the box's {sub}")))?;
                    if root {
                        std::os::unix::fs::chown(&p, Some(uid), Some(gid))
                            .map_err(|e| Error::io(e, format!("giving the box its {sub}")))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Start the keeper, map its ids, and wait for the init's word: the init's pid and landlock.
    /// Start the box's keeper and answer its lines: the init's pid, what landlock gave, and
    /// each port of the box's with this machine's port for it.
    async fn start(
        &self,
        dir: &Path,
        uid: u32,
        gid: u32,
        root: bool,
        secrets: Option<&str>,
        ctx: &Ctx,
    ) -> Result<(i32, String, std::collections::BTreeMap<u16, u16>)> {
        let log_path = dir.join("box.log");
        let log =
            std::fs::File::create(&log_path).map_err(|e| Error::io(e, format!("creating {}", log_path.display())))?;
        let r = &self.opts.runner;
        let mut child = tokio::process::Command::new(&r.program)
            .args(&r.args)
            .arg("namespace")
            .arg(dir)
            .env_clear()
            .envs(crate::egress::roots_env())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::from(log))
            .kill_on_drop(false)
            .spawn()
            .map_err(|e| Error::io(e, format!("starting {}", r.program.display())))?;
        let keeper = child
            .id()
            .ok_or_else(|| Error::unknown("the box's keeper ended as it started"))? as i32;
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| Error::unknown("the keeper has no stdin"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| Error::unknown("the keeper has no stdout"))?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let talk = async {
            // The secrets' plan first: the keeper hands it to the proxy before it unshares.
            if let Some(line) = secrets {
                stdin
                    .write_all(line.as_bytes())
                    .await
                    .map_err(|e| Error::io(e, "handing the box's keeper its secrets"))?;
            }
            let mut init = None;
            let mut ports = std::collections::BTreeMap::new();
            loop {
                let line = lines
                    .next_line()
                    .await
                    .map_err(|e| Error::io(e, "reading the box's keeper"))?
                    .ok_or_else(|| Error::unknown("the box's keeper ended before the box was ready"))?;
                if line == UNSHARED {
                    map_ids(keeper, uid, gid, root)?;
                    stdin
                        .write_all(format!("{MAPPED}\n").as_bytes())
                        .await
                        .map_err(|e| Error::io(e, "answering the box's keeper"))?;
                } else if let Some(pid) = line.strip_prefix(INIT_PREFIX) {
                    init = Some(
                        pid.trim()
                            .parse::<i32>()
                            .map_err(|_| Error::unknown(format!("the box's keeper named no pid: {line:?}")))?,
                    );
                } else if let Some(list) = line.strip_prefix(agentbox_protocol::namespace::PORTS_PREFIX) {
                    ports = parse_ports(list)?;
                } else if let Some(landlock) = line.strip_prefix(READY_PREFIX) {
                    let pid = init.ok_or_else(|| Error::unknown("the box said ready before its init ran"))?;
                    return Ok((pid, landlock.to_string(), ports));
                } else if let Some(why) = line.strip_prefix(ERROR_PREFIX) {
                    return Err(Error::unknown(format!("the namespace box could not be made: {why}")));
                }
            }
        };
        let outcome = match ctx.run(tokio::time::timeout(START_TIMEOUT, talk)).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(Error::timeout(format!(
                "the namespace box was not ready within {}s",
                START_TIMEOUT.as_secs()
            ))),
            Err(e) => Err(e),
        };
        if let Err(e) = &outcome {
            let _ = child.start_kill();
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let log = log.trim();
            if !log.is_empty() {
                return Err(Error::new(e.code(), format!("{}; its log: {log}", e.message())));
            }
        }
        // The keeper's handle is dropped: tokio reaps it when it exits, and if this process dies
        // first, init does.
        outcome
    }

    /// Make the box `key` from `spec` (checked), its writable layers seeded from `seed`:
    /// `None` when its directory is there already (an open of the same name made it first).
    pub(super) async fn make(
        &self,
        key: &str,
        name: Option<&str>,
        spec: &Spec,
        seed: Option<&Seed>,
        ctx: &Ctx,
    ) -> Result<Option<Arc<dyn Sandbox>>> {
        let t0 = std::time::Instant::now();
        ctx.check()?;
        let id = SandboxId::new(NAME, key)?;
        let dir = self.boxes.join(key);
        let created_at_ms = now_ms();
        let ends_at_ms = created_at_ms.saturating_add(spec.max_lifetime.as_millis() as u64);
        // The values are read here, on this machine, and go nowhere but the keeper's stdin.
        let secrets = crate::egress::BoxSecrets::prepare(spec)?;
        let cfg = self.config(key, &dir, spec, ends_at_ms, secrets.as_ref())?;
        let (uid, gid, root) = self.host_ids();
        let Some(lock) = self.make_dir(&dir, uid, gid, root)? else {
            return Ok(None);
        };
        let made = async {
            {
                let (dir, seed) = (dir.clone(), seed.cloned());
                tokio::task::spawn_blocking(move || Self::make_dirs(&dir, uid, gid, root, seed.as_ref()))
                    .await
                    .map_err(|e| Error::unknown(format!("making the box's directories: {e}")))??;
            }
            let bytes = serde_json::to_vec_pretty(&cfg).map_err(|e| Error::unknown(e.to_string()))?;
            write_atomic(&dir.join(CONFIG_FILE), &bytes)?;
            let (init_pid, landlock, ports) = self
                .start(&dir, uid, gid, root, secrets.as_ref().map(|s| s.line.as_str()), ctx)
                .await?;
            if ports.len() != cfg.ports.len() {
                return Err(Error::unknown(format!(
                    "the box's keeper named {} ports of the {} asked for",
                    ports.len(),
                    cfg.ports.len()
                )));
            }
            let init_start = agentbox_proc::stat(init_pid)
                .map(|s| s.start_time)
                .ok_or_else(|| Error::unknown("the box's init ended as it started"))?;
            let mut facts = facts::measure(
                init_pid,
                &cfg,
                spec,
                created_at_ms,
                ends_at_ms,
                landlock,
                self.opts.max_processes,
            )?;
            facts.name = name.map(str::to_string);
            facts.snapshot = seed.and_then(|s| s.snapshot.clone());
            facts.secrets = secrets.as_ref().map(|s| s.names.clone()).unwrap_or_default();
            let record = Record {
                id: id.clone(),
                labels: spec.labels.clone(),
                spec: spec.clone(),
                created_at_ms,
                ends_at_ms,
                init_pid,
                init_start,
                facts,
                runner_files: self.opts.runner_files,
                name: name.map(str::to_string),
                asleep: false,
                ports,
            };
            record.write(&dir)?;
            let record = match &spec.network {
                Some(Network::Allow(list)) => {
                    self.prove_egress(&dir, record, agentbox_core::NetworkFact::Allowlist(list.to_vec()), ctx)
                        .await?
                }
                None | Some(Network::Open) => {
                    self.prove_egress(&dir, record, agentbox_core::NetworkFact::Public, ctx)
                        .await?
                }
                Some(Network::None | Network::Host) => record,
            };
            if secrets.is_some() {
                let b = sandbox::open(dir.clone(), record.clone());
                crate::egress::trust(b.as_ref(), agentbox_protocol::namespace::RUNNER, ctx).await?;
            }
            Ok::<_, Error>(record)
        }
        .await;
        let r = match made {
            Ok(record) => {
                if record.spec.network == Some(Network::Host) {
                    tracing::warn!(
                        box_id = %record.id,
                        "the box shares this machine's network (network host): its programs reach every \
                         service of this machine's, loopback included"
                    );
                }
                let b = self.sandbox(dir, record);
                tracing::info!(box_id = %b.id(), name, ms = t0.elapsed().as_millis() as u64, "created");
                Ok(Some(b))
            }
            Err(e) => {
                end_box(&dir);
                Err(e)
            }
        };
        drop(lock);
        r
    }

    /// A box whose way out is the egress proxy (an allowlist, or the default network) is said
    /// to have it (`proven`) only once a program in it reached the proxy and failed to connect
    /// past it (`agentbox-runner probe egress:PORT`); a box that fails the probe is not handed
    /// out.
    async fn prove_egress(
        &self,
        dir: &Path,
        mut record: Record,
        proven: agentbox_core::NetworkFact,
        ctx: &Ctx,
    ) -> Result<Record> {
        let b = sandbox::open(dir.to_path_buf(), record.clone());
        crate::egress::prove(b.as_ref(), agentbox_protocol::namespace::RUNNER, ctx).await?;
        record.facts.network = Some(proven);
        record.write(dir)?;
        Ok(record)
    }

    pub(super) fn sandbox(&self, dir: PathBuf, record: Record) -> Arc<dyn Sandbox> {
        let asleep = record.asleep;
        let b = sandbox::open(dir, record);
        if asleep { Asleep::new(b) } else { b }
    }

    /// The box `name` if it has not ended (awake or asleep), with its record; what is left of
    /// one that ended is removed.
    pub(super) fn find(&self, name: &str) -> Result<Option<(PathBuf, Record)>> {
        if name.starts_with('.') || name.contains('/') {
            return Ok(None);
        }
        let dir = self.boxes.join(name);
        let record = match Record::read(&dir)? {
            Some(r) => r,
            None => {
                sweep_if_orphan(&dir);
                return Ok(None);
            }
        };
        if record.init_alive() {
            return Ok((record.ends_at_ms > now_ms()).then_some((dir, record)));
        }
        remove_ended(&dir, &record);
        Ok(None)
    }
}

/// Whether a box of `network` goes out through the egress proxy: every network but none and
/// host (the default is the internet through it, with this machine kept out).
pub(crate) fn proxied(network: Option<&Network>) -> bool {
    !matches!(network, Some(Network::None | Network::Host))
}

/// The keeper's `8080=41234 5432=41235`: each port of the box's, and this machine's port for it.
fn parse_ports(list: &str) -> Result<std::collections::BTreeMap<u16, u16>> {
    list.split_whitespace()
        .map(|pair| {
            pair.split_once('=')
                .and_then(|(b, h)| Some((b.parse().ok()?, h.parse().ok()?)))
                .ok_or_else(|| Error::unknown(format!("the box's keeper named a port as {pair:?}")))
        })
        .collect()
}

/// Whether this process's user namespace has the id `id` (`/proc/self/uid_map` or
/// `gid_map`: lines of inside, outside and count).
fn mapped(file: &str, id: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/self/{file}")) else {
        return false;
    };
    text.lines().any(|l| {
        let n: Vec<u64> = l.split_whitespace().filter_map(|w| w.parse().ok()).collect();
        matches!(n[..], [inside, _, count] if (inside..inside + count).contains(&u64::from(id)))
    })
}

/// Write the keeper's maps from outside: root of the box is `uid`/`gid` of the host's. An
/// unprivileged host may map only its own ids, and must deny setgroups first.
fn map_ids(pid: i32, uid: u32, gid: u32, root: bool) -> Result<()> {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let write = |file: &str, text: String| {
        std::fs::write(proc.join(file), text.as_bytes())
            .map_err(|e| Error::io(e, format!("writing the box's {file} ({})", text.trim())))
    };
    write("uid_map", format!("0 {uid} 1\n"))?;
    if !root {
        write("setgroups", "deny\n".into())?;
    }
    write("gid_map", format!("0 {gid} 1\n"))
}

#[async_trait]
impl Provider for NamespaceProvider {
    fn name(&self) -> &str {
        NAME
    }

    fn honours(&self) -> Honours {
        Honours {
            image: true,
            isolation: vec![NAME.into()],
            network_none: true,
            network_allowlist: true,
            network_host: true,
            ports: true,
            mounts: true,
            env: true,
            live_processes: true,
            snapshot: true,
            names: true,
            sleep: true,
            extend: true,
            relabel: true,
            snapshots: true,
            fork: true,
            secrets: true,
            ..Default::default()
        }
    }

    #[tracing::instrument(name = "create", skip_all, fields(provider = NAME))]
    async fn create(&self, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        self.check(spec)?;
        let seed = self.snapshot_seed(spec)?;
        let key = random_hex(8)?;
        self.make(&key, None, spec, seed.as_ref(), ctx)
            .await?
            .ok_or_else(|| Error::unknown(format!("create: a box named {key} is there already")))
    }

    async fn attach(&self, id: &SandboxId, ctx: &Ctx) -> Result<Option<Arc<dyn Sandbox>>> {
        id.expect_provider(NAME)?;
        ctx.check()?;
        Ok(self.find(id.name())?.map(|(dir, record)| self.sandbox(dir, record)))
    }

    async fn list(&self, labels: &Labels, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        ctx.check()?;
        let mut out = Vec::new();
        for name in boxdir::names(&self.boxes)? {
            if let Ok(Some((dir, record))) = self.find(&name)
                && boxdir::labels_match(&record.labels, labels)
            {
                out.push(self.sandbox(dir, record));
            }
        }
        Ok(out)
    }

    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        Some(self)
    }
}

/// End a box whose record may not exist yet: kill the init the config's keeper started (found
/// by the box's directory in its arguments), then remove the directory.
fn end_box(dir: &Path) {
    let needle = dir.to_string_lossy().into_owned();
    for p in agentbox_proc::all() {
        let Ok(cmdline) = std::fs::read(format!("/proc/{}/cmdline", p.pid)) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let ours = args
            .windows(2)
            .any(|w| (w[0] == b"namespace" || w[0] == b"namespace-init") && w[1] == needle.as_bytes());
        if ours && let Some(pid) = rustix::process::Pid::from_raw(p.pid) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
    remove_tree(dir);
}

/// Remove what is left of the ended box whose record was `seen`, if its directory still holds
/// that box: under a lock on the directory of boxes, since an open may be making a new box of
/// the same name in the same place (it only does so once this one is removed, under the same
/// lock). A directory with no record is removed only when its lock is free (no make under
/// way).
pub(crate) fn remove_ended(dir: &Path, seen: &Record) {
    let guard = dir
        .parent()
        .and_then(|boxes| std::fs::File::open(boxes).ok())
        .filter(|f| rustix::fs::flock(f, rustix::fs::FlockOperation::LockExclusive).is_ok());
    match Record::read(dir) {
        Ok(Some(now)) if now.same_box(seen) && !now.init_alive() => remove_tree(dir),
        Ok(None) if dir.join(record::LOCK).exists() && record::try_lock(&dir.join(record::LOCK)).is_some() => {
            remove_tree(dir)
        }
        _ => {}
    }
    drop(guard);
}

/// Give the tree at `dir` (a box's seeded layer, made by this process a moment ago and not yet
/// seen by any program of the box) to the box's host ids. Links are changed themselves, never
/// followed.
fn chown_tree(dir: &Path, uid: u32, gid: u32) -> Result<()> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        std::os::unix::fs::lchown(&d, Some(uid), Some(gid))
            .map_err(|e| Error::io(e, format!("giving the box {}", d.display())))?;
        let meta = std::fs::symlink_metadata(&d).map_err(|e| Error::io(e, format!("reading {}", d.display())))?;
        if !meta.is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(&d).map_err(|e| Error::io(e, format!("listing {}", d.display())))? {
            let entry = entry.map_err(|e| Error::io(e, format!("listing {}", d.display())))?;
            stack.push(entry.path());
        }
    }
    Ok(())
}

fn sweep_if_orphan(dir: &Path) {
    if boxdir::is_old(dir) {
        end_box(dir);
    }
}

/// The workspace's path in every namespace box.
pub const WORKSPACE_IN_BOX: &str = WORKSPACE;

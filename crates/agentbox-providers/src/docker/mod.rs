//! Docker boxes: a container per box, over the Docker Engine API (bollard).
//!
//! The container's first process is `agentbox-runner init` (or, without the runner, `sleep
//! <lifetime>`) in place of the image's entrypoint, and the container is auto-removed when it
//! stops, so Docker ends the box at its deadline whatever happens to the host. The lifecycle
//! (names, sleep, extend, snapshots, forks) is in `lifecycle`, and what a container's labels
//! cannot hold in `state`. Every box carries the label `agentbox.provider=docker`; attach and list see only
//! those. Programs run through `docker exec` behind a small `sh` shim (see `sandbox.rs`) that
//! reports a missing working directory or program before anything runs and tells the
//! program's pid, so a kill can reach it.
//!
//! ```no_run
//! # async fn f() -> agentbox_core::Result<()> {
//! use std::time::Duration;
//! use agentbox_core::{Ctx, Provider, Spec};
//! use agentbox_providers::docker::{DockerOptions, DockerProvider};
//! let provider = DockerProvider::new(DockerOptions { pids_limit: Some(1024), ..Default::default() }).await?;
//! let b = provider.create(&Spec::new(Duration::from_secs(600)), &Ctx::background()).await?;
//! b.destroy(&Ctx::background()).await?;
//! # Ok(()) }
//! ```

pub mod daemon;
mod key;
mod lifecycle;
mod network;
mod options;
mod pull;
mod sandbox;
mod seccomp;
mod state;

pub use options::{DockerOptions, NamedVolume};
use std::collections::HashMap;
use std::sync::Arc;

use agentbox_core::{
    Ctx, Error, Facts, Honours, Labels, Lifecycle, Network, NetworkFact, PortKind, Provider, Result, Sandbox,
    SandboxId, Spec, check_spec, is_normal_absolute, now_ms,
};
use async_trait::async_trait;
use bollard::Docker;
use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig, Mount, MountType};
use bollard::query_parameters::{
    CreateContainerOptions, InspectContainerOptions, ListContainersOptions, RemoveContainerOptions,
};

/// The port a box with an allowlist is told is its proxy (on its own loopback).
pub use crate::egress::EGRESS_PORT;
use crate::random::random_hex;
use crate::runner::{Address, Dial, Relay, RunnerSandbox};
pub use network::BOX_NETWORK;
pub use sandbox::DockerSandbox;

/// The provider's name and id prefix.
pub const NAME: &str = "docker";

/// The image boxes start from unless a spec names one: built by `scripts/box-image`.
pub const DEFAULT_IMAGE: &str = "agentbox-box:bookworm";

/// Where programs start unless a spec names a workspace.
pub const DEFAULT_WORKSPACE: &str = "/workspace";

const LABEL_PROVIDER: &str = "agentbox.provider";
const LABEL_ENDS_AT: &str = "agentbox.ends_at_ms";
const LABEL_DROP_CAPS: &str = "agentbox.drop_capabilities";
const LABEL_WORKSPACE: &str = "agentbox.workspace";
const LABEL_USER: &str = "agentbox.user";
const LABEL_RUNNER: &str = "agentbox.runner";
/// The name a box was opened by (empty: none).
const LABEL_NAME: &str = "agentbox.name";
/// The host's labels as JSON: the box's own, where an image's inherited labels are not.
const LABEL_LABELS: &str = "agentbox.labels";
/// `1`: the first process is `agentbox-runner init`, reading its deadline from a file.
const LABEL_INIT: &str = "agentbox.init";
/// The allowlist of a box with one, as JSON: its facts' network, read back by any host.
const LABEL_ALLOW: &str = "agentbox.allow";
/// The names of a box's secrets (a JSON list; never a value, never a placeholder).
const LABEL_SECRETS: &str = "agentbox.secrets";
/// The snapshot a box was made from (empty: none); a snapshot's image carries it too.
const LABEL_SNAPSHOT: &str = "agentbox.snapshot";
/// Where the deadline file is mounted for the init.
const DEADLINE_IN_BOX: &str = "/run/agentbox-deadline";

/// Where a box's runner binary is mounted.
pub const RUNNER_IN_BOX: &str = "/opt/agentbox/agentbox-runner";
/// Where the box's runner directory (a directory of this machine's, bind-mounted) is in the box.
const RUNNER_DIR_IN_BOX: &str = "/run/agentbox";
/// The unix socket the runner listens on for this machine: in the bind-mounted directory, so
/// the host reaches it as a file of its own, with no network between.
const RUNNER_SOCKET_IN_BOX: &str = "/run/agentbox/runner.sock";
/// The socket a relay exec reaches the runner by, in the box's own /tmp: for a host that
/// cannot open the shared one (another user's) and a box with no network.
const RELAY_SOCKET_IN_BOX: &str = "/tmp/agentbox-runner.sock";

/// The processes a box may have when neither the spec nor the options say: a fork bomb stops
/// here, not at the host's limit.
pub const DEFAULT_PIDS_LIMIT: i64 = 1024;
/// The most memory a box gets by default: half the engine's machine, at most this.
pub const DEFAULT_MEMORY_MAX: i64 = 4 << 30;

/// Parse a Docker size (`512m`, `4g`, `1073741824`) into bytes.
///
/// ```
/// assert_eq!(agentbox_providers::docker::parse_size("4g").unwrap(), 4 << 30);
/// assert!(agentbox_providers::docker::parse_size("4 gigs").is_err());
/// ```
pub fn parse_size(s: &str) -> Result<i64> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix('b').unwrap_or(&t);
    let (num, mul): (&str, i64) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1 << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| Error::invalid(format!("{s:?} is not a size (bytes, or 512m, 4g)")))
}

/// Makes Docker boxes. See the [module documentation](self).
pub struct DockerProvider {
    docker: Docker,
    opts: Arc<DockerOptions>,
    /// Memory a box gets when neither the spec nor the options say: half the engine's
    /// machine, at most [`DEFAULT_MEMORY_MAX`].
    default_memory: i64,
    /// When `list` last pruned the images of deleted snapshots and forks (ms since the epoch):
    /// at most once a minute, so a list stays one call per box.
    pruned_at: std::sync::atomic::AtomicU64,
    /// The runner connections of this provider's handles, by container: another handle of the
    /// same box shares one while any handle holds it.
    clients: std::sync::Mutex<HashMap<String, std::sync::Weak<crate::runner::Client>>>,
    /// The engine has gVisor's `runsc` as a runtime: `isolation: gvisor` is given.
    runsc: bool,
}

/// The engine's name for gVisor's runtime, and the isolation a spec asks for it by.
const RUNSC: &str = "runsc";
/// The isolation of a box run by [`RUNSC`].
pub const GVISOR: &str = "gvisor";

impl DockerProvider {
    /// Connect to the daemon the environment names (`DOCKER_HOST`, else the local socket),
    /// agree on an API version with it, and check the options.
    pub async fn new(opts: DockerOptions) -> Result<Self> {
        opts.validate()?;
        let docker = Docker::connect_with_local_defaults()
            .map_err(|e| Error::unknown(format!("connecting to the Docker daemon: {e}")))?;
        // bollard asks for a newer API than Debian's engine serves unless told.
        let docker = docker
            .negotiate_version()
            .await
            .map_err(|e| Error::unknown(format!("the Docker daemon does not answer: {e}")))?;
        let info = tokio::time::timeout(std::time::Duration::from_secs(30), docker.info())
            .await
            .map_err(|_| Error::timeout("the Docker daemon did not answer its info within 30s"))?
            .map_err(|e| Error::unknown(format!("the Docker daemon's info: {e}")))?;
        let machine = info.mem_total.filter(|m| *m > 0).ok_or_else(|| {
            Error::unknown(
                "the Docker daemon's info states no memory total: a box's default memory limit cannot be set",
            )
        })?;
        let runsc = info.runtimes.as_ref().is_some_and(|r| r.contains_key(RUNSC));
        Ok(DockerProvider {
            docker,
            opts: Arc::new(opts),
            default_memory: (machine / 2).clamp(6 << 20, DEFAULT_MEMORY_MAX),
            pruned_at: std::sync::atomic::AtomicU64::new(0),
            clients: Default::default(),
            runsc,
        })
    }

    fn sandbox(&self, name: String, facts: Facts, labels: Labels, workspace: String) -> Arc<dyn Sandbox> {
        Arc::new(DockerSandbox::new(
            self.docker.clone(),
            self.opts.clone(),
            name,
            facts,
            labels,
            workspace,
        ))
    }

    /// Refuse what a Docker box cannot be.
    fn check(&self, spec: &Spec) -> Result<()> {
        if spec.isolation.as_deref() == Some(GVISOR) {
            if !self.runsc {
                return Err(Error::unsupported(
                    "spec.isolation gvisor: the Docker engine has no runsc runtime; install Debian's runsc \
                     package and register it in /etc/docker/daemon.json as \"runsc\" with runtimeArgs \
                     [\"--platform=ptrace\", \"--network=none\", \"--host-uds=all\"] (see docs/secrets.md)",
                ));
            }
            if matches!(spec.network, Some(Network::Open | Network::Host)) || !spec.ports.is_empty() {
                return Err(Error::unsupported(
                    "spec.network: a gVisor box has no network of its own (runsc runs with --network=none): \
                     give it an allowlist, reached through agentbox's egress proxy, or none (the default)",
                ));
            }
            if self.opts.runner.is_none() {
                return Err(Error::unsupported(
                    "spec.isolation gvisor: a gVisor box is reached through agentbox's runner in it, and this \
                     box is made without the runner",
                ));
            }
        }
        if let Some(Network::Allow(_)) = &spec.network {
            if self.opts.runner.is_none() {
                return Err(Error::unsupported(
                    "spec.network: a Docker box enforces an allowlist through agentbox's init in it \
                     (its bridge to the egress proxy), and this box is made without the runner",
                ));
            }
            if !daemon::is_local() {
                return Err(Error::unsupported(
                    "spec.network: a Docker box's allowlist is enforced by a proxy on this machine, \
                     and the engine is another machine's",
                ));
            }
            crate::egress::check_env(spec, true)?;
            if !spec.ports.is_empty() {
                return Err(Error::unsupported(
                    "spec.ports: a Docker box with an allowlist has loopback alone, which no port \
                     can be published from",
                ));
            }
        }
        if let Some(p) = spec.ports.iter().find(|p| p.kind == PortKind::Https) {
            return Err(Error::unsupported(format!(
                "spec.ports: port {} asks for https (a bare number does), and agentbox has no \
                 certificate for a box on this machine; ask for {{ port: {}, kind: tcp }}",
                p.port, p.port
            )));
        }
        // Asked at every create: a `docker context use` since the provider was made counts.
        check_spec(spec, &self.honours(), NAME)?;
        crate::egress::check_secrets(spec, matches!(spec.network, Some(Network::Allow(_))))?;
        if let Some(ws) = &spec.workspace
            && !is_normal_absolute(ws)
        {
            return Err(Error::invalid(format!(
                "spec.workspace: {ws:?} is not an absolute path in normal form"
            )));
        }
        if spec.image.is_some() && spec.snapshot.is_some() {
            return Err(Error::invalid(
                "spec.snapshot: a box starts from a snapshot or an image, not both",
            ));
        }
        Ok(())
    }

    /// Make the container `name` from `image`: opened by `box_name` where it has one. The
    /// engine refuses a second container of one name, so two makes of one name never both
    /// succeed.
    async fn make(
        &self,
        name: &str,
        box_name: Option<&str>,
        image: String,
        spec: &Spec,
        ctx: &Ctx,
    ) -> Result<Arc<dyn Sandbox>> {
        let t0 = std::time::Instant::now();
        let ms = move || t0.elapsed().as_millis() as u64;
        let name = name.to_string();
        let mut mounts = Vec::new();
        for m in &spec.mounts {
            match std::fs::canonicalize(&m.source) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(Error::not_found(format!(
                        "spec.mounts.source: {} does not exist on this machine",
                        m.source
                    )));
                }
                Err(e) => return Err(Error::io(e, format!("spec.mounts.source: {}", m.source))),
                Ok(c) if c.to_string_lossy() != m.source => {
                    return Err(Error::invalid(format!(
                        "spec.mounts.source: {} is not canonical (it resolves to {})",
                        m.source,
                        c.display()
                    )));
                }
                Ok(_) => {}
            }
            if self.opts.volumes.iter().any(|v| v.target == m.target) {
                return Err(Error::invalid(format!(
                    "spec.mounts.target: {} is a volume's target",
                    m.target
                )));
            }
            mounts.push(Mount {
                typ: Some(MountType::BIND),
                source: Some(m.source.clone()),
                target: Some(m.target.clone()),
                read_only: Some(m.read_only),
                ..Default::default()
            });
        }
        if let Some(r) = &self.opts.runner {
            if !daemon::is_local() {
                return Err(Error::unsupported(
                    "docker runner: the runner binary is mounted from this machine, and the engine is remote",
                ));
            }
            mounts.push(Mount {
                typ: Some(MountType::BIND),
                source: Some(r.program.to_string_lossy().into_owned()),
                target: Some(RUNNER_IN_BOX.into()),
                read_only: Some(true),
                ..Default::default()
            });
            mounts.push(Mount {
                typ: Some(MountType::BIND),
                source: Some(runner_dir(&name, true)?.to_string_lossy().into_owned()),
                target: Some(RUNNER_DIR_IN_BOX.into()),
                read_only: Some(false),
                ..Default::default()
            });
        }
        // With the runner's binary in the box, it is the first process too (`init`): its
        // deadline is a file of this machine's, read-only in the box, that extend rewrites.
        let init = self.opts.runner.is_some();
        let created = now_ms();
        let secs = spec.max_lifetime.as_millis().div_ceil(1000).max(1) as u64;
        let ends_at = created.saturating_add(secs * 1000);
        if init {
            state::write_deadline(&name, ends_at, true)?;
            mounts.push(Mount {
                typ: Some(MountType::BIND),
                source: Some(state::deadline_path(&name)?.to_string_lossy().into_owned()),
                target: Some(DEADLINE_IN_BOX.into()),
                read_only: Some(true),
                ..Default::default()
            });
        }
        for v in &self.opts.volumes {
            mounts.push(Mount {
                typ: Some(MountType::VOLUME),
                source: Some(v.name.clone()),
                target: Some(v.target.clone()),
                read_only: Some(v.read_only),
                ..Default::default()
            });
        }
        ctx.check()?;

        let id = SandboxId::new(NAME, &name)?;
        let workspace = spec.workspace.clone().unwrap_or_else(|| self.opts.workspace.clone());
        let mut labels: HashMap<String, String> = spec.labels.clone().into_iter().collect();
        // Every key of the provider's is set, so none is inherited from a snapshot's image.
        labels.insert(
            LABEL_LABELS.into(),
            serde_json::to_string(&spec.labels).map_err(|e| Error::unknown(e.to_string()))?,
        );
        labels.insert(LABEL_NAME.into(), box_name.unwrap_or_default().into());
        labels.insert(LABEL_INIT.into(), if init { "1" } else { "0" }.into());
        labels.insert(LABEL_SNAPSHOT.into(), spec.snapshot.clone().unwrap_or_default());
        labels.insert(LABEL_PROVIDER.into(), NAME.into());
        labels.insert(LABEL_ENDS_AT.into(), ends_at.to_string());
        labels.insert(
            LABEL_DROP_CAPS.into(),
            if self.opts.keep_capabilities { "0" } else { "1" }.into(),
        );
        labels.insert(LABEL_WORKSPACE.into(), workspace.clone());
        let allow = match &spec.network {
            Some(Network::Allow(list)) => Some(list.clone()),
            _ => None,
        };
        if let Some(list) = &allow {
            labels.insert(
                LABEL_ALLOW.into(),
                serde_json::to_string(list).map_err(|e| Error::unknown(e.to_string()))?,
            );
        }
        // The values are read here, on this machine, and go nowhere but the proxy's stdin.
        let secrets = crate::egress::BoxSecrets::prepare(spec)?;
        if let Some(s) = &secrets {
            labels.insert(
                LABEL_SECRETS.into(),
                serde_json::to_string(&s.names).map_err(|e| Error::unknown(e.to_string()))?,
            );
        }
        labels.insert(LABEL_USER.into(), self.opts.user.clone().unwrap_or_default());
        labels.insert(
            LABEL_RUNNER.into(),
            if self.opts.runner.is_some() { "1" } else { "0" }.into(),
        );

        let gvisor = spec.isolation.as_deref() == Some(GVISOR);
        let cpus = spec.cpus.or(self.opts.cpus);
        let memory = spec
            .memory_mb
            .map(|m| (m as i64) << 20)
            .or(self.opts.memory_bytes)
            .unwrap_or(self.default_memory);
        let drop = !self.opts.keep_capabilities;
        let mut security = vec![seccomp::security_opt()];
        if drop {
            security.push("no-new-privileges".to_string());
        }
        let host = HostConfig {
            auto_remove: Some(true),
            cpu_period: cpus.map(|_| 100_000),
            cpu_quota: cpus.map(|c| (c * 100_000.0).round() as i64),
            memory: Some(memory),
            memory_swap: Some(memory),
            pids_limit: Some(self.opts.pids_limit.unwrap_or(DEFAULT_PIDS_LIMIT)),
            cap_drop: drop.then(|| vec!["ALL".to_string()]),
            security_opt: Some(security),
            storage_opt: self
                .opts
                .disk_bytes
                .map(|d| HashMap::from([("size".to_string(), d.to_string())])),
            network_mode: Some(match &spec.network {
                // An allowlist's box reaches out only through its bridge to the proxy.
                Some(Network::None | Network::Allow(_)) => "none".to_string(),
                // A gVisor box has no network of its own: none unless a list is asked for.
                _ if gvisor => "none".to_string(),
                _ => network::BOX_NETWORK.to_string(),
            }),
            // gVisor's kernel in user space between the box's programs and this machine's.
            runtime: gvisor.then(|| RUNSC.to_string()),
            mounts: (!mounts.is_empty()).then_some(mounts),
            // Each port asked for, published on this machine's loopback at a port the engine
            // picks (`endpoint` reads it back).
            port_bindings: (!spec.ports.is_empty()).then(|| {
                spec.ports
                    .iter()
                    .map(|p| {
                        let binding = bollard::models::PortBinding {
                            host_ip: Some("127.0.0.1".into()),
                            host_port: Some(String::new()),
                        };
                        (format!("{}/tcp", p.port), Some(vec![binding]))
                    })
                    .collect()
            }),
            device_requests: spec.gpu.as_ref().map(|_| {
                // Docker cannot choose a model: any gpu gives every GPU of the host.
                vec![DeviceRequest {
                    count: Some(-1),
                    capabilities: Some(vec![vec!["gpu".to_string()]]),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        };
        if !gvisor && !matches!(spec.network, Some(Network::None | Network::Allow(_))) {
            network::ensure(&self.docker, ctx).await?;
        }
        let mut env = spec.env.clone();
        if allow.is_some() {
            env.extend(crate::egress::proxy_env());
        }
        if let Some(s) = &secrets {
            env.extend(s.env.clone());
        }
        let body = ContainerCreateBody {
            image: Some(image.clone()),
            entrypoint: Some(if let Some(helper) = &self.opts.runner {
                // The runner's program and its own arguments (`agentbox runner`, where the
                // runner is the agentbox binary itself), then the init's.
                let mut argv = vec![RUNNER_IN_BOX.to_string()];
                argv.extend(helper.args.iter().cloned());
                argv.extend(["init".into(), "--deadline-file".into(), DEADLINE_IN_BOX.into()]);
                if allow.is_some() {
                    argv.extend([
                        "--egress-port".into(),
                        EGRESS_PORT.to_string(),
                        "--egress-socket".into(),
                        format!("{RUNNER_DIR_IN_BOX}/{}", agentbox_protocol::namespace::EGRESS_SOCKET),
                    ]);
                }
                argv
            } else {
                vec!["sleep".into(), secs.to_string()]
            }),
            cmd: None,
            env: Some(env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            exposed_ports: (!spec.ports.is_empty())
                .then(|| spec.ports.iter().map(|p| format!("{}/tcp", p.port)).collect()),
            labels: Some(labels.clone()),
            working_dir: Some(workspace.clone()),
            user: self.opts.user.clone(),
            host_config: Some(host),
            ..Default::default()
        };
        let create = |body: ContainerCreateBody| {
            let create = self.docker.create_container(
                Some(CreateContainerOptions {
                    name: Some(name.clone()),
                    ..Default::default()
                }),
                body,
            );
            async {
                match ctx.run(create).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(map_create_error(e, &image, self.opts.disk_bytes)),
                    Err(e) => Err(e),
                }
            }
        };
        let mut made = create(body.clone()).await;
        // An image the engine does not have is pulled where the engine can reach a registry,
        // then the container made again.
        if matches!(&made, Err(e) if e.code() == agentbox_core::ErrorCode::NotFound) {
            made = match pull::pull(&self.docker, &image, ctx).await {
                Ok(()) => create(body).await,
                Err(e) => Err(e),
            };
        }
        if let Err(e) = made {
            // The name's files are this make's only if the container is (a conflict is
            // another's make of the same name).
            if e.code() != agentbox_core::ErrorCode::Refused {
                state::remove(&name);
            }
            return Err(e);
        }
        // The workspace is the box's user's before any program of the box runs: the engine
        // unpacks a directory entry of that owner into the created container (a chown in
        // the box would need the capabilities the box no longer has).
        if let Some(user) = &self.opts.user {
            let owned = async {
                let tar = owned_dir(&workspace, user)?;
                ctx.run(self.docker.upload_to_container(
                    &name,
                    Some(bollard::query_parameters::UploadToContainerOptions {
                        path: "/".into(),
                        ..Default::default()
                    }),
                    bollard::body_full(tar.into()),
                ))
                .await?
                .map_err(|e| Error::unknown(format!("giving {workspace} to {user}: {e}")))
            }
            .await;
            if let Err(e) = owned {
                self.discard_container(&name).await;
                return Err(e.context("giving the workspace to the box's user"));
            }
        }
        // The proxy before the box: its init's bridge finds the socket from its first moment.
        if let (Some(list), Some(runner)) = (&allow, &self.opts.runner)
            && let Err(e) = network::start_proxy(runner, &name, list, secrets.as_ref().map(|s| s.line.as_str())).await
        {
            self.discard_container(&name).await;
            return Err(e);
        }
        let started = ctx.run(self.docker.start_container(&name, None)).await;
        let started = match started {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Error::unknown(format!("starting container {name}: {e}"))),
            Err(e) => Err(e),
        };
        if let Err(e) = started {
            self.discard_container(&name).await;
            return Err(e);
        }
        tracing::debug!(container = %name, ms = ms(), "container started");
        // The facts are what the engine says it made: a box whose facts cannot be read is not
        // handed out with guessed ones.
        let inspected = match ctx
            .run(self.docker.inspect_container(&name, None::<InspectContainerOptions>))
            .await
        {
            Ok(Ok(i)) => i,
            Ok(Err(e)) => {
                self.discard_container(&name).await;
                return Err(Error::unknown(format!(
                    "inspecting container {name} after making it (its facts cannot be known, so it was removed): {e}"
                )));
            }
            Err(e) => {
                self.discard_container(&name).await;
                return Err(e);
            }
        };
        let ip = container_ip(&inspected);
        let Some(host) = inspected.host_config else {
            self.discard_container(&name).await;
            return Err(Error::unknown(format!(
                "container {name}: the engine's inspect has no host config (its limits and network cannot be known, so it was removed)"
            )));
        };
        let mut facts = facts_of(&host, ends_at, Some(created), &workspace);
        // Proven below before the box is handed out, or the box is ended.
        allowlist_facts(&mut facts, &labels, true);
        lifecycle::lifecycle_facts(&mut facts, &labels);
        debug_assert_eq!(id.name(), name);
        let b = self.sandbox(name.clone(), facts, spec.labels.clone(), workspace);
        if self.opts.runner.is_none() {
            tracing::info!(box_id = %id, ms = ms(), "created");
            return Ok(b);
        }
        let made = match self.through_runner(b, ip, true, ctx).await {
            Ok(b) if allow.is_some() => match self.prove_egress(&name, b.as_ref(), secrets.is_some(), ctx).await {
                Ok(()) => Ok(b),
                Err(e) => {
                    self.discard_container(&name).await;
                    return Err(e);
                }
            },
            other => other,
        };
        match made {
            Ok(b) => {
                tracing::info!(box_id = %id, ms = ms(), runner = b.facts().runner.as_deref().unwrap_or("?"), "created");
                Ok(b)
            }
            Err(e) => {
                self.discard_container(&name).await;
                let e = e.context("starting the box's runner");
                // A dynamic build that cannot run in this image: say what to do instead.
                Err(match &self.opts.runner {
                    Some(r) => r.explain(e),
                    None => e,
                })
            }
        }
    }

    /// Prove box `name`'s allowlist from inside it, and keep that it was (its state file); a
    /// box with `secrets` is made to trust its own authority first.
    async fn prove_egress(&self, name: &str, b: &dyn Sandbox, secrets: bool, ctx: &Ctx) -> Result<()> {
        crate::egress::prove(b, RUNNER_IN_BOX, ctx).await?;
        if secrets {
            crate::egress::trust(b, RUNNER_IN_BOX, ctx).await?;
        }
        let _held = state::lock(name, "keeping the box's proven allowlist").await?;
        state::update(name, |s| s.egress_proven = true)
    }

    /// Remember `client` as the connection to box `name`'s runner (forgetting those no handle
    /// holds any more).
    fn hold(&self, name: &str, client: &Arc<crate::runner::Client>) {
        let mut held = self.clients.lock().unwrap();
        held.retain(|_, c| c.strong_count() > 0);
        held.insert(name.to_string(), Arc::downgrade(client));
    }

    /// Build the handle of a container we made, from its inspect; `None` when it is not ours
    /// or has ended.
    async fn find_container(&self, name: &str) -> Result<Option<Arc<dyn Sandbox>>> {
        self.find_labelled(name, None).await
    }

    /// [`Self::find_container`], answering `None` for a box that lacks one of `want` before
    /// anything but its inspect is done (a list reaches no runner of a box it does not answer).
    /// A list (`want` given) starts nothing in a box: a box whose runner does not answer is
    /// listed [`Unreadable`](crate::lifecycle::Unreadable), saying why.
    async fn find_labelled(&self, name: &str, want: Option<&Labels>) -> Result<Option<Arc<dyn Sandbox>>> {
        let info = match self
            .docker
            .inspect_container(name, None::<InspectContainerOptions>)
            .await
        {
            Ok(i) => i,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(Error::unknown(format!("inspecting container {name}: {e}"))),
        };
        let config = info.config.clone().unwrap_or_default();
        let all_labels = config.labels.clone().unwrap_or_default();
        if all_labels.get(LABEL_PROVIDER).map(String::as_str) != Some(NAME) {
            return Ok(None);
        }
        let running = info.state.as_ref().and_then(|s| s.running).unwrap_or(false);
        let init = all_labels.get(LABEL_INIT).map(String::as_str) == Some("1");
        // The deadline its init keeps, where this home holds the file; else the one it was
        // made with.
        let ends_at: u64 = init
            .then(|| state::read_deadline(name))
            .flatten()
            .or_else(|| all_labels.get(LABEL_ENDS_AT).and_then(|v| v.parse().ok()))
            .unwrap_or(0);
        if !running || ends_at <= now_ms() {
            return Ok(None);
        }
        let kept = state::read(name)?;
        let host = info.host_config.clone().unwrap_or_default();
        // The host's labels: as relabelled, else as made (the JSON label, which an image's
        // inherited labels cannot stand in for), else, for a box made before it, the plain ones.
        let labels: Labels = match (&kept.labels, all_labels.get(LABEL_LABELS)) {
            (Some(l), _) => l.clone(),
            (None, Some(json)) => serde_json::from_str(json).map_err(|e| {
                Error::invalid(format!("container {name}: its label {LABEL_LABELS} is not labels: {e}"))
            })?,
            (None, None) => all_labels
                .iter()
                .filter(|(k, _)| !agentbox_core::is_reserved_label(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        };
        if let Some(want) = want
            && !want.iter().all(|(k, v)| labels.get(k) == Some(v))
        {
            return Ok(None);
        }
        let workspace = all_labels
            .get(LABEL_WORKSPACE)
            .cloned()
            .unwrap_or_else(|| self.opts.workspace.clone());
        let created_ms = info
            .state
            .as_ref()
            .and_then(|s| s.started_at.as_deref())
            .and_then(parse_rfc3339_ms);
        let mut facts = facts_of(&host, ends_at, created_ms, &workspace);
        allowlist_facts(&mut facts, &all_labels, kept.egress_proven);
        lifecycle::lifecycle_facts(&mut facts, &all_labels);
        let b = self.sandbox(name.to_string(), facts, labels, workspace);
        if kept.asleep {
            return Ok(Some(crate::lifecycle::Asleep::new(b)));
        }
        if all_labels.get(LABEL_RUNNER).map(String::as_str) == Some("1") {
            let ip = container_ip(&info);
            if want.is_some() {
                let ctx = Ctx::background().with_timeout(std::time::Duration::from_secs(10));
                return Ok(Some(self.runner_answering(b, ip, &ctx).await));
            }
            return Ok(Some(self.through_runner(b, ip, false, &Ctx::background()).await?));
        }
        Ok(Some(b))
    }

    /// The box through a connection this provider already holds to its runner, if it still
    /// answers one message: no connection made, nothing started in the box.
    async fn held_runner(&self, b: &Arc<dyn Sandbox>, ctx: &Ctx) -> Option<Arc<dyn Sandbox>> {
        let client = self
            .clients
            .lock()
            .unwrap()
            .get(b.id().name())
            .and_then(std::sync::Weak::upgrade)?;
        let r = RunnerSandbox::with_client(b.clone(), client);
        r.check(ctx).await.is_ok().then(|| Arc::new(r) as Arc<dyn Sandbox>)
    }

    /// The box through a runner that already answers, by a held connection, its socket or the
    /// container's address: nothing is started or run in the box (a list's way). A runner that
    /// answers none of them (a box another agentbox home or version made) leaves the box
    /// [`Unreadable`](crate::lifecycle::Unreadable), with the reason.
    async fn runner_answering(&self, b: Arc<dyn Sandbox>, ip: Option<String>, ctx: &Ctx) -> Arc<dyn Sandbox> {
        if self.opts.runner.is_none() {
            return b;
        }
        if let Some(r) = self.held_runner(&b, ctx).await {
            return r;
        }
        let mut ways: Vec<Arc<dyn Dial>> = Vec::new();
        match runner_dir(b.id().name(), false) {
            Ok(dir) => ways.push(Arc::new(Address::Unix(dir.join("runner.sock")))),
            Err(e) => tracing::debug!(box_id = %b.id(), error = %e, "no runner directory"),
        }
        if let Some(ip) = &ip {
            match crate::home::default_home().and_then(|h| key::runner_token(&h, b.id().name())) {
                Ok(token) => ways.push(Arc::new(Address::Tcp {
                    addr: format!("{ip}:{}", agentbox_protocol::runner::PORT),
                    token: Some(token),
                })),
                Err(e) => tracing::debug!(box_id = %b.id(), error = %e, "no runner token"),
            }
        }
        let mut last = None;
        for dial in ways {
            let r = RunnerSandbox::new(b.clone(), dial);
            match r.check(ctx).await {
                Ok(()) => {
                    self.hold(b.id().name(), r.client());
                    return Arc::new(r);
                }
                Err(e) => last = Some(e),
            }
        }
        let why = match last {
            Some(e) => format!(
                "its runner does not answer this machine ({}); another agentbox home or version may have made it",
                e.message().lines().map(str::trim).collect::<Vec<_>>().join(" ")
            ),
            None => "its runner cannot be reached from this machine".to_string(),
        };
        crate::lifecycle::Unreadable::new(b, why)
    }

    /// The box through its runner: over the container's address with this machine's token
    /// for it, else over a relay exec (no network, or a runner another machine started);
    /// a runner that does not answer either way is started (`fresh`: the box was just made).
    async fn through_runner(
        &self,
        b: Arc<dyn Sandbox>,
        ip: Option<String>,
        fresh: bool,
        ctx: &Ctx,
    ) -> Result<Arc<dyn Sandbox>> {
        let Some(helper) = &self.opts.runner else {
            // Made with a runner, found by a provider without one: its own exec still works.
            return Ok(b);
        };
        let token = key::runner_token(&crate::home::default_home()?, b.id().name())?;
        let mut program = vec![RUNNER_IN_BOX.to_string()];
        program.extend(helper.args.iter().cloned());
        let relay = || Relay {
            sandbox: b.clone(),
            argv: program
                .iter()
                .cloned()
                .chain(["relay".to_string(), format!("unix:{RELAY_SOCKET_IN_BOX}")])
                .collect(),
        };
        // This machine's end of the runner's socket: a file, no network, no token. Its owner
        // is the box's user: a host process of another (not root) cannot open it, and goes by
        // the container's address or a relay exec instead.
        let socket = runner_dir(b.id().name(), false)?.join("runner.sock");
        let tcp = ip.as_ref().map(|ip| Address::Tcp {
            addr: format!("{ip}:{}", agentbox_protocol::runner::PORT),
            token: Some(token.clone()),
        });
        if fresh {
            let mut listen = vec![
                format!("unix:{RUNNER_SOCKET_IN_BOX}"),
                format!("unix:{RELAY_SOCKET_IN_BOX}"),
            ];
            if ip.is_some() {
                listen.push(format!("0.0.0.0:{}", agentbox_protocol::runner::PORT));
            }
            let started = crate::runner::start(
                b.as_ref(),
                &program,
                &listen,
                ip.is_some().then_some(token.as_str()),
                ctx,
            )
            .await;
            if let Err(e) = started {
                let r = RunnerSandbox::new(b.clone(), Arc::new(Address::Unix(socket.clone())));
                crate::runner::joined(&r, e, ctx).await?;
                return Ok(Arc::new(r));
            }
            // The runner said it listens: the socket answers at once. The container's address
            // is the way of a host user the socket refuses; it can be unreachable for a moment
            // (a reused address whose neighbour entry is stale), so it is tried for ten seconds.
            let r = RunnerSandbox::new(b.clone(), Arc::new(Address::Unix(socket.clone())));
            match r.check(ctx).await {
                Ok(()) => {
                    self.hold(b.id().name(), r.client());
                    return Ok(Arc::new(r));
                }
                Err(e) => {
                    tracing::debug!(box_id = %b.id(), error = %e, "the runner's socket refused this machine's user")
                }
            }
            let dial: Arc<dyn Dial> = match tcp {
                Some(t) => Arc::new(t),
                None => Arc::new(relay()),
            };
            let r = RunnerSandbox::new(b, dial);
            let mut tries = 0;
            while let Err(e) = r.check(ctx).await {
                tries += 1;
                if tries >= 40 || ctx.err().is_some() {
                    return Err(e);
                }
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
            return Ok(Arc::new(r));
        }
        // A connection this provider already holds to the box's runner serves a new handle
        // too: one message to check it, rather than a connection made (a pool's hand-out
        // attaches a box it holds twice).
        if let Some(r) = self.held_runner(&b, ctx).await {
            return Ok(r);
        }
        let mut ways: Vec<Arc<dyn Dial>> = vec![Arc::new(Address::Unix(socket))];
        ways.extend(tcp.map(|t| Arc::new(t) as Arc<dyn Dial>));
        ways.push(Arc::new(relay()));
        for dial in ways {
            let r = RunnerSandbox::new(b.clone(), dial);
            if r.check(ctx).await.is_ok() {
                self.hold(b.id().name(), r.client());
                return Ok(Arc::new(r));
            }
        }
        Box::pin(self.through_runner(b, ip, true, ctx)).await
    }
}

/// The container's address on its first network, where it has one.
fn container_ip(info: &bollard::models::ContainerInspectResponse) -> Option<String> {
    info.network_settings
        .as_ref()?
        .networks
        .as_ref()?
        .values()
        .filter_map(|n| n.ip_address.clone())
        .find(|ip| !ip.is_empty())
}

/// The ports of the box published to this machine's loopback, as the engine states them.
fn published_ports(host: &HostConfig) -> Vec<agentbox_core::PortFact> {
    let mut ports: Vec<agentbox_core::PortFact> = host
        .port_bindings
        .iter()
        .flatten()
        .filter(|(_, b)| b.iter().flatten().any(|b| b.host_ip.as_deref() == Some("127.0.0.1")))
        .filter_map(|(k, _)| k.strip_suffix("/tcp")?.parse().ok())
        .map(|port| agentbox_core::PortFact {
            port,
            kind: PortKind::Tcp,
        })
        .collect();
    ports.sort_by_key(|p| p.port);
    ports
}

/// A box with network `none` and an allowlist in its labels has that allowlist once `proven`
/// (the create that made it proved it from inside, and said so in the box's state file);
/// until then it was asked for and not proven (a create still under way, or one that died
/// before its probe, or a box another agentbox home made).
fn allowlist_facts(facts: &mut Facts, labels: &HashMap<String, String>, proven: bool) {
    if facts.network == Some(NetworkFact::None)
        && let Some(list) = labels.get(LABEL_ALLOW)
    {
        facts.network = match serde_json::from_str::<Vec<String>>(list) {
            Ok(list) if proven => Some(NetworkFact::Allowlist(list)),
            Ok(_) => Some(NetworkFact::Requested),
            // A label that is not a list: what the box may reach is not known.
            Err(_) => None,
        };
    }
    if let Some(names) = labels.get(LABEL_SECRETS) {
        facts.secrets = serde_json::from_str(names).unwrap_or_default();
    }
}

/// This machine's directory for the runner of box `name`, bind-mounted at [`RUNNER_DIR_IN_BOX`]:
/// `$AGENTBOX_HOME/docker/<name>`. Its parent is this user's alone (0700), so the directory
/// itself may be open to the box's user (0777), whoever that is, to make its socket in.
/// `make`: create it (at the box's create).
pub(crate) fn runner_dir(name: &str, make: bool) -> Result<std::path::PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let parent = crate::home::default_home()?.join("docker");
    let dir = parent.join(name);
    if make {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&parent)
            .map_err(|e| Error::io(e, format!("making {}", parent.display())))?;
        std::fs::create_dir(&dir).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                // Another make of one name, or the leftover of a box that ended.
                Error::refused(format!("{} exists: the box's name is taken", dir.display()))
            } else {
                Error::io(e, format!("making {}", dir.display()))
            }
        })?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))
            .map_err(|e| Error::io(e, format!("opening {} to the box's user", dir.display())))?;
    }
    Ok(dir)
}

fn remove_options() -> RemoveContainerOptions {
    RemoveContainerOptions {
        force: true,
        v: true,
        ..Default::default()
    }
}

pub(crate) fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }
    )
}

fn facts_of(host: &HostConfig, ends_at_ms: u64, started_at_ms: Option<u64>, workspace: &str) -> Facts {
    // What the engine says it applied, read the way that fails closed.
    let security = host.security_opt.clone().unwrap_or_default();
    let capabilities = match host.cap_drop.as_deref() {
        Some(d)
            if d.iter().any(|c| c.eq_ignore_ascii_case("ALL"))
                && host.cap_add.as_deref().unwrap_or_default().is_empty() =>
        {
            Some("none".to_string())
        }
        Some([]) | None
            if host.cap_add.as_deref().unwrap_or_default().is_empty() && !host.privileged.unwrap_or(false) =>
        {
            Some("docker-default".to_string())
        }
        _ => None,
    };
    let no_new_privs = Some(
        security
            .iter()
            .any(|o| o == "no-new-privileges" || o == "no-new-privileges:true"),
    );
    let seccomp = if security.iter().any(|o| o == &seccomp::security_opt()) {
        Some(seccomp::NAME.to_string())
    } else if security
        .iter()
        .any(|o| o == "seccomp=unconfined" || o == "seccomp:unconfined")
    {
        Some("unconfined".to_string())
    } else {
        None
    };
    let cpus = match (host.cpu_quota, host.cpu_period) {
        (Some(q), Some(p)) if q > 0 && p > 0 => Some(q as f64 / p as f64),
        _ => None,
    };
    let memory_mb = host.memory.filter(|m| *m > 0).map(|m| (m as u64) >> 20);
    // Read the way that fails closed: a mode the engine did not state is unknown, never open.
    let network = match host.network_mode.as_deref() {
        Some("none") => Some(NetworkFact::None),
        Some(m) if !m.is_empty() => Some(NetworkFact::Open),
        _ => None,
    };
    let mounts = host
        .mounts
        .iter()
        .flatten()
        .filter(|m| m.typ == Some(MountType::BIND))
        // The runner's binary and directory and the init's deadline are the provider's, not
        // the spec's.
        .filter(|m| {
            !matches!(
                m.target.as_deref(),
                Some(RUNNER_IN_BOX | RUNNER_DIR_IN_BOX | DEADLINE_IN_BOX)
            )
        })
        .filter_map(|m| {
            Some(agentbox_core::Mount {
                source: m.source.clone()?,
                target: m.target.clone()?,
                read_only: m.read_only.unwrap_or(false),
            })
        })
        .collect();
    Facts {
        provider: NAME.into(),
        // What the engine says runs the box: gVisor's runsc, or its default (runc).
        isolation: if host.runtime.as_deref() == Some(RUNSC) {
            GVISOR.into()
        } else {
            "container".into()
        },
        cpus,
        memory_mb,
        pids_limit: host.pids_limit.filter(|p| *p > 0).map(|p| p as u64),
        network,
        // The ports published on this machine's loopback, each a raw TCP socket.
        ports: Some(published_ports(host)),
        started_at_ms,
        ends_at_ms: Some(ends_at_ms),
        live_processes: true,
        secrets_via: Some("fd".into()),
        workspace: Some(workspace.to_string()),
        mounts,
        capabilities,
        no_new_privs,
        seccomp,
        ..Default::default()
    }
}

/// `2026-11-30T04:40:00.123456789Z` as milliseconds since the epoch (as Docker writes its
/// times); `None` for anything else or a time before the epoch.
fn parse_rfc3339_ms(s: &str) -> Option<u64> {
    let t: jiff::Timestamp = s.parse().ok()?;
    u64::try_from(t.as_millisecond()).ok()
}

#[async_trait]
impl Provider for DockerProvider {
    fn name(&self) -> &str {
        NAME
    }

    fn honours(&self) -> Honours {
        Honours {
            image: true,
            cpus: true,
            memory: true,
            gpu: true,
            // gvisor where the engine has runsc; refused naming the package where it has not.
            isolation: vec!["container".into(), GVISOR.into()],
            network_none: true,
            network_allowlist: self.opts.runner.is_some() && daemon::is_local(),
            ports: true,
            mounts: daemon::is_local(),
            workspace: true,
            env: true,
            live_processes: true,
            snapshot: true,
            names: true,
            snapshots: true,
            fork: true,
            // Kept outside by the egress proxy of an allowlist, which needs the runner.
            secrets: self.opts.runner.is_some() && daemon::is_local(),
            // These need agentbox's init as the first process, which is the runner's binary.
            sleep: self.opts.runner.is_some(),
            extend: self.opts.runner.is_some(),
            relabel: self.opts.runner.is_some(),
            ..Default::default()
        }
    }

    #[tracing::instrument(name = "create", skip_all, fields(provider = NAME))]
    async fn create(&self, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        self.check(spec)?;
        let image = self.image_of(spec, ctx).await?;
        self.make(&format!("agentbox-{}", random_hex(8)?), None, image, spec, ctx)
            .await
    }
    async fn attach(&self, id: &SandboxId, ctx: &Ctx) -> Result<Option<Arc<dyn Sandbox>>> {
        id.expect_provider(NAME)?;
        ctx.run_result(self.find_container(id.name())).await
    }

    async fn list(&self, labels: &Labels, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        // Filtered here, not by the engine: a relabelled box's labels are this machine's.
        let filters = vec![format!("{LABEL_PROVIDER}={NAME}")];
        let opts = ListContainersOptions {
            all: false,
            filters: Some(HashMap::from([("label".to_string(), filters)])),
            ..Default::default()
        };
        let found = ctx
            .run(self.docker.list_containers(Some(opts)))
            .await?
            .map_err(|e| Error::unknown(format!("listing containers: {e}")))?;
        let mut out = Vec::new();
        for c in found {
            let Some(name) = c
                .names
                .iter()
                .flatten()
                .next()
                .map(|n| n.trim_start_matches('/').to_string())
            else {
                continue;
            };
            match self.find_labelled(&name, Some(labels)).await {
                Ok(Some(b)) => out.push(b),
                Ok(None) => {}
                // One that ended while the list went on is not listed.
                Err(e)
                    if matches!(
                        e.code(),
                        agentbox_core::ErrorCode::Gone | agentbox_core::ErrorCode::NotFound
                    ) =>
                {
                    tracing::debug!(container = %name, error = %e, "ended while listed");
                }
                Err(e) => return Err(e),
            }
        }
        out.sort_by(|a, b| a.id().cmp(b.id()));
        self.sweep_runner_dirs(ctx).await;
        self.prune_images(ctx).await;
        Ok(out)
    }

    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        Some(self)
    }
}

impl DockerProvider {
    /// Remove the runner directories of boxes that ended on their own (their lifetime passed,
    /// with no call from the host): each whose container the engine no longer has, and made
    /// over a minute ago (so never one whose box is being made).
    async fn sweep_runner_dirs(&self, ctx: &Ctx) {
        let Ok(parent) = crate::home::default_home().map(|h| h.join("docker")) else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(&parent) else {
            return;
        };
        for e in entries.flatten().take(1024) {
            let file = e.file_name().to_string_lossy().into_owned();
            // A box's runner directory, or one of its lifecycle's files (`<name>.deadline`...).
            let name = match file.rsplit_once('.') {
                Some((n, "deadline" | "json" | "lock" | "refusals" | "proxy")) => n.to_string(),
                _ => file.clone(),
            };
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|d| d > std::time::Duration::from_secs(60)));
            if !name.starts_with("agentbox-") || !old {
                continue;
            }
            let gone = matches!(
                ctx.run(self.docker.inspect_container(&name, None::<InspectContainerOptions>)).await,
                Ok(Err(ref e)) if is_not_found(e)
            );
            if gone {
                tracing::debug!(container = %name, file, "sweeping what was kept for a box that ended");
                if e.path().is_dir() {
                    let _ = std::fs::remove_dir_all(e.path());
                } else {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}

/// A tar holding one directory entry, `path` (absolute, normal), owned by `user` (`uid:gid`),
/// mode 0755, with its parents as plain root directories: what the engine unpacks to give a
/// box's workspace its owner.
fn owned_dir(path: &str, user: &str) -> Result<Vec<u8>> {
    let (uid, gid) = user
        .split_once(':')
        .and_then(|(u, g)| Some((u.parse::<u64>().ok()?, g.parse::<u64>().ok()?)))
        .ok_or_else(|| Error::invalid(format!("docker user: {user:?} is not uid:gid")))?;
    let mut b = tar::Builder::new(Vec::new());
    let mut prefix = String::new();
    let parts: Vec<&str> = path
        .trim_start_matches('/')
        .split('/')
        .filter(|p| !p.is_empty())
        .collect();
    for (i, part) in parts.iter().enumerate() {
        prefix.push_str(part);
        prefix.push('/');
        let last = i + 1 == parts.len();
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        h.set_uid(if last { uid } else { 0 });
        h.set_gid(if last { gid } else { 0 });
        h.set_mtime(now_ms() / 1000);
        b.append_data(&mut h, &prefix, std::io::empty())
            .map_err(|e| Error::unknown(format!("writing the workspace's archive: {e}")))?;
    }
    b.into_inner()
        .map_err(|e| Error::unknown(format!("writing the workspace's archive: {e}")))
}

fn map_create_error(e: bollard::errors::Error, image: &str, disk: Option<i64>) -> Error {
    let text = e.to_string();
    if disk.is_some() && (text.contains("storage-opt") || text.contains("storage opt") || text.contains("quota")) {
        return Error::unsupported(format!(
            "docker disk: this engine cannot bound a box's disk (Docker enforces a size only for \
             overlay2 on xfs mounted with pquota, and for devicemapper, btrfs and zfs): {text}"
        ));
    }
    if matches!(
        e,
        bollard::errors::Error::DockerResponseServerError { status_code: 409, .. }
    ) {
        return Error::refused(format!("the container's name is taken: {text}"));
    }
    if is_not_found(&e) {
        return Error::not_found(format!(
            "image {image}: not on the Docker daemon (build it with scripts/box-image): {text}"
        ));
    }
    Error::unknown(format!("creating the container: {text}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_the_engine_did_not_state_are_unknown_never_granted() {
        let f = facts_of(&HostConfig::default(), 1, None, "/workspace");
        assert_eq!(f.network, None, "a network mode not stated is unknown, not open");
        assert_eq!((f.cpus, f.memory_mb, f.pids_limit), (None, None, None));
        let none = HostConfig {
            network_mode: Some("none".into()),
            ..Default::default()
        };
        assert_eq!(facts_of(&none, 1, None, "/w").network, Some(NetworkFact::None));
        let bridge = HostConfig {
            network_mode: Some("bridge".into()),
            ..Default::default()
        };
        assert_eq!(facts_of(&bridge, 1, None, "/w").network, Some(NetworkFact::Open));
    }

    #[test]
    fn options_are_checked_by_name() {
        let bad = |f: &dyn Fn(&mut DockerOptions)| {
            let mut o = DockerOptions::default();
            f(&mut o);
            o.validate().unwrap_err().message().to_string()
        };
        assert!(bad(&|o| o.user = Some("root".into())).contains("docker user"));
        assert!(bad(&|o| o.cpus = Some(0.001)).contains("docker cpus"));
        assert!(bad(&|o| o.pids_limit = Some(0)).contains("pids_limit"));
        assert!(bad(&|o| o.pids_limit = Some(4_194_305)).contains("pids_limit"));
        assert!(bad(&|o| o.memory_bytes = Some(1024)).contains("memory"));
        let vol = |name: &str, target: &str| NamedVolume {
            name: name.into(),
            target: target.into(),
            read_only: false,
        };
        assert!(bad(&|o| o.volumes = vec![vol("-x", "/v")]).contains("volumes"));
        assert!(bad(&|o| o.volumes = vec![vol("good", "/v/../etc")]).contains("target"));
        assert!(bad(&|o| o.volumes = vec![vol("a1", "/v"), vol("b1", "/v")]).contains("twice"));
        let mut o = DockerOptions {
            user: Some("1000:1000".into()),
            pids_limit: Some(1024),
            ..Default::default()
        };
        o.volumes.push(vol("cache_1", "/run/x"));
        assert!(o.validate().is_ok());
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("512m").unwrap(), 512 << 20);
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("2GB").unwrap(), 2 << 30);
        assert!(parse_size("0").is_err());
        assert!(parse_size("-1g").is_err());
        assert!(parse_size("99999999999999999g").is_err());
    }

    #[test]
    fn docker_times_parse() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:01.5Z"), Some(1500));
        assert_eq!(
            parse_rfc3339_ms("2026-11-30T04:40:00.123456789Z"),
            Some(1_796_013_600_123)
        );
        assert_eq!(parse_rfc3339_ms("garbage"), None);
    }
}

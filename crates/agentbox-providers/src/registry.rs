//! Every provider agentbox knows, by name, and how each is made from typed [`Options`] and an
//! [`Environment`] (the process's variables, and the program that may serve as a box's
//! helper).
//!
//! Every host asks the registry rather than keeping a list of its own: the CLI's `--provider`,
//! `agentbox mcp`, a transport config's host (`agentbox_transport`) and the bench. A new
//! provider is one [`Entry`] here, behind a cargo feature of its own; an unknown name's error
//! lists every name there is, and a name whose feature this build left out says so.
//!
//! ```no_run
//! # async fn f() -> agentbox_core::Result<()> {
//! use agentbox_providers::registry::{self, Environment, Options};
//! let env = Environment::from_process();
//! let docker = registry::make("docker", &Options::default(), &env).await?;
//! println!("{}", registry::choices()); // local, docker
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Error, Provider, Result};
use futures_util::future::BoxFuture;

use crate::helper::{HelperCommand, RUNNER_ENV};

/// How long making a provider may take: Docker's is a round trip to the engine.
pub const MAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// An option beyond [`Options::runner`], which only some providers take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opt {
    /// [`Options::user`].
    User,
    /// [`Options::pids_limit`].
    PidsLimit,
    /// [`Options::keep_capabilities`].
    KeepCapabilities,
    /// [`Options::disk_bytes`].
    Disk,
}

impl Opt {
    /// Its name in errors (and the CLI's flag, after `--`).
    pub fn name(self) -> &'static str {
        match self {
            Opt::User => "user",
            Opt::PidsLimit => "pids-limit",
            Opt::KeepCapabilities => "keep-capabilities",
            Opt::Disk => "disk",
        }
    }
}

/// How a host wants a provider's boxes made, beyond each box's spec.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Start agentbox's runner in each box where the provider can (on by default): each
    /// command and file operation is then one message to it rather than a process, several
    /// times faster (`agentbox bench runner`). Local boxes always can; Docker
    /// boxes when the engine is this machine's (the runner is a bind mount) and a runner
    /// binary is found ([`Environment::runner`]); elsewhere boxes are made without one, with a
    /// warning, and a box's facts say which it got.
    pub runner: bool,
    /// Every program runs as `UID:GID`, so files written in a bind stay the host user's.
    pub user: Option<String>,
    /// At most this many processes in a box.
    pub pids_limit: Option<i64>,
    /// Keep the provider's default capabilities (Docker's set), for programs that must change
    /// user; by default a box keeps none and cannot gain privileges by exec.
    pub keep_capabilities: bool,
    /// At most this many bytes of a box's own files, where the provider can enforce it (it
    /// refuses, naming why, where it cannot).
    pub disk_bytes: Option<i64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            runner: true,
            user: None,
            pids_limit: None,
            keep_capabilities: false,
            disk_bytes: None,
        }
    }
}

impl Options {
    /// The options beyond `runner` that are set.
    pub fn set(&self) -> Vec<Opt> {
        let mut v = Vec::new();
        if self.user.is_some() {
            v.push(Opt::User);
        }
        if self.pids_limit.is_some() {
            v.push(Opt::PidsLimit);
        }
        if self.keep_capabilities {
            v.push(Opt::KeepCapabilities);
        }
        if self.disk_bytes.is_some() {
            v.push(Opt::Disk);
        }
        v
    }
}

/// What a provider is made from besides its options: environment variables (a snapshot, so a
/// test can pass its own) and the program that can be a box's helper.
///
/// Its `Debug` names the variables' keys, never their values (a provider's key may be one).
#[derive(Clone, Default)]
pub struct Environment {
    vars: BTreeMap<String, OsString>,
    program: Option<HelperCommand>,
}

impl std::fmt::Debug for Environment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Environment")
            .field("vars", &self.vars.keys().collect::<Vec<_>>())
            .field("program", &self.program)
            .finish()
    }
}

impl Environment {
    /// This process's variables.
    pub fn from_process() -> Self {
        Environment::from_vars(std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v))))
    }

    /// These variables and no others.
    pub fn from_vars<K: Into<String>, V: Into<OsString>>(vars: impl IntoIterator<Item = (K, V)>) -> Self {
        Environment {
            vars: vars.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
            program: None,
        }
    }

    /// Name the program that is agentbox's helper (local boxes' supervisor, and a box's runner
    /// where no `agentbox-runner` is found): the `agentbox` binary passes itself with
    /// `["runner"]`, so an installed `agentbox` needs no second file.
    pub fn with_program(mut self, program: HelperCommand) -> Self {
        self.program = Some(program);
        self
    }

    /// A variable, empty ones included.
    pub fn var(&self, key: &str) -> Option<&OsStr> {
        self.vars.get(key).map(OsString::as_os_str)
    }

    /// agentbox's home, by [`crate::home::home_from`]'s rules over these variables.
    pub fn home(&self) -> Result<PathBuf> {
        crate::home::home_from(|k| self.vars.get(k).cloned())
    }

    /// The supervisor of local boxes (and their runner, the same program): the program given,
    /// else `agentbox-runner` found by [`HelperCommand::discover_with`].
    pub fn supervisor(&self) -> Result<HelperCommand> {
        match &self.program {
            Some(p) => Ok(p.clone()),
            None => HelperCommand::discover_with(self.var(RUNNER_ENV)),
        }
    }

    /// The runner to put in a box of another machine's kind (a container): `$AGENTBOX_RUNNER`,
    /// else `agentbox-runner` beside this executable (a static build runs in any image), else
    /// the program given (`agentbox` itself: a dynamic build, which runs in an image whose C
    /// library is at least as new as this machine's; where it cannot, the box's creation fails
    /// saying what to do, [`HelperCommand::explain`]).
    pub fn runner(&self) -> Result<HelperCommand> {
        match (HelperCommand::discover_with(self.var(RUNNER_ENV)), &self.program) {
            (Ok(found), _) => Ok(found),
            // A variable naming nothing is the user's mistake, not a reason to use another.
            (Err(e), _) if self.var(RUNNER_ENV).is_some() => Err(e),
            (Err(_), Some(p)) => Ok(p.clone()),
            (Err(e), None) => Err(e),
        }
    }

    /// The lookup a vendor's options read their variables through, once each of `vars` is
    /// checked: `invalid` naming one that is not UTF-8; an empty one counts as unset.
    ///
    /// ```
    /// use agentbox_providers::registry::Environment;
    /// let env = Environment::from_vars([("ACME_API_KEY", "k-1"), ("ACME_REGION", "")]);
    /// let var = env.vendor_vars(&["ACME_API_KEY", "ACME_REGION"]).unwrap();
    /// assert_eq!((var("ACME_API_KEY").as_deref(), var("ACME_REGION")), (Some("k-1"), None));
    /// ```
    pub fn vendor_vars(&self, vars: &[&str]) -> Result<impl Fn(&str) -> Option<String> + '_> {
        if let Some(k) = vars.iter().find(|k| self.var(k).is_some_and(|v| v.to_str().is_none())) {
            return Err(Error::invalid(format!("{k}: not UTF-8")));
        }
        Ok(move |k: &str| {
            self.var(k)
                .and_then(|v| v.to_str())
                .filter(|v| !v.is_empty())
                .map(String::from)
        })
    }

    /// The runner to put in `provider`'s boxes where `options` ask for one; where none is
    /// found, `None` and a warning (the boxes work without one).
    ///
    /// ```
    /// use agentbox_providers::registry::{Environment, Options};
    /// let off = Options { runner: false, ..Default::default() };
    /// assert!(Environment::default().runner_for("acme", &off).is_none());
    /// ```
    pub fn runner_for(&self, provider: &str, options: &Options) -> Option<HelperCommand> {
        if !options.runner {
            return None;
        }
        self.runner()
            .inspect_err(|e| tracing::warn!("{provider}: boxes get no runner: {}", e.message()))
            .ok()
    }
}

/// How an entry makes its provider.
pub type Make = for<'a> fn(&'a Options, &'a Environment) -> BoxFuture<'a, Result<Arc<dyn Provider>>>;

/// One provider of the registry.
pub struct Entry {
    /// Its name: the provider part of its boxes' ids, `--provider`'s value, a transport
    /// config's `provider`.
    pub name: &'static str,
    /// One line: what its boxes are.
    pub description: &'static str,
    /// The cargo feature of `agentbox-providers` that compiles it in.
    pub feature: &'static str,
    /// Whether this build has it.
    pub compiled: bool,
    /// The options beyond `runner` it takes; any other that is set is refused.
    pub takes: &'static [Opt],
    make: Option<Make>,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("name", &self.name)
            .field("feature", &self.feature)
            .field("compiled", &self.compiled)
            .finish_non_exhaustive()
    }
}

impl Entry {
    /// Whether it takes `opt`.
    pub fn takes(&self, opt: Opt) -> bool {
        self.takes.contains(&opt)
    }

    /// Make the provider, refusing an option it does not take (naming it as the CLI's flag,
    /// the only place such options come from: the one refusal of them), within
    /// [`MAKE_TIMEOUT`].
    pub async fn make(&self, options: &Options, env: &Environment) -> Result<Arc<dyn Provider>> {
        let Some(make) = self.make else {
            return Err(not_compiled(self));
        };
        if let Some(opt) = options.set().into_iter().find(|o| !self.takes(*o)) {
            return Err(Error::unsupported(format!(
                "--{}: {} boxes do not take it",
                opt.name(),
                self.name
            )));
        }
        match tokio::time::timeout(MAKE_TIMEOUT, make(options, env)).await {
            Ok(made) => made,
            Err(_) => Err(Error::timeout(format!(
                "{}: not ready within {} s",
                self.name,
                MAKE_TIMEOUT.as_secs()
            ))),
        }
    }
}

fn not_compiled(e: &Entry) -> Error {
    Error::unsupported(format!(
        "{:?}: this build has no {} provider (agentbox-providers' feature {:?} was off)",
        e.name, e.name, e.feature
    ))
}

static ENTRIES: &[Entry] = &[
    Entry {
        name: "local",
        description: "a directory of this machine and a supervisor process; no isolation (development, tests)",
        feature: "local",
        compiled: cfg!(feature = "local"),
        takes: &[],
        make: LOCAL,
    },
    Entry {
        name: "namespace",
        description: "Linux namespaces over this machine's root (read-only, homes and daemons' sockets masked) or an \
                      unpacked image; no daemon, made in milliseconds",
        feature: "namespace",
        compiled: cfg!(all(feature = "namespace", target_os = "linux")),
        takes: &[Opt::PidsLimit],
        make: NAMESPACE,
    },
    Entry {
        name: "docker",
        description: "a container per box on this machine's (or DOCKER_HOST's) Docker engine",
        feature: "docker",
        compiled: cfg!(feature = "docker"),
        takes: &[Opt::User, Opt::PidsLimit, Opt::KeepCapabilities, Opt::Disk],
        make: DOCKER,
    },
    Entry {
        name: "kube",
        description: "a pod per box on a Kubernetes cluster ($KUBECONFIG, or in-cluster), hardened and ended by the \
                      cluster at its lifetime",
        feature: "kube",
        compiled: cfg!(feature = "kube"),
        takes: &[],
        make: KUBE,
    },
    Entry {
        name: "daytona",
        description: "a Daytona sandbox per box (DAYTONA_API_KEY, DAYTONA_API_URL), sized by its snapshot and ended by \
                      Daytona at its lifetime",
        feature: "daytona",
        compiled: cfg!(feature = "daytona"),
        takes: &[],
        make: DAYTONA,
    },
    Entry {
        name: "archil",
        description: "a directory of an Archil disk per box (ARCHIL_API_KEY, ARCHIL_REGION, ARCHIL_DISK), each command \
                      one exec call of at most 300 s with no stdin and no env; its lifetime checked by every call",
        feature: "archil",
        compiled: cfg!(feature = "archil"),
        takes: &[],
        make: ARCHIL,
    },
    Entry {
        name: "modal",
        description: "a Modal sandbox per box (MODAL_TOKEN_ID, MODAL_TOKEN_SECRET), gVisor or a VM, with GPUs, FUSE, \
                      network allowlists and ports; ended by Modal at its lifetime (at most 24 h)",
        feature: "modal",
        compiled: cfg!(feature = "modal"),
        takes: &[],
        make: MODAL,
    },
    Entry {
        name: "e2b",
        description: "an E2B sandbox per box (E2B_API_KEY), a Firecracker VM ended by E2B at its lifetime (at most the \
                      plan's), paused and resumed as sleep and wake",
        feature: "e2b",
        compiled: cfg!(feature = "e2b"),
        takes: &[],
        make: E2B,
    },
];

/// Every provider this source knows, compiled in or not, in a fixed order.
pub fn entries() -> &'static [Entry] {
    ENTRIES
}

/// The names of the providers this build has.
pub fn names() -> Vec<&'static str> {
    ENTRIES.iter().filter(|e| e.compiled).map(|e| e.name).collect()
}

/// Every name, for help and errors: `local, docker`, and any left out of this build after it.
pub fn choices() -> String {
    let out: Vec<&str> = ENTRIES.iter().filter(|e| !e.compiled).map(|e| e.name).collect();
    let mut s = names().join(", ");
    if !out.is_empty() {
        s.push_str(&format!("; not in this build: {}", out.join(", ")));
    }
    s
}

/// The entry called `name`: `invalid` listing every name when there is none, `unsupported` when
/// this build left it out.
pub fn find(name: &str) -> Result<&'static Entry> {
    match ENTRIES.iter().find(|e| e.name == name) {
        Some(e) if e.compiled => Ok(e),
        Some(e) => Err(not_compiled(e)),
        None => Err(Error::invalid(format!("{name:?} is not a provider ({})", choices()))),
    }
}

/// Make the provider called `name` ([`find`], then [`Entry::make`]).
pub async fn make(name: &str, options: &Options, env: &Environment) -> Result<Arc<dyn Provider>> {
    find(name)?.make(options, env).await
}

#[cfg(feature = "local")]
const LOCAL: Option<Make> = Some(make_local);
#[cfg(not(feature = "local"))]
const LOCAL: Option<Make> = None;

#[cfg(feature = "local")]
fn make_local<'a>(options: &'a Options, env: &'a Environment) -> BoxFuture<'a, Result<Arc<dyn Provider>>> {
    Box::pin(async move {
        let provider = crate::local::LocalProvider::new(crate::local::LocalOptions {
            root: env.home()?,
            path: crate::local::DEFAULT_PATH.into(),
            supervisor: env.supervisor()?,
            runner: options.runner,
        })?;
        Ok(Arc::new(provider) as Arc<dyn Provider>)
    })
}

#[cfg(all(feature = "namespace", target_os = "linux"))]
const NAMESPACE: Option<Make> = Some(make_namespace);
#[cfg(not(all(feature = "namespace", target_os = "linux")))]
const NAMESPACE: Option<Make> = None;

#[cfg(all(feature = "namespace", target_os = "linux"))]
fn make_namespace<'a>(options: &'a Options, env: &'a Environment) -> BoxFuture<'a, Result<Arc<dyn Provider>>> {
    Box::pin(async move {
        let runner = env.runner()?;
        crate::namespace::available(&runner).await?;
        let max_processes = match options.pids_limit {
            None => crate::namespace::DEFAULT_MAX_PROCESSES,
            Some(n) if n > 0 => n as u64,
            Some(n) => {
                return Err(Error::invalid(format!(
                    "pids-limit {n}: a namespace box needs room for at least one process"
                )));
            }
        };
        let provider = crate::namespace::NamespaceProvider::new(crate::namespace::NamespaceOptions {
            root: env.home()?,
            runner,
            runner_files: options.runner,
            host_id: crate::namespace::DEFAULT_HOST_ID,
            max_processes,
            landlock: true,
        })?;
        Ok(Arc::new(provider) as Arc<dyn Provider>)
    })
}

#[cfg(feature = "docker")]
const DOCKER: Option<Make> = Some(make_docker);
#[cfg(not(feature = "docker"))]
const DOCKER: Option<Make> = None;

#[cfg(feature = "docker")]
fn make_docker<'a>(options: &'a Options, env: &'a Environment) -> BoxFuture<'a, Result<Arc<dyn Provider>>> {
    Box::pin(async move {
        let runner = if options.runner && !crate::docker::daemon::is_local() {
            tracing::warn!("docker: the engine is another machine's, so its boxes get no runner (a bind mount)");
            None
        } else {
            env.runner_for("docker", options)
        };
        let provider = crate::docker::DockerProvider::new(crate::docker::DockerOptions {
            user: options.user.clone(),
            pids_limit: options.pids_limit,
            keep_capabilities: options.keep_capabilities,
            disk_bytes: options.disk_bytes,
            runner,
            ..Default::default()
        })
        .await?;
        Ok(Arc::new(provider) as Arc<dyn Provider>)
    })
}

#[cfg(feature = "kube")]
const KUBE: Option<Make> = Some(make_kube);
#[cfg(not(feature = "kube"))]
const KUBE: Option<Make> = None;

/// The kube provider's settings beyond the kubeconfig: `AGENTBOX_KUBE_NAMESPACE`,
/// `AGENTBOX_KUBE_CONTEXT`, `AGENTBOX_KUBE_IMAGE`, `AGENTBOX_KUBE_RUNTIME_CLASS`,
/// `AGENTBOX_KUBE_MAX_LIFETIME` (seconds) and `AGENTBOX_KUBE_AGENT_SANDBOX` (`1`: through
/// kubernetes-sigs/agent-sandbox).
#[cfg(feature = "kube")]
fn make_kube<'a>(options: &'a Options, env: &'a Environment) -> BoxFuture<'a, Result<Arc<dyn Provider>>> {
    Box::pin(async move {
        let text = |k: &str| -> Result<Option<String>> {
            match env.var(k) {
                None => Ok(None),
                Some(v) if v.is_empty() => Ok(None),
                Some(v) => v
                    .to_str()
                    .map(|s| Some(s.to_string()))
                    .ok_or_else(|| Error::invalid(format!("{k}: not UTF-8"))),
            }
        };
        let mut o = crate::kube::KubeOptions {
            // A list of files (`a:b`) is kube-rs's own to merge, from the process's variable.
            kubeconfig: env
                .var("KUBECONFIG")
                .filter(|v| !v.is_empty() && !v.as_encoded_bytes().contains(&b':'))
                .map(PathBuf::from),
            context: text("AGENTBOX_KUBE_CONTEXT")?,
            namespace: text("AGENTBOX_KUBE_NAMESPACE")?.unwrap_or_default(),
            runtime_class: text("AGENTBOX_KUBE_RUNTIME_CLASS")?,
            ..Default::default()
        };
        if let Some(i) = text("AGENTBOX_KUBE_IMAGE")? {
            o.image = i;
        }
        match text("AGENTBOX_KUBE_AGENT_SANDBOX")?.as_deref() {
            None | Some("0") | Some("false") => {}
            Some("1") | Some("true") => o.agent_sandbox = true,
            Some(v) => {
                return Err(Error::invalid(format!(
                    "AGENTBOX_KUBE_AGENT_SANDBOX: {v:?} is not 1, true, 0 or false"
                )));
            }
        }
        if let Some(l) = text("AGENTBOX_KUBE_MAX_LIFETIME")? {
            let secs: u64 = l
                .parse()
                .map_err(|_| Error::invalid(format!("AGENTBOX_KUBE_MAX_LIFETIME: {l:?} is not a number of seconds")))?;
            o.max_lifetime = std::time::Duration::from_secs(secs);
        }
        o.runner = env.runner_for("kube", options);
        let provider = crate::kube::KubeProvider::new(o).await?;
        Ok(Arc::new(provider) as Arc<dyn Provider>)
    })
}

#[cfg(feature = "daytona")]
const DAYTONA: Option<Make> = Some(make_daytona);
#[cfg(not(feature = "daytona"))]
const DAYTONA: Option<Make> = None;

/// The daytona provider from what the `daytona` SDK reads (`DAYTONA_API_KEY`,
/// `DAYTONA_API_URL` or `DAYTONA_SERVER_URL`, `DAYTONA_TARGET`) and
/// `AGENTBOX_DAYTONA_SNAPSHOT`.
#[cfg(feature = "daytona")]
fn make_daytona<'a>(options: &'a Options, env: &'a Environment) -> BoxFuture<'a, Result<Arc<dyn Provider>>> {
    Box::pin(async move {
        let mut o = crate::daytona::DaytonaOptions::from_vars(env.vendor_vars(&crate::daytona::VARIABLES)?)?;
        o.runner = env.runner_for("daytona", options);
        let provider = crate::daytona::DaytonaProvider::new(o)?;
        Ok(Arc::new(provider) as Arc<dyn Provider>)
    })
}

#[cfg(feature = "archil")]
const ARCHIL: Option<Make> = Some(make_archil);
#[cfg(not(feature = "archil"))]
const ARCHIL: Option<Make> = None;

/// The archil provider from what the `archil` SDK reads (`ARCHIL_API_KEY`, `ARCHIL_REGION`,
/// `ARCHIL_S3_BASE_URL`), the control plane's `ARCHIL_BASE_URL` and the disk (`ARCHIL_DISK`).
#[cfg(feature = "archil")]
fn make_archil<'a>(_options: &'a Options, env: &'a Environment) -> BoxFuture<'a, Result<Arc<dyn Provider>>> {
    Box::pin(async move {
        let o = crate::archil::ArchilOptions::from_vars(env.vendor_vars(&crate::archil::VARIABLES)?)?;
        let provider = crate::archil::ArchilProvider::new(o)?;
        Ok(Arc::new(provider) as Arc<dyn Provider>)
    })
}

#[cfg(feature = "modal")]
const MODAL: Option<Make> = Some(make_modal);
#[cfg(not(feature = "modal"))]
const MODAL: Option<Make> = None;

/// The modal provider from what the `modal` client reads (`MODAL_SERVER_URL`, `MODAL_TOKEN_ID`,
/// `MODAL_TOKEN_SECRET`, `MODAL_ENVIRONMENT`) and the app's name (`AGENTBOX_MODAL_APP`).
#[cfg(feature = "modal")]
fn make_modal<'a>(_options: &'a Options, env: &'a Environment) -> BoxFuture<'a, Result<Arc<dyn Provider>>> {
    Box::pin(async move {
        let o = crate::modal::ModalOptions::from_vars(env.vendor_vars(&crate::modal::VARIABLES)?)?;
        let provider = crate::modal::ModalProvider::new(o)?;
        Ok(Arc::new(provider) as Arc<dyn Provider>)
    })
}

#[cfg(feature = "e2b")]
const E2B: Option<Make> = Some(make_e2b);
#[cfg(not(feature = "e2b"))]
const E2B: Option<Make> = None;

/// The e2b provider from what the `e2b` SDK reads (`E2B_API_KEY`, `E2B_DOMAIN`, `E2B_API_URL`,
/// `E2B_SANDBOX_URL`) and the template (`AGENTBOX_E2B_TEMPLATE`).
#[cfg(feature = "e2b")]
fn make_e2b<'a>(options: &'a Options, env: &'a Environment) -> BoxFuture<'a, Result<Arc<dyn Provider>>> {
    Box::pin(async move {
        let mut o = crate::e2b::E2bOptions::from_vars(env.vendor_vars(&crate::e2b::VARIABLES)?)?;
        o.runner = env.runner_for("e2b", options);
        let provider = crate::e2b::E2bProvider::new(o)?;
        Ok(Arc::new(provider) as Arc<dyn Provider>)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The features of this crate's Cargo.toml, less `default`.
    fn features() -> Vec<String> {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
        let section = text.split("[features]").nth(1).expect("a [features] table");
        section
            .lines()
            .skip(1)
            .take_while(|l| !l.trim_start().starts_with('['))
            .filter_map(|l| l.split_once('=').map(|(k, _)| k.trim().to_string()))
            // `vendor*` are what the vendors' providers share, not providers.
            .filter(|k| !k.is_empty() && k != "default" && !k.starts_with("vendor"))
            .collect()
    }

    #[test]
    fn every_feature_is_one_entry_and_the_names_are_the_features_compiled_in() {
        let mut declared = features();
        declared.sort();
        let mut registered: Vec<&str> = entries().iter().map(|e| e.feature).collect();
        registered.sort();
        assert_eq!(
            declared, registered,
            "a provider's feature without an entry, or the reverse"
        );
        let on = [
            ("local", cfg!(feature = "local")),
            ("namespace", cfg!(all(feature = "namespace", target_os = "linux"))),
            ("docker", cfg!(feature = "docker")),
            ("kube", cfg!(feature = "kube")),
            ("daytona", cfg!(feature = "daytona")),
            ("archil", cfg!(feature = "archil")),
            ("modal", cfg!(feature = "modal")),
            ("e2b", cfg!(feature = "e2b")),
        ];
        assert_eq!(on.len(), entries().len(), "every entry's feature is checked here");
        for (feature, compiled) in on {
            let e = entries().iter().find(|e| e.feature == feature).unwrap();
            assert_eq!(e.compiled, compiled, "{feature}");
            assert_eq!(e.make.is_some(), compiled, "{feature}");
        }
        let want: Vec<&str> = on.iter().filter(|(_, c)| *c).map(|(f, _)| *f).collect();
        assert_eq!(names(), want);
    }

    #[test]
    fn an_unknown_name_lists_every_provider() {
        let e = find("nowhere").unwrap_err();
        assert_eq!(e.code(), agentbox_core::ErrorCode::Invalid);
        for name in names() {
            assert!(e.message().contains(name), "{e} should name {name}");
        }
        assert!(find("").is_err());
    }

    #[cfg(feature = "local")]
    #[tokio::test]
    async fn an_option_a_provider_does_not_take_is_named() {
        let local = find("local").unwrap();
        let options = Options {
            pids_limit: Some(10),
            ..Options::default()
        };
        let e = local
            .make(&options, &Environment::from_vars([("AGENTBOX_HOME", "/nonexistent")]))
            .await
            .err()
            .unwrap();
        assert_eq!(e.code(), agentbox_core::ErrorCode::Unsupported);
        assert!(e.message().contains("pids-limit: local boxes"), "{e}");
    }

    /// A vendor's variable that is not UTF-8 is refused naming it, before anything is asked of
    /// the vendor.
    #[cfg(feature = "e2b")]
    #[tokio::test]
    async fn a_vendor_variable_that_is_not_utf8_is_refused_naming_it() {
        use std::os::unix::ffi::OsStringExt;
        let env = Environment::from_vars([("E2B_API_KEY", OsString::from_vec(vec![0xff, 0xfe]))]);
        let e = find("e2b")
            .unwrap()
            .make(&Options::default(), &env)
            .await
            .err()
            .unwrap();
        assert_eq!(e.code(), agentbox_core::ErrorCode::Invalid);
        assert_eq!(e.message(), "E2B_API_KEY: not UTF-8");
    }

    #[test]
    fn the_environment_is_its_variables_and_hides_their_values() {
        let env = Environment::from_vars([("AGENTBOX_HOME", "/h"), ("SOME_KEY", "s3cret")]);
        assert_eq!(env.home().unwrap(), PathBuf::from("/h"));
        assert!(!format!("{env:?}").contains("s3cret"));
        let env = Environment::from_vars([("HOME", "/home/me")]);
        assert_eq!(env.home().unwrap(), PathBuf::from("/home/me/.local/share/agentbox"));
        // A runner variable that names nothing is an error, not a reason to use another program.
        let me = HelperCommand::new("/bin/true", vec![]);
        let env = Environment::from_vars([(RUNNER_ENV, "/nonexistent/agentbox-runner")]).with_program(me.clone());
        assert!(env.runner().unwrap_err().message().contains("/nonexistent"));
        assert_eq!(
            Environment::default().with_program(me.clone()).supervisor().unwrap(),
            me
        );
    }
}

//! A fake Kubernetes API server whose pods really run: each pod is a namespace box
//! (`agentbox_providers::namespace`), its container's command the box's first process.
//!
//! It is what the `kube` provider is tested against, and it is itself judged by kubectl
//! 1.35 and the `kubernetes` Python client (`providers/tests/kube.rs`): where they and the fake
//! disagree, the fake is wrong. It answers what a real API server answers and nothing for
//! agentbox's sake. `docs/fakes.md` is the overview; the details are here and in each
//! module's first lines.
//!
//! What it serves (the real server's paths and shapes; errors are metav1.Status):
//! - a bearer token (random, written into the kubeconfig, never logged) on every request,
//!   401 otherwise; [`FakeKube::throttle`] makes the next N requests 429 `TooManyRequests`
//!   with `Retry-After: 1`;
//! - discovery: `/version`, `/api`, `/api/v1`, `/apis`, and `/apis/GROUP` and
//!   `/apis/GROUP/v1` of `apps`, `networking.k8s.io` and `rbac.authorization.k8s.io`;
//! - with [`FakeKubeOptions::agent_sandbox`], kubernetes-sigs/agent-sandbox: its four
//!   custom resources and its controllers (the `sandbox` module's docs say what they do and
//!   where they are simpler);
//! - namespaces `default` and those given (get, list); pods (create, get, list and watch,
//!   also across namespaces, merge, strategic-merge and JSON patch, delete, deletecollection),
//!   `pods/log`, `pods/exec` and `pods/portforward` (WebSockets, see `stream`);
//!   PersistentVolumeClaims, bound at once to a directory of the fake's, and Secrets (create,
//!   get, list and watch, delete, deletecollection; see `storage`); and the kinds only stored
//!   (`Kind::STORED`: NetworkPolicies, ServiceAccounts, Services, Deployments, Roles,
//!   RoleBindings: create, get, list and watch, patch, delete, deletecollection), defaulted
//!   and validated as the real server does, then acted on by nothing but the kubelet, which
//!   reads NetworkPolicies (so `kubectl apply -f deploy/kubernetes/` works, and its
//!   Deployment runs nothing).
//!
//! What kubectl 1.35 needed that the fake had to add (found by running it against the fake):
//! - TLS: clientcmd reads a kubeconfig user's credentials only for an `https://` server, so
//!   over plain HTTP kubectl sends no token at all (see `tls`);
//! - discovery first asks the aggregated form (`Accept:
//!   application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,...`) of `/api` and
//!   `/apis`; a plain `application/json` APIVersions/APIGroupList answer makes it fall back
//!   to the per-group lists (`/api/v1`, `/apis/GROUP/v1`), as with a server without
//!   aggregated discovery;
//! - OpenAPI: `kubectl create -f` reads `/openapi/v3` (then `/openapi/v2`) before it sends
//!   anything, and without either it refuses (`failed to download openapi`) unless
//!   `--validate=false`. So the fake serves `/openapi/v3` and one document per group version
//!   holding each kind's post and patch operations with `x-kubernetes-group-version-kind` and
//!   a `fieldValidation` parameter, from which kubectl concludes the server validates and
//!   sends `?fieldValidation=Strict` instead of downloading schemas; the fake accepts that
//!   and does not act on it (unknown fields are kept, not refused);
//! - `kubectl get` asks for a Table (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io,
//!   ...,application/json`); the fake answers the plain list, which kubectl prints as names
//!   and ages;
//! - `kubectl exec` upgrades `GET .../exec` to a WebSocket offering `v5.channel.k8s.io` alone;
//!   refused it (`--no-v5`), it falls back to SPDY (a POST with `X-Stream-Protocol-Version`),
//!   which the fake does not speak; and it reads the streams' end from a close frame with code
//!   1000 (a close without a code is an error to it);
//! - `kubectl delete` waits with a list then a watch (`fieldSelector=metadata.name=NAME`,
//!   `resourceVersion` from the list).
//!
//! Simpler than a cluster, everywhere (beyond what `kubelet` lists for running pods):
//! - one node, no scheduler, no controllers (but agent-sandbox's, when asked) and no
//!   admission: no default service account or token volumes, no default tolerations, no quota
//!   or limit ranges;
//! - the kinds only stored are only stored: a Deployment makes no ReplicaSet or pod, its
//!   `status` stays `{}`, and it has no `scale` or `status` subresource (`kubectl scale` is
//!   404); a Service gets a cluster IP (the first free one of 10.96.0.0/16) but no endpoints,
//!   node ports or load balancer; Roles and RoleBindings authorize nothing (the token may do
//!   anything) and a binding is not checked for escalation; a ServiceAccount gets no token;
//! - a pod is deleted at once: its box is killed (no grace period, no SIGTERM), then the
//!   object removed (a MODIFIED event with `deletionTimestamp`, then DELETED);
//! - `continue` tokens name the last item returned, not a snapshot: a list paged while pods
//!   change sees the changes;
//! - no PUT (update), no server-side apply, no dry run, no `status` subresource, no Table,
//!   no protobuf, no field validation of unknown fields, no watch bookmarks;
//! - strategic merge patches are applied as merge patches and refused 400 when they hold a
//!   directive (`$patch`...): `kubectl apply` of a changed list with merge keys (a
//!   Deployment's containers or their env, say) sends `$setElementOrder` and is refused, while
//!   a changed map or number (labels, replicas) goes through; a pod's patch may change its labels, annotations and lower its
//!   `spec.activeDeadlineSeconds` (a container's image, which the real server lets change,
//!   is refused as any other spec change, since the fake never restarts containers);
//! - a watch older than the last 4096 changes answers an ERROR event 410 Expired.

mod api;
mod discovery;
mod kubelet;
mod patch;
mod reads;
mod sandbox;
mod selector;
mod status;
mod storage;
mod store;
mod stream;
mod tls;
mod validate;
mod writes;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use agentbox_core::{Error, Result};
use agentbox_providers::helper::HelperCommand;
use agentbox_providers::namespace::{DEFAULT_HOST_ID, NamespaceOptions, NamespaceProvider};

use crate::kube::api::Shared;
use crate::kube::kubelet::{Images, Kubelet};
use crate::kube::store::{Kind, Store};

/// How a [`FakeKube`] is set up.
///
/// ```
/// let opts = agentbox_fakes::kube::FakeKubeOptions {
///     rootfs: Some("/srv/rootfs".into()),
///     namespaces: vec!["team-a".into()],
///     ..Default::default()
/// };
/// assert!(opts.v5 && opts.network_policy);
/// ```
#[derive(Clone, Debug)]
pub struct FakeKubeOptions {
    /// Where to listen; port 0 picks a free one.
    pub listen: SocketAddr,
    /// Where to write the kubeconfig; `None`: in the fake's own directory.
    pub kubeconfig: Option<PathBuf>,
    /// The root file system of any image not in `images`; `None`: such images are not found
    /// (`ErrImagePull`).
    pub rootfs: Option<PathBuf>,
    /// An image's name (exactly as a pod names it) to its root file system.
    pub images: BTreeMap<String, PathBuf>,
    /// Offer `v5.channel.k8s.io` for exec (off: a server before Kubernetes 1.30).
    pub v5: bool,
    /// Enforce deny-all egress NetworkPolicies (off: a CNI that ignores policies).
    pub network_policy: bool,
    /// Namespaces besides `default`.
    pub namespaces: Vec<String>,
    /// The `agentbox-runner` binary every pod's box is built by (static, for a rootfs);
    /// `None`: `$AGENTBOX_RUNNER`, else beside this executable.
    pub runner: Option<PathBuf>,
    /// Serve HTTPS with a certificate made at start, its CA (`ca.crt` in the fake's own
    /// directory) named by the kubeconfig. Off: plain HTTP, to which kubectl sends no token (so kubectl cannot use
    /// it), while the Python client and kube-rs do.
    pub tls: bool,
    /// Install kubernetes-sigs/agent-sandbox: its CRDs (Sandbox, SandboxTemplate,
    /// SandboxClaim, SandboxWarmPool at v1beta1) and its controllers (see the `sandbox`
    /// module's docs). Off (the default): a cluster without it, whose discovery lists neither
    /// group.
    pub agent_sandbox: bool,
    /// The fault switch every request passes (see [`crate::faults`]).
    pub faults: Option<Arc<crate::faults::Faults>>,
}

impl Default for FakeKubeOptions {
    fn default() -> Self {
        FakeKubeOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            kubeconfig: None,
            rootfs: None,
            images: BTreeMap::new(),
            v5: true,
            network_policy: true,
            namespaces: Vec::new(),
            runner: None,
            tls: true,
            agent_sandbox: false,
            faults: None,
        }
    }
}

/// A pod as a test reads it from outside the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// `status.phase`: Pending, Running, Succeeded or Failed.
    pub phase: String,
    /// Whether a box runs for it now.
    pub has_box: bool,
    /// Whether its box was made with no network but loopback (a NetworkPolicy's deny-all).
    pub isolated: bool,
}

/// A running fake API server. Dropping it (or [`FakeKube::shutdown`]) stops serving and
/// ends every pod's box, so a test leaves no box behind.
///
/// ```no_run
/// # async fn f() -> agentbox_core::Result<()> {
/// use agentbox_fakes::kube::{FakeKube, FakeKubeOptions};
/// let kube = FakeKube::start(FakeKubeOptions {
///     rootfs: Some("/srv/rootfs".into()),
///     ..Default::default()
/// })
/// .await?;
/// println!("KUBECONFIG={} (server {})", kube.kubeconfig().display(), kube.url());
/// kube.throttle(2); // the next two requests answer 429
/// kube.shutdown().await;
/// # Ok(()) }
/// ```
pub struct FakeKube {
    addr: SocketAddr,
    url: String,
    kubeconfig: PathBuf,
    shared: Arc<Shared>,
    /// Its server; and agent-sandbox's controllers, when installed, beside it: stopped before
    /// the boxes are ended, so none makes a pod meanwhile.
    server: crate::server::Server,
    /// The host's ids the pods' programs run as.
    box_ids: (u32, u32),
}

impl FakeKube {
    /// Listen, write the kubeconfig, and serve on this runtime until shut down.
    pub async fn start(opts: FakeKubeOptions) -> Result<FakeKube> {
        for ns in &opts.namespaces {
            validate::dns1123_label(ns).map_err(|why| Error::invalid(format!("namespace {ns:?}: {why}")))?;
        }
        for (image, dir) in opts.images.iter() {
            if !dir.join("bin").exists() {
                return Err(Error::invalid(format!(
                    "image {image}={}: not a root file system (no bin/ in it)",
                    dir.display()
                )));
            }
        }
        if let Some(r) = &opts.rootfs
            && !r.join("bin").exists()
        {
            return Err(Error::invalid(format!(
                "rootfs {}: not a root file system (no bin/ in it)",
                r.display()
            )));
        }
        let dir = tempfile::Builder::new()
            .prefix("agentbox-fake-kube.")
            .tempdir()
            .map_err(|e| Error::io(e, "making the fake's directory"))?;
        // The box's user (another id of the host's) must reach the volumes under it.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
            .map_err(|e| Error::io(e, "opening the fake's directory to its boxes"))?;
        let runner = match &opts.runner {
            Some(p) => HelperCommand::new(p, vec![]),
            None => HelperCommand::discover()?,
        };
        agentbox_providers::namespace::available(&runner).await?;
        let provider = NamespaceProvider::new(NamespaceOptions {
            runner,
            ..NamespaceOptions::at(dir.path().join("home"))?
        })?;
        let volumes = dir.path().join("volumes");
        std::fs::create_dir(&volumes).map_err(|e| Error::io(e, "making the volumes' directory"))?;
        std::fs::set_permissions(&volumes, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| Error::io(e, "opening the volumes' directory to its boxes"))?;
        let box_ids = if rustix::process::geteuid().is_root() {
            (DEFAULT_HOST_ID, DEFAULT_HOST_ID)
        } else {
            (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw())
        };
        let kubelet = Arc::new(Kubelet::new(
            Arc::new(provider),
            Images {
                named: opts.images.clone(),
                any: opts.rootfs.clone(),
            },
            opts.network_policy,
            volumes,
            box_ids,
        ));
        let listener = tokio::net::TcpListener::bind(opts.listen)
            .await
            .map_err(|e| Error::io(e, format!("listening on {}", opts.listen)))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io(e, "reading the listening address"))?;
        let mut namespaces = vec!["default".to_string()];
        namespaces.extend(opts.namespaces.iter().filter(|n| *n != "default").cloned());
        let shared = Arc::new(Shared {
            token: token()?,
            store: Arc::new(Store::new(&namespaces)),
            kubelet,
            throttle: AtomicU32::new(0),
            v5: opts.v5,
            agent_sandbox: opts.agent_sandbox,
            addr,
        });
        let kubeconfig = opts.kubeconfig.clone().unwrap_or_else(|| dir.path().join("kubeconfig"));
        let tls = if opts.tls {
            let (config, ca) = tls::make(addr.ip())?;
            let ca_path = dir.path().join("ca.crt");
            std::fs::write(&ca_path, ca).map_err(|e| Error::io(e, format!("writing {}", ca_path.display())))?;
            Some((config, ca_path))
        } else {
            None
        };
        let url = format!("{}://{addr}", if tls.is_some() { "https" } else { "http" });
        write_kubeconfig(&kubeconfig, &url, tls.as_ref().map(|t| t.1.as_path()), &shared.token)?;
        let app = axum::Router::new().fallback(api::dispatch).with_state(shared.clone());
        let app = crate::faults::wrap(app, opts.faults.as_ref());
        let mut server =
            crate::server::Server::spawn(|stopped| tls::serve(listener, tls.map(|t| t.0), app, stopped), dir);
        if opts.agent_sandbox {
            server.beside(sandbox::spawn(shared.clone()));
        }
        tracing::info!(%addr, kubeconfig = %kubeconfig.display(), "fake Kubernetes API server listening");
        Ok(FakeKube {
            addr,
            url,
            kubeconfig,
            shared,
            server,
            box_ids,
        })
    }

    /// The address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://ADDR` (`http://` without TLS), the kubeconfig's server.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The CA certificate (PEM) the kubeconfig trusts, in the fake's own directory (removed
    /// at shutdown); `None` without TLS.
    pub fn ca(&self) -> Option<PathBuf> {
        let dir = self.server.dir()?;
        self.url.starts_with("https").then(|| dir.join("ca.crt"))
    }

    /// The directory of claim `claim` in `namespace`, as this machine (the cluster's one
    /// node) sees it: made now, owned by the pods' user, when the claim exists and no pod has
    /// mounted it yet. What a test writes there, a pod on the claim reads.
    pub fn claim_dir(&self, namespace: &str, claim: &str) -> Result<PathBuf> {
        if self
            .shared
            .store
            .get(store::Kind::PersistentVolumeClaim, namespace, claim)
            .is_none()
        {
            return Err(Error::not_found(format!(
                "persistentvolumeclaim {namespace}/{claim}: no such claim"
            )));
        }
        let volumes = self
            .server
            .dir()
            .ok_or_else(|| Error::unknown("the fake has shut down"))?
            .join("volumes");
        let dir = storage::claim_dir(&volumes, namespace, claim);
        for d in [dir.parent().and_then(Path::parent), dir.parent()]
            .into_iter()
            .flatten()
        {
            if !d.exists() {
                std::fs::create_dir(d).map_err(|e| Error::io(e, format!("making {}", d.display())))?;
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o711))
                    .map_err(|e| Error::io(e, format!("opening {}", d.display())))?;
            }
        }
        if !dir.exists() {
            std::fs::create_dir(&dir).map_err(|e| Error::io(e, format!("making {}", dir.display())))?;
            std::os::unix::fs::chown(&dir, Some(self.box_ids.0), Some(self.box_ids.1))
                .map_err(|e| Error::io(e, format!("giving the pods {}", dir.display())))?;
        }
        Ok(dir)
    }

    /// The kubeconfig it wrote: its server, a user with the token, a context whose namespace
    /// is `default`, made current.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The bearer token, for a test's own requests (never printed by the fake).
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// Answer the next `n` API requests (after their token is checked) with 429
    /// `TooManyRequests` and `Retry-After: 1`, as an overloaded server's priority and
    /// fairness does.
    pub fn throttle(&self, n: u32) {
        self.shared.throttle.fetch_add(n, Ordering::SeqCst);
    }

    /// Every pod, as it stands.
    pub fn pods(&self) -> Vec<PodView> {
        let objs = self.shared.store.lock().objects(Kind::Pod, None);
        objs.iter()
            .map(|p| {
                let run = p["metadata"]["uid"]
                    .as_str()
                    .and_then(|u| self.shared.kubelet.run_of(u));
                PodView {
                    namespace: p["metadata"]["namespace"].as_str().unwrap_or("").to_string(),
                    name: p["metadata"]["name"].as_str().unwrap_or("").to_string(),
                    phase: p["status"]["phase"].as_str().unwrap_or("").to_string(),
                    has_box: run.as_ref().is_some_and(|r| r.sandbox().is_some()),
                    isolated: run
                        .as_ref()
                        .is_some_and(|r| *r.isolated.lock().unwrap_or_else(|p| p.into_inner())),
                }
            })
            .collect()
    }

    /// Pod `name` is evicted, as a node's pressure or drain evicts one: deleted with no grace,
    /// its box ended. Whether it was there.
    pub async fn evict(&self, namespace: &str, name: &str) -> bool {
        crate::kube::writes::delete_one(&self.shared, Kind::Pod, namespace, name)
            .await
            .is_ok()
    }

    /// The pod object as the API would answer it.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<serde_json::Value> {
        self.shared.store.get(Kind::Pod, namespace, name)
    }

    /// Wait until the pod's phase is `phase`, at most `timeout`; the pod as it then is.
    pub async fn wait_phase(
        &self,
        namespace: &str,
        name: &str,
        phase: &str,
        timeout: Duration,
    ) -> Result<serde_json::Value> {
        let end = tokio::time::Instant::now() + timeout;
        loop {
            let pod = self.pod(namespace, name);
            if let Some(p) = &pod
                && p["status"]["phase"] == phase
            {
                return Ok(p.clone());
            }
            if tokio::time::Instant::now() >= end {
                return Err(Error::timeout(format!(
                    "pod {namespace}/{name} is not {phase} after {timeout:?}: {}",
                    pod.map_or("no such pod".into(), |p| p["status"].to_string())
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stop serving and end every pod's box.
    pub async fn shutdown(mut self) {
        self.server.stopped().await;
        self.shared.kubelet.stop_all().await;
        self.server.remove_dir();
    }
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.server.halt();
        // Drop cannot await: the boxes are ended on a thread of their own with a runtime of
        // its own, and waited for, so no box outlives the fake.
        let kubelet = self.shared.kubelet.clone();
        crate::server::end_on_own_runtime(async move { kubelet.stop_all().await });
    }
}

/// 32 random bytes, hex.
fn token() -> Result<String> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| Error::unknown(format!("the system's random numbers: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The kubeconfig, mode 0600 (it holds the token).
fn write_kubeconfig(path: &Path, url: &str, ca: Option<&Path>, token: &str) -> Result<()> {
    let ca = ca.map_or(String::new(), |c| {
        format!("    certificate-authority: {:?}\n", c.display().to_string())
    });
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: agentbox-fake
  cluster:
    server: \"{url}\"
{ca}users:
- name: agentbox-fake
  user:
    token: \"{token}\"
contexts:
- name: agentbox-fake
  context:
    cluster: agentbox-fake
    user: agentbox-fake
    namespace: default
current-context: agentbox-fake
preferences: {{}}
"
    );
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io(e, format!("writing the kubeconfig {}", path.display())))?;
    f.write_all(text.as_bytes())
        .map_err(|e| Error::io(e, format!("writing the kubeconfig {}", path.display())))
}

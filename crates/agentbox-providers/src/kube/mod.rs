//! Kubernetes boxes: a pod per box, over the cluster's own API (kube-rs).
//!
//! The pod (see `pod`) is hardened as a box must be: no service-account token, no service
//! links, a non-root user, every capability dropped, no privilege escalation, seccomp
//! `RuntimeDefault`, a read-only root with emptyDirs for the workspace, the home, `/tmp` and
//! the runner. Its first process ends the box at the deadline it reads from a downward-API
//! file of the pod's `agentbox.ends-at-ms` annotation, so an extend is one patch, and the
//! pod's `activeDeadlineSeconds` is the cluster's own backstop, set to
//! [`KubeOptions::max_lifetime`] (the API lets it only fall, so it is the longest any box of
//! this provider may be extended to). A pod that ended is deleted by the next list.
//!
//! Programs run over the `pods/exec` WebSocket (`v5.channel.k8s.io`, else `v4`; see `exec`),
//! ports are reached by port-forward, and with [`KubeOptions::runner`] the runner binary is
//! copied into the pod and reached through a relay exec, so each command and file operation
//! is one message. `network: none` is a deny-all NetworkPolicy, and the facts say `none` only
//! once a connection from inside the pod failed (a CNI may ignore policies: then the create
//! fails rather than promise what the cluster does not keep).
//!
//! ```no_run
//! # async fn f() -> agentbox_core::Result<()> {
//! use std::time::Duration;
//! use agentbox_core::{Ctx, Provider, Spec};
//! use agentbox_providers::kube::{KubeOptions, KubeProvider};
//! // The cluster of $KUBECONFIG (or ~/.kube/config, or the pod's own service account).
//! let provider = KubeProvider::new(KubeOptions { namespace: "agents".into(), ..Default::default() }).await?;
//! let b = provider.create(&Spec::new(Duration::from_secs(600)), &Ctx::background()).await?;
//! b.destroy(&Ctx::background()).await?;
//! # Ok(()) }
//! ```

mod agent_sandbox;
mod api;
mod exec;
mod lifecycle;
mod options;
mod pod;
mod pool;
mod sandbox;

use api::{api_error, attempt, conflict, delete_pod, delete_policy, policy_name, retry, selector};
pub use options::KubeOptions;
use pod::{isolation_of, owned_by_sandbox, ports_of};

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{
    Ctx, Error, ErrorCode, ExecOptions, FinishOptions, Honours, Labels, Lifecycle, Network, NetworkFact, PortKind,
    Provider, Result, Sandbox, SandboxId, Spec, check_spec, finish, now_ms,
};
use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};

use crate::random::random_hex;
use crate::runner::{Relay, RunnerSandbox};
pub use pool::ClaimPool;
pub use sandbox::KubeSandbox;

/// The provider's name and id prefix.
pub const NAME: &str = "kube";

/// The image boxes start from unless a spec names one.
pub const DEFAULT_IMAGE: &str = "agentbox-box:bookworm";

/// Where programs start unless a spec names a workspace.
pub const DEFAULT_WORKSPACE: &str = "/workspace";

/// The PATH programs get.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The longest lifetime by default: the pods' `activeDeadlineSeconds`.
pub const DEFAULT_MAX_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// The uid (and gid, and fsGroup) a box's programs run as.
pub const DEFAULT_UID: i64 = 1000;

/// Where the runner binary is copied in the pod.
const RUNNER_IN_POD: &str = "/agentbox/agentbox-runner";
/// The runner's socket in the pod, which a relay exec reaches.
const RUNNER_SOCKET: &str = "/agentbox/runner.sock";

fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(dns_label)
}

/// The provider: pods in one namespace of one cluster.
pub struct KubeProvider {
    client: Client,
    opts: Arc<KubeOptions>,
    namespace: String,
    pods: Api<Pod>,
    policies: Api<NetworkPolicy>,
    /// Whether the API server speaks v5 exec, once any exec learned it.
    v5: Arc<std::sync::OnceLock<bool>>,
    /// The runner binary's bytes, read once.
    runner_bytes: tokio::sync::OnceCell<Arc<Vec<u8>>>,
    /// The API server as the host reaches it, a target for the in-pod network probe.
    server: Option<(String, u16)>,
    /// The agent-sandbox resources, in that mode.
    asb: Option<Arc<agent_sandbox::AgentSandbox>>,
}

impl KubeProvider {
    /// Connect to the cluster of `opts` (nothing is asked of it until the first call).
    pub async fn new(opts: KubeOptions) -> Result<Self> {
        opts.validate()?;
        let kopts = kube::config::KubeConfigOptions {
            context: opts.context.clone(),
            ..Default::default()
        };
        let mut config = match &opts.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path)
                    .map_err(|e| Error::invalid(format!("kubeconfig {}: {e}", path.display())))?;
                kube::Config::from_custom_kubeconfig(kc, &kopts)
                    .await
                    .map_err(|e| Error::invalid(format!("kubeconfig {}: {e}", path.display())))?
            }
            None if opts.context.is_some() => kube::Config::from_kubeconfig(&kopts)
                .await
                .map_err(|e| Error::invalid(format!("kubeconfig: {e}")))?,
            None => kube::Config::infer()
                .await
                .map_err(|e| Error::invalid(format!("no cluster: neither a kubeconfig nor in-cluster config: {e}")))?,
        };
        // Every request has a deadline: a cluster that stops answering is a typed error.
        config.connect_timeout = Some(Duration::from_secs(10));
        config.read_timeout = Some(Duration::from_secs(60));
        config.write_timeout = Some(Duration::from_secs(60));
        let server = config.cluster_url.host().map(|h| {
            (
                h.trim_matches(['[', ']']).to_string(),
                config.cluster_url.port_u16().unwrap_or(443),
            )
        });
        let namespace = if opts.namespace.is_empty() {
            config.default_namespace.clone()
        } else {
            opts.namespace.clone()
        };
        let client = Client::try_from(config).map_err(|e| Error::invalid(format!("kube client: {e}")))?;
        let pods = Api::namespaced(client.clone(), &namespace);
        let policies = Api::namespaced(client.clone(), &namespace);
        let asb = if opts.agent_sandbox {
            let ctx = Ctx::background().with_timeout(Duration::from_secs(30));
            Some(Arc::new(
                agent_sandbox::AgentSandbox::discover(&client, &namespace, &ctx).await?,
            ))
        } else {
            None
        };
        tracing::debug!(namespace = %namespace, agent_sandbox = asb.is_some(), "kube provider");
        Ok(KubeProvider {
            client,
            opts: Arc::new(opts),
            namespace,
            pods,
            policies,
            v5: Default::default(),
            runner_bytes: Default::default(),
            server,
            asb,
        })
    }

    /// The namespace its pods are in.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn id_of(&self, pod: &str) -> SandboxId {
        SandboxId::new(NAME, &format!("{}:{pod}", self.namespace)).expect("namespace and pod names are valid ids")
    }

    /// The pod an id names, where it is this provider's namespace's.
    fn pod_of<'a>(&self, id: &'a SandboxId) -> Option<&'a str> {
        if id.provider() != NAME {
            return None;
        }
        let (ns, pod) = id.name().split_once(':')?;
        (ns == self.namespace && dns_subdomain(pod)).then_some(pod)
    }

    fn target(&self, pod: &str) -> exec::Target {
        exec::Target {
            client: self.client.clone(),
            namespace: self.namespace.clone(),
            pod: pod.into(),
            v5: self.v5.clone(),
        }
    }

    /// The box of a running pod; `None` for one that ended or is not a box.
    async fn sandbox_of(&self, p: &Pod, runner: Runner, ctx: &Ctx) -> Result<Option<Arc<dyn Sandbox>>> {
        // A warm pool's pod not yet claimed has no box key: it is no box yet.
        if pod::label(p, pod::LABEL_PROVIDER) != Some(NAME)
            || pod::box_key(p).is_none()
            || pod::phase(p) == pod::Phase::Ended
        {
            return Ok(None);
        }
        let name = p.metadata.name.clone().unwrap_or_default();
        let network = match (
            pod::annotation(p, pod::ANNOTATION_NETWORK),
            pod::annotation(p, ANNOTATION_VERIFIED),
        ) {
            (Some("none"), Some("none")) => Some(NetworkFact::None),
            (Some("none"), _) => Some(NetworkFact::Requested),
            _ => None,
        };
        let mut facts = pod::facts(p, network);
        facts.ports = Some(ports_of(p));
        let b = Arc::new(self.boxed(p, &name, facts));
        if pod::annotation(p, pod::ANNOTATION_RUNNER) == Some("true") && pod::phase(p) == pod::Phase::Running {
            let r = RunnerSandbox::new(b.clone(), Arc::new(self.relay(b.clone())));
            if runner == Runner::Lazily || r.check(ctx).await.is_ok() {
                return Ok(Some(Arc::new(r)));
            }
            tracing::warn!(pod = %name, "the pod's runner does not answer: its own exec serves");
        }
        Ok(Some(b))
    }

    fn relay(&self, b: Arc<dyn Sandbox>) -> Relay {
        Relay {
            sandbox: b,
            argv: vec![RUNNER_IN_POD.into(), "relay".into(), format!("unix:{RUNNER_SOCKET}")],
        }
    }

    /// Wait until the pod runs: `Ok(pod)`, or the reason it never will.
    async fn wait_running(&self, name: &str, ctx: &Ctx) -> Result<Pod> {
        let deadline = tokio::time::Instant::now() + self.opts.start_timeout;
        let mut pause = Duration::from_millis(10);
        loop {
            let found = retry(ctx, "reading the pod", || self.pods.get_opt(name)).await?;
            let p = match found {
                Some(p) => p,
                None => {
                    // A Sandbox's controller makes its pod after the Sandbox: not yet is no
                    // answer, unless the controller says it cannot.
                    let sb = match &self.asb {
                        Some(asb) => retry(ctx, "reading the Sandbox", || asb.sandboxes.get_opt(name)).await?,
                        None => None,
                    };
                    let Some(sb) = sb else {
                        return Err(Error::gone(format!("pod {name}: deleted while it started")));
                    };
                    if let Some(why) = agent_sandbox::refused(&sb) {
                        return Err(Error::unknown(format!(
                            "Sandbox {name}: the controller cannot make its pod: {why}"
                        )));
                    }
                    if tokio::time::Instant::now() >= deadline {
                        return Err(Error::timeout(format!(
                            "Sandbox {name}: the controller made no pod within {} s",
                            self.opts.start_timeout.as_secs()
                        )));
                    }
                    ctx.run(tokio::time::sleep(pause)).await?;
                    pause = (pause * 2).min(Duration::from_millis(500));
                    continue;
                }
            };
            match pod::phase(&p) {
                pod::Phase::Running => return Ok(p),
                pod::Phase::Ended => {
                    let why = p
                        .status
                        .as_ref()
                        .and_then(|s| s.message.clone().or(s.reason.clone()))
                        .unwrap_or_else(|| "its container exited".into());
                    return Err(Error::unknown(format!("pod {name} ended as it started: {why}")));
                }
                pod::Phase::Pending => {
                    if let Some(why) = pod::stuck(&p) {
                        return Err(Error::unknown(format!("pod {name} cannot start: {why}")));
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::timeout(format!(
                    "pod {name} did not run within {} s (scheduling or pulling its image)",
                    self.opts.start_timeout.as_secs()
                )));
            }
            ctx.run(tokio::time::sleep(pause)).await?;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// Make the pod `name` of `spec` and wait for it; on failure nothing of it is left.
    async fn make(
        &self,
        name: &str,
        key: &str,
        box_name: Option<&str>,
        spec: &Spec,
        ctx: &Ctx,
    ) -> std::result::Result<Arc<dyn Sandbox>, Made> {
        let ends_at = now_ms().saturating_add(u64::try_from(spec.max_lifetime.as_millis()).unwrap_or(u64::MAX));
        let runner = self.opts.runner.is_some();
        let manifest = pod::manifest(&self.opts, name, key, box_name, spec, ends_at, runner).map_err(Made::Failed)?;
        let none = matches!(spec.network, Some(Network::None));
        if none {
            self.deny_all(name, key, ctx).await.map_err(Made::Failed)?;
        }
        let pp = PostParams::default();
        let created = match &self.asb {
            // The controller makes the pod, of the same name.
            Some(asb) => {
                let sb = agent_sandbox::AgentSandbox::sandbox_of(&manifest, ends_at).map_err(Made::Failed)?;
                let made = attempt(ctx, || asb.sandboxes.create(&pp, &sb)).await;
                if let (Ok(Ok(made)), true) = (&made, none) {
                    // The controller deletes pod and Sandbox at the deadline, leaving no ended
                    // pod for a sweep: the policy goes with the Sandbox, its owner.
                    self.own_policy(name, made, ctx).await.map_err(Made::Failed)?;
                }
                made.map(|r| r.map(|_| ()))
            }
            None => attempt(ctx, || self.pods.create(&pp, &manifest))
                .await
                .map(|r| r.map(|_| ())),
        };
        let made = match created {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) if conflict(&e) => Err(Made::Exists),
            Ok(Err(e)) => Err(Made::Failed(api_error(e, "creating the pod"))),
            Err(e) => Err(Made::Failed(e)),
        };
        if let Err(e) = made {
            if none && matches!(e, Made::Failed(_)) {
                let cleanup = Ctx::background().with_timeout(Duration::from_secs(30));
                let _ = self.delete_policy(name, &cleanup).await;
            }
            return Err(e);
        }
        tracing::info!(pod = %name, namespace = %self.namespace, "pod created");
        match self.finish_make(name, none, runner, ctx).await {
            Ok(b) => Ok(b),
            Err(e) => {
                let cleanup = Ctx::background().with_timeout(Duration::from_secs(30));
                let _ = self.end(name, None, &cleanup).await;
                Err(Made::Failed(e))
            }
        }
    }

    async fn finish_make(&self, name: &str, none: bool, runner: bool, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let p = self.wait_running(name, ctx).await?;
        self.ready(p, none, runner, ctx).await
    }

    /// A running pod as a box: `network: none` proven from inside, the runner installed.
    async fn ready(&self, p: Pod, none: bool, runner: bool, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let name = p.metadata.name.clone().unwrap_or_default();
        let name = name.as_str();
        let mut facts = pod::facts(&p, None);
        facts.ports = Some(ports_of(&p));
        let make = |facts| Arc::new(self.boxed(&p, name, facts));
        let mut b = make(facts.clone());
        if none {
            facts.network = Some(self.verify_none(&b, ctx).await?);
            b = make(facts);
        }
        if !runner {
            return Ok(b);
        }
        self.install_runner(&b, ctx).await?;
        let r = RunnerSandbox::new(b.clone(), Arc::new(self.relay(b.clone())));
        r.check(ctx).await?;
        Ok(Arc::new(r))
    }

    /// The box of pod `p` named `name`, with `facts`: one an agent-sandbox controller owns
    /// is ended through its owner.
    fn boxed(&self, p: &Pod, name: &str, mut facts: agentbox_core::Facts) -> KubeSandbox {
        let owner = self.asb.clone().filter(|_| owned_by_sandbox(p));
        if owner.is_some() {
            facts
                .limits
                .insert("controller".into(), format!("agent-sandbox Sandbox {name}"));
        }
        KubeSandbox::new(
            self.pods.clone(),
            self.target(name),
            self.id_of(name),
            facts,
            pod::host_labels(p),
        )
        .with_owner(owner)
    }

    /// End the box of pod `name`: through its Sandbox (or claim) where one owns it, then the pod.
    async fn end(&self, name: &str, p: Option<&Pod>, ctx: &Ctx) -> Result<()> {
        if let Some(asb) = &self.asb
            && p.is_none_or(owned_by_sandbox)
        {
            asb.end(name, ctx).await?;
        }
        delete_pod(&self.pods, name, ctx).await?;
        self.delete_policy(name, ctx).await
    }

    /// A deny-all NetworkPolicy for the box `key`, made before its pod so no packet of the
    /// pod's ever went out unpoliced.
    async fn deny_all(&self, pod_name: &str, key: &str, ctx: &Ctx) -> Result<()> {
        let policy = NetworkPolicy {
            metadata: ObjectMeta {
                name: Some(policy_name(pod_name)),
                labels: Some(
                    [
                        (pod::LABEL_PROVIDER.to_string(), NAME.to_string()),
                        (pod::LABEL_BOX.to_string(), key.to_string()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            spec: Some(NetworkPolicySpec {
                pod_selector: Some(LabelSelector {
                    match_labels: Some([(pod::LABEL_BOX.to_string(), key.to_string())].into()),
                    ..Default::default()
                }),
                policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
                ingress: None,
                egress: None,
            }),
        };
        let pp = PostParams::default();
        match attempt(ctx, || self.policies.create(&pp, &policy)).await? {
            Ok(_) => Ok(()),
            // Left by an earlier make of the same name: it is the same policy.
            Err(e) if conflict(&e) => Ok(()),
            Err(e) => Err(api_error(e, "creating the network policy")),
        }
    }

    /// Make the Sandbox `owner` the owner of the box's network policy.
    async fn own_policy(&self, pod_name: &str, owner: &kube::api::DynamicObject, ctx: &Ctx) -> Result<()> {
        let patch = serde_json::json!({"metadata": {"ownerReferences": [{
            "apiVersion": format!("{}/{}", agent_sandbox::GROUP, agent_sandbox::VERSION),
            "kind": "Sandbox",
            "name": owner.metadata.name,
            "uid": owner.metadata.uid,
        }]}});
        let (name, pp, patch) = (policy_name(pod_name), PatchParams::default(), Patch::Merge(&patch));
        retry(ctx, "giving the network policy its owner", || {
            self.policies.patch(&name, &pp, &patch)
        })
        .await?;
        Ok(())
    }

    async fn delete_policy(&self, pod_name: &str, ctx: &Ctx) -> Result<()> {
        delete_policy(&self.client, &self.namespace, pod_name, ctx).await
    }

    /// Prove `network: none` from inside the pod: a connection to the API server (which
    /// this host just reached) must fail. One that succeeds means the cluster's CNI ignores
    /// NetworkPolicies, and the box is refused; a pod with no way to try is `requested`.
    async fn verify_none(&self, b: &Arc<KubeSandbox>, ctx: &Ctx) -> Result<NetworkFact> {
        let mut targets: Vec<(String, u16)> = self.server.iter().cloned().collect();
        // The service address every pod is given, where the cluster has one.
        let probe = r#"command -v bash >/dev/null && command -v timeout >/dev/null || exit 4
for t in "$@"; do
  h=${t%:*}; p=${t##*:}
  if timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$h" "$p" 2>/dev/null; then echo "reached $t"; exit 0; fi
done
[ -n "$KUBERNETES_SERVICE_HOST" ] && timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$KUBERNETES_SERVICE_HOST" "${KUBERNETES_SERVICE_PORT:-443}" 2>/dev/null && { echo "reached the kubernetes service"; exit 0; }
exit 3"#;
        targets.dedup();
        let mut argv = vec!["sh".to_string(), "-c".into(), probe.into(), "agentbox-probe".into()];
        argv.extend(targets.iter().map(|(h, p)| format!("{h}:{p}")));
        let p = b
            .exec(
                &argv,
                &ExecOptions::default(),
                &ctx.with_timeout(Duration::from_secs(30)),
            )
            .await?;
        let out = finish(p, FinishOptions::default()).await?;
        let (verdict, fact) = match out.status.code {
            0 => {
                return Err(Error::unsupported(format!(
                    "spec.network none: the cluster does not enforce NetworkPolicies (from inside pod {}, {})",
                    b.pod(),
                    out.stdout_text().trim()
                )));
            }
            3 => ("none", NetworkFact::None),
            _ => ("requested", NetworkFact::Requested),
        };
        tracing::info!(pod = %b.pod(), network = verdict, "network none verified from inside the pod");
        let patch = serde_json::json!({"metadata": {"annotations": {ANNOTATION_VERIFIED: verdict}}});
        let (pp, patch) = (PatchParams::default(), Patch::Merge(&patch));
        retry(ctx, "recording the network probe", || {
            self.pods.patch(b.pod(), &pp, &patch)
        })
        .await?;
        Ok(fact)
    }

    /// Copy this machine's runner into the pod and start it listening on its socket.
    async fn install_runner(&self, b: &Arc<KubeSandbox>, ctx: &Ctx) -> Result<()> {
        let Some(helper) = &self.opts.runner else { return Ok(()) };
        let bytes = self
            .runner_bytes
            .get_or_try_init(|| async {
                tokio::fs::read(&helper.program)
                    .await
                    .map(Arc::new)
                    .map_err(|e| Error::io(e, format!("reading the runner {}", helper.program.display())))
            })
            .await?
            .clone();
        b.put(RUNNER_IN_POD, &bytes, 0o755, ctx).await?;
        // A mode other than 0644 always goes by tar, which sets it.
        let mut program = vec![RUNNER_IN_POD.to_string()];
        program.extend(helper.args.iter().cloned());
        crate::runner::start(b.as_ref(), &program, &[format!("unix:{RUNNER_SOCKET}")], None, ctx).await?;
        Ok(())
    }

    /// Wait until the box's first process reads `want` in its deadline file: the kubelet
    /// refreshes a downward-API file on its own sync (within about a minute), and a later
    /// deadline it has not yet written is one the box may still end at (`old`). Past that,
    /// `timeout`.
    async fn await_deadline_file(&self, b: &Arc<dyn Sandbox>, want: u64, old: u64, ctx: &Ctx) -> Result<()> {
        let path = format!("{}/ends-at-ms", pod::DEADLINE_DIR);
        let limit = Duration::from_millis(old.saturating_sub(now_ms())).min(Duration::from_secs(120));
        let until = tokio::time::Instant::now() + limit;
        loop {
            let read = b
                .download(&path, 64, &ctx.with_timeout(Duration::from_secs(30)))
                .await?;
            if String::from_utf8_lossy(&read).trim() == want.to_string() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= until {
                return Err(Error::timeout(format!(
                    "extend {}: the pod's deadline file still reads {:?} (the kubelet has not refreshed it), \
                     so the box may end at its old deadline",
                    b.id(),
                    String::from_utf8_lossy(&read).trim()
                )));
            }
            ctx.run(tokio::time::sleep(Duration::from_millis(500))).await?;
        }
    }

    /// The box again once its pod carries exactly `labels` (a controller applies them), within
    /// 60 s.
    async fn await_labels(&self, id: &SandboxId, labels: &Labels, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let until = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let Some(p) = self.get(id, ctx).await? else {
                return Err(Error::gone(format!("box {id}: it ended as it was relabelled")));
            };
            if &pod::host_labels(&p) == labels {
                return self
                    .sandbox_of(&p, Runner::Checked, ctx)
                    .await?
                    .ok_or_else(|| Error::gone(format!("box {id}: it ended as it was relabelled")));
            }
            if tokio::time::Instant::now() >= until {
                return Err(Error::timeout(format!(
                    "relabel {id}: the controller did not give the pod its labels within 60 s"
                )));
            }
            ctx.run(tokio::time::sleep(Duration::from_millis(100))).await?;
        }
    }

    async fn get(&self, id: &SandboxId, ctx: &Ctx) -> Result<Option<Pod>> {
        let Some(name) = self.pod_of(id) else { return Ok(None) };
        // Another pod of the namespace is not a box: extend and relabel never touch it.
        Ok(retry(ctx, "reading the pod", || self.pods.get_opt(name))
            .await?
            .filter(|p| pod::label(p, pod::LABEL_PROVIDER) == Some(NAME)))
    }
}

/// Whether a box found again has its runner checked at once (attach, open: a runner that does
/// not answer leaves the pod's own exec to serve) or at its first call (list).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Runner {
    Checked,
    Lazily,
}

/// Pods asked for per page of a list.
const LIST_PAGE: u32 = 500;
/// The most pods one list answers.
const MAX_LISTED: usize = 10_000;

/// How a make went wrong: the name was taken (another host's open won), or anything else.
enum Made {
    Exists,
    Failed(Error),
}

/// The annotation the network probe's verdict is kept in.
const ANNOTATION_VERIFIED: &str = "agentbox.network-verified";

#[async_trait]
impl Provider for KubeProvider {
    fn name(&self) -> &str {
        NAME
    }

    fn honours(&self) -> Honours {
        Honours {
            image: true,
            cpus: true,
            memory: true,
            gpu: true,
            isolation: vec![isolation_of(self.opts.runtime_class.as_deref())],
            network_none: true,
            ports: true,
            workspace: true,
            env: true,
            live_processes: true,
            names: true,
            extend: true,
            relabel: true,
            ..Default::default()
        }
    }

    #[tracing::instrument(name = "create", skip_all, fields(provider = NAME))]
    async fn create(&self, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        self.check(spec)?;
        let key = random_hex(8)?;
        match self.make(&format!("agentbox-{key}"), &key, None, spec, ctx).await {
            Ok(b) => Ok(b),
            Err(Made::Failed(e)) => Err(e),
            Err(Made::Exists) => Err(Error::new(
                ErrorCode::Refused,
                format!("pod agentbox-{key} exists already"),
            )),
        }
    }

    async fn attach(&self, id: &SandboxId, ctx: &Ctx) -> Result<Option<Arc<dyn Sandbox>>> {
        if id.provider() != NAME {
            return Err(Error::invalid(format!("box {id}: not a {NAME} box")));
        }
        match self.get(id, ctx).await? {
            Some(p) => self.sandbox_of(&p, Runner::Checked, ctx).await,
            None => Ok(None),
        }
    }

    async fn list(&self, labels: &Labels, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        pod::check_labels(labels)?;
        let mut selectors = vec![selector(labels)];
        if self.asb.is_some() {
            // A claim pool's boxes carry the host's labels in the claim's domain.
            let claimed: Labels = labels
                .iter()
                .map(|(k, v)| (format!("{}{k}", pod::CLAIMED), v.clone()))
                .collect();
            selectors.push(selector(&claimed));
        }
        let mut pods: Vec<Pod> = Vec::new();
        for sel in selectors {
            let mut lp = ListParams::default().labels(&sel).limit(LIST_PAGE);
            loop {
                let page = retry(ctx, "listing pods", || self.pods.list(&lp)).await?;
                for p in page.items {
                    if !pods.iter().any(|q| q.metadata.name == p.metadata.name) {
                        pods.push(p);
                    }
                }
                if pods.len() > MAX_LISTED {
                    return Err(Error::too_large(format!(
                        "list: over {MAX_LISTED} pods of agentbox's in namespace {} match; narrow the labels",
                        self.namespace
                    )));
                }
                match page.metadata.continue_.filter(|c| !c.is_empty()) {
                    Some(c) => lp = lp.continue_token(&c),
                    None => break,
                }
            }
        }
        let mut out = Vec::new();
        for p in pods {
            let name = p.metadata.name.clone().unwrap_or_default();
            if pod::phase(&p) == pod::Phase::Ended {
                // An ended pod is deleted here, its policy with it: nothing is left behind.
                tracing::info!(pod = %name, "deleting an ended pod");
                if let Err(e) = self.end(&name, Some(&p), ctx).await {
                    tracing::warn!(pod = %name, error = %e, "an ended pod (or its policy or Sandbox) was not deleted");
                }
                continue;
            }
            // A listed box's runner is reached at its first call, not now: one exec per pod
            // listed would make a list of many boxes as slow as many creates.
            if let Some(b) = self.sandbox_of(&p, Runner::Lazily, ctx).await? {
                out.push(b);
            }
        }
        Ok(out)
    }

    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        Some(self)
    }
}

impl KubeProvider {
    /// What create and open refuse beyond `check_spec`.
    fn check(&self, spec: &Spec) -> Result<()> {
        check_spec(spec, &self.honours(), NAME)?;
        pod::check_labels(&spec.labels)?;
        if spec.max_lifetime > self.opts.max_lifetime {
            return Err(Error::invalid(format!(
                "spec.max_lifetime: {} s is over this provider's {} s (its pods' activeDeadlineSeconds)",
                spec.max_lifetime.as_secs(),
                self.opts.max_lifetime.as_secs()
            )));
        }
        if let Some(p) = spec.ports.iter().find(|p| p.kind == PortKind::Https) {
            return Err(Error::unsupported(format!(
                "spec.ports: port {} as https: kube boxes reach ports by port-forward, as TCP",
                p.port
            )));
        }
        Ok(())
    }
}

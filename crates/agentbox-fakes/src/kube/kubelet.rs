//! The fake's kubelet: each pod's container runs as the first process of a namespace box,
//! and the pod's status follows it as a kubelet reports it (Pending, Running, Succeeded or
//! Failed; a container waiting with `ErrImagePull`, `CreateContainerConfigError`...).
//!
//! What it makes of a pod's spec:
//! - the image names a root file system (`--image NAME=DIR`, else `--rootfs DIR` for any
//!   image); an unknown one waits with `ErrImagePull`, then `ImagePullBackOff`;
//! - `command` + `args` are the box's first process (detached in the box, so it is the box's
//!   own whatever becomes of a connection); with neither, the container waits with
//!   `CreateContainerError` `no command specified`, which containerd says of an image with no
//!   entrypoint, since a directory has none;
//! - `workingDir`, `env` values and `valueFrom.fieldRef` (the pod's name, namespace, uid,
//!   labels and annotations, `status.podIP`, `spec.nodeName`) become the box's environment
//!   (which `exec` gets too, as in a container); other `valueFrom` sources (secrets, config
//!   maps, resources) wait with `CreateContainerConfigError`;
//! - a pod naming a PersistentVolumeClaim that is not there, not yet Bound or being deleted
//!   is not scheduled: Pending, no node, its `PodScheduled` condition False `Unschedulable`
//!   with the scheduler's message (`0/1 nodes are available: persistentvolumeclaim "x" not
//!   found. ...`), looked at again every [`RETRY`] until the claim is there;
//! - `emptyDir` is a fresh host directory given to the box's user, bound at each mountPath;
//!   `downwardAPI` (fieldRef items) a host directory of files bound read-only, rewritten at
//!   once when a patch changes the labels or annotations (a real kubelet takes up to about a
//!   minute); `persistentVolumeClaim` the claim's own directory (`storage`), given to the
//!   box's user, kept from pod to pod, read-only with `readOnly`; `secret` a host directory
//!   holding each key (or each of `items`, at its path) as a file of `defaultMode` (0644) or
//!   the item's mode, owned by the box's user, bound read-only, written when the container
//!   starts and not refreshed after; `hostPath` the host's path itself (`Directory`, `File`,
//!   `Socket` checked, `DirectoryOrCreate` and `FileOrCreate` made as a kubelet makes them,
//!   `""` made a directory when missing, as containerd does; `CharDevice` and `BlockDevice`
//!   wait `CreateContainerError`, a box's mounts being nodev), read-only where the
//!   volumeMount says so, and reached with the host's permissions as the box's user (one id
//!   of the host's, not root) has them. A volume the kubelet cannot set up yet (a secret or
//!   a key of it missing, a hostPath failing its type check) leaves the container waiting
//!   `ContainerCreating`, as a kubelet leaves it, with the kubelet's `MountVolume.SetUp
//!   failed ...` as its message (where a kubelet says it in a FailedMount event, which the
//!   fake does not serve), tried again every [`RETRY`]; `optional` secrets mount empty. Any
//!   other volume waits with `CreateContainerError`. A mountPath the box's
//!   read-only root does not have is made only where the namespace box can make it: a new
//!   top-level directory (`/data`), anything under `/tmp`, `/root`, `/workspace` or under
//!   another volume's mountPath (mounts are bound shortest path first for that); elsewhere
//!   (`/etc/podinfo`) the box cannot be made and the container waits with
//!   `CreateContainerError` and the box's reason;
//! - `securityContext` is kept as given; `runAsNonRoot: true` with no `runAsUser` or 0 waits
//!   with `CreateContainerConfigError` as the kubelet does. Programs always run as the box's
//!   root (one id of the host's, mapped), whatever `runAsUser` says;
//! - one container per pod (a pod with more, or with init containers, is refused at create);
//!   the container is never restarted: `restartPolicy` is kept, and the pod ends Succeeded
//!   or Failed when its first process exits, whatever the policy;
//! - `spec.activeDeadlineSeconds` is counted from `status.startTime`: the pod is Failed with
//!   reason `DeadlineExceeded` and its box ended; every box is made with a lifetime of
//!   [`POD_LIFETIME`] (6 hours), which its init enforces even if the fake is killed, so a pod
//!   running longer fails as a killed container (137);
//! - a NetworkPolicy selecting the pod with `Egress` in its policyTypes and no egress rule
//!   (and no other selecting policy allowing any egress) gives the box no network but
//!   loopback, read at the pod's start; one with egress rules leaves the network open (the
//!   fake enforces no partial policy, and never pretends to); ingress is never enforced.
//!   Without network isolation the box has its box provider's default network (a namespace
//!   box's own, whose way out is agentbox's egress proxy), or, where the fake plays a cluster
//!   whose network plugin ignores policies, this machine's; `podIP` is 127.0.0.1 all the same,
//!   and port-forward reaches the pod's ports from inside its network (see `stream`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentbox_core::{Ctx, ExecOptions, Mount, Network, Provider, Sandbox, Spec};
use agentbox_providers::namespace::NamespaceProvider;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::sync::{Notify, watch};

use crate::kube::selector::{LabelSelector, labels_of};
use crate::kube::storage;
use crate::kube::store::{Kind, Store, now_rfc3339};

/// The bytes of a pod's log kept: the newest, the oldest let go.
pub(crate) const LOG_BOUND: usize = 1 << 20;

/// The node every pod is bound to.
pub(crate) const NODE: &str = "agentbox-fake";

/// The lifetime every pod's box is made with, which its init enforces with no call from the
/// fake: a fake killed without its shutdown leaves no box past it. A pod that runs longer
/// fails as a container killed (exit 137).
pub(crate) const POD_LIFETIME: Duration = Duration::from_secs(6 * 3600);

/// How long making a box may take before the container is reported failed to start.
const MAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// How often an unscheduled pod's claims, or a volume that could not be set up, are looked at
/// again (a scheduler requeues on the claim's event; a kubelet backs off up to two minutes).
const RETRY: Duration = Duration::from_millis(250);

/// Why a volume is not mounted.
enum VolumeError {
    /// The kubelet's `MountVolume.SetUp` failure, tried again: what is missing may come.
    Retry(String),
    /// What the fake's kubelet does not do, or a spec no retry mends: `CreateContainerError`.
    Refused(String),
}

/// What a pod's box is made from.
pub(crate) struct Images {
    pub(crate) named: BTreeMap<String, PathBuf>,
    pub(crate) any: Option<PathBuf>,
}

impl Images {
    fn resolve(&self, image: &str) -> Option<&PathBuf> {
        self.named.get(image).or(self.any.as_ref())
    }
}

/// The running side of one pod: its box while it has one, its log, its deadline.
pub(crate) struct PodRun {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) container: String,
    pub(crate) working_dir: Option<String>,
    /// The box while the container runs.
    pub(crate) sandbox: Mutex<Option<Arc<dyn Sandbox>>>,
    /// Set (under `sandbox`'s lock) once the pod's box is to end: a box made after it is
    /// destroyed at once rather than kept.
    stopped: std::sync::atomic::AtomicBool,
    /// Whether the box was made with no network but loopback.
    pub(crate) isolated: Mutex<bool>,
    log: Mutex<Log>,
    /// `spec.activeDeadlineSeconds`, which a patch may lower.
    deadline: watch::Sender<Option<i64>>,
    /// Told when the pod is deleted or the fake shuts down.
    stop: Notify,
    /// Where the downwardAPI volumes' files are, to rewrite on a patch.
    downward: Mutex<Vec<Downward>>,
    /// Told on every change of the log, and when the container ends.
    pub(crate) log_changed: Notify,
    pub(crate) ended: watch::Sender<bool>,
}

/// A downwardAPI volume's host directory and its items (file path, fieldPath).
type Downward = (PathBuf, Vec<(String, String)>);

#[derive(Default)]
struct Log {
    bytes: VecDeque<u8>,
}

impl PodRun {
    /// The log as kept, the oldest part let go past [`LOG_BOUND`].
    pub(crate) fn log(&self) -> Vec<u8> {
        let l = self.log.lock().unwrap_or_else(|p| p.into_inner());
        l.bytes.iter().copied().collect()
    }

    fn append(&self, b: &[u8]) {
        {
            let mut l = self.log.lock().unwrap_or_else(|p| p.into_inner());
            l.bytes.extend(b);
            let over = l.bytes.len().saturating_sub(LOG_BOUND);
            l.bytes.drain(..over);
        }
        self.log_changed.notify_waiters();
    }

    pub(crate) fn sandbox(&self) -> Option<Arc<dyn Sandbox>> {
        self.sandbox.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The box, taken for its end; no box made later is kept.
    fn take_sandbox(&self) -> Option<Arc<dyn Sandbox>> {
        let mut slot = self.sandbox.lock().unwrap_or_else(|p| p.into_inner());
        self.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        slot.take()
    }

    /// Keep `b` as the pod's box, unless the pod's end came first (then `false`).
    fn keep(&self, b: &Arc<dyn Sandbox>) -> bool {
        let mut slot = self.sandbox.lock().unwrap_or_else(|p| p.into_inner());
        if self.stopped.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        *slot = Some(b.clone());
        true
    }
}

/// Runs pods.
pub(crate) struct Kubelet {
    pub(crate) provider: Arc<NamespaceProvider>,
    pub(crate) images: Images,
    pub(crate) network_policy: bool,
    /// Where the volumes' host directories are made.
    pub(crate) volumes: PathBuf,
    /// The host ids the box's root is mapped to (given the emptyDirs).
    pub(crate) box_ids: (u32, u32),
    runs: Mutex<HashMap<String, Arc<PodRun>>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// How many boxes are being made, each on a task of its own that outlives its pod's: the
    /// fake's end waits for them, so that none is made after it and left behind.
    making: watch::Sender<usize>,
}

/// One box being made, counted in [`Kubelet::making`] until dropped.
struct Making(watch::Sender<usize>);

impl Drop for Making {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// How the container's life ended, for the pod's status.
enum End {
    Exited(i32),
    Deadline,
    Stopped,
    /// It never started (waiting for ever), and the pod went.
    Never,
}

impl Kubelet {
    pub(crate) fn new(
        provider: Arc<NamespaceProvider>,
        images: Images,
        network_policy: bool,
        volumes: PathBuf,
        box_ids: (u32, u32),
    ) -> Kubelet {
        Kubelet {
            provider,
            images,
            network_policy,
            volumes,
            box_ids,
            runs: Mutex::new(HashMap::new()),
            tasks: Mutex::new(Vec::new()),
            making: watch::Sender::new(0),
        }
    }

    pub(crate) fn run_of(&self, uid: &str) -> Option<Arc<PodRun>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner()).get(uid).cloned()
    }

    /// Every pod's run (for shutdown).
    fn all(&self) -> Vec<Arc<PodRun>> {
        self.runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Start the pod just created.
    pub(crate) fn start(self: &Arc<Self>, store: Arc<Store>, pod: &Value) {
        let c = &pod["spec"]["containers"][0];
        let run = Arc::new(PodRun {
            namespace: pod["metadata"]["namespace"].as_str().unwrap_or("").to_string(),
            name: pod["metadata"]["name"].as_str().unwrap_or("").to_string(),
            uid: pod["metadata"]["uid"].as_str().unwrap_or("").to_string(),
            container: c["name"].as_str().unwrap_or("").to_string(),
            working_dir: c["workingDir"].as_str().filter(|s| !s.is_empty()).map(str::to_string),
            sandbox: Mutex::new(None),
            stopped: std::sync::atomic::AtomicBool::new(false),
            isolated: Mutex::new(false),
            log: Mutex::new(Log::default()),
            deadline: watch::Sender::new(pod["spec"]["activeDeadlineSeconds"].as_i64()),
            stop: Notify::new(),
            downward: Mutex::new(Vec::new()),
            log_changed: Notify::new(),
            ended: watch::Sender::new(false),
        });
        self.runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(run.uid.clone(), run.clone());
        let me = self.clone();
        let task = tokio::spawn(async move { me.live(store, run).await });
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
    }

    /// A patch changed the pod: a lower deadline, new labels or annotations for the
    /// downwardAPI files.
    pub(crate) fn changed(&self, pod: &Value) {
        let Some(run) = pod["metadata"]["uid"].as_str().and_then(|u| self.run_of(u)) else {
            return;
        };
        let d = pod["spec"]["activeDeadlineSeconds"].as_i64();
        run.deadline.send_if_modified(|old| {
            let moved = *old != d;
            *old = d;
            moved
        });
        let dirs = run.downward.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (dir, items) in dirs {
            if let Err(e) = write_downward(&dir, &items, pod) {
                tracing::warn!(pod = %run.name, error = %e, "rewriting a downwardAPI volume");
            }
        }
    }

    /// The pod was deleted: end its box (awaited, so the DELETED event follows the box's end)
    /// and forget it.
    pub(crate) async fn stop(&self, uid: &str) {
        let Some(run) = self.runs.lock().unwrap_or_else(|p| p.into_inner()).remove(uid) else {
            return;
        };
        run.stop.notify_one();
        end_box(&run).await;
        let _ = std::fs::remove_dir_all(self.volumes.join(&run.uid));
    }

    /// End every pod's box (the fake shuts down).
    pub(crate) async fn stop_all(&self) {
        for t in self.tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            t.abort();
        }
        for run in self.all() {
            end_box(&run).await;
        }
        self.runs.lock().unwrap_or_else(|p| p.into_inner()).clear();
        // A box being made now is ended by its own task, its pod's run being stopped: waited
        // for, so that the runtime's end does not cut that task short and leave the box.
        let mut making = self.making.subscribe();
        let _ = tokio::time::timeout(MAKE_TIMEOUT, making.wait_for(|n| *n == 0)).await;
        // Any box of the fake's provider still there (one whose make was under way): ended too.
        let ctx = Ctx::background().with_timeout(Duration::from_secs(10));
        if let Ok(left) = self.provider.list(&Default::default(), &ctx).await {
            for b in left {
                let _ = b.destroy(&ctx).await;
            }
        }
    }

    /// One pod's life, from scheduling to its end.
    async fn live(self: Arc<Self>, store: Arc<Store>, run: Arc<PodRun>) {
        let scheduled = tokio::select! {
            () = schedule(&store, &run) => true,
            _ = run.stop.notified() => false,
        };
        if !scheduled {
            let _ = run.ended.send(true);
            run.log_changed.notify_waiters();
            return;
        }
        let started = std::time::Instant::now();
        let now = now_rfc3339();
        let Some(pod) = set_status(&store, &run, |pod| {
            let c = pod["spec"]["containers"][0].clone();
            pod["spec"]["nodeName"] = json!(NODE);
            pod["status"] = json!({
                "phase": "Pending",
                "conditions": [
                    condition("PodReadyToStartContainers", false, &now, None),
                    condition("Initialized", true, &now, None),
                    condition("Ready", false, &now, Some("ContainersNotReady")),
                    condition("ContainersReady", false, &now, Some("ContainersNotReady")),
                    condition("PodScheduled", true, &now, None),
                ],
                "hostIP": "127.0.0.1",
                "hostIPs": [{"ip": "127.0.0.1"}],
                "startTime": now,
                "qosClass": qos_class(&c),
                "containerStatuses": [{
                    "name": c["name"],
                    "state": {"waiting": {"reason": "ContainerCreating"}},
                    "lastState": {},
                    "ready": false,
                    "restartCount": 0,
                    "image": c["image"],
                    "imageID": "",
                    "started": false,
                }],
            });
        }) else {
            return;
        };
        let deadline = async {
            let mut rx = run.deadline.subscribe();
            loop {
                let d = *rx.borrow_and_update();
                match d {
                    Some(s) => {
                        let at = started + Duration::from_secs(s.max(0) as u64);
                        tokio::select! {
                            _ = tokio::time::sleep_until(at.into()) => return,
                            r = rx.changed() => if r.is_err() { std::future::pending::<()>().await },
                        }
                    }
                    None => {
                        if rx.changed().await.is_err() {
                            std::future::pending::<()>().await
                        }
                    }
                }
            }
        };
        let end = tokio::select! {
            e = self.container(&store, &run, &pod) => e,
            _ = deadline => End::Deadline,
            _ = run.stop.notified() => End::Stopped,
        };
        let had_box = end_box(&run).await;
        let _ = run.ended.send(true);
        run.log_changed.notify_waiters();
        let now = now_rfc3339();
        match end {
            End::Stopped | End::Never => {}
            End::Exited(code) => {
                set_status(&store, &run, |pod| {
                    let st = &mut pod["status"];
                    st["phase"] = json!(if code == 0 { "Succeeded" } else { "Failed" });
                    terminate(st, code, if code == 0 { "Completed" } else { "Error" }, &now);
                    not_ready(st, &now, "PodCompleted");
                });
            }
            End::Deadline => {
                set_status(&store, &run, |pod| {
                    let st = &mut pod["status"];
                    st["phase"] = json!("Failed");
                    st["reason"] = json!("DeadlineExceeded");
                    st["message"] = json!("Pod was active on the node longer than the specified deadline");
                    if had_box {
                        terminate(st, 137, "Error", &now);
                    }
                    not_ready(st, &now, "PodFailed");
                });
            }
        }
    }

    /// Make the box and run the container's first process to its end. A container that
    /// cannot start waits (for ever: only its deadline or its deletion ends the pod).
    async fn container(&self, store: &Store, run: &Arc<PodRun>, pod: &Value) -> End {
        let wait = |reason: &'static str, message: String| {
            tracing::info!(pod = %run.name, reason, message, "container waiting");
            set_status(store, run, |pod| {
                pod["status"]["containerStatuses"][0]["state"] =
                    json!({"waiting": {"reason": reason, "message": message}});
            });
        };
        let c = &pod["spec"]["containers"][0];
        let image = c["image"].as_str().unwrap_or("");
        let Some(rootfs) = self.images.resolve(image).cloned() else {
            wait(
                "ErrImagePull",
                format!(
                    "failed to pull and unpack image {image:?}: the fake knows no such image (give it --image {image}=DIR or --rootfs DIR)"
                ),
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
            wait("ImagePullBackOff", format!("Back-off pulling image {image:?}"));
            return pending().await;
        };
        if let Some(why) = non_root_refusal(pod, c, &run.name, &run.namespace, &run.uid) {
            wait("CreateContainerConfigError", why);
            return pending().await;
        }
        let mut argv: Vec<String> = Vec::new();
        for f in ["command", "args"] {
            if let Some(a) = c[f].as_array() {
                argv.extend(a.iter().filter_map(|s| s.as_str().map(str::to_string)));
            }
        }
        if c["command"].as_array().is_none_or(Vec::is_empty) {
            wait(
                "CreateContainerError",
                "failed to generate container spec: no command specified (the fake's images are directories with no entrypoint: give the container a command)".into(),
            );
            return pending().await;
        }
        let env = match env_of(c, pod) {
            Ok(e) => e,
            Err(why) => {
                wait("CreateContainerConfigError", why);
                return pending().await;
            }
        };
        let mut said = String::new();
        let mounts = loop {
            match self.volumes_of(store, run, pod, c) {
                Ok(m) => break m,
                Err(VolumeError::Refused(why)) => {
                    wait("CreateContainerError", why);
                    return pending().await;
                }
                Err(VolumeError::Retry(why)) => {
                    if why != said {
                        wait("ContainerCreating", why.clone());
                        said = why;
                    }
                    tokio::time::sleep(RETRY).await;
                }
            }
        };
        let isolated = self.network_policy && denies_egress(store, pod);
        *run.isolated.lock().unwrap_or_else(|p| p.into_inner()) = isolated;
        let mut spec = Spec::new(POD_LIFETIME);
        spec.image = Some(rootfs.to_string_lossy().into_owned());
        spec.env = env;
        spec.mounts = mounts;
        spec.network = if isolated {
            Some(Network::None)
        } else if !self.network_policy {
            // A cluster whose network plugin ignores policies: pods on an open network that
            // reaches out (this machine's), as such a cluster's pods do.
            Some(Network::Host)
        } else {
            None
        };
        // Made on a task of its own, which keeps the box or ends it: this future may be dropped
        // (the pod deleted, its deadline) while the box is being made, and a box made then must
        // not outlive its pod.
        let made = {
            let (provider, run) = (self.provider.clone(), run.clone());
            self.making.send_modify(|n| *n += 1);
            let making = Making(self.making.clone());
            tokio::spawn(async move {
                let _making = making;
                let ctx = Ctx::background().with_timeout(MAKE_TIMEOUT);
                let b = provider.create(&spec, &ctx).await?;
                if run.keep(&b) {
                    return Ok(b);
                }
                let _ = b.destroy(&Ctx::background().with_timeout(MAKE_TIMEOUT)).await;
                Err(agentbox_core::Error::aborted("the pod ended while its box was made"))
            })
        };
        let b = match made.await {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => {
                wait(
                    "CreateContainerError",
                    format!("the pod's box could not be made: {}", e.message()),
                );
                return pending().await;
            }
            Err(e) => {
                wait("CreateContainerError", format!("making the pod's box: {e}"));
                return pending().await;
            }
        };
        let opts = ExecOptions {
            cwd: run.working_dir.clone(),
            detach: true,
            ..Default::default()
        };
        let mut p = match b
            .exec(&argv, &opts, &Ctx::background().with_timeout(MAKE_TIMEOUT))
            .await
        {
            Ok(p) => p,
            Err(e) => {
                wait(
                    "RunContainerError",
                    format!("failed to start container {:?}: {}", run.container, e.message()),
                );
                return pending().await;
            }
        };
        if let Some(mut stdin) = p.stdin.take() {
            let _ = stdin.close().await;
        }
        let mut readers = Vec::new();
        for r in [p.stdout.take(), p.stderr.take()].into_iter().flatten() {
            let run = run.clone();
            readers.push(tokio::spawn(async move {
                let mut r = r;
                let mut buf = vec![0u8; 16 * 1024];
                while let Ok(n) = r.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    run.append(&buf[..n]);
                }
            }));
        }
        let now = now_rfc3339();
        let id = b.id().to_string();
        set_status(store, run, |pod| {
            let st = &mut pod["status"];
            st["phase"] = json!("Running");
            st["podIP"] = json!("127.0.0.1");
            st["podIPs"] = json!([{"ip": "127.0.0.1"}]);
            st["containerStatuses"][0]["state"] = json!({"running": {"startedAt": now}});
            st["containerStatuses"][0]["ready"] = json!(true);
            st["containerStatuses"][0]["started"] = json!(true);
            st["containerStatuses"][0]["containerID"] = json!(format!("agentbox://{id}"));
            st["containerStatuses"][0]["imageID"] = json!(format!("agentbox://{}", rootfs.display()));
            if let Some(cs) = st["conditions"].as_array_mut() {
                for c in cs {
                    c["status"] = json!("True");
                    c["lastTransitionTime"] = json!(now);
                    if let Some(m) = c.as_object_mut() {
                        m.remove("reason");
                    }
                }
            }
        });
        let code = match p.wait().await {
            Ok(s) => s.code,
            Err(e) => {
                tracing::warn!(pod = %run.name, error = %e, "waiting for the container's first process");
                // The box went under it (ended by its lifetime, say): as a container runtime
                // reports a container that vanished.
                137
            }
        };
        // Its output to the end, bounded by the box's end right after.
        for r in readers {
            let _ = tokio::time::timeout(Duration::from_secs(2), r).await;
        }
        End::Exited(code)
    }

    /// The spec's mounts for the container's volumeMounts, their host directories made.
    fn volumes_of(&self, store: &Store, run: &PodRun, pod: &Value, c: &Value) -> Result<Vec<Mount>, VolumeError> {
        let volumes: BTreeMap<String, Value> = pod["spec"]["volumes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v["name"].as_str().map(|n| (n.to_string(), v.clone())))
                    .collect()
            })
            .unwrap_or_default();
        // Tried again after a failure: the downwardAPI volumes are listed afresh.
        run.downward.lock().unwrap_or_else(|p| p.into_inner()).clear();
        let mut made: BTreeMap<String, (PathBuf, bool)> = BTreeMap::new();
        let mut mounts = Vec::new();
        for m in c["volumeMounts"].as_array().cloned().unwrap_or_default() {
            let name = m["name"].as_str().unwrap_or("");
            let target = m["mountPath"].as_str().unwrap_or("").to_string();
            let vol = volumes
                .get(name)
                .ok_or_else(|| VolumeError::Refused(format!("volume {name:?} is not in the pod")))?;
            if m.get("subPath").and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
                return Err(VolumeError::Refused(format!(
                    "volumeMount {name:?}: subPath is not supported by the fake's kubelet"
                )));
            }
            if !made.contains_key(name) {
                let source = self.volume(store, run, pod, name, vol)?;
                made.insert(name.to_string(), source);
            }
            let (dir, vol_ro) = &made[name];
            mounts.push(Mount {
                source: dir.to_string_lossy().into_owned(),
                target,
                read_only: *vol_ro || m["readOnly"].as_bool().unwrap_or(false),
            });
        }
        // A parent's bind first, so a mount under it is made in the parent's directory.
        mounts.sort_by_key(|m| m.target.matches('/').count());
        Ok(mounts)
    }

    /// One volume set up: the host path to bind (canonical) and whether the volume itself is
    /// read-only.
    fn volume(
        &self,
        store: &Store,
        run: &PodRun,
        pod: &Value,
        name: &str,
        vol: &Value,
    ) -> Result<(PathBuf, bool), VolumeError> {
        let refused = VolumeError::Refused;
        let set_up = |why: String| VolumeError::Retry(format!("MountVolume.SetUp failed for volume {name:?} : {why}"));
        let own = |dir: &Path| -> Result<PathBuf, VolumeError> {
            let dir = std::fs::canonicalize(dir).map_err(|e| refused(format!("{}: {e}", dir.display())))?;
            std::os::unix::fs::chown(&dir, Some(self.box_ids.0), Some(self.box_ids.1))
                .map_err(|e| refused(format!("giving the box {}: {e}", dir.display())))?;
            Ok(dir)
        };
        let fresh = |dir: &Path| -> Result<(), VolumeError> {
            std::fs::create_dir_all(dir).map_err(|e| refused(format!("making {}: {e}", dir.display())))
        };
        let dir = self.volumes.join(&run.uid).join(name);
        if vol.get("emptyDir").is_some_and(|v| !v.is_null()) {
            fresh(&dir)?;
            return Ok((own(&dir)?, false));
        }
        if let Some(d) = vol.get("downwardAPI").filter(|v| !v.is_null()) {
            fresh(&dir)?;
            let dir = std::fs::canonicalize(&dir).map_err(|e| refused(format!("{}: {e}", dir.display())))?;
            let items = downward_items(d).map_err(refused)?;
            write_downward(&dir, &items, pod).map_err(refused)?;
            run.downward
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((dir.clone(), items));
            return Ok((dir, true));
        }
        if let Some(claim) = vol.get("persistentVolumeClaim").filter(|v| !v.is_null()) {
            let claim_name = claim["claimName"].as_str().unwrap_or("");
            let processing =
                |why: &str| VolumeError::Retry(format!("error processing PVC {}/{claim_name}: {why}", run.namespace));
            match store.get(Kind::PersistentVolumeClaim, &run.namespace, claim_name) {
                None => {
                    return Err(processing(&format!(
                        "failed to fetch PVC from API server: persistentvolumeclaims {claim_name:?} not found"
                    )));
                }
                Some(pvc) if pvc["metadata"]["deletionTimestamp"].is_string() => {
                    return Err(processing("PVC is being deleted"));
                }
                Some(_) => {}
            }
            let dir = storage::claim_dir(&self.volumes, &run.namespace, claim_name);
            for parent in [dir.parent().and_then(Path::parent), dir.parent()]
                .into_iter()
                .flatten()
            {
                if !parent.exists() {
                    fresh(parent)?;
                    // The box's user need not list the claims, only reach its own.
                    let _ = std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o711));
                }
            }
            fresh(&dir)?;
            return Ok((own(&dir)?, claim["readOnly"].as_bool().unwrap_or(false)));
        }
        if let Some(src) = vol.get("secret").filter(|v| !v.is_null()) {
            self.secret_volume(store, run, &dir, src).map_err(|e| match e {
                VolumeError::Retry(why) => set_up(why),
                refused => refused,
            })?;
            return Ok((own(&dir)?, true));
        }
        if let Some(h) = vol.get("hostPath").filter(|v| !v.is_null()) {
            let path = h["path"].as_str().unwrap_or("");
            let kind = h["type"].as_str().unwrap_or("");
            return host_path(path, kind).map(|p| (p, false)).map_err(|e| match e {
                VolumeError::Retry(why) => set_up(why),
                VolumeError::Refused(why) => refused(format!("volume {name:?}: {why}")),
            });
        }
        let kind = vol
            .as_object()
            .and_then(|o| o.keys().find(|k| *k != "name").cloned())
            .unwrap_or_else(|| "(none)".into());
        Err(refused(format!(
            "volume {name:?}: the fake's kubelet mounts emptyDir, downwardAPI, persistentVolumeClaim, secret and hostPath volumes only, not {kind}"
        )))
    }

    /// A secret volume's files, written afresh into `dir`: every key, or `items` (key to
    /// path, each with its mode or the volume's `defaultMode`), owned by the box's user, so a
    /// mode such as 0400 leaves them readable to the box's root as to a container's.
    fn secret_volume(&self, store: &Store, run: &PodRun, dir: &Path, src: &Value) -> Result<(), VolumeError> {
        let refused = VolumeError::Refused;
        let secret_name = src["secretName"].as_str().unwrap_or("");
        let optional = src["optional"].as_bool().unwrap_or(false);
        let default_mode = src["defaultMode"].as_u64().unwrap_or(0o644) as u32;
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|e| refused(format!("emptying {}: {e}", dir.display())))?;
        }
        std::fs::create_dir_all(dir).map_err(|e| refused(format!("making {}: {e}", dir.display())))?;
        let Some(secret) = store.get(Kind::Secret, &run.namespace, secret_name) else {
            if optional {
                return Ok(());
            }
            return Err(VolumeError::Retry(format!("secret {secret_name:?} not found")));
        };
        let files: Vec<(String, String, u32)> = match src["items"].as_array().filter(|a| !a.is_empty()) {
            None => storage::secret_keys(&secret)
                .into_iter()
                .map(|k| (k.clone(), k, default_mode))
                .collect(),
            Some(items) => items
                .iter()
                .map(|i| {
                    (
                        i["key"].as_str().unwrap_or("").to_string(),
                        i["path"].as_str().unwrap_or("").to_string(),
                        i["mode"].as_u64().map_or(default_mode, |m| m as u32),
                    )
                })
                .collect(),
        };
        for (key, path, mode) in files {
            let Some(value) = storage::secret_value(&secret, &key) else {
                if optional {
                    continue;
                }
                return Err(VolumeError::Retry(format!("references non-existent secret key: {key}")));
            };
            if path.is_empty() || path.starts_with('/') || path.split('/').any(|p| p == ".." || p.is_empty()) {
                return Err(refused(format!(
                    "secret {secret_name:?}: item path {path:?}: a relative path without '..'"
                )));
            }
            let to = dir.join(&path);
            let mut parent = to.parent();
            while let Some(p) = parent.filter(|p| *p != dir) {
                std::fs::create_dir_all(p).map_err(|e| refused(format!("{}: {e}", p.display())))?;
                let _ = std::os::unix::fs::chown(p, Some(self.box_ids.0), Some(self.box_ids.1));
                parent = p.parent();
            }
            std::fs::write(&to, &value).map_err(|e| refused(format!("{}: {e}", to.display())))?;
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode & 0o777))
                .map_err(|e| refused(format!("{}: {e}", to.display())))?;
            std::os::unix::fs::chown(&to, Some(self.box_ids.0), Some(self.box_ids.1))
                .map_err(|e| refused(format!("giving the box {}: {e}", to.display())))?;
        }
        Ok(())
    }
}

/// A hostPath checked (and made) as the kubelet's type check does, canonical for the bind:
/// `Retry` with the kubelet's words for a check that fails, `Refused` for what the fake
/// cannot bind.
fn host_path(path: &str, kind: &str) -> Result<PathBuf, VolumeError> {
    use std::os::unix::fs::FileTypeExt;
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(VolumeError::Refused(format!(
            "hostPath.path {path:?}: the fake's kubelet binds absolute paths only"
        )));
    }
    let failed = |what: &str| VolumeError::Retry(format!("hostPath type check failed: {path} is not {what}"));
    let meta = std::fs::metadata(p).ok();
    match kind {
        // containerd makes a missing bind source a directory; so does DirectoryOrCreate.
        "" | "DirectoryOrCreate" if meta.is_none() => {
            std::fs::create_dir_all(p).map_err(|e| VolumeError::Retry(format!("mkdir {path}: {e}")))?;
        }
        "" => {}
        "DirectoryOrCreate" | "Directory" => {
            if !meta.as_ref().is_some_and(|m| m.is_dir()) {
                return Err(failed("a directory"));
            }
        }
        // The parent is not made: a kubelet's FileOrCreate does not make it either.
        "FileOrCreate" if meta.is_none() => {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o644)
                .open(p)
                .map_err(|e| VolumeError::Retry(format!("open {path}: {e}")))?;
        }
        "FileOrCreate" | "File" => {
            if !meta.as_ref().is_some_and(|m| m.is_file()) {
                return Err(failed("a file"));
            }
        }
        "Socket" => {
            if !meta.as_ref().is_some_and(|m| m.file_type().is_socket()) {
                return Err(failed("a socket file"));
            }
        }
        other => {
            return Err(VolumeError::Refused(format!(
                "hostPath type {other:?} is not supported by the fake's kubelet (\"\", Directory, DirectoryOrCreate, File, FileOrCreate, Socket): a box's mounts are nodev, so a device would not open"
            )));
        }
    }
    std::fs::canonicalize(p).map_err(|e| VolumeError::Retry(format!("{path}: {e}")))
}

/// Wait until the scheduler would place the pod: every claim it names there, Bound and not
/// being deleted. Until then the pod stays Pending with the scheduler's condition.
async fn schedule(store: &Store, run: &PodRun) {
    let mut said = String::new();
    loop {
        let Some(pod) = store
            .get(Kind::Pod, &run.namespace, &run.name)
            .filter(|p| p["metadata"]["uid"] == run.uid.as_str())
        else {
            // Deleted: its stop comes.
            return std::future::pending().await;
        };
        let Some(why) = unschedulable(store, &pod) else {
            return;
        };
        if why != said {
            let message = format!(
                "0/1 nodes are available: {why}. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
            );
            tracing::info!(pod = %run.name, message, "pod unschedulable");
            let now = now_rfc3339();
            set_status(store, run, |pod| {
                let mut c = condition("PodScheduled", false, &now, Some("Unschedulable"));
                c["message"] = json!(message);
                pod["status"]["phase"] = json!("Pending");
                pod["status"]["conditions"] = json!([c]);
            });
            said = why;
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// What the scheduler's VolumeBinding plugin says of the pod's claims, if one keeps it from
/// any node.
fn unschedulable(store: &Store, pod: &Value) -> Option<String> {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
    for v in pod["spec"]["volumes"].as_array().into_iter().flatten() {
        let Some(claim) = v["persistentVolumeClaim"]["claimName"].as_str() else {
            continue;
        };
        match store.get(Kind::PersistentVolumeClaim, ns, claim) {
            None => return Some(format!("persistentvolumeclaim {claim:?} not found")),
            Some(pvc) if pvc["metadata"]["deletionTimestamp"].is_string() => {
                return Some(format!("persistentvolumeclaim {claim:?} is being deleted"));
            }
            Some(pvc) if pvc["status"]["phase"] != "Bound" => {
                return Some("pod has unbound immediate PersistentVolumeClaims".into());
            }
            Some(_) => {}
        }
    }
    None
}

async fn pending() -> End {
    std::future::pending::<()>().await;
    End::Never
}

/// Destroy the run's box if it has one; whether it had.
async fn end_box(run: &PodRun) -> bool {
    let Some(b) = run.take_sandbox() else {
        return false;
    };
    let ctx = Ctx::background().with_timeout(Duration::from_secs(10));
    if let Err(e) = b.destroy(&ctx).await {
        tracing::warn!(pod = %run.name, error = %e, "ending a pod's box");
    }
    true
}

/// Change the pod's status, if it is still this run's pod; the pod as changed.
fn set_status<F: FnOnce(&mut Value)>(store: &Store, run: &PodRun, f: F) -> Option<Value> {
    store
        .update(Kind::Pod, &run.namespace, &run.name, Some(&run.uid), |old| {
            let mut new = old.clone();
            f(&mut new);
            Ok(new)
        })
        .ok()
}

fn condition(kind: &str, ok: bool, now: &str, reason: Option<&str>) -> Value {
    let mut c = json!({
        "type": kind,
        "status": if ok { "True" } else { "False" },
        "lastProbeTime": null,
        "lastTransitionTime": now,
    });
    if let Some(r) = reason {
        c["reason"] = json!(r);
    }
    c
}

fn not_ready(st: &mut Value, now: &str, reason: &str) {
    if let Some(cs) = st["conditions"].as_array_mut() {
        for c in cs {
            if matches!(
                c["type"].as_str(),
                Some("Ready" | "ContainersReady" | "PodReadyToStartContainers")
            ) {
                c["status"] = json!("False");
                c["lastTransitionTime"] = json!(now);
                c["reason"] = json!(reason);
            }
        }
    }
}

fn terminate(st: &mut Value, code: i32, reason: &str, now: &str) {
    let cs = &mut st["containerStatuses"][0];
    let started = cs["state"]["running"]["startedAt"].clone();
    cs["state"] = json!({"terminated": {
        "exitCode": code,
        "reason": reason,
        "startedAt": started,
        "finishedAt": now,
        "containerID": cs["containerID"],
    }});
    cs["ready"] = json!(false);
    cs["started"] = json!(false);
}

fn qos_class(c: &Value) -> &'static str {
    let r = &c["resources"];
    let empty = |v: &Value| v.as_object().is_none_or(|m| m.is_empty());
    if empty(&r["limits"]) && empty(&r["requests"]) {
        "BestEffort"
    } else if !empty(&r["limits"])
        && ["cpu", "memory"].iter().all(|k| r["limits"].get(*k).is_some())
        && (empty(&r["requests"]) || r["requests"] == r["limits"])
    {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// The kubelet's refusal of `runAsNonRoot: true` where the container would run as root.
fn non_root_refusal(pod: &Value, c: &Value, name: &str, ns: &str, uid: &str) -> Option<String> {
    let pick = |k: &str| {
        c["securityContext"]
            .get(k)
            .filter(|v| !v.is_null())
            .or_else(|| pod["spec"]["securityContext"].get(k).filter(|v| !v.is_null()))
            .cloned()
    };
    if pick("runAsNonRoot").and_then(|v| v.as_bool()) != Some(true) {
        return None;
    }
    let who = format!(
        "(pod: \"{name}_{ns}({uid})\", container: {})",
        c["name"].as_str().unwrap_or("")
    );
    match pick("runAsUser").and_then(|v| v.as_i64()) {
        None => Some(format!("container has runAsNonRoot and image will run as root {who}")),
        Some(0) => Some(format!("container's runAsUser breaks non-root policy {who}")),
        Some(_) => None,
    }
}

/// A fieldRef's value: what both env and downwardAPI files read.
fn field_ref(path: &str, pod: &Value) -> Result<String, String> {
    let meta = &pod["metadata"];
    let map = |m: &Value| -> String {
        // As the kubelet writes them: `key="value"` lines, sorted, values quoted as Go's %q.
        let mut lines: Vec<String> = m
            .as_object()
            .map(|o| {
                o.iter()
                    .map(|(k, v)| format!("{k}={:?}", v.as_str().unwrap_or("")))
                    .collect()
            })
            .unwrap_or_default();
        lines.sort();
        lines.join("\n")
    };
    let keyed = |prefix: &str| -> Option<String> {
        path.strip_prefix(prefix)
            .and_then(|r| r.strip_prefix("['"))
            .and_then(|r| r.strip_suffix("']"))
            .map(str::to_string)
    };
    Ok(match path {
        "metadata.name" => meta["name"].as_str().unwrap_or("").to_string(),
        "metadata.namespace" => meta["namespace"].as_str().unwrap_or("").to_string(),
        "metadata.uid" => meta["uid"].as_str().unwrap_or("").to_string(),
        "metadata.labels" => map(&meta["labels"]),
        "metadata.annotations" => map(&meta["annotations"]),
        "spec.nodeName" => NODE.to_string(),
        "spec.serviceAccountName" => pod["spec"]["serviceAccountName"].as_str().unwrap_or("").to_string(),
        "status.podIP" | "status.hostIP" => "127.0.0.1".to_string(),
        p => {
            if let Some(k) = keyed("metadata.labels") {
                meta["labels"][k.as_str()].as_str().unwrap_or("").to_string()
            } else if let Some(k) = keyed("metadata.annotations") {
                meta["annotations"][k.as_str()].as_str().unwrap_or("").to_string()
            } else {
                return Err(format!("fieldRef {p:?} is not supported by the fake's kubelet"));
            }
        }
    })
}

/// The container's environment, values resolved.
fn env_of(c: &Value, pod: &Value) -> Result<BTreeMap<String, String>, String> {
    let mut env = BTreeMap::new();
    for e in c["env"].as_array().cloned().unwrap_or_default() {
        let name = e["name"].as_str().unwrap_or("").to_string();
        let value = match e.get("valueFrom").filter(|v| !v.is_null()) {
            None => e["value"].as_str().unwrap_or("").to_string(),
            Some(from) => match from.pointer("/fieldRef/fieldPath").and_then(Value::as_str) {
                Some(path) => field_ref(path, pod)?,
                None => {
                    let kind = from
                        .as_object()
                        .and_then(|o| o.keys().next().cloned())
                        .unwrap_or_default();
                    return Err(format!(
                        "env {name:?}: valueFrom {kind} is not supported by the fake's kubelet (fieldRef only)"
                    ));
                }
            },
        };
        env.insert(name, value);
    }
    Ok(env)
}

fn downward_items(d: &Value) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (i, item) in d["items"].as_array().cloned().unwrap_or_default().iter().enumerate() {
        let path = item["path"].as_str().unwrap_or("");
        if path.is_empty() || path.starts_with('/') || path.split('/').any(|c| c == ".." || c.is_empty()) {
            return Err(format!(
                "downwardAPI items[{i}].path {path:?}: a relative path without '..'"
            ));
        }
        let Some(field) = item.pointer("/fieldRef/fieldPath").and_then(Value::as_str) else {
            return Err(format!(
                "downwardAPI items[{i}]: only fieldRef items are supported by the fake's kubelet"
            ));
        };
        out.push((path.to_string(), field.to_string()));
    }
    Ok(out)
}

/// Write (or rewrite) a downwardAPI volume's files: each to a temporary name, then renamed,
/// so a program reading one sees the old value or the new, never half of one.
fn write_downward(dir: &Path, items: &[(String, String)], pod: &Value) -> Result<(), String> {
    for (path, field) in items {
        let value = field_ref(field, pod)?;
        let to = dir.join(path);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        let tmp = dir.join(format!(".{}.tmp", path.replace('/', "_")));
        std::fs::write(&tmp, value.as_bytes()).map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &to).map_err(|e| format!("{}: {e}", to.display()))?;
    }
    Ok(())
}

/// Whether the NetworkPolicies of the pod's namespace that select it deny all its egress:
/// at least one has `Egress` in its policyTypes, and none of those allows any egress.
fn denies_egress(store: &Store, pod: &Value) -> bool {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
    let labels = labels_of(pod);
    let policies = store.lock().objects(Kind::NetworkPolicy, Some(ns));
    let mut egress_policies = 0;
    for np in policies {
        let Ok(sel) = LabelSelector::from_object(&np["spec"]["podSelector"]) else {
            continue;
        };
        if !sel.matches(&labels) {
            continue;
        }
        let types: Vec<&str> = np["spec"]["policyTypes"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        // Without policyTypes, Egress is implied only when the policy has egress rules.
        let has_rules = np["spec"]["egress"].as_array().is_some_and(|a| !a.is_empty());
        let egress = types.contains(&"Egress") || (types.is_empty() && has_rules);
        if !egress {
            continue;
        }
        if has_rules {
            tracing::warn!(
                pod = pod["metadata"]["name"].as_str().unwrap_or(""),
                policy = np["metadata"]["name"].as_str().unwrap_or(""),
                "a NetworkPolicy allows some egress: the fake enforces deny-all only, so this pod's network is open"
            );
            return false;
        }
        egress_policies += 1;
    }
    egress_policies > 0
}

//! The pod a box is, and what a pod says back: the manifest made from a spec, and the facts,
//! status and labels read from the object the API server holds.
//!
//! Everything a box promises is in the manifest, so a reader of `kubectl get pod -o yaml`
//! sees what the box is: `restartPolicy: Never` (a pod is one life), no service-account token
//! and no service links, a non-root user with every capability dropped, no privilege
//! escalation, seccomp `RuntimeDefault`, a read-only root with emptyDirs for the workspace,
//! the home, `/tmp` and the runner's directory, and the deadline as an annotation the first
//! process reads through a downward-API file (see [`LIFETIME`]).

use std::collections::BTreeMap;

use agentbox_core::{Error, Facts, Labels, NetworkFact, PortFact, PortKind, Result, Spec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, DownwardAPIVolumeFile, DownwardAPIVolumeSource, EmptyDirVolumeSource,
    EnvVar, ObjectFieldSelector, Pod, PodSecurityContext, PodSpec, ResourceRequirements, SeccompProfile,
    SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{KubeOptions, agent_sandbox};

/// The label every box's pod carries: list and attach see only those.
pub(super) const LABEL_PROVIDER: &str = "agentbox.provider";
/// The box's own key, which its network policy selects.
pub(super) const LABEL_BOX: &str = "agentbox.box";
/// Where a claimed pod's labels are: agent-sandbox lets a SandboxClaim add pod labels only
/// in its allowed domain (`sandbox.users.io` by default), so a claim pool's box carries its
/// key and the host's labels under it.
pub(super) const CLAIMED: &str = "sandbox.users.io/";
/// The name a box was opened by.
pub(super) const LABEL_NAME: &str = "agentbox.name";
/// When the first process ends the box, in ms since the epoch (an annotation).
pub(super) const ANNOTATION_ENDS_AT: &str = "agentbox.ends-at-ms";
/// The spec's GPU, the runner's presence and the network asked for (annotations), so a box
/// found again by id states what it was made with.
pub(super) const ANNOTATION_GPU: &str = "agentbox.gpu";
pub(super) const ANNOTATION_RUNNER: &str = "agentbox.runner";
pub(super) const ANNOTATION_NETWORK: &str = "agentbox.network";
/// `true` on a warm pool's pods: the first process waits for a deadline a claim gives.
pub(super) const ANNOTATION_WARM: &str = "agentbox.warm";
/// The container's name.
pub(super) const CONTAINER: &str = "box";
// Every mount point is a top-level directory: an image with a read-only root need not have
// it, since a new top-level directory is the one kind every runtime (and the fake's namespace
// boxes) can make.
/// Where the deadline file is mounted (downward API, read-only).
pub(super) const DEADLINE_DIR: &str = "/agentbox-deadline";
/// The runner's directory (an emptyDir): its binary and its socket.
pub(super) const RUNNER_DIR: &str = "/agentbox";
/// The home directory (an emptyDir).
pub(super) const HOME: &str = "/home";

/// The pod's first process: it ends the box at the deadline it reads (again every second)
/// from the downward-API file of the pod's annotation, so an extend is one patch of that
/// annotation. A file that cannot be read or holds anything but a number ends the box: it
/// fails closed. An empty one on a warm pool's pod (`agentbox.warm`) is a deadline no claim has
/// yet given: it waits, bounded by `activeDeadlineSeconds`, the cluster's backstop should this process be
/// stopped too.
pub(super) const LIFETIME: &str = r#"trap 'exit 0' TERM INT
while :; do
  end=$(cat /agentbox-deadline/ends-at-ms 2>/dev/null) || exit 0
  case $end in
    '') [ "$(cat /agentbox-deadline/warm 2>/dev/null)" = true ] || exit 0 ;;
    *[!0-9]*) exit 0 ;;
    *) [ "$(date +%s)" -lt $(( (end + 999) / 1000 )) ] || exit 0 ;;
  esac
  sleep 1 & wait $!
done"#;

/// The pod for a box named `pod` (key `key`) of `spec`, ending at `ends_at_ms`.
pub(super) fn manifest(
    opts: &KubeOptions,
    pod: &str,
    key: &str,
    name: Option<&str>,
    spec: &Spec,
    ends_at_ms: u64,
    runner: bool,
) -> Result<Pod> {
    let mut labels: BTreeMap<String, String> = spec.labels.clone();
    labels.insert(LABEL_PROVIDER.into(), super::NAME.into());
    labels.insert(LABEL_BOX.into(), key.into());
    if let Some(n) = name {
        labels.insert(LABEL_NAME.into(), n.into());
    }
    let mut annotations = BTreeMap::new();
    annotations.insert(ANNOTATION_ENDS_AT.to_string(), ends_at_ms.to_string());
    annotations.insert(ANNOTATION_RUNNER.to_string(), runner.to_string());
    annotations.insert(
        ANNOTATION_NETWORK.to_string(),
        if matches!(spec.network, Some(agentbox_core::Network::None)) {
            "none"
        } else {
            "open"
        }
        .into(),
    );
    if let Some(g) = &spec.gpu {
        annotations.insert(ANNOTATION_GPU.to_string(), g.clone());
    }

    let mut env = vec![
        EnvVar {
            name: "HOME".into(),
            value: Some(HOME.into()),
            ..Default::default()
        },
        EnvVar {
            name: "PATH".into(),
            value: Some(super::DEFAULT_PATH.into()),
            ..Default::default()
        },
    ];
    for (k, v) in &spec.env {
        env.retain(|e| &e.name != k);
        env.push(EnvVar {
            name: k.clone(),
            value: Some(v.clone()),
            ..Default::default()
        });
    }

    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    if let Some(c) = spec.cpus.or(opts.cpus) {
        let q = Quantity(format!("{}m", (c * 1000.0).ceil() as u64));
        requests.insert("cpu".to_string(), q.clone());
        limits.insert("cpu".to_string(), q);
    }
    if let Some(m) = spec.memory_mb.or(opts.memory_mb) {
        let q = Quantity(format!("{m}Mi"));
        requests.insert("memory".to_string(), q.clone());
        limits.insert("memory".to_string(), q);
    }
    let mut node_selector = None;
    let mut tolerations = None;
    if let Some(g) = &spec.gpu {
        limits.insert("nvidia.com/gpu".to_string(), Quantity("1".into()));
        let mut sel = opts.gpu_node_selector.clone();
        if g != "any" {
            sel.insert(opts.gpu_label.clone(), g.clone());
        }
        node_selector = (!sel.is_empty()).then_some(sel);
        tolerations = Some(vec![Toleration {
            key: Some("nvidia.com/gpu".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }]);
    }

    let empty = |n: &str| Volume {
        name: n.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    };
    let mount = |n: &str, at: &str, read_only: bool| VolumeMount {
        name: n.into(),
        mount_path: at.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    };
    let workspace = spec.workspace.clone().unwrap_or_else(|| opts.workspace.clone());
    let volumes = vec![
        empty("workspace"),
        empty("home"),
        empty("tmp"),
        empty("runner"),
        Volume {
            name: "deadline".into(),
            downward_api: Some(DownwardAPIVolumeSource {
                items: Some(vec![
                    DownwardAPIVolumeFile {
                        path: "ends-at-ms".into(),
                        field_ref: Some(ObjectFieldSelector {
                            field_path: format!("metadata.annotations['{ANNOTATION_ENDS_AT}']"),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                    DownwardAPIVolumeFile {
                        path: "warm".into(),
                        field_ref: Some(ObjectFieldSelector {
                            field_path: format!("metadata.annotations['{ANNOTATION_WARM}']"),
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        },
    ];
    let mounts = vec![
        mount("workspace", &workspace, false),
        mount("home", HOME, false),
        mount("tmp", "/tmp", false),
        mount("runner", RUNNER_DIR, false),
        mount("deadline", DEADLINE_DIR, true),
    ];

    let container = Container {
        name: CONTAINER.into(),
        image: Some(spec.image.clone().unwrap_or_else(|| opts.image.clone())),
        image_pull_policy: opts.image_pull_policy.clone(),
        command: Some(vec!["/bin/sh".into(), "-c".into(), LIFETIME.into()]),
        working_dir: Some(workspace),
        env: Some(env),
        resources: (!requests.is_empty() || !limits.is_empty()).then(|| ResourceRequirements {
            requests: (!requests.is_empty()).then_some(requests),
            limits: (!limits.is_empty()).then_some(limits),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(opts.uid),
            run_as_group: Some(opts.uid),
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        ports: (!spec.ports.is_empty()).then(|| {
            spec.ports
                .iter()
                .map(|p| ContainerPort {
                    container_port: i32::from(p.port),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                })
                .collect()
        }),
        ..Default::default()
    };
    let lifetime = opts.max_lifetime.as_secs().max(1);
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(pod.into()),
            namespace: Some(opts.namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            active_deadline_seconds: Some(i64::try_from(lifetime).unwrap_or(i64::MAX)),
            termination_grace_period_seconds: Some(1),
            runtime_class_name: opts.runtime_class.clone(),
            node_selector,
            tolerations,
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(opts.uid),
                run_as_group: Some(opts.uid),
                fs_group: Some(opts.uid),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    localhost_profile: None,
                }),
                ..Default::default()
            }),
            containers: vec![container],
            volumes: Some(volumes),
            ..Default::default()
        }),
        status: None,
    })
}

/// Where a pod is in its life, as the box's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// Not yet running (scheduling, pulling the image, starting).
    Pending,
    /// Its container runs.
    Running,
    /// Ended (Succeeded, Failed, or being deleted).
    Ended,
}

/// The pod's phase; a pod being deleted has ended.
pub(super) fn phase(p: &Pod) -> Phase {
    if p.metadata.deletion_timestamp.is_some() {
        return Phase::Ended;
    }
    match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Running") => {
            // A container that has stopped while the pod still reads Running: ended.
            let stopped = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.name == CONTAINER))
                .and_then(|c| c.state.as_ref())
                .is_some_and(|s| s.terminated.is_some());
            if stopped { Phase::Ended } else { Phase::Running }
        }
        Some("Pending") | None => Phase::Pending,
        _ => Phase::Ended,
    }
}

/// Why a pending pod will not start, where its container says so (an image that cannot be
/// pulled, a configuration the kubelet refuses): such a pod never runs.
pub(super) fn stuck(p: &Pod) -> Option<String> {
    let cs = p.status.as_ref()?.container_statuses.as_ref()?;
    let c = cs.iter().find(|c| c.name == CONTAINER)?;
    let w = c.state.as_ref()?.waiting.as_ref()?;
    let reason = w.reason.as_deref()?;
    matches!(
        reason,
        "ErrImagePull"
            | "ImagePullBackOff"
            | "InvalidImageName"
            | "CreateContainerConfigError"
            | "CreateContainerError"
            | "RunContainerError"
    )
    .then(|| format!("{reason}: {}", w.message.as_deref().unwrap_or("")))
}

/// The host's labels of a pod: not in the providers' namespace nor agent-sandbox's own
/// domains; a claimed pod's under [`CLAIMED`], without it.
pub(super) fn host_labels(p: &Pod) -> Labels {
    let claimed = is_claimed(p);
    p.metadata
        .labels
        .iter()
        .flatten()
        .filter_map(|(k, v)| {
            let k = if claimed { k.strip_prefix(CLAIMED)? } else { k.as_str() };
            let system = k.starts_with("agents.x-k8s.io/") || k.starts_with("extensions.agents.x-k8s.io/");
            (!system && !agentbox_core::is_reserved_label(k)).then(|| (k.to_string(), v.clone()))
        })
        .collect()
}

/// Whether the pod is a claim pool's box (its key under [`CLAIMED`]).
pub(super) fn is_claimed(p: &Pod) -> bool {
    label(p, &format!("{CLAIMED}{LABEL_BOX}")).is_some()
}

/// The box's key: its own label, or a claimed pod's under [`CLAIMED`].
pub(super) fn box_key(p: &Pod) -> Option<&str> {
    label(p, LABEL_BOX).or_else(|| {
        p.metadata
            .labels
            .as_ref()?
            .iter()
            .find(|(k, _)| k.strip_prefix(CLAIMED) == Some(LABEL_BOX))
            .map(|(_, v)| v.as_str())
    })
}

/// An annotation of the pod's.
pub(super) fn annotation<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
    p.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// A label of the pod's.
pub(super) fn label<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
    p.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// When the box ends: the earlier of its deadline annotation and the pod's
/// `activeDeadlineSeconds` counted from its start. Absent annotation: unknown (`None`).
pub(super) fn ends_at_ms(p: &Pod) -> Option<u64> {
    let own: u64 = annotation(p, ANNOTATION_ENDS_AT)?.parse().ok()?;
    let backstop = started_at_ms(p)
        .zip(p.spec.as_ref().and_then(|s| s.active_deadline_seconds))
        .map(|(start, ads)| start.saturating_add(u64::try_from(ads).unwrap_or(0).saturating_mul(1000)));
    Some(backstop.map_or(own, |b| b.min(own)))
}

/// When the pod started (`status.startTime`), in ms since the epoch.
pub(super) fn started_at_ms(p: &Pod) -> Option<u64> {
    let t = p.status.as_ref()?.start_time.as_ref()?;
    u64::try_from(t.0.as_millisecond()).ok()
}

/// The facts of a box from its pod as the API server holds it: every security fact is read
/// from the object the cluster accepted, never from what this host meant to send, and absent
/// where the object does not say it (fail closed). `network` is `requested` (unverified)
/// until the caller's probe says more.
pub(super) fn facts(p: &Pod, runtime_probe: Option<NetworkFact>) -> Facts {
    let spec = p.spec.as_ref();
    let c = spec.and_then(|s| s.containers.iter().find(|c| c.name == CONTAINER));
    let sc = c.and_then(|c| c.security_context.as_ref());
    let psc = spec.and_then(|s| s.security_context.as_ref());
    let dropped_all = sc.and_then(|s| s.capabilities.as_ref()).is_some_and(|caps| {
        caps.drop.iter().flatten().any(|d| d == "ALL") && caps.add.as_ref().is_none_or(|a| a.is_empty())
    });
    let seccomp = sc
        .and_then(|s| s.seccomp_profile.as_ref())
        .or_else(|| psc.and_then(|s| s.seccomp_profile.as_ref()))
        .map(|p| p.type_.clone());
    let read_only = sc.and_then(|s| s.read_only_root_filesystem) == Some(true);
    let no_escalation = sc.and_then(|s| s.allow_privilege_escalation) == Some(false);
    let limits = c.and_then(|c| c.resources.as_ref()).and_then(|r| r.limits.as_ref());
    let cpus = limits.and_then(|l| l.get("cpu")).and_then(|q| parse_cpu(&q.0));
    let memory_mb = limits.and_then(|l| l.get("memory")).and_then(|q| parse_memory_mb(&q.0));
    let runtime_class = spec.and_then(|s| s.runtime_class_name.clone());
    let isolation = isolation_of(runtime_class.as_deref());
    let mut limits_fact = BTreeMap::new();
    if let Some(c) = cpus {
        limits_fact.insert("cpu".to_string(), format!("pod limit {c}"));
    }
    if let Some(m) = memory_mb {
        limits_fact.insert("memory".to_string(), format!("pod limit {m} MiB"));
    }
    if let Some(rc) = &runtime_class {
        limits_fact.insert("runtime_class".to_string(), rc.clone());
    }
    Facts {
        provider: super::NAME.into(),
        isolation,
        cpus,
        memory_mb,
        gpu: annotation(p, ANNOTATION_GPU).map(String::from),
        network: runtime_probe.or_else(|| match annotation(p, ANNOTATION_NETWORK) {
            Some("open") => Some(NetworkFact::Open),
            _ => None,
        }),
        started_at_ms: started_at_ms(p),
        ends_at_ms: ends_at_ms(p),
        live_processes: true,
        name: label(p, LABEL_NAME).map(String::from),
        workspace: c.and_then(|c| c.working_dir.clone()),
        capabilities: dropped_all.then(|| "none".to_string()),
        no_new_privs: no_escalation.then_some(true),
        seccomp: seccomp.map(|s| s.to_ascii_lowercase().replace("runtimedefault", "runtime-default")),
        root: c.and_then(|c| c.image.clone()).map(|i| format!("image:{i}")),
        root_mode: read_only.then(|| "read-only".to_string()),
        limits: limits_fact,
        ..Default::default()
    }
}

/// A CPU quantity (`500m`, `2`, `1.5`) as CPUs.
pub(super) fn parse_cpu(q: &str) -> Option<f64> {
    match q.strip_suffix('m') {
        Some(m) => m.parse::<f64>().ok().map(|m| m / 1000.0),
        None => q.parse().ok(),
    }
}

/// A memory quantity (`512Mi`, `1Gi`, `1000000`, `1G`) in whole MiB.
pub(super) fn parse_memory_mb(q: &str) -> Option<u64> {
    let units: [(&str, f64); 8] = [
        ("Ki", 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("Ti", 1024.0_f64.powi(4)),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    let (n, mult) = units
        .iter()
        .find_map(|(s, m)| q.strip_suffix(s).map(|n| (n, *m)))
        .unwrap_or((q, 1.0));
    let bytes = n.parse::<f64>().ok()? * mult;
    (bytes.is_finite() && bytes >= 0.0).then(|| (bytes / (1024.0 * 1024.0)) as u64)
}

/// Check the host's labels against Kubernetes' label syntax, naming the one that breaks it:
/// they are the pod's labels, so list can select on them in the cluster.
pub(super) fn check_labels(labels: &Labels) -> Result<()> {
    for (k, v) in labels {
        let (prefix, name) = match k.rsplit_once('/') {
            Some((p, n)) => (Some(p), n),
            None => (None, k.as_str()),
        };
        if let Some(p) = prefix
            && (p.is_empty()
                || p.len() > 253
                || !p.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                }))
        {
            return Err(Error::invalid(format!(
                "label {k:?}: its prefix is not a DNS subdomain (Kubernetes label keys are [prefix/]name)"
            )));
        }
        if !label_part_ok(name, false) {
            return Err(Error::invalid(format!(
                "label {k:?}: a Kubernetes label name is 1 to 63 of A-Z a-z 0-9 - _ . beginning and ending \
                 with a letter or digit"
            )));
        }
        if !label_part_ok(v, true) {
            return Err(Error::invalid(format!(
                "label {k:?}: its value {v:?} is not a Kubernetes label value (at most 63 of A-Z a-z 0-9 - _ . \
                 beginning and ending with a letter or digit)"
            )));
        }
    }
    Ok(())
}

fn label_part_ok(s: &str, empty_ok: bool) -> bool {
    if s.is_empty() {
        return empty_ok;
    }
    let b = s.as_bytes();
    s.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// Whether an agent-sandbox Sandbox owns the pod.
pub(super) fn owned_by_sandbox(p: &Pod) -> bool {
    p.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "Sandbox" && o.api_version.starts_with(agent_sandbox::GROUP))
}

/// Every port is reached by port-forward: the facts name the spec's, as TCP.
pub(super) fn ports_of(p: &Pod) -> Vec<PortFact> {
    p.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .filter(|c| c.name == CONTAINER)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|cp| u16::try_from(cp.container_port).ok())
        .map(|port| PortFact {
            port,
            kind: PortKind::Tcp,
        })
        .collect()
}

pub(super) fn isolation_of(runtime_class: Option<&str>) -> String {
    match runtime_class {
        None => "container".into(),
        Some(rc) if rc.contains("gvisor") || rc == "runsc" => "gvisor".into(),
        Some(rc) if rc.contains("kata") => "vm".into(),
        Some(rc) => format!("runtime-class:{rc}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_as_the_api_writes_them() {
        assert_eq!(parse_cpu("500m"), Some(0.5));
        assert_eq!(parse_cpu("2"), Some(2.0));
        assert_eq!(parse_memory_mb("512Mi"), Some(512));
        assert_eq!(parse_memory_mb("1Gi"), Some(1024));
        assert_eq!(parse_memory_mb("1048576"), Some(1));
        assert_eq!(parse_memory_mb("lots"), None);
    }

    #[test]
    fn labels_kubernetes_would_refuse_are_refused_naming_the_label() {
        let ok: Labels = [("team".to_string(), "a-b.c_d".to_string())].into();
        check_labels(&ok).unwrap();
        for (k, v) in [
            ("team", "has space"),
            ("-x", "v"),
            ("k", "-v"),
            ("a/b/c", "v"),
            ("Bad_/x", "v"),
        ] {
            let l: Labels = [(k.to_string(), v.to_string())].into();
            let e = check_labels(&l).unwrap_err();
            assert!(e.message().contains(k), "{e}");
        }
        let long: Labels = [("k".to_string(), "v".repeat(64))].into();
        assert!(check_labels(&long).is_err());
    }

    #[test]
    fn a_gpu_spec_asks_for_one_gpu_on_a_node_of_its_model() {
        let opts = KubeOptions::default();
        let spec = Spec {
            gpu: Some("A100".into()),
            ..Spec::new(std::time::Duration::from_secs(60))
        };
        let pod = manifest(&opts, "agentbox-x", "x", None, &spec, 1, false).unwrap();
        let s = pod.spec.as_ref().unwrap();
        let limits = s.containers[0].resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert_eq!(limits["nvidia.com/gpu"].0, "1");
        assert_eq!(s.node_selector.as_ref().unwrap()["nvidia.com/gpu.product"], "A100");
        let t = &s.tolerations.as_ref().unwrap()[0];
        assert_eq!(
            (t.key.as_deref(), t.operator.as_deref()),
            (Some("nvidia.com/gpu"), Some("Exists"))
        );
        assert_eq!(facts(&pod, None).gpu.as_deref(), Some("A100"));
        // `any` asks for a GPU without choosing the node's model.
        let any = Spec {
            gpu: Some("any".into()),
            ..spec
        };
        let pod = manifest(&opts, "agentbox-x", "x", None, &any, 1, false).unwrap();
        assert!(pod.spec.unwrap().node_selector.is_none());
    }

    #[test]
    fn the_manifest_drops_every_privilege_and_the_facts_read_it_back() {
        let opts = KubeOptions::default();
        let spec = Spec::new(std::time::Duration::from_secs(60)).label("team", "a");
        let pod = manifest(&opts, "agentbox-x", "x", None, &spec, 1, false).unwrap();
        let s = pod.spec.as_ref().unwrap();
        assert_eq!(s.automount_service_account_token, Some(false));
        assert_eq!(s.enable_service_links, Some(false));
        assert_eq!(s.restart_policy.as_deref(), Some("Never"));
        let f = facts(&pod, None);
        assert_eq!(f.capabilities.as_deref(), Some("none"));
        assert_eq!(f.no_new_privs, Some(true));
        assert_eq!(f.root_mode.as_deref(), Some("read-only"));
        assert_eq!(f.seccomp.as_deref(), Some("runtime-default"));
        // A pod whose container lost its security context says nothing it cannot back.
        let mut bare = pod.clone();
        bare.spec.as_mut().unwrap().containers[0].security_context = None;
        let f = facts(&bare, None);
        assert_eq!(f.capabilities, None);
        assert_eq!(f.no_new_privs, None);
        assert_eq!(f.root_mode, None);
        assert_eq!(host_labels(&pod), [("team".to_string(), "a".to_string())].into());
    }
}

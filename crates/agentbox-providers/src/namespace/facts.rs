//! A namespace box's facts, read by the host from `/proc/<init>`: the kernel's word on the
//! box's init, whose locks every program of the box inherits. Nothing the box could write is
//! read. A lock that is missing fails the create rather than becoming a fact.

use agentbox_core::{Error, Facts, NetworkFact, Result, Spec};
use agentbox_protocol::namespace::{BoxConfig, Root, WORKSPACE};

use super::NAME;

/// The namespaces every box has of its own; `net` too for `network: none`.
const OWN: &[&str] = &["user", "mnt", "pid", "ipc", "uts", "cgroup"];

const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Why cpu and memory cannot be bounded here, as the end of a sentence.
pub(super) fn cgroup_v2_state() -> String {
    match rustix::fs::statfs("/sys/fs/cgroup") {
        #[allow(clippy::unnecessary_cast)] // f_type's width differs between architectures
        Ok(s) if s.f_type as i64 == CGROUP2_SUPER_MAGIC => {
            "this build does not yet place boxes in a delegated cgroup v2".into()
        }
        Ok(_) => "this machine's /sys/fs/cgroup is cgroup v1 (or a v1 and v2 hybrid), not a delegated cgroup v2".into(),
        Err(e) => format!("/sys/fs/cgroup cannot be read ({e})"),
    }
}

use agentbox_proc::{namespace_inode as ns_inode, status_field as field};

/// Read and check the facts of the box whose init is `init` (a pid of the host's).
#[allow(clippy::too_many_arguments)]
pub(super) fn measure(
    init: i32,
    cfg: &BoxConfig,
    spec: &Spec,
    started_at_ms: u64,
    ends_at_ms: u64,
    landlock: String,
    max_processes: u64,
) -> Result<Facts> {
    let pid = init.to_string();
    let status = agentbox_proc::status(&pid).ok_or_else(|| {
        Error::unknown(format!(
            "the box's init (pid {pid}) has no status: it ended as it started"
        ))
    })?;
    let mut missing = Vec::new();
    if field(&status, "NoNewPrivs") != Some("1") {
        missing.push("no_new_privs".to_string());
    }
    if field(&status, "Seccomp") != Some("2") {
        missing.push("a seccomp filter".into());
    }
    for cap in ["CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb"] {
        let v = field(&status, cap).and_then(|v| u64::from_str_radix(v, 16).ok());
        if v != Some(0) {
            missing.push(format!("{cap} 0 (it is {})", field(&status, cap).unwrap_or("unknown")));
        }
    }
    let mut namespaces = std::collections::BTreeMap::new();
    let mut wanted: Vec<&str> = OWN.to_vec();
    if cfg.network_none || cfg.egress.is_some() {
        wanted.push("net");
    }
    for n in wanted {
        match (ns_inode(&pid, n), ns_inode("self", n)) {
            (Some(b), Some(h)) if b != h => {
                namespaces.insert(n.to_string(), b);
            }
            _ => missing.push(format!("a {n} namespace of its own")),
        }
    }
    if !missing.is_empty() {
        return Err(Error::unknown(format!(
            "the namespace box is not hardened as it must be: its init lacks {}",
            missing.join(", ")
        )));
    }
    let uid_map = std::fs::read_to_string(format!("/proc/{pid}/uid_map"))
        .ok()
        .map(|m| m.split_whitespace().collect::<Vec<_>>().join(" "));
    let interfaces = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok().map(|t| {
        t.lines()
            .skip(2)
            .filter_map(|l| Some(l.split_once(':')?.0.trim().to_string()))
            .collect::<Vec<_>>()
    });
    let cgroup = cgroup_v2_state();
    let mut limits = std::collections::BTreeMap::new();
    limits.insert("processes".to_string(), format!("RLIMIT_NPROC {max_processes}"));
    limits.insert("cpus".into(), format!("unsupported: {cgroup}"));
    limits.insert("memory".into(), format!("unsupported: {cgroup}"));
    Ok(Facts {
        provider: NAME.into(),
        isolation: NAME.into(),
        pids_limit: Some(max_processes),
        // A way out through the egress proxy (an allowlist, or the default) is said only once a
        // probe from inside proved it (the provider's `prove_egress`); until then, asked and not
        // proven.
        network: Some(if cfg.network_none {
            NetworkFact::None
        } else if cfg.egress.is_some() {
            NetworkFact::Requested
        } else {
            NetworkFact::Host
        }),
        // With the host's network, a box's listener is this machine's: not a port the box
        // was given, and not none either. With a network of its own, the ports forwarded.
        ports: (cfg.network_none || cfg.egress.is_some()).then(|| {
            cfg.ports
                .iter()
                .map(|&port| agentbox_core::PortFact {
                    port,
                    kind: agentbox_core::PortKind::Tcp,
                })
                .collect()
        }),
        started_at_ms: Some(started_at_ms),
        ends_at_ms: Some(ends_at_ms),
        live_processes: true,
        // A sleep ends the box's programs and keeps its files; its init keeps the deadline.
        sleep: Some("files".into()),
        sleep_clock: Some("counting".into()),
        secrets_via: Some("fd".into()),
        workspace: Some(WORKSPACE.into()),
        mounts: spec.mounts.clone(),
        capabilities: Some("none".into()),
        no_new_privs: Some(true),
        seccomp: Some("agentbox".into()),
        root: Some(
            match cfg.root {
                Root::Host => "host",
                Root::Rootfs(_) => "rootfs",
            }
            .into(),
        ),
        root_mode: Some("read-only".into()),
        landlock: Some(landlock),
        namespaces,
        uid_map,
        interfaces,
        limits,
        ..Default::default()
    })
}

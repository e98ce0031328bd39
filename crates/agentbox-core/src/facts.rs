//! What a box really got, and readers that fail closed.
//!
//! Every fact beyond the provider and isolation is optional, and an absent fact never grants
//! anything: read them through [`Facts::fuse`], [`Facts::network`], [`Facts::no_port_exposed`]
//! and friends, which treat "absent" as "unknown" or "no", never "yes".

use serde::{Deserialize, Serialize};

use crate::spec::PortKind;

/// What a provider says, and where it matters measures, about one box.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Facts {
    /// The provider's name: `local`, `docker`...
    pub provider: String,
    /// The isolation the box has: `none`, `container`, `gvisor`, `vm`...
    pub isolation: String,
    /// CPUs the box got, where bounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Memory the box got in MiB, where bounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// At most this many processes, where bounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<u64>,
    /// The GPU model served, as measured in the box.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// The network the box has; absent is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkFact>,
    /// The exposed ports; absent is unknown, not none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<PortFact>>,
    /// FUSE works for root in the box; absent is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuse: Option<bool>,
    /// `kernel.yama.ptrace_scope` read in the box; absent is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptrace_scope: Option<i32>,
    /// Whole GiB of the workspace's file system; absent is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_gb: Option<u64>,
    /// When the box started, as milliseconds since the Unix epoch; absent is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_ms: Option<u64>,
    /// When the provider will end the box, as milliseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends_at_ms: Option<u64>,
    /// Programs keep running between calls and take stdin.
    pub live_processes: bool,
    /// The box's name, when it was opened by one (`Lifecycle::open`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What a sleep keeps: `files` (its programs end) or `frozen` (they are kept, stopped).
    /// Absent: the box cannot sleep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sleep: Option<String>,
    /// The lifetime's clock while the box sleeps: `counting` (a sleeping box still ends at its
    /// deadline, with no call from the host) or `paused`. Absent: the box cannot sleep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sleep_clock: Option<String>,
    /// The snapshot the box was made from, where it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// The provider bills the box by the exec call rather than by the second (an Archil exec
    /// box): a receipt counts its calls, and a per-second price is never applied to it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub billed_per_call: bool,
    /// How bulk data (a seed, a pull) moves to and from the box: `stream` through an exec's
    /// stdin and stdout, or `files` uploaded and downloaded whole where an exec takes no stdin
    /// (an Archil exec box). Absent: `stream`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bulk: Option<Bulk>,
    /// The longest one exec may run, where the provider bounds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_exec_ms: Option<u64>,
    /// How a secret can reach a program without touching argv, env or a file: `fd` when an
    /// exec's stdin is a real pipe. Absent: no such channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets_via: Option<String>,
    /// The secrets the box uses through its egress proxy, by name: each of these variables
    /// holds a placeholder, never the value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// The directory programs start in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// Bind mounts the box has.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<crate::spec::Mount>,
    /// Where the box's runner is, when its commands and files go through one (each a message
    /// rather than a process). Absent: no runner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<String>,
    /// The capabilities a box's programs hold: `none` (every one dropped), `docker-default`
    /// (the engine's default set, kept on request), or the provider's word for another set.
    /// Absent: unknown, which a caller must read as "may hold any".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<String>,
    /// No program of the box can gain privileges by exec (setuid binaries, file
    /// capabilities): `no_new_privs`. Absent: unknown, so not promised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_new_privs: Option<bool>,
    /// The seccomp profile the box's programs run under, by name (`agentbox`: the provider's
    /// own, with io_uring refused; `unconfined`: none). Absent: unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seccomp: Option<String>,
    /// The root file system the box sees: `host` (this machine's own, with people's homes and
    /// daemons' sockets masked), `rootfs` (a directory holding an unpacked image), or the
    /// provider's image. Absent: unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// How the root may change: `read-only`, `overlay` (writes kept apart from the image) or
    /// `writable`. Absent: unknown, so a caller must not count on it being read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_mode: Option<String>,
    /// Landlock as applied to the box's programs: `abi N`, or `none: why`. Absent: unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub landlock: Option<String>,
    /// The box's own namespaces by name (`user`, `mnt`, `pid`...), each with its inode as the
    /// host reads it. A name absent here is not known to be the box's own.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub namespaces: std::collections::BTreeMap<String, u64>,
    /// The uid map of the box's user namespace (`inside outside count`), as the host reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid_map: Option<String>,
    /// The network interfaces the box sees. Absent: unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interfaces: Option<Vec<String>>,
    /// Each resource bound and how it is held (`processes`: `RLIMIT_NPROC 1024`), or why it is
    /// not (`memory`: `unsupported: …`). A resource absent here is not bounded.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub limits: std::collections::BTreeMap<String, String>,
}

/// The network a box has, as its provider reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum NetworkFact {
    /// Unrestricted.
    Open,
    /// The internet, through agentbox's egress proxy on this machine: every public address,
    /// and never this machine, loopback, link-local (the metadata address) or private ranges.
    /// Said only once a program in the box reached the proxy and failed to connect past it.
    Public,
    /// This machine's own network, shared with the box (`network: host`): everything this
    /// machine reaches, its loopback services included.
    Host,
    /// No traffic.
    None,
    /// Only these hosts and CIDRs.
    Allowlist(Vec<String>),
    /// `none` was asked of the provider's platform (a Kubernetes NetworkPolicy, say) and not
    /// proven from inside the box: read as unknown, never as none.
    Requested,
}

/// An exposed port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PortFact {
    /// The port in the box.
    pub port: u16,
    /// How it is reached.
    pub kind: PortKind,
}

/// What the box's network is known to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KnownNetwork<'a> {
    /// The provider did not say: a caller that needs none or an allowlist must refuse the box.
    Unknown,
    /// Open.
    Open,
    /// None.
    None,
    /// An allowlist.
    Allowlist(&'a [String]),
}

impl Facts {
    /// FUSE is usable: true only when the provider measured it.
    ///
    /// ```
    /// let facts = agentbox_core::Facts::default();
    /// assert!(!facts.fuse());
    /// assert!(!facts.no_port_exposed());
    /// ```
    pub fn fuse(&self) -> bool {
        self.fuse == Some(true)
    }

    /// The network, with absent read as unknown.
    pub fn network(&self) -> KnownNetwork<'_> {
        match &self.network {
            None | Some(NetworkFact::Requested) => KnownNetwork::Unknown,
            Some(NetworkFact::Open | NetworkFact::Public | NetworkFact::Host) => KnownNetwork::Open,
            Some(NetworkFact::None) => KnownNetwork::None,
            Some(NetworkFact::Allowlist(l)) => KnownNetwork::Allowlist(l),
        }
    }

    /// True only for a port list that is known and empty.
    pub fn no_port_exposed(&self) -> bool {
        matches!(&self.ports, Some(p) if p.is_empty())
    }

    /// The ptrace scope, or `None` when unknown (never assume 1 or more).
    pub fn ptrace_scope(&self) -> Option<i32> {
        self.ptrace_scope
    }

    /// The disk size in GiB, or `None` when unknown.
    pub fn disk_gb(&self) -> Option<u64> {
        self.disk_gb
    }

    /// When the box started, or `None` when unknown (a receipt then uses the time the create
    /// call answered).
    pub fn started_at_ms(&self) -> Option<u64> {
        self.started_at_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_facts_grant_nothing() {
        let f = Facts::default();
        assert!(!f.fuse());
        assert_eq!(f.network(), KnownNetwork::Unknown);
        assert!(!f.no_port_exposed());
        assert_eq!(f.ptrace_scope(), None);
        assert_eq!(f.disk_gb(), None);
    }

    #[test]
    fn present_facts_are_read_as_given() {
        let f = Facts {
            fuse: Some(true),
            network: Some(NetworkFact::None),
            ports: Some(vec![]),
            ..Default::default()
        };
        assert!(f.fuse());
        assert_eq!(f.network(), KnownNetwork::None);
        assert!(f.no_port_exposed());
        let f = Facts {
            ports: Some(vec![PortFact {
                port: 1,
                kind: PortKind::Tcp,
            }]),
            ..Default::default()
        };
        assert!(!f.no_port_exposed());
    }
}

/// How bulk data moves to and from a box ([`Facts::bulk`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Bulk {
    /// One stream through an exec's stdin and stdout.
    #[default]
    Stream,
    /// A file uploaded, or made in the box and downloaded, whole.
    Files,
}

/// Where time comes from, so a test can move it by hand (the fake clock in
/// `agentbox-testing`) and everything else reads the system's.
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;

    /// Wait until the clock reads `at_ms` or later: the system's time by default; a clock a
    /// test moves by hand wakes when it is moved past it.
    fn sleep_until(&self, at_ms: u64) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        let left = at_ms.saturating_sub(self.now_ms());
        Box::pin(tokio::time::sleep(std::time::Duration::from_millis(left)))
    }
}

/// The system's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        now_ms()
    }
}

/// The system's time in milliseconds since the Unix epoch (0 for a clock set before it): the
/// one place every crate reads it from where no [`Clock`] is passed in.
///
/// ```
/// assert!(agentbox_core::now_ms() > 1_700_000_000_000);
/// ```
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

//! What the host tells the in-box program that builds a namespace box, and what it answers.
//!
//! The host writes a [`BoxConfig`] as JSON into the box's directory, then starts
//! `agentbox-runner namespace DIR`. That process (the *keeper*) unshares the namespaces and
//! says [`UNSHARED`] on its stdout; the host, still outside, writes the keeper's uid and gid
//! maps and answers [`MAPPED`] on its stdin (a root host maps the box's root to another id,
//! which takes CAP_SETUID in the host's namespace, given up by the keeper when it unshared; an
//! unprivileged host, which may map only its own ids, goes the same way). The keeper then starts
//! the box's init, says [`INIT_PREFIX`] with the init's pid as the host sees it, and waits
//! for the init to end (the host removes the box's directory). The init builds the box's file system,
//! hardens itself, starts the runner and says [`READY_PREFIX`]; any step that fails says
//! [`ERROR_PREFIX`] with why, and the box is not made.
//!
//! Every line is one line of text; nothing a box's program writes can reach this channel, which
//! is closed before the first of them starts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The config's file name in the box's directory.
pub const CONFIG_FILE: &str = "box.json";

/// The keeper has unshared its namespaces and waits for its id maps.
pub const UNSHARED: &str = "unshared";
/// The host has written the maps (the host's line on the keeper's stdin).
pub const MAPPED: &str = "mapped";
/// `init PID`: the box's init runs, with this pid in the host's pid namespace.
pub const INIT_PREFIX: &str = "init ";
/// `ready LANDLOCK`: the runner listens; LANDLOCK is `abi N` or `none: why`.
pub const READY_PREFIX: &str = "ready ";
/// `error WHY`: the box could not be made.
pub const ERROR_PREFIX: &str = "error ";

/// Where the workspace is, in every namespace box.
pub const WORKSPACE: &str = "/workspace";
/// The box's home (its user is root in its own user namespace, holding no capability).
pub const HOME: &str = "/root";
/// The runner's directory in the box: its socket, bound from the box's directory on the host.
pub const RUN_DIR: &str = "/run/agentbox";
/// The runner binary in the box, bound read-only from the host's.
pub const RUNNER: &str = "/run/agentbox-runner";
/// The runner's socket's name in [`RUN_DIR`].
pub const SOCKET: &str = "runner.sock";
/// The egress proxy's socket's name in [`RUN_DIR`] (and in the box directory's `run/` on the
/// host, where the proxy binds it).
pub const EGRESS_SOCKET: &str = "egress.sock";
/// The egress proxy's refusals, one JSON line each, in the box's directory on the host (not
/// bound into the box).
pub const EGRESS_LOG: &str = "egress.log";
/// What the egress proxy says on its stdout once it listens.
pub const EGRESS_READY: &str = "egress ready";
/// The certificate of the box's own authority, beside [`EGRESS_SOCKET`]: written by a proxy
/// holding secrets (whose key never leaves it), trusted by the box.
pub const EGRESS_CA: &str = "egress-ca.pem";
/// The bundle the box's TLS clients are pointed at (`SSL_CERT_FILE` and its kin), in
/// [`RUN_DIR`]: the box's own roots and [`EGRESS_CA`], written by `agentbox-runner trust`.
pub const CA_BUNDLE: &str = "ca-bundle.pem";
/// The init's control socket in the box's directory on the host (not bound into the box):
/// one [`crate::supervisor::Request`] a connection, `Deadline`, `Sleep`, `Wake` or `Ping`,
/// answered [`crate::supervisor::Reply`]. The init takes it only from a peer outside the box's
/// pid namespace, so no program of the box can move its deadline or sleep it.
pub const CONTROL: &str = "control.sock";

/// The root a box sees.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "path")]
pub enum Root {
    /// This machine's own `/`, read-only, with what belongs to people and daemons masked.
    Host,
    /// A directory holding a root file system (an unpacked image), read-only.
    Rootfs(String),
}

/// A bind mount of the spec's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    /// A path on the host.
    pub source: String,
    /// Where it appears in the box.
    pub target: String,
    /// Bound read-only.
    pub read_only: bool,
}

/// A box whose only way out is agentbox's egress proxy.
///
/// The box gets a net namespace of its own with loopback alone (up, and AF_INET sockets
/// allowed: they reach nothing but the box itself). Before it unshares, the keeper starts the
/// proxy (`agentbox-runner egress DIR`) in the host's network, on [`EGRESS_SOCKET`] in the box
/// directory's `run/`; the init bridges `127.0.0.1:port` in the box to that socket, and the
/// box's programs are told of it in `HTTP_PROXY` and `HTTPS_PROXY`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Egress {
    /// The port the bridge listens on in the box (on 127.0.0.1).
    pub port: u16,
    /// The allowlist's entries, as the spec gave them.
    pub allow: Vec<String>,
    /// The names of the box's secrets. When there are some, the host writes them (with their
    /// values) as the first line of the keeper's stdin, and the keeper hands that line to the
    /// proxy's: no file or argument holds a value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
}

/// Everything the keeper and the init need to build one box.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BoxConfig {
    /// The box's name, also its hostname.
    pub name: String,
    /// The box's directory on the host (absolute): `work/`, `home/`, `tmp/`, `run/` and
    /// `root/` (an empty directory the new root is built on) are in it.
    pub dir: String,
    /// The root the box sees.
    pub root: Root,
    /// When the box ends, in milliseconds since the Unix epoch.
    pub deadline_ms: u64,
    /// A net namespace with loopback only, and AF_INET and AF_INET6 sockets refused.
    pub network_none: bool,
    /// The spec's bind mounts.
    pub mounts: Vec<Bind>,
    /// The runner's environment, which every program of the box starts from.
    pub env: BTreeMap<String, String>,
    /// RLIMIT_NPROC for the box's user: at most this many processes.
    pub max_processes: Option<u64>,
    /// Apply landlock where the kernel has it.
    pub landlock: bool,
    /// Host directories hidden under an empty read-only tmpfs in a `host` root, beyond what
    /// every such box masks (`/home`, `/root`, `/run`, `/tmp`): the host user's own home and
    /// agentbox's home (other boxes' files, local boxes' supervisor sockets), wherever they are.
    #[serde(default)]
    pub masks: Vec<String>,
    /// Egress through agentbox's proxy alone (with `network_none` false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Egress>,
    /// Ports of the box's own network (a box with `egress`) reached from this machine's
    /// loopback: the keeper listens on a port of the host's for each, before it leaves the
    /// host's network, says them ([`PORTS_PREFIX`]), and carries each connection into the box.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
}

/// The most ports a box exposes.
pub const MAX_PORTS: usize = 64;

/// The keeper's line naming the host's port for each of the box's: `ports 8080=41234 ...`.
pub const PORTS_PREFIX: &str = "ports ";

/// The descriptors the keeper opens for the init (`O_PATH`, open across exec) and names on
/// the init's stdin after the config: the box's directory, the rootfs, each mount's source.
/// The init reaches them through `/proc/self/fd/N`, which needs no search permission on the
/// host's directories above them (a root host's box is another id of the host's).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Descriptors {
    /// The box's directory.
    pub dir: i32,
    /// The rootfs, for a `rootfs` root.
    pub rootfs: Option<i32>,
    /// Each of the config's mounts' sources, in order.
    pub mounts: Vec<i32>,
}

impl BoxConfig {
    /// Check what a keeper must not act on: a relative or odd path, a name that is not a
    /// hostname, a mount target outside the box's tree.
    pub fn validate(&self) -> Result<(), String> {
        let absolute = |what: &str, p: &str| {
            if !p.starts_with('/') || p.contains('\0') || p.split('/').any(|c| c == "..") {
                Err(format!(
                    "{what} {p:?}: must be an absolute path with no `..` and no NUL"
                ))
            } else {
                Ok(())
            }
        };
        if self.name.is_empty()
            || self.name.len() > 63
            || !self.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(format!(
                "name {:?}: must be 1 to 63 letters, digits or dashes",
                self.name
            ));
        }
        absolute("dir", &self.dir)?;
        if let Root::Rootfs(p) = &self.root {
            absolute("root", p)?;
        }
        for m in &self.masks {
            absolute("mask", m)?;
        }
        for m in &self.mounts {
            absolute("mount source", &m.source)?;
            absolute("mount target", &m.target)?;
            if m.target == "/" {
                return Err("mount target \"/\": the root is the box's own".into());
            }
        }
        if self.max_processes == Some(0) {
            return Err("max_processes: 0 would let no program start".into());
        }
        if let Some(e) = &self.egress {
            if self.network_none {
                return Err("egress: a box with no network has no egress".into());
            }
            if e.port == 0 || e.allow.is_empty() || e.allow.len() > 256 || e.allow.iter().any(|a| a.len() > 300) {
                return Err("egress: a port, and 1 to 256 entries of at most 300 bytes".into());
            }
        }
        if !self.ports.is_empty() {
            if self.egress.is_none() {
                return Err("ports: only a box with a network of its own (an egress) has ports of its own".into());
            }
            if self.ports.len() > MAX_PORTS {
                return Err(format!("ports: {} ports, at most {MAX_PORTS}", self.ports.len()));
            }
            let mut seen = std::collections::BTreeSet::new();
            if let Some(p) = self.ports.iter().find(|p| **p == 0 || !seen.insert(**p)) {
                return Err(format!("ports: {p} is 0 or named twice"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BoxConfig {
        BoxConfig {
            name: "a1".into(),
            dir: "/var/boxes/a1".into(),
            root: Root::Host,
            deadline_ms: 1,
            network_none: false,
            mounts: vec![],
            env: BTreeMap::new(),
            max_processes: Some(10),
            landlock: true,
            masks: vec!["/srv/agentbox".into()],
            egress: Some(Egress {
                port: 3128,
                allow: vec!["example.com".into()],
                secrets: vec![],
            }),
            ports: vec![8080, 5432],
        }
    }

    #[test]
    fn a_config_round_trips_and_bad_ones_name_their_field() {
        let c = config();
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<BoxConfig>(&json).unwrap(), c);
        assert!(c.validate().is_ok());
        let bad = |f: fn(&mut BoxConfig), field: &str| {
            let mut c = config();
            f(&mut c);
            let e = c.validate().unwrap_err();
            assert!(e.contains(field), "{e}");
        };
        bad(|c| c.name = "a b".into(), "name");
        bad(|c| c.network_none = true, "egress");
        bad(|c| c.egress.as_mut().unwrap().allow.clear(), "egress");
        bad(|c| c.dir = "rel".into(), "dir");
        bad(|c| c.root = Root::Rootfs("/x/../y".into()), "root");
        bad(
            |c| {
                c.mounts.push(Bind {
                    source: "/a".into(),
                    target: "/".into(),
                    read_only: true,
                })
            },
            "mount target",
        );
        bad(|c| c.max_processes = Some(0), "max_processes");
        bad(|c| c.ports.push(8080), "ports");
        bad(|c| c.ports.push(0), "ports");
        bad(|c| c.ports = (1..=65).collect(), "ports");
        bad(|c| c.egress = None, "ports");
    }
}

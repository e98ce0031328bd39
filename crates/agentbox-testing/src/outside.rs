//! Views of boxes from outside the provider under test, for [`crate::conformance`].

use std::path::PathBuf;
use std::process::Command;

use agentbox_core::SandboxId;
use async_trait::async_trait;

use crate::conformance::Outside;

/// Whether `pid` names a process of this machine that runs (a zombie does not).
pub fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|c| c != 'Z' && c != 'X')
    })
}

/// Local boxes seen from the file system and this machine's process table.
pub struct LocalView {
    /// The provider's `boxes/` directory.
    pub boxes: PathBuf,
}

#[async_trait]
impl Outside for LocalView {
    async fn ended(&self, id: &SandboxId) -> bool {
        !self.boxes.join(id.name()).exists()
    }
    async fn any_alive(&self, _id: &SandboxId, pids: &[u32]) -> bool {
        pids.iter().any(|&p| running(p))
    }
}

/// `docker ARGS…`'s trimmed stdout when it succeeds.
pub fn docker(args: &[&str]) -> Option<String> {
    let out = Command::new("docker").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Whether the container `name` runs, as the `docker` CLI sees it.
pub fn container_running(name: &str) -> bool {
    docker(&["inspect", "--format", "{{.State.Running}}", name]).is_some_and(|s| s == "true")
}

/// Docker boxes seen through the `docker` CLI: a client of its own, not the provider under test.
pub struct DockerCli;

#[async_trait]
impl Outside for DockerCli {
    async fn ended(&self, id: &SandboxId) -> bool {
        !container_running(id.name())
    }
    async fn any_alive(&self, id: &SandboxId, pids: &[u32]) -> bool {
        if !container_running(id.name()) {
            return false;
        }
        pids.iter().any(|p| {
            let script = format!("sed -n 's/.*) \\(.\\).*/\\1/p' /proc/{p}/stat 2>/dev/null");
            docker(&["exec", id.name(), "sh", "-c", &script]).is_some_and(|s| !s.is_empty() && s != "Z" && s != "X")
        })
    }
}

/// Namespace boxes seen from this machine's process table: a box has ended when no process of
/// its pid namespace is left, and the pids a box reports are its own namespace's, matched by
/// the `NSpid` line of each process in that namespace.
pub struct NamespaceView {
    /// The provider's `namespace/` directory.
    pub boxes: PathBuf,
}

impl NamespaceView {
    /// The inode of the box's pid namespace and its init's host pid, from its record.
    fn pid_ns(&self, id: &SandboxId) -> Option<(u64, u32)> {
        let record = std::fs::read(self.boxes.join(id.name()).join("record.json")).ok()?;
        let v: serde_json::Value = serde_json::from_slice(&record).ok()?;
        Some((
            v["facts"]["namespaces"]["pid"].as_u64()?,
            v["init_pid"].as_u64()? as u32,
        ))
    }

    /// Every running process of the box whose pid namespace is `ns` and whose init is `init`
    /// (a pid of the host's), as (host pid, pid in the box). A namespace's inode is reused once
    /// it ends, so a namespace of that inode whose pid 1 is another process is another box's.
    pub fn members(ns: u64, init: u32) -> Vec<(u32, u32)> {
        let all = Self::in_namespace(ns);
        if all.contains(&(init, 1)) { all } else { vec![] }
    }

    fn in_namespace(ns: u64) -> Vec<(u32, u32)> {
        use std::os::unix::fs::MetadataExt;
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return vec![];
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if std::fs::metadata(format!("/proc/{pid}/ns/pid")).map(|m| m.ino()).ok() != Some(ns) || !running(pid) {
                continue;
            }
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            if let Some(inner) = status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|l| l.split_whitespace().last()?.parse().ok())
            {
                out.push((pid, inner));
            }
        }
        out
    }
}

#[async_trait]
impl Outside for NamespaceView {
    async fn ended(&self, id: &SandboxId) -> bool {
        match self.pid_ns(id) {
            Some((ns, init)) => Self::members(ns, init).is_empty(),
            None => !self.boxes.join(id.name()).exists(),
        }
    }
    async fn any_alive(&self, id: &SandboxId, pids: &[u32]) -> bool {
        let Some((ns, init)) = self.pid_ns(id) else {
            return false;
        };
        Self::members(ns, init).iter().any(|(_, inner)| pids.contains(inner))
    }
}

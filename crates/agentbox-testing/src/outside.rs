//! Views of boxes from outside the provider under test, for [`crate::conformance`].

use std::path::PathBuf;
use std::process::Command;

use agentbox_core::SandboxId;
use async_trait::async_trait;

use crate::conformance::Outside;

/// Whether `pid` names a process of this machine that runs (a zombie does not).
pub fn running(pid: u32) -> bool {
    i32::try_from(pid)
        .ok()
        .and_then(agentbox_proc::stat)
        .is_some_and(|s| !s.is_zombie())
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
        agentbox_proc::all()
            .into_iter()
            .filter(|p| !p.is_zombie())
            .filter(|p| agentbox_proc::namespace_inode(&p.pid.to_string(), "pid") == Some(ns))
            .filter_map(|p| {
                let status = agentbox_proc::status(&p.pid.to_string())?;
                let inner = agentbox_proc::status_field(&status, "NSpid")?
                    .split_whitespace()
                    .last()?
                    .parse()
                    .ok()?;
                Some((p.pid as u32, inner))
            })
            .collect()
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

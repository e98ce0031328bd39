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

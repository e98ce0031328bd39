//! What a docker provider is made with: [`DockerOptions`], its defaults, and where it reads them
//! from the environment.

use agentbox_core::{Error, Result, is_normal_absolute};

use super::{DEFAULT_IMAGE, DEFAULT_WORKSPACE};
use crate::helper::HelperCommand;

/// How every box of a [`DockerProvider`](super::DockerProvider) is made.
#[derive(Clone, Debug)]
pub struct DockerOptions {
    /// The image when a spec names none.
    pub image: String,
    /// `uid:gid` every program runs as, so files written in a bind stay the host user's.
    pub user: Option<String>,
    /// CPUs (the CFS quota `--cpus` would set); a spec's own `cpus` wins.
    pub cpus: Option<f64>,
    /// Memory in bytes, with swap equal (so swap never adds to it); a spec's `memory_mb` wins.
    pub memory_bytes: Option<i64>,
    /// At most this many processes (1 to 4194304); [`DEFAULT_PIDS_LIMIT`](super::DEFAULT_PIDS_LIMIT) when not set.
    pub pids_limit: Option<i64>,
    /// Keep Docker's default capabilities (for programs that must change user: `su`, package
    /// installs that chown), with `no-new-privileges` off. By default every capability is
    /// dropped and `no-new-privileges` is on. A box found again by id keeps what it was made
    /// with, whatever these options say, and its facts say which.
    pub keep_capabilities: bool,
    /// The box's writable layer is at most this many bytes, where the engine can enforce it
    /// (`overlay2` on xfs with project quotas, and a few other drivers); refused elsewhere.
    pub disk_bytes: Option<i64>,
    /// Named volumes on every box.
    pub volumes: Vec<NamedVolume>,
    /// Where programs start unless a spec names a workspace.
    pub workspace: String,
    /// A runner to start in every box made: this machine's `agentbox-runner` (a static build
    /// needs nothing in the image), mounted read-only at [`RUNNER_IN_BOX`](super::RUNNER_IN_BOX). Each command and
    /// file operation is then one message over the container's address, or over a relay exec
    /// when the box has no network. Needs a local engine (it is a bind mount).
    pub runner: Option<HelperCommand>,
}

impl Default for DockerOptions {
    fn default() -> Self {
        DockerOptions {
            image: DEFAULT_IMAGE.into(),
            user: None,
            cpus: None,
            memory_bytes: None,
            pids_limit: None,
            keep_capabilities: false,
            disk_bytes: None,
            volumes: Vec::new(),
            workspace: DEFAULT_WORKSPACE.into(),
            runner: None,
        }
    }
}

impl DockerOptions {
    /// Check every option, naming the one that is wrong.
    pub fn validate(&self) -> Result<()> {
        if self.image.is_empty() || self.image.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(Error::invalid(format!(
                "docker image: {:?} is not an image name",
                self.image
            )));
        }
        if let Some(u) = &self.user {
            let ok = u.split_once(':').is_some_and(|(a, b)| {
                !a.is_empty()
                    && !b.is_empty()
                    && a.bytes().all(|c| c.is_ascii_digit())
                    && b.bytes().all(|c| c.is_ascii_digit())
            });
            if !ok {
                return Err(Error::invalid(format!(
                    "docker user: {u:?} is not uid:gid (for example 1000:1000)"
                )));
            }
        }
        if let Some(c) = self.cpus
            && !(c.is_finite() && c >= 0.01)
        {
            return Err(Error::invalid(format!("docker cpus: {c} is below 0.01")));
        }
        if let Some(m) = self.memory_bytes
            && m < 6 * 1024 * 1024
        {
            return Err(Error::invalid(format!(
                "docker memory: {m} bytes is below Docker's 6 MiB minimum"
            )));
        }
        if let Some(p) = self.pids_limit
            && !(1..=4_194_304).contains(&p)
        {
            return Err(Error::invalid(format!(
                "docker pids_limit: {p} is not between 1 and 4194304"
            )));
        }
        if let Some(d) = self.disk_bytes
            && d < 1 << 20
        {
            return Err(Error::invalid(format!("docker disk: {d} bytes is below 1 MiB")));
        }
        if !is_normal_absolute(&self.workspace) {
            return Err(Error::invalid(format!(
                "docker workspace: {:?} is not an absolute path in normal form",
                self.workspace
            )));
        }
        let mut targets = std::collections::BTreeSet::new();
        for v in &self.volumes {
            let name_ok = v.name.len() >= 2
                && v.name.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
                && v.name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
            if !name_ok {
                return Err(Error::invalid(format!(
                    "docker volumes: {:?} is not a name Docker takes",
                    v.name
                )));
            }
            if !is_normal_absolute(&v.target) || v.target == "/" {
                return Err(Error::invalid(format!(
                    "docker volumes: target {:?} is not an absolute path in normal form",
                    v.target
                )));
            }
            if !targets.insert(v.target.as_str()) {
                return Err(Error::invalid(format!(
                    "docker volumes: target {:?} is used twice",
                    v.target
                )));
            }
        }
        Ok(())
    }
}

/// A named Docker volume mounted on every box (after the spec's binds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedVolume {
    /// The volume's name.
    pub name: String,
    /// An absolute path in normal form, in the box.
    pub target: String,
    /// Mounted read-only.
    pub read_only: bool,
}

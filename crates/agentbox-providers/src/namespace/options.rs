//! What a namespace provider is made with: [`NamespaceOptions`], its defaults, and where it reads
//! them from the environment.

use std::path::PathBuf;

use agentbox_core::Result;

use super::{DEFAULT_HOST_ID, DEFAULT_MAX_PROCESSES};
use crate::helper::HelperCommand;

/// How a [`NamespaceProvider`](super::NamespaceProvider) is set up.
#[derive(Clone, Debug)]
pub struct NamespaceOptions {
    /// agentbox's home: boxes live in `<root>/namespace`.
    pub root: PathBuf,
    /// The runner binary: the keeper, the init and the runner of every box. For boxes with a
    /// `rootfs` root it must be static (the image's C library may be older than the host's).
    pub runner: HelperCommand,
    /// File operations through the runner (one message each) rather than through programs.
    pub runner_files: bool,
    /// The id of the host's that the box's root is mapped to when agentbox runs as root.
    pub host_id: u32,
    /// RLIMIT_NPROC of the box's user.
    pub max_processes: u64,
    /// Apply landlock where the kernel has it.
    pub landlock: bool,
}

impl NamespaceOptions {
    /// Options with `root` and the runner found by [`HelperCommand::discover`].
    pub fn at(root: impl Into<PathBuf>) -> Result<Self> {
        Ok(NamespaceOptions {
            root: root.into(),
            runner: HelperCommand::discover()?,
            runner_files: true,
            host_id: DEFAULT_HOST_ID,
            max_processes: DEFAULT_MAX_PROCESSES,
            landlock: true,
        })
    }

    /// Options from the environment's agentbox home (see [`crate::home::default_home`]).
    pub fn from_env() -> Result<Self> {
        NamespaceOptions::at(crate::home::default_home()?)
    }
}

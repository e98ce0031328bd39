//! What a local provider is made with: [`LocalOptions`], its defaults, and where it reads them from
//! the environment.

use std::path::PathBuf;

use agentbox_core::Result;

use super::{DEFAULT_PATH, default_home};
use crate::helper::HelperCommand;

/// How a [`LocalProvider`](super::LocalProvider) is set up.
#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// agentbox's home: boxes live in `<root>/boxes`.
    pub root: PathBuf,
    /// The PATH every program gets.
    pub path: String,
    /// The command that runs the supervisor (and the runner, which is the same program).
    pub supervisor: HelperCommand,
    /// Start a runner in every box made, so each command and file operation is one message
    /// on its unix socket rather than a process (see [`crate::runner`]).
    pub runner: bool,
}

impl LocalOptions {
    /// Options with `root` and the supervisor found by [`HelperCommand::discover`].
    pub fn at(root: impl Into<PathBuf>) -> Result<Self> {
        Ok(LocalOptions {
            root: root.into(),
            path: DEFAULT_PATH.into(),
            supervisor: HelperCommand::discover()?,
            runner: false,
        })
    }

    /// Options from the environment: `$AGENTBOX_HOME`, else `$XDG_DATA_HOME/agentbox`, else
    /// `~/.local/share/agentbox`.
    pub fn from_env() -> Result<Self> {
        LocalOptions::at(default_home()?)
    }
}

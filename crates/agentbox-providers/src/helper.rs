//! Finding agentbox's helper binary (`agentbox-runner`), which local boxes run as their
//! supervisor.

use std::path::{Path, PathBuf};

use agentbox_core::{Error, Result};

/// The variable that names the helper binary explicitly.
pub const RUNNER_ENV: &str = "AGENTBOX_RUNNER";

/// A command line that runs the helper: `program args… supervise …`.
///
/// The `agentbox` binary passes itself with `["runner"]`, so an installed `agentbox` needs no
/// second file; a library user passes nothing and [`HelperCommand::discover`] finds
/// `agentbox-runner`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelperCommand {
    /// The executable.
    pub program: PathBuf,
    /// Arguments before the helper's own subcommand.
    pub args: Vec<String>,
}

impl HelperCommand {
    /// A helper at an explicit path.
    pub fn new(program: impl Into<PathBuf>, args: Vec<String>) -> Self {
        HelperCommand {
            program: program.into(),
            args,
        }
    }

    /// `$AGENTBOX_RUNNER`, else `agentbox-runner` beside this executable or one directory up
    /// (where cargo puts binaries when this executable is a test), else `not_found` saying how
    /// to get one.
    pub fn discover() -> Result<Self> {
        if let Some(p) = std::env::var_os(RUNNER_ENV) {
            let p = PathBuf::from(p);
            if !p.is_file() {
                return Err(Error::not_found(format!("{RUNNER_ENV}={}: no such file", p.display())));
            }
            return Ok(HelperCommand::new(p, vec![]));
        }
        let exe = std::env::current_exe().map_err(|e| Error::io(e, "finding this executable"))?;
        let mut dir: Option<&Path> = exe.parent();
        for _ in 0..2 {
            let Some(d) = dir else { break };
            let candidate = d.join("agentbox-runner");
            if candidate.is_file() {
                return Ok(HelperCommand::new(candidate, vec![]));
            }
            dir = d.parent();
        }
        Err(Error::not_found(format!(
            "the agentbox-runner binary is not beside {} and {RUNNER_ENV} is not set: build it with \
             `cargo build -p agentbox-runner`, or set {RUNNER_ENV} to its path",
            exe.display()
        )))
    }
}

//! agentbox's home directory: where local boxes, marks, ledgers, demo runs and the runner key
//! live. Every provider may need it (Docker keeps its runner key there), so it is no one
//! provider's.

use std::path::PathBuf;

use agentbox_core::{Error, Result};

/// The variable naming agentbox's home directory (boxes go under `boxes/` in it).
pub const HOME_ENV: &str = "AGENTBOX_HOME";

/// agentbox's home from the environment: `$AGENTBOX_HOME`, else `$XDG_DATA_HOME/agentbox`, else
/// `~/.local/share/agentbox`.
///
/// ```no_run
/// let home = agentbox_providers::home::default_home().unwrap();
/// println!("boxes live in {}", home.join("boxes").display());
/// ```
pub fn default_home() -> Result<PathBuf> {
    home_from(|k| std::env::var_os(k))
}

/// [`default_home`] over variables `lookup` gives (a registry's environment, a test's).
pub fn home_from(lookup: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<PathBuf> {
    let var = |k: &str| lookup(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(h) = var(HOME_ENV) {
        return Ok(h);
    }
    if let Some(d) = var("XDG_DATA_HOME") {
        return Ok(d.join("agentbox"));
    }
    if let Some(h) = var("HOME") {
        return Ok(h.join(".local/share/agentbox"));
    }
    Err(Error::not_found(format!("no home directory: set {HOME_ENV}")))
}

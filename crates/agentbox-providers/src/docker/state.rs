//! What a Docker box's lifecycle keeps on this machine, beside the container: a container's
//! labels cannot change once it is made, so what changes after (its deadline, its sleep, its
//! host labels) lives in files of this machine's agentbox home.
//!
//! - `docker/<name>.deadline`: the deadline, decimal milliseconds, bind-mounted read-only into
//!   the box for its init (`agentbox-runner init`), which reads it again when told (SIGHUP).
//!   Written in place, never renamed over: a bind mount of a file holds its inode.
//! - `docker/<name>.refusals`: what the egress proxy of a box with an allowlist refused (the
//!   proxy, a process of this machine's, ends once the deadline file says so or is gone), and
//!   `docker/<name>.proxy` its stderr.
//! - `docker/<name>.json`: whether the box sleeps, and its host labels once relabelled.
//!   Written whole by rename, under `docker/<name>.lock` (held across a whole sleep, wake or
//!   relabel).
//!
//! A host with another agentbox home finds neither file: it reads the deadline and labels the
//! box was made with, and refuses to move them (`refused`, naming the file it lacks).

use std::io::Write;
use std::path::PathBuf;

use agentbox_core::{Error, Labels, Result};
use serde::{Deserialize, Serialize};

use crate::atomic::write_atomic;

/// What `<name>.json` holds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct State {
    /// The box sleeps.
    #[serde(default)]
    pub asleep: bool,
    /// The host labels, once relabelled (else the ones it was made with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<Labels>,
    /// The box's allowlist was proven from inside it by the create that made it.
    #[serde(default)]
    pub egress_proven: bool,
}

fn dir() -> Result<PathBuf> {
    Ok(crate::home::default_home()?.join("docker"))
}

/// The deadline file of box `name`.
pub(super) fn deadline_path(name: &str) -> Result<PathBuf> {
    Ok(dir()?.join(format!("{name}.deadline")))
}

/// The egress proxy's record of what it refused, for box `name` with an allowlist: outside
/// the box's runner directory, so nothing in the box can write it.
pub(super) fn refusals_path(name: &str) -> Result<PathBuf> {
    Ok(dir()?.join(format!("{name}.refusals")))
}

/// The egress proxy's stderr, for box `name` with an allowlist.
pub(super) fn proxy_log_path(name: &str) -> Result<PathBuf> {
    Ok(dir()?.join(format!("{name}.proxy")))
}

/// Write the deadline of box `name`, in place (made when `create`, else it must exist).
pub(super) fn write_deadline(name: &str, ends_at_ms: u64, create: bool) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = deadline_path(name)?;
    if create {
        std::fs::DirBuilder::new()
            .recursive(true)
            .create(dir()?)
            .map_err(|e| Error::io(e, "making the agentbox home's docker directory"))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(create)
        .truncate(false)
        .mode(0o644)
        .open(&path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::refused(format!(
                    "box {name}: its deadline file {} is not in this agentbox home (the box was made by another)",
                    path.display()
                ))
            } else {
                Error::io(e, format!("opening {}", path.display()))
            }
        })?;
    // Fixed width, one write: the init never reads half of an old and half of a new number.
    // Not synced: the init reads it from the page cache, and a machine that crashes takes the
    // box with it.
    f.write_all(format!("{ends_at_ms:020}\n").as_bytes())
        .map_err(|e| Error::io(e, format!("writing {}", path.display())))
}

/// The deadline in the file of box `name`, where this home has it.
pub(super) fn read_deadline(name: &str) -> Option<u64> {
    let text = std::fs::read_to_string(deadline_path(name).ok()?).ok()?;
    text.trim().parse().ok()
}

/// The state of box `name`; the default where there is none.
pub(super) fn read(name: &str) -> Result<State> {
    let path = dir()?.join(format!("{name}.json"));
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| Error::invalid(format!("{}: not a box's state: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
        Err(e) => Err(Error::io(e, format!("reading {}", path.display()))),
    }
}

/// Hold box `name`'s lock while an operation (`what`) reads its state, acts and writes it
/// again: two changes of one box (a sleep and a wake, two relabels) never cross. Waited for at
/// most 30 s. Refused for a box whose deadline file this home lacks: another home made it, and
/// what this one kept would disagree with what that one keeps.
pub(super) async fn lock(name: &str, what: &str) -> Result<crate::lock::Locked> {
    let deadline = deadline_path(name)?;
    if !deadline.exists() {
        return Err(Error::refused(format!(
            "{what}: box {name}'s deadline file {} is not in this agentbox home (another home made the box)",
            deadline.display()
        )));
    }
    let path = dir()?.join(format!("{name}.lock"));
    crate::lock::lock(&path, std::time::Duration::from_secs(30), what)
        .await?
        .ok_or_else(|| Error::gone(format!("{what}: box {name}: its files are gone")))
}

/// Change the state of box `name`; the caller holds [`lock`].
pub(super) fn update(name: &str, change: impl FnOnce(&mut State)) -> Result<()> {
    let mut state = read(name)?;
    change(&mut state);
    let bytes = serde_json::to_vec_pretty(&state).map_err(|e| Error::unknown(e.to_string()))?;
    write_atomic(&dir()?.join(format!("{name}.json")), &bytes)
}

/// The lock file of the snapshot `name` (held while it is checked for and taken).
pub(super) fn snapshot_lock(name: &str) -> Result<PathBuf> {
    let d = dir()?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .create(&d)
        .map_err(|e| Error::io(e, "making the agentbox home's docker directory"))?;
    Ok(d.join(format!("snapshot-{name}.lock")))
}

/// Remove every file of box `name` (at its destroy, or a sweep of a box that ended).
pub(super) fn remove(name: &str) {
    if let Ok(d) = dir() {
        for ext in ["deadline", "json", "lock", "refusals", "proxy"] {
            let _ = std::fs::remove_file(d.join(format!("{name}.{ext}")));
        }
    }
}

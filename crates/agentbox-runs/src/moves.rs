//! Planned moves: `move.json` in a run's directory asks its holder to let the run go at its
//! next step boundary (never mid-step), for a driver to start the next generation on the
//! target it names. The holder tells the agent it is leaving ([`crate::agent::work`]); the
//! next generation, which consumes the request when it opens the run, tells it where it now
//! runs ([`crate::agent::note_move`]).

use std::path::Path;

use agentbox_core::{Error, Result};
use serde::{Deserialize, Serialize};

use crate::record::sync_dir;

/// A request to move a run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRequest {
    /// Where the next generation runs: a driver's name (`local`, `docker`, `kube`).
    pub to: String,
    /// Who asked: a host's name.
    pub by: String,
    /// When, in ms since the epoch.
    pub asked_ms: u64,
}

const FILE: &str = "move.json";

/// The most a move request's file may hold.
const MAX_BYTES: u64 = 64 << 10;

/// Ask the holder of the run in `dir` to let it go for a move to `to` (written whole or not
/// at all). Asking again replaces the request.
///
/// ```no_run
/// let req = agentbox_runs::moves::ask("/data/runs/r1".as_ref(), "docker", "laptop").unwrap();
/// assert_eq!(req.to, "docker");
/// ```
pub fn ask(dir: &Path, to: &str, by: &str) -> Result<MoveRequest> {
    if to.is_empty() || to.len() > 64 || !to.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(Error::invalid(format!(
            "move: target {to:?}: 1 to 64 letters, digits or '-'"
        )));
    }
    if !dir.join("run.json").is_file() {
        return Err(Error::not_found(format!("move: {}: no such run", dir.display())));
    }
    let req = MoveRequest {
        to: to.to_string(),
        by: by.to_string(),
        asked_ms: {
            use agentbox_core::Clock;
            agentbox_core::SystemClock.now_ms()
        },
    };
    // A name of this asker's own, so two askers at once never write one file.
    let tmp = dir.join(format!(".move.json.{}.tmp", std::process::id()));
    let bytes = serde_json::to_vec(&req).map_err(|e| Error::unknown(e.to_string()))?;
    std::fs::write(&tmp, &bytes)
        .and_then(|_| std::fs::File::open(&tmp)?.sync_all())
        .map_err(|e| Error::io(e, format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, dir.join(FILE)).map_err(|e| Error::io(e, format!("placing {}", tmp.display())))?;
    sync_dir(dir)?;
    tracing::info!(run = %dir.display(), to, "move asked");
    Ok(req)
}

/// The move asked of the run in `dir`, if any. A file that is not a request is an error
/// naming it, never taken for "no move".
pub fn asked(dir: &Path) -> Result<Option<MoveRequest>> {
    let path = dir.join(FILE);
    let f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(e, format!("reading {}", path.display()))),
    };
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(f, MAX_BYTES + 1), &mut bytes)
        .map_err(|e| Error::io(e, format!("reading {}", path.display())))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(Error::too_large(format!("{}: over {MAX_BYTES} bytes", path.display())));
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::invalid(format!("{}: not a move request: {e}", path.display())))
}

/// Take the request away when it named `driver`: the generation it asked for has opened the
/// run, so the move is done. A request to another driver stays. One that cannot be read is
/// logged and removed, so it never blocks the run.
pub(crate) fn done(dir: &Path, driver: &str) -> Option<MoveRequest> {
    let req = match asked(dir) {
        Ok(None) => return None,
        Ok(Some(r)) if r.to != driver => return None,
        Ok(Some(r)) => Some(r),
        Err(e) => {
            tracing::warn!(run = %dir.display(), "a move request that is not one, removed: {e}");
            None
        }
    };
    match std::fs::remove_file(dir.join(FILE)) {
        Ok(()) => {
            let _ = sync_dir(dir);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(run = %dir.display(), "removing the move request: {e}"),
    }
    req
}

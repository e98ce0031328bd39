//! `run.json`: what a run is, readable from outside with no claim.

use std::io::Write;
use std::path::Path;

use agentbox_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// Where a run stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Made, never opened.
    New,
    /// A holder has it.
    Open,
    /// Released: its store checkpointed and synced.
    Sealed,
    /// Released until its deadline, when a supervisor starts it again.
    Parked,
}

/// Who holds (or last held) a run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The host's name.
    pub host: String,
    /// The process.
    pub pid: u32,
    /// Since when, in ms since the epoch.
    pub since_ms: u64,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} on {} (since {} ms)", self.pid, self.host, self.since_ms)
    }
}

/// `run.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The run's id (its directory's name).
    pub id: String,
    /// Where it stands.
    pub status: RunStatus,
    /// How many times it was opened.
    pub generation: u64,
    /// Who holds it (open) or held it last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    /// The run it was forked from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// A parked run's deadline, in ms since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
}

/// The run in `dir`, read from outside with no claim.
///
/// ```no_run
/// let r = agentbox_runs::read_status("runs/r1".as_ref()).unwrap();
/// println!("{} is {:?} at generation {}", r.id, r.status, r.generation);
/// ```
pub fn read_status(dir: &Path) -> Result<RunRecord> {
    let path = dir.join("run.json");
    let bytes = std::fs::read(&path).map_err(|e| Error::io(e, format!("reading {}", path.display())))?;
    if bytes.len() > 1 << 20 {
        return Err(Error::too_large(format!("{}: over 1 MiB", path.display())));
    }
    serde_json::from_slice(&bytes).map_err(|e| Error::invalid(format!("{}: not a run record: {e}", path.display())))
}

/// Write `record` to `dir/run.json` so a reader sees the old or the whole new one, durably.
pub fn write_record(dir: &Path, record: &RunRecord) -> Result<()> {
    let path = dir.join("run.json");
    let tmp = dir.join(".run.json.tmp");
    let bytes = serde_json::to_vec_pretty(record).map_err(|e| Error::unknown(e.to_string()))?;
    let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io(e, format!("creating {}", tmp.display())))?;
    f.write_all(&bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::io(e, format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(e, format!("renaming {} into place", tmp.display())))?;
    sync_dir(dir)
}

/// fsync a directory, so a rename or a new file in it survives a crash.
pub fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(e, format!("syncing {}", dir.display())))
}

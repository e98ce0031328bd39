//! A namespace box's record on disk: what attach and list read from any process.

use std::path::Path;
use std::time::Duration;

use agentbox_core::{Error, Labels, Result, SandboxId, Spec};
use serde::{Deserialize, Serialize};

use crate::util::try_flock;
pub(crate) use crate::util::{Locked, lock};

/// The record's file name in the box's directory.
const RECORD: &str = "record.json";

/// The lock every change of the record takes, in the box's directory; held too by the make of
/// the box until its record is written, so an open that finds the directory can tell a make
/// under way (held) from one that died (free, and still no record).
pub(crate) const LOCK: &str = "record.lock";

/// How long a change of the record waits for the lock: a make holds it while the box starts
/// (at most its start timeout), a change for one message to the init.
pub(crate) const LOCK_WAIT: Duration = Duration::from_secs(30);

/// What attach and list read of a box: written when it is made, and changed (under [`LOCK`])
/// by extend, sleep, wake and relabel.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Record {
    pub id: SandboxId,
    pub labels: Labels,
    pub spec: Spec,
    pub created_at_ms: u64,
    pub ends_at_ms: u64,
    /// The init's pid and start time on the host: together they name one process for ever.
    pub init_pid: i32,
    pub init_start: u64,
    pub facts: agentbox_core::Facts,
    pub runner_files: bool,
    /// The name the box was opened by (`Provider::open`); its labels are part of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The box sleeps: its programs were ended and it takes none until woken.
    #[serde(default)]
    pub asleep: bool,
}

impl Record {
    pub(crate) fn read(dir: &Path) -> Result<Option<Record>> {
        crate::boxdir::read_record(&dir.join(RECORD))
    }

    /// Write the record, whole or not at all.
    pub(crate) fn write(&self, dir: &Path) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| agentbox_core::Error::unknown(e.to_string()))?;
        crate::util::write_atomic(&dir.join(RECORD), &bytes)
    }

    /// The init still runs: the box has not ended.
    pub(crate) fn init_alive(&self) -> bool {
        agentbox_proc::stat(self.init_pid).is_some_and(|s| s.start_time == self.init_start && !s.is_zombie())
    }

    /// This record and `other` are of one box (one init, for ever).
    pub(crate) fn same_box(&self, other: &Record) -> bool {
        self.init_pid == other.init_pid && self.init_start == other.init_start
    }
}

/// The lock on `path` if it is free now; `None` when another holds it or the file is missing.
pub(crate) fn try_lock(path: &Path) -> Option<Locked> {
    let f = std::fs::OpenOptions::new().write(true).open(path).ok()?;
    try_flock(&f).ok().map(|()| Locked(f))
}

/// Make the lock file `path` (it must not exist) and take its lock: the make of a box, in the
/// directory it just made.
pub(crate) fn try_lock_new(path: &Path) -> Result<Locked> {
    let f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(e, format!("creating {}", path.display())))?;
    try_flock(&f).map_err(|e| Error::unknown(format!("locking {}, made a moment ago: {e}", path.display())))?;
    Ok(Locked(f))
}

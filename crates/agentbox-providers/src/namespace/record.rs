//! A namespace box's record on disk: what attach and list read from any process.

use std::path::Path;
use std::time::Duration;

use agentbox_core::{Error, Labels, Result, SandboxId, Spec};
use serde::{Deserialize, Serialize};

use crate::lock::try_flock;

pub(crate) use crate::lock::{Locked, lock};

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
    /// The name the box was opened by (`Lifecycle::open`); its labels are part of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The box sleeps: its programs were ended and it takes none until woken.
    #[serde(default)]
    pub asleep: bool,
    /// Each port of the box's own network, and the port of this machine's loopback its keeper
    /// forwards from.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub ports: std::collections::BTreeMap<u16, u16>,
}

impl Record {
    pub(crate) fn read(dir: &Path) -> Result<Option<Record>> {
        crate::boxdir::read_record(&dir.join(RECORD))
    }

    /// Write the record, whole or not at all.
    pub(crate) fn write(&self, dir: &Path) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| agentbox_core::Error::unknown(e.to_string()))?;
        crate::atomic::write_atomic(&dir.join(RECORD), &bytes)
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
///
/// The file appears under its name already locked: it is made and locked under a name of its
/// own, then linked into place. Made in place, a waiting open could find it in the moment
/// between its make and its lock, take the lock itself and remove the box as a make that died.
pub(crate) fn try_lock_new(path: &Path) -> Result<Locked> {
    let staged = path.with_extension("lock.new");
    let f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&staged)
        .map_err(|e| Error::io(e, format!("creating {}", staged.display())))?;
    let placed = try_flock(&f)
        .map_err(|e| Error::unknown(format!("locking {}, made a moment ago: {e}", staged.display())))
        .and_then(|()| {
            std::fs::hard_link(&staged, path).map_err(|e| Error::io(e, format!("creating {}", path.display())))
        });
    let _ = std::fs::remove_file(&staged);
    placed.map(|()| Locked(f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A waiter polling the lock of a box being made never gets it: the file is locked before
    /// it has its name. (Made in place, the waiter took it now and then; seen in CI as an open
    /// of one name that failed with "made a moment ago".)
    #[test]
    fn a_new_lock_is_never_free_under_its_name() {
        let root = tempfile::tempdir().unwrap();
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let stolen = std::sync::Arc::new(AtomicBool::new(false));
        let dirs: Vec<_> = (0..1000).map(|i| root.path().join(i.to_string())).collect();
        let waiter = {
            let (dirs, done, stolen) = (dirs.clone(), done.clone(), stolen.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    for d in &dirs {
                        if try_lock(&d.join(LOCK)).is_some() && !d.join("made").exists() {
                            stolen.store(true, Ordering::Relaxed);
                        }
                    }
                }
            })
        };
        let mut held = Vec::new();
        for d in &dirs {
            std::fs::create_dir(d).unwrap();
            held.push(try_lock_new(&d.join(LOCK)).unwrap());
            assert!(!d.join("record.lock.new").exists(), "the staged name is removed");
        }
        // Let go of each in turn, marking it first: only then may the waiter have it.
        for (d, h) in dirs.iter().zip(held) {
            std::fs::write(d.join("made"), b"").unwrap();
            drop(h);
        }
        done.store(true, Ordering::Relaxed);
        waiter.join().unwrap();
        assert!(
            !stolen.load(Ordering::Relaxed),
            "a waiter took the lock of a box being made"
        );
    }
}

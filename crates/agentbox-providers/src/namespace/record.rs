//! A namespace box's record on disk: what attach and list read from any process.

use std::path::Path;

use agentbox_core::{Labels, Result, SandboxId, Spec};
use serde::{Deserialize, Serialize};

/// The record's file name in the box's directory.
const RECORD: &str = "record.json";

/// What attach and list read of a box, written once when it is made.
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
}

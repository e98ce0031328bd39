//! A local box's record on disk: what attach and list read from a new process.

use std::path::Path;

use agentbox_core::{Error, Labels, Result, SandboxId, Spec};
use serde::{Deserialize, Serialize};

use crate::atomic::write_atomic;

const FILE: &str = "record.json";

/// Written when the box is made; rewritten whole (under [`Record::lock`]) by extend, sleep,
/// wake and relabel.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Record {
    pub id: SandboxId,
    pub labels: Labels,
    pub spec: Spec,
    pub created_at_ms: u64,
    pub ends_at_ms: u64,
    /// The supervisor's pid and start time: together they name one process for ever, so a
    /// reused pid is never taken for the supervisor.
    pub supervisor_pid: i32,
    pub supervisor_start: u64,
    /// Whether the box's commands and files go through a runner (at `runner.sock` in its
    /// directory).
    #[serde(default)]
    pub runner: bool,
    /// The name it was opened by (`Lifecycle::open`), where it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// It sleeps: its supervisor takes no exec until it wakes.
    #[serde(default)]
    pub asleep: bool,
    /// The snapshot it was made from, where it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

impl Record {
    /// The record in `dir`; `None` when there is none (a create under way, or a sweep).
    pub(super) fn read(dir: &Path) -> Result<Option<Record>> {
        crate::boxdir::read_record(&dir.join(FILE))
    }

    /// Write the record, whole or not at all.
    pub(super) fn write(&self, dir: &Path) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| Error::unknown(e.to_string()))?;
        write_atomic(&dir.join(FILE), &bytes)
    }

    /// Hold the box's lock (a file beside the record) while a change reads the record and
    /// writes it again: two changes at once never lose one another. Waited for at most 30 s,
    /// without blocking a thread of the runtime.
    pub(super) async fn lock(dir: &Path, what: &str) -> Result<crate::lock::Locked> {
        crate::lock::lock(&dir.join("record.lock"), std::time::Duration::from_secs(30), what)
            .await?
            .ok_or_else(|| Error::gone(format!("{what}: the box's directory {} is gone", dir.display())))
    }

    /// The supervisor still runs (and so the box has not been ended).
    pub(super) fn supervisor_alive(&self) -> bool {
        agentbox_proc::stat(self.supervisor_pid)
            .is_some_and(|s| s.start_time == self.supervisor_start && !s.is_zombie())
    }
}

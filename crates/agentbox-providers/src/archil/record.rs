//! A box's record: `boxes.records/<id>.json` on the disk, outside every box's directory, so a
//! box's own commands never hold it in a checkout and attach and list find the box after a
//! restart. It keeps what only the maker knew (labels, start, end); the facts are the
//! provider's, rebuilt from it, so a record that a command on the shared disk rewrote cannot
//! grant a box more than any archil box gets.

use agentbox_core::{Error, Facts, Labels, Result, validate_labels};
use serde::{Deserialize, Serialize};

use super::{MAX_CPUS, MAX_MEMORY_MB, NAME, RECORDS, WORKSPACE};

/// The format's version, so a later one is read or refused knowingly.
pub(crate) const VERSION: u32 = 1;
/// The most of a record read: labels are bounded well below it.
pub(crate) const MAX_RECORD: u64 = 1 << 20;

/// What the disk keeps of one box.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Record {
    pub version: u32,
    /// The box's own name (the id less `archil:`).
    pub id: String,
    pub labels: Labels,
    pub started_at_ms: u64,
    pub ends_at_ms: u64,
}

impl Record {
    /// The record's key on the disk.
    pub(crate) fn key(name: &str) -> String {
        format!("{RECORDS}/{name}.json")
    }

    /// A record as the disk holds it, checked: it must be this box's, of a version read here,
    /// with labels a spec could have carried.
    pub(crate) fn parse(bytes: &[u8], name: &str) -> Result<Self> {
        let r: Record = serde_json::from_slice(bytes)
            .map_err(|e| Error::invalid(format!("the record of archil box {name} does not read: {e}")))?;
        if r.version != VERSION {
            return Err(Error::invalid(format!(
                "the record of archil box {name} is of version {}, not {VERSION}",
                r.version
            )));
        }
        if r.id != name {
            return Err(Error::invalid(format!(
                "the record of archil box {name} names box {:?}",
                r.id
            )));
        }
        validate_labels(&r.labels).map_err(|e| e.context(format!("the record of archil box {name}")))?;
        Ok(r)
    }

    /// The record as written.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// The box's facts: the provider's own, with the record's start and end.
    pub(crate) fn facts(&self, max_exec_ms: u64) -> Facts {
        Facts {
            provider: NAME.into(),
            isolation: "vm".into(),
            cpus: Some(MAX_CPUS),
            memory_mb: Some(MAX_MEMORY_MB),
            ports: Some(vec![]),
            started_at_ms: Some(self.started_at_ms),
            ends_at_ms: Some(self.ends_at_ms),
            live_processes: false,
            billed_per_call: true,
            // Its exec takes no stdin: a seed or a pull moves as a file.
            bulk: Some(agentbox_core::Bulk::Files),
            max_exec_ms: Some(max_exec_ms),
            workspace: Some(WORKSPACE.into()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_a_foreign_one_is_refused() {
        let mut labels = Labels::new();
        labels.insert("task".into(), "a".into());
        let r = Record {
            version: VERSION,
            id: "0123456789abcdef".into(),
            labels,
            started_at_ms: 5,
            ends_at_ms: 9,
        };
        let back = Record::parse(&r.to_bytes(), "0123456789abcdef").unwrap();
        assert_eq!(back, r);
        assert_eq!(back.facts(300_000).ends_at_ms, Some(9));
        assert!(!back.facts(300_000).live_processes);
        let e = Record::parse(&r.to_bytes(), "ffffffffffffffff").unwrap_err();
        assert!(e.message().contains("names box"), "{e}");
        assert!(Record::parse(b"{", "x").is_err());
        let mut bad = r.clone();
        bad.labels.insert("agentbox.provider".into(), "x".into());
        assert!(Record::parse(&bad.to_bytes(), "0123456789abcdef").is_err());
        let mut later = r;
        later.version = 2;
        assert!(
            Record::parse(&later.to_bytes(), "0123456789abcdef")
                .unwrap_err()
                .message()
                .contains("version")
        );
    }
}

//! What an extraction did: written, skipped by reason, modes masked, and why it stopped.

use std::collections::BTreeMap;

use serde::Serialize;

/// At most this many skips are named in [`Receipt::skips`]; the rest are only counted.
pub const MAX_NAMED_SKIPS: usize = 100;

/// Why a member was not written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// A symbolic link (its target is in the skip).
    Symlink,
    /// A hard link (its target is in the skip).
    Hardlink,
    /// A character or block device.
    Device,
    /// A named pipe.
    Fifo,
    /// Any other member type (sparse files, volume labels…).
    Other,
    /// A pax global header: never honoured.
    PaxGlobal,
    /// A name that is absolute, holds `.`, `..`, an empty segment or NUL, or is too long.
    UnsafeName,
    /// The caller's `admit` said no.
    NotAdmitted,
    /// A second member of a path already extracted.
    Duplicate,
    /// A symbolic link in the destination where a directory or the file was: never followed.
    LinkInDestination,
    /// A file where a directory is asked for, or the other way round.
    Occupied,
    /// The destination's file is newer (`keep: newer`).
    KeptNewer,
}

/// One skipped member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Skip {
    /// Its name as the archive gives it (lossy UTF-8).
    pub path: String,
    /// Why.
    pub reason: SkipReason,
    /// What a link names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// Why an extraction stopped before the archive's end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Stopped {
    /// `malformed`, `too_large`, `too_many_entries`, `transfer_failed`, `copy_failed` or `stalled`.
    pub reason: StopReason,
    /// What happened.
    pub message: String,
}

/// The reasons an extraction stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The archive is not a well-formed tar: a bad checksum, a lone zero block, a cut, or pax
    /// and ustar headers that disagree.
    Malformed,
    /// Past the byte bound.
    TooLarge,
    /// Past the entry bound.
    TooManyEntries,
    /// This machine's own file system failed.
    TransferFailed,
    /// The other side's copy failed after the archive began (a pull: the box's pack exited
    /// with an error, a file it listed could not be read): what came is written, and what did
    /// not is named by the pull.
    CopyFailed,
    /// The other side sent no byte for the stall limit, and the copy was stopped.
    Stalled,
}

/// The receipt of one extraction. What was written before a stop stays, every file whole.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Receipt {
    /// Files and directories written.
    pub written: u64,
    /// Members skipped, by reason.
    pub skipped: BTreeMap<SkipReason, u64>,
    /// The first skips by path.
    pub skips: Vec<Skip>,
    /// Files written that lost a mode bit.
    pub masked: u64,
    /// Why it stopped early, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<Stopped>,
}

impl Receipt {
    pub(crate) fn skip(&mut self, path: &[u8], reason: SkipReason, target: Option<&[u8]>) {
        *self.skipped.entry(reason).or_default() += 1;
        if self.skips.len() < MAX_NAMED_SKIPS {
            self.skips.push(Skip {
                path: String::from_utf8_lossy(path).into_owned(),
                reason,
                target: target.map(|t| String::from_utf8_lossy(t).into_owned()),
            });
        }
    }

    /// Members skipped in all.
    pub fn skipped_total(&self) -> u64 {
        self.skipped.values().sum()
    }
}

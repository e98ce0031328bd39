//! What the providers that keep each box as a directory of this machine (local, namespace)
//! share: the directory of boxes, a box's record read back by any process, the names listed
//! in a stable order, and the age that tells a create that died from one under way.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentbox_core::{Error, Labels, Result};

/// A directory with no record older than this is the leftover of a create that died.
pub(crate) const ORPHAN_DIR_AGE: Duration = Duration::from_secs(600);

/// `root/sub`, made (mode 0700, with its parents) when missing: boxes of one user only.
pub(crate) fn make_boxes_dir(root: &Path, sub: &str) -> Result<PathBuf> {
    let boxes = root.join(sub);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&boxes)
        .map_err(|e| Error::io(e, format!("creating {}", boxes.display())))?;
    Ok(boxes)
}

/// The JSON record at `path`; `None` when there is none (a create under way, or a directory
/// being removed under the reader).
pub(crate) fn read_record<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(Error::io(e, format!("reading {}", path.display()))),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::invalid(format!("{}: not a box record: {e}", path.display())))
}

/// The names in `boxes`, sorted; none when the directory is missing.
pub(crate) fn names(boxes: &Path) -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(boxes) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(Error::io(e, format!("listing {}", boxes.display()))),
    };
    let mut names: Vec<String> = entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
    names.sort();
    Ok(names)
}

/// Every label asked for is the box's, with the same value.
pub(crate) fn labels_match(have: &Labels, want: &Labels) -> bool {
    want.iter().all(|(k, v)| have.get(k) == Some(v))
}

/// `dir` was last changed more than [`ORPHAN_DIR_AGE`] ago.
pub(crate) fn is_old(dir: &Path) -> bool {
    std::fs::metadata(dir)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age > ORPHAN_DIR_AGE)
}

//! A file replaced whole: a reader sees the old file or the whole new one, never half (a box's
//! record, a name's spec, a snapshot's manifest).

use std::path::Path;

use agentbox_core::{Error, Result};

/// Write `bytes` to `path` so a reader sees the old file or the whole new one: a temporary
/// file beside it, synced, then renamed over it.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io(e, format!("creating {}", tmp.display())))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::io(e, format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(e, format!("renaming {} into place", tmp.display())))
}

//! What the providers that keep each box as a directory of this machine (local, namespace)
//! share: the directory of boxes, a box's record read back by any process, the names listed
//! in a stable order, and the age that tells a create that died from one under way.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
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

/// Copy the tree `src` into `dst` (made, mode 0700, with what it holds): directories, regular
/// files with their modes, and symbolic links as links (never followed, so a link a box made
/// to this machine's files copies as a link, not as those files). Sockets, fifos and devices
/// are left out. Answers the bytes of file content copied.
///
/// What it copies is the box's own writable files, so a link anywhere in `src` is only ever
/// read as a link, and `dst` is made fresh (it must not exist).
pub(crate) fn copy_tree(src: &Path, dst: &Path) -> Result<u64> {
    use std::os::unix::fs::PermissionsExt;
    let mut bytes = 0u64;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dst)
        .map_err(|e| Error::io(e, format!("creating {}", dst.display())))?;
    let mut stack = vec![(src.to_path_buf(), dst.to_path_buf())];
    while let Some((from, to)) = stack.pop() {
        let entries = std::fs::read_dir(&from).map_err(|e| Error::io(e, format!("listing {}", from.display())))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(e, format!("listing {}", from.display())))?;
            let (f, t) = (entry.path(), to.join(entry.file_name()));
            let meta = std::fs::symlink_metadata(&f).map_err(|e| Error::io(e, format!("reading {}", f.display())))?;
            let kind = meta.file_type();
            if kind.is_symlink() {
                let target = std::fs::read_link(&f).map_err(|e| Error::io(e, format!("reading {}", f.display())))?;
                std::os::unix::fs::symlink(&target, &t)
                    .map_err(|e| Error::io(e, format!("linking {}", t.display())))?;
            } else if kind.is_dir() {
                std::fs::DirBuilder::new()
                    .mode(meta.permissions().mode() & 0o7777 | 0o700)
                    .create(&t)
                    .map_err(|e| Error::io(e, format!("creating {}", t.display())))?;
                stack.push((f, t));
            } else if kind.is_file() {
                // Opened without following a link: the entry was a regular file a moment ago,
                // and a link put in its place since is refused rather than read through.
                let mut r = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
                    .open(&f)
                    .map_err(|e| Error::io(e, format!("reading {}", f.display())))?;
                let mut w = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(meta.permissions().mode() & 0o7777)
                    .open(&t)
                    .map_err(|e| Error::io(e, format!("creating {}", t.display())))?;
                bytes += std::io::copy(&mut r, &mut w).map_err(|e| Error::io(e, format!("copying {}", f.display())))?;
            }
        }
    }
    Ok(bytes)
}

//! Removing paths under a directory by the same walk as extraction: a file or a link is
//! unlinked (never what a link names), a directory only when empty.

use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::names::segments;

/// What [`remove_entries`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Removed {
    /// Paths removed.
    pub removed: u64,
    /// Paths left: missing, unsafe, behind a link, or a directory with entries.
    pub left: Vec<String>,
}

/// Remove each relative path under `dir`.
pub fn remove_entries(dir: &Path, paths: &[String]) -> std::io::Result<Removed> {
    let root = rustix::fs::open(dir, OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
    let mut out = Removed::default();
    for p in paths {
        match remove_one(&root, p.as_bytes()) {
            Ok(true) => out.removed += 1,
            Ok(false) => out.left.push(p.clone()),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

fn remove_one(root: &OwnedFd, path: &[u8]) -> Result<bool, Errno> {
    let Some(segs) = segments(path) else { return Ok(false) };
    let mut dir = rustix::io::fcntl_dupfd_cloexec(root, 0)?;
    for seg in &segs[..segs.len() - 1] {
        match rustix::fs::openat(
            &dir,
            seg.as_slice(),
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(d) => dir = d,
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    let last = segs[segs.len() - 1].as_slice();
    let kind = match rustix::fs::statat(&dir, last, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => FileType::from_raw_mode(st.st_mode),
        Err(Errno::NOENT) => return Ok(false),
        Err(e) => return Err(e),
    };
    let flags = if kind == FileType::Directory {
        AtFlags::REMOVEDIR
    } else {
        AtFlags::empty()
    };
    match rustix::fs::unlinkat(&dir, last, flags) {
        Ok(()) => Ok(true),
        Err(Errno::NOTEMPTY | Errno::EXIST | Errno::NOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

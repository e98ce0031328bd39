//! What the providers that keep each box as a directory of this machine (local, namespace)
//! share: the directory of boxes, a box's record read back by any process, the names listed
//! in a stable order, and the age that tells a create that died from one under way.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentbox_core::{Error, Labels, Result};

pub(crate) mod snapshots;

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
/// `src` may be a running box's own files, changing under the copy: every entry is opened
/// relative to its parent's open descriptor with `O_NOFOLLOW`, so a directory or file the box
/// swaps for a link between the look and the open is refused (the copy fails) rather than
/// followed to this machine's files, and a file swapped for a fifo is opened without blocking
/// and then left out. `dst` is made fresh (it must not exist). At most [`MAX_COPY_DEPTH`]
/// directories deep.
///
/// Nothing a box holds multiplies on this machine's disk: files hard-linked to one another are
/// hard-linked in the copy, and a copy that would leave less than [`COPY_RESERVE`] free on the
/// copy's file system (a sparse file's holes are written out) fails `too_large` before it does.
pub(crate) fn copy_tree(src: &Path, dst: &Path) -> Result<u64> {
    copy_tree_within(src, dst, None)
}

/// What a copy leaves free on the file system it writes to, at least.
pub(crate) const COPY_RESERVE: u64 = 1 << 30;

/// [`copy_tree`], copying at most `budget` bytes of content where given (else what the copy's
/// file system has free, less [`COPY_RESERVE`]).
pub(crate) fn copy_tree_within(src: &Path, dst: &Path, budget: Option<u64>) -> Result<u64> {
    use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let io = |e: rustix::io::Errno, what: &str, p: &Path| Error::io(e.into(), format!("{what} {}", p.display()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dst)
        .map_err(|e| Error::io(e, format!("creating {}", dst.display())))?;
    let src_fd = rustix::fs::open(src, dir_flags, Mode::empty()).map_err(|e| io(e, "opening", src))?;
    let dst_fd = rustix::fs::open(dst, dir_flags, Mode::empty()).map_err(|e| io(e, "opening", dst))?;
    let budget = match budget {
        Some(b) => b,
        None => {
            let fs = rustix::fs::fstatvfs(&dst_fd).map_err(|e| io(e, "reading the file system of", dst))?;
            fs.f_bavail.saturating_mul(fs.f_frsize).saturating_sub(COPY_RESERVE)
        }
    };
    let mut bytes = 0u64;
    // The copy of each file with more than one name, by its device and inode: the next name
    // is a hard link to it.
    let mut linked: std::collections::HashMap<(u64, u64), PathBuf> = std::collections::HashMap::new();
    // Depth first, one open directory (and its copy) a level.
    let mut stack = vec![(
        Dir::new(src_fd).map_err(|e| io(e, "reading", src))?,
        dst_fd,
        src.to_path_buf(),
        dst.to_path_buf(),
    )];
    loop {
        let depth = stack.len();
        let Some((dir, to, at, to_path)) = stack.last_mut() else {
            break;
        };
        let Some(entry) = dir.next() else {
            stack.pop();
            continue;
        };
        let entry = entry.map_err(|e| io(e, "listing", at))?;
        let name = entry.file_name().to_owned();
        if name.as_bytes() == b"." || name.as_bytes() == b".." {
            continue;
        }
        let path = at.join(std::ffi::OsStr::from_bytes(name.as_bytes()));
        let from = dir.fd().map_err(|e| io(e, "reading", at))?;
        let st = rustix::fs::statat(from, &name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| io(e, "reading", &path))?;
        let mode = Mode::from_raw_mode(st.st_mode) & Mode::from_bits_truncate(0o7777);
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(from, &name, Vec::new()).map_err(|e| io(e, "reading", &path))?;
                rustix::fs::symlinkat(&target, &*to, &name).map_err(|e| io(e, "linking", &path))?;
            }
            FileType::Directory => {
                if depth >= MAX_COPY_DEPTH {
                    return Err(Error::too_large(format!(
                        "copying {}: over {MAX_COPY_DEPTH} directories deep",
                        src.display()
                    )));
                }
                let sub =
                    rustix::fs::openat(from, &name, dir_flags, Mode::empty()).map_err(|e| io(e, "opening", &path))?;
                rustix::fs::mkdirat(&*to, &name, mode | Mode::RWXU)
                    .map_err(|e| io(e, "creating the copy of", &path))?;
                let sub_to = rustix::fs::openat(&*to, &name, dir_flags, Mode::empty())
                    .map_err(|e| io(e, "opening the copy of", &path))?;
                let sub = Dir::new(sub).map_err(|e| io(e, "reading", &path))?;
                let sub_to_path = to_path.join(std::ffi::OsStr::from_bytes(name.as_bytes()));
                stack.push((sub, sub_to, path, sub_to_path));
            }
            FileType::RegularFile => {
                let copy_path = to_path.join(std::ffi::OsStr::from_bytes(name.as_bytes()));
                let key = (st.st_dev, st.st_ino);
                if st.st_nlink > 1
                    && let Some(first) = linked.get(&key)
                {
                    std::fs::hard_link(first, &copy_path)
                        .map_err(|e| Error::io(e, format!("linking the copy of {}", path.display())))?;
                    continue;
                }
                let size = u64::try_from(st.st_size).unwrap_or(u64::MAX);
                if bytes.saturating_add(size) > budget {
                    return Err(Error::too_large(format!(
                        "copying {}: its files come to more than the {budget} bytes the copy may take \
                         (what {} has free, less a reserve of {COPY_RESERVE})",
                        src.display(),
                        dst.display()
                    )));
                }
                let r = rustix::fs::openat(
                    from,
                    &name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| io(e, "reading", &path))?;
                // What was opened is what is copied: a fifo or a device put in the file's
                // place since the look is left out too.
                if !FileType::from_raw_mode(rustix::fs::fstat(&r).map_err(|e| io(e, "reading", &path))?.st_mode)
                    .is_file()
                {
                    continue;
                }
                let w = rustix::fs::openat(
                    &*to,
                    &name,
                    OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    mode,
                )
                .map_err(|e| io(e, "creating the copy of", &path))?;
                // The mode exactly, whatever the umask took from it.
                rustix::fs::fchmod(&w, mode).map_err(|e| io(e, "creating the copy of", &path))?;
                let (r, mut w) = (std::fs::File::from(r), std::fs::File::from(w));
                // Bounded as it is read too: the file may grow under the copy.
                let left = budget - bytes;
                let n = std::io::copy(&mut std::io::Read::take(r, left.saturating_add(1)), &mut w)
                    .map_err(|e| Error::io(e, format!("copying {}", path.display())))?;
                if n > left {
                    return Err(Error::too_large(format!(
                        "copying {}: {} grew past the {budget} bytes the copy may take",
                        src.display(),
                        path.display()
                    )));
                }
                bytes += n;
                if st.st_nlink > 1 {
                    linked.insert(key, copy_path);
                }
            }
            _ => {}
        }
    }
    Ok(bytes)
}

/// How deep [`copy_tree`] goes: two descriptors a level are open at once.
pub(crate) const MAX_COPY_DEPTH: usize = 256;

/// Remove a box's directory, opening up what the box left without permission for its owner.
pub(crate) fn remove_tree(dir: &Path) {
    if std::fs::remove_dir_all(dir).is_ok() || !dir.exists() {
        return;
    }
    fn open_up(d: &Path) {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700));
        if let Ok(entries) = std::fs::read_dir(d) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    open_up(&e.path());
                }
            }
        }
    }
    open_up(dir);
    let _ = std::fs::remove_dir_all(dir);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, mpsc};

    #[test]
    fn hard_links_stay_links_and_a_copy_past_its_budget_is_refused_before_it_writes() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        std::fs::create_dir_all(src.join("d")).unwrap();
        std::fs::write(src.join("one"), vec![7u8; 4096]).unwrap();
        for i in 0..50 {
            std::fs::hard_link(src.join("one"), src.join("d").join(format!("link{i}"))).unwrap();
        }
        let dst = t.path().join("dst");
        // Fifty-one names of one 4 KiB file: copied once, within a budget of 8 KiB.
        assert_eq!(copy_tree_within(&src, &dst, Some(8192)).unwrap(), 4096);
        let first = std::fs::metadata(dst.join("one")).unwrap();
        assert_eq!(first.nlink(), 51, "every name of the file is a link to one copy");
        assert_eq!(std::fs::metadata(dst.join("d/link7")).unwrap().ino(), first.ino());
        // A sparse file larger than the disk has free (no block of it written) is refused by
        // its size, before a byte of it is copied.
        let sparse = t.path().join("sparse");
        std::fs::create_dir(&sparse).unwrap();
        let fs = rustix::fs::statvfs(t.path()).unwrap();
        let free = fs.f_bavail * fs.f_frsize;
        std::fs::File::create(sparse.join("holes"))
            .unwrap()
            .set_len(free + (2 << 30))
            .unwrap();
        let e = copy_tree(&sparse, &t.path().join("sparse-copy")).unwrap_err();
        assert_eq!(e.code(), agentbox_core::ErrorCode::TooLarge, "{e}");
        assert_eq!(
            std::fs::metadata(t.path().join("sparse-copy/holes"))
                .map(|m| m.len())
                .unwrap_or(0),
            0,
            "nothing of it was written"
        );
    }

    #[test]
    fn a_copy_keeps_files_modes_and_links_and_leaves_out_fifos() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        std::fs::create_dir_all(src.join("a/b")).unwrap();
        std::fs::write(src.join("a/b/f"), b"hello").unwrap();
        std::fs::write(src.join("x"), b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(src.join("x"), std::fs::Permissions::from_mode(0o751)).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", src.join("l")).unwrap();
        rustix::fs::mkfifoat(rustix::fs::CWD, src.join("p"), rustix::fs::Mode::from_raw_mode(0o600)).unwrap();
        let dst = t.path().join("dst");
        assert_eq!(copy_tree(&src, &dst).unwrap(), 15);
        assert_eq!(std::fs::read(dst.join("a/b/f")).unwrap(), b"hello");
        assert_eq!(
            std::fs::metadata(dst.join("x")).unwrap().permissions().mode() & 0o7777,
            0o751
        );
        assert_eq!(std::fs::read_link(dst.join("l")).unwrap(), Path::new("/etc/hostname"));
        assert!(!dst.join("p").exists() && std::fs::symlink_metadata(dst.join("p")).is_err());
        assert!(copy_tree(&src, &dst).is_err(), "dst must not exist");
    }

    /// A box swaps a directory for a link to this machine's files, and a file for a fifo, as
    /// fast as it can while its files are copied: no copy holds what the link points to, and
    /// none hangs on the fifo. (The copy before this one followed the swapped link with
    /// `read_dir`, and blocked opening the fifo for reading.)
    #[test]
    fn a_copy_of_a_tree_that_changes_under_it_follows_no_link_and_opens_no_fifo() {
        let t = tempfile::tempdir().unwrap();
        let secret = t.path().join("secret");
        std::fs::create_dir(&secret).unwrap();
        std::fs::write(secret.join("key"), b"host's").unwrap();
        let src = t.path().join("src");
        std::fs::create_dir_all(src.join("d")).unwrap();
        std::fs::write(src.join("d/own"), b"box's").unwrap();
        std::os::unix::fs::symlink(&secret, src.join("alt")).unwrap();
        std::fs::write(src.join("f"), b"file").unwrap();
        rustix::fs::mkfifoat(rustix::fs::CWD, src.join("g"), rustix::fs::Mode::from_raw_mode(0o600)).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let (src, stop) = (src.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for (a, b) in [("d", "alt"), ("f", "g")] {
                        let _ = rustix::fs::renameat_with(
                            rustix::fs::CWD,
                            src.join(a),
                            rustix::fs::CWD,
                            src.join(b),
                            rustix::fs::RenameFlags::EXCHANGE,
                        );
                    }
                }
            })
        };
        let (tx, rx) = mpsc::channel();
        {
            let (src, root) = (src.clone(), t.path().to_path_buf());
            std::thread::spawn(move || {
                for i in 0..400 {
                    let dst = root.join(format!("copy{i}"));
                    let _ = copy_tree(&src, &dst);
                    let leaked = holds(&dst, b"host's");
                    let _ = remove_copy(&dst);
                    if tx.send(leaked).is_err() {
                        return;
                    }
                }
            });
        }
        let mut copies = 0;
        loop {
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(leaked) => {
                    assert!(!leaked, "copy {copies} holds the host's file behind the link");
                    copies += 1;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    stop.store(true, Ordering::Relaxed);
                    panic!("a copy hung (on the fifo?) after {copies} copies");
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        assert_eq!(copies, 400);
    }

    /// Some regular file in the tree at `dir`, walked without following a link, holds `what`.
    fn holds(dir: &Path, what: &[u8]) -> bool {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return false;
        };
        entries.flatten().any(|e| match std::fs::symlink_metadata(e.path()) {
            Ok(m) if m.is_dir() => holds(&e.path(), what),
            Ok(m) if m.is_file() => std::fs::read(e.path()).is_ok_and(|b| b == what),
            _ => false,
        })
    }

    fn remove_copy(dst: &Path) -> std::io::Result<()> {
        std::fs::remove_dir_all(dst)
    }
}

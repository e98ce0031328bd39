//! The file operations a runner serves, as the host's own system calls in the box: each
//! behaves as the same call does on the host (hands' `HostEnv`), so a failure carries the
//! errno the host would have seen.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use agentbox_protocol::runner::{Answer, Kind, MAX_MESSAGE, Meta};

/// The largest file a single `read` or `write` frame carries: a message less its header.
pub(super) const MAX_FILE: u64 = (MAX_MESSAGE - 16) as u64;

/// A failed operation as the answer the client reads: the errno and its name, and a message
/// naming the path.
pub(super) fn io_error(id: u32, e: &std::io::Error, path: &str) -> Answer {
    let errno = e.raw_os_error();
    Answer::Error {
        id: Some(id),
        message: format!("{path}: {e}"),
        code: Some(errno.map(errno_name).unwrap_or("unknown").to_string()),
        errno,
    }
}

fn errno_name(n: i32) -> &'static str {
    use rustix::io::Errno as E;
    match E::from_raw_os_error(n) {
        E::PERM => "EPERM",
        E::NOENT => "ENOENT",
        E::ACCESS => "EACCES",
        E::EXIST => "EEXIST",
        E::NOTDIR => "ENOTDIR",
        E::ISDIR => "EISDIR",
        E::INVAL => "EINVAL",
        E::NOSPC => "ENOSPC",
        E::ROFS => "EROFS",
        E::NAMETOOLONG => "ENAMETOOLONG",
        E::NOTEMPTY => "ENOTEMPTY",
        E::LOOP => "ELOOP",
        _ => "EIO",
    }
}

/// The error a directory gives where a file was asked for.
fn is_a_directory() -> std::io::Error {
    rustix::io::Errno::ISDIR.into()
}

/// A path's metadata as the protocol carries it.
pub(super) fn meta_of(path: &str, m: &std::fs::Metadata) -> Meta {
    let ft = m.file_type();
    let kind = if ft.is_symlink() {
        Kind::Symlink
    } else if ft.is_dir() {
        Kind::Dir
    } else if ft.is_file() {
        Kind::File
    } else {
        Kind::Other
    };
    Meta {
        name: Path::new(path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.to_string()),
        kind,
        size: m.len(),
        mode: m.mode() & 0o7777,
        mtime_ms: m.mtime() * 1000 + m.mtime_nsec() / 1_000_000,
    }
}

/// What a `read` answers: the bytes, `None` for a missing file, or an error answer.
pub(super) fn read(id: u32, path: &str, offset: Option<u64>, length: Option<u64>) -> Result<Option<Vec<u8>>, Answer> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(id, &e, path)),
    };
    let meta = f.metadata().map_err(|e| io_error(id, &e, path))?;
    if meta.is_dir() {
        return Err(io_error(id, &is_a_directory(), path));
    }
    let offset = offset.unwrap_or(0);
    let want = match length {
        Some(n) => n,
        None => meta.len().saturating_sub(offset),
    };
    if want > MAX_FILE {
        return Err(Answer::error(
            Some(id),
            "too_large",
            format!("{path}: {want} bytes asked for, over the {MAX_FILE} one message carries: read it by ranges"),
        ));
    }
    if offset > 0 {
        f.seek(SeekFrom::Start(offset)).map_err(|e| io_error(id, &e, path))?;
    }
    let mut out = Vec::with_capacity(want.min(1 << 20) as usize);
    // Bounded while reading: the file may have grown since its length was read.
    let limit = if length.is_some() { want } else { MAX_FILE + 1 };
    f.take(limit)
        .read_to_end(&mut out)
        .map_err(|e| io_error(id, &e, path))?;
    if out.len() as u64 > MAX_FILE {
        return Err(Answer::error(
            Some(id),
            "too_large",
            format!("{path}: grew over the {MAX_FILE} bytes one message carries while it was read"),
        ));
    }
    Ok(Some(out))
}

/// Write (or append) `bytes` to `path`, making missing parents first.
///
/// A write that replaces a file is whole or not at all: the bytes go to a new file beside it,
/// renamed over it once written, so a runner killed mid-write (or a full disk) leaves the old
/// file as it was, never a part of the new one. The open the host would make runs first and
/// decides every error (a directory, a file this user may not write). A file with other hard
/// links, a symlink, or a directory where no file can be made beside it is written in place,
/// as the host writes it: replacing it would cut the link or the symlink. So is one the
/// rename cannot replace (a file bind-mounted in, as a container's `/etc/hosts`; another
/// user's file in a sticky directory), which the host's own write can.
pub(super) fn write(id: u32, path: &str, bytes: &[u8], mode: Option<u32>, append: bool) -> Answer {
    if let Some(parent) = Path::new(path).parent() {
        // A parent that cannot be made shows as the open's own error below.
        let _ = std::fs::create_dir_all(parent);
    }
    let done = |r: std::io::Result<()>| match r {
        Ok(()) => Answer::Ok { id },
        Err(e) => io_error(id, &e, path),
    };
    if append {
        return done(in_place(path, bytes, mode, true));
    }
    let linked = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    let old = match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(f) => match f.metadata() {
            Ok(m) if m.is_file() && m.nlink() == 1 && !linked => Some(m),
            Ok(_) => return done(in_place(path, bytes, mode, false)),
            Err(e) => return io_error(id, &e, path),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !linked => None,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return done(in_place(path, bytes, mode, false)),
        Err(e) => return io_error(id, &e, path),
    };
    match replace(path, bytes, mode, old.as_ref()) {
        Some(r) => done(r),
        None => done(in_place(path, bytes, mode, false)),
    }
}

/// The host's own write: open (made when missing), truncated or appended to, written.
fn in_place(path: &str, bytes: &[u8], mode: Option<u32>, append: bool) -> std::io::Result<()> {
    let mut o = std::fs::OpenOptions::new();
    o.create(true);
    if append {
        o.append(true);
    } else {
        o.write(true).truncate(true);
    }
    if let Some(m) = mode {
        o.mode(m & 0o7777);
    }
    o.open(path).and_then(|mut f| f.write_all(bytes))
}

/// Write `bytes` to a new file beside `path` and rename it over `path`, with the old file's
/// mode and owner (`old`) or, for a new file, `mode`. `None` when no file can be made beside
/// it (a directory this user may not write) or the rename cannot replace it (a mount point,
/// a sticky directory): the caller writes in place.
fn replace(
    path: &str,
    bytes: &[u8],
    mode: Option<u32>,
    old: Option<&std::fs::Metadata>,
) -> Option<std::io::Result<()>> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let at = Path::new(path);
    let name = at.file_name()?.to_string_lossy();
    let temp = at.with_file_name(format!(
        ".{name}.agentbox-write-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    o.mode(old.map(|m| m.mode()).or(mode).unwrap_or(0o666) & 0o7777);
    let mut f = o.open(&temp).ok()?;
    let written = (|| {
        if let Some(m) = old {
            // The old file's mode as it was (the umask narrowed the new one's), and its owner
            // where this user may give it (root may; others own what they write anyway).
            let _ = std::os::unix::fs::fchown(&f, Some(m.uid()), Some(m.gid()));
            f.set_permissions(std::fs::Permissions::from_mode(m.mode() & 0o7777))?;
        }
        f.write_all(bytes)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Some(Err(e));
    }
    match std::fs::rename(&temp, path) {
        Ok(()) => Some(Ok(())),
        Err(_) => {
            let _ = std::fs::remove_file(&temp);
            None
        }
    }
}

/// Every other file operation: its answer.
pub(super) fn other(req: &agentbox_protocol::runner::Request) -> Answer {
    use agentbox_protocol::runner::Request as R;
    let id = req.id();
    let done = |r: std::io::Result<()>, path: &str| match r {
        Ok(()) => Answer::Ok { id },
        Err(e) => io_error(id, &e, path),
    };
    match req {
        R::Stat { path, follow, .. } => {
            let m = if *follow {
                std::fs::metadata(path)
            } else {
                std::fs::symlink_metadata(path)
            };
            match m {
                Ok(m) => Answer::Stat {
                    id,
                    meta: meta_of(path, &m),
                },
                Err(e) => io_error(id, &e, path),
            }
        }
        R::List { path, .. } => list(id, path),
        R::Mkdir { path, recursive, .. } => done(
            if *recursive {
                std::fs::create_dir_all(path)
            } else {
                std::fs::create_dir(path)
            },
            path,
        ),
        R::Remove {
            path, recursive, force, ..
        } => remove(id, path, *recursive, *force),
        R::Rename { from, to, .. } => done(std::fs::rename(from, to), from),
        R::Truncate { path, size, .. } => done(
            std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .and_then(|f| f.set_len(*size)),
            path,
        ),
        other => Answer::error(Some(id), "invalid", format!("{other:?} is not a file operation")),
    }
}

fn list(id: u32, path: &str) -> Answer {
    let rd = match std::fs::read_dir(path) {
        Ok(rd) => rd,
        Err(e) => return io_error(id, &e, path),
    };
    let mut entries = Vec::new();
    // Names and metadata, bounded by what one message carries.
    let mut size = 0usize;
    for e in rd {
        let e = match e {
            Ok(e) => e,
            Err(e) => return io_error(id, &e, path),
        };
        let name = e.file_name().to_string_lossy().into_owned();
        // An entry removed meanwhile is left out, as the host's listing leaves it.
        let Ok(m) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        size += name.len() + 96;
        if size > MAX_FILE as usize {
            return Answer::error(
                Some(id),
                "too_large",
                format!("{path}: its listing is over the {MAX_FILE} bytes one message carries"),
            );
        }
        let mut meta = meta_of(&name, &m);
        meta.name = name;
        entries.push(meta);
    }
    Answer::Entries { id, entries }
}

fn remove(id: u32, path: &str, recursive: bool, force: bool) -> Answer {
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e)
            if force
                && matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
        {
            return Answer::Ok { id };
        }
        Err(e) => return io_error(id, &e, path),
    };
    let r = if m.is_dir() {
        if !recursive {
            return io_error(id, &is_a_directory(), path);
        }
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    match r {
        Ok(()) => Answer::Ok { id },
        Err(e) => io_error(id, &e, path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(a: Answer) {
        assert!(matches!(a, Answer::Ok { id: 1 }), "{a:?}");
    }

    #[test]
    fn a_write_replaces_a_file_whole_and_keeps_what_the_host_keeps() {
        let dir = tempfile::tempdir().unwrap();
        let at = |n: &str| dir.path().join(n).to_string_lossy().into_owned();

        // Over a file: a new file renamed in, the old mode kept, nothing left beside it.
        std::fs::write(at("f"), b"old").unwrap();
        std::fs::set_permissions(at("f"), std::fs::Permissions::from_mode(0o640)).unwrap();
        let before = std::fs::metadata(at("f")).unwrap().ino();
        ok(write(1, &at("f"), b"new", Some(0o777), false));
        let m = std::fs::metadata(at("f")).unwrap();
        assert_eq!(std::fs::read(at("f")).unwrap(), b"new");
        assert_eq!(m.mode() & 0o7777, 0o640, "the old file's mode, not the asked one");
        assert_ne!(m.ino(), before, "replaced, not rewritten in place");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, ["f"], "no temporary file left");

        // A file with another hard link: written in place, both names see it.
        std::fs::hard_link(at("f"), at("g")).unwrap();
        ok(write(1, &at("f"), b"linked", None, false));
        assert_eq!(std::fs::read(at("g")).unwrap(), b"linked");

        // Through a symlink: the target written, the link still a link.
        std::fs::write(at("t"), b"target").unwrap();
        std::os::unix::fs::symlink(at("t"), at("l")).unwrap();
        ok(write(1, &at("l"), b"through", None, false));
        assert!(std::fs::symlink_metadata(at("l")).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(at("t")).unwrap(), b"through");

        // A new file, in a new directory; then an append.
        ok(write(1, &at("d/e/n"), b"a", None, false));
        ok(write(1, &at("d/e/n"), b"b", None, true));
        assert_eq!(std::fs::read(at("d/e/n")).unwrap(), b"ab");

        // A directory where the file should be: the host's error.
        std::fs::create_dir(at("dir")).unwrap();
        match write(1, &at("dir"), b"x", None, false) {
            Answer::Error { code, .. } => assert_eq!(code.as_deref(), Some("EISDIR")),
            a => panic!("{a:?}"),
        }
    }
}

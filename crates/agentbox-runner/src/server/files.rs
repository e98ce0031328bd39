//! The file operations a runner serves, as the host's own system calls in the box: each
//! behaves as the same call does on the host (hands' `HostEnv`), so a failure carries the
//! errno the host would have seen.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
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
pub(super) fn write(id: u32, path: &str, bytes: &[u8], mode: Option<u32>, append: bool) -> Answer {
    if let Some(parent) = Path::new(path).parent() {
        // A parent that cannot be made shows as the open's own error below.
        let _ = std::fs::create_dir_all(parent);
    }
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
    match o.open(path).and_then(|mut f| f.write_all(bytes)) {
        Ok(()) => Answer::Ok { id },
        Err(e) => io_error(id, &e, path),
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

//! A disk's files as the object API and the exec mounts reach them: every path is resolved
//! from a descriptor of the disk's directory with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS)`, so a key never leaves the disk, whatever `..` or symbolic link
//! a box left in it (a link that stays inside is followed, as a mounted file system would; one
//! that leads out fails `EXDEV`, answered AccessDenied). Leaves are then acted on relative to
//! their parent's descriptor (`renameat`, `unlinkat`, `mkdirat`), never by a host path.
//! A write follows a link at its leaf as `open(2)` with `O_CREAT` does ([`DiskRoot::write_target`]):
//! each link's destination is resolved from the disk's root, beneath it, so the file replaced
//! (or made, for a dangling link) is the one a read of the key would reach.
//! Written on rustix's calls rather than cap-std, which is not in the workspace; rustix is.
//!
//! When the fake runs as root, what it makes is given to the boxes' host id (the id a box's
//! root is mapped to), so a box writes what the object API wrote and the other way round.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, SystemTime};

use rustix::fs::{AtFlags, Dir, FileType, Gid, Mode, OFlags, ResolveFlags, Stat, Uid};
use rustix::io::Errno;

/// How resolving a path below a disk's root fails, as the object API tells it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FsError {
    /// Nothing there.
    NotFound,
    /// A parent on the way is not a directory.
    NotDir,
    /// The path leads out of the disk (through `..` or a symbolic link).
    Escapes,
    /// Too many symbolic links on the way (`ELOOP`): a loop.
    Loop,
    /// A directory where a file was meant.
    IsDir,
    /// A directory that still holds entries.
    NotEmpty,
    /// Anything else, as the system said it.
    Os(Errno),
}

impl From<Errno> for FsError {
    fn from(e: Errno) -> FsError {
        match e {
            Errno::NOENT => FsError::NotFound,
            Errno::NOTDIR => FsError::NotDir,
            Errno::XDEV => FsError::Escapes,
            Errno::LOOP => FsError::Loop,
            Errno::ISDIR => FsError::IsDir,
            // rmdir of a directory with entries may say either.
            Errno::NOTEMPTY | Errno::EXIST => FsError::NotEmpty,
            e => FsError::Os(e),
        }
    }
}

/// What an entry of a disk is, as a listing and a HEAD read it.
#[derive(Clone, Debug)]
pub(crate) struct Meta {
    pub(crate) kind: FileType,
    pub(crate) size: u64,
    pub(crate) mtime: SystemTime,
    pub(crate) ino: u64,
    mtime_ns: u64,
}

impl Meta {
    // `struct stat`'s field types differ between architectures (c_long here, i64 there): the
    // conversions are the same type on x86_64 alone.
    #[allow(clippy::useless_conversion)]
    pub(crate) fn of(st: &Stat) -> Meta {
        let secs = i64::from(st.st_mtime);
        let nanos = u64::from(st.st_mtime_nsec).min(999_999_999);
        let mtime = if secs >= 0 {
            SystemTime::UNIX_EPOCH + Duration::new(secs as u64, nanos as u32)
        } else {
            SystemTime::UNIX_EPOCH
        };
        Meta {
            kind: FileType::from_raw_mode(st.st_mode),
            size: u64::try_from(i64::from(st.st_size)).unwrap_or(0),
            mtime,
            ino: u64::from(st.st_ino),
            mtime_ns: (secs.max(0) as u64).saturating_mul(1_000_000_000).saturating_add(nanos),
        }
    }

    /// The entity tag: the file's inode, size and modification time, so it changes whenever
    /// the content does (through the object API or a box) and is the same for HEAD, GET and
    /// a listing. Not an MD5 of the content as S3's is: no client here reads it as one.
    pub(crate) fn etag(&self) -> String {
        format!("\"{:x}-{:x}-{:x}\"", self.ino, self.size, self.mtime_ns)
    }
}

/// The owner what the fake makes is given: the boxes' host id when the fake runs as root,
/// else nobody else's (the fake's own files are the boxes' then).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Owner(pub(crate) Option<u32>);

impl Owner {
    fn ids(self) -> Option<(Uid, Gid)> {
        self.0.map(|id| (Uid::from_raw(id), Gid::from_raw(id)))
    }

    /// Give `fd` (a regular descriptor) to the boxes' id.
    pub(crate) fn give(self, fd: &OwnedFd) -> Result<(), FsError> {
        if let Some((u, g)) = self.ids() {
            rustix::fs::fchown(fd, Some(u), Some(g))?;
        }
        Ok(())
    }

    /// Give `name` in `dir` to the boxes' id, not following a link.
    pub(crate) fn give_at(self, dir: &OwnedFd, name: &str) -> Result<(), FsError> {
        if let Some((u, g)) = self.ids() {
            rustix::fs::chownat(dir, name, Some(u), Some(g), AtFlags::SYMLINK_NOFOLLOW)?;
        }
        Ok(())
    }
}

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

/// The most symbolic links a write follows at its leaf (Linux's own bound, `MAXSYMLINKS`).
pub(crate) const MAX_LEAF_LINKS: usize = 40;

/// Where a write lands once the links at its leaf are followed: the directory that holds it
/// (beneath the disk), its name there, and what is there now (`None`: nothing; never a link).
pub(crate) struct WriteTarget {
    pub(crate) dir: OwnedFd,
    pub(crate) name: Vec<u8>,
    /// The path from the disk's root that reaches it (`..` and links in it resolve beneath).
    pub(crate) rel: Vec<u8>,
    pub(crate) kind: Option<FileType>,
}

/// `a` and `b` joined by a `/` (either may be empty).
fn join(a: &[u8], b: &[u8]) -> Vec<u8> {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_vec(),
        (_, true) => a.to_vec(),
        _ => [a, b"/", b].concat(),
    }
}

/// One disk's directory, held open for one request.
pub(crate) struct DiskRoot {
    fd: OwnedFd,
    pub(crate) owner: Owner,
}

/// The most entries one directory may have for a listing to read it.
pub(crate) const MAX_DIR_ENTRIES: usize = 1 << 20;

impl DiskRoot {
    pub(crate) fn open(dir: &Path, owner: Owner) -> Result<DiskRoot, FsError> {
        let fd = rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        Ok(DiskRoot { fd, owner })
    }

    /// `rel` (segments joined by `/`; empty: the root) opened beneath the disk.
    pub(crate) fn at(&self, rel: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, FsError> {
        self.at_bytes(rel.as_bytes(), flags, mode)
    }

    /// [`DiskRoot::at`] of a path that need not be UTF-8 (a link's destination may not be).
    pub(crate) fn at_bytes(&self, rel: &[u8], flags: OFlags, mode: Mode) -> Result<OwnedFd, FsError> {
        let path: &[u8] = if rel.is_empty() { b"." } else { rel };
        Ok(rustix::fs::openat2(
            &self.fd,
            path,
            flags | OFlags::CLOEXEC,
            mode,
            RESOLVE,
        )?)
    }

    /// The directory `segs` names, as a descriptor to act in.
    pub(crate) fn dir(&self, segs: &[String]) -> Result<OwnedFd, FsError> {
        self.at(&segs.join("/"), OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
    }

    /// The directory `segs` names, made where missing (each new one 0755, the boxes'),
    /// as a descriptor to act in.
    pub(crate) fn make_dirs(&self, segs: &[String]) -> Result<OwnedFd, FsError> {
        let mut cur = self.dir(&[])?;
        for i in 0..segs.len() {
            let here = &segs[..=i];
            cur = match self.dir(here) {
                Ok(fd) => fd,
                Err(FsError::NotFound) => {
                    match rustix::fs::mkdirat(&cur, segs[i].as_str(), Mode::from_raw_mode(0o755)) {
                        Ok(()) => self.owner.give_at(&cur, &segs[i])?,
                        Err(Errno::EXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                    self.dir(here)?
                }
                Err(e) => return Err(e),
            };
        }
        Ok(cur)
    }

    /// What a write to `leaf` in the directory `parent` (held open as `dir`) reaches, a
    /// symbolic link there followed as `open(2)` with `O_CREAT` follows it: each link's
    /// destination is resolved from the directory that holds the link, beneath the disk (an
    /// absolute link, or one whose `..` climbs out, is `Escapes`; one through a missing
    /// directory `NotFound`, through a file `NotDir`), until a name that is no link, or
    /// nothing (a dangling link: the file is made there). A destination that must be a
    /// directory (ending in `/`, `.` or `..`) is `IsDir`, as `O_CREAT` answers `EISDIR`; past
    /// [`MAX_LEAF_LINKS`] links, `Loop`.
    pub(crate) fn write_target(&self, parent: &[String], dir: OwnedFd, leaf: &str) -> Result<WriteTarget, FsError> {
        let mut dir = dir;
        let mut dir_rel = parent.join("/").into_bytes();
        let mut name = leaf.as_bytes().to_vec();
        let mut links = 0;
        loop {
            let kind = match rustix::fs::statat(&dir, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => Some(FileType::from_raw_mode(st.st_mode)),
                Err(Errno::NOENT) => None,
                Err(e) => return Err(e.into()),
            };
            if kind != Some(FileType::Symlink) {
                let rel = join(&dir_rel, &name);
                return Ok(WriteTarget { dir, name, rel, kind });
            }
            links += 1;
            if links > MAX_LEAF_LINKS {
                return Err(FsError::Loop);
            }
            let dest = rustix::fs::readlinkat(&dir, name.as_slice(), Vec::new())?.into_bytes();
            if dest.is_empty() {
                return Err(FsError::NotFound);
            }
            // RESOLVE_BENEATH refuses an absolute link, as a read of it is refused.
            if dest[0] == b'/' {
                return Err(FsError::Escapes);
            }
            // Not empty: the destination does not start with `/`.
            let trimmed = &dest[..dest.iter().rposition(|b| *b != b'/').map_or(0, |i| i + 1)];
            let slash = trimmed.len() < dest.len();
            let (head, last) = match trimmed.iter().rposition(|b| *b == b'/') {
                Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
                None => (&trimmed[..0], trimmed),
            };
            // Resolved from the disk's root through the link's own directory, so a `..` in
            // it may climb as far as the disk's root and no further.
            let head_rel = join(&dir_rel, head);
            let dots = last == b"." || last == b"..";
            if slash || dots {
                // Once the way there resolves, O_CREAT answers EISDIR for a name that must
                // be a directory, whatever is there.
                let way = if dots { join(&head_rel, last) } else { head_rel };
                self.at_bytes(&way, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
                return Err(FsError::IsDir);
            }
            dir = self.at_bytes(&head_rel, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
            dir_rel = head_rel;
            name = last.to_vec();
        }
    }

    /// A regular file to read: a directory is `IsDir`, anything else (a FIFO a box made,
    /// say) `NotFound`. Opened without blocking, so a FIFO never holds the request.
    pub(crate) fn open_file(&self, rel: &str) -> Result<(std::fs::File, Meta), FsError> {
        let fd = self.at(rel, OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY, Mode::empty())?;
        let meta = Meta::of(&rustix::fs::fstat(&fd)?);
        match meta.kind {
            // O_NONBLOCK changes nothing for a regular file.
            FileType::RegularFile => Ok((std::fs::File::from(fd), meta)),
            FileType::Directory => Err(FsError::IsDir),
            _ => Err(FsError::NotFound),
        }
    }

    /// The entries of directory `segs` (no `.`, `..`), each with what it is (not following
    /// links), unsorted. Past [`MAX_DIR_ENTRIES`]: `Os(E2BIG)`.
    pub(crate) fn entries(&self, segs: &[String]) -> Result<Vec<(String, Meta)>, FsError> {
        let fd = self.at(&segs.join("/"), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        let dir = Dir::read_from(&fd)?;
        let mut out = Vec::new();
        for entry in dir {
            let entry = entry?;
            let Ok(name) = entry.file_name().to_str() else {
                // A name that is not UTF-8 is no key.
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            if out.len() >= MAX_DIR_ENTRIES {
                return Err(FsError::Os(Errno::TOOBIG));
            }
            match rustix::fs::statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => out.push((name.to_string(), Meta::of(&st))),
                // Removed since the directory was read.
                Err(Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(out)
    }
}

/// The canonical host path of `fd`, as the kernel names it (for a bind mount's source).
pub(crate) fn path_of(fd: &OwnedFd) -> Result<std::path::PathBuf, FsError> {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| FsError::Os(Errno::from_io_error(&e).unwrap_or(Errno::IO)))
}

//! Unpacking a box's tar archive on this machine, trusting nothing in it.
//!
//! The `tar` crate is used as a parser only, in raw mode: pax headers and GNU long names are
//! read and checked here, so an archive cannot say one thing to this reader and another to
//! the next. Every directory is opened from a held handle of the one above with
//! `O_NOFOLLOW | O_DIRECTORY`, one segment at a time, so a link already in the destination is
//! never followed, whatever another process does meanwhile; every file is written under a
//! temporary name and renamed into place.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use tar::EntryType;

use crate::names::segments;
use crate::pax::{self, Pax};
use crate::receipt::{Receipt, Skip, SkipReason, StopReason, Stopped};

/// The default byte bound of an archive: 1 GiB.
pub const MAX_BYTES: u64 = 1 << 30;
/// The default bound on members written or skipped.
pub const MAX_ENTRIES: u64 = 100_000;
/// One pax header or GNU long name holds at most this much.
pub const MAX_EXTENSION: u64 = 64 * 1024;

/// What a member is, for `admit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
}

/// Decides by path and kind what may be written.
pub type Admit = Arc<dyn Fn(&str, Kind) -> bool + Send + Sync>;

/// Told of each member written, by its name in the archive and its kind.
pub type Written = Arc<dyn Fn(&str, Kind) + Send + Sync>;

/// Told of each skip as the extraction goes ([`Options::on_skip`]).
pub type Observe<T> = Arc<dyn Fn(&T) + Send + Sync>;

/// How an extraction is bounded and what it may write.
#[derive(Clone)]
pub struct Options {
    /// Bytes of archive read at most (every header block, extension payload and member data).
    pub max_bytes: u64,
    /// Members written or skipped at most.
    pub max_entries: u64,
    /// Keep a destination file newer than the member.
    pub keep_newer: bool,
    /// What may be written; everything when absent.
    pub admit: Option<Admit>,
    /// Each skip, as it happens: every one, where the receipt names only the first
    /// [`crate::MAX_NAMED_SKIPS`] (a caller that keeps links as data reads their targets here).
    pub on_skip: Option<Observe<Skip>>,
    /// Each member written (its name as the archive gives it, and its kind), once it is whole
    /// in place: what a pull marks as copied.
    pub on_written: Option<Written>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_bytes: MAX_BYTES,
            max_entries: MAX_ENTRIES,
            keep_newer: false,
            admit: None,
            on_skip: None,
            on_written: None,
        }
    }
}

/// Charges every byte before it is read, and refuses past the bound.
struct Bounded<R> {
    inner: R,
    left: u64,
    hit: bool,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            // One byte more would pass the bound: is there one?
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => {
                    self.hit = true;
                    Err(std::io::Error::other("the archive passed its byte bound"))
                }
            };
        }
        let want = buf.len().min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

enum Failure {
    /// The archive is at fault (malformed, cut, over a bound).
    Archive(String),
    /// This machine's file system is.
    Host(String),
}

/// Extract the tar read from `reader` into `dest` (made if missing). Never fails: what
/// happened, a stop included, is in the receipt.
///
/// ```no_run
/// let archive = std::fs::File::open("box.tar").unwrap();
/// let receipt = agentbox_sync::extract(archive, std::path::Path::new("/tmp/out"), &Default::default());
/// assert!(receipt.stopped.is_none());
/// ```
pub fn extract(reader: impl Read, dest: &Path, opts: &Options) -> Receipt {
    let mut receipt = Receipt::default();
    let stop = |r: &mut Receipt, reason, message: String| r.stopped = Some(Stopped { reason, message });
    if let Err(e) = std::fs::create_dir_all(dest) {
        stop(
            &mut receipt,
            StopReason::TransferFailed,
            format!("making {}: {e}", dest.display()),
        );
        return receipt;
    }
    let root = match rustix::fs::open(
        dest,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) => {
            stop(
                &mut receipt,
                StopReason::TransferFailed,
                format!("opening {}: {e}", dest.display()),
            );
            return receipt;
        }
    };
    let mut archive = tar::Archive::new(Bounded {
        inner: reader,
        left: opts.max_bytes,
        hit: false,
    });
    let outcome = walk(&mut archive, &root, opts, &mut receipt);
    let mut bounded = archive.into_inner();
    let read = opts.max_bytes.saturating_sub(bounded.left);
    let outcome = outcome.and_then(|()| {
        // The crate stops at the first zero block: a well-formed end has a second.
        let mut block = [0u8; 512];
        match bounded.read_exact(&mut block) {
            Ok(()) if block.iter().all(|&b| b == 0) => Ok(()),
            Ok(()) => Err(Failure::Archive("a lone zero block, with data after it".into())),
            Err(_) if bounded.hit => Err(Failure::Archive("over the byte bound".into())),
            Err(_) => Err(Failure::Archive(
                "the archive ends without its two zero blocks (a lone zero block, or cut short)".into(),
            )),
        }
    });
    match outcome {
        Ok(()) => {}
        Err(_) if bounded.hit => stop(
            &mut receipt,
            StopReason::TooLarge,
            format!("the archive is over {} bytes", opts.max_bytes),
        ),
        Err(Failure::Archive(m)) if m.starts_with("too many") => stop(&mut receipt, StopReason::TooManyEntries, m),
        Err(Failure::Archive(m)) => stop(&mut receipt, StopReason::Malformed, m),
        Err(Failure::Host(m)) => stop(&mut receipt, StopReason::TransferFailed, m),
    }
    tracing::debug!(
        bytes = read,
        written = receipt.written,
        skipped = receipt.skipped_total(),
        masked = receipt.masked,
        stopped = ?receipt.stopped.as_ref().map(|s| s.reason),
        "extracted"
    );
    receipt
}

fn read_extension(entry: &mut impl Read, size: u64, what: &str) -> Result<Vec<u8>, Failure> {
    if size > MAX_EXTENSION {
        return Err(Failure::Archive(format!(
            "a {what} of {size} bytes, over {MAX_EXTENSION}"
        )));
    }
    let mut data = Vec::with_capacity(size as usize);
    entry
        .read_to_end(&mut data)
        .map_err(|e| Failure::Archive(format!("reading a {what}: {e}")))?;
    if data.len() as u64 != size {
        return Err(Failure::Archive(format!("a {what} cut short")));
    }
    Ok(data)
}

/// Count and name a skip in `receipt`, and tell `opts.on_skip`.
fn skip(receipt: &mut Receipt, opts: &Options, path: &[u8], reason: SkipReason, target: Option<&[u8]>) {
    receipt.skip(path, reason, target);
    if let Some(told) = &opts.on_skip {
        told(&Skip {
            path: String::from_utf8_lossy(path).into_owned(),
            reason,
            target: target.map(|t| String::from_utf8_lossy(t).into_owned()),
        });
    }
}

fn walk<R: Read>(
    archive: &mut tar::Archive<R>,
    root: &OwnedFd,
    opts: &Options,
    receipt: &mut Receipt,
) -> Result<(), Failure> {
    let entries = archive
        .entries()
        .map_err(|e| Failure::Archive(e.to_string()))?
        .raw(true);
    let mut pax: Option<Pax> = None;
    let mut long_name: Option<Vec<u8>> = None;
    let mut long_link: Option<Vec<u8>> = None;
    let mut seen: HashSet<Vec<Vec<u8>>> = HashSet::new();
    let mut members = 0u64;
    for item in entries {
        let mut entry = item.map_err(|e| Failure::Archive(e.to_string()))?;
        let header = entry.header().clone();
        let kind = header.entry_type();
        let size = header
            .entry_size()
            .map_err(|e| Failure::Archive(format!("a header's size: {e}")))?;
        match kind {
            EntryType::XHeader => {
                if pax.is_some() || long_name.is_some() || long_link.is_some() {
                    return Err(Failure::Archive(
                        "a pax header where a member was expected (pax state outliving its entry)".into(),
                    ));
                }
                let data = read_extension(&mut entry, size, "pax header")?;
                pax = Some(pax::parse(&data).map_err(|e| Failure::Archive(format!("malformed pax records: {e}")))?);
                continue;
            }
            EntryType::XGlobalHeader => {
                read_extension(&mut entry, size, "pax global header")?;
                skip(receipt, opts, b"", SkipReason::PaxGlobal, None);
                continue;
            }
            EntryType::GNULongName | EntryType::GNULongLink => {
                if pax.as_ref().is_some_and(|p| p.size.is_some()) {
                    return Err(Failure::Archive("a pax size applied to a GNU long-name member".into()));
                }
                let slot = if kind == EntryType::GNULongName {
                    &mut long_name
                } else {
                    &mut long_link
                };
                if slot.is_some() {
                    return Err(Failure::Archive("two GNU long names for one member".into()));
                }
                let mut data = read_extension(&mut entry, size, "GNU long name")?;
                while data.last() == Some(&0) {
                    data.pop();
                }
                *slot = Some(data);
                continue;
            }
            _ => {}
        }
        members += 1;
        if members > opts.max_entries {
            return Err(Failure::Archive(format!("too many members: over {}", opts.max_entries)));
        }
        let ext = pax.take().unwrap_or_default();
        if let Some(ps) = ext.size
            && ps != size
        {
            return Err(Failure::Archive(format!(
                "pax size {ps} and ustar size {size} disagree"
            )));
        }
        let name = ext
            .path
            .or(long_name.take())
            .unwrap_or_else(|| header.path_bytes().into_owned());
        let target = ext
            .linkpath
            .or(long_link.take())
            .or_else(|| header.link_name_bytes().map(|c| c.into_owned()));
        let what = match kind {
            EntryType::Regular | EntryType::Continuous => Kind::File,
            EntryType::Directory => Kind::Directory,
            other => {
                let reason = match other {
                    EntryType::Symlink => SkipReason::Symlink,
                    EntryType::Link => SkipReason::Hardlink,
                    EntryType::Char | EntryType::Block => SkipReason::Device,
                    EntryType::Fifo => SkipReason::Fifo,
                    _ => SkipReason::Other,
                };
                let t = matches!(reason, SkipReason::Symlink | SkipReason::Hardlink)
                    .then_some(())
                    .and(target.as_deref());
                skip(receipt, opts, &name, reason, t);
                continue;
            }
        };
        if what == Kind::Directory && crate::names::is_root(&name) {
            continue; // the destination itself
        }
        let Some(segs) = segments(&name) else {
            skip(receipt, opts, &name, SkipReason::UnsafeName, None);
            continue;
        };
        if let Some(admit) = &opts.admit
            && !admit(&String::from_utf8_lossy(&name), what)
        {
            skip(receipt, opts, &name, SkipReason::NotAdmitted, None);
            continue;
        }
        if !seen.insert(segs.clone()) {
            skip(receipt, opts, &name, SkipReason::Duplicate, None);
            continue;
        }
        let mode = header.mode().unwrap_or(0o644);
        let mtime = ext.mtime.or_else(|| header.mtime().ok().map(|m| m as i64));
        let parent = match open_parents(root, &segs[..segs.len() - 1]) {
            Ok(p) => p,
            Err(Placed::Skip(reason)) => {
                skip(receipt, opts, &name, reason, None);
                continue;
            }
            Err(Placed::Archive(m)) => return Err(Failure::Archive(m)),
            Err(Placed::Host(m)) => return Err(Failure::Host(m)),
        };
        let last = &segs[segs.len() - 1];
        let placed = match what {
            Kind::Directory => make_dir(&parent, last),
            Kind::File => write_file(&parent, last, &mut entry, size, mode, mtime, opts.keep_newer),
        };
        match placed {
            Ok(masked) => {
                receipt.written += 1;
                receipt.masked += u64::from(masked);
                if let Some(told) = &opts.on_written {
                    told(&String::from_utf8_lossy(&name), what);
                }
            }
            Err(Placed::Skip(reason)) => skip(receipt, opts, &name, reason, None),
            Err(Placed::Archive(m)) => return Err(Failure::Archive(m)),
            Err(Placed::Host(m)) => return Err(Failure::Host(m)),
        }
    }
    if pax.is_some() || long_name.is_some() || long_link.is_some() {
        return Err(Failure::Archive(
            "a pax header or GNU long name with no member after it".into(),
        ));
    }
    Ok(())
}

enum Placed {
    Skip(SkipReason),
    /// Reading the member failed: the archive's fault.
    Archive(String),
    Host(String),
}

fn host(what: &str, e: impl std::fmt::Display) -> Placed {
    Placed::Host(format!("{what}: {e}"))
}

/// What is at `name` in `dir`, not following a link.
fn kind_at(dir: &OwnedFd, name: &[u8]) -> Result<Option<FileType>, Placed> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(FileType::from_raw_mode(st.st_mode))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(host("looking at a destination path", e)),
    }
}

/// Open (making where missing) each directory below `root`, never following a link.
fn open_parents(root: &OwnedFd, segs: &[Vec<u8>]) -> Result<OwnedFd, Placed> {
    let mut dir = rustix::io::fcntl_dupfd_cloexec(root, 0).map_err(|e| host("holding the destination", e))?;
    for seg in segs {
        dir = open_dir(&dir, seg, true)?;
    }
    Ok(dir)
}

fn open_dir(parent: &OwnedFd, seg: &[u8], make: bool) -> Result<OwnedFd, Placed> {
    if make {
        match rustix::fs::mkdirat(parent, seg, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(host("making a directory", e)),
        }
    }
    match rustix::fs::openat(
        parent,
        seg,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => Ok(fd),
        Err(Errno::LOOP) => Err(Placed::Skip(SkipReason::LinkInDestination)),
        Err(Errno::NOTDIR) => match kind_at(parent, seg)? {
            Some(FileType::Symlink) => Err(Placed::Skip(SkipReason::LinkInDestination)),
            _ => Err(Placed::Skip(SkipReason::Occupied)),
        },
        Err(e) => Err(host("opening a directory", e)),
    }
}

fn make_dir(parent: &OwnedFd, name: &[u8]) -> Result<bool, Placed> {
    open_dir(parent, name, true).map(|_| false)
}

fn write_file(
    parent: &OwnedFd,
    name: &[u8],
    data: &mut impl Read,
    size: u64,
    mode: u32,
    mtime: Option<i64>,
    keep_newer: bool,
) -> Result<bool, Placed> {
    match kind_at(parent, name)? {
        Some(FileType::Directory) => return Err(Placed::Skip(SkipReason::Occupied)),
        Some(FileType::Symlink) => return Err(Placed::Skip(SkipReason::LinkInDestination)),
        Some(_) if keep_newer => {
            let st = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| host("looking at a file", e))?;
            if mtime.is_some_and(|m| st.st_mtime > m) {
                return Err(Placed::Skip(SkipReason::KeptNewer));
            }
        }
        _ => {}
    }
    let capped = if mode & 0o111 != 0 { 0o755 } else { 0o644 };
    let masked = (mode & 0o7777) & !capped != 0;
    // A name already taken (the archive chooses its members' names, and may choose ours) is
    // passed over: each is taken once, so this ends within the directory's entries.
    let (tmp, fd) = loop {
        let tmp = format!(".agentbox-extract-{}-{}", std::process::id(), unique());
        match rustix::fs::openat(
            parent,
            tmp.as_str(),
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        ) {
            Ok(fd) => break (tmp, fd),
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(host("creating a file", e)),
        }
    };
    let mut file = std::fs::File::from(fd);
    let copied = copy(data, &mut file, size);
    let finished = copied.and_then(|()| {
        rustix::fs::fchmod(file.as_fd(), Mode::from_raw_mode(capped)).map_err(|e| host("setting a mode", e))?;
        if let Some(m) = mtime.and_then(|m| u64::try_from(m).ok()) {
            let _ = file.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(m));
        }
        drop(file);
        rustix::fs::renameat(parent, tmp.as_str(), parent, name).map_err(|e| host("renaming a file into place", e))
    });
    if let Err(e) = finished {
        // One cut off halfway is removed.
        let _ = rustix::fs::unlinkat(parent, tmp.as_str(), AtFlags::empty());
        return Err(e);
    }
    Ok(masked)
}

fn copy(from: &mut impl Read, to: &mut std::fs::File, size: u64) -> Result<(), Placed> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut left = size;
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = from
            .read(&mut buf[..want])
            .map_err(|e| Placed::Archive(format!("reading a member: {e}")))?;
        if n == 0 {
            return Err(Placed::Archive("the archive is cut short in a member's data".into()));
        }
        to.write_all(&buf[..n]).map_err(|e| host("writing a file", e))?;
        left -= n as u64;
    }
    Ok(())
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

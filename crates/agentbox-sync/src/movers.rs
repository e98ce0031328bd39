//! A run's files between this machine and a box: seed (host to box) and pull (box to host).
//!
//! Seed packs the host directory with this process's own walker (a link on the host is never
//! followed: it is skipped and counted), so nothing from outside the directory reaches the
//! box. Pull is incremental by the box's listing (kind, size, mode, mtime to the nanosecond,
//! NUL-separated): a path comes back when it is new or listed differently from the mark of
//! the seed or last pull. The box's clock is never compared with the host's. A path the box
//! no longer lists stays in the mark, flagged `gone`, while the host has it and no mirror
//! removed it, and a file `if_unchanged` left as the host has it keeps its old entry: no pull
//! makes a later one forget what it still has to do. Every pulled
//! member goes through [`crate::extract`], never `tar`. No name is ever put in a shell
//! string: the box reads its list on stdin.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex as StdMutex};

use agentbox_core::{Ctx, Error, ExecOptions, FinishOptions, Result, Sandbox, finish, finish_cut};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::{Options, Receipt, extract_tar};

/// The default bound on the box's listing.
pub const MAX_LISTING_BYTES: usize = 64 << 20;
/// The largest seed archive.
pub(crate) const MAX_SEED_BYTES: u64 = 1 << 30;
/// How much of a seed goes at a time, each piece within the stall limit: a slow link that
/// still moves (8 KiB a minute) is not taken for a stalled one.
const SEED_CHUNK: usize = 8 << 10;
/// How long a streamed transfer may go without a byte moving before it is stopped (the box
/// stopped sending, or stopped taking): a box that hangs never holds a streamed seed or pull for
/// ever. (A box that moves bulk data as files is bounded by its calls' own deadlines.)
pub const STALL_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// One path as the box listed it, and the SHA-256 of what the host knows it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkEntry {
    /// `f` file, `d` directory, `l` link, other letters as find prints them.
    pub kind: String,
    /// Bytes.
    pub size: u64,
    /// Permission bits in octal.
    pub mode: String,
    /// Modification time as the box printed it (seconds with nanoseconds): compared as text.
    pub mtime: String,
    /// SHA-256 of the bytes the host sent or pulled, for files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// The box no longer lists this path, and no mirror has acted on it yet: the entry is kept
    /// (as the box last listed it) so that a later pull with mirror deletes still removes the
    /// host's copy. Dropped once the host has no such path.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gone: bool,
}

/// The box's listing at the last seed or pull, keyed by relative path.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    /// Every path under the box directory.
    pub entries: BTreeMap<String, MarkEntry>,
}

impl Mark {
    /// Keep the mark at `path`, whole: a new file beside it renamed over it, so a process
    /// killed while it writes leaves the last mark, never half of one (which no pull could
    /// read, and after which every file would look changed here).
    ///
    /// ```
    /// let dir = tempfile::tempdir().unwrap();
    /// let at = dir.path().join("mark.json");
    /// agentbox_sync::Mark::default().save(&at).unwrap();
    /// assert_eq!(agentbox_sync::Mark::load(&at).unwrap(), Some(agentbox_sync::Mark::default()));
    /// ```
    pub fn save(&self, path: &Path) -> Result<()> {
        use std::io::Write;
        let bytes = serde_json::to_vec(self).map_err(|e| Error::unknown(format!("the mark: {e}")))?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
        let written = std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(&bytes).and_then(|_| f.sync_all()))
            .and_then(|_| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::io(e, format!("keeping the mark at {}", path.display())));
        }
        Ok(())
    }

    /// The mark kept at `path`: `None` when there is none; an error naming the file when it
    /// is there but is no mark.
    pub fn load(path: &Path) -> Result<Option<Mark>> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| Error::invalid(format!("the mark at {}: not a mark ({e})", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(e, format!("reading the mark at {}", path.display()))),
        }
    }
}

/// What to seed.
#[derive(Clone, Debug, Default)]
pub struct SeedOptions {
    /// The host directory.
    pub from: PathBuf,
    /// The box directory (made if missing).
    pub to: String,
    /// Relative paths left out (a path and everything under it).
    pub exclude: Vec<String>,
    /// Relative paths sent without a write bit.
    pub read_only: Vec<String>,
    /// How long the box may take no byte before the seed stops ([`STALL_LIMIT`] when absent).
    pub stall: Option<std::time::Duration>,
}

/// What a seed did.
#[derive(Clone, Debug, Serialize)]
pub struct Seeded {
    /// Files and directories sent.
    pub sent: u64,
    /// Host entries not sent, by reason (`link`, `other`: pipes, sockets, devices).
    pub skipped: BTreeMap<String, u64>,
    /// Files sent that the box does not hold as sent, when its unpack failed (`stopped`): in
    /// the mark without a hash.
    pub copy_failed: Vec<String>,
    /// Why the unpack failed (`copy_failed`, with tar's own words), if it did: a seed that
    /// stopped is not a seed to start work on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<crate::Stopped>,
    /// The box's listing after the seed, with the SHA-256 of each file sent.
    pub mark: Mark,
}

impl Seeded {
    /// This seed when the box took all of it; else `transfer_failed` with the unpack's words
    /// and the files the box does not hold (for a caller that works only on a whole seed).
    pub fn whole(self) -> Result<Seeded> {
        match &self.stopped {
            None => Ok(self),
            Some(s) => Err(Error::transfer_failed(format!(
                "{}; not written in the box: {}",
                s.message,
                named(&self.copy_failed)
            ))),
        }
    }
}

/// Up to ten paths, and how many more.
fn named(paths: &[String]) -> String {
    let mut s = paths.iter().take(10).cloned().collect::<Vec<_>>().join(", ");
    if paths.len() > 10 {
        s.push_str(&format!(" and {} more", paths.len() - 10));
    }
    if s.is_empty() {
        s.push_str("none known");
    }
    s
}

/// What to pull.
#[derive(Clone, Debug, Default)]
pub struct PullOptions {
    /// The box directory.
    pub from: String,
    /// The host directory.
    pub to: PathBuf,
    /// The mark of the seed or last pull; without one, everything comes back.
    pub since: Option<Mark>,
    /// Remove from the host what the box no longer has (files and links; directories when empty).
    pub mirror_deletes: bool,
    /// Relative paths left out of the listing, the deletions and the archive.
    pub exclude: Vec<String>,
    /// Replace (or delete) a host file only while it is still the bytes the mark records.
    pub if_unchanged: bool,
    /// Bytes of listing read at most.
    pub max_listing_bytes: Option<usize>,
    /// Bytes of archive read at most (default 1 GiB).
    pub max_bytes: Option<u64>,
    /// How long the box may send no byte before the pull stops ([`STALL_LIMIT`] when absent).
    pub stall: Option<std::time::Duration>,
}

/// What a pull did.
#[derive(Clone, Debug, Serialize)]
pub struct Pulled {
    /// Paths asked of the box.
    pub fetched: u64,
    /// Bytes of archive that came out of the box.
    pub bytes: u64,
    /// The extraction's receipt.
    pub receipt: Receipt,
    /// Host paths removed by mirror deletes.
    pub deleted: u64,
    /// Paths left as the host has them because the host's copy changed since the mark.
    pub host_changed: Vec<String>,
    /// Paths asked of the box and not written on the host (the box could not send them, the
    /// archive stopped first, or the extractor skipped them): each keeps its old entry in the
    /// mark, so the next pull asks again. `receipt.stopped` says why, when something failed.
    pub copy_failed: Vec<String>,
    /// The next mark.
    pub mark: Mark,
}

fn excluded(path: &str, exclude: &[String]) -> bool {
    exclude.iter().any(|e| {
        let e = e.trim_matches('/');
        path == e || path.starts_with(&format!("{e}/"))
    })
}

/// A member name as the listing writes it: no leading `./`, no trailing `/`.
fn relative(name: &str) -> String {
    let n = String::from_utf8_lossy(crate::names::strip_dot_prefix(name.as_bytes())).into_owned();
    n.trim_end_matches('/').to_string()
}

fn sha256_file(p: &Path) -> Option<String> {
    let mut f = std::fs::File::open(p).ok()?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Some(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// A directory packed by this process's own walker.
#[derive(Clone, Debug)]
pub struct Packed {
    /// The tar.
    pub archive: Vec<u8>,
    /// Files and directories in it.
    pub sent: u64,
    /// Entries left out, by reason (`link`, `other`).
    pub skipped: BTreeMap<String, u64>,
    /// The SHA-256 of every file packed, by relative path.
    pub hashes: BTreeMap<String, String>,
    /// The size and modification time (seconds) of every file packed, by relative path: how a
    /// seed whose unpack failed tells the files the box holds from those it does not.
    pub stamps: BTreeMap<String, (u64, u64)>,
}

/// `opts.from` as a tar, packed as a seed packs it: a link is skipped and counted (never
/// followed), as are pipes, sockets and devices, and modes are capped; at most 1 GiB.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// std::fs::write(dir.path().join("a.txt"), "hi").unwrap();
/// let opts = agentbox_sync::SeedOptions { from: dir.path().into(), ..Default::default() };
/// let packed = agentbox_sync::pack_dir(&opts).unwrap();
/// assert_eq!(packed.sent, 1);
/// ```
pub fn pack_dir(opts: &SeedOptions) -> Result<Packed> {
    pack(opts)
}

/// Pack `from` (links skipped, modes capped), with the SHA-256 of every file packed.
fn pack(opts: &SeedOptions) -> Result<Packed> {
    let mut b = tar::Builder::new(Vec::new());
    let (mut sent, mut skipped, mut hashes) = (0u64, BTreeMap::new(), BTreeMap::new());
    let mut stamps = BTreeMap::new();
    let mut read_only_dirs: Vec<(String, u64)> = Vec::new();
    let mut stack = vec![(opts.from.clone(), String::new())];
    let mut total = 0u64;
    while let Some((dir, rel)) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .map_err(|e| Error::io(e, format!("reading {}", dir.display())))?
            .flatten()
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            if excluded(&r, &opts.exclude) {
                continue;
            }
            let meta = std::fs::symlink_metadata(e.path()).map_err(|err| Error::io(err, format!("reading {r}")))?;
            let ro = excluded(&r, &opts.read_only);
            let mut h = tar::Header::new_gnu();
            h.set_mtime(meta.mtime().max(0) as u64);
            if meta.file_type().is_symlink() {
                *skipped.entry("link".to_string()).or_default() += 1;
            } else if meta.is_dir() {
                // Made writable first, whatever it ends as: a box's root that holds no
                // capabilities cannot write into a read-only directory, not even its own.
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                b.append_data(&mut h, format!("{r}/"), std::io::empty())
                    .map_err(|err| Error::io(err, "packing"))?;
                if ro {
                    read_only_dirs.push((r.clone(), meta.mtime().max(0) as u64));
                }
                sent += 1;
                stack.push((e.path(), r));
            } else if meta.is_file() {
                total += meta.len();
                if total > MAX_SEED_BYTES {
                    return Err(Error::too_large(format!(
                        "seed: more than {MAX_SEED_BYTES} bytes under {}",
                        opts.from.display()
                    )));
                }
                let data = std::fs::read(e.path()).map_err(|err| Error::io(err, format!("reading {r}")))?;
                let exec = meta.mode() & 0o111 != 0;
                let mode = match (exec, ro) {
                    (true, false) => 0o755,
                    (true, true) => 0o555,
                    (false, false) => 0o644,
                    (false, true) => 0o444,
                };
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(mode);
                h.set_size(data.len() as u64);
                hashes.insert(
                    r.clone(),
                    Sha256::digest(&data).iter().map(|x| format!("{x:02x}")).collect(),
                );
                stamps.insert(r.clone(), (data.len() as u64, meta.mtime().max(0) as u64));
                b.append_data(&mut h, &r, &data[..])
                    .map_err(|err| Error::io(err, "packing"))?;
                sent += 1;
            } else {
                *skipped.entry("other".to_string()).or_default() += 1;
            }
        }
    }
    // Read-only directories take their mode last, once what is in them was written (the
    // deepest first, so a parent's mode never stands in a child's way).
    for (r, mtime) in read_only_dirs.into_iter().rev() {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(mtime);
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o555);
        h.set_size(0);
        b.append_data(&mut h, format!("{r}/"), std::io::empty())
            .map_err(|err| Error::io(err, "packing"))?;
    }
    let archive = b.into_inner().map_err(|e| Error::io(e, "packing"))?;
    Ok(Packed {
        archive,
        sent,
        skipped,
        hashes,
        stamps,
    })
}

const UNPACK: &str = r#"mkdir -p -- "$1" && exec tar -x -f - -p --no-same-owner -C "$1""#;

/// Unpack the file `$2` into `$1`, and remove it whatever happened.
const UNPACK_FILE: &str =
    r#"mkdir -p -- "$1" && tar -x -f "$2" -p --no-same-owner -C "$1"; s=$?; rm -f -- "$2"; exit $s"#;

/// Pack the paths listed NUL-separated in the file `$3`, relative to `$1`, into the file `$2`;
/// the list is removed whatever happened.
const PACK_FILE: &str = r#"cd -- "$1" || exit 3
tar -c -f "$2" --null --no-recursion --hard-dereference -T "$3"; s=$?; rm -f -- "$3"; exit $s"#;

/// Every path under `$1`: kind, size, mode, mtime, path, each NUL-terminated.
const LIST: &str = r#"cd -- "$1" || exit 3
exec find . -mindepth 1 -printf '%y\0%s\0%m\0%T@\0%P\0'"#;

/// Pack the paths read NUL-separated on stdin, relative to `$1`; two names of one inode
/// both come back as files.
const PACK: &str = r#"cd -- "$1" || exit 3
exec tar -c -f - --null --no-recursion --hard-dereference -T -"#;

/// Send `opts.from` into the box at `opts.to`.
#[tracing::instrument(name = "sync.seed", skip_all, fields(box_id = %b.id(), to = %opts.to))]
pub async fn seed_dir(b: &dyn Sandbox, opts: &SeedOptions, ctx: &Ctx) -> Result<Seeded> {
    let Packed {
        archive,
        sent,
        skipped,
        hashes,
        stamps,
    } = pack(opts)?;
    let bytes = archive.len();
    let out = if b.facts().bulk == Some(agentbox_core::Bulk::Files) {
        unpack_from_file(b, &opts.to, &archive, ctx).await?
    } else {
        unpack_streamed(b, &opts.to, archive, opts.stall.unwrap_or(STALL_LIMIT), ctx).await?
    };
    let stopped = (out.status.code != 0).then(|| crate::Stopped {
        reason: crate::StopReason::CopyFailed,
        message: format!(
            "unpacking in the box: exit {}: {}",
            out.status.code,
            out.stderr_text().trim()
        ),
    });
    let mut mark = match list_box(b, &opts.to, &opts.exclude, MAX_LISTING_BYTES, ctx).await {
        Ok(m) => m,
        // Nothing to mark: the unpack's own failure is the one to tell.
        Err(e) => match &stopped {
            Some(s) => return Err(Error::transfer_failed(format!("{} (and listing: {e})", s.message))),
            None => return Err(e),
        },
    };
    // A failed unpack wrote some files and not others (a file the box would not let it
    // replace, a full disk): a file counts as sent only where the box lists it with the size
    // and time sent. The others get no hash, so no pull takes the box's copy for the host's.
    let mut copy_failed = Vec::new();
    if stopped.is_some() {
        for (path, (size, mtime)) in &stamps {
            let arrived = mark.entries.get(path).is_some_and(|e| {
                e.kind == "f" && e.size == *size && e.mtime.split('.').next() == Some(&mtime.to_string())
            });
            if !arrived {
                copy_failed.push(path.clone());
            }
        }
    }
    let not_sent: std::collections::HashSet<&String> = copy_failed.iter().collect();
    for (path, e) in mark.entries.iter_mut() {
        if !not_sent.contains(path) {
            e.sha256 = hashes.get(path).cloned();
        }
    }
    tracing::info!(
        sent,
        skipped = skipped.values().sum::<u64>(),
        bytes,
        listed = mark.entries.len(),
        copy_failed = copy_failed.len(),
        "seeded"
    );
    if let Some(s) = &stopped {
        tracing::warn!(not_written = copy_failed.len(), why = %s.message, "seed failed in part");
    }
    Ok(Seeded {
        sent,
        skipped,
        copy_failed,
        stopped,
        mark,
    })
}

/// Unpack `archive` in the box at `to` through the unpack's stdin, a chunk at a time, each
/// within `stall`.
async fn unpack_streamed(
    b: &dyn Sandbox,
    to: &str,
    archive: Vec<u8>,
    stall: std::time::Duration,
    ctx: &Ctx,
) -> Result<agentbox_core::Finished> {
    let argv = ["sh", "-c", UNPACK, "agentbox-seed", to].map(String::from).to_vec();
    let mut p = b.exec(&argv, &ExecOptions::default(), ctx).await?;
    // The archive goes a chunk at a time, each within the stall limit, and the unpack ends
    // within it once the last byte is in: a box that stops taking it, or hangs after, stops
    // the seed, not the host.
    let mut stdin = p.stdin.take();
    let killer = p.killer();
    let stopped = |what: &str| {
        Error::timeout(format!(
            "seed: the box {what} for {}s (the stall limit); the unpack was stopped",
            stall.as_secs_f64()
        ))
    };
    let write = async move {
        let Some(w) = stdin.as_mut() else {
            return Ok(true);
        };
        for chunk in archive.chunks(SEED_CHUNK) {
            match tokio::time::timeout(stall, w.write_all(chunk)).await {
                Ok(Ok(())) => {}
                // The unpack ended early: its exit says why.
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(true),
                Ok(Err(e)) => return Err(Error::io(e, "sending the seed")),
                Err(_) => return Ok(false),
            }
        }
        Ok(tokio::time::timeout(stall, w.close()).await.is_ok())
    };
    let mut write = std::pin::pin!(write);
    let mut finishing = std::pin::pin!(finish(
        p,
        FinishOptions {
            stdin: Vec::new(),
            max_output: 1 << 20,
        },
    ));
    let mut sent = false;
    loop {
        tokio::select! {
            w = &mut write, if !sent => {
                if !w? {
                    let _ = killer.signal(agentbox_core::SIGKILL).await;
                    return Err(stopped("took no byte"));
                }
                sent = true;
            }
            out = &mut finishing => return out,
            _ = tokio::time::sleep(stall), if sent => {
                let _ = killer.signal(agentbox_core::SIGKILL).await;
                return Err(stopped("did not end the unpack after its last byte"));
            }
        }
    }
}

/// A name for a transfer's file in the box's workspace, unique to this process and moment.
fn transfer_name(what: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        ".agentbox-transfer-{}-{}-{}.{what}",
        std::process::id(),
        agentbox_core::now_ms(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// The box's workspace, where a box that moves bulk data as files keeps a transfer's file.
fn workspace_of(b: &dyn Sandbox) -> Result<String> {
    b.facts().workspace.clone().ok_or_else(|| {
        Error::unsupported(format!(
            "box {}: moves bulk data as files but names no workspace",
            b.id()
        ))
    })
}

/// Unpack `archive` in the box at `to` from a file uploaded first (a box whose exec takes no
/// stdin), removed after.
async fn unpack_from_file(b: &dyn Sandbox, to: &str, archive: &[u8], ctx: &Ctx) -> Result<agentbox_core::Finished> {
    let name = transfer_name("tar");
    let path = format!("{}/{name}", workspace_of(b)?);
    b.upload(&name, archive, ctx).await?;
    let argv = ["sh", "-c", UNPACK_FILE, "agentbox-seed", to, &path]
        .map(String::from)
        .to_vec();
    let p = b.exec(&argv, &ExecOptions::default(), ctx).await?;
    finish(
        p,
        FinishOptions {
            stdin: Vec::new(),
            max_output: 1 << 20,
        },
    )
    .await
}

/// Run `script` (named `name`, its `$1` the box directory `dir`) under `sh` in the C locale,
/// so `find` and `tar` print names and times the same way on every box.
async fn in_c_locale(
    b: &dyn Sandbox,
    script: &str,
    name: &str,
    dir: &str,
    ctx: &Ctx,
) -> Result<agentbox_core::Process> {
    // Set by the script, not the exec's env: a box may carry no env (an archil box).
    let script = format!("LC_ALL=C; export LC_ALL\n{script}");
    let argv = ["sh", "-c", &script, name, dir].map(String::from).to_vec();
    b.exec(&argv, &ExecOptions::default(), ctx).await
}

/// The box's listing of `dir` (kind, size, mode, mtime of each path under it, links not
/// followed), at most `max` bytes of it: what a pull compares with its mark.
pub async fn list_box(b: &dyn Sandbox, dir: &str, exclude: &[String], max: usize, ctx: &Ctx) -> Result<Mark> {
    let p = in_c_locale(b, LIST, "agentbox-list", dir, ctx).await?;
    let out = finish(
        p,
        FinishOptions {
            stdin: Vec::new(),
            max_output: max,
        },
    )
    .await
    .map_err(|e| {
        if e.code() == agentbox_core::ErrorCode::TooLarge {
            Error::too_large(format!("the listing of {dir} is over {max} bytes"))
        } else {
            e
        }
    })?;
    if out.status.code != 0 {
        return Err(Error::not_found(format!(
            "listing {dir} in the box: {}",
            out.stderr_text().trim()
        )));
    }
    let fields: Vec<&[u8]> = out.stdout.split(|&c| c == 0).collect();
    let mut mark = Mark::default();
    for rec in fields.chunks(5).filter(|c| c.len() == 5) {
        let text = |i: usize| String::from_utf8_lossy(rec[i]).into_owned();
        let path = text(4);
        if path.is_empty() || excluded(&path, exclude) {
            continue;
        }
        let entry = MarkEntry {
            kind: text(0),
            size: text(1).parse().unwrap_or(0),
            mode: text(2),
            mtime: text(3),
            sha256: None,
            gone: false,
        };
        mark.entries.insert(path, entry);
    }
    Ok(mark)
}

/// The most files [`box_hashes`] hashes in one pull, and in one exec.
const MAX_HASHED: usize = 4096;
const HASHED_PER_EXEC: usize = 256;
/// How long the hashing of a pull's disagreeing files may take in all.
const HASH_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The SHA-256 of each of `paths` (relative to `dir`) as the box now holds them; a path it
/// could not hash (gone, unreadable, no `sha256sum` in the box) is left out, as is any past
/// [`MAX_HASHED`]. Never an error: a hash missing only means a file is not known to agree.
/// Only regular files are read (a FIFO the box put there would block the read), each batch
/// within [`HASH_LIMIT`] whatever the caller's deadline.
async fn box_hashes(b: &dyn Sandbox, dir: &str, paths: &[String], ctx: &Ctx) -> BTreeMap<String, String> {
    let ctx = &ctx.with_timeout(HASH_LIMIT);
    // One line per argument, in order: its hash, or nothing where it has none.
    const HASH: &str = r#"cd -- "$1" || exit 1; shift
for f do h=; if [ -f "$f" ] && [ ! -h "$f" ]; then h=$(sha256sum 2>/dev/null < "$f") || h=; fi; printf '%.64s\0' "$h"; done"#;
    let mut out = BTreeMap::new();
    for chunk in paths[..paths.len().min(MAX_HASHED)].chunks(HASHED_PER_EXEC) {
        let mut argv = ["sh", "-c", HASH, "agentbox-hash", dir].map(String::from).to_vec();
        argv.extend(chunk.iter().cloned());
        let Ok(p) = b.exec(&argv, &ExecOptions::default(), ctx).await else {
            return out;
        };
        let Ok(done) = finish(
            p,
            FinishOptions {
                stdin: Vec::new(),
                max_output: 65 * HASHED_PER_EXEC + 1,
            },
        )
        .await
        else {
            return out;
        };
        if done.status.code != 0 {
            return out;
        }
        let hashes: Vec<&[u8]> = done.stdout.split(|&c| c == 0).collect();
        for (path, h) in chunk.iter().zip(hashes) {
            if h.len() == 64 && h.iter().all(u8::is_ascii_hexdigit) {
                out.insert(path.clone(), String::from_utf8_lossy(h).into_owned());
            }
        }
    }
    out
}

/// The lock of pulls into `to`. A lock no pull holds is dropped here, so a process that pulls
/// into many directories (a server's scratch directories) keeps only those in use.
/// The locks of the directories pulls are running into.
static LOCKS: StdMutex<Option<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>> = StdMutex::new(None);

fn pull_lock(to: &Path) -> Arc<tokio::sync::Mutex<()>> {
    let key = std::fs::canonicalize(to).unwrap_or_else(|_| to.to_path_buf());
    let mut g = LOCKS.lock().unwrap_or_else(|p| p.into_inner());
    let locks = g.get_or_insert_with(HashMap::new);
    locks.retain(|_, l| Arc::strong_count(l) > 1);
    locks.entry(key).or_default().clone()
}

/// Bring back from the box what changed since `opts.since`.
#[tracing::instrument(name = "sync.pull", skip_all, fields(box_id = %b.id(), from = %opts.from))]
pub async fn pull_dir(b: &dyn Sandbox, opts: &PullOptions, ctx: &Ctx) -> Result<Pulled> {
    std::fs::create_dir_all(&opts.to).map_err(|e| Error::io(e, format!("making {}", opts.to.display())))?;
    // Pulls into one directory run one at a time, from the first check to the mark.
    let lock = pull_lock(&opts.to);
    let _held = lock.lock().await;
    let listed = list_box(
        b,
        &opts.from,
        &opts.exclude,
        opts.max_listing_bytes.unwrap_or(MAX_LISTING_BYTES),
        ctx,
    )
    .await?;
    let since = opts.since.clone().unwrap_or_default();
    let host_hash = |p: &str| sha256_file(&opts.to.join(p));
    let mut host_changed = Vec::new();
    let mut wanted = Vec::new();
    for (path, e) in &listed.entries {
        let old = since.entries.get(path);
        let same = old
            .is_some_and(|o| !o.gone && o.kind == e.kind && o.size == e.size && o.mode == e.mode && o.mtime == e.mtime);
        if same || (e.kind != "f" && e.kind != "d") {
            continue;
        }
        if opts.if_unchanged && e.kind == "f" && opts.to.join(path).exists() {
            let recorded = old.and_then(|o| o.sha256.clone());
            if recorded.is_none() || host_hash(path) != recorded {
                host_changed.push(path.clone());
                continue;
            }
        }
        wanted.push(path.clone());
    }
    // A file the host holds as the box does is no change here, whatever the mark says: a pull
    // killed after it renamed some files into place (before its mark was kept) left them so.
    // Taken as pulled, not named, so the box's next change to them comes back.
    let agreed = if host_changed.is_empty() {
        BTreeMap::new()
    } else {
        let hashes = box_hashes(b, &opts.from, &host_changed, ctx).await;
        host_changed
            .iter()
            .filter_map(|p| {
                let h = host_hash(p)?;
                (hashes.get(p) == Some(&h)).then(|| (p.clone(), h))
            })
            .collect()
    };
    host_changed.retain(|p| !agreed.contains_key(p));
    if !agreed.is_empty() {
        tracing::info!(
            files = agreed.len(),
            "files the host already holds as the box does, taken as pulled"
        );
    }
    let max_bytes = opts.max_bytes.unwrap_or(crate::MAX_BYTES);
    let Fetched {
        receipt,
        bytes,
        written,
    } = fetch_within(
        b,
        &opts.from,
        &wanted,
        &opts.to,
        max_bytes,
        opts.stall.unwrap_or(STALL_LIMIT),
        ctx,
    )
    .await?;
    // The next mark: the box's listing, with the hash of what the host now holds.
    let mut mark = listed.clone();
    for (path, e) in mark.entries.iter_mut() {
        if e.kind != "f" {
            continue;
        }
        e.sha256 = if written.contains(path) {
            host_hash(path)
        } else if let Some(h) = agreed.get(path) {
            Some(h.clone())
        } else {
            since.entries.get(path).and_then(|o| o.sha256.clone())
        };
    }
    // A file left as the host has it keeps its old entry (or none), so the next pull sees the
    // box's change again: it is named again, and `if_unchanged` off (`--force`) takes it.
    // So does each path asked for and not written (the box could not send it, the archive
    // stopped first, the extractor skipped it): the next pull asks for it again, and this one
    // names it.
    let copy_failed: Vec<String> = wanted.iter().filter(|w| !written.contains(*w)).cloned().collect();
    let mut kept_back: Vec<&String> = host_changed.iter().collect();
    kept_back.extend(copy_failed.iter());
    for w in kept_back {
        match since.entries.get(w) {
            Some(old) => mark.entries.insert(w.clone(), old.clone()),
            None => mark.entries.remove(w),
        };
    }
    // What the box no longer lists (and the mark still had, from this pull's mark or one
    // before it that no mirror acted on).
    let mut gone: Vec<String> = since
        .entries
        .keys()
        .filter(|p| !listed.entries.contains_key(*p) && !excluded(p, &opts.exclude))
        .cloned()
        .collect();
    let mut deleted = 0;
    if opts.mirror_deletes {
        gone.sort_by_key(|p| std::cmp::Reverse(p.matches('/').count()));
        let mut removable = Vec::new();
        for p in gone.iter().cloned() {
            if opts.if_unchanged
                && since.entries[&p].kind == "f"
                && host_hash(&p) != since.entries[&p].sha256
                && opts.to.join(&p).exists()
            {
                host_changed.push(p);
                continue;
            }
            removable.push(p);
        }
        deleted = crate::remove_entries(&opts.to, &removable)
            .map_err(|e| Error::io(e, "mirroring deletes"))?
            .removed;
    }
    // Each gone path the host still has stays in the mark, flagged, until a mirror removes it:
    // a pull without mirror deletes never makes a later one forget it.
    for p in gone.drain(..) {
        if std::fs::symlink_metadata(opts.to.join(&p)).is_ok() {
            let mut e = since.entries[&p].clone();
            e.gone = true;
            mark.entries.insert(p, e);
        }
    }
    tracing::info!(
        listed = listed.entries.len(),
        fetched = wanted.len(),
        bytes,
        written = receipt.written,
        deleted,
        host_changed = host_changed.len(),
        copy_failed = copy_failed.len(),
        stopped = ?receipt.stopped.as_ref().map(|s| s.reason),
        "pulled"
    );
    if !copy_failed.is_empty() {
        tracing::warn!(
            first = %copy_failed[0],
            count = copy_failed.len(),
            why = receipt.stopped.as_ref().map_or("", |s| s.message.as_str()),
            "pull left files as the host has them: not written"
        );
    }
    Ok(Pulled {
        fetched: wanted.len() as u64,
        bytes,
        receipt,
        deleted,
        host_changed,
        copy_failed,
        mark,
    })
}

/// What [`fetch`] brought.
#[derive(Clone, Debug, Default)]
pub struct Fetched {
    /// The extraction's receipt; `stopped` is `copy_failed` when the box's pack failed (a
    /// file it could not read, one gone since the listing) and the archive itself did not.
    pub receipt: Receipt,
    /// Bytes of archive that came out of the box.
    pub bytes: u64,
    /// The names asked for that were written on the host, relative to `to`.
    pub written: std::collections::BTreeSet<String>,
}

/// How much of the pack's stderr is kept for a `copy_failed` message.
const MAX_PACK_ERRORS: usize = 16 << 10;

/// Bring the files and directories `names` (relative to the box directory `from`) to the host
/// directory `to`, through the safe extractor: a member the box sends that was not asked for
/// is skipped. The pack's exit is checked: a box that could not send a file says so in the
/// receipt (`copy_failed`), and [`Fetched::written`] says which names did arrive.
pub async fn fetch(
    b: &dyn Sandbox,
    from: &str,
    names: &[String],
    to: &Path,
    max_bytes: u64,
    ctx: &Ctx,
) -> Result<Fetched> {
    fetch_within(b, from, names, to, max_bytes, STALL_LIMIT, ctx).await
}

/// [`fetch`] with a stall limit of its own: a box that sends no byte for `stall` has its pack
/// stopped, and the receipt says `stalled`.
pub async fn fetch_within(
    b: &dyn Sandbox,
    from: &str,
    names: &[String],
    to: &Path,
    max_bytes: u64,
    stall: std::time::Duration,
    ctx: &Ctx,
) -> Result<Fetched> {
    if names.is_empty() {
        return Ok(Fetched::default());
    }
    if b.facts().bulk == Some(agentbox_core::Bulk::Files) {
        return fetch_as_file(b, from, names, to, max_bytes, ctx).await;
    }
    let bytes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut p = in_c_locale(b, PACK, "agentbox-pull", from, ctx).await?;
    let killer = p.killer();
    let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let list_bytes = nul_separated(names);
    let mut stdin = p.stdin.take();
    let writer = async move {
        if let Some(s) = stdin.as_mut() {
            let _ = s.write_all(&list_bytes).await;
            let _ = s.close().await;
        }
    };
    // Both streams are read: a pack whose error pipe fills stops writing its archive.
    let stderr = p.stderr.take();
    let errors = async move {
        let mut kept = Vec::new();
        if let Some(mut e) = stderr {
            let mut buf = [0u8; 4096];
            loop {
                match tokio::io::AsyncReadExt::read(&mut e, &mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let room = MAX_PACK_ERRORS.saturating_sub(kept.len());
                        kept.extend_from_slice(&buf[..n.min(room)]);
                    }
                }
            }
        }
        kept
    };
    let (extract_opts, written) = asked_for(names, max_bytes);
    let stdout = p
        .stdout
        .take()
        .ok_or_else(|| Error::unknown("the pack has no stdout"))?;
    let extraction = async {
        let receipt = extract_tar(
            Counted {
                inner: stdout,
                bytes: bytes.clone(),
                stall: Stall::new(stall, stalled.clone()),
            },
            to.to_path_buf(),
            extract_opts,
        )
        .await;
        // A stalled pack is stopped now: its stderr, read beside, ends with it.
        if stalled.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = killer.signal(agentbox_core::SIGKILL).await;
        }
        receipt
    };
    let (_, mut receipt, errors) = tokio::join!(writer, extraction, errors);
    if stalled.load(std::sync::atomic::Ordering::SeqCst) {
        // What the extractor made of the cut archive matters less than why it was cut.
        receipt.stopped = Some(crate::Stopped {
            reason: crate::StopReason::Stalled,
            message: format!(
                "the box sent no byte of {from} for {}s (the stall limit); its pack was stopped",
                stall.as_secs_f64()
            ),
        });
    }
    let exit = p.wait().await;
    if receipt.stopped.is_none() {
        let failed = match exit {
            Ok(s) if !pack_failed(s.code) => None,
            Ok(s) => Some(format!("exit {}", s.code)),
            Err(e) => Some(e.to_string()),
        };
        if let Some(how) = failed {
            receipt.stopped = Some(pack_stopped(from, &how, &String::from_utf8_lossy(&errors)));
        }
    }
    Ok(fetched(
        receipt,
        bytes.load(std::sync::atomic::Ordering::Relaxed),
        &written,
    ))
}

/// Why a pull stopped when the box's pack failed: its exit (`how`) and what it `said`.
fn pack_stopped(from: &str, how: &str, said: &str) -> crate::Stopped {
    crate::Stopped {
        reason: crate::StopReason::CopyFailed,
        message: format!("packing {from} in the box: {how}: {}", said.trim()),
    }
}

/// What a fetch brought: its receipt, its bytes, and the names the extraction wrote.
fn fetched(receipt: Receipt, bytes: u64, written: &StdMutex<std::collections::BTreeSet<String>>) -> Fetched {
    Fetched {
        receipt,
        bytes,
        written: std::mem::take(&mut *written.lock().unwrap_or_else(|e| e.into_inner())),
    }
}

/// Whether a pack's exit code says it failed. GNU tar's 1 is "a file changed as it was read":
/// the file was sent, and the next listing sees the change; only 2 and the rest are failures.
fn pack_failed(code: i32) -> bool {
    code != 0 && code != 1
}

/// `names`, each ended by a NUL: the list a pack reads.
fn nul_separated(names: &[String]) -> Vec<u8> {
    let mut list = Vec::new();
    for n in names {
        list.extend_from_slice(n.as_bytes());
        list.push(0);
    }
    list
}

/// The extraction of a pull's archive: only `names` admitted, at most `max_bytes`, and the set
/// of those written, filled as they are.
fn asked_for(names: &[String], max_bytes: u64) -> (Options, Arc<StdMutex<std::collections::BTreeSet<String>>>) {
    let wanted: std::collections::HashSet<String> = names.iter().cloned().collect();
    let written = Arc::new(StdMutex::new(std::collections::BTreeSet::new()));
    let told = written.clone();
    let opts = Options {
        admit: Some(Arc::new(move |path: &str, _| wanted.contains(&relative(path)))),
        on_written: Some(Arc::new(move |path: &str, _| {
            told.lock().unwrap_or_else(|e| e.into_inner()).insert(relative(path));
        })),
        max_bytes,
        ..Default::default()
    };
    (opts, written)
}

/// The receipt of an extraction that never began.
fn stopped_before(reason: crate::StopReason, message: String) -> Receipt {
    Receipt {
        stopped: Some(crate::Stopped { reason, message }),
        ..Default::default()
    }
}

/// [`fetch`] from a box whose exec takes no stdin: the list goes up as a file, the box packs
/// into a file of its workspace, and that file comes down whole (refused past `max_bytes`
/// before a byte moves) and through the same extractor; both files are removed.
async fn fetch_as_file(
    b: &dyn Sandbox,
    from: &str,
    names: &[String],
    to: &Path,
    max_bytes: u64,
    ctx: &Ctx,
) -> Result<Fetched> {
    let workspace = workspace_of(b)?;
    let (list, archive) = (transfer_name("list"), transfer_name("tar"));
    let (list_path, archive_path) = (format!("{workspace}/{list}"), format!("{workspace}/{archive}"));
    let moved = async {
        b.upload(&list, &nul_separated(names), ctx).await?;
        let script = format!("LC_ALL=C; export LC_ALL\n{PACK_FILE}");
        let argv = ["sh", "-c", &script, "agentbox-pull", from, &archive_path, &list_path]
            .map(String::from)
            .to_vec();
        // Its stderr cut, not refused: a pack that names many files it could not read is still
        // a pack whose archive is read.
        let (packed, _) = finish_cut(
            b.exec(&argv, &ExecOptions::default(), ctx).await?,
            FinishOptions {
                stdin: Vec::new(),
                max_output: MAX_PACK_ERRORS,
            },
        )
        .await?;
        Ok::<_, Error>((
            packed.status.code,
            packed.stderr_text(),
            b.download(&archive, max_bytes, ctx).await,
        ))
    }
    .await;
    // Both files are removed whatever came of it.
    let removed = ["rm", "-f", "--", &archive_path, &list_path].map(String::from);
    if let Ok(p) = b.exec(&removed, &ExecOptions::default(), ctx).await {
        let _ = finish(p, FinishOptions::default()).await;
    }
    let (code, said, data) = moved?;
    let data = match data {
        Ok(d) => d,
        Err(e) if e.code() == agentbox_core::ErrorCode::TooLarge => {
            return Ok(Fetched {
                receipt: stopped_before(crate::StopReason::TooLarge, e.message().to_string()),
                ..Default::default()
            });
        }
        // No archive at all: the pack failed before it wrote one, and says why.
        Err(e) if pack_failed(code) => {
            return Ok(Fetched {
                receipt: Receipt {
                    stopped: Some(pack_stopped(from, &format!("exit {code}"), &format!("{said} ({e})"))),
                    ..Default::default()
                },
                ..Default::default()
            });
        }
        Err(e) => return Err(e),
    };
    let (opts, written) = asked_for(names, max_bytes);
    let bytes = data.len() as u64;
    let dest = to.to_path_buf();
    let mut receipt = tokio::task::spawn_blocking(move || crate::extract(&data[..], &dest, &opts))
        .await
        .map_err(|e| Error::unknown(format!("the extractor failed: {e}")))?;
    if receipt.stopped.is_none() && pack_failed(code) {
        receipt.stopped = Some(pack_stopped(from, &format!("exit {code}"), &said));
    }
    Ok(fetched(receipt, bytes, &written))
}

/// The part of an agent's home that is its memory: seeded read-only, never pulled back, never
/// removed by a pull.
pub const LEARNING: &str = "learning";

/// Seed an agent's home: `learning/` goes read-only.
pub async fn seed_agent_home(b: &dyn Sandbox, opts: &SeedOptions, ctx: &Ctx) -> Result<Seeded> {
    let mut o = opts.clone();
    if !o.read_only.iter().any(|r| r == LEARNING) {
        o.read_only.push(LEARNING.into());
    }
    seed_dir(b, &o, ctx).await
}

/// Pull an agent's home: `learning/` is never brought back nor removed, and a home file
/// another run wrote stays (`if_unchanged` is always on).
pub async fn pull_agent_home(b: &dyn Sandbox, opts: &PullOptions, ctx: &Ctx) -> Result<Pulled> {
    let mut o = opts.clone();
    o.if_unchanged = true;
    if !o.exclude.iter().any(|e| e == LEARNING) {
        o.exclude.push(LEARNING.into());
    }
    pull_dir(b, &o, ctx).await
}

/// A stall limit on a stream: how long it has had nothing to give since a read first found it
/// empty (time this side spent not reading is not the box's silence).
struct Stall {
    limit: std::time::Duration,
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// The timer runs from the first read that found nothing.
    armed: bool,
    hit: Arc<std::sync::atomic::AtomicBool>,
}

impl Stall {
    fn new(limit: std::time::Duration, hit: Arc<std::sync::atomic::AtomicBool>) -> Self {
        Stall {
            limit,
            timer: Box::pin(tokio::time::sleep(limit)),
            armed: false,
            hit,
        }
    }
}

/// Counts the bytes read through it, and ends the stream with an error once no byte came for
/// the stall limit (the flag says so).
struct Counted<R> {
    inner: R,
    bytes: Arc<std::sync::atomic::AtomicU64>,
    stall: Stall,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Counted<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = (buf.filled().len() - before) as u64;
        self.bytes.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        match r {
            Poll::Ready(r) => {
                self.stall.armed = false;
                Poll::Ready(r)
            }
            Poll::Pending => {
                if !self.stall.armed {
                    let deadline = tokio::time::Instant::now() + self.stall.limit;
                    self.stall.timer.as_mut().reset(deadline);
                    self.stall.armed = true;
                }
                match self.stall.timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        self.stall.hit.store(true, std::sync::atomic::Ordering::SeqCst);
                        Poll::Ready(Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "no byte within the stall limit",
                        )))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_lock_no_pull_holds_is_let_go() {
        let dir = tempfile::tempdir().unwrap();
        for n in 0..100 {
            let d = dir.path().join(n.to_string());
            std::fs::create_dir(&d).unwrap();
            drop(super::pull_lock(&d));
        }
        let held = super::pull_lock(dir.path());
        let n = super::LOCKS.lock().unwrap().as_ref().map_or(0, |m| m.len());
        assert!(
            n <= 1 + 4,
            "only the locks in use stay (this one, and other tests' at most): {n}"
        );
        drop(held);
    }
}

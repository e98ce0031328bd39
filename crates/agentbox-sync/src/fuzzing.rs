//! The property the fuzz target checks, shared with the test that runs its corpus in CI:
//! whatever the bytes, the extractor does not panic, writes nothing outside the destination
//! (also through links planted in it), and leaves what the archive says and nothing else.
//!
//! The tree is compared with a model read from the same bytes, not judged by its names: every
//! entry must be a member the archive names (the first member of its path, as the extractor
//! keeps the first) or a directory above one; a file holds that member's bytes, with the
//! member's mode capped at 0755 or 0644; and an archive that extracts with no skip and no stop
//! leaves every member it names. So a leftover temporary is caught whatever it is called, and
//! a member that is only called like one (`.agentbox-extract…`) is the archive's own.
//!
//! The model reads the members with the same parser (the `tar` crate in raw mode) and the
//! same name rules ([`crate::names::segments`], [`crate::pax::parse`]): what it checks is
//! what the extractor does on the file system, not how it parses. Where the extractor stops
//! (a malformed archive, a bound), the model may read on: the tree need only be within it.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tar::EntryType;

use crate::{Options, Receipt, extract};

/// A path below the destination, segment by segment.
type Segs = Vec<Vec<u8>>;

/// What the archive says is at a path: the first member naming it.
#[derive(Debug)]
enum Member {
    File { data: Vec<u8>, mode: u32 },
    Directory,
}

/// What the archive says should be in the destination.
#[derive(Debug, Default)]
struct Model {
    /// The first member of each safe path (a later one is a duplicate, never written).
    first: HashMap<Segs, Member>,
    /// Every directory strictly above such a member, which writing it makes.
    parents: HashSet<Segs>,
}

impl Model {
    /// Read the members as the extractor does: pax `path` over a GNU long name over the
    /// header's name; a root directory (`./`) is the destination itself.
    fn read(data: &[u8]) -> Model {
        let mut model = Model::default();
        let mut archive = tar::Archive::new(data);
        let Ok(entries) = archive.entries() else { return model };
        let (mut pax_path, mut long_name) = (None::<Vec<u8>>, None::<Vec<u8>>);
        for item in entries.raw(true) {
            // The parser gave up: so did the extractor, at this member or before.
            let Ok(mut entry) = item else { break };
            let header = entry.header().clone();
            let kind = header.entry_type();
            let mut body = Vec::new();
            let _ = entry.read_to_end(&mut body);
            match kind {
                EntryType::XHeader => {
                    let Ok(pax) = crate::pax::parse(&body) else { break };
                    pax_path = pax.path;
                    continue;
                }
                EntryType::XGlobalHeader | EntryType::GNULongLink => continue,
                EntryType::GNULongName => {
                    while body.last() == Some(&0) {
                        body.pop();
                    }
                    long_name = Some(body);
                    continue;
                }
                _ => {}
            }
            let name = pax_path
                .take()
                .or(long_name.take())
                .unwrap_or_else(|| header.path_bytes().into_owned());
            let member = match kind {
                EntryType::Regular | EntryType::Continuous => {
                    let mode = header.mode().unwrap_or(0o644);
                    Member::File {
                        data: body,
                        mode: if mode & 0o111 != 0 { 0o755 } else { 0o644 },
                    }
                }
                EntryType::Directory if crate::names::is_root(&name) => continue,
                EntryType::Directory => Member::Directory,
                _ => continue, // never written: links, devices, fifos, the rest
            };
            let Some(segs) = crate::names::segments(&name) else {
                continue;
            };
            if model.first.contains_key(&segs) {
                continue;
            }
            for n in 1..segs.len() {
                model.parents.insert(segs[..n].to_vec());
            }
            model.first.insert(segs, member);
        }
        model
    }
}

/// The scratch directory of one check, removed however the check ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Extract `data` into a fresh destination holding two links that point outside, and check
/// the tree against what the archive says.
pub fn extract_confined(data: &[u8]) {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let root = Scratch(std::env::temp_dir().join(format!("agentbox-fuzz-{}-{n}", std::process::id())));
    let (dest, outside) = (root.0.join("dest"), root.0.join("outside"));
    std::fs::create_dir_all(&dest).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink("../outside", dest.join("escape")).unwrap();
    std::os::unix::fs::symlink(&outside, dest.join("abs")).unwrap();
    let receipt = extract(
        data,
        &dest,
        &Options {
            max_bytes: 4 << 20,
            max_entries: 2000,
            ..Default::default()
        },
    );
    let listed = |d: &Path| -> Vec<PathBuf> { std::fs::read_dir(d).unwrap().flatten().map(|e| e.path()).collect() };
    let escaped = listed(&outside);
    assert!(
        escaped.is_empty(),
        "wrote outside the destination: {escaped:?} ({receipt:?})"
    );
    let mut beside = listed(&root.0);
    beside.sort();
    assert_eq!(
        beside,
        [dest.clone(), outside.clone()],
        "wrote beside the destination ({receipt:?})"
    );
    for (link, target) in [("escape", Path::new("../outside")), ("abs", &outside)] {
        assert_eq!(
            std::fs::read_link(dest.join(link)).ok().as_deref(),
            Some(target),
            "the planted link {link} was replaced ({receipt:?})"
        );
    }
    check_tree(&dest, &Model::read(data), &receipt);
}

/// Every entry of the tree is one the model holds; with no skip and no stop, every entry the
/// model holds is in the tree; and the receipt's count agrees with what is there.
fn check_tree(dest: &Path, model: &Model, receipt: &Receipt) {
    let (mut files, mut dirs) = (HashSet::new(), HashSet::new());
    let mut todo: Vec<Segs> = vec![Vec::new()];
    while let Some(at) = todo.pop() {
        let dir = at
            .iter()
            .fold(dest.to_path_buf(), |p, s| p.join(std::ffi::OsStr::from_bytes(s)));
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let mut segs = at.clone();
            segs.push(e.file_name().as_bytes().to_vec());
            let path = e.path();
            if at.is_empty() && (segs[0] == b"escape" || segs[0] == b"abs") {
                continue; // the planted links, checked above
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let mode = meta.permissions().mode() & 0o7777;
            match model.first.get(&segs) {
                _ if meta.file_type().is_symlink() => panic!("a link was created: {path:?} ({receipt:?})"),
                Some(Member::File { data, mode: want }) if meta.is_file() => {
                    assert_eq!(mode, *want, "{path:?} has mode {mode:o} ({receipt:?})");
                    assert!(
                        std::fs::read(&path).unwrap() == *data,
                        "{path:?} does not hold its member's bytes ({receipt:?})"
                    );
                    files.insert(segs);
                }
                Some(Member::Directory) if meta.is_dir() => {
                    assert!(mode & !0o755 == 0, "{path:?} has mode {mode:o} ({receipt:?})");
                    todo.push(segs.clone());
                    dirs.insert(segs);
                }
                _ if meta.is_dir() && model.parents.contains(&segs) => {
                    assert!(mode & !0o755 == 0, "{path:?} has mode {mode:o} ({receipt:?})");
                    todo.push(segs.clone());
                    dirs.insert(segs);
                }
                other => panic!(
                    "{path:?} ({:?}) is not what the archive says is there ({other:?}): a leftover? ({receipt:?})",
                    meta.file_type()
                ),
            }
        }
    }
    // Each file written is a distinct path in the tree, and so is each directory member
    // written; directories above members are made without being counted.
    let (nf, nd) = (files.len() as u64, dirs.len() as u64);
    assert!(
        nf <= receipt.written && receipt.written <= nf + nd,
        "the receipt says {} written; the tree holds {nf} files and {nd} directories ({receipt:?})",
        receipt.written
    );
    if receipt.stopped.is_none() && receipt.skipped_total() == 0 {
        for (segs, member) in &model.first {
            let there = match member {
                Member::File { .. } => files.contains(segs),
                Member::Directory => dirs.contains(segs),
            };
            assert!(
                there,
                "{:?} ({member:?}) is missing, though nothing was skipped ({receipt:?})",
                String::from_utf8_lossy(&segs.join(&b'/'))
            );
        }
        for segs in &model.parents {
            assert!(
                dirs.contains(segs),
                "the directory {:?} is missing ({receipt:?})",
                String::from_utf8_lossy(&segs.join(&b'/'))
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in members {
            let mut h = tar::Header::new_ustar();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// Extract `data`, let `spoil` change the tree, and say whether the property caught it.
    fn caught(data: &[u8], spoil: impl FnOnce(&Path)) -> bool {
        let dest = tempfile::tempdir().unwrap();
        let receipt = extract(data, dest.path(), &Options::default());
        check_tree(dest.path(), &Model::read(data), &receipt);
        spoil(dest.path());
        std::panic::catch_unwind(|| check_tree(dest.path(), &Model::read(data), &receipt)).is_err()
    }

    #[test]
    fn the_property_catches_what_the_archive_does_not_say() {
        let data = archive(&[("d/f", b"mine"), (".agentbox-extractnnn", b"x")]);
        let write = |p: &str, b: &[u8]| {
            let p = p.to_string();
            let b = b.to_vec();
            move |d: &Path| std::fs::write(d.join(p), b).unwrap()
        };
        // A leftover, whatever its name; other bytes; a member missing; a wider mode.
        assert!(caught(&data, write(".agentbox-extract-1-7", b"")));
        assert!(caught(&data, write("d/other", b"")));
        assert!(caught(&data, write("d/f", b"yours")));
        assert!(caught(&data, |d| std::fs::remove_file(d.join("d/f")).unwrap()));
        assert!(caught(&data, |d| std::fs::create_dir(d.join("e")).unwrap()));
        assert!(caught(&data, |d| {
            std::fs::set_permissions(d.join("d/f"), std::fs::Permissions::from_mode(0o755)).unwrap()
        }));
        assert!(caught(&data, |d| std::os::unix::fs::symlink("f", d.join("d/l")).unwrap()));
        assert!(!caught(&data, |_| ()), "an untouched tree passes");
    }
}

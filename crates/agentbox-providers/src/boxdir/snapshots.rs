//! Snapshots of boxes kept as directories of this machine (local, namespace): each is
//! `<root>/snapshots/<provider>/<name>/` holding copies of a box's `work/` and `home/` and its
//! description, `snapshot.json`.
//!
//! A snapshot is whole or absent: it is copied into a temporary directory (`.tmp-…`) and
//! renamed into place with `RENAME_NOREPLACE`, so of two snapshots of one name one is kept and
//! the other refused; a delete renames it out of its name (`.del-…`) before removing it, so no
//! box is seeded from a half-removed one. What a snapshot or delete that died left is removed
//! by a later listing, once old.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use agentbox_core::{Error, Result, SandboxId, Snapshot, now_ms, validate_name};

use super::{copy_tree, is_old, make_boxes_dir, names, read_record, remove_tree};
use crate::atomic::write_atomic;
use crate::random::random_hex;

/// A snapshot's description in its directory.
const DESCRIPTION: &str = "snapshot.json";

/// What a box keeps of its own and a snapshot copies.
pub(crate) const KEPT: [&str; 2] = ["work", "home"];

/// One provider's snapshots.
pub(crate) struct Snapshots {
    dir: PathBuf,
    provider: &'static str,
}

impl Snapshots {
    /// The snapshots of `provider` under agentbox's home `root`.
    pub(crate) fn at(root: &Path, provider: &'static str) -> Self {
        Snapshots {
            dir: root.join("snapshots").join(provider),
            provider,
        }
    }

    fn exists(&self, name: &str) -> Error {
        Error::refused(format!(
            "snapshot: a {} snapshot named {name:?} exists (delete it first, or take another name)",
            self.provider
        ))
    }

    /// The directory of the snapshot a spec names (its `work/` and `home/` seed a new box);
    /// `not_found` naming it when there is none.
    pub(crate) fn seed(&self, name: &str) -> Result<PathBuf> {
        validate_name("spec.snapshot", name)?;
        let dir = self.dir.join(name);
        if !dir.join(DESCRIPTION).is_file() {
            return Err(Error::not_found(format!(
                "spec.snapshot: no {} snapshot named {name:?}",
                self.provider
            )));
        }
        Ok(dir)
    }

    /// Keep the `work/` and `home/` of the box in `box_dir` (whose id is `from`) as `name`.
    pub(crate) async fn take(&self, box_dir: &Path, name: &str, from: &SandboxId) -> Result<Snapshot> {
        validate_name("snapshot", name)?;
        let snaps = make_boxes_dir(self.dir.parent().unwrap_or(&self.dir), self.provider)?;
        let target = snaps.join(name);
        if target.exists() {
            return Err(self.exists(name));
        }
        let tmp = snaps.join(format!(".tmp-{}", random_hex(8)?));
        let mut snap = Snapshot {
            name: name.to_string(),
            provider: self.provider.into(),
            from: Some(from.clone()),
            created_at_ms: Some(now_ms()),
            bytes: None,
            memory: false,
        };
        let exists = self.exists(name);
        let (box_dir, tmp2) = (box_dir.to_path_buf(), tmp.clone());
        // The copy is blocking work (a box's files may be many): off the runtime's threads.
        let taken = tokio::task::spawn_blocking(move || -> Result<Snapshot> {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&tmp2)
                .map_err(|e| Error::io(e, format!("snapshot: creating {}", tmp2.display())))?;
            let mut bytes = 0;
            for sub in KEPT {
                bytes += copy_tree(&box_dir.join(sub), &tmp2.join(sub))
                    .map_err(|e| Error::new(e.code(), format!("snapshot: copying the box's {sub}: {}", e.message())))?;
            }
            snap.bytes = Some(bytes);
            let json = serde_json::to_vec_pretty(&snap).map_err(|e| Error::unknown(e.to_string()))?;
            write_atomic(&tmp2.join(DESCRIPTION), &json)?;
            // Into place whole, or not at all: a second snapshot of one name loses here.
            rustix::fs::renameat_with(
                rustix::fs::CWD,
                &tmp2,
                rustix::fs::CWD,
                &target,
                rustix::fs::RenameFlags::NOREPLACE,
            )
            .map_err(|e| match e {
                rustix::io::Errno::EXIST | rustix::io::Errno::NOTEMPTY => exists,
                e => Error::io(e.into(), format!("snapshot: renaming {} into place", tmp2.display())),
            })?;
            Ok(snap)
        })
        .await
        .map_err(|e| Error::unknown(format!("snapshot: {e}")))
        .and_then(|r| r);
        if taken.is_err() {
            remove_tree(&tmp);
        }
        taken
    }

    /// Every snapshot kept, by name.
    pub(crate) fn list(&self) -> Result<Vec<Snapshot>> {
        let mut out = Vec::new();
        for name in names(&self.dir)? {
            let dir = self.dir.join(&name);
            if name.starts_with('.') {
                // What a snapshot or a delete that died left.
                if is_old(&dir) {
                    remove_tree(&dir);
                }
                continue;
            }
            if let Ok(Some(s)) = read_record::<Snapshot>(&dir.join(DESCRIPTION)) {
                out.push(s);
            }
        }
        Ok(out)
    }

    /// Delete the snapshot `name`; `false` when there was none.
    pub(crate) async fn delete(&self, name: &str) -> Result<bool> {
        validate_name("snapshot", name)?;
        let dir = self.dir.join(name);
        // Out of its name at once, then removed: a snapshot of the same name may be taken
        // again meanwhile, and no box is seeded from a half-removed one.
        let gone = self.dir.join(format!(".del-{}", random_hex(8)?));
        match std::fs::rename(&dir, &gone) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(Error::io(e, format!("delete_snapshot: moving {}", dir.display()))),
        }
        tokio::task::spawn_blocking(move || remove_tree(&gone))
            .await
            .map_err(|e| Error::unknown(format!("delete_snapshot: {e}")))?;
        tracing::info!(provider = self.provider, snapshot = name, "snapshot deleted");
        Ok(true)
    }
}

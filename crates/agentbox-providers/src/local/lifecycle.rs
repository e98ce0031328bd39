//! A local box's lifecycle beyond create and destroy.
//!
//! - **Names**: the box opened by `name` is the directory [`name_key`] of the name and its
//!   labels, so two opens at once meet at one `mkdir`, and the one that loses it waits for the
//!   other's record.
//! - **Sleep, wake, extend**: asked of the box's supervisor, which owns its programs and its
//!   deadline: a sleep ends every program and refuses execs until a wake; a deadline moved is
//!   the one the supervisor then keeps, with no call from the host. The record says the same
//!   for any process that reads it. A local box has no isolation, so nothing stops its own
//!   programs asking these of the supervisor: it is for development and tests.
//! - **Snapshots and forks**: copies of the box's `work/` and `home/` (never `tmp/`), made
//!   with links copied as links, in `<root>/snapshots/local/<name>/`, written to a temporary
//!   directory and renamed into place so a snapshot is whole or absent.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{
    Ctx, Error, Labels, Result, Sandbox, SandboxId, Snapshot, Spec, check_deadline, check_fork_count, validate_labels,
    validate_name,
};
use agentbox_protocol::supervisor::Request;

use super::{LocalProvider, NAME, Record, ask_supervisor};
use crate::boxdir;
use crate::lifecycle::name_key;
use crate::util::{now_ms, random_hex, write_atomic};

/// How long an open waits for another process's make of the same name.
const OPEN_WAIT: Duration = Duration::from_secs(30);

/// How long a control request to the supervisor may take.
const ASK_LIMIT: Duration = Duration::from_secs(15);

/// A snapshot's own description, beside its `work/` and `home/`.
#[derive(serde::Serialize, serde::Deserialize)]
struct SnapshotMeta {
    from: SandboxId,
    created_at_ms: u64,
    bytes: u64,
}

/// `<root>/snapshots/local`, made when missing.
fn snapshots_root(p: &LocalProvider) -> Result<PathBuf> {
    boxdir::make_boxes_dir(&p.opts.root, "snapshots/local")
}

/// The directory of the snapshot `name`; `not_found` naming it when there is none.
pub(super) fn snapshot_dir(p: &LocalProvider, name: &str) -> Result<PathBuf> {
    validate_name("spec.snapshot", name)?;
    let dir = snapshots_root(p)?.join(name);
    if !dir.join("meta.json").is_file() {
        return Err(Error::not_found(format!(
            "spec.snapshot: no local snapshot named {name:?}"
        )));
    }
    Ok(dir)
}

impl LocalProvider {
    /// The record of box `id` for a change, under its lock: `gone` when it has ended.
    fn locked(&self, id: &SandboxId) -> Result<(PathBuf, Record, std::fs::File)> {
        id.expect_provider(NAME)?;
        let gone = || Error::gone(format!("box {id}: it has ended"));
        let (dir, _) = self.find(id.name())?.ok_or_else(gone)?;
        let lock = Record::lock(&dir)?;
        // Read again under the lock: the one read before it may be another change's past.
        let record = Record::read(&dir)?.ok_or_else(gone)?;
        Ok((dir, record, lock))
    }

    /// The box as it is now, after a change.
    async fn again(&self, id: &SandboxId, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        use agentbox_core::Provider;
        self.attach(id, ctx)
            .await?
            .ok_or_else(|| Error::gone(format!("box {id}: it ended")))
    }

    pub(super) async fn open_named(&self, name: &str, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let key = name_key(name, &spec.labels)?;
        self.check(spec)?;
        let seed = match &spec.snapshot {
            Some(s) => Some(snapshot_dir(self, s)?),
            None => None,
        };
        let id = SandboxId::new(NAME, &key)?;
        let t0 = tokio::time::Instant::now();
        loop {
            ctx.check()?;
            if let Some((_, record)) = self.find(&key)? {
                if record.name.as_deref() != Some(name) || record.labels != spec.labels {
                    return Err(Error::refused(format!(
                        "open {name:?}: the box {id} that holds this name's place is another's (a hash collision of label sets)"
                    )));
                }
                if record.asleep {
                    tracing::info!(box_id = %id, name, "opened asleep: waking it");
                    return self.wake_box(&id, ctx).await;
                }
                tracing::info!(box_id = %id, name, "opened");
                return self.again(&id, ctx).await;
            }
            match self.make(&key, Some(name), seed.as_deref(), spec, ctx).await {
                Ok(b) => {
                    tracing::info!(box_id = %id, name, "opened: made");
                    return Ok(b);
                }
                // Another process makes it (or an ended box's directory is going): wait for
                // its record, or for the directory to be gone.
                Err(e) if self.boxes.join(&key).exists() && t0.elapsed() < OPEN_WAIT => {
                    tracing::debug!(box_id = %id, error = %e, "another make of this name is under way");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e.context(format!("open {name:?}"))),
            }
        }
    }

    pub(super) async fn discard_named(&self, name: &str, labels: &Labels, ctx: &Ctx) -> Result<bool> {
        let key = name_key(name, labels)?;
        let Some((_, record)) = self.find(&key)? else {
            return Ok(false);
        };
        if record.name.as_deref() != Some(name) || &record.labels != labels {
            return Ok(false);
        }
        let b = agentbox_core::Provider::attach(self, &record.id, ctx).await?;
        if let Some(b) = b {
            b.destroy(ctx).await?;
        }
        tracing::info!(box_id = %record.id, name, "discarded");
        Ok(true)
    }

    pub(super) async fn sleep_box(&self, id: &SandboxId, ctx: &Ctx) -> Result<()> {
        let (dir, mut record, _lock) = self.locked(id)?;
        if record.asleep {
            return Ok(());
        }
        ctx.run_result(ask_supervisor(&dir, Request::Sleep, ASK_LIMIT)).await?;
        record.asleep = true;
        record.write(&dir)?;
        tracing::info!(box_id = %id, "asleep");
        Ok(())
    }

    pub(super) async fn wake_box(&self, id: &SandboxId, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        {
            let (dir, mut record, _lock) = self.locked(id)?;
            if record.asleep {
                ctx.run_result(ask_supervisor(&dir, Request::Wake, ASK_LIMIT)).await?;
                record.asleep = false;
                record.write(&dir)?;
                tracing::info!(box_id = %id, "awake");
            }
        }
        // Its runner ended with its programs: attach starts it again.
        self.again(id, ctx).await
    }

    pub(super) async fn extend_box(&self, id: &SandboxId, ends_at_ms: u64, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        check_deadline(ends_at_ms, now_ms())?;
        {
            let (dir, mut record, _lock) = self.locked(id)?;
            // The supervisor first: the deadline it keeps is the one that holds.
            ctx.run_result(ask_supervisor(
                &dir,
                Request::Deadline {
                    deadline_ms: ends_at_ms,
                },
                ASK_LIMIT,
            ))
            .await?;
            record.ends_at_ms = ends_at_ms;
            record.write(&dir)?;
            tracing::info!(box_id = %id, ends_at = %agentbox_core::rfc3339(ends_at_ms as i64), "deadline moved");
        }
        self.again(id, ctx).await
    }

    pub(super) async fn relabel_box(&self, id: &SandboxId, labels: &Labels, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        validate_labels(labels)?;
        {
            let (dir, mut record, _lock) = self.locked(id)?;
            if let Some(name) = &record.name {
                return Err(Error::refused(format!(
                    "relabel {id}: it was opened by the name {name:?}, whose labels are part of that name"
                )));
            }
            record.labels = labels.clone();
            record.write(&dir)?;
            tracing::info!(box_id = %id, "relabelled");
        }
        self.again(id, ctx).await
    }

    pub(super) async fn snapshot_box(&self, id: &SandboxId, name: &str, ctx: &Ctx) -> Result<Snapshot> {
        validate_name("snapshot", name)?;
        id.expect_provider(NAME)?;
        let (dir, _) = self
            .find(id.name())?
            .ok_or_else(|| Error::gone(format!("box {id}: it has ended")))?;
        let root = snapshots_root(self)?;
        let target = root.join(name);
        if target.exists() {
            return Err(Error::refused(format!(
                "snapshot {name:?}: one of that name exists; delete it first"
            )));
        }
        let tmp = root.join(format!(".{name}.{}", random_hex(4)?));
        let made = (|| {
            std::fs::create_dir(&tmp).map_err(|e| Error::io(e, format!("creating {}", tmp.display())))?;
            let mut bytes = 0;
            for sub in ["work", "home"] {
                bytes += boxdir::copy_tree(&dir.join(sub), &tmp.join(sub))?;
            }
            let meta = SnapshotMeta {
                from: id.clone(),
                created_at_ms: now_ms(),
                bytes,
            };
            let json = serde_json::to_vec_pretty(&meta).map_err(|e| Error::unknown(e.to_string()))?;
            write_atomic(&tmp.join("meta.json"), &json)?;
            // A rename onto a directory that is there and not empty fails: of two snapshots
            // of one name at once, one is kept and the other refused.
            std::fs::rename(&tmp, &target).map_err(|e| {
                if target.exists() {
                    Error::refused(format!("snapshot {name:?}: one of that name was just taken"))
                } else {
                    Error::io(e, format!("putting snapshot {name:?} in place"))
                }
            })?;
            Ok::<_, Error>(meta)
        })();
        ctx.check()?;
        match made {
            Ok(meta) => {
                tracing::info!(box_id = %id, snapshot = name, bytes = meta.bytes, "snapshot taken");
                Ok(snapshot_of(name, meta))
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                Err(e)
            }
        }
    }

    pub(super) fn list_snapshots(&self) -> Result<Vec<Snapshot>> {
        let root = snapshots_root(self)?;
        let mut out = Vec::new();
        for name in boxdir::names(&root)? {
            if name.starts_with('.') {
                continue;
            }
            if let Ok(Some(meta)) = boxdir::read_record::<SnapshotMeta>(&root.join(&name).join("meta.json")) {
                out.push(snapshot_of(&name, meta));
            }
        }
        Ok(out)
    }

    pub(super) fn remove_snapshot(&self, name: &str) -> Result<bool> {
        validate_name("snapshot", name)?;
        let root = snapshots_root(self)?;
        let dir = root.join(name);
        if !dir.exists() {
            return Ok(false);
        }
        // Out of its name first, so no create starts from a half-removed snapshot.
        let gone = root.join(format!(".{name}.{}.gone", random_hex(4)?));
        std::fs::rename(&dir, &gone).map_err(|e| Error::io(e, format!("removing snapshot {name:?}")))?;
        std::fs::remove_dir_all(&gone).map_err(|e| Error::io(e, format!("removing snapshot {name:?}")))?;
        tracing::info!(snapshot = name, "snapshot deleted");
        Ok(true)
    }

    pub(super) async fn fork_box(
        &self,
        id: &SandboxId,
        n: usize,
        spec: &Spec,
        ctx: &Ctx,
    ) -> Result<Vec<Arc<dyn Sandbox>>> {
        check_fork_count(n)?;
        if spec.snapshot.is_some() {
            return Err(Error::invalid(
                "fork: spec.snapshot is set, but a fork's boxes start from the box forked",
            ));
        }
        self.check(spec)?;
        id.expect_provider(NAME)?;
        let (dir, _) = self
            .find(id.name())?
            .ok_or_else(|| Error::gone(format!("box {id}: it has ended")))?;
        let mut made: Vec<Arc<dyn Sandbox>> = Vec::with_capacity(n);
        for _ in 0..n {
            match self.make(&random_hex(8)?, None, Some(&dir), spec, ctx).await {
                Ok(b) => made.push(b),
                Err(e) => {
                    for b in &made {
                        let _ = b
                            .destroy(&Ctx::background().with_timeout(Duration::from_secs(30)))
                            .await;
                    }
                    return Err(e.context(format!("fork of {id}")));
                }
            }
        }
        tracing::info!(box_id = %id, n, "forked");
        Ok(made)
    }
}

fn snapshot_of(name: &str, meta: SnapshotMeta) -> Snapshot {
    Snapshot {
        name: name.to_string(),
        provider: NAME.into(),
        from: Some(meta.from),
        created_at_ms: Some(meta.created_at_ms),
        bytes: Some(meta.bytes),
        memory: false,
    }
}

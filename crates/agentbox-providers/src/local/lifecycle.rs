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
    Ctx, Error, Labels, Lifecycle, Result, Sandbox, SandboxId, Snapshot, Spec, check_deadline, check_fork, now_ms,
    validate_labels, validate_name,
};
use agentbox_protocol::supervisor::Request;
use async_trait::async_trait;

use super::{LocalProvider, NAME, Record, ask_supervisor};
use crate::boxdir::snapshots::Snapshots;
use crate::lifecycle::name_key;
use crate::random::random_hex;

/// How long an open waits for another process's make of the same name.
const OPEN_WAIT: Duration = Duration::from_secs(30);

/// How long a control request to the supervisor may take.
const ASK_LIMIT: Duration = Duration::from_secs(15);

/// The local provider's snapshots.
fn snapshots(p: &LocalProvider) -> Snapshots {
    Snapshots::at(&p.opts.root, NAME)
}

/// The directory of the snapshot `name`; `not_found` naming it when there is none.
pub(super) fn snapshot_dir(p: &LocalProvider, name: &str) -> Result<PathBuf> {
    snapshots(p).seed(name)
}

impl LocalProvider {
    /// The record of box `id` for a change (`what`), under its lock: `gone` when it has ended.
    async fn locked(&self, id: &SandboxId, what: &str) -> Result<(PathBuf, Record, crate::lock::Locked)> {
        id.expect_provider(NAME)?;
        let gone = || Error::gone(format!("box {id}: it has ended"));
        let (dir, _) = self.find(id.name())?.ok_or_else(gone)?;
        let lock = Record::lock(&dir, what).await?;
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
}

#[async_trait]
impl Lifecycle for LocalProvider {
    async fn open(&self, name: &str, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
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
                    return self.wake(&id, ctx).await;
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

    async fn discard(&self, name: &str, labels: &Labels, ctx: &Ctx) -> Result<bool> {
        let key = name_key(name, labels)?;
        let Some((_, record)) = self.find(&key)? else {
            return Ok(false);
        };
        if record.name.as_deref() != Some(name) || &record.labels != labels {
            return Err(Error::refused(format!(
                "discard {name:?}: the box {} that holds this name's place is another's (a hash collision of label sets)",
                record.id
            )));
        }
        let b = agentbox_core::Provider::attach(self, &record.id, ctx).await?;
        if let Some(b) = b {
            b.destroy(ctx).await?;
        }
        tracing::info!(box_id = %record.id, name, "discarded");
        Ok(true)
    }

    async fn sleep(&self, id: &SandboxId, ctx: &Ctx) -> Result<()> {
        let (dir, mut record, _lock) = self.locked(id, "sleep").await?;
        // Asked again of an asleep box too: the supervisor is what holds, and asking is harmless.
        ctx.run_result(ask_supervisor(&dir, Request::Sleep, ASK_LIMIT)).await?;
        record.asleep = true;
        record.write(&dir)?;
        tracing::info!(box_id = %id, "asleep");
        Ok(())
    }

    async fn wake(&self, id: &SandboxId, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        {
            let (dir, mut record, _lock) = self.locked(id, "wake").await?;
            // Asked whatever the record says: a sleep whose caller gave up after the
            // supervisor slept the box left the record saying awake.
            ctx.run_result(ask_supervisor(&dir, Request::Wake, ASK_LIMIT)).await?;
            if record.asleep {
                record.asleep = false;
                record.write(&dir)?;
                tracing::info!(box_id = %id, "awake");
            }
        }
        // Its runner ended with its programs: attach starts it again.
        self.again(id, ctx).await
    }

    async fn extend(&self, id: &SandboxId, ends_at_ms: u64, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        check_deadline(ends_at_ms, now_ms())?;
        {
            let (dir, mut record, _lock) = self.locked(id, "extend").await?;
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

    async fn relabel(&self, id: &SandboxId, labels: &Labels, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        validate_labels(labels)?;
        {
            let (dir, mut record, _lock) = self.locked(id, "relabel").await?;
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

    async fn snapshot(&self, id: &SandboxId, name: &str, ctx: &Ctx) -> Result<Snapshot> {
        validate_name("snapshot", name)?;
        id.expect_provider(NAME)?;
        let (dir, _) = self
            .find(id.name())?
            .ok_or_else(|| Error::gone(format!("box {id}: it has ended")))?;
        let snap = ctx.run_result(snapshots(self).take(&dir, name, id)).await?;
        tracing::info!(box_id = %id, snapshot = name, bytes = snap.bytes, "snapshot taken");
        Ok(snap)
    }

    async fn snapshots(&self, ctx: &Ctx) -> Result<Vec<Snapshot>> {
        ctx.check()?;
        snapshots(self).list()
    }

    async fn delete_snapshot(&self, name: &str, ctx: &Ctx) -> Result<bool> {
        ctx.check()?;
        snapshots(self).delete(name).await
    }

    async fn fork(&self, id: &SandboxId, n: usize, spec: &Spec, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        check_fork(n, spec)?;
        self.check(spec)?;
        id.expect_provider(NAME)?;
        let (dir, _) = self
            .find(id.name())?
            .ok_or_else(|| Error::gone(format!("box {id}: it has ended")))?;
        crate::lifecycle::all_or_none(id, n, || async {
            self.make(&random_hex(8)?, None, Some(&dir), spec, ctx).await
        })
        .await
    }
}

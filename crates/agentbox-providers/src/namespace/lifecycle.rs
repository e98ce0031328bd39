//! A namespace box's life beyond create and destroy (see `agentbox_core::lifecycle`).
//!
//! - **Names.** The box opened as `name` is the box whose id is
//!   `namespace:<name_key(name, labels)>`, so two opens of one name meet at one directory:
//!   `mkdir` decides which makes it, and the other waits (bounded) for its record, then
//!   answers it. A box found there must carry that very name and those labels in its record.
//! - **Sleep.** The init ends every process of the box but itself and starts no runner until
//!   woken; the files stay, and so does the init with its deadline, so a sleeping box still
//!   ends at its deadline with no call from the host (`sleep: files`, `sleep_clock:
//!   counting`). The record says `asleep`, so attach and list from any process answer
//!   [`Asleep`] handles.
//! - **Extend.** The init takes the new deadline on its control socket, later or earlier, and
//!   its deadline's thread waits for that one instead. Only the host can ask (see
//!   `control`).
//! - **Relabel.** The record's labels replaced, except for a named box, whose labels are part
//!   of its name.
//! - **Snapshots.** The box's writable layers of its own, `work/` (`/workspace`) and `home/`
//!   (`/root`), copied to `<root>/snapshots/namespace/<name>/` (not `tmp/`, and not a spec's
//!   mounts, which are the host's); a spec's `snapshot` seeds a new box's `work/` and `home/`
//!   from one. A fork seeds its boxes from the parent's layers as they are.
//!
//! Every change of a record (extend, sleep, wake, relabel) is a read, a message to the init
//! and a write under the record's lock, so concurrent changes never lose each other's.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::Lifecycle;

use agentbox_core::{
    Ctx, Error, Labels, Result, Sandbox, SandboxId, Snapshot, Spec, check_deadline, check_fork, is_reserved_label,
    now_ms, validate_labels, validate_name,
};
use agentbox_protocol::supervisor::Request;
use async_trait::async_trait;

use super::record::{self, LOCK, LOCK_WAIT, Record};
use super::{NAME, NamespaceProvider, control, end_box, remove_ended};
use crate::boxdir::snapshots::Snapshots;
use crate::lifecycle::name_key;
use crate::random::random_hex;

/// How long an open waits for another open's make of the same name (its start is bounded by
/// the start timeout) before it gives up.
const OPEN_WAIT: Duration = Duration::from_secs(30);

/// What a new box's writable layers are copied from: a snapshot's, or a fork's parent's.
#[derive(Clone, Debug)]
pub(crate) struct Seed {
    pub work: PathBuf,
    pub home: PathBuf,
    /// The snapshot's name, for the box's facts.
    pub snapshot: Option<String>,
}

impl NamespaceProvider {
    fn snapshots(&self) -> Snapshots {
        Snapshots::at(&self.opts.root, NAME)
    }

    /// The seed a spec's `snapshot` names; `not_found` naming it when there is none.
    pub(super) fn snapshot_seed(&self, spec: &Spec) -> Result<Option<Seed>> {
        let Some(name) = &spec.snapshot else {
            return Ok(None);
        };
        let dir = self.snapshots().seed(name)?;
        Ok(Some(Seed {
            work: dir.join("work"),
            home: dir.join("home"),
            snapshot: Some(name.clone()),
        }))
    }

    /// The box `id` that has not ended, with its directory; `gone` naming `what` when none.
    fn found(&self, id: &SandboxId, what: &str) -> Result<(PathBuf, Record)> {
        id.expect_provider(NAME)?;
        self.find(id.name())?
            .ok_or_else(|| Error::gone(format!("{what}: box {id} has ended (or never was)")))
    }

    /// Change the record of the box `id` under its lock: `change` answers whether anything
    /// changed (and so whether to write it). Answers the box as it is afterwards.
    async fn change<F>(&self, id: &SandboxId, what: &str, change: F) -> Result<Arc<dyn Sandbox>>
    where
        F: AsyncFnOnce(&Path, &mut Record) -> Result<bool>,
    {
        let (dir, _) = self.found(id, what)?;
        let gone = || Error::gone(format!("{what}: box {id} has ended"));
        let _lock = record::lock(&dir.join(LOCK), LOCK_WAIT, what).await?.ok_or_else(gone)?;
        let mut r = Record::read(&dir)?
            .filter(|r| r.init_alive() && r.ends_at_ms > now_ms())
            .ok_or_else(gone)?;
        if change(&dir, &mut r).await? {
            r.write(&dir)?;
        }
        Ok(self.sandbox(dir, r))
    }

    /// Wait until the directory `dir` holds a record (answered), or is gone or was a make that
    /// died (cleaned up; `None`, so the caller makes it again).
    async fn settled(&self, dir: &Path, what: &str, ctx: &Ctx) -> Result<Option<Record>> {
        let until = tokio::time::Instant::now() + OPEN_WAIT;
        loop {
            ctx.check()?;
            if let Some(r) = Record::read(dir)? {
                return Ok(Some(r));
            }
            if !dir.exists() {
                return Ok(None);
            }
            // No record: a make under way holds the lock; a make that died let go of it.
            if let Some(held) = record::try_lock(&dir.join(LOCK)) {
                if let Some(r) = Record::read(dir)? {
                    return Ok(Some(r));
                }
                tracing::info!(dir = %dir.display(), "{what}: removing a make that died");
                end_box(dir);
                drop(held);
                return Ok(None);
            }
            if tokio::time::Instant::now() > until {
                return Err(Error::timeout(format!(
                    "{what}: {} is being made by another open, which has not finished in {} s",
                    dir.display(),
                    OPEN_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// `e`, its message led by the operation that refused it.
fn named(operation: &str, e: Error) -> Error {
    Error::new(e.code(), format!("{operation}: {}", e.message()))
}

#[async_trait]
impl Lifecycle for NamespaceProvider {
    async fn open(&self, name: &str, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let key = name_key(name, &spec.labels).map_err(|e| named("open", e))?;
        self.check(spec)?;
        let seed = self.snapshot_seed(spec)?;
        let dir = self.boxes.join(&key);
        let until = tokio::time::Instant::now() + OPEN_WAIT;
        loop {
            if let Some(b) = self.make(&key, Some(name), spec, seed.as_ref(), ctx).await? {
                tracing::info!(box_id = %b.id(), name, "open: made");
                return Ok(b);
            }
            if let Some(r) = self.settled(&dir, "open", ctx).await? {
                if r.name.as_deref() != Some(name) || r.labels != spec.labels {
                    return Err(Error::refused(format!(
                        "open {name:?}: the box {} in this name's place was opened by {:?} with other labels",
                        r.id,
                        r.name.as_deref().unwrap_or("no name")
                    )));
                }
                if r.init_alive() && r.ends_at_ms > now_ms() {
                    let id = r.id.clone();
                    if r.asleep {
                        tracing::info!(box_id = %id, name, "open: waking it");
                        return self.wake(&id, ctx).await;
                    }
                    tracing::info!(box_id = %id, name, "open: found");
                    return Ok(self.sandbox(dir, r));
                }
                // It ended (or is ending at its deadline): made again once it is gone.
                remove_ended(&dir, &r);
            }
            if tokio::time::Instant::now() > until {
                return Err(Error::timeout(format!(
                    "open {name:?}: the box at {} neither answered nor went in {} s",
                    dir.display(),
                    OPEN_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn discard(&self, name: &str, labels: &Labels, ctx: &Ctx) -> Result<bool> {
        validate_labels(labels).map_err(|e| named("discard", e))?;
        let key = name_key(name, labels).map_err(|e| named("discard", e))?;
        let dir = self.boxes.join(&key);
        let Some(r) = self.settled(&dir, "discard", ctx).await? else {
            tracing::info!(name, "discard: there was none");
            return Ok(false);
        };
        if r.name.as_deref() != Some(name) || &r.labels != labels {
            return Err(Error::refused(format!(
                "discard {name:?}: the box {} in this name's place was opened by {:?} with other labels",
                r.id,
                r.name.as_deref().unwrap_or("no name")
            )));
        }
        let was = r.init_alive() && r.ends_at_ms > now_ms();
        let id = r.id.clone();
        self.sandbox(dir, r).destroy(ctx).await?;
        tracing::info!(box_id = %id, name, was, "discarded");
        Ok(was)
    }

    async fn sleep(&self, id: &SandboxId, ctx: &Ctx) -> Result<()> {
        ctx.check()?;
        self.change(id, "sleep", async |dir: &Path, r: &mut Record| {
            if r.asleep {
                return Ok(false);
            }
            control::ask(dir, &Request::Sleep, "sleep").await?;
            r.asleep = true;
            Ok(true)
        })
        .await?;
        tracing::info!(box_id = %id, "asleep");
        Ok(())
    }

    async fn wake(&self, id: &SandboxId, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        ctx.check()?;
        let b = self
            .change(id, "wake", async |dir: &Path, r: &mut Record| {
                if !r.asleep {
                    return Ok(false);
                }
                // Answered once the new runner listens: the box takes programs again.
                control::ask(dir, &Request::Wake, "wake").await?;
                r.asleep = false;
                Ok(true)
            })
            .await?;
        tracing::info!(box_id = %id, "awake");
        Ok(b)
    }

    async fn extend(&self, id: &SandboxId, ends_at_ms: u64, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        ctx.check()?;
        check_deadline(ends_at_ms, now_ms())?;
        let b = self
            .change(id, "extend", async |dir: &Path, r: &mut Record| {
                control::ask(
                    dir,
                    &Request::Deadline {
                        deadline_ms: ends_at_ms,
                    },
                    "extend",
                )
                .await?;
                r.ends_at_ms = ends_at_ms;
                r.facts.ends_at_ms = Some(ends_at_ms);
                Ok(true)
            })
            .await?;
        tracing::info!(box_id = %id, ends_at_ms, "extended");
        Ok(b)
    }

    async fn relabel(&self, id: &SandboxId, labels: &Labels, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        ctx.check()?;
        validate_labels(labels).map_err(|e| named("relabel", e))?;
        let b = self
            .change(id, "relabel", async |_: &Path, r: &mut Record| {
                if let Some(name) = &r.name {
                    return Err(Error::refused(format!(
                        "relabel: box {} was opened by the name {name:?}, whose labels are part of it \
                         (discard it and open it with the new labels)",
                        r.id
                    )));
                }
                // The providers' own labels stay; the host's are replaced.
                r.labels.retain(|k, _| is_reserved_label(k));
                r.labels.extend(labels.clone());
                Ok(true)
            })
            .await?;
        tracing::info!(box_id = %id, "relabelled");
        Ok(b)
    }

    async fn snapshot(&self, id: &SandboxId, name: &str, ctx: &Ctx) -> Result<Snapshot> {
        ctx.check()?;
        validate_name("snapshot name", name).map_err(|e| named("snapshot", e))?;
        let (dir, r) = self.found(id, "snapshot")?;
        let snap = self.snapshots().take(&dir, name, &r.id).await?;
        tracing::info!(box_id = %id, snapshot = name, bytes = snap.bytes, "snapshot taken");
        Ok(snap)
    }

    async fn snapshots(&self, ctx: &Ctx) -> Result<Vec<Snapshot>> {
        ctx.check()?;
        self.snapshots().list()
    }

    async fn delete_snapshot(&self, name: &str, ctx: &Ctx) -> Result<bool> {
        ctx.check()?;
        validate_name("snapshot name", name).map_err(|e| named("delete_snapshot", e))?;
        self.snapshots().delete(name).await
    }

    async fn fork(&self, id: &SandboxId, n: usize, spec: &Spec, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        check_fork(n, spec)?;
        self.check(spec)?;
        let (dir, _) = self.found(id, "fork")?;
        let seed = Seed {
            work: dir.join("work"),
            home: dir.join("home"),
            snapshot: None,
        };
        crate::lifecycle::all_or_none(id, n, || async {
            let key = random_hex(8)?;
            self.make(&key, None, spec, Some(&seed), ctx)
                .await?
                .ok_or_else(|| Error::unknown(format!("a box named {key} is there already")))
        })
        .await
    }
}

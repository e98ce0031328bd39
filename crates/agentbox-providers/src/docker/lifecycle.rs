//! A Docker box's lifecycle beyond create and destroy.
//!
//! - **Names**: the container of the box opened by `name` is `agentbox-<name_key>`, so two
//!   opens at once meet at the engine's refusal of a second container of one name.
//! - **Extend** rewrites the box's deadline file (see [`super::state`]) and tells its init
//!   (SIGHUP through the engine), which ends the container then, with no call from the host.
//!   No program of the box can move it: the file is mounted read-only, and a signal only makes
//!   the init read it again.
//! - **Sleep** asks the init (SIGUSR1) to kill every other process of the box; the box keeps
//!   its files and its deadline, and is marked asleep on this machine, so attach and list
//!   answer it asleep and wake starts its runner again. The container itself keeps running,
//!   with only its init: a stopped container has no process left to end it at its deadline,
//!   and the engine would keep it (and its disk) past its lifetime with no call from the host.
//! - **Relabel**: the labels are kept on this machine (a container's cannot change).
//! - **Snapshots** are `docker commit` into `agentbox-snapshot:<name>`; a box made from one
//!   starts from that image. **Forks** commit into a hidden image, make each box from it, and
//!   untag it; the engine keeps its layers while a fork's box uses them, and the next list
//!   prunes the image once none does.
//!
//! Commit keeps what the engine keeps of a container besides its files: a box made from a
//! snapshot also gets the environment its source was made with, under its own spec's.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::Lifecycle;

use agentbox_core::{
    Ctx, Error, ErrorCode, Facts, Labels, Provider, Result, Sandbox, SandboxId, Snapshot, Spec, check_deadline,
    check_fork, now_ms, validate_labels, validate_name,
};
use async_trait::async_trait;
use bollard::query_parameters::{
    CommitContainerOptions, KillContainerOptions, ListImagesOptions, PruneImagesOptions, RemoveImageOptions,
};

use super::{DockerProvider, LABEL_INIT, LABEL_NAME, LABEL_SNAPSHOT, NAME, is_not_found, remove_options, state};
use crate::lifecycle::name_key;
use crate::random::random_hex;

/// The repository snapshots are kept in, one tag per snapshot.
pub(super) const SNAPSHOT_REPO: &str = "agentbox-snapshot";
/// The repository of a fork's hidden image.
const FORK_REPO: &str = "agentbox-fork";
/// A snapshot image's labels: its name, the box it was taken of, and when.
const LABEL_SNAPSHOT_FROM: &str = "agentbox.snapshot.from";
const LABEL_SNAPSHOT_AT: &str = "agentbox.snapshot.at_ms";

/// How often the init reads its deadline file again (`agentbox_runner::init`'s poll).
const INIT_POLL_MS: u64 = 2_000;

/// How long a sleep waits for the init to have ended every other process.
const SLEEP_WAIT: Duration = Duration::from_secs(10);

/// How long an open waits for another process's make of the same name.
const OPEN_WAIT: Duration = Duration::from_secs(60);

/// The lifecycle's facts of a box from its labels: its name, its snapshot, and what a sleep
/// keeps (where its init can sleep it).
pub(super) fn lifecycle_facts(facts: &mut Facts, labels: &HashMap<String, String>) {
    let non_empty = |k: &str| labels.get(k).filter(|v| !v.is_empty()).cloned();
    facts.name = non_empty(LABEL_NAME);
    facts.snapshot = non_empty(LABEL_SNAPSHOT);
    if labels.get(LABEL_INIT).map(String::as_str) == Some("1") {
        facts.sleep = Some("files".into());
        facts.sleep_clock = Some("counting".into());
    }
}

impl DockerProvider {
    /// Remove a container this provider made and the files it keeps for it.
    pub(super) async fn discard_container(&self, name: &str) {
        let _ = self.docker.remove_container(name, Some(remove_options())).await;
        // A container whose init already ended is being removed by the engine (auto-remove),
        // and the remove above answers at once ("removal in progress"): wait, at most ten
        // seconds, until the engine no longer knows it (or cannot be asked), so a failed create leaves nothing
        // listed behind it.
        let until = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while let Ok(Ok(_)) = tokio::time::timeout_at(until, self.docker.inspect_container(name, None)).await {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        state::remove(name);
        if let Ok(dir) = super::runner_dir(name, false) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    /// The image a spec's box starts from: its snapshot's (which must exist), its own, or the
    /// provider's.
    pub(super) async fn image_of(&self, spec: &Spec, ctx: &Ctx) -> Result<String> {
        let Some(snap) = &spec.snapshot else {
            return Ok(spec.image.clone().unwrap_or_else(|| self.opts.image.clone()));
        };
        validate_name("spec.snapshot", snap)?;
        let image = format!("{SNAPSHOT_REPO}:{snap}");
        match ctx.run(self.docker.inspect_image(&image)).await? {
            Ok(_) => Ok(image),
            Err(e) if is_not_found(&e) => Err(Error::not_found(format!(
                "spec.snapshot: no docker snapshot named {snap:?}"
            ))),
            Err(e) => Err(Error::unknown(format!("inspecting snapshot {snap:?}: {e}"))),
        }
    }

    /// Refuse `operation` where this provider starts no init of agentbox's (no runner), as
    /// its `honours()` says.
    fn needs_init(&self, operation: &str) -> Result<()> {
        if self.opts.runner.is_some() {
            return Ok(());
        }
        Err(Error::unsupported(format!(
            "{} (this provider makes boxes without the runner, whose binary is their init)",
            agentbox_core::refuse(NAME, operation).message()
        )))
    }

    /// The running box `id`; `gone` when it has ended.
    async fn running_box(&self, id: &SandboxId, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        id.expect_provider(NAME)?;
        self.attach(id, ctx)
            .await?
            .ok_or_else(|| Error::gone(format!("box {id}: it has ended")))
    }

    /// The labels of box `id`, whose first process must be agentbox's init (`unsupported`
    /// for a box made without the runner, whose first process is `sleep` and cannot be told).
    async fn with_init(&self, id: &SandboxId, what: &str, ctx: &Ctx) -> Result<HashMap<String, String>> {
        let labels = self.labels_of(id, ctx).await?;
        if labels.get(LABEL_INIT).map(String::as_str) != Some("1") {
            return Err(Error::unsupported(format!(
                "{what}: box {id} was made without agentbox's init (no runner): its first process is `sleep`, which cannot be told"
            )));
        }
        Ok(labels)
    }

    /// The labels of the running container of box `id`, read with one inspect (no runner is
    /// reached): `gone` when it has ended or is not this provider's.
    async fn labels_of(&self, id: &SandboxId, ctx: &Ctx) -> Result<HashMap<String, String>> {
        id.expect_provider(NAME)?;
        let gone = || Error::gone(format!("box {id}: it has ended"));
        let info = match ctx.run(self.docker.inspect_container(id.name(), None)).await? {
            Ok(i) => i,
            Err(e) if is_not_found(&e) => return Err(gone()),
            Err(e) => return Err(Error::unknown(format!("inspecting container {}: {e}", id.name()))),
        };
        let labels = info.config.and_then(|c| c.labels).unwrap_or_default();
        let running = info.state.and_then(|s| s.running).unwrap_or(false);
        if !running || labels.get(super::LABEL_PROVIDER).map(String::as_str) != Some(NAME) {
            return Err(gone());
        }
        Ok(labels)
    }

    /// Commit box `id` into `repo:tag`, labelled as snapshot `name` (empty for a fork's).
    async fn commit(&self, id: &SandboxId, repo: &str, tag: &str, name: &str, ctx: &Ctx) -> Result<()> {
        let at = now_ms();
        let labels = HashMap::from([
            (LABEL_SNAPSHOT.to_string(), name.to_string()),
            (LABEL_SNAPSHOT_FROM.to_string(), id.to_string()),
            (LABEL_SNAPSHOT_AT.to_string(), at.to_string()),
        ]);
        let commit = self.docker.commit_container(
            CommitContainerOptions {
                container: Some(id.name().to_string()),
                repo: Some(repo.to_string()),
                tag: Some(tag.to_string()),
                comment: Some(format!("agentbox snapshot of {id}")),
                // Paused while its layer is read: the files are one moment's.
                pause: true,
                ..Default::default()
            },
            bollard::models::ContainerConfig {
                labels: Some(labels),
                ..Default::default()
            },
        );
        ctx.run(commit)
            .await?
            .map_err(|e| Error::unknown(format!("committing {id}: {e}")))?;
        Ok(())
    }

    async fn snapshot_info(&self, name: &str, ctx: &Ctx) -> Result<Option<Snapshot>> {
        Ok(self.snapshots(ctx).await?.into_iter().find(|s| s.name == name))
    }

    /// Untag `image`; its layers stay while a box uses them, and [`Self::prune_images`]
    /// removes them once none does. `false` when there was no such image.
    async fn untag(&self, image: &str, ctx: &Ctx) -> Result<bool> {
        let opts = RemoveImageOptions {
            force: true,
            noprune: false,
            ..Default::default()
        };
        match ctx.run(self.docker.remove_image(image, Some(opts), None)).await? {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(Error::unknown(format!("removing {image}: {e}"))),
        }
    }

    /// Remove the untagged images of snapshots and forks no box uses any more (at most once a
    /// minute).
    pub(super) async fn prune_images(&self, ctx: &Ctx) {
        use std::sync::atomic::Ordering;
        let now = now_ms();
        let last = self.pruned_at.load(Ordering::Relaxed);
        if now.saturating_sub(last) < 60_000
            || self
                .pruned_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let opts = PruneImagesOptions {
            filters: Some(HashMap::from([
                ("dangling".to_string(), vec!["true".to_string()]),
                ("label".to_string(), vec![LABEL_SNAPSHOT_FROM.to_string()]),
            ])),
        };
        if let Ok(Err(e)) = ctx.run(self.docker.prune_images(Some(opts))).await {
            tracing::debug!(error = %e, "pruning the images of deleted snapshots and forks");
        }
        // A fork's image still tagged an hour after its commit is one whose fork died part way
        // (its host killed): untagged without force, so one a box still uses stays until it
        // ends, and is pruned then.
        let forks = ListImagesOptions {
            filters: Some(HashMap::from([(
                "reference".to_string(),
                vec![format!("{FORK_REPO}:*")],
            )])),
            ..Default::default()
        };
        if let Ok(Ok(images)) = ctx.run(self.docker.list_images(Some(forks))).await {
            for i in images {
                let at = i
                    .labels
                    .get(LABEL_SNAPSHOT_AT)
                    .and_then(|a| a.parse::<u64>().ok())
                    .unwrap_or(0);
                if now.saturating_sub(at) < 3_600_000 {
                    continue;
                }
                for tag in &i.repo_tags {
                    let opts = RemoveImageOptions {
                        force: false,
                        noprune: false,
                        ..Default::default()
                    };
                    let _ = ctx.run(self.docker.remove_image(tag, Some(opts), None)).await;
                }
            }
        }
    }
}

#[async_trait]
impl Lifecycle for DockerProvider {
    async fn open(&self, name: &str, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let cname = format!("agentbox-{}", name_key(name, &spec.labels)?);
        self.check(spec)?;
        let image = self.image_of(spec, ctx).await?;
        let id = SandboxId::new(NAME, &cname)?;
        let t0 = tokio::time::Instant::now();
        loop {
            ctx.check()?;
            let found = match self.find_container(&cname).await {
                Ok(found) => found,
                // Found while another open makes it (its runner not yet up): again shortly.
                Err(e) if t0.elapsed() < OPEN_WAIT && e.code() != ErrorCode::Invalid => {
                    tracing::debug!(box_id = %id, error = %e, "the name's box is being made: waiting for it");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Some(b) = found {
                if b.facts().name.as_deref() != Some(name) || b.labels() != &spec.labels {
                    return Err(Error::refused(format!(
                        "open {name:?}: the container {cname} that holds this name's place is another's"
                    )));
                }
                if b.status(ctx).await? == agentbox_core::Status::Sleeping {
                    tracing::info!(box_id = %id, name, "opened asleep: waking it");
                    return self.wake(&id, ctx).await;
                }
                tracing::info!(box_id = %id, name, "opened");
                return Ok(b);
            }
            match self.make(&cname, Some(name), image.clone(), spec, ctx).await {
                Ok(b) => {
                    tracing::info!(box_id = %id, name, "opened: made");
                    return Ok(b);
                }
                // Another make of this name holds it, or an ended box of it is being removed.
                Err(e) if e.code() == ErrorCode::Refused && t0.elapsed() < OPEN_WAIT => {
                    tracing::debug!(box_id = %id, error = %e, "the name's container exists: waiting for it");
                    // One that ended but is still there (its removal stuck), or the files of
                    // one that ended that no sweep has removed yet (older than a make takes),
                    // is removed.
                    let stale = match self.docker.inspect_container(&cname, None).await {
                        Ok(info) => {
                            !info.state.and_then(|s| s.running).unwrap_or(false)
                                && t0.elapsed() > Duration::from_secs(5)
                        }
                        Err(e) if is_not_found(&e) => super::runner_dir(&cname, false)
                            .ok()
                            .and_then(|d| d.metadata().ok()?.modified().ok()?.elapsed().ok())
                            .is_some_and(|age| age > Duration::from_secs(60)),
                        Err(_) => false,
                    };
                    if stale {
                        self.discard_container(&cname).await;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e.context(format!("open {name:?}"))),
            }
        }
    }

    async fn discard(&self, name: &str, labels: &Labels, ctx: &Ctx) -> Result<bool> {
        let cname = format!("agentbox-{}", name_key(name, labels)?);
        let Some(b) = ctx.run_result(self.find_container(&cname)).await? else {
            return Ok(false);
        };
        if b.facts().name.as_deref() != Some(name) || b.labels() != labels {
            return Ok(false);
        }
        b.destroy(ctx).await?;
        tracing::info!(box_id = %b.id(), name, "discarded");
        Ok(true)
    }

    async fn sleep(&self, id: &SandboxId, ctx: &Ctx) -> Result<()> {
        self.needs_init("sleep")?;
        id.expect_provider(NAME)?;
        self.with_init(id, "sleep", ctx).await?;
        let _lock = state::lock(id.name(), "sleep").await?;
        if !state::read(id.name())?.asleep {
            // Marked first: a host that attaches meanwhile must not start a runner again.
            state::update(id.name(), |s| s.asleep = true)?;
        }
        // Told again of an asleep box too (a sleep cut short may have marked it only).
        let told = ctx.run(self.docker.kill_container(
            id.name(),
            Some(KillContainerOptions {
                signal: "SIGUSR1".into(),
            }),
        ));
        if let Err(e) = told
            .await?
            .map_err(|e| Error::unknown(format!("sleep: signalling the init of {id}: {e}")))
        {
            state::update(id.name(), |s| s.asleep = false)?;
            return Err(e);
        }
        // The init kills every other process when it takes the signal: the sleep is over
        // once the engine sees the init alone (so a wake that follows starts a runner the
        // sleep will not kill).
        let t0 = tokio::time::Instant::now();
        loop {
            let top = ctx
                .run(
                    self.docker
                        .top_processes(id.name(), None::<bollard::query_parameters::TopOptions>),
                )
                .await?;
            match top {
                Ok(t) if t.processes.as_ref().is_some_and(|p| p.len() <= 1) => break,
                Ok(_) if t0.elapsed() < SLEEP_WAIT => tokio::time::sleep(Duration::from_millis(50)).await,
                Ok(t) => {
                    return Err(Error::timeout(format!(
                        "sleep: box {id} still runs {} processes {}s after its init was told to end them",
                        t.processes.map(|p| p.len()).unwrap_or(0),
                        SLEEP_WAIT.as_secs()
                    )));
                }
                Err(e) if is_not_found(&e) => return Err(Error::gone(format!("sleep: box {id} ended"))),
                Err(e) => return Err(Error::unknown(format!("sleep: listing the processes of {id}: {e}"))),
            }
        }
        tracing::info!(box_id = %id, "asleep");
        Ok(())
    }

    async fn wake(&self, id: &SandboxId, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        self.needs_init("wake")?;
        id.expect_provider(NAME)?;
        {
            self.with_init(id, "wake", ctx).await?;
            let _lock = state::lock(id.name(), "wake").await?;
            if state::read(id.name())?.asleep {
                state::update(id.name(), |s| s.asleep = false)?;
                tracing::info!(box_id = %id, "awake");
            }
        }
        // Its runner ended with its programs: attach starts it again.
        self.running_box(id, ctx).await
    }

    async fn extend(&self, id: &SandboxId, ends_at_ms: u64, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        self.needs_init("extend")?;
        check_deadline(ends_at_ms, now_ms())?;
        id.expect_provider(NAME)?;
        // Quick, for a pool hands a box out with an extend: the deadline file is rewritten,
        // and the attach that answers the box says whether it still runs.
        let before = state::read_deadline(id.name());
        if let Err(e) = state::write_deadline(id.name(), ends_at_ms, false) {
            // No file: a box made without agentbox's init, or by another home, or none.
            if self.labels_of(id, ctx).await?.get(LABEL_INIT).map(String::as_str) != Some("1") {
                return Err(Error::unsupported(format!(
                    "extend: box {id} was made without agentbox's init (no runner): its first process is `sleep`, which cannot be extended"
                )));
            }
            return Err(e);
        }
        // The init reads its file every few seconds: told at once only where that could be
        // too late (a deadline moved earlier, or one close at hand).
        let soon = before.is_none_or(|b| ends_at_ms < b || b.saturating_sub(now_ms()) < 3 * INIT_POLL_MS);
        if soon {
            ctx.run(self.docker.kill_container(
                id.name(),
                Some(KillContainerOptions {
                    signal: "SIGHUP".into(),
                }),
            ))
            .await?
            .map_err(|e| Error::unknown(format!("extend: signalling the init of {id}: {e}")))?;
        }
        tracing::info!(box_id = %id, ends_at = %agentbox_core::rfc3339(ends_at_ms as i64), "deadline moved");
        self.running_box(id, ctx).await
    }

    async fn relabel(&self, id: &SandboxId, labels: &Labels, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        self.needs_init("relabel")?;
        validate_labels(labels)?;
        id.expect_provider(NAME)?;
        {
            let found = self.with_init(id, "relabel", ctx).await?;
            let _lock = state::lock(id.name(), "relabel").await?;
            if let Some(name) = found.get(LABEL_NAME).filter(|n| !n.is_empty()) {
                return Err(Error::refused(format!(
                    "relabel {id}: it was opened by the name {name:?}, whose labels are part of that name"
                )));
            }
            state::update(id.name(), |s| s.labels = Some(labels.clone()))?;
        }
        tracing::info!(box_id = %id, "relabelled");
        self.running_box(id, ctx).await
    }

    async fn snapshot(&self, id: &SandboxId, name: &str, ctx: &Ctx) -> Result<Snapshot> {
        validate_name("snapshot", name)?;
        self.running_box(id, ctx).await?;
        // A commit onto a tag that exists moves the tag: the check and the commit are made
        // one under a lock of this home's, so of two snapshots of one name one is refused.
        let lock_path = state::snapshot_lock(name)?;
        let _lock = crate::lock::lock(&lock_path, Duration::from_secs(120), "snapshot")
            .await?
            .ok_or_else(|| Error::unknown(format!("snapshot: {} cannot be made", lock_path.display())))?;
        let image = format!("{SNAPSHOT_REPO}:{name}");
        match ctx.run(self.docker.inspect_image(&image)).await? {
            Ok(_) => {
                return Err(Error::refused(format!(
                    "snapshot {name:?}: one of that name exists; delete it first"
                )));
            }
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(Error::unknown(format!("inspecting {image}: {e}"))),
        }
        self.commit(id, SNAPSHOT_REPO, name, name, ctx).await?;
        tracing::info!(box_id = %id, snapshot = name, "snapshot taken");
        self.snapshot_info(name, ctx).await?.ok_or_else(|| {
            Error::unknown(format!(
                "snapshot {name:?}: the engine does not show the image it committed"
            ))
        })
    }

    async fn snapshots(&self, ctx: &Ctx) -> Result<Vec<Snapshot>> {
        let opts = ListImagesOptions {
            filters: Some(HashMap::from([(
                "reference".to_string(),
                vec![format!("{SNAPSHOT_REPO}:*")],
            )])),
            ..Default::default()
        };
        let images = ctx
            .run(self.docker.list_images(Some(opts)))
            .await?
            .map_err(|e| Error::unknown(format!("listing snapshots: {e}")))?;
        let mut out = Vec::new();
        for i in images {
            for tag in &i.repo_tags {
                let Some(name) = tag.strip_prefix(&format!("{SNAPSHOT_REPO}:")) else {
                    continue;
                };
                out.push(Snapshot {
                    name: name.to_string(),
                    provider: NAME.into(),
                    from: i.labels.get(LABEL_SNAPSHOT_FROM).and_then(|f| f.parse().ok()),
                    created_at_ms: i.labels.get(LABEL_SNAPSHOT_AT).and_then(|a| a.parse().ok()),
                    bytes: u64::try_from(i.size).ok(),
                    memory: false,
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn delete_snapshot(&self, name: &str, ctx: &Ctx) -> Result<bool> {
        validate_name("snapshot", name)?;
        let removed = self.untag(&format!("{SNAPSHOT_REPO}:{name}"), ctx).await?;
        if removed {
            tracing::info!(snapshot = name, "snapshot deleted");
        }
        Ok(removed)
    }

    async fn fork(&self, id: &SandboxId, n: usize, spec: &Spec, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        check_fork(n, spec)?;
        if spec.image.is_some() {
            return Err(Error::invalid(
                "fork: spec.image is set, but a fork's boxes start from the box forked's image",
            ));
        }
        self.check(spec)?;
        self.running_box(id, ctx).await?;
        let tag = random_hex(8)?;
        let image = format!("{FORK_REPO}:{tag}");
        self.commit(id, FORK_REPO, &tag, "", ctx).await?;
        let made = crate::lifecycle::all_or_none(id, n, || async {
            let cname = format!("agentbox-{}", random_hex(8)?);
            self.make(&cname, None, image.clone(), spec, ctx).await
        })
        .await;
        let _ = self
            .untag(&image, &Ctx::background().with_timeout(Duration::from_secs(30)))
            .await;
        made
    }
}

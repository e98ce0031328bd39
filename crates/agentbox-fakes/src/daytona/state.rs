//! The fake's sandboxes: their records (what the API answers), their namespace boxes, their
//! lifecycle (create, stop, start, archive, the soft delete and the destroy after it), the
//! label index that trails them, and the clock that stops and deletes them with no request
//! (ttl, autoStop, autoDelete).
//!
//! A delete is the API's soft delete (D190 `sandbox.service.ts` `destroy`, `sandbox.entity.ts`
//! `getSoftDeleteUpdate`): answered at once, the record gets `desiredState: destroyed` and a
//! new name (`DESTROYED_<name>_<ms>`, so the name is free for a create at once) and stays,
//! readable by id, until the runner has destroyed the sandbox; a second delete meanwhile is
//! 409. The fake ends the box at once (the runner's first sync does) and forgets the record
//! after [`crate::daytona::FakeDaytonaOptions::delete_lag`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use agentbox_core::{Ctx, Lifecycle, Network, Provider, Sandbox, Spec};
use agentbox_providers::namespace::NamespaceProvider;
use serde_json::{Value, json};

use crate::daytona::error::DError;
use crate::daytona::session::Sessions;
use crate::daytona::{FakeSnapshot, SandboxView};

/// The organization every sandbox belongs to.
pub(crate) const ORGANIZATION: &str = "fake-organization";
/// The target (region) every sandbox is in, whatever the create asked.
pub(crate) const TARGET: &str = "us";
/// The version the toolbox's `/version` answers and the DTO's `daemonVersion`.
pub(crate) const DAEMON_VERSION: &str = "v0.226.1-agentbox-fake";
/// The longest a box lives with no ttl: its init ends it then even if the fake was killed.
const BOX_LIFETIME: Duration = Duration::from_secs(6 * 3600);
/// How long making or ending one box may take.
const BOX_TIMEOUT: Duration = Duration::from_secs(30);
/// Label versions kept per sandbox for the index (the oldest let go).
const INDEX_VERSIONS: usize = 64;

pub(crate) fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
}

pub(crate) fn rfc3339(t: SystemTime) -> String {
    agentbox_core::rfc3339(agentbox_core::epoch_ms(t))
}

/// What every request handler shares.
pub(crate) struct Shared {
    pub(crate) api_key: String,
    pub(crate) base: String,
    pub(crate) provider: Arc<NamespaceProvider>,
    pub(crate) volumes: crate::daytona::volume::Volumes,
    pub(crate) snapshots: BTreeMap<String, FakeSnapshot>,
    pub(crate) default_snapshot: String,
    pub(crate) rootfs: Option<PathBuf>,
    pub(crate) index_lag: Duration,
    pub(crate) minute: Duration,
    pub(crate) network_unenforced: bool,
    /// How long a deleted sandbox's record stays before it is destroyed (then 404).
    pub(crate) delete_lag: Duration,
    /// The status the next create is answered with after it made its sandbox.
    pub(crate) fail_after_create: Mutex<Option<u16>>,
    pub(crate) sandboxes: Mutex<BTreeMap<String, Arc<Sbx>>>,
    pub(crate) throttle: AtomicUsize,
    pub(crate) hang: AtomicBool,
    pub(crate) fail: Mutex<Option<(u16, String, String, usize)>>,
    pub(crate) list_queries: Mutex<Vec<Option<String>>>,
    /// Told when the fake shuts down: the clock's task and any hung request end.
    pub(crate) closing: tokio::sync::watch::Sender<bool>,
}

/// One sandbox.
pub(crate) struct Sbx {
    pub(crate) id: String,
    pub(crate) rec: Mutex<Rec>,
    /// Its namespace box: the awake handle while started, the asleep one while stopped.
    pub(crate) boxed: Mutex<Option<Arc<dyn Sandbox>>>,
    pub(crate) sessions: Sessions,
    /// One lifecycle change at a time (a request's or the clock's).
    pub(crate) op: tokio::sync::Mutex<()>,
    pub(crate) last_activity: Mutex<Instant>,
    pub(crate) stopped_at: Mutex<Option<Instant>>,
    /// The labels as they were changed, each with when: what the index answers from.
    pub(crate) label_versions: Mutex<Vec<(Instant, BTreeMap<String, String>)>>,
    /// The root the box was made from (for the session shell's choice of bash or sh).
    pub(crate) root: PathBuf,
}

/// What the API answers of a sandbox (the DTO's changing fields).
#[derive(Clone, Debug)]
pub(crate) struct Rec {
    pub(crate) name: String,
    pub(crate) snapshot: String,
    pub(crate) user: String,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) public: bool,
    pub(crate) network_block_all: bool,
    pub(crate) network_allow_list: Option<String>,
    pub(crate) domain_allow_list: Option<String>,
    pub(crate) cpu: u32,
    pub(crate) memory: u32,
    pub(crate) disk: u32,
    pub(crate) class: String,
    /// The entity's state; the DTO shows it through `desired_state` ([`Rec::shown_state`]).
    pub(crate) state: String,
    /// What the API is bringing the sandbox to (`SandboxDesiredState`): set by each
    /// lifecycle request, `destroyed` from a delete on (the sandbox is pending its destroy).
    pub(crate) desired_state: String,
    pub(crate) auto_stop: i64,
    pub(crate) auto_archive: i64,
    pub(crate) auto_delete: i64,
    pub(crate) ttl: i64,
    /// Where the ttl counts from: the creation, then each `POST ttl` ("re-anchored from the
    /// current time", `daytona_api_client`'s `set_ttl`), on the wall clock for the DTO's
    /// `autoDestroyAt` and on the monotonic one for the fake's clock.
    pub(crate) ttl_from: (SystemTime, Instant),
    pub(crate) created_at: SystemTime,
    pub(crate) updated_at: SystemTime,
    pub(crate) last_activity_at: SystemTime,
    pub(crate) preview_token: String,
    pub(crate) box_id: Option<String>,
    /// The volumes it mounts, as its create named them.
    pub(crate) volumes: Vec<crate::daytona::volume::Mounted>,
}

impl Sbx {
    pub(crate) fn rec(&self) -> Rec {
        self.rec.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn change<F: FnOnce(&mut Rec)>(&self, f: F) -> Rec {
        let mut r = self.rec.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut r);
        r.updated_at = SystemTime::now();
        r.clone()
    }

    /// The state the API shows (a sandbox being deleted is `destroying`, not `started`).
    pub(crate) fn shown_state(&self) -> String {
        self.rec
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .shown_state()
            .to_string()
    }

    /// A delete was accepted: the sandbox waits for its destroy.
    pub(crate) fn deleting(&self) -> bool {
        self.rec.lock().unwrap_or_else(|p| p.into_inner()).desired_state == "destroyed"
    }

    pub(crate) fn boxed(&self) -> Option<Arc<dyn Sandbox>> {
        self.boxed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A toolbox request came: autoStop counts from now.
    pub(crate) fn touch(&self) {
        *self.last_activity.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.rec.lock().unwrap_or_else(|p| p.into_inner()).last_activity_at = SystemTime::now();
    }

    pub(crate) fn set_labels(&self, labels: BTreeMap<String, String>) -> Rec {
        let mut v = self.label_versions.lock().unwrap_or_else(|p| p.into_inner());
        v.push((Instant::now(), labels.clone()));
        let over = v.len().saturating_sub(INDEX_VERSIONS);
        v.drain(..over);
        drop(v);
        self.change(|r| r.labels = labels)
    }

    /// The labels the index holds for this sandbox for a query shape trailing by `lag`:
    /// `None` while the sandbox is not in it yet.
    pub(crate) fn indexed_labels(&self, lag: Duration, now: Instant) -> Option<BTreeMap<String, String>> {
        let v = self.label_versions.lock().unwrap_or_else(|p| p.into_inner());
        v.iter().rev().find(|(t, _)| *t + lag <= now).map(|(_, l)| l.clone())
    }

    pub(crate) fn view(&self) -> SandboxView {
        let r = self.rec();
        let state = r.shown_state().to_string();
        SandboxView {
            id: self.id.clone(),
            name: r.name,
            state,
            desired_state: r.desired_state,
            labels: r.labels,
            network_block_all: r.network_block_all,
            domain_allow_list: r.domain_allow_list,
            network_allow_list: r.network_allow_list,
            ttl_minutes: r.ttl,
            auto_stop: r.auto_stop,
            auto_archive: r.auto_archive,
            auto_delete: r.auto_delete,
            snapshot: r.snapshot,
            box_id: r.box_id,
        }
    }
}

impl Rec {
    /// The DTO's `state`: the entity's, except where a change is under way (D190
    /// `SandboxDto.getSandboxState`): started or stopped with `destroyed` desired is
    /// `destroying`, started with `stopped` is `stopping`, stopped with `started` is
    /// `starting`, stopped with `archived` is `archiving`.
    pub(crate) fn shown_state(&self) -> &str {
        match (self.state.as_str(), self.desired_state.as_str()) {
            ("started" | "stopped", "destroyed") => "destroying",
            ("started", "stopped") => "stopping",
            ("stopped", "started") => "starting",
            ("stopped", "archived") => "archiving",
            (s, _) => s,
        }
    }

    /// When ttl ends the sandbox, in the API's minutes.
    pub(crate) fn auto_destroy_at(&self, minute: Duration) -> Option<SystemTime> {
        (self.ttl > 0).then(|| self.ttl_from.0 + self.ttl_span(minute))
    }

    /// The ttl as a duration.
    fn ttl_span(&self, minute: Duration) -> Duration {
        minute * (self.ttl.clamp(0, u32::MAX as i64) as u32)
    }

    /// The Sandbox DTO (`daytona_api_client/models/sandbox.py`): every required field set.
    pub(crate) fn dto(&self, id: &str, s: &Shared) -> Value {
        let mut v = self.list_item(id, s, &self.labels);
        v["env"] = json!(self.env);
        v["kvm"] = json!(false);
        v["volumes"] = Value::Array(self.volumes.iter().map(|m| m.dto()).collect());
        v
    }

    /// The SandboxListItem (`sandbox_list_item.py`), with the labels the index holds.
    pub(crate) fn list_item(&self, id: &str, s: &Shared, labels: &BTreeMap<String, String>) -> Value {
        let mut v = json!({
            "id": id,
            "organizationId": ORGANIZATION,
            "name": self.name,
            "snapshot": self.snapshot,
            "user": self.user,
            "labels": labels,
            "public": self.public,
            "networkBlockAll": self.network_block_all,
            "target": TARGET,
            "cpu": self.cpu,
            "gpu": 0,
            "memory": self.memory,
            "disk": self.disk,
            "state": self.shown_state(),
            "desiredState": self.desired_state,
            "autoStopInterval": self.auto_stop,
            "autoArchiveInterval": self.auto_archive,
            "autoDeleteInterval": self.auto_delete,
            "createdAt": rfc3339(self.created_at),
            "updatedAt": rfc3339(self.updated_at),
            "lastActivityAt": rfc3339(self.last_activity_at),
            "sandboxClass": self.class,
            "daemonVersion": DAEMON_VERSION,
            "runnerId": "fake-runner",
            "toolboxProxyUrl": format!("{}/toolbox", s.base),
        });
        if let Some(n) = &self.network_allow_list {
            v["networkAllowList"] = json!(n);
        }
        if let Some(d) = &self.domain_allow_list {
            v["domainAllowList"] = json!(d);
        }
        if let Some(at) = self.auto_destroy_at(s.minute) {
            v["autoDestroyAt"] = json!(rfc3339(at));
        }
        v
    }
}

/// What a create asked for, validated.
pub(crate) struct NewSandbox {
    pub(crate) id: String,
    pub(crate) rec: Rec,
    pub(crate) root: Option<PathBuf>,
}

impl Shared {
    pub(crate) fn get(&self, id_or_name: &str) -> Option<Arc<Sbx>> {
        let m = self.sandboxes.lock().unwrap_or_else(|p| p.into_inner());
        m.get(id_or_name)
            .cloned()
            .or_else(|| m.values().find(|s| s.rec().name == id_or_name).cloned())
    }

    pub(crate) fn find(&self, id_or_name: &str) -> Result<Arc<Sbx>, DError> {
        self.get(id_or_name)
            .ok_or_else(|| DError::sandbox_not_found(id_or_name))
    }

    pub(crate) fn all(&self) -> Vec<Arc<Sbx>> {
        self.sandboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    pub(crate) fn snapshot(&self, name: &str) -> Option<FakeSnapshot> {
        if let Some(s) = self.snapshots.get(name) {
            return Some(s.clone());
        }
        (name == self.default_snapshot).then(|| FakeSnapshot {
            name: name.to_string(),
            rootfs: None,
            cpu: 1,
            memory_gb: 1,
            disk_gb: 3,
            class: "container".into(),
        })
    }

    /// How long the index trails for the query shape `labels` (the `labels` query as sent).
    pub(crate) fn lag_of(&self, labels: Option<&str>) -> Duration {
        let h = fnv1a(labels.unwrap_or("").as_bytes());
        self.index_lag * (1 + (h % 3) as u32)
    }

    /// Make the sandbox's box and keep the sandbox, started. The record's name was checked
    /// free under the same lock that keeps it.
    pub(crate) async fn create(&self, new: NewSandbox) -> Result<Arc<Sbx>, DError> {
        let NewSandbox { id, mut rec, root } = new;
        let mut spec = Spec::new(match rec.ttl {
            t if t > 0 => self.minute * (t.min(u32::MAX as i64) as u32) + Duration::from_secs(2),
            _ => BOX_LIFETIME,
        });
        spec.image = root.as_ref().map(|r| r.to_string_lossy().into_owned());
        spec.env = rec.env.clone();
        spec.mounts = rec
            .volumes
            .iter()
            .map(|m| agentbox_core::Mount {
                source: m.source.to_string_lossy().into_owned(),
                target: m.mount_path.clone(),
                read_only: false,
            })
            .collect();
        // A sandbox's ports are reached on this machine's loopback (the previews' proxy): the
        // box shares this machine's network unless it is blocked.
        spec.network = Some(if rec.network_block_all {
            Network::None
        } else {
            Network::Host
        });
        let ctx = Ctx::background().with_timeout(BOX_TIMEOUT);
        let b = self.provider.create(&spec, &ctx).await.map_err(|e| {
            DError::internal(
                format!("the sandbox's box could not be made: {}", e.message()),
                crate::daytona::error::Source::Api,
            )
        })?;
        rec.box_id = Some(b.id().to_string());
        rec.state = "started".into();
        rec.desired_state = "started".into();
        let now = Instant::now();
        let sbx = Arc::new(Sbx {
            id: id.clone(),
            label_versions: Mutex::new(vec![(now, rec.labels.clone())]),
            rec: Mutex::new(rec),
            boxed: Mutex::new(Some(b.clone())),
            sessions: Sessions::default(),
            op: tokio::sync::Mutex::new(()),
            last_activity: Mutex::new(now),
            stopped_at: Mutex::new(None),
            root: root.unwrap_or_else(|| PathBuf::from("/")),
        });
        let name = sbx.rec().name;
        let taken = {
            let mut m = self.sandboxes.lock().unwrap_or_else(|p| p.into_inner());
            let taken = m.values().any(|s| s.rec().name == name);
            if !taken {
                m.insert(id, sbx.clone());
            }
            taken
        };
        if taken {
            let _ = b.destroy(&Ctx::background().with_timeout(BOX_TIMEOUT)).await;
            return Err(DError::api(
                409,
                "CONFLICT",
                format!("Sandbox with name {name} already exists"),
            ));
        }
        Ok(sbx)
    }

    /// Stop: the box sleeps (files kept, processes ended). A sandbox with autoDelete 0 is
    /// ephemeral: its stop is a delete (D190 `stop`: `isEphemeral` → the soft delete). Holds
    /// the sandbox's op lock.
    pub(crate) async fn stop(self: &Arc<Self>, sbx: &Arc<Sbx>) -> Result<Rec, DError> {
        let _op = sbx.op.lock().await;
        let rec = sbx.rec();
        if rec.state != rec.desired_state {
            return Err(DError::state_change_in_progress());
        }
        match rec.state.as_str() {
            "started" => {}
            "stopped" | "archived" => return Ok(rec),
            s => return Err(DError::bad_request(format!("Sandbox is not started (state: {s})"))),
        }
        if rec.auto_delete == 0 {
            return self.soft_delete_locked(sbx).await;
        }
        sbx.sessions.end_all().await;
        if let Some(bid) = &rec.box_id {
            let id = agentbox_core::SandboxId::try_from(bid.clone())
                .map_err(|e| DError::internal(e.to_string(), crate::daytona::error::Source::Api))?;
            let ctx = Ctx::background().with_timeout(BOX_TIMEOUT);
            self.provider.sleep(&id, &ctx).await.map_err(|e| {
                DError::internal(
                    format!("stopping the sandbox's box: {}", e.message()),
                    crate::daytona::error::Source::Api,
                )
            })?;
            let asleep = self.provider.attach(&id, &ctx).await.ok().flatten();
            *sbx.boxed.lock().unwrap_or_else(|p| p.into_inner()) = asleep;
        }
        *sbx.stopped_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        Ok(sbx.change(|r| {
            r.state = "stopped".into();
            r.desired_state = "stopped".into();
        }))
    }

    /// Start a stopped or archived sandbox: its box wakes with its files, no process.
    pub(crate) async fn start(&self, sbx: &Arc<Sbx>) -> Result<Rec, DError> {
        let _op = sbx.op.lock().await;
        let rec = sbx.rec();
        if rec.state != rec.desired_state {
            return Err(DError::state_change_in_progress());
        }
        match rec.state.as_str() {
            "stopped" | "archived" => {}
            "started" => return Ok(rec),
            s => return Err(DError::bad_request(format!("Sandbox is not stopped (state: {s})"))),
        }
        if let Some(bid) = &rec.box_id {
            let id = agentbox_core::SandboxId::try_from(bid.clone())
                .map_err(|e| DError::internal(e.to_string(), crate::daytona::error::Source::Api))?;
            let ctx = Ctx::background().with_timeout(BOX_TIMEOUT);
            let b = self.provider.wake(&id, &ctx).await.map_err(|e| {
                DError::internal(
                    format!("starting the sandbox's box: {}", e.message()),
                    crate::daytona::error::Source::Api,
                )
            })?;
            *sbx.boxed.lock().unwrap_or_else(|p| p.into_inner()) = Some(b);
        }
        *sbx.stopped_at.lock().unwrap_or_else(|p| p.into_inner()) = None;
        sbx.touch();
        Ok(sbx.change(|r| {
            r.state = "started".into();
            r.desired_state = "started".into();
        }))
    }

    pub(crate) async fn archive(&self, sbx: &Arc<Sbx>) -> Result<Rec, DError> {
        let _op = sbx.op.lock().await;
        let rec = sbx.rec();
        if rec.state != rec.desired_state {
            return Err(DError::state_change_in_progress());
        }
        match rec.state.as_str() {
            "stopped" => Ok(sbx.change(|r| {
                r.state = "archived".into();
                r.desired_state = "archived".into();
            })),
            "archived" => Ok(rec),
            _ => Err(DError::bad_request("Sandbox is not stopped")),
        }
    }

    /// `DELETE /sandbox/{id}` (and ttl, autoDelete, an ephemeral stop): the soft delete.
    pub(crate) async fn delete(self: &Arc<Self>, sbx: &Arc<Sbx>) -> Result<Rec, DError> {
        let _op = sbx.op.lock().await;
        self.soft_delete_locked(sbx).await
    }

    /// The API's soft delete (`getSoftDeleteUpdate`): `desiredState: destroyed` and the name
    /// `DESTROYED_<name>_<ms since the epoch>` at once, the entity's state left as it was, so
    /// the answer and every read until the destroy show the record (`destroying` where it was
    /// started or stopped). Then, as the runner's sync does, the box is ended at once and the
    /// state becomes `destroying` (an archived one has no box running and stays `archived`);
    /// after `delete_lag` the sandbox is destroyed and a read is 404. With no lag it is
    /// destroyed before the answer. A sandbox already pending its destroy is 409 (D190
    /// `StateChangeInProgressError`). The caller holds the op lock.
    async fn soft_delete_locked(self: &Arc<Self>, sbx: &Arc<Sbx>) -> Result<Rec, DError> {
        if sbx.deleting() {
            return Err(DError::state_change_in_progress());
        }
        let ms = agentbox_core::now_ms();
        let rec = sbx.change(|r| {
            r.desired_state = "destroyed".into();
            r.name = format!("DESTROYED_{}_{ms}", r.name);
        });
        if self.delete_lag.is_zero() {
            return Ok(self.destroy_locked(sbx).await);
        }
        let at = tokio::time::Instant::now() + self.delete_lag;
        let (s, sbx) = (self.clone(), sbx.clone());
        tokio::spawn(async move {
            {
                let _op = sbx.op.lock().await;
                s.end_box(&sbx).await;
                sbx.change(|r| {
                    if matches!(r.state.as_str(), "started" | "stopped") {
                        r.state = "destroying".into();
                    }
                });
            }
            tokio::time::sleep_until(at).await;
            let _op = sbx.op.lock().await;
            s.forget(&sbx);
        });
        Ok(rec)
    }

    /// Destroy now, with no soft delete before it (the fake shuts down).
    pub(crate) async fn destroy(&self, sbx: &Arc<Sbx>) -> Rec {
        let _op = sbx.op.lock().await;
        self.destroy_locked(sbx).await
    }

    /// Forget the sandbox (a later GET is 404, the index drops it at once) and end its box.
    async fn destroy_locked(&self, sbx: &Arc<Sbx>) -> Rec {
        self.forget(sbx);
        self.end_box(sbx).await;
        sbx.rec()
    }

    /// The sandbox is destroyed: gone from reads and from the index.
    fn forget(&self, sbx: &Arc<Sbx>) -> Rec {
        self.sandboxes.lock().unwrap_or_else(|p| p.into_inner()).remove(&sbx.id);
        sbx.change(|r| {
            r.state = "destroyed".into();
            r.desired_state = "destroyed".into();
        })
    }

    /// End the sandbox's sessions and its box, awake or asleep.
    async fn end_box(&self, sbx: &Arc<Sbx>) {
        sbx.sessions.end_all().await;
        let b = sbx.boxed.lock().unwrap_or_else(|p| p.into_inner()).take();
        let ctx = Ctx::background().with_timeout(BOX_TIMEOUT);
        match b {
            Some(b) => {
                if let Err(e) = b.destroy(&ctx).await {
                    tracing::warn!(sandbox = %sbx.id, error = %e, "ending a sandbox's box");
                }
            }
            None => {
                if let Some(bid) = sbx.rec().box_id
                    && let Ok(id) = agentbox_core::SandboxId::try_from(bid)
                    && let Ok(Some(b)) = self.provider.attach(&id, &ctx).await
                {
                    let _ = b.destroy(&ctx).await;
                }
            }
        }
    }

    /// Set the ttl, counted from now (the API re-anchors it); the box's own deadline follows,
    /// so a fake that dies still leaves no box past it.
    pub(crate) async fn set_ttl(&self, sbx: &Arc<Sbx>, minutes: i64) -> Rec {
        let rec = sbx.change(|r| {
            r.ttl = minutes;
            r.ttl_from = (SystemTime::now(), Instant::now());
        });
        if let Some(bid) = &rec.box_id
            && let Ok(id) = agentbox_core::SandboxId::try_from(bid.clone())
        {
            let left = match rec.auto_destroy_at(self.minute) {
                Some(at) => {
                    at.duration_since(SystemTime::now())
                        .unwrap_or(Duration::ZERO)
                        .max(Duration::from_secs(1))
                        + Duration::from_secs(2)
                }
                None => BOX_LIFETIME,
            };
            let ends = SystemTime::now() + left;
            let ms = ends
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0);
            let ctx = Ctx::background().with_timeout(BOX_TIMEOUT);
            if let Err(e) = self.provider.extend(&id, ms, &ctx).await {
                tracing::warn!(sandbox = %sbx.id, error = %e, "moving the box's deadline to the ttl");
            }
        }
        rec
    }

    /// One turn of the clock: ttl, autoStop and autoDelete, each in the API's minutes. Ttl
    /// and autoDelete delete as a request does (the soft delete); a sandbox already pending
    /// its destroy is left to it.
    pub(crate) async fn tick(self: &Arc<Self>) {
        let now = Instant::now();
        for sbx in self.all() {
            let rec = sbx.rec();
            if rec.desired_state == "destroyed" {
                continue;
            }
            if rec.ttl > 0 && now >= rec.ttl_from.1 + rec.ttl_span(self.minute) {
                tracing::info!(sandbox = %sbx.id, "ttl passed: deleted");
                if let Err(e) = self.delete(&sbx).await {
                    tracing::debug!(sandbox = %sbx.id, error = %e.message, "ttl");
                }
                continue;
            }
            match rec.state.as_str() {
                "started" if rec.auto_stop > 0 => {
                    let idle = now.duration_since(*sbx.last_activity.lock().unwrap_or_else(|p| p.into_inner()));
                    if idle >= self.minute * (rec.auto_stop.min(u32::MAX as i64) as u32) {
                        tracing::info!(sandbox = %sbx.id, "autoStop: stopped");
                        if let Err(e) = self.stop(&sbx).await {
                            tracing::warn!(sandbox = %sbx.id, error = %e.message, "autoStop");
                        }
                    }
                }
                "stopped" | "archived" if rec.auto_delete >= 0 => {
                    let since = *sbx.stopped_at.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(t) = since
                        && now.duration_since(t) >= self.minute * (rec.auto_delete.min(u32::MAX as i64) as u32)
                    {
                        tracing::info!(sandbox = %sbx.id, "autoDelete: deleted");
                        if let Err(e) = self.delete(&sbx).await {
                            tracing::debug!(sandbox = %sbx.id, error = %e.message, "autoDelete");
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// End every sandbox's box (the fake shuts down).
    pub(crate) async fn end_all(&self) {
        for sbx in self.all() {
            self.destroy(&sbx).await;
        }
        let ctx = Ctx::background().with_timeout(Duration::from_secs(10));
        if let Ok(left) = self.provider.list(&Default::default(), &ctx).await {
            for b in left {
                let _ = b.destroy(&ctx).await;
            }
        }
    }
}

/// The shell a sandbox's programs are given to: bash where the root has it (sessions need
/// its one-byte reads of a pipe, so a command reading stdin gets the input sent to it), else sh.
pub(crate) fn shell_of(root: &Path) -> &'static str {
    for p in ["bin/bash", "usr/bin/bash"] {
        if root.join(p).exists() {
            return "bash";
        }
    }
    "sh"
}

/// FNV-1a, 64 bits: a hash that is the same in every run (the std one is seeded).
pub(crate) fn fnv1a(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for x in b {
        h ^= *x as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// A random id as Daytona's (a UUID, version 4).
pub(crate) fn uuid() -> String {
    crate::ids::uuid4()
}

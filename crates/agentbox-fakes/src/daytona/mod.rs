//! A fake Daytona whose sandboxes really run: each sandbox is a namespace box
//! (`agentbox_providers::namespace`) whose root is its snapshot's directory.
//!
//! It is what the `daytona` provider is tested against, and it is itself judged by Daytona's
//! own Python SDK (`daytona` 0.226.1, in `providers/tests/daytona.rs`): where the SDK and the
//! fake disagree, the fake is wrong. It answers what the real service answers and nothing for
//! agentbox's sake. `docs/fakes.md` is the overview.
//!
//! One port serves three things, as Daytona's three hosts do:
//! - `/api/...`, the control plane (`DAYTONA_API_URL`, see `api`): `Authorization: Bearer
//!   KEY` on every request, else 401; errors in the API's envelope (`error`);
//! - `/toolbox/{sandboxId}/...`, the daemon in each sandbox behind Daytona's proxy (the DTO's
//!   `toolboxProxyUrl`, see `toolbox` and `session`), with the same key;
//! - `/preview/{sandboxId}/{port}/...`, preview links (see `preview`).
//!
//! The knobs of a test: [`FakeDaytona::throttle`] (429 with `Retry-After`),
//! [`FakeDaytona::fail_next`] (any status and code on the API),
//! [`FakeDaytona::fail_after_next_create`] (a create carried out but answered as failed),
//! [`FakeDaytona::hang_toolbox`] (a daemon that accepts and never answers), the label
//! index's lag ([`FakeDaytonaOptions::index_lag`]), how long a deleted sandbox's record stays
//! before it is destroyed ([`FakeDaytonaOptions::delete_lag`]) and the length of the API's minute
//! ([`FakeDaytonaOptions::minute`]), which every interval (ttl, autoStop, autoDelete) counts in;
//! how long a new volume takes to be ready ([`FakeDaytonaOptions::volume_lag`]), where volumes
//! keep their files ([`FakeDaytonaOptions::volumes_dir`], read back by
//! [`FakeDaytona::volume_dir`]) and whose user the sandboxes' root is
//! ([`FakeDaytonaOptions::boxes_as_this_user`]).
//!
//! What is real: programs run in the box (as the box's root, mapped to an unprivileged id of
//! this machine; the DTO's `user` is the create's, `daytona` by default, but no such user
//! runs them), with the snapshot's root file system read only and `/workspace`, `/root`,
//! `/tmp` writable; stop ends every process and keeps the files, start brings the box back
//! with them; `networkBlockAll` makes the box with loopback alone; ttl, autoStop and
//! autoDelete are the fake's own clock, needing no request. What is emulated or left out is
//! listed in `docs/fakes.md` and in each module's first lines.

mod api;
mod error;
mod preview;
mod session;
mod state;
mod toolbox;
mod volume;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agentbox_providers::helper::HelperCommand;
use agentbox_providers::namespace::{NamespaceOptions, NamespaceProvider};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::response::Response;
use serde_json::Value;

use crate::daytona::error::{DError, Source};
use crate::daytona::state::Shared;

/// A snapshot the fake offers: sandboxes made from it get its root and its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeSnapshot {
    /// Its name, as a create's `snapshot` names it.
    pub name: String,
    /// Its root file system; `None`: the fake's [`FakeDaytonaOptions::rootfs`].
    pub rootfs: Option<PathBuf>,
    /// The sandbox's `cpu`.
    pub cpu: u32,
    /// The sandbox's `memory`, in GB.
    pub memory_gb: u32,
    /// The sandbox's `disk`, in GB.
    pub disk_gb: u32,
    /// Its `sandboxClass`: `container` or `linux-vm` (a linux-vm sandbox is a namespace box
    /// like any other here).
    pub class: String,
}

/// How a [`FakeDaytona`] is set up.
#[derive(Clone, Debug)]
pub struct FakeDaytonaOptions {
    /// Where to listen; port 0 picks a free one.
    pub listen: SocketAddr,
    /// The root of the default snapshot and of every snapshot given without one (`None`:
    /// this machine's `/`, read only).
    pub rootfs: Option<PathBuf>,
    /// The snapshots besides the default.
    pub snapshots: Vec<FakeSnapshot>,
    /// What a create naming no snapshot gets; 1 cpu, 1 GB, 3 GB of disk, `container`.
    pub default_snapshot: String,
    /// The API key every request must show (`Authorization: Bearer KEY`).
    pub api_key: String,
    /// How far the label index trails a change (one query shape sees it after this, another
    /// after two or three times this).
    pub index_lag: Duration,
    /// How long one of the API's minutes lasts (tests make it about a second).
    pub minute: Duration,
    /// The organization's tier has no network settings: a create's `networkBlockAll` and
    /// allow lists are dropped (the sandbox reads back open), `network-settings` is 400.
    pub network_unenforced: bool,
    /// How long a deleted sandbox's record stays (readable by id, `desiredState:
    /// destroyed`, its name already free) before it is destroyed and a read is 404, as the
    /// real API's soft delete waits for its runner. Zero: destroyed before the delete answers.
    pub delete_lag: Duration,
    /// How long a new volume stays `pending_create` before it is `ready` (and mountable).
    pub volume_lag: Duration,
    /// Where volumes keep their files, one directory each by name (`None`: the fake's own
    /// directory, removed at its end).
    pub volumes_dir: Option<PathBuf>,
    /// The sandboxes' root is this machine's user (root, when the fake runs as root) rather
    /// than an unprivileged id of its own: for tests where this machine and the sandboxes
    /// write the same files of a volume, as every user of a real Daytona volume may.
    pub boxes_as_this_user: bool,
    /// The fault switch every request passes (see [`crate::faults`]).
    pub faults: Option<Arc<crate::faults::Faults>>,
}

impl Default for FakeDaytonaOptions {
    fn default() -> Self {
        FakeDaytonaOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            rootfs: None,
            snapshots: Vec::new(),
            default_snapshot: DEFAULT_SNAPSHOT.into(),
            api_key: String::new(),
            index_lag: Duration::from_secs(1),
            minute: Duration::from_secs(60),
            network_unenforced: false,
            delete_lag: Duration::from_secs(1),
            volume_lag: Duration::from_millis(500),
            volumes_dir: None,
            boxes_as_this_user: false,
            faults: None,
        }
    }
}

/// The default snapshot's name unless told otherwise (Daytona's own default image).
pub const DEFAULT_SNAPSHOT: &str = "daytonaio/sandbox:0.5.0";

/// A sandbox as a test reads it from outside the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxView {
    /// Its id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its state as the API shows it: `started`, `stopped`, `archived`, `destroying` (deleted,
    /// not yet destroyed; a destroyed one is no longer listed).
    pub state: String,
    /// Its `desiredState`: `started`, `stopped`, `archived`, or `destroyed` once deleted.
    pub desired_state: String,
    /// Its labels as they are now (the index may trail them).
    pub labels: BTreeMap<String, String>,
    /// Whether its box has loopback alone.
    pub network_block_all: bool,
    /// `domainAllowList`, a comma string, stored (not enforced).
    pub domain_allow_list: Option<String>,
    /// `networkAllowList`, a comma string, stored (not enforced).
    pub network_allow_list: Option<String>,
    /// `ttlMinutes` (0: none).
    pub ttl_minutes: i64,
    /// `autoStopInterval`.
    pub auto_stop: i64,
    /// `autoArchiveInterval`.
    pub auto_archive: i64,
    /// `autoDeleteInterval`.
    pub auto_delete: i64,
    /// Its snapshot's name.
    pub snapshot: String,
    /// Its namespace box's id (`namespace:...`), for a test that looks inside.
    pub box_id: Option<String>,
}

/// A running fake Daytona. Dropping it (or [`FakeDaytona::shutdown`]) stops serving and ends
/// every sandbox's box.
///
/// ```no_run
/// # async fn f() -> Result<(), String> {
/// use agentbox_fakes::daytona::{FakeDaytona, FakeDaytonaOptions};
/// let d = FakeDaytona::start(FakeDaytonaOptions {
///     api_key: "test-key".into(),
///     rootfs: Some("/srv/rootfs".into()),
///     ..Default::default()
/// })
/// .await?;
/// println!("DAYTONA_API_URL={}", d.api_url());
/// d.throttle(1); // the next request answers 429
/// d.shutdown().await;
/// # Ok(()) }
/// ```
pub struct FakeDaytona {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: crate::server::Server,
}

impl FakeDaytona {
    /// Listen and serve on this runtime until shut down. The runner the boxes are built by
    /// is `$AGENTBOX_RUNNER` (else beside this executable).
    pub async fn start(o: FakeDaytonaOptions) -> Result<FakeDaytona, String> {
        if o.api_key.is_empty() {
            return Err("api_key: empty (every request must show a key)".into());
        }
        if o.minute.is_zero() {
            return Err("minute: zero (every interval would pass at once)".into());
        }
        let check_root = |what: &str, r: &PathBuf| {
            if r.join("bin").exists() {
                Ok(())
            } else {
                Err(format!(
                    "{what} {}: not a root file system (no bin/ in it)",
                    r.display()
                ))
            }
        };
        if let Some(r) = &o.rootfs {
            check_root("rootfs", r)?;
        }
        let mut snapshots = BTreeMap::new();
        for s in &o.snapshots {
            if s.name.is_empty() {
                return Err("snapshots: a snapshot with no name".into());
            }
            if let Some(r) = &s.rootfs {
                check_root(&format!("snapshot {}", s.name), r)?;
            }
            if !matches!(s.class.as_str(), "container" | "linux-vm") {
                return Err(format!(
                    "snapshot {}: class {:?}: container or linux-vm",
                    s.name, s.class
                ));
            }
            let mut s = s.clone();
            if s.rootfs.is_none() {
                s.rootfs = o.rootfs.clone();
            }
            snapshots.insert(s.name.clone(), s);
        }
        let dir = tempfile::Builder::new()
            .prefix("agentbox-fake-daytona.")
            .tempdir()
            .map_err(|e| format!("making the fake's directory: {e}"))?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
            .map_err(|e| format!("opening the fake's directory to its boxes: {e}"))?;
        let runner = HelperCommand::discover().map_err(|e| e.to_string())?;
        agentbox_providers::namespace::available(&runner)
            .await
            .map_err(|e| e.to_string())?;
        let mut ns = NamespaceOptions {
            runner,
            ..NamespaceOptions::at(dir.path().join("home")).map_err(|e| e.to_string())?
        };
        if o.boxes_as_this_user {
            ns.host_id = rustix::process::geteuid().as_raw();
        }
        let provider = NamespaceProvider::new(ns).map_err(|e| e.to_string())?;
        let volumes = volume::Volumes::new(
            o.volumes_dir.clone().unwrap_or_else(|| dir.path().join("volumes")),
            o.volume_lag,
            provider.box_owner(),
        );
        let listener = tokio::net::TcpListener::bind(o.listen)
            .await
            .map_err(|e| format!("listening on {}: {e}", o.listen))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("reading the listening address: {e}"))?;
        let shared = Arc::new(Shared {
            api_key: o.api_key.clone(),
            base: format!("http://{addr}"),
            provider: Arc::new(provider),
            volumes,
            snapshots,
            default_snapshot: o.default_snapshot.clone(),
            rootfs: o.rootfs.clone(),
            index_lag: o.index_lag,
            minute: o.minute,
            network_unenforced: o.network_unenforced,
            delete_lag: o.delete_lag,
            fail_after_create: Default::default(),
            sandboxes: Default::default(),
            throttle: Default::default(),
            hang: Default::default(),
            fail: Default::default(),
            list_queries: Default::default(),
            closing: tokio::sync::watch::Sender::new(false),
        });
        let app = axum::Router::new()
            .fallback(dispatch)
            .with_state(shared.clone())
            .layer(DefaultBodyLimit::max(toolbox::MAX_UPLOAD));
        let app = crate::faults::wrap(app, o.faults.as_ref());
        let mut server = crate::server::Server::spawn(|stopped| crate::server::serve(listener, app, stopped), dir);
        let clock = {
            let s = shared.clone();
            let tick = (o.minute / 20).clamp(Duration::from_millis(20), Duration::from_secs(1));
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(tick).await;
                    s.tick().await;
                }
            })
        };
        server.beside(clock);
        tracing::info!(%addr, "fake Daytona listening");
        Ok(FakeDaytona { addr, shared, server })
    }

    /// The address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT/api`: `DAYTONA_API_URL`.
    pub fn api_url(&self) -> String {
        format!("{}/api", self.shared.base)
    }

    /// `http://127.0.0.1:PORT/toolbox`: every sandbox's `toolboxProxyUrl`.
    pub fn toolbox_url(&self) -> String {
        format!("{}/toolbox", self.shared.base)
    }

    /// The next `n` requests (API or toolbox, after their key is checked) answer 429 with
    /// `Retry-After: 1`. It sets how many are left, whatever was left before: `throttle(0)`
    /// ends a throttle at once, and a test that retries knows exactly how many 429s it gets.
    pub fn throttle(&self, n: usize) {
        self.shared.throttle.store(n, Ordering::SeqCst);
    }

    /// While on, toolbox requests are accepted and never answered (a hung daemon).
    pub fn hang_toolbox(&self, on: bool) {
        self.shared.hang.store(on, Ordering::SeqCst);
        if !on {
            self.shared.closing.send_modify(|_| {});
        }
    }

    /// The next `n` API requests (after their key is checked) answer `status` with `code` and
    /// `message` in the API's envelope.
    pub fn fail_next(&self, status: u16, code: &str, message: &str, n: usize) {
        *self.shared.fail.lock().unwrap_or_else(|p| p.into_inner()) =
            (n > 0).then(|| (status, code.to_string(), message.to_string(), n));
    }

    /// The next `POST /sandbox` is carried out (its sandbox made, started and kept) but
    /// answered `status` in the API's error envelope, as a gateway that gave up after the API
    /// did the work: a caller that retries or gives up must find and end what it made. The
    /// fault is spent on that request whatever comes of it (a refused create answers its own
    /// refusal). `status` must be an error status, 400 to 599.
    pub fn fail_after_next_create(&self, status: u16) -> Result<(), String> {
        if !(400..=599).contains(&status) {
            return Err(format!(
                "fail_after_next_create: status {status} is not an error status (400 to 599)"
            ));
        }
        *self.shared.fail_after_create.lock().unwrap_or_else(|p| p.into_inner()) = Some(status);
        Ok(())
    }

    /// The directory of this machine that holds the files of the volume called `name`: what
    /// a sandbox mounting it sees at its mount path. `None` when there is no such volume.
    pub fn volume_dir(&self, name: &str) -> Option<std::path::PathBuf> {
        let s = &self.shared;
        s.volumes.id_of(name).map(|_| s.volumes.dir_of(name))
    }

    /// Sandbox `id` (or name) is lost behind every client's back, as a runner's failure loses
    /// one: destroyed at once, its sessions and box ended, a later read 404. Whether it was
    /// there.
    pub async fn lose(&self, id: &str) -> bool {
        match self.shared.get(id) {
            Some(sbx) => {
                self.shared.destroy(&sbx).await;
                true
            }
            None => false,
        }
    }

    /// Every sandbox not destroyed (one deleted and pending its destroy included), as it stands.
    pub fn sandboxes(&self) -> Vec<SandboxView> {
        self.shared.all().iter().map(|s| s.view()).collect()
    }

    /// The `labels` query of each `GET /sandbox`, in order, as received (`None`: none).
    pub fn list_queries(&self) -> Vec<Option<String>> {
        self.shared
            .list_queries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stop serving and end every sandbox's box.
    pub async fn shutdown(mut self) {
        let _ = self.shared.closing.send(true);
        self.server.stopped().await;
        self.shared.end_all().await;
        self.server.remove_dir();
    }
}

impl Drop for FakeDaytona {
    fn drop(&mut self) {
        let _ = self.shared.closing.send(true);
        self.server.halt();
        // Drop cannot await: the boxes are ended on a thread of their own.
        let shared = self.shared.clone();
        crate::server::end_on_own_runtime(async move { shared.end_all().await });
    }
}

pub(crate) use crate::http::Query;

pub(crate) use crate::ids::same;

fn authorized(key: &str, h: &HeaderMap) -> bool {
    h.get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|got| same(got.trim(), key))
}

/// A path segment with its `%XX` escapes decoded (invalid UTF-8 replaced).
fn decode(seg: &str) -> String {
    String::from_utf8_lossy(&crate::http::percent_decode(seg)).into_owned()
}

/// Every request: by its first segment to the API, the toolbox or a preview.
async fn dispatch(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let method = req.method().to_string();
    let seg: Vec<String> = path.split('/').filter(|p| !p.is_empty()).map(decode).collect();
    let seg: Vec<&str> = seg.iter().map(String::as_str).collect();
    let r = match seg.first().copied() {
        Some("api") => api_request(&s, &seg[1..], req).await,
        Some("toolbox") => toolbox_request(&s, &seg[1..], req).await,
        Some("preview") if seg.len() >= 3 => {
            let raw = req.uri().path().to_string();
            let rest = raw
                .split('/')
                .filter(|p| !p.is_empty())
                .skip(3)
                .collect::<Vec<_>>()
                .join("/");
            let tail = if raw.ends_with('/') && !rest.is_empty() {
                format!("{rest}/")
            } else {
                rest
            };
            preview::forward(&s, seg[1], seg[2], &tail, req).await
        }
        _ => Err(DError::api(404, "NOT_FOUND", format!("Cannot {method} {path}"))),
    };
    match r {
        Ok(r) => r,
        Err(e) => e.response(&method, &path),
    }
}

/// The throttle's turn: `Some` 429 while it counts down.
fn throttled(s: &Shared, source: Source) -> Option<DError> {
    s.throttle
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
        .then(|| DError::rate_limited(source))
}

async fn api_request(s: &Arc<Shared>, seg: &[&str], req: Request) -> Result<Response, DError> {
    if !authorized(&s.api_key, req.headers()) {
        return Err(DError::unauthorized(Source::Api));
    }
    if let Some(e) = throttled(s, Source::Api) {
        return Err(e);
    }
    {
        let mut f = s.fail.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((status, code, message, n)) = f.as_mut() {
            let e = DError::api(*status, code, message.clone());
            *n -= 1;
            if *n == 0 {
                *f = None;
            }
            return Err(e);
        }
    }
    let m = req.method().clone();
    let q = Query::of(&req);
    let body = if m == Method::POST || m == Method::PUT {
        let bytes = axum::body::to_bytes(req.into_body(), 8 << 20)
            .await
            .map_err(|e| DError::api(413, "PAYLOAD_TOO_LARGE", format!("reading the body: {e}")))?;
        if bytes.is_empty() {
            None
        } else {
            Some(
                serde_json::from_slice::<Value>(&bytes)
                    .map_err(|e| DError::bad_request(format!("the body is not JSON: {e}")))?,
            )
        }
    } else {
        None
    };
    api::route(s, &m, seg, &q, body).await
}

async fn toolbox_request(s: &Arc<Shared>, seg: &[&str], req: Request) -> Result<Response, DError> {
    if !authorized(&s.api_key, req.headers()) {
        return Err(DError::unauthorized(Source::Proxy));
    }
    if let Some(e) = throttled(s, Source::Proxy) {
        return Err(e);
    }
    if s.hang.load(Ordering::SeqCst) {
        // Accepted, never answered: until the fake is told otherwise or shuts down.
        let mut rx = s.closing.subscribe();
        loop {
            if *rx.borrow_and_update() || rx.changed().await.is_err() {
                return Err(DError::new(
                    503,
                    "SERVICE_UNAVAILABLE",
                    "the fake is shutting down",
                    Source::Proxy,
                ));
            }
            if !s.hang.load(Ordering::SeqCst) {
                break;
            }
        }
    }
    let Some((id, rest)) = seg.split_first() else {
        return Err(DError::new(404, "NOT_FOUND", "no sandbox in the path", Source::Proxy));
    };
    let sbx = s
        .get(id)
        .ok_or_else(|| DError::new(404, "NOT_FOUND", format!("Sandbox {id} not found"), Source::Proxy))?;
    let state = sbx.shown_state();
    if state != "started" {
        return Err(preview::not_started(&sbx.id, &state));
    }
    sbx.touch();
    let q = Query::of(&req);
    toolbox::route(s, &sbx, rest, &q, req).await
}

pub(crate) use crate::http::is_websocket;

/// The 101 answer to a WebSocket upgrade, and the socket once hyper hands it over.
pub(crate) fn upgrade(req: Request) -> Result<(Response, hyper::upgrade::OnUpgrade), DError> {
    crate::http::upgrade(req, "").map_err(|e| match e {
        crate::http::UpgradeRefused::NoKey => DError::daemon_bad_request("Sec-WebSocket-Key is missing"),
        crate::http::UpgradeRefused::Internal(e) => DError::internal(e, Source::Daemon),
    })
}

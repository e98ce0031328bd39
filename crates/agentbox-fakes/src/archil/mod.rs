//! A fake Archil whose disks are directories of this machine and whose execs really run:
//! each exec call is a fresh namespace box (`agentbox_providers::namespace`) with the disks
//! bound into it.
//!
//! It is what the `archil` provider is tested against, and it is itself judged by Archil's
//! own Python SDK (`archil` 0.18.0, with the generated `archil-openapi` 0.0.61, in
//! `providers/tests/archil.rs`): where the SDK and the fake disagree, the fake is wrong. It
//! answers what the real service answers and nothing for agentbox's sake; where the SDK and
//! the openapi are silent it does what a real service plausibly would, and says so here and
//! in each module's first lines. `docs/fakes.md` is the overview.
//!
//! One port serves both of Archil's hosts:
//! - `/api/...`, the control plane (the SDK's `base_url`): disks (`api`: list, get, create,
//!   delete) and exec (`exec`), in the envelope `{"success": true, "data": ...}`, errors
//!   `{"success": false, "error": MSG, "code": CODE}` (`error`);
//! - `/s3/...`, the S3-style object API (the SDK's `s3_base_url`, path style: `/s3/{diskId}/
//!   {key}`, see `s3`), errors in S3's XML.
//!
//! Every request shows the API key: `Authorization: key-KEY` (what the `archil` SDK sends),
//! `Bearer key-KEY` or `Bearer KEY` (the openapi client's); anything else is 401
//! `unauthorized` on the control plane and 403 `AccessDenied` on the object API. A key
//! configured with a `key-` prefix is the same key without it, as the SDK strips it.
//!
//! The knobs of a test: [`FakeArchil::fail_next`] (the next requests matching a method and a
//! path prefix answer a given error, in the envelope of the API they reach),
//! [`FakeArchil::requests`] (what was sent, never the key), [`FakeArchil::create_disk`] and
//! [`FakeArchil::disk_dir`] (a disk's files, seen from this machine), and
//! [`FakeArchilOptions::exec_limit`] (Archil's 300 s per exec, made short).
//!
//! Simpler than Archil, beyond what `api`, `exec` and `s3` list: no sandboxes, images,
//! tokens, users, branches, checkpoints, grep, share URLs, delegation listing or revocation
//! (their routes are 404); a disk is `available` from its creation and has no token users
//! (`authorizedUsers` is empty, so the SDK's `CreateDiskResult.token` is `None`); disks live
//! as long as the fake (a given [`FakeArchilOptions::root`] is written into but not read back
//! at start); no rate limits.

mod api;
mod checkout;
mod error;
mod exec;
mod files;
mod s3;
mod state;
mod xml;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentbox_providers::helper::HelperCommand;
use agentbox_providers::namespace::{NamespaceOptions, NamespaceProvider};
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, header};
use axum::response::Response;
use serde_json::{Value, json};

use crate::archil::error::{ApiError, S3Error};
use crate::archil::files::Owner;
use crate::archil::state::{Fault, Shared};
pub(crate) use crate::http::Query;

/// How a [`FakeArchil`] is set up.
#[derive(Clone, Debug)]
pub struct FakeArchilOptions {
    /// Where to listen; port 0 picks a free one.
    pub listen: SocketAddr,
    /// The API key every request must show. A `key-` prefix is no part of it (the SDK sends
    /// `key-` and the key without one).
    pub api_key: String,
    /// The region the disks are in (`aws-us-east-1`, as the SDK's `region`).
    pub region: String,
    /// Where the disks live, one directory each (`None`: a directory of the fake's own,
    /// removed at its end). It must exist.
    pub root: Option<PathBuf>,
    /// How long one exec's command may run before its box is destroyed and the call is 504
    /// (Archil's is 300 s).
    pub exec_limit: Duration,
    /// The root file system of the exec boxes (`None`: this machine's `/`, read only).
    pub rootfs: Option<PathBuf>,
    /// The fault switch every request passes (see [`crate::faults`]).
    pub faults: Option<Arc<crate::faults::Faults>>,
}

impl Default for FakeArchilOptions {
    fn default() -> Self {
        FakeArchilOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            api_key: "test-key".into(),
            region: DEFAULT_REGION.into(),
            root: None,
            exec_limit: Duration::from_secs(300),
            rootfs: None,
            faults: None,
        }
    }
}

/// The region unless told otherwise.
pub const DEFAULT_REGION: &str = "aws-us-east-1";

/// One request as the fake received it, for a test to read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    /// `GET`, `PUT`...
    pub method: String,
    /// The path as sent (percent-encoded), with `?` and the query when there is one.
    pub path: String,
    /// The body as text (invalid UTF-8 replaced), its first 64 KiB.
    pub body: String,
}

/// A running fake Archil. Dropping it (or [`FakeArchil::shutdown`]) stops serving and ends
/// every exec's box.
///
/// ```no_run
/// # async fn f() -> Result<(), String> {
/// use agentbox_fakes::archil::{FakeArchil, FakeArchilOptions};
/// let a = FakeArchil::start(FakeArchilOptions::default()).await?;
/// let disk = a.create_disk("work")?;
/// println!("base_url={} s3_base_url={} disk={disk}", a.base_url(), a.s3_base_url());
/// a.fail_next("POST", "/api/exec", 500, "internal_error", "scripted", 1);
/// a.shutdown().await;
/// # Ok(()) }
/// ```
pub struct FakeArchil {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: crate::server::Server,
}

impl FakeArchil {
    /// Listen and serve on this runtime until shut down. The runner the exec boxes are built
    /// by is `$AGENTBOX_RUNNER` (else beside this executable).
    pub async fn start(o: FakeArchilOptions) -> Result<FakeArchil, String> {
        let api_key = o.api_key.strip_prefix("key-").unwrap_or(&o.api_key).to_string();
        if api_key.is_empty() {
            return Err("api_key: empty (every request must show a key)".into());
        }
        if o.region.is_empty() {
            return Err("region: empty".into());
        }
        if o.exec_limit.is_zero() {
            return Err("exec_limit: zero (no command could run)".into());
        }
        if let Some(r) = &o.rootfs
            && !r.join("bin").exists()
        {
            return Err(format!(
                "rootfs {}: not a root file system (no bin/ in it)",
                r.display()
            ));
        }
        let dir = tempfile::Builder::new()
            .prefix("agentbox-fake-archil.")
            .tempdir()
            .map_err(|e| format!("making the fake's directory: {e}"))?;
        // The boxes' keeper opens the disks and the staged /mnt as the boxes' id: it must
        // pass through (not read) the directories above them.
        let open = |p: &std::path::Path, mode: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
                .map_err(|e| format!("opening {} to the boxes: {e}", p.display()))
        };
        open(dir.path(), 0o711)?;
        let root = match &o.root {
            Some(r) => std::fs::canonicalize(r).map_err(|e| format!("root {}: {e}", r.display()))?,
            None => {
                let r = dir.path().join("disks");
                std::fs::create_dir(&r).map_err(|e| format!("making {}: {e}", r.display()))?;
                open(&r, 0o711)?;
                std::fs::canonicalize(&r).map_err(|e| format!("root {}: {e}", r.display()))?
            }
        };
        if !root.is_dir() {
            return Err(format!("root {}: not a directory", root.display()));
        }
        let staging = dir.path().join("exec");
        std::fs::create_dir(&staging).map_err(|e| format!("making {}: {e}", staging.display()))?;
        open(&staging, 0o711)?;
        let staging = std::fs::canonicalize(&staging).map_err(|e| format!("{}: {e}", staging.display()))?;
        let runner = HelperCommand::discover().map_err(|e| e.to_string())?;
        agentbox_providers::namespace::available(&runner)
            .await
            .map_err(|e| e.to_string())?;
        let ns = NamespaceOptions {
            runner,
            ..NamespaceOptions::at(dir.path().join("home")).map_err(|e| e.to_string())?
        };
        // Running as root, the boxes' root is the host id `ns.host_id`: what the fake makes
        // in a disk is given to it.
        let owner = Owner(rustix::process::geteuid().is_root().then_some(ns.host_id));
        let provider = NamespaceProvider::new(ns).map_err(|e| e.to_string())?;
        let listener = tokio::net::TcpListener::bind(o.listen)
            .await
            .map_err(|e| format!("listening on {}: {e}", o.listen))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("reading the listening address: {e}"))?;
        let shared = Arc::new(Shared {
            api_key,
            region: o.region.clone(),
            root,
            staging,
            rootfs: o.rootfs.clone(),
            exec_limit: o.exec_limit,
            owner,
            provider: Arc::new(provider),
            disks: Default::default(),
            next_seq: AtomicU64::new(1),
            checkouts: Default::default(),
            boxes: Default::default(),
            exec_slots: Arc::new(tokio::sync::Semaphore::new(exec::MAX_EXECS)),
            faults: Default::default(),
            requests: Mutex::new(VecDeque::new()),
        });
        // Bodies are read by each route with its own bound (a PUT streams up to 512 MiB).
        let app = axum::Router::new()
            .fallback(dispatch)
            .with_state(shared.clone())
            .layer(DefaultBodyLimit::disable());
        let app = crate::faults::wrap(app, o.faults.as_ref());
        let server = crate::server::Server::spawn(|stopped| crate::server::serve(listener, app, stopped), dir);
        tracing::info!(%addr, "fake Archil listening");
        Ok(FakeArchil { addr, shared, server })
    }

    /// The address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`: the SDK's `base_url` (the control plane is under `/api`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://ADDR/s3`: the SDK's `s3_base_url`.
    pub fn s3_base_url(&self) -> String {
        format!("http://{}/s3", self.addr)
    }

    /// Make a disk as `POST /api/disks {"name"}` does; its id (`dsk-` and 16 hex digits).
    /// Refused as the API refuses: a malformed name, or one a disk has already.
    pub fn create_disk(&self, name: &str) -> Result<String, String> {
        api::create(&self.shared, &json!({ "name": name }))
            .map(|d| d.id)
            .map_err(|e| format!("creating disk {name:?}: {} ({})", e.message, e.code))
    }

    /// Where disk `id`'s files are on this machine (whether or not it exists). When the fake
    /// runs as root, what it makes there is owned by the boxes' host id (the id an exec box's
    /// root is mapped to); a file a test writes here as root is readable by the boxes but not
    /// theirs to change (write it through the object API, or give it to that id).
    pub fn disk_dir(&self, id: &str) -> PathBuf {
        self.shared.disk_dir(id)
    }

    /// The next `n` requests whose method is `method` (`*`: any) and whose path (as sent,
    /// without the query) starts with `path_prefix` answer `status` with `code` and `message`:
    /// in the control plane's JSON envelope under `/api`, as S3's XML `<Error>` under `/s3`.
    /// They are checked after the key, and do nothing else. Faults added stand in line; a
    /// request meets the first that matches it.
    pub fn fail_next(&self, method: &str, path_prefix: &str, status: u16, code: &str, message: &str, n: usize) {
        if n == 0 {
            return;
        }
        self.shared
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Fault {
                method: method.to_string(),
                path_prefix: path_prefix.to_string(),
                status,
                code: code.to_string(),
                message: message.to_string(),
                left: n,
            });
    }

    /// Every request received, oldest first (the last 10,000), without its headers.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    /// Stop serving and end every exec's box.
    pub async fn shutdown(mut self) {
        self.server.stopped().await;
        self.shared.end_all().await;
        self.server.remove_dir();
    }
}

impl Drop for FakeArchil {
    fn drop(&mut self) {
        self.server.halt();
        // Drop cannot await: the boxes are ended on a thread of their own.
        let shared = self.shared.clone();
        crate::server::end_on_own_runtime(async move { shared.end_all().await });
    }
}

/// Whether the request shows the key: `key-KEY`, `Bearer key-KEY` or `Bearer KEY`.
fn authorized(key: &str, h: &HeaderMap) -> bool {
    let Some(v) = h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let v = v.trim();
    let got = v.strip_prefix("Bearer ").map(str::trim).unwrap_or(v);
    let got = match got.strip_prefix("key-") {
        Some(k) => k,
        // Without `key-`, only as a bearer token.
        None if v.starts_with("Bearer ") => got,
        None => return false,
    };
    crate::ids::same(got, key)
}

/// The largest control-plane body.
const MAX_API_BODY: usize = 8 << 20;

/// Every request: the control plane under `/api`, the object API under `/s3`.
async fn dispatch(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let arrived = Instant::now();
    let raw_path = req.uri().path().to_string();
    let with_query = match req.uri().query() {
        Some(q) => format!("{raw_path}?{q}"),
        None => raw_path.clone(),
    };
    let method = req.method().clone();
    if let Some(rest) = raw_path.strip_prefix("/s3/").or((raw_path == "/s3").then_some("")) {
        let head = method == Method::HEAD;
        let mut excerpt = Vec::new();
        let (parts, body) = req.into_parts();
        let mut body = Some(body);
        let answer = s3_request(&s, rest, &raw_path, &parts, &mut body, &mut excerpt).await;
        let stated = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        // A body stated past the bound is not waited for: the answer comes at once.
        if let Some(b) = body
            && stated.is_none_or(|n| n <= MAX_DRAIN as u64)
        {
            drain(b, &mut excerpt).await;
        }
        s.record(method.as_str(), &with_query, &excerpt);
        return answer.unwrap_or_else(|e| e.response(head));
    }
    let shown = authorized(&s.api_key, req.headers());
    let q = Query::of(&req);
    let body = match axum::body::to_bytes(req.into_body(), MAX_API_BODY).await {
        Ok(b) => b,
        Err(e) => {
            s.record(method.as_str(), &with_query, b"");
            return ApiError::new(
                413,
                "payload_too_large",
                format!("reading the body (at most {} MiB): {e}", MAX_API_BODY >> 20),
            )
            .response();
        }
    };
    s.record(method.as_str(), &with_query, &body);
    if !shown {
        return ApiError::unauthorized().response();
    }
    api_request(&s, &method, &raw_path, &q, &body, arrived)
        .await
        .unwrap_or_else(|e| e.response())
}

async fn api_request(
    s: &Arc<Shared>,
    m: &Method,
    raw_path: &str,
    q: &Query,
    body: &[u8],
    arrived: Instant,
) -> Result<Response, ApiError> {
    if let Some((status, code, message)) = s.fault(m.as_str(), raw_path) {
        return Err(ApiError::new(status, &code, message));
    }
    let Some(rest) = raw_path.strip_prefix("/api/") else {
        return Err(ApiError::not_found(format!(
            "{m} {raw_path}: no such route in this fake"
        )));
    };
    let segs: Vec<String> = rest
        .split('/')
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(&crate::http::percent_decode(p)).into_owned())
        .collect();
    let seg: Vec<&str> = segs.iter().map(String::as_str).collect();
    let json = if body.is_empty() {
        None
    } else {
        Some(
            serde_json::from_slice::<Value>(body)
                .map_err(|e| ApiError::invalid(format!("the body is not JSON: {e}")))?,
        )
    };
    let json_or_null = || json.clone().unwrap_or(Value::Null);
    match (m, seg.as_slice()) {
        (&Method::POST, ["exec"]) => {
            let (mounts, command) = exec::parse_multi(&json_or_null())?;
            exec::exec(s, mounts, command, arrived).await
        }
        (&Method::POST, ["disks", id, "exec"]) => {
            api::found(s, id)?;
            let (mounts, command) = exec::parse_single(id, &json_or_null())?;
            exec::exec(s, mounts, command, arrived).await
        }
        _ => api::route(s, m, &seg, q, json).await,
    }
}

async fn s3_request(
    s: &Arc<Shared>,
    rest: &str,
    raw_path: &str,
    parts: &Parts,
    body: &mut Option<Body>,
    excerpt: &mut Vec<u8>,
) -> Result<Response, S3Error> {
    if !authorized(&s.api_key, &parts.headers) {
        return Err(S3Error::new(
            403,
            "AccessDenied",
            "Access Denied: a valid API key is required",
        ));
    }
    if let Some((status, code, message)) = s.fault(parts.method.as_str(), raw_path) {
        return Err(S3Error::new(status, &code, message));
    }
    let q = Query::of_uri(&parts.uri);
    s3::route(s, rest, &q, parts, body, excerpt).await
}

/// The most of a refused request's body read (and dropped) before the answer.
const MAX_DRAIN: usize = 16 << 20;
/// How long draining may take.
const DRAIN_TIME: Duration = Duration::from_secs(10);

/// Read a body nobody took, up to [`MAX_DRAIN`] bytes and [`DRAIN_TIME`], before its refusal is
/// answered: a client still sending when the server closes gets a reset, not the answer
/// (httpx then raises a ReadError in place of the SDK's ArchilS3Error). Past the bound the
/// connection is closed after the answer all the same.
async fn drain(body: Body, excerpt: &mut Vec<u8>) {
    use futures_util::StreamExt;
    let mut stream = body.into_data_stream();
    let mut read = 0usize;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while let Some(Ok(chunk)) = stream.next().await {
            let room = state::MAX_RECORDED_BODY.saturating_sub(excerpt.len());
            excerpt.extend_from_slice(&chunk[..chunk.len().min(room)]);
            read += chunk.len();
            if read > MAX_DRAIN {
                break;
            }
        }
    })
    .await;
}

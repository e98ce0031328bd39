//! E2B's API over any agentbox provider: the control plane (`E2B_API_URL`) and envd, each
//! sandbox's own server (`E2B_SANDBOX_URL`), on one router. E2B's SDKs, pointed at it, make
//! and drive agentbox boxes as they would E2B sandboxes.
//!
//! There is one implementation of E2B's API in agentbox, and it has two users:
//! `agentbox serve --e2b ADDR` serves it over the registry's providers, with agentbox's API
//! keys as `E2B_API_KEY`; `agentbox-fakes`' fake E2B serves it over namespace boxes, with the
//! fault switches ([`E2b::fail_next`] and the rest) that the e2b provider's tests set. What
//! differs between them is a [`Backend`]: who a key is, and how a sandbox's box is made.
//! Both are judged by E2B's own SDKs: where an SDK and this crate disagree, this crate is
//! wrong. `docs/e2b-api.md` is the overview for users.
//!
//! One port serves every host of E2B's. Under [`E2bOptions::domain`] the host names what a
//! request is for (`api.DOMAIN`, `PORT-ID.DOMAIN`, `sandbox.DOMAIN`); on any other host (the
//! one-URL mode) the headers do. A request with an `E2b-Sandbox-Id` header is for that
//! sandbox's envd (the SDK sends it, and `E2b-Sandbox-Port: 49983`, on every envd call when
//! `E2B_SANDBOX_URL` points it at one url); a request naming another port goes through E2B's
//! proxy to that port of the sandbox (`ports`); every other request is the control plane's.
//! HTTP/1.1 and Connect's JSON codec are served; the SDK is told `E2B_HTTP_VERSION=1.1`.
//!
//! The control plane (E2B's `openapi.yml`; the SDK's generated client where they differ), each
//! call showing `X-API-KEY` (one the backend does not know: 401 `{code, message}`, checked
//! first): `POST /v2/sandboxes` (the SDK's create) and `POST /sandboxes`,
//! `GET /sandboxes/{id}`, `GET /v2/sandboxes` and `GET /sandboxes` (running only, unpaged),
//! `DELETE /sandboxes/{id}`, `POST /sandboxes/{id}/timeout`, `POST /sandboxes/{id}/pause`,
//! `POST /sandboxes/{id}/resume`, `POST /sandboxes/{id}/connect` and
//! `POST /v2/sandboxes/{id}/connect` (the SDK's connect and resume), snapshots and forks
//! (`POST /sandboxes/{id}/snapshots`, `GET /snapshots`, `DELETE /templates/{id}`,
//! `POST /sandboxes/{id}/fork`: see `snapshots`), metrics (`GET /sandboxes/{id}/metrics`,
//! `GET /sandboxes/metrics`: measured in the box, see `metrics`), and `GET /health`.
//! Errors are E2B's `{code, message}`. A key sees only the sandboxes it made (an admin key
//! every one): another key's sandbox is 404, as one that does not exist. Ids are 20 lowercase
//! letters and digits.
//!
//! A sandbox: its `envVars` are its box's environment, over `E2B_SANDBOX`, `E2B_SANDBOX_ID`
//! and `E2B_TEMPLATE_ID` as envd sets them; `timeout` (seconds, default 15, more
//! than [`E2bOptions::max_timeout`] is 400 as E2B answers: "Timeout cannot be greater than
//! 1 hours") sets its end, which this crate keeps itself (and the box's own lifetime, a
//! margin later, is the provider's to enforce should this process die): at the end it is
//! killed (gone: 404), or paused with `autoPause`. A timeout call sets the end to now +
//! timeout; a connect to a running sandbox only extends it (200), to a paused one resumes it
//! (201); resume of a running one is 409, pause of a paused one 409. Pause is the provider's
//! sleep (every program ended, the files kept), for a day at most; resume its wake. A v2
//! create is always secure (its answer and detail carry `envdAccessToken`, which envd then
//! demands in `X-Access-Token`); a v1 create only with `secure: true`, unless
//! [`E2bOptions::always_secure`]. `allow_internet_access: false` is no network;
//! `network.allowOut` is an allowlist, and a `denyOut` of all traffic alone no network (see
//! `api::network_of`; any other deny list is refused, naming why); the network config is
//! answered back as asked. Listing: newest first
//! (or `order=asc`), filtered by `metadata` (`k=v&k2=v2`, each escaped once more, then the
//! whole value as a query parameter: as the SDK sends it), `state` (comma-separated),
//! `template` and `startedAfter` (started at or after an RFC 3339 time); at most `limit` (1 to 100, and at most [`E2bOptions::list_page_max`]) a page,
//! the next page's token in `X-Next-Token` (absent on the last page), `X-Total-Running`
//! beside it.
//!
//! envd (`spec/envd`): Connect RPC over HTTP/1.1 with JSON (see `envd`): `process.Process`
//! Start, Connect, List, SendInput, StreamInput, CloseStdin, SendSignal (SIGTERM, SIGKILL),
//! Update (a terminal's size); a Start with `pty {size}` runs the program in a terminal (its
//! output `data {pty}`, its input `input {pty}`); `filesystem.Filesystem` Stat, ListDir (with
//! `depth`), MakeDir (an existing one: `already_exists`), Move, Remove, WatchDir and the
//! watcher API (CreateWatcher, GetWatcherEvents, RemoveWatcher; a poll of the directory, see
//! `watch`); `GET /files?path=`
//! (download, every byte; gzipped when accepted) and `POST /files` (multipart, a `file` part
//! per file named by its path, or octet-stream with `path`; gzipped or not; either by a URL
//! signed with the access token rather than the token itself: `envd::signed`), `GET /health`
//! (204). A process stream is `start {pid}`,
//! its output as `data {stdout|stderr}` chunks, `keepalive {}` after every quiet interval (the
//! request's `Keepalive-Ping-Interval` seconds, else [`E2bOptions::keepalive`], envd's 90 s),
//! then `end {exitCode, exited, status}` as Go's `ProcessState` says it (`exit status 3`;
//! `signal: killed`, exit code -1, not exited) and the end-of-stream envelope. A Connect by pid
//! (or tag) streams the same from then on. A `Connect-Timeout-Ms` on a Start kills the program
//! at it. Pids are this crate's own, from 1000. The user a call asks (`Authorization: Basic
//! base64(user:)`, or `username=`) is recorded; everything runs as the box's user. A call for a
//! sandbox that is not running (gone, paused, unknown) is answered as E2B's proxy answers it:
//! 502 `{"code": 502, "message": "The sandbox ID was not found"}`, which the SDK reads as not
//! running.
//!
//! Not yet served (each answered as E2B answers a route or feature it lacks, never as a
//! missing sandbox): file metadata (`X-Metadata-*`, which the SDKs refuse themselves below
//! the envd version reported), logs, network updates, template builds, volumes, MCP and
//! IAM; Connect's binary codec. cpu, memory and disk are reported (2, 512 MiB, 10 GiB),
//! not enforced; relative paths and `~` are from the box's workspace (where its programs
//! start) for every user. A process stream that falls more than 4096 reads of the program's
//! pipe behind skips some. Bounds: 64 programs and 64 watchers a sandbox, 512 MiB an upload (gzip
//! undone) and a download, 30 s for a program to take its stdin. The records of sandboxes live
//! in this process: a server that stops ends their boxes; one killed leaves them to their
//! lifetimes (the timeout and two minutes).
//!
//! ```no_run
//! # async fn f(backend: std::sync::Arc<dyn agentbox_e2b::Backend>) -> Result<(), String> {
//! use agentbox_e2b::{E2b, E2bOptions};
//! let e2b = E2b::new(backend, E2bOptions::default())?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await.map_err(|e| e.to_string())?;
//! axum::serve(listener, e2b.router()).await.map_err(|e| e.to_string())?;
//! # Ok(()) }
//! ```

mod api;
mod envd;
pub mod http;
mod metrics;
mod ports;
mod snapshots;
mod state;
mod watch;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentbox_core::{Provider, Sandbox};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::response::Response;

use crate::state::{Fault, Shared, lock};

/// How an [`E2b`] behaves.
#[derive(Clone, Debug)]
pub struct E2bOptions {
    /// A process stream's keepalive interval when the request names none
    /// (`Keepalive-Ping-Interval`): envd's default, 90 s.
    pub keepalive: Duration,
    /// The longest timeout a sandbox may ask (the plan's: 1 h on E2B's default plan, 24 h on
    /// Pro); more is 400.
    pub max_timeout: Duration,
    /// The most sandboxes one listing page holds (E2B's: 100).
    pub list_page_max: usize,
    /// Every sandbox demands its envd access token, whatever its create asked. envd's calls
    /// carry no API key, so a service with more than one key sets this: without it, anyone
    /// who learns a v1 sandbox's id drives it.
    pub always_secure: bool,
    /// The domain of E2B's domain mode (`E2B_DOMAIN` of the SDKs): requests for `api.DOMAIN`
    /// are the control plane's, for `PORT-ID.DOMAIN` a sandbox's port (envd's, 49983, or
    /// another through the proxy), for `sandbox.DOMAIN` the sandbox its `E2b-Sandbox-Id`
    /// names; a create answers it as the sandbox's `domain`, so the SDK's `get_host` and its
    /// signed file URLs name this server. Requests for any other host are routed by header,
    /// as without it.
    pub domain: Option<Domain>,
}

/// A domain of E2B's domain mode, checked: lowercase DNS labels (letters, digits, inner `-`),
/// two or more.
///
/// ```
/// assert!(agentbox_e2b::Domain::new("e2b.example.com").is_ok());
/// assert!(agentbox_e2b::Domain::new("localhost").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Domain(String);

impl Domain {
    /// `d`, if it is a domain; the reason when not.
    pub fn new(d: &str) -> Result<Domain, String> {
        domain_name(d).map_err(|why| format!("{d:?}: {why}"))?;
        Ok(Domain(d.to_string()))
    }

    /// The domain's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for E2bOptions {
    fn default() -> Self {
        E2bOptions {
            keepalive: Duration::from_secs(90),
            max_timeout: Duration::from_secs(3600),
            list_page_max: 100,
            always_secure: true,
            domain: None,
        }
    }
}

/// Who called the control plane: the key's id (the owner of the sandboxes it makes, never the
/// key itself), whether it sees every sandbox, and what the backend knows of it.
#[derive(Clone)]
pub struct Caller {
    /// The owner written on what this caller makes.
    pub id: String,
    /// Sees and drives every sandbox, whoever made it.
    pub admin: bool,
    /// The longest a sandbox of this caller's may be asked to live from now (a timeout, a
    /// connect, a paused sandbox kept), beside the plan's; `None`: the plan's alone.
    pub max_lifetime: Option<Duration>,
    /// The backend's own record of the caller (the service's key, with its limits), handed
    /// back to [`Backend::make`]; this crate never reads it.
    pub record: Arc<dyn std::any::Any + Send + Sync>,
}

impl Caller {
    /// A caller with no record of the backend's.
    pub fn new(id: impl Into<String>, admin: bool) -> Self {
        Caller {
            id: id.into(),
            admin,
            max_lifetime: None,
            record: Arc::new(()),
        }
    }
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("id", &self.id)
            .field("admin", &self.admin)
            .finish_non_exhaustive()
    }
}

/// What a create asks of a sandbox's box.
#[derive(Clone, Debug)]
pub struct Ask {
    /// The sandbox's id, made before its box (a backend may label the box with it).
    pub sandbox_id: String,
    /// The template it names (`base`, or any name the backend maps).
    pub template: String,
    /// How long the box must live at least: the sandbox's timeout and a margin. The sandbox
    /// ends at its timeout (this crate ends it); this lifetime bounds a box whose server died.
    pub lifetime: Duration,
    /// Its network: `None` the provider's open one; `Some(None)` nothing at all (no internet,
    /// or everything denied); `Some(Allow(..))` only what E2B's `allowOut` lists.
    pub network: Option<agentbox_core::Network>,
    /// Its environment (`envVars`).
    pub env: BTreeMap<String, String>,
}

/// A box made for a sandbox, and the provider that made it (its pause and resume are that
/// provider's sleep and wake).
#[derive(Clone)]
pub struct Made {
    /// The provider.
    pub provider: Arc<dyn Provider>,
    /// The box.
    pub sandbox: Arc<dyn Sandbox>,
}

/// A refusal in E2B's words: the HTTP status and the message of its `{code, message}` body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status (and the body's `code`).
    pub status: u16,
    /// What was wrong, and why.
    pub message: String,
}

impl Refusal {
    /// A refusal of `status` saying `message`.
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        Refusal {
            status,
            message: message.into(),
        }
    }
}

/// Where [`E2b`] takes its callers and boxes from: the service's keys and registry, or a
/// fake's one key and namespace provider.
///
/// ```
/// use std::sync::Arc;
/// use agentbox_e2b::{Ask, Backend, Caller, Made, Refusal};
/// struct OneKey;
/// #[async_trait::async_trait]
/// impl Backend for OneKey {
///     async fn caller(&self, key: &str, _: &axum::http::Extensions) -> Result<Caller, Refusal> {
///         match agentbox_e2b::http::same(key, "e2b_secret") {
///             true => Ok(Caller::new("me", false)),
///             false => Err(Refusal::new(401, "Invalid API key")),
///         }
///     }
///     async fn make(&self, _: &Caller, ask: &Ask) -> Result<Made, Refusal> {
///         Err(Refusal::new(400, format!("template {:?}: not known here", ask.template)))
///     }
/// }
/// let _: Arc<dyn Backend> = Arc::new(OneKey);
/// ```
#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// The caller an `X-API-KEY` names, or the refusal to answer (401 for a key it does not
    /// know, 429 past the key's rate). `extensions` are the request's, where a server's own
    /// layers left what they want told (the access log's caller).
    async fn caller(&self, api_key: &str, extensions: &axum::http::Extensions) -> Result<Caller, Refusal>;

    /// Make the box of a new sandbox for `caller` (its template mapped, its limits checked).
    /// A template may name one of the caller's snapshots ([`Backend::snapshot`]).
    async fn make(&self, caller: &Caller, ask: &Ask) -> Result<Made, Refusal>;

    /// Take a snapshot of `of` (a sandbox of the caller's) called `name`, the caller's own:
    /// a later [`Ask::template`] of that name makes a box from it.
    async fn snapshot(&self, caller: &Caller, of: &Made, name: &str) -> Result<(), Refusal> {
        let _ = (caller, of, name);
        Err(Refusal::new(501, "snapshots are not served here"))
    }

    /// The caller's snapshots: each one's name, and the box it was taken of where known.
    async fn snapshots(&self, caller: &Caller) -> Result<Vec<(String, Option<agentbox_core::SandboxId>)>, Refusal> {
        let _ = caller;
        Err(Refusal::new(501, "snapshots are not served here"))
    }

    /// Delete the caller's snapshot `name`: whether it was there.
    async fn delete_snapshot(&self, caller: &Caller, name: &str) -> Result<bool, Refusal> {
        let _ = (caller, name);
        Err(Refusal::new(501, "snapshots are not served here"))
    }

    /// New boxes holding `of`'s files as they are now, one per ask (each its sandbox's id,
    /// lifetime, network, environment), counted against the caller's limits; all or none.
    async fn fork(&self, caller: &Caller, of: &Made, asks: &[Ask]) -> Result<Vec<Made>, Refusal> {
        let _ = (caller, of, asks);
        Err(Refusal::new(501, "forks are not served here"))
    }
}

/// One request as it was received, for a test to read back (never a key or token).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path, without the query (as `/v2/sandboxes` or `/process.Process/Start`).
    pub path: String,
    /// The sandbox it is for: named in the path (control plane) or by `E2b-Sandbox-Id` (envd).
    pub sandbox_id: Option<String>,
    /// The user an envd call asks for (`Authorization: Basic`), if any.
    pub user: Option<String>,
}

/// E2B's API over a [`Backend`]. Its [`E2b::router`] serves it; [`E2b::end_all`] ends every
/// sandbox's box.
pub struct E2b {
    shared: Arc<Shared>,
}

impl E2b {
    /// E2B's API over `backend`.
    pub fn new(backend: Arc<dyn Backend>, o: E2bOptions) -> Result<E2b, String> {
        if o.list_page_max == 0 {
            return Err("list_page_max: zero (no listing could page)".into());
        }
        if o.keepalive.is_zero() {
            return Err("keepalive: zero".into());
        }
        Ok(E2b {
            shared: Arc::new(Shared {
                backend,
                keepalive: o.keepalive,
                max_timeout: o.max_timeout,
                list_page_max: o.list_page_max,
                always_secure: o.always_secure,
                domain: o.domain.map(|d| d.0),
                sandboxes: Default::default(),
                seq: AtomicU64::new(1),
                next_pid: AtomicU32::new(1000),
                faults: Default::default(),
                requests: Mutex::new(VecDeque::new()),
                silence: tokio::sync::watch::channel(false).0,
            }),
        })
    }

    /// The routes of both of E2B's hosts, on one router. Bodies are read by each route with
    /// its own bound (an upload up to 512 MiB), so no layer above may bound them lower.
    pub fn router(&self) -> axum::Router {
        axum::Router::new()
            .fallback(dispatch)
            .with_state(self.shared.clone())
            .layer(DefaultBodyLimit::disable())
    }

    /// Every request received, oldest first (the last 10,000), without its headers, query or
    /// body. Control-plane requests the key refused are in it too.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.requests).iter().cloned().collect()
    }

    /// A test's fault: the next `n` requests of `method` (`*`: any) whose path starts with
    /// `path_prefix` (control plane or envd alike) answer `status` with E2B's error body
    /// `{code, message}`, after the key is checked (control plane) and before anything else.
    /// Faults stand in line; a request meets the first that matches it.
    pub fn fail_next(&self, method: &str, path_prefix: &str, status: u16, message: &str, n: usize) {
        if n == 0 {
            return;
        }
        lock(&self.shared.faults).push(Fault {
            method: method.to_string(),
            path_prefix: path_prefix.to_string(),
            status,
            message: message.to_string(),
            left: n,
        });
    }

    /// A test's fault: sandbox `id` dies at once, as a host failure would end it: its box
    /// destroyed, every open process stream cut mid-way (no end event, no end of stream),
    /// later control-plane calls 404 and envd calls 502. Whether it was there.
    pub fn vanish(&self, id: &str) -> bool {
        self.shared.remove(id).is_some()
    }

    /// A test's fault: while `on`, every process stream sends nothing (no data, no
    /// keepalives) but stays open: a hang a client must detect by the keepalives it misses.
    pub fn silence_keepalives(&self, on: bool) {
        self.shared.silence.send_replace(on);
    }

    /// Every sandbox there is, oldest first: its id and state (`running` or `paused`).
    pub fn sandboxes(&self) -> Vec<(String, String)> {
        let r = lock(&self.shared.sandboxes);
        let mut all: Vec<_> = r.values().collect();
        all.sort_by_key(|x| x.seq);
        all.iter()
            .map(|x| (x.id.clone(), x.state().name().to_string()))
            .collect()
    }

    /// End every sandbox's box (the server shuts down), each within 30 s.
    pub async fn end_all(&self) {
        self.shared.end_all().await;
    }
}

/// Whether `d` is a domain a host under it can be named by: lowercase DNS labels (letters,
/// digits, `-`), at least two, none empty; the reason when not.
fn domain_name(d: &str) -> Result<(), String> {
    if d.len() > 200 {
        return Err("longer than 200 bytes".into());
    }
    let labels: Vec<&str> = d.split('.').collect();
    if labels.len() < 2 {
        return Err("not a domain of two labels or more (as e2b.example.com)".into());
    }
    for l in labels {
        if l.is_empty() || l.len() > 63 {
            return Err("a label is empty or longer than 63 bytes".into());
        }
        if !l
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            || l.starts_with('-')
            || l.ends_with('-')
        {
            return Err(format!("label {l:?}: not lowercase letters, digits and inner dashes"));
        }
    }
    Ok(())
}

/// Where a request goes: which host of E2B's it is for.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    /// The control plane.
    Api,
    /// A sandbox's port (envd's when [`envd::PORT`]).
    Sandbox(String, u16),
    /// A host under the domain that names none of E2B's.
    Unknown(String),
}

/// The route of a request for `host` (its port, if any, left out) with these E2B headers,
/// under `domain` when the server has one. Under the domain, the host decides; elsewhere (a
/// single URL for both of E2B's), the headers do.
fn route(domain: Option<&str>, host: Option<&str>, sandbox: Option<String>, port: Option<u16>) -> Route {
    let by_header = |sandbox: Option<String>| match sandbox {
        Some(id) => Route::Sandbox(id, port.unwrap_or(envd::PORT)),
        None => Route::Api,
    };
    let (Some(domain), Some(host)) = (domain, host) else {
        return by_header(sandbox);
    };
    let host = host.to_ascii_lowercase();
    let Some(label) = host.strip_suffix(domain).and_then(|h| h.strip_suffix('.')) else {
        return by_header(sandbox);
    };
    match label {
        "api" => Route::Api,
        "sandbox" => match sandbox {
            Some(id) => Route::Sandbox(id, port.unwrap_or(envd::PORT)),
            None => Route::Unknown(host),
        },
        _ => match label.split_once('-') {
            Some((p, id))
                if !id.is_empty()
                    && !id.contains('.')
                    && let Ok(p) = p.parse::<u16>() =>
            {
                Route::Sandbox(id.to_string(), p)
            }
            _ => Route::Unknown(host),
        },
    }
}

/// The host a request was sent to, without its port: HTTP/2's `:authority` (in the URI), or
/// HTTP/1.1's `Host`.
fn host_of(req: &Request) -> Option<&str> {
    let h = req.uri().host().or_else(|| {
        req.headers()
            .get(axum::http::header::HOST)
            .and_then(|v| v.to_str().ok())
    })?;
    // `Host` may carry a port; an IPv6 literal keeps its brackets and has no name to route.
    Some(match h.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => h,
    })
}

/// Every request: envd's when it is for a sandbox's envd port, a sandbox's other port through
/// the proxy, else the control plane's (see [`route`]).
async fn dispatch(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let sandbox = req
        .headers()
        .get("e2b-sandbox-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let port = req
        .headers()
        .get("e2b-sandbox-port")
        .and_then(|v| v.to_str().ok())
        .and_then(|p| p.parse::<u16>().ok());
    match route(s.domain.as_deref(), host_of(&req), sandbox, port) {
        Route::Sandbox(id, p) if p != envd::PORT => ports::forward(s, id, p, req).await,
        Route::Sandbox(id, _) => envd::handle(s, id, req).await,
        Route::Api => api::handle(s, req).await,
        Route::Unknown(host) => api::json_response(
            axum::http::StatusCode::NOT_FOUND,
            &serde_json::json!({
                "code": 404,
                "message": format!(
                    "{host}: no host of this server's (api.DOMAIN, sandbox.DOMAIN or PORT-ID.DOMAIN)"
                ),
            }),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_routed_by_its_host_under_the_domain_and_by_header_elsewhere() {
        let d = Some("e2b.test");
        let id = || Some("abc".to_string());
        assert_eq!(route(d, Some("api.e2b.test"), None, None), Route::Api);
        assert_eq!(route(d, Some("API.E2B.test"), None, None), Route::Api);
        assert_eq!(
            route(d, Some("49983-abc.e2b.test"), None, None),
            Route::Sandbox("abc".into(), 49983)
        );
        assert_eq!(
            route(d, Some("8000-abc.e2b.test"), id(), Some(49983)),
            Route::Sandbox("abc".into(), 8000),
            "under the domain the host decides"
        );
        assert_eq!(
            route(d, Some("sandbox.e2b.test"), id(), None),
            Route::Sandbox("abc".into(), 49983)
        );
        assert!(matches!(
            route(d, Some("sandbox.e2b.test"), None, None),
            Route::Unknown(_)
        ));
        assert!(matches!(route(d, Some("x.e2b.test"), None, None), Route::Unknown(_)));
        assert!(matches!(
            route(d, Some("99999-abc.e2b.test"), None, None),
            Route::Unknown(_)
        ));
        assert!(matches!(
            route(d, Some("1-a.b.e2b.test"), None, None),
            Route::Unknown(_)
        ));
        // Another host (the single URL), or no domain: the headers decide.
        assert_eq!(route(d, Some("127.0.0.1"), None, None), Route::Api);
        assert_eq!(route(d, Some("notae2b.test"), None, None), Route::Api);
        assert_eq!(
            route(None, Some("49983-abc.e2b.test"), id(), Some(8000)),
            Route::Sandbox("abc".into(), 8000)
        );
    }

    #[test]
    fn a_domain_is_lowercase_labels() {
        assert!(domain_name("e2b.test").is_ok());
        assert!(domain_name("a-1.example.com").is_ok());
        for bad in ["localhost", "E2B.test", "a..b", "-a.b", "a_b.c", ".a.b", "a.b."] {
            assert!(domain_name(bad).is_err(), "{bad}");
        }
    }
}

//! A fake E2B whose sandboxes are namespace boxes of this machine
//! (`agentbox_providers::namespace`): one long-lived box per sandbox, its programs really run.
//!
//! It is what the `e2b` provider is tested against, and it is itself judged by E2B's own
//! Python SDK (`e2b` 2.63, in `providers/tests/e2b.rs`): where the SDK and the fake disagree, the
//! fake is wrong. It answers what the real service answers and nothing for agentbox's sake;
//! where the SDK and the spec are silent it does what a real service plausibly would, and says
//! so here. `docs/fakes.md` is the overview.
//!
//! One loopback port serves plain HTTP/1.1 for both of E2B's hosts. A request with an
//! `E2b-Sandbox-Id` header is for that sandbox's envd (the SDK sends it, and
//! `E2b-Sandbox-Port: 49983`, on every envd call when `E2B_SANDBOX_URL` points it at one
//! url); every other request is the control plane's (`E2B_API_URL`). The SDK's default is
//! HTTP/2; it is told `E2B_HTTP_VERSION=1.1` (its file downloads are HTTP/1.1 anyway).
//!
//! The control plane (`spec/openapi.yml`; the SDK's generated client where they differ), each
//! call showing `X-API-KEY` (wrong or missing: 401 `{code, message}`, checked first):
//! `POST /v2/sandboxes` (the SDK's create) and `POST /sandboxes`, `GET /sandboxes/{id}`,
//! `GET /v2/sandboxes` and `GET /sandboxes` (running only, unpaged), `DELETE /sandboxes/{id}`,
//! `POST /sandboxes/{id}/timeout`, `POST /sandboxes/{id}/pause`, `POST /sandboxes/{id}/resume`,
//! `POST /sandboxes/{id}/connect` and `POST /v2/sandboxes/{id}/connect` (the SDK's connect and
//! resume), and `GET /health`. Errors are E2B's `{code, message}`; an unknown or gone sandbox
//! is 404. Ids are 20 lowercase letters and digits.
//!
//! A sandbox: its `envVars` are its box's environment; `timeout` (seconds, default 15, more
//! than [`FakeE2BOptions::max_timeout`] is 400 as E2B answers: "Timeout cannot be greater than
//! 1 hours") sets its end, which the fake keeps itself: at the end it is killed (gone: 404),
//! or paused with `autoPause`. A timeout call sets the end to now + timeout; a connect to a
//! running sandbox only extends it (200), to a paused one resumes it (201); resume of a running
//! one is 409, pause of a paused one 409. Pause ends every program of the box (the namespace
//! provider's sleep) and keeps its files (`/tmp`, `/root`, `/workspace`; the rest of the root
//! is read only), for a day at most; resume wakes it (a fresh runner, the same files). A v2
//! create is always secure (its answer and detail carry `envdAccessToken`, which envd then
//! demands in `X-Access-Token`); a v1 create only with `secure: true`. `allow_internet_access:
//! false` is no network; `network.allowOut`/`denyOut` lists cannot be enforced here, so any
//! list is no network too (fail closed); the network config is recorded and answered back.
//! Listing: newest first (or `order=asc`), filtered by `metadata` (`k=v&k2=v2`, each escaped
//! once more, then the whole value as a query parameter: as the SDK sends it), `state`
//! (comma-separated) and `template`; at most `limit` (1 to 100, and at most
//! [`FakeE2BOptions::list_page_max`]) a page, the next page's token in `X-Next-Token` (absent
//! on the last page), `X-Total-Running` beside it.
//!
//! envd (`spec/envd`): Connect RPC over HTTP/1.1 with JSON (see `envd`): `process.Process`
//! Start, Connect, List, SendInput, StreamInput, CloseStdin, SendSignal (SIGTERM, SIGKILL),
//! Update (accepted, nothing done: no PTYs); `filesystem.Filesystem` Stat, ListDir (with
//! `depth`), MakeDir (an existing one: `already_exists`), Move, Remove; `GET /files?path=`
//! (download, every byte) and `POST /files` (multipart, a `file` part per file named by its
//! path, or octet-stream with `path`), `GET /health` (204). A process stream is `start {pid}`,
//! its output as `data {stdout|stderr}` chunks, `keepalive {}` after every quiet interval (the
//! request's `Keepalive-Ping-Interval` seconds, else [`FakeE2BOptions::keepalive`], envd's 90 s),
//! then `end {exitCode, exited, status}` as Go's `ProcessState` says it (`exit status 3`;
//! `signal: killed`, exit code -1, not exited) and the end-of-stream envelope. A Connect by pid
//! (or tag) streams the same from then on. A `Connect-Timeout-Ms` on a Start kills the program
//! at it. Pids are the fake's own, from 1000. The user a call asks (`Authorization: Basic
//! base64(user:)`, or `username=`) is recorded; everything runs as the box's root. A call for a
//! sandbox that is not running (gone, paused, unknown) is answered as E2B's proxy answers it:
//! 502 `{"code": 502, "message": "The sandbox ID was not found"}`, which the SDK reads as not
//! running.
//!
//! A request naming another port (`E2b-Sandbox-Port`) goes through E2B's proxy to that port
//! of the sandbox (see `ports`).
//!
//! Simpler than E2B: every template is [`FakeE2BOptions::rootfs`] (or this machine's `/`, read
//! only) whatever it names; cpu, memory and disk are reported (2, 512 MiB, 10 GiB), not
//! enforced; relative paths and `~` are from `/root` (the box's home) for every user, and a
//! program's default working directory is the box's (`/workspace`), not the user's home; no
//! PTYs, WatchDir, watchers, file metadata (`X-Metadata-*`), gzip uploads, signed URLs,
//! snapshots, forks, metrics, logs, templates, volumes, MCP or IAM; a process stream that falls
//! more than 4096 chunks behind skips some; a paused sandbox's files are kept a day.
//!
//! The knobs of a test: [`FakeE2B::fail_next`] (the next requests of a method and path answer
//! a given status with E2B's error body), [`FakeE2B::vanish`] (a sandbox dies at once: its box
//! destroyed, its streams cut without an end, later calls 404 and 502),
//! [`FakeE2B::silence_keepalives`] (streams send nothing, keepalives included, but stay open),
//! [`FakeE2B::requests`] (never a key or token), [`FakeE2B::sandboxes`], and
//! [`FakeE2BOptions::list_page_max`] (small, to test paging).

mod api;
mod envd;
mod ports;
mod state;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentbox_providers::helper::HelperCommand;
use agentbox_providers::namespace::{NamespaceOptions, NamespaceProvider};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::response::Response;

use crate::e2b::state::{Fault, Shared, lock};

/// How a [`FakeE2B`] is set up.
#[derive(Clone, Debug)]
pub struct FakeE2BOptions {
    /// Where to listen; port 0 picks a free one.
    pub listen: SocketAddr,
    /// The key every control-plane call must show (`X-API-KEY`); never recorded.
    pub api_key: String,
    /// The root file system of every sandbox (`None`: this machine's `/`, read only).
    pub rootfs: Option<PathBuf>,
    /// Where the fake keeps its boxes (`None`: a directory of its own, removed at its end). It
    /// must exist.
    pub root: Option<PathBuf>,
    /// A process stream's keepalive interval when the request names none
    /// (`Keepalive-Ping-Interval`): envd's default, 90 s.
    pub keepalive: Duration,
    /// The longest timeout a sandbox may ask (the plan's: 1 h on E2B's default plan, 24 h on
    /// Pro); more is 400.
    pub max_timeout: Duration,
    /// The most sandboxes one listing page holds (E2B's: 100).
    pub list_page_max: usize,
}

impl Default for FakeE2BOptions {
    fn default() -> Self {
        FakeE2BOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            api_key: "e2b_fake".into(),
            rootfs: None,
            root: None,
            keepalive: Duration::from_secs(90),
            max_timeout: Duration::from_secs(3600),
            list_page_max: 100,
        }
    }
}

/// One request as the fake received it, for a test to read back (never a key or token).
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

/// A running fake E2B. Dropping it (or [`FakeE2B::shutdown`]) stops serving and ends every
/// sandbox's box.
///
/// ```no_run
/// # async fn f() -> Result<(), String> {
/// use agentbox_fakes::e2b::{FakeE2B, FakeE2BOptions};
/// let e = FakeE2B::start(FakeE2BOptions::default()).await?;
/// println!("E2B_API_URL={0} E2B_SANDBOX_URL={0}", e.url());
/// e.fail_next("POST", "/v2/sandboxes", 503, "scripted", 1);
/// e.shutdown().await;
/// # Ok(()) }
/// ```
pub struct FakeE2B {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: crate::server::Server,
}

impl FakeE2B {
    /// Listen and serve on this runtime until shut down. The runner the boxes are built by is
    /// `$AGENTBOX_RUNNER` (else beside this executable).
    pub async fn start(o: FakeE2BOptions) -> Result<FakeE2B, String> {
        if o.api_key.is_empty() {
            return Err("api_key: required".into());
        }
        if o.list_page_max == 0 {
            return Err("list_page_max: zero (no listing could page)".into());
        }
        if o.keepalive.is_zero() {
            return Err("keepalive: zero".into());
        }
        if let Some(r) = &o.rootfs
            && !r.join("bin").exists()
        {
            return Err(format!(
                "rootfs {}: not a root file system (no bin/ in it)",
                r.display()
            ));
        }
        let tmp = tempfile::Builder::new()
            .prefix("agentbox-fake-e2b.")
            .tempdir()
            .map_err(|e| format!("making the fake's directory: {e}"))?;
        let home = match &o.root {
            Some(r) => std::fs::canonicalize(r).map_err(|e| format!("root {}: {e}", r.display()))?,
            None => tmp.path().join("home"),
        };
        let runner = HelperCommand::discover().map_err(|e| e.to_string())?;
        agentbox_providers::namespace::available(&runner)
            .await
            .map_err(|e| e.to_string())?;
        let ns = NamespaceOptions {
            runner,
            ..NamespaceOptions::at(home).map_err(|e| e.to_string())?
        };
        let provider = NamespaceProvider::new(ns).map_err(|e| e.to_string())?;
        let listener = tokio::net::TcpListener::bind(o.listen)
            .await
            .map_err(|e| format!("listening on {}: {e}", o.listen))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("reading the listening address: {e}"))?;
        let shared = Arc::new(Shared {
            api_key: o.api_key.clone(),
            rootfs: o.rootfs.clone(),
            keepalive: o.keepalive,
            max_timeout: o.max_timeout,
            list_page_max: o.list_page_max,
            provider: Arc::new(provider),
            sandboxes: Default::default(),
            seq: AtomicU64::new(1),
            next_pid: AtomicU32::new(1000),
            faults: Default::default(),
            requests: Mutex::new(VecDeque::new()),
            silence: tokio::sync::watch::channel(false).0,
        });
        // Bodies are read by each route with its own bound (an upload up to 512 MiB).
        let app = axum::Router::new()
            .fallback(dispatch)
            .with_state(shared.clone())
            .layer(DefaultBodyLimit::disable());
        let server = crate::server::Server::spawn(|stopped| crate::server::serve(listener, app, stopped), tmp);
        tracing::info!(%addr, "fake E2B listening");
        Ok(FakeE2B { addr, shared, server })
    }

    /// The address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`: the SDK's `E2B_API_URL` and `E2B_SANDBOX_URL` both.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received, oldest first (the last 10,000), without its headers, query or
    /// body. Control-plane requests the key refused are in it too.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.requests).iter().cloned().collect()
    }

    /// The next `n` requests of `method` (`*`: any) whose path starts with `path_prefix`
    /// (control plane or envd alike) answer `status` with E2B's error body `{code, message}`,
    /// after the key is checked (control plane) and before anything else. Faults stand in
    /// line; a request meets the first that matches it.
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

    /// Sandbox `id` dies at once, as a host failure would end it: its box destroyed, every open
    /// process stream cut mid-way (no end event, no end of stream), later control-plane calls
    /// 404 and envd calls 502. Whether it was there.
    pub fn vanish(&self, id: &str) -> bool {
        self.shared.remove(id)
    }

    /// While `on`, every process stream sends nothing (no data, no keepalives) but stays open:
    /// a hang a client must detect by the keepalives it misses.
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

    /// Stop serving and end every sandbox's box.
    pub async fn shutdown(mut self) {
        self.server.stopped().await;
        self.shared.end_all().await;
        self.server.remove_dir();
    }
}

impl Drop for FakeE2B {
    fn drop(&mut self) {
        self.server.halt();
        // Drop cannot await: the boxes are ended on a thread of their own.
        let shared = self.shared.clone();
        crate::server::end_on_own_runtime(async move { shared.end_all().await });
    }
}

/// Every request: envd's when it names a sandbox (`E2b-Sandbox-Id`) and no other port
/// (`E2b-Sandbox-Port`), a sandbox's port through the proxy when it names another, else the
/// control plane's.
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
    match (sandbox, port) {
        (Some(id), Some(p)) if p != envd::PORT => ports::forward(s, id, p, req).await,
        (Some(id), _) => envd::handle(s, id, req).await,
        (None, _) => api::handle(s, req).await,
    }
}

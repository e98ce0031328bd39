//! A fake Modal whose sandboxes are namespace boxes of this machine
//! (`agentbox_providers::namespace`): one long-lived box per sandbox, its execs really run.
//!
//! It is what the `modal` provider is tested against, and it is itself judged by Modal's own
//! Python SDK (`modal` 1.6.x, in `providers/tests/modal.rs`): where the SDK and the fake
//! disagree, the fake is wrong. It answers what the real service answers and nothing for
//! agentbox's sake; where the SDK and the protocol are silent it does what a real service
//! plausibly would, and says so here. `docs/fakes.md` is the overview.
//!
//! One loopback port serves Modal's two gRPC services over plain HTTP/2 (h2c), compiled from
//! the protocol the `modal` 1.6.4 package ships (`agentbox-modal-proto`):
//! - `modal.client.ModalClient` (`client`): ClientHello, EnvironmentGetOrCreate,
//!   AppGetOrCreate, AppGetTags/AppSetTags, SecretGetOrCreate (the SDK makes a sandbox's `env`
//!   a secret), ImageGetOrCreate, ImageJoinStreaming, ImageFromId, ImageDelete, SandboxCreate,
//!   SandboxGetTaskId, TaskGetCommandRouterAccess, SandboxWait, SandboxList, SandboxTerminate,
//!   SandboxTagsSet/SandboxTagsGet, SandboxSnapshotFs, SandboxGetTunnels. Every call of these
//!   shows `x-modal-token-id` and `x-modal-token-secret`; wrong or missing is
//!   `UNAUTHENTICATED` (checked for every call of the service, before anything else).
//! - `modal.task_command_router.TaskCommandRouter` (`router`): TaskExecStart,
//!   TaskExecStdioRead, TaskExecStdinWrite, TaskExecStdinWriteStream, TaskExecStdinStatus,
//!   TaskExecWait, TaskExecPoll, TaskSnapshotFilesystem; each shows the task's JWT
//!   (`authorization: Bearer JWT`, from TaskGetCommandRouterAccess, random per task). The
//!   router's url is this same `http://ADDR`: the SDK takes a plain-http router url when its
//!   server url is a loopback one (`_task_command_router_client.py`: "plain http serving should
//!   only be used for unit tests").
//!
//! Every other call of either service answers `UNIMPLEMENTED`.
//!
//! A sandbox: its entrypoint runs in its box (none given: the box just lives); when it exits
//! the sandbox ends `SUCCESS` (exit 0) or `FAILURE` with its exit code; at `timeout_secs`
//! (default 300, at most 86,400: more is `INVALID_ARGUMENT`) the box is ended and the result is
//! `TIMEOUT`; SandboxTerminate ends it `TERMINATED` (again: no error, `existing_result` set).
//! Ids have Modal's shapes (`sb-` and 22 letters and digits, which the SDK reads as a V1
//! sandbox; `ta-`, `ap-`, `im-`, `st-`, `en-`). SandboxWait holds until the end or the asked
//! timeout, at most [`FakeModalOptions::max_wait`]; 0 polls. SandboxList pages newest first
//! by `created_at` (strictly earlier than `before_timestamp` when it is set, as the SDK pages),
//! at most [`FakeModalOptions::list_page`] a page, every asked tag matching; without
//! `include_finished` only running sandboxes. Tags (app and sandbox) are replaced whole by a
//! set, as the SDK documents.
//!
//! An exec: `exec_id` is the client's idempotency key (a second start answers OK and starts
//! nothing). Each stream is kept whole, up to 64 MiB (past it the program is killed and a read
//! past the bound is `RESOURCE_EXHAUSTED`), so any offset can be read again; a read follows the
//! program until the stream ends (its pipe closed after the exit, or a second after the exit
//! when a background program holds it). Stdin takes bytes at an offset: bytes already written
//! are ignored, a gap is `INVALID_ARGUMENT`, `eof` closes it (twice is no error). A program
//! that cannot be started (not found) starts all the same and ends 127 with the reason on its
//! stderr, as a shell would (the SDK has no case of its own for it). `timeout_secs` kills the
//! program (SIGKILL: the wait answers `signal: 9`). Once the sandbox ended, every router call
//! for its task is `NOT_FOUND` (the SDK's exec wait stops retrying on it).
//!
//! Simpler than Modal: every image is [`FakeModalOptions::rootfs`] (or this machine's `/`,
//! read only) whatever it names, built at once (`SUCCESS`, its Dockerfile commands only
//! recorded, one definition one id); a filesystem snapshot (SandboxSnapshotFs, or the router's
//! TaskSnapshotFilesystem the SDK uses by default) keeps the box's own writable places only,
//! `/workspace` and `/root` (the namespace provider's snapshot); cpu and memory are recorded,
//! not enforced; the network is open or none: `BLOCKED` and `block_network` are none, and an
//! `ALLOWLIST` cannot be enforced here, so it is none too (fail closed); a tunnel is the box's
//! own port on 127.0.0.1 (an open-network box shares this machine's network), encrypted or not
//! alike; no logs (SandboxGetLogs), no sandbox stdin/stdout of the entrypoint, no PTYs, no
//! volumes, mounts, memory (a memory snapshot, SandboxSnapshot and SandboxRestore, keeps the files and the
//! definition; a restore starts the entrypoint afresh), names lookup, V2 sandboxes or sidecars; a `runtime` is
//! recorded and only `vm` means anything (FUSE, below).
//!
//! Scripted hardware: a sandbox with a `gpu_config` gets an `nvidia-smi` on its PATH (at
//! `/nvidia/bin`) printing, for `--query-gpu=name`, the names [`FakeModalOptions::gpus`]
//! lists for the asked type, one a line (none listed: nothing, exit 0, "asked and none
//! served"); others have none. With [`FakeModalOptions::fuse`], a sandbox of runtime `vm`
//! gets a character device at `/dev/fuse` that root opens: a link to the box's own `/dev/null`
//! standing in (this machine's device is its root's alone, which no box's root is, and a
//! device bound into a box is nodev), so a client's check passes but a FUSE mount would not;
//! others have no `/dev/fuse`.
//!
//! The knobs of a test: [`FakeModal::fail_next`] (the next calls of a method answer a given
//! status), [`FakeModal::cut_stdio_after`] (stdio reads fail `UNAVAILABLE` part way, so a
//! client must resume from its offset), [`FakeModal::end_sandbox`] (a sandbox ended behind the
//! client's back), [`FakeModal::requests`] (what was called, never the tokens),
//! [`FakeModal::sandboxes`], and [`FakeModalOptions::list_page`] (small, to test paging).

mod client;
mod router;
mod state;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentbox_modal_proto::client::generic_result::GenericStatus;
use agentbox_modal_proto::client::modal_client_server::ModalClientServer;
use agentbox_modal_proto::task_command_router::task_command_router_server::TaskCommandRouterServer;
use agentbox_providers::helper::HelperCommand;
use agentbox_providers::namespace::{NamespaceOptions, NamespaceProvider};

use crate::modal::state::{Fault, Shared, lock, result};

/// The largest message either service takes (a stdin write, an image definition).
const MAX_MESSAGE: usize = 64 << 20;

/// How a [`FakeModal`] is set up.
#[derive(Clone, Debug)]
pub struct FakeModalOptions {
    /// Where to listen; port 0 picks a free one. Loopback: the SDK takes the plain-http router
    /// url only from a loopback server.
    pub listen: SocketAddr,
    /// The token id every call must show (`x-modal-token-id`).
    pub token_id: String,
    /// The token secret every call must show (`x-modal-token-secret`); never recorded.
    pub token_secret: String,
    /// The root file system of every sandbox (`None`: this machine's `/`, read only).
    pub rootfs: Option<PathBuf>,
    /// Where the fake keeps its boxes and snapshots (`None`: a directory of its own, removed at
    /// its end). It must exist.
    pub root: Option<PathBuf>,
    /// The GPUs a sandbox of each asked type sees: (the asked `gpu_type`, as `T4` or `H100`,
    /// matched without case; the names `nvidia-smi` prints, one per card).
    pub gpus: Vec<(String, Vec<String>)>,
    /// Whether a sandbox of runtime `vm` gets `/dev/fuse`.
    pub fuse: bool,
    /// The most sandboxes one SandboxList page holds (Modal's: 100 or so).
    pub list_page: usize,
    /// The longest SandboxWait holds, whatever it asks.
    pub max_wait: Duration,
    /// The fault switch every call passes, by its gRPC path (`/modal.client.ModalClient/
    /// SandboxCreate`): see [`crate::faults`]. A status fault is an HTTP status a proxy in
    /// front would answer; a malformed answer is a message that is not protobuf.
    pub faults: Option<Arc<crate::faults::Faults>>,
}

impl Default for FakeModalOptions {
    fn default() -> Self {
        FakeModalOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            token_id: "ak-fake".into(),
            token_secret: "as-fake".into(),
            rootfs: None,
            root: None,
            gpus: Vec::new(),
            fuse: false,
            list_page: 100,
            max_wait: Duration::from_secs(55),
            faults: None,
        }
    }
}

/// One call as the fake received it, for a test to read back (never a token or JWT).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedCall {
    /// The method's name, as `SandboxCreate` or `TaskExecStart`.
    pub method: String,
    /// The sandbox it names (or whose task it names), if any.
    pub sandbox_id: Option<String>,
    /// The task it names, if any.
    pub task_id: Option<String>,
    /// The exec it names, if any.
    pub exec_id: Option<String>,
}

/// A running fake Modal. Dropping it (or [`FakeModal::shutdown`]) stops serving and ends every
/// sandbox's box.
///
/// ```no_run
/// # async fn f() -> Result<(), String> {
/// use agentbox_fakes::modal::{FakeModal, FakeModalOptions};
/// let m = FakeModal::start(FakeModalOptions::default()).await?;
/// println!("MODAL_SERVER_URL={}", m.url());
/// m.fail_next("SandboxCreate", tonic::Code::Unavailable, "scripted", 1);
/// m.shutdown().await;
/// # Ok(()) }
/// ```
pub struct FakeModal {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: crate::server::Server,
}

impl FakeModal {
    /// Listen and serve on this runtime until shut down. The runner the boxes are built by is
    /// `$AGENTBOX_RUNNER` (else beside this executable).
    pub async fn start(o: FakeModalOptions) -> Result<FakeModal, String> {
        if o.token_id.is_empty() || o.token_secret.is_empty() {
            return Err("token_id and token_secret: both required".into());
        }
        if o.list_page == 0 {
            return Err("list_page: zero (no listing could page)".into());
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
            .prefix("agentbox-fake-modal.")
            .tempdir()
            .map_err(|e| format!("making the fake's directory: {e}"))?;
        // The boxes' keeper opens the GPU directories as the boxes' id: it must pass through
        // the directories above them.
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711))
            .map_err(|e| format!("opening {} to the boxes: {e}", tmp.path().display()))?;
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
            token_id: o.token_id.clone(),
            token_secret: o.token_secret.clone(),
            rootfs: o.rootfs.clone(),
            gpus: o.gpus.clone(),
            fuse: o.fuse,
            list_page: o.list_page,
            max_wait: o.max_wait,
            url: format!("http://{addr}"),
            dir: tmp.path().to_path_buf(),
            provider: Arc::new(provider),
            records: Default::default(),
            faults: Default::default(),
            cuts: Default::default(),
            calls: Mutex::new(VecDeque::new()),
        });
        let auth = shared.clone();
        let check = move |r: tonic::Request<()>| -> Result<tonic::Request<()>, tonic::Status> {
            let get = |k: &str| r.metadata().get(k).and_then(|v| v.to_str().ok()).unwrap_or("");
            if crate::ids::same(get("x-modal-token-id"), &auth.token_id)
                && crate::ids::same(get("x-modal-token-secret"), &auth.token_secret)
            {
                Ok(r)
            } else {
                Err(tonic::Status::unauthenticated("Invalid token id or secret"))
            }
        };
        let client = ModalClientServer::new(client::Client(shared.clone()))
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let client = tonic::service::interceptor::InterceptedService::new(client, check);
        let router = TaskCommandRouterServer::new(router::Router(shared.clone()))
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let faults = o.faults.clone();
        let serve = |stopped: tokio::sync::oneshot::Receiver<()>| async move {
            let served = tonic::transport::Server::builder()
                .layer(crate::faults::FaultLayer::new(faults))
                .add_service(client)
                .add_service(router)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "the fake Modal stopped serving");
            }
        };
        let server = crate::server::Server::spawn(serve, tmp);
        tracing::info!(%addr, "fake Modal listening");
        Ok(FakeModal { addr, shared, server })
    }

    /// The address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`: the SDK's `MODAL_SERVER_URL`, and the command router's url.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every call received, oldest first (the last 10,000), without its metadata. Calls the
    /// tokens refused are not in it.
    pub fn requests(&self) -> Vec<RecordedCall> {
        lock(&self.shared.calls).iter().cloned().collect()
    }

    /// The next `n` calls of `method` (as `SandboxCreate`, `TaskExecStart`: either service)
    /// answer `code` with `message`, after the tokens (or the JWT's task) are checked and
    /// before anything else. Faults stand in line; a call meets the first for its method.
    pub fn fail_next(&self, method: &str, code: tonic::Code, message: &str, n: usize) {
        if n == 0 {
            return;
        }
        lock(&self.shared.faults).push(Fault {
            method: method.to_string(),
            code,
            message: message.to_string(),
            left: n,
        });
    }

    /// The next `n` TaskExecStdioRead streams send at most `bytes` bytes and then fail
    /// `UNAVAILABLE` (which the SDK retries, from the offset it reached).
    pub fn cut_stdio_after(&self, bytes: usize, n: usize) {
        *lock(&self.shared.cuts) = (n > 0).then_some((bytes, n));
    }

    /// End sandbox `id` behind the client's back, as Modal ending it would (its result
    /// `TERMINATED`); whether it was running.
    pub fn end_sandbox(&self, id: &str) -> bool {
        let Ok(x) = self.shared.sandbox(id) else {
            return false;
        };
        x.end(result(GenericStatus::Terminated, 137, "Sandbox ended by Modal"))
    }

    /// Every sandbox made, oldest first: its id and whether it ended.
    pub fn sandboxes(&self) -> Vec<(String, bool)> {
        let r = lock(&self.shared.records);
        let mut all: Vec<_> = r.sandboxes.values().collect();
        all.sort_by(|a, b| a.created_at.total_cmp(&b.created_at));
        all.iter().map(|x| (x.id.clone(), x.result().is_some())).collect()
    }

    /// Stop serving and end every sandbox's box.
    pub async fn shutdown(mut self) {
        self.server.stopped().await;
        self.shared.end_all().await;
        self.server.remove_dir();
    }
}

impl Drop for FakeModal {
    fn drop(&mut self) {
        self.server.halt();
        // Drop cannot await: the boxes are ended on a thread of their own.
        let shared = self.shared.clone();
        crate::server::end_on_own_runtime(async move { shared.end_all().await });
    }
}

//! A fake E2B whose sandboxes are namespace boxes of this machine
//! (`agentbox_providers::namespace`): one long-lived box per sandbox, its programs really run.
//!
//! It is what the `e2b` provider is tested against, and it is judged by E2B's own Python SDK
//! (`e2b` 2.63, in `providers/tests/e2b.rs`). E2B's API itself is `agentbox_e2b`, the same
//! code `agentbox serve --e2b` serves: this fake is that API over a backend of one key and one
//! namespace provider, with the fault switches a test sets. `docs/fakes.md` is the overview.
//!
//! Its backend: every control-plane call must show [`FakeE2BOptions::api_key`]; every
//! template is [`FakeE2BOptions::rootfs`] (or this machine's `/`, read only) whatever it names;
//! a box shares this machine's network (E2B's proxy reaches a sandbox's ports, its runner's
//! among them, on loopback) unless the sandbox has no internet or an allowlist, then it has
//! none (an allowlist cannot be kept on this machine's network: it fails closed). A v1 create
//! is secure only when it asks, as E2B's.
//!
//! The knobs of a test: [`FakeE2B::fail_next`] (the next requests of a method and path answer
//! a given status with E2B's error body), [`FakeE2B::vanish`] (a sandbox dies at once: its box
//! destroyed, its streams cut without an end, later calls 404 and 502),
//! [`FakeE2B::silence_keepalives`] (streams send nothing, keepalives included, but stay open),
//! [`FakeE2B::requests`] (never a key or token), [`FakeE2B::sandboxes`], and
//! [`FakeE2BOptions::list_page_max`] (small, to test paging).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Lifecycle, Network, Provider, SandboxId, Spec};
use agentbox_e2b::{Ask, Backend, Caller, E2b, E2bOptions, Made, Refusal};
use agentbox_providers::helper::HelperCommand;
use agentbox_providers::namespace::{NamespaceOptions, NamespaceProvider};

pub use agentbox_e2b::RecordedRequest;

/// How long making a sandbox's box may take.
const BOX_TIMEOUT: Duration = Duration::from_secs(30);

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
    /// The fault switch every request passes (see [`crate::faults`]).
    pub faults: Option<Arc<crate::faults::Faults>>,
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
            faults: None,
        }
    }
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
    e2b: Arc<E2b>,
    provider: Arc<NamespaceProvider>,
    server: crate::server::Server,
}

/// The fake's backend: one key, one namespace provider, every template one root.
struct OneKey {
    api_key: String,
    rootfs: Option<PathBuf>,
    provider: Arc<NamespaceProvider>,
}

#[async_trait::async_trait]
impl Backend for OneKey {
    async fn caller(&self, api_key: &str, _: &axum::http::Extensions) -> Result<Caller, Refusal> {
        match agentbox_e2b::http::same(api_key, &self.api_key) {
            true => Ok(Caller::new("fake", false)),
            false => Err(Refusal::new(401, "Invalid API key")),
        }
    }

    async fn make(&self, _: &Caller, ask: &Ask) -> Result<Made, Refusal> {
        let mut spec = self.spec(ask);
        let ctx = Ctx::background().with_timeout(BOX_TIMEOUT);
        // A template that names one of the fake's snapshots starts from it.
        let snapshots = Lifecycle::snapshots(self.provider.as_ref(), &ctx)
            .await
            .map_err(failed)?;
        if snapshots.iter().any(|s| s.name == ask.template) {
            spec.snapshot = Some(ask.template.clone());
        }
        let sandbox = self.provider.create(&spec, &ctx).await.map_err(failed)?;
        Ok(Made {
            provider: self.provider.clone(),
            sandbox,
        })
    }

    async fn snapshot(&self, _: &Caller, of: &Made, name: &str) -> Result<(), Refusal> {
        let ctx = Ctx::background().with_timeout(BOX_TIMEOUT);
        self.provider
            .snapshot(of.sandbox.id(), name, &ctx)
            .await
            .map_err(|e| Refusal::new(400, e.message()))?;
        Ok(())
    }

    async fn snapshots(&self, _: &Caller) -> Result<Vec<(String, Option<SandboxId>)>, Refusal> {
        let ctx = Ctx::background().with_timeout(BOX_TIMEOUT);
        let all = Lifecycle::snapshots(self.provider.as_ref(), &ctx)
            .await
            .map_err(failed)?;
        Ok(all.into_iter().map(|s| (s.name, s.from)).collect())
    }

    async fn delete_snapshot(&self, _: &Caller, name: &str) -> Result<bool, Refusal> {
        let ctx = Ctx::background().with_timeout(BOX_TIMEOUT);
        if agentbox_core::validate_name("name", name).is_err() {
            return Ok(false);
        }
        self.provider.delete_snapshot(name, &ctx).await.map_err(failed)
    }

    async fn fork(&self, _: &Caller, of: &Made, asks: &[Ask]) -> Result<Vec<Made>, Refusal> {
        let ctx = Ctx::background().with_timeout(BOX_TIMEOUT);
        let mut made = Vec::new();
        for ask in asks {
            match self.provider.fork(of.sandbox.id(), 1, &self.spec(ask), &ctx).await {
                Ok(boxes) => made.extend(boxes.into_iter().map(|sandbox| Made {
                    provider: self.provider.clone(),
                    sandbox,
                })),
                Err(e) => {
                    // A context of its own: the fork's may be what ran out.
                    let undo = Ctx::background().with_timeout(std::time::Duration::from_secs(30));
                    for m in made {
                        let _ = m.sandbox.destroy(&undo).await;
                    }
                    return Err(failed(e));
                }
            }
        }
        Ok(made)
    }
}

impl OneKey {
    /// The spec of a sandbox's box: the fake's root, this machine's network or none.
    fn spec(&self, ask: &Ask) -> Spec {
        let mut spec = Spec::new(ask.lifetime);
        spec.image = self.rootfs.as_ref().map(|r| r.to_string_lossy().into_owned());
        // Its ports are reached on this machine's loopback, so an open box shares this
        // machine's network; an allowlist cannot be kept that way, so it is no network (fail
        // closed).
        spec.network = Some(match ask.network {
            None => Network::Host,
            Some(_) => Network::None,
        });
        spec.env = ask.env.clone();
        spec
    }
}

/// The provider's failure, as E2B answers one of its own.
fn failed(e: agentbox_core::Error) -> Refusal {
    Refusal::new(500, format!("the sandbox could not be made: {}", e.message()))
}

impl FakeE2B {
    /// Listen and serve on this runtime until shut down. The runner the boxes are built by is
    /// `$AGENTBOX_RUNNER` (else beside this executable).
    pub async fn start(o: FakeE2BOptions) -> Result<FakeE2B, String> {
        if o.api_key.is_empty() {
            return Err("api_key: required".into());
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
        let provider = Arc::new(provider);
        let backend = Arc::new(OneKey {
            api_key: o.api_key.clone(),
            rootfs: o.rootfs.clone(),
            provider: provider.clone(),
        });
        let e2b = Arc::new(E2b::new(
            backend,
            E2bOptions {
                keepalive: o.keepalive,
                max_timeout: o.max_timeout,
                list_page_max: o.list_page_max,
                always_secure: false,
                domain: None,
            },
        )?);
        let app = crate::faults::wrap(e2b.router(), o.faults.as_ref());
        let server = crate::server::Server::spawn(|stopped| crate::server::serve(listener, app, stopped), tmp);
        tracing::info!(%addr, "fake E2B listening");
        Ok(FakeE2B {
            addr,
            e2b,
            provider,
            server,
        })
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
        self.e2b.requests()
    }

    /// The next `n` requests of `method` (`*`: any) whose path starts with `path_prefix`
    /// answer `status` with E2B's error body. See [`E2b::fail_next`].
    pub fn fail_next(&self, method: &str, path_prefix: &str, status: u16, message: &str, n: usize) {
        self.e2b.fail_next(method, path_prefix, status, message, n);
    }

    /// Sandbox `id` dies at once. See [`E2b::vanish`]. Whether it was there.
    pub fn vanish(&self, id: &str) -> bool {
        self.e2b.vanish(id)
    }

    /// While `on`, every process stream sends nothing but stays open. See
    /// [`E2b::silence_keepalives`].
    pub fn silence_keepalives(&self, on: bool) {
        self.e2b.silence_keepalives(on);
    }

    /// Every sandbox there is, oldest first: its id and state (`running` or `paused`).
    pub fn sandboxes(&self) -> Vec<(String, String)> {
        self.e2b.sandboxes()
    }

    /// Stop serving and end every sandbox's box.
    pub async fn shutdown(mut self) {
        self.server.stopped().await;
        end_all(&self.e2b, &self.provider).await;
        self.server.remove_dir();
    }
}

impl Drop for FakeE2B {
    fn drop(&mut self) {
        self.server.halt();
        // Drop cannot await: the boxes are ended on a thread of their own.
        let (e2b, provider) = (self.e2b.clone(), self.provider.clone());
        crate::server::end_on_own_runtime(async move { end_all(&e2b, &provider).await });
    }
}

/// End every sandbox's box, and any box of the fake's provider left.
async fn end_all(e2b: &E2b, provider: &NamespaceProvider) {
    e2b.end_all().await;
    let ctx = Ctx::background().with_timeout(Duration::from_secs(10));
    if let Ok(left) = provider.list(&Default::default(), &ctx).await {
        for b in left {
            let _ = b.destroy(&ctx).await;
        }
    }
}

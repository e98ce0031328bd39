//! `agentbox mcp`: the tools of the hands (pi's seven: read, bash, edit, write, grep, find,
//! ls; then process_read, process_write, process_kill and process_list, which
//! `--no-process-tools` leaves out; see docs/tools.md) for any MCP client, running in a box
//! made at the first tool call and ended when the client leaves (or by its lifetime, if this
//! server is killed); with `--pool N` (or the config's `pool`), that box comes from N ready
//! ones kept warm. Protocol 2025-11-25
//! through rmcp, over stdio: stdout carries only protocol messages; everything else goes to
//! stderr.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Error, Labels, Result, Spec, parse_duration};
use agentbox_hands::tools;
use agentbox_hands::{BoxEnv, ExecutionEnv};
use agentbox_server::mcp::{McpHands, served};
use agentbox_sync::{Mark, PullOptions, SeedOptions, pull_dir, seed_dir};
use agentbox_transport::{
    Environment as TransportEnvironment, Hands as HandsConfig, MemoryDocuments, Prepare, Scope, Transport,
    TransportConfig, TransportHost,
};
use clap::Args;
use rmcp::ServiceExt;

#[derive(Args)]
pub(crate) struct McpArgs {
    /// The provider of the box (without it, the default: see `boxes::default_provider`).
    #[arg(long, help = crate::boxes::default_help("The provider of the box"))]
    provider: Option<String>,
    /// The box's image (providers that take one).
    #[arg(long)]
    image: Option<String>,
    /// How long the box may live, whatever happens to this server (500ms, 90s, 10m, 6h).
    #[arg(long, default_value = "1h")]
    lifetime: String,
    /// A transport config: the box is its default environment's (provider and spec).
    #[arg(long, conflicts_with_all = ["provider", "image"])]
    config: Option<PathBuf>,
    /// A directory seeded into the box's workspace at the first tool call and pulled back when
    /// the client leaves: your files come back changed, and nothing else does.
    #[arg(long)]
    workspace: Option<PathBuf>,
    /// Serve the streamable HTTP transport on this loopback address (127.0.0.1:PORT) instead of
    /// stdio: each MCP session gets its box, ended with the session. Requests whose Host is not
    /// loopback are refused.
    #[arg(long, value_name = "ADDR")]
    http: Option<std::net::SocketAddr>,
    /// No in-box runner: each tool's file operation or command is then a process of its own in
    /// the box (without it, a runner in the box serves them all over one connection).
    #[arg(long)]
    no_runner: bool,
    /// Keep this many ready boxes of the spec warm (0 to 64), so a session's first tool call
    /// takes one at once instead of waiting for a box to start (over --http, each new
    /// session). Ready boxes not handed out end when the server does, or by their two-minute
    /// idle lifetime if it is killed. With --config, in place of the environment's `pool`.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=64))]
    pool: Option<u8>,
    /// List pi's seven tools alone, as pi has them: no process_read, process_write,
    /// process_kill or process_list, and bash without `background` (for clients that expect
    /// exactly pi's tools).
    #[arg(long)]
    no_process_tools: bool,
    /// A credential the box uses without holding it (repeat it), as `box create --secret`:
    /// NAME=env:VARIABLE@host or NAME=file:/path@host. With --config, added to the
    /// environment's own `secrets`.
    #[arg(long = "secret", value_name = "NAME=env:VAR@HOST")]
    secrets: Vec<String>,
}

/// An MCP session's conversation on the transport, whose box the transport makes at the
/// first tool call. Over HTTP, a session that ends (dropped by rmcp) ends its box; over stdio
/// the server ends it itself, after pulling the workspace back.
struct Conversation {
    transport: Arc<Transport>,
    name: String,
    end_on_drop: bool,
}

impl Drop for Conversation {
    fn drop(&mut self) {
        if !self.end_on_drop {
            return;
        }
        let (transport, name) = (self.transport.clone(), std::mem::take(&mut self.name));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
                match transport.end(&name, &ctx).await {
                    Ok(ended) => ended
                        .iter()
                        .for_each(|id| eprintln!("agentbox mcp: ended box {id} with its session")),
                    Err(e) => eprintln!("agentbox mcp: ending the box of session {name}: {e}"),
                }
            });
        }
    }
}

/// The directory `--workspace` names, seeded into each box made and pulled back from the last.
struct Workspace {
    dir: PathBuf,
    /// What the box was seeded with: the pull brings back only what changed since.
    mark: std::sync::Mutex<Option<Mark>>,
}

impl Workspace {
    async fn seed(&self, env: &BoxEnv, ctx: &Ctx) -> Result<()> {
        let to = env.cwd();
        let options = SeedOptions {
            from: self.dir.clone(),
            to: to.clone(),
            ..Default::default()
        };
        let seeded = seed_dir(env.sandbox().as_ref(), &options, ctx)
            .await
            .and_then(|s| s.whole())
            .map_err(|e| e.context(format!("seeding {}", self.dir.display())))?;
        eprintln!(
            "agentbox mcp: seeded {} entries of {} into {to}",
            seeded.sent,
            self.dir.display()
        );
        *self.mark.lock().unwrap() = Some(seeded.mark);
        Ok(())
    }

    /// Bring back into the directory what changed in the box since it was seeded.
    async fn pull(&self, env: &BoxEnv, ctx: &Ctx) -> Result<()> {
        let options = PullOptions {
            from: env.cwd(),
            to: self.dir.clone(),
            since: self.mark.lock().unwrap().clone(),
            mirror_deletes: true,
            if_unchanged: true,
            ..Default::default()
        };
        let p = pull_dir(env.sandbox().as_ref(), &options, ctx)
            .await
            .map_err(|e| e.context(format!("pulling back into {}", self.dir.display())))?;
        eprintln!(
            "agentbox mcp: pulled {} paths ({} bytes) back into {}",
            p.fetched,
            p.bytes,
            self.dir.display()
        );
        *self.mark.lock().unwrap() = Some(p.mark);
        if !p.host_changed.is_empty() {
            eprintln!(
                "agentbox mcp: kept the host's copy of {} changed since the seed: {}",
                p.host_changed.len(),
                p.host_changed.join(", ")
            );
        }
        if !p.copy_failed.is_empty() {
            let why = p.receipt.stopped.map(|s| s.message).unwrap_or_default();
            return Err(Error::transfer_failed(format!(
                "{} paths were not brought back into {} ({}): {why}",
                p.copy_failed.len(),
                self.dir.display(),
                p.copy_failed.join(", ")
            )));
        }
        Ok(())
    }
}

/// What the transport calls for each box it makes: say so, and seed the workspace if there
/// is one.
fn prepare(workspace: Option<Arc<Workspace>>, lifetime: Duration) -> Prepare {
    Arc::new(move |env: Arc<BoxEnv>, ctx: Ctx| {
        let workspace = workspace.clone();
        Box::pin(async move {
            eprintln!("agentbox mcp: made box {} (lifetime {lifetime:?})", env.sandbox().id());
            match workspace {
                Some(w) => w.seed(&env, &ctx).await,
                None => Ok(()),
            }
        })
    })
}

/// The hands of a conversation: the server's MCP handler over the conversation's environment,
/// keeping the conversation (and, over HTTP, its box) as long as the session lives.
fn hands(conversation: Conversation, tools: Arc<Vec<Box<dyn tools::Tool>>>) -> McpHands {
    let env = conversation
        .transport
        .env(&conversation.name)
        .expect("the MCP server's transport config names its hands");
    McpHands::new(env, tools).keeping(Arc::new(conversation))
}

pub(crate) async fn run(a: McpArgs) -> Result<i32> {
    let mut config = config(&a)?;
    let lifetime = the_box(&mut config).spec.max_lifetime;
    let workspace = match &a.workspace {
        Some(dir) if !dir.is_dir() => {
            return Err(Error::not_found(format!(
                "--workspace {}: not a directory",
                dir.display()
            )));
        }
        Some(_) if a.http.is_some() => {
            return Err(Error::unsupported(
                "--workspace: over --http, sessions come and go: use stdio",
            ));
        }
        Some(dir) => Some(Arc::new(Workspace {
            dir: dir.clone(),
            mark: Default::default(),
        })),
        None => None,
    };
    let environment = crate::boxes::environment()?;
    if the_box(&mut config).provider.is_empty() {
        // No --provider and no --config: the default provider, chosen here (it may say why).
        let chosen = crate::boxes::chosen(None, &environment).await?;
        the_box(&mut config).provider = chosen.name.to_string();
    }
    let options = agentbox_providers::registry::Options {
        runner: !a.no_runner,
        ..Default::default()
    };
    let providers = config
        .registry_providers(&options, &environment)
        .await
        .map_err(|e| match &a.config {
            Some(path) => e.context(path.display()),
            None => e,
        })?;
    let pool = the_box(&mut config).pool;
    let host = TransportHost {
        providers,
        documents: Arc::new(MemoryDocuments::default()),
        session: format!("mcp-{}", std::process::id()),
        labels: Labels::from([("agentbox-mcp".to_string(), std::process::id().to_string())]),
        on_lost: None,
        prepare: Some(prepare(workspace.clone(), lifetime)),
    };
    let transport = Arc::new(Transport::new(config, host)?);
    if pool > 0 {
        eprintln!("agentbox mcp: keeping {pool} ready boxes warm");
        let filling = transport.clone();
        tokio::spawn(async move {
            let ctx = Ctx::background().with_timeout(Duration::from_secs(600));
            match filling.warm(&ctx).await {
                Ok(()) => eprintln!("agentbox mcp: the pool is warm ({pool} ready boxes)"),
                Err(e) => eprintln!("agentbox mcp: the pool is not warm: {e}"),
            }
        });
    }
    let served = served(a.no_process_tools);
    let r = match a.http {
        Some(addr) => http(addr, transport.clone(), served).await,
        None => stdio(&transport, workspace.as_deref(), served).await,
    };
    close_pools(&transport).await;
    r
}

/// The one environment the server's transport declares.
fn the_box(config: &mut TransportConfig) -> &mut TransportEnvironment {
    config
        .environments
        .values_mut()
        .next()
        .expect("the MCP server's transport config declares its environment")
}

/// The transport config of the server's boxes: one environment, the default hands of
/// `--config` or `box` from the flags (its provider left empty when the default is to be
/// chosen), each MCP session a conversation of its own.
fn config(a: &McpArgs) -> Result<TransportConfig> {
    let (name, environment) = match &a.config {
        Some(path) => {
            let config = TransportConfig::load(path)?;
            let hands = config
                .hands
                .as_ref()
                .ok_or_else(|| Error::invalid(format!("{}: names no hands", path.display())))?;
            (hands.default.clone(), config.environments[&hands.default].clone())
        }
        None => {
            let lifetime = parse_duration(&a.lifetime).map_err(|e| e.context("--lifetime"))?;
            let mut spec = Spec::new(lifetime);
            spec.image = a.image.clone();
            let environment = TransportEnvironment {
                provider: a.provider.clone().unwrap_or_default(),
                spec,
                pool: 0,
            };
            ("box".to_string(), environment)
        }
    };
    let mut environment = TransportEnvironment {
        pool: a.pool.map_or(environment.pool, usize::from),
        ..environment
    };
    for flag in &a.secrets {
        environment
            .spec
            .secrets
            .push(agentbox_core::SecretSpec::parse_flag(flag)?);
    }
    environment.spec.validate()?;
    if let Some(name) = a.provider.as_deref() {
        crate::boxes::entry(name, "--provider")?;
    }
    Ok(TransportConfig {
        environments: BTreeMap::from([(name.clone(), environment)]),
        hands: Some(HandsConfig {
            default: name,
            roles: BTreeMap::new(),
        }),
        scope: Scope::Conversation,
    })
}

/// One MCP session over stdio; when the client leaves, the workspace comes back and the box
/// ends.
async fn stdio(
    transport: &Arc<Transport>,
    workspace: Option<&Workspace>,
    tools: Arc<Vec<Box<dyn tools::Tool>>>,
) -> Result<i32> {
    const NAME: &str = "stdio";
    let conversation = Conversation {
        transport: transport.clone(),
        name: NAME.to_string(),
        end_on_drop: false,
    };
    let served = hands(conversation, tools)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| Error::unknown(format!("mcp: the client did not initialize: {e}")))?;
    if let Err(e) = served.waiting().await {
        eprintln!("agentbox mcp: the session ended: {e}");
    }
    // The client left: its workspace comes back, and its box goes with what it ran.
    let ctx = Ctx::background().with_timeout(Duration::from_secs(300));
    let pulled = match (workspace, transport.opened(NAME)) {
        (Some(w), Some(env)) => w.pull(&env, &ctx).await,
        _ => Ok(()),
    };
    for id in transport.end(NAME, &ctx).await? {
        eprintln!("agentbox mcp: ended box {id}");
    }
    pulled?;
    Ok(0)
}

/// Destroy the pools' ready boxes (what is left of them after a minute ends by its idle
/// lifetime).
async fn close_pools(transport: &Transport) {
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    if let Err(e) = transport.close_pools(&ctx).await {
        eprintln!("agentbox mcp: ending the pool's ready boxes: {e}");
    }
}

/// The streamable HTTP transport on a loopback address, with rmcp's Host checks (localhost,
/// 127.0.0.1, ::1) kept: a page in a browser cannot reach it by DNS rebinding.
async fn http(
    addr: std::net::SocketAddr,
    transport: Arc<Transport>,
    tools: Arc<Vec<Box<dyn tools::Tool>>>,
) -> Result<i32> {
    use rmcp::transport::streamable_http_server::session::SessionManager;
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
    if !addr.ip().is_loopback() {
        return Err(Error::invalid(format!(
            "--http {addr}: only a loopback address (127.0.0.1:PORT) is served"
        )));
    }
    let sessions = Arc::new(LocalSessionManager::default());
    let count = std::sync::atomic::AtomicU64::new(0);
    let service = StreamableHttpService::new(
        move || {
            let n = count.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            let conversation = Conversation {
                transport: transport.clone(),
                name: format!("http-{n}"),
                end_on_drop: true,
            };
            Ok(hands(conversation, tools.clone()))
        },
        sessions.clone(),
        StreamableHttpServerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::io(e, format!("--http {addr}")))?;
    eprintln!(
        "agentbox mcp: serving MCP at http://{}/",
        listener.local_addr().map_err(|e| Error::io(e, "the bound address"))?
    );
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => r.map_err(|e| Error::io(e, "accepting"))?,
            _ = tokio::signal::ctrl_c() => return Ok(0),
        };
        let (service, sessions) = (service.clone(), sessions.clone());
        // rmcp answers every DELETE of a session with 202 Accepted; the MCP SDKs expect 200 or
        // 204 (the Python SDK logs "Session termination failed: 202"), and the protocol wants
        // 404 for a session it does not know. rmcp has closed the session by then (and checked
        // the Host), so a 202 becomes 200, or 404 when there was no such session.
        let svc = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let (service, sessions) = (service.clone(), sessions.clone());
            async move {
                let delete = request.method() == hyper::Method::DELETE;
                let known = match request.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()) {
                    Some(id) if delete => sessions.has_session(&id.into()).await.unwrap_or(false),
                    _ => false,
                };
                let mut response = service.handle(request).await;
                if delete && response.status() == hyper::StatusCode::ACCEPTED {
                    *response.status_mut() = if known {
                        hyper::StatusCode::OK
                    } else {
                        hyper::StatusCode::NOT_FOUND
                    };
                }
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(io, svc)
                .await;
        });
    }
}

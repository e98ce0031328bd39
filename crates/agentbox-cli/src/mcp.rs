//! `agentbox mcp`: the tools of the hands (pi's seven: read, bash, edit, write, grep, find,
//! ls; then process_read, process_write, process_kill and process_list, which
//! `--no-process-tools` leaves out; see docs/tools.md) for any MCP client, running in a box
//! made at the first tool call and ended when the client leaves (or by its lifetime, if this
//! server is killed); with `--pool N` (or the config's `pool`), that box comes from N ready
//! ones kept warm. Protocol 2025-11-25
//! through rmcp, over stdio: stdout carries only protocol messages; everything else goes to
//! stderr.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Error, Provider, Result, Sandbox, Spec, parse_duration};
use agentbox_hands::tools::{self, Content};
use agentbox_hands::{BoxEnv, ExecutionEnv};
use agentbox_providers::pool::{Pool, PoolOptions};
use agentbox_sync::{Mark, PullOptions, SeedOptions, pull_dir, seed_dir};
use clap::Args;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, ListToolsResult,
    PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use tokio::sync::Mutex;

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
}

/// The box of a session, made at the first tool call; a session dropped with its box still
/// open (an HTTP session that ended) ends it.
struct Session {
    provider: Arc<dyn Provider>,
    spec: Spec,
    workspace: Option<PathBuf>,
    open: Mutex<Option<Open>>,
}

struct Open {
    sandbox: Arc<dyn Sandbox>,
    env: Arc<BoxEnv>,
    mark: Option<Mark>,
    box_dir: String,
}

impl Session {
    async fn env(&self) -> Result<Arc<BoxEnv>> {
        let mut open = self.open.lock().await;
        if let Some(o) = open.as_ref() {
            return Ok(o.env.clone());
        }
        let ctx = Ctx::background().with_timeout(Duration::from_secs(300));
        let sandbox = self.provider.create(&self.spec, &ctx).await?;
        eprintln!(
            "agentbox mcp: made box {} (lifetime {:?})",
            sandbox.id(),
            self.spec.max_lifetime
        );
        let env = Arc::new(BoxEnv::new(sandbox.clone()));
        let box_dir = env.cwd();
        let mut mark = None;
        if let Some(dir) = &self.workspace {
            let seeded = seed_dir(
                sandbox.as_ref(),
                &SeedOptions {
                    from: dir.clone(),
                    to: box_dir.clone(),
                    ..Default::default()
                },
                &ctx,
            )
            .await;
            match seeded {
                Ok(s) => {
                    eprintln!(
                        "agentbox mcp: seeded {} entries of {} into {box_dir}",
                        s.sent,
                        dir.display()
                    );
                    mark = Some(s.mark);
                }
                Err(e) => {
                    let _ = sandbox.destroy(&ctx).await;
                    return Err(e.context(format!("seeding {}", dir.display())));
                }
            }
        }
        *open = Some(Open {
            sandbox,
            env: env.clone(),
            mark,
            box_dir,
        });
        Ok(env)
    }

    /// Pull the workspace back (when one was given) and end the box.
    async fn end(&self) -> Result<()> {
        let Some(o) = self.open.lock().await.take() else {
            return Ok(());
        };
        let ctx = Ctx::background().with_timeout(Duration::from_secs(300));
        let mut result = Ok(());
        if let Some(dir) = &self.workspace {
            let pulled = pull_dir(
                o.sandbox.as_ref(),
                &PullOptions {
                    from: o.box_dir.clone(),
                    to: dir.clone(),
                    since: o.mark.clone(),
                    mirror_deletes: true,
                    if_unchanged: true,
                    ..Default::default()
                },
                &ctx,
            )
            .await;
            match pulled {
                Ok(p) => eprintln!(
                    "agentbox mcp: pulled {} paths ({} bytes) back into {}",
                    p.fetched,
                    p.bytes,
                    dir.display()
                ),
                Err(e) => result = Err(e.context(format!("pulling back into {}", dir.display()))),
            }
        }
        o.sandbox.destroy(&ctx).await?;
        eprintln!("agentbox mcp: ended box {}", o.sandbox.id());
        result
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let Some(o) = self.open.get_mut().take() else { return };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
                match o.sandbox.destroy(&ctx).await {
                    Ok(()) => eprintln!("agentbox mcp: ended box {} with its session", o.sandbox.id()),
                    Err(e) => eprintln!("agentbox mcp: ending box {}: {e}", o.sandbox.id()),
                }
            });
        }
    }
}

#[derive(Clone)]
struct Hands {
    session: Arc<Session>,
    tools: Arc<Vec<Box<dyn tools::Tool>>>,
}

/// The tools served: every tool of the hands, or pi's seven alone.
fn served(no_process_tools: bool) -> Arc<Vec<Box<dyn tools::Tool>>> {
    Arc::new(if no_process_tools { tools::seven() } else { tools::all() })
}

/// Each tool served as MCP lists it: the schema derived from its argument struct, and its
/// hints.
fn listed(served: &[Box<dyn tools::Tool>]) -> Vec<Tool> {
    served
        .iter()
        .map(|t| {
            let schema = match t.schema() {
                serde_json::Value::Object(m) => m,
                _ => serde_json::Map::new(),
            };
            let read_only = t.read_only();
            let mut hints = ToolAnnotations::new();
            hints.read_only_hint = Some(read_only);
            // bash may do anything; write and edit replace what was there.
            hints.destructive_hint = Some(!read_only);
            hints.open_world_hint = Some(t.name() == "bash");
            Tool::new(t.name(), t.description(), Arc::new(schema)).with_annotations(hints)
        })
        .collect()
}

impl ServerHandler for Hands {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.protocol_version = ProtocolVersion::V_2025_11_25;
        info.server_info = Implementation::new("agentbox", env!("CARGO_PKG_VERSION"));
        let mut instructions =
            "Tools that read, write, edit, search and run commands in a sandbox box (not this machine). \
             The box is made at the first tool call and ends when this session does."
                .to_string();
        if self.tools.iter().any(|t| t.name() == "process_read") {
            instructions.push_str(
                " bash with background: true starts a command that keeps running (a server, a watcher, a long build) \
                 and answers its handle; process_read reads its output, process_write its stdin, \
                 process_kill stops it, process_list lists them.",
            );
        }
        info.instructions = Some(instructions);
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(listed(&self.tools)))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResponse, ErrorData> {
        self.call(request, context).await.map(CallToolResponse::from)
    }
}

impl Hands {
    /// One tool call, answered as the model reads it (a tool's failure is a result with
    /// `isError`, never a protocol error).
    async fn call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResult, ErrorData> {
        let name = request.name.to_string();
        let Some(tool) = self.tools.iter().find(|t| t.name() == name) else {
            let names: Vec<&str> = self.tools.iter().map(|t| t.name()).collect();
            return Err(ErrorData::invalid_params(
                format!("unknown tool {name:?} ({})", names.join(", ")),
                None,
            ));
        };
        let args = serde_json::Value::Object(request.arguments.unwrap_or_default());
        let env = match self.session.env().await {
            Ok(e) => e,
            Err(e) => {
                return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                    "No box to run in: {e}"
                ))]));
            }
        };
        // A client's cancellation ends the call (and the command it ran).
        let ctx = Ctx::background();
        let cancel = ctx.clone();
        let ct = context.ct.clone();
        let watch = tokio::spawn(async move {
            ct.cancelled().await;
            cancel.cancel();
        });
        let r = tools::run(&**tool, &*env, args, &ctx).await;
        watch.abort();
        let content = r
            .content
            .iter()
            .map(|c| match c {
                Content::Text { text } => ContentBlock::text(text.clone()),
                Content::Image { data, mime_type } => ContentBlock::image(data.clone(), mime_type.clone()),
            })
            .collect();
        Ok(if r.is_error {
            CallToolResult::error(content)
        } else {
            CallToolResult::success(content)
        })
    }
}

pub(crate) async fn run(a: McpArgs) -> Result<i32> {
    let environment = crate::boxes::environment()?;
    let (entry, spec, pool) = match &a.config {
        Some(path) => {
            let config = agentbox_transport::TransportConfig::load(path)?;
            let hands = config
                .hands
                .as_ref()
                .ok_or_else(|| Error::invalid(format!("{}: names no hands", path.display())))?;
            let env = &config.environments[&hands.default];
            let at = format!(
                "{}: transport config: environments.{}.provider",
                path.display(),
                hands.default
            );
            (crate::boxes::entry(&env.provider, &at)?, env.spec.clone(), env.pool)
        }
        None => {
            let lifetime = parse_duration(&a.lifetime).map_err(|e| e.context("--lifetime"))?;
            let mut spec = Spec::new(lifetime);
            spec.image = a.image.clone();
            (
                crate::boxes::chosen(a.provider.as_deref(), &environment).await?,
                spec,
                0,
            )
        }
    };
    let pool = a.pool.map_or(pool, usize::from);
    spec.validate()?;
    if let Some(dir) = &a.workspace
        && !dir.is_dir()
    {
        return Err(Error::not_found(format!(
            "--workspace {}: not a directory",
            dir.display()
        )));
    }
    let options = agentbox_providers::registry::Options {
        runner: !a.no_runner,
        ..Default::default()
    };
    let mut provider = entry.make(&options, &environment).await?;
    let spec = spec.label("agentbox-mcp", std::process::id().to_string());
    let mut warm = None;
    if pool > 0 {
        let opts = PoolOptions {
            size: pool,
            ..Default::default()
        };
        let p = Arc::new(Pool::new(provider, spec.clone(), opts).map_err(|e| e.context("--pool"))?);
        eprintln!("agentbox mcp: keeping {pool} ready boxes warm (pool {})", p.id());
        let filling = p.clone();
        tokio::spawn(async move {
            let ctx = Ctx::background().with_timeout(Duration::from_secs(600));
            match filling.warm(&ctx).await {
                Ok(()) => eprintln!("agentbox mcp: the pool is warm ({pool} ready boxes)"),
                Err(e) => eprintln!("agentbox mcp: the pool is not warm: {e}"),
            }
        });
        provider = p.clone();
        warm = Some(p);
    }
    if let Some(addr) = a.http {
        if a.workspace.is_some() {
            return Err(Error::unsupported(
                "--workspace: over --http, sessions come and go: use stdio",
            ));
        }
        let r = http(addr, provider, spec, served(a.no_process_tools)).await;
        close_pool(warm).await;
        return r;
    }
    let session = Arc::new(Session {
        provider,
        spec,
        workspace: a.workspace.clone(),
        open: Mutex::new(None),
    });
    let hands = Hands {
        session: session.clone(),
        tools: served(a.no_process_tools),
    };
    let served = hands
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| Error::unknown(format!("mcp: the client did not initialize: {e}")))?;
    let waited = served.waiting().await;
    if let Err(e) = &waited {
        eprintln!("agentbox mcp: the session ended: {e}");
    }
    // The client left: its box goes, with what it ran, and the ready boxes with it.
    let ended = session.end().await;
    close_pool(warm).await;
    ended?;
    Ok(0)
}

/// Destroy the pool's ready boxes (what is left of them after a minute ends by its idle
/// lifetime).
async fn close_pool(pool: Option<Arc<Pool>>) {
    let Some(pool) = pool else { return };
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    match pool.close(&ctx).await {
        Ok(()) => eprintln!("agentbox mcp: ended the pool's ready boxes"),
        Err(e) => eprintln!("agentbox mcp: ending the pool's ready boxes: {e}"),
    }
}

/// The streamable HTTP transport on a loopback address, with rmcp's Host checks (localhost,
/// 127.0.0.1, ::1) kept: a page in a browser cannot reach it by DNS rebinding.
async fn http(
    addr: std::net::SocketAddr,
    provider: Arc<dyn Provider>,
    spec: Spec,
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
    let service = StreamableHttpService::new(
        move || {
            Ok(Hands {
                session: Arc::new(Session {
                    provider: provider.clone(),
                    spec: spec.clone(),
                    workspace: None,
                    open: Mutex::new(None),
                }),
                tools: tools.clone(),
            })
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

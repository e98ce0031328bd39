//! The hands' tools over MCP (rmcp's server): [`McpHands`] serves pi's seven tools and the
//! process tools on one environment, for `agentbox mcp` and for the service's MCP routes.
//!
//! The service serves MCP's streamable HTTP transport under the same keys and ownership as
//! its API ([`routes`]): at `/mcp`, each session gets a box of its own from the server's default
//! provider, made at its first tool call, owned by the key and ended with the session; at
//! `/v1/boxes/{id}/mcp`, each session's tools run in a box the key already owns. A session is
//! its key's: another key's requests naming it answer 404.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use agentbox_core::{Ctx, ErrorCode, Labels, Spec};
use agentbox_hands::tools::{self, Content};
use agentbox_hands::{BoxEnv, ExecutionEnv};
use agentbox_transport::{
    Environment as TransportEnvironment, Hands as HandsConfig, MemoryDocuments, Prepare, Scope, Transport,
    TransportConfig, TransportHost,
};
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use rmcp::ErrorData;
use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, ListToolsResult,
    PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::api::boxes::{BoxPath, may_use, reach, room_for};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::keys::KeyInfo;
use crate::state::{AppState, OWNER_LABEL};

/// The hands' tools on one environment, as an MCP server. See the [module documentation](self).
#[derive(Clone)]
pub struct McpHands {
    env: Arc<dyn ExecutionEnv>,
    tools: Arc<Vec<Box<dyn tools::Tool>>>,
    /// Held for its drop: whatever must live as long as the session (and end with it).
    _keep: Option<Arc<dyn Any + Send + Sync>>,
}

impl McpHands {
    /// `tools` (see [`served`]) running on `env`.
    ///
    /// ```no_run
    /// # fn f(b: std::sync::Arc<dyn agentbox_core::Sandbox>) {
    /// let env = std::sync::Arc::new(agentbox_hands::BoxEnv::new(b));
    /// let hands = agentbox_server::mcp::McpHands::new(env, agentbox_server::mcp::served(false));
    /// # }
    /// ```
    pub fn new(env: Arc<dyn ExecutionEnv>, tools: Arc<Vec<Box<dyn tools::Tool>>>) -> Self {
        McpHands {
            env,
            tools,
            _keep: None,
        }
    }

    /// The same hands, keeping `what` alive as long as any clone of them (a session's box,
    /// ended when the last clone drops).
    pub fn keeping(mut self, what: Arc<dyn Any + Send + Sync>) -> Self {
        self._keep = Some(what);
        self
    }
}

/// The tools served: every tool of the hands, or pi's seven alone.
pub fn served(no_process_tools: bool) -> Arc<Vec<Box<dyn tools::Tool>>> {
    Arc::new(if no_process_tools { tools::seven() } else { tools::all() })
}

/// Each tool served as MCP lists it: the schema derived from its argument struct, and its
/// hints.
pub fn listed(served: &[Box<dyn tools::Tool>]) -> Vec<Tool> {
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

impl ServerHandler for McpHands {
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

impl McpHands {
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
        // A client's cancellation ends the call (and the command it ran); an hour ends any.
        let ctx = Ctx::background().with_timeout(TOOL_DEADLINE);
        let cancel = ctx.clone();
        let ct = context.ct.clone();
        let watch = tokio::spawn(async move {
            ct.cancelled().await;
            cancel.cancel();
        });
        let r = tools::run(&**tool, &*self.env, args, &ctx).await;
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

/// The service's MCP sessions: rmcp's session manager, and which key each session is.
#[derive(Default)]
pub(crate) struct Sessions {
    manager: Arc<LocalSessionManager>,
    owners: std::sync::Mutex<HashMap<String, String>>,
    /// The transport of each key that opened a session at `/mcp` (its boxes labelled its own).
    transports: tokio::sync::Mutex<HashMap<String, Arc<Transport>>>,
    count: AtomicU64,
}

/// The most sessions remembered before those rmcp no longer has are forgotten.
const MAX_REMEMBERED: usize = 10_000;

/// How long one tool call may take (a tool's own timeout, `bash`'s say, is shorter).
const TOOL_DEADLINE: Duration = Duration::from_secs(3600);

/// How long a session's box may live at most (less where the key says less).
const SESSION_LIFETIME: Duration = Duration::from_secs(3600);

/// A conversation of a key's transport, its box ended when the session drops it.
struct Conversation {
    transport: Arc<Transport>,
    name: String,
}

impl Drop for Conversation {
    fn drop(&mut self) {
        let (transport, name) = (self.transport.clone(), std::mem::take(&mut self.name));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
                match transport.end(&name, &ctx).await {
                    Ok(ended) => ended
                        .iter()
                        .for_each(|id| tracing::info!(box_id = %id, session = %name, "MCP session's box ended")),
                    Err(e) => tracing::warn!(session = %name, "ending an MCP session's box: {e}"),
                }
            });
        }
    }
}

fn config() -> StreamableHttpServerConfig {
    // The key, not the Host, says who may call: the server may be reached by any name.
    StreamableHttpServerConfig::default().disable_allowed_hosts()
}

/// `key`'s transport for `/mcp` sessions: one environment, the server's default provider, a
/// lifetime within the key's, every box labelled the key's and counted against its most
/// before any tool runs in it.
async fn transport_of(state: &Arc<AppState>, key: &KeyInfo) -> Result<Arc<Transport>, ApiError> {
    let sessions = &state.mcp;
    let mut held = sessions.transports.lock().await;
    if let Some(t) = held.get(&key.id) {
        return Ok(t.clone());
    }
    let provider_name = state.default_provider.clone();
    may_use(key, &provider_name)?;
    let provider = state.provider(&provider_name).await?;
    let lifetime = key
        .limits
        .max_lifetime
        .map_or(SESSION_LIFETIME, |most| most.min(SESSION_LIFETIME));
    let config = TransportConfig {
        environments: BTreeMap::from([(
            "box".to_string(),
            TransportEnvironment {
                provider: provider_name.clone(),
                spec: Spec::new(lifetime),
                pool: 0,
            },
        )]),
        hands: Some(HandsConfig {
            default: "box".into(),
            roles: BTreeMap::new(),
        }),
        scope: Scope::Conversation,
    };
    let (counting, key_for) = (state.clone(), key.clone());
    let prepare: Prepare = Arc::new(move |env: Arc<BoxEnv>, _ctx: Ctx| {
        let (state, key) = (counting.clone(), key_for.clone());
        Box::pin(async move {
            // Made before it could be counted: one past the key's most is refused (and the
            // transport ends it).
            let _counted = state.key_lock(&key.id).await;
            room_for(&state, &key, 0, |_| false)
                .await
                .map_err(|e| agentbox_core::Error::new(e.code(), e.message().to_string()))?;
            tracing::info!(box_id = %env.sandbox().id(), key = %key.name, "MCP session's box made");
            Ok(())
        })
    });
    let host = TransportHost {
        providers: BTreeMap::from([(provider_name, provider)]),
        documents: Arc::new(MemoryDocuments::default()),
        session: format!("serve-mcp-{}", key.id),
        labels: Labels::from([(OWNER_LABEL.to_string(), key.id.clone())]),
        on_lost: None,
        prepare: Some(prepare),
    };
    let t = Arc::new(Transport::new(config, host)?);
    held.insert(key.id.clone(), t.clone());
    Ok(t)
}

/// Answer one MCP request with `hands` made for each new session, the session checked to be
/// `key`'s.
async fn answer(
    state: &AppState,
    key: &KeyInfo,
    request: Request,
    hands: impl Fn() -> McpHands + Send + Sync + 'static,
) -> Result<Response, ApiError> {
    let sessions = &state.mcp;
    let named = request
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let Some(id) = &named {
        let owner = sessions
            .owners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned();
        if owner.as_deref() != Some(key.id.as_str()) {
            return Err(ApiError::new(ErrorCode::NotFound, "mcp-session-id: no such session"));
        }
    }
    let delete = request.method() == axum::http::Method::DELETE;
    let known = match &named {
        Some(id) if delete => sessions.manager.has_session(&id.as_str().into()).await.unwrap_or(false),
        _ => false,
    };
    let service = StreamableHttpService::new(move || Ok(hands()), sessions.manager.clone(), config());
    let mut response = service.handle(request).await;
    // rmcp answers a DELETE of a session 202; the SDKs expect 200, and 404 for one unknown.
    if delete && response.status() == axum::http::StatusCode::ACCEPTED {
        *response.status_mut() = if known {
            axum::http::StatusCode::OK
        } else {
            axum::http::StatusCode::NOT_FOUND
        };
    }
    let remembered = {
        let mut owners = sessions.owners.lock().unwrap_or_else(|p| p.into_inner());
        if delete && let Some(id) = &named {
            owners.remove(id);
        }
        if let Some(id) = response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok())
            && named.is_none()
        {
            owners.insert(id.to_string(), key.id.clone());
            tracing::info!(session = id, key = %key.name, "MCP session opened");
        }
        (owners.len() > MAX_REMEMBERED).then(|| owners.keys().cloned().collect::<Vec<_>>())
    };
    if let Some(ids) = remembered {
        // Sessions rmcp let go of (their clients gone without a DELETE) are forgotten here.
        let mut gone = Vec::new();
        for id in ids {
            if !sessions.manager.has_session(&id.as_str().into()).await.unwrap_or(false) {
                gone.push(id);
            }
        }
        let mut owners = sessions.owners.lock().unwrap_or_else(|p| p.into_inner());
        for id in &gone {
            owners.remove(id);
        }
    }
    Ok(response.map(Body::new).into_response())
}

/// `/mcp`: each session a box of its own, made at its first tool call, ended with the session.
pub(crate) async fn session_box(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    request: Request,
) -> Result<Response, ApiError> {
    let transport = transport_of(&state, &key).await?;
    let tools = served(false);
    let numbering = state.clone();
    answer(&state, &key, request, move || {
        let name = format!("mcp-{}", numbering.mcp.count.fetch_add(1, Ordering::Relaxed));
        let conversation = Conversation {
            transport: transport.clone(),
            name,
        };
        let env = transport
            .env(&conversation.name)
            .expect("the service's MCP transport names its hands");
        McpHands::new(env, tools.clone()).keeping(Arc::new(conversation))
    })
    .await
}

/// `/v1/boxes/{id}/mcp`: each session's tools run in a box the key owns.
pub(crate) async fn on_box(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
    request: Request,
) -> Result<Response, ApiError> {
    let b = reach(&state, &key, &p.id).await?;
    let env: Arc<dyn ExecutionEnv> = Arc::new(BoxEnv::new(b));
    let tools = served(false);
    answer(&state, &key, request, move || McpHands::new(env.clone(), tools.clone())).await
}

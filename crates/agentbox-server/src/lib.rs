//! agentbox as a service: one HTTP API over every provider in the registry, for programs in
//! any language, with API keys and ownership.
//!
//! - [`router`] builds the service: the native API under `/v1` ([`api`]), its OpenAPI 3.1
//!   document at `/v1/openapi.json` (derived from the handlers' own types), and `/healthz`.
//! - [`keys`]: the API keys (SQLite, hashed), each with its limits. Every box the service
//!   makes carries the label [`OWNER_LABEL`], the id of the key that made it; another key's
//!   box answers `not_found`, as a box that does not exist; an admin key reaches every box.
//! - [`error`]: the one shape of every failure, `{"code", "message"}`, one HTTP status per
//!   code, whoever failed (a handler, axum's parsing, the router, a panic).
//! - [`events`]: live views pushed as server-sent events (a key's boxes, one box), and
//!   [`page`]: the page at `/` that shows them, embedded in the binary.
//!
//! The server keeps no box of its own: a box is found from its provider at each call, so a
//! server that restarts (or a second one over the same keys) serves the same boxes.
//!
//! ```no_run
//! # async fn f() -> agentbox_core::Result<()> {
//! use std::sync::Arc;
//! use agentbox_server::{Keys, ServerOptions};
//! let keys = Arc::new(Keys::open("keys.db".as_ref())?);
//! let (_, key) = keys.add("laptop", false, Default::default()).await?;
//! println!("your key: {key}");
//! let app = agentbox_server::router(ServerOptions::new(keys));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await.unwrap();
//! axum::serve(listener, app).await.unwrap();
//! # Ok(()) }
//! ```

use std::sync::Arc;

use aide::openapi::{Components, Info, OpenApi, ReferenceOr, SecurityScheme};
use axum::Json;
use axum::extract::DefaultBodyLimit;
use axum::routing::get;

mod access;
pub mod api;
mod auth;
pub mod e2b;
pub mod error;
pub mod events;
pub mod keys;
mod listen;
pub mod mcp;
mod metrics;
pub mod page;
#[cfg(test)]
mod properties;
mod rate;
mod state;
pub mod tls;
pub mod ws;

pub use auth::{WS_KEY_PREFIX, WS_PROTOCOL};
pub use error::{ApiError, ErrorBody};
pub use keys::{KeyInfo, Keys, Limits};
pub use listen::{Accept, DRAIN, HEADER_DEADLINE, serve};
pub use state::{OWNER_LABEL, ServerOptions};

/// The service's routes. See the [crate documentation](crate).
pub fn router(options: ServerOptions) -> axum::Router {
    service(options).api
}

/// The service: its own API, and E2B's API over the same keys and providers, to be served on
/// a port of its own (E2B's SDKs take a whole URL for each of E2B's two hosts).
pub struct Service {
    /// The native API, its document, health and metrics: what [`router`] gives.
    pub api: axum::Router,
    /// E2B's control plane and envd ([`agentbox_e2b`]), each sandbox a box of the provider
    /// its template maps to ([`ServerOptions::e2b_templates`]).
    pub e2b: axum::Router,
    sandboxes: Arc<agentbox_e2b::E2b>,
    ending: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Service {
    /// What ends the live views ([`events`]) when called: a server that stops calls it before
    /// its drain, which would otherwise wait out every open page.
    pub fn views_ender(&self) -> impl Fn() + Send + Sync + 'static {
        let ending = self.ending.clone();
        move || {
            let _ = ending.send(true);
        }
    }

    /// End every box made through E2B's API: its sandboxes' records live in this process, so
    /// a server that stops ends them rather than leave boxes no E2B call can reach.
    pub async fn end_e2b(&self) {
        self.sandboxes.end_all().await;
    }
}

/// The service and E2B's API beside it. See [`Service`].
///
/// ```no_run
/// # async fn f(keys: std::sync::Arc<agentbox_server::Keys>) {
/// let s = agentbox_server::service(agentbox_server::ServerOptions::new(keys));
/// let e2b = tokio::net::TcpListener::bind("127.0.0.1:3000").await.unwrap();
/// tokio::spawn(async move { axum::serve(e2b, s.e2b).await });
/// # }
/// ```
pub fn service(options: ServerOptions) -> Service {
    let max_body = options.max_body;
    let body_deadline = options.body_deadline;
    let state = Arc::new(state::AppState::new(options));
    let ending = state.ending.clone();
    let sandboxes = Arc::new(e2b::api(state.clone()));
    let served = Arc::new(openapi());
    let ready = state.clone();
    let metrics = state.metrics.clone();
    let scraped: axum::Router = axum::Router::new()
        .route("/metrics", get(metrics::scrape))
        .route("/mcp", axum::routing::any(mcp::session_box))
        .route("/v1/boxes/{id}/mcp", axum::routing::any(mcp::on_box))
        .route("/v1/events", get(events::boxes))
        .route("/v1/boxes/{id}/events", get(events::one_box))
        .with_state(state.clone());
    let routes: axum::Router = api::routes().with_state(state).into();
    let app = axum::Router::new()
        .merge(routes)
        .merge(scraped)
        .merge(page::routes())
        .route(
            "/v1/openapi.json",
            get(move || async move { Json(served.as_ref().clone()) }),
        )
        .route("/healthz", get(|| async { Json(serde_json::json!({"status": "ok"})) }))
        .route("/readyz", get(move || readyz(ready.clone())))
        .layer(axum::middleware::from_fn(metrics::tag_route));
    let api = answered_in_one_shape(app, max_body)
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(body_deadline))
        .layer(axum::middleware::from_fn_with_state(metrics.clone(), access::log));
    // E2B's answers are its own shape ({code: number, message}), so none of the layers above
    // rewrite them; the access log is the same.
    let e2b = sandboxes
        .router()
        .layer(axum::middleware::from_fn(metrics::tag_e2b))
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(body_deadline))
        .layer(axum::middleware::from_fn_with_state(metrics, access::log));
    Service {
        api,
        e2b,
        sandboxes,
        ending,
    }
}

/// How long a client may take between two pieces of a request's body (by default: see
/// [`ServerOptions::body_deadline`]).
pub const BODY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// Ready when the key store and the default provider answer (a list of a label no box has,
/// within 10 s); otherwise `unknown`, naming which did not.
async fn readyz(state: Arc<state::AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    let not_ready = |what: String| ApiError::new(agentbox_core::ErrorCode::Unknown, format!("not ready: {what}"));
    let within = std::time::Duration::from_secs(10);
    match tokio::time::timeout(within, state.keys.list()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(not_ready(format!("the key store: {}", e.message()))),
        Err(_) => {
            return Err(not_ready(format!(
                "the key store ({}) did not answer within 10 s",
                state.keys.kind()
            )));
        }
    }
    let name = state.default_provider.clone();
    let provider = state
        .provider(&name)
        .await
        .map_err(|e| not_ready(e.message().to_string()))?;
    let ctx = agentbox_core::Ctx::background().with_timeout(std::time::Duration::from_secs(10));
    let nobody = agentbox_core::Labels::from([(OWNER_LABEL.to_string(), "readyz".to_string())]);
    provider
        .list(&nobody, &ctx)
        .await
        .map_err(|e| not_ready(format!("provider {name}: {}", e.message())))?;
    Ok(Json(serde_json::json!({"status": "ready", "default_provider": name})))
}

/// `app` with what makes every failure one shape: the router's 404, the body's bound, axum's
/// rejections rewritten ([`error::one_shape`]), a panic caught.
fn answered_in_one_shape(app: axum::Router, max_body: usize) -> axum::Router {
    app.fallback(|| async { axum::http::StatusCode::NOT_FOUND })
        .layer(DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::from_fn(error::one_shape))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(error::panicked))
}

/// The methods the route `template` (`/v1/boxes/{id}`) takes, from the document: `GET, DELETE`.
fn methods_of(template: &str) -> Option<String> {
    static ROUTES: std::sync::OnceLock<std::collections::BTreeMap<String, String>> = std::sync::OnceLock::new();
    let routes = ROUTES.get_or_init(|| {
        let doc = openapi();
        let mut out = std::collections::BTreeMap::new();
        if let Some(paths) = doc["paths"].as_object() {
            for (path, item) in paths {
                let methods: Vec<String> = ["get", "post", "put", "patch", "delete"]
                    .iter()
                    .filter(|m| item.get(**m).is_some())
                    .map(|m| m.to_uppercase())
                    .collect();
                out.insert(path.clone(), methods.join(", "));
            }
        }
        out
    });
    routes.get(template).cloned()
}

/// The OpenAPI 3.1 document of the `/v1` API, from the handlers' own types.
///
/// ```
/// let doc = agentbox_server::openapi();
/// assert_eq!(doc["openapi"], "3.1.0");
/// assert!(doc["paths"]["/v1/boxes"]["post"].is_object());
/// ```
pub fn openapi() -> serde_json::Value {
    let mut doc = OpenApi {
        info: Info {
            title: "agentbox".into(),
            description: Some(
                "Sandboxes for AI agents over every provider agentbox has. Every call but \
                 /healthz shows an API key (`Authorization: Bearer <key>`). Every failure \
                 answers {\"code\", \"message\"}, one HTTP status per code."
                    .into(),
            ),
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        },
        ..Default::default()
    };
    aide::generate::infer_responses(true);
    let _ = api::routes().finish_api(&mut doc);
    doc.components
        .get_or_insert_with(Components::default)
        .security_schemes
        .insert(
            auth::SCHEME.into(),
            ReferenceOr::Item(SecurityScheme::Http {
                scheme: "bearer".into(),
                bearer_format: Some("abk_...".into()),
                description: Some("An API key: `agentbox serve keys add NAME` makes one.".into()),
                extensions: Default::default(),
            }),
        );
    let mut doc = serde_json::to_value(doc).unwrap_or_default();
    // A WebSocket's messages are no operation's body: named here so a client generator has
    // their shapes (the streams' routes say which way each goes).
    for (name, schema) in [
        ("StreamServerMessage", schemars::schema_for!(ws::ServerMessage)),
        ("StreamClientMessage", schemars::schema_for!(ws::ClientMessage)),
    ] {
        let text = serde_json::to_string(&schema).unwrap_or_default();
        let text = text.replace("\"#/$defs/", "\"#/components/schemas/");
        let mut schema: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        if let Some(defs) = schema.as_object_mut().and_then(|o| o.remove("$defs"))
            && let Some(defs) = defs.as_object()
        {
            for (k, v) in defs {
                doc["components"]["schemas"][k] = v.clone();
            }
        }
        if let Some(o) = schema.as_object_mut() {
            o.remove("$schema");
        }
        doc["components"]["schemas"][name] = schema;
    }
    // aide documents axum's own rejections as the text axum writes; this server answers them
    // in the one shape (error::one_shape), which each operation's default response describes.
    if let Some(paths) = doc["paths"].as_object_mut() {
        for item in paths.values_mut().filter_map(|i| i.as_object_mut()) {
            for op in item.values_mut() {
                if let Some(responses) = op["responses"].as_object_mut() {
                    responses.retain(|code, r| {
                        code == "default" || code.starts_with('2') || r["content"].get("text/plain").is_none()
                    });
                }
            }
        }
    }
    doc
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    #[tokio::test]
    async fn a_handler_that_panics_answers_the_one_shape() {
        let app = axum::Router::new().route(
            "/boom",
            axum::routing::get(|| async {
                if true {
                    panic!("secret detail");
                }
                "unreached"
            }),
        );
        let app = super::answered_in_one_shape(app, 1024);
        let r = app
            .oneshot(Request::get("/boom").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 500);
        let body = axum::body::to_bytes(r.into_body(), 4096).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["code"], "unknown");
        assert!(
            !v.to_string().contains("secret detail"),
            "the panic's text stays in the log: {v}"
        );
    }
}

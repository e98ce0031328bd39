//! `/metrics`, in Prometheus' text format (OpenMetrics, written by `prometheus-client`):
//!
//! - `agentbox_http_requests_total{method, route, code}`: requests by route template
//!   (`/v1/boxes/{id}/exec`, never a box's id) and outcome (`ok`, or the error's code);
//! - `agentbox_http_request_duration_seconds{method, route}`: their latency;
//! - `agentbox_tool_calls_total{tool, outcome}`: tool calls, `ok` or `tool_error` (a tool that
//!   ran and failed; a call that never reached its tool is a request's error);
//! - `agentbox_streams_open`: WebSocket streams open now;
//! - `agentbox_boxes{provider, state}`: the service's boxes (those with an owner) of each
//!   provider this server has used, by state, counted at the scrape (each box's status asked
//!   within 10 s; one that did not answer in time is `unknown`).
//!
//! It takes an admin key, as every box's count is every key's business.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentbox_core::{Ctx, ErrorCode, Labels, Sandbox, Status};
use axum::body::Body;
use axum::extract::{MatchedPath, State};
use axum::http::{HeaderValue, Request, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::{AppState, OWNER_LABEL};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    method: String,
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BoxLabels {
    provider: String,
    state: String,
}

type Latency = Family<RouteLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms to about 65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// The server's metrics. See the [module documentation](self).
pub(crate) struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Latency,
    tool_calls: Family<ToolLabels, Counter>,
    streams: Gauge,
    boxes: Family<BoxLabels, Gauge>,
    /// One scrape at a time: each clears and counts the boxes again.
    scraping: tokio::sync::Mutex<()>,
    /// The last minute's requests and errors, a second a bucket: what the live page's health
    /// shows.
    minute: std::sync::Mutex<Minute>,
}

/// Requests and errors of the last 60 seconds: bucket `s % 60` holds second `s` (since the
/// server started), reset when a later second comes to it.
struct Minute {
    started: std::time::Instant,
    buckets: [(u64, u64, u64); 60],
}

impl Minute {
    fn now(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    fn count(&mut self, error: bool) {
        let s = self.now();
        let b = &mut self.buckets[(s % 60) as usize];
        if b.0 != s {
            *b = (s, 0, 0);
        }
        b.1 += 1;
        b.2 += u64::from(error);
    }

    fn last(&self) -> (u64, u64) {
        let s = self.now();
        self.buckets
            .iter()
            .filter(|b| b.0 <= s && s - b.0 < 60)
            .fold((0, 0), |(r, e), b| (r + b.1, e + b.2))
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("agentbox");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency: Latency = Family::new_with_constructor(latency_histogram);
        let tool_calls = Family::<ToolLabels, Counter>::default();
        let streams = Gauge::default();
        let boxes = Family::<BoxLabels, Gauge>::default();
        registry.register("http_requests", "Requests, by route and outcome", requests.clone());
        registry.register(
            "http_request_duration_seconds",
            "Time to answer a request, by route",
            latency.clone(),
        );
        registry.register("tool_calls", "Tool calls, by tool and outcome", tool_calls.clone());
        registry.register("streams_open", "WebSocket streams open", streams.clone());
        registry.register("boxes", "The service's boxes, by provider and state", boxes.clone());
        Metrics {
            registry,
            requests,
            latency,
            tool_calls,
            streams,
            boxes,
            scraping: tokio::sync::Mutex::new(()),
            minute: std::sync::Mutex::new(Minute {
                started: std::time::Instant::now(),
                // Second 0's bucket starts empty: `u64::MAX` is no second.
                buckets: [(u64::MAX, 0, 0); 60],
            }),
        }
    }
}

impl Metrics {
    /// The requests answered in the last minute, and how many of them failed (4xx or 5xx).
    pub(crate) fn last_minute(&self) -> (u64, u64) {
        self.minute.lock().unwrap_or_else(|p| p.into_inner()).last()
    }

    /// How many streams are open.
    pub(crate) fn streams_open(&self) -> i64 {
        self.streams.get()
    }

    /// Count a request answered.
    pub(crate) fn request(&self, method: &str, route: &str, status: u16, took: Duration) {
        self.minute
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .count(status >= 400);
        let code = if status < 400 {
            "ok".to_string()
        } else {
            crate::error::code_of_status(status).as_str().to_string()
        };
        let route = route.to_string();
        // A client names its method: any token, a label value each. The standard ones are
        // kept, the rest counted as one.
        let method = match method {
            "GET" | "POST" | "PUT" | "DELETE" | "PATCH" | "HEAD" | "OPTIONS" => method,
            _ => "OTHER",
        }
        .to_string();
        self.requests
            .get_or_create(&RequestLabels {
                method: method.clone(),
                route: route.clone(),
                code,
            })
            .inc();
        self.latency
            .get_or_create(&RouteLabels { method, route })
            .observe(took.as_secs_f64());
    }

    /// Count a tool call that ran.
    pub(crate) fn tool_call(&self, tool: &str, failed: bool) {
        let outcome = if failed { "tool_error" } else { "ok" };
        self.tool_calls
            .get_or_create(&ToolLabels {
                tool: tool.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// A stream opened; it is counted until the guard drops.
    pub(crate) fn stream_opened(self: &Arc<Self>) -> StreamGuard {
        self.streams.inc();
        StreamGuard(self.clone())
    }
}

/// Counts one open stream while it lives.
pub(crate) struct StreamGuard(Arc<Metrics>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.streams.dec();
    }
}

/// Middleware on every route: the route's template rides on its response for the access log
/// and the metrics (an outer middleware sees no matched path).
pub(crate) async fn tag_route(request: Request<Body>, next: Next) -> Response {
    let matched = request.extensions().get::<MatchedPath>().cloned();
    let mut response = next.run(request).await;
    if let Some(m) = matched {
        response.extensions_mut().insert(m);
    }
    response
}

/// The name a router that has no templates (E2B's API) gives every answer of its, for the
/// metrics: never a sandbox's id.
#[derive(Clone, Copy)]
pub(crate) struct RouteName(pub(crate) &'static str);

/// Middleware: every answer of E2B's API counted under the route `e2b`.
pub(crate) async fn tag_e2b(request: Request<Body>, next: Next) -> Response {
    let mut response = next.run(request).await;
    response.extensions_mut().insert(RouteName("e2b"));
    response
}

/// The template of the route that answered, its router's name, or `unmatched`.
pub(crate) fn route_of(response: &Response) -> String {
    let e = response.extensions();
    match (e.get::<MatchedPath>(), e.get::<RouteName>()) {
        (Some(m), _) => m.as_str().to_string(),
        (None, Some(RouteName(n))) => (*n).to_string(),
        (None, None) => "unmatched".into(),
    }
}

/// How long a scrape waits for the boxes' states.
const SCRAPE_DEADLINE: Duration = Duration::from_secs(10);

/// `GET /metrics`.
pub(crate) async fn scrape(State(state): State<Arc<AppState>>, Caller(key): Caller) -> Result<Response, ApiError> {
    if !key.admin {
        return Err(ApiError::new(
            ErrorCode::PermissionDenied,
            "/metrics: an admin key's alone (it counts every key's boxes)",
        ));
    }
    let m = &state.metrics;
    let _one = m.scraping.lock().await;
    count_boxes(&state).await;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &m.registry)
        .map_err(|e| ApiError::new(ErrorCode::Unknown, format!("writing the metrics: {e}")))?;
    let mut r = text.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    Ok(r)
}

/// Count the service's boxes of each provider made so far, by state.
async fn count_boxes(state: &AppState) {
    let m = &state.metrics;
    m.boxes.clear();
    let until = Instant::now() + SCRAPE_DEADLINE;
    for (name, provider) in state.made_providers() {
        let ctx = Ctx::background().with_timeout(SCRAPE_DEADLINE);
        let boxes = match provider.list(&Labels::new(), &ctx).await {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(provider = %name, "metrics: not listed: {}", e.message());
                continue;
            }
        };
        let mut ours: Vec<Arc<dyn Sandbox>> = Vec::new();
        for b in boxes {
            if b.labels().contains_key(OWNER_LABEL) {
                ours.push(b);
            }
        }
        let mut states = Vec::with_capacity(ours.len());
        for chunk in ours.chunks(16) {
            states.extend(futures_util::future::join_all(chunk.iter().cloned().map(|b| state_of(b, until))).await);
        }
        for s in states {
            m.boxes
                .get_or_create(&BoxLabels {
                    provider: name.clone(),
                    state: s.to_string(),
                })
                .inc();
        }
    }
}

/// A box's state, asked before `until`.
async fn state_of(b: Arc<dyn Sandbox>, until: Instant) -> &'static str {
    let left = until.saturating_duration_since(Instant::now());
    let ctx = Ctx::background().with_timeout(left);
    match tokio::time::timeout(left, b.status(&ctx)).await {
        Ok(Ok(Status::Running)) => "running",
        Ok(Ok(Status::Sleeping)) => "sleeping",
        Ok(Ok(Status::Ended)) => "ended",
        _ => "unknown",
    }
}

//! One access-log line per request, through tracing (target `agentbox_server::access`, level
//! info): method, path, HTTP version, status, milliseconds, and the calling key's name (never
//! the key); and
//! the request counted in the metrics by its route's template.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::Request;
use axum::middleware::Next;
use axum::response::Response;

/// Where the caller's key name is left for the log line, by whoever finds the key.
#[derive(Clone, Default)]
pub(crate) struct Who(Arc<Mutex<Option<String>>>);

impl Who {
    /// Name the caller.
    pub(crate) fn set(&self, name: &str) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(name.to_string());
    }

    fn get(&self) -> String {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| "-".into())
    }
}

/// Middleware: log and count the request once it is answered.
pub(crate) async fn log(
    State(metrics): State<Arc<crate::metrics::Metrics>>,
    mut request: Request<Body>,
    next: Next,
) -> Response {
    let who = Who::default();
    request.extensions_mut().insert(who.clone());
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let version = request.version();
    let started = Instant::now();
    let response = next.run(request).await;
    metrics.request(
        method.as_str(),
        &crate::metrics::route_of(&response),
        response.status().as_u16(),
        started.elapsed(),
    );
    tracing::info!(
        target: "agentbox_server::access",
        %method,
        %path,
        ?version,
        status = response.status().as_u16(),
        ms = started.elapsed().as_millis() as u64,
        key = %who.get(),
        "request"
    );
    response
}

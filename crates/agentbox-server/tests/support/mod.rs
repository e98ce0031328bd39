//! What the server's test files share: a server over local boxes on a loopback port, and
//! requests to it that check the one error shape.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use agentbox_providers::registry::Environment;
use agentbox_server::{Keys, Limits, ServerOptions};
use serde_json::{Value, json};

pub(crate) struct Server {
    pub(crate) url: String,
    pub(crate) http: reqwest::Client,
    _home: Option<tempfile::TempDir>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<()>>,
}

impl Server {
    /// Stop it as SIGTERM does (no new connections, the requests in flight finished), and wait.
    pub(crate) async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.served.take() {
            t.await.unwrap();
        }
    }
}

/// A server over `keys` on a loopback port, its boxes local boxes under a home of its own.
pub(crate) async fn start(keys: Arc<Keys>, max_body: usize) -> Server {
    let home = tempfile::tempdir().unwrap();
    let mut s = start_in(keys, max_body, home.path()).await;
    s._home = Some(home);
    s
}

/// A server over `keys` whose local boxes live under `home` (which two servers may share, as
/// replicas share a provider).
pub(crate) async fn start_in(keys: Arc<Keys>, max_body: usize, home: &std::path::Path) -> Server {
    start_with(keys, max_body, home, |_| {}).await
}

/// A server as [`start_in`] makes it, its options changed by `tune` first.
pub(crate) async fn start_with(
    keys: Arc<Keys>,
    max_body: usize,
    home: &std::path::Path,
    tune: impl FnOnce(&mut ServerOptions),
) -> Server {
    start_over(keys, max_body, home, &[], tune).await
}

/// A server as [`start_with`] makes it, with `vars` among its providers' variables (a vendor's
/// URL and key, a fake's).
pub(crate) async fn start_over(
    keys: Arc<Keys>,
    max_body: usize,
    home: &std::path::Path,
    extra: &[(&str, String)],
    tune: impl FnOnce(&mut ServerOptions),
) -> Server {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runner = agentbox_testing::runner::ensure();
    let mut vars: Vec<(String, std::ffi::OsString)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v)))
        .filter(|(k, _)| k != "AGENTBOX_HOME" && k != "AGENTBOX_RUNNER")
        .collect();
    vars.push(("AGENTBOX_HOME".into(), home.into()));
    vars.push(("AGENTBOX_RUNNER".into(), runner.into()));
    for (k, v) in extra {
        vars.retain(|(name, _)| name != k);
        vars.push((k.to_string(), v.into()));
    }
    let mut options = ServerOptions::new(keys);
    options.environment = Environment::from_vars(vars);
    options.default_provider = "local".into();
    options.max_body = max_body;
    tune(&mut options);
    let app = agentbox_server::router(options);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        agentbox_server::serve(listener, app, async {
            let _ = stopped.await;
        })
        .await
        .unwrap()
    });
    Server {
        url,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .no_proxy()
            .build()
            .unwrap(),
        _home: None,
        stop: Some(stop),
        served: Some(served),
    }
}

/// A request's status, JSON body (or `null`) and `Retry-After`.
pub(crate) async fn call(s: &Server, key: Option<&str>, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let (status, body, _) = call_with(s, key, method, path, body.map(|b| b.to_string().into_bytes())).await;
    (status, body)
}

pub(crate) async fn call_with(
    s: &Server,
    key: Option<&str>,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
) -> (u16, Value, Option<String>) {
    let mut r = s.http.request(method.parse().unwrap(), format!("{}{path}", s.url));
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    if let Some(b) = body {
        r = r.header("content-type", "application/json").body(b);
    }
    let answer = r.send().await.unwrap();
    let status = answer.status().as_u16();
    let retry = answer
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let text = answer.text().await.unwrap();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}"))
    };
    (status, body, retry)
}

/// The failure's code, after checking it is exactly `{code, message}`.
pub(crate) fn code_of(body: &Value) -> &str {
    let o = body.as_object().unwrap_or_else(|| panic!("not an object: {body}"));
    assert_eq!(o.len(), 2, "only code and message: {body}");
    assert!(o["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    o["code"].as_str().unwrap()
}

/// The limits of a key that may use local boxes (which isolate nothing, so no key may use them
/// unless it names them, or is an admin's).
pub(crate) fn local() -> Limits {
    Limits {
        providers: Some(vec!["local".into()]),
        ..Default::default()
    }
}

pub(crate) fn spec(lifetime_ms: u64) -> Value {
    json!({"max_lifetime_ms": lifetime_ms})
}

/// A WebSocket client's stream.
pub(crate) type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// A WebSocket to `path` with `key`, or the HTTP status it was refused with.
pub(crate) async fn ws_connect(s: &Server, key: &str, path: &str) -> Result<Ws, u16> {
    use tokio_tungstenite::tungstenite::Error as WsError;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = format!("{}{path}", s.url.replace("http://", "ws://"));
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    let tcp = tokio::net::TcpStream::connect(s.url.trim_start_matches("http://"))
        .await
        .unwrap();
    match tokio_tungstenite::client_async(req, tcp).await {
        Ok((ws, _)) => Ok(ws),
        Err(WsError::Http(r)) => Err(r.status().as_u16()),
        Err(e) => panic!("{path}: {e}"),
    }
}

/// `command` run to its end in box `id` with `key`, which must succeed: its stdout.
pub(crate) async fn run_in(s: &Server, key: &str, id: &str, command: &str) -> String {
    let (st, b) = call(
        s,
        Some(key),
        "POST",
        &format!("/v1/boxes/{id}/exec"),
        Some(json!({"command": command})),
    )
    .await;
    assert_eq!(st, 200, "{b}");
    b["stdout"].as_str().unwrap().to_string()
}

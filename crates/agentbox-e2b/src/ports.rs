//! E2B's proxy to a port of a sandbox other than envd's (`https://{port}-{id}.{domain}`, or one
//! URL with `E2b-Sandbox-Id` and `E2b-Sandbox-Port`, as the SDK addresses envd under
//! `E2B_SANDBOX_URL`). A request is forwarded, upgrades (WebSockets) included, to the port's
//! endpoint as the box's provider gives it (`Sandbox::endpoint`), with the `Host` the sandbox
//! asked (`network.maskRequestHost`, `${PORT}` the port) or `localhost:PORT`. A sandbox asked
//! with `allowPublicTraffic: false` has ports only for who shows its traffic access token
//! (`e2b-traffic-access-token`; else 403).
//!
//! Nothing listening on the port: 502 with the words of E2B's "Closed Port" page. A sandbox
//! that is not running: 502 "not found", as for envd. Simpler than E2B: a sandbox without
//! internet access has no port this proxy reaches: its box has no network at all (not even a socket of its own to listen on), where E2B's proxy still
//! reaches it. Such a port is 502, saying so; so is a port the provider gives no endpoint for
//! (a box with a network of its own is reached only at the ports its spec names: the backend
//! asks for them).

use std::sync::Arc;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use crate::api::json_response;
use crate::state::Shared;

/// The headers of the proxy's own, not forwarded.
const PROXY_HEADERS: [&str; 4] = [
    "e2b-sandbox-id",
    "e2b-sandbox-port",
    "x-access-token",
    "e2b-traffic-access-token",
];
/// How long finding a port's endpoint, and connecting to it, may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub(crate) async fn forward(s: Arc<Shared>, id: String, port: u16, req: Request) -> Response {
    let path = req.uri().path().to_string();
    s.record(req.method().as_str(), &path, Some(&id), None);
    let gone = || {
        json_response(
            StatusCode::BAD_GATEWAY,
            &json!({"code": 502, "message": format!("The sandbox {id} was not found"), "sandboxId": id}),
        )
    };
    let Some(x) = s.sandbox(&id) else {
        return gone();
    };
    let Some(b) = x.running_box() else {
        return gone();
    };
    if let Some(t) = &x.traffic_token
        && !crate::http::shows(req.headers(), "e2b-traffic-access-token", t)
    {
        return json_response(
            StatusCode::FORBIDDEN,
            &json!({
                "code": 403,
                "message": format!(
                    "The sandbox {id}'s ports are not public: send its traffic access token in the \
                     e2b-traffic-access-token header"
                ),
                "sandboxId": id,
                "port": port,
            }),
        );
    }
    let closed = |why: String| {
        tracing::debug!(sandbox = %id, port, why, "e2b: a closed port");
        json_response(
            StatusCode::BAD_GATEWAY,
            &json!({
                "code": 502,
                "message": format!("The sandbox {id} is running but there's no service running on port {port}."),
                "sandboxId": id,
                "port": port,
            }),
        )
    };
    if b.facts().network == Some(agentbox_core::NetworkFact::None) {
        return json_response(
            StatusCode::BAD_GATEWAY,
            &json!({
                "code": 502,
                "message": format!(
                    "The sandbox {id} has no internet access, and here no network: no port of it is reached."
                ),
                "sandboxId": id,
                "port": port,
            }),
        );
    }
    let ctx = agentbox_core::Ctx::background().with_timeout(CONNECT_TIMEOUT);
    let at = match b.endpoint(port, &ctx).await {
        Ok(at) => at,
        Err(e) => return closed(e.to_string()),
    };
    let tcp = match tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect((at.host.as_str(), at.port)),
    )
    .await
    {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => return closed(e.to_string()),
        Err(_) => return closed(format!("no connection within {CONNECT_TIMEOUT:?}")),
    };
    let host = crate::api::request_host(x.network.as_ref(), port);
    match crate::http::forward(tcp, req, &path, &host, &PROXY_HEADERS).await {
        Ok(r) => r,
        Err(e) => closed(e),
    }
}

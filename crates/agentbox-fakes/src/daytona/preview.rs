//! Preview links: `/preview/{sandboxId}/{port}/...` forwards HTTP requests, and WebSocket
//! (or any) upgrades as raw bytes both ways, to 127.0.0.1:{port}, where a box with the open
//! network (which shares this machine's network) listens. Daytona's proxy serves the same at
//! `https://{port}-{sandboxId}.proxy.daytona.works`; the fake puts the two in the path.
//!
//! The caller shows the sandbox's token in `X-Daytona-Preview-Token` (none: 401, another
//! sandbox's or a wrong one: 403, as a private preview). A sandbox that is not started is 400
//! as for the toolbox; one made with `networkBlockAll` has only loopback in its own network
//! namespace, which this machine cannot reach: 502.

use std::sync::Arc;

use axum::extract::Request;

use crate::daytona::error::{DError, DResult, Source};
use crate::daytona::state::Shared;

pub(crate) const TOKEN_HEADER: &str = "x-daytona-preview-token";

pub(crate) async fn forward(s: &Arc<Shared>, id: &str, port: &str, rest: &str, req: Request) -> DResult {
    let Some(sbx) = s.get(id) else {
        return Err(DError::new(
            404,
            "NOT_FOUND",
            format!("Sandbox {id} not found"),
            Source::Proxy,
        ));
    };
    let rec = sbx.rec();
    match req.headers().get(TOKEN_HEADER).and_then(|v| v.to_str().ok()) {
        None => return Err(DError::unauthorized(Source::Proxy)),
        Some(t) if !crate::daytona::same(t, &rec.preview_token) => {
            return Err(DError::new(403, "FORBIDDEN", "Invalid preview token", Source::Proxy));
        }
        Some(_) => {}
    }
    if rec.shown_state() != "started" {
        return Err(not_started(id, rec.shown_state()));
    }
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| DError::new(400, "BAD_REQUEST", format!("Invalid port {port:?}"), Source::Proxy))?;
    if rec.network_block_all {
        return Err(DError::new(
            502,
            "BAD_GATEWAY",
            format!("sandbox {id} has no network this proxy reaches (networkBlockAll)"),
            Source::Proxy,
        ));
    }
    sbx.touch();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| {
        DError::new(
            502,
            "BAD_GATEWAY",
            format!("nothing answers on port {port}: {e}"),
            Source::Proxy,
        )
    })?;
    crate::http::forward(
        tcp,
        req,
        &format!("/{rest}"),
        &format!("127.0.0.1:{port}"),
        &[TOKEN_HEADER],
    )
    .await
    .map_err(|e| DError::new(502, "BAD_GATEWAY", format!("port {port}: {e}"), Source::Proxy))
}

/// What the proxy answers for a sandbox that is not started (the fake's choice: the SDK and
/// the facts name no such answer; 400 with the proxy's envelope).
pub(crate) fn not_started(id: &str, state: &str) -> DError {
    DError::new(
        400,
        "BAD_REQUEST",
        format!("Sandbox {id} is not started (state: {state})"),
        Source::Proxy,
    )
}

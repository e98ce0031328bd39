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

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use hyper_util::rt::TokioIo;

use crate::daytona::error::{DError, DResult, Source};
use crate::daytona::state::Shared;

pub(crate) const TOKEN_HEADER: &str = "x-daytona-preview-token";

pub(crate) async fn forward(s: &Arc<Shared>, id: &str, port: &str, rest: &str, mut req: Request) -> DResult {
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
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| DError::new(502, "BAD_GATEWAY", format!("port {port}: {e}"), Source::Proxy))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let upgrading = req.headers().contains_key(header::UPGRADE);
    let down = upgrading.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    let query = parts.uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    parts.uri = format!("/{rest}{query}")
        .parse()
        .map_err(|e| DError::new(400, "BAD_REQUEST", format!("the path: {e}"), Source::Proxy))?;
    parts.headers.remove(TOKEN_HEADER);
    if let Ok(h) = HeaderValue::from_str(&format!("127.0.0.1:{port}")) {
        parts.headers.insert(header::HOST, h);
    }
    let mut resp = sender
        .send_request(hyper::Request::from_parts(parts, body))
        .await
        .map_err(|e| DError::new(502, "BAD_GATEWAY", format!("port {port}: {e}"), Source::Proxy))?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(down) = down
    {
        let up = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            if let (Ok(d), Ok(u)) = (down.await, up.await) {
                let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(d), &mut TokioIo::new(u)).await;
            }
        });
        let (parts, _) = resp.into_parts();
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    Ok(resp.map(Body::new))
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

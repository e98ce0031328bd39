//! Live views, pushed as server-sent events (`text/event-stream`): what the page shows without
//! a polling loop in the browser, and what any client may follow.
//!
//! - `GET /v1/events`: `hello` (the key's name, whether it is an admin's), then the calling
//!   key's boxes (every box, for an admin key), first whole
//!   (`boxes` with `full: true`), then what changed (`upsert`, `removed`); and the server's
//!   health (`health`: providers up, boxes by state, requests and errors in the last minute).
//! - `GET /v1/boxes/{id}/events`: one box (`box`, with where each of its ports is reached:
//!   `endpoints`), its processes (`processes`) and what its
//!   egress proxy refused (`refusals`), each sent when it changes; `gone` when the box is.
//!
//! The server looks at each [`TICK`], and at once when it made, ended or changed a box itself
//! ([`AppState::changed`]). Each box's status is asked at most every
//! [`crate::state::STATUS_KEPT_FOR`], so a thousand boxes cost a thousand cheap calls a few
//! times a minute, not a second. Each event's `data` is one JSON object carrying `now_ms` (the
//! server's clock), so a page counts lifetimes down against the server's time, not its own.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Labels, Sandbox, Status};
use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, KeepAliveStream, Sse};
use futures_util::StreamExt;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::api::boxes::{BoxInfo, BoxPath, owned, reach};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::keys::KeyInfo;
use crate::state::{AppState, OWNER_LABEL};

/// How often a view looks again with nothing said to have changed.
pub const TICK: Duration = Duration::from_secs(2);
/// How often the health is sent.
const HEALTH_EVERY: Duration = Duration::from_secs(5);
/// How long one status call may take before the box shows `unknown`.
const STATUS_DEADLINE: Duration = Duration::from_secs(3);
/// The most boxes a view lists: past it, `truncated` says so.
const MOST_BOXES: usize = 10_000;
/// The most refusals a box's view shows.
const MOST_REFUSALS: usize = 100;

/// The events of a view, as the response streams them.
type Events = Sse<KeepAliveStream<futures_util::stream::BoxStream<'static, Result<Event, Infallible>>>>;

/// A box as the live views show it.
#[derive(Clone, Debug, Serialize)]
struct Row {
    #[serde(flatten)]
    info: BoxInfo,
    /// `running`, `sleeping`, `ended`, or `unknown` (its provider did not say in time).
    state: String,
    /// The name of the key that owns it, for an admin's view.
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
}

/// The response of a view fed by `rx`, kept alive with comments.
fn respond(rx: mpsc::Receiver<Event>) -> Events {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (Ok(e), rx)) });
    Sse::new(stream.boxed()).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

fn event(name: &str, data: Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

fn now_ms() -> u64 {
    agentbox_core::Clock::now_ms(&agentbox_core::SystemClock)
}

/// Wait a tick, or until the server says a box changed: false when the server stops.
async fn next_look(
    changes: &mut tokio::sync::watch::Receiver<u64>,
    ending: &mut tokio::sync::watch::Receiver<bool>,
) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(TICK) => {}
        _ = changes.changed() => {}
        _ = ending.wait_for(|e| *e) => return false,
    }
    !*ending.borrow()
}

/// `GET /v1/events`: the key's boxes and the server's health, live.
pub(crate) async fn boxes(State(state): State<Arc<AppState>>, Caller(key): Caller) -> Result<Events, ApiError> {
    let (tx, rx) = mpsc::channel(8);
    tracing::info!(key = %key.name, "live view of boxes opened");
    tokio::spawn(async move {
        let _open = state.metrics.stream_opened();
        let mut changes = state.changes.subscribe();
        let mut ending = state.ending.subscribe();
        // Each box as last sent, as its JSON.
        let mut shown: HashMap<String, String> = HashMap::new();
        let hello =
            json!({"key": key.name, "admin": key.admin, "terminal": crate::page::HAS_TERMINAL, "now_ms": now_ms()});
        if tx.send(event("hello", hello)).await.is_err() {
            return;
        }
        let mut first = true;
        let mut health_at: Option<std::time::Instant> = None;
        loop {
            let rows = match rows(&state, &key).await {
                Ok(rows) => rows,
                Err(e) => {
                    let sent = tx
                        .send(event(
                            "error",
                            json!({"code": e.code().as_str(), "message": e.message()}),
                        ))
                        .await;
                    if sent.is_err() {
                        break;
                    }
                    if !next_look(&mut changes, &mut ending).await {
                        break;
                    }
                    continue;
                }
            };
            let truncated = rows.len() > MOST_BOXES;
            let rows: Vec<Row> = rows.into_iter().take(MOST_BOXES).collect();
            let now: HashMap<String, String> = rows
                .iter()
                .map(|r| (r.info.id.clone(), serde_json::to_string(r).unwrap_or_default()))
                .collect();
            let message = if first {
                let mut all: Vec<&Row> = rows.iter().collect();
                all.sort_by(|a, b| a.info.id.cmp(&b.info.id));
                Some(json!({"full": true, "boxes": all, "truncated": truncated, "now_ms": now_ms()}))
            } else {
                let upsert: Vec<&Row> = rows
                    .iter()
                    .filter(|r| shown.get(&r.info.id) != now.get(&r.info.id))
                    .collect();
                let removed: Vec<&String> = shown.keys().filter(|id| !now.contains_key(*id)).collect();
                (!upsert.is_empty() || !removed.is_empty()).then(|| {
                    json!({"full": false, "upsert": upsert, "removed": removed, "truncated": truncated, "now_ms": now_ms()})
                })
            };
            if let Some(m) = message
                && tx.send(event("boxes", m)).await.is_err()
            {
                break;
            }
            if health_at.is_none_or(|at| at.elapsed() >= HEALTH_EVERY) {
                health_at = Some(std::time::Instant::now());
                if tx
                    .send(event("health", health(&state, &key, &rows).await))
                    .await
                    .is_err()
                {
                    break;
                }
            }
            first = false;
            shown = now;
            if !next_look(&mut changes, &mut ending).await || tx.is_closed() {
                break;
            }
        }
        tracing::info!(key = %key.name, "live view of boxes closed");
    });
    Ok(respond(rx))
}

/// The rows of the boxes `key` owns, each with its state (and owner's name, for an admin).
async fn rows(state: &Arc<AppState>, key: &KeyInfo) -> Result<Vec<Row>, ApiError> {
    let boxes = owned(state, key, None, &Labels::new()).await?;
    let names: HashMap<String, String> = if key.admin {
        state
            .keys
            .list()
            .await
            .map(|ks| ks.into_iter().map(|k| (k.id, k.name)).collect())
            .unwrap_or_default()
    } else {
        HashMap::new()
    };
    // Sixteen boxes asked at once.
    let mut states: Vec<String> = Vec::with_capacity(boxes.len());
    for chunk in boxes.chunks(16) {
        let mut asked = Vec::with_capacity(chunk.len());
        for b in chunk {
            asked.push(state_of(state, b.as_ref()));
        }
        states.extend(futures_util::future::join_all(asked).await);
    }
    Ok(boxes
        .iter()
        .zip(states)
        .map(|(b, st)| Row {
            info: BoxInfo::of(b.as_ref()),
            state: st,
            owner: key
                .admin
                .then(|| {
                    b.labels()
                        .get(OWNER_LABEL)
                        .map(|id| names.get(id).cloned().unwrap_or_else(|| id.clone()))
                })
                .flatten(),
        })
        .collect())
}

/// A box's state, as kept or asked now.
async fn state_of(state: &AppState, b: &dyn Sandbox) -> String {
    let id = b.id().to_string();
    if let Some(s) = state.kept_status(&id) {
        return s;
    }
    let ctx = Ctx::background().with_timeout(STATUS_DEADLINE);
    let s = match tokio::time::timeout(STATUS_DEADLINE, b.status(&ctx)).await {
        Ok(Ok(Status::Running)) => "running",
        Ok(Ok(Status::Sleeping)) => "sleeping",
        Ok(Ok(Status::Ended)) => "ended",
        Ok(Err(e)) => {
            tracing::debug!(box_id = %id, "status: {e}");
            "unknown"
        }
        Err(_) => "unknown",
    };
    state.keep_status(&id, s);
    s.to_string()
}

/// The server's health as `key` may see it: the providers it may use and whether each is up,
/// its boxes by state, and the server's requests and errors in the last minute.
async fn health(state: &AppState, key: &KeyInfo, rows: &[Row]) -> Value {
    let mut providers = Vec::new();
    for name in agentbox_providers::registry::names() {
        if crate::api::boxes::may_use(key, name).is_err() {
            continue;
        }
        match state.provider(name).await {
            Ok(_) => providers.push(json!({"name": name, "up": true})),
            Err(e) => providers.push(json!({"name": name, "up": false, "error": e.message()})),
        }
    }
    let mut by_state: BTreeMap<&str, u64> = BTreeMap::new();
    for r in rows {
        *by_state.entry(r.state.as_str()).or_default() += 1;
    }
    let (requests, errors) = state.metrics.last_minute();
    json!({
        "providers": providers,
        "boxes_by_state": by_state,
        "requests_per_minute": requests,
        "errors_per_minute": errors,
        "streams_open": state.metrics.streams_open(),
        "now_ms": now_ms(),
    })
}

/// Where this machine reaches each port the box's facts name (at most 32): `{port, host,
/// port, url}`, or the port and why not.
async fn endpoints(b: &dyn Sandbox, ctx: &Ctx) -> Value {
    let mut out = Vec::new();
    for p in b.facts().ports.iter().flatten().take(32) {
        match b.endpoint(p.port, ctx).await {
            Ok(e) => out.push(json!({"port": p.port, "host": e.host, "at": e.port, "url": e.url})),
            Err(e) => out.push(json!({"port": p.port, "error": e.message()})),
        }
    }
    Value::Array(out)
}

/// `GET /v1/boxes/{id}/events`: one box, its processes and its egress refusals, live.
pub(crate) async fn one_box(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
) -> Result<Events, ApiError> {
    // A box the key cannot reach is refused now, in the one shape, not as an event.
    reach(&state, &key, &p.id).await?;
    let (tx, rx) = mpsc::channel(8);
    tracing::info!(box_id = %p.id, key = %key.name, "live view of a box opened");
    tokio::spawn(async move {
        let _open = state.metrics.stream_opened();
        let mut changes = state.changes.subscribe();
        let mut ending = state.ending.subscribe();
        let mut sent: HashMap<&'static str, String> = HashMap::new();
        loop {
            let b = match reach(&state, &key, &p.id).await {
                Ok(b) => b,
                Err(e) => {
                    let _ = tx
                        .send(event(
                            "gone",
                            json!({"code": e.code().as_str(), "message": e.message(), "now_ms": now_ms()}),
                        ))
                        .await;
                    break;
                }
            };
            let st = state_of(&state, b.as_ref()).await;
            let ctx = Ctx::background().with_timeout(STATUS_DEADLINE);
            let processes = match b.processes() {
                None => json!({"error": format!("box {}: it has no runner, so no processes are kept", p.id)}),
                Some(ps) => match ps.list(&ctx).await {
                    Ok(list) => json!({"processes": list}),
                    Err(e) => json!({"error": e.message()}),
                },
            };
            let refusals = match b.net_refusals(MOST_REFUSALS, &ctx).await {
                Ok(list) => json!({"refusals": list}),
                Err(e) => json!({"error": e.message()}),
            };
            let mut info = serde_json::to_value(Row {
                info: BoxInfo::of(b.as_ref()),
                state: st.clone(),
                owner: None,
            })
            .unwrap_or_default();
            info["endpoints"] = endpoints(b.as_ref(), &ctx).await;
            for (name, value) in [("box", info), ("processes", processes), ("refusals", refusals)] {
                let text = value.to_string();
                if sent.get(name) == Some(&text) {
                    continue;
                }
                let mut with_time = value;
                with_time["now_ms"] = json!(now_ms());
                if tx.send(event(name, with_time)).await.is_err() {
                    tracing::info!(box_id = %p.id, "live view of a box closed");
                    return;
                }
                sent.insert(name, text);
            }
            if st == "ended" {
                let _ = tx
                    .send(event(
                        "gone",
                        json!({"code": "not_found", "message": format!("box {}: it ended", p.id), "now_ms": now_ms()}),
                    ))
                    .await;
                break;
            }
            if !next_look(&mut changes, &mut ending).await || tx.is_closed() {
                break;
            }
        }
        tracing::info!(box_id = %p.id, "live view of a box closed");
    });
    Ok(respond(rx))
}

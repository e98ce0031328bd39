//! A box's lifecycle through the service: open by name (made, or found and woken), sleep, wake,
//! extend. A provider that has no such operation answers `unsupported`, naming it; the key's
//! limits hold (an extension past its longest lifetime is refused). A name is the key's own:
//! the owner label is part of the name's place, so two keys opening `dev` get two boxes.

use std::sync::Arc;

use agentbox_core::{Ctx, ErrorCode, SandboxId, Spec, now_ms};
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use schemars::JsonSchema;
use serde::Deserialize;

use super::boxes::{BoxInfo, BoxPath, CALL_DEADLINE, CREATE_DEADLINE, allowed_spec, reach, room_for};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;

/// A box to open by name.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenBox {
    /// The provider (without it, the server's default).
    #[serde(default)]
    pub provider: Option<String>,
    /// The box's name: the same name (and labels) opens the same box again.
    pub name: String,
    /// What a box made for the name is asked for.
    pub spec: Spec,
}

/// A new deadline: give one of the two.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Extend {
    /// The new deadline, in ms since the Unix epoch (later or earlier).
    #[serde(default)]
    pub ends_at_ms: Option<u64>,
    /// Move the deadline this many ms from where it is.
    #[serde(default)]
    pub by_ms: Option<u64>,
}

/// `POST /v1/boxes/open`.
pub(crate) async fn open(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Json(body): Json<OpenBox>,
) -> Result<Json<BoxInfo>, ApiError> {
    let name = body.provider.unwrap_or_else(|| state.default_provider.clone());
    let spec = allowed_spec(&key, &name, &state.secrets, body.spec)?;
    let spec = super::snapshots::own_snapshot(&state, &key, &name, spec).await?;
    // Counted and made under the key's lock, so two opens at once cannot pass its most. A
    // reopen makes nothing: the same provider, name and labels (the name's place).
    let _counted = state.key_lock(&key.id).await;
    room_for(&state, &key, 1, |b| {
        b.id().provider() == name && b.facts().name.as_deref() == Some(body.name.as_str()) && *b.labels() == spec.labels
    })
    .await?;
    let provider = state.provider(&name).await?;
    let ctx = Ctx::background().with_timeout(CREATE_DEADLINE);
    let b = provider.open(&body.name, &spec, &ctx).await?;
    tracing::info!(box_id = %b.id(), key = %key.name, name = %body.name, "box opened");
    state.changed();
    Ok(Json(BoxInfo::of(b.as_ref())))
}

/// `POST /v1/boxes/{id}/sleep`: files kept, programs ended; its lifetime goes on.
pub(crate) async fn sleep(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
) -> Result<StatusCode, ApiError> {
    // Its facts fresh from the provider, and let go after: they change.
    state.forget_box(&p.id);
    let b = reach(&state, &key, &p.id).await?;
    let _changing = state.changing(&p.id);
    let provider = state.provider(b.id().provider()).await?;
    provider
        .sleep(b.id(), &Ctx::background().with_timeout(CALL_DEADLINE))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/boxes/{id}/wake`.
pub(crate) async fn wake(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
) -> Result<Json<BoxInfo>, ApiError> {
    // Its facts fresh from the provider, and let go after: they change.
    state.forget_box(&p.id);
    let b = reach(&state, &key, &p.id).await?;
    let _changing = state.changing(&p.id);
    let provider = state.provider(b.id().provider()).await?;
    let woken = provider
        .wake(b.id(), &Ctx::background().with_timeout(CREATE_DEADLINE))
        .await?;
    Ok(Json(BoxInfo::of(woken.as_ref())))
}

/// `POST /v1/boxes/{id}/extend`.
pub(crate) async fn extend(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
    Json(body): Json<Extend>,
) -> Result<Json<BoxInfo>, ApiError> {
    // Its deadline fresh from the provider, and let go after: it changes.
    state.forget_box(&p.id);
    let b = reach(&state, &key, &p.id).await?;
    let _changing = state.changing(&p.id);
    let id: SandboxId = b.id().clone();
    let ends_at_ms = match (body.ends_at_ms, body.by_ms) {
        (Some(at), None) => at,
        (None, Some(by)) => {
            let now = b.facts().ends_at_ms.unwrap_or_else(now_ms);
            now.saturating_add(by)
        }
        _ => {
            return Err(ApiError::new(ErrorCode::Invalid, "ends_at_ms, by_ms: give one of them"));
        }
    };
    if let Some(most) = key.limits.max_lifetime {
        let most = most.as_millis() as u64;
        // Where the provider does not say when the box started, from now: never longer.
        let started = b.facts().started_at_ms.unwrap_or_else(now_ms);
        if ends_at_ms.saturating_sub(started) > most {
            return Err(ApiError::new(
                ErrorCode::PermissionDenied,
                format!(
                    "ends_at_ms: the box would live {} ms, more than this key's {most}",
                    ends_at_ms.saturating_sub(started),
                ),
            ));
        }
    }
    let provider = state.provider(id.provider()).await?;
    let moved = provider
        .extend(&id, ends_at_ms, &Ctx::background().with_timeout(CALL_DEADLINE))
        .await?;
    Ok(Json(BoxInfo::of(moved.as_ref())))
}

//! Snapshots and forks. A snapshot's name is its key's own: two keys may both keep `base`,
//! and neither sees, uses or deletes the other's. The provider keeps it as
//! `s-<key id>-<name>`; a spec's `snapshot` names the key's own snapshot of that name, or
//! (when the key has none) one of the vendor's own (a Daytona snapshot, say), never another
//! key's. A fork's boxes are owned by the key that forked, and counted against its limits.

use std::sync::Arc;

use agentbox_core::{Ctx, ErrorCode, Snapshot, Spec, check_fork, validate_name};
use agentbox_providers::registry;
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::boxes::{BoxInfo, BoxPath, CALL_DEADLINE, CREATE_DEADLINE, allowed_spec, may_use, reach, room_for};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::keys::KeyInfo;
use crate::state::AppState;

/// Providers with no snapshots of the vendor's own: each of theirs was taken through agentbox.
const OWN_SNAPSHOTS_ONLY: [&str; 3] = ["local", "namespace", "docker"];

/// The longest name a key may give a snapshot (the provider's name is 63 at most).
pub const MAX_SNAPSHOT_NAME: usize = 63 - PREFIX_LEN;
/// `s-`, 16 hex digits of the key's id, `-`.
const PREFIX_LEN: usize = 19;

/// A snapshot to take.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TakeSnapshot {
    /// Its name: a DNS label of at most 44 characters, unique among this key's snapshots of
    /// the provider.
    pub name: String,
}

/// A snapshot, as its key names it.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct SnapshotInfo {
    /// Its name (the key's own).
    pub name: String,
    /// The provider that keeps it.
    pub provider: String,
    /// The box it was taken of, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// When it was taken, in ms since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at_ms: Option<u64>,
    /// Bytes it holds, where the provider says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// It holds the box's memory too, not only its files.
    pub memory: bool,
}

/// Which snapshots to list.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListSnapshots {
    /// Only this provider's.
    #[serde(default)]
    pub provider: Option<String>,
}

/// The path of one snapshot.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
pub struct SnapshotPath {
    /// The provider that keeps it.
    pub provider: String,
    /// Its name.
    pub name: String,
}

/// Boxes to fork from one.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkBox {
    /// How many boxes (1 to 16).
    #[serde(default = "one")]
    pub n: usize,
    /// The spec of each new box (its lifetime, labels...); `snapshot` must be unset.
    pub spec: Spec,
}

fn one() -> usize {
    1
}

pub(crate) fn prefix(key: &KeyInfo) -> String {
    format!("s-{}-", key.id)
}

/// Whether `name` is in the service's form for some key's snapshot.
fn some_keys(name: &str) -> bool {
    name.len() > PREFIX_LEN
        && name.starts_with("s-")
        && name.as_bytes()[PREFIX_LEN - 1] == b'-'
        && name[2..PREFIX_LEN - 1].bytes().all(|b| b.is_ascii_hexdigit())
}

/// The provider's name of `key`'s snapshot `name`, refused when `name` is not a name.
pub(crate) fn full_name(key: &KeyInfo, name: &str) -> Result<String, ApiError> {
    validate_name("name", name)?;
    if name.len() > MAX_SNAPSHOT_NAME {
        return Err(ApiError::new(
            ErrorCode::Invalid,
            format!("name: {} characters, at most {MAX_SNAPSHOT_NAME}", name.len()),
        ));
    }
    Ok(format!("{}{name}", prefix(key)))
}

fn info(key: &KeyInfo, s: Snapshot) -> Option<SnapshotInfo> {
    let name = s.name.strip_prefix(&prefix(key))?.to_string();
    Some(SnapshotInfo {
        name,
        provider: s.provider,
        from: s.from.map(|f| f.to_string()),
        created_at_ms: s.created_at_ms,
        bytes: s.bytes,
        memory: s.memory,
    })
}

/// `spec` with its `snapshot` the provider's name of the key's own snapshot of that name, or
/// left as a vendor's own; another key's is `not_found`.
pub(crate) async fn own_snapshot(
    state: &AppState,
    key: &KeyInfo,
    provider: &str,
    mut spec: Spec,
) -> Result<Spec, ApiError> {
    let Some(name) = spec.snapshot.clone() else {
        return Ok(spec);
    };
    let missing = || ApiError::new(ErrorCode::NotFound, format!("spec.snapshot: {name}: no such snapshot"));
    if some_keys(&name) {
        return Err(missing());
    }
    let p = state.provider(provider).await?;
    if !p.honours().snapshots {
        // The vendor's own, or refused by the provider as any spec it cannot honour.
        return Ok(spec);
    }
    let full = full_name(key, &name).ok();
    let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
    if let Some(full) = full
        && p.snapshots(&ctx).await?.iter().any(|s| s.name == full)
    {
        spec.snapshot = Some(full);
        return Ok(spec);
    }
    // Where every snapshot is one agentbox took (an operator's, through the CLI), a name that is
    // not the key's is no key's to start from.
    if OWN_SNAPSHOTS_ONLY.contains(&provider) {
        return Err(missing());
    }
    Ok(spec)
}

/// `POST /v1/boxes/{id}/snapshots`.
pub(crate) async fn take(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
    Json(body): Json<TakeSnapshot>,
) -> Result<(StatusCode, Json<SnapshotInfo>), ApiError> {
    let full = full_name(&key, &body.name)?;
    let b = reach(&state, &key, &p.id).await?;
    let provider = state.provider(b.id().provider()).await?;
    let ctx = Ctx::background().with_timeout(CREATE_DEADLINE);
    let s = provider.snapshot(b.id(), &full, &ctx).await?;
    tracing::info!(box_id = %b.id(), snapshot = %full, key = %key.name, "snapshot taken");
    let shown = info(&key, s).ok_or_else(|| ApiError::new(ErrorCode::Unknown, "the provider renamed the snapshot"))?;
    Ok((StatusCode::CREATED, Json(shown)))
}

/// `GET /v1/snapshots`: the calling key's snapshots.
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Query(q): Query<ListSnapshots>,
) -> Result<Json<Vec<SnapshotInfo>>, ApiError> {
    let names: Vec<&str> = match &q.provider {
        Some(p) => {
            may_use(&key, p)?;
            vec![p.as_str()]
        }
        None => registry::names()
            .into_iter()
            .filter(|p| may_use(&key, p).is_ok())
            .collect(),
    };
    let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
    let mut out = Vec::new();
    for name in names {
        let p = match state.provider(name).await {
            Ok(p) => p,
            Err(e) if q.provider.is_some() => return Err(e.into()),
            Err(_) => continue,
        };
        if !p.honours().snapshots {
            continue;
        }
        out.extend(p.snapshots(&ctx).await?.into_iter().filter_map(|s| info(&key, s)));
    }
    Ok(Json(out))
}

/// `DELETE /v1/snapshots/{provider}/{name}`.
pub(crate) async fn delete(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<SnapshotPath>,
) -> Result<StatusCode, ApiError> {
    may_use(&key, &p.provider)?;
    let full = full_name(&key, &p.name)?;
    let provider = state.provider(&p.provider).await?;
    let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
    if !provider.delete_snapshot(&full, &ctx).await? {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("snapshot {}/{}: no such snapshot", p.provider, p.name),
        ));
    }
    tracing::info!(snapshot = %full, key = %key.name, "snapshot deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/boxes/{id}/fork`: `n` boxes holding the box's files as they are now, owned by the
/// calling key.
pub(crate) async fn fork(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
    Json(body): Json<ForkBox>,
) -> Result<(StatusCode, Json<Vec<BoxInfo>>), ApiError> {
    let b = reach(&state, &key, &p.id).await?;
    let provider_name = b.id().provider().to_string();
    let spec = allowed_spec(&key, &provider_name, &state.secrets, body.spec)?;
    check_fork(body.n, &spec)?;
    let _counted = state.key_lock(&key.id).await;
    room_for(&state, &key, body.n, |_| false).await?;
    let provider = state.provider(&provider_name).await?;
    let ctx = Ctx::background().with_timeout(CREATE_DEADLINE);
    let boxes = provider.fork(b.id(), body.n, &spec, &ctx).await?;
    tracing::info!(box_id = %b.id(), n = boxes.len(), key = %key.name, "box forked");
    state.changed();
    Ok((
        StatusCode::CREATED,
        Json(boxes.iter().map(|f| BoxInfo::of(f.as_ref())).collect()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_snapshot_names_are_its_own() {
        assert!(some_keys("s-0123456789abcdef-base"));
        assert!(!some_keys("s-0123456789abcdef"));
        assert!(!some_keys("s-0123456789abcdeg-base"));
        assert!(!some_keys("base"));
    }
}

//! Boxes: create from a spec, list by label, get, delete; each box owned by the key that made
//! it. Another key's box answers `not_found`, exactly as a box that does not exist; an admin
//! key reaches every box.

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{
    Ctx, Error, ErrorCode, Facts, Labels, Provider, Sandbox, SandboxId, Spec, Status, validate_labels,
};
use agentbox_providers::registry;
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::keys::KeyInfo;
use crate::state::{AppState, OWNER_LABEL};

/// How long making a box may take.
pub(crate) const CREATE_DEADLINE: Duration = Duration::from_secs(300);
/// How long any other call on a provider may take.
pub(crate) const CALL_DEADLINE: Duration = Duration::from_secs(60);

/// A box to make.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBox {
    /// The provider that makes it (`GET /v1/providers` lists them); without it, the server's
    /// default.
    #[serde(default)]
    pub provider: Option<String>,
    /// What the box is asked for: every field of the contract's spec. A field the provider
    /// cannot honour is refused (`unsupported`), never dropped.
    pub spec: Spec,
}

/// A box, as the service shows it.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct BoxInfo {
    /// Its id, `provider:name`: the path of every call on it.
    pub id: String,
    /// Its provider.
    pub provider: String,
    /// Its labels (the service's owner label included).
    pub labels: Labels,
    /// What it really got, as its provider says.
    pub facts: Facts,
    /// Whether it runs, where it was asked (`GET /v1/boxes/{id}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}

impl BoxInfo {
    pub(crate) fn of(b: &dyn Sandbox) -> Self {
        BoxInfo {
            id: b.id().to_string(),
            provider: b.id().provider().to_string(),
            labels: b.labels().clone(),
            facts: b.facts().clone(),
            status: None,
        }
    }
}

/// The path of a box.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
pub struct BoxPath {
    /// The box's id, `provider:name`.
    pub id: String,
}

/// Which boxes to list.
#[derive(Clone, Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListBoxes {
    /// Only this provider's boxes.
    #[serde(default)]
    pub provider: Option<String>,
    /// Only boxes with all these labels: `key=value` pairs joined by commas.
    #[serde(default)]
    pub labels: Option<String>,
}

/// Providers whose boxes isolate nothing: a program in one runs as the server's user, with its
/// files (the key store, other keys' boxes) and its environment. Only an admin key, or a key
/// whose `--providers` names one outright, may use them.
pub const UNISOLATED: [&str; 1] = ["local"];

/// Whether `key` may use `provider` (one agentbox has: an unknown name is `invalid`, listing
/// them).
pub(crate) fn may_use(key: &KeyInfo, provider: &str) -> Result<(), ApiError> {
    registry::find(provider)?;
    match &key.limits.providers {
        Some(allowed) if !allowed.iter().any(|p| p == provider) => Err(ApiError::new(
            ErrorCode::PermissionDenied,
            format!("provider {provider}: this key may use {}", allowed.join(", ")),
        )),
        None if !key.admin && UNISOLATED.contains(&provider) => Err(ApiError::new(
            ErrorCode::PermissionDenied,
            format!(
                "provider {provider}: its boxes isolate nothing (a program in one runs as this server's user), \
                 so only an admin key or a key made with --providers {provider} may use it"
            ),
        )),
        _ => Ok(()),
    }
}

/// Whether `key` owns `b` (an admin key owns every box).
fn owns(key: &KeyInfo, b: &dyn Sandbox) -> bool {
    key.admin || b.labels().get(OWNER_LABEL) == Some(&key.id)
}

/// The box `id` if `key` may reach it; a box of another key's is `not_found`, as one that
/// does not exist.
pub(crate) async fn reach(state: &AppState, key: &KeyInfo, id: &str) -> Result<Arc<dyn Sandbox>, ApiError> {
    let parsed: SandboxId = id
        .parse()
        .map_err(|e: Error| ApiError::new(ErrorCode::Invalid, format!("box id {id:?}: {}", e.message())))?;
    let missing = || ApiError::new(ErrorCode::NotFound, format!("box {id}: no such box"));
    if registry::find(parsed.provider()).is_err() || may_use(key, parsed.provider()).is_err() {
        return Err(missing());
    }
    if let Some(b) = state.cached_box(parsed.as_str()) {
        return if owns(key, b.as_ref()) { Ok(b) } else { Err(missing()) };
    }
    let provider = state.provider(parsed.provider()).await?;
    let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
    let seen = state.forgotten();
    match provider.attach(&parsed, &ctx).await? {
        Some(b) if owns(key, b.as_ref()) => {
            state.keep_box(&b, seen);
            Ok(b)
        }
        _ => Err(missing()),
    }
}

/// The boxes `key` owns (every box, for an admin key), of one provider or of every one this
/// server can make.
pub(crate) async fn owned(
    state: &AppState,
    key: &KeyInfo,
    provider: Option<&str>,
    extra: &Labels,
) -> Result<Vec<Arc<dyn Sandbox>>, ApiError> {
    let mut labels = extra.clone();
    if !key.admin {
        labels.insert(OWNER_LABEL.to_string(), key.id.clone());
    }
    let names: Vec<&str> = match provider {
        Some(p) => {
            may_use(key, p)?;
            vec![p]
        }
        None => registry::names()
            .into_iter()
            .filter(|p| may_use(key, p).is_ok())
            .collect(),
    };
    let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
    let mut out = Vec::new();
    for name in names {
        let p: Arc<dyn Provider> = match state.provider(name).await {
            Ok(p) => p,
            // Named outright, its failure is the answer; otherwise a provider this server
            // cannot make has no boxes to list.
            Err(e) if provider.is_some() => return Err(e.into()),
            Err(e) => {
                tracing::debug!(provider = name, "not listed: {}", e.message());
                continue;
            }
        };
        out.extend(p.list(&labels, &ctx).await?);
    }
    Ok(out)
}

/// `spec` as `key` may ask it of `provider`, with the key's id as its owner label: refused
/// when the provider is not the key's, the lifetime is past the key's longest, or the spec
/// names an owner itself.
pub(crate) fn allowed_spec(
    key: &KeyInfo,
    provider: &str,
    offered: &[agentbox_core::SecretSpec],
    mut spec: Spec,
) -> Result<Spec, ApiError> {
    may_use(key, provider)?;
    offered_secrets(offered, &spec)?;
    if spec.labels.contains_key(OWNER_LABEL) {
        return Err(ApiError::new(
            ErrorCode::Invalid,
            format!("spec.labels: {OWNER_LABEL} is the service's own (the key that makes a box owns it)"),
        ));
    }
    validate_labels(&spec.labels)?;
    if let Some(most) = key.limits.max_lifetime
        && spec.max_lifetime > most
    {
        return Err(ApiError::new(
            ErrorCode::PermissionDenied,
            format!(
                "spec.max_lifetime_ms: {} is more than this key's {}",
                spec.max_lifetime.as_millis(),
                most.as_millis()
            ),
        ));
    }
    spec.labels.insert(OWNER_LABEL.to_string(), key.id.clone());
    Ok(spec)
}

/// The secret this server offers as `name`, read now, for one program's descriptor
/// (`secret_fd` of an exec or a process): `permission_denied` for one it does not offer.
pub(crate) fn offered_fd(
    offered: &[agentbox_core::SecretSpec],
    name: &str,
) -> Result<agentbox_core::FdSecret, ApiError> {
    let offer = offered.iter().find(|o| o.name == name).ok_or_else(|| {
        ApiError::new(
            ErrorCode::PermissionDenied,
            format!("secret_fd: this service offers no secret {name} (its operator offers them with agentbox serve --secret)"),
        )
    })?;
    Ok(agentbox_core::FdSecret {
        name: name.to_string(),
        value: offer.read_for_descriptor()?,
    })
}

/// Refuse (`permission_denied`) a spec's secret this server does not offer: one of another
/// name, another source, or a host its offer does not hold. The server's own variables and
/// files are its operator's; a key gets only what `agentbox serve --secret` hands out.
fn offered_secrets(offered: &[agentbox_core::SecretSpec], spec: &Spec) -> Result<(), ApiError> {
    for (i, asked) in spec.secrets.iter().enumerate() {
        let denied = |why: String| ApiError::new(ErrorCode::PermissionDenied, format!("spec.secrets[{i}]: {why}"));
        let Some(offer) = offered.iter().find(|o| o.name == asked.name) else {
            return Err(denied(format!(
                "this service offers no secret {} (its operator offers them with agentbox serve --secret{})",
                asked.name,
                if offered.is_empty() {
                    "; it offers none".to_string()
                } else {
                    format!(
                        "; it offers {}",
                        offered.iter().map(|o| o.name.as_str()).collect::<Vec<_>>().join(", ")
                    )
                }
            )));
        };
        if asked.from != offer.from {
            return Err(denied(format!(
                "secret {} comes from {} on this service, not {}",
                asked.name, offer.from, asked.from
            )));
        }
        if let Some(h) = asked.hosts.iter().find(|h| !offer.hosts.contains(h)) {
            return Err(denied(format!(
                "secret {} may be sent to {} and not {h}",
                asked.name,
                offer.hosts.join(", ")
            )));
        }
    }
    Ok(())
}

/// Refused (`rate_limited`, with `Retry-After`) when `n` more boxes would pass the key's most;
/// a box of its own that `again` says is asked for once more is not counted twice. Call it
/// under the key's lock ([`AppState::key_lock`]), and make the boxes before letting go.
pub(crate) async fn room_for(
    state: &AppState,
    key: &KeyInfo,
    n: usize,
    again: impl Fn(&dyn Sandbox) -> bool,
) -> Result<(), ApiError> {
    let Some(most) = key.limits.max_boxes else {
        return Ok(());
    };
    let mine = owned(state, key, None, &Labels::new()).await?;
    if mine.iter().any(|b| again(b.as_ref())) || mine.len() + n <= most as usize {
        return Ok(());
    }
    let more = if n == 1 {
        String::new()
    } else {
        format!(" ({n} more asked)")
    };
    Err(ApiError::new(
        ErrorCode::RateLimited,
        format!(
            "this key owns {} boxes, its most {most}{more}: end one first",
            mine.len()
        ),
    )
    .retry_after(30))
}

/// The labels of a list's `labels` query: `key=value` pairs joined by commas (an empty pair
/// is skipped), each checked as a spec's labels are.
pub(crate) fn labels_of(query: &str) -> Result<Labels, ApiError> {
    let mut labels = Labels::new();
    for pair in query.split(',').filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(ApiError::new(
                ErrorCode::Invalid,
                format!("labels: {pair:?} is not key=value"),
            ));
        };
        labels.insert(k.to_string(), v.to_string());
    }
    validate_labels(&labels).map_err(|e| ApiError::new(ErrorCode::Invalid, format!("labels: {}", e.message())))?;
    Ok(labels)
}

/// `POST /v1/boxes`.
pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Json(body): Json<CreateBox>,
) -> Result<(StatusCode, Json<BoxInfo>), ApiError> {
    let name = body.provider.unwrap_or_else(|| state.default_provider.clone());
    let spec = allowed_spec(&key, &name, &state.secrets, body.spec)?;
    let spec = super::snapshots::own_snapshot(&state, &key, &name, spec).await?;
    // Counted and made under the key's lock, so two creates at once cannot pass its most.
    let _counted = state.key_lock(&key.id).await;
    room_for(&state, &key, 1, |_| false).await?;
    let provider = state.provider(&name).await?;
    let ctx = Ctx::background().with_timeout(CREATE_DEADLINE);
    let b = provider.create(&spec, &ctx).await?;
    tracing::info!(box_id = %b.id(), key = %key.name, "box made");
    state.changed();
    Ok((StatusCode::CREATED, Json(BoxInfo::of(b.as_ref()))))
}

/// `GET /v1/boxes`.
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Query(q): Query<ListBoxes>,
) -> Result<Json<Vec<BoxInfo>>, ApiError> {
    let labels = labels_of(q.labels.as_deref().unwrap_or_default())?;
    let boxes = owned(&state, &key, q.provider.as_deref(), &labels).await?;
    Ok(Json(boxes.iter().map(|b| BoxInfo::of(b.as_ref())).collect()))
}

/// `GET /v1/boxes/{id}`.
pub(crate) async fn get(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
) -> Result<Json<BoxInfo>, ApiError> {
    let b = reach(&state, &key, &p.id).await?;
    let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
    let mut info = BoxInfo::of(b.as_ref());
    info.status = Some(b.status(&ctx).await?);
    Ok(Json(info))
}

/// `DELETE /v1/boxes/{id}`: the box ends, with every program in it.
pub(crate) async fn delete(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
) -> Result<StatusCode, ApiError> {
    let b = reach(&state, &key, &p.id).await?;
    let _changing = state.changing(&p.id);
    let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
    b.destroy(&ctx).await?;
    tracing::info!(box_id = %b.id(), key = %key.name, "box ended");
    Ok(StatusCode::NO_CONTENT)
}

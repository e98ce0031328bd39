//! Runs, the ledger and receipts of this host, read-only: the runs under the server's runs
//! root (each one's record: its status, generation and holder), the ledger's tool calls by run
//! and by target, and the receipts' totals by provider and kind.
//!
//! A run, its ledger and its receipts belong to this host, not to a key: only an admin key
//! reads them (any other is `permission_denied`).

use std::sync::Arc;

use agentbox_core::ErrorCode;
use axum::Json;
use axum::extract::{Path, Query, State};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::keys::KeyInfo;
use crate::state::AppState;

/// The path of one run.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
pub struct RunPath {
    /// The run's id.
    pub id: String,
}

/// Which calls of a target to read.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ByTarget {
    /// What the calls acted on: an absolute path, or a box's id.
    pub target: String,
    /// At most this many, newest first (default 50, at most 1000).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// What the receipts of one provider and kind add up to.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ReceiptTotal {
    /// The provider.
    pub provider: String,
    /// The kind of box.
    pub kind: String,
    /// How many boxes.
    pub boxes: u64,
    /// Their seconds together.
    pub seconds: f64,
    /// Their estimated cost together, in US dollars.
    pub cost_usd: f64,
}

fn admin(key: &KeyInfo) -> Result<(), ApiError> {
    if key.admin {
        return Ok(());
    }
    Err(ApiError::new(
        ErrorCode::PermissionDenied,
        "runs, the ledger and receipts are this host's, not a key's: an admin key's alone",
    ))
}

fn values<T: Serialize>(items: &[T]) -> Result<Vec<serde_json::Value>, ApiError> {
    items
        .iter()
        .map(|i| serde_json::to_value(i).map_err(|e| ApiError::new(ErrorCode::Unknown, e.to_string())))
        .collect()
}

/// `GET /v1/runs`: every run's record.
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
) -> Result<Json<Vec<serde_json::Value>>, ApiError> {
    admin(&key)?;
    let runs = agentbox_runs::Runs::new(state.runs_root()?);
    let records = tokio::task::spawn_blocking(move || runs.list())
        .await
        .map_err(|e| ApiError::new(ErrorCode::Unknown, e.to_string()))??;
    Ok(Json(values(&records)?))
}

/// `GET /v1/runs/{id}`: one run's record (its status, generation, holder), read with no
/// claim, also while another process holds it.
pub(crate) async fn get(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<RunPath>,
) -> Result<Json<serde_json::Value>, ApiError> {
    admin(&key)?;
    agentbox_runs::run::check_id(&p.id)
        .map_err(|e| ApiError::new(ErrorCode::Invalid, format!("run id: {}", e.message())))?;
    let dir = agentbox_runs::Runs::new(state.runs_root()?).dir(&p.id);
    if !dir.is_dir() {
        return Err(ApiError::new(ErrorCode::NotFound, format!("run {}: no such run", p.id)));
    }
    let record = agentbox_runs::read_status(&dir)?;
    let mut shown = serde_json::to_value(record).map_err(|e| ApiError::new(ErrorCode::Unknown, e.to_string()))?;
    shown["generations"] = serde_json::to_value(agentbox_runs::history::read(&dir)?)
        .map_err(|e| ApiError::new(ErrorCode::Unknown, e.to_string()))?;
    Ok(Json(shown))
}

/// `GET /v1/runs/{id}/ledger`: a run's tool calls, in order.
pub(crate) async fn ledger_of_run(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<RunPath>,
) -> Result<Json<Vec<serde_json::Value>>, ApiError> {
    admin(&key)?;
    let records = state.ledger()?.read(&p.id).await?;
    Ok(Json(values(&records)?))
}

/// `GET /v1/ledger?target=T`: the calls that acted on a target, newest first.
pub(crate) async fn ledger_of_target(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Query(q): Query<ByTarget>,
) -> Result<Json<Vec<serde_json::Value>>, ApiError> {
    admin(&key)?;
    let limit = q.limit.unwrap_or(50);
    if limit == 0 || limit > 1000 {
        return Err(ApiError::new(
            ErrorCode::Invalid,
            format!("limit: {limit} is not 1 to 1000"),
        ));
    }
    let records = state.ledger()?.read_by_target(&q.target, limit).await?;
    Ok(Json(values(&records)?))
}

/// `GET /v1/receipts`: the receipts' totals by provider and kind.
pub(crate) async fn receipts(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
) -> Result<Json<Vec<ReceiptTotal>>, ApiError> {
    admin(&key)?;
    let file = state.receipts().ok_or_else(|| {
        ApiError::new(
            ErrorCode::NotFound,
            "receipts: this server reads none (start it with --receipts FILE)",
        )
    })?;
    let totals = tokio::task::spawn_blocking(move || agentbox_transport::receipts::totals(&file))
        .await
        .map_err(|e| ApiError::new(ErrorCode::Unknown, e.to_string()))??;
    Ok(Json(
        totals
            .into_iter()
            .map(|t| ReceiptTotal {
                provider: t.provider,
                kind: t.kind,
                boxes: t.boxes,
                seconds: t.seconds,
                cost_usd: t.usd,
            })
            .collect(),
    ))
}

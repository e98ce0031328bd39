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

/// Which receipts to read.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Newest {
    /// At most this many, newest first (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// The most bytes of the receipts file read for its newest receipts: its end.
const RECEIPTS_TAIL: u64 = 4 << 20;

/// `GET /v1/receipts/boxes`: each box's receipt (its label, provider, kind, from, to,
/// seconds, cost), newest first. A receipt names a box by a label of the receipts' own, never
/// by its id.
pub(crate) async fn receipts_of_boxes(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Query(q): Query<Newest>,
) -> Result<Json<Vec<serde_json::Value>>, ApiError> {
    admin(&key)?;
    let limit = q.limit.unwrap_or(100);
    if limit == 0 || limit > 1000 {
        return Err(ApiError::new(
            ErrorCode::Invalid,
            format!("limit: {limit} is not 1 to 1000"),
        ));
    }
    let file = receipts_file(&state)?;
    let tail = tokio::task::spawn_blocking(move || -> agentbox_core::Result<String> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open(&file)
            .map_err(|e| agentbox_core::Error::io(e, format!("reading {}", file.display())))?;
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let from = len.saturating_sub(RECEIPTS_TAIL);
        f.seek(SeekFrom::Start(from))
            .map_err(|e| agentbox_core::Error::io(e, format!("reading {}", file.display())))?;
        let mut text = String::new();
        f.take(RECEIPTS_TAIL)
            .read_to_string(&mut text)
            .map_err(|e| agentbox_core::Error::io(e, format!("reading {}", file.display())))?;
        // Past the bound, the first (partial) line is not a receipt to read.
        Ok(if from > 0 {
            text.split_once('\n')
                .map(|(_, rest)| rest.to_string())
                .unwrap_or_default()
        } else {
            text
        })
    })
    .await
    .map_err(|e| ApiError::new(ErrorCode::Unknown, e.to_string()))??;
    let newest: Vec<serde_json::Value> = tail
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| agentbox_transport::receipts::receipt_in(&v).cloned())
        .take(limit)
        .collect();
    Ok(Json(newest))
}

/// The receipts file, or `not_found` saying how to give one.
fn receipts_file(state: &AppState) -> Result<std::path::PathBuf, ApiError> {
    state.receipts().ok_or_else(|| {
        ApiError::new(
            ErrorCode::NotFound,
            "receipts: this server reads none (start it with --receipts FILE)",
        )
    })
}

/// `GET /v1/receipts`: the receipts' totals by provider and kind.
pub(crate) async fn receipts(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
) -> Result<Json<Vec<ReceiptTotal>>, ApiError> {
    admin(&key)?;
    let file = receipts_file(&state)?;
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

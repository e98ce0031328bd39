//! The agent's tools by name, as `agentbox tool` and `agentbox mcp` give them: pi's seven
//! (read, write, edit, bash, ls, grep, find) with pi's schemas and messages, and the four
//! process tools. A tool's failure is a result the model reads (`isError`), not an error of the
//! request; an unknown tool, or a box the key cannot reach, is.

use std::sync::Arc;

use agentbox_core::{Ctx, ErrorCode};
use agentbox_hands::BoxEnv;
use agentbox_hands::tools::{self, ToolResult};
use axum::Json;
use axum::extract::{Path, State};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::boxes::reach;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;

/// One tool, as a model is told of it.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ToolInfo {
    /// Its name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON Schema of its arguments.
    pub parameters: serde_json::Value,
    /// It changes nothing.
    pub read_only: bool,
}

/// The path of a tool call.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
pub struct ToolPath {
    /// The box's id, `provider:name`.
    pub id: String,
    /// The tool's name.
    pub name: String,
}

/// How long one tool call may take (a tool's own timeout, `bash`'s say, is shorter).
const TOOL_DEADLINE: std::time::Duration = std::time::Duration::from_secs(3600);

/// `GET /v1/tools`.
pub(crate) async fn list(Caller(_key): Caller) -> Json<Vec<ToolInfo>> {
    Json(
        tools::all()
            .iter()
            .map(|t| ToolInfo {
                name: t.name().to_string(),
                description: t.description().to_string(),
                parameters: t.schema(),
                read_only: t.read_only(),
            })
            .collect(),
    )
}

/// `POST /v1/boxes/{id}/tools/{name}`: the body is the tool's arguments.
pub(crate) async fn call(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<ToolPath>,
    Json(args): Json<serde_json::Value>,
) -> Result<Json<ToolResult>, ApiError> {
    let Some(tool) = tools::by_name(&p.name) else {
        let names: Vec<&str> = tools::all().iter().map(|t| t.name()).collect();
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("tool {:?}: no such tool ({})", p.name, names.join(", ")),
        ));
    };
    let env = BoxEnv::new(reach(&state, &key, &p.id).await?);
    let ctx = Ctx::background().with_timeout(TOOL_DEADLINE);
    let result = tools::run(&*tool, &env, args, &ctx).await;
    state.metrics.tool_call(&p.name, result.is_error);
    Ok(Json(result))
}

//! `GET /v1/providers`: every provider agentbox knows, whether this server can make its boxes,
//! and what it honours.

use std::sync::Arc;

use agentbox_core::Honours;
use agentbox_providers::registry;
use axum::Json;
use axum::extract::State;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;

/// One provider, as this server serves it.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ProviderInfo {
    /// Its name: what a create's `provider` says (`local`, `namespace`, `docker`...).
    pub name: String,
    /// What its boxes are.
    pub description: String,
    /// Whether this build of agentbox has it.
    pub compiled: bool,
    /// Whether this server can make its boxes now (it was made, and answered).
    pub available: bool,
    /// Why not, when it is not available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why_not: Option<String>,
    /// What a spec may ask of it (the lifecycle included: names, sleep, extend, relabel,
    /// snapshots, fork), when it is available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub honours: Option<Honours>,
    /// Whether a create that names no provider gets this one.
    pub default: bool,
}

/// The providers, in the registry's order; those the key may not use are left out.
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
) -> Result<Json<Vec<ProviderInfo>>, ApiError> {
    let mut out = Vec::new();
    for entry in registry::entries() {
        if let Some(allowed) = &key.limits.providers
            && !allowed.iter().any(|p| p == entry.name)
        {
            continue;
        }
        let made = match entry.compiled {
            true => Some(state.provider(entry.name).await),
            false => None,
        };
        let (available, why_not, honours) = match made {
            Some(Ok(p)) => (true, None, Some(p.honours())),
            Some(Err(e)) => (false, Some(e.message().to_string()), None),
            None => (
                false,
                Some(format!(
                    "this build of agentbox has no {} (its feature was off)",
                    entry.name
                )),
                None,
            ),
        };
        out.push(ProviderInfo {
            name: entry.name.to_string(),
            description: entry.description.to_string(),
            compiled: entry.compiled,
            available,
            why_not,
            honours,
            default: entry.name == state.default_provider,
        });
    }
    Ok(Json(out))
}

//! What every request shares: the keys, and the providers made from the registry (each made
//! once, at its first use, and kept).

use std::collections::HashMap;
use std::sync::Arc;

use agentbox_core::{Error, Provider, Result};
use agentbox_providers::registry::{self, Environment, Options};

use crate::keys::Keys;

/// The label the service writes on every box it makes: the id of the key that made it (never
/// the key). A spec may not set it.
pub const OWNER_LABEL: &str = "agentbox-server.owner";

/// How a server is set up. See [`crate::router`].
pub struct ServerOptions {
    /// Who may call it.
    pub keys: Arc<Keys>,
    /// The variables and helper program providers are made from.
    pub environment: Environment,
    /// How providers make boxes (a runner in each where they can, by default).
    pub provider_options: Options,
    /// The provider a create that names none uses.
    pub default_provider: String,
    /// The largest request body taken, in bytes (a larger one is answered 413).
    pub max_body: usize,
}

impl ServerOptions {
    /// A server over `keys` with the registry's providers on this process's variables, the
    /// default provider `local`, and 16 MiB bodies.
    pub fn new(keys: Arc<Keys>) -> Self {
        ServerOptions {
            keys,
            environment: Environment::from_process(),
            provider_options: Options::default(),
            default_provider: "local".into(),
            max_body: 16 << 20,
        }
    }
}

pub(crate) struct AppState {
    pub(crate) keys: Arc<Keys>,
    pub(crate) default_provider: String,
    environment: Environment,
    provider_options: Options,
    providers: tokio::sync::Mutex<HashMap<String, Arc<dyn Provider>>>,
}

impl AppState {
    pub(crate) fn new(o: ServerOptions) -> Self {
        AppState {
            keys: o.keys,
            default_provider: o.default_provider,
            environment: o.environment,
            provider_options: o.provider_options,
            providers: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The provider called `name`, made at its first use (a failure is answered and tried
    /// again next time).
    pub(crate) async fn provider(&self, name: &str) -> Result<Arc<dyn Provider>> {
        let entry = registry::find(name)?;
        let mut made = self.providers.lock().await;
        if let Some(p) = made.get(entry.name) {
            return Ok(p.clone());
        }
        let p = entry
            .make(&self.provider_options, &self.environment)
            .await
            .map_err(|e| Error::new(e.code(), format!("provider {name}: {}", e.message())))?;
        tracing::info!(provider = entry.name, "provider made");
        made.insert(entry.name.to_string(), p.clone());
        Ok(p)
    }
}

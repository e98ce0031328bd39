//! The service's own API as the benches call it: a key's client of a server on loopback.

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Error, Result};
use serde_json::Value;

/// A client of the service's HTTP API, with a key.
pub(super) struct Service {
    pub(super) url: String,
    pub(super) key: String,
    pub(super) http: reqwest::Client,
}

impl Service {
    /// A client of the server at `url` (plain HTTP on loopback) with `key`.
    pub(super) fn new(url: String, key: String) -> Result<Service> {
        // Plain HTTP on loopback: TLS is configured only because the client must have it.
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::unknown(format!("TLS: {e}")))?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .no_proxy()
            .timeout(Duration::from_secs(300))
            .build()
            .map_err(|e| Error::unknown(format!("an HTTP client: {e}")))?;
        Ok(Service { url, key, http })
    }

    /// `method path` with `body`, its JSON answer; an answer not 2xx is an error naming it.
    pub(super) async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value> {
        let mut r = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(&self.key);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let answer = r
            .send()
            .await
            .map_err(|e| Error::transfer_failed(format!("{path}: {e}")))?;
        let status = answer.status();
        let text = answer
            .text()
            .await
            .map_err(|e| Error::transfer_failed(format!("{path}: {e}")))?;
        if !status.is_success() {
            return Err(Error::unknown(format!("{path}: {status}: {text}")));
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

//! How the proxy turns a name into addresses: the system's resolver, or one a test supplies.

use std::net::IpAddr;

use async_trait::async_trait;

/// Resolves a name to its addresses.
#[async_trait]
pub trait Resolver: Send + Sync {
    /// The addresses of `host`, in the order to try them.
    async fn resolve(&self, host: &str) -> std::io::Result<Vec<IpAddr>>;
}

/// The system's resolver (`getaddrinfo`, through tokio).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemResolver;

#[async_trait]
impl Resolver for SystemResolver {
    async fn resolve(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
        Ok(tokio::net::lookup_host((host, 0)).await?.map(|a| a.ip()).collect())
    }
}

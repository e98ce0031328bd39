//! TLS for a network: a listener that hands [`crate::serve`] connections already through their
//! handshake (rustls, with the ring provider the workspace already links). Each handshake runs
//! on its own task within [`crate::HEADER_DEADLINE`], so a client that opens a connection and
//! says nothing holds up no one. ALPN offers HTTP/2 and HTTP/1.1.

use std::path::Path;
use std::sync::Arc;

use agentbox_core::{Error, Result};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::listen::{Accept, HEADER_DEADLINE};

/// The most TLS handshakes under way at once.
pub const MAX_HANDSHAKES: usize = 1024;

/// The server's side of TLS from a PEM certificate chain and its PEM private key.
///
/// ```no_run
/// let config = agentbox_server::tls::config("cert.pem".as_ref(), "key.pem".as_ref()).unwrap();
/// ```
pub fn config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| Error::invalid(format!("--tls-cert {}: {e}", cert.display())))?
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::invalid(format!("--tls-cert {}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(Error::invalid(format!(
            "--tls-cert {}: no PEM certificate in it",
            cert.display()
        )));
    }
    let private =
        PrivateKeyDer::from_pem_file(key).map_err(|e| Error::invalid(format!("--tls-key {}: {e}", key.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::invalid(format!("TLS: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, private)
        .map_err(|e| Error::invalid(format!("--tls-cert and --tls-key: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A TCP listener whose connections come out of their TLS handshake.
pub struct TlsListener {
    ready: mpsc::Receiver<TlsStream<TcpStream>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Accept on `tcp` with `config`.
    pub fn new(tcp: TcpListener, config: Arc<ServerConfig>) -> Self {
        let (tx, ready) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
        let accepting = tokio::spawn(async move {
            loop {
                let (io, peer) = match tcp.accept().await {
                    Ok(c) => {
                        crate::listen::no_delay(&c.0);
                        c
                    }
                    Err(e) => {
                        tracing::warn!("accepting a connection: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // A flood of connections that never handshake is bounded: past the most, a new
                // one is closed at once.
                let Ok(slot) = handshakes.clone().try_acquire_owned() else {
                    tracing::debug!(%peer, "{MAX_HANDSHAKES} TLS handshakes under way: a new connection closed");
                    continue;
                };
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let _slot = slot;
                    match tokio::time::timeout(HEADER_DEADLINE, acceptor.accept(io)).await {
                        Ok(Ok(s)) => {
                            let _ = tx.send(s).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, "a TLS handshake failed: {e}"),
                        Err(_) => {
                            tracing::debug!(%peer, "a TLS handshake took over {} s: cut", HEADER_DEADLINE.as_secs())
                        }
                    }
                });
            }
        });
        TlsListener { ready, accepting }
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl Accept for TlsListener {
    type Io = TlsStream<TcpStream>;
    async fn accept(&mut self) -> std::io::Result<Self::Io> {
        self.ready
            .recv()
            .await
            .ok_or_else(|| std::io::Error::other("the TLS listener stopped"))
    }
}

//! HTTPS for the fake: a CA and a server certificate made at start (ECDSA P-256, by rcgen),
//! the CA written beside the kubeconfig for clients to trust, and an accept loop serving the
//! router over TLS with HTTP/1.1 upgrades (exec and port-forward).
//!
//! Why TLS at all: kubectl reads a kubeconfig user's credentials only for a TLS server
//! (client-go's clientcmd), so over `http://` it sends no token and every request would be
//! 401. A real API server is HTTPS too.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Error, Result};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// How long a client has to finish its TLS handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// The server's TLS setup and the CA's certificate (PEM) that clients trust.
pub(crate) fn make(ip: IpAddr) -> Result<(rustls::ServerConfig, String)> {
    let bad = |e: rcgen::Error| Error::unknown(format!("making the fake's certificate: {e}"));
    let ca_key = rcgen::KeyPair::generate().map_err(bad)?;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(bad)?;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "agentbox-fake-ca");
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).map_err(bad)?;
    let key = rcgen::KeyPair::generate().map_err(bad)?;
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    if !ip.is_unspecified() && !ip.is_loopback() {
        names.push(ip.to_string());
    }
    let mut leaf = rcgen::CertificateParams::new(names).map_err(bad)?;
    leaf.distinguished_name.push(rcgen::DnType::CommonName, "agentbox-fake");
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = leaf.signed_by(&key, &ca_cert, &ca_key).map_err(bad)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::unknown(format!("TLS versions: {e}")))?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .map_err(|e| Error::unknown(format!("the fake's TLS setup: {e}")))?;
    // HTTP/1.1 only: exec and port-forward upgrade the connection, which HTTP/2 cannot.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((config, ca_cert.pem()))
}

/// Serve `app` on `listener`, over TLS when `tls` is given, until `stop` fires; each
/// connection is a task, aborted at the stop.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<rustls::ServerConfig>,
    app: axum::Router,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let acceptor = tls.map(|c| tokio_rustls::TlsAcceptor::from(Arc::new(c)));
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            got = listener.accept() => {
                let (tcp, peer): (tokio::net::TcpStream, SocketAddr) = match got {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let (acceptor, app) = (acceptor.clone(), app.clone());
                conns.spawn(async move {
                    let svc = TowerToHyperService::new(app);
                    let http = hyper::server::conn::http1::Builder::new();
                    let done = match acceptor {
                        Some(a) => match tokio::time::timeout(HANDSHAKE, a.accept(tcp)).await {
                            Ok(Ok(s)) => http.serve_connection(TokioIo::new(s), svc).with_upgrades().await,
                            _ => {
                                tracing::debug!(%peer, "a TLS handshake failed");
                                return;
                            }
                        },
                        None => http.serve_connection(TokioIo::new(tcp), svc).with_upgrades().await,
                    };
                    if let Err(e) = done {
                        tracing::debug!(%peer, error = %e, "a connection ended");
                    }
                });
            }
        }
    }
    conns.abort_all();
}

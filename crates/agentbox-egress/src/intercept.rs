//! A box's HTTPS to a host some secret names, decrypted on its way out: the proxy answers the
//! box's TLS with a certificate for the name signed by the box's own authority, puts each
//! secret's value into the headers of each request ([`Secrets::rewrite`]), and sends it on over
//! a TLS connection of its own to the real host, whose certificate it checks against this
//! machine's roots.
//!
//! The authority is made when the proxy starts and lives in its memory alone: its certificate
//! goes into the box (the box trusts it), its key never leaves the proxy. It is constrained to
//! the names the box's secrets go to, so even a stolen key could not speak for another site.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::refusal::Refusal;
use crate::secrets::Secrets;

/// How long either TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);
/// At most this many hosts' certificates are kept made.
const MAX_LEAVES: usize = 256;

/// A box's secrets and the authority its decrypted connections are answered with.
pub struct Interceptor {
    secrets: Secrets,
    ca_key: rcgen::KeyPair,
    ca: rcgen::Certificate,
    client: Arc<rustls::ClientConfig>,
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

type Body = Either<Incoming, Full<Bytes>>;

impl Interceptor {
    /// An authority of its own for `secrets`, and a client trusting `roots` (this machine's).
    pub fn new(secrets: Secrets, roots: rustls::RootCertStore) -> Result<Interceptor, String> {
        let bad = |e: rcgen::Error| format!("making the box's certificate authority: {e}");
        let ca_key = rcgen::KeyPair::generate().map_err(bad)?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(bad)?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        // A name and serial of its own: a fork's store may still hold its parent's authority
        // (dead with its parent's proxy), and a client looking an issuer up by name must find
        // this one.
        let mut id = [0u8; 16];
        getrandom::fill(&mut id)
            .map_err(|e| format!("making the box's certificate authority: no random bytes: {e}"))?;
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("agentbox egress proxy {}", &hex[..16]),
        );
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&id));
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let mut permitted: Vec<rcgen::GeneralSubtree> = Vec::new();
        for entry in secrets.host_entries() {
            let name = match &entry.target {
                agentbox_core::AllowTarget::Domain(d) | agentbox_core::AllowTarget::Below(d) => d.clone(),
                _ => continue,
            };
            let subtree = rcgen::GeneralSubtree::DnsName(name);
            if !permitted.contains(&subtree) {
                permitted.push(subtree);
            }
        }
        params.name_constraints = Some(rcgen::NameConstraints {
            permitted_subtrees: permitted,
            excluded_subtrees: Vec::new(),
        });
        let ca = params.self_signed(&ca_key).map_err(bad)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("the proxy's TLS client: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Interceptor {
            secrets,
            ca_key,
            ca,
            client: Arc::new(client),
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// This machine's roots: the system's store, or `SSL_CERT_FILE` / `SSL_CERT_DIR` where set.
    pub fn machine_roots() -> Result<rustls::RootCertStore, String> {
        let found = rustls_native_certs::load_native_certs();
        let mut roots = rustls::RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            let why = found.errors.first().map(|e| format!(": {e}")).unwrap_or_default();
            return Err(format!(
                "no root certificate found on this machine to check the secrets' hosts with{why} \
                 (install ca-certificates, or set SSL_CERT_FILE)"
            ));
        }
        Ok(roots)
    }

    /// The authority's certificate, PEM: what the box trusts.
    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// The secrets it holds.
    pub fn secrets(&self) -> &Secrets {
        &self.secrets
    }

    /// The server side of a TLS connection for `host`: a certificate of its own, made once.
    fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        let host = host.to_ascii_lowercase();
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = leaves.get(&host) {
            return Ok(c.clone());
        }
        let bad = |e: rcgen::Error| format!("making a certificate for {host}: {e}");
        let key = rcgen::KeyPair::generate().map_err(bad)?;
        let mut params = rcgen::CertificateParams::new(vec![host.clone()]).map_err(bad)?;
        params.distinguished_name.push(rcgen::DnType::CommonName, host.clone());
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let leaf = params.signed_by(&key, &self.ca, &self.ca_key).map_err(bad)?;
        let chain: Vec<CertificateDer<'static>> = vec![leaf.der().clone(), self.ca.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("the proxy's TLS server: {e}"))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| format!("the certificate for {host}: {e}"))?;
        // HTTP/1.1 only: each request is read, checked and rewritten on its own.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(host, config.clone());
        Ok(config)
    }

    /// Open the proxy's own TLS connection to `host` over `upstream` (connected to the address
    /// the policy checked), checking the host's certificate.
    pub(crate) async fn connect_upstream(
        &self,
        host: &str,
        upstream: tokio::net::TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
        let name = ServerName::try_from(host.to_string()).map_err(|e| format!("{host}: not a server name: {e}"))?;
        let connector = tokio_rustls::TlsConnector::from(self.client.clone());
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(name, upstream)).await {
            Err(_) => Err(format!("TLS to {host}: no handshake within 15 s")),
            Ok(Err(e)) => Err(format!("TLS to {host}: {e}")),
            Ok(Ok(s)) => Ok(s),
        }
    }

    /// Serve the box's decrypted connection to `host:port`: each request checked, its
    /// placeholders replaced, and sent on `upstream`; a leak refused `403` and told to `refused`.
    pub(crate) async fn serve<S>(
        self: &Arc<Self>,
        client: S,
        host: &str,
        port: u16,
        upstream: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
        refused: Arc<dyn Fn(Refusal) + Send + Sync>,
    ) -> Result<(), String>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.server_config(host)?);
        let client = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(client)).await {
            Err(_) => return Err(format!("the box's TLS to {host}: no handshake within 15 s")),
            Ok(Err(e)) => return Err(format!("the box's TLS to {host}: {e}")),
            Ok(Ok(s)) => s,
        };
        let (sender, connection) = hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(upstream))
            .await
            .map_err(|e| format!("HTTP to {host}: {e}"))?;
        let upstream_done = tokio::spawn(connection);
        let sender = Arc::new(tokio::sync::Mutex::new(sender));
        let this = self.clone();
        let host = host.to_string();
        let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            let (this, sender, host, refused) = (this.clone(), sender.clone(), host.clone(), refused.clone());
            async move {
                // The request must be for the host this connection was opened to and checked
                // for: a Host (or an absolute URL) naming another would have a server behind
                // the same address (a CDN's) route the value to a site of the box's choosing.
                if let Some(other) = other_host(&req, &host, port) {
                    let why = format!("the request names host {other:?}, and this connection is to {host}:{port}");
                    tracing::warn!(host = %host, port, named = %other, "egress refused: a decrypted request for another host");
                    refused(Refusal {
                        at_ms: agentbox_core::now_ms(),
                        host: host.clone(),
                        port,
                        address: None,
                        rule: "another host in a decrypted request".into(),
                        why: why.clone(),
                    });
                    return Ok::<_, hyper::Error>(answer(403, &why));
                }
                let uri = req.uri().to_string();
                match this.secrets.rewrite(&host, port, &uri, req.headers_mut()) {
                    Err(leak) => {
                        let why = leak.why(&host);
                        tracing::warn!(host = %host, port, secret = %leak.secret, place = %leak.place, "egress refused: attempted leak of a secret");
                        refused(Refusal {
                            at_ms: agentbox_core::now_ms(),
                            host: host.clone(),
                            port,
                            address: None,
                            rule: leak.rule(),
                            why: why.clone(),
                        });
                        return Ok(answer(403, &why));
                    }
                    Ok(n) => tracing::debug!(host = %host, port, replaced = n, "request sent on with its secrets"),
                }
                let mut sender = sender.lock().await;
                if sender.ready().await.is_err() {
                    return Ok(answer(502, &format!("{host} closed the connection")));
                }
                match sender.send_request(req).await {
                    Ok(r) => Ok(r.map(Either::Left)),
                    Err(e) => Ok(answer(502, &format!("{host}: {e}"))),
                }
            }
        });
        let served = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(client), service)
            .await;
        upstream_done.abort();
        served.map_err(|e| e.to_string())
    }
}

/// The host a decrypted request names other than `host` (on `port`): its absolute URL's
/// authority, or its `Host` header (a missing one names none). Names compare without case or
/// a trailing dot, with or without the port.
fn other_host<B>(req: &hyper::Request<B>, host: &str, port: u16) -> Option<String> {
    let same = |named: &str| {
        let (name, named_port) = match named.rsplit_once(':') {
            // `[v6]:port`, or `name:port`; a bare IPv6 literal has colons and no port.
            Some((n, p)) if !n.contains(':') || n.ends_with(']') => (n, Some(p.parse::<u16>().ok())),
            _ => (named, None),
        };
        let port_ok = match named_port {
            None => true,
            Some(Some(p)) => p == port,
            Some(None) => false,
        };
        port_ok && name.trim_end_matches('.').eq_ignore_ascii_case(host)
    };
    if let Some(a) = req.uri().authority()
        && !same(a.as_str())
    {
        return Some(a.as_str().to_string());
    }
    let named = req.headers().get(hyper::header::HOST)?;
    let named = String::from_utf8_lossy(named.as_bytes()).into_owned();
    (!same(&named)).then_some(named)
}

/// A short answer of the proxy's own to a decrypted request.
fn answer(status: u16, why: &str) -> hyper::Response<Body> {
    let body = format!("agentbox egress: {why}\n");
    let mut r = hyper::Response::new(Either::Right(Full::new(Bytes::from(body))));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::BAD_GATEWAY);
    let h = r.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain"),
    );
    h.insert(
        "x-agentbox-egress",
        hyper::header::HeaderValue::from_static(if status == 403 { "refused" } else { "proxy" }),
    );
    h.insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("close"),
    );
    r
}

/// A stream with bytes already read from it put back in front: what a client sent after its
/// `CONNECT` head, before the answer, is the start of its TLS.
pub(crate) struct Prefixed<S> {
    prefix: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    pub(crate) fn new(prefix: Vec<u8>, inner: S) -> Self {
        Prefixed { prefix, at: 0, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.at < self.prefix.len() {
            let n = buf.remaining().min(self.prefix.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.prefix[at..at + n]);
            self.at += n;
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(uri: &str, host: Option<&str>) -> hyper::Request<()> {
        let mut b = hyper::Request::builder().uri(uri);
        if let Some(h) = host {
            b = b.header(hyper::header::HOST, h);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn a_request_for_another_host_than_its_connection_is_named() {
        for (uri, host) in [
            ("/x", Some("api.test")),
            ("/x", Some("API.test.")),
            ("/x", Some("api.test:443")),
            ("/x", None),
            ("https://api.test/x", Some("api.test")),
        ] {
            assert_eq!(other_host(&req(uri, host), "api.test", 443), None, "{uri} {host:?}");
        }
        for (uri, host, named) in [
            ("/x", Some("evil.test"), "evil.test"),
            ("/x", Some("api.test:8443"), "api.test:8443"),
            ("/x", Some("api.test.evil.test"), "api.test.evil.test"),
            ("https://evil.test/x", Some("api.test"), "evil.test"),
        ] {
            assert_eq!(
                other_host(&req(uri, host), "api.test", 443).as_deref(),
                Some(named),
                "{uri} {host:?}"
            );
        }
    }
}

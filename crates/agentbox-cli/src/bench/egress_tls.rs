//! `agentbox bench egress`'s HTTPS pairs: what decrypting a request to put a secret in it
//! costs, beside a direct TLS connection and one the proxy passes through untouched.
//!
//! All three sides run in this process on loopback, so the ratios are the proxy's alone: an
//! HTTPS server for `bench.test` (a certificate of an authority made for the run), and
//! agentbox's egress proxy (`agentbox_egress::Proxy`) twice, on two ports: one holding no
//! secret (a `CONNECT` to `bench.test` is a tunnel), one holding a secret for `bench.test` (its
//! TLS is answered by the box's authority, each request's placeholder replaced, and sent on
//! over the proxy's own TLS). The client sends the placeholder; the server refuses any request
//! whose `Authorization` is not the value, so a sample where nothing was replaced fails.

use std::net::IpAddr;
use std::sync::Arc;

use agentbox_core::{Allowlist, Error, Result};
use agentbox_egress::{Interceptor, Policy, Proxy, Resolver, SecretPlan, SecretRule, Secrets};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::egress::{listen, read_head};
use super::measure::{Pair, measure_all, pair, side};

/// The name the server answers for.
const HOST: &str = "bench.test";
/// What the box holds, and what the server must receive instead.
const PLACEHOLDER: &str = "agentbox-placeholder-0123456789abcdef0123456789abcdef";
const VALUE: &str = "bench-secret-value";
/// The body of one bulk download.
pub(super) const BULK_BYTES: u64 = 64 << 20;
/// The requests of one latency sample, each on a connection of its own.
pub(super) const REQUESTS: u32 = 20;
/// The body of each of those.
const SMALL_BYTES: u64 = 1024;

/// Every name is `127.0.0.1`: the bench's server.
struct Loopback;

#[async_trait::async_trait]
impl Resolver for Loopback {
    async fn resolve(&self, _host: &str) -> std::io::Result<Vec<IpAddr>> {
        Ok(vec![IpAddr::from([127, 0, 0, 1])])
    }
}

fn bad(what: &str) -> impl Fn(String) -> Error + '_ {
    move |e| Error::unknown(format!("bench egress (https): {what}: {e}"))
}

/// The server, the two proxies, and the clients' settings.
struct Setup {
    server: u16,
    tunnel: u16,
    intercepting: u16,
    /// Trusts the server's authority (direct and tunnelled).
    site_client: Arc<rustls::ClientConfig>,
    /// Trusts the box's authority (intercepted), as a box with the secret does.
    box_client: Arc<rustls::ClientConfig>,
}

fn client(roots: rustls::RootCertStore) -> Result<Arc<rustls::ClientConfig>> {
    let c = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("a TLS client")(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(c))
}

async fn setup() -> Result<Setup> {
    let e = |e: rcgen::Error| bad("the bench's certificates")(e.to_string());
    let ca_key = rcgen::KeyPair::generate().map_err(e)?;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(e)?;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).map_err(e)?;
    let key = rcgen::KeyPair::generate().map_err(e)?;
    let leaf = rcgen::CertificateParams::new(vec![HOST.to_string()])
        .map_err(e)?
        .signed_by(&key, &ca, &ca_key)
        .map_err(e)?;
    let server = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("the server's TLS")(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .map_err(|e| bad("the server's TLS")(e.to_string()))?;
    let mut site_roots = rustls::RootCertStore::empty();
    site_roots
        .add(ca.der().clone())
        .map_err(|e| bad("the site's root")(e.to_string()))?;
    let server_port = serve_site(Arc::new(server)).await?;
    let allow = Allowlist::parse(&[format!("{HOST}:{server_port}"), format!("127.0.0.1/32:{server_port}")])?;
    let plain = Proxy::new(Policy::new(allow.clone()), Arc::new(Loopback), Arc::new(|_| {}));
    let secrets = Secrets::new(SecretPlan {
        secrets: vec![SecretRule {
            name: "BENCH_TOKEN".into(),
            placeholder: PLACEHOLDER.into(),
            hosts: vec![HOST.into()],
            value: VALUE.into(),
        }],
    })
    .map_err(bad("the secret"))?;
    let interceptor = Interceptor::new(secrets, site_roots.clone()).map_err(bad("the box's authority"))?;
    let mut box_roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile_certs(&interceptor.ca_pem())? {
        box_roots.add(c).map_err(|e| bad("the box's root")(e.to_string()))?;
    }
    let intercepting =
        Proxy::new(Policy::new(allow), Arc::new(Loopback), Arc::new(|_| {})).with_secrets(Arc::new(interceptor));
    Ok(Setup {
        server: server_port,
        tunnel: serve_proxy(plain).await?,
        intercepting: serve_proxy(intercepting).await?,
        site_client: client(site_roots)?,
        box_client: client(box_roots)?,
    })
}

/// The certificates of a PEM text.
fn rustls_pemfile_certs(pem: &str) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad("the box's authority's PEM")(e.to_string()))
}

async fn serve_proxy(proxy: Proxy) -> Result<u16> {
    let (l, port) = listen().await?;
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            let _ = c.set_nodelay(true);
            let proxy = proxy.clone();
            tokio::spawn(async move {
                let _ = proxy.serve(c).await;
            });
        }
    });
    Ok(port)
}

/// The site: each request (`GET /N`) answered with N bytes if its `Authorization` is the
/// secret's value (or the direct clients' own), `403` otherwise; keep-alive, until the client
/// closes.
async fn serve_site(config: Arc<rustls::ServerConfig>) -> Result<u16> {
    let (l, port) = listen().await?;
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            let _ = c.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(c).await else { return };
                while let Ok(head) = read_head(&mut tls).await {
                    let n: u64 = head
                        .split_whitespace()
                        .nth(1)
                        .and_then(|p| p.trim_start_matches('/').parse().ok())
                        .unwrap_or(0)
                        .min(BULK_BYTES);
                    let authorized = head
                        .lines()
                        .any(|l| l.eq_ignore_ascii_case(&format!("authorization: Bearer {VALUE}")));
                    if !authorized {
                        let _ = tls
                            .write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                            .await;
                        return;
                    }
                    if write_body(&mut tls, n).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(port)
}

async fn write_body<W: AsyncWrite + Unpin>(w: &mut W, n: u64) -> std::io::Result<()> {
    w.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n").as_bytes())
        .await?;
    super::egress::write_zeros(w, n).await?;
    w.flush().await
}

/// How one sample reaches the site.
#[derive(Clone, Copy)]
enum Way {
    /// Straight to the server.
    Direct,
    /// A `CONNECT` through the proxy with no secret: a tunnel.
    Tunnel,
    /// A `CONNECT` through the proxy holding the secret: decrypted and rewritten.
    Intercepted,
}

/// `count` requests of `bytes` each, each on a connection of its own, every byte read; an
/// error unless each answer was whole.
async fn fetch(s: &Setup, way: Way, bytes: u64, count: u32) -> Result<()> {
    for _ in 0..count {
        let port = match way {
            Way::Direct => s.server,
            Way::Tunnel => s.tunnel,
            Way::Intercepted => s.intercepting,
        };
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| Error::io(e, "bench egress (https): connecting"))?;
        let _ = tcp.set_nodelay(true);
        if !matches!(way, Way::Direct) {
            tcp.write_all(format!("CONNECT {HOST}:{0} HTTP/1.1\r\nHost: {HOST}:{0}\r\n\r\n", s.server).as_bytes())
                .await
                .map_err(|e| Error::io(e, "bench egress (https): CONNECT"))?;
            let said = read_head(&mut tcp)
                .await
                .map_err(|e| Error::io(e, "bench egress (https): the proxy's answer"))?;
            if !said.starts_with("HTTP/1.1 200") {
                return Err(bad("the proxy")(said));
            }
        }
        let config = match way {
            Way::Intercepted => s.box_client.clone(),
            _ => s.site_client.clone(),
        };
        let name = rustls::pki_types::ServerName::try_from(HOST).map_err(|e| bad("the name")(e.to_string()))?;
        let mut tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| Error::io(e, "bench egress (https): the TLS handshake"))?;
        let token = match way {
            Way::Intercepted => PLACEHOLDER,
            _ => VALUE,
        };
        tls.write_all(
            format!(
                "GET /{bytes} HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .map_err(|e| Error::io(e, "bench egress (https): the request"))?;
        let head = read_head(&mut tls)
            .await
            .map_err(|e| Error::io(e, "bench egress (https): the answer"))?;
        if !head.starts_with("HTTP/1.1 200") {
            return Err(bad("the site")(head.lines().next().unwrap_or("").to_string()));
        }
        let mut got = 0u64;
        let mut buf = vec![0u8; 256 << 10];
        while got < bytes {
            let n = tls
                .read(&mut buf)
                .await
                .map_err(|e| Error::io(e, "bench egress (https): the body"))?;
            if n == 0 {
                break;
            }
            got += n as u64;
        }
        if got != bytes {
            return Err(bad("the body")(format!("{got} bytes of {bytes}")));
        }
    }
    Ok(())
}

/// The HTTPS pairs: latency (requests each on its own connection) and throughput (one bulk
/// download), the intercepted side against the direct and the tunnelled ones.
pub(super) async fn pairs(n: u32) -> Result<Vec<Pair>> {
    let s = setup().await?;
    let s = &s;
    let mut out = Vec::new();
    for (what, bytes, count) in [
        (format!("https: {REQUESTS} requests"), SMALL_BYTES, REQUESTS),
        (format!("https: {} MiB download", BULK_BYTES >> 20), BULK_BYTES, 1),
    ] {
        let stats = measure_all(
            n,
            vec![
                side(move || fetch(s, Way::Direct, bytes, count)),
                side(move || fetch(s, Way::Tunnel, bytes, count)),
                side(move || fetch(s, Way::Intercepted, bytes, count)),
            ],
        )
        .await?;
        out.push(pair(
            &format!("{what}, secret put in"),
            "a direct TLS connection",
            "the same decrypted by the egress proxy, its secret put in, sent on over the proxy's TLS",
            stats[0],
            stats[2],
        ));
        out.push(pair(
            &format!("{what}, vs tunnel"),
            "the same through the egress proxy untouched (CONNECT, a host no secret names)",
            "the same decrypted by the egress proxy, its secret put in",
            stats[1],
            stats[2],
        ));
    }
    Ok(out)
}

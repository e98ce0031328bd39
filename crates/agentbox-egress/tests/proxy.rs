//! The proxy against servers this test starts in a network namespace of its own
//! (`agentbox_testing::netns`: the test runs again in namespaces it makes; nothing outside is
//! reached):
//! `198.51.100.7` stands for the internet, `127.0.0.1` for this machine's inside, and
//! `169.254.169.254` for a cloud's metadata service. Names resolve through a resolver the
//! test scripts.
//!
//! A machine that cannot make the namespace (no `unshare`, or unprivileged user namespaces
//! off) says so loudly and skips; CI (`CI=true`) fails instead.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use agentbox_core::Allowlist;
use agentbox_egress::{Policy, Proxy, Refusal, Resolver};
use async_trait::async_trait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const INTERNET: &str = "198.51.100.7";
const METADATA: &str = "169.254.169.254";

/// Whether this process is the test's child in namespaces of its own, with the internet's and
/// the metadata service's addresses on its loopback (go on); else the test ran there and this
/// answers false.
fn in_namespace(test: &str) -> bool {
    if !agentbox_testing::netns::isolated(test) {
        return false;
    }
    for addr in [INTERNET, METADATA] {
        let st = std::process::Command::new("ip")
            .args(["addr", "add", &format!("{addr}/32"), "dev", "lo"])
            .status()
            .expect("running ip");
        assert!(st.success(), "ip addr add {addr}/32 dev lo");
    }
    true
}

/// Names as the test says, each answer list taken in turn (the last kept), every call counted.
#[derive(Default)]
struct Scripted {
    answers: Mutex<HashMap<String, Vec<Vec<IpAddr>>>>,
    calls: AtomicUsize,
}

impl Scripted {
    fn with(self, name: &str, answers: &[&[&str]]) -> Self {
        let a = answers
            .iter()
            .map(|l| l.iter().map(|s| s.parse().unwrap()).collect())
            .collect();
        self.answers.lock().unwrap().insert(name.into(), a);
        self
    }
}

#[async_trait]
impl Resolver for Scripted {
    async fn resolve(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut a = self.answers.lock().unwrap();
        match a.get_mut(host) {
            Some(l) if l.len() > 1 => Ok(l.remove(0)),
            Some(l) => Ok(l[0].clone()),
            None => Err(std::io::Error::new(std::io::ErrorKind::NotFound, "no such name")),
        }
    }
}

/// A server on `addr:port` answering every request with `name`; how many connections it took.
async fn server(addr: &str, port: u16, name: &'static str) -> Arc<AtomicUsize> {
    let l = tokio::net::TcpListener::bind((addr, port)).await.unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let body = format!(
                    "{name} saw {}",
                    String::from_utf8_lossy(&got).lines().next().unwrap_or("")
                );
                let _ = c
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    seen
}

struct Setup {
    socket: std::path::PathBuf,
    refusals: Arc<Mutex<Vec<Refusal>>>,
    _dir: tempfile::TempDir,
}

/// The proxy on a unix socket (as a box reaches it) with `list`, `resolver`, and this
/// machine's own addresses as the policy finds them (`real_own`) or none.
fn proxy(list: &[&str], resolver: Arc<dyn Resolver>, real_own: bool) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("egress.sock");
    let mut policy = Policy::new(Allowlist::parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap());
    if !real_own {
        policy = policy.with_own_addresses(|_| false);
    }
    let refusals = Arc::new(Mutex::new(Vec::new()));
    let sink = refusals.clone();
    let p = Proxy::new(policy, resolver, Arc::new(move |r| sink.lock().unwrap().push(r)));
    let l = tokio::net::UnixListener::bind(&socket).unwrap();
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            let p = p.clone();
            tokio::spawn(async move {
                let _ = p.serve(c).await;
            });
        }
    });
    Setup {
        socket,
        refusals,
        _dir: dir,
    }
}

/// Through the proxy: `CONNECT target`, then a GET in the tunnel. The whole answer.
async fn via_connect(s: &Setup, target: &str) -> String {
    let mut c = tokio::net::UnixStream::connect(&s.socket).await.unwrap();
    c.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if c.read(&mut b).await.unwrap() == 0 {
            break;
        }
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    if !head.starts_with("HTTP/1.1 200") {
        let mut rest = String::new();
        let _ = c.read_to_string(&mut rest).await;
        return head + &rest;
    }
    c.write_all(b"GET /tunnelled HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut rest = String::new();
    c.read_to_string(&mut rest).await.unwrap();
    rest
}

/// Through the proxy: a plain HTTP request in absolute form. The whole answer.
async fn via_http(s: &Setup, url: &str) -> String {
    let mut c = tokio::net::UnixStream::connect(&s.socket).await.unwrap();
    c.write_all(format!("GET {url} HTTP/1.1\r\nProxy-Connection: keep-alive\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut all = String::new();
    c.read_to_string(&mut all).await.unwrap();
    all
}

fn rules(s: &Setup) -> Vec<String> {
    s.refusals.lock().unwrap().iter().map(|r| r.rule.clone()).collect()
}

#[test]
fn an_allowed_name_reaches_its_server_and_nothing_else_passes() {
    if !in_namespace("an_allowed_name_reaches_its_server_and_nothing_else_passes") {
        return;
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let internet = server(INTERNET, 80, "internet").await;
            let inside = server("127.0.0.1", 8080, "inside").await;
            let metadata = server(METADATA, 80, "metadata").await;
            let resolver = Arc::new(
                Scripted::default()
                    .with("allowed.test", &[&[INTERNET]])
                    .with("other.test", &[&[INTERNET]])
                    .with("inside.test", &[&["127.0.0.1"]])
                    .with("metadata.test", &[&[METADATA]]),
            );
            let s = proxy(
                &["allowed.test:80", "inside.test", "metadata.test"],
                resolver.clone(),
                false,
            );
            // The allowed name, by CONNECT and by plain HTTP (sent on in origin form).
            let a = via_connect(&s, "allowed.test:80").await;
            assert!(a.contains("internet saw GET /tunnelled"), "{a}");
            let a = via_http(&s, "http://allowed.test/plain?x=1").await;
            assert!(a.contains("internet saw GET /plain?x=1 HTTP/1.1"), "{a}");
            assert_eq!(internet.load(Ordering::SeqCst), 2);
            // A name not listed, a port not listed, an address written outright: refused
            // before anything is resolved or reached.
            let before = resolver.calls.load(Ordering::SeqCst);
            for t in ["other.test:80", "allowed.test:443", &format!("{INTERNET}:80")] {
                let a = via_connect(&s, t).await;
                assert!(a.starts_with("HTTP/1.1 403") && a.contains("no entry"), "{t}: {a}");
            }
            assert_eq!(
                resolver.calls.load(Ordering::SeqCst),
                before,
                "a refused name is not resolved"
            );
            // A listed name that resolves to loopback, or to the metadata address.
            let a = via_connect(&s, "inside.test:8080").await;
            assert!(a.starts_with("HTTP/1.1 403") && a.contains("loopback"), "{a}");
            let a = via_http(&s, "http://metadata.test/latest/meta-data/").await;
            assert!(a.starts_with("HTTP/1.1 403") && a.contains("metadata"), "{a}");
            let a = via_connect(&s, &format!("{METADATA}:80")).await;
            assert!(a.starts_with("HTTP/1.1 403"), "{a}");
            assert_eq!(inside.load(Ordering::SeqCst), 0, "nothing reached the inside");
            assert_eq!(
                metadata.load(Ordering::SeqCst),
                0,
                "nothing reached the metadata address"
            );
            assert_eq!(
                internet.load(Ordering::SeqCst),
                2,
                "no refused request reached the internet"
            );
            // Every refusal recorded, with its rule.
            assert_eq!(
                rules(&s),
                [
                    "no entry",
                    "no entry",
                    "no entry",
                    "loopback (127.0.0.0/8)",
                    "the cloud metadata address",
                    "no entry"
                ]
            );
            let r = s.refusals.lock().unwrap()[3].clone();
            assert_eq!(
                (r.host.as_str(), r.port, r.address.as_deref()),
                ("inside.test", 8080, Some("127.0.0.1"))
            );
        });
}

#[test]
fn a_listed_cidr_reaches_inside_and_a_name_never_rebinds_between_check_and_connect() {
    if !in_namespace("a_listed_cidr_reaches_inside_and_a_name_never_rebinds_between_check_and_connect") {
        return;
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let internet = server(INTERNET, 80, "internet").await;
            let inside = server("127.0.0.1", 8080, "inside").await;
            // Rebinding: the name answers the internet, then loopback.
            let resolver = Arc::new(Scripted::default().with("rebind.test", &[&[INTERNET], &["127.0.0.1"]]));
            let s = proxy(&["rebind.test", "127.0.0.1/32:8080"], resolver.clone(), false);
            let a = via_connect(&s, "rebind.test:80").await;
            assert!(a.contains("internet saw"), "{a}");
            assert_eq!(
                resolver.calls.load(Ordering::SeqCst),
                1,
                "one resolve, one connect, to what was checked"
            );
            // Its next answer, loopback, is refused: the port is not the listed CIDR's.
            let a = via_connect(&s, "rebind.test:80").await;
            assert!(a.starts_with("HTTP/1.1 403") && a.contains("loopback"), "{a}");
            assert_eq!(internet.load(Ordering::SeqCst), 1);
            // A CIDR that is listed reaches inside, on its port.
            let a = via_connect(&s, "127.0.0.1:8080").await;
            assert!(a.contains("inside saw"), "{a}");
            assert_eq!(inside.load(Ordering::SeqCst), 1);
        });
}

#[test]
fn a_name_that_resolves_to_this_machine_is_refused() {
    if !in_namespace("a_name_that_resolves_to_this_machine_is_refused") {
        return;
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let internet = server(INTERNET, 80, "internet").await;
            let resolver = Arc::new(Scripted::default().with("self.test", &[&[INTERNET]]));
            // The policy finds this machine's addresses itself: 198.51.100.7 is one here.
            let s = proxy(&["self.test"], resolver, true);
            let a = via_connect(&s, "self.test:80").await;
            assert!(a.starts_with("HTTP/1.1 403") && a.contains("this machine"), "{a}");
            assert_eq!(rules(&s), ["this machine's address"]);
            assert_eq!(internet.load(Ordering::SeqCst), 0);
        });
}

/// A TLS server on `addr:port` for `api.test` with a certificate of `ca`'s, answering each
/// request of a connection (keep-alive) with `ok`, every head kept.
async fn tls_server(addr: &str, port: u16, ca: &(rcgen::Certificate, rcgen::KeyPair)) -> Arc<Mutex<Vec<String>>> {
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["api.test".into()])
        .unwrap()
        .signed_by(&key, &ca.0, &ca.1)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let l = tokio::net::TcpListener::bind((addr, port)).await.unwrap();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let kept = heads.clone();
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            let (acceptor, kept) = (acceptor.clone(), kept.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(c).await else { return };
                while let Some(head) = read_head(&mut tls).await {
                    kept.lock().unwrap().push(head);
                    if tls
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    heads
}

async fn read_head<R: tokio::io::AsyncRead + Unpin>(r: &mut R) -> Option<String> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if r.read(&mut b).await.ok()? == 0 {
            return None;
        }
        head.push(b[0]);
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

fn authority(name: &str) -> (rcgen::Certificate, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    p.distinguished_name.push(rcgen::DnType::CommonName, name);
    (p.self_signed(&key).unwrap(), key)
}

/// A box's HTTPS to a secret's host: decrypted, each request of a kept-alive connection
/// carried with the value in place of the placeholder; a host whose certificate this
/// machine's roots do not hold is refused `502` before the box's TLS starts, nothing sent.
#[test]
fn a_decrypted_connection_carries_each_request_with_its_secret_and_checks_the_real_host() {
    if !in_namespace("a_decrypted_connection_carries_each_request_with_its_secret_and_checks_the_real_host") {
        return;
    }
    const PLACEHOLDER: &str = "agentbox-placeholder-00112233445566778899aabbccddeeff";
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let trusted = authority("the test's roots");
            let stranger = authority("an authority nobody trusts");
            let heads = tls_server(INTERNET, 443, &trusted).await;
            let strange = tls_server(INTERNET, 8443, &stranger).await;
            let mut roots = rustls::RootCertStore::empty();
            roots.add(trusted.0.der().clone()).unwrap();
            let secrets = agentbox_egress::Secrets::new(agentbox_egress::SecretPlan {
                secrets: vec![agentbox_egress::SecretRule {
                    name: "TOKEN".into(),
                    placeholder: PLACEHOLDER.into(),
                    hosts: vec!["api.test".into()],
                    value: "the-value".into(),
                }],
            })
            .unwrap();
            let interceptor = Arc::new(agentbox_egress::Interceptor::new(secrets, roots).unwrap());
            let mut box_roots = rustls::RootCertStore::empty();
            use rustls::pki_types::pem::PemObject;
            for c in rustls::pki_types::CertificateDer::pem_slice_iter(interceptor.ca_pem().as_bytes()) {
                box_roots.add(c.unwrap()).unwrap();
            }
            let resolver = Arc::new(Scripted::default().with("api.test", &[&[INTERNET]]));
            let dir = tempfile::tempdir().unwrap();
            let socket = dir.path().join("egress.sock");
            let policy = Policy::new(Allowlist::parse(&["api.test".into()]).unwrap()).with_own_addresses(|_| false);
            let p = Proxy::new(policy, resolver, Arc::new(|_| {})).with_secrets(interceptor);
            let l = tokio::net::UnixListener::bind(&socket).unwrap();
            tokio::spawn(async move {
                while let Ok((c, _)) = l.accept().await {
                    let p = p.clone();
                    tokio::spawn(async move {
                        let _ = p.serve(c).await;
                    });
                }
            });
            let connect = |port: u16| {
                let socket = socket.clone();
                async move {
                    let mut c = tokio::net::UnixStream::connect(&socket).await.unwrap();
                    c.write_all(
                        format!("CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n").as_bytes(),
                    )
                    .await
                    .unwrap();
                    let head = read_head(&mut c).await.unwrap();
                    (c, head)
                }
            };
            // Two requests on one connection, both rewritten.
            let (c, head) = connect(443).await;
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            let client =
                rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_root_certificates(box_roots)
                    .with_no_client_auth();
            let mut tls = tokio_rustls::TlsConnector::from(Arc::new(client))
                .connect(rustls::pki_types::ServerName::try_from("api.test").unwrap(), c)
                .await
                .expect("the box trusts its own authority's certificate for api.test");
            for path in ["/one", "/two"] {
                tls.write_all(
                    format!("GET {path} HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer {PLACEHOLDER}\r\n\r\n")
                        .as_bytes(),
                )
                .await
                .unwrap();
                let answer = read_head(&mut tls).await.unwrap();
                assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
                let mut body = [0u8; 2];
                tls.read_exact(&mut body).await.unwrap();
                assert_eq!(&body, b"ok");
            }
            let seen = heads.lock().unwrap().clone();
            assert_eq!(seen.len(), 2, "{seen:?}");
            for (h, path) in seen.iter().zip(["/one", "/two"]) {
                assert!(h.starts_with(&format!("GET {path} HTTP/1.1")), "{h}");
                assert!(
                    h.to_ascii_lowercase().contains("authorization: bearer the-value\r\n"),
                    "{h}"
                );
                assert!(!h.contains(PLACEHOLDER), "{h}");
            }
            // A host whose certificate is not from this machine's roots: 502, saying why.
            let (mut c, head) = connect(8443).await;
            assert!(head.starts_with("HTTP/1.1 502"), "{head}");
            let mut rest = String::new();
            let _ = c.read_to_string(&mut rest).await;
            assert!(rest.contains("TLS to api.test"), "{rest}");
            assert!(strange.lock().unwrap().is_empty(), "a request reached the stranger");
        });
}

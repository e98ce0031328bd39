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

//! A box's allowlist, enforced on this machine (namespace and Docker boxes): the box reaches
//! what its list names through the egress proxy, and nothing else at all.
//!
//! The scenario runs in network namespaces the test makes (`agentbox_testing::netns`): the
//! box's host has `198.51.100.1` on a cable to a peer at `198.51.100.7` (the internet), and its
//! own `127.0.0.1` (this machine's inside); names resolve through a hosts file of the test's.
//! No other address is reached. That a name's answer cannot change between the check and the
//! connect (DNS rebinding) is tested on the proxy itself with a scripted resolver
//! (`agentbox-egress`'s tests): the proxy resolves once and connects to the address it checked.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentbox_core::{Ctx, ErrorCode, Network, NetworkFact, Provider, Sandbox, Spec};
use agentbox_providers::docker::{DockerOptions, DockerProvider};
use agentbox_providers::helper::HelperCommand;
use agentbox_providers::namespace::{NamespaceOptions, NamespaceProvider};
use agentbox_testing::netns::{self, Peer};

const HERE: &str = "198.51.100.1";
const INTERNET: &str = "198.51.100.7";

fn provider(root: &std::path::Path) -> Arc<dyn Provider> {
    Arc::new(
        NamespaceProvider::new(NamespaceOptions {
            runner: HelperCommand::new(agentbox_testing::runner::ensure(), vec![]),
            ..NamespaceOptions::at(root).unwrap()
        })
        .unwrap(),
    )
}

/// An HTTP server on `listener` answering each request with `name` and its request line;
/// how many connections it took.
fn serve(listener: TcpListener, name: &'static str) -> Arc<AtomicUsize> {
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&got).lines().next().unwrap_or("").to_string();
                let body = format!("{name} saw {line}");
                let _ = write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    seen
}

/// A request to the proxy: its head, and for a `CONNECT` the request sent in the tunnel.
struct Request {
    head: String,
    tunnelled: String,
}

/// What a program in `b` reads back from the proxy at `HTTP_PROXY` for `request` (bash's
/// `/dev/tcp`: no HTTP client needed in the box), with stderr and the exit code. A tunnel's
/// request is sent as a client sends it: after the proxy's `200`, never pipelined behind the
/// `CONNECT` (bash writes line by line, so a pipelined request could still be arriving when a
/// refusal closes the connection).
async fn through_proxy(b: &dyn Sandbox, request: &Request) -> String {
    let script = r#"p=${HTTP_PROXY#http://}; p=${p%/}
exec 3<>"/dev/tcp/${p%:*}/${p##*:}" || exit 7
printf '%s' "$1" >&3
if [ -n "$2" ]; then
  IFS= read -r -t 10 status <&3 || exit 8
  printf '%s\n' "$status"
  case $status in
    "HTTP/1.1 200"*)
      while IFS= read -r -t 10 line <&3 && [ "$line" != $'\r' ]; do printf '%s\n' "$line"; done
      printf '\r\n'
      printf '%s' "$2" >&3 ;;
  esac
fi
timeout 10 cat <&3"#;
    run(b, &["bash", "-c", script, "_", &request.head, &request.tunnelled]).await
}

/// What a Docker box's egress proxy said on stderr (its refusals, and why it ended), for an
/// assertion's message: a request that ends with no answer shows whether the proxy was there.
fn proxy_log(b: &dyn Sandbox) -> String {
    let Ok(home) = agentbox_providers::home::home_from(|k| std::env::var_os(k)) else {
        return String::new();
    };
    let path = home.join("docker").join(format!("{}.proxy", b.id().name()));
    match std::fs::read_to_string(&path) {
        Ok(text) => format!("{}:\n{text}", path.display()),
        Err(e) => format!("{}: {e}", path.display()),
    }
}

/// A program ignoring the proxy: a direct connect to `host` `port`.
async fn direct(b: &dyn Sandbox, host: &str, port: u16) -> String {
    let script = format!("exec 3<>/dev/tcp/{host}/{port} && echo connected");
    run(b, &["timeout", "10", "bash", "-c", &script]).await
}

async fn run(b: &dyn Sandbox, argv: &[&str]) -> String {
    let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let p = b.exec(&argv, &Default::default(), &ctx).await.unwrap();
    let out = agentbox_core::finish(p, Default::default()).await.unwrap();
    format!("{}{}[exit {}]", out.stdout_text(), out.stderr_text(), out.status.code)
}

fn get(host: &str, path: &str) -> Request {
    Request {
        head: format!("GET http://{host}{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        tunnelled: String::new(),
    }
}

fn connect(host: &str, port: u16, path: &str) -> Request {
    Request {
        head: format!("CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n"),
        tunnelled: format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    }
}

/// The servers of the scenario, started in this test's namespaces: the internet's (port 80,
/// and 81, not listed) on the peer, this machine's own on loopback and on its address; and
/// the names the proxy resolves. How many connections each took.
struct Servers {
    internet: Arc<AtomicUsize>,
    internet81: Arc<AtomicUsize>,
    inside: Arc<AtomicUsize>,
    mine: Arc<AtomicUsize>,
    _peer: Peer,
}

fn servers() -> Servers {
    let peer = Peer::new(&format!("{HERE}/24"), &format!("{INTERNET}/24"));
    let (pkg, other_port) = peer
        .run(|| {
            (
                TcpListener::bind((INTERNET, 80)).unwrap(),
                TcpListener::bind((INTERNET, 81)).unwrap(),
            )
        })
        .join()
        .unwrap();
    netns::hosts(&[
        ("pkg.test", INTERNET),
        ("other.test", INTERNET),
        ("inside.test", "127.0.0.1"),
        ("me.test", HERE),
        ("meta.test", "169.254.169.254"),
    ]);
    Servers {
        internet: serve(pkg, "pkg"),
        internet81: serve(other_port, "81"),
        inside: serve(TcpListener::bind(("127.0.0.1", 8081)).unwrap(), "inside"),
        mine: serve(TcpListener::bind((HERE, 8082)).unwrap(), "mine"),
        _peer: peer,
    }
}

/// The whole scenario against boxes of `p`: what is allowed arrives, what is not is refused
/// and recorded, and a program ignoring the proxy reaches nothing.
async fn reaches_what_its_allowlist_names(p: Arc<dyn Provider>, s: &Servers, isolation: Option<&str>) {
    let ctx = Ctx::background();
    let list: Vec<String> = ["pkg.test:80", "inside.test", "me.test", "meta.test", "*.example.org"]
        .map(String::from)
        .to_vec();
    let mut spec = Spec::new(Duration::from_secs(120));
    spec.network = Some(Network::Allow(list.clone()));
    spec.isolation = isolation.map(str::to_string);
    let b = p.create(&spec, &ctx).await.unwrap();
    assert_eq!(
        b.facts().network,
        Some(NetworkFact::Allowlist(list.clone())),
        "the facts say allowlist once the probe passed"
    );
    let again = p.attach(b.id(), &ctx).await.unwrap().expect("attached");
    assert_eq!(
        again.facts().network,
        Some(NetworkFact::Allowlist(list.clone())),
        "another handle reads the proven allowlist back"
    );
    // Its network is loopback alone: no route leads anywhere but through the proxy.
    let interfaces = run(
        b.as_ref(),
        &["sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"],
    )
    .await;
    assert_eq!(interfaces, "lo\n[exit 0]");
    let env = run(b.as_ref(), &["sh", "-c", "echo $HTTP_PROXY $https_proxy $NO_PROXY"]).await;
    assert_eq!(
        env,
        "http://127.0.0.1:3128 http://127.0.0.1:3128 localhost,127.0.0.1,::1\n[exit 0]"
    );

    // Allowed: plain HTTP and a tunnel, to a listed name on its listed port.
    let out = through_proxy(b.as_ref(), &get("pkg.test", "/hello")).await;
    assert!(out.contains("pkg saw GET /hello HTTP/1.1"), "{out}");
    let out = through_proxy(b.as_ref(), &connect("pkg.test", 80, "/tunnel")).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("pkg saw GET /tunnel HTTP/1.1"), "{out}");
    assert_eq!(s.internet.load(Ordering::SeqCst), 2);

    // Refused by the list: a name it does not hold, a listed name on another port, an
    // address (no CIDR is listed).
    for (req, host) in [
        (get("other.test", "/"), "other.test"),
        (connect("pkg.test", 81, "/"), "pkg.test"),
        (connect(INTERNET, 80, "/"), INTERNET),
    ] {
        let out = through_proxy(b.as_ref(), &req).await;
        assert!(
            out.starts_with("HTTP/1.1 403"),
            "{host}: {out}\n{}",
            proxy_log(b.as_ref())
        );
        assert!(out.contains("no entry"), "{host}: {out}");
    }
    // Refused after the name resolved: listed names leading inside.
    for (req, rule) in [
        (get("inside.test:8081", "/"), "loopback"),
        (connect("me.test", 8082, "/"), "this machine's address"),
        (get("meta.test", "/latest/meta-data/"), "the cloud metadata address"),
    ] {
        let out = through_proxy(b.as_ref(), &req).await;
        assert!(out.starts_with("HTTP/1.1 403"), "{rule}: {out}");
        assert!(out.contains(rule), "{rule}: {out}");
    }
    // A program that ignores the proxy reaches nothing: not the internet, not this
    // machine's services, not the metadata address.
    for (host, port) in [(INTERNET, 80), (HERE, 8082), ("169.254.169.254", 80), ("10.0.0.1", 80)] {
        let out = direct(b.as_ref(), host, port).await;
        assert!(!out.contains("connected"), "{host}:{port} reached directly: {out}");
    }
    assert_eq!(
        s.internet.load(Ordering::SeqCst),
        2,
        "only the allowed requests arrived"
    );
    assert_eq!(s.internet81.load(Ordering::SeqCst), 0);
    assert_eq!(s.inside.load(Ordering::SeqCst), 0);
    assert_eq!(s.mine.load(Ordering::SeqCst), 0);

    // Every refusal is on record, in order, with its rule.
    let refusals = b.net_refusals(100, &ctx).await.unwrap();
    let seen: Vec<(String, u16, String)> = refusals
        .iter()
        .map(|r| (r.host.clone(), r.port, r.rule.clone()))
        .collect();
    let want = [
        ("other.test", 80, "no entry"),
        ("pkg.test", 81, "no entry"),
        (INTERNET, 80, "no entry"),
        ("inside.test", 8081, "loopback (127.0.0.0/8)"),
        ("me.test", 8082, "this machine's address"),
        ("meta.test", 80, "the cloud metadata address"),
    ];
    // The probe's own direct connects are refused by the network, not the proxy: no line.
    assert_eq!(
        seen,
        want.map(|(h, p, r)| (h.to_string(), p, r.to_string())).to_vec(),
        "{refusals:#?}"
    );
    assert_eq!(refusals[3].address.as_deref(), Some("127.0.0.1"));
    let one = b.net_refusals(1, &ctx).await.unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].host, "meta.test", "the newest are kept");

    b.destroy(&ctx).await.unwrap();
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_namespace_box_reaches_what_its_allowlist_names_and_nothing_else() {
    if !netns::isolated("a_namespace_box_reaches_what_its_allowlist_names_and_nothing_else") {
        return;
    }
    let s = servers();
    let root = tempfile::tempdir().unwrap();
    runtime().block_on(reaches_what_its_allowlist_names(provider(root.path()), &s, None));
}

#[test]
fn a_docker_box_reaches_what_its_allowlist_names_and_nothing_else() {
    docker_reaches_what_its_allowlist_names("a_docker_box_reaches_what_its_allowlist_names_and_nothing_else", None);
}

/// The same on a Docker box run by gVisor's runsc.
#[test]
fn a_gvisor_docker_box_reaches_what_its_allowlist_names_and_nothing_else() {
    docker_reaches_what_its_allowlist_names(
        "a_gvisor_docker_box_reaches_what_its_allowlist_names_and_nothing_else",
        Some("gvisor"),
    );
}

/// The scenario on Docker boxes of `isolation`, as test `name`.
fn docker_reaches_what_its_allowlist_names(name: &str, isolation: Option<&str>) {
    let here = match isolation {
        Some(_) => agentbox_testing::services::gvisor_available(name),
        None => agentbox_testing::services::docker_available(name),
    };
    if !here || !netns::isolated(name) {
        return;
    }
    let s = servers();
    runtime().block_on(async {
        let p: Arc<dyn Provider> = Arc::new(
            DockerProvider::new(DockerOptions {
                runner: Some(HelperCommand::new(agentbox_testing::runner::ensure(), vec![])),
                ..DockerOptions::default()
            })
            .await
            .expect("the Docker daemon answers"),
        );
        reaches_what_its_allowlist_names(p, &s, isolation).await;
    });
}

/// The error of a create that must fail.
fn refused(made: agentbox_core::Result<Arc<dyn Sandbox>>, what: &str) -> agentbox_core::Error {
    match made {
        Ok(b) => panic!("{what} was taken: box {}", b.id()),
        Err(e) => e,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowlists_are_refused_where_they_cannot_be_enforced_or_read() {
    let root = tempfile::tempdir().unwrap();
    let p = provider(root.path());
    let ctx = Ctx::background();
    let with = |list: &[&str]| {
        let mut spec = Spec::new(Duration::from_secs(60));
        spec.network = Some(Network::Allow(list.iter().map(|s| s.to_string()).collect()));
        spec
    };
    for (list, names) in [
        (&[][..], "empty"),
        (&["exa mple.com"][..], "exa mple.com"),
        (&["example.com:0"][..], "example.com:0"),
        (&["example.com:http"][..], "example.com:http"),
        (&["example.com:"][..], "example.com:"),
        (&["10.0.0.0/33"][..], "10.0.0.0/33"),
        (&["*.*.example.com"][..], "*.*.example.com"),
    ] {
        let e = refused(p.create(&with(list), &ctx).await, &format!("{list:?}"));
        assert_eq!(e.code(), ErrorCode::Invalid, "{list:?}: {e}");
        let text = e.to_string();
        assert!(text.contains("spec.network"), "{list:?}: {text}");
        assert!(text.contains(names), "{list:?}: {text}");
    }
    // The proxy's variables are the provider's to set.
    let mut spec = with(&["example.com"]);
    spec.env.insert("HTTPS_PROXY".into(), "http://elsewhere:8080".into());
    let e = refused(p.create(&spec, &ctx).await, "HTTPS_PROXY");
    assert_eq!(e.code(), ErrorCode::Invalid, "{e}");
    assert!(e.to_string().contains("HTTPS_PROXY"), "{e}");
    // A local box has no isolation to enforce a list with.
    let local = agentbox_providers::local::LocalProvider::new(agentbox_providers::local::LocalOptions {
        supervisor: HelperCommand::new(agentbox_testing::runner::ensure(), vec![]),
        ..agentbox_providers::local::LocalOptions::at(root.path().join("local")).unwrap()
    })
    .unwrap();
    let e = refused(local.create(&with(&["example.com"]), &ctx).await, "a local box's list");
    assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
    assert!(e.to_string().contains("cannot enforce an allowlist"), "{e}");
    // No box was left by any refusal.
    assert!(p.list(&Default::default(), &ctx).await.unwrap().is_empty());
}

/// A namespace box with a network of its own (an allowlist) exposes the tcp ports asked for on
/// this machine's loopback, through its keeper, and no other: a listener the box has on a port
/// not asked for answers nowhere here. An open box refuses ports (its listeners are this
/// machine's already), and so does an https port.
#[test]
fn a_namespace_box_exposes_the_ports_asked_for_and_no_other() {
    if !netns::isolated("a_namespace_box_exposes_the_ports_asked_for_and_no_other") {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let p = provider(root.path());
        let ctx = Ctx::background();
        let mut spec = Spec::new(Duration::from_secs(120));
        spec.network = Some(Network::Allow(vec!["example.com".into()]));
        spec.ports = vec![agentbox_core::PortSpec {
            port: 8080,
            kind: agentbox_core::PortKind::Tcp,
        }];
        let b = p.create(&spec, &ctx).await.unwrap();
        assert_eq!(
            b.facts().ports,
            Some(vec![agentbox_core::PortFact {
                port: 8080,
                kind: agentbox_core::PortKind::Tcp
            }])
        );
        for port in [8080, 8081] {
            agentbox_testing::greeter(b.as_ref(), "127.0.0.1", port).await;
        }
        // Both listen in the box (seen from inside)...
        let inside = run(
            b.as_ref(),
            &[
                "bash",
                "-c",
                "sleep 0.5; for p in 8080 8081; do exec 3<>/dev/tcp/127.0.0.1/$p && cat <&3; done",
            ],
        )
        .await;
        assert_eq!(inside, "port 8080\nport 8081\n[exit 0]");
        // ...and only the one asked for answers from this machine.
        let e = b.endpoint(8080, &ctx).await.unwrap();
        assert_eq!(e.host, "127.0.0.1");
        let mut said = String::new();
        std::net::TcpStream::connect((e.host.as_str(), e.port))
            .unwrap()
            .read_to_string(&mut said)
            .unwrap();
        assert_eq!(said, "port 8080\n");
        let unasked = b.endpoint(8081, &ctx).await.unwrap_err();
        assert_eq!(unasked.code(), ErrorCode::Unsupported, "{unasked}");
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", 8081)).is_err(),
            "the box's port 8081 answers on this machine"
        );
        b.destroy(&ctx).await.unwrap();

        // A box with no network policy has a network of its own too: the port asked for is
        // forwarded, and only it.
        let mut default = Spec::new(Duration::from_secs(60));
        default.ports = spec.ports.clone();
        let b = p.create(&default, &ctx).await.unwrap();
        assert_eq!(b.facts().network, Some(agentbox_core::NetworkFact::Public));
        assert_ne!(b.endpoint(8080, &ctx).await.unwrap().port, 8080);
        assert_eq!(b.endpoint(8081, &ctx).await.unwrap_err().code(), ErrorCode::Unsupported);
        b.destroy(&ctx).await.unwrap();
        let mut host = default.clone();
        host.network = Some(Network::Host);
        let e = refused(p.create(&host, &ctx).await, "ports on a box with network host");
        assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
        assert!(e.message().contains("shares this machine's network"), "{e}");
        spec.ports[0].kind = agentbox_core::PortKind::Https;
        let e = refused(p.create(&spec, &ctx).await, "an https port");
        assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
        assert!(e.message().contains("no certificate"), "{e}");
    });
}

//! Secrets that never enter a box (namespace and Docker boxes): the box holds a placeholder,
//! and this machine's egress proxy puts the value into HTTPS requests bound for the secret's
//! own hosts, and nowhere else.
//!
//! The scenario runs in network namespaces the test makes (`agentbox_testing::netns`), as the
//! egress tests do: an HTTPS server of the test's on `198.51.100.7` (the internet) answers for
//! `api.test`, `other.test` and `open.test` with a certificate of the test's own authority,
//! which this machine's roots hold (in the test's mounts alone), and records every request it
//! receives. The values are in files of the test's, never in its argv or environment.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentbox_core::{Ctx, Network, Provider, SecretSpec, Spec};
use agentbox_providers::docker::{DockerOptions, DockerProvider};
use agentbox_providers::helper::HelperCommand;
use agentbox_providers::namespace::{NamespaceOptions, NamespaceProvider};
use agentbox_testing::netns::{self, Peer};
use agentbox_testing::sh;

const HERE: &str = "198.51.100.1";
const INTERNET: &str = "198.51.100.7";
/// The secrets' values: in the box, a grep for them is written so its own argv cannot match.
const VALUE: &str = "s3cr3t-4f9e2c-the-real-value";
const OTHER_VALUE: &str = "0ther-s3cr3t-77aa-value";
/// A pattern matching [`VALUE`] and not itself.
const VALUE_PATTERN: &str = "s3cr3t-4f9e2c-the-real-valu[e]";

/// What the test's HTTPS server received: the name the client asked for, and the request head.
#[derive(Clone, Debug)]
struct Seen {
    sni: String,
    head: String,
}

/// The test's HTTPS site on the internet, and the authority its certificate is from.
struct Site {
    ca_pem: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    _peer: Peer,
}

impl Site {
    /// The heads received for `path`.
    fn heads(&self, path: &str) -> Vec<Seen> {
        let line = format!("GET {path} HTTP/1.1");
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.head.starts_with(&line))
            .cloned()
            .collect()
    }

    /// The one head received for `path`.
    fn head(&self, path: &str) -> Seen {
        let h = self.heads(path);
        assert_eq!(h.len(), 1, "requests for {path}: {h:#?}");
        h[0].clone()
    }
}

/// Start the site in a peer namespace, with plain HTTP on port 80 for `pkg.test` too, and the
/// names the proxy resolves; this machine's roots are made to hold the site's authority.
fn site() -> Site {
    let peer = Peer::new(&format!("{HERE}/24"), &format!("{INTERNET}/24"));
    let (tls, plain) = peer
        .run(|| {
            (
                TcpListener::bind((INTERNET, 443)).unwrap(),
                TcpListener::bind((INTERNET, 80)).unwrap(),
            )
        })
        .join()
        .unwrap();
    netns::hosts(&[
        ("api.test", INTERNET),
        ("other.test", INTERNET),
        ("open.test", INTERNET),
        ("pkg.test", INTERNET),
    ]);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "the secrets test's authority");
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["api.test".into(), "other.test".into(), "open.test".into()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap(),
    );
    netns::roots(&ca.pem());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for conn in tls.incoming() {
            let Ok(tcp) = conn else { continue };
            let (config, record) = (config.clone(), record.clone());
            std::thread::spawn(move || {
                let _ = tcp.set_read_timeout(Some(Duration::from_secs(20)));
                let mut tls = rustls::StreamOwned::new(rustls::ServerConnection::new(config).unwrap(), tcp);
                let Some(head) = read_head(&mut tls) else { return };
                let sni = tls.conn.server_name().unwrap_or("").to_string();
                let line = head.lines().next().unwrap_or("").to_string();
                record.lock().unwrap().push(Seen { sni: sni.clone(), head });
                // Never the head's headers: a value echoed back would enter the box.
                let body = format!("{sni} saw {line}");
                let _ = write!(
                    tls,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    let record = seen.clone();
    std::thread::spawn(move || {
        for conn in plain.incoming() {
            let Ok(mut c) = conn else { continue };
            if let Some(head) = read_head(&mut c) {
                record.lock().unwrap().push(Seen {
                    sni: String::new(),
                    head,
                });
                let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
            }
        }
    });
    Site {
        ca_pem: ca.pem(),
        seen,
        _peer: peer,
    }
}

fn read_head(c: &mut impl Read) -> Option<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    Some(String::from_utf8_lossy(&got).into_owned())
}

/// The value of header `name` in `head` (any case).
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// A box's output as one string: stdout, stderr and the exit code.
async fn run(b: &dyn agentbox_core::Sandbox, script: &str) -> String {
    let out = sh(b, script).await;
    format!("{}{}[exit {}]", out.stdout_text(), out.stderr_text(), out.status.code)
}

/// Every regular file under `dir` (a box's files on this machine) that holds `needle`.
fn files_holding(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for e in entries.flatten() {
        let p = e.path();
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            found.extend(files_holding(&p, needle));
        } else if t.is_file()
            && let Ok(bytes) = std::fs::read(&p)
            && bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
        {
            found.push(p);
        }
    }
    found
}

/// A tracing subscriber at debug level for the whole test, its output kept to be searched.
fn traced() -> Arc<Mutex<Vec<u8>>> {
    #[derive(Clone)]
    struct Kept(Arc<Mutex<Vec<u8>>>);
    impl Write for Kept {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let kept = Arc::new(Mutex::new(Vec::new()));
    let writer = Kept(kept.clone());
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .init();
    kept
}

/// The whole scenario against boxes of `p`, whose files on this machine are under `home`.
async fn secrets_reach_only_their_hosts(
    p: Arc<dyn Provider>,
    site: &Site,
    home: &Path,
    values: &Path,
    isolation: Option<&str>,
) {
    let ctx = Ctx::background();
    std::fs::write(values.join("api"), format!("{VALUE}\n")).unwrap();
    std::fs::write(values.join("other"), OTHER_VALUE).unwrap();
    let secret = |name: &str, file: &str, host: &str| SecretSpec {
        name: name.into(),
        from: format!("file:{}", values.join(file).display()),
        hosts: vec![host.into()],
    };
    let mut spec = Spec::new(Duration::from_secs(300));
    spec.isolation = isolation.map(str::to_string);
    spec.network = Some(Network::Allow(
        ["api.test:443", "other.test:443", "open.test:443", "pkg.test:80"]
            .map(String::from)
            .to_vec(),
    ));
    spec.secrets = vec![
        secret("API_TOKEN", "api", "api.test"),
        secret("OTHER_TOKEN", "other", "other.test:443"),
    ];
    let b = p.create(&spec, &ctx).await.unwrap();
    assert_eq!(b.facts().secrets, ["API_TOKEN", "OTHER_TOKEN"]);
    let facts = serde_json::to_string(&b.facts()).unwrap();
    assert!(!facts.contains(VALUE), "{facts}");
    let placeholder = run(b.as_ref(), "printf %s \"$API_TOKEN\"").await;
    assert!(placeholder.starts_with("agentbox-placeholder-"), "{placeholder}");
    let placeholder = placeholder.trim_end_matches("[exit 0]").to_string();

    // The value reaches its host from curl and from Python's urllib, in a bearer token, a
    // custom header and basic auth; the box is answered as the host answers.
    let out = run(
        b.as_ref(),
        r#"curl -sS -H "Authorization: Bearer $API_TOKEN" -H "X-Api-Key: $API_TOKEN" https://api.test/curl"#,
    )
    .await;
    assert_eq!(out, "api.test saw GET /curl HTTP/1.1[exit 0]");
    let seen = site.head("/curl");
    assert_eq!(seen.sni, "api.test");
    assert_eq!(
        header(&seen.head, "authorization"),
        Some(format!("Bearer {VALUE}").as_str())
    );
    assert_eq!(header(&seen.head, "x-api-key"), Some(VALUE));
    let py = r#"python3 -c 'import os, urllib.request
r = urllib.request.Request("https://api.test/python", headers={"Authorization": "token " + os.environ["API_TOKEN"]})
print(urllib.request.urlopen(r, timeout=30).read().decode())'"#;
    let out = run(b.as_ref(), py).await;
    assert_eq!(out, "api.test saw GET /python HTTP/1.1\n[exit 0]");
    assert_eq!(
        header(&site.head("/python").head, "authorization"),
        Some(format!("token {VALUE}").as_str())
    );
    let out = run(
        b.as_ref(),
        r#"curl -sS -u "x-access-token:$API_TOKEN" https://api.test/basic"#,
    )
    .await;
    assert!(out.ends_with("[exit 0]"), "{out}");
    let basic = header(&site.head("/basic").head, "authorization").unwrap().to_string();
    let decoded = base64_decode(basic.strip_prefix("Basic ").unwrap());
    assert_eq!(decoded, format!("x-access-token:{VALUE}"));

    // The placeholder bound for another host is refused and recorded: to a host another
    // secret names (decrypted, so read), and in plain HTTP.
    let out = run(
        b.as_ref(),
        r#"curl -sS -o /dev/null -w '%{http_code}' -H "X-Key: $API_TOKEN" https://other.test/leak"#,
    )
    .await;
    assert_eq!(out, "403[exit 0]");
    let out = run(
        b.as_ref(),
        r#"curl -sS -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $API_TOKEN" http://pkg.test/leak"#,
    )
    .await;
    assert_eq!(out, "403[exit 0]");
    assert!(
        site.heads("/leak").is_empty(),
        "a leak arrived: {:#?}",
        site.heads("/leak")
    );
    // A decrypted request naming another host than its connection's (a server behind the same
    // address would route the value to that site) is refused too.
    let out = run(
        b.as_ref(),
        r#"curl -sS -o /dev/null -w '%{http_code}' -H "Host: open.test" -H "X-Key: $API_TOKEN" https://api.test/fronted"#,
    )
    .await;
    assert_eq!(out, "403[exit 0]");
    assert!(site.heads("/fronted").is_empty(), "{:#?}", site.heads("/fronted"));
    // Its own secret to other.test goes, and only its own.
    let out = run(
        b.as_ref(),
        r#"curl -sS -H "X-Key: $OTHER_TOKEN" https://other.test/own"#,
    )
    .await;
    assert_eq!(out, "other.test saw GET /own HTTP/1.1[exit 0]");
    assert_eq!(header(&site.head("/own").head, "x-key"), Some(OTHER_VALUE));

    // A host no secret names is not decrypted: the box's TLS is end to end (the site's own
    // certificate, which only the test's authority checks), and what it sends arrives as sent.
    let ca = site.ca_pem.replace('\n', "\\n");
    let out = run(
        b.as_ref(),
        &format!(
            "printf '%b' '{ca}' > /tmp/site-ca.pem && curl -sS --cacert /tmp/site-ca.pem -H \"X-Key: $API_TOKEN\" https://open.test/through"
        ),
    )
    .await;
    assert_eq!(out, "open.test saw GET /through HTTP/1.1[exit 0]");
    assert_eq!(header(&site.head("/through").head, "x-key"), Some(placeholder.as_str()));
    // ...while a secret's host is answered by the box's own authority, which the site's does not check.
    let out = run(b.as_ref(), "curl -sS --cacert /tmp/site-ca.pem https://api.test/mitm").await;
    assert!(!out.ends_with("[exit 0]"), "{out}");

    // Nothing in the box holds the value: its environment, its processes, its files.
    let out = run(
        b.as_ref(),
        &format!(
            "env | grep -c '{VALUE_PATTERN}'; grep -lE '{VALUE_PATTERN}' /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null; \
             grep -rlE '{VALUE_PATTERN}' /run /tmp /etc/ssl /root /home 2>/dev/null; echo searched"
        ),
    )
    .await;
    assert_eq!(out, "0\nsearched\n[exit 0]");
    // The box trusts its authority in the bundle its variables name.
    let out = run(
        b.as_ref(),
        "echo $SSL_CERT_FILE $REQUESTS_CA_BUNDLE $CURL_CA_BUNDLE $NODE_EXTRA_CA_CERTS",
    )
    .await;
    assert_eq!(
        out,
        "/run/agentbox/ca-bundle.pem /run/agentbox/ca-bundle.pem /run/agentbox/ca-bundle.pem /run/agentbox/egress-ca.pem\n[exit 0]"
    );

    // The refusals are on record, and no record holds the value.
    let refusals = b.net_refusals(100, &ctx).await.unwrap();
    let leaks: Vec<(String, u16, String)> = refusals
        .iter()
        .map(|r| (r.host.clone(), r.port, r.rule.clone()))
        .collect();
    assert_eq!(
        leaks,
        [
            (
                "other.test".to_string(),
                443,
                "attempted leak of secret API_TOKEN".to_string()
            ),
            (
                "pkg.test".to_string(),
                80,
                "attempted leak of secret API_TOKEN".to_string()
            ),
            (
                "api.test".to_string(),
                443,
                "another host in a decrypted request".to_string()
            ),
        ],
        "{refusals:#?}"
    );
    assert!(!format!("{refusals:?}").contains(VALUE));

    // A fork gets placeholders of its own; the parent's is nothing in it.
    if let Some(l) = p.lifecycle()
        && p.honours().fork
    {
        let mut fork_spec = spec.clone();
        fork_spec.max_lifetime = Duration::from_secs(120);
        let forks = l.fork(b.id(), 1, &fork_spec, &ctx).await.unwrap();
        let f = &forks[0];
        let theirs = run(f.as_ref(), "printf %s \"$API_TOKEN\"").await;
        let theirs = theirs.trim_end_matches("[exit 0]");
        assert!(
            theirs.starts_with("agentbox-placeholder-") && theirs != placeholder,
            "{theirs}"
        );
        let out = run(
            f.as_ref(),
            &format!(r#"curl -sS -H "X-Parent: {placeholder}" -H "X-Own: $API_TOKEN" https://api.test/fork"#),
        )
        .await;
        assert_eq!(out, "api.test saw GET /fork HTTP/1.1[exit 0]");
        let seen = site.head("/fork");
        assert_eq!(header(&seen.head, "x-parent"), Some(placeholder.as_str()));
        assert_eq!(header(&seen.head, "x-own"), Some(VALUE));
        f.destroy(&ctx).await.unwrap();
    }

    // A box with no secrets is never decrypted: its TLS to api.test is the site's own.
    let mut plain = Spec::new(Duration::from_secs(120));
    plain.network = spec.network.clone();
    plain.isolation = spec.isolation.clone();
    let c = p.create(&plain, &ctx).await.unwrap();
    let out = run(
        c.as_ref(),
        &format!("printf '%b' '{ca}' > /tmp/site-ca.pem && curl -sS --cacert /tmp/site-ca.pem https://api.test/plain"),
    )
    .await;
    assert_eq!(out, "api.test saw GET /plain HTTP/1.1[exit 0]");
    c.destroy(&ctx).await.unwrap();
    b.destroy(&ctx).await.unwrap();

    // No file of this machine's that the boxes left (logs, records, the proxies' refusals)
    // holds the value.
    assert_eq!(files_holding(home, VALUE), Vec::<PathBuf>::new());
}

fn base64_decode(text: &str) -> String {
    use std::process::{Command, Stdio};
    let mut child = Command::new("base64")
        .arg("-d")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap()
}

/// Namespace boxes under `root`, with the tests' runner.
fn namespace(root: &Path) -> NamespaceProvider {
    NamespaceProvider::new(NamespaceOptions {
        runner: HelperCommand::new(agentbox_testing::runner::ensure(), vec![]),
        ..NamespaceOptions::at(root).unwrap()
    })
    .unwrap()
}

/// Docker boxes with the tests' runner.
async fn docker() -> DockerProvider {
    DockerProvider::new(DockerOptions {
        runner: Some(HelperCommand::new(agentbox_testing::runner::ensure(), vec![])),
        ..DockerOptions::default()
    })
    .await
    .expect("the Docker daemon answers")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// What a test's tracing output must never hold, checked after the scenario.
fn never_traced(kept: &Mutex<Vec<u8>>) {
    let text = String::from_utf8_lossy(&kept.lock().unwrap()).into_owned();
    assert!(
        text.contains("the box trusts its own authority"),
        "the debug output is not the scenario's:\n{text}"
    );
    assert!(
        !text.contains(VALUE) && !text.contains(OTHER_VALUE),
        "a value was traced:\n{text}"
    );
}

#[test]
fn a_namespace_box_sends_its_secrets_only_to_their_hosts_and_never_holds_them() {
    if !netns::isolated("a_namespace_box_sends_its_secrets_only_to_their_hosts_and_never_holds_them") {
        return;
    }
    let kept = traced();
    let s = site();
    let root = tempfile::tempdir().unwrap();
    let values = tempfile::tempdir().unwrap();
    let p: Arc<dyn Provider> = Arc::new(namespace(root.path()));
    runtime().block_on(secrets_reach_only_their_hosts(p, &s, root.path(), values.path(), None));
    never_traced(&kept);
}

#[test]
fn a_docker_box_sends_its_secrets_only_to_their_hosts_and_never_holds_them() {
    docker_secrets(
        "a_docker_box_sends_its_secrets_only_to_their_hosts_and_never_holds_them",
        None,
    );
}

/// The same on a Docker box run by gVisor's runsc.
#[test]
fn a_gvisor_docker_box_sends_its_secrets_only_to_their_hosts_and_never_holds_them() {
    docker_secrets(
        "a_gvisor_docker_box_sends_its_secrets_only_to_their_hosts_and_never_holds_them",
        Some("gvisor"),
    );
}

/// The scenario on Docker boxes of `isolation`, as test `name`.
fn docker_secrets(name: &str, isolation: Option<&str>) {
    let here = match isolation {
        Some(_) => agentbox_testing::services::gvisor_available(name),
        None => agentbox_testing::services::docker_available(name),
    };
    if !here || !netns::isolated(name) {
        return;
    }
    let kept = traced();
    let s = site();
    let values = tempfile::tempdir().unwrap();
    let home = agentbox_providers::home::home_from(|k| std::env::var_os(k)).unwrap();
    runtime().block_on(async {
        let p: Arc<dyn Provider> = Arc::new(docker().await);
        secrets_reach_only_their_hosts(p, &s, &home.join("docker"), values.path(), isolation).await;
    });
    never_traced(&kept);
}

/// `exec` with a secret on a descriptor: the program reads the value on descriptor 3 (named
/// in its AGENTBOX_SECRET_FD), then EOF; its argv and environment, and every other program,
/// hold none of it.
async fn a_program_gets_one_secret_on_its_descriptor(p: Arc<dyn Provider>) {
    let ctx = Ctx::background();
    let b = p.create(&Spec::new(Duration::from_secs(120)), &ctx).await.unwrap();
    let script = format!(
        "value=$(cat <&3); echo \"read ${{#value}} bytes, then EOF: $(cat <&3 | wc -c)\"; \
         [ \"$value\" = \"$(printf %s '{VALUE_PATTERN}' | tr -d '[]')\" ] && echo 'it is the value'; \
         echo \"fd $AGENTBOX_SECRET_FD name $AGENTBOX_SECRET_NAME\"; \
         env | grep -c '{VALUE_PATTERN}'; grep -lE '{VALUE_PATTERN}' /proc/[0-9]*/environ /proc/[0-9]*/cmdline; echo done"
    );
    let argv: Vec<String> = vec!["sh".into(), "-c".into(), script];
    let opts = agentbox_core::ExecOptions {
        secret_fd: Some(agentbox_core::FdSecret {
            name: "DEPLOY_KEY".into(),
            value: agentbox_core::SecretValue::new(VALUE.into()).unwrap(),
        }),
        ..Default::default()
    };
    let out = agentbox_core::finish(b.exec(&argv, &opts, &ctx).await.unwrap(), Default::default())
        .await
        .unwrap();
    assert_eq!(
        out.stdout_text(),
        format!(
            "read {} bytes, then EOF: 0\nit is the value\nfd 3 name DEPLOY_KEY\n0\ndone\n",
            VALUE.len()
        ),
        "{}",
        out.stderr_text()
    );
    // A key file's lines come whole.
    let key = "-----BEGIN KEY-----\nAAAA\n-----END KEY-----\n";
    let opts = agentbox_core::ExecOptions {
        secret_fd: Some(agentbox_core::FdSecret {
            name: "SSH_KEY".into(),
            value: agentbox_core::SecretValue::for_descriptor(key.into()).unwrap(),
        }),
        ..Default::default()
    };
    let argv: Vec<String> = vec!["sh".into(), "-c".into(), "cat <&3 | md5sum".into()];
    let out = agentbox_core::finish(b.exec(&argv, &opts, &ctx).await.unwrap(), Default::default())
        .await
        .unwrap();
    let want = std::process::Command::new("sh")
        .args(["-c", &format!("printf '%s' '{key}' | md5sum")])
        .output()
        .unwrap();
    assert_eq!(out.stdout_text(), String::from_utf8_lossy(&want.stdout));
    // A program without it has no descriptor 3 and no such variable.
    let out = run(
        b.as_ref(),
        "[ -e /proc/self/fd/3 ] && echo has-3; echo \"${AGENTBOX_SECRET_FD:-none}\"",
    )
    .await;
    assert_eq!(out, "none\n[exit 0]");
    // A name that is not a variable's is refused before anything runs.
    let bad = agentbox_core::ExecOptions {
        secret_fd: Some(agentbox_core::FdSecret {
            name: "not a name".into(),
            value: agentbox_core::SecretValue::new("x".into()).unwrap(),
        }),
        ..Default::default()
    };
    let e = b.exec(&argv, &bad, &ctx).await.err().expect("a bad name was taken");
    assert_eq!(e.code(), agentbox_core::ErrorCode::Invalid, "{e}");
    b.destroy(&ctx).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_box_program_gets_one_secret_on_its_descriptor() {
    let root = tempfile::tempdir().unwrap();
    let p: Arc<dyn Provider> = Arc::new(namespace(root.path()));
    a_program_gets_one_secret_on_its_descriptor(p).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_box_program_gets_one_secret_on_its_descriptor() {
    if !agentbox_testing::services::docker_available("a_docker_box_program_gets_one_secret_on_its_descriptor") {
        return;
    }
    let p: Arc<dyn Provider> = Arc::new(docker().await);
    a_program_gets_one_secret_on_its_descriptor(p).await;
}

/// Where secrets cannot be kept outside, or are asked for wrongly, the create is refused
/// naming why, and no box is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_refused_where_they_cannot_be_kept() {
    let root = tempfile::tempdir().unwrap();
    let values = tempfile::tempdir().unwrap();
    std::fs::write(values.path().join("v"), VALUE).unwrap();
    let ns = namespace(root.path());
    let local = agentbox_providers::local::LocalProvider::new(agentbox_providers::local::LocalOptions {
        supervisor: HelperCommand::new(agentbox_testing::runner::ensure(), vec![]),
        ..agentbox_providers::local::LocalOptions::at(root.path().join("local")).unwrap()
    })
    .unwrap();
    let ctx = Ctx::background();
    let with = |network: Option<Network>, from: &str, host: &str| {
        let mut s = Spec::new(Duration::from_secs(60));
        s.network = network;
        s.secrets = vec![SecretSpec {
            name: "TOKEN".into(),
            from: from.into(),
            hosts: vec![host.into()],
        }];
        s
    };
    let file = format!("file:{}", values.path().join("v").display());
    let allow = Some(Network::Allow(vec!["api.test:443".into()]));
    for (p, spec, code, word) in [
        (
            &local as &dyn Provider,
            with(None, &file, "api.test"),
            "unsupported",
            "egress proxy",
        ),
        (
            &ns,
            with(Some(Network::None), &file, "api.test"),
            "unsupported",
            "network none",
        ),
        (&ns, with(Some(Network::Host), &file, "api.test"), "unsupported", "host"),
        (
            &ns,
            with(allow.clone(), &file, "other.test"),
            "invalid",
            "not reached by spec.network",
        ),
        (
            &ns,
            with(allow.clone(), "env:AGENTBOX_TEST_NO_SUCH_SECRET", "api.test"),
            "invalid",
            "not set",
        ),
        (
            &ns,
            with(allow.clone(), "file:/no/such/secret", "api.test"),
            "invalid",
            "opening it",
        ),
    ] {
        let e = match p.create(&spec, &ctx).await {
            Ok(b) => panic!("{word}: box {} was made", b.id()),
            Err(e) => e,
        };
        assert_eq!(format!("{:?}", e.code()).to_lowercase(), code, "{word}: {e}");
        assert!(e.message().contains(word), "{word}: {e}");
        assert!(!e.message().contains(VALUE), "{e}");
    }
    let mut spec = with(allow, &file, "api.test");
    spec.env.insert("SSL_CERT_FILE".into(), "/x".into());
    let e = match ns.create(&spec, &ctx).await {
        Ok(b) => panic!("SSL_CERT_FILE was taken: box {}", b.id()),
        Err(e) => e,
    };
    assert!(e.message().contains("spec.env.SSL_CERT_FILE"), "{e}");
    assert!(
        ns.list(&Default::default(), &ctx).await.unwrap().is_empty(),
        "a refused create left a box"
    );
    // A program's descriptor is refused, naming it, by a box whose programs the runner does
    // not start.
    let opts = agentbox_core::ExecOptions {
        secret_fd: Some(agentbox_core::FdSecret {
            name: "K".into(),
            value: agentbox_core::SecretValue::new("v".into()).unwrap(),
        }),
        ..Default::default()
    };
    let e = opts.refuse(true, true, true, "it has no runner").unwrap_err();
    assert!(e.message().contains("secret_fd"), "{e}");
}

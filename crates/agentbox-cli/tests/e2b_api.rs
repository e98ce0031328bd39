//! E2B's API as `agentbox serve --e2b` serves it, judged by E2B's own Python SDK (`e2b` 2.x),
//! which nobody here wrote: the same judge as the fake E2B's
//! (`crates/agentbox-providers/tests/e2b_judge.py`, `JUDGE_MODE=serve`) and its npm SDK
//! (`tests/e2b-js/judge.mjs` there), over namespace boxes, Docker boxes and the fake Kubernetes' pods, with two of the server's
//! keys. Beside the fake's steps it checks what the service adds: a
//! sandbox is one box of the service's own API, owned by the key that made it; another key
//! neither lists, reads, connects to nor kills it; a box ended through the service's API is a
//! sandbox the SDK finds not running; a killed sandbox leaves no box.

mod common;

use std::time::Duration;

use agentbox_testing::judge;
use agentbox_testing::judge::e2b::{Sdk, Setup};

/// The judge's whole run, bounded.
const JUDGE_TIMEOUT: Duration = Duration::from_secs(600);
/// The page the judge asks for: it pages past it.
const LIST_PAGE: usize = 2;

/// `agentbox serve --e2b` over `home` on loopback ports, its default provider `provider` (of
/// the cluster `kubeconfig` names): the process (killed when dropped), the service's URL,
/// E2B's, and its log from then on.
async fn serve_e2b(
    home: &std::path::Path,
    provider: &str,
    over: &Over<'_>,
    tls: Option<&Tls>,
) -> (tokio::process::Child, String, String, common::Kept) {
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"));
    if let Some(k) = over.kubeconfig {
        server.env("KUBECONFIG", k);
    }
    if let Some(t) = tls {
        server
            .arg("serve")
            .arg("--tls-cert")
            .arg(&t.cert)
            .arg("--tls-key")
            .arg(&t.key);
    } else {
        server.arg("serve");
    }
    let e2b_at = if over.domain { DOMAIN_AT } else { "127.0.0.1:0" };
    server.args(["--listen", "127.0.0.1:0", "--e2b", e2b_at, "--provider", provider]);
    if over.domain {
        server.args(["--e2b-domain", DOMAIN]);
    }
    server.args(over.extra);
    let mut server = common::started(&mut server, home);
    let (mut said, log) = common::announced_kept(
        &mut server,
        &["agentbox serve: serving on ", "agentbox serve: E2B's API on "],
    )
    .await;
    let (e2b, api) = (said.remove(1), said.remove(0));
    (server, api, e2b, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_judges_agentbox_serve_e2b() {
    let Some(py) = judge::python("e2b", "the_python_sdk_judges_agentbox_serve_e2b") else {
        return;
    };
    judge_serve(Sdk::Python(py), "namespace").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_judges_agentbox_serve_e2b_over_docker() {
    let test = "the_python_sdk_judges_agentbox_serve_e2b_over_docker";
    let Some(py) = judge::python("e2b", test) else {
        return;
    };
    if !agentbox_testing::services::docker_available(test) {
        return;
    }
    judge_serve(Sdk::Python(py), "docker").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_npm_sdk_judges_agentbox_serve_e2b() {
    let Some(dir) = judge::node("e2b", "the_npm_sdk_judges_agentbox_serve_e2b") else {
        return;
    };
    judge_serve(Sdk::Node(dir), "namespace").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_npm_sdk_judges_agentbox_serve_e2b_over_docker() {
    let test = "the_npm_sdk_judges_agentbox_serve_e2b_over_docker";
    let Some(dir) = judge::node("e2b", test) else {
        return;
    };
    if !agentbox_testing::services::docker_available(test) {
        return;
    }
    judge_serve(Sdk::Node(dir), "docker").await;
}

/// The fake Kubernetes API server's pods under `agentbox serve --e2b`, judged by the Python
/// SDK: every step but those a kube box cannot take (pause, snapshots, forks, an allowlist),
/// which must be refused as E2B refuses a feature it lacks, the sandbox running on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_judges_agentbox_serve_e2b_over_the_fake_kubernetes() {
    let test = "the_python_sdk_judges_agentbox_serve_e2b_over_the_fake_kubernetes";
    if let Some(py) = judge::python("e2b", test) {
        judge_over_kube(Sdk::Python(py), test).await;
    }
}

/// The same, judged by the npm SDK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_npm_sdk_judges_agentbox_serve_e2b_over_the_fake_kubernetes() {
    let test = "the_npm_sdk_judges_agentbox_serve_e2b_over_the_fake_kubernetes";
    if let Some(dir) = judge::node("e2b", test) {
        judge_over_kube(Sdk::Node(dir), test).await;
    }
}

/// `agentbox serve --e2b` over the pods of a fake Kubernetes API server, judged by `sdk`.
async fn judge_over_kube(sdk: Sdk, test: &str) {
    let Some(rootfs) = agentbox_testing::services::rootfs(test) else {
        return;
    };
    let fake = agentbox_fakes::kube::FakeKube::start(agentbox_fakes::kube::FakeKubeOptions {
        rootfs: Some(rootfs.into()),
        ..Default::default()
    })
    .await
    .expect("the fake API server starts");
    let over = Over {
        kubeconfig: Some(fake.kubeconfig()),
        lacks: &["pause-resume", "snapshot", "fork", "network"],
        ..Default::default()
    };
    judge_over(sdk, "kube", &over).await;
    fake.shutdown().await;
}

/// Both SDKs, over TLS and with their own default settings (HTTP/2 where TLS offers it): the
/// service's certificate, signed by an authority made for the test, which the SDKs are told to
/// trust.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_sdks_judge_agentbox_serve_e2b_over_tls_with_their_defaults() {
    let test = "both_sdks_judge_agentbox_serve_e2b_over_tls_with_their_defaults";
    let (Some(py), Some(dir)) = (judge::python("e2b", test), judge::node("e2b", test)) else {
        return;
    };
    let over = Over {
        tls: true,
        ..Default::default()
    };
    judge_over(Sdk::Python(py), "namespace", &over).await;
    judge_over(Sdk::Node(dir), "namespace", &over).await;
}

/// E2B's domain mode: each SDK told only `E2B_DOMAIN` (and its key), as a program written for
/// E2B's cloud is, reaches the control plane at `api.DOMAIN`, envd at `49983-ID.DOMAIN`, a
/// sandbox's port at `get_host`'s address and its files at signed URLs, over TLS with a
/// certificate for `*.DOMAIN` (`tests/e2b_domain_judge.py`, and `tests/e2b-js/domain.mjs` of
/// the providers). One test for both: the server's address and the DNS server's are fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_sdks_judge_e2b_domain_mode() {
    let test = "both_sdks_judge_e2b_domain_mode";
    let (Some(py), Some(js)) = (judge::python("e2b", test), judge::node("e2b", test)) else {
        return;
    };
    agentbox_testing::runner::ensure();
    let home = tempfile::tempdir().unwrap();
    let tls = Tls::make(home.path());
    let key = common::key(home.path(), "a");
    let over = Over {
        tls: true,
        domain: true,
        ..Default::default()
    };
    let (mut server, _api, e2b, _log) = serve_e2b(home.path(), "namespace", &over, Some(&tls)).await;
    assert_eq!(e2b, format!("https://{DOMAIN_AT}"));
    // `*.DOMAIN` and `DOMAIN` are the server's address, for the judges alone.
    let dns = agentbox_testing::dns::Wildcard::start(
        DOMAIN,
        std::net::Ipv4Addr::new(127, 0, 2, 1),
        std::net::Ipv4Addr::new(127, 0, 2, 53),
        home.path(),
    )
    .await
    .expect("a DNS server on 127.0.2.53:53 (root, as CI runs the tests)");
    let python = {
        let mut c = dns.resolving(&py);
        c.arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2b_domain_judge.py"));
        c
    };
    let node = {
        let mut c = dns.resolving(std::path::Path::new("node"));
        c.arg(js.join("domain.mjs")).current_dir(&js);
        c
    };
    for mut command in [python, node] {
        command
            .env("E2B_DOMAIN", DOMAIN)
            .env("E2B_API_KEY", &key)
            .env("SSL_CERT_FILE", &tls.ca)
            .env("NODE_EXTRA_CA_CERTS", &tls.ca)
            .env("HOME", home.path());
        for unwanted in [
            "E2B_API_URL",
            "E2B_SANDBOX_URL",
            "E2B_DEBUG",
            "E2B_HTTP_VERSION",
            "E2B_ACCESS_TOKEN",
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "NO_PROXY",
        ] {
            command.env_remove(unwanted);
        }
        let judged = judge::run(command, JUDGE_TIMEOUT, |_| {}).await;
        judged.assert_steps(&[
            "readme",
            "create",
            "envd",
            "port",
            "private-port",
            "signed-urls",
            "hosts",
            "kill",
        ]);
    }
    server.start_kill().unwrap();
}

/// E2B's base template on Docker boxes: the image `scripts/box-image --e2b-base` builds from
/// Debian's packages, mapped as `base` with its user's home as the workspace, the boxes keeping
/// their capabilities for sudo. The Python SDK finds E2B's user, home, tools and sudo
/// (`tests/e2b_base_judge.py`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_finds_e2bs_base_template_on_docker() {
    let test = "the_python_sdk_finds_e2bs_base_template_on_docker";
    let Some(image) =
        agentbox_testing::services::path_from("AGENTBOX_TEST_E2B_BASE_IMAGE", "scripts/box-image --e2b-base", test)
    else {
        return;
    };
    if !agentbox_testing::services::docker_available(test) {
        return;
    }
    let template = format!("base=docker:{},workspace=/home/user", image.display());
    let extra = ["--keep-capabilities", "--e2b-template", &template];
    judge_base(test, "docker", &extra, &["user", "tools", "home", "sudo"]).await;
}

/// The same tree as a namespace box's rootfs (`scripts/box-rootfs --e2b-base`): E2B's tools and
/// its user known, the box's one user being root of its own namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_finds_e2bs_base_template_as_a_rootfs() {
    let test = "the_python_sdk_finds_e2bs_base_template_as_a_rootfs";
    let Some(rootfs) =
        agentbox_testing::services::path_from("AGENTBOX_TEST_E2B_BASE_ROOTFS", "scripts/box-rootfs --e2b-base", test)
    else {
        return;
    };
    let template = format!("base=namespace:{}", rootfs.display());
    judge_base(
        test,
        "namespace",
        &["--e2b-template", &template],
        &["rootfs-user", "tools"],
    )
    .await;
}

/// `agentbox serve --e2b` over `provider`'s boxes with `extra` arguments, judged by
/// `tests/e2b_base_judge.py`, which must pass `steps`.
async fn judge_base(test: &str, provider: &str, extra: &[&str], steps: &[&str]) {
    let Some(py) = judge::python("e2b", test) else {
        return;
    };
    agentbox_testing::runner::ensure();
    let home = tempfile::tempdir().unwrap();
    let key = common::key(home.path(), "a");
    let over = Over {
        extra,
        ..Default::default()
    };
    let (mut server, _api, e2b, _log) = serve_e2b(home.path(), provider, &over, None).await;
    let mut command = tokio::process::Command::new(&py);
    command
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2b_base_judge.py"))
        .env("E2B_API_URL", &e2b)
        .env("E2B_SANDBOX_URL", &e2b)
        .env("E2B_API_KEY", &key)
        .env("E2B_HTTP_VERSION", "1.1")
        .env("JUDGE_BOXES", provider)
        .env("NO_PROXY", "127.0.0.1")
        .env("HOME", home.path());
    for unwanted in ["E2B_DOMAIN", "E2B_DEBUG", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        command.env_remove(unwanted);
    }
    let judged = judge::run(command, JUDGE_TIMEOUT, |_| {}).await;
    judged.assert_steps(steps);
    server.start_kill().unwrap();
}

/// Where a judged server's boxes are and how it is reached.
#[derive(Default)]
struct Over<'a> {
    /// The cluster of kube boxes.
    kubeconfig: Option<&'a std::path::Path>,
    /// The steps the provider cannot take, asserted refused.
    lacks: &'a [&'a str],
    /// Serve https, with a certificate made for the test.
    tls: bool,
    /// E2B's domain mode, under [`DOMAIN`].
    domain: bool,
    /// More arguments of `agentbox serve`.
    extra: &'a [&'a str],
}

/// The domain of E2B's domain mode under test: `.test` is reserved, never a real one.
const DOMAIN: &str = "e2b.test";
/// Where E2B's API is served in domain mode: port 443, as `https://api.DOMAIN` names no port,
/// on a loopback address of its own that every name under the domain resolves to.
const DOMAIN_AT: &str = "127.0.2.1:443";

/// A certificate for `127.0.0.1`, `localhost`, [`DOMAIN`] and `*.DOMAIN`, and the authority
/// that signed it, as files.
struct Tls {
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    ca: std::path::PathBuf,
}

impl Tls {
    fn make(dir: &std::path::Path) -> Tls {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // Names of their own: OpenSSL takes a leaf whose issuer is its own subject for one signed
        // by itself.
        ca.distinguished_name
            .push(DnType::CommonName, "agentbox test authority");
        let ca = ca.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        // And every name of E2B's domain mode under `DOMAIN`.
        let names = ["127.0.0.1", "localhost", DOMAIN, &format!("*.{DOMAIN}")].map(str::to_string);
        let mut leaf = CertificateParams::new(names.to_vec()).unwrap();
        leaf.distinguished_name.push(DnType::CommonName, "localhost");
        let leaf = leaf.signed_by(&key, &ca, &ca_key).unwrap();
        let t = Tls {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            ca: dir.join("ca.pem"),
        };
        std::fs::write(&t.cert, leaf.pem()).unwrap();
        std::fs::write(&t.key, key.serialize_pem()).unwrap();
        std::fs::write(&t.ca, ca.pem()).unwrap();
        t
    }
}

/// `agentbox serve --e2b` over `provider`'s boxes, with two keys, judged by `sdk`'s judge.
async fn judge_serve(sdk: Sdk, provider: &str) {
    judge_over(sdk, provider, &Over::default()).await;
}

/// `agentbox serve --e2b` over `provider`'s boxes, reached as `over` says, with two keys, judged
/// by `sdk`'s judge; the steps it lacks asserted refused.
async fn judge_over(sdk: Sdk, provider: &str, over: &Over<'_>) {
    agentbox_testing::runner::ensure();
    let home = tempfile::tempdir().unwrap();
    let lacks = over.lacks;
    let tls = over.tls.then(|| Tls::make(home.path()));
    let (a, b) = (common::key(home.path(), "a"), common::key(home.path(), "b"));
    let (mut server, api, e2b, log) = serve_e2b(home.path(), provider, over, tls.as_ref()).await;
    let mut command = judge::e2b::command(
        &sdk,
        &Setup {
            url: &e2b,
            key: &a,
            mode: "serve",
            list_page: LIST_PAGE,
            max_timeout_secs: 24 * 3600,
            home: home.path(),
            ca: tls.as_ref().map(|t| t.ca.as_path()),
        },
    );
    command
        .env("JUDGE_OTHER_KEY", &b)
        .env("AGENTBOX_URL", &api)
        .env("JUDGE_LACKS", lacks.join(","));
    let judged = judge::run(command, JUDGE_TIMEOUT, |_| {}).await;
    let lacked: Vec<String> = lacks.iter().map(|s| format!("{s}-lacked")).collect();
    let steps: Vec<&str> = judge::e2b::STEPS
        .iter()
        .chain(judge::e2b::SERVE_STEPS)
        .map(|s| match lacks.iter().position(|l| l == s) {
            Some(i) => lacked[i].as_str(),
            None => s,
        })
        .collect();
    judged.assert_steps(&steps);
    // The SDKs' own HTTP version: over TLS they ask HTTP/2 (ALPN) and envd's calls are served
    // over it; over plain http they are told 1.1.
    let want = if tls.is_some() { "HTTP/2.0" } else { "HTTP/1.1" };
    let envd: Vec<String> = log
        .lines()
        .into_iter()
        .filter(|l| l.contains("path=/process.Process/Start"))
        .collect();
    assert!(
        !envd.is_empty() && envd.iter().all(|l| l.contains(want)),
        "envd's calls over {want}: {envd:?}"
    );
    // Every call of E2B's API is counted under one route, never a sandbox's id.
    let admin = common::key_with(home.path(), "admin", &["--admin"]);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut http = reqwest::Client::builder();
    if let Some(t) = &tls {
        http = http.add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(&t.ca).unwrap()).unwrap());
    }
    let scraped = http
        .build()
        .unwrap()
        .get(format!("{api}/metrics"))
        .bearer_auth(&admin)
        .timeout(std::time::Duration::from_secs(30))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        scraped
            .lines()
            .any(|l| l.starts_with("agentbox_http_requests_total{") && l.contains("route=\"e2b\"")),
        "E2B's calls counted: {scraped}"
    );
    assert!(
        !scraped.contains("/sandboxes/") && !scraped.contains("process.Process"),
        "no route of E2B's named in the metrics: {scraped}"
    );
    server.start_kill().unwrap();
}

/// `bench e2b` measures E2B's Python SDK against `agentbox serve --e2b` beside the service's
/// own API in one run (a sandbox made and `true` run in it; 16 MiB of a command's output),
/// every sample of both sides checked (exit 0, every byte), and leaves no box behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_e2b_bench_measures_the_sdk_beside_the_own_api() {
    let Some(py) = judge::python("e2b", "the_e2b_bench_measures_the_sdk_beside_the_own_api") else {
        return;
    };
    let home = common::Home::new();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args([
            "bench",
            "e2b",
            "--provider",
            "namespace",
            "--iterations",
            "3",
            "--json",
            "--python",
        ])
        .arg(&py)
        .env("AGENTBOX_HOME", home.0.path())
        .output();
    let out = tokio::time::timeout(JUDGE_TIMEOUT, out).await.unwrap().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}\n{}", String::from_utf8_lossy(&out.stderr));
    let (names, pairs) = common::bench_pairs(&said);
    assert_eq!(
        names,
        ["create then run true: e2b vs own", "16 MiB of output streamed"],
        "{said}"
    );
    for p in pairs {
        assert!(p["subject_ms"]["median"].as_f64().unwrap() > 0.0, "{p}");
    }
    common::no_box_left(&home);
}

/// `agentbox serve`'s E2B flags, given wrong, are refused before anything is served, each
/// naming the flag and why.
#[test]
fn wrong_e2b_flags_are_refused_naming_the_flag() {
    let home = tempfile::tempdir().unwrap();
    let many: Vec<String> = (3000..3033).map(|p| p.to_string()).collect();
    let many = many.join(",");
    let cases: [(&[&str], &str); 6] = [
        (
            &["--e2b-template", "base=docker:img,workspace=rel"],
            "workspace \"rel\": not a normal absolute path",
        ),
        (&["--e2b-template", "base=docker:img,home=/x"], "not workspace=DIR"),
        (&["--e2b-template", "base"], "not NAME=PROVIDER"),
        (
            &["--e2b-domain", "localhost"],
            "--e2b-domain \"localhost\": not a domain of two labels",
        ),
        (&["--e2b-ports", &many], "--e2b-ports: 33 ports; at most 32"),
        (&["--e2b-ports", "0"], "--e2b-ports"),
    ];
    for (flags, said) in cases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentbox"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--e2b",
                "127.0.0.1:0",
                "--provider",
                "namespace",
            ])
            .args(flags)
            .env("AGENTBOX_HOME", home.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(said), "{flags:?}: {stderr}");
    }
}

//! `deploy/kubernetes` as a cluster takes it: kubectl applies the manifests to the fake API
//! server, and the server runs as the Deployment says (its container's arguments, its secrets
//! where the Deployment mounts them) with in-cluster settings only: the service account's token,
//! CA and namespace at `/var/run/secrets/kubernetes.io/serviceaccount` (in a mount namespace of
//! its own, so this machine's files are untouched), `KUBERNETES_SERVICE_HOST` and `_PORT`, no
//! kubeconfig. A key in PostgreSQL makes a pod box through it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentbox_fakes::kube::{FakeKube, FakeKubeOptions};
use serde_json::{Value, json};

mod common;

const BIN: &str = env!("CARGO_BIN_EXE_agentbox");
const WAIT: Duration = Duration::from_secs(60);

async fn kubectl(k: &Path, fake: &FakeKube, args: &[&str]) -> String {
    let out = tokio::time::timeout(
        WAIT,
        tokio::process::Command::new(k)
            .args(args)
            .env("KUBECONFIG", fake.kubeconfig())
            .env("HOME", fake.kubeconfig().parent().unwrap())
            .output(),
    )
    .await
    .expect("kubectl ends within a minute")
    .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kubectl {args:?}: {said}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn manifests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifests_apply_and_the_server_makes_a_pod_box_in_cluster() {
    const TEST: &str = "the_manifests_apply_and_the_server_makes_a_pod_box_in_cluster";
    let Some(rootfs) = agentbox_testing::services::rootfs(TEST) else {
        return;
    };
    let Some(pg) = agentbox_testing::services::postgres(TEST) else {
        return;
    };
    let Some(k) = agentbox_testing::services::path_from("AGENTBOX_TEST_KUBECTL", "scripts/kube-clients", TEST) else {
        return;
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let fake = FakeKube::start(FakeKubeOptions {
        rootfs: Some(rootfs.into()),
        runner: Some(agentbox_testing::runner::ensure()),
        namespaces: vec!["agents".into()],
        ..Default::default()
    })
    .await
    .expect("the fake API server starts");
    let dir = manifests();
    // In a namespace of its own, which the server learns from its service account alone.
    let applied = kubectl(&k, &fake, &["apply", "-n", "agents", "-f", dir.to_str().unwrap()]).await;
    for made in [
        "serviceaccount/agentbox created",
        "role.rbac.authorization.k8s.io/agentbox created",
        "rolebinding.rbac.authorization.k8s.io/agentbox created",
        "secret/agentbox-postgres created",
        "deployment.apps/agentbox created",
        "service/agentbox created",
    ] {
        assert!(applied.contains(made), "{made:?} in {applied}");
    }
    let deployment: Value = serde_json::from_str(
        &kubectl(
            &k,
            &fake,
            &["get", "-n", "agents", "deployment", "agentbox", "-o", "json"],
        )
        .await,
    )
    .unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(pod["serviceAccountName"], "agentbox");
    let container = &pod["containers"][0];

    // What the Deployment mounts, here: each secret volume's mount path maps to a directory
    // holding what the secret would (TLS made now; PostgreSQL the tests' own).
    let here = tempfile::tempdir().unwrap();
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let mut mounts: Vec<(String, PathBuf)> = Vec::new();
    for m in container["volumeMounts"].as_array().unwrap() {
        let (name, path) = (m["name"].as_str().unwrap(), m["mountPath"].as_str().unwrap());
        let at = here.path().join(name);
        std::fs::create_dir_all(&at).unwrap();
        match name {
            "tls" => {
                std::fs::write(at.join("tls.crt"), made.cert.pem()).unwrap();
                std::fs::write(at.join("tls.key"), made.key_pair.serialize_pem()).unwrap();
            }
            "postgres" => std::fs::write(at.join("url"), &pg).unwrap(),
            _ => {}
        }
        mounts.push((path.to_string(), at));
    }
    let mapped = |arg: &str| {
        let mut a = arg.to_string();
        for (path, at) in &mounts {
            a = a.replace(path.as_str(), at.to_str().unwrap());
        }
        // The container's port is the pod's own; here, any free one of loopback.
        if a.starts_with("--listen=") {
            a = "--listen=127.0.0.1:0".into();
        }
        a
    };
    let args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| mapped(a.as_str().unwrap()))
        .collect();
    assert_eq!(args[0], "serve");
    assert!(args.contains(&"--provider=kube".to_string()), "{args:?}");
    let postgres_file = args
        .iter()
        .find_map(|a| a.strip_prefix("--postgres="))
        .expect("the Deployment names its key store")
        .to_string();

    // A key in the store the Deployment names.
    let name = format!("deploy-{:x}", std::process::id());
    let home = here.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let key = std::process::Command::new(BIN)
        .args([
            "serve",
            "keys",
            "add",
            &name,
            "--providers",
            "kube",
            "--postgres",
            &postgres_file,
        ])
        .env("AGENTBOX_HOME", &home)
        .output()
        .unwrap();
    assert!(key.status.success(), "{key:?}");
    let key = String::from_utf8(key.stdout).unwrap().trim().to_string();

    // The service account's files, where the kubelet puts them (a tmpfs over /run, in this
    // server's mount namespace alone).
    let account = here.path().join("serviceaccount");
    std::fs::create_dir_all(&account).unwrap();
    std::fs::write(account.join("token"), fake.token()).unwrap();
    std::fs::copy(fake.ca().expect("the fake serves TLS"), account.join("ca.crt")).unwrap();
    std::fs::write(account.join("namespace"), "agents").unwrap();
    const IN_CLUSTER: &str = r#"mount -t tmpfs tmpfs /run &&
mkdir -p /run/secrets/kubernetes.io/serviceaccount &&
cp "$0"/* /run/secrets/kubernetes.io/serviceaccount/ &&
exec "$@""#;
    let mut server = tokio::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", IN_CLUSTER])
        .arg(&account)
        .arg(BIN)
        .args(&args)
        .env("KUBERNETES_SERVICE_HOST", fake.addr().ip().to_string())
        .env("KUBERNETES_SERVICE_PORT", fake.addr().port().to_string())
        .env_remove("KUBECONFIG")
        .env("HOME", &home)
        .env("AGENTBOX_HOME", &home)
        .env_remove("AGENTBOX_PROVIDER")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let url = common::serving_url(&mut server).await;
    assert!(
        url.starts_with("https://127.0.0.1:"),
        "TLS, as the Deployment says: {url}"
    );
    let port = url.rsplit(':').next().unwrap().parse::<u16>().unwrap();
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(made.cert.pem().as_bytes()).unwrap())
        .resolve("localhost", ([127, 0, 0, 1], port).into())
        .timeout(Duration::from_secs(300))
        .no_proxy()
        .build()
        .unwrap();
    let base = format!("https://localhost:{port}");
    let call = |method: reqwest::Method, path: &str, body: Option<Value>| {
        let mut r = http.request(method, format!("{base}{path}")).bearer_auth(&key);
        if let Some(b) = body {
            r = r.json(&b);
        }
        async move {
            let r = r.send().await.unwrap();
            let status = r.status().as_u16();
            let text = r.text().await.unwrap();
            (status, serde_json::from_str::<Value>(&text).unwrap_or(Value::Null))
        }
    };
    // Ready: its key store and its provider (the cluster, in-cluster) answer.
    let (st, ready) = call(reqwest::Method::GET, "/readyz", None).await;
    assert_eq!((st, &ready["default_provider"]), (200, &json!("kube")), "{ready}");
    let (st, made_box) = call(
        reqwest::Method::POST,
        "/v1/boxes",
        Some(json!({"spec": {"max_lifetime_ms": 600_000}})),
    )
    .await;
    assert_eq!(st, 201, "{made_box}");
    let id = made_box["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("kube:"), "{id}");
    let (st, ran) = call(
        reqwest::Method::POST,
        &format!("/v1/boxes/{id}/exec"),
        Some(json!({"command": "echo in-a-pod"})),
    )
    .await;
    assert_eq!((st, ran["stdout"].as_str()), (200, Some("in-a-pod\n")), "{ran}");
    let pods = fake.pods();
    let pod = pods
        .iter()
        .find(|p| id.ends_with(&p.name))
        .expect("the box is a pod of the fake");
    assert_eq!(pod.namespace, "agents", "in the server's own namespace");
    let (st, _) = call(reqwest::Method::DELETE, &format!("/v1/boxes/{id}"), None).await;
    assert_eq!(st, 204);

    let removed = std::process::Command::new(BIN)
        .args(["serve", "keys", "remove", &name, "--postgres", &postgres_file])
        .env("AGENTBOX_HOME", &home)
        .output()
        .unwrap();
    assert!(removed.status.success(), "{removed:?}");
    server.start_kill().unwrap();
    let deleted = kubectl(&k, &fake, &["delete", "-n", "agents", "-f", dir.to_str().unwrap()]).await;
    assert!(deleted.contains("deployment.apps \"agentbox\" deleted"), "{deleted}");
}

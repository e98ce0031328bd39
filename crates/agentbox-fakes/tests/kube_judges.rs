//! The judges: kubectl 1.35 and the `kubernetes` Python client, which nobody here wrote,
//! against the fake (over TLS, as kubectl needs). Where they and the fake disagree, the fake
//! is wrong. `scripts/kube-clients` installs both; `scripts/test` exports their paths as
//! `AGENTBOX_TEST_KUBECTL` and `AGENTBOX_TEST_KUBE_PYTHON`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentbox_fakes::kube::{FakeKube, FakeKubeOptions};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);

/// A path from `var`, or `None` after the loud notice (a failure under CI).
fn tool(var: &str, test: &str) -> Option<PathBuf> {
    if let Ok(p) = std::env::var(var)
        && !p.is_empty()
    {
        return Some(PathBuf::from(p));
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: CI needs {var} (scripts/test runs scripts/kube-clients)");
    }
    eprintln!("\n!!!! {test}: {var} UNSET: this test did NOT run. Run scripts/kube-clients and export it. !!!!\n");
    None
}

async fn fake(test: &str, v5: bool) -> Option<FakeKube> {
    fake_with(test, v5, false).await
}

async fn fake_with(test: &str, v5: bool, agent_sandbox: bool) -> Option<FakeKube> {
    let rootfs = agentbox_testing::services::rootfs(test)?;
    Some(
        FakeKube::start(FakeKubeOptions {
            rootfs: Some(rootfs.into()),
            runner: Some(agentbox_testing::runner::ensure()),
            v5,
            agent_sandbox,
            ..Default::default()
        })
        .await
        .expect("the fake starts"),
    )
}

/// kubectl with the fake's kubeconfig: its exit code, stdout and stderr.
async fn kubectl(k: &Path, kube: &FakeKube, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(k)
        .args(args)
        .env("KUBECONFIG", kube.kubeconfig())
        .env("HOME", kube.kubeconfig().parent().unwrap())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl starts");
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).await.unwrap();
    }
    drop(input);
    let out = tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("kubectl {args:?} did not end within {WAIT:?}"))
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn ok(k: &Path, kube: &FakeKube, args: &[&str]) -> String {
    let (code, out, err) = kubectl(k, kube, args, None).await;
    assert_eq!(code, 0, "kubectl {args:?}: {out}{err}");
    out
}

const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: judged
  labels: {k: v}
  annotations: {note: first}
spec:
  restartPolicy: Never
  securityContext: {runAsNonRoot: true, runAsUser: 1000, fsGroup: 2000}
  containers:
  - name: main
    image: debian:bookworm
    command: ["sh", "-c", "echo started; sleep 300"]
    securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
    volumeMounts:
    - {name: scratch, mountPath: /scratch}
    - {name: cache, mountPath: /tmp/cache}
    - {name: info, mountPath: /podinfo}
  volumes:
  - {name: scratch, emptyDir: {}}
  - {name: cache, emptyDir: {}}
  - name: info
    downwardAPI:
      items:
      - {path: name, fieldRef: {fieldPath: metadata.name}}
      - {path: note, fieldRef: {fieldPath: "metadata.annotations['note']"}}
      - {path: labels, fieldRef: {fieldPath: metadata.labels}}
---
apiVersion: v1
kind: Pod
metadata:
  name: other
  labels: {k: other}
spec:
  restartPolicy: Never
  containers:
  - {name: main, image: debian:bookworm, command: ["sleep", "300"]}
"#;

const POLICY: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-egress}
spec:
  podSelector: {matchLabels: {sandbox: "true"}}
  policyTypes: [Egress]
"#;

async fn running(kube: &FakeKube, name: &str) {
    kube.wait_phase("default", name, "Running", WAIT).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_judges_the_fake() {
    let test = "kubectl_judges_the_fake";
    let Some(k) = tool("AGENTBOX_TEST_KUBECTL", test) else {
        return;
    };
    let Some(kube) = fake(test, true).await else { return };
    let dir = kube.kubeconfig().parent().unwrap().to_path_buf();
    std::fs::write(dir.join("pod.yaml"), POD).unwrap();
    std::fs::write(dir.join("np.yaml"), POLICY).unwrap();
    let pod_yaml = dir.join("pod.yaml").to_string_lossy().into_owned();
    let np_yaml = dir.join("np.yaml").to_string_lossy().into_owned();
    let out = ok(&k, &kube, &["create", "-f", &pod_yaml]).await;
    assert!(
        out.contains("pod/judged created") && out.contains("pod/other created"),
        "{out}"
    );
    // Only the matching pod, and its security context as it was given.
    let list: Value = serde_json::from_str(&ok(&k, &kube, &["get", "pods", "-l", "k=v", "-o", "json"]).await).unwrap();
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{list}");
    assert_eq!(items[0]["metadata"]["name"], "judged");
    assert_eq!(items[0]["spec"]["securityContext"]["runAsUser"], 1000);
    running(&kube, "judged").await;
    // An exit code, and stdin ended by v5's close.
    let (code, _, err) = kubectl(&k, &kube, &["exec", "judged", "--", "sh", "-c", "exit 3"], None).await;
    assert_eq!(code, 3, "{err}");
    let (code, out, err) = kubectl(
        &k,
        &kube,
        &["exec", "-i", "judged", "--", "cat"],
        Some("through stdin\n"),
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "through stdin\n"), "{err}");
    let out = ok(
        &k,
        &kube,
        &[
            "exec",
            "judged",
            "--",
            "sh",
            "-c",
            "touch /scratch/f /tmp/cache/f && cat /podinfo/name /podinfo/note",
        ],
    )
    .await;
    assert_eq!(out, "judgedfirst");
    // Patches: get sees them, and so does the downward file in the pod.
    ok(&k, &kube, &["annotate", "pod", "judged", "note=second", "--overwrite"]).await;
    ok(&k, &kube, &["label", "pod", "judged", "extra=yes"]).await;
    let got: Value = serde_json::from_str(&ok(&k, &kube, &["get", "pod", "judged", "-o", "json"]).await).unwrap();
    assert_eq!(got["metadata"]["annotations"]["note"], "second");
    assert_eq!(got["metadata"]["labels"]["extra"], "yes");
    assert_eq!(
        ok(&k, &kube, &["exec", "judged", "--", "cat", "/podinfo/note"]).await,
        "second"
    );
    assert!(
        ok(&k, &kube, &["exec", "judged", "--", "cat", "/podinfo/labels"])
            .await
            .contains("extra=\"yes\"")
    );
    assert!(ok(&k, &kube, &["logs", "judged"]).await.contains("started"));
    // Delete waits (a watch) until the pod is gone.
    let out = ok(&k, &kube, &["delete", "pod", "judged"]).await;
    assert!(out.contains("\"judged\" deleted"), "{out}");
    let (code, _, err) = kubectl(&k, &kube, &["get", "pod", "judged"], None).await;
    assert_ne!(code, 0);
    assert!(err.contains("NotFound") || err.contains("not found"), "{err}");
    // NetworkPolicies.
    assert!(
        ok(&k, &kube, &["create", "-f", &np_yaml])
            .await
            .contains("deny-egress created")
    );
    let np: Value =
        serde_json::from_str(&ok(&k, &kube, &["get", "networkpolicy", "deny-egress", "-o", "json"]).await).unwrap();
    assert_eq!(np["spec"]["policyTypes"], serde_json::json!(["Egress"]));
    // A patch (kubectl label sends a strategic merge patch), as the provider gives a policy
    // its owner.
    assert!(
        ok(&k, &kube, &["label", "networkpolicy", "deny-egress", "owner=box"])
            .await
            .contains("labeled")
    );
    let np: Value =
        serde_json::from_str(&ok(&k, &kube, &["get", "networkpolicy", "deny-egress", "-o", "json"]).await).unwrap();
    assert_eq!(np["metadata"]["labels"]["owner"], "box");
    assert_eq!(
        np["spec"]["policyTypes"],
        serde_json::json!(["Egress"]),
        "the patch kept the rules"
    );
    assert!(ok(&k, &kube, &["delete", "-f", &np_yaml]).await.contains("deleted"));
    let (code, _, _) = kubectl(&k, &kube, &["get", "networkpolicy", "deny-egress"], None).await;
    assert_ne!(code, 0);
    kube.shutdown().await;
}

const STORAGE: &str = r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: judged-data}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: Secret
metadata: {name: judged-creds}
type: Opaque
stringData: {token: hunter2}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_claims_and_secrets() {
    let test = "kubectl_applies_claims_and_secrets";
    let Some(k) = tool("AGENTBOX_TEST_KUBECTL", test) else {
        return;
    };
    let Some(kube) = fake(test, true).await else { return };
    let (code, out, err) = kubectl(&k, &kube, &["apply", "-f", "-"], Some(STORAGE)).await;
    assert_eq!(code, 0, "{out}{err}");
    for made in [
        "persistentvolumeclaim/judged-data created",
        "secret/judged-creds created",
    ] {
        assert!(out.contains(made), "{made} not in {out}");
    }
    // Bound at once, as a dynamic provisioner binds; found by its short name too.
    assert_eq!(
        ok(
            &k,
            &kube,
            &["get", "pvc", "judged-data", "-o", "jsonpath={.status.phase}"]
        )
        .await,
        "Bound"
    );
    assert!(
        ok(&k, &kube, &["get", "persistentvolumeclaims"])
            .await
            .contains("judged-data")
    );
    assert!(ok(&k, &kube, &["get", "secret"]).await.contains("judged-creds"));
    // stringData came back as data, base64.
    assert_eq!(
        ok(
            &k,
            &kube,
            &["get", "secret", "judged-creds", "-o", "jsonpath={.data.token}"]
        )
        .await,
        "aHVudGVyMg=="
    );
    // Applied again with a new value (a strategic merge patch: stringData is never stored, so
    // kubectl always sends it), and labels, as kubectl patches them.
    let changed = STORAGE.replace("hunter2", "hunter3");
    let (code, out, err) = kubectl(&k, &kube, &["apply", "-f", "-"], Some(&changed)).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("persistentvolumeclaim/judged-data unchanged"), "{out}");
    assert!(out.contains("secret/judged-creds configured"), "{out}");
    assert_eq!(
        ok(
            &k,
            &kube,
            &["get", "secret", "judged-creds", "-o", "jsonpath={.data.token}"]
        )
        .await,
        "aHVudGVyMw=="
    );
    ok(&k, &kube, &["label", "pvc", "judged-data", "judge=kubectl"]).await;
    assert_eq!(
        ok(
            &k,
            &kube,
            &[
                "get",
                "pvc",
                "-l",
                "judge=kubectl",
                "-o",
                "jsonpath={.items[0].status.phase}"
            ]
        )
        .await,
        "Bound"
    );
    // Delete waits (a watch) until both are gone: the claim, named by no pod, at once.
    let (code, out, err) = kubectl(&k, &kube, &["delete", "-f", "-"], Some(STORAGE)).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("\"judged-data\" deleted") && out.contains("\"judged-creds\" deleted"),
        "{out}"
    );
    let (code, _, err) = kubectl(&k, &kube, &["get", "pvc", "judged-data"], None).await;
    assert_ne!(code, 0);
    assert!(err.contains("NotFound") || err.contains("not found"), "{err}");
    kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_without_v5_falls_back_to_spdy_which_the_fake_refuses() {
    // kubectl 1.35 asks only v5.channel.k8s.io of a WebSocket and falls back to SPDY, not to
    // v4, on a server without it; the fake speaks no SPDY and says so. This pins that gap.
    let test = "kubectl_without_v5_falls_back_to_spdy_which_the_fake_refuses";
    let Some(k) = tool("AGENTBOX_TEST_KUBECTL", test) else {
        return;
    };
    let Some(kube) = fake(test, false).await else { return };
    let dir = kube.kubeconfig().parent().unwrap().to_path_buf();
    std::fs::write(dir.join("pod.yaml"), POD).unwrap();
    ok(&k, &kube, &["create", "-f", &dir.join("pod.yaml").to_string_lossy()]).await;
    running(&kube, "other").await;
    let (code, _, err) = kubectl(&k, &kube, &["exec", "other", "--", "true"], None).await;
    assert_ne!(code, 0);
    assert!(err.contains("no SPDY"), "{err}");
    kube.shutdown().await;
}

const SANDBOX: &str = r#"
apiVersion: agents.x-k8s.io/v1beta1
kind: Sandbox
metadata:
  name: judged
spec:
  podTemplate:
    metadata:
      labels: {app: judged}
    spec:
      restartPolicy: Never
      containers:
      - {name: main, image: debian:bookworm, command: ["sleep", "300"]}
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata:
  name: tmpl
spec:
  networkPolicyManagement: Unmanaged
  podTemplate:
    spec:
      restartPolicy: Never
      containers:
      - {name: main, image: debian:bookworm, command: ["sleep", "300"]}
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata:
  name: pool
spec:
  replicas: 1
  sandboxTemplateRef: {name: tmpl}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_judges_agent_sandbox_mode() {
    let test = "kubectl_judges_agent_sandbox_mode";
    let Some(k) = tool("AGENTBOX_TEST_KUBECTL", test) else {
        return;
    };
    let Some(kube) = fake_with(test, true, true).await else {
        return;
    };
    let dir = kube.kubeconfig().parent().unwrap().to_path_buf();
    std::fs::write(dir.join("sandbox.yaml"), SANDBOX).unwrap();
    let file = dir.join("sandbox.yaml").to_string_lossy().into_owned();
    let out = ok(&k, &kube, &["create", "-f", &file]).await;
    for made in [
        "sandbox.agents.x-k8s.io/judged created",
        "sandboxtemplate.extensions.agents.x-k8s.io/tmpl created",
        "sandboxwarmpool.extensions.agents.x-k8s.io/pool created",
    ] {
        assert!(out.contains(made), "{made} not in {out}");
    }
    running(&kube, "judged").await;
    let list: Value = serde_json::from_str(&ok(&k, &kube, &["get", "sandboxes", "-o", "json"]).await).unwrap();
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"judged"), "{list}");
    // Ready, as the printer column's jsonpath reads it.
    let end = tokio::time::Instant::now() + WAIT;
    loop {
        let path = "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}";
        if ok(&k, &kube, &["get", "sandbox", "judged", "-o", path]).await == "True" {
            break;
        }
        assert!(tokio::time::Instant::now() < end, "the Sandbox is not Ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The short name, a label (a merge patch), and exec into the Sandbox's pod.
    ok(&k, &kube, &["label", "sandbox", "judged", "judge=kubectl"]).await;
    let got: Value =
        serde_json::from_str(&ok(&k, &kube, &["get", "sandbox", "-l", "judge=kubectl", "-o", "json"]).await).unwrap();
    assert_eq!(got["items"][0]["metadata"]["name"], "judged", "{got}");
    let (code, out, err) = kubectl(
        &k,
        &kube,
        &["exec", "judged", "--", "sh", "-c", "echo inside; exit 3"],
        None,
    )
    .await;
    assert_eq!((code, out.as_str()), (3, "inside\n"), "{err}");
    // The pool and its member.
    let out = ok(&k, &kube, &["get", "sandboxwarmpools"]).await;
    assert!(out.contains("pool"), "{out}");
    let end = tokio::time::Instant::now() + WAIT;
    loop {
        let pool: Value = serde_json::from_str(&ok(&k, &kube, &["get", "swp", "pool", "-o", "json"]).await).unwrap();
        if pool["status"]["readyReplicas"] == 1 {
            break;
        }
        assert!(tokio::time::Instant::now() < end, "the pool is not ready: {pool}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Delete waits until the Sandbox is gone; its pod follows.
    let out = ok(&k, &kube, &["delete", "sandbox", "judged"]).await;
    assert!(out.contains("\"judged\" deleted"), "{out}");
    let (code, _, err) = kubectl(&k, &kube, &["get", "sandbox", "judged"], None).await;
    assert_ne!(code, 0);
    assert!(err.contains("NotFound") || err.contains("not found"), "{err}");
    let end = tokio::time::Instant::now() + WAIT;
    while kube.pod("default", "judged").is_some() {
        assert!(tokio::time::Instant::now() < end, "the Sandbox's pod outlived it");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A 422 as kubectl prints it.
    let (code, _, err) = kubectl(
        &k,
        &kube,
        &["create", "-f", "-"],
        Some("apiVersion: agents.x-k8s.io/v1beta1\nkind: Sandbox\nmetadata: {name: bad}\nspec: {}\n"),
    )
    .await;
    assert_ne!(code, 0);
    assert!(err.contains("spec.podTemplate: Required value"), "{err}");
    kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_judges_agent_sandbox_mode() {
    let test = "the_python_client_judges_agent_sandbox_mode";
    let Some(py) = tool("AGENTBOX_TEST_KUBE_PYTHON", test) else {
        return;
    };
    let Some(kube) = fake_with(test, true, true).await else {
        return;
    };
    let said = run_python(&py, "kube_judge_sandbox.py", kube.kubeconfig()).await;
    for step in [
        "create-sandbox",
        "conflict-409",
        "invalid-422",
        "get-sandbox",
        "list-sandbox",
        "patch-sandbox",
        "create-claim",
        "get-claim py-pool-",
        "list-claim",
        "delete-claim",
        "delete-sandbox",
    ] {
        assert!(
            said.lines().any(|l| l == format!("OK {step}")),
            "no `OK {step}` in:\n{said}"
        );
    }
    kube.shutdown().await;
}

/// Run the Python judge `script` (of this crate's tests) against the fake of `kubeconfig`,
/// within 180 s; what it printed, once it succeeded.
async fn run_python(py: &Path, script: &str, kubeconfig: &Path) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(script);
    let out = tokio::time::timeout(
        Duration::from_secs(180),
        tokio::process::Command::new(py)
            .arg(&script)
            .env("KUBECONFIG", kubeconfig)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the Python judge ends within 180 s")
    .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the Python judge failed:\n{said}\n{err}");
    said
}

async fn python(test: &str, v5: bool) {
    let Some(py) = tool("AGENTBOX_TEST_KUBE_PYTHON", test) else {
        return;
    };
    let Some(kube) = fake(test, v5).await else { return };
    let said = run_python(&py, "kube_judge.py", kube.kubeconfig()).await;
    let stdin_step = if v5 {
        "exec-stdin v5"
    } else {
        "exec-stdin v4.channel.k8s.io"
    };
    for step in [
        "create",
        "list-selector",
        "conflict-409",
        "missing-404",
        "exec-returncode 3",
        stdin_step,
        "deadline-lowered",
        "deadline-raised-422",
        "portforward",
        "delete",
        "deletecollection",
    ] {
        assert!(
            said.lines().any(|l| l == format!("OK {step}")),
            "no `OK {step}` in:\n{said}"
        );
    }
    kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_judges_the_fake() {
    python("the_python_client_judges_the_fake", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_judges_the_fake_without_v5() {
    python("the_python_client_judges_the_fake_without_v5", false).await;
}

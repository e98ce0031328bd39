//! A run moved to a Kubernetes pod whose volume claim holds the runs' root: the kube driver
//! against the fake API server (its pods namespace boxes, its claims directories of this
//! machine), with a real PostgreSQL reached by its socket directory.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use agentbox_fakes::kube::{FakeKube, FakeKubeOptions};
use agentbox_runs::Store;
use agentbox_testing::services::{postgres_socket, rootfs};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use kube::Api;
use kube::api::PostParams;

const BIN: &str = env!("CARGO_BIN_EXE_agentbox");

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_moves_from_this_host_to_a_pod_on_its_volume_claim() {
    const TEST: &str = "a_run_moves_from_this_host_to_a_pod_on_its_volume_claim";
    let (Some(rootfs), Some(conn)) = (rootfs(TEST), postgres_socket(TEST)) else {
        return;
    };
    let fake = FakeKube::start(FakeKubeOptions {
        rootfs: Some(rootfs.into()),
        ..Default::default()
    })
    .await
    .expect("the fake API server starts");
    let kc = kube::config::Kubeconfig::read_from(fake.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let in_cluster: Api<Secret> = Api::namespaced(client, "default");
    let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "runs"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    claims.create(&PostParams::default(), &pvc).await.unwrap();
    // The claim's volume, as this machine (the cluster's one node) sees it.
    let root = fake.claim_dir("default", "runs").unwrap();
    let meta = std::fs::metadata(&root).unwrap();
    // This host's generation runs as the pods' user, as every host sharing a volume must.
    let as_pods = |args: &[&str]| {
        let mut c = Command::new("setpriv");
        c.args([
            &format!("--reuid={}", meta.uid()),
            &format!("--regid={}", meta.gid()),
            "--clear-groups",
            BIN,
        ])
        .args(args);
        c
    };
    let secrets = tempfile::tempdir().unwrap();
    std::fs::set_permissions(secrets.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let pg = secrets.path().join("postgres");
    std::fs::write(&pg, format!("{conn}\n")).unwrap();
    std::fs::set_permissions(&pg, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (root_s, pg_s) = (root.to_str().unwrap(), pg.to_str().unwrap());
    let id = &format!("to-a-pod-{}", std::process::id());
    assert!(
        as_pods(&["runs", "new", id, "--root", root_s])
            .status()
            .unwrap()
            .success()
    );

    let first = as_pods(&[
        "runs",
        "agent",
        id,
        "--root",
        root_s,
        "--postgres-file",
        pg_s,
        "--steps",
        "6",
        "--step-time",
        "1s",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let dir = root.join("runs").join(id);
    common::record_until(&dir, "held by the first generation", |r| r["status"] == "open");
    let moved = Command::new(BIN)
        .args([
            "runs",
            "move",
            id,
            "--root",
            root_s,
            "--to",
            "kube",
            "--claim",
            "runs",
            "--host-binary",
        ])
        .args(["--postgres-file", pg_s, "--lifetime", "5m", "--command"])
        .args(["agentbox", "runs", "agent", "--steps", "6", "--step-time", "1s"])
        .env("KUBECONFIG", fake.kubeconfig())
        .env_remove("AGENTBOX_KUBE_NAMESPACE")
        .output()
        .unwrap();
    let first = first.wait_with_output().unwrap();
    assert!(first.status.success(), "{}", text(&first.stderr));
    let said = text(&moved.stdout);
    assert!(moved.status.success(), "{said}{}", text(&moved.stderr));
    assert!(
        said.contains("generation 2 ran in kube pod default/agentbox-run-"),
        "{said}"
    );
    // The pod's log came here: the agent there was told it moved, and counted to the end.
    assert!(
        said.contains("This run moved from host") && said.contains("a planned move to kube"),
        "{said}"
    );
    assert!(said.contains("answered: Counted to 6."), "{said}");

    let run: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(
        (run["status"].as_str(), run["generation"].as_u64()),
        (Some("sealed"), Some(2))
    );
    let conv = Store::read(&dir.join("store.db")).unwrap().messages().unwrap();
    assert_eq!(conv.iter().filter(|m| m.role == "user").count(), 1);
    assert!(conv.iter().any(|m| m.generation == 2 && m.role == "tool"));
    let log = std::fs::read_to_string(dir.join("workspace/count.log")).unwrap();
    let steps: Vec<&str> = log.lines().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(steps, ["1", "2", "3", "4", "5", "6"], "{log}");
    let starts = std::fs::read_to_string(dir.join("starts.jsonl")).unwrap();
    let start: serde_json::Value = serde_json::from_str(starts.trim()).unwrap();
    assert_eq!(
        (start["driver"].as_str(), start["exit"].as_i64()),
        (Some("kube"), Some(0))
    );
    // The pod is gone (its Secret with it): nothing of the generation is left in the cluster.
    let t = Instant::now();
    while !fake.pods().is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{:?}",
            fake.pods().iter().map(|p| &p.name).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(in_cluster.list(&Default::default()).await.unwrap().items.is_empty());
    // The connection string went in a Secret, never in the pod's spec: the driver said no
    // more of it than its file's name.
    assert!(!said.contains("dbname=") && !text(&moved.stderr).contains("dbname="));
}

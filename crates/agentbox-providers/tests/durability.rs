//! The acknowledged-writes probe on the disks a run may live on: this machine's file system
//! (a local box) and a Docker named volume shared by two containers.

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Provider, Spec};
use agentbox_providers::docker::{DockerOptions, DockerProvider, NamedVolume};
use agentbox_providers::durability::probe_acknowledged_writes;
use agentbox_providers::local::{LocalOptions, LocalProvider};
use agentbox_testing::services::docker_available;
use agentbox_testing::sh;

fn ctx() -> Ctx {
    Ctx::background().with_timeout(Duration::from_secs(120))
}

#[tokio::test]
async fn a_local_box_keeps_every_acknowledged_write() {
    let root = tempfile::tempdir().unwrap();
    let p = LocalProvider::new(LocalOptions::at(root.path()).unwrap()).unwrap();
    let b = p.create(&Spec::new(Duration::from_secs(60)), &ctx()).await.unwrap();
    let probe = probe_acknowledged_writes(&*b, None, &ctx()).await.unwrap();
    assert!(probe.passed(), "{probe}");
    assert_eq!((probe.acknowledged, probe.kept), (10, 10));
    assert!(
        !probe.file_system.is_empty() && probe.file_system != "unknown",
        "{probe}"
    );
    // The probe leaves nothing behind.
    assert_eq!(sh(&*b, "ls -A").await.stdout_text(), "");
    // A directory it cannot write in is an error naming it, not a pass or a fail.
    let e = probe_acknowledged_writes(&*b, Some("/proc"), &ctx()).await.unwrap_err();
    assert!(e.message().contains("/proc"), "{e}");
    b.destroy(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_volume_keeps_every_acknowledged_write_for_the_next_container() {
    if !docker_available("a_docker_volume_keeps_every_acknowledged_write_for_the_next_container") {
        return;
    }
    let volume = format!("agentbox-probe-{}", std::process::id());
    let p: Arc<dyn Provider> = Arc::new(
        DockerProvider::new(DockerOptions {
            volumes: vec![NamedVolume {
                name: volume.clone(),
                target: "/runs".into(),
                read_only: false,
            }],
            ..Default::default()
        })
        .await
        .unwrap(),
    );
    let spec = Spec::new(Duration::from_secs(120));
    let b = p.create(&spec, &ctx()).await.unwrap();
    let probe = probe_acknowledged_writes(&*b, Some("/runs"), &ctx()).await.unwrap();
    assert!(probe.passed(), "{probe}");
    // What one container wrote on the volume, the next one reads.
    assert!(
        sh(&*b, "echo from-the-first > /runs/seen && sync")
            .await
            .status
            .success()
    );
    b.destroy(&ctx()).await.unwrap();
    let c = p.create(&spec, &ctx()).await.unwrap();
    assert_eq!(sh(&*c, "cat /runs/seen").await.stdout_text(), "from-the-first\n");
    let again = probe_acknowledged_writes(&*c, Some("/runs"), &ctx()).await.unwrap();
    assert!(again.passed(), "{again}");
    c.destroy(&ctx()).await.unwrap();
    let _ = std::process::Command::new("docker")
        .args(["volume", "rm", "-f", &volume])
        .output();
}

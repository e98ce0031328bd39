//! `agentbox bench kube`: agentbox's own cost per operation on Kubernetes boxes, against the
//! fake API server (`agentbox-fake kube`), beside the same operation made with kube-rs
//! directly (a bare pod, a bare exec). The fake's and the cluster's time is in both sides,
//! so the ratio is what the provider adds: the hardened manifest, the shim, the checks.

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Error, Provider, Result, Sandbox, Spec};
use agentbox_providers::helper::HelperCommand;
use agentbox_providers::kube::{KubeOptions, KubeProvider};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tokio::io::{AsyncBufReadExt, AsyncReadExt};

use super::BenchArgs;
use super::boxes::{box_true, create_exec_destroy};
use super::measure::{measure, measure_all, pair, print_pairs, side};

/// The fake API server, a child process, killed when dropped.
struct Fake {
    child: tokio::process::Child,
    dir: std::path::PathBuf,
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Start `agentbox-fake kube` (`$AGENTBOX_FAKE`, else beside this executable) with its pods
/// on `$AGENTBOX_TEST_ROOTFS`, and wait (30 s at most) for it to say it listens.
async fn start_fake() -> Result<Fake> {
    let program = match std::env::var_os("AGENTBOX_FAKE") {
        Some(p) => std::path::PathBuf::from(p),
        None => std::env::current_exe()
            .map_err(|e| Error::io(e, "finding this executable"))?
            .with_file_name("agentbox-fake"),
    };
    let rootfs = std::env::var_os("AGENTBOX_TEST_ROOTFS").ok_or_else(|| {
        Error::invalid(
            "bench kube: AGENTBOX_TEST_ROOTFS must name the fake's pods' root file system (scripts/box-rootfs)",
        )
    })?;
    let dir = std::env::temp_dir().join(format!("agentbox-bench-kube-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(e, dir.display().to_string()))?;
    let mut child = tokio::process::Command::new(&program)
        .args(["kube", "--listen", "127.0.0.1:0", "--kubeconfig"])
        .arg(dir.join("kubeconfig"))
        .arg("--rootfs")
        .arg(&rootfs)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            Error::io(
                e,
                format!("starting {} (cargo build -p agentbox-fakes)", program.display()),
            )
        })?;
    let stdout = child.stdout.take().ok_or_else(|| Error::unknown("the fake's stdout"))?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let said = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(l)) = lines.next_line().await {
            if l.starts_with("listening ") {
                return Ok(());
            }
        }
        Err(Error::unknown("the fake API server ended before it listened"))
    })
    .await
    .map_err(|_| Error::timeout("the fake API server did not listen within 30 s"))?;
    said?;
    // Its later lines are not read: keep the pipe drained so it never blocks on them.
    tokio::spawn(async move {
        let mut rest = lines.into_inner();
        let mut sink = Vec::new();
        let _ = rest.read_to_end(&mut sink).await;
    });
    Ok(Fake { child, dir })
}

/// A bare pod: the image and a sleeping first process, nothing else.
fn bare_pod(name: &str) -> Result<Pod> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"agentbox-bench": "bare"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "box", "image": agentbox_providers::kube::DEFAULT_IMAGE, "command": ["sleep", "600"]}]
        }
    }))
    .map_err(|e| Error::unknown(format!("the bare pod: {e}")))
}

/// `true` by a bare exec of kube-rs's own.
async fn bare_true(pods: &Api<Pod>, name: &str) -> Result<()> {
    let ap = kube::api::AttachParams::default();
    let mut p = pods
        .exec(name, ["true"], &ap)
        .await
        .map_err(|e| Error::unknown(format!("bare exec: {e}")))?;
    let status = p.take_status().ok_or_else(|| Error::unknown("bare exec: no status"))?;
    match status.await {
        Some(s) if s.status.as_deref() == Some("Success") => Ok(()),
        s => Err(Error::unknown(format!("bare exec of true: {s:?}"))),
    }
}

/// A bare pod made, waited for, `true` run in it, and deleted.
async fn bare_cycle(pods: &Api<Pod>, n: &std::sync::atomic::AtomicU32) -> Result<()> {
    let name = format!(
        "bare-{}-{}",
        std::process::id(),
        n.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    );
    pods.create(&Default::default(), &bare_pod(&name)?)
        .await
        .map_err(|e| Error::unknown(format!("bare create: {e}")))?;
    for _ in 0..600 {
        let p = pods
            .get(&name)
            .await
            .map_err(|e| Error::unknown(format!("bare get: {e}")))?;
        if p.status.and_then(|s| s.phase).as_deref() == Some("Running") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bare_true(pods, &name).await?;
    let dp = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    pods.delete(&name, &dp)
        .await
        .map_err(|e| Error::unknown(format!("bare delete: {e}")))?;
    Ok(())
}

pub(super) async fn kube(args: BenchArgs) -> Result<()> {
    let fake = start_fake().await?;
    let kubeconfig = fake.dir.join("kubeconfig");
    let n = args.iterations;
    eprintln!("agentbox bench kube: {n} samples of each side, interleaved, against the fake API server");
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).map_err(|e| Error::invalid(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| Error::invalid(e.to_string()))?;
    let client = kube::Client::try_from(config).map_err(|e| Error::invalid(e.to_string()))?;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let opts = KubeOptions {
        kubeconfig: Some(kubeconfig),
        ..Default::default()
    };
    let provider: Arc<dyn Provider> = Arc::new(KubeProvider::new(opts.clone()).await?);
    let runner = std::env::var_os("AGENTBOX_RUNNER").map(|p| HelperCommand {
        program: p.into(),
        args: Vec::new(),
    });
    let mut pairs = Vec::new();
    let mut notes = Vec::new();

    let count = std::sync::atomic::AtomicU32::new(0);
    let (a, b) = measure(n, || bare_cycle(&pods, &count), || create_exec_destroy(&provider)).await?;
    pairs.push(pair(
        "create → first exec → destroy",
        "a bare pod, kube-rs exec, delete",
        "a kube box (hardened pod, shim)",
        a,
        b,
    ));

    let ctx = Ctx::background().with_timeout(Duration::from_secs(600));
    let spec = Spec::new(Duration::from_secs(600)).label("agentbox-bench", "1");
    let plain = provider.create(&spec, &ctx).await?;
    let bare = format!("bare-{}-exec", std::process::id());
    pods.create(&Default::default(), &bare_pod(&bare)?)
        .await
        .map_err(|e| Error::unknown(format!("bare create: {e}")))?;
    let mut waited = 0;
    while pods
        .get(&bare)
        .await
        .ok()
        .and_then(|p| p.status)
        .and_then(|s| s.phase)
        .as_deref()
        != Some("Running")
    {
        waited += 1;
        if waited > 3000 {
            return Err(Error::timeout("the bare pod did not run within 30 s"));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let with_runner: Option<Arc<dyn Sandbox>> = match &runner {
        Some(r) => {
            let p = KubeProvider::new(KubeOptions {
                runner: Some(r.clone()),
                ..opts.clone()
            })
            .await?;
            Some(p.create(&spec, &ctx).await?)
        }
        None => {
            notes.push("exec through the runner: AGENTBOX_RUNNER names no static runner".to_string());
            None
        }
    };
    let mut labels = vec!["a kube box's exec (shim, its own WebSocket)".to_string()];
    let mut sides = vec![side(|| bare_true(&pods, &bare)), side(|| box_true(&*plain))];
    if let Some(r) = &with_runner {
        labels.push("a kube box's runner (one message on the relay)".into());
        sides.push(side(move || box_true(&**r)));
    }
    let stats = measure_all(n, sides).await?;
    for (label, s) in labels.iter().zip(&stats[1..]) {
        pairs.push(pair(
            "exec round trip of true",
            "kube-rs exec of true in a bare pod",
            label,
            stats[0],
            *s,
        ));
    }
    plain.destroy(&ctx).await?;
    if let Some(r) = with_runner {
        r.destroy(&ctx).await?;
    }
    let _ = pods.delete(&bare, &Default::default()).await;
    drop(fake);
    print_pairs(&pairs, &notes, args.json)
}

//! The kube driver: one generation of a run as a pod whose volume claim holds the runs' root.

use std::path::Path;
use std::time::Duration;

use agentbox_core::{Error, Result};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, LogParams, PostParams};
use serde_json::json;

use super::DriverArgs;

/// Where a PostgreSQL socket directory of this machine is bound in the pod.
const SOCKET_IN_POD: &str = "/tmp/agentbox/pgsocket";

/// How long the cluster may take to start the pod before the driver gives up.
const START_DEADLINE: Duration = Duration::from_secs(300);

/// A name Kubernetes takes (a DNS label): `agentbox-run-` and the run's id, lowered and cut,
/// and a random suffix.
fn pod_name(id: &str) -> Result<String> {
    let mut tag = [0u8; 4];
    getrandom::fill(&mut tag).map_err(|e| Error::unknown(format!("the kernel gave no random bytes: {e}")))?;
    let mut base: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    base.truncate(40);
    let suffix: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("agentbox-run-{}-{suffix}", base.trim_matches('-')))
}

/// A client for the calls (each with a read deadline) and one for the pod's log, which may be
/// quiet for long (a generation waiting on its model): that one's bound is the lifetime.
async fn client(namespace: Option<&str>) -> Result<(kube::Client, kube::Client, String)> {
    let mut config = kube::Config::infer().await.map_err(|e| {
        Error::invalid(format!(
            "kube driver: no cluster (neither a kubeconfig nor in-cluster config): {e}"
        ))
    })?;
    config.connect_timeout = Some(Duration::from_secs(10));
    config.write_timeout = Some(Duration::from_secs(60));
    let ns = namespace
        .map(str::to_string)
        .unwrap_or_else(|| config.default_namespace.clone());
    let logs = kube::Client::try_from(config.clone()).map_err(|e| Error::invalid(format!("kube client: {e}")))?;
    // Every other request has a deadline: a cluster that stops answering is an error, not a
    // hang.
    config.read_timeout = Some(Duration::from_secs(60));
    let client = kube::Client::try_from(config).map_err(|e| Error::invalid(format!("kube client: {e}")))?;
    Ok((client, logs, ns))
}

fn kube_err(e: kube::Error, what: &str) -> Error {
    match &e {
        kube::Error::Api(s) if s.code == 404 => Error::not_found(format!("kube driver: {what}: {}", s.message)),
        kube::Error::Api(s) if s.code == 422 || s.code == 400 => {
            Error::invalid(format!("kube driver: {what}: {}", s.message))
        }
        _ => Error::unknown(format!("kube driver: {what}: {e}")),
    }
}

/// Run `command` for run `id` in a pod; its place and exit code.
pub(super) async fn run(
    args: &DriverArgs,
    id: &str,
    postgres_file: Option<&Path>,
    command: &[String],
) -> Result<(String, i32)> {
    let k = &args.kube;
    let claim = k
        .claim
        .as_deref()
        .ok_or_else(|| Error::invalid("--claim: the kube driver needs the volume claim that holds the runs' root"))?;
    let lifetime = agentbox_core::parse_duration(&args.lifetime).map_err(|e| e.context("--lifetime"))?;
    let (client, logs, ns) = client(k.namespace.as_deref()).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let log_pods: Api<Pod> = Api::namespaced(logs, &ns);
    let secrets: Api<Secret> = Api::namespaced(client, &ns);
    let name = pod_name(id)?;

    let mut volumes = vec![json!({"name": "runs", "persistentVolumeClaim": {"claimName": claim}})];
    let mut mounts = vec![json!({"name": "runs", "mountPath": "/runs"})];
    let mut env = vec![
        json!({"name": "AGENTBOX_RUN", "value": id}),
        json!({"name": "AGENTBOX_RUNS", "value": "/runs"}),
        json!({"name": super::DRIVER_ENV, "value": "kube"}),
        json!({"name": "AGENTBOX_HOME", "value": "/tmp/agentbox-home"}),
        json!({"name": "HOME", "value": "/tmp"}),
    ];
    if k.host_binary {
        let exe = std::env::current_exe().map_err(|e| Error::io(e, "finding the agentbox executable"))?;
        let exe = super::canonical(&exe, "the agentbox executable")?;
        volumes.push(json!({"name": "agentbox", "hostPath": {"path": exe, "type": "File"}}));
        mounts.push(json!({"name": "agentbox", "mountPath": "/tmp/agentbox/bin/agentbox", "readOnly": true}));
        env.push(json!({"name": "PATH", "value": "/tmp/agentbox/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}));
    }
    // The connection string goes in a Secret, mounted as a file: never in the pod's env or
    // spec.
    let mut secret_made = false;
    if let Some(f) = postgres_file {
        let mut config = super::read_postgres_file(f)?;
        // A unix socket directory of this machine is bound into the pod (where the image may
        // have no such path) and the connection string points there.
        if k.host_binary
            && let Some(dir) = super::socket_dir(&config)
        {
            config = config.replace(&format!("host={dir}"), &format!("host={SOCKET_IN_POD}"));
            volumes.push(json!({"name": "pgsocket", "hostPath": {"path": dir, "type": "Directory"}}));
            mounts.push(json!({"name": "pgsocket", "mountPath": SOCKET_IN_POD, "readOnly": true}));
        }
        let secret: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "labels": {"run": label_value(id)}},
            "stringData": {"postgres": config},
        }))
        .map_err(|e| Error::unknown(format!("the Secret: {e}")))?;
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .map_err(|e| kube_err(e, "making the connection's Secret"))?;
        secret_made = true;
        volumes.push(json!({"name": "postgres", "secret": {"secretName": name, "defaultMode": 0o400}}));
        mounts.push(json!({"name": "postgres", "mountPath": "/tmp/agentbox/secret", "readOnly": true}));
        env.push(json!({"name": "AGENTBOX_RUNS_POSTGRES_FILE", "value": "/tmp/agentbox/secret/postgres"}));
    }
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"run": label_value(id), "app.kubernetes.io/managed-by": "agentbox"}},
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": lifetime.as_secs().max(1),
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "generation",
                "image": k.image,
                "command": command,
                "env": env,
                "volumeMounts": mounts,
            }],
            "volumes": volumes,
        }
    }))
    .map_err(|e| Error::unknown(format!("the pod: {e}")))?;
    let ran = async {
        pods.create(&PostParams::default(), &pod)
            .await
            .map_err(|e| kube_err(e, "making the pod"))?;
        let place = format!("kube pod {ns}/{name}");
        eprintln!("agentbox: run {id}: started {place}");
        let code = watch(&pods, &log_pods, &name, lifetime).await?;
        Ok::<_, Error>((place, code))
    }
    .await;
    if let Err(e) = pods.delete(&name, &DeleteParams::default()).await {
        tracing::warn!(pod = %name, "deleting the generation's pod: {e}");
    }
    if secret_made && let Err(e) = secrets.delete(&name, &DeleteParams::default()).await {
        tracing::warn!(secret = %name, "deleting the connection's Secret: {e}");
    }
    ran
}

/// A label's value: 63 characters at most, alphanumerics, `-`, `_`, `.`.
fn label_value(id: &str) -> String {
    // It must begin and end with a letter or digit.
    let v = id.trim_start_matches(['-', '_', '.']);
    let v: String = v.chars().take(63).collect();
    v.trim_end_matches(['-', '_', '.']).to_string()
}

/// Wait for the pod to start, stream its log here, and read its exit code.
async fn watch(pods: &Api<Pod>, log_pods: &Api<Pod>, name: &str, lifetime: Duration) -> Result<i32> {
    let started = tokio::time::Instant::now();
    loop {
        let p = pods.get(name).await.map_err(|e| kube_err(e, "reading the pod"))?;
        let phase = p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        if phase != "Pending" && !phase.is_empty() {
            break;
        }
        if started.elapsed() > START_DEADLINE {
            let why = waiting_reason(&p).unwrap_or_else(|| "no reason given".into());
            return Err(Error::timeout(format!(
                "kube driver: pod {name} did not start within {}s: {why}",
                START_DEADLINE.as_secs()
            )));
        }
        if let Some(why) = waiting_reason(&p).filter(|w| w.contains("Err") || w.contains("Invalid")) {
            return Err(Error::unknown(format!("kube driver: pod {name} cannot start: {why}")));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The log, followed until the container ends (or the lifetime and a minute pass).
    // Its bytes as they come (not lines: a log need not be text, nor end its lines), written
    // here; a stdout that is gone (a closed pipe) stops the copy, never the pod.
    let follow = async {
        use futures_util::AsyncReadExt;
        let mut stream = log_pods
            .log_stream(
                name,
                &LogParams {
                    follow: true,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| kube_err(e, "reading the pod's log"))?;
        let mut buf = vec![0u8; 64 << 10];
        let mut out = std::io::stdout();
        loop {
            let n = stream
                .read(&mut buf)
                .await
                .map_err(|e| Error::io(e, "reading the pod's log"))?;
            if n == 0 {
                break;
            }
            use std::io::Write;
            if out.write_all(&buf[..n]).and_then(|_| out.flush()).is_err() {
                tracing::warn!(pod = name, "stdout is gone: the pod's log is no longer copied");
                break;
            }
        }
        Ok::<_, Error>(())
    };
    tokio::time::timeout(lifetime + Duration::from_secs(60), follow)
        .await
        .map_err(|_| Error::timeout(format!("kube driver: pod {name} outlived its lifetime")))??;
    // The exit code, once the kubelet has reported it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let p = pods.get(name).await.map_err(|e| kube_err(e, "reading the pod"))?;
        let terminated = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.as_ref())
            .map(|t| t.exit_code);
        if let Some(code) = terminated {
            return Ok(code);
        }
        let phase = p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        if phase == "Failed" {
            let why = p.status.as_ref().and_then(|s| s.reason.clone()).unwrap_or_default();
            return Err(Error::unknown(format!("kube driver: pod {name} failed: {why}")));
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Error::timeout(format!(
                "kube driver: pod {name}'s exit was not reported within 60 s of its log's end"
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Why the pod's container waits, as the kubelet says.
fn waiting_reason(p: &Pod) -> Option<String> {
    let w = p
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .waiting
        .as_ref()?;
    Some(format!(
        "{}: {}",
        w.reason.clone().unwrap_or_default(),
        w.message.clone().unwrap_or_default()
    ))
}

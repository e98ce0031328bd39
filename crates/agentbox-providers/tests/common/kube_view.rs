//! The cluster seen from outside the provider, shared by the fake's and the live suites.

use agentbox_core::SandboxId;
use agentbox_testing::conformance::Outside;
use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

/// The cluster as seen by kube-rs directly, not through the provider: a box has ended when
/// its pod is gone or no longer runs; a pid is alive while `/proc/PID/stat` in the pod says
/// so (an exec of kube-rs's own, not the provider's).
pub(crate) struct ClusterView {
    pods: Api<Pod>,
}

impl ClusterView {
    /// Over the cluster of `kubeconfig`, in `namespace` (empty: the context's).
    pub(crate) async fn new(kubeconfig: &std::path::Path, namespace: &str) -> Self {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let ns = if namespace.is_empty() {
            config.default_namespace.clone()
        } else {
            namespace.to_string()
        };
        let client = kube::Client::try_from(config).unwrap();
        ClusterView {
            pods: Api::namespaced(client, &ns),
        }
    }

    /// The box's pod, where it exists.
    pub(crate) async fn pod(&self, id: &SandboxId) -> Option<Pod> {
        let name = id.name().split_once(':').map(|(_, p)| p.to_string())?;
        self.pods.get_opt(&name).await.unwrap()
    }
}

#[async_trait]
impl Outside for ClusterView {
    async fn ended(&self, id: &SandboxId) -> bool {
        match self.pod(id).await {
            None => true,
            Some(p) => !matches!(
                p.status.and_then(|s| s.phase).as_deref(),
                Some("Running") | Some("Pending")
            ),
        }
    }

    async fn any_alive(&self, id: &SandboxId, pids: &[u32]) -> bool {
        if self.ended(id).await {
            return false;
        }
        let name = id.name().split_once(':').map(|(_, p)| p.to_string()).unwrap();
        for pid in pids {
            let script = format!("sed -n 's/.*) \\(.\\).*/\\1/p' /proc/{pid}/stat 2>/dev/null");
            let ap = kube::api::AttachParams::default().stderr(false);
            let mut p = match self.pods.exec(&name, ["sh", "-c", &script], &ap).await {
                Ok(p) => p,
                // A pod that ended meanwhile runs nothing (its container can be gone a moment
                // before its phase says so: the phase is given five seconds to); any other
                // failure is the view's, and must not read as "not alive".
                Err(e) => {
                    for _ in 0..20 {
                        if self.ended(id).await {
                            return false;
                        }
                        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                    }
                    panic!("outside: an exec in pod {name} to read /proc/{pid}/stat failed: {e}")
                }
            };
            let mut out = String::new();
            if let Some(mut o) = p.stdout() {
                use tokio::io::AsyncReadExt;
                let _ = o.read_to_string(&mut out).await;
            }
            let _ = p.join().await;
            let s = out.trim();
            if !s.is_empty() && s != "Z" && s != "X" {
                return true;
            }
        }
        false
    }
}

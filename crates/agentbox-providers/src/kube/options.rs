//! What a kube provider is made with: [`KubeOptions`], its defaults, and where it reads them from
//! the environment.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use agentbox_core::{Error, Result};

use super::{DEFAULT_IMAGE, DEFAULT_MAX_LIFETIME, DEFAULT_UID, DEFAULT_WORKSPACE, dns_label, dns_subdomain};
use crate::helper::HelperCommand;

/// How a [`KubeProvider`](super::KubeProvider) makes its pods.
#[derive(Clone, Debug)]
pub struct KubeOptions {
    /// The kubeconfig to read; `None`: `$KUBECONFIG`, `~/.kube/config`, else the in-cluster
    /// service account.
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig's context; `None`: its current one.
    pub context: Option<String>,
    /// The namespace pods are made in; empty: the kubeconfig context's (else `default`).
    pub namespace: String,
    /// The image when a spec names none.
    pub image: String,
    /// The container's `imagePullPolicy`; `None`: the cluster's default.
    pub image_pull_policy: Option<String>,
    /// `runtimeClassName` for every pod (`gvisor`, `kata`...), stated in the facts' isolation.
    pub runtime_class: Option<String>,
    /// The longest lifetime a box may have or be extended to: every pod's
    /// `activeDeadlineSeconds`.
    pub max_lifetime: Duration,
    /// The uid, gid and fsGroup programs run as (never 0: `runAsNonRoot`).
    pub uid: i64,
    /// CPUs when a spec names none.
    pub cpus: Option<f64>,
    /// Memory in MiB when a spec names none.
    pub memory_mb: Option<u64>,
    /// A node selector for pods that ask for a GPU (beside `nvidia.com/gpu: 1` and a
    /// toleration of the `nvidia.com/gpu` taint).
    pub gpu_node_selector: BTreeMap<String, String>,
    /// The node label a spec's GPU model selects (`nvidia.com/gpu.product` by default).
    pub gpu_label: String,
    /// Where programs start unless a spec names a workspace.
    pub workspace: String,
    /// How long a pod may take to run (scheduling, pulling its image).
    pub start_timeout: Duration,
    /// A static `agentbox-runner` of this machine's, copied into each pod made: each command
    /// and file operation is then one message through a relay exec.
    pub runner: Option<HelperCommand>,
    /// Make boxes through kubernetes-sigs/agent-sandbox (a Sandbox per box, warm pools as
    /// SandboxWarmPool and SandboxClaim: [`KubeProvider::claim_pool`](super::KubeProvider::claim_pool)) rather than as bare
    /// pods. The provider is refused, naming what is missing, where discovery does not show
    /// `agents.x-k8s.io/v1beta1` and `extensions.agents.x-k8s.io/v1beta1`.
    pub agent_sandbox: bool,
}

impl Default for KubeOptions {
    fn default() -> Self {
        KubeOptions {
            kubeconfig: None,
            context: None,
            namespace: String::new(),
            image: DEFAULT_IMAGE.into(),
            image_pull_policy: None,
            runtime_class: None,
            max_lifetime: DEFAULT_MAX_LIFETIME,
            uid: DEFAULT_UID,
            cpus: None,
            memory_mb: None,
            gpu_node_selector: BTreeMap::new(),
            gpu_label: "nvidia.com/gpu.product".into(),
            workspace: DEFAULT_WORKSPACE.into(),
            start_timeout: Duration::from_secs(180),
            runner: None,
            agent_sandbox: false,
        }
    }
}

impl KubeOptions {
    /// Check every option, naming the one that is wrong.
    pub fn validate(&self) -> Result<()> {
        if !self.namespace.is_empty() && !dns_label(&self.namespace) {
            return Err(Error::invalid(format!(
                "kube namespace: {:?} is not a DNS label (1 to 63 of a-z, 0-9 and -)",
                self.namespace
            )));
        }
        if self.image.is_empty() || self.image.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(Error::invalid(format!(
                "kube image: {:?} is not an image name",
                self.image
            )));
        }
        if let Some(p) = &self.image_pull_policy
            && !matches!(p.as_str(), "Always" | "IfNotPresent" | "Never")
        {
            return Err(Error::invalid(format!(
                "kube image_pull_policy: {p:?} is not Always, IfNotPresent or Never"
            )));
        }
        if let Some(rc) = &self.runtime_class
            && !dns_subdomain(rc)
        {
            return Err(Error::invalid(format!(
                "kube runtime_class: {rc:?} is not a DNS subdomain"
            )));
        }
        if self.uid <= 0 {
            return Err(Error::invalid(format!(
                "kube uid: {} is root or below; pods run as non-root",
                self.uid
            )));
        }
        if self.max_lifetime < Duration::from_secs(60) || self.max_lifetime > Duration::from_secs(30 * 24 * 3600) {
            return Err(Error::invalid(format!(
                "kube max_lifetime: {} s is not between 60 s and 30 days",
                self.max_lifetime.as_secs()
            )));
        }
        if !agentbox_core::is_normal_absolute(&self.workspace) {
            return Err(Error::invalid(format!(
                "kube workspace: {:?} is not an absolute path in normal form",
                self.workspace
            )));
        }
        Ok(())
    }
}

//! Warm pools through agent-sandbox: a SandboxTemplate and a SandboxWarmPool of one spec, whose
//! ready Sandboxes a SandboxClaim per box adopts. The cluster's controller keeps the pool
//! full, so ready pods outlive this host as the pool object does (delete it with
//! [`ClaimPool::close`]); agentbox's own [`crate::pool::Pool`] does the same from the host for
//! any provider.
//!
//! A ready pod has no deadline yet (its first process waits, bounded by
//! `activeDeadlineSeconds`); its claim gives it its box key, the host's labels and the
//! deadline as pod metadata, and the claim's `lifecycle.shutdownTime` is the controller's end
//! of the box.

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{
    Ctx, Error, Honours, Labels, Lifecycle, Network, Provider, Result, Sandbox, SandboxId, Spec, now_ms,
};
use async_trait::async_trait;

use super::{KubeProvider, pod};
use crate::random::random_hex;

/// A warm pool of kube boxes of one spec, kept by the cluster's agent-sandbox controller.
/// Made by [`KubeProvider::claim_pool`]; a create of that spec (any lifetime, any labels)
/// claims a ready box, any other spec is made as the provider makes it.
pub struct ClaimPool {
    inner: Arc<KubeProvider>,
    spec: Spec,
    name: String,
}

/// A claim pool's box carries the host's labels under `pod::CLAIMED`, so a key may have no
/// prefix of its own.
pub(super) fn check_claim_labels(labels: &Labels) -> Result<()> {
    match labels.keys().find(|k| k.contains('/')) {
        Some(k) => Err(Error::invalid(format!(
            "label {k:?}: a claim pool's box carries its labels under {}, so a key may have no prefix of its own",
            pod::CLAIMED
        ))),
        None => Ok(()),
    }
}

/// The spec a pool serves, with what may differ between its boxes (lifetime, labels) set
/// aside.
fn shape(spec: &Spec) -> serde_json::Value {
    let mut s = spec.clone();
    s.max_lifetime = Duration::from_secs(1);
    s.labels.clear();
    serde_json::to_value(&s).unwrap_or_default()
}

impl KubeProvider {
    /// A warm pool of `size` ready boxes of `spec` as a SandboxWarmPool (made, or found
    /// where another host made the same one), claimed by SandboxClaims. Needs
    /// [`super::KubeOptions::agent_sandbox`]; a spec with `network: none` is refused (its
    /// policy is per box, and a claim cannot carry one).
    ///
    /// ```no_run
    /// # async fn f(p: std::sync::Arc<agentbox_providers::kube::KubeProvider>) -> agentbox_core::Result<()> {
    /// use std::time::Duration;
    /// use agentbox_core::{Ctx, Provider, Spec};
    /// let spec = Spec::new(Duration::from_secs(3600));
    /// let pool = p.claim_pool(&spec, 4, &Ctx::background()).await?;
    /// let b = pool.create(&spec, &Ctx::background()).await?; // a ready pod, claimed
    /// # Ok(()) }
    /// ```
    pub async fn claim_pool(self: &Arc<Self>, spec: &Spec, size: usize, ctx: &Ctx) -> Result<ClaimPool> {
        let Some(asb) = &self.asb else {
            return Err(Error::unsupported(
                "claim_pool: the provider was made without agent_sandbox (SandboxWarmPool is agent-sandbox's)",
            ));
        };
        if !(1..=crate::pool::MAX_POOL).contains(&size) {
            return Err(Error::invalid(format!(
                "claim_pool size: {size} is not between 1 and {}",
                crate::pool::MAX_POOL
            )));
        }
        self.check(spec)?;
        if matches!(spec.network, Some(Network::None)) {
            return Err(Error::unsupported(
                "spec.network none: a warm pool's pods are made before their box, and their deny-all policy is per box",
            ));
        }
        let mut template = pod::manifest(&self.opts, "template", "template", None, spec, 0, false)?;
        // What a claim gives each box: its key, the host's labels, its deadline and runner.
        if let Some(l) = template.metadata.labels.as_mut() {
            l.retain(|k, _| k == pod::LABEL_PROVIDER);
        }
        if let Some(a) = template.metadata.annotations.as_mut() {
            a.remove(pod::ANNOTATION_ENDS_AT);
            a.remove(pod::ANNOTATION_RUNNER);
            // Only a warm pod's first process waits for a deadline not yet given.
            a.insert(pod::ANNOTATION_WARM.into(), "true".into());
        }
        let text = serde_json::to_string(&template.spec).unwrap_or_default();
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in text.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        let name = format!("agentbox-p-{:012x}", h & 0xffff_ffff_ffff);
        asb.ensure_pool(&name, &template, size, ctx).await?;
        tracing::info!(pool = %name, size, "kube: a SandboxWarmPool serves this spec");
        Ok(ClaimPool {
            inner: self.clone(),
            spec: spec.clone(),
            name,
        })
    }
}

impl ClaimPool {
    /// The SandboxWarmPool's (and its SandboxTemplate's) name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Delete the warm pool and its template: its ready pods go with it; claimed boxes stay
    /// until their own end.
    /// While any claim of agentbox's names the pool, the pool is only emptied (0 ready): the
    /// claim controller reaches its boxes' template through it, and their extend and relabel
    /// would stop working without it.
    pub async fn close(&self, ctx: &Ctx) -> Result<()> {
        let Some(asb) = &self.inner.asb else { return Ok(()) };
        if asb.claimed_from(&self.name, ctx).await? {
            tracing::info!(pool = %self.name, "kube: claims remain; the SandboxWarmPool is emptied, not deleted");
            return asb.scale_pool(&self.name, 0, ctx).await;
        }
        asb.remove_pool(&self.name, ctx).await
    }

    async fn claim(&self, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let asb = self
            .inner
            .asb
            .as_ref()
            .ok_or_else(|| Error::unknown("a claim pool without agent-sandbox"))?;
        self.inner.check(spec)?;
        let key = random_hex(8)?;
        let claim = format!("agentbox-c-{key}");
        let ends_at = now_ms().saturating_add(u64::try_from(spec.max_lifetime.as_millis()).unwrap_or(u64::MAX));
        check_claim_labels(&spec.labels)?;
        let mut labels: std::collections::BTreeMap<String, String> = spec
            .labels
            .iter()
            .map(|(k, v)| (format!("{}{k}", pod::CLAIMED), v.clone()))
            .collect();
        labels.insert(format!("{}{}", pod::CLAIMED, pod::LABEL_BOX), key.clone());
        let runner = self.inner.opts.runner.is_some();
        let annotations = [
            (pod::ANNOTATION_ENDS_AT.to_string(), ends_at.to_string()),
            (pod::ANNOTATION_RUNNER.to_string(), runner.to_string()),
        ]
        .into();
        let wait = self.inner.opts.start_timeout;
        let c = super::agent_sandbox::Claim {
            name: &claim,
            pool: &self.name,
            labels: &labels,
            annotations: &annotations,
            ends_at_ms: ends_at,
        };
        let sandbox = asb.claim(&c, wait, ctx).await?;
        tracing::info!(claim = %claim, sandbox = %sandbox, "kube: a warm pod claimed");
        let made = async {
            // The claim's metadata reaches the pod through the controller, then its deadline
            // file through the kubelet: the box is the caller's once both did.
            let until = tokio::time::Instant::now() + wait;
            let p = loop {
                let p = self.inner.wait_running(&sandbox, ctx).await?;
                if pod::box_key(&p) == Some(key.as_str()) {
                    break p;
                }
                if tokio::time::Instant::now() >= until {
                    return Err(Error::timeout(format!(
                        "claim {claim}: pod {sandbox} did not take the claim's labels within {} s",
                        wait.as_secs()
                    )));
                }
                ctx.run(tokio::time::sleep(Duration::from_millis(100))).await?;
            };
            // A pod warm for long has less of its backstop left than the box needs.
            let ads = p.spec.as_ref().and_then(|s| s.active_deadline_seconds).unwrap_or(0);
            let backstop = pod::started_at_ms(&p)
                .unwrap_or_else(now_ms)
                .saturating_add(u64::try_from(ads).unwrap_or(0).saturating_mul(1000));
            if backstop < ends_at {
                return Err(Error::unsupported(format!(
                    "claim {claim}: pod {sandbox} was warm so long that its activeDeadlineSeconds ends at {backstop} ms, \
                     before the box's {ends_at}"
                )));
            }
            let b = self.inner.ready(p, false, runner, ctx).await?;
            self.inner.await_deadline_file(&b, ends_at, ends_at, ctx).await?;
            Ok(b)
        };
        match made.await {
            Ok(b) => Ok(b),
            Err(e) => {
                let cleanup = Ctx::background().with_timeout(Duration::from_secs(30));
                let _ = asb.drop_claim(&claim, &cleanup).await;
                let _ = asb.end(&sandbox, &cleanup).await;
                Err(e)
            }
        }
    }
}

#[async_trait]
impl Provider for ClaimPool {
    fn name(&self) -> &str {
        super::NAME
    }

    fn honours(&self) -> Honours {
        self.inner.honours()
    }

    async fn create(&self, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        if shape(spec) == shape(&self.spec) {
            self.claim(spec, ctx).await
        } else {
            self.inner.create(spec, ctx).await
        }
    }

    async fn attach(&self, id: &SandboxId, ctx: &Ctx) -> Result<Option<Arc<dyn Sandbox>>> {
        self.inner.attach(id, ctx).await
    }

    async fn list(&self, labels: &Labels, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        self.inner.list(labels, ctx).await
    }

    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        Some(self)
    }
}

#[async_trait]
impl Lifecycle for ClaimPool {
    async fn open(&self, name: &str, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        self.inner.open(name, spec, ctx).await
    }

    async fn discard(&self, name: &str, labels: &Labels, ctx: &Ctx) -> Result<bool> {
        self.inner.discard(name, labels, ctx).await
    }

    async fn extend(&self, id: &SandboxId, ends_at_ms: u64, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        self.inner.extend(id, ends_at_ms, ctx).await
    }

    async fn relabel(&self, id: &SandboxId, labels: &Labels, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        self.inner.relabel(id, labels, ctx).await
    }
}

//! The lifecycle Kubernetes boxes have beyond create and destroy: open, discard, extend, relabel
//! (the contract's [`Lifecycle`]; every other operation is refused).

use std::sync::Arc;

use agentbox_core::{
    Ctx, Error, Labels, Lifecycle, Provider, Result, Sandbox, SandboxId, Spec, check_deadline, now_ms, validate_name,
};
use async_trait::async_trait;
use kube::api::{Patch, PatchParams};

use super::api::retry;
use super::pod::owned_by_sandbox;
use super::{KubeProvider, Made, Runner, pod, pool};

#[async_trait]
impl Lifecycle for KubeProvider {
    async fn open(&self, name: &str, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        validate_name("name", name)?;
        self.check(spec)?;
        let key = crate::lifecycle::name_key(name, &spec.labels)?;
        let pod_name = format!("agentbox-n-{key}");
        for _ in 0..3 {
            if let Some(p) = retry(ctx, "reading the pod", || self.pods.get_opt(&pod_name)).await? {
                if pod::phase(&p) == pod::Phase::Ended {
                    self.end(&pod_name, Some(&p), ctx).await?;
                    continue;
                }
                let p = self.wait_running(&pod_name, ctx).await?;
                if let Some(b) = self.sandbox_of(&p, Runner::Checked, ctx).await? {
                    return Ok(b);
                }
                continue;
            }
            match self.make(&pod_name, &key, Some(name), spec, ctx).await {
                Ok(b) => return Ok(b),
                // Another host made it first: that one is the box, once its pod runs (a
                // Sandbox's controller makes the pod after the Sandbox).
                Err(Made::Exists) => {
                    let p = self.wait_running(&pod_name, ctx).await?;
                    if let Some(b) = self.sandbox_of(&p, Runner::Checked, ctx).await? {
                        return Ok(b);
                    }
                    continue;
                }
                Err(Made::Failed(e)) => return Err(e),
            }
        }
        Err(Error::unknown(format!(
            "open {name:?}: pod {pod_name} kept ending or changing while it was opened"
        )))
    }

    async fn discard(&self, name: &str, labels: &Labels, ctx: &Ctx) -> Result<bool> {
        let key = crate::lifecycle::name_key(name, labels)?;
        let pod_name = format!("agentbox-n-{key}");
        let found = retry(ctx, "reading the pod", || self.pods.get_opt(&pod_name)).await?;
        let existed = found.as_ref().is_some_and(|p| pod::phase(p) != pod::Phase::Ended);
        self.end(&pod_name, found.as_ref(), ctx).await?;
        Ok(existed)
    }

    async fn extend(&self, id: &SandboxId, ends_at_ms: u64, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        check_deadline(ends_at_ms, now_ms())?;
        let Some(p) = self.get(id, ctx).await?.filter(|p| pod::phase(p) != pod::Phase::Ended) else {
            return Err(Error::gone(format!("box {id}: it has ended")));
        };
        let name = p.metadata.name.clone().unwrap_or_default();
        let start = pod::started_at_ms(&p).unwrap_or_else(now_ms);
        let ads = p.spec.as_ref().and_then(|s| s.active_deadline_seconds).unwrap_or(0);
        let backstop = start.saturating_add(u64::try_from(ads).unwrap_or(0).saturating_mul(1000));
        if ends_at_ms > backstop {
            return Err(Error::invalid(format!(
                "extend {id}: past the pod's backstop (activeDeadlineSeconds {ads} s from its start, which the \
                 API lets only fall): at most {backstop} ms since the epoch"
            )));
        }
        let current: u64 = pod::annotation(&p, pod::ANNOTATION_ENDS_AT)
            .and_then(|v| v.parse().ok())
            .unwrap_or(backstop);
        let mut patch =
            serde_json::json!({"metadata": {"annotations": {pod::ANNOTATION_ENDS_AT: ends_at_ms.to_string()}}});
        if ends_at_ms < current {
            // An earlier end is the cluster's to keep at once, not only when the kubelet next
            // refreshes the downward-API file.
            let secs = ends_at_ms.saturating_sub(start).div_ceil(1000).max(1);
            patch["spec"] = serde_json::json!({"activeDeadlineSeconds": secs});
        }
        if let Some(asb) = self.asb.as_ref().filter(|_| owned_by_sandbox(&p)) {
            // The controller's own end first, so it never deletes the pod at the old one.
            asb.set_end(&name, ends_at_ms, ctx).await?;
        }
        let (pp, patch) = (PatchParams::default(), Patch::Merge(&patch));
        retry(ctx, "extending the pod", || self.pods.patch(&name, &pp, &patch)).await?;
        tracing::info!(box_id = %id, ends_at_ms, "extended");
        let b = self
            .attach(id, ctx)
            .await?
            .ok_or_else(|| Error::gone(format!("box {id}: it ended as it was extended")))?;
        if ends_at_ms > current {
            self.await_deadline_file(&b, ends_at_ms, current, ctx).await?;
        }
        Ok(b)
    }

    async fn relabel(&self, id: &SandboxId, labels: &Labels, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        agentbox_core::validate_labels(labels)?;
        pod::check_labels(labels)?;
        let Some(p) = self.get(id, ctx).await?.filter(|p| pod::phase(p) != pod::Phase::Ended) else {
            return Err(Error::gone(format!("box {id}: it has ended")));
        };
        let name = p.metadata.name.clone().unwrap_or_default();
        let mut set = serde_json::Map::new();
        for k in pod::host_labels(&p).keys() {
            set.insert(k.clone(), serde_json::Value::Null);
        }
        for (k, v) in labels {
            set.insert(k.clone(), serde_json::Value::String(v.clone()));
        }
        if let Some(asb) = self.asb.as_ref().filter(|_| owned_by_sandbox(&p)) {
            if pod::is_claimed(&p) {
                pool::check_claim_labels(labels)?;
                // A claimed pod's labels are its claim's, in the claim's domain.
                let claimed: serde_json::Map<String, serde_json::Value> = set
                    .iter()
                    .map(|(k, v)| (format!("{}{k}", pod::CLAIMED), v.clone()))
                    .collect();
                asb.relabel_claim(&name, serde_json::Value::Object(claimed), ctx)
                    .await?;
                return self.await_labels(id, labels, ctx).await;
            }
            // The controller keeps the pod's labels in step with its Sandbox's template.
            asb.set_pod_metadata(
                &name,
                serde_json::Value::Object(set.clone()),
                serde_json::json!({}),
                ctx,
            )
            .await?;
        }
        let patch = serde_json::json!({"metadata": {"labels": set}});
        let (pp, patch) = (PatchParams::default(), Patch::Merge(&patch));
        retry(ctx, "relabelling the pod", || self.pods.patch(&name, &pp, &patch)).await?;
        self.attach(id, ctx)
            .await?
            .ok_or_else(|| Error::gone(format!("box {id}: it ended as it was relabelled")))
    }
}

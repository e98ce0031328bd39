//! The agent-sandbox mode: boxes made through kubernetes-sigs/agent-sandbox's resources
//! (`agents.x-k8s.io/v1beta1` Sandbox; `extensions.agents.x-k8s.io/v1beta1` SandboxTemplate,
//! SandboxWarmPool and SandboxClaim) rather than as bare pods, where the cluster runs its
//! controller.
//!
//! What the controller does, and so what this module counts on:
//! - a Sandbox makes one pod of the same name from `spec.podTemplate`, copying the template's
//!   labels and annotations (all but its own `agents.x-k8s.io/` ones) and owning it, so the
//!   pod is found, exec'd into and listed exactly as a bare box's;
//! - a Sandbox deletes its pod at `spec.shutdownTime` (the deadline, a second enforcement
//!   beside the pod's own first process and `activeDeadlineSeconds`) and, with
//!   `shutdownPolicy: Delete`, itself;
//! - a pod deleted under a live Sandbox is made again: so a box is ended by deleting its
//!   Sandbox (or the claim that owns it), never its pod alone;
//! - a SandboxWarmPool keeps ready Sandboxes of a SandboxTemplate, and a SandboxClaim naming
//!   the pool adopts one (its name in `status.sandbox.name`), adding the claim's
//!   `additionalPodMetadata` to the pod; the claim's `lifecycle.shutdownTime` ends it.

use std::collections::BTreeMap;
use std::time::Duration;

use agentbox_core::{Ctx, Error, ErrorCode, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client};

use super::api::{api_error, attempt, retry};

/// The core group and the version this module speaks.
pub(super) const GROUP: &str = "agents.x-k8s.io";
/// The extensions' group (templates, warm pools, claims).
pub(super) const EXTENSIONS: &str = "extensions.agents.x-k8s.io";
/// The version of both.
pub(super) const VERSION: &str = "v1beta1";

/// The agent-sandbox resources of one namespace.
pub(super) struct AgentSandbox {
    pub(super) sandboxes: Api<DynamicObject>,
    pub(super) templates: Api<DynamicObject>,
    pub(super) pools: Api<DynamicObject>,
    pub(super) claims: Api<DynamicObject>,
}

fn resource(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, VERSION, kind), plural)
}

impl AgentSandbox {
    /// The resources, once discovery shows both groups served at [`VERSION`]: `unsupported`
    /// naming what is missing where the cluster has no agent-sandbox.
    pub(super) async fn discover(client: &Client, namespace: &str, ctx: &Ctx) -> Result<AgentSandbox> {
        for (group, want) in [
            (GROUP, &["sandboxes"][..]),
            (
                EXTENSIONS,
                &["sandboxtemplates", "sandboxwarmpools", "sandboxclaims"][..],
            ),
        ] {
            let gv = format!("{group}/{VERSION}");
            let listed = match attempt(ctx, || client.list_api_group_resources(&gv)).await? {
                Ok(l) => l,
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    return Err(Error::unsupported(format!(
                        "kube agent_sandbox: the cluster serves no {gv} (kubernetes-sigs/agent-sandbox is not installed)"
                    )));
                }
                Err(e) => return Err(api_error(e, &format!("discovering {gv}"))),
            };
            for r in want {
                if !listed.resources.iter().any(|x| x.name == *r) {
                    return Err(Error::unsupported(format!(
                        "kube agent_sandbox: {gv} serves no {r} (an agent-sandbox without its extensions?)"
                    )));
                }
            }
        }
        tracing::info!(namespace, "kube: boxes through agent-sandbox ({GROUP}/{VERSION})");
        Ok(AgentSandbox {
            sandboxes: Api::namespaced_with(client.clone(), namespace, &resource(GROUP, "Sandbox", "sandboxes")),
            templates: Api::namespaced_with(
                client.clone(),
                namespace,
                &resource(EXTENSIONS, "SandboxTemplate", "sandboxtemplates"),
            ),
            pools: Api::namespaced_with(
                client.clone(),
                namespace,
                &resource(EXTENSIONS, "SandboxWarmPool", "sandboxwarmpools"),
            ),
            claims: Api::namespaced_with(
                client.clone(),
                namespace,
                &resource(EXTENSIONS, "SandboxClaim", "sandboxclaims"),
            ),
        })
    }

    /// The Sandbox for `pod` (its metadata the pod template's, its name the pod's), ending at
    /// `ends_at_ms`.
    pub(super) fn sandbox_of(pod: &Pod, ends_at_ms: u64) -> Result<DynamicObject> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let value = serde_json::json!({
            "apiVersion": format!("{GROUP}/{VERSION}"),
            "kind": "Sandbox",
            "metadata": {"name": name, "labels": pod.metadata.labels},
            "spec": {
                "podTemplate": {
                    "metadata": {"labels": pod.metadata.labels, "annotations": pod.metadata.annotations},
                    "spec": pod.spec,
                },
                "shutdownTime": rfc3339(ends_at_ms)?,
                "shutdownPolicy": "Delete",
            }
        });
        serde_json::from_value(value).map_err(|e| Error::unknown(format!("the Sandbox of pod {name}: {e}")))
    }

    /// End the box whose pod is `pod`: the claim that owns its Sandbox where there is one
    /// (the Sandbox and pod follow it), else the Sandbox. Absent already is done.
    pub(super) async fn end(&self, pod: &str, ctx: &Ctx) -> Result<()> {
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        if let Some(claim) = self.claim_of(pod, ctx).await? {
            gone_ok(retry(ctx, "deleting the SandboxClaim", || self.claims.delete(&claim, &dp)).await)?;
        }
        gone_ok(retry(ctx, "deleting the Sandbox", || self.sandboxes.delete(pod, &dp)).await)
    }

    /// The SandboxClaim that owns the Sandbox `name`, where one does.
    async fn claim_of(&self, name: &str, ctx: &Ctx) -> Result<Option<String>> {
        let Some(sb) = retry(ctx, "reading the Sandbox", || self.sandboxes.get_opt(name)).await? else {
            return Ok(None);
        };
        Ok(sb
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.kind == "SandboxClaim")
            .map(|o| o.name.clone()))
    }

    /// Move the box's end to `ends_at_ms` where the controller keeps one: the claim's
    /// `lifecycle.shutdownTime`, else the Sandbox's `shutdownTime`; and the deadline annotation
    /// in the Sandbox's pod template, which the controller copies to the pod.
    pub(super) async fn set_end(&self, pod: &str, ends_at_ms: u64, ctx: &Ctx) -> Result<()> {
        let at = rfc3339(ends_at_ms)?;
        let pp = PatchParams::default();
        if let Some(claim) = self.claim_of(pod, ctx).await? {
            // The claim controller keeps the Sandbox's template to the claim's: the deadline
            // annotation is the claim's too.
            let patch = serde_json::json!({"spec": {
                "lifecycle": {"shutdownTime": at, "shutdownPolicy": "Delete"},
                "additionalPodMetadata": {"annotations": {super::pod::ANNOTATION_ENDS_AT: ends_at_ms.to_string()}},
            }});
            let patch = Patch::Merge(&patch);
            retry(ctx, "extending the SandboxClaim", || {
                self.claims.patch(&claim, &pp, &patch)
            })
            .await?;
            return Ok(());
        }
        let patch = serde_json::json!({"spec": {
            "shutdownTime": at,
            "podTemplate": {"metadata": {"annotations": {super::pod::ANNOTATION_ENDS_AT: ends_at_ms.to_string()}}},
        }});
        // (A claimed Sandbox's own shutdownTime is unset: the claim's is its end; setting it
        // here too is harmless and keeps one rule for both.)
        let patch = Patch::Merge(&patch);
        match retry(ctx, "extending the Sandbox", || self.sandboxes.patch(pod, &pp, &patch)).await {
            Ok(_) => Ok(()),
            Err(e) if e.code() == ErrorCode::NotFound => Err(Error::gone(format!("pod {pod}: its Sandbox is gone"))),
            Err(e) => Err(e),
        }
    }

    /// Merge `labels` and `annotations` (a null value removes a key) into the pod template of
    /// the Sandbox `name`: the controller keeps its pod's metadata in step with that template,
    /// so a change made to the pod alone would be undone.
    pub(super) async fn set_pod_metadata(
        &self,
        name: &str,
        labels: serde_json::Value,
        annotations: serde_json::Value,
        ctx: &Ctx,
    ) -> Result<()> {
        let patch =
            serde_json::json!({"spec": {"podTemplate": {"metadata": {"labels": labels, "annotations": annotations}}}});
        let (pp, patch) = (PatchParams::default(), Patch::Merge(&patch));
        match retry(ctx, "changing the Sandbox's pod template", || {
            self.sandboxes.patch(name, &pp, &patch)
        })
        .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code() == ErrorCode::NotFound => Err(Error::gone(format!("pod {name}: its Sandbox is gone"))),
            Err(e) => Err(e),
        }
    }

    /// Merge `labels` (a null removes one) into the additionalPodMetadata of the claim that
    /// owns the Sandbox `name`.
    pub(super) async fn relabel_claim(&self, name: &str, labels: serde_json::Value, ctx: &Ctx) -> Result<()> {
        let claim = self
            .claim_of(name, ctx)
            .await?
            .ok_or_else(|| Error::gone(format!("pod {name}: no SandboxClaim owns it now")))?;
        let patch = serde_json::json!({"spec": {"additionalPodMetadata": {"labels": labels}}});
        let (pp, patch) = (PatchParams::default(), Patch::Merge(&patch));
        retry(ctx, "relabelling the SandboxClaim", || {
            self.claims.patch(&claim, &pp, &patch)
        })
        .await?;
        Ok(())
    }

    /// Make the template and warm pool `name` of `template` (a pod's labels, annotations and
    /// spec) with `replicas` ready; both already there is done.
    pub(super) async fn ensure_pool(&self, name: &str, template: &Pod, replicas: usize, ctx: &Ctx) -> Result<()> {
        let t: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": format!("{EXTENSIONS}/{VERSION}"),
            "kind": "SandboxTemplate",
            "metadata": {"name": name, "labels": {super::pod::LABEL_PROVIDER: super::NAME}},
            "spec": {
                "podTemplate": {
                    "metadata": {"labels": template.metadata.labels, "annotations": template.metadata.annotations},
                    "spec": template.spec,
                },
                // agentbox makes its own policies (network none), and a managed one would
                // also rewrite the pods' DNS.
                "networkPolicyManagement": "Unmanaged",
            }
        }))
        .map_err(|e| Error::unknown(format!("the SandboxTemplate {name}: {e}")))?;
        let pool: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": format!("{EXTENSIONS}/{VERSION}"),
            "kind": "SandboxWarmPool",
            "metadata": {"name": name, "labels": {super::pod::LABEL_PROVIDER: super::NAME}},
            "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": name}},
        }))
        .map_err(|e| Error::unknown(format!("the SandboxWarmPool {name}: {e}")))?;
        let pp = PostParams::default();
        let made_template = match attempt(ctx, || self.templates.create(&pp, &t)).await? {
            Ok(_) => true,
            // The same spec's, made by this or another host: the name is its pod spec's hash.
            Err(kube::Error::Api(s)) if s.code == 409 => false,
            Err(e) => return Err(api_error(e, &format!("creating the SandboxTemplate {name}"))),
        };
        match attempt(ctx, || self.pools.create(&pp, &pool)).await? {
            Ok(_) => Ok(()),
            // Another host's pool of the same spec: it now keeps this many ready.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tracing::info!(
                    pool = name,
                    replicas,
                    "kube: the SandboxWarmPool exists; setting its size"
                );
                self.scale_pool(name, replicas, ctx).await
            }
            Err(e) => {
                if made_template {
                    let dp = DeleteParams::default();
                    let _ = self.templates.delete(name, &dp).await;
                }
                Err(api_error(e, &format!("creating the SandboxWarmPool {name}")))
            }
        }
    }

    /// Delete the warm pool and template `name` (their Sandboxes follow the pool).
    pub(super) async fn remove_pool(&self, name: &str, ctx: &Ctx) -> Result<()> {
        let dp = DeleteParams::default();
        gone_ok(retry(ctx, "deleting the SandboxWarmPool", || self.pools.delete(name, &dp)).await)?;
        gone_ok(retry(ctx, "deleting the SandboxTemplate", || self.templates.delete(name, &dp)).await)
    }

    /// Claim a box of the warm pool: the adopted Sandbox's (and so pod's) name, once the
    /// claim says it, within `wait`. Its labels must be in the controller's allowed domain
    /// (`sandbox.users.io/` by default: the caller puts them there); the claim controller
    /// keeps the Sandbox's pod template to the claim's, so the claim is where they live.
    pub(super) async fn claim(&self, c: &Claim<'_>, wait: Duration, ctx: &Ctx) -> Result<String> {
        let Claim {
            name: claim,
            pool,
            labels,
            annotations,
            ends_at_ms,
        } = *c;
        let obj: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": format!("{EXTENSIONS}/{VERSION}"),
            "kind": "SandboxClaim",
            "metadata": {"name": claim, "labels": {super::pod::LABEL_PROVIDER: super::NAME}},
            "spec": {
                "warmPoolRef": {"name": pool},
                "additionalPodMetadata": {"labels": labels, "annotations": annotations},
                "lifecycle": {"shutdownTime": rfc3339(ends_at_ms)?, "shutdownPolicy": "Delete"},
            }
        }))
        .map_err(|e| Error::unknown(format!("the SandboxClaim {claim}: {e}")))?;
        let pp = PostParams::default();
        retry(ctx, "creating the SandboxClaim", || self.claims.create(&pp, &obj)).await?;
        match self.adopted(claim, wait, ctx).await {
            Ok(name) => Ok(name),
            Err(e) => {
                // Whatever went wrong (the caller gone too), the claim must not go on to adopt
                // a pod nobody holds.
                let cleanup = Ctx::background().with_timeout(Duration::from_secs(30));
                let _ = self.drop_claim(claim, &cleanup).await;
                Err(e)
            }
        }
    }

    /// The Sandbox the claim adopted, once its status names it, within `wait`.
    async fn adopted(&self, claim: &str, wait: Duration, ctx: &Ctx) -> Result<String> {
        let until = tokio::time::Instant::now() + wait;
        let mut pause = Duration::from_millis(10);
        loop {
            let got = retry(ctx, "reading the SandboxClaim", || self.claims.get_opt(claim))
                .await?
                .ok_or_else(|| Error::gone(format!("SandboxClaim {claim}: deleted while it was claimed")))?;
            if let Some(name) = got.data["status"]["sandbox"]["name"].as_str().filter(|n| !n.is_empty()) {
                return Ok(name.to_string());
            }
            if let Some(c) = ready_false(&got, &["InvalidMetadata"]) {
                // The cluster's allow-list, not the caller's input, refused it.
                return Err(Error::unsupported(format!(
                    "SandboxClaim {claim}: the controller refused its metadata: {c}"
                )));
            }
            if tokio::time::Instant::now() >= until {
                return Err(Error::timeout(format!(
                    "SandboxClaim {claim}: the controller named no Sandbox within {} s",
                    wait.as_secs()
                )));
            }
            ctx.run(tokio::time::sleep(pause)).await?;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// Delete the claim `claim` (its Sandbox and pod follow); absent already is done.
    pub(super) async fn drop_claim(&self, claim: &str, ctx: &Ctx) -> Result<()> {
        let dp = DeleteParams::default();
        gone_ok(retry(ctx, "deleting the SandboxClaim", || self.claims.delete(claim, &dp)).await)
    }

    /// Whether any SandboxClaim of agentbox's names the warm pool `pool`.
    pub(super) async fn claimed_from(&self, pool: &str, ctx: &Ctx) -> Result<bool> {
        let lp = kube::api::ListParams::default().labels(&format!("{}={}", super::pod::LABEL_PROVIDER, super::NAME));
        let claims = retry(ctx, "listing SandboxClaims", || self.claims.list(&lp)).await?;
        Ok(claims
            .items
            .iter()
            .any(|c| c.data["spec"]["warmPoolRef"]["name"] == pool))
    }

    /// Set the warm pool's ready count.
    pub(super) async fn scale_pool(&self, pool: &str, replicas: usize, ctx: &Ctx) -> Result<()> {
        let patch = serde_json::json!({"spec": {"replicas": replicas}});
        let (pp, patch) = (PatchParams::default(), Patch::Merge(&patch));
        retry(ctx, "scaling the SandboxWarmPool", || {
            self.pools.patch(pool, &pp, &patch)
        })
        .await?;
        Ok(())
    }
}

/// The message of an object's `Ready` condition when it is False for one of `reasons`.
fn ready_false(o: &DynamicObject, reasons: &[&str]) -> Option<String> {
    o.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready" && c["status"] == "False" && reasons.iter().any(|r| c["reason"] == *r))
        .map(|c| {
            format!(
                "{} ({})",
                c["message"].as_str().unwrap_or(""),
                c["reason"].as_str().unwrap_or("")
            )
        })
}

/// Why the controller cannot make a Sandbox's pod (its Ready condition False with a
/// reconciler error: admission or a quota refused the pod), where it says so.
pub(super) fn refused(sb: &DynamicObject) -> Option<String> {
    ready_false(sb, &["ReconcilerError"])
}

/// A claim of one box from a warm pool.
#[derive(Clone, Copy)]
pub(super) struct Claim<'a> {
    /// The SandboxClaim's name.
    pub(super) name: &'a str,
    /// The SandboxWarmPool's.
    pub(super) pool: &'a str,
    /// Labels and annotations the claimed pod gets.
    pub(super) labels: &'a BTreeMap<String, String>,
    pub(super) annotations: &'a BTreeMap<String, String>,
    /// When the controller ends the claim.
    pub(super) ends_at_ms: u64,
}

fn gone_ok<T>(r: Result<T>) -> Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if e.code() == ErrorCode::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Milliseconds since the epoch as the API's `date-time`, in whole seconds rounded up (never
/// before the deadline).
fn rfc3339(ms: u64) -> Result<String> {
    let secs = i64::try_from(ms.div_ceil(1000)).unwrap_or(i64::MAX);
    let ts = k8s_openapi::jiff::Timestamp::from_second(secs)
        .map_err(|e| Error::invalid(format!("a deadline of {ms} ms: {e}")))?;
    Ok(ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

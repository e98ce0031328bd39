//! kubernetes-sigs/agent-sandbox in the fake (`FakeKubeOptions::agent_sandbox`, off by
//! default: a cluster without the controller, where `/apis` lists neither group and every
//! path under them is the bare 404): its four custom resources, served as kube-apiserver
//! serves their CRDs, and its controllers (Sandbox, SandboxTemplate, SandboxWarmPool,
//! SandboxClaim) acting as the project's do, reading the same labels and writing the same
//! names, so a client written against a real cluster with agent-sandbox sees the same
//! objects here. What each controller does is taken from the upstream source (its
//! `controllers/` and `extensions/controllers/`); the rules below name what the fake does
//! differently.
//!
//! Served (`agents.x-k8s.io/v1beta1` sandboxes; `extensions.agents.x-k8s.io/v1beta1`
//! sandboxtemplates, sandboxclaims, sandboxwarmpools; all namespaced): discovery (`/apis`,
//! `/apis/GROUP`, `/apis/GROUP/v1beta1`, and an OpenAPI v3 document per group version like
//! the core ones), create, get, list and watch (label and field selectors, across
//! namespaces), merge and JSON patch, delete and deletecollection, and the `status`
//! subresource (get, merge and JSON patch) of all but SandboxTemplate. As with a CRD's
//! status subresource, the main resource ignores `status` on create and patch, and a change
//! of `spec` raises `metadata.generation`. The CRDs' defaults are filled (Sandbox
//! `operatingMode: Running`, `shutdownPolicy: Retain`; pool `replicas: 1`; claim lifecycle
//! `shutdownPolicy: Retain`; template `networkPolicyManagement: Managed`,
//! `envVarsInjectionPolicy` and `volumeClaimTemplatesPolicy: Disallowed`) and their required
//! fields, enums, minimums and date-times checked (422 `Invalid` naming each field).
//!
//! The controllers, one pass over every object after each change and every 200 ms:
//! - a Sandbox makes a pod of its own name from `spec.podTemplate` (its labels and
//!   annotations copied but for the `agents.x-k8s.io/` and `extensions.agents.x-k8s.io/`
//!   keys, `agents.x-k8s.io/sandbox-name-hash` = FNV-1a of the name, the propagated-keys
//!   annotations, one controller ownerReference to the Sandbox) through the same admission as
//!   a client's pod; notes it in the Sandbox's `agents.x-k8s.io/pod-name`; keeps its labels
//!   and annotations in step with the template; makes it again when it is deleted; writes
//!   `status` (`selector`, `podIPs`, `nodeName`, conditions `Ready`, `PodScheduled`,
//!   `Finished`, `Suspended`); at `spec.shutdownTime` marks Ready False `SandboxExpired`,
//!   deletes the pod and then the Sandbox (`shutdownPolicy: Delete`) or keeps it with only its
//!   conditions (`Retain`); `operatingMode: Suspended` deletes the pod and keeps the Sandbox;
//! - a SandboxTemplate gets its `agents.x-k8s.io/sandbox-template-ref-hash` label and, while
//!   `networkPolicyManagement` is Managed, the NetworkPolicy `<template>-network-policy`
//!   (the upstream default: ingress from the sandbox router, egress to all but private
//!   ranges, which the fake leaves open; or the template's own rules, so `networkPolicy:
//!   {}` is a deny-all egress the fake enforces);
//! - a SandboxWarmPool keeps `spec.replicas` Sandboxes `<pool>-xxxxx` of its template
//!   (labels, annotations and secure defaults as upstream: `automountServiceAccountToken:
//!   false`, and `dnsPolicy: None` with public resolvers under a Managed template with no
//!   rules), deletes the surplus (not-Ready first), and writes `replicas`,
//!   `readyReplicas`, `selector`;
//! - a SandboxClaim takes its Sandbox from `spec.warmPoolRef`'s pool (a Ready member with a
//!   pod IP first, a not-yet-Ready one with an IP next; members still without one are waited
//!   for two seconds from the claim's creation), keeping the member's name and handing its
//!   ownerReference to the claim, its pod then relabelled by the Sandbox controller; or, with
//!   none, with `spec.env` or with `spec.volumeClaimTemplates`, makes a Sandbox named like the
//!   claim from the pool's template. `additionalPodMetadata` is validated as upstream (label
//!   keys need a domain in the allow-list, here the upstream default `sandbox.users.io`;
//!   restricted annotation domains refused; no override of a template key) and merged into the
//!   Sandbox's pod template. `status.sandbox` names the Sandbox and mirrors its pod IPs;
//!   `Ready` is the Sandbox's. At `spec.lifecycle.shutdownTime` the claim is Ready False
//!   `ClaimExpired` and, by its policy, deleted (`Delete`, `DeleteForeground`) or kept with its
//!   Sandbox deleted (`Retain`);
//! - the garbage collector: a Sandbox, pod or NetworkPolicy whose every ownerReference names
//!   one of these kinds and none of which still exists is deleted (background propagation),
//!   so deleting a Sandbox ends its pod, a claim its Sandbox and pod, a pool its members.
//!
//! Simpler than the real thing:
//! - only v1beta1 (the storage version) is served: the deprecated v1alpha1 (Sandbox
//!   `replicas`, claim `sandboxTemplateRef` + `warmpool`) and its conversion webhook are not;
//!   no scale subresource, no PUT, no server-side apply, no Table (as for pods);
//! - strategic merge patch is refused 415, as the real server refuses it for custom resources;
//! - the CRDs' OpenAPI schemas are not checked beyond the fields above (unknown fields are
//!   kept); the pod template's spec is checked when its pod is made (a refusal is the
//!   Sandbox's Ready False `ReconcilerError` with the API's message);
//! - no Services (`spec.service` is kept, nothing made: `status.service` stays empty), no PVCs
//!   made from `volumeClaimTemplates` (kept, their volumes added to the pod, which then stays
//!   Pending, unschedulable, until claims of those names are made by someone else), no
//!   events, no metrics, no tracing annotations;
//! - a warm pool makes at most [`POOL_BATCH`] Sandboxes a pass, never replaces members whose
//!   template changed (`updateStrategy` is kept, not acted on) nor members not Ready after
//!   five minutes, and adopts no orphans; `DeleteForeground` deletes the claim at once
//!   (the Sandbox and pod follow by the collector); `ttlSecondsAfterFinished` is kept, not
//!   acted on; the template-hash labels are FNV-1a of the JSON, not upstream's hashes;
//! - DNS settings are kept in the pod, not acted on: a box resolves as the rootfs says.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::kube::api::{self, Shared};
use crate::kube::patch;
use crate::kube::status::{ApiError, Cause};
use crate::kube::store::{Kind, now_rfc3339};
use crate::kube::validate;

/// The one version served of both groups (the storage version upstream).
pub(crate) const VERSION: &str = "v1beta1";

/// agent-sandbox's API groups.
pub(crate) const GROUPS: [&str; 2] = ["agents.x-k8s.io", "extensions.agents.x-k8s.io"];

/// How often the controllers look again with no change to wake them (shutdown times, the
/// wait for warm candidates).
const TICK: Duration = Duration::from_millis(200);

/// The most Sandboxes a warm pool makes in one pass (upstream batches its creates too): a
/// pool asking thousands makes them a few at a time instead of all at once.
pub(crate) const POOL_BATCH: usize = 8;

/// How long a claim waits for pool members still without a pod IP before it makes a Sandbox
/// of its own (upstream's warmCandidateGracePeriod).
const WARM_CANDIDATE_GRACE: Duration = Duration::from_secs(2);

const NAME_HASH: &str = "agents.x-k8s.io/sandbox-name-hash";
const POD_NAME: &str = "agents.x-k8s.io/pod-name";
const TEMPLATE_REF: &str = "agents.x-k8s.io/sandbox-template-ref";
const LAUNCH_TYPE: &str = "agents.x-k8s.io/launch-type";
const CREATED_BY: &str = "agents.x-k8s.io/created-by";
const POD_TEMPLATE_HASH: &str = "agents.x-k8s.io/sandbox-pod-template-hash";
const TEMPLATE_HASH: &str = "agents.x-k8s.io/sandbox-template-hash";
const PROPAGATED_LABELS: &str = "agents.x-k8s.io/propagated-labels";
const PROPAGATED_ANNOTATIONS: &str = "agents.x-k8s.io/propagated-annotations";
const ADOPTABLE: &str = "agents.x-k8s.io/adoptable";
const WARM_POOL: &str = "agents.x-k8s.io/warm-pool-sandbox";
const TEMPLATE_REF_HASH: &str = "agents.x-k8s.io/sandbox-template-ref-hash";
const CLAIM_UID: &str = "agents.x-k8s.io/claim-uid";
const ASSIGNED: &str = "agents.x-k8s.io/sandbox-name";
const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
const EXTENSIONS: &str = "extensions.agents.x-k8s.io";

/// The label domains a claim's additionalPodMetadata may use: upstream's default allow-list.
const ALLOWED_LABEL_DOMAINS: &[&str] = &["sandbox.users.io"];
/// Annotation domains a claim may not set (upstream's restrictedDomains).
const RESTRICTED_DOMAINS: &[&str] = &["kubernetes.io", "k8s.io", "agents.x-k8s.io"];

// ---------------------------------------------------------------------------------------
// Discovery.

/// A group's entry in `/apis` (and, with kind and apiVersion, `/apis/GROUP`).
pub(crate) fn group(g: &str) -> Value {
    let v = json!({"groupVersion": format!("{g}/{VERSION}"), "version": VERSION});
    json!({"name": g, "versions": [v], "preferredVersion": v})
}

/// `/apis/GROUP/v1beta1`: the group's resources and their status subresources.
pub(crate) fn resources(g: &str) -> Value {
    let mut out = Vec::new();
    for k in Kind::SANDBOX_KINDS.into_iter().filter(|k| k.group() == g) {
        let mut r = api::resource(
            k.resource(),
            k.singular(),
            true,
            k.kind(),
            &["create", "delete", "deletecollection", "get", "list", "patch", "watch"],
        );
        r["shortNames"] = json!(k.short_names());
        out.push(r);
        if k.has_status() {
            out.push(api::resource(
                &format!("{}/status", k.resource()),
                "",
                true,
                k.kind(),
                &["get", "patch"],
            ));
        }
    }
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{g}/{VERSION}"), "resources": out})
}

// ---------------------------------------------------------------------------------------
// Admission: the CRDs' defaults and validation.

/// A new object of one of the four kinds, as the API server admits a custom resource:
/// server-set metadata dropped, status dropped (a status subresource), defaults filled,
/// validated, stored with generation 1.
pub(crate) fn admit(s: &Arc<Shared>, kind: Kind, ns: &str, mut obj: Value) -> Result<Value, ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request("the body is not a JSON object"));
    }
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    crate::kube::api::clear_server_fields(&mut obj, &["generation"]);
    if kind.has_status()
        && let Some(o) = obj.as_object_mut()
    {
        o.remove("status");
    }
    defaults(kind, &mut obj);
    let mut causes = Vec::new();
    validate::metadata(&obj["metadata"], &mut causes);
    causes.extend(check(kind, &obj));
    if !causes.is_empty() {
        return Err(ApiError::invalid(
            kind.kind(),
            kind.group(),
            &api::name_for_errors(&obj),
            causes,
        ));
    }
    obj["metadata"]["generation"] = json!(1);
    s.store.create(kind, ns, obj)
}

/// A merge or JSON patch of the main resource (`status` kept as it was, generation raised
/// when spec changes) or of the status subresource (only `status` taken).
pub(crate) fn patch(
    s: &Arc<Shared>,
    kind: Kind,
    ns: &str,
    name: &str,
    ct: &str,
    p: &Value,
    status: bool,
) -> Result<Value, ApiError> {
    s.store.update(kind, ns, name, None, |old| {
        let patched = match ct {
            "application/merge-patch+json" => {
                let mut n = old.clone();
                patch::merge(&mut n, p);
                n
            }
            "application/json-patch+json" => api::json_patch(old, p)?,
            other => {
                // A custom resource has no Go struct to merge strategically by.
                return Err(ApiError {
                    code: 415,
                    reason: "UnsupportedMediaType",
                    message: format!(
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other:?})"
                    ),
                    details: None,
                    retry_after: None,
                });
            }
        };
        if let Some(rv) = p.pointer("/metadata/resourceVersion").and_then(Value::as_str)
            && Some(rv) != old["metadata"]["resourceVersion"].as_str()
        {
            return Err(ApiError {
                code: 409,
                reason: "Conflict",
                details: Some(json!({"name": name, "group": kind.group(), "kind": kind.resource()})),
                ..ApiError::bad_request(format!(
                    "Operation cannot be fulfilled on {}.{} {name:?}: the object has been modified; please apply your changes to the latest version and try again",
                    kind.resource(),
                    kind.group()
                ))
            });
        }
        let mut new = if status {
            let mut n = old.clone();
            set_or_remove(&mut n, "status", patched.get("status").cloned());
            n
        } else {
            let mut n = patched;
            if kind.has_status() {
                set_or_remove(&mut n, "status", old.get("status").cloned());
            }
            if !n["metadata"].is_object() {
                n["metadata"] = json!({});
            }
            for k in ["name", "namespace", "uid", "creationTimestamp", "generation"] {
                set_or_remove(&mut n["metadata"], k, old["metadata"].get(k).cloned());
            }
            defaults(kind, &mut n);
            let mut causes = Vec::new();
            validate::metadata(&n["metadata"], &mut causes);
            causes.extend(check(kind, &n));
            if !causes.is_empty() {
                return Err(ApiError::invalid(kind.kind(), kind.group(), name, causes));
            }
            if n["spec"] != old["spec"] {
                let g = old["metadata"]["generation"].as_i64().unwrap_or(1);
                n["metadata"]["generation"] = json!(g + 1);
            }
            n
        };
        new["kind"] = old["kind"].clone();
        new["apiVersion"] = old["apiVersion"].clone();
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        for k in ["labels", "annotations"] {
            if new["metadata"][k].as_object().is_some_and(Map::is_empty) {
                new["metadata"].as_object_mut().map(|m| m.remove(k));
            }
        }
        Ok(new)
    })
}

fn set_or_remove(obj: &mut Value, key: &str, v: Option<Value>) {
    match v {
        Some(v) => obj[key] = v,
        None => {
            if let Some(o) = obj.as_object_mut() {
                o.remove(key);
            }
        }
    }
}

/// The CRDs' `default:` values, filled where their parent object is given.
fn defaults(kind: Kind, obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    let fill = |o: &mut Value, k: &str, v: Value| {
        if o.get(k).is_none_or(Value::is_null) {
            o[k] = v;
        }
    };
    match kind {
        Kind::Sandbox => {
            fill(spec, "operatingMode", json!("Running"));
            fill(spec, "shutdownPolicy", json!("Retain"));
        }
        Kind::SandboxTemplate => {
            fill(spec, "networkPolicyManagement", json!("Managed"));
            fill(spec, "envVarsInjectionPolicy", json!("Disallowed"));
            fill(spec, "volumeClaimTemplatesPolicy", json!("Disallowed"));
        }
        Kind::SandboxClaim => {
            if let Some(l) = spec.get_mut("lifecycle").filter(|l| l.is_object()) {
                fill(l, "shutdownPolicy", json!("Retain"));
            }
        }
        Kind::SandboxWarmPool => {
            fill(spec, "replicas", json!(1));
            if let Some(u) = spec.get_mut("updateStrategy").filter(|u| u.is_object()) {
                fill(u, "type", json!("OnReplenish"));
            }
        }
        Kind::Pod
        | Kind::PersistentVolumeClaim
        | Kind::Secret
        | Kind::NetworkPolicy
        | Kind::ServiceAccount
        | Kind::Service
        | Kind::Deployment
        | Kind::Role
        | Kind::RoleBinding => {}
    }
}

/// The CRD schema's word for a value of the wrong type.
fn wrong_type(field: &str, v: &Value, ty: &str) -> Cause {
    Cause::invalid(
        field,
        v,
        format!("{field} in body must be of type {ty}: {}", type_name(v)),
    )
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "\"null\"",
        Value::Bool(_) => "\"boolean\"",
        Value::Number(_) => "\"number\"",
        Value::String(_) => "\"string\"",
        Value::Array(_) => "\"array\"",
        Value::Object(_) => "\"object\"",
    }
}

/// An object the schema requires at `field` of `parent`: the cause when it is missing or not
/// an object.
fn required_object(parent: &Value, key: &str, field: &str, causes: &mut Vec<Cause>) -> bool {
    match parent.get(key) {
        None | Some(Value::Null) => {
            causes.push(Cause::required(field));
            false
        }
        Some(v) if !v.is_object() => {
            causes.push(wrong_type(field, v, "object"));
            false
        }
        Some(_) => true,
    }
}

fn required_string(parent: &Value, key: &str, field: &str, causes: &mut Vec<Cause>) {
    match parent.get(key) {
        None | Some(Value::Null) => causes.push(Cause::required(field)),
        Some(Value::String(_)) => {}
        Some(v) => causes.push(wrong_type(field, v, "string")),
    }
}

fn enumerated(parent: &Value, key: &str, field: &str, allowed: &[&str], causes: &mut Vec<Cause>) {
    match parent.get(key) {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if allowed.contains(&s.as_str()) => {}
        Some(v @ Value::String(_)) => causes.push(Cause::not_supported(field, v, allowed)),
        Some(v) => causes.push(wrong_type(field, v, "string")),
    }
}

fn date_time(parent: &Value, key: &str, field: &str, causes: &mut Vec<Cause>) {
    match parent.get(key) {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if parse_time(s).is_some() => {}
        Some(v @ Value::String(_)) => causes.push(Cause::invalid(
            field,
            v,
            format!("{field} in body must be of type date-time: {}", v),
        )),
        Some(v) => causes.push(wrong_type(field, v, "string")),
    }
}

fn string_map(parent: &Value, key: &str, field: &str, causes: &mut Vec<Cause>) {
    match parent.get(key) {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (k, v) in m {
                if !v.is_string() {
                    causes.push(wrong_type(&format!("{field}.{k}"), v, "string"));
                }
            }
        }
        Some(v) => causes.push(wrong_type(field, v, "object")),
    }
}

/// A pod template as the Sandbox and SandboxTemplate schemas hold it: `podTemplate` with a
/// required `spec` object and optional string maps of labels and annotations.
fn pod_template(spec: &Value, causes: &mut Vec<Cause>) {
    if !required_object(spec, "podTemplate", "spec.podTemplate", causes) {
        return;
    }
    let pt = &spec["podTemplate"];
    required_object(pt, "spec", "spec.podTemplate.spec", causes);
    if let Some(m) = pt.get("metadata").filter(|m| !m.is_null()) {
        if m.is_object() {
            string_map(m, "labels", "spec.podTemplate.metadata.labels", causes);
            string_map(m, "annotations", "spec.podTemplate.metadata.annotations", causes);
        } else {
            causes.push(wrong_type("spec.podTemplate.metadata", m, "object"));
        }
    }
    if let Some(v) = spec.get("service").filter(|v| !v.is_null() && !v.is_boolean()) {
        causes.push(wrong_type("spec.service", v, "boolean"));
    }
}

/// The schema's checks of `spec` beyond metadata.
fn check(kind: Kind, obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    if !required_object(obj, "spec", "spec", &mut causes) {
        return causes;
    }
    let spec = &obj["spec"];
    match kind {
        Kind::Sandbox => {
            pod_template(spec, &mut causes);
            enumerated(
                spec,
                "operatingMode",
                "spec.operatingMode",
                &["Running", "Suspended"],
                &mut causes,
            );
            enumerated(
                spec,
                "shutdownPolicy",
                "spec.shutdownPolicy",
                &["Delete", "Retain"],
                &mut causes,
            );
            date_time(spec, "shutdownTime", "spec.shutdownTime", &mut causes);
        }
        Kind::SandboxTemplate => {
            pod_template(spec, &mut causes);
            enumerated(
                spec,
                "networkPolicyManagement",
                "spec.networkPolicyManagement",
                &["Managed", "Unmanaged"],
                &mut causes,
            );
            enumerated(
                spec,
                "envVarsInjectionPolicy",
                "spec.envVarsInjectionPolicy",
                &["Allowed", "Overrides", "Disallowed"],
                &mut causes,
            );
            enumerated(
                spec,
                "volumeClaimTemplatesPolicy",
                "spec.volumeClaimTemplatesPolicy",
                &["Disallowed", "Allowed", "Overrides"],
                &mut causes,
            );
        }
        Kind::SandboxClaim => {
            if required_object(spec, "warmPoolRef", "spec.warmPoolRef", &mut causes) {
                required_string(&spec["warmPoolRef"], "name", "spec.warmPoolRef.name", &mut causes);
            }
            if let Some(l) = spec.get("lifecycle").filter(|l| !l.is_null()) {
                if l.is_object() {
                    date_time(l, "shutdownTime", "spec.lifecycle.shutdownTime", &mut causes);
                    enumerated(
                        l,
                        "shutdownPolicy",
                        "spec.lifecycle.shutdownPolicy",
                        &["Delete", "DeleteForeground", "Retain"],
                        &mut causes,
                    );
                } else {
                    causes.push(wrong_type("spec.lifecycle", l, "object"));
                }
            }
            if let Some(m) = spec.get("additionalPodMetadata").filter(|m| !m.is_null()) {
                string_map(m, "labels", "spec.additionalPodMetadata.labels", &mut causes);
                string_map(m, "annotations", "spec.additionalPodMetadata.annotations", &mut causes);
            }
            if let Some(env) = spec.get("env").filter(|e| !e.is_null()) {
                match env.as_array() {
                    Some(items) => {
                        for (i, e) in items.iter().enumerate() {
                            required_string(e, "name", &format!("spec.env[{i}].name"), &mut causes);
                            required_string(e, "value", &format!("spec.env[{i}].value"), &mut causes);
                        }
                    }
                    None => causes.push(wrong_type("spec.env", env, "array")),
                }
            }
        }
        Kind::SandboxWarmPool => {
            if required_object(spec, "sandboxTemplateRef", "spec.sandboxTemplateRef", &mut causes) {
                required_string(
                    &spec["sandboxTemplateRef"],
                    "name",
                    "spec.sandboxTemplateRef.name",
                    &mut causes,
                );
            }
            match spec.get("replicas") {
                None | Some(Value::Null) => {}
                Some(v) => match v.as_i64() {
                    Some(n) if n < 0 => causes.push(Cause::invalid(
                        "spec.replicas",
                        v,
                        "spec.replicas in body should be greater than or equal to 0",
                    )),
                    Some(n) if n > i64::from(i32::MAX) => {
                        causes.push(Cause::invalid("spec.replicas", v, "must fit in int32"))
                    }
                    Some(_) => {}
                    None => causes.push(wrong_type("spec.replicas", v, "integer")),
                },
            }
            if let Some(u) = spec.get("updateStrategy").filter(|u| u.is_object()) {
                enumerated(
                    u,
                    "type",
                    "spec.updateStrategy.type",
                    &["Recreate", "OnReplenish"],
                    &mut causes,
                );
            }
        }
        Kind::Pod
        | Kind::PersistentVolumeClaim
        | Kind::Secret
        | Kind::NetworkPolicy
        | Kind::ServiceAccount
        | Kind::Service
        | Kind::Deployment
        | Kind::Role
        | Kind::RoleBinding => {}
    }
    causes
}

// ---------------------------------------------------------------------------------------
// Small helpers over JSON objects.

fn meta<'a>(o: &'a Value, k: &str) -> &'a str {
    o["metadata"][k].as_str().unwrap_or("")
}

fn str_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

fn map_value(m: &BTreeMap<String, String>) -> Value {
    Value::Object(m.iter().map(|(k, v)| (k.clone(), json!(v))).collect())
}

/// Upstream's NameHash: FNV-1a (32 bits) of the name, as eight lower-case hex digits.
pub(crate) fn name_hash(s: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

fn parse_time(s: &str) -> Option<jiff::Timestamp> {
    s.parse().ok()
}

/// Whether a `shutdownTime` is given and reached.
fn expired(t: &Value) -> bool {
    t.as_str()
        .and_then(parse_time)
        .is_some_and(|t| t <= jiff::Timestamp::now())
}

/// A key upstream keeps for itself: a template may not set it on a pod.
fn is_system(k: &str) -> bool {
    k.starts_with("agents.x-k8s.io/") || k.starts_with("extensions.agents.x-k8s.io/")
}

fn owner_ref(owner: &Value, kind: Kind) -> Value {
    json!({
        "apiVersion": kind.api_version(),
        "kind": kind.kind(),
        "name": meta(owner, "name"),
        "uid": meta(owner, "uid"),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

fn controller_of(o: &Value) -> Option<&Value> {
    o["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|r| r["controller"] == true)
}

fn controlled_by(o: &Value, uid: &str) -> bool {
    controller_of(o).is_some_and(|r| r["uid"] == uid)
}

fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

/// Whether `o`'s controller is a `kind` of agent-sandbox's (by group and kind, any version,
/// as upstream matches owners), named `name` when given.
fn controlled_by_kind(o: &Value, kind: Kind, name: Option<&str>) -> bool {
    controller_of(o).is_some_and(|r| {
        group_of(r["apiVersion"].as_str().unwrap_or("")) == kind.group()
            && r["kind"] == kind.kind()
            && name.is_none_or(|n| r["name"] == n)
    })
}

fn condition(ty: &str, ok: bool, reason: &str, message: &str, generation: &Value) -> Value {
    json!({
        "type": ty,
        "status": if ok { "True" } else { "False" },
        "reason": reason,
        "message": message,
        "observedGeneration": generation.as_i64().unwrap_or(0),
        "lastTransitionTime": now_rfc3339(),
    })
}

/// meta.SetStatusCondition: the transition time moves only when the status does.
fn set_condition(conds: &mut Vec<Value>, mut c: Value) {
    match conds.iter_mut().find(|o| o["type"] == c["type"]) {
        Some(old) => {
            if old["status"] == c["status"] {
                c["lastTransitionTime"] = old["lastTransitionTime"].clone();
            }
            *old = c;
        }
        None => conds.push(c),
    }
}

fn remove_condition(conds: &mut Vec<Value>, ty: &str) {
    conds.retain(|c| c["type"] != ty);
}

fn find_condition<'a>(o: &'a Value, ty: &str) -> Option<&'a Value> {
    o["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == ty)
}

fn is_ready(o: &Value) -> bool {
    find_condition(o, "Ready").is_some_and(|c| c["status"] == "True")
}

fn pod_ips(o: &Value) -> Vec<String> {
    o["status"]["podIPs"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i.as_str().or(i["ip"].as_str()).map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Write `status` (an empty one removed) if it changed; the object must still be `uid`.
fn write_status(s: &Shared, kind: Kind, o: &Value, status: Value) -> Result<(), ApiError> {
    let empty = status.as_object().is_none_or(Map::is_empty);
    s.store
        .update(
            kind,
            meta(o, "namespace"),
            meta(o, "name"),
            Some(meta(o, "uid")),
            |old| {
                let mut n = old.clone();
                set_or_remove(&mut n, "status", (!empty).then_some(status));
                Ok(n)
            },
        )
        .map(|_| ())
}

/// Change `o`'s stored self with `f` (a no-op writes nothing); the object must still be `o`'s uid.
fn update<F: FnOnce(&mut Value) -> Result<(), ApiError>>(
    s: &Shared,
    kind: Kind,
    o: &Value,
    f: F,
) -> Result<Value, ApiError> {
    s.store.update(
        kind,
        meta(o, "namespace"),
        meta(o, "name"),
        Some(meta(o, "uid")),
        |old| {
            let mut n = old.clone();
            f(&mut n)?;
            for k in ["labels", "annotations"] {
                if n["metadata"][k].as_object().is_some_and(Map::is_empty) {
                    n["metadata"].as_object_mut().map(|m| m.remove(k));
                }
            }
            Ok(n)
        },
    )
}

fn delete_ignoring_gone(s: &Shared, kind: Kind, ns: &str, name: &str) -> Result<(), ApiError> {
    match s.store.delete(kind, ns, name) {
        Err(e) if e.code != 404 => Err(e),
        _ => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------
// The controllers.

/// Run the controllers until the task is aborted (the fake's shutdown).
pub(crate) fn spawn(s: Arc<Shared>) -> tokio::task::JoinHandle<()> {
    use tokio::sync::broadcast::error::{RecvError, TryRecvError};
    tokio::spawn(async move {
        let mut rx = s.store.subscribe();
        loop {
            reconcile(&s).await;
            tokio::select! {
                got = rx.recv() => if let Err(RecvError::Closed) = got { return },
                _ = tokio::time::sleep(TICK) => {}
            }
            // One pass answers every change queued meanwhile.
            loop {
                match rx.try_recv() {
                    Ok(_) | Err(TryRecvError::Lagged(_)) => {}
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Closed) => return,
                }
            }
        }
    })
}

/// One pass of every controller over every object; a failure is the next pass's to retry,
/// as a controller's requeue.
async fn reconcile(s: &Arc<Shared>) {
    collect_garbage(s).await;
    let all = |kind| s.store.lock().objects(kind, None);
    for t in all(Kind::SandboxTemplate) {
        if let Err(e) = template(s, &t) {
            tracing::debug!(template = meta(&t, "name"), error = %e.message, "SandboxTemplate");
        }
    }
    for p in all(Kind::SandboxWarmPool) {
        if let Err(e) = warm_pool(s, &p) {
            tracing::debug!(pool = meta(&p, "name"), error = %e.message, "SandboxWarmPool");
        }
    }
    for c in all(Kind::SandboxClaim) {
        if let Err(e) = claim(s, &c) {
            tracing::debug!(claim = meta(&c, "name"), error = %e.message, "SandboxClaim");
        }
    }
    for sb in all(Kind::Sandbox) {
        if let Err(e) = sandbox(s, &sb).await {
            tracing::debug!(sandbox = meta(&sb, "name"), error = %e.message, "Sandbox");
        }
    }
}

/// Kubernetes' garbage collector for what these controllers own: an object all of whose
/// owners are agent-sandbox objects that no longer exist goes (background propagation).
async fn collect_garbage(s: &Arc<Shared>) {
    let owner_kinds = [
        Kind::Sandbox,
        Kind::SandboxClaim,
        Kind::SandboxWarmPool,
        Kind::SandboxTemplate,
    ];
    let (owners, dependents) = {
        let i = s.store.lock();
        let owners: BTreeSet<(String, String)> = owner_kinds
            .iter()
            .flat_map(|k| i.objects(*k, None))
            .map(|o| (meta(&o, "namespace").to_string(), meta(&o, "uid").to_string()))
            .collect();
        let dependents: Vec<(Kind, Value)> = [Kind::Sandbox, Kind::Pod, Kind::NetworkPolicy]
            .into_iter()
            .flat_map(|k| i.objects(k, None).into_iter().map(move |o| (k, o)))
            .collect();
        (owners, dependents)
    };
    for (kind, o) in dependents {
        let Some(refs) = o["metadata"]["ownerReferences"].as_array().filter(|r| !r.is_empty()) else {
            continue;
        };
        let ours = refs.iter().all(|r| {
            owner_kinds
                .iter()
                .any(|k| r["kind"] == k.kind() && group_of(r["apiVersion"].as_str().unwrap_or("")) == k.group())
        });
        let ns = meta(&o, "namespace").to_string();
        let orphan = refs
            .iter()
            .all(|r| !owners.contains(&(ns.clone(), r["uid"].as_str().unwrap_or("").to_string())));
        if !(ours && orphan) {
            continue;
        }
        let name = meta(&o, "name");
        let gone = if kind == Kind::Pod {
            api::delete_one(s, kind, &ns, name).await.map(|_| ())
        } else {
            delete_ignoring_gone(s, kind, &ns, name)
        };
        if let Err(e) = gone.or_else(|e| if e.code == 404 { Ok(()) } else { Err(e) }) {
            tracing::debug!(name, error = %e.message, "collecting an orphan");
        }
    }
}

/// SandboxTemplate: its ref-hash label, and its NetworkPolicy while Managed.
fn template(s: &Arc<Shared>, t: &Value) -> Result<(), ApiError> {
    let name = meta(t, "name");
    let ns = meta(t, "namespace");
    let hash = name_hash(name);
    if t["metadata"]["labels"][TEMPLATE_REF_HASH] != hash.as_str() {
        update(s, Kind::SandboxTemplate, t, |n| {
            if !n["metadata"]["labels"].is_object() {
                n["metadata"]["labels"] = json!({});
            }
            n["metadata"]["labels"][TEMPLATE_REF_HASH] = json!(hash);
            Ok(())
        })?;
    }
    let np_name = format!("{name}-network-policy");
    let existing = s.store.get(Kind::NetworkPolicy, ns, &np_name);
    let uid = meta(t, "uid");
    if t["spec"]["networkPolicyManagement"] == "Unmanaged" {
        if let Some(np) = existing
            && controlled_by(&np, uid)
        {
            delete_ignoring_gone(s, Kind::NetworkPolicy, ns, &np_name)?;
        }
        return Ok(());
    }
    let selector = json!({"matchLabels": {TEMPLATE_REF_HASH: hash}});
    let spec = match t["spec"].get("networkPolicy").filter(|p| p.is_object()) {
        None => json!({
            "podSelector": selector,
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agent-sandbox-system"}},
                "podSelector": {"matchLabels": {"app": "sandbox-router"}},
            }]}],
            "egress": [{"to": [
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"]}},
                {"ipBlock": {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10"]}},
            ]}],
        }),
        Some(p) => {
            let mut spec = json!({"podSelector": selector, "policyTypes": ["Ingress", "Egress"]});
            for k in ["ingress", "egress"] {
                if let Some(r) = p.get(k).filter(|r| !r.is_null()) {
                    spec[k] = r.clone();
                }
            }
            spec
        }
    };
    match existing {
        None => {
            let np = json!({
                "metadata": {"name": np_name, "ownerReferences": [owner_ref(t, Kind::SandboxTemplate)]},
                "spec": spec,
            });
            s.store.create(Kind::NetworkPolicy, ns, np).map(|_| ())
        }
        Some(np) if controlled_by(&np, uid) && np["spec"] != spec => update(s, Kind::NetworkPolicy, &np, |n| {
            n["spec"] = spec;
            Ok(())
        })
        .map(|_| ()),
        Some(_) => Ok(()),
    }
}

/// upstream's ApplySandboxSecureDefaults over a pod spec made from `template`.
fn secure_defaults(template: &Value, pod_spec: &mut Value) {
    if !pod_spec.is_object() {
        return;
    }
    if pod_spec.get("automountServiceAccountToken").is_none_or(Value::is_null) {
        pod_spec["automountServiceAccountToken"] = json!(false);
    }
    let managed = template["spec"]["networkPolicyManagement"]
        .as_str()
        .is_none_or(|m| m.is_empty() || m == "Managed");
    let secure_by_default = managed && template["spec"].get("networkPolicy").is_none_or(Value::is_null);
    if secure_by_default && pod_spec["dnsPolicy"].as_str().is_none_or(str::is_empty) {
        pod_spec["dnsPolicy"] = json!("None");
        pod_spec["dnsConfig"] = json!({"nameservers": ["8.8.8.8", "1.1.1.1"]});
    }
}

/// The blueprint a template shares with a Sandbox's spec.
fn blueprint(template: &Value) -> Value {
    let mut spec = json!({});
    for k in ["podTemplate", "volumeClaimTemplates", "service"] {
        if let Some(v) = template["spec"].get(k).filter(|v| !v.is_null()) {
            spec[k] = v.clone();
        }
    }
    if !spec["podTemplate"]["metadata"].is_object() {
        spec["podTemplate"]["metadata"] = json!({});
    }
    spec
}

fn ensure_map<'a>(parent: &'a mut Value, key: &str) -> &'a mut Map<String, Value> {
    if !parent[key].is_object() {
        parent[key] = json!({});
    }
    parent[key].as_object_mut().expect("made an object just above")
}

/// SandboxWarmPool: `replicas` Sandboxes of its template, and its status.
fn warm_pool(s: &Arc<Shared>, pool: &Value) -> Result<(), ApiError> {
    let ns = meta(pool, "namespace");
    let name = meta(pool, "name");
    let uid = meta(pool, "uid");
    let hash = name_hash(name);
    let members: Vec<Value> = s
        .store
        .lock()
        .objects(Kind::Sandbox, Some(ns))
        .into_iter()
        .filter(|sb| sb["metadata"]["labels"][WARM_POOL] == hash.as_str() && controlled_by(sb, uid))
        .collect();
    let desired = pool["spec"]["replicas"].as_i64().unwrap_or(1).max(0) as usize;
    let template_name = pool["spec"]["sandboxTemplateRef"]["name"].as_str().unwrap_or("");
    let template = s.store.get(Kind::SandboxTemplate, ns, template_name);
    if members.len() < desired
        && let Some(t) = &template
    {
        for _ in 0..(desired - members.len()).min(POOL_BATCH) {
            admit(s, Kind::Sandbox, ns, pool_sandbox(pool, t))?;
        }
    } else if members.len() > desired {
        let mut surplus = members.clone();
        // Not Ready first, then the newest.
        surplus.sort_by(|a, b| {
            is_ready(a)
                .cmp(&is_ready(b))
                .then_with(|| meta(b, "creationTimestamp").cmp(meta(a, "creationTimestamp")))
        });
        for sb in surplus.iter().take(members.len() - desired) {
            delete_ignoring_gone(s, Kind::Sandbox, ns, meta(sb, "name"))?;
        }
    }
    let ready = members.iter().filter(|m| is_ready(m)).count();
    let mut status = json!({
        "selector": format!("{WARM_POOL}={hash}"),
        "observedGeneration": pool["metadata"]["generation"].as_i64().unwrap_or(0),
    });
    if !members.is_empty() {
        status["replicas"] = json!(members.len());
    }
    if ready > 0 {
        status["readyReplicas"] = json!(ready);
    }
    if let Some(c) = pool["status"].get("conditions") {
        status["conditions"] = c.clone();
    }
    write_status(s, Kind::SandboxWarmPool, pool, status)
}

/// upstream's buildSandboxCR: one pool member.
fn pool_sandbox(pool: &Value, template: &Value) -> Value {
    let template_name = meta(template, "name");
    let mut spec = blueprint(template);
    let pod_template_hash = name_hash(&spec["podTemplate"].to_string());
    let blueprint_hash = name_hash(&spec.to_string());
    let pool_hash = name_hash(meta(pool, "name"));
    let ref_hash = name_hash(template_name);
    {
        let labels = ensure_map(&mut spec["podTemplate"]["metadata"], "labels");
        labels.insert(WARM_POOL.into(), json!(pool_hash));
        labels.insert(TEMPLATE_REF_HASH.into(), json!(ref_hash));
        labels.insert(POD_TEMPLATE_HASH.into(), json!(pod_template_hash));
        labels.insert(TEMPLATE_HASH.into(), json!(blueprint_hash));
    }
    secure_defaults(template, &mut spec["podTemplate"]["spec"]);
    json!({
        "metadata": {
            "generateName": format!("{}-", meta(pool, "name")),
            "labels": {
                WARM_POOL: pool_hash,
                TEMPLATE_REF_HASH: ref_hash,
                LAUNCH_TYPE: "warm",
                POD_TEMPLATE_HASH: pod_template_hash,
                TEMPLATE_HASH: blueprint_hash,
                CREATED_BY: "controller",
            },
            "annotations": {TEMPLATE_REF: template_name},
            "ownerReferences": [owner_ref(pool, Kind::SandboxWarmPool)],
        },
        "spec": spec,
    })
}

/// Why a claim is not Ready, as its condition says it.
struct Unready {
    reason: &'static str,
    message: String,
}

impl Unready {
    fn new(reason: &'static str, message: impl Into<String>) -> Unready {
        Unready {
            reason,
            message: message.into(),
        }
    }
}

impl From<ApiError> for Unready {
    fn from(e: ApiError) -> Unready {
        Unready::new("ReconcilerError", e.message)
    }
}

/// SandboxClaim: its Sandbox (adopted or made), its status, its expiry.
fn claim(s: &Arc<Shared>, c: &Value) -> Result<(), ApiError> {
    let ns = meta(c, "namespace");
    let uid = meta(c, "uid");
    let generation = &c["metadata"]["generation"];
    let mut status = c.get("status").filter(|s| s.is_object()).cloned().unwrap_or(json!({}));
    let mut conds: Vec<Value> = status["conditions"].as_array().cloned().unwrap_or_default();
    let lifecycle = &c["spec"]["lifecycle"];
    if expired(&lifecycle["shutdownTime"]) {
        set_condition(
            &mut conds,
            condition("Ready", false, "ClaimExpired", "Claim expired", generation),
        );
        let policy = lifecycle["shutdownPolicy"].as_str().unwrap_or("Retain");
        if policy == "Delete" || policy == "DeleteForeground" {
            // The collector then takes its Sandbox, and that one's pod.
            return delete_ignoring_gone(s, Kind::SandboxClaim, ns, meta(c, "name"));
        }
        let sb_name = status["sandbox"]["name"]
            .as_str()
            .filter(|n| !n.is_empty())
            .unwrap_or(meta(c, "name"))
            .to_string();
        if let Some(sb) = s.store.get(Kind::Sandbox, ns, &sb_name)
            && controlled_by(&sb, uid)
        {
            delete_ignoring_gone(s, Kind::Sandbox, ns, &sb_name)?;
        }
        if let Some(o) = status["sandbox"].as_object_mut() {
            o.remove("podIPs");
        }
        status["conditions"] = json!(conds);
        return write_status(s, Kind::SandboxClaim, c, status);
    }
    match claimed(s, c) {
        Ok(None) => return Ok(()),
        Ok(Some(sb)) => {
            let mut sbs = json!({"name": meta(&sb, "name")});
            let ips = sb["status"]["podIPs"].clone();
            if ips.as_array().is_some_and(|a| !a.is_empty()) {
                sbs["podIPs"] = ips;
            }
            status["sandbox"] = sbs;
            let ready = match find_condition(&sb, "Ready") {
                Some(r) => {
                    let mut r = r.clone();
                    r["observedGeneration"] = json!(generation.as_i64().unwrap_or(0));
                    r
                }
                None => condition("Ready", false, "SandboxNotReady", "Sandbox is not ready", generation),
            };
            set_condition(&mut conds, ready);
        }
        Err(u) => set_condition(&mut conds, condition("Ready", false, u.reason, &u.message, generation)),
    }
    status["conditions"] = json!(conds);
    write_status(s, Kind::SandboxClaim, c, status)
}

/// The claim's Sandbox, found, adopted or made; `None` while it waits for warm candidates.
fn claimed(s: &Arc<Shared>, c: &Value) -> Result<Option<Value>, Unready> {
    let ns = meta(c, "namespace");
    let uid = meta(c, "uid");
    let pool_name = c["spec"]["warmPoolRef"]["name"].as_str().unwrap_or("");
    validate_additional(&c["spec"]["additionalPodMetadata"]).map_err(|m| Unready::new("InvalidMetadata", m))?;
    // Its own already: status, then the assignment annotation.
    if let Some(n) = c["status"]["sandbox"]["name"].as_str().filter(|n| !n.is_empty())
        && let Some(sb) = s.store.get(Kind::Sandbox, ns, n)
        && controlled_by(&sb, uid)
    {
        return keep_in_step(s, c, &sb).map(Some);
    }
    if let Some(n) = c["metadata"]["annotations"][ASSIGNED]
        .as_str()
        .filter(|n| !n.is_empty())
    {
        match s.store.get(Kind::Sandbox, ns, n) {
            Some(sb) if controlled_by(&sb, uid) => return keep_in_step(s, c, &sb).map(Some),
            Some(sb) if adoptable(&sb, pool_name) => return adopt(s, c, &sb).map(Some),
            _ => {
                update(s, Kind::SandboxClaim, c, |n| {
                    if let Some(a) = n["metadata"]["annotations"].as_object_mut() {
                        a.remove(ASSIGNED);
                    }
                    Ok(())
                })?;
            }
        }
    }
    if let Some(sb) = s.store.get(Kind::Sandbox, ns, meta(c, "name")) {
        if controlled_by(&sb, uid) {
            return keep_in_step(s, c, &sb).map(Some);
        }
        return Err(Unready::new(
            "ReconcilerError",
            format!(
                "sandbox {:?} is not controlled by claim {:?}. Please use a different claim name or delete the sandbox manually",
                meta(&sb, "name"),
                meta(c, "name")
            ),
        ));
    }
    let custom = c["spec"]["env"].as_array().is_some_and(|e| !e.is_empty())
        || c["spec"]["volumeClaimTemplates"]
            .as_array()
            .is_some_and(|v| !v.is_empty());
    if !custom {
        let mut candidates: Vec<Value> = s
            .store
            .lock()
            .objects(Kind::Sandbox, Some(ns))
            .into_iter()
            .filter(|sb| adoptable(sb, pool_name))
            .collect();
        candidates.sort_by(|a, b| meta(a, "creationTimestamp").cmp(meta(b, "creationTimestamp")));
        let with_ip = || candidates.iter().filter(|sb| !pod_ips(sb).is_empty());
        let pick = with_ip().find(|sb| is_ready(sb)).or_else(|| with_ip().next()).cloned();
        if let Some(sb) = pick {
            update(s, Kind::SandboxClaim, c, |n| {
                ensure_map(&mut n["metadata"], "annotations").insert(ASSIGNED.into(), json!(meta(&sb, "name")));
                Ok(())
            })?;
            return adopt(s, c, &sb).map(Some);
        }
        let pending = candidates.iter().any(|sb| pod_ips(sb).is_empty());
        let young = meta(c, "creationTimestamp")
            .parse::<jiff::Timestamp>()
            .ok()
            .is_some_and(|t| {
                jiff::Timestamp::now().duration_since(t)
                    < jiff::SignedDuration::try_from(WARM_CANDIDATE_GRACE).unwrap_or_default()
            });
        if pending && young {
            return Ok(None);
        }
    }
    let (_, template) = pool_template(s, ns, pool_name)?;
    make_for_claim(s, c, &template).map(Some)
}

/// The claim's pool and that pool's template, or why not.
fn pool_template(s: &Shared, ns: &str, pool_name: &str) -> Result<(Value, Value), Unready> {
    let pool = s
        .store
        .get(Kind::SandboxWarmPool, ns, pool_name)
        .ok_or_else(|| Unready::new("WarmPoolNotFound", format!("SandboxWarmPool {pool_name:?} not found")))?;
    let t = pool["spec"]["sandboxTemplateRef"]["name"].as_str().unwrap_or("");
    let template = s
        .store
        .get(Kind::SandboxTemplate, ns, t)
        .ok_or_else(|| Unready::new("TemplateNotFound", format!("SandboxTemplate {t:?} not found")))?;
    Ok((pool, template))
}

/// upstream's isAdoptable and the pool check: a live member of the claim's pool.
fn adoptable(sb: &Value, pool_name: &str) -> bool {
    let labels = &sb["metadata"]["labels"];
    labels.get(WARM_POOL).is_some()
        && labels.get(TEMPLATE_REF_HASH).is_some()
        && sb["metadata"].get("deletionTimestamp").is_none()
        && controlled_by_kind(sb, Kind::SandboxWarmPool, Some(pool_name))
}

/// upstream's validateAdditionalPodMetadata.
fn validate_additional(m: &Value) -> Result<(), String> {
    for (k, v) in str_map(&m["labels"]) {
        let why = || -> Option<String> {
            if let Err(e) = validate::label_key(&k) {
                return Some(format!("invalid label key: {k:?}: {e}"));
            }
            if k.eq_ignore_ascii_case("app") && v.eq_ignore_ascii_case("sandbox-router") {
                return Some(format!(
                    "restricted system label value: {k:?}={v:?} is not allowed in AdditionalPodMetadata"
                ));
            }
            let Some((domain, _)) = k.split_once('/') else {
                return Some(format!(
                    "label {k:?} must have a domain prefix (e.g. 'sandbox.users.io/my-label') to prevent opting into unintended policy domains"
                ));
            };
            let domain = domain.to_ascii_lowercase();
            if !ALLOWED_LABEL_DOMAINS
                .iter()
                .any(|d| domain == *d || domain.ends_with(&format!(".{d}")))
            {
                return Some(format!("label domain {domain:?} is not in the allowlist"));
            }
            if let Err(e) = validate::label_value(&v) {
                return Some(format!(
                    "invalid label value: {v:?} does not match allowed pattern: {e}"
                ));
            }
            None
        };
        if let Some(w) = why() {
            return Err(format!("failed to validate label {k:?}: {w}"));
        }
    }
    for k in str_map(&m["annotations"]).keys() {
        if let Err(e) = validate::label_key(k) {
            return Err(format!(
                "failed to validate annotation {k:?}: invalid annotation key: {k:?}: {e}"
            ));
        }
        let domain = k.split_once('/').map_or(String::new(), |(d, _)| d.to_ascii_lowercase());
        let restricted = RESTRICTED_DOMAINS
            .iter()
            .any(|d| domain == *d || domain.ends_with(&format!(".{d}")));
        if restricted && k != SAFE_TO_EVICT {
            return Err(format!(
                "failed to validate annotation {k:?}: restricted system domain: {k:?} is not allowed in AdditionalPodMetadata"
            ));
        }
    }
    Ok(())
}

/// upstream's mergePodMetadata: the claim's keys over `base`, none overriding one of it.
fn merge_additional(base: &mut Value, claim: &Value) -> Result<(), Unready> {
    let add = &claim["spec"]["additionalPodMetadata"];
    for (what, key) in [("label", "labels"), ("annotation", "annotations")] {
        let extra = str_map(&add[key]);
        if extra.is_empty() {
            continue;
        }
        let have = ensure_map(base, key);
        for (k, v) in &extra {
            if let Some(t) = have.get(k).and_then(Value::as_str)
                && t != v
            {
                return Err(Unready::new(
                    "ReconcilerError",
                    format!(
                        "metadata override conflict: {what} {k:?} is defined in template with value {t:?}, but claim requests {v:?}"
                    ),
                ));
            }
        }
        for (k, v) in extra {
            have.insert(k, json!(v));
        }
    }
    Ok(())
}

/// The pod metadata a claimed Sandbox's template carries: the template's, the claim's
/// identity and template hash, its created-by, and additionalPodMetadata.
fn claimed_pod_metadata(template: &Value, claim: &Value) -> Result<Value, Unready> {
    let mut m = template["spec"]["podTemplate"]["metadata"].clone();
    if !m.is_object() {
        m = json!({});
    }
    {
        let labels = ensure_map(&mut m, "labels");
        labels.insert(CLAIM_UID.into(), json!(meta(claim, "uid")));
        labels.insert(TEMPLATE_REF_HASH.into(), json!(name_hash(meta(template, "name"))));
        match claim["metadata"]["labels"][CREATED_BY]
            .as_str()
            .filter(|v| !v.is_empty())
        {
            Some(v) => labels.insert(CREATED_BY.into(), json!(v)),
            None => labels.remove(CREATED_BY),
        };
    }
    merge_additional(&mut m, claim)?;
    if m.get("annotations").is_none() {
        m["annotations"] = json!({});
    }
    Ok(m)
}

/// Pod metadata equal as upstream's DeepEqual of PodMetadata sees it (an empty map is none).
fn same_pod_metadata(a: &Value, b: &Value) -> bool {
    ["labels", "annotations"]
        .iter()
        .all(|k| str_map(&a[*k]) == str_map(&b[*k]))
}

/// The claim's own Sandbox kept in step with its template and claim (upstream's fast path).
fn keep_in_step(s: &Arc<Shared>, c: &Value, sb: &Value) -> Result<Value, Unready> {
    let ns = meta(c, "namespace");
    let pool_name = c["spec"]["warmPoolRef"]["name"].as_str().unwrap_or("");
    let template = match pool_template(s, ns, pool_name) {
        Ok((_, t)) => t,
        Err(u) => {
            let add = &c["spec"]["additionalPodMetadata"];
            if !str_map(&add["labels"]).is_empty() || !str_map(&add["annotations"]).is_empty() {
                return Err(Unready::new(
                    "ReconcilerError",
                    format!("failed to get template for metadata propagation: {}", u.message),
                ));
            }
            return Ok(sb.clone());
        }
    };
    let want = claimed_pod_metadata(&template, c)?;
    let hash = name_hash(meta(&template, "name"));
    let created_by = c["metadata"]["labels"][CREATED_BY].as_str().filter(|v| !v.is_empty());
    let labels = &sb["metadata"]["labels"];
    let in_step = same_pod_metadata(&want, &sb["spec"]["podTemplate"]["metadata"])
        && labels[TEMPLATE_REF_HASH] == hash.as_str()
        && labels[CREATED_BY].as_str() == created_by;
    if in_step {
        return Ok(sb.clone());
    }
    Ok(update(s, Kind::Sandbox, sb, |n| {
        n["spec"]["podTemplate"]["metadata"] = want;
        let l = ensure_map(&mut n["metadata"], "labels");
        l.insert(TEMPLATE_REF_HASH.into(), json!(hash));
        match created_by {
            Some(v) => l.insert(CREATED_BY.into(), json!(v)),
            None => l.remove(CREATED_BY),
        };
        Ok(())
    })?)
}

/// upstream's completeAdoption: the pool member becomes the claim's.
fn adopt(s: &Arc<Shared>, c: &Value, sb: &Value) -> Result<Value, Unready> {
    let ns = meta(c, "namespace");
    let pool_name = c["spec"]["warmPoolRef"]["name"].as_str().unwrap_or("").to_string();
    let template = pool_template(s, ns, &pool_name).ok().map(|(_, t)| t);
    let merged = match &template {
        Some(t) => Some(claimed_pod_metadata(t, c)?),
        None => None,
    };
    let claim_uid = meta(c, "uid").to_string();
    let created_by = c["metadata"]["labels"][CREATED_BY]
        .as_str()
        .filter(|v| !v.is_empty())
        .map(str::to_string);
    let claim_ref = owner_ref(c, Kind::SandboxClaim);
    let name = meta(sb, "name").to_string();
    let adopted = update(s, Kind::Sandbox, sb, |n| {
        // Under the store's lock: still the pool's, or another claim took it (upstream's
        // optimistic lock answers the same 409).
        if !adoptable(n, &pool_name) {
            return Err(ApiError {
                code: 409,
                reason: "Conflict",
                details: None,
                ..ApiError::bad_request(format!("sandbox {name:?} is no longer the pool's to adopt"))
            });
        }
        let labels = ensure_map(&mut n["metadata"], "labels");
        let template_hash = labels
            .get(TEMPLATE_REF_HASH)
            .and_then(Value::as_str)
            .map(str::to_string);
        for k in [WARM_POOL, POD_TEMPLATE_HASH, TEMPLATE_HASH] {
            labels.remove(k);
        }
        labels.insert(LAUNCH_TYPE.into(), json!("warm"));
        labels.insert(CLAIM_UID.into(), json!(claim_uid));
        match &created_by {
            Some(v) => labels.insert(CREATED_BY.into(), json!(v)),
            None => labels.remove(CREATED_BY),
        };
        if let Some(h) = &template_hash {
            labels.insert(TEMPLATE_REF_HASH.into(), json!(h));
        }
        n["metadata"]["ownerReferences"] = json!([claim_ref]);
        ensure_map(&mut n["metadata"], "annotations").insert(POD_NAME.into(), json!(name));
        match merged {
            Some(m) => n["spec"]["podTemplate"]["metadata"] = m,
            None => {
                let pm = &mut n["spec"]["podTemplate"]["metadata"];
                if !pm.is_object() {
                    *pm = json!({});
                }
                if let Some(a) = pm["annotations"].as_object_mut()
                    && a.get(SAFE_TO_EVICT).and_then(Value::as_str) == Some("true")
                {
                    a.remove(SAFE_TO_EVICT);
                }
                let l = ensure_map(pm, "labels");
                l.insert(CLAIM_UID.into(), json!(claim_uid));
                if let Some(h) = &template_hash {
                    l.insert(TEMPLATE_REF_HASH.into(), json!(h));
                }
                match &created_by {
                    Some(v) => l.insert(CREATED_BY.into(), json!(v)),
                    None => l.remove(CREATED_BY),
                };
                merge_additional(pm, c).map_err(|u| ApiError::bad_request(u.message))?;
            }
        }
        Ok(())
    });
    adopted.map_err(|e| {
        if e.code == 409 {
            Unready::new(
                "AdoptionConflict",
                format!("{}; the next pass retries from a converged view", e.message),
            )
        } else {
            Unready::from(e)
        }
    })
}

/// upstream's createSandbox: a Sandbox named like the claim, from the pool's template.
fn make_for_claim(s: &Arc<Shared>, c: &Value, template: &Value) -> Result<Value, Unready> {
    let ns = meta(c, "namespace");
    let template_name = meta(template, "name");
    let hash = name_hash(template_name);
    let mut spec = blueprint(template);
    if let Some(v) = c["spec"]["volumeClaimTemplates"].as_array().filter(|v| !v.is_empty()) {
        if template["spec"]["volumeClaimTemplatesPolicy"]
            .as_str()
            .unwrap_or("Disallowed")
            == "Disallowed"
        {
            return Err(Unready::new(
                "VolumeClaimTemplatesError",
                "volume claim templates are disallowed by the template",
            ));
        }
        spec["volumeClaimTemplates"] = json!(v);
    }
    let mut labels = BTreeMap::from([
        (CLAIM_UID.to_string(), meta(c, "uid").to_string()),
        (LAUNCH_TYPE.to_string(), "cold".to_string()),
        (TEMPLATE_REF_HASH.to_string(), hash.clone()),
    ]);
    let created_by = c["metadata"]["labels"][CREATED_BY].as_str().filter(|v| !v.is_empty());
    {
        let pl = ensure_map(&mut spec["podTemplate"]["metadata"], "labels");
        pl.insert(CLAIM_UID.into(), json!(meta(c, "uid")));
        pl.insert(TEMPLATE_REF_HASH.into(), json!(hash));
        match created_by {
            Some(v) => {
                labels.insert(CREATED_BY.into(), v.into());
                pl.insert(CREATED_BY.into(), json!(v));
            }
            None => {
                pl.remove(CREATED_BY);
            }
        }
    }
    merge_additional(&mut spec["podTemplate"]["metadata"], c)?;
    inject_env(c, template, &mut spec["podTemplate"]["spec"])?;
    secure_defaults(template, &mut spec["podTemplate"]["spec"]);
    let sb = json!({
        "metadata": {
            "name": meta(c, "name"),
            "labels": map_value(&labels),
            "annotations": {TEMPLATE_REF: template_name},
            "ownerReferences": [owner_ref(c, Kind::SandboxClaim)],
        },
        "spec": spec,
    });
    match admit(s, Kind::Sandbox, ns, sb) {
        Ok(v) => Ok(v),
        Err(e) if e.code == 409 => Err(Unready::new(
            "SandboxCreatePending",
            "Sandbox already created; waiting for cache to converge",
        )),
        Err(e) => Err(Unready::new(
            "ReconcilerError",
            format!("sandbox create error: {}", e.message),
        )),
    }
}

/// upstream's env injection: the claim's `env` into the template's containers, as the
/// template's envVarsInjectionPolicy allows.
fn inject_env(c: &Value, template: &Value, pod_spec: &mut Value) -> Result<(), Unready> {
    let Some(env) = c["spec"]["env"].as_array().filter(|e| !e.is_empty()) else {
        return Ok(());
    };
    let policy = template["spec"]["envVarsInjectionPolicy"]
        .as_str()
        .unwrap_or("Disallowed");
    let rejected = |m: String| Unready::new("EnvVarsInjectionRejected", m);
    if policy != "Allowed" && policy != "Overrides" {
        return Err(rejected(
            "environment variable injection rejected: environment variable injection is not allowed by the template policy"
                .into(),
        ));
    }
    let Some(containers) = pod_spec["containers"].as_array_mut() else {
        return Ok(());
    };
    for e in env {
        let name = e["name"].as_str().unwrap_or("");
        let value = e["value"].as_str().unwrap_or("");
        let target = match e["containerName"].as_str().filter(|n| !n.is_empty()) {
            None => containers.first_mut(),
            Some(cn) => containers.iter_mut().find(|x| x["name"] == cn),
        };
        let Some(container) = target else {
            return Err(Unready::new(
                "ReconcilerError",
                format!(
                    "target container {:?} not found in template for environment variable {name:?}",
                    e["containerName"].as_str().unwrap_or("")
                ),
            ));
        };
        if policy == "Allowed" && container["envFrom"].as_array().is_some_and(|f| !f.is_empty()) {
            return Err(rejected(format!(
                "environment variable injection rejected: container {:?} uses EnvFrom sources; Allowed policy cannot safely prevent overriding EnvFrom-provided variables",
                container["name"].as_str().unwrap_or("")
            )));
        }
        if !container["env"].is_array() {
            container["env"] = json!([]);
        }
        let list = container["env"].as_array_mut().expect("made an array just above");
        match list.iter_mut().find(|x| x["name"] == name) {
            Some(_) if policy != "Overrides" => {
                return Err(Unready::new(
                    "ReconcilerError",
                    format!(
                        "environment variable override is not allowed by the template policy for variable {name:?}"
                    ),
                ));
            }
            Some(x) => *x = json!({"name": name, "value": value}),
            None => list.push(json!({"name": name, "value": value})),
        }
    }
    Ok(())
}

/// The labels agent-sandbox's extensions own on a pod, from its Sandbox's labels (upstream's
/// computeExtensionPodLabels): only while an extensions object controls the Sandbox.
fn extension_labels(sb: &Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Some(r) = controller_of(sb) else { return out };
    if group_of(r["apiVersion"].as_str().unwrap_or("")) != EXTENSIONS {
        return out;
    }
    let labels = str_map(&sb["metadata"]["labels"]);
    if r["kind"] == "SandboxWarmPool"
        && let Some(v) = labels.get(WARM_POOL).filter(|v| !v.is_empty())
    {
        out.insert(WARM_POOL.to_string(), v.clone());
    }
    if let Some(v) = labels.get(TEMPLATE_REF_HASH).filter(|v| !v.is_empty()) {
        out.insert(TEMPLATE_REF_HASH.to_string(), v.clone());
    }
    out
}

/// The Sandbox's new pod: its template's spec and metadata as upstream's reconcilePod makes it.
fn new_pod(sb: &Value) -> Value {
    let template = &sb["spec"]["podTemplate"];
    let mut labels: BTreeMap<String, String> = BTreeMap::new();
    let mut managed_labels = Vec::new();
    for (k, v) in str_map(&template["metadata"]["labels"]) {
        if !is_system(&k) {
            managed_labels.push(k.clone());
            labels.insert(k, v);
        }
    }
    labels.insert(NAME_HASH.to_string(), name_hash(meta(sb, "name")));
    labels.extend(extension_labels(sb));
    if let Some(v) = sb["metadata"]["labels"][CREATED_BY].as_str().filter(|v| !v.is_empty()) {
        labels.insert(CREATED_BY.to_string(), v.to_string());
    }
    let mut annotations: BTreeMap<String, String> = BTreeMap::new();
    let mut managed_annotations = Vec::new();
    for (k, v) in str_map(&template["metadata"]["annotations"]) {
        if !is_system(&k) {
            managed_annotations.push(k.clone());
            annotations.insert(k, v);
        }
    }
    if !managed_labels.is_empty() {
        annotations.insert(PROPAGATED_LABELS.to_string(), managed_labels.join(","));
    }
    if !managed_annotations.is_empty() {
        annotations.insert(PROPAGATED_ANNOTATIONS.to_string(), managed_annotations.join(","));
    }
    let mut spec = template["spec"].clone();
    let claims: Vec<Value> = sb["spec"]["volumeClaimTemplates"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(|t| t["metadata"]["name"].as_str())
                .map(
                    |n| json!({"name": n, "persistentVolumeClaim": {"claimName": format!("{n}-{}", meta(sb, "name"))}}),
                )
                .collect()
        })
        .unwrap_or_default();
    if !claims.is_empty() {
        let mut volumes: Vec<Value> = spec["volumes"].as_array().cloned().unwrap_or_default();
        for c in claims {
            match volumes.iter_mut().find(|v| v["name"] == c["name"]) {
                Some(v) => *v = c,
                None => volumes.push(c),
            }
        }
        spec["volumes"] = json!(volumes);
    }
    let mut metadata = json!({
        "name": meta(sb, "name"),
        "labels": map_value(&labels),
        "ownerReferences": [owner_ref(sb, Kind::Sandbox)],
    });
    if !annotations.is_empty() {
        metadata["annotations"] = map_value(&annotations);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

/// upstream's updatePodMetadata: an existing pod's labels and annotations kept in step with
/// its Sandbox's template; the new metadata when it changed.
fn pod_metadata_in_step(pod: &Value, sb: &Value) -> Option<(BTreeMap<String, String>, BTreeMap<String, String>)> {
    let mut labels = str_map(&pod["metadata"]["labels"]);
    let mut annotations = str_map(&pod["metadata"]["annotations"]);
    let (labels0, annotations0) = (labels.clone(), annotations.clone());
    let template = &sb["spec"]["podTemplate"]["metadata"];
    let tl = str_map(&template["labels"]);
    let ta = str_map(&template["annotations"]);
    labels.insert(NAME_HASH.to_string(), name_hash(meta(sb, "name")));
    let mut managed_labels = Vec::new();
    for (k, v) in &tl {
        if !is_system(k) {
            labels.insert(k.clone(), v.clone());
            managed_labels.push(k.clone());
        }
    }
    let propagated = |a: &BTreeMap<String, String>, key: &str| -> Vec<String> {
        a.get(key)
            .map(|s| s.split(',').filter(|k| !k.is_empty()).map(str::to_string).collect())
            .unwrap_or_default()
    };
    for k in propagated(&annotations0, PROPAGATED_LABELS) {
        if is_system(&k) {
            if k != NAME_HASH {
                labels.remove(&k);
            }
        } else if !tl.contains_key(&k) {
            labels.remove(&k);
        }
    }
    let ext = extension_labels(sb);
    for k in [WARM_POOL, TEMPLATE_REF_HASH] {
        match ext.get(k) {
            Some(v) => labels.insert(k.to_string(), v.clone()),
            None => labels.remove(k),
        };
    }
    match sb["metadata"]["labels"][CREATED_BY].as_str().filter(|v| !v.is_empty()) {
        Some(v) => labels.insert(CREATED_BY.to_string(), v.to_string()),
        None => labels.remove(CREATED_BY),
    };
    let mut managed_annotations = Vec::new();
    for (k, v) in &ta {
        if !is_system(k) {
            annotations.insert(k.clone(), v.clone());
            managed_annotations.push(k.clone());
        }
    }
    for k in propagated(&annotations0, PROPAGATED_ANNOTATIONS) {
        if is_system(&k) {
            if k != PROPAGATED_LABELS && k != PROPAGATED_ANNOTATIONS {
                annotations.remove(&k);
            }
        } else if !ta.contains_key(&k) {
            annotations.remove(&k);
        }
    }
    annotations.insert(PROPAGATED_LABELS.to_string(), managed_labels.join(","));
    annotations.insert(PROPAGATED_ANNOTATIONS.to_string(), managed_annotations.join(","));
    (labels != labels0 || annotations != annotations0).then_some((labels, annotations))
}

/// Sandbox: its pod, its expiry, its status.
async fn sandbox(s: &Arc<Shared>, sb: &Value) -> Result<(), ApiError> {
    let ns = meta(sb, "namespace");
    let name = meta(sb, "name");
    let uid = meta(sb, "uid");
    let generation = &sb["metadata"]["generation"];
    let spec = &sb["spec"];
    let mut conds: Vec<Value> = sb["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let tracked = sb["metadata"]["annotations"][POD_NAME]
        .as_str()
        .filter(|n| !n.is_empty());
    let pod_name = tracked.unwrap_or(name).to_string();
    let pod = s.store.get(Kind::Pod, ns, &pod_name);

    if expired(&spec["shutdownTime"]) {
        set_condition(
            &mut conds,
            condition("Ready", false, "SandboxExpired", "Sandbox has expired", generation),
        );
        remove_condition(&mut conds, "PodScheduled");
        if let Some(p) = &pod
            && controlled_by(p, uid)
        {
            match api::delete_one(s, Kind::Pod, ns, &pod_name).await {
                Err(e) if e.code != 404 => return Err(e),
                _ => {}
            }
        }
        if spec["shutdownPolicy"] == "Delete" {
            return delete_ignoring_gone(s, Kind::Sandbox, ns, name);
        }
        return write_status(s, Kind::Sandbox, sb, json!({"conditions": conds}));
    }

    let clear_tracking = |s: &Arc<Shared>| {
        update(s, Kind::Sandbox, sb, |n| {
            if let Some(a) = n["metadata"]["annotations"].as_object_mut() {
                a.remove(POD_NAME);
            }
            Ok(())
        })
    };
    let suspended = spec["operatingMode"] == "Suspended";
    let mut error: Option<String> = None;
    let mut pod = pod;
    if suspended {
        if let Some(p) = &pod
            && controlled_by(p, uid)
        {
            match api::delete_one(s, Kind::Pod, ns, &pod_name).await {
                Err(e) if e.code != 404 => return Err(e),
                _ => pod = None,
            }
        }
        if tracked.is_some() {
            clear_tracking(s)?;
        }
    } else {
        if pod.is_none() && tracked.is_some() {
            clear_tracking(s)?;
        }
        pod = match pod {
            Some(p) => match own_pod(s, sb, &p) {
                Ok(p) => Some(p),
                Err(e) => {
                    error = Some(e.message);
                    Some(p)
                }
            },
            None => match api::admit_pod(s, ns, new_pod(sb)) {
                Ok(p) => Some(p),
                Err(e) => {
                    error = Some(e.message);
                    None
                }
            },
        };
        if error.is_none()
            && let Some(p) = &pod
            && sb["metadata"]["annotations"][POD_NAME] != meta(p, "name")
            && tracked.is_none()
        {
            let pn = meta(p, "name").to_string();
            update(s, Kind::Sandbox, sb, |n| {
                ensure_map(&mut n["metadata"], "annotations").insert(POD_NAME.into(), json!(pn));
                Ok(())
            })?;
        }
    }

    let mut status = json!({});
    let owned = pod.as_ref().filter(|p| controlled_by(p, uid));
    if pod.is_some() {
        status["selector"] = json!(format!("{NAME_HASH}={}", name_hash(name)));
    } else if let Some(sel) = sb["status"].get("selector") {
        status["selector"] = sel.clone();
    }
    if let Some(p) = owned {
        let ips = pod_ips(p);
        if !ips.is_empty() {
            status["podIPs"] = json!(ips);
        }
        if let Some(n) = p["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
            status["nodeName"] = json!(n);
        }
    }
    set_condition(
        &mut conds,
        ready_condition(sb, pod.as_ref(), error.as_deref(), suspended),
    );
    match &pod {
        Some(p) => {
            let c = match p["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "PodScheduled"))
            {
                Some(pc) => json!({
                    "type": "PodScheduled",
                    "status": pc["status"],
                    "reason": pc["reason"].as_str().filter(|r| !r.is_empty()).unwrap_or("PodScheduled"),
                    "message": pc["message"].as_str().unwrap_or(""),
                    "observedGeneration": generation.as_i64().unwrap_or(0),
                    "lastTransitionTime": now_rfc3339(),
                }),
                None => json!({
                    "type": "PodScheduled",
                    "status": "Unknown",
                    "reason": "PodSchedulingUnknown",
                    "message": "Pod has not reported a PodScheduled condition",
                    "observedGeneration": generation.as_i64().unwrap_or(0),
                    "lastTransitionTime": now_rfc3339(),
                }),
            };
            set_condition(&mut conds, c);
        }
        None => remove_condition(&mut conds, "PodScheduled"),
    }
    match owned.and_then(|p| p["status"]["phase"].as_str()) {
        Some("Succeeded") => set_condition(
            &mut conds,
            condition(
                "Finished",
                true,
                "PodSucceeded",
                "Pod completed successfully",
                generation,
            ),
        ),
        Some("Failed") => set_condition(
            &mut conds,
            condition("Finished", true, "PodFailed", "Pod failed", generation),
        ),
        _ => remove_condition(&mut conds, "Finished"),
    }
    if suspended {
        set_condition(
            &mut conds,
            condition("Suspended", true, "PodTerminated", "Pod is terminated", generation),
        );
    } else if conds.iter().any(|c| c["type"] == "Suspended") {
        set_condition(
            &mut conds,
            condition("Suspended", false, "NotSuspended", "Sandbox is running", generation),
        );
    }
    status["conditions"] = json!(conds);
    write_status(s, Kind::Sandbox, sb, status)
}

/// The Sandbox's existing pod: its own (metadata kept in step), or one it may adopt.
fn own_pod(s: &Arc<Shared>, sb: &Value, pod: &Value) -> Result<Value, ApiError> {
    let uid = meta(sb, "uid");
    let mut adopt = false;
    match controller_of(pod) {
        Some(r) if r["uid"] == uid => {}
        Some(r) => {
            return Err(ApiError::bad_request(format!(
                "pod {:?} is owned by {}/{} (UID: {}), not by sandbox {:?}",
                meta(pod, "name"),
                r["kind"].as_str().unwrap_or(""),
                r["name"].as_str().unwrap_or(""),
                r["uid"].as_str().unwrap_or(""),
                meta(sb, "name")
            )));
        }
        None => {
            let labels = &pod["metadata"]["labels"];
            let hash = name_hash(meta(sb, "name"));
            if labels[ADOPTABLE] != "true" && labels[NAME_HASH] != hash.as_str() {
                return Err(ApiError::bad_request(format!(
                    "cannot adopt unowned pod {:?}: missing required pool authorization label ({ADOPTABLE:?}) or sandbox tracking label ({NAME_HASH:?})",
                    meta(pod, "name")
                )));
            }
            adopt = true;
        }
    }
    let change = pod_metadata_in_step(pod, sb);
    if !adopt && change.is_none() {
        return Ok(pod.clone());
    }
    let sandbox_ref = owner_ref(sb, Kind::Sandbox);
    let changed = update(s, Kind::Pod, pod, |n| {
        if adopt {
            let refs = n["metadata"]["ownerReferences"].as_array().cloned().unwrap_or_default();
            let mut refs: Vec<Value> = refs.into_iter().filter(|r| r["uid"] != sandbox_ref["uid"]).collect();
            refs.push(sandbox_ref);
            n["metadata"]["ownerReferences"] = json!(refs);
        }
        if let Some((l, a)) = change {
            n["metadata"]["labels"] = map_value(&l);
            n["metadata"]["annotations"] = map_value(&a);
        }
        Ok(())
    })?;
    s.kubelet.changed(&changed);
    Ok(changed)
}

/// upstream's computeReadyCondition, without Services.
fn ready_condition(sb: &Value, pod: Option<&Value>, error: Option<&str>, suspended: bool) -> Value {
    let generation = &sb["metadata"]["generation"];
    if let Some(e) = error {
        return condition(
            "Ready",
            false,
            "ReconcilerError",
            &format!("Error seen: {e}"),
            generation,
        );
    }
    if suspended {
        let m = if pod.is_some() {
            "Sandbox is suspending"
        } else {
            "Sandbox is suspended"
        };
        return condition("Ready", false, "SandboxSuspended", m, generation);
    }
    let Some(p) = pod else {
        return condition("Ready", false, "DependenciesNotReady", "Pod does not exist", generation);
    };
    let phase = p["status"]["phase"].as_str().unwrap_or("");
    match phase {
        "Succeeded" => return condition("Ready", false, "PodSucceeded", "Pod completed successfully", generation),
        "Failed" => return condition("Ready", false, "PodFailed", "Pod failed", generation),
        _ => {}
    }
    let mut message = format!("Pod exists with phase: {phase}");
    let mut ready = false;
    if phase == "Running" {
        message = "Pod is Running but not Ready".into();
        let pod_ready = p["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
            .is_some_and(|c| c["status"] == "True");
        if pod_ready {
            if pod_ips(p).is_empty() {
                message = "Pod is Ready but has no podIPs yet".into();
            } else {
                message = "Pod is Ready".into();
                ready = true;
            }
        }
    }
    if spec_wants_service(sb) {
        // No Service is ever made here: a Sandbox asking one is never Ready, as upstream's
        // would not be without its Service.
        message.push_str("; Service does not exist");
        ready = false;
    }
    if ready {
        condition("Ready", true, "DependenciesReady", &message, generation)
    } else {
        condition("Ready", false, "DependenciesNotReady", &message, generation)
    }
}

fn spec_wants_service(sb: &Value) -> bool {
    sb["spec"]["service"] == true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_hash_is_upstreams_fnv1a() {
        // FNV-1a 32 of "" is the offset basis; of "a" the published test vector.
        assert_eq!(name_hash(""), "811c9dc5");
        assert_eq!(name_hash("a"), "e40c292c");
        assert_eq!(name_hash("foobar"), "bf9cf968");
    }

    #[test]
    fn additional_pod_metadata_is_validated_as_upstream() {
        assert!(validate_additional(&json!({"labels": {"sandbox.users.io/x": "1"}})).is_ok());
        assert!(validate_additional(&json!({"labels": {"team.sandbox.users.io/x": "1"}})).is_ok());
        let e = validate_additional(&json!({"labels": {"agentbox": "1"}})).unwrap_err();
        assert!(e.contains("must have a domain prefix"), "{e}");
        let e = validate_additional(&json!({"labels": {"example.com/x": "1"}})).unwrap_err();
        assert!(e.contains("not in the allowlist"), "{e}");
        let e = validate_additional(&json!({"annotations": {"agents.x-k8s.io/x": "1"}})).unwrap_err();
        assert!(e.contains("restricted system domain"), "{e}");
        assert!(validate_additional(&json!({"annotations": {SAFE_TO_EVICT: "false", "note": "x"}})).is_ok());
    }

    #[test]
    fn a_shutdown_time_is_reached_or_not() {
        assert!(expired(&json!("2000-01-01T00:00:00Z")));
        assert!(!expired(&json!("2999-01-01T00:00:00+02:00")));
        assert!(!expired(&Value::Null));
    }
}

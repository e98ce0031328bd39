//! The writes: a pod's create (defaults, validation, admission) and the kinds only stored's
//! ([`Kind::STORED`]: defaults and validation, as the real server's), their patches, and
//! deletes one by one or by collection.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::api::{ApiResult, Query, Shared, body_json, ok};
use super::discovery::strip_kind;
use super::patch::{json_patch, patched};
use super::reads::Selection;
use crate::kube::status::{ApiError, Cause, json_response};
use crate::kube::store::{Inner, Kind, now_rfc3339};
use crate::kube::{patch, storage, validate};

/// The object's namespace, if it names one, must be the path's.
pub(crate) fn check_namespace(obj: &Value, ns: &str) -> Result<(), ApiError> {
    match obj["metadata"]["namespace"].as_str() {
        Some(n) if !n.is_empty() && n != ns => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => Ok(()),
    }
}

pub(crate) fn check_kind(obj: &Value, kind: Kind) -> Result<(), ApiError> {
    if let Some(k) = obj.get("kind").and_then(Value::as_str)
        && k != kind.kind()
    {
        return Err(ApiError::bad_request(format!(
            "{} in version {:?} cannot be handled as a {}: the object's kind is {k:?}",
            kind.kind(),
            kind.api_version(),
            kind.kind()
        )));
    }
    if let Some(v) = obj.get("apiVersion").and_then(Value::as_str)
        && v != kind.api_version()
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({v}) does not match the expected API version ({})",
            kind.api_version()
        )));
    }
    Ok(())
}

/// Set `o[k]` to `v` where it is absent, null or empty, as Go's defaulting fills a zero value.
fn fill(o: &mut Value, k: &str, v: Value) {
    if o.get(k).is_none_or(|x| x.is_null() || x == "") {
        o[k] = v;
    }
}

/// `parent[key]`, made an object where it is none.
fn object_at<'a>(parent: &'a mut Value, key: &str) -> &'a mut Value {
    let v = &mut parent[key];
    if !v.is_object() {
        *v = json!({});
    }
    v
}

/// What the real server fills in a new pod before it validates it: a pod template's
/// defaults, then what a pod alone gets (its service links, and the priority admission's).
pub(super) fn pod_defaults(pod: &mut Value) {
    template_defaults(pod);
    let spec = &mut pod["spec"];
    fill(spec, "enableServiceLinks", json!(true));
    fill(spec, "preemptionPolicy", json!("PreemptLowerPriority"));
    fill(spec, "priority", json!(0));
}

/// What the real server fills in a pod template (`metadata` and `spec`; a Deployment's
/// `spec.template`, or a pod) before it validates it.
fn template_defaults(pod: &mut Value) {
    object_at(pod, "metadata");
    let spec = object_at(pod, "spec");
    for (k, v) in [
        ("restartPolicy", json!("Always")),
        ("dnsPolicy", json!("ClusterFirst")),
        ("schedulerName", json!("default-scheduler")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("securityContext", json!({})),
    ] {
        fill(spec, k, v);
    }
    if let Some(cs) = spec["containers"].as_array_mut() {
        for c in cs {
            if !c.is_object() {
                continue;
            }
            let image = c["image"].as_str().unwrap_or("").to_string();
            let tagged = image
                .rsplit('/')
                .next()
                .is_some_and(|last| last.contains(':') || last.contains('@'));
            let latest = !tagged || image.ends_with(":latest");
            for (k, v) in [
                ("imagePullPolicy", json!(if latest { "Always" } else { "IfNotPresent" })),
                ("terminationMessagePath", json!("/dev/termination-log")),
                ("terminationMessagePolicy", json!("File")),
                ("resources", json!({})),
            ] {
                if c.get(k).is_none_or(|x| x.is_null() || x == "") {
                    c[k] = v;
                }
            }
        }
    }
    if let Some(vs) = spec["volumes"].as_array_mut() {
        for v in vs {
            if let Some(d) = v.get_mut("secret").filter(|d| d.is_object())
                && d.get("defaultMode").is_none_or(Value::is_null)
            {
                d["defaultMode"] = json!(420);
            }
            if let Some(h) = v.get_mut("hostPath").filter(|h| h.is_object())
                && h.get("type").is_none_or(Value::is_null)
            {
                h["type"] = json!("");
            }
            if let Some(d) = v.get_mut("downwardAPI").filter(|d| d.is_object()) {
                if d.get("defaultMode").is_none() {
                    d["defaultMode"] = json!(420);
                }
                if let Some(items) = d["items"].as_array_mut() {
                    for i in items {
                        if let Some(f) = i.get_mut("fieldRef").filter(|f| f.is_object())
                            && f.get("apiVersion").is_none()
                        {
                            f["apiVersion"] = json!("v1");
                        }
                    }
                }
            }
        }
    }
}

pub(crate) fn name_for_errors(obj: &Value) -> String {
    obj["metadata"]["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        .or(obj["metadata"]["generateName"].as_str())
        .unwrap_or("")
        .to_string()
}

pub(super) async fn create_pod(s: &Arc<Shared>, ns: &str, req: Request) -> ApiResult {
    let (_, pod) = body_json(req).await?;
    validate::pod_decodes(&pod).map_err(ApiError::bad_request)?;
    check_kind(&pod, Kind::Pod)?;
    check_namespace(&pod, ns)?;
    let pod = admit_pod(s, ns, pod)?;
    Ok(json_response(StatusCode::CREATED, &pod))
}

/// Drop what only the server sets from a new object's metadata (`uid`, `resourceVersion`,
/// timestamps, `managedFields`, `selfLink`, and `extra`), as the real server ignores them on
/// create.
pub(crate) fn clear_server_fields(obj: &mut Value, extra: &[&str]) {
    if let Some(m) = obj["metadata"].as_object_mut() {
        for k in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "managedFields",
            "selfLink",
        ]
        .iter()
        .chain(extra)
        {
            m.remove(*k);
        }
    }
}

/// A new pod as the API admits one (defaults, validation, the fake's own limits), stored and
/// handed to the kubelet: a client's, or one agent-sandbox's controller makes.
pub(crate) fn admit_pod(s: &Arc<Shared>, ns: &str, mut pod: Value) -> Result<Value, ApiError> {
    validate::pod_decodes(&pod).map_err(ApiError::bad_request)?;
    pod_defaults(&mut pod);
    let mut causes = validate::pod(&pod);
    // The fake's own limits, refused rather than run as something else (see `kubelet`).
    if pod["spec"]["containers"].as_array().is_some_and(|c| c.len() > 1) {
        causes.push(Cause::forbidden(
            "spec.containers",
            "the agentbox fake runs one container per pod (each pod is one namespace box)",
        ));
    }
    if pod["spec"]["initContainers"].as_array().is_some_and(|c| !c.is_empty()) {
        causes.push(Cause::forbidden(
            "spec.initContainers",
            "the agentbox fake runs no init containers",
        ));
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid("Pod", "", &name_for_errors(&pod), causes));
    }
    pod["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
    crate::kube::api::clear_server_fields(&mut pod, &[]);
    let pod = s.store.create(Kind::Pod, ns, pod)?;
    s.kubelet.start(s.store.clone(), &pod);
    Ok(pod)
}

/// POST of a kind only stored ([`Kind::STORED`]), as the real server admits one: what only
/// the server sets dropped, the kind's defaults filled, validated (422 with the real
/// messages), `status` the server's own (a Deployment's `{}`, a Service's empty load
/// balancer), `generation` 1 where the real strategy counts them (Deployments,
/// NetworkPolicies), a Service's cluster IP allocated. Then stored, and acted on by nothing
/// (the kubelet reads NetworkPolicies as pods start).
pub(super) async fn create_stored(s: &Arc<Shared>, kind: Kind, ns: &str, req: Request) -> ApiResult {
    let (_, mut obj) = body_json(req).await?;
    if !obj.is_object() {
        return Err(ApiError::bad_request("the body is not a JSON object"));
    }
    check_kind(&obj, kind)?;
    check_namespace(&obj, ns)?;
    object_at(&mut obj, "metadata");
    clear_server_fields(&mut obj, &["generation"]);
    stored_defaults(kind, &mut obj);
    let causes = validate::stored(kind, &obj);
    if !causes.is_empty() {
        return Err(ApiError::invalid(
            kind.kind(),
            kind.group(),
            &name_for_errors(&obj),
            causes,
        ));
    }
    match kind {
        Kind::Deployment => obj["status"] = json!({}),
        Kind::Service => obj["status"] = json!({"loadBalancer": {}}),
        _ => {}
    }
    if matches!(kind, Kind::Deployment | Kind::NetworkPolicy) {
        obj["metadata"]["generation"] = json!(1);
    }
    let made = s.store.create_with(kind, ns, obj, |i, o| match kind {
        Kind::Service => cluster_ip(i, o),
        _ => Ok(()),
    })?;
    Ok(json_response(StatusCode::CREATED, &made))
}

/// A patch of a kind only stored (merge, strategic without directives, or JSON patch, as
/// `kubectl apply` and `label` send them), then defaulted and validated again as the real
/// server decodes and validates an update, with what an update may not change (a
/// Deployment's selector, a RoleBinding's roleRef, a Service's cluster IPs). `status` and
/// what the server set are kept (a Service's cluster IPs too, where the patch leaves them
/// out); `generation` rises when the spec changes (a Deployment's annotations too, which
/// its ReplicaSets copy).
pub(super) async fn patch_stored(s: &Arc<Shared>, kind: Kind, ns: &str, name: &str, req: Request) -> ApiResult {
    let (ct, p) = body_json(req).await?;
    s.store
        .update(kind, ns, name, None, |old| {
            let mut new = patched(old, &ct, &p)?;
            let server_set: &[&str] = match kind {
                Kind::Deployment | Kind::Service => &["status"],
                _ => &[],
            };
            for k in server_set {
                new[*k] = old[*k].clone();
            }
            for k in ["creationTimestamp", "generation"] {
                match old["metadata"].get(k) {
                    Some(v) => new["metadata"][k] = v.clone(),
                    None => {
                        new["metadata"].as_object_mut().map(|m| m.remove(k));
                    }
                }
            }
            if kind == Kind::Service {
                for k in ["clusterIP", "clusterIPs"] {
                    let left_out = new["spec"]
                        .get(k)
                        .is_none_or(|v| v.is_null() || v == "" || v.as_array().is_some_and(Vec::is_empty));
                    if left_out && let Some(v) = old["spec"].get(k) {
                        new["spec"][k] = v.clone();
                    }
                }
            }
            stored_defaults(kind, &mut new);
            let mut causes = validate::stored(kind, &new);
            causes.extend(validate::stored_update(kind, old, &new));
            if !causes.is_empty() {
                return Err(ApiError::invalid(kind.kind(), kind.group(), name, causes));
            }
            for k in ["labels", "annotations"] {
                if new["metadata"][k].as_object().is_some_and(|m| m.is_empty()) {
                    new["metadata"].as_object_mut().map(|m| m.remove(k));
                }
            }
            let annotated =
                kind == Kind::Deployment && new["metadata"]["annotations"] != old["metadata"]["annotations"];
            if (new["spec"] != old["spec"] || annotated)
                && let Some(g) = old["metadata"]["generation"].as_i64()
            {
                new["metadata"]["generation"] = json!(g + 1);
            }
            Ok(new)
        })
        .map(ok)
}

/// What the real server fills in an object of a kind only stored before it validates it
/// (its `SetDefaults_*`), at create and at every patch.
fn stored_defaults(kind: Kind, obj: &mut Value) {
    match kind {
        // Ingress, and Egress where there are egress rules.
        Kind::NetworkPolicy if obj["spec"]["policyTypes"].as_array().is_none_or(Vec::is_empty) => {
            let mut types = vec![json!("Ingress")];
            if obj["spec"]["egress"].as_array().is_some_and(|e| !e.is_empty()) {
                types.push(json!("Egress"));
            }
            object_at(obj, "spec")["policyTypes"] = json!(types);
        }
        Kind::Deployment => {
            let spec = object_at(obj, "spec");
            fill(spec, "replicas", json!(1));
            fill(spec, "revisionHistoryLimit", json!(10));
            fill(spec, "progressDeadlineSeconds", json!(600));
            let strategy = object_at(spec, "strategy");
            fill(strategy, "type", json!("RollingUpdate"));
            if strategy["type"] == "RollingUpdate" {
                let rolling = object_at(strategy, "rollingUpdate");
                fill(rolling, "maxUnavailable", json!("25%"));
                fill(rolling, "maxSurge", json!("25%"));
            }
            template_defaults(object_at(spec, "template"));
        }
        Kind::Service => {
            let spec = object_at(obj, "spec");
            fill(spec, "type", json!("ClusterIP"));
            fill(spec, "sessionAffinity", json!("None"));
            if spec["sessionAffinity"] == "ClientIP" {
                let client = object_at(object_at(spec, "sessionAffinityConfig"), "clientIP");
                fill(client, "timeoutSeconds", json!(10800));
            }
            if spec["type"] != "ExternalName" {
                fill(spec, "internalTrafficPolicy", json!("Cluster"));
            }
            for p in spec["ports"].as_array_mut().into_iter().flatten() {
                if p.is_object() {
                    fill(p, "protocol", json!("TCP"));
                    if p.get("targetPort").is_none_or(|t| t.is_null() || t == 0 || t == "") {
                        p["targetPort"] = p["port"].clone();
                    }
                }
            }
        }
        Kind::RoleBinding => {
            for subject in obj["subjects"].as_array_mut().into_iter().flatten() {
                if subject.is_object() && matches!(subject["kind"].as_str(), Some("User" | "Group")) {
                    fill(subject, "apiGroup", json!("rbac.authorization.k8s.io"));
                }
            }
        }
        _ => {}
    }
}

/// A new Service's cluster IP as the real server's allocator sets it: none for
/// ExternalName; `None` (headless) or an address the client gave, kept; else the first free
/// address of 10.96.0.0/16 from 10.96.0.11, where the real allocator picks one at random in
/// the cluster's service range (kubeadm's 10.96.0.0/12, its .1 the `kubernetes` Service's and
/// its .10 the DNS's). Single-stack IPv4. Called under the store's lock, so no two Services
/// get one address.
fn cluster_ip(i: &Inner, svc: &mut Value) -> Result<(), ApiError> {
    let spec = &mut svc["spec"];
    if spec["type"] == "ExternalName" {
        return Ok(());
    }
    let ip = match spec["clusterIP"].as_str().filter(|ip| !ip.is_empty()) {
        Some(ip) => ip.to_string(),
        None => {
            let taken: std::collections::BTreeSet<String> = i
                .objects(Kind::Service, None)
                .iter()
                .filter_map(|s| s["spec"]["clusterIP"].as_str().map(str::to_string))
                .collect();
            (11..=0xffffu32)
                .map(|n| format!("10.96.{}.{}", n >> 8, n & 0xff))
                .find(|ip| !taken.contains(ip))
                .ok_or_else(|| ApiError::internal("failed to allocate a serviceIP: range is full"))?
        }
    };
    spec["clusterIPs"] = json!([ip]);
    spec["clusterIP"] = json!(ip);
    spec["ipFamilies"] = json!(["IPv4"]);
    spec["ipFamilyPolicy"] = json!("SingleStack");
    Ok(())
}

pub(super) async fn patch_pod(s: &Arc<Shared>, ns: &str, name: &str, req: Request) -> ApiResult {
    let (ct, p) = body_json(req).await?;
    patch_pod_with(s, ns, name, &ct, &p).map(ok)
}

/// A patch of a pod's main resource under the real update rules, the kubelet told of it.
pub(crate) fn patch_pod_with(s: &Arc<Shared>, ns: &str, name: &str, ct: &str, p: &Value) -> Result<Value, ApiError> {
    let p = p.clone();
    let changed = s.store.update(Kind::Pod, ns, name, None, |old| {
        let mut new = match ct {
            "application/merge-patch+json" => {
                let mut n = old.clone();
                patch::merge(&mut n, &p);
                n
            }
            "application/strategic-merge-patch+json" => {
                if let Some(d) = patch::directive(&p) {
                    return Err(ApiError::bad_request(format!(
                        "the agentbox fake applies strategic merge patches without directives: {d} is not supported"
                    )));
                }
                let mut n = old.clone();
                patch::merge(&mut n, &p);
                n
            }
            "application/json-patch+json" => json_patch(old, &p)?,
            other => return Err(ApiError::unsupported_media_type(other)),
        };
        validate::pod_decodes(&new).map_err(ApiError::bad_request)?;
        // The main resource's patch leaves status as it is, and what the server keeps.
        new["status"] = old["status"].clone();
        new["kind"] = old["kind"].clone();
        new["apiVersion"] = old["apiVersion"].clone();
        if let Some(rv) = p.pointer("/metadata/resourceVersion").and_then(Value::as_str)
            && Some(rv) != old["metadata"]["resourceVersion"].as_str()
        {
            return Err(ApiError {
                code: 409,
                reason: "Conflict",
                details: Some(json!({"name": name, "kind": "pods"})),
                ..ApiError::bad_request(format!(
                    "Operation cannot be fulfilled on pods {name:?}: the object has been modified; please apply your changes to the latest version and try again"
                ))
            });
        }
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if new["metadata"]["labels"].as_object().is_some_and(|m| m.is_empty()) {
            new["metadata"].as_object_mut().map(|m| m.remove("labels"));
        }
        if new["metadata"]["annotations"].as_object().is_some_and(|m| m.is_empty()) {
            new["metadata"].as_object_mut().map(|m| m.remove("annotations"));
        }
        let causes = validate::pod_update(old, &new);
        if !causes.is_empty() {
            return Err(ApiError::invalid("Pod", "", name, causes));
        }
        Ok(new)
    })?;
    s.kubelet.changed(&changed);
    Ok(changed)
}

/// Delete one object: a pod is marked (MODIFIED, with its deletionTimestamp), its box ended,
/// then removed (DELETED), and answered as it was marked; a claim it kept from going goes
/// then. A claim is marked and goes once no pod keeps it (`storage`).
pub(crate) async fn delete_one(s: &Arc<Shared>, kind: Kind, ns: &str, name: &str) -> Result<Value, ApiError> {
    if kind == Kind::PersistentVolumeClaim {
        return storage::delete_claim(s, ns, name);
    }
    let obj = s.store.get(kind, ns, name).ok_or_else(|| kind.not_found(name))?;
    if kind == Kind::Pod {
        let uid = obj["metadata"]["uid"].as_str().unwrap_or("").to_string();
        let marked = s.store.update(kind, ns, name, Some(&uid), |old| {
            let mut n = old.clone();
            n["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
            n["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            Ok(n)
        })?;
        s.kubelet.stop(&uid).await;
        let gone = s.store.delete(kind, ns, name)?;
        let _ = gone;
        storage::release_claims(&s.store, &s.kubelet.volumes, ns);
        return Ok(marked);
    }
    s.store.delete(kind, ns, name)
}

pub(super) async fn delete_collection(s: &Arc<Shared>, kind: Kind, ns: &str, q: &Query) -> ApiResult {
    let sel = Selection::of(kind, q)?;
    let targets: Vec<String> = {
        let i = s.store.lock();
        i.objects(kind, Some(ns))
            .into_iter()
            .filter(|o| sel.matches(o))
            .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
            .collect()
    };
    let mut items = Vec::new();
    for name in targets {
        match delete_one(s, kind, ns, &name).await {
            Ok(o) => items.push(strip_kind(&o)),
            // Deleted by another request meanwhile.
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let rv = s.store.lock().rv();
    Ok(ok(json!({
        "kind": format!("{}List", kind.kind()),
        "apiVersion": kind.api_version(),
        "metadata": {"resourceVersion": rv.to_string()},
        "items": items,
    })))
}

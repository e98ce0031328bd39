//! Discovery as the real server answers it: the version, the API groups and their resources, and
//! the OpenAPI documents kubectl reads.

use serde_json::{Value, json};

use super::api::MINOR;
use crate::kube::store::Kind;

pub(super) fn version() -> Value {
    json!({
        "major": "1",
        "minor": MINOR,
        "emulationMajor": "1",
        "emulationMinor": MINOR,
        "gitVersion": format!("v1.{MINOR}.0-agentbox-fake"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// The OpenAPI v3 documents' version, for clients that cache them by it.
pub(super) const OPENAPI_HASH: &str = "agentbox-fake-1";

/// A group version's OpenAPI v3 document, with as much as kubectl reads of it: each kind's
/// patch operation, its `x-kubernetes-group-version-kind` and that it takes
/// `fieldValidation`, from which kubectl concludes the server validates (so it downloads no
/// schema to validate with itself). No schemas: `kubectl explain` has nothing to explain.
pub(super) fn openapi(prefix: &str, group: &str, version: &str, kinds: &[Kind]) -> Value {
    let query = |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}});
    let mut paths = serde_json::Map::new();
    for kind in kinds {
        let gvk = json!({"group": group, "version": version, "kind": kind.kind()});
        let item = format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", kind.resource());
        let collection = format!("{prefix}/namespaces/{{namespace}}/{}", kind.resource());
        let op = |verb: &str| {
            json!({
                "operationId": format!("{verb}Namespaced{}", kind.kind()),
                "x-kubernetes-action": verb,
                "x-kubernetes-group-version-kind": gvk,
                "parameters": [query("dryRun"), query("fieldManager"), query("fieldValidation")],
                "responses": {"200": {"description": "OK"}},
            })
        };
        paths.insert(collection, json!({"post": op("post")}));
        paths.insert(item, json!({"patch": op("patch")}));
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v1.{MINOR}.0")},
        "paths": paths,
        "components": {"schemas": {}},
    })
}

/// The built-in API groups besides the core one, served at v1 alone, whose kinds are only
/// stored ([`Kind::STORED`]), in the order the real server lists them.
pub(super) const GROUPS: [&str; 3] = ["apps", "networking.k8s.io", "rbac.authorization.k8s.io"];

/// A built-in group's entry in `/apis` (and, with kind and apiVersion, `/apis/GROUP`).
pub(super) fn group(g: &str) -> Value {
    let v = json!({"groupVersion": format!("{g}/v1"), "version": "v1"});
    json!({"name": g, "versions": [v], "preferredVersion": v})
}

/// The verbs of what the fake stores: all but update, since it takes no PUT.
const SERVED: [&str; 7] = ["create", "delete", "deletecollection", "get", "list", "patch", "watch"];

/// A kind only stored as its group version's list names it: its short names, and the `all`
/// category of those `kubectl get all` shows.
fn stored_resource(kind: Kind) -> Value {
    let mut r = resource(kind.resource(), kind.singular(), true, kind.kind(), &SERVED);
    if !kind.short_names().is_empty() {
        r["shortNames"] = json!(kind.short_names());
    }
    if matches!(kind, Kind::Service | Kind::Deployment) {
        r["categories"] = json!(["all"]);
    }
    r
}

/// `/apis/GROUP/v1` of a built-in group: its kinds only stored, without their subresources
/// (no `status`, `scale` or `proxy`).
pub(super) fn group_resources(g: &str) -> Value {
    let resources: Vec<Value> = Kind::STORED
        .into_iter()
        .filter(|k| k.group() == g)
        .map(stored_resource)
        .collect();
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{g}/v1"), "resources": resources})
}

pub(crate) fn resource(name: &str, singular: &str, namespaced: bool, kind: &str, verbs: &[&str]) -> Value {
    json!({"name": name, "singularName": singular, "namespaced": namespaced, "kind": kind, "verbs": verbs})
}

pub(super) fn core_resources() -> Value {
    let mut pods = resource(
        "pods",
        "pod",
        true,
        "Pod",
        &["create", "delete", "deletecollection", "get", "list", "patch", "watch"],
    );
    pods["shortNames"] = json!(["po"]);
    pods["categories"] = json!(["all"]);
    let mut ns = resource("namespaces", "namespace", false, "Namespace", &["get", "list"]);
    ns["shortNames"] = json!(["ns"]);
    let mut pvc = resource(
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        true,
        "PersistentVolumeClaim",
        &SERVED,
    );
    pvc["shortNames"] = json!(["pvc"]);
    let secrets = resource("secrets", "secret", true, "Secret", &SERVED);
    let mut resources = vec![
        ns,
        pvc,
        pods,
        resource("pods/exec", "", true, "PodExecOptions", &["create", "get"]),
        resource("pods/log", "", true, "Pod", &["get"]),
        resource(
            "pods/portforward",
            "",
            true,
            "PodPortForwardOptions",
            &["create", "get"],
        ),
        secrets,
    ];
    resources.extend(
        Kind::STORED
            .into_iter()
            .filter(|k| k.group().is_empty())
            .map(stored_resource),
    );
    json!({"kind": "APIResourceList", "groupVersion": "v1", "resources": resources})
}

/// A list's items carry no kind or apiVersion, as the real server writes them.
pub(crate) fn strip_kind(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("kind");
        o.remove("apiVersion");
    }
    v
}

//! The REST side: authentication, throttling, discovery, and the resources (namespaces,
//! pods, pods' logs, PersistentVolumeClaims, Secrets, NetworkPolicies) with list, watch,
//! create, patch and delete, answered in the real server's shapes. The WebSockets (exec,
//! port-forward) are `stream`'s; what claims and secrets are made of, `storage`'s.
//!
//! Routing is one match over the path's segments rather than a router's table: every
//! resource path is `/api/v1/...` or `/apis/GROUP/VERSION/...` with the same shape, the
//! real server's bare 404 answers anything else, and a known path asked with a method it
//! does not serve is 405.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::kube::kubelet::Kubelet;
use crate::kube::patch;
use crate::kube::sandbox;
use crate::kube::selector::{FieldSelector, LabelSelector, labels_of};
use crate::kube::status::{ApiError, Cause, json_response};
use crate::kube::storage;
use crate::kube::store::{Event, Kind, Store, now_rfc3339};
use crate::kube::validate;

/// The largest request body read, as the real server's limit (3 MiB).
const MAX_BODY: usize = 3 << 20;

/// A watch with no `timeoutSeconds` ends after this long (the real server picks 30 to 60
/// minutes); a client watches again.
const WATCH_DEFAULT: Duration = Duration::from_secs(30 * 60);

/// The version `/version` answers: kubectl warns past one minor version of skew.
pub(crate) const MINOR: &str = "35";

/// What every request handler shares.
pub(crate) struct Shared {
    pub(crate) token: String,
    pub(crate) store: Arc<Store>,
    pub(crate) kubelet: Arc<Kubelet>,
    /// How many of the next requests answer 429.
    pub(crate) throttle: AtomicU32,
    /// Whether exec offers `v5.channel.k8s.io`.
    pub(crate) v5: bool,
    /// Whether agent-sandbox's CRDs and controllers are installed (`sandbox`).
    pub(crate) agent_sandbox: bool,
    pub(crate) addr: SocketAddr,
}

pub(crate) type ApiResult = Result<Response, ApiError>;

pub(crate) use crate::shared::Query;

/// Kubernetes' reading of a query's booleans.
pub(crate) trait Flag {
    /// A boolean as Go's `strconv.ParseBool` reads it (the Python client sends `True`).
    fn flag(&self, k: &str) -> Result<bool, ApiError>;
}

impl Flag for Query {
    fn flag(&self, k: &str) -> Result<bool, ApiError> {
        match self.get(k) {
            None | Some("") => Ok(false),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(v) => Err(ApiError::bad_request(format!(
                "strconv.ParseBool: parsing {v:?}: invalid syntax (query parameter {k:?})"
            ))),
        }
    }
}

/// Every request: the token, then the throttle, then the route.
pub(crate) async fn dispatch(State(s): State<Arc<Shared>>, req: Request) -> Response {
    if !authorized(&s.token, req.headers().get(header::AUTHORIZATION)) {
        return ApiError::unauthorized().into_response();
    }
    if s.throttle
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        return ApiError::too_many_requests().into_response();
    }
    match route(s, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// `Bearer TOKEN`, compared in time that does not depend on where it differs.
fn authorized(token: &str, got: Option<&HeaderValue>) -> bool {
    let Some(got) = got
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    let (a, b) = (got.trim().as_bytes(), token.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn route(s: Arc<Shared>, req: Request) -> ApiResult {
    let path = req.uri().path().to_string();
    let seg: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let m = req.method().clone();
    let q = Query::of(&req);
    let get = m == Method::GET;
    match seg.as_slice() {
        ["version"] if get => Ok(ok(version())),
        ["api"] if get => Ok(ok(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": s.addr.to_string()}],
        }))),
        ["api", "v1"] if get => Ok(ok(core_resources())),
        ["apis"] if get => {
            let mut groups = vec![networking_group()];
            if s.agent_sandbox {
                groups.extend(sandbox::GROUPS.iter().map(|g| sandbox::group(g)));
            }
            Ok(ok(
                json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
            ))
        }
        ["apis", g] if get && s.agent_sandbox && sandbox::GROUPS.contains(g) => {
            let mut v = sandbox::group(g);
            v["kind"] = json!("APIGroup");
            v["apiVersion"] = json!("v1");
            Ok(ok(v))
        }
        ["apis", g, sandbox::VERSION] if get && s.agent_sandbox && sandbox::GROUPS.contains(g) => {
            Ok(ok(sandbox::resources(g)))
        }
        ["openapi", "v3", "apis", g, sandbox::VERSION] if get && s.agent_sandbox && sandbox::GROUPS.contains(g) => {
            let kinds: Vec<Kind> = Kind::SANDBOX_KINDS.into_iter().filter(|k| k.group() == *g).collect();
            Ok(ok(openapi(
                &format!("/apis/{g}/{}", sandbox::VERSION),
                g,
                sandbox::VERSION,
                &kinds,
            )))
        }
        ["apis", g, sandbox::VERSION, plural] if get && s.agent_sandbox && Kind::custom(g, plural).is_some() => {
            let kind = Kind::custom(g, plural).ok_or_else(ApiError::no_route)?;
            list(&s, kind, None, &q)
        }
        ["apis", g, sandbox::VERSION, "namespaces", ns, plural, rest @ ..]
            if s.agent_sandbox && Kind::custom(g, plural).is_some() && rest.len() <= 2 =>
        {
            let kind = Kind::custom(g, plural).ok_or_else(ApiError::no_route)?;
            let ns = ns.to_string();
            match (rest, &m) {
                ([], &Method::GET) => list(&s, kind, Some(&ns), &q),
                ([], &Method::POST) => {
                    let (_, obj) = body_json(req).await?;
                    check_kind(&obj, kind)?;
                    check_namespace(&obj, &ns)?;
                    let made = sandbox::admit(&s, kind, &ns, obj)?;
                    Ok(json_response(StatusCode::CREATED, &made))
                }
                ([], &Method::DELETE) => delete_collection(&s, kind, &ns, &q).await,
                ([name], &Method::GET) => s.store.get(kind, &ns, name).map(ok).ok_or_else(|| kind.not_found(name)),
                ([name], &Method::PATCH) => {
                    let name = name.to_string();
                    let (ct, p) = body_json(req).await?;
                    sandbox::patch(&s, kind, &ns, &name, &ct, &p, false).map(ok)
                }
                ([name], &Method::DELETE) => delete_one(&s, kind, &ns, name).await.map(ok),
                ([name, "status"], &Method::GET) if kind.has_status() => {
                    s.store.get(kind, &ns, name).map(ok).ok_or_else(|| kind.not_found(name))
                }
                ([name, "status"], &Method::PATCH) if kind.has_status() => {
                    let name = name.to_string();
                    let (ct, p) = body_json(req).await?;
                    sandbox::patch(&s, kind, &ns, &name, &ct, &p, true).map(ok)
                }
                ([_], _) | ([], _) => Err(ApiError::method_not_allowed()),
                _ => Err(ApiError::no_route()),
            }
        }
        ["apis", "networking.k8s.io"] if get => Ok(ok(json!({"kind": "APIGroup", "apiVersion": "v1"})
            .as_object()
            .map(|o| {
                let mut g = networking_group();
                for (k, v) in o {
                    g[k] = v.clone();
                }
                g
            })
            .unwrap_or_default())),
        ["apis", "networking.k8s.io", "v1"] if get => Ok(ok(networking_resources())),
        ["openapi", "v3"] if get => {
            let mut paths = json!({
                "api/v1": {"serverRelativeURL": format!("/openapi/v3/api/v1?hash={OPENAPI_HASH}")},
                "apis/networking.k8s.io/v1": {"serverRelativeURL": format!("/openapi/v3/apis/networking.k8s.io/v1?hash={OPENAPI_HASH}")},
            });
            if s.agent_sandbox {
                for g in sandbox::GROUPS {
                    let gv = format!("apis/{g}/{}", sandbox::VERSION);
                    paths[&gv] = json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={OPENAPI_HASH}")});
                }
            }
            Ok(ok(json!({ "paths": paths })))
        }
        ["openapi", "v3", "api", "v1"] if get => Ok(ok(openapi(
            "/api/v1",
            "",
            "v1",
            &[Kind::Pod, Kind::PersistentVolumeClaim, Kind::Secret],
        ))),
        ["openapi", "v3", "apis", "networking.k8s.io", "v1"] if get => Ok(ok(openapi(
            "/apis/networking.k8s.io/v1",
            "networking.k8s.io",
            "v1",
            &[Kind::NetworkPolicy],
        ))),
        ["api", "v1", "namespaces"] if get => {
            let i = s.store.lock();
            let items: Vec<Value> = i.namespaces().map(strip_kind).collect();
            Ok(ok(
                json!({"kind": "NamespaceList", "apiVersion": "v1", "metadata": {"resourceVersion": i.rv().to_string()}, "items": items}),
            ))
        }
        ["api", "v1", "namespaces", ns] if get => s
            .store
            .lock()
            .namespace(ns)
            .cloned()
            .map(ok)
            .ok_or_else(|| ApiError::not_found("namespaces", "", ns)),
        ["api", "v1", "pods"] if get => list(&s, Kind::Pod, None, &q),
        ["api", "v1", plural @ ("persistentvolumeclaims" | "secrets")] if get => {
            list(&s, storage_kind(plural), None, &q)
        }
        [
            "api",
            "v1",
            "namespaces",
            ns,
            plural @ ("persistentvolumeclaims" | "secrets"),
        ] => {
            let (ns, kind) = (ns.to_string(), storage_kind(plural));
            match (m, kind) {
                (Method::GET, _) => list(&s, kind, Some(&ns), &q),
                (Method::POST, Kind::Secret) => storage::create_secret(&s, &ns, req).await,
                (Method::POST, _) => storage::create_claim(&s, &ns, req).await,
                (Method::DELETE, _) => delete_collection(&s, kind, &ns, &q).await,
                _ => Err(ApiError::method_not_allowed()),
            }
        }
        [
            "api",
            "v1",
            "namespaces",
            ns,
            plural @ ("persistentvolumeclaims" | "secrets"),
            name,
        ] => {
            let (ns, name, kind) = (ns.to_string(), name.to_string(), storage_kind(plural));
            match m {
                Method::GET => s
                    .store
                    .get(kind, &ns, &name)
                    .map(ok)
                    .ok_or_else(|| kind.not_found(&name)),
                Method::PATCH => storage::patch(&s, kind, &ns, &name, req).await,
                Method::DELETE => delete_one(&s, kind, &ns, &name).await.map(ok),
                _ => Err(ApiError::method_not_allowed()),
            }
        }
        ["apis", "networking.k8s.io", "v1", "networkpolicies"] if get => list(&s, Kind::NetworkPolicy, None, &q),
        ["api", "v1", "namespaces", ns, "pods"] => {
            let ns = ns.to_string();
            match m {
                Method::GET => list(&s, Kind::Pod, Some(&ns), &q),
                Method::POST => create_pod(&s, &ns, req).await,
                Method::DELETE => delete_collection(&s, Kind::Pod, &ns, &q).await,
                _ => Err(ApiError::method_not_allowed()),
            }
        }
        ["api", "v1", "namespaces", ns, "pods", name] => {
            let (ns, name) = (ns.to_string(), name.to_string());
            match m {
                Method::GET => s
                    .store
                    .get(Kind::Pod, &ns, &name)
                    .map(ok)
                    .ok_or_else(|| Kind::Pod.not_found(&name)),
                Method::PATCH => patch_pod(&s, &ns, &name, req).await,
                Method::DELETE => delete_one(&s, Kind::Pod, &ns, &name).await.map(ok),
                _ => Err(ApiError::method_not_allowed()),
            }
        }
        ["api", "v1", "namespaces", ns, "pods", name, "log"] if get => crate::kube::stream::log(&s, ns, name, &q).await,
        ["api", "v1", "namespaces", ns, "pods", name, "exec"] if get || m == Method::POST => {
            let (ns, name) = (ns.to_string(), name.to_string());
            crate::kube::stream::exec(s, &ns, &name, q, req).await
        }
        ["api", "v1", "namespaces", ns, "pods", name, "portforward"] if get || m == Method::POST => {
            let (ns, name) = (ns.to_string(), name.to_string());
            crate::kube::stream::port_forward(s, &ns, &name, q, req).await
        }
        ["apis", "networking.k8s.io", "v1", "namespaces", ns, "networkpolicies"] => {
            let ns = ns.to_string();
            match m {
                Method::GET => list(&s, Kind::NetworkPolicy, Some(&ns), &q),
                Method::POST => create_network_policy(&s, &ns, req).await,
                Method::DELETE => delete_collection(&s, Kind::NetworkPolicy, &ns, &q).await,
                _ => Err(ApiError::method_not_allowed()),
            }
        }
        [
            "apis",
            "networking.k8s.io",
            "v1",
            "namespaces",
            ns,
            "networkpolicies",
            name,
        ] => {
            let (ns, name) = (ns.to_string(), name.to_string());
            match m {
                Method::GET => s
                    .store
                    .get(Kind::NetworkPolicy, &ns, &name)
                    .map(ok)
                    .ok_or_else(|| Kind::NetworkPolicy.not_found(&name)),
                Method::DELETE => delete_one(&s, Kind::NetworkPolicy, &ns, &name).await.map(ok),
                Method::PATCH => patch_policy(&s, &ns, &name, req).await,
                _ => Err(ApiError::method_not_allowed()),
            }
        }
        _ => Err(ApiError::no_route()),
    }
}

/// The core kind of a storage resource's plural (`persistentvolumeclaims` or `secrets`).
fn storage_kind(plural: &str) -> Kind {
    if plural == "secrets" {
        Kind::Secret
    } else {
        Kind::PersistentVolumeClaim
    }
}

fn ok(v: Value) -> Response {
    json_response(StatusCode::OK, &v)
}

fn version() -> Value {
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
const OPENAPI_HASH: &str = "agentbox-fake-1";

/// A group version's OpenAPI v3 document, with as much as kubectl reads of it: each kind's
/// patch operation, its `x-kubernetes-group-version-kind` and that it takes
/// `fieldValidation`, from which kubectl concludes the server validates (so it downloads no
/// schema to validate with itself). No schemas: `kubectl explain` has nothing to explain.
fn openapi(prefix: &str, group: &str, version: &str, kinds: &[Kind]) -> Value {
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

fn networking_group() -> Value {
    let v = json!({"groupVersion": "networking.k8s.io/v1", "version": "v1"});
    json!({"name": "networking.k8s.io", "versions": [v], "preferredVersion": v})
}

pub(crate) fn resource(name: &str, singular: &str, namespaced: bool, kind: &str, verbs: &[&str]) -> Value {
    json!({"name": name, "singularName": singular, "namespaced": namespaced, "kind": kind, "verbs": verbs})
}

fn core_resources() -> Value {
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
    let served = ["create", "delete", "deletecollection", "get", "list", "patch", "watch"];
    let mut pvc = resource(
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        true,
        "PersistentVolumeClaim",
        &served,
    );
    pvc["shortNames"] = json!(["pvc"]);
    let secrets = resource("secrets", "secret", true, "Secret", &served);
    json!({
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            ns,
            pvc,
            pods,
            resource("pods/exec", "", true, "PodExecOptions", &["create", "get"]),
            resource("pods/log", "", true, "Pod", &["get"]),
            resource("pods/portforward", "", true, "PodPortForwardOptions", &["create", "get"]),
            secrets,
        ],
    })
}

fn networking_resources() -> Value {
    let mut np = resource(
        "networkpolicies",
        "networkpolicy",
        true,
        "NetworkPolicy",
        &["create", "delete", "deletecollection", "get", "list", "patch"],
    );
    np["shortNames"] = json!(["netpol"]);
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "networking.k8s.io/v1", "resources": [np]})
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

fn field_labels(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Pod => &[
            "metadata.name",
            "metadata.namespace",
            "status.phase",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "status.podIP",
        ],
        Kind::Secret => &["metadata.name", "metadata.namespace", "type"],
        _ => &["metadata.name", "metadata.namespace"],
    }
}

/// The selectors of a list, watch or deletecollection.
struct Selection {
    labels: LabelSelector,
    fields: FieldSelector,
    any: bool,
}

impl Selection {
    fn of(kind: Kind, q: &Query) -> Result<Selection, ApiError> {
        let l = q.get("labelSelector").unwrap_or("");
        let f = q.get("fieldSelector").unwrap_or("");
        Ok(Selection {
            labels: LabelSelector::parse(l).map_err(ApiError::bad_request)?,
            fields: FieldSelector::parse(f, field_labels(kind)).map_err(ApiError::bad_request)?,
            any: !l.trim().is_empty() || !f.trim().is_empty(),
        })
    }

    fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(&labels_of(obj)) && self.fields.matches(obj)
    }
}

fn key_of(obj: &Value) -> String {
    format!(
        "{}/{}",
        obj["metadata"]["namespace"].as_str().unwrap_or(""),
        obj["metadata"]["name"].as_str().unwrap_or("")
    )
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

fn list(s: &Arc<Shared>, kind: Kind, ns: Option<&str>, q: &Query) -> ApiResult {
    let sel = Selection::of(kind, q)?;
    if q.flag("watch")? {
        return watch(s, kind, ns, sel, q);
    }
    let limit = match q.get("limit").filter(|l| !l.is_empty()) {
        None => None,
        Some(l) => match l.parse::<i64>() {
            Ok(n) if n > 0 => Some(n as usize),
            Ok(_) => None,
            Err(_) => return Err(ApiError::bad_request(format!("limit: invalid value {l:?}"))),
        },
    };
    let after = match q.get("continue").filter(|c| !c.is_empty()) {
        None => None,
        Some(c) => Some(unhex(c).ok_or_else(|| {
            ApiError::bad_request("continue key is not valid: the token is not one this server gave")
        })?),
    };
    let (rv, all) = {
        let i = s.store.lock();
        (i.rv(), i.objects(kind, ns))
    };
    let mut items: Vec<Value> = all
        .into_iter()
        .filter(|o| sel.matches(o))
        .filter(|o| after.as_ref().is_none_or(|a| key_of(o).as_str() > a.as_str()))
        .collect();
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(n) = limit
        && items.len() > n
    {
        let rest = items.len() - n;
        items.truncate(n);
        meta["continue"] = json!(hex(&key_of(&items[n - 1])));
        if !sel.any {
            meta["remainingItemCount"] = json!(rest);
        }
    }
    let items: Vec<Value> = items.iter().map(strip_kind).collect();
    Ok(ok(json!({
        "kind": format!("{}List", kind.kind()),
        "apiVersion": kind.api_version(),
        "metadata": meta,
        "items": items,
    })))
}

/// What a watch sends of `e`: the type as the watcher's selection sees the change.
fn seen(kind: Kind, ns: Option<&str>, sel: &Selection, e: &Event) -> Option<Value> {
    if e.kind != kind || ns.is_some_and(|n| n != e.namespace) {
        return None;
    }
    let now = sel.matches(&e.object);
    let before = e.before.as_ref().is_some_and(|b| sel.matches(b));
    let t = match (e.kind_of_change, before, now) {
        ("MODIFIED", true, true) => "MODIFIED",
        ("MODIFIED", false, true) => "ADDED",
        ("MODIFIED", true, false) => "DELETED",
        ("MODIFIED", false, false) => return None,
        (t, _, true) => t,
        _ => return None,
    };
    Some(json!({"type": t, "object": e.object}))
}

fn watch(s: &Arc<Shared>, kind: Kind, ns: Option<&str>, sel: Selection, q: &Query) -> ApiResult {
    let since = match q.get("resourceVersion").filter(|r| !r.is_empty() && *r != "0") {
        None => None,
        Some(r) => Some(
            r.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("resourceVersion: invalid value {r:?}")))?,
        ),
    };
    let timeout = match q.get("timeoutSeconds").filter(|t| !t.is_empty()) {
        None => WATCH_DEFAULT,
        Some(t) => Duration::from_secs(
            t.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("timeoutSeconds: invalid value {t:?}")))?,
        ),
    };
    let ns = ns.map(str::to_string);
    let (first, mut rx) = {
        let i = s.store.lock();
        let first: Vec<Value> = match since {
            None => i
                .objects(kind, ns.as_deref())
                .into_iter()
                .filter(|o| sel.matches(o))
                .map(|o| json!({"type": "ADDED", "object": o}))
                .collect(),
            Some(rv) => match i.since(rv) {
                Some(events) => events
                    .iter()
                    .filter_map(|e| seen(kind, ns.as_deref(), &sel, e))
                    .collect(),
                None => {
                    let oldest = i.rv();
                    vec![
                        json!({"type": "ERROR", "object": ApiError::gone(format!("too old resource version: {rv} ({oldest})")).status()}),
                    ]
                }
            },
        };
        // Subscribed under the lock every change is made under: nothing is missed or sent twice.
        (first, s.store.subscribe())
    };
    let expired = first.iter().any(|e| e["type"] == "ERROR");
    let (tx, out) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    tokio::spawn(async move {
        let line = |v: &Value| {
            let mut b = serde_json::to_vec(v).unwrap_or_default();
            b.push(b'\n');
            Ok(Bytes::from(b))
        };
        for e in &first {
            if tx.send(line(e)).await.is_err() {
                return;
            }
        }
        if expired {
            return;
        }
        let end = tokio::time::sleep(timeout);
        tokio::pin!(end);
        loop {
            tokio::select! {
                _ = &mut end => return,
                _ = tx.closed() => return,
                got = rx.recv() => match got {
                    Ok(e) => {
                        if let Some(v) = seen(kind, ns.as_deref(), &sel, &e)
                            && tx.send(line(&v)).await.is_err()
                        {
                            return;
                        }
                    }
                    // Fallen behind, or the fake is going: end the watch, the client watches again.
                    Err(_) => return,
                },
            }
        }
    });
    let mut out = out;
    let stream = futures_util::stream::poll_fn(move |cx| out.poll_recv(cx));
    let mut r = Response::new(Body::from_stream(stream));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(r)
}

pub(crate) async fn body_json(req: Request) -> Result<(String, Value), ApiError> {
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_string();
    let bytes = axum::body::to_bytes(req.into_body(), MAX_BODY)
        .await
        .map_err(|e| ApiError {
            code: 413,
            reason: "RequestEntityTooLarge",
            ..ApiError::bad_request(format!(
                "the request body could not be read (at most {MAX_BODY} bytes): {e}"
            ))
        })?;
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the body of the request could not be decoded as JSON: {e}")))?;
    Ok((ct, v))
}

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

/// What the real server fills in a new pod before it validates it.
fn pod_defaults(pod: &mut Value) {
    if !pod["metadata"].is_object() {
        pod["metadata"] = json!({});
    }
    let spec = &mut pod["spec"];
    if !spec.is_object() {
        *spec = json!({});
    }
    for (k, v) in [
        ("restartPolicy", json!("Always")),
        ("dnsPolicy", json!("ClusterFirst")),
        ("schedulerName", json!("default-scheduler")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("securityContext", json!({})),
        ("enableServiceLinks", json!(true)),
        ("preemptionPolicy", json!("PreemptLowerPriority")),
        ("priority", json!(0)),
    ] {
        if spec.get(k).is_none_or(|x| x.is_null() || x == "") {
            spec[k] = v;
        }
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

async fn create_pod(s: &Arc<Shared>, ns: &str, req: Request) -> ApiResult {
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

async fn create_network_policy(s: &Arc<Shared>, ns: &str, req: Request) -> ApiResult {
    let (_, mut np) = body_json(req).await?;
    if !np.is_object() {
        return Err(ApiError::bad_request("the body is not a JSON object"));
    }
    check_kind(&np, Kind::NetworkPolicy)?;
    check_namespace(&np, ns)?;
    if !np["metadata"].is_object() {
        np["metadata"] = json!({});
    }
    let causes = validate::network_policy(&np);
    if !causes.is_empty() {
        return Err(ApiError::invalid(
            "NetworkPolicy",
            "networking.k8s.io",
            &name_for_errors(&np),
            causes,
        ));
    }
    // policyTypes as the real server defaults them: Ingress, and Egress where there are egress rules.
    if np["spec"]["policyTypes"].as_array().is_none_or(Vec::is_empty) {
        let mut types = vec![json!("Ingress")];
        if np["spec"]["egress"].as_array().is_some_and(|e| !e.is_empty()) {
            types.push(json!("Egress"));
        }
        np["spec"]["policyTypes"] = json!(types);
    }
    if let Some(m) = np["metadata"].as_object_mut() {
        for k in ["uid", "resourceVersion", "creationTimestamp", "managedFields"] {
            m.remove(k);
        }
    }
    let np = s.store.create(Kind::NetworkPolicy, ns, np)?;
    Ok(json_response(StatusCode::CREATED, &np))
}

/// RFC 6902 JSON patch over `doc`: add, remove, replace, test, move, copy.
pub(crate) fn json_patch(doc: &Value, ops: &Value) -> Result<Value, ApiError> {
    let bad = |m: String| ApiError::bad_request(format!("the JSON patch could not be applied: {m}"));
    let ops = ops
        .as_array()
        .ok_or_else(|| bad("a JSON patch is a list of operations".into()))?;
    let mut doc = doc.clone();
    for (i, op) in ops.iter().enumerate() {
        let path = op["path"]
            .as_str()
            .ok_or_else(|| bad(format!("operation {i}: no path")))?;
        let kind = op["op"].as_str().unwrap_or("");
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| bad(format!("operation {i}: no value")))
        };
        match kind {
            "add" | "replace" => {
                let v = value()?;
                if kind == "replace" && doc.pointer(path).is_none() {
                    return Err(bad(format!(
                        "replace operation does not apply: doc is missing key: {path}"
                    )));
                }
                put(&mut doc, path, v, kind == "add").map_err(|m| bad(format!("operation {i}: {m}")))?;
            }
            "remove" => {
                take(&mut doc, path)
                    .ok_or_else(|| bad(format!("remove operation does not apply: doc is missing path: {path}")))?;
            }
            "test" => {
                if doc.pointer(path) != Some(&value()?) {
                    return Err(bad(format!("testing value {path} failed")));
                }
            }
            "move" | "copy" => {
                let from = op["from"]
                    .as_str()
                    .ok_or_else(|| bad(format!("operation {i}: no from")))?;
                let v = if kind == "move" {
                    take(&mut doc, from)
                } else {
                    doc.pointer(from).cloned()
                }
                .ok_or_else(|| bad(format!("operation {i}: missing from {from}")))?;
                put(&mut doc, path, v, true).map_err(|m| bad(format!("operation {i}: {m}")))?;
            }
            other => return Err(bad(format!("operation {i}: unexpected op {other:?}"))),
        }
    }
    Ok(doc)
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

fn split_pointer(path: &str) -> Option<(String, String)> {
    let (parent, last) = path.rsplit_once('/')?;
    Some((parent.to_string(), unescape(last)))
}

fn put(doc: &mut Value, path: &str, v: Value, insert: bool) -> Result<(), String> {
    if path.is_empty() {
        *doc = v;
        return Ok(());
    }
    let (parent, last) = split_pointer(path).ok_or("a path starts with /")?;
    let p = doc
        .pointer_mut(&parent)
        .ok_or_else(|| format!("missing parent {parent}"))?;
    match p {
        Value::Object(m) => {
            m.insert(last, v);
            Ok(())
        }
        Value::Array(a) => {
            let i = if last == "-" {
                a.len()
            } else {
                last.parse::<usize>().map_err(|_| format!("bad index {last}"))?
            };
            if insert && i <= a.len() {
                a.insert(i, v);
                Ok(())
            } else if !insert && i < a.len() {
                a[i] = v;
                Ok(())
            } else {
                Err(format!("index {i} out of range"))
            }
        }
        _ => Err(format!("{parent} is not an object or a list")),
    }
}

fn take(doc: &mut Value, path: &str) -> Option<Value> {
    let (parent, last) = split_pointer(path)?;
    match doc.pointer_mut(&parent)? {
        Value::Object(m) => m.remove(&last),
        Value::Array(a) => {
            let i = last.parse::<usize>().ok().filter(|i| *i < a.len())?;
            Some(a.remove(i))
        }
        _ => None,
    }
}

/// A patch of a NetworkPolicy (its metadata, such as owner references, or its rules): merge,
/// strategic (without directives) or JSON patch, as the real server takes them. The fake's
/// kubelet reads policies when a pod starts, so a changed rule reaches only later pods.
async fn patch_policy(s: &Arc<Shared>, ns: &str, name: &str, req: Request) -> ApiResult {
    let (ct, p) = body_json(req).await?;
    s.store
        .update(Kind::NetworkPolicy, ns, name, None, |old| patched(old, &ct, &p))
        .map(ok)
}

/// `p` applied to `old` as its content type says (a merge patch, a strategic merge patch
/// without directives, applied as a merge patch, or a JSON patch), what the server keeps of
/// an object kept: its kind, name, namespace, uid and resourceVersion.
pub(crate) fn patched(old: &Value, ct: &str, p: &Value) -> Result<Value, ApiError> {
    let mut new = match ct {
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            if ct == "application/strategic-merge-patch+json"
                && let Some(d) = patch::directive(p)
            {
                return Err(ApiError::bad_request(format!(
                    "the agentbox fake applies strategic merge patches without directives: {d} is not supported"
                )));
            }
            let mut n = old.clone();
            patch::merge(&mut n, p);
            n
        }
        "application/json-patch+json" => json_patch(old, p)?,
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    if !new.is_object() || !new["metadata"].is_object() {
        return Err(ApiError::bad_request(
            "the patched object is not an object with metadata",
        ));
    }
    new["kind"] = old["kind"].clone();
    new["apiVersion"] = old["apiVersion"].clone();
    new["metadata"]["name"] = old["metadata"]["name"].clone();
    new["metadata"]["namespace"] = old["metadata"]["namespace"].clone();
    new["metadata"]["uid"] = old["metadata"]["uid"].clone();
    new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
    Ok(new)
}

async fn patch_pod(s: &Arc<Shared>, ns: &str, name: &str, req: Request) -> ApiResult {
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

async fn delete_collection(s: &Arc<Shared>, kind: Kind, ns: &str, q: &Query) -> ApiResult {
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

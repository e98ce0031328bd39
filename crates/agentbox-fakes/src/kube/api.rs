//! The REST side's core: authentication, throttling, and the routing of every request to the
//! resources (namespaces, pods, pods' logs, PersistentVolumeClaims, Secrets, and the kinds
//! only stored: NetworkPolicies, ServiceAccounts, Services, Deployments, Roles,
//! RoleBindings), answered in the real server's shapes. Discovery is `discovery`'s, list and
//! watch `reads`', create, patch and delete `writes`', the patches themselves `patch`'s. The
//! WebSockets (exec, port-forward) are `stream`'s; what claims and secrets are made of,
//! `storage`'s. The kinds only stored share one path (`stored`), their kind found from the
//! path's group and plural.
//!
//! Routing is one match over the path's segments rather than a router's table: every
//! resource path is `/api/v1/...` or `/apis/GROUP/VERSION/...` with the same shape, the
//! real server's bare 404 answers anything else, and a known path asked with a method it
//! does not serve is 405.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::kube::kubelet::Kubelet;
use crate::kube::sandbox;
use crate::kube::status::{ApiError, json_response};
use crate::kube::storage;
use crate::kube::store::{Kind, Store};

use super::discovery::{GROUPS, OPENAPI_HASH, core_resources, group, group_resources, openapi, version};
pub(crate) use super::discovery::{resource, strip_kind};
pub(crate) use super::patch::{json_patch, patched};
use super::reads::list;
pub(crate) use super::writes::{
    admit_pod, check_kind, check_namespace, clear_server_fields, delete_one, name_for_errors,
};
use super::writes::{create_pod, create_stored, delete_collection, patch_pod, patch_stored};

/// The largest request body read, as the real server's limit (3 MiB).
const MAX_BODY: usize = 3 << 20;

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

pub(crate) use crate::http::Query;

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
    if let Some((kind, ns, name)) = stored_path(&seg) {
        return stored(&s, kind, ns, name, m, &q, req).await;
    }
    match seg.as_slice() {
        ["version"] if get => Ok(ok(version())),
        ["api"] if get => Ok(ok(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": s.addr.to_string()}],
        }))),
        ["api", "v1"] if get => Ok(ok(core_resources())),
        ["apis"] if get => {
            let mut groups: Vec<Value> = GROUPS.iter().map(|g| group(g)).collect();
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
        ["apis", g] if get && GROUPS.contains(g) => {
            let mut v = group(g);
            v["kind"] = json!("APIGroup");
            v["apiVersion"] = json!("v1");
            Ok(ok(v))
        }
        ["apis", g, "v1"] if get && GROUPS.contains(g) => Ok(ok(group_resources(g))),
        ["openapi", "v3"] if get => {
            let mut paths = json!({
                "api/v1": {"serverRelativeURL": format!("/openapi/v3/api/v1?hash={OPENAPI_HASH}")},
            });
            for g in GROUPS {
                let gv = format!("apis/{g}/v1");
                paths[&gv] = json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={OPENAPI_HASH}")});
            }
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
            &[
                Kind::Pod,
                Kind::PersistentVolumeClaim,
                Kind::Secret,
                Kind::ServiceAccount,
                Kind::Service,
            ],
        ))),
        ["openapi", "v3", "apis", g, "v1"] if get && GROUPS.contains(g) => {
            let kinds: Vec<Kind> = Kind::STORED.into_iter().filter(|k| k.group() == *g).collect();
            Ok(ok(openapi(&format!("/apis/{g}/v1"), g, "v1", &kinds)))
        }
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
        _ => Err(ApiError::no_route()),
    }
}

/// The path of a kind only stored (`/api/v1/...` or `/apis/GROUP/v1/...`, [`Kind::STORED`]):
/// its kind, its namespace (`None`: a list across namespaces) and its object's name.
fn stored_path<'a>(seg: &[&'a str]) -> Option<(Kind, Option<&'a str>, Option<&'a str>)> {
    let (group, rest) = match seg {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", g, "v1", rest @ ..] => (*g, rest),
        _ => return None,
    };
    let (ns, plural, name) = match rest {
        [plural] => (None, plural, None),
        ["namespaces", ns, plural] => (Some(*ns), plural, None),
        ["namespaces", ns, plural, name] => (Some(*ns), plural, Some(*name)),
        _ => return None,
    };
    Kind::stored(group, plural).map(|k| (k, ns, name))
}

/// A request for a kind only stored: list (and watch), create and deletecollection of a
/// namespace's; get, patch and delete of one; list (and watch) across namespaces.
async fn stored(
    s: &Arc<Shared>,
    kind: Kind,
    ns: Option<&str>,
    name: Option<&str>,
    m: Method,
    q: &Query,
    req: Request,
) -> ApiResult {
    match (ns, name, m) {
        (None, _, Method::GET) => list(s, kind, None, q),
        (Some(ns), None, Method::GET) => list(s, kind, Some(ns), q),
        (Some(ns), None, Method::POST) => create_stored(s, kind, ns, req).await,
        (Some(ns), None, Method::DELETE) => delete_collection(s, kind, ns, q).await,
        (Some(ns), Some(name), Method::GET) => s.store.get(kind, ns, name).map(ok).ok_or_else(|| kind.not_found(name)),
        (Some(ns), Some(name), Method::PATCH) => patch_stored(s, kind, ns, name, req).await,
        (Some(ns), Some(name), Method::DELETE) => delete_one(s, kind, ns, name).await.map(ok),
        _ => Err(ApiError::method_not_allowed()),
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

pub(super) fn ok(v: Value) -> Response {
    json_response(StatusCode::OK, &v)
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

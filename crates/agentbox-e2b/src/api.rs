//! The control plane (E2B's `openapi.yml`, and the generated client of the `e2b` SDK where the
//! two differ: the SDK creates by `POST /v2/sandboxes` and connects by
//! `POST /v2/sandboxes/{id}/connect`, which the spec snapshot lacks).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use crate::Caller;
use crate::http::Query;
use crate::state::{Asked, ENVD_VERSION, Sbx, Shared, St, lock, now_ms, random, rfc3339};
use agentbox_core::Network;

/// The largest control-plane body.
const MAX_BODY: usize = 4 << 20;
/// A sandbox's timeout when the create asks none (the spec's default), in seconds.
pub(crate) const DEFAULT_TIMEOUT: u64 = 15;
/// What every sandbox says it has (recorded, not enforced).
const CPU_COUNT: u64 = 2;
const MEMORY_MB: u64 = 512;
const DISK_MB: u64 = 10_240;

pub(crate) fn json_response(status: StatusCode, v: &Value) -> Response {
    let mut r = Response::new(Body::from(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// E2B's error body: `{code, message}`.
pub(crate) fn error(status: u16, message: impl Into<String>) -> Response {
    let st = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(st, &json!({"code": status, "message": message.into()}))
}

fn empty(status: StatusCode) -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = status;
    r
}

pub(crate) fn not_found(id: &str) -> Response {
    error(
        404,
        format!("sandbox \"{id}\" doesn't exist or you don't have access to it"),
    )
}

pub(crate) async fn handle(s: Arc<Shared>, req: Request) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let segs: Vec<String> = path
        .split('/')
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(&crate::http::percent_decode(p)).into_owned())
        .collect();
    let seg: Vec<&str> = segs.iter().map(String::as_str).collect();
    let named = match seg.as_slice() {
        ["sandboxes", id, ..] | ["v2", "sandboxes", id, ..] => Some(*id),
        _ => None,
    };
    s.record(method.as_str(), &path, named, None);
    let key = req
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let caller = match s.backend.caller(key, req.extensions()).await {
        Ok(c) => c,
        Err(r) => return error(r.status, r.message),
    };
    if let Some((status, message)) = s.fault(method.as_str(), &path) {
        return error(status, message);
    }
    let q = Query::of(&req);
    let body = match axum::body::to_bytes(req.into_body(), MAX_BODY).await {
        Ok(b) => b,
        Err(e) => return error(400, format!("reading the body: {e}")),
    };
    let json: Value = if body.is_empty() {
        Value::Null
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return error(400, format!("the body is not JSON: {e}")),
        }
    };
    match (&method, seg.as_slice()) {
        (&Method::GET, ["health"]) => json_response(StatusCode::OK, &json!({"message": "Health check successful"})),
        (&Method::POST, ["sandboxes"]) => create(&s, &caller, &json, false).await,
        (&Method::POST, ["v2", "sandboxes"]) => create(&s, &caller, &json, true).await,
        (&Method::GET, ["sandboxes"]) => list_v1(&s, &caller, &q),
        (&Method::GET, ["v2", "sandboxes"]) => list(&s, &caller, &q),
        (&Method::GET, ["sandboxes", "metrics"]) => metrics_of_many(&s, &caller, &q).await,
        (&Method::GET, ["sandboxes", id, "metrics"]) => metrics_of(&s, &caller, id, &q).await,
        (&Method::GET, ["sandboxes", id]) => match s.owned(&caller, id) {
            Some(x) => json_response(StatusCode::OK, &detail(&s, &x)),
            None => not_found(id),
        },
        (&Method::DELETE, ["sandboxes", id]) => {
            // Answered once the box is gone, as E2B answers a kill once the sandbox is; after a
            // pause or resume under way, never beside it.
            let removed = match s.owned(&caller, id) {
                Some(x) => {
                    let _held = x.op.lock().await;
                    s.remove(id)
                }
                None => None,
            };
            match removed {
                Some(ending) => {
                    let _ = ending.await;
                    empty(StatusCode::NO_CONTENT)
                }
                None => not_found(id),
            }
        }
        (&Method::POST, ["sandboxes", id, "timeout"]) => set_timeout(&s, &caller, id, &json).await,
        (&Method::POST, ["sandboxes", id, "refreshes"]) => refresh(&s, &caller, id, &json).await,
        (&Method::POST, ["sandboxes", id, "pause"]) => pause(&s, &caller, id).await,
        (&Method::POST, ["sandboxes", id, "resume"]) => resume(&s, &caller, id, &json).await,
        (&Method::POST, ["sandboxes", id, "connect"]) | (&Method::POST, ["v2", "sandboxes", id, "connect"]) => {
            connect(&s, &caller, id, &json).await
        }
        (&Method::POST, ["sandboxes", id, "snapshots"]) => crate::snapshots::take(&s, &caller, id, &json).await,
        (&Method::GET, ["snapshots"]) => crate::snapshots::list(&s, &caller, &q).await,
        (&Method::DELETE, ["templates", id]) => crate::snapshots::delete(&s, &caller, id).await,
        (&Method::POST, ["sandboxes", id, "fork"]) => crate::snapshots::fork(&s, &caller, id, &json).await,
        // A sandbox's own route that is not served (metrics, logs, a network update...): for a
        // sandbox of the caller's, E2B's answer to a feature it lacks, never "not found" (which
        // the SDKs read as a sandbox that is gone).
        (_, ["sandboxes", id, rest, ..]) | (_, ["v2", "sandboxes", id, rest, ..]) => match s.owned(&caller, id) {
            Some(_) => error(
                501,
                format!("{method} {path}: the sandbox's {rest} are not served by agentbox's E2B API"),
            ),
            None => not_found(id),
        },
        // E2B's routes of what agentbox has no part of: answered as a feature E2B lacks.
        (_, [first, ..]) | (_, ["v2" | "v3", first, ..]) if UNSERVED.contains(first) => error(
            501,
            format!("{method} {path}: E2B's {first} are not served by agentbox's E2B API"),
        ),
        _ => error(
            404,
            format!("{method} {path}: no such route in E2B's API as agentbox serves it"),
        ),
    }
}

/// The first segment of E2B's routes this server does not serve: template builds and
/// listings, volumes, secrets (`docs/e2b-api.md` says why).
const UNSERVED: [&str; 4] = ["templates", "default-templates", "volumes", "secrets"];

/// `POST /sandboxes/{id}/refreshes {duration}`: the sandbox lives at least `duration` seconds
/// more from now (never less than it had; 0 to 3600, default 0), as E2B's refresh.
async fn refresh(s: &Shared, caller: &Caller, id: &str, v: &Value) -> Response {
    let Some(x) = s.owned(caller, id) else {
        return not_found(id);
    };
    let duration = match v.get("duration") {
        None | Some(Value::Null) => 0,
        Some(d) => match d.as_u64() {
            Some(d) if d <= 3600 => d,
            _ => {
                return error(
                    400,
                    format!("duration {d}: not a whole number of seconds from 0 to 3600"),
                );
            }
        },
    };
    let t = match timeout_of(s, caller, &json!({"timeout": duration}), 0) {
        Ok(t) => t,
        Err(r) => return refuse(r),
    };
    let _held = x.op.lock().await;
    match x.state() {
        St::Gone => return not_found(id),
        St::Paused => return error(409, format!("Sandbox {id} is paused")),
        St::Running => {}
    }
    let end = now_ms() + t * 1000;
    if end > *x.end_ms.borrow() {
        x.set_end(end).await;
    }
    empty(StatusCode::NO_CONTENT)
}

/// A sample of sandbox `x` taken now and kept, if it runs; the reason when its box gave none.
async fn measure(x: &Sbx) -> Result<Option<crate::metrics::Sample>, String> {
    let Some(b) = x.running_box() else {
        return Ok(None);
    };
    let home = b.facts().workspace.clone().unwrap_or_else(|| "/".to_string());
    let sample = crate::metrics::sample(b.as_ref(), &home).await?;
    crate::metrics::keep(&mut lock(&x.samples), sample.clone());
    Ok(Some(sample))
}

/// `GET /sandboxes/{id}/metrics?start=&end=`: a sample taken now (of a running sandbox), and
/// every kept one within `start`..`end` (seconds since the epoch, both optional), oldest first.
async fn metrics_of(s: &Shared, caller: &Caller, id: &str, q: &Query) -> Response {
    let Some(x) = s.owned(caller, id) else {
        return not_found(id);
    };
    let bound = |k: &str| -> Result<Option<u64>, String> {
        match q.get(k) {
            None | Some("") => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| format!("{k} {v:?}: not seconds since the epoch")),
        }
    };
    let (start, end) = match (bound("start"), bound("end")) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(why), _) | (_, Err(why)) => return error(400, why),
    };
    if let Err(why) = measure(&x).await {
        return error(500, why);
    }
    let kept: Vec<Value> = lock(&x.samples)
        .iter()
        .filter(|m| start.is_none_or(|t| m.unix >= t) && end.is_none_or(|t| m.unix <= t))
        .map(crate::metrics::Sample::json)
        .collect();
    json_response(StatusCode::OK, &Value::Array(kept))
}

/// `GET /sandboxes/metrics?sandbox_ids=a,b`: a sample of each running sandbox named that the
/// caller owns, taken now (at most 100 named).
async fn metrics_of_many(s: &Shared, caller: &Caller, q: &Query) -> Response {
    let ids: Vec<String> = q
        .all("sandbox_ids")
        .iter()
        .flat_map(|v| v.split(','))
        .filter(|v| !v.is_empty())
        .map(str::to_string)
        .collect();
    if ids.len() > 100 {
        return error(400, format!("sandbox_ids: {} named; at most 100", ids.len()));
    }
    let mut out = serde_json::Map::new();
    for id in ids {
        let Some(x) = s.owned(caller, &id) else {
            continue;
        };
        match measure(&x).await {
            Ok(Some(m)) => {
                out.insert(id, m.json());
            }
            Ok(None) => {}
            Err(why) => return error(500, format!("{id}: {why}")),
        }
    }
    json_response(StatusCode::OK, &json!({"sandboxes": out}))
}

/// A pause or resume the provider refused or failed: a provider that cannot sleep a box
/// answers 501 (E2B's answer to a feature it lacks), naming the provider; anything else 500.
fn lifecycle_error(e: &agentbox_core::Error) -> Response {
    match e.code() {
        agentbox_core::ErrorCode::Unsupported => error(501, e.message()),
        _ => error(500, e.message()),
    }
}

/// A refusal: its status and message.
pub(crate) type Refused = (u16, String);

pub(crate) fn refuse((status, message): Refused) -> Response {
    error(status, message)
}

fn strings(v: &Value, field: &str) -> Result<BTreeMap<String, String>, Refused> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err((400, format!("{field}.{k}: not a string"))),
            })
            .collect(),
        Some(_) => Err((400, format!("{field}: not an object of strings"))),
    }
}

/// A timeout in seconds, at most the plan's and the caller's own longest lifetime (a timeout
/// is a new end from now, as the service's extend).
pub(crate) fn timeout_of(s: &Shared, caller: &Caller, v: &Value, default: u64) -> Result<u64, Refused> {
    let t = match v.get("timeout") {
        None | Some(Value::Null) => default,
        Some(t) => t
            .as_u64()
            .ok_or_else(|| (400, format!("timeout {t}: not a whole number of seconds")))?,
    };
    let max = s.max_timeout.as_secs();
    if t > max {
        let hours = max / 3600;
        return Err((
            400,
            if max.is_multiple_of(3600) {
                format!("Timeout cannot be greater than {hours} hours")
            } else {
                format!("Timeout cannot be greater than {max} seconds")
            },
        ));
    }
    if let Some(most) = caller.max_lifetime
        && t > most.as_secs()
    {
        return Err((
            400,
            format!(
                "Timeout cannot be greater than {} seconds: this key's longest lifetime",
                most.as_secs()
            ),
        ));
    }
    Ok(t)
}

async fn create(s: &Arc<Shared>, caller: &Caller, v: &Value, v2: bool) -> Response {
    let Some(template) = v.get("templateID").and_then(Value::as_str).filter(|t| !t.is_empty()) else {
        return error(400, "templateID: required");
    };
    let timeout = match timeout_of(s, caller, v, DEFAULT_TIMEOUT) {
        Ok(t) => t,
        Err(r) => return refuse(r),
    };
    let (metadata, env) = match (strings(v, "metadata"), strings(v, "envVars")) {
        (Ok(m), Ok(e)) => (m, e),
        (Err(r), _) | (_, Err(r)) => return refuse(r),
    };
    let allow_internet = v.get("allow_internet_access").and_then(Value::as_bool);
    let network = v.get("network").filter(|n| !n.is_null()).cloned();
    let box_network = match network_of(allow_internet, network.as_ref()) {
        Ok(n) => n,
        Err(r) => return refuse(r),
    };
    let auto_pause = v.get("autoPause").and_then(Value::as_bool).unwrap_or(false);
    // v2 sandboxes are always secure (the SDK no longer sends `secure`).
    let secure = s.always_secure || v2 || v.get("secure").and_then(Value::as_bool).unwrap_or(false);
    let asked = Asked {
        owner: caller.id.clone(),
        template_id: template.to_string(),
        metadata,
        env,
        allow_internet,
        network,
        box_network,
        auto_pause,
        secure,
        max_lifetime: caller.max_lifetime,
    };
    let id = random(b"abcdefghijklmnopqrstuvwxyz0123456789", 20);
    // Made and kept on a task of its own: a client that goes away mid-create leaves a sandbox
    // that ends at its timeout, never a box nothing would end.
    let (s2, caller2) = (s.clone(), caller.clone());
    let made = tokio::spawn(async move {
        let lifetime = std::time::Duration::from_secs(timeout);
        let made = s2.backend.make(&caller2, &s2.ask(&id, &asked, lifetime)).await?;
        Ok::<_, crate::Refusal>(s2.keep(id, asked, timeout, made))
    })
    .await;
    match made {
        Ok(Ok(x)) => json_response(StatusCode::CREATED, &sandbox(s, &x)),
        Ok(Err(r)) => error(r.status, r.message),
        Err(e) => error(500, format!("making the sandbox: {e}")),
    }
}

/// E2B's network asks as agentbox's (`None`: the provider's open network).
///
/// E2B denies what `denyOut` lists and allows what `allowOut` lists over it; agentbox enforces
/// allowlists, and reads a list the way that fails closed. So: no internet is no network;
/// `allowOut` (alone, or over a `denyOut` of all traffic, `0.0.0.0/0`) is an allowlist of it;
/// a `denyOut` of all traffic alone is no network; any other `denyOut` is refused, naming
/// why, rather than enforced as something else. Transform `rules` are refused likewise.
fn network_of(allow_internet: Option<bool>, n: Option<&Value>) -> Result<Option<Network>, Refused> {
    if allow_internet == Some(false) {
        return Ok(Some(Network::None));
    }
    let list = |k: &str| -> Result<Vec<String>, Refused> {
        match n.and_then(|n| n.get(k)) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| (400, format!("network.{k}: {x} is not a string")))
                })
                .collect(),
            Some(x) => Err((400, format!("network.{k}: {x} is not a list"))),
        }
    };
    if let Some(p) = n.and_then(|n| n.get("allowPublicTraffic"))
        && !p.is_null()
        && !p.is_boolean()
    {
        return Err((400, format!("network.allowPublicTraffic: {p} is not true or false")));
    }
    if let Some(m) = n.and_then(|n| n.get("maskRequestHost"))
        && !m.is_null()
        && !m.as_str().is_some_and(|m| {
            !m.is_empty() && m.len() <= 253 && axum::http::HeaderValue::from_str(&m.replace("${PORT}", "1")).is_ok()
        })
    {
        return Err((400, format!("network.maskRequestHost: {m} is not a host name")));
    }
    if n.and_then(|n| n.get("rules"))
        .is_some_and(|r| !r.is_null() && r != &json!({}))
    {
        return Err((400, "network.rules: transform rules are not served here".into()));
    }
    let (allow, deny) = (list("allowOut")?, list("denyOut")?);
    if !deny.is_empty() && !deny.iter().any(|d| d == ALL_TRAFFIC) {
        return Err((
            400,
            format!(
                "network.denyOut: {deny:?}: agentbox enforces allowlists, not deny lists: deny all traffic \
                 ({ALL_TRAFFIC}) and name what is allowed in allowOut"
            ),
        ));
    }
    Ok(match (allow.is_empty(), deny.is_empty()) {
        (true, true) => None,
        (true, false) => Some(Network::None),
        (false, _) => Some(Network::Allow(allow)),
    })
}

/// E2B's name for every IPv4 address, in `denyOut`: the internet denied.
const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// The `Sandbox` answer of a create, resume or connect.
pub(crate) fn sandbox(s: &Shared, x: &Sbx) -> Value {
    let mut v = json!({
        "templateID": x.template_id,
        "sandboxID": x.id,
        "clientID": x.client_id,
        "envdVersion": ENVD_VERSION,
        "domain": s.domain,
    });
    if let Some(t) = &x.token {
        v["envdAccessToken"] = json!(t);
    }
    if let Some(t) = &x.traffic_token {
        v["trafficAccessToken"] = json!(t);
    }
    if let Some(a) = &x.alias {
        v["alias"] = json!(a);
    }
    v
}

/// Whether a sandbox's ports take anyone (`network.allowPublicTraffic`, true unless asked
/// false): when not, each request to one must show its traffic access token.
pub(crate) fn public_traffic(network: Option<&Value>) -> bool {
    network
        .and_then(|n| n.get("allowPublicTraffic"))
        .and_then(Value::as_bool)
        .unwrap_or(true)
}

/// The host a request to port `port` of a sandbox is sent with: `network.maskRequestHost`
/// with `${PORT}` as the port, or `localhost:PORT`.
pub(crate) fn request_host(network: Option<&Value>, port: u16) -> String {
    match network.and_then(|n| n.get("maskRequestHost")).and_then(Value::as_str) {
        Some(mask) => mask.replace("${PORT}", &port.to_string()),
        None => format!("localhost:{port}"),
    }
}

fn listed(x: &Sbx) -> Value {
    let mut v = json!({
        "templateID": x.template_id,
        "sandboxID": x.id,
        "clientID": x.client_id,
        "startedAt": rfc3339(x.started_ms),
        "endAt": rfc3339(*x.end_ms.borrow()),
        "cpuCount": CPU_COUNT,
        "memoryMB": MEMORY_MB,
        "diskSizeMB": DISK_MB,
        "metadata": x.metadata,
        "state": x.state().name(),
        "envdVersion": ENVD_VERSION,
    });
    if let Some(a) = &x.alias {
        v["alias"] = json!(a);
    }
    v
}

fn detail(s: &Shared, x: &Sbx) -> Value {
    let mut v = listed(x);
    v["domain"] = json!(s.domain);
    if let Some(t) = &x.token {
        v["envdAccessToken"] = json!(t);
    }
    if let Some(t) = &x.traffic_token {
        v["trafficAccessToken"] = json!(t);
    }
    v["allowInternetAccess"] = json!(x.allow_internet);
    if let Some(n) = &x.network {
        v["network"] = n.clone();
    }
    v["lifecycle"] = json!({
        "autoResume": false,
        "onTimeout": if x.auto_pause { "pause" } else { "kill" },
    });
    v
}

/// `metadata=k=v&k2=v2`, decoded as E2B's server decodes it: the query value (decoded once
/// already), unescaped whole, split on `&` and `=`, each part unescaped again (so a client
/// escapes each key and value before it joins them, as the SDK does).
fn metadata_filter(q: &Query) -> Vec<(String, String)> {
    let Some(m) = q.get("metadata") else {
        return Vec::new();
    };
    // Go's QueryUnescape: `+` is a space.
    let un = |s: &str| String::from_utf8_lossy(&crate::http::percent_decode(&s.replace('+', " "))).into_owned();
    let whole = un(m);
    whole
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (un(k), un(v))
        })
        .collect()
}

fn matching(s: &Shared, caller: &Caller, q: &Query, states: &[St]) -> Vec<Arc<Sbx>> {
    let meta = metadata_filter(q);
    let template = q.get("template").filter(|t| !t.is_empty());
    lock(&s.sandboxes)
        .values()
        .filter(|x| caller.admin || x.owner == caller.id)
        .filter(|x| states.contains(&x.state()))
        .filter(|x| meta.iter().all(|(k, v)| x.metadata.get(k) == Some(v)))
        .filter(|x| template.is_none_or(|t| x.template_id == t || x.alias.as_deref() == Some(t)))
        .cloned()
        .collect()
}

fn list_v1(s: &Shared, caller: &Caller, q: &Query) -> Response {
    let mut all = matching(s, caller, q, &[St::Running]);
    all.sort_by_key(|x| std::cmp::Reverse(x.seq));
    json_response(StatusCode::OK, &Value::Array(all.iter().map(|x| listed(x)).collect()))
}

fn list(s: &Shared, caller: &Caller, q: &Query) -> Response {
    let mut states = Vec::new();
    for st in q
        .all("state")
        .iter()
        .flat_map(|v| v.split(',').map(str::to_string).collect::<Vec<_>>())
    {
        match st.as_str() {
            "running" => states.push(St::Running),
            "paused" => states.push(St::Paused),
            "" => {}
            other => return error(400, format!("state {other:?}: running or paused")),
        }
    }
    if states.is_empty() {
        states = vec![St::Running, St::Paused];
    }
    let asc = match q.get("order") {
        None | Some("") | Some("desc") => false,
        Some("asc") => true,
        Some(o) => return error(400, format!("order {o:?}: asc or desc")),
    };
    let limit = match q.get("limit") {
        None => s.list_page_max,
        Some(l) => match l.parse::<usize>() {
            Ok(n) if (1..=100).contains(&n) => n.min(s.list_page_max),
            _ => return error(400, format!("limit {l:?}: 1 to 100")),
        },
    };
    let after = match q.get("nextToken").filter(|t| !t.is_empty()) {
        None => None,
        Some(t) => match t.strip_prefix("seq-").and_then(|n| n.parse::<u64>().ok()) {
            Some(n) => Some(n),
            None => return error(400, format!("nextToken {t:?}: not a token this API gave")),
        },
    };
    let after_ms = match q.get("startedAfter").filter(|t| !t.is_empty()) {
        None => None,
        Some(t) => match t.parse::<jiff::Timestamp>() {
            Ok(ts) => Some(ts.as_millisecond()),
            Err(e) => return error(400, format!("startedAfter {t:?}: not an RFC 3339 time: {e}")),
        },
    };
    let mut all = matching(s, caller, q, &states);
    // E2B's "started at or after".
    all.retain(|x| after_ms.is_none_or(|a| i64::try_from(x.started_ms).unwrap_or(i64::MAX) >= a));
    let running = all.iter().filter(|x| x.state() == St::Running).count();
    if asc {
        all.sort_by_key(|x| x.seq);
        all.retain(|x| after.is_none_or(|a| x.seq > a));
    } else {
        all.sort_by_key(|x| std::cmp::Reverse(x.seq));
        all.retain(|x| after.is_none_or(|a| x.seq < a));
    }
    let more = all.len() > limit;
    all.truncate(limit);
    let mut r = json_response(StatusCode::OK, &Value::Array(all.iter().map(|x| listed(x)).collect()));
    if more
        && let Some(last) = all.last()
        && let Ok(v) = HeaderValue::from_str(&format!("seq-{}", last.seq))
    {
        r.headers_mut().insert("x-next-token", v);
    }
    if states.contains(&St::Running)
        && let Ok(v) = HeaderValue::from_str(&running.to_string())
    {
        r.headers_mut().insert("x-total-running", v);
    }
    r
}

async fn set_timeout(s: &Shared, caller: &Caller, id: &str, v: &Value) -> Response {
    let Some(x) = s.owned(caller, id) else {
        return not_found(id);
    };
    if v.get("timeout").is_none() {
        return error(400, "timeout: required");
    }
    let t = match timeout_of(s, caller, v, 0) {
        Ok(t) => t,
        Err(r) => return refuse(r),
    };
    let _held = x.op.lock().await;
    x.set_end(now_ms() + t * 1000).await;
    empty(StatusCode::NO_CONTENT)
}

async fn pause(s: &Shared, caller: &Caller, id: &str) -> Response {
    let Some(x) = s.owned(caller, id) else {
        return not_found(id);
    };
    let _held = x.op.lock().await;
    match x.state() {
        St::Paused => return error(409, format!("Sandbox {id} is already paused")),
        St::Gone => return not_found(id),
        St::Running => {}
    }
    match x.pause().await {
        Ok(_) => empty(StatusCode::NO_CONTENT),
        Err(e) => lifecycle_error(&e),
    }
}

async fn resume(s: &Shared, caller: &Caller, id: &str, v: &Value) -> Response {
    let Some(x) = s.owned(caller, id) else {
        return not_found(id);
    };
    let t = match timeout_of(s, caller, v, DEFAULT_TIMEOUT) {
        Ok(t) => t,
        Err(r) => return refuse(r),
    };
    let _held = x.op.lock().await;
    match x.state() {
        St::Running => return error(409, format!("Sandbox {id} is already running")),
        St::Gone => return not_found(id),
        St::Paused => {}
    }
    match x.resume(now_ms() + t * 1000).await {
        Ok(()) => json_response(StatusCode::CREATED, &sandbox(s, &x)),
        Err(e) => lifecycle_error(&e),
    }
}

async fn connect(s: &Shared, caller: &Caller, id: &str, v: &Value) -> Response {
    let Some(x) = s.owned(caller, id) else {
        return not_found(id);
    };
    let t = match timeout_of(s, caller, v, 300) {
        Ok(t) => t,
        Err(r) => return refuse(r),
    };
    let _held = x.op.lock().await;
    let end = now_ms() + t * 1000;
    match x.state() {
        St::Gone => not_found(id),
        St::Running => {
            // The TTL is only extended.
            if end > *x.end_ms.borrow() {
                x.set_end(end).await;
            }
            json_response(StatusCode::OK, &sandbox(s, &x))
        }
        St::Paused => match x.resume(end).await {
            Ok(()) => json_response(StatusCode::CREATED, &sandbox(s, &x)),
            Err(e) => lifecycle_error(&e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_traffic_and_the_request_host_are_read_from_the_network_asked() {
        assert!(public_traffic(None));
        assert!(public_traffic(Some(&json!({"allowOut": ["a.com"]}))));
        assert!(!public_traffic(Some(&json!({"allowPublicTraffic": false}))));
        assert_eq!(request_host(None, 8000), "localhost:8000");
        let masked = json!({"maskRequestHost": "${PORT}-app.example.com"});
        assert_eq!(request_host(Some(&masked), 8000), "8000-app.example.com");
        let refused = |n: Value| network_of(None, Some(&n)).unwrap_err().1;
        assert!(refused(json!({"allowPublicTraffic": "no"})).contains("allowPublicTraffic"));
        assert!(refused(json!({"maskRequestHost": "a\nb"})).contains("maskRequestHost"));
        assert!(refused(json!({"maskRequestHost": ""})).contains("maskRequestHost"));
        assert_eq!(network_of(None, Some(&json!({"allowPublicTraffic": false}))), Ok(None));
    }

    #[test]
    fn e2b_networks_are_agentbox_allowlists_or_refused() {
        let n = |v: Value| network_of(None, Some(&v));
        assert_eq!(network_of(Some(false), None), Ok(Some(Network::None)));
        assert_eq!(network_of(None, None), Ok(None));
        assert_eq!(
            n(json!({"allowOut": ["a.com"]})),
            Ok(Some(Network::Allow(vec!["a.com".into()]))),
            "allowOut alone is an allowlist: read the way that fails closed"
        );
        assert_eq!(n(json!({"rules": {"a.com": []}})).unwrap_err().0, 400);
        assert_eq!(n(json!({"denyOut": ["0.0.0.0/0"]})), Ok(Some(Network::None)));
        assert_eq!(
            n(json!({"denyOut": ["0.0.0.0/0"], "allowOut": ["a.com", "10.0.0.0/8"]})),
            Ok(Some(Network::Allow(vec!["a.com".into(), "10.0.0.0/8".into()])))
        );
        let refused = n(json!({"denyOut": ["1.2.3.4/32"]})).unwrap_err();
        assert_eq!(refused.0, 400);
        assert!(
            refused.1.contains("network.denyOut") && refused.1.contains("allowlists"),
            "{}",
            refused.1
        );
        assert_eq!(n(json!({"allowOut": "a.com"})).unwrap_err().0, 400);
        assert_eq!(n(json!({"allowOut": [1]})).unwrap_err().0, 400);
    }
}

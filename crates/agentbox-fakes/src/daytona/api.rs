//! The control plane, under `/api`: sandboxes (create, get, list, delete, start, stop,
//! archive, labels, the auto intervals, ttl, network settings, the toolbox and preview URLs),
//! volumes (see `volume`) and snapshots (get), answered in the shapes of `daytona_api_client`'s models.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::http::Method;
use serde_json::{Map, Value, json};

use crate::daytona::Query;
use crate::daytona::error::{DError, DResult, ok};
use crate::daytona::state::{NewSandbox, Rec, Sbx, Shared, rfc3339, uuid};

/// The most entries either allow list may hold (D190 `network-validation.util.ts`).
const MAX_ALLOW: usize = 10;
/// The default and the largest page of a list.
const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 200;

pub(crate) async fn route(s: &Arc<Shared>, m: &Method, seg: &[&str], q: &Query, body: Option<Value>) -> DResult {
    let post = *m == Method::POST;
    let get = *m == Method::GET;
    match seg {
        ["sandbox"] if post => create(s, body.unwrap_or(Value::Null)).await,
        ["sandbox"] if get => list(s, q),
        ["sandbox", id] if get => {
            let sbx = s.find(id)?;
            ok(sbx.rec().dto(&sbx.id, s))
        }
        ["sandbox", id] if *m == Method::DELETE => {
            let sbx = s.find(id)?;
            let rec = s.delete(&sbx).await?;
            ok(rec.dto(&sbx.id, s))
        }
        ["sandbox", id, "start"] if post => {
            let sbx = s.find(id)?;
            let rec = s.start(&sbx).await?;
            ok(rec.dto(&sbx.id, s))
        }
        ["sandbox", id, "stop"] if post => {
            let sbx = s.find(id)?;
            match q.get("force") {
                None | Some("true" | "false") => {}
                Some(v) => return Err(DError::bad_request(format!("force must be a boolean value, not {v:?}"))),
            }
            let rec = s.stop(&sbx).await?;
            ok(rec.dto(&sbx.id, s))
        }
        ["sandbox", id, "archive"] if post => {
            let sbx = s.find(id)?;
            let rec = s.archive(&sbx).await?;
            ok(rec.dto(&sbx.id, s))
        }
        ["sandbox", id, "labels"] if *m == Method::PUT => {
            let sbx = s.find(id)?;
            let body = body.unwrap_or(Value::Null);
            let labels =
                str_map(&body, "labels")?.ok_or_else(|| DError::bad_request("labels must be an object of strings"))?;
            let rec = sbx.set_labels(labels);
            ok(json!({"labels": rec.labels}))
        }
        [
            "sandbox",
            id,
            kind @ ("autostop" | "autoarchive" | "autodelete" | "ttl"),
            minutes,
        ] if post => {
            let sbx = s.find(id)?;
            let n: i64 = minutes
                .parse()
                .map_err(|_| DError::bad_request(format!("{kind}: {minutes:?} is not an integer number of minutes")))?;
            let rec = match *kind {
                "autostop" if n < 0 => {
                    return Err(DError::bad_request("autoStopInterval must be a non-negative integer"));
                }
                "autoarchive" if n < 0 => {
                    return Err(DError::bad_request(
                        "autoArchiveInterval must be a non-negative integer",
                    ));
                }
                "ttl" if n < 0 => return Err(DError::bad_request("ttlMinutes must be a non-negative integer")),
                "autostop" => {
                    sbx.touch();
                    sbx.change(|r| r.auto_stop = n)
                }
                "autoarchive" => sbx.change(|r| r.auto_archive = if n == 0 { MAX_ARCHIVE } else { n }),
                "autodelete" => {
                    let rec = sbx.change(|r| r.auto_delete = n);
                    if n == 0 && matches!(rec.state.as_str(), "stopped" | "archived") && !sbx.deleting() {
                        s.delete(&sbx).await?
                    } else {
                        rec
                    }
                }
                _ => s.set_ttl(&sbx, n).await,
            };
            ok(rec.dto(&sbx.id, s))
        }
        ["sandbox", id, "network-settings"] if post => {
            let sbx = s.find(id)?;
            if s.network_unenforced {
                return Err(DError::api(
                    400,
                    "BAD_REQUEST",
                    "Network settings are not available for organizations on this tier (sandboxLimitedNetworkEgress)",
                ));
            }
            let body = body.unwrap_or(Value::Null);
            let block = opt_bool(&body, "networkBlockAll")?;
            let nets = opt_str(&body, "networkAllowList")?
                .map(|v| network_list(&v))
                .transpose()?;
            let domains = opt_str(&body, "domainAllowList")?
                .map(|v| domain_list(&v))
                .transpose()?;
            let rec = sbx.change(|r| {
                if let Some(b) = block {
                    r.network_block_all = b;
                }
                if let Some(n) = nets {
                    r.network_allow_list = n;
                }
                if let Some(d) = domains {
                    r.domain_allow_list = d;
                }
            });
            ok(rec.dto(&sbx.id, s))
        }
        ["sandbox", id, "toolbox-proxy-url"] if get => {
            s.find(id)?;
            ok(json!({"url": format!("{}/toolbox", s.base)}))
        }
        ["sandbox", id, "ports", port, "preview-url"] if get => {
            let sbx = s.find(id)?;
            let p: u16 = port
                .parse()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| DError::bad_request(format!("Invalid port {port:?}")))?;
            let rec = sbx.rec();
            ok(json!({
                "sandboxId": sbx.id,
                "url": format!("{}/preview/{}/{p}", s.base, sbx.id),
                "token": rec.preview_token,
            }))
        }
        ["volumes"] if post => s.volumes.create(&body.unwrap_or(Value::Null)),
        ["volumes"] if get => s.volumes.list(),
        ["volumes", "by-name", name] if get => s.volumes.by_name(name),
        ["volumes", id] if get => s.volumes.get(id),
        ["volumes", id] if *m == Method::DELETE => {
            let in_use = s
                .all()
                .into_iter()
                .find(|x| !x.deleting() && x.rec().volumes.iter().any(|v| v.volume_id == *id))
                .map(|x| x.id.clone());
            s.volumes.delete(id, in_use)
        }
        ["snapshots", name] if get => {
            let snap = s
                .snapshot(name)
                .ok_or_else(|| DError::api(404, "SNAPSHOT_NOT_FOUND", format!("Snapshot {name} not found")))?;
            let t = rfc3339(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_767_225_600));
            ok(json!({
                "id": format!("snapshot-{}", crate::daytona::state::fnv1a(snap.name.as_bytes())),
                "organizationId": crate::daytona::state::ORGANIZATION,
                "general": false,
                "name": snap.name,
                "imageName": snap.name,
                "state": "active",
                "size": snap.disk_gb,
                "entrypoint": null,
                "cpu": snap.cpu,
                "gpu": 0,
                "mem": snap.memory_gb,
                "disk": snap.disk_gb,
                "errorReason": null,
                "createdAt": t,
                "updatedAt": t,
                "lastUsedAt": null,
                "sourceSandboxId": null,
                "sandboxClass": snap.class,
            }))
        }
        _ => Err(DError::api(
            404,
            "NOT_FOUND",
            format!("Cannot {m} /api/{}", seg.join("/")),
        )),
    }
}

/// autoArchiveInterval 0 means the largest (D190: 30 days).
const MAX_ARCHIVE: i64 = 30 * 24 * 60;

/// `POST /sandbox`, and the fault [`crate::daytona::FakeDaytona::fail_after_next_create`]:
/// taken as the request arrives, so it is this create's whatever comes of it; a create that
/// is refused answers its own refusal, one that made its sandbox answers the fault's status.
async fn create(s: &Arc<Shared>, body: Value) -> DResult {
    let lost = s.fail_after_create.lock().unwrap_or_else(|p| p.into_inner()).take();
    let made = create_sandbox(s, body).await?;
    match lost {
        Some(status) => {
            let e = DError::lost_answer(status);
            tracing::info!(status, "a create made its sandbox and is answered as failed");
            Err(e)
        }
        None => Ok(made),
    }
}

async fn create_sandbox(s: &Arc<Shared>, body: Value) -> DResult {
    if !body.is_object() {
        return Err(DError::bad_request("the body must be a CreateSandbox JSON object"));
    }
    let snapshot_named = opt_str(&body, "snapshot")?.filter(|n| !n.is_empty());
    for f in ["cpu", "gpu", "memory", "disk"] {
        if !body[f].is_null() {
            opt_int(&body, f)?;
            if !body["buildInfo"].is_null() {
                continue;
            }
            return Err(DError::bad_request(
                "Cannot specify Sandbox resources when using a snapshot",
            ));
        }
    }
    if !body["buildInfo"].is_null() {
        return Err(DError::bad_request(
            "buildInfo: this fake Daytona builds no images: create from a snapshot (its snapshots are directories given at its start)",
        ));
    }
    let snap_name = snapshot_named.unwrap_or_else(|| s.default_snapshot.clone());
    let snap = s.snapshot(&snap_name).ok_or_else(|| {
        DError::bad_request(format!(
            "Snapshot {snap_name} not found. Did you add it through the Daytona Dashboard?"
        ))
    })?;
    let id = uuid();
    let name = opt_str(&body, "name")?
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| id.clone());
    if name.len() > 255 {
        return Err(DError::bad_request(
            "name must be shorter than or equal to 255 characters",
        ));
    }
    // Names are unique among the organization's sandboxes (a unique index, D190 answering its
    // violation 409); a sandbox's id is another column, so a name equal to a deleted
    // sandbox's id is free.
    if s.all().iter().any(|x| x.rec().name == name) {
        return Err(DError::api(
            409,
            "CONFLICT",
            format!("Sandbox with name {name} already exists"),
        ));
    }
    let labels = str_map(&body, "labels")?.unwrap_or_default();
    let env = str_map(&body, "env")?.unwrap_or_default();
    let volumes = s.volumes.mounts(&body)?;
    let user = opt_str(&body, "user")?
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "daytona".into());
    let block = opt_bool(&body, "networkBlockAll")?.unwrap_or(false);
    let nets = opt_str(&body, "networkAllowList")?
        .map(|v| network_list(&v))
        .transpose()?
        .flatten();
    let domains = opt_str(&body, "domainAllowList")?
        .map(|v| domain_list(&v))
        .transpose()?
        .flatten();
    let auto_stop = opt_int(&body, "autoStopInterval")?.unwrap_or(15);
    let auto_archive = opt_int(&body, "autoArchiveInterval")?.unwrap_or(7 * 24 * 60);
    let auto_delete = opt_int(&body, "autoDeleteInterval")?.unwrap_or(-1);
    let ttl = opt_int(&body, "ttlMinutes")?.unwrap_or(0);
    if auto_stop < 0 {
        return Err(DError::bad_request("autoStopInterval must be a non-negative integer"));
    }
    if auto_archive < 0 {
        return Err(DError::bad_request(
            "autoArchiveInterval must be a non-negative integer",
        ));
    }
    if ttl < 0 {
        return Err(DError::bad_request("ttlMinutes must be a non-negative integer"));
    }
    let public = opt_bool(&body, "public")?.unwrap_or(false);
    let now = SystemTime::now();
    // An organization whose tier has no network settings: the create succeeds and the
    // sandbox has the open network, its read saying so.
    let (block, nets, domains) = if s.network_unenforced {
        (false, None, None)
    } else {
        (block, nets, domains)
    };
    let mut token = [0u8; 16];
    let _ = getrandom::fill(&mut token);
    let rec = Rec {
        name,
        snapshot: snap.name.clone(),
        user,
        env,
        labels,
        public,
        network_block_all: block,
        network_allow_list: nets,
        domain_allow_list: domains,
        cpu: snap.cpu,
        memory: snap.memory_gb,
        disk: snap.disk_gb,
        class: snap.class.clone(),
        state: "creating".into(),
        desired_state: "started".into(),
        auto_stop,
        auto_archive: if auto_archive == 0 { MAX_ARCHIVE } else { auto_archive },
        auto_delete,
        ttl,
        ttl_from: (now, Instant::now()),
        created_at: now,
        updated_at: now,
        last_activity_at: now,
        preview_token: token.iter().map(|x| format!("{x:02x}")).collect(),
        box_id: None,
        volumes,
    };
    let root = snap.rootfs.clone().or_else(|| s.rootfs.clone());
    let sbx = s.create(NewSandbox { id, rec, root }).await?;
    tracing::info!(sandbox = %sbx.id, "created");
    ok(sbx.rec().dto(&sbx.id, s))
}

/// `GET /sandbox`: answered from the label index, which trails each change by the query
/// shape's lag.
fn list(s: &Arc<Shared>, q: &Query) -> DResult {
    let labels_q = q.get("labels").map(str::to_string);
    s.list_queries
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(labels_q.clone());
    let want: BTreeMap<String, String> = match &labels_q {
        None => BTreeMap::new(),
        Some(t) => {
            let v: Value = serde_json::from_str(t)
                .map_err(|e| DError::bad_request(format!("labels must be a JSON object of strings: {e}")))?;
            str_map(&json!({"labels": v}), "labels")?
                .ok_or_else(|| DError::bad_request("labels must be a JSON object of strings"))?
        }
    };
    let limit = match q.get("limit") {
        None | Some("") => DEFAULT_LIMIT,
        Some(l) => match l.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
            Ok(0) => return Err(DError::bad_request("limit must not be less than 1")),
            Ok(_) => {
                return Err(DError::bad_request(format!(
                    "limit must not be greater than {MAX_LIMIT}"
                )));
            }
            Err(_) => return Err(DError::bad_request("limit must be an integer number")),
        },
    };
    let states = q.all("states");
    let name = q.get("name").map(str::to_lowercase);
    let id_prefix = q.get("id").map(str::to_lowercase);
    let lag = s.lag_of(labels_q.as_deref());
    let now = Instant::now();
    let mut hits: Vec<(Arc<Sbx>, Rec, BTreeMap<String, String>)> = Vec::new();
    for sbx in s.all() {
        let Some(indexed) = sbx.indexed_labels(lag, now) else {
            continue;
        };
        if !want.iter().all(|(k, v)| indexed.get(k) == Some(v)) {
            continue;
        }
        let rec = sbx.rec();
        if !states.is_empty() && !states.contains(&rec.state) {
            continue;
        }
        if let Some(n) = &name
            && !rec.name.to_lowercase().starts_with(n.as_str())
        {
            continue;
        }
        if let Some(p) = &id_prefix
            && !sbx.id.to_lowercase().starts_with(p.as_str())
        {
            continue;
        }
        hits.push((sbx, rec, indexed));
    }
    // Newest first, as the API's default sort (createdAt, desc); the id breaks ties.
    let key = |rec: &Rec, id: &str| (millis(rec.created_at), id.to_string());
    hits.sort_by_key(|h| std::cmp::Reverse(key(&h.1, &h.0.id)));
    if let Some(c) = q.get("cursor").filter(|c| !c.is_empty()) {
        let (ms, id) = c
            .split_once(':')
            .and_then(|(ms, id)| ms.parse::<u128>().ok().map(|ms| (ms, id.to_string())))
            .ok_or_else(|| DError::bad_request(format!("Invalid cursor {c:?}")))?;
        hits.retain(|(sbx, rec, _)| key(rec, &sbx.id) < (ms, id.clone()));
    }
    let more = hits.len() > limit;
    hits.truncate(limit);
    let next = if more {
        hits.last()
            .map(|(sbx, rec, _)| format!("{}:{}", millis(rec.created_at), sbx.id))
    } else {
        None
    };
    let items: Vec<Value> = hits
        .iter()
        .map(|(sbx, rec, indexed)| rec.list_item(&sbx.id, s, indexed))
        .collect();
    ok(json!({"items": items, "nextCursor": next}))
}

fn millis(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

fn opt_str(body: &Value, f: &str) -> Result<Option<String>, DError> {
    match &body[f] {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        _ => Err(DError::bad_request(format!("{f} must be a string"))),
    }
}

fn opt_bool(body: &Value, f: &str) -> Result<Option<bool>, DError> {
    match &body[f] {
        Value::Null => Ok(None),
        Value::Bool(b) => Ok(Some(*b)),
        _ => Err(DError::bad_request(format!("{f} must be a boolean value"))),
    }
}

fn opt_int(body: &Value, f: &str) -> Result<Option<i64>, DError> {
    match &body[f] {
        Value::Null => Ok(None),
        v => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| DError::bad_request(format!("{f} must be an integer number"))),
    }
}

fn str_map(body: &Value, f: &str) -> Result<Option<BTreeMap<String, String>>, DError> {
    match &body[f] {
        Value::Null => Ok(None),
        Value::Object(m) => {
            let m: &Map<String, Value> = m;
            let mut out = BTreeMap::new();
            for (k, v) in m {
                let v = v
                    .as_str()
                    .ok_or_else(|| DError::bad_request(format!("{f}.{k} must be a string")))?;
                out.insert(k.clone(), v.to_string());
            }
            Ok(Some(out))
        }
        _ => Err(DError::bad_request(format!("{f} must be an object"))),
    }
}

/// `networkAllowList`: comma-separated IPv4 CIDRs, at most ten; empty clears it.
fn network_list(v: &str) -> Result<Option<String>, DError> {
    let items: Vec<&str> = v.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    if items.is_empty() {
        return Ok(None);
    }
    if items.len() > MAX_ALLOW {
        return Err(DError::bad_request(format!(
            "Network allow list cannot contain more than {MAX_ALLOW} networks"
        )));
    }
    for i in &items {
        let ok = i.split_once('/').is_some_and(|(ip, bits)| {
            ip.parse::<std::net::Ipv4Addr>().is_ok() && bits.parse::<u8>().is_ok_and(|b| b <= 32)
        });
        if !ok {
            return Err(DError::bad_request(format!(
                "Invalid network allow list: {i} is not a valid IPv4 CIDR (e.g. 10.0.0.0/8)"
            )));
        }
    }
    Ok(Some(items.join(",")))
}

/// `domainAllowList`: comma-separated domains (a leading `*.` allowed), at most ten; empty
/// clears it.
fn domain_list(v: &str) -> Result<Option<String>, DError> {
    let items: Vec<&str> = v.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    if items.is_empty() {
        return Ok(None);
    }
    if items.len() > MAX_ALLOW {
        return Err(DError::bad_request(format!(
            "Domain allow list cannot contain more than {MAX_ALLOW} domains"
        )));
    }
    for i in &items {
        let d = i.strip_prefix("*.").unwrap_or(i);
        let labels: Vec<&str> = d.split('.').collect();
        let ok = d.len() <= 253
            && labels.len() >= 2
            && labels.iter().all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && !l.starts_with('-')
                    && !l.ends_with('-')
                    && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            })
            && labels
                .last()
                .is_some_and(|t| t.chars().all(|c| c.is_ascii_alphabetic()));
        if !ok {
            return Err(DError::bad_request(format!(
                "Invalid domain allow list: {i} is not a valid domain (e.g. example.com or *.example.com)"
            )));
        }
    }
    Ok(Some(items.join(",")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_lists_are_checked_as_the_api_does() {
        assert_eq!(
            network_list("10.0.0.0/8, 1.2.3.4/32").unwrap().as_deref(),
            Some("10.0.0.0/8,1.2.3.4/32")
        );
        assert!(network_list("10.0.0.0").is_err());
        assert!(network_list("example.com").is_err());
        assert!(network_list(&["1.1.1.1/32"; 11].join(",")).is_err());
        assert_eq!(
            domain_list("*.pypi.org,github.com").unwrap().as_deref(),
            Some("*.pypi.org,github.com")
        );
        assert!(domain_list("10.0.0.0/8").is_err());
        assert!(domain_list("localhost").is_err());
        assert!(domain_list(&["a.com"; 11].join(",")).is_err());
        assert_eq!(domain_list(" ").unwrap(), None);
    }
}

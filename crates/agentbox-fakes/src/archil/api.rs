//! The control plane's disk routes (`archil_openapi` `api/disks`): list with cursor paging,
//! get, create and delete. Exec is `exec`'s.
//!
//! A listing is in creation order; its `nextCursor` (the envelope's, beside `data`) is set
//! while disks remain and absent on the last page, `limit` is 1 to 100 (default and past 100:
//! 100, as the server clamps), `name` matches a disk's name exactly; `short=true` and `q`
//! are not served (400). Disk names are
//! `[A-Za-z0-9_-]`, at most 255 bytes, one disk per name (a second create is 409
//! `conflict`: the openapi documents a 409 for create and names nothing else for it).

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use crate::archil::Query;
use crate::archil::error::{ApiError, ApiResult, json_response, ok};
use crate::archil::files::{DiskRoot, Owner};
use crate::archil::state::{Disk, Shared, random_id};

/// The largest page of disks.
const PAGE_LIMIT: usize = 100;
/// The longest disk name.
const MAX_NAME: usize = 255;

pub(crate) async fn route(s: &Arc<Shared>, m: &Method, seg: &[&str], q: &Query, body: Option<Value>) -> ApiResult {
    match (m, seg) {
        (&Method::GET, ["disks"]) => list(s, q),
        (&Method::POST, ["disks"]) => {
            let d = create(s, body.as_ref().unwrap_or(&Value::Null))?;
            ok(json!({"diskId": d.id, "authorizedUsers": []}))
        }
        (&Method::GET, ["disks", id]) => ok(s.disk_json(&found(s, id)?)),
        (&Method::DELETE, ["disks", id]) => delete(s, id).await,
        _ => Err(ApiError::not_found(format!(
            "{m} /api/{}: no such route in this fake",
            seg.join("/")
        ))),
    }
}

pub(crate) fn found(s: &Shared, id: &str) -> Result<Disk, ApiError> {
    s.disk(id)
        .ok_or_else(|| ApiError::not_found(format!("disk {id} not found")))
}

fn list(s: &Shared, q: &Query) -> ApiResult {
    // The openapi client sends `short=false` on every listing; `short=true` (a short form
    // with a `total`) and `q` (a search) are not served.
    if q.get("q").is_some_and(|v| !v.is_empty()) || q.get("short").is_some_and(|v| v != "false") {
        return Err(ApiError::invalid(
            "q and short=true: not served by this fake (limit, cursor, name, short=false)",
        ));
    }
    let limit = match q.get("limit") {
        None => PAGE_LIMIT,
        Some(l) => match l.parse::<usize>() {
            Ok(n) if n >= 1 => n.min(PAGE_LIMIT),
            _ => return Err(ApiError::invalid(format!("limit {l:?}: a whole number from 1"))),
        },
    };
    let after = match q.get("cursor") {
        None | Some("") => None,
        Some(c) => Some(
            c.strip_prefix("cur-")
                .and_then(|n| n.parse::<u64>().ok())
                .ok_or_else(|| ApiError::invalid(format!("cursor {c:?}: not a cursor this API gave")))?,
        ),
    };
    let name = q.get("name");
    let mut disks: Vec<Disk> = s
        .disks
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .filter(|d| name.is_none_or(|n| d.name == n))
        .filter(|d| after.is_none_or(|a| d.seq > a))
        .cloned()
        .collect();
    disks.sort_by_key(|d| d.seq);
    let more = disks.len() > limit;
    disks.truncate(limit);
    let mut v = json!({
        "success": true,
        "data": disks.iter().map(|d| s.disk_json(d)).collect::<Vec<_>>(),
    });
    if more && let Some(last) = disks.last() {
        v["nextCursor"] = json!(format!("cur-{}", last.seq));
    }
    Ok(json_response(StatusCode::OK, &v))
}

/// `POST /api/disks` (and [`crate::archil::FakeArchil::create_disk`]): the record and its
/// directory, empty, owned by the boxes' id, mode 0755 or `rootAttrs.mode`.
pub(crate) fn create(s: &Shared, body: &Value) -> Result<Disk, ApiError> {
    let o = body
        .as_object()
        .ok_or_else(|| ApiError::invalid("the body must be a JSON object with a name"))?;
    for k in o.keys() {
        if !matches!(k.as_str(), "name" | "mounts" | "allowedIps" | "rootAttrs") {
            return Err(ApiError::invalid(format!(
                "{k}: not served by this fake (name, mounts (empty), allowedIps, rootAttrs)"
            )));
        }
    }
    let name = o
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid("name: required, a string"))?;
    check_name(name)?;
    match o.get("mounts") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) if a.is_empty() => {}
        Some(_) => {
            return Err(ApiError::invalid(
                "mounts: bring-your-own buckets are not served by this fake (its disks are Archil-managed)",
            ));
        }
    }
    let allowed_ips = match o.get("allowedIps") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ApiError::invalid("allowedIps: a list of strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::invalid("allowedIps: a list of strings")),
    };
    let (root_attrs, mode) = match o.get("rootAttrs") {
        None | Some(Value::Null) => (None, 0o755),
        Some(Value::Object(a)) => {
            let mut mode = 0o755;
            for (k, v) in a {
                let n = v
                    .as_u64()
                    .filter(|n| *n <= u32::MAX as u64)
                    .ok_or_else(|| ApiError::invalid(format!("rootAttrs.{k}: a whole number")))?;
                match k.as_str() {
                    "uid" | "gid" => {}
                    "mode" if n <= 0o7777 => mode = n as u32,
                    "mode" => return Err(ApiError::invalid("rootAttrs.mode: at most 0o7777")),
                    _ => return Err(ApiError::invalid(format!("rootAttrs.{k}: uid, gid or mode"))),
                }
            }
            (Some(Value::Object(a.clone())), mode)
        }
        Some(_) => return Err(ApiError::invalid("rootAttrs: an object of uid, gid, mode")),
    };
    let mut disks = s.disks.lock().unwrap_or_else(|p| p.into_inner());
    if disks.values().any(|d| d.name == name) {
        return Err(ApiError::new(
            409,
            "conflict",
            format!("a disk named {name} already exists"),
        ));
    }
    // Ids are random; one taken (or a directory already there) is drawn again.
    let mut id = random_id("dsk-");
    for _ in 0..8 {
        if !disks.contains_key(&id) && !s.disk_dir(&id).exists() {
            break;
        }
        id = random_id("dsk-");
    }
    let dir = s.disk_dir(&id);
    std::fs::create_dir(&dir)
        .map_err(|e| ApiError::internal(format!("making disk {id}'s directory {}: {e}", dir.display())))?;
    let made = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
        .map_err(|e| e.to_string())
        .and_then(|()| give(&dir, s.owner));
    if let Err(e) = made {
        let _ = std::fs::remove_dir(&dir);
        return Err(ApiError::internal(format!("setting up disk {id}'s directory: {e}")));
    }
    let d = Disk {
        id: id.clone(),
        name: name.to_string(),
        seq: s.next_seq.fetch_add(1, Ordering::SeqCst),
        created_at: SystemTime::now(),
        allowed_ips,
        root_attrs,
    };
    disks.insert(id, d.clone());
    Ok(d)
}

/// Give a disk's new directory to the boxes' id.
fn give(dir: &std::path::Path, owner: Owner) -> Result<(), String> {
    let root = DiskRoot::open(dir, Owner(None)).map_err(|e| format!("{e:?}"))?;
    let fd = root
        .at(
            "",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| format!("{e:?}"))?;
    owner.give(&fd).map_err(|e| format!("{e:?}"))
}

pub(crate) fn check_name(name: &str) -> Result<(), ApiError> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(ApiError::invalid(format!("name {name:?}: 1 to {MAX_NAME} characters")));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(ApiError::invalid(format!(
            "name {name:?}: only letters, digits, dashes and underscores"
        )));
    }
    Ok(())
}

/// `DELETE /api/disks/{id}`: the record at once, then its files (`{"success": true}`, the
/// openapi's ApiResponseEmpty). An exec that has the disk mounted keeps what it has until
/// it ends.
async fn delete(s: &Arc<Shared>, id: &str) -> ApiResult {
    let removed = s.disks.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    if removed.is_none() {
        return Err(ApiError::not_found(format!("disk {id} not found")));
    }
    let dir = s.disk_dir(id);
    // remove_dir_all does not follow symbolic links: what a box linked to stays.
    let gone = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&dir)).await;
    if let Ok(Err(e)) = gone {
        tracing::warn!(disk = %id, error = %e, "removing a deleted disk's files");
    }
    Ok(json_response(StatusCode::OK, &json!({"success": true})))
}

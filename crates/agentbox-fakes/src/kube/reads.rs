//! The reads: a list (with label and field selectors, pages and their continue tokens) and a watch
//! (its events from a resource version, bookmarks, its timeout), as the real server answers them.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use serde_json::{Value, json};

use super::api::{ApiResult, Flag, Query, Shared, ok};
use super::discovery::strip_kind;
use crate::kube::selector::{FieldSelector, LabelSelector, labels_of};
use crate::kube::status::ApiError;
use crate::kube::store::{Event, Kind};

/// A watch with no `timeoutSeconds` ends after this long (the real server picks 30 to 60
/// minutes); a client watches again.
pub(super) const WATCH_DEFAULT: Duration = Duration::from_secs(30 * 60);

pub(super) fn field_labels(kind: Kind) -> &'static [&'static str] {
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
pub(super) struct Selection {
    labels: LabelSelector,
    fields: FieldSelector,
    any: bool,
}

impl Selection {
    pub(super) fn of(kind: Kind, q: &Query) -> Result<Selection, ApiError> {
        let l = q.get("labelSelector").unwrap_or("");
        let f = q.get("fieldSelector").unwrap_or("");
        Ok(Selection {
            labels: LabelSelector::parse(l).map_err(ApiError::bad_request)?,
            fields: FieldSelector::parse(f, field_labels(kind)).map_err(ApiError::bad_request)?,
            any: !l.trim().is_empty() || !f.trim().is_empty(),
        })
    }

    pub(super) fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(&labels_of(obj)) && self.fields.matches(obj)
    }
}

pub(super) fn key_of(obj: &Value) -> String {
    format!(
        "{}/{}",
        obj["metadata"]["namespace"].as_str().unwrap_or(""),
        obj["metadata"]["name"].as_str().unwrap_or("")
    )
}

pub(super) fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

pub(super) fn list(s: &Arc<Shared>, kind: Kind, ns: Option<&str>, q: &Query) -> ApiResult {
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
pub(super) fn seen(kind: Kind, ns: Option<&str>, sel: &Selection, e: &Event) -> Option<Value> {
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

pub(super) fn watch(s: &Arc<Shared>, kind: Kind, ns: Option<&str>, sel: Selection, q: &Query) -> ApiResult {
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

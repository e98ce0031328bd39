//! E2B's snapshots and forks, over the backend's (each snapshot the caller's own).
//!
//! `POST /sandboxes/{id}/snapshots` (`{name?}`) takes one of a running sandbox's files (its
//! programs go on; `memory: true` is refused: no provider here keeps a box's memory): 201
//! `{snapshotID, names}`, the id its name (`snap-` and 12 random letters and digits when none
//! is given), which a create then names as its template. `GET /snapshots` lists the caller's
//! (`sandboxID` and `name` filters, `limit` and `nextToken` paging, the next token in
//! `X-Next-Token`); `DELETE /templates/{id}` deletes one (204; 404 when the caller has none of
//! that name). `POST /sandboxes/{id}/fork` (`{timeout?, count?}`, 1 to 16) makes `count`
//! sandboxes holding the sandbox's files as they are now, each asked as the sandbox was (its
//! template, metadata, environment and network): 201 with `[{sandbox}]`.

use std::sync::Arc;

use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

use crate::Caller;
use crate::api::{DEFAULT_TIMEOUT, error, json_response, not_found, refuse, sandbox, timeout_of};
use crate::http::Query;
use crate::state::{Asked, Shared, lock, random};

/// The most sandboxes one fork makes (agentbox's bound on a fork).
const MAX_FORK: u64 = 16;
/// The most snapshots one listing page holds.
const PAGE_MAX: usize = 100;

/// `POST /sandboxes/{id}/snapshots`.
pub(crate) async fn take(s: &Shared, caller: &Caller, id: &str, v: &Value) -> Response {
    let Some(x) = s.owned(caller, id) else {
        return not_found(id);
    };
    let given = match v.get("name") {
        None | Some(Value::Null) => None,
        Some(Value::String(n)) => Some(n.clone()),
        Some(n) => return error(400, format!("name: {n} is not a string")),
    };
    // E2B's default is memory and files; agentbox's providers keep files. Unset, a snapshot
    // is the files (said in the docs); asked for outright, memory is refused.
    if v.get("memory").and_then(Value::as_bool) == Some(true) {
        return error(
            400,
            "memory: a snapshot here keeps the sandbox's files, not its memory (ask mode=\"filesystem\")",
        );
    }
    let name = given
        .clone()
        .unwrap_or_else(|| format!("snap-{}", random(b"abcdefghijklmnopqrstuvwxyz0123456789", 12)));
    let _held = x.op.lock().await;
    let Some(made) = x.made() else {
        return error(409, format!("Sandbox {id} is not running: resume it first"));
    };
    if let Err(r) = s.backend.snapshot(caller, &made, &name).await {
        return error(r.status, r.message);
    }
    tracing::info!(sandbox = %id, snapshot = %name, "e2b: snapshot taken");
    json_response(
        StatusCode::CREATED,
        &json!({"snapshotID": name, "names": given.into_iter().collect::<Vec<_>>()}),
    )
}

/// `GET /snapshots`.
pub(crate) async fn list(s: &Shared, caller: &Caller, q: &Query) -> Response {
    let all = match s.backend.snapshots(caller).await {
        Ok(a) => a,
        Err(r) => return error(r.status, r.message),
    };
    // A snapshot's sandbox is known while the sandbox is: its box is the one it was taken of.
    let of_sandbox = q.get("sandboxID").filter(|x| !x.is_empty()).map(|sid| {
        s.owned(caller, sid)
            .and_then(|x| lock(&x.boxed).as_ref().map(|b| b.id().clone()))
    });
    let limit = match q.get("limit") {
        None => PAGE_MAX,
        Some(l) => match l.parse::<usize>() {
            Ok(n) if (1..=PAGE_MAX).contains(&n) => n,
            _ => return error(400, format!("limit {l:?}: 1 to {PAGE_MAX}")),
        },
    };
    let mut names: Vec<String> = all
        .into_iter()
        .filter(|(_, from)| match &of_sandbox {
            None => true,
            Some(b) => b.is_some() && from.as_ref() == b.as_ref(),
        })
        .map(|(n, _)| n)
        .filter(|n| q.get("name").is_none_or(|want| want.is_empty() || n == want))
        .collect();
    names.sort();
    if let Some(after) = q.get("nextToken").filter(|t| !t.is_empty()) {
        names.retain(|n| n.as_str() > after);
    }
    let more = names.len() > limit;
    names.truncate(limit);
    let page: Vec<Value> = names.iter().map(|n| json!({"snapshotID": n, "names": []})).collect();
    let mut r = json_response(StatusCode::OK, &Value::Array(page));
    if more
        && let Some(last) = names.last()
        && let Ok(v) = HeaderValue::from_str(last)
    {
        r.headers_mut().insert("x-next-token", v);
    }
    r
}

/// `DELETE /templates/{id}`: a snapshot of the caller's.
pub(crate) async fn delete(s: &Shared, caller: &Caller, id: &str) -> Response {
    match s.backend.delete_snapshot(caller, id).await {
        Ok(true) => {
            tracing::info!(snapshot = %id, "e2b: snapshot deleted");
            let mut r = Response::new(axum::body::Body::empty());
            *r.status_mut() = StatusCode::NO_CONTENT;
            r
        }
        Ok(false) => error(404, format!("template '{id}' not found")),
        Err(r) => error(r.status, r.message),
    }
}

/// `POST /sandboxes/{id}/fork`.
pub(crate) async fn fork(s: &Arc<Shared>, caller: &Caller, id: &str, v: &Value) -> Response {
    let Some(x) = s.owned(caller, id) else {
        return not_found(id);
    };
    let timeout = match timeout_of(s, caller, v, DEFAULT_TIMEOUT) {
        Ok(t) => t,
        Err(r) => return refuse(r),
    };
    let count = match v.get("count") {
        None | Some(Value::Null) => 1,
        Some(c) => match c.as_u64() {
            Some(n) if (1..=MAX_FORK).contains(&n) => n,
            _ => return error(400, format!("count {c}: 1 to {MAX_FORK}")),
        },
    };
    let made = {
        let _held = x.op.lock().await;
        match x.made() {
            Some(m) => m,
            None => return error(409, format!("Sandbox {id} is not running: resume it first")),
        }
    };
    // The forks are the caller's: its owner, its longest lifetime.
    let asked = Asked {
        owner: caller.id.clone(),
        max_lifetime: caller.max_lifetime,
        ..x.asked()
    };
    let ids: Vec<String> = (0..count)
        .map(|_| random(b"abcdefghijklmnopqrstuvwxyz0123456789", 20))
        .collect();
    let lifetime = std::time::Duration::from_secs(timeout);
    let asks: Vec<_> = ids.iter().map(|fid| s.ask(fid, &asked, lifetime)).collect();
    // Made and kept on a task of its own, as a create: a client gone mid-fork leaves sandboxes
    // that end at their timeout.
    let (s2, caller2) = (s.clone(), caller.clone());
    let kept = tokio::spawn(async move {
        let forks = s2.backend.fork(&caller2, &made, &asks).await?;
        if forks.len() != ids.len() {
            let ctx = agentbox_core::Ctx::background().with_timeout(std::time::Duration::from_secs(30));
            for f in &forks {
                let _ = f.sandbox.destroy(&ctx).await;
            }
            return Err(crate::Refusal::new(
                500,
                format!("the provider made {} boxes where {} were asked", forks.len(), ids.len()),
            ));
        }
        Ok(ids
            .into_iter()
            .zip(forks)
            .map(|(fid, m)| s2.keep(fid, asked.clone(), timeout, m))
            .collect::<Vec<_>>())
    })
    .await;
    let kept = match kept {
        Ok(Ok(k)) => k,
        Ok(Err(r)) => return error(r.status, r.message),
        Err(e) => return error(500, format!("forking the sandbox: {e}")),
    };
    let out: Vec<Value> = kept.iter().map(|x| json!({"sandbox": sandbox(s, x)})).collect();
    tracing::info!(sandbox = %id, n = out.len(), "e2b: sandbox forked");
    json_response(StatusCode::CREATED, &Value::Array(out))
}

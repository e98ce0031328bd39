//! A directory in and out of a box as a tar, with nothing trusted on either side.
//!
//! In: the client's archive is unpacked on the server by agentbox's safe extractor (never
//! `tar`: no member lands outside the directory, links and devices are skipped and said,
//! the bytes and entries are bounded), and only then is the directory sent into the box, packed
//! again by agentbox's own walker. An archive that is malformed or past a bound leaves the
//! box as it was. Out: the box's archive goes through the same extractor on the server, and
//! the client gets a tar the server packed from what came through: whatever the box put in its
//! tar (a link out of the tree, a path that climbs) never reaches the client.

use std::collections::BTreeMap;
use std::sync::Arc;

use agentbox_core::{Ctx, ErrorCode};
use agentbox_sync::{Options, PullOptions, Receipt, SeedOptions, StopReason};
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::boxes::{BoxPath, CALL_DEADLINE, reach};
use super::files::checked;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;

/// The most bytes an archive holds, either way.
pub const MAX_ARCHIVE: u64 = 256 << 20;
/// The most entries an archive holds.
pub const MAX_ENTRIES: u64 = 100_000;
/// How long a whole archive's move may take.
const ARCHIVE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(600);

/// The directory of an archive.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ArchivePath {
    /// A directory in the box: absolute, or relative to its workspace (never climbing out).
    /// Made, with its parents, when an archive goes in.
    pub path: String,
}

/// An entry left out of an archive.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct SkippedEntry {
    /// Its path in the archive.
    pub path: String,
    /// Why: `link`, `hardlink`, `device`, `fifo`, `unsafe_path`, `unsupported`...
    pub reason: String,
    /// Where a link pointed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// What an archive sent into a box did.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct Unpacked {
    /// Files and directories unpacked from the archive.
    pub written: u64,
    /// Files and directories sent into the box.
    pub sent: u64,
    /// Entries left out, by reason.
    pub skipped: BTreeMap<String, u64>,
    /// The first entries left out, by path.
    pub skips: Vec<SkippedEntry>,
    /// Files that lost a mode bit (setuid, setgid, sticky, or a write bit for others).
    pub masked: u64,
}

fn reason_text<T: Serialize>(r: &T) -> String {
    serde_json::to_value(r)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "other".into())
}

/// The failure of an extraction that stopped, or `None`.
fn stopped(receipt: &Receipt, whose: &str) -> Option<ApiError> {
    let s = receipt.stopped.as_ref()?;
    let code = match s.reason {
        StopReason::Malformed => ErrorCode::Invalid,
        StopReason::TooLarge | StopReason::TooManyEntries => ErrorCode::TooLarge,
        StopReason::TransferFailed | StopReason::CopyFailed => ErrorCode::TransferFailed,
        StopReason::Stalled => ErrorCode::Timeout,
    };
    Some(ApiError::new(code, format!("{whose}: {}", s.message)))
}

fn options() -> Options {
    Options {
        max_bytes: MAX_ARCHIVE,
        max_entries: MAX_ENTRIES,
        ..Default::default()
    }
}

fn scratch() -> Result<tempfile::TempDir, ApiError> {
    tempfile::Builder::new()
        .prefix("agentbox-archive-")
        .tempdir()
        .map_err(|e| ApiError::new(ErrorCode::Unknown, format!("a scratch directory: {e}")))
}

/// `PUT /v1/boxes/{id}/archive?path=DIR`: the body, a tar, unpacked into the directory.
pub(crate) async fn put(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
    Query(q): Query<ArchivePath>,
    body: Body,
) -> Result<Json<Unpacked>, ApiError> {
    let to = checked(&q.path, "path")?;
    let b = reach(&state, &key, &p.id).await?;
    let dir = scratch()?;
    let mut x = agentbox_sync::Extractor::new(dir.path().to_path_buf(), options());
    let mut stream = body.into_data_stream();
    let mut read = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            // A body that stopped coming is the client's time run out, as elsewhere.
            let text = e.to_string();
            let code = if text.contains("within the designated timeout") {
                ErrorCode::Timeout
            } else {
                ErrorCode::Invalid
            };
            ApiError::new(code, format!("the archive's body: {text}"))
        })?;
        read += chunk.len() as u64;
        // Headers and padding ride over the extractor's bound on contents: a tar twice the
        // bound is refused here, whatever its members claim.
        if read > 2 * MAX_ARCHIVE {
            return Err(ApiError::new(
                ErrorCode::TooLarge,
                format!("the archive: over {} bytes", 2 * MAX_ARCHIVE),
            ));
        }
        if !x.write(chunk.to_vec()).await {
            break;
        }
    }
    let receipt = x.finish().await;
    if let Some(e) = stopped(&receipt, "the archive") {
        return Err(e);
    }
    let ctx = Ctx::background().with_timeout(ARCHIVE_DEADLINE);
    let seeded = agentbox_sync::seed_dir(
        b.as_ref(),
        &SeedOptions {
            from: dir.path().to_path_buf(),
            to: to.clone(),
            ..Default::default()
        },
        &ctx,
    )
    .await?
    .whole()?;
    tracing::info!(box_id = %b.id(), path = %to, written = receipt.written, sent = seeded.sent, key = %key.name, "archive unpacked");
    Ok(Json(Unpacked {
        written: receipt.written,
        sent: seeded.sent,
        skipped: receipt.skipped.iter().map(|(r, n)| (reason_text(r), *n)).collect(),
        skips: receipt
            .skips
            .iter()
            .map(|s| SkippedEntry {
                path: s.path.clone(),
                reason: reason_text(&s.reason),
                target: s.target.clone(),
            })
            .collect(),
        masked: receipt.masked,
    }))
}

/// `GET /v1/boxes/{id}/archive?path=DIR`: the directory's contents as a tar (members relative
/// to it). Entries the server left out are counted in `agentbox-skipped`.
pub(crate) async fn get(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
    Query(q): Query<ArchivePath>,
) -> Result<Response, ApiError> {
    let from = checked(&q.path, "path")?;
    let b = reach(&state, &key, &p.id).await?;
    let dir = scratch()?;
    let to = dir.path().join("tree");
    let ctx = Ctx::background().with_timeout(ARCHIVE_DEADLINE.max(CALL_DEADLINE));
    let pulled = agentbox_sync::pull_dir(
        b.as_ref(),
        &PullOptions {
            from: from.clone(),
            to: to.clone(),
            max_bytes: Some(MAX_ARCHIVE),
            ..Default::default()
        },
        &ctx,
    )
    .await?;
    if let Some(e) = stopped(&pulled.receipt, &format!("the box's archive of {from}")) {
        return Err(e);
    }
    let skipped = pulled.receipt.skipped.clone();
    let unfollowed = pulled.mark.entries.values().map(|e| e.kind.clone()).collect::<Vec<_>>();
    packed(&key.name, b.id().to_string(), from, to, skipped, &unfollowed).await
}

/// The tree the server extracted at `to`, packed again and answered as a tar, with what was
/// left out (the extractor's skips and, by `kinds` the box listed, links and the like never
/// followed) in `agentbox-skipped`.
async fn packed(
    key: &str,
    box_id: String,
    from: String,
    to: std::path::PathBuf,
    skipped: BTreeMap<agentbox_sync::SkipReason, u64>,
    kinds: &[String],
) -> Result<Response, ApiError> {
    let packed = tokio::task::spawn_blocking(move || {
        agentbox_sync::pack_dir(&SeedOptions {
            from: to,
            ..Default::default()
        })
    })
    .await
    .map_err(|e| ApiError::new(ErrorCode::Unknown, format!("packing: {e}")))??;
    let mut skipped: BTreeMap<String, u64> = skipped.iter().map(|(r, n)| (reason_text(r), *n)).collect();
    // What the box listed but no pull asks for: links and the like, never followed.
    for kind in kinds.iter().filter(|k| *k != "f" && *k != "d") {
        let reason = if kind == "l" { "symlink" } else { "special" };
        *skipped.entry(reason.into()).or_default() += 1;
    }
    let said = skipped
        .iter()
        .map(|(r, n)| format!("{r}={n}"))
        .collect::<Vec<_>>()
        .join(",");
    tracing::info!(box_id = %box_id, path = %from, sent = packed.sent, skipped = %said, key = %key, "archive packed");
    let mut r = packed.archive.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-tar"));
    if let Ok(v) = HeaderValue::from_str(&said) {
        h.insert("agentbox-skipped", v);
    }
    Ok(r)
}

/// One path of a box directory's listing.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct ListedEntry {
    /// `f` file, `d` directory, `l` link, other letters as `find -printf %y` prints them.
    pub kind: String,
    /// Bytes.
    pub size: u64,
    /// Permission bits, in octal.
    pub mode: String,
    /// Modification time as the box printed it (seconds with nanoseconds): compare it as text,
    /// never with this machine's clock.
    pub mtime: String,
}

/// A box directory's listing: what an incremental pull compares with what it last saw.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
pub struct Listing {
    /// Every path under the directory (relative, links not followed), in byte order.
    pub entries: BTreeMap<String, ListedEntry>,
}

/// `GET /v1/boxes/{id}/archive/listing?path=DIR`: each path under the directory with its
/// kind, size, mode and mtime as the box lists them. A client that keeps the last listing
/// asks `pick` for only what changed since: sync's incremental pull, over the API.
pub(crate) async fn listing(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
    Query(q): Query<ArchivePath>,
) -> Result<Json<Listing>, ApiError> {
    let from = checked(&q.path, "path")?;
    let b = reach(&state, &key, &p.id).await?;
    let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
    let mark = agentbox_sync::list_box(b.as_ref(), &from, &[], agentbox_sync::MAX_LISTING_BYTES, &ctx).await?;
    let entries = mark
        .entries
        .into_iter()
        .map(|(path, e)| {
            let e = ListedEntry {
                kind: e.kind,
                size: e.size,
                mode: e.mode,
                mtime: e.mtime,
            };
            (path, e)
        })
        .collect();
    Ok(Json(Listing { entries }))
}

/// The files of a directory to bring out.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Pick {
    /// The box directory, as for the archive.
    pub path: String,
    /// Paths relative to it (as the listing names them): files and directories. Anything
    /// else, and anything not named, is left out.
    pub names: Vec<String>,
}

/// `POST /v1/boxes/{id}/archive/pick`: the named files and directories of a box directory as
/// a tar, through the same safe extractor as the whole archive.
pub(crate) async fn pick(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
    Json(body): Json<Pick>,
) -> Result<Response, ApiError> {
    let from = checked(&body.path, "path")?;
    if body.names.len() as u64 > MAX_ENTRIES {
        return Err(ApiError::new(
            ErrorCode::TooLarge,
            format!("names: {} paths, at most {MAX_ENTRIES}", body.names.len()),
        ));
    }
    for (i, n) in body.names.iter().enumerate() {
        let climbs = n.split('/').any(|s| s == ".." || s.is_empty() || s == ".");
        if n.starts_with('/') || climbs || n.contains('\0') {
            return Err(ApiError::new(
                ErrorCode::Invalid,
                format!("names[{i}]: {n:?} is not a relative path in normal form"),
            ));
        }
    }
    let b = reach(&state, &key, &p.id).await?;
    let dir = scratch()?;
    let to = dir.path().join("tree");
    std::fs::create_dir_all(&to).map_err(|e| ApiError::new(ErrorCode::Unknown, format!("a scratch directory: {e}")))?;
    let ctx = Ctx::background().with_timeout(ARCHIVE_DEADLINE.max(CALL_DEADLINE));
    let receipt = agentbox_sync::fetch(b.as_ref(), &from, &body.names, &to, MAX_ARCHIVE, &ctx)
        .await?
        .receipt;
    if let Some(e) = stopped(&receipt, &format!("the box's archive of {from}")) {
        return Err(e);
    }
    packed(&key.name, b.id().to_string(), from, to, receipt.skipped.clone(), &[]).await
}

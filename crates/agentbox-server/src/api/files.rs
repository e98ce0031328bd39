//! A box's files through the hands (`agentbox_hands::BoxEnv`), which work on any box, with a
//! runner or without: read and write whole files, stat, list, make a directory, rename,
//! remove. A relative path is taken from the box's workspace and may not climb out of it; an
//! absolute path is the box's own.

use std::sync::Arc;

use agentbox_core::{Ctx, ErrorCode};
use agentbox_hands::{BoxEnv, ExecutionEnv, FileInfo, FsCode, FsError};
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use schemars::JsonSchema;
use serde::Deserialize;

use super::boxes::{BoxPath, CALL_DEADLINE, reach};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;

/// The largest file read whole in one request.
pub const MAX_READ: u64 = 64 << 20;

/// The file or directory a call is about.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FilePath {
    /// A path in the box: absolute, or relative to its workspace (never climbing out of it).
    pub path: String,
    /// With `DELETE`: a directory and everything in it. With `mkdir`: its parents too.
    #[serde(default)]
    pub recursive: bool,
}

/// A rename.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Rename {
    /// The path now.
    pub from: String,
    /// The path after (replaced if it is a file).
    pub to: String,
}

/// A directory to make.
#[derive(Clone, Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MakeDir {
    /// Its path.
    pub path: String,
    /// Make its parents too, and answer success if it exists.
    #[serde(default)]
    pub recursive: bool,
}

/// `path`, refused when it is empty, holds a NUL, or (relative) climbs out of the workspace.
pub(crate) fn checked(path: &str, field: &str) -> Result<String, ApiError> {
    if path.is_empty() || path.contains('\0') {
        return Err(ApiError::new(
            ErrorCode::Invalid,
            format!("{field}: {path:?} is not a path"),
        ));
    }
    if !path.starts_with('/') {
        let mut depth: i64 = 0;
        for part in path.split('/') {
            match part {
                "" | "." => {}
                ".." => depth -= 1,
                _ => depth += 1,
            }
            if depth < 0 {
                return Err(ApiError::new(
                    ErrorCode::Invalid,
                    format!("{field}: {path:?} climbs out of the workspace (name it by its absolute path)"),
                ));
            }
        }
    }
    Ok(path.to_string())
}

fn fs(e: FsError) -> ApiError {
    let code = match e.code {
        FsCode::NotFound => ErrorCode::NotFound,
        FsCode::PermissionDenied => ErrorCode::PermissionDenied,
        FsCode::NotDirectory | FsCode::IsDirectory | FsCode::Invalid => ErrorCode::Invalid,
        FsCode::NotSupported => ErrorCode::Unsupported,
        FsCode::Aborted => ErrorCode::Timeout,
        FsCode::Unknown => ErrorCode::Unknown,
    };
    ApiError::new(code, e.to_string())
}

async fn env(state: &AppState, key: &crate::keys::KeyInfo, id: &str) -> Result<BoxEnv, ApiError> {
    Ok(BoxEnv::new(reach(state, key, id).await?))
}

fn ctx() -> Ctx {
    Ctx::background().with_timeout(CALL_DEADLINE)
}

/// `GET /v1/boxes/{id}/files?path=P`: the file's bytes.
pub(crate) async fn read(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
    Query(q): Query<FilePath>,
) -> Result<Vec<u8>, ApiError> {
    let path = checked(&q.path, "path")?;
    let env = env(&state, &key, &p.id).await?;
    let ctx = ctx();
    // Sized where a link leads, not the link: the read follows it.
    let target = env.canonical_path(&path, &ctx).await.map_err(fs)?;
    let info = env.file_info(&target, &ctx).await.map_err(fs)?;
    if info.size > MAX_READ {
        return Err(ApiError::new(
            ErrorCode::TooLarge,
            format!(
                "path {path:?}: {} bytes, more than the {MAX_READ} one read takes",
                info.size
            ),
        ));
    }
    env.read_binary_file(&path, &ctx).await.map_err(fs)
}

/// `PUT /v1/boxes/{id}/files?path=P`: the body becomes the file (its parents made).
pub(crate) async fn write(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
    Query(q): Query<FilePath>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let path = checked(&q.path, "path")?;
    let env = env(&state, &key, &p.id).await?;
    env.write_file(&path, &body, &ctx()).await.map_err(fs)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/boxes/{id}/files?path=P`: a file, a link, an empty directory, or with
/// `recursive` a directory and everything in it.
pub(crate) async fn remove(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
    Query(q): Query<FilePath>,
) -> Result<StatusCode, ApiError> {
    let path = checked(&q.path, "path")?;
    let env = env(&state, &key, &p.id).await?;
    env.remove(&path, q.recursive, false, &ctx()).await.map_err(fs)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/boxes/{id}/files/stat?path=P`: what the path is (links not followed).
pub(crate) async fn stat(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
    Query(q): Query<FilePath>,
) -> Result<Json<FileInfo>, ApiError> {
    let path = checked(&q.path, "path")?;
    let env = env(&state, &key, &p.id).await?;
    Ok(Json(env.file_info(&path, &ctx()).await.map_err(fs)?))
}

/// `GET /v1/boxes/{id}/files/list?path=P`: a directory's entries.
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
    Query(q): Query<FilePath>,
) -> Result<Json<Vec<FileInfo>>, ApiError> {
    let path = checked(&q.path, "path")?;
    let env = env(&state, &key, &p.id).await?;
    Ok(Json(env.list_dir(&path, &ctx()).await.map_err(fs)?))
}

/// `POST /v1/boxes/{id}/files/mkdir`.
pub(crate) async fn mkdir(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
    Json(body): Json<MakeDir>,
) -> Result<StatusCode, ApiError> {
    let path = checked(&body.path, "path")?;
    let env = env(&state, &key, &p.id).await?;
    env.create_dir(&path, body.recursive, &ctx()).await.map_err(fs)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/boxes/{id}/files/rename`.
pub(crate) async fn rename(
    State(state): State<Arc<AppState>>,
    Caller(key): Caller,
    Path(p): Path<BoxPath>,
    Json(body): Json<Rename>,
) -> Result<StatusCode, ApiError> {
    let from = checked(&body.from, "from")?;
    let to = checked(&body.to, "to")?;
    let env = env(&state, &key, &p.id).await?;
    env.rename_file(&from, &to, &ctx()).await.map_err(fs)?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::checked;

    #[test]
    fn a_relative_path_may_not_climb_out_of_the_workspace() {
        for ok in ["a.txt", "src/../b", "./x", "/etc/passwd", "/../x", "a/b/../../c"] {
            assert!(checked(ok, "path").is_ok(), "{ok}");
        }
        for bad in ["..", "../x", "a/../../x", "", "a\0b", "./.."] {
            assert!(checked(bad, "path").is_err(), "{bad:?}");
        }
    }
}

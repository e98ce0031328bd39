//! The object API under `/s3`, path style: `/s3/{diskId}` is the bucket, `/s3/{diskId}/{key}`
//! an object, each key segment percent-encoded as `_http.py`'s `s3_request` sends it. A disk
//! is a file system, so an object is a file and a key's `/`s are directories:
//!
//! - `PUT` writes the body exactly (into a new file beside the old, renamed over it, so a
//!   reader sees the old or the new), making missing parents (0755); a key ending in `/`
//!   makes a directory (its body must be empty). A write follows a symbolic link at the
//!   key's leaf within the disk, as a file write does (`open(2)` with `O_CREAT`): the file
//!   the link names is replaced and the link kept, a dangling link's file is made where it
//!   points (404 `NoSuchKey` when that directory is missing), a link to a directory is 400
//!   `InvalidRequest` as a directory of the key's name is, more than 40 links in a row 400
//!   `InvalidRequest`. `x-archil-mode` (octal) is applied;
//!   `x-archil-uid`/`x-archil-gid` are checked and accepted but not applied (a box maps one
//!   id, so every file is its root's). Answers an `ETag`. At most [`MAX_PUT`] bytes (400
//!   `EntityTooLarge`, told by `Content-Length` before a byte is read, else when the count
//!   passes it); `PUT ?append=true` adds at most [`MAX_APPEND`] bytes, making the file if
//!   missing.
//! - `GET`/`HEAD` a file (`Content-Length`, `ETag`, `Last-Modified`); a directory or anything
//!   else is 404 `NoSuchKey` (a HEAD's 404 has no body).
//! - `DELETE` a file: 204, and 204 for one already gone; a key ending in `/` removes that
//!   directory if it is empty, else 409 `DirectoryNotEmpty` (the fake's code: S3 has none).
//! - `GET ?list-type=2` (ListObjectsV2): `prefix`, `delimiter` (`/` only), `max-keys` (at most
//!   1000), `continuation-token`, `start-after`, keys in byte order. Files are `Contents`;
//!   with the delimiter, directories (empty ones too) are `CommonPrefixes` ending in `/`;
//!   without it, a listing holds files only.
//! - `POST ?delete` (DeleteObjects): up to 1000 keys, each deleted as `DELETE` is.
//!
//! Every request shows the API key as the control plane's does, else 403 `AccessDenied`. A
//! disk that does not exist is 404 `NoSuchBucket`. A write (PUT, append, DELETE) under a path
//! an exec holds checked out is 409 `OperationAborted`, S3's code for "a conflicting
//! operation is in progress, try again"; reads go on.
//!
//! Keys are confined to the disk (`files`): a `.` or `..` segment, an empty segment (`a//b`,
//! a leading `/`), a NUL or invalid UTF-8 is 400 `InvalidArgument`; a key over 1024 bytes
//! or a segment over 255 is 400 `KeyTooLongError`; a key whose path leads out of the disk
//! through a link a box made (on the way, or at the leaf a write follows) is 403
//! `AccessDenied`; a path whose links loop is 400 `InvalidRequest`.
//!
//! Simpler than Archil's gateway: no multipart uploads (`?uploads`, `?uploadId`,
//! `?partNumber` are 501 `NotImplemented`, so the SDK's `put_object` of more than 16 MiB,
//! which goes multipart, fails here), no `Range` reads (501), no ListObjects V1 and no
//! `encoding-type` (400); the content type is not kept (reads answer
//! `application/octet-stream`); the `ETag` is not an MD5 of the content (see
//! `Meta::etag`); listings leave out symbolic links, FIFOs, names XML cannot carry and the
//! fake's own files being written (`.archil-put-*`).

use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use futures_util::StreamExt;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::archil::Query;
use crate::archil::checkout::CoPath;
use crate::archil::error::{S3Error, S3Result};
use crate::archil::files::{DiskRoot, FsError, Meta, WriteTarget};
use crate::archil::state::{Shared, http_date, rfc3339};
use crate::archil::xml;

/// The largest object one PUT may write.
pub(crate) const MAX_PUT: u64 = 512 << 20;
/// The most one append may add (Archil's bound, `_disk.append_object`).
pub(crate) const MAX_APPEND: u64 = 1 << 20;
/// The largest DeleteObjects body.
const MAX_DELETE_BODY: usize = 2 << 20;
/// The longest key (S3's bound).
const MAX_KEY: usize = 1024;
/// The most keys a listing page holds (S3's bound and default).
const MAX_LIST: usize = 1000;
/// What the fake names the files it is writing, left out of listings.
const TEMP_PREFIX: &str = ".archil-put-";

/// A key, checked: its segments, and whether it names a directory (ends in `/`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    pub(crate) text: String,
    pub(crate) segs: Vec<String>,
    pub(crate) dir: bool,
}

impl Key {
    fn rel(&self) -> String {
        self.segs.join("/")
    }

    fn parent(&self) -> &[String] {
        &self.segs[..self.segs.len().saturating_sub(1)]
    }

    fn leaf(&self) -> &str {
        self.segs.last().map(String::as_str).unwrap_or("")
    }
}

/// A key as the path carried it (each segment percent-decoded), checked.
pub(crate) fn key_of_path(raw: &str) -> Result<Key, S3Error> {
    let mut bytes = Vec::with_capacity(raw.len());
    for (i, seg) in raw.split('/').enumerate() {
        if i > 0 {
            bytes.push(b'/');
        }
        bytes.extend(crate::http::percent_decode(seg));
    }
    let text = String::from_utf8(bytes).map_err(|_| S3Error::invalid("the key is not UTF-8"))?;
    check_key(&text)
}

/// A key's rules (see the module's documentation).
pub(crate) fn check_key(text: &str) -> Result<Key, S3Error> {
    let bad = |why: &str| S3Error::invalid(format!("key {text:?}: {why}"));
    if text.is_empty() {
        return Err(bad("empty"));
    }
    if text.len() > MAX_KEY {
        return Err(S3Error::new(
            400,
            "KeyTooLongError",
            format!("a key of {} bytes: at most {MAX_KEY}", text.len()),
        ));
    }
    if text.contains('\0') {
        return Err(bad("holds a NUL"));
    }
    if text.starts_with('/') {
        return Err(bad("absolute (keys are relative to the disk's root)"));
    }
    let (body, dir) = match text.strip_suffix('/') {
        Some(b) => (b, true),
        None => (text, false),
    };
    let mut segs = Vec::new();
    for s in body.split('/') {
        match s {
            "" => return Err(bad("has an empty segment")),
            "." | ".." => return Err(bad("has a `.` or `..` segment")),
            s if s.len() > 255 => {
                return Err(S3Error::new(
                    400,
                    "KeyTooLongError",
                    format!("key {text:?}: a segment over 255 bytes"),
                ));
            }
            s => segs.push(s.to_string()),
        }
    }
    Ok(Key {
        text: text.to_string(),
        segs,
        dir,
    })
}

/// A failure to reach a key, in S3's words.
fn fs_error(key: &str, e: FsError) -> S3Error {
    match e {
        FsError::NotFound | FsError::IsDir => S3Error::no_such_key(key),
        FsError::NotDir => S3Error::new(
            400,
            "InvalidRequest",
            format!("key {key:?}: a part of its path is a file, not a directory"),
        ),
        FsError::Escapes => S3Error::new(
            403,
            "AccessDenied",
            format!("key {key:?}: its path leads out of the disk"),
        ),
        FsError::Loop => S3Error::new(
            400,
            "InvalidRequest",
            format!("key {key:?}: too many levels of symbolic links"),
        ),
        FsError::NotEmpty => S3Error::new(
            409,
            "DirectoryNotEmpty",
            format!("key {key:?}: the directory is not empty"),
        ),
        FsError::Os(e) => S3Error::internal(format!("key {key:?}: {e}")),
    }
}

/// A write refused because a directory is where the file would be.
fn directory_there(key: &str) -> S3Error {
    S3Error::new(
        400,
        "InvalidRequest",
        format!("key {key:?}: a directory of that name is there"),
    )
}

/// Where a write to `key` (a file's) lands: its parents made, the links at its leaf followed
/// beneath the disk (`DiskRoot::write_target`); a directory there is refused.
fn write_target(root: &DiskRoot, key: &Key) -> Result<WriteTarget, S3Error> {
    let refused = |e| match e {
        FsError::IsDir => directory_there(&key.text),
        e => fs_error(&key.text, e),
    };
    let parent = root.make_dirs(key.parent()).map_err(refused)?;
    let t = root.write_target(key.parent(), parent, key.leaf()).map_err(refused)?;
    if t.kind == Some(FileType::Directory) {
        return Err(directory_there(&key.text));
    }
    Ok(t)
}

/// Every request under `/s3/`: `rest` is the path after it, as sent. A route that reads the
/// body takes it from `body` (one that refuses leaves it, for the caller to drain); `excerpt`
/// gets its first bytes, for the request log.
pub(crate) async fn route(
    s: &Arc<Shared>,
    rest: &str,
    q: &Query,
    req: &Parts,
    body: &mut Option<Body>,
    excerpt: &mut Vec<u8>,
) -> S3Result {
    let (disk_raw, key_raw) = match rest.split_once('/') {
        Some((d, k)) => (d, k),
        None => (rest, ""),
    };
    let disk = String::from_utf8_lossy(&crate::http::percent_decode(disk_raw)).into_owned();
    let m = req.method.clone();
    if disk.is_empty() {
        return Err(S3Error::new(
            400,
            "InvalidBucketName",
            "no disk in the path (/s3/{diskId}/{key})",
        ));
    }
    if s.disk(&disk).is_none() {
        return Err(S3Error::new(
            404,
            "NoSuchBucket",
            format!("The specified bucket does not exist: {disk}"),
        ));
    }
    let multipart = ["uploads", "uploadId", "partNumber"].iter().any(|k| q.get(k).is_some());
    if multipart {
        return Err(S3Error::new(
            501,
            "NotImplemented",
            "multipart uploads are not served by this fake (PUT bodies up to 512 MiB)",
        ));
    }
    let root = DiskRoot::open(&s.disk_dir(&disk), s.owner).map_err(|e| fs_error("", e))?;
    if key_raw.is_empty() {
        return match m {
            Method::GET => list(&root, &disk, q),
            Method::HEAD => Ok(empty(StatusCode::OK)),
            Method::POST if q.get("delete").is_some() => delete_many(s, &root, &disk, take(body), excerpt).await,
            _ => Err(S3Error::new(
                405,
                "MethodNotAllowed",
                format!("{m} on a disk (bucket) is not served"),
            )),
        };
    }
    let key = key_of_path(key_raw)?;
    match m {
        Method::GET | Method::HEAD => {
            if req.headers.contains_key(header::RANGE) {
                return Err(S3Error::new(
                    501,
                    "NotImplemented",
                    "Range reads are not served by this fake",
                ));
            }
            get(&root, &key, m == Method::HEAD).await
        }
        Method::PUT => {
            let writable = |k: &Key| -> Result<(), S3Error> { not_checked_out(s, &disk, k) };
            writable(&key)?;
            let attrs = Attrs::of(&req.headers)?;
            if q.get("append").is_some() {
                if q.get("append") != Some("true") {
                    return Err(S3Error::invalid("append: only append=true"));
                }
                append(&root, &key, attrs, &req.headers, body, excerpt).await
            } else {
                put(&root, &key, attrs, &req.headers, body, excerpt).await
            }
        }
        Method::DELETE => {
            not_checked_out(s, &disk, &key)?;
            delete_one(&root, &key)?;
            Ok(empty(StatusCode::NO_CONTENT))
        }
        _ => Err(S3Error::new(
            405,
            "MethodNotAllowed",
            format!("{m} on an object is not served"),
        )),
    }
}

/// 409 `OperationAborted` where an exec holds the key's path checked out.
fn not_checked_out(s: &Shared, disk: &str, key: &Key) -> Result<(), S3Error> {
    let p = CoPath {
        disk: disk.to_string(),
        segs: key.segs.clone(),
    };
    match s.checkouts.blocks(&p) {
        None => Ok(()),
        Some(held) => Err(S3Error::new(
            409,
            "OperationAborted",
            format!(
                "A conflicting operation is in progress: /{} of disk {disk} is checked out by an exec (a delegation); try again",
                held.segs.join("/")
            ),
        )),
    }
}

fn take(body: &mut Option<Body>) -> Body {
    body.take().unwrap_or_default()
}

fn empty(status: StatusCode) -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = status;
    r
}

fn set(h: &mut HeaderMap, name: header::HeaderName, v: &str) {
    if let Ok(v) = HeaderValue::from_str(v) {
        h.insert(name, v);
    }
}

/// The POSIX attributes a write may set (`x-archil-mode`, octal; uid and gid accepted).
#[derive(Clone, Copy, Debug, Default)]
struct Attrs {
    mode: Option<u32>,
}

impl Attrs {
    fn of(h: &HeaderMap) -> Result<Attrs, S3Error> {
        let text = |name: &str| -> Result<Option<String>, S3Error> {
            h.get(name)
                .map(|v| {
                    v.to_str()
                        .map(|s| s.trim().to_string())
                        .map_err(|_| S3Error::invalid(format!("{name}: not text")))
                })
                .transpose()
        };
        let mode = match text("x-archil-mode")? {
            None => None,
            Some(m) => Some(
                u32::from_str_radix(&m, 8)
                    .ok()
                    .filter(|n| *n <= 0o7777)
                    .ok_or_else(|| S3Error::invalid(format!("x-archil-mode {m:?}: an octal mode, at most 7777")))?,
            ),
        };
        for name in ["x-archil-uid", "x-archil-gid"] {
            if let Some(v) = text(name)?
                && v.parse::<u32>().is_err()
            {
                return Err(S3Error::invalid(format!("{name} {v:?}: a whole number")));
            }
        }
        Ok(Attrs { mode })
    }
}

/// `Content-Length` when the request states it (a bad one is refused).
fn content_length(h: &HeaderMap) -> Result<Option<u64>, S3Error> {
    h.get(header::CONTENT_LENGTH)
        .map(|v| {
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| S3Error::invalid("Content-Length: not a number"))
        })
        .transpose()
}

fn too_large(max: u64) -> S3Error {
    S3Error::new(
        400,
        "EntityTooLarge",
        format!("Your proposed upload exceeds the maximum allowed size ({max} bytes)"),
    )
}

fn etag_headers(r: &mut Response, meta: &Meta) {
    let h = r.headers_mut();
    set(h, header::ETAG, &meta.etag());
    set(h, header::LAST_MODIFIED, &http_date(meta.mtime));
}

async fn get(root: &DiskRoot, key: &Key, head: bool) -> S3Result {
    if key.dir {
        return Err(S3Error::no_such_key(&key.text));
    }
    let (file, meta) = root.open_file(&key.rel()).map_err(|e| fs_error(&key.text, e))?;
    let body = if head {
        Body::empty()
    } else {
        let file = tokio::fs::File::from_std(file);
        let stream = futures_util::stream::unfold(Some(file), |f| async move {
            let mut f = f?;
            let mut buf = vec![0u8; 256 << 10];
            match f.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok::<_, std::io::Error>(axum::body::Bytes::from(buf)), Some(f)))
                }
                Err(e) => Some((Err(e), None)),
            }
        });
        Body::from_stream(stream)
    };
    let mut r = Response::new(body);
    etag_headers(&mut r, &meta);
    let h = r.headers_mut();
    set(h, header::CONTENT_LENGTH, &meta.size.to_string());
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(r)
}

/// The name of a file being written, random, beside its key.
fn temp_name() -> String {
    crate::archil::state::random_id(TEMP_PREFIX)
}

async fn put(
    root: &DiskRoot,
    key: &Key,
    attrs: Attrs,
    headers: &HeaderMap,
    body: &mut Option<Body>,
    excerpt: &mut Vec<u8>,
) -> S3Result {
    let stated = content_length(headers)?;
    if stated.is_some_and(|n| n > MAX_PUT) {
        return Err(too_large(MAX_PUT));
    }
    if key.dir {
        if stated.is_some_and(|n| n > 0) {
            return Err(S3Error::invalid(format!(
                "key {:?} ends in / and names a directory: its body must be empty",
                key.text
            )));
        }
        let b = axum::body::to_bytes(take(body), 0)
            .await
            .map_err(|_| S3Error::invalid(format!("key {:?} names a directory: its body must be empty", key.text)))?;
        drop(b);
        root.make_dirs(&key.segs).map_err(|e| fs_error(&key.text, e))?;
        let fd = root
            .at(&key.rel(), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
            .map_err(|e| fs_error(&key.text, e))?;
        if let Some(mode) = attrs.mode {
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| fs_error(&key.text, e.into()))?;
        }
        let meta = Meta::of(&rustix::fs::fstat(&fd).map_err(|e| fs_error(&key.text, e.into()))?);
        let mut r = empty(StatusCode::OK);
        etag_headers(&mut r, &meta);
        return Ok(r);
    }
    // Beside the file the key's leaf names, its links followed, so the rename replaces that
    // file (and keeps a link) as a write through the link would.
    let t = write_target(root, key)?;
    let parent = &t.dir;
    let tmp = temp_name();
    let fd = rustix::fs::openat(
        parent,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(|e| fs_error(&key.text, e.into()))?;
    let written = write_body(root, &fd, attrs, take(body), excerpt).await;
    let meta = match written {
        Ok(m) => m,
        Err(e) => {
            let _ = rustix::fs::unlinkat(parent, tmp.as_str(), AtFlags::empty());
            return Err(e);
        }
    };
    if let Err(e) = rustix::fs::renameat(parent, tmp.as_str(), parent, t.name.as_slice()) {
        let _ = rustix::fs::unlinkat(parent, tmp.as_str(), AtFlags::empty());
        return Err(match e {
            // A directory made there since it was looked at.
            Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST => directory_there(&key.text),
            e => fs_error(&key.text, e.into()),
        });
    }
    let mut r = empty(StatusCode::OK);
    etag_headers(&mut r, &meta);
    Ok(r)
}

/// The body into `fd`, at most [`MAX_PUT`] bytes, synced; the file's metadata after.
async fn write_body(
    root: &DiskRoot,
    fd: &OwnedFd,
    attrs: Attrs,
    body: Body,
    excerpt: &mut Vec<u8>,
) -> Result<Meta, S3Error> {
    root.owner.give(fd).map_err(|e| fs_error("", e))?;
    if let Some(mode) = attrs.mode {
        rustix::fs::fchmod(fd, Mode::from_raw_mode(mode)).map_err(|e| fs_error("", e.into()))?;
    }
    let dup = fd
        .try_clone()
        .map_err(|e| S3Error::internal(format!("writing the object: {e}")))?;
    let mut file = tokio::fs::File::from_std(std::fs::File::from(dup));
    let mut stream = body.into_data_stream();
    let mut total: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| S3Error::new(400, "IncompleteBody", format!("reading the body: {e}")))?;
        total += chunk.len() as u64;
        if total > MAX_PUT {
            return Err(too_large(MAX_PUT));
        }
        keep_excerpt(excerpt, &chunk);
        file.write_all(&chunk)
            .await
            .map_err(|e| S3Error::internal(format!("writing the object: {e}")))?;
    }
    file.flush()
        .await
        .map_err(|e| S3Error::internal(format!("writing the object: {e}")))?;
    // Nothing acknowledged is lost: the data is on disk before the answer says so.
    file.sync_all()
        .await
        .map_err(|e| S3Error::internal(format!("syncing the object: {e}")))?;
    Ok(Meta::of(&rustix::fs::fstat(fd).map_err(|e| fs_error("", e.into()))?))
}

fn keep_excerpt(excerpt: &mut Vec<u8>, chunk: &[u8]) {
    let room = crate::archil::state::MAX_RECORDED_BODY.saturating_sub(excerpt.len());
    excerpt.extend_from_slice(&chunk[..chunk.len().min(room)]);
}

async fn append(
    root: &DiskRoot,
    key: &Key,
    attrs: Attrs,
    headers: &HeaderMap,
    body: &mut Option<Body>,
    excerpt: &mut Vec<u8>,
) -> S3Result {
    if key.dir {
        return Err(S3Error::invalid(format!(
            "key {:?} names a directory: nothing to append to",
            key.text
        )));
    }
    if content_length(headers)?.is_some_and(|n| n > MAX_APPEND) {
        return Err(too_large(MAX_APPEND));
    }
    let body = axum::body::to_bytes(take(body), MAX_APPEND as usize)
        .await
        .map_err(|_| too_large(MAX_APPEND))?;
    keep_excerpt(excerpt, &body);
    // The file the key's leaf names, its links followed (a dangling link's is made).
    let t = write_target(root, key)?;
    let flags = OFlags::WRONLY | OFlags::APPEND | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat(
        &t.dir,
        t.name.as_slice(),
        flags | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW,
        Mode::from_raw_mode(attrs.mode.unwrap_or(0o644)),
    ) {
        Ok(fd) => {
            root.owner.give(&fd).map_err(|e| fs_error(&key.text, e))?;
            if let Some(mode) = attrs.mode {
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(|e| fs_error(&key.text, e.into()))?;
            }
            fd
        }
        // There already: opened through the disk's root, so a link is followed only inside.
        Err(Errno::EXIST) => root.at_bytes(&t.rel, flags, Mode::empty()).map_err(|e| match e {
            FsError::IsDir => directory_there(&key.text),
            e => fs_error(&key.text, e),
        })?,
        Err(e) => return Err(fs_error(&key.text, e.into())),
    };
    let st = rustix::fs::fstat(&fd).map_err(|e| fs_error(&key.text, e.into()))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(S3Error::new(
            400,
            "InvalidRequest",
            format!("key {:?}: not a regular file", key.text),
        ));
    }
    let mut f = std::fs::File::from(fd);
    f.write_all(&body)
        .and_then(|()| f.sync_all())
        .map_err(|e| S3Error::internal(format!("appending to {:?}: {e}", key.text)))?;
    let meta = Meta::of(&rustix::fs::fstat(&f).map_err(|e| fs_error(&key.text, e.into()))?);
    let mut r = empty(StatusCode::OK);
    etag_headers(&mut r, &meta);
    Ok(r)
}

/// Delete one key as `DELETE` does: a file (or link) unlinked, a directory key's empty
/// directory removed; what is not there is already deleted.
fn delete_one(root: &DiskRoot, key: &Key) -> Result<(), S3Error> {
    let parent = match root.dir(key.parent()) {
        Ok(fd) => fd,
        Err(FsError::NotFound | FsError::NotDir) => return Ok(()),
        Err(e) => return Err(fs_error(&key.text, e)),
    };
    if key.dir {
        return match rustix::fs::unlinkat(&parent, key.leaf(), AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) | Err(Errno::NOTDIR) => Ok(()),
            Err(e) => Err(fs_error(&key.text, e.into())),
        };
    }
    match rustix::fs::statat(&parent, key.leaf(), AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(fs_error(&key.text, e.into())),
        // A directory is no object: there is nothing of that key to delete.
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => return Ok(()),
        Ok(_) => {}
    }
    match rustix::fs::unlinkat(&parent, key.leaf(), AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(fs_error(&key.text, e.into())),
    }
}

async fn delete_many(s: &Shared, root: &DiskRoot, disk: &str, body: Body, excerpt: &mut Vec<u8>) -> S3Result {
    let body = axum::body::to_bytes(body, MAX_DELETE_BODY).await.map_err(|_| {
        S3Error::new(
            400,
            "MalformedXML",
            format!("a Delete body of more than {MAX_DELETE_BODY} bytes"),
        )
    })?;
    keep_excerpt(excerpt, &body);
    let text = std::str::from_utf8(&body).map_err(|_| S3Error::new(400, "MalformedXML", "the body is not UTF-8"))?;
    let d =
        xml::parse_delete(text).map_err(|why| S3Error::new(400, "MalformedXML", format!("the Delete body: {why}")))?;
    let mut out = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DeleteResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">",
    );
    for k in &d.keys {
        let done = check_key(k).and_then(|key| {
            not_checked_out(s, disk, &key)?;
            delete_one(root, &key)
        });
        match done {
            Ok(()) if d.quiet => {}
            Ok(()) => out.push_str(&format!("<Deleted><Key>{}</Key></Deleted>", xml::escape(k))),
            Err(e) => out.push_str(&format!(
                "<Error><Key>{}</Key><Code>{}</Code><Message>{}</Message></Error>",
                xml::escape(k),
                xml::escape(&e.code),
                xml::escape(&e.message)
            )),
        }
    }
    out.push_str("</DeleteResult>");
    Ok(xml_response(out))
}

fn xml_response(body: String) -> Response {
    let mut r = Response::new(Body::from(body));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/xml"));
    r
}

/// One entry of a listing, in key order.
enum Item {
    Object(String, Meta),
    Prefix(String),
}

impl Item {
    fn key(&self) -> &str {
        match self {
            Item::Object(k, _) | Item::Prefix(k) => k,
        }
    }
}

/// A directory being walked: its segments, the key prefix of its entries, and its entries
/// in key order (a directory sorts as its name and `/`, as its keys do).
struct Frame {
    segs: Vec<String>,
    prefix: String,
    entries: std::vec::IntoIter<(String, Meta)>,
}

fn frame(root: &DiskRoot, segs: Vec<String>, prefix: String, name_prefix: &str) -> Result<Option<Frame>, S3Error> {
    let mut entries = match root.entries(&segs) {
        Ok(e) => e,
        Err(FsError::NotFound | FsError::NotDir) => return Ok(None),
        Err(FsError::Os(Errno::TOOBIG)) => {
            return Err(S3Error::internal(format!(
                "directory {prefix:?} holds more than {} entries: too many to list",
                crate::archil::files::MAX_DIR_ENTRIES
            )));
        }
        Err(e) => return Err(fs_error(&prefix, e)),
    };
    entries.retain(|(name, meta)| {
        name.starts_with(name_prefix)
            && !name.starts_with(TEMP_PREFIX)
            && xml::writable(name)
            && matches!(meta.kind, FileType::RegularFile | FileType::Directory)
    });
    let sort_key = |(n, m): &(String, Meta)| {
        if m.kind == FileType::Directory {
            format!("{n}/")
        } else {
            n.clone()
        }
    };
    entries.sort_by_cached_key(sort_key);
    Ok(Some(Frame {
        segs,
        prefix,
        entries: entries.into_iter(),
    }))
}

/// ListObjectsV2.
fn list(root: &DiskRoot, disk: &str, q: &Query) -> S3Result {
    for (k, _) in &q.0 {
        if !matches!(
            k.as_str(),
            "list-type" | "prefix" | "delimiter" | "max-keys" | "continuation-token" | "start-after"
        ) {
            return Err(S3Error::invalid(format!(
                "{k}: not served by this fake's listing (list-type=2, prefix, delimiter, max-keys, continuation-token, start-after)"
            )));
        }
    }
    if q.get("list-type") != Some("2") {
        return Err(S3Error::invalid("only ListObjectsV2 (list-type=2) is served"));
    }
    let prefix = q.get("prefix").unwrap_or("");
    let delimited = match q.get("delimiter") {
        None | Some("") => false,
        Some("/") => true,
        Some(d) => return Err(S3Error::invalid(format!("delimiter {d:?}: only / is served"))),
    };
    let max = match q.get("max-keys") {
        None => MAX_LIST,
        Some(m) => m
            .parse::<usize>()
            .map_err(|_| S3Error::invalid(format!("max-keys {m:?}: a whole number")))?
            .min(MAX_LIST),
    };
    let token = q.get("continuation-token");
    let marker = match token {
        Some(t) => Some(unhex(t).ok_or_else(|| S3Error::invalid("The continuation token provided is incorrect"))?),
        None => q.get("start-after").filter(|s| !s.is_empty()).map(str::to_string),
    };
    let (items, truncated) = walk(root, prefix, delimited, marker.as_deref(), max)?;
    let mut out = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">",
    );
    out.push_str(&format!("<Name>{}</Name>", xml::escape(disk)));
    out.push_str(&format!("<Prefix>{}</Prefix>", xml::escape(prefix)));
    if delimited {
        out.push_str("<Delimiter>/</Delimiter>");
    }
    out.push_str(&format!("<MaxKeys>{max}</MaxKeys><KeyCount>{}</KeyCount>", items.len()));
    out.push_str(&format!("<IsTruncated>{truncated}</IsTruncated>"));
    if let Some(t) = token {
        out.push_str(&format!("<ContinuationToken>{}</ContinuationToken>", xml::escape(t)));
    }
    if let Some(sa) = q.get("start-after") {
        out.push_str(&format!("<StartAfter>{}</StartAfter>", xml::escape(sa)));
    }
    if truncated && let Some(last) = items.last() {
        out.push_str(&format!(
            "<NextContinuationToken>{}</NextContinuationToken>",
            hex(last.key())
        ));
    }
    for item in &items {
        match item {
            Item::Object(k, m) => out.push_str(&format!(
                "<Contents><Key>{}</Key><LastModified>{}</LastModified><ETag>{}</ETag><Size>{}</Size><StorageClass>STANDARD</StorageClass></Contents>",
                xml::escape(k),
                rfc3339(m.mtime),
                xml::escape(&m.etag()),
                m.size
            )),
            Item::Prefix(p) => out.push_str(&format!("<CommonPrefixes><Prefix>{}</Prefix></CommonPrefixes>", xml::escape(p))),
        }
    }
    out.push_str("</ListBucketResult>");
    Ok(xml_response(out))
}

/// The keys after `marker` under `prefix`, in key order, at most `max`; whether more remain.
/// Directories wholly before the marker are not read.
fn walk(
    root: &DiskRoot,
    prefix: &str,
    delimited: bool,
    marker: Option<&str>,
    max: usize,
) -> Result<(Vec<Item>, bool), S3Error> {
    let (dir_part, name_part) = match prefix.rfind('/') {
        Some(i) => (&prefix[..=i], &prefix[i + 1..]),
        None => ("", prefix),
    };
    let dir_segs: Vec<String> = dir_part
        .strip_suffix('/')
        .map(|d| d.split('/').map(str::to_string).collect())
        .unwrap_or_default();
    // No key has an empty, `.` or `..` segment: such a prefix matches nothing.
    if dir_segs.iter().any(|s| s.is_empty() || s == "." || s == "..") {
        return Ok((Vec::new(), false));
    }
    let after = |k: &str| marker.is_none_or(|m| k > m);
    let mut items = Vec::new();
    let mut stack: Vec<Frame> = frame(root, dir_segs, dir_part.to_string(), name_part)?
        .into_iter()
        .collect();
    while let Some(top) = stack.last_mut() {
        let Some((name, meta)) = top.entries.next() else {
            stack.pop();
            continue;
        };
        let is_dir = meta.kind == FileType::Directory;
        let key = if is_dir {
            format!("{}{name}/", top.prefix)
        } else {
            format!("{}{name}", top.prefix)
        };
        if !is_dir {
            if after(&key) {
                if items.len() == max {
                    return Ok((items, true));
                }
                items.push(Item::Object(key, meta));
            }
            continue;
        }
        if delimited {
            if after(&key) {
                if items.len() == max {
                    return Ok((items, true));
                }
                items.push(Item::Prefix(key));
            }
            continue;
        }
        // Every key under `key` starts with it: past them all when the marker is beyond it
        // and not inside it.
        if let Some(m) = marker
            && m > key.as_str()
            && !m.starts_with(&key)
        {
            continue;
        }
        let mut segs = top.segs.clone();
        segs.push(name);
        if let Some(f) = frame(root, segs, key, "")? {
            stack.push(f);
        }
    }
    Ok((items, false))
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(t: &str) -> Option<String> {
    if !t.len().is_multiple_of(2) || t.len() > 2 * MAX_KEY + 2 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..t.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(t.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked_as_the_module_says() {
        let k = key_of_path("a%20b/c%2Fd/%C3%A9").unwrap();
        assert_eq!(k.segs, vec!["a b", "c", "d", "é"]);
        assert!(!k.dir);
        let d = key_of_path("dir/sub/").unwrap();
        assert_eq!(
            (d.segs.clone(), d.dir),
            (vec!["dir".to_string(), "sub".to_string()], true)
        );
        for bad in [
            "..",
            "a/../b",
            "./a",
            "a//b",
            "/etc/passwd",
            "%2Fetc",
            "a%00b",
            "%FF",
            "a/%2E%2E/b",
        ] {
            let e = key_of_path(bad).unwrap_err();
            assert_eq!((e.status.as_u16(), e.code.as_str()), (400, "InvalidArgument"), "{bad}");
        }
        assert_eq!(key_of_path(&"x".repeat(1025)).unwrap_err().code, "KeyTooLongError");
        assert_eq!(key_of_path(&"x".repeat(256)).unwrap_err().code, "KeyTooLongError");
    }

    #[test]
    fn tokens_round_trip() {
        for k in ["a/b", "é x", ""] {
            assert_eq!(unhex(&hex(k)).as_deref(), Some(k));
        }
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex("abc"), None);
    }
}

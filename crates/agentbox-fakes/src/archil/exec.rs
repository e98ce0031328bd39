//! Exec: `POST /api/exec` (disks mounted at `/mnt/archil/<relPath>`) and `POST
//! /api/disks/{id}/exec` (the disk's root at `/mnt/archil`, as the openapi's example `ls -la
//! /mnt/archil` has it). Each call runs `sh -c COMMAND` in a fresh namespace box
//! (`agentbox_providers::namespace`), cwd `/`, stdin at its end, with `ARCHIL_CONTAINER_ID`,
//! `ARCHIL_DISK_ID` (the disk of the first relPath in byte order) and `ARCHIL_REGION` set,
//! and ends the box after. The answer is 200 with `exitCode`, `stdout`, `stderr` (invalid
//! UTF-8 replaced by U+FFFD) and `timing` whatever the exit code.
//!
//! The box's `/mnt` is a directory the fake stages for the call, bound read-only, holding
//! `archil/<relPath>` for each mount, onto which the disks (or their subdirectories) are
//! bound, read-only where `readOnly` asks. So nothing is made in a disk to hold a mount.
//!
//! Validation, as the openapi states it: relPaths and subdirectories are non-empty,
//! relative, without `.` or `..` segments; a subdirectory must be a directory of the disk
//! (400 where it is malformed, a file, or leads out of the disk through a link; 404 where it
//! is missing); `queueMs` and `checkoutPaths` are refused with `readOnly` (400). A disk that
//! does not exist is 404.
//!
//! Delegation checkouts (see `checkout`): a mount that is neither read-only nor conditional
//! checks out the path it exposes (the disk and its subdirectory, or each of `checkoutPaths`
//! under it) before the command starts and holds it until the call ends; a conditional mount
//! checks out its `checkoutPaths` where it names some. Not had within `queueMs` (absent: no
//! wait), the call is 400 `checkout_timeout`: the openapi says a delegation conflict or queue
//! expiry answers 400 with its message, and names no code. `timing.queueMs` is everything
//! before the command started (the checkout's wait, the box's making), as the openapi
//! defines it; `executeMs` the command's run; `totalMs` the request's.
//!
//! Bounds: the command runs at most [`crate::archil::FakeArchilOptions::exec_limit`] (Archil's
//! 300 s); past it the box is destroyed and the call is 504 `timeout` (the openapi's 504).
//! stdout and stderr are kept up to 64 MiB each; past it the box is destroyed and the call is
//! 400 `output_too_large`. Output written after the shell exits (by a program it left in the
//! background) is read for at most a second more, then the box is ended. At most
//! [`MAX_EXECS`] calls run at once; past it 503 `no_capacity` (the code the SDK knows as a
//! capacity refusal).
//!
//! Simpler than Archil: one call checks out all its paths at once, waiting at most the
//! smallest `queueMs` of its mounts (Archil applies each mount's own); a checkout path need
//! not exist; relPaths may not nest (`a` and `a/b` in one call: 400), and a call mounts at
//! most seven disks (the box binds at most eight directories, one of them `/mnt`); the
//! command is at most 128 KiB (one argument of `sh`); the container is a namespace box of
//! this machine whose root is [`crate::archil::FakeArchilOptions::rootfs`] (or this machine's
//! `/`), its programs running as its root. A subdirectory is resolved to its canonical path
//! once, before the box is made; a box of another call that swaps a directory of that path
//! for a link meanwhile can have the mount land where the link leads, which the box's own
//! id can reach anyway.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentbox_core::{ByteReader, Ctx, ErrorCode, ExecOptions, Mount, Provider, Sandbox, Spec};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use crate::archil::checkout::CoPath;
use crate::archil::error::{ApiError, ApiResult, ok};
use crate::archil::files::{DiskRoot, FsError, path_of};
use crate::archil::state::{Shared, random_id};

/// How many execs may run at once.
pub(crate) const MAX_EXECS: usize = 16;
/// The most one of stdout and stderr may hold.
const MAX_OUTPUT: usize = 64 << 20;
/// The longest command (Linux's bound on one argument, its NUL counted).
const MAX_COMMAND: usize = (128 << 10) - 1;
/// The most disks one call mounts (the box binds eight directories, `/mnt` is one).
const MAX_MOUNTS: usize = agentbox_core::MAX_MOUNTS - 1;
/// The most checkout paths one mount names.
const MAX_CHECKOUT_PATHS: usize = 64;
/// The longest `queueMs` taken (an hour).
const MAX_QUEUE_MS: u64 = 3_600_000;
/// How long making or ending one box may take.
const BOX_TIMEOUT: Duration = Duration::from_secs(30);
/// How long output is still read once the shell has exited.
const OUTPUT_GRACE: Duration = Duration::from_secs(1);
/// Where the disks are in the box.
const MOUNT_ROOT: &str = "/mnt/archil";

/// One disk to mount, validated.
#[derive(Clone, Debug)]
pub(crate) struct MountReq {
    /// Its relPath's segments (none: the single-disk exec's `/mnt/archil`).
    rel: Vec<String>,
    disk: String,
    sub: Vec<String>,
    read_only: bool,
    conditional: bool,
    queue_ms: Option<u64>,
    checkout_paths: Vec<Vec<String>>,
    /// How the request named it, for messages (`disks.data`).
    field: String,
}

/// A relative path's segments: non-empty, not absolute, no `.`, `..` or empty segment.
fn rel_segments(field: &str, p: &str) -> Result<Vec<String>, ApiError> {
    let bad = |why: &str| ApiError::invalid(format!("{field} {p:?}: {why}"));
    if p.is_empty() {
        return Err(bad("empty (a relative path is required)"));
    }
    if p.starts_with('/') {
        return Err(bad("absolute (a relative path is required)"));
    }
    if p.contains('\0') {
        return Err(bad("holds a NUL"));
    }
    let segs: Vec<String> = p.split('/').map(str::to_string).collect();
    for s in &segs {
        match s.as_str() {
            "" => return Err(bad("has an empty segment")),
            "." | ".." => return Err(bad("has a `.` or `..` segment")),
            s if s.len() > 255 => return Err(bad("has a segment over 255 bytes")),
            _ => {}
        }
    }
    Ok(segs)
}

fn command_of(o: &serde_json::Map<String, Value>) -> Result<String, ApiError> {
    let c = o
        .get("command")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid("command: required, a string"))?;
    if c.trim().is_empty() {
        return Err(ApiError::invalid("command: empty"));
    }
    if c.len() > MAX_COMMAND {
        return Err(ApiError::invalid(format!(
            "command: {} bytes, at most {MAX_COMMAND}",
            c.len()
        )));
    }
    if c.contains('\0') {
        return Err(ApiError::invalid("command: holds a NUL"));
    }
    Ok(c.to_string())
}

fn object(body: &Value) -> Result<&serde_json::Map<String, Value>, ApiError> {
    body.as_object()
        .ok_or_else(|| ApiError::invalid("the body must be a JSON object"))
}

/// `POST /api/exec`'s body: `{"disks": {relPath: diskId | ExecMount}, "command"}`.
pub(crate) fn parse_multi(body: &Value) -> Result<(Vec<MountReq>, String), ApiError> {
    let o = object(body)?;
    for k in o.keys() {
        if k != "disks" && k != "command" {
            return Err(ApiError::invalid(format!(
                "{k}: not a field of an exec request (disks, command)"
            )));
        }
    }
    let disks = o
        .get("disks")
        .and_then(Value::as_object)
        .ok_or_else(|| ApiError::invalid("disks: required, an object of relative path to disk"))?;
    if disks.is_empty() {
        return Err(ApiError::invalid("disks: at least one entry is required"));
    }
    if disks.len() > MAX_MOUNTS {
        return Err(ApiError::invalid(format!(
            "disks: {} entries, at most {MAX_MOUNTS} in this fake",
            disks.len()
        )));
    }
    let mut mounts = Vec::new();
    // In byte order, whatever order the JSON object kept.
    let sorted: BTreeMap<&String, &Value> = disks.iter().collect();
    for (rel, v) in sorted {
        let field = format!("disks.{rel}");
        let rel_segs = rel_segments("disks: relative path", rel)?;
        let m = match v {
            Value::String(id) => MountReq {
                rel: rel_segs,
                disk: id.clone(),
                sub: Vec::new(),
                read_only: false,
                conditional: false,
                queue_ms: None,
                checkout_paths: Vec::new(),
                field,
            },
            Value::Object(spec) => mount_spec(rel_segs, field, spec)?,
            _ => {
                return Err(ApiError::invalid(format!(
                    "{field}: a disk id or an object with a disk"
                )));
            }
        };
        mounts.push(m);
    }
    for (i, a) in mounts.iter().enumerate() {
        for b in &mounts[i + 1..] {
            let n = a.rel.len().min(b.rel.len());
            if a.rel[..n] == b.rel[..n] {
                return Err(ApiError::invalid(format!(
                    "disks: {} and {} are the same path or one holds the other",
                    a.rel.join("/"),
                    b.rel.join("/")
                )));
            }
        }
    }
    Ok((mounts, command_of(o)?))
}

fn mount_spec(rel: Vec<String>, field: String, o: &serde_json::Map<String, Value>) -> Result<MountReq, ApiError> {
    for k in o.keys() {
        if !matches!(
            k.as_str(),
            "disk" | "subdirectory" | "readOnly" | "conditional" | "queueMs" | "checkoutPaths"
        ) {
            return Err(ApiError::invalid(format!(
                "{field}.{k}: not a field of ExecMount (disk, subdirectory, readOnly, conditional, queueMs, checkoutPaths)"
            )));
        }
    }
    let disk = o
        .get("disk")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(format!("{field}.disk: required, a disk id")))?
        .to_string();
    let flag = |k: &str| match o.get(k) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid(format!("{field}.{k}: true or false"))),
    };
    let read_only = flag("readOnly")?;
    let conditional = flag("conditional")?;
    let sub = match o.get("subdirectory") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => rel_segments(&format!("{field}.subdirectory"), s)?,
        Some(_) => return Err(ApiError::invalid(format!("{field}.subdirectory: a string"))),
    };
    let queue_ms = match o.get("queueMs") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().filter(|n| *n <= MAX_QUEUE_MS).ok_or_else(|| {
            ApiError::invalid(format!("{field}.queueMs: a whole number of ms, at most {MAX_QUEUE_MS}"))
        })?),
    };
    let checkout_paths = match o.get("checkoutPaths") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => {
            if a.len() > MAX_CHECKOUT_PATHS {
                return Err(ApiError::invalid(format!(
                    "{field}.checkoutPaths: {} paths, at most {MAX_CHECKOUT_PATHS}",
                    a.len()
                )));
            }
            a.iter()
                .map(|p| {
                    p.as_str()
                        .ok_or_else(|| ApiError::invalid(format!("{field}.checkoutPaths: a list of strings")))
                        .and_then(|p| rel_segments(&format!("{field}.checkoutPaths"), p))
                })
                .collect::<Result<_, _>>()?
        }
        Some(_) => return Err(ApiError::invalid(format!("{field}.checkoutPaths: a list of strings"))),
    };
    if read_only && (queue_ms.is_some() || o.get("checkoutPaths").is_some_and(|v| !v.is_null())) {
        return Err(ApiError::invalid(format!(
            "{field}: queueMs and checkoutPaths are delegation checkout options, refused with readOnly: true"
        )));
    }
    Ok(MountReq {
        rel,
        disk,
        sub,
        read_only,
        conditional,
        queue_ms,
        checkout_paths,
        field,
    })
}

/// `POST /api/disks/{id}/exec`'s body: `{"command"}`; the disk's root at `/mnt/archil`.
pub(crate) fn parse_single(id: &str, body: &Value) -> Result<(Vec<MountReq>, String), ApiError> {
    let o = object(body)?;
    for k in o.keys() {
        if k != "command" {
            return Err(ApiError::invalid(format!(
                "{k}: not a field of a disk exec request (command)"
            )));
        }
    }
    let m = MountReq {
        rel: Vec::new(),
        disk: id.to_string(),
        sub: Vec::new(),
        read_only: false,
        conditional: false,
        queue_ms: None,
        checkout_paths: Vec::new(),
        field: "disk".into(),
    };
    Ok((vec![m], command_of(o)?))
}

/// Run one exec call to its end in a task of its own, so a caller that hangs up leaves no
/// box or checkout behind.
pub(crate) async fn exec(s: &Arc<Shared>, mounts: Vec<MountReq>, command: String, arrived: Instant) -> ApiResult {
    let s = s.clone();
    match tokio::spawn(async move { run(&s, mounts, command, arrived).await }).await {
        Ok(r) => r,
        Err(e) => Err(ApiError::internal(format!("the exec ended unexpectedly: {e}"))),
    }
}

/// A mount resolved to a host directory.
struct Resolved {
    req: MountReq,
    source: std::path::PathBuf,
}

async fn run(s: &Arc<Shared>, mounts: Vec<MountReq>, command: String, arrived: Instant) -> ApiResult {
    let _slot = s.exec_slots.clone().try_acquire_owned().map_err(|_| {
        ApiError::new(
            503,
            "no_capacity",
            format!("{MAX_EXECS} execs are running; try again shortly"),
        )
    })?;
    let mut resolved = Vec::new();
    for m in mounts {
        resolved.push(resolve(s, m)?);
    }
    // Checkouts: every path of every mount that takes one, all at once.
    let mut paths = Vec::new();
    let mut wait: Option<u64> = None;
    for r in &resolved {
        let m = &r.req;
        let mine: Vec<CoPath> = if !m.checkout_paths.is_empty() {
            m.checkout_paths
                .iter()
                .map(|cp| CoPath {
                    disk: m.disk.clone(),
                    segs: m.sub.iter().chain(cp).cloned().collect(),
                })
                .collect()
        } else if !m.read_only && !m.conditional {
            vec![CoPath {
                disk: m.disk.clone(),
                segs: m.sub.clone(),
            }]
        } else {
            Vec::new()
        };
        if !mine.is_empty() {
            let w = m.queue_ms.unwrap_or(0);
            wait = Some(wait.map_or(w, |x| x.min(w)));
            paths.extend(mine);
        }
    }
    let _held = s
        .checkouts
        .acquire(paths, Duration::from_millis(wait.unwrap_or(0)))
        .await
        .map_err(|e| {
            let what = e
                .blocker
                .map(|b| format!("disk {} path /{}", b.disk, b.segs.join("/")))
                .unwrap_or_else(|| "the delegation queue".into());
            ApiError::new(
                400,
                "checkout_timeout",
                format!(
                    "delegation checkout not acquired after {} ms: {what} is checked out by another client",
                    e.waited.as_millis()
                ),
            )
        })?;
    let cid = random_id("ctr-");
    let stage = s.staging.join(&cid);
    let made = stage_mnt(&stage, &resolved);
    let answer = match made {
        Err(e) => Err(e),
        Ok(()) => in_box(s, &cid, &stage, &resolved, &command, arrived).await,
    };
    if let Err(e) = std::fs::remove_dir_all(&stage)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(container = %cid, error = %e, "removing an exec's staged /mnt");
    }
    answer
}

/// The disk is there, and its subdirectory, as a canonical host path inside the disk.
fn resolve(s: &Shared, m: MountReq) -> Result<Resolved, ApiError> {
    if s.disk(&m.disk).is_none() {
        return Err(ApiError::not_found(format!("{}: disk {} not found", m.field, m.disk)));
    }
    let dir = s.disk_dir(&m.disk);
    let sub = m.sub.join("/");
    let what = if sub.is_empty() {
        format!("disk {}", m.disk)
    } else {
        format!("{}.subdirectory {sub:?} of disk {}", m.field, m.disk)
    };
    let fd = DiskRoot::open(&dir, s.owner)
        .and_then(|r| r.dir(&m.sub))
        .map_err(|e| match e {
            FsError::NotFound => ApiError::not_found(format!("{what}: no such directory")),
            FsError::NotDir => ApiError::invalid(format!("{what}: not a directory")),
            FsError::Escapes => ApiError::invalid(format!("{what}: leads out of the disk through a link")),
            FsError::Loop => ApiError::invalid(format!("{what}: too many levels of symbolic links")),
            e => ApiError::internal(format!("{what}: {e:?}")),
        })?;
    let source = path_of(&fd).map_err(|e| ApiError::internal(format!("{what}: reading its path: {e:?}")))?;
    if !source.starts_with(&dir) {
        return Err(ApiError::invalid(format!("{what}: leads out of the disk")));
    }
    Ok(Resolved { req: m, source })
}

/// The call's `/mnt`: `archil/<relPath>` for each mount, open to the box's id.
fn stage_mnt(stage: &std::path::Path, mounts: &[Resolved]) -> Result<(), ApiError> {
    let fail = |e: std::io::Error| ApiError::internal(format!("staging the exec's /mnt: {e}"));
    let archil = stage.join("archil");
    std::fs::create_dir_all(&archil).map_err(fail)?;
    for r in mounts {
        if !r.req.rel.is_empty() {
            std::fs::create_dir_all(archil.join(r.req.rel.join("/"))).map_err(fail)?;
        }
    }
    for dir in walk_dirs(stage) {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).map_err(fail)?;
    }
    Ok(())
}

/// `dir` and every directory under it (the staged tree is the fake's own and small).
fn walk_dirs(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        if let Ok(rd) = std::fs::read_dir(&out[i]) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    out.push(e.path());
                }
            }
        }
        i += 1;
    }
    out
}

/// Make the box, run the command, end the box.
async fn in_box(
    s: &Arc<Shared>,
    cid: &str,
    stage: &std::path::Path,
    mounts: &[Resolved],
    command: &str,
    arrived: Instant,
) -> ApiResult {
    let mut spec = Spec::new(s.exec_limit + BOX_TIMEOUT * 2);
    spec.image = s.rootfs.as_ref().map(|r| r.to_string_lossy().into_owned());
    spec.mounts.push(Mount {
        source: stage.to_string_lossy().into_owned(),
        target: "/mnt".into(),
        read_only: true,
    });
    for r in mounts {
        let target = if r.req.rel.is_empty() {
            MOUNT_ROOT.to_string()
        } else {
            format!("{MOUNT_ROOT}/{}", r.req.rel.join("/"))
        };
        spec.mounts.push(Mount {
            source: r.source.to_string_lossy().into_owned(),
            target,
            read_only: r.req.read_only,
        });
    }
    let b = s
        .provider
        .create(&spec, &Ctx::background().with_timeout(BOX_TIMEOUT))
        .await
        .map_err(|e| ApiError::internal(format!("the exec's container could not be made: {}", e.message())))?;
    s.boxes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(cid.to_string(), b.clone());
    let mut env = BTreeMap::new();
    env.insert("ARCHIL_CONTAINER_ID".to_string(), cid.to_string());
    env.insert(
        "ARCHIL_DISK_ID".to_string(),
        mounts.first().map(|m| m.req.disk.clone()).unwrap_or_default(),
    );
    env.insert("ARCHIL_REGION".to_string(), s.region.clone());
    let started = Instant::now();
    let outcome = command_in(&b, command, env, s.exec_limit).await;
    let executed = started.elapsed();
    let ended = b.destroy(&Ctx::background().with_timeout(BOX_TIMEOUT)).await;
    s.boxes.lock().unwrap_or_else(|p| p.into_inner()).remove(cid);
    if let Err(e) = ended {
        tracing::warn!(container = %cid, error = %e, "ending an exec's box");
    }
    let ms = |d: Duration| d.as_millis().min(i64::MAX as u128) as i64;
    match outcome {
        Outcome::Ran { code, stdout, stderr } => ok(json!({
            "exitCode": code,
            "stdout": String::from_utf8_lossy(&stdout),
            "stderr": String::from_utf8_lossy(&stderr),
            "timing": {
                "totalMs": ms(arrived.elapsed()),
                "queueMs": ms(started.duration_since(arrived)),
                "executeMs": ms(executed),
            },
        })),
        Outcome::TimedOut => Err(ApiError::new(
            504,
            "timeout",
            format!(
                "the command ran past the exec limit of {} ms; its container was destroyed",
                s.exec_limit.as_millis()
            ),
        )),
        Outcome::TooLarge(what) => Err(ApiError::new(
            400,
            "output_too_large",
            format!(
                "the command wrote more than {} MiB to {what}; its container was destroyed",
                MAX_OUTPUT >> 20
            ),
        )),
        Outcome::Failed(why) => Err(ApiError::internal(format!("the command could not run: {why}"))),
    }
}

enum Outcome {
    Ran {
        code: i32,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
    },
    TimedOut,
    TooLarge(&'static str),
    Failed(String),
}

/// One of the program's streams as it is read, bounded.
#[derive(Default)]
struct Collected {
    buf: Mutex<Vec<u8>>,
    over: AtomicBool,
}

/// Read `r` into `into` until its end or past [`MAX_OUTPUT`] (then flag it and tell `over`).
async fn pump(
    r: Option<ByteReader>,
    into: Arc<Collected>,
    over: tokio::sync::mpsc::Sender<&'static str>,
    what: &'static str,
) {
    let Some(mut r) = r else { return };
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        match r.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let mut b = into.buf.lock().unwrap_or_else(|p| p.into_inner());
                if b.len() + n > MAX_OUTPUT {
                    into.over.store(true, Ordering::SeqCst);
                    drop(b);
                    let _ = over.try_send(what);
                    return;
                }
                b.extend_from_slice(&chunk[..n]);
            }
        }
    }
}

/// `sh -c COMMAND` in the box, with stdin at its end, to its exit or the limit.
async fn command_in(b: &Arc<dyn Sandbox>, command: &str, env: BTreeMap<String, String>, limit: Duration) -> Outcome {
    let opts = ExecOptions {
        cwd: Some("/".into()),
        env,
        ..Default::default()
    };
    let argv = ["sh".to_string(), "-c".to_string(), command.to_string()];
    let deadline = tokio::time::Instant::now() + limit;
    let mut p = match b.exec(&argv, &opts, &Ctx::background().with_timeout(limit)).await {
        Ok(p) => p,
        Err(e) if e.code() == ErrorCode::Timeout => return Outcome::TimedOut,
        Err(e) => return Outcome::Failed(e.message().to_string()),
    };
    if let Some(mut w) = p.stdin.take() {
        let _ = w.close().await;
    }
    let (out, err) = (Arc::new(Collected::default()), Arc::new(Collected::default()));
    let (tx, mut over) = tokio::sync::mpsc::channel(2);
    let mut pumps = tokio::task::JoinSet::new();
    pumps.spawn(pump(p.stdout.take(), out.clone(), tx.clone(), "stdout"));
    pumps.spawn(pump(p.stderr.take(), err.clone(), tx, "stderr"));
    let status = tokio::select! {
        w = tokio::time::timeout_at(deadline, p.wait()) => match w {
            Ok(Ok(st)) => st,
            Ok(Err(e)) if e.code() == ErrorCode::Timeout => return Outcome::TimedOut,
            Ok(Err(e)) => return Outcome::Failed(e.message().to_string()),
            Err(_) => return Outcome::TimedOut,
        },
        Some(what) = over.recv() => return Outcome::TooLarge(what),
    };
    // What the shell wrote before it exited is in the pipes; a program it left behind may
    // hold them open, so they are read a little longer and then let go with the box.
    let _ = tokio::time::timeout(OUTPUT_GRACE, async { while pumps.join_next().await.is_some() {} }).await;
    pumps.abort_all();
    for (c, what) in [(&out, "stdout"), (&err, "stderr")] {
        if c.over.load(Ordering::SeqCst) {
            return Outcome::TooLarge(what);
        }
    }
    let take = |c: &Collected| std::mem::take(&mut *c.buf.lock().unwrap_or_else(|p| p.into_inner()));
    Outcome::Ran {
        code: status.code,
        stdout: take(&out),
        stderr: take(&err),
    }
}

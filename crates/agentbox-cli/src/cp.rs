//! `agentbox box cp`: files and directories between this machine and a box, as `docker cp`
//! copies them.
//!
//! - A file goes to the destination path, or into it (under its own base name) when the
//!   destination is a directory or ends in `/` (a directory made if missing).
//! - A directory goes to the destination when that does not exist, or into it (under its own
//!   base name) when it is a directory or ends in `/`; a file there is refused.
//! - Out of a box, a directory comes as a tar the box makes, unpacked here by
//!   `agentbox-sync`'s extractor (links skipped and said, nothing outside the destination);
//!   into a box, a directory goes as `sync seed` sends one (links here skipped, never followed).
//! - `-` as the destination writes a file's bytes to stdout, or a directory as a tar stream
//!   (its members under the directory's base name, as `docker cp` does); `-` as the source
//!   reads a file's bytes from stdin, or a tar stream when the destination ends in `/` (the
//!   directory it is unpacked into, made if missing).

use std::path::{Path, PathBuf};

use agentbox_core::{Ctx, Error, ExecOptions, FinishOptions, Result, Sandbox, SandboxId, finish};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::boxes::{attach, box_path};

/// The most bytes `box cp` moves in one copy: a file, a stdin, or a directory's archive.
const MAX_COPY_BYTES: u64 = 1 << 30;

/// What a box path is: `d` a directory, `f` something else that exists, `none`.
const KIND: &str = r#"if [ -d "$1" ]; then echo d; elif [ -e "$1" ] || [ -L "$1" ]; then echo f; else echo none; fi"#;

/// The contents of the directory `$1` as a tar on stdout.
const PACK_CONTENTS: &str = r#"cd -- "$1" || exit 3
exec tar -c -f - ."#;

/// The directory `$2` of `$1`, under its own name, as a tar on stdout.
const PACK_NAMED: &str = r#"cd -- "$1" || exit 3
exec tar -c -f - -- "$2""#;

/// A tar on stdin unpacked into the directory `$1`, made if missing.
const UNPACK: &str = r#"mkdir -p -- "$1" && exec tar -x -f - --no-same-owner -C "$1""#;

/// One side of a copy.
enum End {
    Here(String),
    Stdio,
    InBox(SandboxId, String),
}

fn end(s: &str) -> End {
    if s == "-" {
        End::Stdio
    } else if let Some((id, path)) = box_path(s) {
        End::InBox(id, path)
    } else {
        End::Here(s.to_string())
    }
}

/// The last name of `path` (`a/b/` is `b`).
fn base_name(path: &str) -> Option<&str> {
    let t = path.trim_end_matches('/');
    let b = t.rsplit('/').next().unwrap_or(t);
    (!b.is_empty() && b != "." && b != "..").then_some(b)
}

/// The base name of a source, or an error naming it.
fn base_of(src: &str, shown: &str) -> Result<String> {
    if let Some(b) = base_name(src) {
        return Ok(b.to_string());
    }
    // `.` and `..` here: the name of the directory they are.
    std::fs::canonicalize(src)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .ok_or_else(|| Error::invalid(format!("cp: the source {shown} has no name to copy under")))
}

/// `name` under the directory `dir`.
fn under(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

pub(crate) async fn copy(src: &str, dst: &str, ctx: &Ctx) -> Result<()> {
    match (end(src), end(dst)) {
        (End::Here(from), End::InBox(id, to)) => here_to_box(&from, &id, &to, ctx).await,
        (End::Stdio, End::InBox(id, to)) => stdin_to_box(&id, &to, ctx).await,
        (End::InBox(id, from), End::Here(to)) => box_to_here(&id, &from, &to, ctx).await,
        (End::InBox(id, from), End::Stdio) => box_to_stdout(&id, &from, ctx).await,
        (End::InBox(..), End::InBox(..)) => Err(crate::usage(Error::invalid(
            "cp: copy between two boxes through this machine, in two steps",
        ))),
        _ => Err(crate::usage(Error::invalid(
            "cp: one side must be ID:PATH (for example local:3f9a…:notes.txt), the other a path here or - for stdin/stdout",
        ))),
    }
}

/// `sh -c script` in the box with `args`, `stdin` written to it, run to its end; a non-zero
/// exit is `transfer_failed` naming `what` and the box's stderr.
async fn box_sh(
    b: &dyn Sandbox,
    script: &str,
    args: &[&str],
    stdin: Vec<u8>,
    what: &str,
    ctx: &Ctx,
) -> Result<Vec<u8>> {
    let mut argv = vec!["sh".to_string(), "-c".into(), script.into(), "agentbox-cp".into()];
    argv.extend(args.iter().map(|a| a.to_string()));
    let p = b.exec(&argv, &ExecOptions::default(), ctx).await?;
    let out = finish(
        p,
        FinishOptions {
            stdin,
            max_output: 1 << 20,
        },
    )
    .await?;
    if out.status.code != 0 {
        return Err(Error::transfer_failed(format!(
            "cp: {what} in box {}: exit {}: {}",
            b.id(),
            out.status.code,
            out.stderr_text().trim()
        )));
    }
    Ok(out.stdout)
}

/// What `path` is in the box: `d`, `f` or `none`.
async fn box_kind(b: &dyn Sandbox, path: &str, ctx: &Ctx) -> Result<String> {
    let out = box_sh(b, KIND, &[path], Vec::new(), &format!("looking at {path}"), ctx).await?;
    Ok(String::from_utf8_lossy(&out).trim().to_string())
}

async fn here_to_box(from: &str, id: &SandboxId, to: &str, ctx: &Ctx) -> Result<()> {
    let meta = std::fs::metadata(from).map_err(|e| Error::io(e, format!("cp: reading {from}")))?;
    let b = attach(id, ctx).await?;
    let name = base_of(from, from)?;
    if meta.is_dir() {
        let target = if to.ends_with('/') || box_kind(&*b, to, ctx).await? == "d" {
            under(to, &name)
        } else {
            to.to_string()
        };
        if box_kind(&*b, &target, ctx).await? == "f" {
            return Err(Error::invalid(format!(
                "cp: {id}:{target} is a file in the box; the directory {from} cannot be copied onto it"
            )));
        }
        let seeded = agentbox_sync::seed_dir(
            &*b,
            &agentbox_sync::SeedOptions {
                from: PathBuf::from(from),
                to: target,
                ..Default::default()
            },
            ctx,
        )
        .await?
        .whole()?;
        for (why, n) in &seeded.skipped {
            crate::term::say(&format!("cp: {n} {why} entries of {from} not copied (never followed)"));
        }
        return Ok(());
    }
    if meta.len() > MAX_COPY_BYTES {
        return Err(Error::too_large(format!(
            "cp: {from} is over the {MAX_COPY_BYTES}-byte bound"
        )));
    }
    let data = tokio::fs::read(from)
        .await
        .map_err(|e| Error::io(e, format!("cp: reading {from}")))?;
    if to.ends_with('/') {
        return b.upload(&under(to, &name), &data, ctx).await;
    }
    match b.upload(to, &data, ctx).await {
        Ok(()) => Ok(()),
        // A directory there: the file goes into it, as docker cp does.
        Err(e) => match box_kind(&*b, to, ctx).await {
            Ok(k) if k == "d" => b.upload(&under(to, &name), &data, ctx).await,
            _ => Err(e),
        },
    }
}

/// This process's stdin, whole, bounded.
async fn read_stdin() -> Result<Vec<u8>> {
    let mut data = Vec::new();
    tokio::io::stdin()
        .take(MAX_COPY_BYTES + 1)
        .read_to_end(&mut data)
        .await
        .map_err(|e| Error::io(e, "cp: reading stdin"))?;
    if data.len() as u64 > MAX_COPY_BYTES {
        return Err(Error::too_large(format!(
            "cp: stdin is over the {MAX_COPY_BYTES}-byte bound"
        )));
    }
    Ok(data)
}

async fn stdin_to_box(id: &SandboxId, to: &str, ctx: &Ctx) -> Result<()> {
    let b = attach(id, ctx).await?;
    let data = read_stdin().await?;
    if to.ends_with('/') {
        // A tar stream, unpacked into the directory, as docker cp does with `-`.
        box_sh(&*b, UNPACK, &[to], data, &format!("unpacking stdin into {to}"), ctx).await?;
        return Ok(());
    }
    match b.upload(to, &data, ctx).await {
        Ok(()) => Ok(()),
        Err(e) => match box_kind(&*b, to, ctx).await {
            Ok(k) if k == "d" => Err(Error::invalid(format!(
                "cp: {id}:{to} is a directory in the box: stdin's bytes become a file, so name one (or end the path with / to unpack a tar stream into it)"
            ))),
            _ => Err(e),
        },
    }
}

/// The file `from` of the box, or `None` when it is a directory.
async fn file_or_dir(b: &dyn Sandbox, from: &str, ctx: &Ctx) -> Result<Option<Vec<u8>>> {
    if from.ends_with('/') {
        return match box_kind(b, from, ctx).await?.as_str() {
            "d" => Ok(None),
            _ => Err(Error::not_found(format!(
                "cp: {}:{from}: no such directory in the box",
                b.id()
            ))),
        };
    }
    match b.download(from, MAX_COPY_BYTES, ctx).await {
        Ok(data) => Ok(Some(data)),
        Err(e) => match box_kind(b, from, ctx).await {
            Ok(k) if k == "d" => Ok(None),
            _ => Err(e),
        },
    }
}

async fn box_to_here(id: &SandboxId, from: &str, to: &str, ctx: &Ctx) -> Result<()> {
    let b = attach(id, ctx).await?;
    let name = base_name(from)
        .ok_or_else(|| Error::invalid(format!("cp: the source {id}:{from} has no name to copy under")))?
        .to_string();
    let into = to.ends_with('/') || Path::new(to).is_dir();
    match file_or_dir(&*b, from, ctx).await? {
        Some(data) => {
            let target = if into {
                std::fs::create_dir_all(to).map_err(|e| Error::io(e, format!("cp: making {to}")))?;
                under(to, &name)
            } else {
                to.to_string()
            };
            tokio::fs::write(&target, data)
                .await
                .map_err(|e| Error::io(e, format!("cp: writing {target}")))
        }
        None => {
            let target = if into { under(to, &name) } else { to.to_string() };
            if std::fs::symlink_metadata(&target).is_ok_and(|m| !m.is_dir()) {
                return Err(Error::invalid(format!(
                    "cp: {target} is not a directory here; the directory {id}:{from} cannot be copied onto it"
                )));
            }
            std::fs::create_dir_all(&target).map_err(|e| Error::io(e, format!("cp: making {target}")))?;
            let argv = ["sh", "-c", PACK_CONTENTS, "agentbox-cp", from].map(String::from);
            let mut p = b.exec(&argv, &ExecOptions::default(), ctx).await?;
            let stdout = p
                .stdout
                .take()
                .ok_or_else(|| Error::unknown("cp: the box's tar has no stdout"))?;
            let stderr = p.stderr.take();
            let opts = agentbox_sync::Options {
                max_bytes: MAX_COPY_BYTES,
                ..Default::default()
            };
            let (receipt, why) = tokio::join!(
                agentbox_sync::extract_tar(stdout, PathBuf::from(&target), opts),
                read_some(stderr)
            );
            let status = p.wait().await?;
            if let Some(s) = receipt.stopped {
                return Err(Error::transfer_failed(format!(
                    "cp: unpacking {id}:{from} into {target} stopped ({:?}): {}",
                    s.reason, s.message
                )));
            }
            if status.code != 0 {
                return Err(Error::transfer_failed(format!(
                    "cp: packing {from} in box {id}: exit {}: {}",
                    status.code,
                    why.trim()
                )));
            }
            for (why, n) in &receipt.skipped {
                crate::term::say(&format!(
                    "cp: {n} entries of {id}:{from} not copied ({})",
                    serde_json::to_value(why)
                        .ok()
                        .and_then(|v| v.as_str().map(String::from))
                        .unwrap_or_default()
                ));
            }
            Ok(())
        }
    }
}

/// Up to 64 KiB of a program's stderr, as text; the rest is read and dropped.
async fn read_some(from: Option<agentbox_core::ByteReader>) -> String {
    let Some(mut from) = from else { return String::new() };
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 8192];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            break;
        }
        if kept.len() < 64 * 1024 {
            kept.extend_from_slice(&buf[..n]);
        }
    }
    String::from_utf8_lossy(&kept).into_owned()
}

async fn box_to_stdout(id: &SandboxId, from: &str, ctx: &Ctx) -> Result<()> {
    let b = attach(id, ctx).await?;
    let mut out = tokio::io::stdout();
    match file_or_dir(&*b, from, ctx).await? {
        Some(data) => {
            out.write_all(&data)
                .await
                .map_err(|e| Error::io(e, "cp: writing stdout"))?;
        }
        None => {
            let trimmed = from.trim_end_matches('/');
            let (parent, name) = match trimmed.rsplit_once('/') {
                Some(("", n)) => ("/", n),
                Some((p, n)) => (p, n),
                None => (".", trimmed),
            };
            if base_name(name).is_none() {
                return Err(Error::invalid(format!(
                    "cp: the source {id}:{from} has no name to stream a tar of"
                )));
            }
            let argv = ["sh", "-c", PACK_NAMED, "agentbox-cp", parent, name].map(String::from);
            let mut p = b.exec(&argv, &ExecOptions::default(), ctx).await?;
            let stdout = p
                .stdout
                .take()
                .ok_or_else(|| Error::unknown("cp: the box's tar has no stdout"))?;
            let stderr = p.stderr.take();
            let mut bounded = stdout.take(MAX_COPY_BYTES + 1);
            let (copied, why) = tokio::join!(tokio::io::copy(&mut bounded, &mut out), read_some(stderr));
            let copied = copied.map_err(|e| Error::io(e, "cp: writing stdout"))?;
            if copied > MAX_COPY_BYTES {
                let _ = p.kill().await;
                return Err(Error::too_large(format!(
                    "cp: the tar of {id}:{from} is over the {MAX_COPY_BYTES}-byte bound"
                )));
            }
            let status = p.wait().await?;
            if status.code != 0 {
                return Err(Error::transfer_failed(format!(
                    "cp: packing {from} in box {id}: exit {}: {}",
                    status.code,
                    why.trim()
                )));
            }
        }
    }
    out.flush().await.map_err(|e| Error::io(e, "cp: writing stdout"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_names_and_paths_under_a_directory() {
        assert_eq!(base_name("a/b/"), Some("b"));
        assert_eq!(base_name("/x"), Some("x"));
        assert_eq!(base_name("f.txt"), Some("f.txt"));
        assert_eq!(base_name("/"), None);
        assert_eq!(base_name("a/.."), None);
        assert_eq!(under("d/", "f"), "d/f");
        assert_eq!(under("/", "f"), "/f");
    }
}

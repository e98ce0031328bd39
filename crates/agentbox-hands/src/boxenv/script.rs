//! The script path: one exec of a fixed script ([`super::scripts`]) per operation, paths as
//! arguments, `LC_ALL=C` so a failure is the kernel's strerror, which [`code_of`] maps to the
//! code the host's errno gives. Every box can take it; it is how a box with no runner is
//! served, and how a box with one is served what its runner does not (canonical paths, links,
//! temporaries, watches, files over what one message carries).

use std::collections::BTreeMap;

use agentbox_core::{Ctx, ExecOptions as BoxExecOptions, FinishOptions, Finished, finish};

use super::BoxEnv;
use super::scripts;
use crate::path::base_name;
use crate::watch::Seen;
use crate::{FileInfo, FileKind, FsCode, FsError, WatchTarget};

impl BoxEnv {
    /// Run a script with its arguments; a box-level failure becomes an `FsError` and, when the
    /// box is gone or stopped answering, sticks.
    pub(super) async fn script(
        &self,
        script: &str,
        args: &[&str],
        stdin: Vec<u8>,
        max_out: usize,
        ctx: &Ctx,
    ) -> Result<Finished, FsError> {
        let path = args.first().copied().unwrap_or_default();
        if let Some(why) = self.lost() {
            return Err(FsError::new(FsCode::Unknown, path, why));
        }
        let op = ctx.with_timeout(self.op_timeout);
        let (script, opts) = if self.one_call() {
            if !stdin.is_empty() {
                return Err(FsError::new(
                    FsCode::NotSupported,
                    path,
                    format!(
                        "box {} takes no input: it runs each command as one call, so bytes go by upload",
                        self.sandbox.id()
                    ),
                ));
            }
            // Such a box carries no variables: the locale is the script's own first line. The
            // call's own deadline is the operation's, so nothing of it runs on past it.
            let opts = BoxExecOptions {
                timeout: self.own_deadline(None, &op),
                ..Default::default()
            };
            (format!("export LC_ALL=C\n{script}"), opts)
        } else {
            let opts = BoxExecOptions {
                env: BTreeMap::from([("LC_ALL".to_string(), "C".to_string())]),
                ..Default::default()
            };
            (script.to_string(), opts)
        };
        let mut argv = vec!["sh".to_string(), "-c".into(), script, "agentbox-hands".into()];
        argv.extend(args.iter().map(|a| a.to_string()));
        let r = match self.sandbox.exec(&argv, &opts, &op).await {
            Ok(p) => {
                finish(
                    p,
                    FinishOptions {
                        stdin,
                        max_output: max_out,
                    },
                )
                .await
            }
            Err(e) => Err(e),
        };
        r.map_err(|e| self.box_error(e, path, ctx))
    }

    /// Run a script and require exit 0, mapping its stderr to a code.
    pub(super) async fn ok(&self, script: &str, args: &[&str], stdin: Vec<u8>, ctx: &Ctx) -> Result<Vec<u8>, FsError> {
        let cap = usize::try_from(self.max_reader_bytes)
            .unwrap_or(usize::MAX)
            .saturating_add(4096);
        let out = self.script(script, args, stdin, cap, ctx).await?;
        if out.status.code == 0 {
            return Ok(out.stdout);
        }
        let text = out.stderr_text();
        let path = args.first().copied().unwrap_or_default();
        let message = text.trim().lines().last().unwrap_or("failed").to_string();
        Err(FsError::new(code_of(&text), path, message))
    }

    /// Every path under the targets, for a polling watcher.
    pub(super) async fn snapshot(&self, targets: &[WatchTarget]) -> Option<Seen> {
        let mut seen = Seen::new();
        for t in targets {
            let depth = if t.recursive { "-1" } else { "1" };
            let out = self
                .ok(scripts::SNAPSHOT, &[depth, &t.path], vec![], &Ctx::background())
                .await
                .ok()?;
            for rec in parse_records(&out, 4) {
                let p = rec[0].clone();
                if crate::watch::excluded(&t.path, &p, &t.exclude) {
                    continue;
                }
                seen.insert(
                    p,
                    (
                        kind_of_letter(&rec[1]),
                        rec[2].parse().unwrap_or(0),
                        seconds_to_ms(&rec[3]),
                    ),
                );
            }
        }
        Some(seen)
    }
}

/// A reader's refusal of a link it was told not to follow, in the host's words.
pub(super) fn refused_link(mut e: FsError, path: &str, no_follow: bool) -> FsError {
    if e.code == FsCode::Invalid && no_follow {
        e.message = format!("Refusing to follow a symbolic link: {path}");
    }
    e
}

/// A failure's code from the text GNU tools print under `LC_ALL=C`.
pub fn code_of(stderr: &str) -> FsCode {
    let has = |s: &str| stderr.contains(s);
    if has("agentbox:symlink") || has("agentbox:invalid") {
        FsCode::Invalid
    } else if has("agentbox:too_large") {
        FsCode::NotSupported
    } else if has("agentbox:not_directory") || has("Not a directory") || has("cannot overwrite non-directory") {
        FsCode::NotDirectory
    } else if has("No such file or directory") {
        FsCode::NotFound
    } else if has("Is a directory") || has("cannot overwrite directory") {
        FsCode::IsDirectory
    } else if has("Permission denied") || has("Operation not permitted") {
        FsCode::PermissionDenied
    } else if has("Invalid argument") || has("subdirectory of itself") {
        FsCode::Invalid
    } else {
        FsCode::Unknown
    }
}

/// NUL-separated fields, `fields` to a record.
pub(super) fn parse_records(bytes: &[u8], fields: usize) -> Vec<Vec<String>> {
    let parts: Vec<String> = bytes
        .split(|&b| b == 0)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    parts
        .chunks(fields)
        .filter(|c| c.len() == fields)
        .map(|c| c.to_vec())
        .collect()
}

/// find's `%y` letter as a kind.
pub(super) fn kind_of_letter(l: &str) -> FileKind {
    match l {
        "d" => FileKind::Directory,
        "l" => FileKind::Symlink,
        _ => FileKind::File,
    }
}

fn kind_of_stat(s: &str) -> FileKind {
    match s {
        "directory" => FileKind::Directory,
        "symbolic link" => FileKind::Symlink,
        _ => FileKind::File,
    }
}

/// `1700000000.1234` seconds as whole milliseconds.
pub(super) fn seconds_to_ms(s: &str) -> i64 {
    let (secs, frac) = s.split_once('.').unwrap_or((s, ""));
    let secs: i64 = secs.parse().unwrap_or(0);
    let ms: i64 = format!("{:0<3}", &frac[..frac.len().min(3)]).parse().unwrap_or(0);
    secs * 1000 + ms
}

/// One line of [`scripts::INFO`]: kind|size|mtime.
pub(super) fn parse_info(path: &str, line: &str) -> Result<FileInfo, FsError> {
    let bad = || FsError::new(FsCode::Unknown, path, format!("unexpected stat output {line:?}"));
    let mut parts = line.rsplitn(3, '|');
    let mtime = parts.next().ok_or_else(bad)?;
    let size = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
    let kind = kind_of_stat(parts.next().ok_or_else(bad)?);
    Ok(FileInfo {
        name: base_name(path),
        path: path.to_string(),
        kind,
        size,
        mtime_ms: seconds_to_ms(mtime),
    })
}

/// Bytes as text, a byte that is not UTF-8 as U+FFFD.
pub(super) fn text(b: Vec<u8>) -> String {
    String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gnu_messages_map_to_codes() {
        assert_eq!(code_of("cat: x: No such file or directory"), FsCode::NotFound);
        assert_eq!(
            code_of("stat: cannot statx 'f/x': Not a directory"),
            FsCode::NotDirectory
        );
        assert_eq!(code_of("rm: cannot remove 'd': Is a directory"), FsCode::IsDirectory);
        assert_eq!(
            code_of("mv: cannot overwrite directory 'd' with non-directory"),
            FsCode::IsDirectory
        );
        assert_eq!(
            code_of("mv: cannot overwrite non-directory 'f' with directory 'd2'"),
            FsCode::NotDirectory
        );
        assert_eq!(code_of("tee: x: Permission denied"), FsCode::PermissionDenied);
        assert_eq!(
            code_of("mkdir: cannot create directory 'f': File exists"),
            FsCode::Unknown
        );
        assert_eq!(code_of("agentbox:too_large 99"), FsCode::NotSupported);
    }

    #[test]
    fn stat_lines_and_times_parse() {
        let i = parse_info("/w/a|b", "regular file|3|1796013729.906").unwrap();
        assert_eq!(
            (i.kind, i.size, i.mtime_ms, i.name.as_str()),
            (FileKind::File, 3, 1_796_013_729_906, "a|b")
        );
        assert_eq!(seconds_to_ms("5.1"), 5100);
        assert_eq!(seconds_to_ms("7"), 7000);
        assert_eq!(
            parse_info("/x", "directory|4096|1.000").unwrap().kind,
            FileKind::Directory
        );
    }
}

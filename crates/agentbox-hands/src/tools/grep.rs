//! `grep {pattern, path?, glob?, ignoreCase?, literal?, context?, limit? = 100}`, with GNU grep
//! in the environment: a box needs no ripgrep. The pattern and paths are arguments of one
//! fixed script, never part of its text.

use agentbox_core::Ctx;
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::args::Count;
use super::{ToolError, ToolResult, Typed, capture, glob, with_notices};
use crate::{ExecutionEnv, FileKind, FsCode};

pub(super) struct Grep;

/// Lines longer than this are cut.
const MAX_LINE: usize = 500;

/// `$1` is the regex flavour flag, then grep's arguments; grep's status follows on stderr.
const SCRIPT: &str = r#"f=$1; shift
grep "$f" "$@"
echo "agentbox-grep-status $?" >&2"#;

async fn run_grep(
    env: &dyn ExecutionEnv,
    flavour: &str,
    args: &[String],
    ctx: &Ctx,
) -> Result<(Vec<u8>, String), ToolError> {
    let mut argv = vec![
        "sh".to_string(),
        "-c".into(),
        SCRIPT.into(),
        "agentbox-grep".into(),
        flavour.into(),
    ];
    argv.extend(args.iter().cloned());
    capture(env, argv, ctx).await
}

fn status_of(stderr: &str) -> Option<i32> {
    stderr
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("agentbox-grep-status "))
        .and_then(|s| s.trim().parse().ok())
}

/// `grep`'s arguments.
#[derive(Deserialize, JsonSchema)]
pub(super) struct GrepArgs {
    /// Search pattern (regex or literal string)
    pattern: String,
    /// Directory or file to search (default: current directory)
    path: Option<String>,
    /// Filter files by glob pattern, e.g. '*.ts' or '**/*.spec.ts'
    glob: Option<String>,
    /// Case-insensitive search (default: false)
    #[serde(rename = "ignoreCase")]
    ignore_case: Option<bool>,
    /// Treat pattern as literal string instead of regex (default: false)
    literal: Option<bool>,
    /// Number of lines to show before and after each match (default: 0)
    context: Option<Count>,
    /// Maximum number of matches to return (default: 100)
    limit: Option<Count>,
}

#[async_trait]
impl Typed for Grep {
    type Args = GrepArgs;
    const NAME: &'static str = "grep";
    const DESCRIPTION: &'static str = "Search file contents for a pattern. Returns matching lines with file paths and line numbers. Skips .git and node_modules. Output is truncated to 100 matches or 50KB (whichever is hit first). Long lines are truncated to 500 chars.";
    const READ_ONLY: bool = true;

    async fn call(&self, env: &dyn ExecutionEnv, args: GrepArgs, ctx: &Ctx) -> Result<ToolResult, ToolError> {
        let pattern = args.pattern;
        let path = args.path.unwrap_or_else(|| ".".into());
        let glob_pat = args.glob;
        let limit = args.limit.map_or(100, |c| c.0).max(1) as usize;
        let context = args.context.map_or(0, |c| c.0);
        let (ignore_case, literal) = (args.ignore_case.unwrap_or(false), args.literal.unwrap_or(false));
        let info = env.file_info(&path, ctx).await.map_err(|e| {
            if matches!(e.code, FsCode::NotFound | FsCode::NotDirectory) {
                ToolError(format!("Path not found: {path}"))
            } else {
                ToolError(e.message)
            }
        })?;
        let root = env.absolute_path(&path);
        let is_dir = info.kind == FileKind::Directory || env.list_dir(&root, ctx).await.is_ok();
        let mut gargs = vec![
            "-r".to_string(),
            "-n".into(),
            "-H".into(),
            "-Z".into(),
            "-I".into(),
            "--exclude-dir=.git".into(),
            "--exclude-dir=node_modules".into(),
        ];
        if ignore_case {
            gargs.push("-i".into());
        }
        if context > 0 {
            gargs.push(format!("-C{context}"));
        }
        gargs.extend(["-e".into(), pattern.clone(), "--".into(), root.clone()]);
        let (mut stdout, mut stderr) = run_grep(env, if literal { "-F" } else { "-P" }, &gargs, ctx).await?;
        if !literal && status_of(&stderr) == Some(2) && stderr.contains("-P") {
            // A grep built without PCRE: extended regular expressions instead.
            (stdout, stderr) = run_grep(env, "-E", &gargs, ctx).await?;
        }
        if status_of(&stderr) == Some(2) {
            let why: Vec<&str> = stderr
                .lines()
                .filter(|l| !l.starts_with("agentbox-grep-status"))
                .collect();
            return Err(ToolError(why.join("\n")));
        }
        let rel = |file: &str| -> String {
            if is_dir {
                file.strip_prefix(&root)
                    .map(|r| r.trim_start_matches('/').to_string())
                    .unwrap_or_else(|| file.to_string())
            } else {
                crate::path::base_name(file)
            }
        };
        // grep walks in directory order: results go by file, each file's lines in order.
        let mut records: Vec<(String, String)> = stdout
            .split(|&b| b == b'\n')
            .filter(|raw| !raw.is_empty() && *raw != b"--")
            .filter_map(|raw| {
                let z = raw.iter().position(|&b| b == 0)?;
                Some((
                    String::from_utf8_lossy(&raw[..z]).into_owned(),
                    String::from_utf8_lossy(&raw[z + 1..]).into_owned(),
                ))
            })
            .collect();
        records.sort_by(|a, b| a.0.cmp(&b.0));
        let mut lines = Vec::new();
        let mut matches = 0usize;
        let mut reached = false;
        let mut cut = false;
        for (file, rest) in records {
            let digits = rest.chars().take_while(|c| c.is_ascii_digit()).count();
            let (num, sep, text) = (
                &rest[..digits],
                rest[digits..].chars().next().unwrap_or(':'),
                rest.get(digits + 1..).unwrap_or(""),
            );
            let shown = rel(&file);
            if let Some(g) = &glob_pat
                && !glob::matches(g, &shown)
            {
                continue;
            }
            if sep == ':' {
                if matches == limit {
                    reached = true;
                    break;
                }
                matches += 1;
            }
            let mut text = text.to_string();
            if text.chars().count() > MAX_LINE {
                text = text.chars().take(MAX_LINE).collect::<String>() + "... [truncated]";
                cut = true;
            }
            lines.push(format!("{shown}{sep}{num}{sep} {text}"));
        }
        if matches == 0 {
            return Ok(ToolResult::ok("No matches found".into(), Value::Null));
        }
        let mut notices = Vec::new();
        if reached {
            notices.push(format!(
                "{limit} matches limit reached. Use limit={} for more, or refine pattern",
                limit * 2
            ));
        }
        if cut {
            notices.push(format!(
                "Some lines truncated to {MAX_LINE} chars. Use read tool to see full lines"
            ));
        }
        let output = with_notices(&lines, notices);
        Ok(ToolResult::ok(
            output,
            json!({ "matchLimitReached": reached.then_some(limit), "linesTruncated": cut }),
        ))
    }
}

//! `find {pattern, path?, limit? = 1000}`: a glob over the tree, with GNU find in the
//! environment (a box needs no fd). Skips `.git` and `node_modules`.

use agentbox_core::Ctx;
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::args::Count;
use super::{ToolError, ToolResult, Typed, capture, glob, with_notices};
use crate::{ExecutionEnv, FsCode};

pub(super) struct Find;

/// Every path under `$1` with its type letter, NUL-separated, bounded at 16 MiB.
const SCRIPT: &str =
    r#"find "$1" -mindepth 1 \( -name .git -o -name node_modules \) -prune -o -printf '%y %P\0' | head -c 16777216"#;

/// `find`'s arguments.
#[derive(Deserialize, JsonSchema)]
pub(super) struct FindArgs {
    /// Glob pattern to match files, e.g. '*.ts', '**/*.json', or 'src/**/*.spec.ts'
    pattern: String,
    /// Directory to search in (default: current directory)
    path: Option<String>,
    /// Maximum number of results (default: 1000)
    limit: Option<Count>,
}

#[async_trait]
impl Typed for Find {
    type Args = FindArgs;
    const NAME: &'static str = "find";
    const DESCRIPTION: &'static str = "Search for files by glob pattern. Returns matching file paths relative to the search directory. Skips .git and node_modules. Output is truncated to 1000 results or 50KB (whichever is hit first).";
    const READ_ONLY: bool = true;

    async fn call(&self, env: &dyn ExecutionEnv, args: FindArgs, ctx: &Ctx) -> Result<ToolResult, ToolError> {
        let pattern = args.pattern;
        let path = args.path.unwrap_or_else(|| ".".into());
        let limit = args.limit.map_or(1000, |c| c.0).max(1) as usize;
        env.list_dir(&path, ctx).await.map_err(|e| match e.code {
            FsCode::NotFound => ToolError(format!("Path not found: {path}")),
            FsCode::NotDirectory => ToolError(format!("Not a directory: {path}")),
            _ => ToolError(e.message),
        })?;
        let root = env.absolute_path(&path);
        let argv = vec![
            "sh".to_string(),
            "-c".into(),
            SCRIPT.into(),
            "agentbox-find".into(),
            root,
        ];
        let (bytes, _) = capture(env, argv, ctx).await?;
        let mut found: Vec<String> = bytes
            .split(|&b| b == 0)
            .filter_map(|rec| {
                let rec = String::from_utf8_lossy(rec);
                let (kind, rel) = rec.split_once(' ')?;
                glob::matches(&pattern, rel).then(|| {
                    if kind == "d" {
                        format!("{rel}/")
                    } else {
                        rel.to_string()
                    }
                })
            })
            .collect();
        found.sort();
        if found.is_empty() {
            return Ok(ToolResult::ok("No files found matching pattern".into(), Value::Null));
        }
        let reached = found.len() > limit;
        found.truncate(limit);
        let notices = if reached {
            vec![format!(
                "{limit} results limit reached. Use limit={} for more, or refine pattern",
                limit * 2
            )]
        } else {
            vec![]
        };
        let output = with_notices(&found, notices);
        Ok(ToolResult::ok(
            output,
            json!({ "resultLimitReached": reached.then_some(limit) }),
        ))
    }
}

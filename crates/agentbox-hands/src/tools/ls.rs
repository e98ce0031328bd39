//! `ls {path?, limit? = 500}`.

use agentbox_core::Ctx;
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::args::Count;
use super::{ToolError, ToolResult, Typed, with_notices};
use crate::{ExecutionEnv, FileKind, FsCode};

pub(super) struct Ls;

/// `ls`'s arguments.
#[derive(Deserialize, JsonSchema)]
pub(super) struct LsArgs {
    /// Directory to list (default: current directory)
    path: Option<String>,
    /// Maximum number of entries to return (default: 500)
    limit: Option<Count>,
}

#[async_trait]
impl Typed for Ls {
    type Args = LsArgs;
    const NAME: &'static str = "ls";
    const DESCRIPTION: &'static str = "List directory contents. Returns entries sorted alphabetically, with '/' suffix for directories. Includes dotfiles. Output is truncated to 500 entries or 50KB (whichever is hit first).";
    const READ_ONLY: bool = true;

    async fn call(&self, env: &dyn ExecutionEnv, args: LsArgs, ctx: &Ctx) -> Result<ToolResult, ToolError> {
        let path = args.path.unwrap_or_else(|| ".".into());
        let limit = args.limit.map_or(500, |c| c.0).max(1) as usize;
        let mut entries = env.list_dir(&path, ctx).await.map_err(|e| match e.code {
            FsCode::NotFound => ToolError(format!("Path not found: {path}")),
            FsCode::NotDirectory => ToolError(format!("Not a directory: {path}")),
            _ => ToolError(e.message),
        })?;
        entries.sort_by(|a, b| {
            a.name
                .to_lowercase()
                .cmp(&b.name.to_lowercase())
                .then(a.name.cmp(&b.name))
        });
        if entries.is_empty() {
            return Ok(ToolResult::ok("(empty directory)".into(), Value::Null));
        }
        let reached = entries.len() > limit;
        let mut names = Vec::new();
        for e in entries.into_iter().take(limit) {
            let dir = match e.kind {
                FileKind::Directory => true,
                // A link to a directory lists like one.
                FileKind::Symlink => match env.canonical_path(&e.path, ctx).await {
                    Ok(target) => env
                        .file_info(&target, ctx)
                        .await
                        .is_ok_and(|i| i.kind == FileKind::Directory),
                    Err(_) => false,
                },
                FileKind::File => false,
            };
            names.push(if dir { format!("{}/", e.name) } else { e.name });
        }
        let notices = if reached {
            vec![format!(
                "{limit} entries limit reached. Use limit={} for more",
                limit * 2
            )]
        } else {
            vec![]
        };
        let output = with_notices(&names, notices);
        Ok(ToolResult::ok(
            output,
            json!({ "entryLimitReached": reached.then_some(limit) }),
        ))
    }
}

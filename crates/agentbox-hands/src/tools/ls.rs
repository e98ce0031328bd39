//! `ls {path?, limit? = 500}`.

use agentbox_core::Ctx;
use async_trait::async_trait;
use serde_json::{Value, json};

use super::{Tool, ToolError, ToolResult, number, object, string, with_notices};
use crate::env::{ExecutionEnv, FileKind, FsCode};

pub struct Ls;

#[async_trait]
impl Tool for Ls {
    fn name(&self) -> &'static str {
        "ls"
    }
    fn description(&self) -> &'static str {
        "List directory contents. Returns entries sorted alphabetically, with '/' suffix for directories. Includes dotfiles. Output is truncated to 500 entries or 50KB (whichever is hit first)."
    }
    fn schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Directory to list (default: current directory)"},
                "limit": {"type": "number", "description": "Maximum number of entries to return (default: 500)"}
            }
        })
    }
    fn read_only(&self) -> bool {
        true
    }

    async fn run(&self, env: &dyn ExecutionEnv, args: Value, ctx: &Ctx) -> Result<ToolResult, ToolError> {
        object(&args)?;
        let path = string(&args, "path")?.unwrap_or_else(|| ".".into());
        let limit = number(&args, "limit")?.unwrap_or(500).max(1) as usize;
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

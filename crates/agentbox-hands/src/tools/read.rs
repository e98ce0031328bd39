//! `read {path, offset?, limit?}`.

use agentbox_core::Ctx;
use async_trait::async_trait;
use base64::Engine;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::args::Count;
use super::truncate::{MAX_BYTES, MAX_LINES, format_size, head};
use super::{Content, ToolError, ToolResult, Typed};
use crate::{ExecutionEnv, FsCode};

pub(super) struct Read;

fn image_mime(path: &str) -> Option<&'static str> {
    let ext = path.rsplit('.').next()?.to_ascii_lowercase();
    match ext.as_str() {
        "png" => Some("image/png"),
        "jpg" | "jpeg" => Some("image/jpeg"),
        "gif" => Some("image/gif"),
        "webp" => Some("image/webp"),
        _ => None,
    }
}

/// `read`'s arguments.
#[derive(Deserialize, JsonSchema)]
pub(super) struct ReadArgs {
    /// Path to the file to read (relative or absolute)
    path: String,
    /// Line number to start reading from (1-indexed)
    offset: Option<Count>,
    /// Maximum number of lines to read
    limit: Option<Count>,
}

#[async_trait]
impl Typed for Read {
    type Args = ReadArgs;
    const NAME: &'static str = "read";
    const DESCRIPTION: &'static str = "Read the contents of a file. Supports text files and images (jpg, png, gif, webp). Images are sent as attachments. For text files, output is truncated to 2000 lines or 50KB (whichever is hit first). Use offset/limit for large files.";
    const READ_ONLY: bool = true;

    async fn call(&self, env: &dyn ExecutionEnv, args: ReadArgs, ctx: &Ctx) -> Result<ToolResult, ToolError> {
        let ReadArgs { path, offset, limit } = args;
        let (offset, limit) = (offset.map(|c| c.0), limit.map(|c| c.0));
        let not_found = |e: crate::FsError| {
            if e.code == FsCode::NotFound {
                ToolError(format!("File not found: {path}"))
            } else {
                ToolError(e.message)
            }
        };
        if let Some(mime) = image_mime(&path) {
            let bytes = env.read_binary_file(&path, ctx).await.map_err(not_found)?;
            let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
            return Ok(ToolResult {
                content: vec![
                    Content::Text {
                        text: format!("Read image file [{mime}]"),
                    },
                    Content::Image {
                        data,
                        mime_type: mime.into(),
                    },
                ],
                details: Value::Null,
                is_error: false,
            });
        }
        let text = env.read_text_file(&path, ctx).await.map_err(not_found)?;
        let lines: Vec<&str> = text.split('\n').collect();
        let total = lines.len();
        let start = offset.map(|o| o.saturating_sub(1) as usize).unwrap_or(0);
        if start >= total {
            return Err(ToolError(format!(
                "Offset {} is beyond end of file ({total} lines total)",
                offset.unwrap_or(0)
            )));
        }
        let end = match limit {
            Some(l) => (start + l as usize).min(total),
            None => total,
        };
        let selected = lines[start..end].join("\n");
        let t = head(&selected, MAX_LINES, MAX_BYTES);
        let shown_from = start + 1;
        let output = if t.first_line_exceeds_limit {
            let size = format_size(lines[start].len());
            format!(
                "[Line {shown_from} is {size}, exceeds {} limit. Use bash: sed -n '{shown_from}p' {path} | head -c {MAX_BYTES}]",
                format_size(MAX_BYTES)
            )
        } else if t.truncated {
            let last = shown_from + t.output_lines - 1;
            let next = last + 1;
            let why = if t.truncated_by == Some("bytes") {
                format!(" ({} limit)", format_size(MAX_BYTES))
            } else {
                String::new()
            };
            format!(
                "{}\n\n[Showing lines {shown_from}-{last} of {total}{why}. Use offset={next} to continue.]",
                t.content
            )
        } else if limit.is_some() && end < total {
            format!(
                "{}\n\n[{} more lines in file. Use offset={} to continue.]",
                t.content,
                total - end,
                end + 1
            )
        } else {
            t.content.clone()
        };
        Ok(ToolResult::ok(
            output,
            json!({ "truncation": if t.truncated { serde_json::to_value(&t).unwrap_or(Value::Null) } else { Value::Null } }),
        ))
    }
}

//! `write {path, content}`.

use agentbox_core::Ctx;
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::{ToolError, ToolResult, Typed};
use crate::ExecutionEnv;

pub(super) struct Write;

/// `write`'s arguments.
#[derive(Deserialize, JsonSchema)]
pub(super) struct WriteArgs {
    /// Path to the file to write (relative or absolute)
    path: String,
    /// Content to write to the file
    content: String,
}

#[async_trait]
impl Typed for Write {
    type Args = WriteArgs;
    const NAME: &'static str = "write";
    const DESCRIPTION: &'static str = "Write content to a file. Creates the file if it doesn't exist, overwrites if it does. Automatically creates parent directories.";
    const READ_ONLY: bool = false;

    async fn call(&self, env: &dyn ExecutionEnv, args: WriteArgs, ctx: &Ctx) -> Result<ToolResult, ToolError> {
        let WriteArgs { path, content } = args;
        env.write_file(&path, content.as_bytes(), ctx)
            .await
            .map_err(|e| ToolError(e.message))?;
        Ok(ToolResult::ok(
            format!("Successfully wrote {} bytes to {path}", content.len()),
            Value::Null,
        ))
    }
}

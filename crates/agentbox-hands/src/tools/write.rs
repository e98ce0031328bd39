//! `write {path, content}`.

use agentbox_core::Ctx;
use async_trait::async_trait;
use serde_json::{Value, json};

use super::{Tool, ToolError, ToolResult, object, required};
use crate::env::ExecutionEnv;

pub struct Write;

#[async_trait]
impl Tool for Write {
    fn name(&self) -> &'static str {
        "write"
    }
    fn description(&self) -> &'static str {
        "Write content to a file. Creates the file if it doesn't exist, overwrites if it does. Automatically creates parent directories."
    }
    fn schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Path to the file to write (relative or absolute)"},
                "content": {"type": "string", "description": "Content to write to the file"}
            },
            "required": ["path", "content"]
        })
    }
    fn read_only(&self) -> bool {
        false
    }

    async fn run(&self, env: &dyn ExecutionEnv, args: Value, ctx: &Ctx) -> Result<ToolResult, ToolError> {
        object(&args)?;
        let path = required(&args, "path")?;
        let content = required(&args, "content")?;
        env.write_file(&path, content.as_bytes(), ctx)
            .await
            .map_err(|e| ToolError(e.message))?;
        Ok(ToolResult::ok(
            format!("Successfully wrote {} bytes to {path}", content.len()),
            Value::Null,
        ))
    }
}

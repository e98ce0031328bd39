//! The tools a model calls over any [`ExecutionEnv`]: pi's seven (read, bash, edit, write,
//! grep, find, ls) with pi's schemas, defaults, limits and messages, bash also taking
//! `background`; then the four over the processes a box keeps (process_read, process_write,
//! process_kill, process_list). `docs/tools.md` says them all.
//!
//! A tool's failure is an error result carrying the message the model should read, never a
//! crash of the host.
//!
//! ```no_run
//! # async fn f(env: &dyn agentbox_hands::ExecutionEnv) {
//! use agentbox_core::Ctx;
//! let r = agentbox_hands::tools::call("read", env, serde_json::json!({"path": "notes.md"}), &Ctx::background()).await;
//! println!("{}", r.text());
//! # }
//! ```

mod args;
mod bash;
mod edit;
mod find;
pub mod glob;
mod grep;
mod ls;
mod process;
mod read;
pub mod truncate;
mod write;

use agentbox_core::Ctx;
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::ExecutionEnv;

/// One part of a tool's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Content {
    /// Text for the model.
    Text {
        /// The text.
        text: String,
    },
    /// An image for the model.
    Image {
        /// Base64 of the bytes.
        data: String,
        /// `image/png`…
        #[serde(rename = "mimeType")]
        mime_type: String,
    },
}

/// What a tool call gave the model.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolResult {
    /// The parts the model reads.
    pub content: Vec<Content>,
    /// Structured details for the host (a diff, a truncation…).
    #[serde(skip_serializing_if = "Value::is_null")]
    pub details: Value,
    /// The call failed; `content` holds the message.
    pub is_error: bool,
}

impl ToolResult {
    /// A text result.
    pub fn text(&self) -> String {
        self.content
            .iter()
            .filter_map(|c| match c {
                Content::Text { text } => Some(text.as_str()),
                Content::Image { .. } => None,
            })
            .collect::<Vec<_>>()
            .join("")
    }

    fn ok(text: String, details: Value) -> Self {
        ToolResult {
            content: vec![Content::Text { text }],
            details,
            is_error: false,
        }
    }

    fn error(message: String) -> Self {
        ToolResult {
            content: vec![Content::Text { text: message }],
            details: Value::Null,
            is_error: true,
        }
    }
}

/// A tool's failure: the message the model reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolError(pub String);

impl<T: std::fmt::Display> From<T> for ToolError {
    fn from(e: T) -> Self {
        ToolError(e.to_string())
    }
}

/// One tool.
#[async_trait]
pub trait Tool: Send + Sync {
    /// Its name: `read`, `bash`…
    fn name(&self) -> &'static str;
    /// What it does, for the model.
    fn description(&self) -> &'static str;
    /// The JSON schema of its arguments, derived from the struct they parse into.
    fn schema(&self) -> Value;
    /// Whether it only reads (an MCP read-only hint).
    fn read_only(&self) -> bool;
    /// Parse `args` as a call would, without running anything: the refusal a call would give.
    fn check(&self, args: Value) -> Result<(), ToolError>;
    /// Run it.
    async fn run(&self, env: &dyn ExecutionEnv, args: Value, ctx: &Ctx) -> Result<ToolResult, ToolError>;
}

/// A tool written against its typed arguments. [`Tool`] comes with it, so what every tool
/// does first is written once: the schema is derived from `Args`, and a call's arguments are
/// parsed into `Args` (refused with a message naming the argument) before `call` runs.
#[async_trait]
trait Typed: Send + Sync {
    /// The arguments: their schema is what `tools/list` shows.
    type Args: DeserializeOwned + JsonSchema + Send;
    const NAME: &'static str;
    const DESCRIPTION: &'static str;
    const READ_ONLY: bool;
    async fn call(&self, env: &dyn ExecutionEnv, args: Self::Args, ctx: &Ctx) -> Result<ToolResult, ToolError>;
}

#[async_trait]
impl<T: Typed> Tool for T {
    fn name(&self) -> &'static str {
        T::NAME
    }
    fn description(&self) -> &'static str {
        T::DESCRIPTION
    }
    fn schema(&self) -> Value {
        args::schema_of::<T::Args>()
    }
    fn read_only(&self) -> bool {
        T::READ_ONLY
    }
    fn check(&self, args: Value) -> Result<(), ToolError> {
        args::parse::<T::Args>(args).map(drop)
    }
    async fn run(&self, env: &dyn ExecutionEnv, args: Value, ctx: &Ctx) -> Result<ToolResult, ToolError> {
        let args = args::parse::<T::Args>(args)?;
        self.call(env, args, ctx).await
    }
}

/// Every tool: pi's seven in pi's order (bash with `background`), then the process tools.
pub fn all() -> Vec<Box<dyn Tool>> {
    vec![
        Box::new(read::Read),
        Box::new(bash::Bash),
        Box::new(edit::Edit),
        Box::new(write::Write),
        Box::new(grep::Grep),
        Box::new(find::Find),
        Box::new(ls::Ls),
        Box::new(process::ProcessRead),
        Box::new(process::ProcessWrite),
        Box::new(process::ProcessKill),
        Box::new(process::ProcessList),
    ]
}

/// pi's seven tools alone, exactly as pi has them: bash without `background` (nothing could
/// read a background command's output without the process tools).
pub fn seven() -> Vec<Box<dyn Tool>> {
    vec![
        Box::new(read::Read),
        Box::new(bash::PiBash),
        Box::new(edit::Edit),
        Box::new(write::Write),
        Box::new(grep::Grep),
        Box::new(find::Find),
        Box::new(ls::Ls),
    ]
}

/// The tool called `name`, of [`all`].
pub fn by_name(name: &str) -> Option<Box<dyn Tool>> {
    all().into_iter().find(|t| t.name() == name)
}

/// Run the tool `name` of [`all`] with `args`; every failure is an error result with its
/// message.
pub async fn call(name: &str, env: &dyn ExecutionEnv, args: Value, ctx: &Ctx) -> ToolResult {
    let Some(tool) = by_name(name) else {
        return ToolResult::error(format!("Unknown tool: {name}"));
    };
    run(&*tool, env, args, ctx).await
}

/// Run `tool` with `args` (a tool of [`all`] or of [`seven`]); every failure is an error result
/// with its message.
pub async fn run(tool: &dyn Tool, env: &dyn ExecutionEnv, args: Value, ctx: &Ctx) -> ToolResult {
    match tool.run(env, args, ctx).await {
        Ok(r) => r,
        Err(ToolError(m)) => ToolResult::error(m),
    }
}

/// Run `argv` in the environment and keep its stdout (at most 16 MiB) and its stderr.
async fn capture(env: &dyn ExecutionEnv, argv: Vec<String>, ctx: &Ctx) -> Result<(Vec<u8>, String), ToolError> {
    use std::sync::{Arc, Mutex};
    let out = Arc::new(Mutex::new(Vec::<u8>::new()));
    let err = Arc::new(Mutex::new(String::new()));
    let (o, e) = (out.clone(), err.clone());
    let opts = crate::ExecOptions {
        on_output: Some(Arc::new(move |t: &str, s| {
            match s {
                crate::Stream::Stdout => {
                    let mut o = o.lock().unwrap();
                    if o.len() < 16 << 20 {
                        o.extend_from_slice(t.as_bytes());
                    }
                }
                crate::Stream::Stderr => e.lock().unwrap().push_str(t),
            }
            Ok(())
        })),
        ..Default::default()
    };
    env.exec(crate::Command::Argv(argv), opts, ctx)
        .await
        .map_err(|e| ToolError(e.message))?;
    let stdout = out.lock().unwrap().clone();
    let stderr = err.lock().unwrap().clone();
    Ok((stdout, stderr))
}

/// `lines` cut to 50 KB, with `notices` (and the byte limit's, when it cut) after a blank line.
fn with_notices(lines: &[String], mut notices: Vec<String>) -> String {
    let t = truncate::head(&lines.join("\n"), usize::MAX, truncate::MAX_BYTES);
    let mut output = t.content;
    if t.truncated {
        notices.push(format!("{} limit reached", truncate::format_size(truncate::MAX_BYTES)));
    }
    if !notices.is_empty() {
        output.push_str(&format!("\n\n[{}]", notices.join(". ")));
    }
    output
}

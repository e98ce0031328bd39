//! `edit {path, edits: [{oldText, newText}]}`, also the older top-level `oldText`/`newText`,
//! and `edits` sent as a JSON string.

use agentbox_core::Ctx;
use async_trait::async_trait;
use serde_json::{Value, json};
use unicode_normalization::UnicodeNormalization;

use super::{Tool, ToolError, ToolResult, object, required, string};
use crate::env::{ExecutionEnv, FsCode};

pub struct Edit;

/// The space a fuzzy match is made in: NFKC, no trailing whitespace on a line, smart quotes
/// as ASCII, unicode dashes as `-`, special spaces as a space.
pub fn fuzzy(text: &str) -> String {
    let nfkc: String = text.nfkc().collect();
    let trimmed: Vec<&str> = nfkc.split('\n').map(|l| l.trim_end()).collect();
    trimmed
        .join("\n")
        .chars()
        .map(|c| match c {
            '\u{2018}' | '\u{2019}' | '\u{201A}' | '\u{201B}' => '\'',
            '\u{201C}' | '\u{201D}' | '\u{201E}' | '\u{201F}' => '"',
            '\u{2010}' | '\u{2011}' | '\u{2012}' | '\u{2013}' | '\u{2014}' | '\u{2015}' | '\u{2212}' => '-',
            '\u{00A0}' | '\u{2000}'..='\u{200A}' | '\u{202F}' | '\u{205F}' | '\u{3000}' => ' ',
            c => c,
        })
        .collect()
}

struct OneEdit {
    old: String,
    new: String,
}

fn parse_edits(args: &Value) -> Result<Vec<OneEdit>, ToolError> {
    let list = match args.get("edits") {
        Some(Value::String(s)) => serde_json::from_str::<Value>(s)
            .map_err(|e| ToolError(format!("Invalid arguments: edits is not valid JSON: {e}")))?,
        Some(v @ Value::Array(_)) => v.clone(),
        Some(Value::Null) | None => Value::Null,
        Some(_) => return Err(ToolError("Invalid arguments: edits must be an array".into())),
    };
    let mut out = Vec::new();
    if let Value::Array(items) = list {
        for (i, e) in items.iter().enumerate() {
            let get = |k: &str| {
                e.get(k)
                    .and_then(Value::as_str)
                    .map(String::from)
                    .ok_or_else(|| ToolError(format!("Invalid arguments: edits[{i}].{k} must be a string")))
            };
            out.push(OneEdit {
                old: get("oldText")?,
                new: get("newText")?,
            });
        }
    }
    if let (Some(old), Some(new)) = (string(args, "oldText")?, string(args, "newText")?) {
        out.push(OneEdit { old, new });
    }
    if out.is_empty() {
        return Err(ToolError(
            "Invalid arguments: edits is required (a list of {oldText, newText})".into(),
        ));
    }
    Ok(out)
}

fn occurrences(hay: &str, needle: &str) -> Vec<usize> {
    hay.match_indices(needle).map(|(i, _)| i).collect()
}

#[async_trait]
impl Tool for Edit {
    fn name(&self) -> &'static str {
        "edit"
    }
    fn description(&self) -> &'static str {
        "Edit a file by replacing exact text. Each edits[i].oldText must match a unique, non-overlapping region of the original file; all edits are applied together."
    }
    fn schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Path to the file to edit (relative or absolute)"},
                "edits": {
                    "type": "array",
                    "description": "Replacements, each matched against the original file",
                    "items": {
                        "type": "object",
                        "properties": {
                            "oldText": {"type": "string", "description": "Exact text to find and replace (must be unique)"},
                            "newText": {"type": "string", "description": "New text to replace it with"}
                        },
                        "required": ["oldText", "newText"]
                    }
                }
            },
            "required": ["path", "edits"]
        })
    }
    fn read_only(&self) -> bool {
        false
    }

    async fn run(&self, env: &dyn ExecutionEnv, args: Value, ctx: &Ctx) -> Result<ToolResult, ToolError> {
        object(&args)?;
        let path = required(&args, "path")?;
        let edits = parse_edits(&args)?;
        let raw = env.read_text_file(&path, ctx).await.map_err(|e| {
            if e.code == FsCode::NotFound {
                ToolError(format!("File not found: {path}"))
            } else {
                ToolError(e.message)
            }
        })?;
        let (bom, body) = match raw.strip_prefix('\u{feff}') {
            Some(rest) => (true, rest),
            None => (false, raw.as_str()),
        };
        let crlf = body
            .find('\n')
            .is_some_and(|i| i > 0 && body.as_bytes()[i - 1] == b'\r');
        let original = body.replace("\r\n", "\n");
        let edits: Vec<OneEdit> = edits
            .into_iter()
            .map(|e| OneEdit {
                old: e.old.replace("\r\n", "\n"),
                new: e.new.replace("\r\n", "\n"),
            })
            .collect();
        if edits.iter().any(|e| e.old.is_empty()) {
            return Err(ToolError(format!("oldText must not be empty in {path}.")));
        }
        // Exact first; when any edit needs it, every edit is matched in the fuzzy space.
        let exact = edits.iter().all(|e| original.contains(&e.old));
        let base = if exact { original.clone() } else { fuzzy(&original) };
        let mut spans = Vec::new();
        for (i, e) in edits.iter().enumerate() {
            let needle = if exact { e.old.clone() } else { fuzzy(&e.old) };
            let at = occurrences(&base, &needle);
            match at.len() {
                0 => {
                    return Err(ToolError(format!(
                        "Could not find edits[{i}] in {path}. The oldText must match exactly including all whitespace and newlines."
                    )));
                }
                1 => spans.push((at[0], needle.len(), i)),
                n => {
                    return Err(ToolError(format!(
                        "Found {n} occurrences of edits[{i}] in {path}. Each oldText must be unique. Please provide more context to make it unique."
                    )));
                }
            }
        }
        spans.sort();
        for w in spans.windows(2) {
            let (a, b) = (w[0], w[1]);
            if a.0 + a.1 > b.0 {
                let (i, j) = (a.2.min(b.2), a.2.max(b.2));
                return Err(ToolError(format!(
                    "edits[{i}] and edits[{j}] overlap in {path}. Merge them into one edit or target disjoint regions."
                )));
            }
        }
        let mut result = base.clone();
        for &(start, len, i) in spans.iter().rev() {
            result.replace_range(start..start + len, &edits[i].new);
        }
        if result == base {
            return Err(ToolError(format!(
                "No changes made to {path}. The replacement produced identical content."
            )));
        }
        let mut written = if crlf {
            result.replace('\n', "\r\n")
        } else {
            result.clone()
        };
        if bom {
            written.insert(0, '\u{feff}');
        }
        env.write_file(&path, written.as_bytes(), ctx)
            .await
            .map_err(|e| ToolError(e.message))?;
        let diff = similar::TextDiff::from_lines(&original, &result);
        let first_changed_line = diff
            .ops()
            .iter()
            .find(|op| !matches!(op, similar::DiffOp::Equal { .. }))
            .map(|op| op.new_range().start + 1);
        let unified = diff.unified_diff().context_radius(4).header(&path, &path).to_string();
        Ok(ToolResult::ok(
            format!("Successfully replaced {} block(s) in {path}.", spans.len()),
            json!({ "diff": unified, "firstChangedLine": first_changed_line }),
        ))
    }
}

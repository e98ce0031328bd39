//! `edit {path, edits: [{oldText, newText}]}`, also the older top-level `oldText`/`newText`,
//! and `edits` sent as a JSON string.

use agentbox_core::Ctx;
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use unicode_normalization::UnicodeNormalization;

use super::{ToolError, ToolResult, Typed};
use crate::{ExecutionEnv, FsCode};

pub(super) struct Edit;

/// The space a fuzzy match is made in: NFKC, no trailing whitespace on a line, smart quotes
/// as ASCII, unicode dashes as `-`, special spaces as a space.
pub(super) fn fuzzy(text: &str) -> String {
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

/// `edit`'s arguments: the path and the edits, from either form.
#[derive(Deserialize)]
#[serde(try_from = "SentEditArgs")]
pub(super) struct EditArgs {
    path: String,
    edits: Vec<OneEdit>,
}

/// The schema is that of the arguments as sent.
impl JsonSchema for EditArgs {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        SentEditArgs::schema_name()
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        SentEditArgs::json_schema(generator)
    }
}

/// `edit`'s arguments as sent.
#[derive(Deserialize, JsonSchema)]
struct SentEditArgs {
    /// Path to the file to edit (relative or absolute)
    path: String,
    /// Replacements, each matched against the original file
    #[schemars(required)]
    edits: Option<Edits>,
    /// The older form of one edit, at the top level (not in the schema).
    #[serde(rename = "oldText")]
    #[schemars(skip)]
    old_text: Option<String>,
    #[serde(rename = "newText")]
    #[schemars(skip)]
    new_text: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
struct EditItem {
    /// Exact text to find and replace (must be unique)
    #[serde(rename = "oldText")]
    old_text: String,
    /// New text to replace it with
    #[serde(rename = "newText")]
    new_text: String,
}

/// The list of edits, also when a model sent it as a JSON string of the list.
struct Edits(Vec<EditItem>);

impl<'de> Deserialize<'de> for Edits {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Sent {
            List(Vec<Value>),
            Text(String),
            Other(serde::de::IgnoredAny),
        }
        use serde::de::Error;
        let items = match Sent::deserialize(d)? {
            Sent::List(items) => items,
            Sent::Text(s) => match serde_json::from_str::<Value>(&s)
                .map_err(|e| D::Error::custom(format!("is not valid JSON: {e}")))?
            {
                Value::Array(items) => items,
                _ => return Err(D::Error::custom("must be an array")),
            },
            Sent::Other(_) => return Err(D::Error::custom("must be an array")),
        };
        let mut out = Vec::new();
        for (i, item) in items.into_iter().enumerate() {
            let one = serde_path_to_error::deserialize::<_, EditItem>(item).map_err(|e| {
                let field = e.path().to_string();
                let inner = e.into_inner().to_string();
                let field = inner
                    .strip_prefix("missing field `")
                    .and_then(|s| s.strip_suffix('`'))
                    .unwrap_or(&field);
                D::Error::custom(format!("[{i}].{field} must be a string"))
            })?;
            out.push(one);
        }
        Ok(Edits(out))
    }
}

impl JsonSchema for Edits {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Edits".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // At least one: a call with none changes nothing, and is refused.
        schemars::json_schema!({"type": "array", "items": generator.subschema_for::<EditItem>(), "minItems": 1})
    }
}

impl TryFrom<SentEditArgs> for EditArgs {
    type Error = String;
    fn try_from(args: SentEditArgs) -> Result<Self, String> {
        let path = args.path.clone();
        Ok(EditArgs {
            path,
            edits: edits_of(args)?,
        })
    }
}

fn edits_of(args: SentEditArgs) -> Result<Vec<OneEdit>, String> {
    let mut out: Vec<OneEdit> = args
        .edits
        .map(|Edits(list)| {
            list.into_iter()
                .map(|e| OneEdit {
                    old: e.old_text,
                    new: e.new_text,
                })
                .collect()
        })
        .unwrap_or_default();
    if let (Some(old), Some(new)) = (args.old_text, args.new_text) {
        out.push(OneEdit { old, new });
    }
    if out.is_empty() {
        return Err("edits is required (a list of {oldText, newText})".into());
    }
    Ok(out)
}

fn occurrences(hay: &str, needle: &str) -> Vec<usize> {
    hay.match_indices(needle).map(|(i, _)| i).collect()
}

#[async_trait]
impl Typed for Edit {
    type Args = EditArgs;
    const NAME: &'static str = "edit";
    const DESCRIPTION: &'static str = "Edit a file by replacing exact text. Each edits[i].oldText must match a unique, non-overlapping region of the original file; all edits are applied together.";
    const READ_ONLY: bool = false;

    async fn call(&self, env: &dyn ExecutionEnv, args: EditArgs, ctx: &Ctx) -> Result<ToolResult, ToolError> {
        let EditArgs { path, edits } = args;
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

//! A tool's arguments as a typed struct: its JSON schema derived from the struct (schemars),
//! its parse done by serde, and one place that words a refusal the way a model reads it
//! (`Invalid arguments: limit must be a non-negative whole number`).
//!
//! The schema is what `tools/list` hands a model, so it says what pi's tools say and no more:
//! plain `number` for counts and seconds, optional arguments left out of `required`, no
//! `null` in any type. The parse is a little kinder than the schema in three ways a model
//! trips over and pi forgives: `null` for an optional argument counts as absent, and `edit`
//! takes `edits` sent as a JSON string and the older top-level `oldText`/`newText`.

use std::borrow::Cow;

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::ToolError;

/// The JSON schema of `T` as a tool lists it: every subschema inline, no `$schema`, no
/// title, no `null` for an optional field, no `format`.
pub(super) fn schema_of<T: JsonSchema>() -> Value {
    let generator = SchemaSettings::draft2020_12()
        .with(|s| {
            s.meta_schema = None;
            s.inline_subschemas = true;
        })
        .into_generator();
    let mut schema = generator.into_root_schema_for::<T>().to_value();
    if let Value::Object(root) = &mut schema {
        // The struct's own name and doc comment are ours, not the model's.
        root.remove("title");
        root.remove("description");
        // A tool with no arguments still says it takes an object of none (some clients
        // refuse a tool whose schema has no properties).
        root.entry("properties")
            .or_insert_with(|| Value::Object(Default::default()));
    }
    plain(&mut schema);
    schema
}

/// schemars writes an `Option<T>` as `T` or `null` (and adds `null` to an enum's values) and
/// adds a `format` (`uint64`, `double`) to numbers; pi's schemas say `T` alone, an optional
/// argument being one left out of `required`.
fn plain(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if m.get("format").is_some_and(Value::is_string) {
                m.remove("format");
            }
            if let Some(Value::Array(values)) = m.get_mut("enum") {
                values.retain(|v| !v.is_null());
            }
            if let Some(Value::Array(types)) = m.get("type") {
                let rest: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
                if let [one] = rest.as_slice() {
                    m.insert("type".into(), one.clone());
                }
            }
            m.values_mut().for_each(plain);
        }
        Value::Array(a) => a.iter_mut().for_each(plain),
        _ => {}
    }
}

/// Parse a call's arguments into `T`; a refusal names the argument and why.
pub(super) fn parse<T: DeserializeOwned>(args: Value) -> Result<T, ToolError> {
    let Value::Object(mut map) = args else {
        return Err(ToolError("Invalid arguments: expected an object".into()));
    };
    // A model that sends `null` for an optional argument means "not given".
    map.retain(|_, v| !v.is_null());
    serde_path_to_error::deserialize(Value::Object(map)).map_err(|e| {
        let path = e.path().to_string();
        ToolError(format!(
            "Invalid arguments: {}",
            explain(&path, &e.into_inner().to_string())
        ))
    })
}

/// serde's wording as a sentence about the argument: `path is required`, `path must be a
/// string`, `limit must be a non-negative whole number`.
fn explain(path: &str, serde: &str) -> String {
    let path = if path == "." { "" } else { path };
    let join = |name: &str| match (path, name) {
        ("", n) => n.to_string(),
        (p, "") => p.to_string(),
        (p, n) => format!("{p}.{n}"),
    };
    if let Some(field) = serde.strip_prefix("missing field `").and_then(|s| s.strip_suffix('`')) {
        return format!("{} is required", join(field));
    }
    if serde.starts_with("invalid type:")
        && let Some((_, expected)) = serde.rsplit_once(", expected ")
    {
        let expected = match expected {
            "a sequence" => "an array",
            "a boolean" | "a string" => expected,
            other if other.starts_with("struct ") => "an object",
            other => other,
        };
        return format!("{} must be {expected}", join(""));
    }
    if path.is_empty() {
        // A refusal of the whole call, already a sentence.
        return serde.to_string();
    }
    if serde.starts_with('[') {
        // An item of a list: `edits[0].oldText must be a string`.
        return format!("{}{serde}", join(""));
    }
    format!("{} {serde}", join(""))
}

/// A count (`offset`, `limit`, `context`): any JSON number that is whole and not negative,
/// `3.0` included, as pi's `number` arguments are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Count(pub u64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d)?
            .as_f64()
            .filter(|n| n.is_finite() && *n >= 0.0 && n.fract() == 0.0)
            .map(|n| Count(n as u64))
            .ok_or_else(|| D::Error::custom("must be a non-negative whole number"))
    }
}

impl JsonSchema for Count {
    fn schema_name() -> Cow<'static, str> {
        "Count".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "number"})
    }
}

/// A time in seconds: a positive, finite JSON number (`0.5` included).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Seconds(pub f64);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d)?
            .as_f64()
            .filter(|t| t.is_finite() && *t > 0.0)
            .map(Seconds)
            .ok_or_else(|| D::Error::custom("must be a positive number of seconds"))
    }
}

impl JsonSchema for Seconds {
    fn schema_name() -> Cow<'static, str> {
        "Seconds".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "number"})
    }
}

/// A wait in seconds: a finite JSON number, 0 (do not wait) or more, at most `MAX_READ_WAIT`
/// (the longest a box waits for output in one read).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Wait(pub std::time::Duration);

impl<'de> Deserialize<'de> for Wait {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let max = agentbox_core::MAX_READ_WAIT;
        let refuse = || D::Error::custom(format!("must be a number of seconds from 0 to {}", max.as_secs()));
        let t = Value::deserialize(d)?
            .as_f64()
            .filter(|t| t.is_finite() && *t >= 0.0)
            .ok_or_else(refuse)?;
        std::time::Duration::try_from_secs_f64(t)
            .ok()
            .filter(|w| *w <= max)
            .map(Wait)
            .ok_or_else(refuse)
    }
}

impl JsonSchema for Wait {
    fn schema_name() -> Cow<'static, str> {
        "Wait".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "number"})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, JsonSchema, Debug)]
    #[allow(dead_code)]
    struct Args {
        /// A name
        name: String,
        /// How many
        limit: Option<Count>,
        flag: Option<bool>,
    }

    fn refused(v: Value) -> String {
        parse::<Args>(v).unwrap_err().0
    }

    #[test]
    fn refusals_name_the_argument_and_why() {
        use serde_json::json;
        assert_eq!(refused(json!([])), "Invalid arguments: expected an object");
        assert_eq!(refused(json!({})), "Invalid arguments: name is required");
        assert_eq!(refused(json!({"name": null})), "Invalid arguments: name is required");
        assert_eq!(refused(json!({"name": 3})), "Invalid arguments: name must be a string");
        assert_eq!(
            refused(json!({"name": "a", "limit": -1})),
            "Invalid arguments: limit must be a non-negative whole number"
        );
        assert_eq!(
            refused(json!({"name": "a", "limit": 1.5})),
            "Invalid arguments: limit must be a non-negative whole number"
        );
        assert_eq!(
            refused(json!({"name": "a", "flag": "yes"})),
            "Invalid arguments: flag must be a boolean"
        );
        let ok = parse::<Args>(json!({"name": "a", "limit": 3.0, "flag": null, "other": 1})).unwrap();
        assert_eq!((ok.limit, ok.flag), (Some(Count(3)), None));
    }

    #[test]
    fn the_schema_says_number_and_leaves_options_out_of_required() {
        assert_eq!(
            schema_of::<Args>(),
            serde_json::json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "A name"},
                    "limit": {"type": "number", "description": "How many"},
                    "flag": {"type": "boolean"}
                },
                "required": ["name"]
            })
        );
    }
}

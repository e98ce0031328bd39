//! Patches as the real server applies them: JSON merge patch (RFC 7386) and strategic merge
//! patch, which for what a pod lets a patch change (metadata maps, a number in the spec) is
//! the same merge; a strategic patch's directives (`$patch`, `$retainKeys`,
//! `$setElementOrder`...) are refused 400 rather than misread; and JSON patch (RFC 6902).

use serde_json::Value;

use crate::kube::status::ApiError;

/// RFC 7386: objects merge key by key, `null` removes, anything else replaces.
pub(crate) fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Default::default());
            }
            let t = target.as_object_mut().expect("made an object above");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// The first strategic-merge directive in `patch`, if any.
pub(crate) fn directive(patch: &Value) -> Option<String> {
    match patch {
        Value::Object(m) => m.iter().find_map(|(k, v)| {
            if k.starts_with('$') {
                Some(k.clone())
            } else {
                directive(v)
            }
        }),
        Value::Array(a) => a.iter().find_map(directive),
        _ => None,
    }
}

/// RFC 6902 JSON patch over `doc`: add, remove, replace, test, move, copy.
pub(crate) fn json_patch(doc: &Value, ops: &Value) -> Result<Value, ApiError> {
    let bad = |m: String| ApiError::bad_request(format!("the JSON patch could not be applied: {m}"));
    let ops = ops
        .as_array()
        .ok_or_else(|| bad("a JSON patch is a list of operations".into()))?;
    let mut doc = doc.clone();
    for (i, op) in ops.iter().enumerate() {
        let path = op["path"]
            .as_str()
            .ok_or_else(|| bad(format!("operation {i}: no path")))?;
        let kind = op["op"].as_str().unwrap_or("");
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| bad(format!("operation {i}: no value")))
        };
        match kind {
            "add" | "replace" => {
                let v = value()?;
                if kind == "replace" && doc.pointer(path).is_none() {
                    return Err(bad(format!(
                        "replace operation does not apply: doc is missing key: {path}"
                    )));
                }
                put(&mut doc, path, v, kind == "add").map_err(|m| bad(format!("operation {i}: {m}")))?;
            }
            "remove" => {
                take(&mut doc, path)
                    .ok_or_else(|| bad(format!("remove operation does not apply: doc is missing path: {path}")))?;
            }
            "test" => {
                if doc.pointer(path) != Some(&value()?) {
                    return Err(bad(format!("testing value {path} failed")));
                }
            }
            "move" | "copy" => {
                let from = op["from"]
                    .as_str()
                    .ok_or_else(|| bad(format!("operation {i}: no from")))?;
                let v = if kind == "move" {
                    take(&mut doc, from)
                } else {
                    doc.pointer(from).cloned()
                }
                .ok_or_else(|| bad(format!("operation {i}: missing from {from}")))?;
                put(&mut doc, path, v, true).map_err(|m| bad(format!("operation {i}: {m}")))?;
            }
            other => return Err(bad(format!("operation {i}: unexpected op {other:?}"))),
        }
    }
    Ok(doc)
}

pub(super) fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

pub(super) fn split_pointer(path: &str) -> Option<(String, String)> {
    let (parent, last) = path.rsplit_once('/')?;
    Some((parent.to_string(), unescape(last)))
}

pub(super) fn put(doc: &mut Value, path: &str, v: Value, insert: bool) -> Result<(), String> {
    if path.is_empty() {
        *doc = v;
        return Ok(());
    }
    let (parent, last) = split_pointer(path).ok_or("a path starts with /")?;
    let p = doc
        .pointer_mut(&parent)
        .ok_or_else(|| format!("missing parent {parent}"))?;
    match p {
        Value::Object(m) => {
            m.insert(last, v);
            Ok(())
        }
        Value::Array(a) => {
            let i = if last == "-" {
                a.len()
            } else {
                last.parse::<usize>().map_err(|_| format!("bad index {last}"))?
            };
            if insert && i <= a.len() {
                a.insert(i, v);
                Ok(())
            } else if !insert && i < a.len() {
                a[i] = v;
                Ok(())
            } else {
                Err(format!("index {i} out of range"))
            }
        }
        _ => Err(format!("{parent} is not an object or a list")),
    }
}

pub(super) fn take(doc: &mut Value, path: &str) -> Option<Value> {
    let (parent, last) = split_pointer(path)?;
    match doc.pointer_mut(&parent)? {
        Value::Object(m) => m.remove(&last),
        Value::Array(a) => {
            let i = last.parse::<usize>().ok().filter(|i| *i < a.len())?;
            Some(a.remove(i))
        }
        _ => None,
    }
}

/// `p` applied to `old` as its content type says (a merge patch, a strategic merge patch
/// without directives, applied as a merge patch, or a JSON patch), what the server keeps of
/// an object kept: its kind, name, namespace, uid and resourceVersion.
pub(crate) fn patched(old: &Value, ct: &str, p: &Value) -> Result<Value, ApiError> {
    let mut new = match ct {
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            if ct == "application/strategic-merge-patch+json"
                && let Some(d) = directive(p)
            {
                return Err(ApiError::bad_request(format!(
                    "the agentbox fake applies strategic merge patches without directives: {d} is not supported"
                )));
            }
            let mut n = old.clone();
            merge(&mut n, p);
            n
        }
        "application/json-patch+json" => json_patch(old, p)?,
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    if !new.is_object() || !new["metadata"].is_object() {
        return Err(ApiError::bad_request(
            "the patched object is not an object with metadata",
        ));
    }
    new["kind"] = old["kind"].clone();
    new["apiVersion"] = old["apiVersion"].clone();
    new["metadata"]["name"] = old["metadata"]["name"].clone();
    new["metadata"]["namespace"] = old["metadata"]["namespace"].clone();
    new["metadata"]["uid"] = old["metadata"]["uid"].clone();
    new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
    Ok(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_merge_patch_merges_replaces_and_removes() {
        let mut t = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": [1]}});
        merge(
            &mut t,
            &json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": {"x": [2]}}),
        );
        assert_eq!(
            t,
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": {"x": [2]}})
        );
        assert_eq!(
            directive(&json!({"spec": {"containers": [{"$patch": "delete"}]}})).as_deref(),
            Some("$patch")
        );
    }
}

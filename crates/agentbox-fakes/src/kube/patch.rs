//! Patches as the real server applies them: JSON merge patch (RFC 7386) and strategic merge
//! patch, which for what a pod lets a patch change (metadata maps, a number in the spec) is
//! the same merge; a strategic patch's directives (`$patch`, `$retainKeys`,
//! `$setElementOrder`...) are refused 400 rather than misread.

use serde_json::Value;

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

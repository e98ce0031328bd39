//! Label and field selectors as `labelSelector=` and `fieldSelector=` carry them, parsed the
//! way apimachinery's `labels.Parse` and `fields.ParseSelector` read them, and LabelSelector
//! objects (`matchLabels`, `matchExpressions`) as a NetworkPolicy's `podSelector` holds one.

use std::collections::BTreeMap;

use serde_json::Value;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// Every requirement must hold; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct LabelSelector(pub(crate) Vec<Req>);

/// The labels of an object, from its `metadata.labels`.
pub(crate) fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

impl LabelSelector {
    /// Parse `k=v,k2!=v,k3 in (a,b),!k4,k5`; an error says what is wrong, as a 400's message.
    pub(crate) fn parse(s: &str) -> Result<LabelSelector, String> {
        let mut reqs = Vec::new();
        for part in split_top(s)? {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            reqs.push(parse_req(part)?);
        }
        Ok(LabelSelector(reqs))
    }

    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => labels.get(k) == Some(v),
            Req::NotEq(k, v) => labels.get(k) != Some(v),
            Req::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Req::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Req::Exists(k) => labels.contains_key(k),
            Req::NotExists(k) => !labels.contains_key(k),
        })
    }

    /// A metav1.LabelSelector object; `None` (absent) selects nothing, `{}` everything, as a
    /// NetworkPolicy's podSelector reads.
    pub(crate) fn from_object(v: &Value) -> Result<LabelSelector, String> {
        let mut reqs = Vec::new();
        if let Some(m) = v.get("matchLabels") {
            let m = m.as_object().ok_or("matchLabels: not an object")?;
            for (k, val) in m {
                let val = val.as_str().ok_or_else(|| format!("matchLabels[{k}]: not a string"))?;
                reqs.push(Req::Eq(k.clone(), val.to_string()));
            }
        }
        if let Some(e) = v.get("matchExpressions") {
            let e = e.as_array().ok_or("matchExpressions: not a list")?;
            for (i, x) in e.iter().enumerate() {
                let key = x
                    .get("key")
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("matchExpressions[{i}].key: required"))?
                    .to_string();
                let values: Vec<String> = x
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
                    .unwrap_or_default();
                let op = x.get("operator").and_then(Value::as_str).unwrap_or("");
                reqs.push(match op {
                    "In" if !values.is_empty() => Req::In(key, values),
                    "NotIn" if !values.is_empty() => Req::NotIn(key, values),
                    "Exists" if values.is_empty() => Req::Exists(key),
                    "DoesNotExist" if values.is_empty() => Req::NotExists(key),
                    "In" | "NotIn" => return Err(format!("matchExpressions[{i}].values: must be specified when `operator` is 'In' or 'NotIn'")),
                    "Exists" | "DoesNotExist" => return Err(format!("matchExpressions[{i}].values: may not be specified when `operator` is 'Exists' or 'DoesNotExist'")),
                    other => return Err(format!("matchExpressions[{i}].operator: not a valid selector operator: {other:?}")),
                });
            }
        }
        Ok(LabelSelector(reqs))
    }
}

/// Split on commas outside parentheses.
fn split_top(s: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(format!("unable to parse requirement: unexpected ')' in {s:?}"));
                }
            }
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("unable to parse requirement: unclosed '(' in {s:?}"));
    }
    out.push(&s[start..]);
    Ok(out)
}

fn parse_req(part: &str) -> Result<Req, String> {
    if let Some(k) = part.strip_prefix('!') {
        let k = k.trim();
        check_key(k)?;
        return Ok(Req::NotExists(k.to_string()));
    }
    for (op, make) in [
        ("!=", Req::NotEq as fn(String, String) -> Req),
        ("==", Req::Eq),
        ("=", Req::Eq),
    ] {
        if let Some((k, v)) = part.split_once(op) {
            let (k, v) = (k.trim(), v.trim());
            check_key(k)?;
            check_value(v)?;
            return Ok(make(k.to_string(), v.to_string()));
        }
    }
    let words: Vec<&str> = part.splitn(2, char::is_whitespace).collect();
    if words.len() == 2 {
        let k = words[0];
        let rest = words[1].trim();
        let (op, list) = if let Some(r) = rest.strip_prefix("notin") {
            ("notin", r)
        } else if let Some(r) = rest.strip_prefix("in") {
            ("in", r)
        } else {
            return Err(format!(
                "unable to parse requirement: found '{rest}', expected: in, notin, =, ==, !="
            ));
        };
        let list = list.trim();
        let inner = list
            .strip_prefix('(')
            .and_then(|l| l.strip_suffix(')'))
            .ok_or_else(|| format!("unable to parse requirement: found '{list}', expected: '('"))?;
        check_key(k)?;
        let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
        for v in &values {
            check_value(v)?;
        }
        return Ok(if op == "in" {
            Req::In(k.to_string(), values)
        } else {
            Req::NotIn(k.to_string(), values)
        });
    }
    check_key(part)?;
    Ok(Req::Exists(part.to_string()))
}

fn check_key(k: &str) -> Result<(), String> {
    crate::kube::validate::label_key(k)
        .map_err(|why| format!("unable to parse requirement: invalid label key {k:?}: {why}"))
}

fn check_value(v: &str) -> Result<(), String> {
    crate::kube::validate::label_value(v)
        .map_err(|why| format!("unable to parse requirement: invalid label value: {v:?}: at key: {why}"))
}

/// A field selector: `metadata.name=x`, `status.phase!=Running`, over the fields the real
/// server indexes for pods that this fake answers (`metadata.name`, `metadata.namespace`,
/// `status.phase`, `spec.nodeName`, `spec.restartPolicy`).
#[derive(Debug, Clone, Default)]
pub(crate) struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// `supported` is what this resource may be selected by; any other field is the real
    /// server's 400 `field label not supported`.
    pub(crate) fn parse(s: &str, supported: &[&str]) -> Result<FieldSelector, String> {
        let mut out = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(format!("invalid selector: '{s}'; can't understand '{part}'"));
            };
            let k = k.trim();
            if !supported.contains(&k) {
                return Err(format!("field label not supported: {k}"));
            }
            out.push((k.to_string(), eq, v.trim().to_string()));
        }
        Ok(FieldSelector(out))
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(k, eq, v)| {
            let pointer = format!("/{}", k.replace('.', "/"));
            let got = obj.pointer(&pointer).and_then(Value::as_str).unwrap_or("");
            (got == v) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn every_operator_selects_as_apimachinery_does() {
        let s = LabelSelector::parse("a=1,b==2,c!=3,d in (x, y),e notin (z),f,!g").unwrap();
        let ok = l(&[("a", "1"), ("b", "2"), ("d", "y"), ("f", "")]);
        assert!(s.matches(&ok));
        for bad in [
            l(&[("a", "1"), ("b", "2"), ("c", "3"), ("d", "y"), ("f", "")]),
            l(&[("a", "1"), ("b", "2"), ("d", "q"), ("f", "")]),
            l(&[("a", "1"), ("b", "2"), ("d", "y"), ("e", "z"), ("f", "")]),
            l(&[("a", "1"), ("b", "2"), ("d", "y")]),
            l(&[("a", "1"), ("b", "2"), ("d", "y"), ("f", ""), ("g", "")]),
        ] {
            assert!(!s.matches(&bad), "{bad:?}");
        }
        assert!(LabelSelector::parse("a in (x").is_err());
        assert!(LabelSelector::parse("bad key!=1").is_err());
    }
}

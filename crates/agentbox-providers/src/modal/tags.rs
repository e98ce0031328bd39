//! What a Modal box keeps in its sandbox's tags: the provider's mark, the host's labels, and
//! what attach and list need to give the box's facts back (the spec's isolation, size,
//! network, ports and workspace; the hardware the create measured).
//!
//! Tags are set through Modal's API, so nothing inside the box can write them. Modal takes a
//! tag's key and value as at most 63 of `[A-Za-z0-9._-]` (the rule the `modal` client checks of
//! an app's tags, kept here for a sandbox's too):
//! the host's labels must fit as they are (a label that does not is refused `invalid`), and
//! the provider's own values are escaped (`_XX` for any other byte) and cut into numbered
//! parts (`key`, `key.1`, …) where long.

use std::collections::BTreeMap;

use agentbox_core::{Error, Labels, Result};

/// The mark on every box this provider made (value `1`).
pub(crate) const MARK: &str = "agentbox";
/// The tags under the provider's own namespace start so.
const OWN: &str = "agentbox.";
/// The longest key or value Modal takes.
pub(crate) const MAX: usize = 63;
/// At most this many parts for one long value.
pub(crate) const MAX_PARTS: usize = 8;

/// Whether `s` is a tag key or value as Modal takes it.
pub(crate) fn fits(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Check the host's labels: each key and value a Modal tag as it is.
pub(crate) fn check_labels(labels: &Labels) -> Result<()> {
    for (k, v) in labels {
        if !fits(k) || !fits(v) {
            return Err(Error::invalid(format!(
                "spec.labels.{k}: Modal keeps labels as sandbox tags, whose keys and values are 1 to {MAX} \
                 letters, digits, '.', '-' or '_'"
            )));
        }
    }
    Ok(())
}

/// The host's labels among `tags` (the provider's own left out).
pub(crate) fn labels_of(tags: &BTreeMap<String, String>) -> Labels {
    tags.iter()
        .filter(|(k, _)| k.as_str() != MARK && !k.starts_with(OWN))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Keep `value` under `key` (one of the provider's own), escaped and cut into parts.
pub(crate) fn put(tags: &mut BTreeMap<String, String>, key: &str, value: &str) -> Result<()> {
    let mut escaped = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b == b'.' || b == b'-' {
            escaped.push(b as char);
        } else {
            escaped.push_str(&format!("_{b:02x}"));
        }
    }
    if escaped.is_empty() {
        tags.insert(key.to_string(), "_".to_string());
        return Ok(());
    }
    // Cut at a part boundary that never splits an escape.
    let mut parts = Vec::new();
    let mut rest = escaped.as_str();
    while !rest.is_empty() {
        let mut end = rest.len().min(MAX);
        while end < rest.len() && rest[..end].rfind('_').is_some_and(|i| i + 3 > end) {
            end -= 1;
        }
        parts.push(&rest[..end]);
        rest = &rest[end..];
    }
    if parts.len() > MAX_PARTS {
        return Err(Error::invalid(format!(
            "{key}: {} bytes is more than Modal's tags can keep for it",
            value.len()
        )));
    }
    for (i, p) in parts.iter().enumerate() {
        let k = if i == 0 { key.to_string() } else { format!("{key}.{i}") };
        tags.insert(k, (*p).to_string());
    }
    Ok(())
}

/// The value [`put`] kept under `key`; `None` when there is none or it is not one [`put`]
/// wrote (a tag changed by hand reads as absent, never as a guess).
pub(crate) fn get(tags: &BTreeMap<String, String>, key: &str) -> Option<String> {
    let first = tags.get(key)?;
    if first == "_" {
        return Some(String::new());
    }
    let mut escaped = first.clone();
    for i in 1..MAX_PARTS {
        match tags.get(&format!("{key}.{i}")) {
            Some(p) => escaped.push_str(p),
            None => break,
        }
    }
    let mut out = Vec::with_capacity(escaped.len());
    let b = escaped.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'_' {
            let hex = escaped.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_come_back_as_they_went_in() {
        let long = "NVIDIA A100-SXM4-80GB + NVIDIA H100 80GB HBM3 + NVIDIA H100 80GB HBM3 + more_and:more/";
        for v in [
            "",
            "vm",
            "/workspace",
            "api.example.com,*.example.com,10.0.0.0/8",
            long,
            "ü ✓",
        ] {
            let mut t = BTreeMap::new();
            put(&mut t, "agentbox.x", v).unwrap();
            assert!(t.iter().all(|(k, v)| fits(k) && fits(v)), "{t:?}");
            assert_eq!(get(&t, "agentbox.x").as_deref(), Some(v), "{t:?}");
        }
        let mut t = BTreeMap::new();
        assert!(
            put(&mut t, "agentbox.x", &"/".repeat(200)).is_err(),
            "too long for 8 parts"
        );
    }

    #[test]
    fn a_tag_changed_by_hand_reads_as_absent() {
        let t = BTreeMap::from([("agentbox.x".to_string(), "ab_zz".to_string())]);
        assert_eq!(get(&t, "agentbox.x"), None);
        let t = BTreeMap::from([("agentbox.x".to_string(), "ab_f".to_string())]);
        assert_eq!(get(&t, "agentbox.x"), None);
    }

    #[test]
    fn labels_must_fit_and_the_providers_own_are_kept_apart() {
        assert!(check_labels(&Labels::from([("team".into(), "a-1".into())])).is_ok());
        let e = check_labels(&Labels::from([("team".into(), "a b".into())])).unwrap_err();
        assert!(e.message().starts_with("spec.labels.team: "), "{e}");
        let tags = BTreeMap::from([
            ("agentbox".to_string(), "1".to_string()),
            ("agentbox.iso".to_string(), "vm".to_string()),
            ("team".to_string(), "a".to_string()),
        ]);
        assert_eq!(labels_of(&tags), Labels::from([("team".into(), "a".into())]));
    }
}

//! The property the transport config's fuzz target checks, shared with the test that runs its
//! corpus in CI (`tests/fuzz_corpus.rs`): whatever the text, neither parser panics, every
//! refusal is `invalid` or `unsupported` and names the transport config, and TOML and JSON
//! say the same (a TOML document and its JSON translation are the same config, or both are
//! refused with the same code).

use agentbox_core::ErrorCode;

use crate::TransportConfig;

/// Past this depth the translation is not compared: JSON's reader refuses nesting TOML
/// allows (serde_json stops at 128), which is a difference of the formats, not of the config.
const MAX_COMPARED_DEPTH: usize = 100;

/// Parse `data` as TOML and as JSON, and compare the TOML with its JSON translation.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let from_toml = TransportConfig::from_toml(text);
    let from_json = TransportConfig::from_json(text);
    for parsed in [&from_toml, &from_json] {
        if let Err(e) = parsed {
            assert!(
                matches!(e.code(), ErrorCode::Invalid | ErrorCode::Unsupported),
                "refused as {:?}: {}",
                e.code(),
                e.message()
            );
            assert!(
                e.message().starts_with("transport config"),
                "a refusal that does not name the config: {}",
                e.message()
            );
        }
    }
    let Ok(doc) = toml::from_str::<toml::Table>(text) else {
        return;
    };
    let value = toml::Value::Table(doc);
    if !translatable(&value, 0) {
        return;
    }
    let json = serde_json::to_string(&value).expect("a TOML document serialises as JSON");
    let translated = TransportConfig::from_json(&json);
    match (&from_toml, &translated) {
        (Ok(t), Ok(j)) => assert_eq!(t, j, "TOML and its JSON ({json}) say different things"),
        (Err(t), Err(j)) => assert_eq!(t.code(), j.code(), "TOML refused with {t}, its JSON ({json}) with {j}"),
        (t, j) => panic!("TOML gives {t:?}, its JSON ({json}) gives {j:?}"),
    }
}

/// Whether JSON can say what `v` says: no datetime (JSON has none: its translation is a
/// table), no infinite or NaN float (JSON's is `null`), not too deep.
fn translatable(v: &toml::Value, depth: usize) -> bool {
    if depth > MAX_COMPARED_DEPTH {
        return false;
    }
    match v {
        toml::Value::Datetime(_) => false,
        toml::Value::Float(f) => f.is_finite(),
        toml::Value::Array(a) => a.iter().all(|v| translatable(v, depth + 1)),
        toml::Value::Table(t) => t.values().all(|v| translatable(v, depth + 1)),
        toml::Value::String(_) | toml::Value::Integer(_) | toml::Value::Boolean(_) => true,
    }
}

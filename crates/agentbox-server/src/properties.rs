//! Property tests of the parsers of what a request carries (proptest): each takes any input
//! without a panic, and what it accepts keeps its promise.

use proptest::prelude::*;
use serde_json::{Value, json};

use crate::api::boxes::labels_of;
use crate::api::files::checked;
use crate::api::processes::signal_of;
use crate::ws::{self, ClientMessage};

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn a_stream_frame_is_a_message_or_refused_never_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Err(e) = ws::parse(&bytes) {
            prop_assert!(e.message().starts_with("a frame out of protocol"));
        }
    }

    #[test]
    fn a_message_a_client_writes_is_read_back(
        data in ".{0,40}", close in any::<bool>(), rows in any::<u16>(), cols in any::<u16>(),
        // serde_json reads a float back to within a bit, not always exactly: whole numbers and names.
        sig in prop_oneof![any::<i64>().prop_map(Value::from), "[A-Z]{0,8}".prop_map(Value::from)]
    ) {
        for m in [
            ClientMessage::Stdin { data: data.clone(), data_base64: None, close },
            ClientMessage::Resize { rows, cols },
            ClientMessage::Signal { signal: sig.clone() },
        ] {
            let frame = serde_json::to_vec(&m).unwrap();
            let back = ws::parse(&frame).unwrap();
            prop_assert_eq!(serde_json::to_value(&back).unwrap(), serde_json::to_value(&m).unwrap());
        }
    }

    #[test]
    fn a_json_frame_of_any_shape_is_parsed_or_refused(v in any_json()) {
        let _ = ws::parse(v.to_string().as_bytes());
    }

    #[test]
    fn an_accepted_relative_path_never_climbs_out(path in "[a-z./]{0,24}") {
        if let Ok(p) = checked(&path, "path") {
            prop_assert!(!p.is_empty() && !p.contains('\0'));
            if !p.starts_with('/') {
                let mut depth = 0i64;
                for part in p.split('/') {
                    depth += match part { "" | "." => 0, ".." => -1, _ => 1 };
                    prop_assert!(depth >= 0, "{p} climbs out");
                }
            }
        }
    }

    #[test]
    fn any_path_text_is_checked_without_a_panic(path in any::<String>()) {
        let _ = checked(&path, "path");
    }

    #[test]
    fn a_signal_accepted_is_a_signal(v in any_json()) {
        if let Ok(n) = signal_of(&v) {
            prop_assert!((1..=64).contains(&n));
        }
    }

    #[test]
    fn a_labels_query_is_labels_or_refused(q in any::<String>()) {
        if let Ok(labels) = labels_of(&q) {
            prop_assert!(agentbox_core::validate_labels(&labels).is_ok());
        }
    }

    #[test]
    fn labels_written_as_a_query_are_read_back(
        labels in prop::collection::btree_map("[a-z][a-z0-9-]{0,10}", "[a-z0-9]{0,10}", 0..5)
    ) {
        let q: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let back = labels_of(&q.join(",")).unwrap();
        prop_assert_eq!(back.into_iter().collect::<Vec<_>>(), labels.into_iter().collect::<Vec<_>>());
    }
}

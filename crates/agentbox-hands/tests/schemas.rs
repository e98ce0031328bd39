//! Each tool's schema is derived from the struct its arguments parse into, says what pi's
//! tools say (the schemas below were written by hand before they were derived, and must not
//! drift; `edits` has since said it takes at least one), and refuses what the tool's parser
//! refuses. pi's seven alone ([`tools::seven`]) are exactly pi's; with the process tools
//! ([`tools::all`]) bash also takes `background`, and the four process tools follow.

use agentbox_hands::tools::{self, Tool};
use serde_json::{Value, json};

/// The schemas as they were written by hand from pi's tools: names, types, required fields
/// and descriptions.
fn pi_schemas() -> Vec<(&'static str, Value)> {
    vec![
        (
            "read",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path to the file to read (relative or absolute)"},
                    "offset": {"type": "number", "description": "Line number to start reading from (1-indexed)"},
                    "limit": {"type": "number", "description": "Maximum number of lines to read"}
                },
                "required": ["path"]
            }),
        ),
        (
            "bash",
            json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "Bash command to execute"},
                    "timeout": {"type": "number", "description": "Timeout in seconds (optional, no default timeout)"}
                },
                "required": ["command"]
            }),
        ),
        (
            "edit",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path to the file to edit (relative or absolute)"},
                    "edits": {
                        "type": "array",
                        "description": "Replacements, each matched against the original file",
                        "minItems": 1,
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
            }),
        ),
        (
            "write",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Path to the file to write (relative or absolute)"},
                    "content": {"type": "string", "description": "Content to write to the file"}
                },
                "required": ["path", "content"]
            }),
        ),
        (
            "grep",
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Search pattern (regex or literal string)"},
                    "path": {"type": "string", "description": "Directory or file to search (default: current directory)"},
                    "glob": {"type": "string", "description": "Filter files by glob pattern, e.g. '*.ts' or '**/*.spec.ts'"},
                    "ignoreCase": {"type": "boolean", "description": "Case-insensitive search (default: false)"},
                    "literal": {"type": "boolean", "description": "Treat pattern as literal string instead of regex (default: false)"},
                    "context": {"type": "number", "description": "Number of lines to show before and after each match (default: 0)"},
                    "limit": {"type": "number", "description": "Maximum number of matches to return (default: 100)"}
                },
                "required": ["pattern"]
            }),
        ),
        (
            "find",
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Glob pattern to match files, e.g. '*.ts', '**/*.json', or 'src/**/*.spec.ts'"},
                    "path": {"type": "string", "description": "Directory to search in (default: current directory)"},
                    "limit": {"type": "number", "description": "Maximum number of results (default: 1000)"}
                },
                "required": ["pattern"]
            }),
        ),
        (
            "ls",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Directory to list (default: current directory)"},
                    "limit": {"type": "number", "description": "Maximum number of entries to return (default: 500)"}
                }
            }),
        ),
    ]
}

/// The schemas of every tool: pi's, bash with `background`, and the process tools, as
/// docs/tools.md gives them.
fn all_schemas() -> Vec<(&'static str, Value)> {
    let mut all = pi_schemas();
    let bash = &mut all[1].1;
    bash["properties"]["background"] = json!({
        "type": "boolean",
        "description": "Run it in the background: return at once with a handle for process_read, process_write and process_kill (default: false)"
    });
    let handle = |d: &str| json!({"type": "number", "description": d});
    all.extend([
        (
            "process_read",
            json!({
                "type": "object",
                "properties": {
                    "handle": handle("Handle of the process (from bash with background, or process_list)"),
                    "after": {"type": "number", "description": "Byte number to read from: 0 for the start, or the next number a previous read gave (default: 0)"},
                    "wait": {"type": "number", "description": "Seconds to wait for new output when there is none yet (default: 5, at most 300)"}
                },
                "required": ["handle"]
            }),
        ),
        (
            "process_write",
            json!({
                "type": "object",
                "properties": {
                    "handle": handle("Handle of the process"),
                    "text": {"type": "string", "description": "Text to write to its stdin, as UTF-8 (include \"\\n\" to end a line)"},
                    "close": {"type": "boolean", "description": "Close its stdin after the text, so it reads end of file (default: false)"}
                },
                "required": ["handle"]
            }),
        ),
        (
            "process_kill",
            json!({
                "type": "object",
                "properties": {
                    "handle": handle("Handle of the process"),
                    "signal": {
                        "type": "string",
                        "description": "Signal to send to its process group (default: TERM)",
                        "enum": ["TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2", "STOP", "CONT", "TSTP", "ABRT", "ALRM", "PIPE", "SEGV", "WINCH"]
                    }
                },
                "required": ["handle"]
            }),
        ),
        ("process_list", json!({"type": "object", "properties": {}})),
    ]);
    all
}

#[test]
fn every_derived_schema_is_pis() {
    let seven = tools::seven();
    assert_eq!(seven.len(), pi_schemas().len());
    for (t, (name, want)) in seven.iter().zip(pi_schemas()) {
        assert_eq!(t.name(), name);
        assert_eq!(
            t.schema(),
            want,
            "{name}: {}",
            serde_json::to_string_pretty(&t.schema()).unwrap()
        );
    }
}

#[test]
fn every_schema_with_the_process_tools_is_as_documented() {
    let all = tools::all();
    assert_eq!(all.len(), all_schemas().len());
    for (t, (name, want)) in all.iter().zip(all_schemas()) {
        assert_eq!(t.name(), name);
        assert_eq!(
            t.schema(),
            want,
            "{name}: {}",
            serde_json::to_string_pretty(&t.schema()).unwrap()
        );
    }
}

/// Whether `v` is valid against `schema`, for the keywords these schemas use (the test
/// below fails on any other, so none is silently ignored).
fn valid(schema: &Value, v: &Value) -> bool {
    let s = schema.as_object().expect("a schema is an object");
    for k in s.keys() {
        assert!(
            [
                "type",
                "properties",
                "required",
                "items",
                "minItems",
                "description",
                "enum"
            ]
            .contains(&k.as_str()),
            "a keyword this check does not know: {k}"
        );
    }
    let typed = match s.get("type").and_then(Value::as_str) {
        None => true,
        Some("object") => v.is_object(),
        Some("array") => v.is_array(),
        Some("string") => v.is_string(),
        Some("number") => v.is_number(),
        Some("boolean") => v.is_boolean(),
        Some(other) => panic!("a type this check does not know: {other}"),
    };
    if !typed {
        return false;
    }
    if let Some(values) = s.get("enum").and_then(Value::as_array)
        && !values.contains(v)
    {
        return false;
    }
    if let Some(req) = s.get("required").and_then(Value::as_array)
        && !req.iter().all(|r| v.get(r.as_str().unwrap()).is_some())
    {
        return false;
    }
    if let Some(props) = s.get("properties").and_then(Value::as_object)
        && !props.iter().all(|(k, p)| v.get(k).is_none_or(|x| valid(p, x)))
    {
        return false;
    }
    if let Some(min) = s.get("minItems").and_then(Value::as_u64)
        && (v.as_array().unwrap().len() as u64) < min
    {
        return false;
    }
    if let Some(items) = s.get("items")
        && !v.as_array().unwrap().iter().all(|x| valid(items, x))
    {
        return false;
    }
    true
}

/// Inputs for `tool`: every required argument left out in turn, every argument given a value
/// of each JSON type, and one whole valid call.
fn inputs(t: &dyn Tool) -> Vec<Value> {
    let schema = t.schema();
    let props = schema["properties"].as_object().unwrap().clone();
    let good = |p: &Value| match p["type"].as_str().unwrap() {
        "string" if p.get("enum").is_some() => p["enum"][0].clone(),
        "string" => json!("x"),
        "number" => json!(2),
        "boolean" => json!(true),
        "array" => json!([{"oldText": "a", "newText": "b"}]),
        other => panic!("{other}"),
    };
    let valid_call: serde_json::Map<String, Value> = props.iter().map(|(k, p)| (k.clone(), good(p))).collect();
    let mut out = vec![
        Value::Object(valid_call.clone()),
        json!({}),
        json!("not an object"),
        json!([1]),
    ];
    for k in props.keys() {
        let mut without = valid_call.clone();
        without.remove(k);
        out.push(Value::Object(without));
        for wrong in [json!("s"), json!(3), json!(true), json!({"a": 1}), json!([])] {
            let mut with = valid_call.clone();
            with.insert(k.clone(), wrong);
            out.push(Value::Object(with));
        }
    }
    if t.name() == "process_kill" {
        for spelled in ["SIGKILL", "kill", "9", "SIGNOPE"] {
            let mut with = valid_call.clone();
            with.insert("signal".into(), json!(spelled));
            out.push(Value::Object(with));
        }
    }
    if t.name() == "edit" {
        for item in [
            json!({"oldText": "a"}),
            json!({"oldText": 1, "newText": "b"}),
            json!("x"),
        ] {
            let mut with = valid_call.clone();
            with.insert("edits".into(), json!([item]));
            out.push(Value::Object(with));
        }
    }
    out
}

#[test]
fn each_schema_accepts_and_refuses_what_its_parser_does() {
    for t in tools::all().into_iter().chain(tools::seven()) {
        let schema = t.schema();
        for input in inputs(&*t) {
            let by_schema = valid(&schema, &input);
            let parsed = t.check(input.clone());
            // Where the parser is kinder than the schema, on purpose: `edits` sent as a JSON
            // string (pi takes it), and a signal spelled with `SIG`, in lower case or by its
            // number. Nothing else.
            let kinder = (t.name() == "edit" && input["edits"].is_string())
                || (t.name() == "process_kill" && input["signal"].is_string());
            if kinder {
                assert!(parsed.is_ok() || !by_schema, "{}: {input}", t.name());
                continue;
            }
            match (&parsed, by_schema) {
                (Ok(()), true) | (Err(_), false) => {}
                (Ok(()), false) => panic!("{}: the parser takes what the schema refuses: {input}", t.name()),
                (Err(e), true) => panic!(
                    "{}: the parser refuses what the schema takes: {input}: {}",
                    t.name(),
                    e.0
                ),
            }
            if let Err(e) = parsed {
                assert!(e.0.starts_with("Invalid arguments: "), "{}: {}", t.name(), e.0);
            }
        }
    }
}

#[test]
fn a_refusal_names_the_argument_and_why() {
    let check = |tool: &str, args: Value| tools::by_name(tool).unwrap().check(args).unwrap_err().0;
    assert_eq!(
        check("read", json!({"offset": 1})),
        "Invalid arguments: path is required"
    );
    assert_eq!(
        check("read", json!({"path": 7})),
        "Invalid arguments: path must be a string"
    );
    assert_eq!(
        check("read", json!({"path": "a", "limit": -1})),
        "Invalid arguments: limit must be a non-negative whole number"
    );
    assert_eq!(
        check("bash", json!({"command": "true", "timeout": 0})),
        "Invalid arguments: timeout must be a positive number of seconds"
    );
    assert_eq!(
        check("grep", json!({"pattern": "a", "ignoreCase": "yes"})),
        "Invalid arguments: ignoreCase must be a boolean"
    );
    assert_eq!(
        check("edit", json!({"path": "a", "edits": [{"oldText": "x"}]})),
        "Invalid arguments: edits[0].newText must be a string"
    );
    assert_eq!(
        check("edit", json!({"path": "a", "edits": [{"oldText": 1, "newText": "x"}]})),
        "Invalid arguments: edits[0].oldText must be a string"
    );
    assert_eq!(
        check("edit", json!({"path": "a", "edits": 3})),
        "Invalid arguments: edits must be an array"
    );
    assert!(
        check("edit", json!({"path": "a", "edits": "[nope"})).starts_with("Invalid arguments: edits is not valid JSON"),
    );
    assert_eq!(check("ls", json!(null)), "Invalid arguments: expected an object");
    // null for an optional argument is "not given", as before.
    tools::by_name("ls")
        .unwrap()
        .check(json!({"path": null, "limit": null}))
        .unwrap();
    // The older top-level form of one edit.
    tools::by_name("edit")
        .unwrap()
        .check(json!({"path": "a", "oldText": "x", "newText": "y"}))
        .unwrap();
}

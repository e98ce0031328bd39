//! Every tool's messages, as docs/tools.md gives them, and the tools in boxes with no ripgrep or fd.

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Provider, Spec};
use agentbox_hands::tools::{self, Content, ToolResult};
use agentbox_hands::{BoxEnv, ExecutionEnv, HostEnv};
use agentbox_providers::docker::{DockerOptions, DockerProvider};
use agentbox_providers::{LocalOptions, LocalProvider};
use serde_json::{Value, json};

async fn call(env: &dyn ExecutionEnv, name: &str, args: Value) -> ToolResult {
    tools::call(name, env, args, &Ctx::background()).await
}

fn ok(r: &ToolResult) -> String {
    assert!(!r.is_error, "expected success: {}", r.text());
    r.text()
}

fn err(r: &ToolResult) -> String {
    assert!(r.is_error, "expected an error: {}", r.text());
    r.text()
}

fn host() -> (tempfile::TempDir, HostEnv) {
    let d = tempfile::tempdir().unwrap();
    let env = HostEnv::new(d.path().to_string_lossy()).unwrap();
    (d, env)
}

#[tokio::test]
async fn read_messages() {
    let (_d, env) = host();
    let ctx = Ctx::background();
    let lines: Vec<String> = (1..=2500).map(|i| format!("line {i}")).collect();
    env.write_file("many.txt", lines.join("\n").as_bytes(), &ctx)
        .await
        .unwrap();
    let t = ok(&call(&env, "read", json!({"path": "many.txt"})).await);
    assert!(t.starts_with("line 1\nline 2\n") && !t.contains("line 2001\n"));
    assert!(
        t.ends_with("\n\n[Showing lines 1-2000 of 2500. Use offset=2001 to continue.]"),
        "{}",
        &t[t.len() - 80..]
    );
    let t = ok(&call(&env, "read", json!({"path": "many.txt", "offset": 2490})).await);
    assert_eq!(
        t,
        (2490..=2500)
            .map(|i| format!("line {i}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let t = ok(&call(&env, "read", json!({"path": "many.txt", "offset": 10, "limit": 2})).await);
    assert_eq!(
        t,
        "line 10\nline 11\n\n[2489 more lines in file. Use offset=12 to continue.]"
    );
    assert_eq!(
        err(&call(&env, "read", json!({"path": "many.txt", "offset": 3000})).await),
        "Offset 3000 is beyond end of file (2500 lines total)"
    );
    // By bytes.
    let wide: Vec<String> = (1..=100).map(|i| format!("{i:04}{}", "w".repeat(996))).collect();
    env.write_file("wide.txt", wide.join("\n").as_bytes(), &ctx)
        .await
        .unwrap();
    let t = ok(&call(&env, "read", json!({"path": "wide.txt"})).await);
    assert!(
        t.ends_with("\n\n[Showing lines 1-51 of 100 (50.0KB limit). Use offset=52 to continue.]"),
        "{}",
        &t[t.len() - 90..]
    );
    // A first line over the limit.
    env.write_file("long.txt", "y".repeat(60_000).as_bytes(), &ctx)
        .await
        .unwrap();
    assert_eq!(
        ok(&call(&env, "read", json!({"path": "long.txt"})).await),
        "[Line 1 is 58.6KB, exceeds 50.0KB limit. Use bash: sed -n '1p' long.txt | head -c 51200]"
    );
    assert_eq!(
        err(&call(&env, "read", json!({"path": "nope.txt"})).await),
        "File not found: nope.txt"
    );
    // Images come back as an image part.
    env.write_file("p.png", b"\x89PNG\r\n\x1a\nfake", &ctx).await.unwrap();
    let r = call(&env, "read", json!({"path": "p.png"})).await;
    assert!(
        r.content
            .iter()
            .any(|c| matches!(c, Content::Image { mime_type, .. } if mime_type == "image/png"))
    );
    // Bad arguments are the model's error, not a crash.
    assert!(err(&call(&env, "read", json!({"offset": 1})).await).contains("path is required"));
    assert!(err(&call(&env, "read", json!({"path": "many.txt", "limit": -1})).await).contains("limit"));
}

#[tokio::test]
async fn write_and_edit_messages() {
    let (_d, env) = host();
    let ctx = Ctx::background();
    assert_eq!(
        ok(&call(&env, "write", json!({"path": "a/b/c.txt", "content": "héllo\n"})).await),
        "Successfully wrote 7 bytes to a/b/c.txt"
    );
    env.write_file("f.txt", b"alpha\nbeta\ngamma\nbeta2\n", &ctx)
        .await
        .unwrap();
    let r = call(&env, "edit", json!({"path": "f.txt", "edits": [{"oldText": "alpha", "newText": "ALPHA"}, {"oldText": "gamma", "newText": "GAMMA"}]})).await;
    assert_eq!(ok(&r), "Successfully replaced 2 block(s) in f.txt.");
    assert_eq!(r.details["firstChangedLine"], 1);
    assert!(
        r.details["diff"].as_str().unwrap().contains("-alpha\n+ALPHA"),
        "{}",
        r.details["diff"]
    );
    assert_eq!(
        env.read_text_file("f.txt", &ctx).await.unwrap(),
        "ALPHA\nbeta\nGAMMA\nbeta2\n"
    );
    let e = |edits: Value| json!({"path": "f.txt", "edits": edits});
    assert_eq!(
        err(&call(&env, "edit", e(json!([{"oldText": "delta", "newText": "x"}]))).await),
        "Could not find edits[0] in f.txt. The oldText must match exactly including all whitespace and newlines."
    );
    assert_eq!(
        err(&call(
            &env,
            "edit",
            e(json!([{"oldText": "GAMMA", "newText": "g"}, {"oldText": "beta", "newText": "x"}]))
        )
        .await),
        "Found 2 occurrences of edits[1] in f.txt. Each oldText must be unique. Please provide more context to make it unique."
    );
    assert_eq!(
        err(&call(&env, "edit", e(json!([{"oldText": "", "newText": "x"}]))).await),
        "oldText must not be empty in f.txt."
    );
    assert_eq!(
        err(&call(
            &env,
            "edit",
            e(json!([{"oldText": "ALPHA\nbeta", "newText": "x"}, {"oldText": "beta\nGAMMA", "newText": "y"}]))
        )
        .await),
        "edits[0] and edits[1] overlap in f.txt. Merge them into one edit or target disjoint regions."
    );
    assert_eq!(
        err(&call(&env, "edit", e(json!([{"oldText": "GAMMA", "newText": "GAMMA"}]))).await),
        "No changes made to f.txt. The replacement produced identical content."
    );
    // The older top-level form, and edits as a JSON string.
    ok(&call(
        &env,
        "edit",
        json!({"path": "f.txt", "oldText": "ALPHA", "newText": "one"}),
    )
    .await);
    ok(&call(
        &env,
        "edit",
        json!({"path": "f.txt", "edits": "[{\"oldText\": \"GAMMA\", \"newText\": \"three\"}]"}),
    )
    .await);
    assert_eq!(
        env.read_text_file("f.txt", &ctx).await.unwrap(),
        "one\nbeta\nthree\nbeta2\n"
    );
    // CRLF and a BOM are kept; a fuzzy match finds smart quotes, dashes and trailing spaces.
    env.write_file(
        "w.txt",
        "\u{feff}say \u{201c}hi\u{201d} \u{2014} ok   \r\nnext\r\n".as_bytes(),
        &ctx,
    )
    .await
    .unwrap();
    ok(&call(
        &env,
        "edit",
        json!({"path": "w.txt", "edits": [{"oldText": "say \"hi\" - ok\nnext", "newText": "said\nthen"}]}),
    )
    .await);
    assert_eq!(
        env.read_text_file("w.txt", &ctx).await.unwrap(),
        "\u{feff}said\r\nthen\r\n"
    );
    assert_eq!(
        err(&call(
            &env,
            "edit",
            json!({"path": "none.txt", "edits": [{"oldText": "a", "newText": "b"}]})
        )
        .await),
        "File not found: none.txt"
    );
}

#[tokio::test]
async fn bash_messages() {
    let (_d, env) = host();
    assert_eq!(
        ok(&call(&env, "bash", json!({"command": "echo hi; echo err >&2"})).await),
        "hi\nerr\n"
    );
    assert_eq!(ok(&call(&env, "bash", json!({"command": "true"})).await), "(no output)");
    assert_eq!(
        err(&call(&env, "bash", json!({"command": "echo partial; exit 3"})).await),
        "partial\n\n\nCommand exited with code 3"
    );
    assert_eq!(
        err(&call(&env, "bash", json!({"command": "sleep 30", "timeout": 1})).await),
        "Command timed out after 1 seconds"
    );
    let r = call(&env, "bash", json!({"command": "seq 1 3000"})).await;
    let t = ok(&r);
    let full = r.details["fullOutputPath"]
        .as_str()
        .expect("the whole output is in a file")
        .to_string();
    assert!(
        t.starts_with("1002\n")
            && t.ends_with(&format!(
                "3000\n\n\n[Showing lines 1002-3001 of 3001. Full output: {full}]"
            )),
        "{}",
        &t[t.len() - 100..]
    );
    assert_eq!(
        env.read_text_file(&full, &Ctx::background())
            .await
            .unwrap()
            .lines()
            .count(),
        3000
    );
    // An abort.
    let ctx = Ctx::background();
    let c = ctx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        c.cancel();
    });
    let r = tools::call("bash", &env, json!({"command": "echo started; sleep 30"}), &ctx).await;
    assert_eq!(err(&r), "started\n\n\nCommand aborted");
}

#[tokio::test]
async fn ls_grep_find_messages() {
    let (_d, env) = host();
    let ctx = Ctx::background();
    for f in [
        "b.txt",
        "A.txt",
        ".dot",
        "sub/inner.rs",
        "sub/deep/x.rs",
        "node_modules/m.rs",
        ".git/g.rs",
    ] {
        env.write_file(f, b"fn main() {}\nlet needle = 1;\n", &ctx)
            .await
            .unwrap();
    }
    assert_eq!(
        ok(&call(&env, "ls", json!({})).await),
        ".dot\n.git/\nA.txt\nb.txt\nnode_modules/\nsub/"
    );
    assert_eq!(
        ok(&call(&env, "ls", json!({"limit": 2})).await),
        ".dot\n.git/\n\n[2 entries limit reached. Use limit=4 for more]"
    );
    env.create_dir("empty", false, &ctx).await.unwrap();
    assert_eq!(
        ok(&call(&env, "ls", json!({"path": "empty"})).await),
        "(empty directory)"
    );
    assert_eq!(
        err(&call(&env, "ls", json!({"path": "nowhere"})).await),
        "Path not found: nowhere"
    );
    assert_eq!(
        err(&call(&env, "ls", json!({"path": "b.txt"})).await),
        "Not a directory: b.txt"
    );

    let t = ok(&call(&env, "grep", json!({"pattern": "needle"})).await);
    assert_eq!(
        t,
        ".dot:2: let needle = 1;\nA.txt:2: let needle = 1;\nb.txt:2: let needle = 1;\nsub/deep/x.rs:2: let needle = 1;\nsub/inner.rs:2: let needle = 1;"
    );
    let t = ok(&call(
        &env,
        "grep",
        json!({"pattern": "NEEDLE", "ignoreCase": true, "glob": "*.rs", "context": 1}),
    )
    .await);
    assert_eq!(
        t,
        "sub/deep/x.rs-1- fn main() {}\nsub/deep/x.rs:2: let needle = 1;\nsub/inner.rs-1- fn main() {}\nsub/inner.rs:2: let needle = 1;"
    );
    assert_eq!(
        ok(&call(&env, "grep", json!({"pattern": "needle", "path": "b.txt"})).await),
        "b.txt:2: let needle = 1;"
    );
    assert_eq!(
        ok(&call(
            &env,
            "grep",
            json!({"pattern": "fn main() {", "literal": true, "limit": 1})
        )
        .await)
        .split("\n\n")
        .nth(1),
        Some("[1 matches limit reached. Use limit=2 for more, or refine pattern]")
    );
    assert_eq!(
        ok(&call(&env, "grep", json!({"pattern": "absent"})).await),
        "No matches found"
    );
    assert_eq!(
        err(&call(&env, "grep", json!({"pattern": "x", "path": "nowhere"})).await),
        "Path not found: nowhere"
    );
    env.write_file("wide.txt", format!("{}needle", "z".repeat(600)).as_bytes(), &ctx)
        .await
        .unwrap();
    let t = ok(&call(&env, "grep", json!({"pattern": "needle", "path": "wide.txt"})).await);
    assert!(
        t.starts_with(&format!("wide.txt:1: {}... [truncated]", "z".repeat(500))),
        "{t}"
    );

    assert_eq!(
        ok(&call(&env, "find", json!({"pattern": "*.rs"})).await),
        "sub/deep/x.rs\nsub/inner.rs"
    );
    assert_eq!(
        ok(&call(&env, "find", json!({"pattern": "sub/**"})).await),
        "sub/deep/\nsub/deep/x.rs\nsub/inner.rs"
    );
    assert_eq!(
        ok(&call(&env, "find", json!({"pattern": "*.nothing"})).await),
        "No files found matching pattern"
    );
    assert_eq!(
        ok(&call(&env, "find", json!({"pattern": "*", "limit": 2})).await),
        ".dot\nA.txt\n\n[2 results limit reached. Use limit=4 for more, or refine pattern]"
    );
    assert_eq!(err(&call(&env, "nosuch", json!({})).await), "Unknown tool: nosuch");
}

#[tokio::test]
async fn every_tool_exposes_a_schema() {
    let names: Vec<&str> = tools::all().iter().map(|t| t.name()).collect();
    assert_eq!(
        names,
        [
            "read",
            "bash",
            "edit",
            "write",
            "grep",
            "find",
            "ls",
            "process_read",
            "process_write",
            "process_kill",
            "process_list"
        ]
    );
    for t in tools::all().into_iter().chain(tools::seven()) {
        let s = t.schema();
        assert_eq!(s["type"], "object", "{}", t.name());
        for req in s["required"].as_array().into_iter().flatten() {
            assert!(
                s["properties"].get(req.as_str().unwrap()).is_some(),
                "{}: {req}",
                t.name()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tools_work_in_boxes_with_no_ripgrep_and_no_fd() {
    agentbox_testing::runner::ensure();
    let home = tempfile::tempdir().unwrap();
    let spec = Spec::new(Duration::from_secs(300));
    let mut boxes = vec![
        LocalProvider::new(LocalOptions::at(home.path()).unwrap())
            .unwrap()
            .create(&spec, &Ctx::background())
            .await
            .unwrap(),
    ];
    if agentbox_testing::services::docker_available("the tools in a Docker box") {
        let d = DockerProvider::new(DockerOptions::default()).await.unwrap();
        boxes.push(d.create(&spec, &Ctx::background()).await.unwrap());
    }
    for b in boxes {
        let env: Arc<dyn ExecutionEnv> = Arc::new(BoxEnv::new(b.clone()));
        let env = &*env;
        if b.id().provider() == "docker" {
            assert!(
                err(&call(
                    env,
                    "bash",
                    json!({"command": "command -v rg || command -v fd || exit 9"})
                )
                .await)
                .contains("code 9")
            );
        }
        ok(&call(
            env,
            "write",
            json!({"path": "src/lib.rs", "content": "pub fn answer() -> u32 {\n    42\n}\n"}),
        )
        .await);
        ok(&call(
            env,
            "edit",
            json!({"path": "src/lib.rs", "edits": [{"oldText": "42", "newText": "43"}]}),
        )
        .await);
        assert_eq!(
            ok(&call(env, "read", json!({"path": "src/lib.rs", "offset": 2, "limit": 1})).await),
            "    43\n\n[2 more lines in file. Use offset=3 to continue.]"
        );
        assert_eq!(
            ok(&call(env, "grep", json!({"pattern": "fn \\w+\\(", "path": "src"})).await),
            "lib.rs:1: pub fn answer() -> u32 {"
        );
        assert_eq!(
            ok(&call(env, "find", json!({"pattern": "**/*.rs"})).await),
            "src/lib.rs"
        );
        assert_eq!(ok(&call(env, "ls", json!({})).await), "src/");
        assert_eq!(
            ok(&call(env, "bash", json!({"command": "cat src/lib.rs | wc -l"})).await),
            "3\n"
        );
        b.destroy(&Ctx::background()).await.unwrap();
    }
}

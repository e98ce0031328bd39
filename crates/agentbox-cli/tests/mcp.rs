//! `agentbox mcp` driven as a real MCP client drives it (rmcp's client, over the server's
//! stdio): every tool, a tool error, a bash timeout, a malformed request, a background command
//! read and killed through the process tools (hidden by `--no-process-tools`, which serves
//! pi's seven alone), the workspace seeded and
//! pulled back, and the box ended when the client leaves (also mid-call).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock};
use rmcp::service::{RoleClient, RunningService};
use serde_json::{Value, json};

struct Server {
    client: RunningService<RoleClient, ()>,
    child: tokio::process::Child,
}

async fn start(home: &Path, args: &[&str]) -> Server {
    start_as(Path::new(env!("CARGO_BIN_EXE_agentbox")), home, args).await
}

/// The server as `program`, with no `AGENTBOX_RUNNER` (an MCP client's stdio launch passes
/// none).
async fn start_as(program: &Path, home: &Path, args: &[&str]) -> Server {
    let mut child = tokio::process::Command::new(program)
        .arg("mcp")
        .args(args)
        .env("AGENTBOX_HOME", home)
        .env_remove("AGENTBOX_RUNNER")
        .env_remove("AGENTBOX_PROVIDER")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
    let client = ().serve((stdout, stdin)).await.expect("the server initializes");
    Server { client, child }
}

async fn call(s: &Server, tool: &str, args: Value) -> CallToolResult {
    let Value::Object(map) = args else {
        panic!("arguments are an object")
    };
    s.client
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(map))
        .await
        .unwrap()
}

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| match c {
            ContentBlock::Text(t) => Some(t.text.clone()),
            _ => None,
        })
        .collect()
}

/// Leave as a client that dies does: its end of the pipes closes. The server then ends its box
/// and exits.
async fn leave(s: Server) {
    let Server { client, mut child } = s;
    drop(client);
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("the server exits once its client is gone")
        .unwrap();
    assert!(status.success(), "{status}");
}

async fn every_tool(s: &Server) {
    let info = s.client.peer_info().unwrap();
    assert_eq!(info.protocol_version.to_string(), "2025-11-25");
    assert_eq!(info.server_info.as_ref().map(|i| i.name.as_str()), Some("agentbox"));
    let tools = s.client.list_all_tools().await.unwrap();
    let names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
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
        ],
        "pi's seven, then the process tools"
    );
    for t in &tools {
        let hints = t.annotations.as_ref().expect("hints");
        let read_only = matches!(
            t.name.as_ref(),
            "read" | "ls" | "grep" | "find" | "process_read" | "process_list"
        );
        assert_eq!(hints.read_only_hint, Some(read_only), "{}", t.name);
        assert_eq!(hints.destructive_hint, Some(!read_only), "{}", t.name);
        assert_eq!(t.input_schema.get("type"), Some(&json!("object")), "{}", t.name);
        // What the client reads is the schema derived from the tool's argument struct.
        let derived = agentbox_hands::tools::by_name(&t.name)
            .expect("a tool of the hands")
            .schema();
        assert_eq!(Value::Object((*t.input_schema).clone()), derived, "{}", t.name);
    }
    let w = call(s, "write", json!({"path": "src/main.txt", "content": "alpha\nbeta\n"})).await;
    assert_eq!(w.is_error, Some(false), "{}", text(&w));
    assert!(text(&call(s, "read", json!({"path": "src/main.txt"})).await).contains("beta"));
    let e = call(
        s,
        "edit",
        json!({"path": "src/main.txt", "edits": [{"oldText": "beta", "newText": "gamma"}]}),
    )
    .await;
    assert_eq!(e.is_error, Some(false), "{}", text(&e));
    let b = call(s, "bash", json!({"command": "cat src/main.txt; echo in-the-box"})).await;
    assert!(
        text(&b).contains("gamma") && text(&b).contains("in-the-box"),
        "{}",
        text(&b)
    );
    assert!(text(&call(s, "ls", json!({"path": "src"})).await).contains("main.txt"));
    assert!(text(&call(s, "grep", json!({"pattern": "gamma"})).await).contains("main.txt"));
    assert!(text(&call(s, "find", json!({"pattern": "*.txt"})).await).contains("main.txt"));
    // An image comes back as image content.
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
    call(
        s,
        "bash",
        json!({"command": format!("echo {png} | base64 -d > dot.png")}),
    )
    .await;
    let img = call(s, "read", json!({"path": "dot.png"})).await;
    let image = img.content.iter().find_map(|c| match c {
        ContentBlock::Image(i) => Some((i.mime_type.clone(), i.data.clone())),
        _ => None,
    });
    let (mime, data) = image.expect("an image block");
    assert_eq!((mime.as_str(), data.as_str()), ("image/png", png));
    // A tool's failure is a result the model reads, with isError.
    let missing = call(s, "read", json!({"path": "no/such.txt"})).await;
    assert_eq!(missing.is_error, Some(true));
    assert!(text(&missing).contains("no/such.txt"), "{}", text(&missing));
    // A command past its timeout.
    let slow = call(s, "bash", json!({"command": "sleep 30", "timeout": 1})).await;
    assert_eq!(slow.is_error, Some(true));
    assert!(text(&slow).to_lowercase().contains("timed out"), "{}", text(&slow));
    // A malformed request (a tool that does not exist) is a JSON-RPC error, not a result.
    let err = s
        .client
        .call_tool(CallToolRequestParams::new("teleport"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("teleport"), "{err}");
}

fn local_boxes(home: &Path) -> usize {
    std::fs::read_dir(home.join("boxes")).map(|d| d.count()).unwrap_or(0)
}

fn namespace_boxes(home: &Path) -> usize {
    std::fs::read_dir(home.join("namespace"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Boxes of either kind a server started without `--provider` may make.
fn boxes(home: &Path) -> usize {
    local_boxes(home) + namespace_boxes(home)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tool_in_a_local_box_and_the_box_ends_with_the_client() {
    let home = tempfile::tempdir().unwrap();
    let s = start(home.path(), &["--provider", "local", "--lifetime", "10m"]).await;
    assert_eq!(local_boxes(home.path()), 0, "no box before the first tool call");
    every_tool(&s).await;
    assert_eq!(local_boxes(home.path()), 1);
    leave(s).await;
    assert_eq!(local_boxes(home.path()), 0, "the box went with the client");
}

/// With no `--provider`, a client's hands are isolated: every tool runs in a namespace box
/// (this machine makes them), whose programs have no new privileges and a user namespace of
/// their own, and the box goes with the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tool_in_a_namespace_box_unless_asked_otherwise() {
    let home = tempfile::tempdir().unwrap();
    let s = start(home.path(), &["--lifetime", "10m"]).await;
    assert_eq!(boxes(home.path()), 0, "no box before the first tool call");
    every_tool(&s).await;
    assert_eq!(
        (namespace_boxes(home.path()), local_boxes(home.path())),
        (1, 0),
        "a namespace box"
    );
    let out = text(
        &call(
            &s,
            "bash",
            json!({"command": "grep '^NoNewPrivs:' /proc/self/status; readlink /proc/self/ns/user"}),
        )
        .await,
    );
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("NoNewPrivs:\t1"), "{out}");
    let host_user_ns = std::fs::read_link("/proc/self/ns/user").unwrap();
    let box_user_ns = lines.next().unwrap_or_default();
    assert!(box_user_ns.starts_with("user:["), "{out}");
    assert_ne!(
        box_user_ns,
        host_user_ns.to_str().unwrap(),
        "a user namespace of its own"
    );
    leave(s).await;
    assert_eq!(boxes(home.path()), 0, "the box went with the client");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_dying_mid_call_ends_the_box() {
    let home = tempfile::tempdir().unwrap();
    let s = start(home.path(), &[]).await;
    call(&s, "write", json!({"path": "x", "content": "1"})).await;
    let Server { client, mut child } = s;
    let peer = client.peer().clone();
    let running = tokio::spawn(async move {
        peer.call_tool(
            CallToolRequestParams::new("bash")
                .with_arguments(json!({"command": "sleep 300"}).as_object().unwrap().clone()),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(client);
    running.abort();
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("the server exits")
        .unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(boxes(home.path()), 0, "the box and its sleep went with the client");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workspace_goes_in_and_comes_back_changed() {
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("keep.txt"), "unchanged\n").unwrap();
    std::fs::write(work.path().join("edit.txt"), "before\n").unwrap();
    std::fs::write(work.path().join("gone.txt"), "delete me\n").unwrap();
    let s = start(home.path(), &["--workspace", work.path().to_str().unwrap()]).await;
    assert!(text(&call(&s, "read", json!({"path": "keep.txt"})).await).contains("unchanged"));
    call(
        &s,
        "edit",
        json!({"path": "edit.txt", "edits": [{"oldText": "before", "newText": "after"}]}),
    )
    .await;
    call(
        &s,
        "write",
        json!({"path": "new/made.txt", "content": "made in the box\n"}),
    )
    .await;
    call(
        &s,
        "bash",
        json!({"command": "rm gone.txt; echo outside > /tmp/not-the-workspace.txt"}),
    )
    .await;
    leave(s).await;
    let read = |p: &str| std::fs::read_to_string(work.path().join(p)).ok();
    assert_eq!(read("keep.txt").as_deref(), Some("unchanged\n"));
    assert_eq!(read("edit.txt").as_deref(), Some("after\n"));
    assert_eq!(read("new/made.txt").as_deref(), Some("made in the box\n"));
    assert_eq!(read("gone.txt"), None, "a deletion comes back");
    assert_eq!(read("not-the-workspace.txt"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tool_in_a_docker_box_and_the_box_is_gone_after() {
    if !agentbox_testing::services::docker_available("every_tool_in_a_docker_box_and_the_box_is_gone_after") {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let s = start(home.path(), &["--provider", "docker", "--lifetime", "10m"]).await;
    every_tool(&s).await;
    let pid = s.child.id().unwrap().to_string();
    let label = format!("label=agentbox-mcp={pid}");
    let listed = || {
        let out = std::process::Command::new("docker")
            .args(["ps", "-q", "--filter", &label])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert!(!listed().is_empty(), "the box is a container");
    leave(s).await;
    assert_eq!(listed(), "", "the container went with the client");
}

/// One HTTP request on a fresh connection; the whole answer.
async fn http(addr: &str, method: &str, host: &str, session: Option<&str>, body: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let session = session
        .map(|id| format!("mcp-session-id: {id}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} / HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\n\
         mcp-protocol-version: 2025-11-25\r\n{session}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    // An event stream may stay open: read until the answer's data line is in.
    let _ = tokio::time::timeout(Duration::from_secs(30), async {
        let mut buf = [0u8; 4096];
        loop {
            let n = s.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&out);
            if text.contains("\"result\"")
                || text.contains("\"error\"")
                || (method != "POST" && text.contains("\r\n\r\n"))
            {
                break;
            }
        }
    })
    .await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_http_on_loopback_with_its_host_checks() {
    let home = tempfile::tempdir().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let addr = format!("127.0.0.1:{port}");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args(["mcp", "--http", &addr])
        .env("AGENTBOX_HOME", home.path())
        .env_remove("AGENTBOX_PROVIDER")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"test","version":"1"}}}"#;
    let mut answer = String::new();
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(&addr).await.is_ok() {
            answer = http(&addr, "POST", &addr, None, init).await;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains("2025-11-25"),
        "{answer}"
    );
    let session = answer
        .lines()
        .find_map(|l| l.strip_prefix("mcp-session-id: "))
        .expect("a session id")
        .trim()
        .to_string();
    // A request naming another Host (DNS rebinding from a page) is refused.
    let evil = http(&addr, "POST", "evil.example", None, init).await;
    assert!(evil.starts_with("HTTP/1.1 403"), "{evil}");
    http(
        &addr,
        "POST",
        &addr,
        Some(&session),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    )
    .await;
    let call = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"bash","arguments":{"command":"echo over-http"}}}"#;
    let answer = http(&addr, "POST", &addr, Some(&session), call).await;
    assert!(answer.contains("over-http"), "{answer}");
    assert_eq!(boxes(home.path()), 1);
    // The session ends: its box goes, and the DELETE is answered 200 (the MCP SDKs take 200
    // or 204; rmcp alone says 202).
    let deleted = http(&addr, "DELETE", &addr, Some(&session), "").await;
    assert!(deleted.starts_with("HTTP/1.1 200"), "{deleted}");
    let again = http(&addr, "DELETE", &addr, Some(&session), "").await;
    assert!(again.starts_with("HTTP/1.1 404"), "a session no longer there: {again}");
    let evil = http(&addr, "DELETE", "evil.example", Some("whatever"), "").await;
    assert!(evil.starts_with("HTTP/1.1 403"), "the Host check comes first: {evil}");
    let mut gone = false;
    for _ in 0..100 {
        if boxes(home.path()) == 0 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the session's box ended with it");
    child.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_box_has_a_runner_unless_told_not_to() {
    let home = tempfile::tempdir().unwrap();
    let runner_socket = |home: &Path| {
        std::fs::read_dir(home.join("boxes"))
            .unwrap()
            .filter_map(|d| d.ok())
            .any(|d| d.path().join("runner.sock").exists())
    };
    let s = start(home.path(), &["--provider", "local"]).await;
    assert_eq!(
        text(&call(&s, "bash", json!({"command": "echo hi"})).await).trim(),
        "hi"
    );
    assert!(runner_socket(home.path()), "the default box serves through its runner");
    leave(s).await;
    let s = start(home.path(), &["--provider", "local", "--no-runner"]).await;
    assert_eq!(
        text(&call(&s, "bash", json!({"command": "echo hi"})).await).trim(),
        "hi"
    );
    assert!(!runner_socket(home.path()), "--no-runner: no runner");
    leave(s).await;
}

/// A background command through the process tools, in a box with a runner: read while it
/// runs, listed, killed, and its end read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_command_through_the_process_tools() {
    let home = tempfile::tempdir().unwrap();
    let s = start(home.path(), &["--provider", "local"]).await;
    let started = call(
        &s,
        "bash",
        json!({"command": "echo serving; exec sleep 120", "background": true}),
    )
    .await;
    assert_eq!(started.is_error, Some(false), "{}", text(&started));
    let said = text(&started);
    let handle: u64 = said
        .strip_prefix("Started in the background as process ")
        .and_then(|r| r.split('.').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    let mut seen = String::new();
    for _ in 0..15 {
        let r = call(&s, "process_read", json!({"handle": handle, "wait": 2})).await;
        assert_eq!(r.is_error, Some(false), "{}", text(&r));
        seen = text(&r);
        if seen.contains("serving") {
            break;
        }
    }
    assert!(
        seen.starts_with("serving\n") && seen.contains("is still running"),
        "{seen}"
    );
    let listed = text(&call(&s, "process_list", json!({})).await);
    assert!(listed.contains("echo serving; exec sleep 120"), "{listed}");
    let killed = call(&s, "process_kill", json!({"handle": handle, "signal": "KILL"})).await;
    assert_eq!(
        text(&killed),
        format!("Sent SIGKILL to process {handle}. Use process_read to see how it ended.")
    );
    let mut ended = String::new();
    for _ in 0..15 {
        ended = text(&call(&s, "process_read", json!({"handle": handle, "after": 8, "wait": 2})).await);
        if !ended.contains("is still running") {
            break;
        }
    }
    assert!(ended.contains("was ended by SIGKILL (exit code 137)"), "{ended}");
    leave(s).await;
}

/// `--no-process-tools` lists pi's seven alone, bash as pi has it, and a call of a process
/// tool is then a tool that does not exist; without a runner the process tools refuse, saying
/// why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_tools_are_hidden_when_asked_and_refuse_without_a_runner() {
    let home = tempfile::tempdir().unwrap();
    let s = start(home.path(), &["--provider", "local", "--no-process-tools"]).await;
    let tools = s.client.list_all_tools().await.unwrap();
    let names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    assert_eq!(names, ["read", "bash", "edit", "write", "grep", "find", "ls"]);
    let bash = tools.iter().find(|t| t.name == "bash").unwrap();
    let pi_bash = agentbox_hands::tools::seven()
        .into_iter()
        .find(|t| t.name() == "bash")
        .unwrap();
    assert_eq!(Value::Object((*bash.input_schema).clone()), pi_bash.schema());
    assert!(bash.input_schema["properties"].get("background").is_none());
    let err = s
        .client
        .call_tool(CallToolRequestParams::new("process_list"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("process_list"), "{err}");
    leave(s).await;

    let s = start(home.path(), &["--provider", "local", "--no-runner"]).await;
    let r = call(&s, "process_list", json!({})).await;
    assert_eq!(r.is_error, Some(true));
    assert!(
        text(&r).starts_with("No processes here: box local:") && text(&r).contains("has no runner"),
        "{}",
        text(&r)
    );
    let r = call(&s, "bash", json!({"command": "sleep 60", "background": true})).await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("has no runner"), "{}", text(&r));
    leave(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_install_serves_docker_boxes_through_its_runner() {
    if !agentbox_testing::services::docker_available("a_fresh_install_serves_docker_boxes_through_its_runner") {
        return;
    }
    // `agentbox` alone in a bin directory, as `cargo install --root` lays it out.
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("bin")).unwrap();
    let exe = root.path().join("bin/agentbox");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_agentbox"), &exe).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_agentbox"), &exe).unwrap();
    }
    let home = tempfile::tempdir().unwrap();
    let s = start_as(&exe, home.path(), &["--provider", "docker", "--lifetime", "10m"]).await;
    call(&s, "write", json!({"path": "a.txt", "content": "through the runner\n"})).await;
    assert!(text(&call(&s, "read", json!({"path": "a.txt"})).await).contains("through the runner"));
    let pid = s.child.id().unwrap().to_string();
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-q",
            "--filter",
            &format!("label=agentbox-mcp={pid}"),
            "--filter",
            "label=agentbox.runner=1",
        ])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stdout).trim().is_empty(),
        "the box was made with its runner"
    );
    leave(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_debug_logs_stdout_carries_only_protocol_messages() {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let home = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args(["mcp", "-vv"])
        .env("AGENTBOX_HOME", home.path())
        .env_remove("AGENTBOX_PROVIDER")
        .env("RUST_LOG", "debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stderr = child.stderr.take().unwrap();
    let errors = tokio::spawn(async move {
        let mut all = String::new();
        let _ = stderr.read_to_string(&mut all).await;
        all
    });
    let requests = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"bash","arguments":{"command":"echo logged"}}}"#,
    ];
    let mut lines = Vec::new();
    for r in requests {
        stdin.write_all(format!("{r}\n").as_bytes()).await.unwrap();
        if r.contains("\"id\"") {
            let line = tokio::time::timeout(Duration::from_secs(60), stdout.next_line())
                .await
                .expect("an answer")
                .unwrap()
                .expect("a line");
            lines.push(line);
        }
    }
    drop(stdin);
    while let Ok(Some(line)) = tokio::time::timeout(Duration::from_secs(60), stdout.next_line())
        .await
        .expect("stdout closes once the client leaves")
    {
        lines.push(line);
    }
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
    for line in &lines {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON-RPC: {line:?}: {e}"));
        assert_eq!(v["jsonrpc"], "2.0", "{line}");
    }
    assert!(lines.iter().any(|l| l.contains("logged")), "{lines:?}");
    let errors = errors.await.unwrap();
    assert!(errors.contains("DEBUG"), "the debug logs went to stderr: {errors}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_names_the_box_and_a_killed_server_leaves_it_to_its_lifetime() {
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("transport.toml");
    std::fs::write(
        &config,
        "hands = \"sandbox\"\n[environments.sandbox]\nprovider = \"local\"\nmax_lifetime = \"3s\"\nenv = { MODE = \"from-config\" }\n",
    )
    .unwrap();
    let s = start(home.path(), &["--config", config.to_str().unwrap()]).await;
    let out = call(&s, "bash", json!({"command": "echo $MODE"})).await;
    assert_eq!(text(&out).trim(), "from-config");
    assert_eq!(local_boxes(home.path()), 1);
    // Killed, the server ends nothing itself: the box's own lifetime does.
    let Server { client, mut child } = s;
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    drop(client);
    let mut gone = false;
    for _ in 0..100 {
        if local_boxes(home.path()) == 0 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the box ended by its 3 s lifetime");
}

/// The names of the local boxes under `home`.
fn local_box_names(home: &Path) -> Vec<String> {
    std::fs::read_dir(home.join("boxes"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

async fn until_boxes(home: &Path, n: usize, what: &str) {
    for _ in 0..600 {
        if local_boxes(home) == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: {} local boxes, not {n}, after 30 s", local_boxes(home));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_pool_the_first_tool_call_takes_a_ready_box_and_the_rest_end_with_the_server() {
    use tokio::io::AsyncBufReadExt;
    let home = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args(["mcp", "--provider", "local", "--lifetime", "10m", "--pool", "2"])
        .env("AGENTBOX_HOME", home.path())
        .env_remove("AGENTBOX_RUNNER")
        .env_remove("AGENTBOX_PROVIDER")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut errors = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
    let client = ().serve((stdout, stdin)).await.expect("the server initializes");
    let s = Server { client, child };
    // The server says when its ready boxes are there; then the first call takes one.
    let warm = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = errors.next_line().await.unwrap() {
            eprintln!("{line}");
            if line.contains("the pool is warm") {
                return;
            }
        }
        panic!("the server's stderr ended before its pool was warm");
    });
    warm.await.expect("the pool warm within 60 s");
    tokio::spawn(async move {
        while let Ok(Some(line)) = errors.next_line().await {
            eprintln!("{line}");
        }
    });
    let ready = local_box_names(home.path());
    assert_eq!(ready.len(), 2, "{ready:?}");
    let out = call(&s, "bash", json!({"command": "pwd"})).await;
    let pwd = text(&out);
    assert!(
        ready.iter().any(|r| pwd.contains(r.as_str())),
        "{pwd:?} is in none of the ready boxes {ready:?}"
    );
    until_boxes(home.path(), 3, "the pool filled again after the hand-out").await;
    leave(s).await;
    assert_eq!(
        local_boxes(home.path()),
        0,
        "the box and the ready ones went with the client"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configs_pool_warms_its_environment_and_a_pool_past_64_is_refused() {
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("transport.toml");
    std::fs::write(
        &config,
        "hands = \"sandbox\"\n[environments.sandbox]\nprovider = \"local\"\nmax_lifetime = \"10m\"\npool = 1\n",
    )
    .unwrap();
    let s = start(home.path(), &["--config", config.to_str().unwrap()]).await;
    until_boxes(home.path(), 1, "the config's pool of 1").await;
    leave(s).await;
    assert_eq!(local_boxes(home.path()), 0);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args(["mcp", "--provider", "local", "--pool", "65"])
        .env("AGENTBOX_HOME", home.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--pool") && err.contains("65"), "{err}");
}

/// A process's resident memory in bytes, from `/proc/PID/status` (`VmRSS`, in kB).
fn rss_of(status: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or_else(|| panic!("no VmRSS in {status:?}"))
}

/// Rounds of write, read and bash: three tool calls each.
async fn soak_rounds(s: &Server, rounds: usize) {
    for i in 0..rounds {
        let content = format!("round {i}\n");
        let w = call(s, "write", json!({"path": "soak.txt", "content": content})).await;
        assert_eq!(w.is_error, Some(false), "{}", text(&w));
        let r = call(s, "read", json!({"path": "soak.txt"})).await;
        assert!(text(&r).contains(&content), "{}", text(&r));
        let b = call(s, "bash", json!({"command": "echo ok"})).await;
        assert_eq!(text(&b).trim(), "ok");
    }
}

/// The resident memory of the runner in the box: the parent of a bash the runner started.
async fn runner_rss(s: &Server) -> u64 {
    let b = call(
        s,
        "bash",
        json!({"command": "tr '\\0' ' ' < /proc/$PPID/cmdline; echo; cat /proc/$PPID/status"}),
    )
    .await;
    let out = text(&b);
    assert!(
        out.lines().next().unwrap_or_default().contains("serve"),
        "the runner is bash's parent: {out}"
    );
    rss_of(&out)
}

/// Memory stays flat over a long session: thousands of tool calls (write, read, bash) on a
/// namespace box, the server's and the in-box runner's resident memory measured after a
/// warm-up and at the end. Each call used to keep about 2.6 KB in the server. A bound on
/// memory per call, with room for the allocator's noise, not on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_stays_flat_over_thousands_of_tool_calls() {
    const WARM: usize = 200;
    const ROUNDS: usize = 2000;
    const BOUND: u64 = 300;
    let home = tempfile::tempdir().unwrap();
    let s = start(home.path(), &["--provider", "namespace", "--lifetime", "10m"]).await;
    let pid = s.child.id().expect("the server runs");
    let server_rss = || rss_of(&std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap());
    soak_rounds(&s, WARM).await;
    let (server0, runner0) = (server_rss(), runner_rss(&s).await);
    soak_rounds(&s, ROUNDS).await;
    let (server1, runner1) = (server_rss(), runner_rss(&s).await);
    let calls = (ROUNDS * 3 + 1) as u64;
    let per_call = |a: u64, b: u64| b.saturating_sub(a) / calls;
    eprintln!(
        "soak: {calls} calls: server {server0} -> {server1} bytes ({} per call), runner {runner0} -> {runner1} bytes ({} per call)",
        per_call(server0, server1),
        per_call(runner0, runner1)
    );
    assert!(
        per_call(server0, server1) <= BOUND,
        "the server grew from {server0} to {server1} bytes over {calls} tool calls: over {BOUND} bytes a call"
    );
    assert!(
        per_call(runner0, runner1) <= BOUND,
        "the box's runner grew from {runner0} to {runner1} bytes over {calls} tool calls: over {BOUND} bytes a call"
    );
    leave(s).await;
}

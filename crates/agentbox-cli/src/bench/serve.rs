//! `agentbox bench serve`: the service measured beside its baselines, in one run.
//!
//! - a tool call (`bash true`) through the service's HTTP API, beside the same call through
//!   `agentbox mcp` (a child process over stdio, as an MCP client runs it) and a program
//!   spawned on the host;
//! - 10,000 requests with a wrong key beside 10,000 with none, interleaved: the two should
//!   cost the same (a key is found by its hash, whatever was sent);
//! - 200 WebSocket streams of one process at once, beside one;
//! - boxes made and ended through the service beside the same through the provider, with this
//!   process's memory before and after.
//!
//! The server runs in this process on a loopback port, its boxes of `--provider` (the default
//! of `box create` without it).

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentbox_core::{Ctx, Error, Result, Spec};
use agentbox_server::{Keys, Limits, ServerOptions};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use super::BenchArgs;
use super::measure::{Pair, measure, pair, print_pairs};
use super::service::Service;

/// Requests of each kind in the wrong-key comparison.
const KEY_REQUESTS: u32 = 10_000;
/// Streams open at once.
const STREAMS: usize = 200;

/// This process's resident memory, in MiB (Linux's `/proc/self/status`).
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// `agentbox mcp` over stdio, one JSON-RPC message a line.
struct Mcp {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    id: u64,
}

impl Mcp {
    async fn start(provider: &str) -> Result<Self> {
        let exe = std::env::current_exe().map_err(|e| Error::io(e, "this program's path"))?;
        let mut child = tokio::process::Command::new(exe)
            .args(["mcp", "--provider", provider, "--lifetime", "15m"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::io(e, "starting agentbox mcp"))?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| Error::unknown("agentbox mcp: no stdin"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| Error::unknown("agentbox mcp: no stdout"))?;
        let mut m = Mcp {
            child,
            stdin,
            lines: tokio::io::BufReader::new(stdout).lines(),
            id: 0,
        };
        m.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}),
        )
        .await?;
        m.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await?;
        Ok(m)
    }

    async fn send(&mut self, v: Value) -> Result<()> {
        let mut line = v.to_string();
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|e| Error::io(e, "writing to agentbox mcp"))
    }

    async fn request(&mut self, method: &str, params: Value) -> Result<Value> {
        self.id += 1;
        let id = self.id;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await?;
        let deadline = Duration::from_secs(300);
        loop {
            let line = tokio::time::timeout(deadline, self.lines.next_line())
                .await
                .map_err(|_| Error::timeout(format!("agentbox mcp: no answer to {method} within 300 s")))?
                .map_err(|e| Error::io(e, "reading agentbox mcp"))?
                .ok_or_else(|| Error::unknown("agentbox mcp ended"))?;
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if v["id"] == id {
                if v.get("error").is_some() {
                    return Err(Error::unknown(format!("agentbox mcp: {method}: {}", v["error"])));
                }
                return Ok(v["result"].clone());
            }
        }
    }

    /// Close its stdin, as a client that leaves does, and wait for it to end (and end its box).
    async fn end(mut self) {
        drop(self.stdin);
        if tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .is_err()
        {
            eprintln!("agentbox bench serve: agentbox mcp did not end within 60 s of its stdin's end");
        }
    }

    async fn tool(&mut self, name: &str, args: Value) -> Result<()> {
        let r = self
            .request("tools/call", json!({"name": name, "arguments": args}))
            .await?;
        if r["isError"] == true {
            return Err(Error::unknown(format!("agentbox mcp: {name}: {}", r["content"])));
        }
        Ok(())
    }
}

/// See the [module documentation](self).
pub(super) async fn serve(args: BenchArgs) -> Result<()> {
    let environment = crate::boxes::environment()?;
    let provider = crate::boxes::chosen(args.provider.as_deref(), &environment).await?;
    let provider_name = provider.name.to_string();
    let keys = Arc::new(Keys::in_memory()?);
    let (_, key) = keys.add("bench", true, Limits::default()).await?;
    let mut options = ServerOptions::new(keys);
    options.environment = environment;
    options.default_provider = provider_name.clone();
    let app = agentbox_server::router(options);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| Error::io(e, "binding a loopback port"))?;
    let addr = listener.local_addr().map_err(|e| Error::io(e, "the bound address"))?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(agentbox_server::serve(listener, app, async {
        let _ = stopped.await;
    }));
    let s = Service::new(format!("http://{addr}"), key)?;
    let n = args.iterations;
    let mut pairs: Vec<Pair> = Vec::new();
    let mut memory = Vec::new();
    eprintln!("agentbox bench serve: {provider_name} boxes, {n} samples of each side, interleaved");

    // A tool call: the service beside agentbox mcp, and a host spawn.
    let made = s
        .call(
            reqwest::Method::POST,
            "/v1/boxes",
            Some(json!({"spec": {"max_lifetime_ms": 900_000}})),
        )
        .await?;
    let id = made["id"].as_str().unwrap_or_default().to_string();
    let tool_path = format!("/v1/boxes/{id}/tools/bash");
    let mut mcp_child = Mcp::start(&provider_name).await?;
    let mcp = tokio::sync::Mutex::new(&mut mcp_child);
    let (host, mcp_side) = measure(
        n,
        || async {
            let st = tokio::process::Command::new("sh")
                .args(["-c", "true"])
                .status()
                .await
                .map_err(|e| Error::io(e, "sh -c true"))?;
            if st.success() {
                Ok(())
            } else {
                Err(Error::unknown("sh -c true failed"))
            }
        },
        || async { mcp.lock().await.tool("bash", json!({"command": "true"})).await },
    )
    .await?;
    let (mcp_again, service) = measure(
        n,
        || async { mcp.lock().await.tool("bash", json!({"command": "true"})).await },
        || async {
            let r = s
                .call(reqwest::Method::POST, &tool_path, Some(json!({"command": "true"})))
                .await?;
            if r["isError"] == true {
                return Err(Error::unknown(format!("bash through the service: {r}")));
            }
            Ok(())
        },
    )
    .await?;
    mcp_child.end().await;
    pairs.push(pair(
        "tool call: agentbox mcp vs host",
        "sh -c true spawned here",
        &format!("bash true through agentbox mcp (stdio) in a {provider_name} box"),
        host,
        mcp_side,
    ));
    pairs.push(pair(
        "tool call: service vs mcp",
        &format!("bash true through agentbox mcp (stdio) in a {provider_name} box"),
        &format!("bash true through POST {tool_path}"),
        mcp_again,
        service,
    ));

    // A wrong key beside none: interleaved one by one, with no pause between (the
    // settling pause of the other sides would make this one minutes long).
    let path = format!("{}/v1/boxes", s.url);
    let unauthenticated = |r: reqwest::Result<reqwest::Response>, what: &str| match r {
        Ok(r) if r.status() == 401 => Ok(()),
        Ok(r) => Err(Error::unknown(format!("{what}: {} rather than 401", r.status()))),
        Err(e) => Err(Error::transfer_failed(format!("{what}: {e}"))),
    };
    let (mut none_ms, mut wrong_ms) = (Vec::new(), Vec::new());
    for _ in 0..KEY_REQUESTS {
        let t = Instant::now();
        unauthenticated(s.http.get(&path).send().await, "a missing key")?;
        none_ms.push(t.elapsed());
        let t = Instant::now();
        let wrong = s
            .http
            .get(&path)
            .bearer_auth("abk_not-a-key-this-server-holds-00000000000");
        unauthenticated(wrong.send().await, "a wrong key")?;
        wrong_ms.push(t.elapsed());
    }
    let (none, wrong) = (super::measure::stats(none_ms), super::measure::stats(wrong_ms));
    pairs.push(pair(
        "10,000 requests: wrong key vs none",
        "no Authorization header (401)",
        "a wrong key (401)",
        none,
        wrong,
    ));

    // Streams: 200 at once beside one, each reading a process's whole output.
    let p = s
        .call(
            reqwest::Method::POST,
            &format!("/v1/boxes/{id}/processes"),
            Some(json!({"command": "seq 1 20000"})),
        )
        .await?;
    let handle = p["handle"].as_u64().unwrap_or_default();
    let ws_url = format!("ws://{addr}/v1/boxes/{id}/processes/{handle}/stream");
    let read_stream = || {
        let (url, key) = (ws_url.clone(), s.key.clone());
        async move { read_whole_stream(&url, &key, addr).await }
    };
    let streams_rounds = n.clamp(3, 10);
    let before = rss_mib();
    let (one, many) = measure(streams_rounds, read_stream, || async {
        let all = futures_util::future::join_all((0..STREAMS).map(|_| read_stream())).await;
        all.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    })
    .await?;
    pairs.push(pair(
        "200 streams at once vs one",
        "one WebSocket stream of a 108,894-byte output",
        "200 of them at once",
        one,
        many,
    ));
    memory.push(format!(
        "around the streams: {before:.1} MiB before, {:.1} MiB after",
        rss_mib()
    ));
    s.call(reqwest::Method::DELETE, &format!("/v1/boxes/{id}"), None)
        .await?;

    // Boxes made and ended: through the service beside the provider itself.
    let count = (n as usize * 10).min(1000);
    let direct = crate::boxes::provider(&provider_name).await?;
    let spec = Spec::new(Duration::from_secs(600)).label("agentbox-bench", "serve");
    let ctx = Ctx::background().with_timeout(Duration::from_secs(3600));
    let before = rss_mib();
    let t = Instant::now();
    for _ in 0..count {
        let b = direct.create(&spec, &ctx).await?;
        b.destroy(&ctx).await?;
    }
    let direct_ms = t.elapsed().as_secs_f64() * 1000.0 / count as f64;
    let t = Instant::now();
    for _ in 0..count {
        let made = s
            .call(
                reqwest::Method::POST,
                "/v1/boxes",
                Some(json!({"spec": {"max_lifetime_ms": 600_000}})),
            )
            .await?;
        let id = made["id"].as_str().unwrap_or_default();
        s.call(reqwest::Method::DELETE, &format!("/v1/boxes/{id}"), None)
            .await?;
    }
    let service_ms = t.elapsed().as_secs_f64() * 1000.0 / count as f64;
    let stat = |ms: f64| super::measure::Stats { median: ms, p90: ms };
    pairs.push(pair(
        &format!("{count} boxes made and ended"),
        &format!("{provider_name} create + destroy through the provider (mean)"),
        "POST /v1/boxes + DELETE through the service (mean)",
        stat(direct_ms),
        stat(service_ms),
    ));
    memory.push(format!(
        "around {count} boxes through the service: {before:.1} MiB before, {:.1} MiB after",
        rss_mib()
    ));
    let _ = stop.send(());
    let _ = served.await;
    print_pairs(&pairs, &[], args.json)?;
    if !args.json {
        for m in memory {
            println!("memory (this process's resident set) {m}");
        }
    }
    Ok(())
}

/// Open a stream of a process from its start and read it to its `exit` message.
async fn read_whole_stream(url: &str, key: &str, addr: std::net::SocketAddr) -> Result<()> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = url
        .into_client_request()
        .map_err(|e| Error::invalid(format!("{url}: {e}")))?;
    let auth = format!("Bearer {key}")
        .parse()
        .map_err(|_| Error::invalid("the key is not a header value"))?;
    req.headers_mut().insert("authorization", auth);
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| Error::io(e, "connecting to the service"))?;
    let (mut ws, _) = tokio_tungstenite::client_async(req, tcp)
        .await
        .map_err(|e| Error::transfer_failed(format!("a stream: {e}")))?;
    while let Some(m) = tokio::time::timeout(Duration::from_secs(300), ws.next())
        .await
        .map_err(|_| Error::timeout("a stream: no message within 300 s"))?
    {
        let m = m.map_err(|e| Error::transfer_failed(format!("a stream: {e}")))?;
        if let tokio_tungstenite::tungstenite::Message::Text(t) = m {
            let v: Value = serde_json::from_str(&t).unwrap_or(Value::Null);
            match v["type"].as_str() {
                Some("exit") => return Ok(()),
                Some("error") => return Err(Error::unknown(format!("a stream: {v}"))),
                _ => {}
            }
        }
    }
    Err(Error::unknown("a stream ended before its program's exit"))
}

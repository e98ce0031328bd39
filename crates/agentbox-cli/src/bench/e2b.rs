//! `agentbox bench e2b`: E2B's SDK against `agentbox serve --e2b`, beside agentbox's own API,
//! in one run.
//!
//! - a sandbox made and a command run in it (`Sandbox.create()` then `commands.run("true")`,
//!   by E2B's Python SDK), beside a box made and the same command run through the service's
//!   own API (`POST /v1/boxes` then `POST /v1/boxes/{id}/exec`). Ending it is not timed on
//!   either side;
//! - a command's 16 MiB of output streamed to the client (the SDK's `on_stdout`), beside the
//!   same output read whole from the service's own `exec`, both in one box made before: the
//!   rate of each is printed beside the times.
//!
//! The server runs in this process (both APIs on loopback ports, its boxes of `--provider`);
//! the SDK runs in a child Python (`--python`, which must import `e2b`), told by one line on
//! its stdin what to do and answering how long it took, so Python's start is never timed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentbox_core::{Error, Result};
use agentbox_server::{Keys, Limits, ServerOptions};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use super::BenchArgs;
use super::measure::{Pair, Stats, pair, print_pairs, stats};
use super::service::Service;

/// The bytes of output streamed by each side of the streaming comparison.
const STREAMED: u64 = 16 << 20;

/// The command both sides stream: [`STREAMED`] bytes of text.
fn streamed_command() -> String {
    format!("yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c {STREAMED}")
}

/// The child's program: one request a line on stdin (`create-run`, `open`, `stream`,
/// `close`), one JSON answer a line on stdout.
const SAMPLER: &str = r#"
import json, sys, time
from e2b import Sandbox

box = None
for line in sys.stdin:
    what, _, arg = line.strip().partition(" ")
    try:
        if what == "create-run":
            t = time.perf_counter()
            s = Sandbox.create(timeout=300)
            r = s.commands.run("true")
            ms = (time.perf_counter() - t) * 1000
            s.kill()
            answer = {"ms": ms, "exit": r.exit_code}
        elif what == "open":
            box = Sandbox.create(timeout=900)
            answer = {"ok": True}
        elif what == "stream":
            got = [0]
            def count(chunk):
                got[0] += len(chunk.encode())
            t = time.perf_counter()
            r = box.commands.run(arg, on_stdout=count, timeout=300)
            ms = (time.perf_counter() - t) * 1000
            answer = {"ms": ms, "exit": r.exit_code, "bytes": got[0]}
        elif what == "close":
            box.kill()
            answer = {"ok": True}
        else:
            answer = {"error": "unknown request " + what}
    except Exception as e:
        answer = {"error": type(e).__name__ + ": " + str(e)}
    print(json.dumps(answer), flush=True)
"#;

/// E2B's Python SDK in a child process.
struct Sdk {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Sdk {
    async fn start(python: &str, url: &str, key: &str) -> Result<Self> {
        let mut child = tokio::process::Command::new(python)
            .args(["-c", SAMPLER])
            .env("E2B_API_URL", url)
            .env("E2B_SANDBOX_URL", url)
            .env("E2B_API_KEY", key)
            // Plain HTTP on loopback: HTTP/1.1, as the SDK speaks it without TLS.
            .env("E2B_HTTP_VERSION", "1.1")
            .env("NO_PROXY", "127.0.0.1")
            .env_remove("E2B_DOMAIN")
            .env_remove("E2B_DEBUG")
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .env_remove("ALL_PROXY")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::io(e, format!("--python {python}: starting it")))?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| Error::unknown("the SDK's child: no stdin"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| Error::unknown("the SDK's child: no stdout"))?;
        Ok(Sdk {
            child,
            stdin,
            lines: tokio::io::BufReader::new(stdout).lines(),
        })
    }

    /// Ask one thing; its answer, or the error it names.
    async fn ask(&mut self, request: &str) -> Result<Value> {
        let line = format!("{request}\n");
        self.stdin.write_all(line.as_bytes()).await.map_err(|e| {
            Error::io(
                e,
                "writing to the SDK's child (does --python import e2b? its error is above)",
            )
        })?;
        let answer = tokio::time::timeout(Duration::from_secs(300), self.lines.next_line())
            .await
            .map_err(|_| Error::timeout(format!("the SDK's child: no answer to {request:?} within 300 s")))?
            .map_err(|e| Error::io(e, "reading the SDK's child"))?
            .ok_or_else(|| Error::unknown("the SDK's child ended (does --python import e2b? its error is above)"))?;
        let v: Value = serde_json::from_str(&answer)
            .map_err(|e| Error::unknown(format!("the SDK's child said {answer:?}: {e}")))?;
        if let Some(e) = v.get("error") {
            return Err(Error::unknown(format!("E2B's SDK: {request}: {e}")));
        }
        Ok(v)
    }

    /// A timed request's time, its command's exit checked.
    async fn timed(&mut self, request: &str) -> Result<(Duration, Value)> {
        let v = self.ask(request).await?;
        if v["exit"] != 0 {
            return Err(Error::unknown(format!("E2B's SDK: {request}: {v}")));
        }
        let ms = v["ms"]
            .as_f64()
            .ok_or_else(|| Error::unknown(format!("E2B's SDK: {request}: no time in {v}")))?;
        Ok((Duration::from_secs_f64(ms / 1000.0), v))
    }

    async fn end(mut self) {
        drop(self.stdin);
        let _ = tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await;
    }
}

/// The service's own API, over its key: what the SDK's side is measured beside.
struct Native(Service);

impl Native {
    async fn make(&self) -> Result<String> {
        let made = self
            .0
            .call(
                reqwest::Method::POST,
                "/v1/boxes",
                Some(json!({"spec": {"max_lifetime_ms": 900_000}})),
            )
            .await?;
        made["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| Error::unknown(format!("POST /v1/boxes: no id in {made}")))
    }

    async fn end(&self, id: &str) -> Result<()> {
        self.0
            .call(reqwest::Method::DELETE, &format!("/v1/boxes/{id}"), None)
            .await
            .map(|_| ())
    }

    /// A box made and `true` run in it: the time of both; the box is then ended, untimed.
    async fn create_run(&self) -> Result<Duration> {
        let t = Instant::now();
        let id = self.make().await?;
        let r = self
            .0
            .call(
                reqwest::Method::POST,
                &format!("/v1/boxes/{id}/exec"),
                Some(json!({"command": "true"})),
            )
            .await?;
        let took = t.elapsed();
        self.end(&id).await?;
        if r["exit_code"] != 0 {
            return Err(Error::unknown(format!("exec true through the service: {r}")));
        }
        Ok(took)
    }

    /// The streamed command run in box `id` through `exec`, its whole output read: the time,
    /// and the bytes read. (`exec`, not a process's WebSocket stream: that stream reads what
    /// the box keeps of a program's output, a window a program writing this fast outruns.)
    async fn stream(&self, id: &str) -> Result<(Duration, u64)> {
        let t = Instant::now();
        let r = self
            .0
            .call(
                reqwest::Method::POST,
                &format!("/v1/boxes/{id}/exec"),
                Some(json!({"command": streamed_command(), "max_output": STREAMED})),
            )
            .await?;
        let took = t.elapsed();
        if r["exit_code"] != 0 {
            return Err(Error::unknown(format!(
                "exec of {STREAMED} bytes of output: exit {}",
                r["exit_code"]
            )));
        }
        Ok((took, r["stdout"].as_str().map_or(0, str::len) as u64))
    }
}

/// Megabytes a second, of [`STREAMED`] bytes in `ms`.
fn rate(ms: f64) -> f64 {
    STREAMED as f64 / (1 << 20) as f64 / (ms / 1000.0)
}

/// See the [module documentation](self).
pub(super) async fn e2b(args: BenchArgs) -> Result<()> {
    let environment = crate::boxes::environment()?;
    let provider = crate::boxes::chosen(args.provider.as_deref(), &environment).await?;
    let provider_name = provider.name.to_string();
    let keys = Arc::new(Keys::in_memory()?);
    let (_, key) = keys.add("bench", false, Limits::default()).await?;
    let mut options = ServerOptions::new(keys);
    options.environment = environment;
    options.default_provider = provider_name.clone();
    let service = agentbox_server::service(options);
    let bind = || async {
        tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| Error::io(e, "binding a loopback port"))
    };
    let (api_listener, e2b_listener) = (bind().await?, bind().await?);
    let addr = api_listener
        .local_addr()
        .map_err(|e| Error::io(e, "the bound address"))?;
    let e2b_addr = e2b_listener
        .local_addr()
        .map_err(|e| Error::io(e, "the bound address"))?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let served = |listener, app, mut stopped: tokio::sync::watch::Receiver<bool>| {
        tokio::spawn(agentbox_server::serve(listener, app, async move {
            let _ = stopped.wait_for(|s| *s).await;
        }))
    };
    let api_served = served(api_listener, service.api.clone(), stopped.clone());
    let e2b_served = served(e2b_listener, service.e2b.clone(), stopped);
    let native = Native(Service::new(format!("http://{addr}"), key.clone())?);
    let python = args.python.clone().unwrap_or_else(|| "python3".into());
    let n = args.iterations;
    eprintln!(
        "agentbox bench e2b: {provider_name} boxes, E2B's SDK in {python}, {n} samples of each side, interleaved"
    );
    let measured = measure_both(&native, &python, &format!("http://{e2b_addr}"), &key, n).await;
    let _ = stop.send(true);
    let _ = api_served.await;
    let _ = e2b_served.await;
    service.end_e2b().await;
    let (pairs, rates) = measured?;
    print_pairs(&pairs, &[], args.json)?;
    if !args.json {
        println!("{rates}");
    }
    Ok(())
}

/// Both comparisons, interleaved sample by sample; the pairs and a line of the streams' rates.
async fn measure_both(native: &Native, python: &str, e2b_url: &str, key: &str, n: u32) -> Result<(Vec<Pair>, String)> {
    let mut sdk = Sdk::start(python, e2b_url, key).await?;
    let measured = interleave(native, &mut sdk, n).await;
    sdk.end().await;
    let (made, streamed) = measured?;
    let pairs = vec![
        pair(
            "create then run true: e2b vs own",
            "POST /v1/boxes + POST /v1/boxes/{id}/exec true (agentbox's API)",
            "Sandbox.create() + commands.run(\"true\") (E2B's Python SDK)",
            made.0,
            made.1,
        ),
        pair(
            "16 MiB of output streamed",
            "POST /v1/boxes/{id}/exec, its output whole (agentbox's API)",
            "commands.run(on_stdout=...) (E2B's Python SDK)",
            streamed.0,
            streamed.1,
        ),
    ];
    let rates = format!(
        "streamed (median): {:.1} MB/s through agentbox's API, {:.1} MB/s through E2B's SDK",
        rate(streamed.0.median),
        rate(streamed.1.median)
    );
    Ok((pairs, rates))
}

type Sides = ((Stats, Stats), (Stats, Stats));

async fn interleave(native: &Native, sdk: &mut Sdk, n: u32) -> Result<Sides> {
    // One warm-up of each side, not counted.
    native.create_run().await?;
    sdk.timed("create-run").await?;
    let (mut own, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..n {
        own.push(native.create_run().await?);
        tokio::time::sleep(super::measure::SETTLE).await;
        theirs.push(sdk.timed("create-run").await?.0);
        tokio::time::sleep(super::measure::SETTLE).await;
    }
    let made = (stats(own), stats(theirs));

    let id = native.make().await?;
    sdk.ask("open").await?;
    let command = streamed_command();
    let streamed = async {
        let (mut own, mut theirs) = (Vec::new(), Vec::new());
        for i in 0..=n {
            let (took, bytes) = native.stream(&id).await?;
            if bytes != STREAMED {
                return Err(Error::unknown(format!("exec gave {bytes} bytes of {STREAMED}")));
            }
            let (sdk_took, v) = sdk.timed(&format!("stream {command}")).await?;
            if v["bytes"] != STREAMED {
                return Err(Error::unknown(format!(
                    "E2B's SDK read {} bytes of {STREAMED}",
                    v["bytes"]
                )));
            }
            // The first of each is a warm-up.
            if i > 0 {
                own.push(took);
                theirs.push(sdk_took);
            }
        }
        Ok((stats(own), stats(theirs)))
    }
    .await;
    let closed = sdk.ask("close").await;
    native.end(&id).await?;
    let streamed = streamed?;
    closed?;
    Ok((made, streamed))
}

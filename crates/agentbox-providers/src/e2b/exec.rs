//! A program in an E2B box: envd's `process.Process/Start`, a stream of start, data, end and
//! keepalive events.
//!
//! The program runs behind the `sh` shim (`crate::shim`), so a missing program or directory is
//! `not_found` as everywhere. Its input goes by `SendInput` and ends with `CloseStdin`. The
//! stream has an idle deadline against envd's keepalives: a sandbox that dies under a program
//! is a typed error (`gone`, or `timeout` when it is silent) within three keepalives, never a
//! hang. A caller that gives up kills the program in the box (`SendSignal` SIGKILL) rather
//! than leaving it running.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use agentbox_core::{ByteWriter, Ctx, Error, ErrorCode, ExitStatus, Process, ProcessControl, Result};
use async_trait::async_trait;
use base64::Engine;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::oneshot;

use super::envd::Envd;
use crate::shim::{self, Header};

/// Bytes of stdin per `SendInput`.
const STDIN_CHUNK: usize = 256 * 1024;
/// Bytes held between the stream and a slow reader of stdout or stderr.
const PIPE_BUFFER: usize = 256 * 1024;
const START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Start `argv` in `cwd` with `env`.
pub(crate) async fn start(
    envd: &Envd,
    argv: &[String],
    cwd: &str,
    env: &std::collections::BTreeMap<String, String>,
    ctx: &Ctx,
) -> Result<Process> {
    let mut args = vec!["-c".to_string(), shim::SHIM.into(), "agentbox-exec".into(), cwd.into()];
    args.extend(argv.iter().cloned());
    let body = json!({
        "process": {"cmd": "/bin/sh", "args": args, "envs": env, "cwd": "/"},
        "stdin": true,
    });
    let mut stream = envd.stream(ctx, "/process.Process/Start", &body).await?;
    // The first event names the pid.
    let pid = match tokio::time::timeout(START_TIMEOUT, ctx.run(stream.next())).await {
        Err(_) => return Err(Error::timeout("e2b: the program did not start within 30 s")),
        Ok(r) => match r?? {
            Some(v) => v
                .pointer("/event/start/pid")
                .and_then(Value::as_u64)
                .ok_or_else(|| Error::unknown(format!("e2b: Start's first event was not its start: {v}")))?,
            None => return Err(Error::unknown("e2b: Start ended before the program started")),
        },
    };
    let (out_w, out_r) = tokio::io::duplex(PIPE_BUFFER);
    let (err_w, err_r) = tokio::io::duplex(PIPE_BUFFER);
    let (exit_tx, exit_rx) = oneshot::channel();
    let (header_tx, header_rx) = oneshot::channel::<Result<Header>>();
    let ended = Arc::new(AtomicBool::new(false));
    let flag = ended.clone();
    let watcher = envd.clone();
    tokio::spawn(async move {
        let mut header = Some(header_tx);
        let mut line = Vec::new();
        let (mut out, mut err) = (Some(out_w), Some(err_w));
        let outcome = loop {
            let v = match stream.next().await {
                Ok(Some(v)) => v,
                Ok(None) => break Err(Error::unknown("e2b: the program's stream ended with no end event")),
                Err(e) => break Err(e),
            };
            let Some(event) = v.get("event") else { continue };
            if let Some(d) = event.get("data") {
                let (which, text) = match (d.get("stdout"), d.get("stderr")) {
                    (Some(Value::String(s)), _) => (1, s),
                    (_, Some(Value::String(s))) => (2, s),
                    _ => continue,
                };
                let Ok(bytes) = B64.decode(text) else {
                    break Err(Error::unknown("e2b: output that is not base64"));
                };
                if which == 1 {
                    if let Some(h) = header.take() {
                        line.extend_from_slice(&bytes);
                        match shim::split_header(&line) {
                            Some(Ok((hd, rest))) => {
                                let rest = rest.to_vec();
                                let _ = h.send(Ok(hd));
                                put(&mut out, &rest).await;
                            }
                            Some(Err(e)) => {
                                let _ = h.send(Err(e));
                            }
                            None => header = Some(h),
                        }
                    } else {
                        put(&mut out, &bytes).await;
                    }
                } else {
                    put(&mut err, &bytes).await;
                }
            } else if let Some(end) = event.get("end") {
                break Ok(exit_of(end));
            }
            // start and keepalive: nothing to do (the keepalive reset the idle deadline).
        };
        flag.store(true, Ordering::SeqCst);
        let outcome = match outcome {
            Ok(s) => Ok(s),
            // The stream broke or went silent: a sandbox that is gone says so.
            Err(e) => match watcher
                .unary(
                    &Ctx::background().with_timeout(watcher.timeout),
                    "/process.Process/List",
                    &json!({}),
                )
                .await
            {
                Err(g) if g.code() == ErrorCode::Gone => Err(Error::gone(format!(
                    "e2b: sandbox {} ended while the program ran",
                    watcher.sandbox_id
                ))),
                _ => Err(e),
            },
        };
        if let Some(h) = header.take() {
            let _ = h.send(Err(match &outcome {
                Err(e) => e.clone(),
                Ok(s) => Error::unknown(format!(
                    "e2b: the program ended (exit {}) before its shim spoke",
                    s.code
                )),
            }));
        }
        let _ = exit_tx.send(outcome);
    });
    let header = match tokio::time::timeout(START_TIMEOUT, ctx.run(header_rx)).await {
        Ok(Ok(h)) => h.map_err(|_| Error::unknown("e2b: the exec ended before its shim spoke"))?,
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::timeout("e2b: the program did not start within 30 s")),
    };
    let header = match header {
        Ok(h) => h,
        Err(e) => {
            // Started in the box, given up on here: it is not left running.
            let body = json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"});
            let _ = envd
                .unary(
                    &Ctx::background().with_timeout(crate::transfer::CONTROL_TIMEOUT),
                    "/process.Process/SendSignal",
                    &body,
                )
                .await;
            return Err(e);
        }
    };
    match header {
        Header::Pid(_) => {}
        Header::NoCwd => {
            return Err(Error::not_found(format!(
                "working directory {cwd} does not exist in the box"
            )));
        }
        Header::NoProg => return Err(Error::not_found(format!("program {:?} not found in the box", argv[0]))),
    }
    let stdin = writer(envd.clone(), pid);
    let control = Arc::new(Control {
        envd: envd.clone(),
        pid,
        ended,
        exit: shim::ExitSlot::new(exit_rx),
    });
    Ok(Process::new(
        Some(stdin),
        Some(Box::pin(out_r)),
        Some(Box::pin(err_r)),
        control,
        ctx,
    ))
}

/// An end event as an exit: `exited` with its code, else the signal `status` names.
fn exit_of(end: &Value) -> ExitStatus {
    let code = end.get("exitCode").and_then(Value::as_i64).unwrap_or(0) as i32;
    if end.get("exited").and_then(Value::as_bool).unwrap_or(false) {
        return ExitStatus::exited(code);
    }
    let status = end.get("status").and_then(Value::as_str).unwrap_or("");
    let signal = match status.strip_prefix("signal: ").unwrap_or("") {
        "hangup" => 1,
        "interrupt" => 2,
        "quit" => 3,
        "terminated" => 15,
        "broken pipe" => 13,
        _ => 9,
    };
    ExitStatus::signaled(signal)
}

/// Write to an output pipe whose reader may have gone: the stream is still read to its end.
async fn put(w: &mut Option<DuplexStream>, bytes: &[u8]) {
    if let Some(s) = w.as_mut()
        && !bytes.is_empty()
        && s.write_all(bytes).await.is_err()
    {
        *w = None;
    }
}

/// The program's stdin: `SendInput` per chunk, `CloseStdin` at its end.
fn writer(envd: Envd, pid: u64) -> ByteWriter {
    let (w, mut r) = tokio::io::duplex(STDIN_CHUNK);
    tokio::spawn(async move {
        let ctx = Ctx::background();
        let mut buf = vec![0u8; STDIN_CHUNK];
        loop {
            let n: usize = r.read(&mut buf).await.unwrap_or_default();
            if n == 0 {
                break;
            }
            let body = json!({"process": {"pid": pid}, "input": {"stdin": B64.encode(&buf[..n])}});
            if let Err(e) = envd.unary(&ctx, "/process.Process/SendInput", &body).await {
                tracing::debug!(pid, "e2b: stdin: {e}");
                return;
            }
        }
        let body = json!({"process": {"pid": pid}});
        if let Err(e) = envd.unary(&ctx, "/process.Process/CloseStdin", &body).await {
            tracing::debug!(pid, "e2b: closing stdin: {e}");
        }
    });
    Box::pin(w)
}

struct Control {
    envd: Envd,
    pid: u64,
    ended: Arc<AtomicBool>,
    exit: shim::ExitSlot,
}

#[async_trait]
impl ProcessControl for Control {
    async fn wait(&self) -> Result<ExitStatus> {
        self.exit.wait().await
    }

    async fn signal(&self, signal: i32) -> Result<()> {
        if self.ended.load(Ordering::SeqCst) || !(1..=31).contains(&signal) {
            return Ok(());
        }
        let ctx = Ctx::background().with_timeout(crate::transfer::CONTROL_TIMEOUT);
        let r = match signal {
            9 | 15 => {
                let name = if signal == 9 {
                    "SIGNAL_SIGKILL"
                } else {
                    "SIGNAL_SIGTERM"
                };
                let body = json!({"process": {"pid": self.pid}, "signal": name});
                self.envd
                    .unary(&ctx, "/process.Process/SendSignal", &body)
                    .await
                    .map(|_| ())
            }
            // envd sends TERM and KILL alone: any other goes by the shell's own kill.
            _ => {
                let argv = [
                    "sh",
                    "-c",
                    r#"kill -s "$1" "$2""#,
                    "agentbox-kill",
                    &signal.to_string(),
                    &self.pid.to_string(),
                ]
                .map(String::from);
                let p = start(&self.envd, &argv, "/", &Default::default(), &ctx).await?;
                agentbox_core::finish(p, agentbox_core::FinishOptions::default())
                    .await
                    .map(|_| ())
            }
        };
        match r {
            Err(e) if matches!(e.code(), ErrorCode::NotFound | ErrorCode::Gone) => Ok(()),
            r => r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_events_are_exits_or_signals() {
        assert_eq!(
            exit_of(&json!({"exitCode": 3, "exited": true, "status": "exit status 3"})).code,
            3
        );
        let k = exit_of(&json!({"exitCode": -1, "exited": false, "status": "signal: killed"}));
        assert_eq!((k.code, k.signal), (137, Some(9)));
        assert_eq!(
            exit_of(&json!({"exited": false, "status": "signal: terminated"})).signal,
            Some(15)
        );
    }
}

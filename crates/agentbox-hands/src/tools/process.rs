//! The tools over the processes a box keeps, started by `bash` with `background: true`:
//! `process_read {handle, after?, wait?}`, `process_write {handle, text?, close?}`,
//! `process_kill {handle, signal?}` and `process_list {}`.
//!
//! They work where the environment's box keeps processes (a box with a runner); elsewhere each
//! refuses, saying why. A process is named by its handle, its output by byte numbers: both
//! streams counted together from 0, so a reader that passes back the `next` it was given
//! misses nothing the box still keeps, and is told what it no longer keeps.

use std::borrow::Cow;
use std::time::Duration;

use agentbox_core::{Ctx, ErrorCode, ExitStatus, OutputRead, ProcessInfo, ProcessState, SIGNALS};
use async_trait::async_trait;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::{Value, json};

use super::args::{Count, Wait};
use super::truncate::{MAX_BYTES, MAX_LINES, format_size};
use super::{ToolError, ToolResult, Typed};
use crate::ExecutionEnv;

/// How long `process_read` waits for new output when not told.
const DEFAULT_WAIT: Duration = Duration::from_secs(5);
/// How long a call to the box's processes may take past the wait it asked for.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);
/// A command shown by `process_list` is cut past this many characters.
const MAX_COMMAND_CHARS: usize = 120;

/// `SIGTERM` for 15; `signal 42` for one the table does not name.
pub(super) fn signal_name(n: i32) -> String {
    match SIGNALS.iter().find(|(_, m)| *m == n) {
        Some((name, _)) => format!("SIG{name}"),
        None => format!("signal {n}"),
    }
}

/// A signal by name: `TERM`, with or without `SIG`, in any case, or its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Signal(pub i32);

impl<'de> Deserialize<'de> for Signal {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let upper = s.trim().to_ascii_uppercase();
        let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
        SIGNALS
            .iter()
            .find(|(name, n)| *name == bare || bare.parse::<i32>() == Ok(*n))
            .map(|(_, n)| Signal(*n))
            .ok_or_else(|| {
                let names: Vec<&str> = SIGNALS.iter().map(|(name, _)| *name).collect();
                D::Error::custom(format!(
                    "{s:?} is not a signal this box can send (one of {})",
                    names.join(", ")
                ))
            })
    }
}

impl JsonSchema for Signal {
    fn schema_name() -> Cow<'static, str> {
        "Signal".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let names: Vec<&str> = SIGNALS.iter().map(|(name, _)| *name).collect();
        json_schema!({"type": "string", "enum": names})
    }
}

/// The environment's processes, or the refusal the model reads: why this environment keeps
/// none.
async fn processes(
    env: &dyn ExecutionEnv,
    ctx: &Ctx,
) -> Result<std::sync::Arc<dyn agentbox_core::Processes>, ToolError> {
    env.processes(ctx)
        .await
        .map_err(|e| ToolError(format!("No processes here: {}", e.message())))
}

/// A box's failure about process `handle`, in the words a model acts on.
fn failed(e: agentbox_core::Error, handle: u64, ctx: &Ctx) -> ToolError {
    ToolError(match e.code() {
        ErrorCode::NotFound => format!("No process {handle} in this box. process_list shows the processes it keeps."),
        ErrorCode::Aborted => "Aborted".into(),
        ErrorCode::Timeout if ctx.err().is_some() => "Aborted: the call's deadline passed".into(),
        ErrorCode::Timeout => format!(
            "The box did not answer about process {handle} within {}s",
            ANSWER_TIMEOUT.as_secs()
        ),
        _ => format!("Process {handle}: {}", e.message()),
    })
}

/// How a process ended, as a sentence: `exited with code 0`, `was ended by SIGTERM (exit
/// code 143)`, `timed out and was killed (exit code 137)`.
pub(super) fn ended(state: &ProcessState) -> Option<String> {
    let by = |s: &ExitStatus| match s.signal {
        Some(sig) => format!("was ended by {} (exit code {})", signal_name(sig), s.code),
        None => format!("exited with code {}", s.code),
    };
    match state {
        ProcessState::Running => None,
        ProcessState::Exited { status } => Some(by(status)),
        ProcessState::TimedOut { status } => Some(format!("timed out and was killed (exit code {})", status.code)),
    }
}

fn state_json(state: &ProcessState) -> Value {
    match state {
        ProcessState::Running => json!({"state": "running"}),
        ProcessState::Exited { status } => json!({"state": "exited", "code": status.code, "signal": status.signal}),
        ProcessState::TimedOut { status } => {
            json!({"state": "timed_out", "code": status.code, "signal": status.signal})
        }
    }
}

pub(super) struct ProcessRead;

/// `process_read`'s arguments.
#[derive(Deserialize, JsonSchema)]
pub(super) struct ReadArgs {
    /// Handle of the process (from bash with background, or process_list)
    handle: Count,
    /// Byte number to read from: 0 for the start, or the next number a previous read gave (default: 0)
    after: Option<Count>,
    /// Seconds to wait for new output when there is none yet (default: 5, at most 300)
    wait: Option<Wait>,
}

/// The bytes a read got from `after` on, as one run: where it starts, its bytes, the
/// stretch before it the box let go (`(after, from)`), and whether it holds every chunk (a
/// hole between chunks ends the run there; the next read from its end is told of the hole).
fn gather(got: &OutputRead, after: u64) -> (u64, Vec<u8>, Option<(u64, u64)>, bool) {
    let mut at = after;
    if let Some(from) = got.gap_from {
        at = at.max(from);
    }
    let start = got.chunks.first().map_or(at, |c| c.seq.max(at));
    let lost = (start > after).then_some((after, start));
    let mut bytes = Vec::new();
    let mut pos = start;
    for c in &got.chunks {
        let end = c.seq + c.bytes.len() as u64;
        if end <= pos {
            continue; // what this reader already has
        }
        if c.seq > pos {
            return (start, bytes, lost, false);
        }
        bytes.extend_from_slice(&c.bytes[(pos - c.seq) as usize..]);
        pos = end;
    }
    (start, bytes, lost, true)
}

#[async_trait]
impl Typed for ProcessRead {
    type Args = ReadArgs;
    const NAME: &'static str = "process_read";
    const DESCRIPTION: &'static str = "Read the output of a process started by bash with background: true (stdout and stderr merged), from byte number after on. Waits up to wait seconds for new output when there is none yet. Returns at most 2000 lines or 50KB and the number to pass as after next time, and says how the process ended once it did and all its output was read.";
    const READ_ONLY: bool = true;

    async fn call(&self, env: &dyn ExecutionEnv, args: ReadArgs, ctx: &Ctx) -> Result<ToolResult, ToolError> {
        let handle = args.handle.0;
        let after = args.after.map_or(0, |a| a.0);
        let wait = args.wait.map_or(DEFAULT_WAIT, |w| w.0);
        let ps = processes(env, ctx).await?;
        let c = ctx.with_timeout(wait + ANSWER_TIMEOUT);
        let got = ps
            .read(handle, after, wait, MAX_BYTES + 1, &c)
            .await
            .map_err(|e| failed(e, handle, ctx))?;
        let (start, mut raw, lost, complete) = gather(&got, after);
        let whole = raw.len();
        let mut cut_by = None;
        if whole > MAX_BYTES {
            raw.truncate(MAX_BYTES);
            cut_by = Some(format!("{} limit", format_size(MAX_BYTES)));
        }
        if let Some((i, _)) = raw.iter().enumerate().filter(|(_, b)| **b == b'\n').nth(MAX_LINES - 1)
            && i + 1 < raw.len()
        {
            raw.truncate(i + 1);
            cut_by = Some(format!("{MAX_LINES} lines limit"));
        }
        // The exit counts once every byte before it was shown.
        let exit = if complete && raw.len() == whole { got.exit } else { None };
        // A character cut in two by the read's bound waits for the next read, whole.
        if exit.is_none()
            && let Err(e) = std::str::from_utf8(&raw)
            && e.error_len().is_none()
            && e.valid_up_to() > 0
        {
            raw.truncate(e.valid_up_to());
        }
        let next = if whole > 0 {
            start + raw.len() as u64
        } else {
            got.next.max(start)
        };
        let mut text = String::from_utf8_lossy(&raw).into_owned();
        if text.is_empty() {
            text = "(no new output)".into();
        }
        let mut notices = Vec::new();
        if let Some((a, b)) = lost {
            notices.push(format!(
                "[Output bytes {a}-{b} were let go before they were read: the box keeps only the last part of a process's output ({} lost)]",
                format_size((b - a) as usize)
            ));
        }
        notices.push(match (exit.as_ref().and_then(ended), &cut_by) {
            (Some(how), _) => format!("[Process {handle} {how}]"),
            (None, Some(by)) => format!("[Showing output bytes {start}-{next} ({by}). Use after={next} to continue.]"),
            (None, None) if !complete => {
                format!("[Showing output bytes {start}-{next}. Use after={next} to continue.]")
            }
            (None, None) => format!("[Process {handle} is still running. Use after={next} to read on.]"),
        });
        let details = json!({
            "handle": handle,
            "next": next,
            "lost": lost.map(|(a, b)| json!({"from": a, "to": b})),
            "truncated": cut_by.is_some(),
            "exit": exit.as_ref().map(state_json),
        });
        Ok(ToolResult::ok(format!("{text}\n\n{}", notices.join("\n")), details))
    }
}

pub(super) struct ProcessWrite;

/// `process_write`'s arguments.
#[derive(Deserialize, JsonSchema)]
pub(super) struct WriteArgs {
    /// Handle of the process
    handle: Count,
    /// Text to write to its stdin, as UTF-8 (include "\n" to end a line)
    text: Option<String>,
    /// Close its stdin after the text, so it reads end of file (default: false)
    close: Option<bool>,
}

#[async_trait]
impl Typed for ProcessWrite {
    type Args = WriteArgs;
    const NAME: &'static str = "process_write";
    const DESCRIPTION: &'static str = "Write text to the stdin of a process started by bash with background: true, and close its stdin when close is true (the process then reads end of file). Nothing is added to the text: include \"\\n\" to end a line.";
    const READ_ONLY: bool = false;

    async fn call(&self, env: &dyn ExecutionEnv, args: WriteArgs, ctx: &Ctx) -> Result<ToolResult, ToolError> {
        let handle = args.handle.0;
        let text = args.text.unwrap_or_default();
        let close = args.close.unwrap_or(false);
        let ps = processes(env, ctx).await?;
        ps.write(handle, text.as_bytes(), close, &ctx.with_timeout(ANSWER_TIMEOUT))
            .await
            .map_err(|e| failed(e, handle, ctx))?;
        let n = text.len();
        let message = match (n, close) {
            (0, true) => format!("Closed the stdin of process {handle}."),
            (_, true) => format!("Wrote {n} bytes to process {handle} and closed its stdin."),
            (_, false) => format!("Wrote {n} bytes to process {handle}."),
        };
        Ok(ToolResult::ok(
            message,
            json!({"handle": handle, "bytes": n, "closed": close}),
        ))
    }
}

pub(super) struct ProcessKill;

/// `process_kill`'s arguments.
#[derive(Deserialize, JsonSchema)]
pub(super) struct KillArgs {
    /// Handle of the process
    handle: Count,
    /// Signal to send to its process group (default: TERM)
    signal: Option<Signal>,
}

#[async_trait]
impl Typed for ProcessKill {
    type Args = KillArgs;
    const NAME: &'static str = "process_kill";
    const DESCRIPTION: &'static str = "Send a signal (TERM by default; KILL if it does not end) to the process group of a process started by bash with background: true. process_read then shows how it ended.";
    const READ_ONLY: bool = false;

    async fn call(&self, env: &dyn ExecutionEnv, args: KillArgs, ctx: &Ctx) -> Result<ToolResult, ToolError> {
        let handle = args.handle.0;
        let signal = args.signal.map_or(agentbox_core::SIGTERM, |s| s.0);
        let ps = processes(env, ctx).await?;
        ps.signal(handle, signal, &ctx.with_timeout(ANSWER_TIMEOUT))
            .await
            .map_err(|e| failed(e, handle, ctx))?;
        Ok(ToolResult::ok(
            format!(
                "Sent {} to process {handle}. Use process_read to see how it ended.",
                signal_name(signal)
            ),
            json!({"handle": handle, "signal": signal}),
        ))
    }
}

pub(super) struct ProcessList;

/// `process_list`'s arguments: none.
#[derive(Deserialize, JsonSchema)]
pub(super) struct ListArgs {}

#[async_trait]
impl Typed for ProcessList {
    type Args = ListArgs;
    const NAME: &'static str = "process_list";
    const DESCRIPTION: &'static str = "List the processes the box keeps (those bash started with background: true, running or ended): handle, state or exit code, when it started (UTC), how much output it wrote, and its command.";
    const READ_ONLY: bool = true;

    async fn call(&self, env: &dyn ExecutionEnv, _args: ListArgs, ctx: &Ctx) -> Result<ToolResult, ToolError> {
        let ps = processes(env, ctx).await?;
        let c = ctx.with_timeout(ANSWER_TIMEOUT);
        let list = ps.list(&c).await.map_err(|e| {
            ToolError(match e.code() {
                ErrorCode::Aborted => "Aborted".into(),
                _ => format!("Listing the box's processes: {}", e.message()),
            })
        })?;
        let details = json!({ "processes": list.iter().map(|p| json!({
            "handle": p.handle,
            "argv": p.argv,
            "startedMs": p.started_ms,
            "state": state_json(&p.state),
            "outputBytes": p.end,
        })).collect::<Vec<_>>() });
        if list.is_empty() {
            return Ok(ToolResult::ok("No processes".into(), details));
        }
        Ok(ToolResult::ok(table(&list), details))
    }
}

/// The processes as aligned columns, one a line.
fn table(list: &[ProcessInfo]) -> String {
    let mut rows = vec![[
        "handle".to_string(),
        "state".into(),
        "started".into(),
        "output".into(),
        "command".into(),
    ]];
    for p in list {
        let state = match &p.state {
            ProcessState::Running => "running".to_string(),
            ProcessState::Exited { status } => match status.signal {
                Some(s) => format!("{} ({})", signal_name(s), status.code),
                None => format!("exited {}", status.code),
            },
            ProcessState::TimedOut { status } => format!("timed out ({})", status.code),
        };
        rows.push([
            p.handle.to_string(),
            state,
            utc(p.started_ms),
            format_size(usize::try_from(p.end).unwrap_or(usize::MAX)),
            command(&p.argv),
        ]);
    }
    let widths: Vec<usize> = (0..4)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|r| {
            let mut line = String::new();
            for (i, w) in widths.iter().enumerate() {
                line.push_str(&format!("{:<w$}  ", r[i], w = *w));
            }
            line.push_str(&r[4]);
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A process's command as a model wrote it: the script of `SHELL -c SCRIPT` (without the
/// `exec 2>&1` bash puts in front), else the argv joined; on one line, cut past
/// [`MAX_COMMAND_CHARS`].
fn command(argv: &[String]) -> String {
    let s = match argv {
        [sh, c, script, ..] if sh.ends_with("sh") && c == "-c" => {
            script.strip_prefix(super::bash::MERGE).unwrap_or(script).to_string()
        }
        _ => argv.join(" "),
    };
    let one_line = s.replace('\n', "\\n");
    if one_line.chars().count() > MAX_COMMAND_CHARS {
        let cut: String = one_line.chars().take(MAX_COMMAND_CHARS).collect();
        format!("{cut}…")
    } else {
        one_line
    }
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS` in UTC.
pub(super) fn utc(ms: i64) -> String {
    agentbox_core::utc_seconds(ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentbox_core::{OutputChunk, Stream};

    #[test]
    fn times_print_as_utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_795_962_245_123), "2026-11-29 14:24:05");
        assert_eq!(utc(-1000), "1969-12-31 23:59:59");
    }

    #[test]
    fn signals_parse_by_name_with_or_without_sig_and_by_number() {
        let sig = |s: &str| serde_json::from_value::<Signal>(json!(s)).map(|s| s.0);
        assert_eq!(sig("TERM").unwrap(), 15);
        assert_eq!(sig("SIGKILL").unwrap(), 9);
        assert_eq!(sig("int").unwrap(), 2);
        assert_eq!(sig(" sighup ").unwrap(), 1);
        assert_eq!(sig("9").unwrap(), 9);
        let e = sig("FOO").unwrap_err().to_string();
        assert!(
            e.starts_with("\"FOO\" is not a signal this box can send (one of TERM, KILL, INT"),
            "{e}"
        );
        assert!(sig("99").is_err());
        assert_eq!(signal_name(15), "SIGTERM");
        assert_eq!(signal_name(42), "signal 42");
    }

    #[test]
    fn a_command_shows_as_written_on_one_line() {
        let a = |v: &[&str]| command(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(a(&["/bin/bash", "-c", "exec 2>&1\nnpm run dev"]), "npm run dev");
        assert_eq!(a(&["/bin/sh", "-c", "a\nb"]), "a\\nb");
        assert_eq!(a(&["sleep", "60"]), "sleep 60");
        let long = a(&["/bin/bash", "-c", &"x".repeat(500)]);
        assert_eq!(long.chars().count(), MAX_COMMAND_CHARS + 1);
        assert!(long.ends_with('…'));
    }

    fn chunk(seq: u64, bytes: &[u8]) -> OutputChunk {
        OutputChunk {
            seq,
            stream: Stream::Stdout,
            bytes: bytes.to_vec(),
        }
    }

    #[test]
    fn gather_keeps_one_run_and_names_what_was_let_go() {
        let read = |chunks, gap_from| OutputRead {
            chunks,
            gap_from,
            next: 0,
            exit: None,
        };
        // Contiguous from where it was asked.
        let (s, b, l, all) = gather(&read(vec![chunk(3, b"ab"), chunk(5, b"cd")], None), 3);
        assert_eq!((s, b.as_slice(), l, all), (3, &b"abcd"[..], None, true));
        // The box's gap; a hole between chunks ends the run.
        let (s, b, l, all) = gather(&read(vec![chunk(10, b"ab"), chunk(20, b"c")], Some(10)), 4);
        assert_eq!((s, b.as_slice(), l, all), (10, &b"ab"[..], Some((4, 10)), false));
        // A chunk that starts before `after` gives only what follows it.
        let (s, b, l, all) = gather(&read(vec![chunk(0, b"hello")], None), 2);
        assert_eq!((s, b.as_slice(), l, all), (2, &b"llo"[..], None, true));
        // Nothing new.
        let (s, b, l, all) = gather(&read(vec![], None), 7);
        assert_eq!((s, b.len(), l, all), (7, 0, None, true));
    }
}

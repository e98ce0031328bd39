//! The processes a box keeps, as a person uses them: `box exec -it` and `box shell` (a
//! terminal in the box), `box exec --detach`, `box ps`, `box logs` and `box attach`.

use std::time::Duration;

use agentbox_core::{
    Ctx, Error, OutputGap, Process, ProcessInfo, ProcessState, Processes, Result, Sandbox, SandboxId, Stream,
};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::term;

/// The most output bytes one `box logs` read asks for.
const LOGS_CHUNK: usize = 1 << 20;
/// How long one `box logs` read without --follow waits for bytes the process already wrote
/// (a read answers as soon as some come).
const LOGS_WAIT: Duration = Duration::from_secs(5);
/// How long one `box logs --follow` read waits for output before asking again.
const FOLLOW_WAIT: Duration = Duration::from_secs(30);
/// Past a read's own wait, how long the box may take to answer it.
const ANSWER_DEADLINE: Duration = Duration::from_secs(60);
/// How long a program killed because this process was signalled may take to be reaped.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// The box's processes, or the error a box without them answers.
pub(crate) fn of<'a>(b: &'a dyn Sandbox, id: &SandboxId) -> Result<&'a dyn Processes> {
    b.processes()
        .ok_or_else(|| Error::unsupported(format!("box {id}: this box keeps no processes: it has no runner")))
}

/// What a session does with this process's stdin.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Input {
    /// Every byte to the program's stdin; at its end, the program's stdin ends.
    Forward,
    /// None: the program's stdin is left alone.
    None,
}

/// What a signal to this process does to the program of a session.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnSignal {
    /// Kill it (an exec: the program is this command's).
    Kill,
    /// Let go of it; it runs on (an attach).
    LetGo,
}

/// The output, stdin, terminal and exit of `p` joined to this process's, until the program
/// ends (its exit code) or this process is signalled (128 + the signal). With `tty`, this
/// terminal is raw while it lasts (when stdin is one) and its size follows this one's.
pub(crate) async fn session(mut p: Process, tty: bool, input: Input, on_signal: OnSignal) -> Result<i32> {
    // Raw only once the program runs, so an exec's error is said on a terminal as it was.
    let _raw = if tty && input != Input::None && term::stdin_is_terminal() {
        Some(term::Raw::enter()?)
    } else {
        None
    };
    if tty {
        let resizer = p.killer();
        // A resize the box refuses (a program that just ended) is no reason to stop.
        tokio::spawn(async move {
            let Ok(mut winch) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()) else {
                return;
            };
            while winch.recv().await.is_some() {
                if let Some((rows, cols)) = term::size() {
                    let _ = resizer.resize(rows, cols).await;
                }
            }
        });
    }
    let stdin = p.stdin.take();
    // Ctrl-P Ctrl-Q lets go of an attached program's terminal, as with `docker attach`: the
    // only way out of a raw terminal that leaves the program running.
    let detach_keys = tty && on_signal == OnSignal::LetGo && term::is_raw();
    let (let_go, let_go_asked) = tokio::sync::oneshot::channel::<()>();
    if input == Input::None
        && let Some(w) = stdin
    {
        leave_open(w);
    } else if let Some(mut w) = stdin {
        tokio::spawn(async move {
            let mut chunks = stdin_chunks();
            let mut keys = DetachKeys::default();
            while let Some(c) = chunks.recv().await {
                let c = if detach_keys {
                    match keys.scan(&c) {
                        Some(c) => c,
                        None => {
                            leave_open(w);
                            let _ = let_go.send(());
                            return;
                        }
                    }
                } else {
                    c
                };
                if w.write_all(&c).await.is_err() || w.flush().await.is_err() {
                    return;
                }
            }
            let _ = w.close().await;
        });
    }
    let let_go_asked = async {
        if let_go_asked.await.is_err() {
            // No detach keys here (or stdin ended): only the program's end or a signal.
            std::future::pending::<()>().await;
        }
    };
    let out = p.stdout.take();
    let err = p.stderr.take();
    let ended = async {
        let (o, e) = tokio::join!(pump(out, tokio::io::stdout()), pump(err, tokio::io::stderr()));
        o?;
        e?;
        p.wait().await
    };
    let outcome = tokio::select! {
        r = ended => Ok(r),
        sig = signalled() => Err(Some(sig)),
        _ = let_go_asked => Err(None),
    };
    match outcome {
        Ok(Ok(status)) => Ok(status.code),
        Ok(Err(e)) if e.code() == agentbox_core::ErrorCode::Aborted => Ok(130),
        Ok(Err(e)) => Err(e),
        Err(None) => {
            term::restore();
            let handle = p.handle().map(|h| format!(" {h}")).unwrap_or_default();
            term::say(&format!("let go of process{handle}; it runs on"));
            Ok(0)
        }
        Err(Some(sig)) => {
            // The terminal first: whatever the box does next, the person gets theirs back.
            term::restore();
            if on_signal == OnSignal::Kill {
                let _ = p.kill().await;
                let _ = tokio::time::timeout(KILL_WAIT, p.wait()).await;
            }
            Ok(128 + sig)
        }
    }
}

/// Leave a program's stdin open as this process ends: a box may take the writer's drop for the
/// end of the program's stdin (the runner's client does), and a program let go of, detached
/// or attached to with `--no-stdin` must keep its stdin for the next attach. The writer is
/// never dropped; this process is about to exit.
pub(crate) fn leave_open(w: agentbox_core::Stdin) {
    std::mem::forget(w);
}

/// Finds Ctrl-P Ctrl-Q in what is typed, across reads: a Ctrl-P is held back until the key
/// after it says whether it was one.
#[derive(Default)]
struct DetachKeys {
    ctrl_p: bool,
}

impl DetachKeys {
    const CTRL_P: u8 = 0x10;
    const CTRL_Q: u8 = 0x11;

    /// The bytes of `typed` for the program, or `None` where the keys asked to let go.
    fn scan(&mut self, typed: &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(typed.len() + 1);
        for &b in typed {
            if std::mem::take(&mut self.ctrl_p) {
                if b == Self::CTRL_Q {
                    return None;
                }
                out.push(Self::CTRL_P);
            }
            if b == Self::CTRL_P {
                self.ctrl_p = true;
            } else {
                out.push(b);
            }
        }
        Some(out)
    }
}

/// The first of SIGINT, SIGTERM and SIGHUP this process gets, as its number. (In raw mode
/// Ctrl-C is a byte for the program, not a SIGINT.)
async fn signalled() -> i32 {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        // Without handlers the default actions stand: never answer.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => 2,
        _ = term.recv() => 15,
        _ = hup.recv() => 1,
    }
}

/// This process's stdin, read on a thread of its own: a blocking read of a terminal cannot be
/// cancelled, and on tokio's blocking pool it would hold this process up at its exit until
/// the person pressed a key. The thread ends with the process.
pub(crate) fn stdin_chunks() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel(4);
    std::thread::spawn(move || {
        use std::io::Read;
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    });
    rx
}

/// Copy a program's output here to its end. Output the box let go before it was read is said
/// on stderr with its numbers, and the copy goes on after it.
pub(crate) async fn pump(from: Option<agentbox_core::ByteReader>, mut to: impl AsyncWrite + Unpin) -> Result<()> {
    let Some(mut from) = from else { return Ok(()) };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(n) => n,
            Err(e) => match OutputGap::of(&e) {
                Some(gap) => {
                    term::say(&gap.to_string());
                    continue;
                }
                None => return Err(Error::io(e, "reading the program's output")),
            },
        };
        if n == 0 {
            return Ok(());
        }
        // A closed pipe on our side (agentbox … | head) is not the program's failure.
        if to.write_all(&buf[..n]).await.is_err() || to.flush().await.is_err() {
            return Ok(());
        }
    }
}

/// The process `handle` as the box lists it: `not_found`, naming it, when the box has none
/// by that number (never started there, or forgotten).
async fn info(ps: &dyn Processes, id: &SandboxId, handle: u64, ctx: &Ctx) -> Result<ProcessInfo> {
    ps.list(ctx)
        .await?
        .into_iter()
        .find(|p| p.handle == handle)
        .ok_or_else(|| Error::not_found(format!("box {id}: no process {handle} (see agentbox box ps {id})")))
}

/// Whether a process is agentbox's own helper in the box (its runner's probe, relay or
/// init, run by the runner's program), which `box ps` leaves out without `--all`.
fn is_helper(p: &ProcessInfo) -> bool {
    let Some(program) = p.argv.first() else { return false };
    let name = program.rsplit('/').next().unwrap_or(program);
    name == "agentbox" || name == "agentbox-runner" || program.starts_with("/opt/agentbox/")
}

/// A signal by name (`TERM`, with or without `SIG`, in any case) or number, one of those a
/// box's programs may be sent.
pub(crate) fn signal(s: &str) -> std::result::Result<i32, String> {
    let upper = s.trim().to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    agentbox_core::SIGNALS
        .iter()
        .find(|(name, n)| *name == bare || bare.parse::<i32>() == Ok(*n))
        .map(|(_, n)| *n)
        .ok_or_else(|| {
            let names: Vec<&str> = agentbox_core::SIGNALS.iter().map(|(name, _)| *name).collect();
            format!(
                "{s:?} is not a signal a box's program can be sent (one of {})",
                names.join(", ")
            )
        })
}

/// `box kill`: `signal` to the process `handle`, which must be one the box keeps.
pub(crate) async fn kill(b: &dyn Sandbox, id: &SandboxId, handle: u64, signal: i32) -> Result<i32> {
    let ps = of(b, id)?;
    let ctx = Ctx::background().with_timeout(ANSWER_DEADLINE);
    let p = info(ps, id, handle, &ctx).await?;
    if p.state != ProcessState::Running {
        return Err(Error::gone(format!(
            "box {id}: process {handle} already ended ({})",
            state(&p.state)
        )));
    }
    ps.signal(handle, signal, &ctx).await?;
    tracing::info!(box_id = %id, handle, signal, "signal sent");
    Ok(0)
}

/// `box ps`: a table, one line a process, or JSON; agentbox's own helpers only with `all`.
pub(crate) async fn ps(b: &dyn Sandbox, id: &SandboxId, all: bool, json: bool) -> Result<i32> {
    let ctx = Ctx::background().with_timeout(ANSWER_DEADLINE);
    let mut list = of(b, id)?.list(&ctx).await?;
    if !all {
        list.retain(|p| !is_helper(p));
    }
    if json {
        println!(
            "{}",
            serde_json::to_string(&list).map_err(|e| Error::unknown(e.to_string()))?
        );
        return Ok(0);
    }
    let now = now_ms();
    println!(
        "{:<8} {:<24} {:<10} {:<4} ARGV",
        "HANDLE", "STATE/EXIT", "STARTED", "TTY"
    );
    for p in &list {
        println!(
            "{:<8} {:<24} {:<10} {:<4} {}",
            p.handle,
            state(&p.state),
            ago(now - p.started_ms),
            if p.tty { "yes" } else { "no" },
            argv_line(&p.argv)
        );
    }
    Ok(0)
}

fn now_ms() -> i64 {
    agentbox_core::now_ms() as i64
}

/// A state as `box ps` prints it.
fn state(s: &ProcessState) -> String {
    let exit = |st: &agentbox_core::ExitStatus| match st.signal {
        Some(sig) => format!("exit {} (signal {sig})", st.code),
        None => format!("exit {}", st.code),
    };
    match s {
        ProcessState::Running => "running".into(),
        ProcessState::Exited { status } => exit(status),
        ProcessState::TimedOut { status } => format!("timed out, {}", exit(status)),
    }
}

/// How long ago, as a person reads it: 42s, 5m, 3h, 2d.
fn ago(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..60 => format!("{s}s ago"),
        60..3600 => format!("{}m ago", s / 60),
        3600..86400 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86400),
    }
}

/// An argv as one line a shell would read back: arguments with spaces or quotes are quoted,
/// and those with a newline or another control character are written `$'…'` with escapes.
fn argv_line(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            let plain = !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b) || b >= 0x80);
            if plain {
                a.clone()
            } else if a.chars().any(char::is_control) {
                let mut out = String::from("$'");
                for c in a.chars() {
                    match c {
                        '\n' => out.push_str("\\n"),
                        '\t' => out.push_str("\\t"),
                        '\r' => out.push_str("\\r"),
                        '\\' => out.push_str("\\\\"),
                        '\'' => out.push_str("\\'"),
                        c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32 & 0xff)),
                        c => out.push(c),
                    }
                }
                out.push('\'');
                out
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `box logs`: the output from byte `after` on, stdout's on stdout and stderr's on stderr;
/// with `follow`, more as it comes until the process ends. Without it, up to what the process
/// had written when asked.
pub(crate) async fn logs(b: &dyn Sandbox, id: &SandboxId, handle: u64, after: u64, follow: bool) -> Result<i32> {
    let ps = of(b, id)?;
    let ctx = Ctx::background().with_timeout(ANSWER_DEADLINE);
    let end = info(ps, id, handle, &ctx).await?.end;
    // Without --follow the bytes up to `end` are there (or said lost): each read answers as
    // soon as some come, within a deadline for them all.
    let wait = if follow { FOLLOW_WAIT } else { LOGS_WAIT };
    let deadline = tokio::time::Instant::now() + ANSWER_DEADLINE;
    let (mut stdout, mut stderr) = (tokio::io::stdout(), tokio::io::stderr());
    let mut at = after;
    loop {
        let ctx = Ctx::background().with_timeout(wait + ANSWER_DEADLINE);
        let got = ps.read(handle, at, wait, LOGS_CHUNK, &ctx).await?;
        if let Some(from) = got.gap_from {
            term::say(&format!("box logs: {}", OutputGap { after: at, from }));
        }
        for c in got.chunks {
            let to: &mut (dyn AsyncWrite + Unpin) = match c.stream {
                Stream::Stdout => &mut stdout,
                Stream::Stderr => &mut stderr,
            };
            // A closed pipe on our side (… | head) ends the command, not as a failure.
            if to.write_all(&c.bytes).await.is_err() || to.flush().await.is_err() {
                return Ok(0);
            }
        }
        at = got.next;
        if got.exit.is_some() || (!follow && at >= end) {
            return Ok(0);
        }
        if !follow && tokio::time::Instant::now() > deadline {
            return Err(Error::timeout(format!(
                "box logs: process {handle} had written {end} bytes, and only those to {at} came within {}s",
                ANSWER_DEADLINE.as_secs()
            )));
        }
    }
}

/// `box attach`: the process's output from byte `after` on, this stdin to its stdin (and its
/// end to the program's stdin; `no_stdin` leaves the program's stdin alone), this terminal's
/// size to its terminal; the process's exit code. With a terminal, this one is raw while
/// attached and Ctrl-P Ctrl-Q lets go. A signal here lets go of it too; it runs on.
pub(crate) async fn attach(b: &dyn Sandbox, id: &SandboxId, handle: u64, after: u64, no_stdin: bool) -> Result<i32> {
    let ps = of(b, id)?;
    let ctx = Ctx::background().with_timeout(ANSWER_DEADLINE);
    let tty = info(ps, id, handle, &ctx).await?.tty;
    // The attached process lives by this context: it is never ended from here, so letting go
    // (dropping it) leaves the program running.
    let p = ps.attach(handle, after, &Ctx::background()).await?;
    if tty && let Some((rows, cols)) = term::size() {
        // The terminal it had may be another's size: it takes this one's, as on each change.
        let _ = p.resize(rows, cols).await;
    }
    let input = if no_stdin { Input::None } else { Input::Forward };
    session(p, tty, input, OnSignal::LetGo).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctrl_p_ctrl_q_lets_go_even_split_across_reads() {
        let mut k = DetachKeys::default();
        assert_eq!(k.scan(b"ls\x10").as_deref(), Some(&b"ls"[..]));
        assert_eq!(
            k.scan(b"\x10x").as_deref(),
            Some(&b"\x10\x10x"[..]),
            "a held Ctrl-P goes on"
        );
        assert_eq!(k.scan(b"\x10"), Some(vec![]));
        assert_eq!(k.scan(b"\x11"), None);
        let mut k = DetachKeys::default();
        assert_eq!(k.scan(b"a\x10\x11b"), None);
    }

    #[test]
    fn ps_cells_read_as_a_person_reads_them() {
        assert_eq!(ago(59_999), "59s ago");
        assert_eq!(ago(3_600_000), "1h ago");
        assert_eq!(ago(-5), "0s ago");
        assert_eq!(
            argv_line(&["sh".into(), "-c".into(), "echo it's".into(), "".into()]),
            r"sh -c 'echo it'\''s' ''"
        );
        assert_eq!(
            argv_line(&["sh".into(), "-c".into(), "sleep 1\necho 'a'\\".into()]),
            r"sh -c $'sleep 1\necho \'a\'\\'"
        );
        assert_eq!(signal("sigkill"), Ok(9));
        assert_eq!(signal("15"), Ok(15));
        assert!(signal("NOPE").unwrap_err().contains("TERM"));
        assert_eq!(state(&ProcessState::Running), "running");
        let killed = agentbox_core::ExitStatus::signaled(9);
        assert_eq!(
            state(&ProcessState::TimedOut { status: killed }),
            "timed out, exit 137 (signal 9)"
        );
    }
}

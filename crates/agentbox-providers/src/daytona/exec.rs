//! A program in a sandbox without the runner: started as a toolbox session command, its
//! input and output spooled in files of the sandbox and moved by toolbox calls.
//!
//! Why files and not the session's own logs and input: the toolbox labels each line of a
//! session command's output, adds a final newline and loses NUL bytes, and its input is text
//! with a newline added and no end of file. A spool keeps every byte: the wrapper below runs
//! the program with stdin from a FIFO fed by numbered input files, stdout and stderr into
//! files, and its exit status into a file. The host polls (about every 150 ms, at once again
//! while output keeps coming) with one `process/execute` that answers the exit and what both
//! files gained, base64 in the result's text.
//!
//! Every wait is bounded: a toolbox that stops answering for [`Tuning::silent`] ends the
//! program's wait with `timeout`, never a hang.

pub(crate) use crate::shell::quote as sq;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

use agentbox_core::{Ctx, Error, ErrorCode, ExecOptions, ExitStatus, Process, ProcessControl, Result};
use async_trait::async_trait;
use base64::Engine as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

use super::toolbox::Toolbox;
use crate::random::random_hex;
use crate::shim::ExitSlot;

/// Where programs' spools live in the sandbox.
pub(crate) const SPOOL: &str = "/tmp/agentbox/spool";

/// What a poll's state line starts with.
const STATE: &str = "AGENTBOX-SPOOL|";

/// Spooled output is let go of in steps of this much once read.
const HOLE: u64 = 1 << 20;

/// The most of each stream one poll brings back.
const CHUNK: usize = 1 << 20;

/// How the spool is polled.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tuning {
    /// The pause between polls while nothing comes.
    pub poll: Duration,
    /// How long the toolbox may fail every poll before the program's wait is `timeout`.
    pub silent: Duration,
    /// How long a program may take to start.
    pub start: Duration,
}

/// The session command: `sh -c WRAPPER agentbox-exec DIR [SECONDS]`. DIR holds `cmd` (the
/// program's own script, uploaded: its environment never rides the command's text, which
/// Daytona keeps); `in.N` with `in.N.ok` after it, and `in.end`, are its input; `out`,
/// `err`, `pid`, `head` (`nocwd`, `noprog`), `exit` and `timedout` are what it leaves.
/// `setsid` makes the program a process group of its own (same pid) where the image has it,
/// so a signal reaches its children too.
const WRAPPER: &str = r#"d=$1; t=$2
chmod 700 "$d"
mkfifo "$d/fifo" || { echo nofifo > "$d/head"; exit 1; }
s=; command -v setsid >/dev/null 2>&1 && s=setsid
$s sh "$d/cmd" "$d" < "$d/fifo" > "$d/out" 2> "$d/err" &
p=$!
(n=0; while :; do
  if [ -e "$d/in.$n.ok" ]; then cat "$d/in.$n" 2>/dev/null; rm -f "$d/in.$n" "$d/in.$n.ok"; n=$((n+1))
  elif [ -e "$d/in.end" ]; then exit 0
  else sleep 0.05; fi
done) > "$d/fifo" &
f=$!
w=
if [ -n "$t" ]; then (trap 'kill $z 2>/dev/null; exit 0' TERM; sleep "$t" & z=$!; wait $z; [ -e "$d/exit" ] || { : > "$d/timedout"; kill -9 -- -$p 2>/dev/null || kill -9 $p; }) >/dev/null 2>&1 & w=$!; fi
wait $p; c=$?
kill $f $w 2>/dev/null
echo $c > "$d/exit.t" && mv "$d/exit.t" "$d/exit""#;

/// One poll: `STATE` line (`exit|head|pid|timedout`), then what stdout and stderr gained past
/// their offsets (none asked: empty), base64, one line each.
fn poll_script(dir: &str, offsets: Option<(u64, u64)>) -> String {
    let mut s = format!(
        r#"d={}
x=$(cat "$d/exit" 2>/dev/null); h=$(cat "$d/head" 2>/dev/null); p=$(cat "$d/pid" 2>/dev/null); t=; [ -e "$d/timedout" ] && t=1
printf 'AGENTBOX-SPOOL|%s|%s|%s|%s\n' "$x" "$h" "$p" "$t"
"#,
        sq(dir)
    );
    match offsets {
        Some((o, e)) => {
            s.push_str(&format!(
                r#"tail -c +{o1} "$d/out" 2>/dev/null | head -c {CHUNK} | base64 | tr -d '\n'; echo
tail -c +{e1} "$d/err" 2>/dev/null | head -c {CHUNK} | base64 | tr -d '\n'; echo"#,
                o1 = o + 1,
                e1 = e + 1
            ));
            // What was read is let go on the box's disk (the files keep their length, so the
            // offsets hold), where the file system can punch holes.
            let (po, pe) = (o / HOLE * HOLE, e / HOLE * HOLE);
            if po > 0 || pe > 0 {
                s.push_str(&format!(
                    "\n{{ fallocate -p -o 0 -l {po} \"$d/out\"; fallocate -p -o 0 -l {pe} \"$d/err\"; }} >/dev/null 2>&1"
                ));
            }
        }
        None => s.push_str("echo; echo"),
    }
    s
}

/// The program's own script: its directory, its variables, then the program in place of the
/// shell (same pid).
fn cmd_script(argv: &[String], cwd: &str, opts: &ExecOptions) -> String {
    let mut s = String::from("D=$1\n");
    s.push_str(&format!(
        "cd -- {} 2>/dev/null || {{ echo nocwd > \"$D/head\"; exit 126; }}\n",
        sq(cwd)
    ));
    for (k, v) in &opts.env {
        s.push_str(&format!("export {}\n", sq(&format!("{k}={v}"))));
    }
    s.push_str(&format!(
        "command -v -- {} >/dev/null 2>&1 || {{ echo noprog > \"$D/head\"; exit 127; }}\n",
        sq(&argv[0])
    ));
    s.push_str("echo $$ > \"$D/pid.t\" && mv \"$D/pid.t\" \"$D/pid\"\nexec");
    for a in argv {
        s.push(' ');
        s.push_str(&sq(a));
    }
    s.push('\n');
    s
}

/// What one poll saw.
#[derive(Debug, Default, PartialEq)]
struct Seen {
    exit: Option<i32>,
    head: Option<String>,
    pid: Option<u32>,
    timed_out: bool,
    out: Vec<u8>,
    err: Vec<u8>,
}

fn parse(result: &str) -> Result<Seen> {
    let bad = || {
        Error::unknown(format!(
            "the toolbox's answer to a poll is not the spool's: {:?}",
            result.chars().take(200).collect::<String>()
        ))
    };
    // Past anything a shell's start-up files printed before the script ran.
    let at = result.find(STATE).ok_or_else(bad)?;
    let mut lines = result[at + STATE.len()..].split('\n');
    let state = lines.next().ok_or_else(bad)?;
    let f: Vec<&str> = state.split('|').collect();
    if f.len() != 4 {
        return Err(bad());
    }
    let b64 = |s: Option<&str>| -> Result<Vec<u8>> {
        base64::engine::general_purpose::STANDARD
            .decode(s.unwrap_or("").trim())
            .map_err(|_| bad())
    };
    Ok(Seen {
        exit: (!f[0].trim().is_empty())
            .then(|| f[0].trim().parse().map_err(|_| bad()))
            .transpose()?,
        head: (!f[1].trim().is_empty()).then(|| f[1].trim().to_string()),
        pid: f[2].trim().parse().ok(),
        timed_out: f[3].trim() == "1",
        out: b64(lines.next())?,
        err: b64(lines.next())?,
    })
}

/// Start `argv` in `cwd` (absolute) as a session command: answered once the program runs
/// (`not_found` where its directory or the program is missing).
pub(crate) async fn start(
    tb: &Toolbox,
    argv: &[String],
    cwd: &str,
    opts: &ExecOptions,
    tuning: Tuning,
    ctx: &Ctx,
) -> Result<Process> {
    ctx.check()?;
    let sid = format!("agentbox-{}", random_hex(8)?);
    let dir = format!("{SPOOL}/{sid}");
    let script = cmd_script(argv, cwd, opts);
    tb.upload(
        ctx,
        "writing the program's script in the sandbox",
        &[(format!("{dir}/cmd"), script.as_bytes())],
    )
    .await?;
    let cleanup = Cleanup {
        tb: tb.clone(),
        sid: sid.clone(),
        dir: dir.clone(),
    };
    let started = async {
        tb.create_session(ctx, &sid).await?;
        let secs = opts
            .timeout
            .map(|t| t.as_secs_f64().max(0.001).to_string())
            .unwrap_or_default();
        let command = format!("sh -c {} agentbox-exec {} {secs}", sq(WRAPPER), sq(&dir));
        tb.start_command(ctx, &sid, &command).await?;
        let t = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            let r = tb
                .execute(ctx, "reading a program's start", &poll_script(&dir, None), 5)
                .await?;
            let seen = parse(&r.result)?;
            match seen.head.as_deref() {
                Some("nocwd") => return Err(Error::not_found(format!("exec: the directory {cwd} does not exist"))),
                Some("noprog") => {
                    return Err(Error::not_found(format!("exec: no program {:?} in the box", argv[0])));
                }
                Some(h) => return Err(Error::unknown(format!("exec: the program did not start ({h})"))),
                None => {}
            }
            if let Some(pid) = seen.pid {
                return Ok(pid);
            }
            if seen.exit.is_some() {
                return Err(Error::unknown("exec: the program's wrapper ended before it started"));
            }
            if t.elapsed() > tuning.start {
                return Err(Error::timeout(format!(
                    "exec: the program did not start within {}s",
                    tuning.start.as_secs()
                )));
            }
            ctx.run(tokio::time::sleep(pause)).await?;
            pause = (pause * 2).min(tuning.poll);
        }
    };
    let pid = match started.await {
        Ok(pid) => pid,
        Err(e) => {
            cleanup.spawn();
            return Err(e);
        }
    };
    tracing::debug!(session = %sid, pid, "program started through the toolbox");
    let (stdin_w, stdin_r) = tokio::io::duplex(64 << 10);
    let (out_w, out_r) = tokio::io::duplex(256 << 10);
    let (err_w, err_r) = tokio::io::duplex(256 << 10);
    let (exit_tx, exit_rx) = oneshot::channel();
    let control = Arc::new(SpoolControl {
        tb: tb.clone(),
        dir: dir.clone(),
        pid,
        signalled: AtomicI32::new(0),
        ended: AtomicBool::new(false),
        exit: ExitSlot::new(exit_rx),
    });
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(feed(tb.clone(), dir.clone(), stdin_r, done_rx));
    tokio::spawn(follow(cleanup, control.clone(), tuning, out_w, err_w, exit_tx, done_tx));
    Ok(Process::new(
        Some(Box::pin(stdin_w)),
        Some(Box::pin(out_r)),
        Some(Box::pin(err_r)),
        control,
        ctx,
    ))
}

/// The session and spool of a program, ended once it is done with.
struct Cleanup {
    tb: Toolbox,
    sid: String,
    dir: String,
}

impl Cleanup {
    /// End the session and remove the spool, within 15 s.
    async fn run(&self) {
        let ctx = Ctx::background().with_timeout(Duration::from_secs(15));
        let _ = self.tb.delete_session(&ctx, &self.sid).await;
        let _ = self
            .tb
            .execute(
                &ctx,
                "removing a program's spool",
                &format!("rm -rf {}", sq(&self.dir)),
                10,
            )
            .await;
    }

    /// [`Cleanup::run`] in the background, where no caller waits (a start that failed).
    fn spawn(self) {
        tokio::spawn(async move { self.run().await });
    }
}

/// Move what the host writes on stdin into `in.N` files, `in.end` at its end, until the
/// program is done.
async fn feed(
    tb: Toolbox,
    dir: String,
    mut stdin: tokio::io::DuplexStream,
    mut done: tokio::sync::watch::Receiver<bool>,
) {
    let ctx = Ctx::background();
    let mut n = 0u64;
    let mut buf = vec![0u8; 256 << 10];
    loop {
        let got = tokio::select! {
            r = stdin.read(&mut buf) => r.unwrap_or(0),
            _ = done.wait_for(|d| *d) => return,
        };
        let what = "writing a program's input in the sandbox";
        let r = if got == 0 {
            tb.upload(&ctx, what, &[(format!("{dir}/in.end"), &[][..])]).await
        } else {
            // The data first, then its mark: the feeder takes a file only once it is whole.
            tb.upload(
                &ctx,
                what,
                &[
                    (format!("{dir}/in.{n}"), &buf[..got]),
                    (format!("{dir}/in.{n}.ok"), &[][..]),
                ],
            )
            .await
        };
        if let Err(e) = r {
            tracing::warn!(error = %e, "a program's input could not be written; its stdin ends here");
            return;
        }
        if got == 0 {
            return;
        }
        n += 1;
    }
}

/// Poll the spool until the program's exit and all its output are in.
async fn follow(
    cleanup: Cleanup,
    control: Arc<SpoolControl>,
    tuning: Tuning,
    mut out: tokio::io::DuplexStream,
    mut err: tokio::io::DuplexStream,
    exit: oneshot::Sender<Result<ExitStatus>>,
    done: tokio::sync::watch::Sender<bool>,
) {
    let ctx = Ctx::background();
    let (mut out_off, mut err_off) = (0u64, 0u64);
    let (mut out_open, mut err_open) = (true, true);
    let mut last_ok = tokio::time::Instant::now();
    let outcome = loop {
        let r = cleanup
            .tb
            .execute(
                &ctx,
                "polling a program",
                &poll_script(&cleanup.dir, Some((out_off, err_off))),
                5,
            )
            .await;
        let seen = match r.and_then(|r| parse(&r.result)) {
            Ok(s) => s,
            Err(e) if matches!(e.code(), ErrorCode::NotFound | ErrorCode::Gone) => {
                break Err(Error::gone(format!("the box ended under its program: {}", e.message())));
            }
            Err(e) => {
                // A box put to sleep or ended under the program says so, not a timeout.
                if let Some(why) = cleanup.tb.ended_or_asleep().await {
                    break Err(why);
                }
                if last_ok.elapsed() > tuning.silent {
                    break Err(Error::timeout(format!(
                        "the sandbox's toolbox stopped answering for {}s: {}",
                        tuning.silent.as_secs(),
                        e.message()
                    )));
                }
                tracing::debug!(error = %e, "a poll failed; trying again");
                tokio::time::sleep(tuning.poll).await;
                continue;
            }
        };
        last_ok = tokio::time::Instant::now();
        let full = seen.out.len() >= CHUNK || seen.err.len() >= CHUNK;
        out_off += seen.out.len() as u64;
        err_off += seen.err.len() as u64;
        // A reader that went away loses its stream, not the program's exit.
        if out_open && !seen.out.is_empty() && out.write_all(&seen.out).await.is_err() {
            out_open = false;
        }
        if err_open && !seen.err.is_empty() && err.write_all(&seen.err).await.is_err() {
            err_open = false;
        }
        if seen.timed_out {
            break Err(Error::timeout(
                "exec: the program's timeout passed and the box ended it",
            ));
        }
        if let Some(code) = seen.exit
            && !full
        {
            let sig = control.signalled.load(Ordering::Relaxed);
            break Ok(if sig > 0 && code == 128 + sig {
                ExitStatus::signaled(sig)
            } else {
                ExitStatus::exited(code)
            });
        }
        if !full {
            tokio::time::sleep(tuning.poll).await;
        }
    };
    control.ended.store(true, Ordering::SeqCst);
    let _ = done.send(true);
    let _ = out.shutdown().await;
    let _ = err.shutdown().await;
    if outcome.is_ok() {
        // The session and spool end before the exit is told: a host process that exits next
        // (one `box exec`) leaves nothing behind.
        cleanup.run().await;
        let _ = exit.send(outcome);
    } else {
        // A toolbox that stopped answering would hold the error up: it is told at once.
        let _ = exit.send(outcome);
        cleanup.spawn();
    }
}

/// Signals by a toolbox call; the exit from the poll.
struct SpoolControl {
    tb: Toolbox,
    dir: String,
    pid: u32,
    /// Set once the exit is known: the pid may be another program's by then.
    ended: AtomicBool,
    /// The last signal sent, so an exit of 128+N after it reads as that signal.
    signalled: AtomicI32,
    exit: ExitSlot,
}

#[async_trait]
impl ProcessControl for SpoolControl {
    async fn wait(&self) -> Result<ExitStatus> {
        self.exit.wait().await
    }

    async fn signal(&self, signal: i32) -> Result<()> {
        if !(1..=64).contains(&signal) {
            return Err(Error::invalid(format!("signal {signal}: not a signal")));
        }
        if self.ended.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.signalled.store(signal, Ordering::Relaxed);
        let p = self.pid;
        // Only while the wrapper has not reaped it (no exit file, the spool still there): past
        // that, the pid may be another program's.
        let command = format!(
            "d={}; [ -e \"$d/exit\" ] || [ ! -d \"$d\" ] || kill -{signal} -- -{p} 2>/dev/null || kill -{signal} {p} 2>/dev/null; true",
            sq(&self.dir)
        );
        let ctx = Ctx::background().with_timeout(Duration::from_secs(30));
        self.tb.execute(&ctx, "signalling a program", &command, 5).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_answer_reads_back() {
        let s = parse("AGENTBOX-SPOOL|3||42|\naGVsbG8=\n\n").unwrap();
        assert_eq!(
            s,
            Seen {
                exit: Some(3),
                pid: Some(42),
                out: b"hello".to_vec(),
                ..Default::default()
            }
        );
        let s = parse("AGENTBOX-SPOOL||nocwd||\n\n\n").unwrap();
        assert_eq!(s.head.as_deref(), Some("nocwd"));
        assert!(s.exit.is_none());
        assert!(parse("garbage").is_err());
        assert!(parse("AGENTBOX-SPOOL|x|||\n\n\n").is_err());
        assert!(parse("AGENTBOX-SPOOL||||\n!!!\n\n").is_err());
        // What a shell's start-up files print first is passed over.
        let s = parse("welcome to zsh\nAGENTBOX-SPOOL|0|||\n\n\n").unwrap();
        assert_eq!(s.exit, Some(0));
        // A malformed answer whose text has a character across byte 200 is an error, not a
        // panic.
        let text = format!("{}é{}", "x".repeat(199), "y".repeat(50));
        assert!(parse(&text).is_err());
    }

    #[test]
    fn words_are_quoted_for_sh() {
        assert_eq!(sq("it's"), r#"'it'\''s'"#);
        let s = cmd_script(
            &["printf".into(), "%s\n".into(), "a b'c".into()],
            "/tmp/x y",
            &ExecOptions {
                env: [("K".to_string(), "v'1 $HOME".to_string())].into(),
                ..Default::default()
            },
        );
        assert!(s.contains(r#"cd -- '/tmp/x y'"#), "{s}");
        assert!(s.contains(r#"export 'K=v'\''1 $HOME'"#), "{s}");
        assert!(s.ends_with("exec 'printf' '%s\n' 'a b'\\''c'\n"), "{s}");
    }
}

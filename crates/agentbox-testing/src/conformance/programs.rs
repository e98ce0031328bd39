//! The cases of programs in a box: exit codes and signals, stdin, stdout and stderr, large output,
//! the environment, concurrency, cancellation, kill, the working directory, a missing program, and
//! boxes without live processes or env.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use agentbox_core::{Ctx, ErrorCode, ExecOptions, FinishOptions, finish};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use super::cx::{Cx, argv};
use super::{CaseResult, Need, futures_join_all};

/// An exit code comes back as the program gave it, and a signal as 128 plus its number.
pub(super) async fn exit_codes_and_signals(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    for (script, want) in [
        ("exit 0", 0),
        ("exit 3", 3),
        ("exit 255", 255),
        ("kill -TERM $$", 143),
        ("kill -KILL $$", 137),
    ] {
        let out = cx.sh(&*b, script).await?;
        ensure!(
            out.status.code == want,
            "`{script}` gave {}, expected {want}",
            out.status.code
        );
    }
    let out = cx.sh(&*b, "kill -TERM $$").await?;
    ensure!(
        matches!(out.status.signal, None | Some(15)),
        "signal reported as {:?}",
        out.status.signal
    );
    Ok(())
}

/// Stdin streams while open (a line comes back before EOF), EOF is never lost, and every
/// byte value passes.
pub(super) async fn stdin_round_trip_and_eof(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    // Streaming: a line goes in and comes back while stdin is still open.
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let mut p = b
        .exec(&argv(&["cat"]), &ExecOptions::default(), &ctx)
        .await
        .map_err(|e| e.to_string())?;
    let mut stdin = p.stdin.take().ok_or("no stdin")?;
    let mut lines = tokio::io::BufReader::new(p.stdout.take().ok_or("no stdout")?);
    stdin.write_all(b"ping\n").await.map_err(|e| e.to_string())?;
    stdin.flush().await.map_err(|e| e.to_string())?;
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(20), lines.read_line(&mut line))
        .await
        .map_err(|_| "cat did not echo a line while stdin was open")?
        .map_err(|e| e.to_string())?;
    ensure!(line == "ping\n", "cat echoed {line:?}");
    stdin.close().await.map_err(|e| e.to_string())?;
    let st = p.wait().await.map_err(|e| format!("cat after EOF: {e}"))?;
    ensure!(st.code == 0, "cat exited {}", st.code);

    // An empty stdin still ends: the EOF is not lost.
    for _ in 0..5 {
        let out = cx.run_opts(&*b, &["cat"], &ExecOptions::default(), vec![]).await?;
        ensure!(
            out.status.code == 0 && out.stdout.is_empty(),
            "cat of an empty stdin gave {:?}",
            out
        );
    }
    // Every byte value, a MiB of them.
    let data: Vec<u8> = (0..(1 << 20))
        .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let out = cx
        .run_opts(&*b, &["cat"], &ExecOptions::default(), data.clone())
        .await?;
    ensure!(
        out.stdout == data,
        "1 MiB through cat came back as {} different bytes",
        out.stdout.len()
    );
    Ok(())
}

/// Stdout and stderr arrive apart, each in order.
pub(super) async fn stdout_and_stderr_kept_apart(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    let out = cx.sh(&*b, "echo out; echo err >&2; echo out2; echo err2 >&2").await?;
    ensure!(out.stdout == b"out\nout2\n", "stdout was {:?}", out.stdout_text());
    ensure!(out.stderr == b"err\nerr2\n", "stderr was {:?}", out.stderr_text());
    Ok(())
}

/// 16 MiB on each stream at once: both are read as they come, so neither blocks the other.
pub(super) async fn sixteen_mib_of_output_without_deadlock(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    let script = "head -c 16777216 /dev/zero | tr '\\0' a & head -c 16777216 /dev/zero | tr '\\0' b >&2; wait";
    let out = cx.sh(&*b, script).await?;
    ensure!(out.status.code == 0, "exited {}", out.status.code);
    ensure!(out.stdout.len() == 16 << 20, "stdout had {} bytes", out.stdout.len());
    ensure!(out.stderr.len() == 16 << 20, "stderr had {} bytes", out.stderr.len());
    ensure!(
        out.stdout.iter().all(|&c| c == b'a'),
        "stdout holds bytes of stderr or garbage"
    );
    ensure!(
        out.stderr.iter().all(|&c| c == b'b'),
        "stderr holds bytes of stdout or garbage"
    );
    Ok(())
}

/// None of the host's variables reach a box; the spec's and the exec's do, as given, and an
/// exec's reach only that exec.
pub(super) async fn host_environment_invisible_spec_env_visible(cx: &Cx) -> CaseResult {
    let value = "spaces, 'quotes', \"dq\", $dollar and ✓";
    let mut spec = cx.spec();
    spec.env.insert("AGENTBOX_CONFORMANCE_SPEC".into(), value.into());
    let b = cx.create(&spec).await?;
    let out = cx.run_opts(&*b, &["env"], &ExecOptions::default(), vec![]).await?;
    let text = out.stdout_text();
    let names: BTreeSet<&str> = text.lines().filter_map(|l| l.split_once('=').map(|(k, _)| k)).collect();
    // Names a box may have of its own whatever the host has.
    let own = [
        "PATH", "HOME", "TMPDIR", "PWD", "SHLVL", "_", "HOSTNAME", "LANG", "TERM", "USER", "LOGNAME", "SHELL", "OLDPWD",
    ];
    let leaked: Vec<String> = std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| !own.contains(&k.as_str()) && !k.starts_with("LC_") && names.contains(k.as_str()))
        .collect();
    ensure!(leaked.is_empty(), "the box sees the host's variables {leaked:?}");
    ensure!(
        text.lines().any(|l| l == format!("AGENTBOX_CONFORMANCE_SPEC={value}")),
        "the spec's env is not visible as given: {text:?}"
    );
    let mut opts = ExecOptions::default();
    opts.env.insert("AGENTBOX_CONFORMANCE_EXEC".into(), "per-exec".into());
    let out = cx
        .run_opts(&*b, &["sh", "-c", "echo \"$AGENTBOX_CONFORMANCE_EXEC\""], &opts, vec![])
        .await?;
    ensure!(
        out.stdout == b"per-exec\n",
        "the exec's env is not visible: {:?}",
        out.stdout_text()
    );
    let out = cx.sh(&*b, "echo \"${AGENTBOX_CONFORMANCE_EXEC-unset}\"").await?;
    ensure!(
        out.stdout == b"unset\n",
        "one exec's env reached the next: {:?}",
        out.stdout_text()
    );
    Ok(())
}

/// Eight execs run in one box at once. No clock tells: each marks that it started, then waits
/// in the box until all eight marks are there, so each waits for a mark only a later exec
/// makes. Execs run one after another never get there; the deadline only bounds how long
/// such a provider is waited for. It needs live processes: eight programs alive together.
pub(super) async fn concurrent_execs(cx: &Cx) -> CaseResult {
    const N: usize = 8;
    const WAIT: Duration = Duration::from_secs(30);
    /// `$1` marks its start in `started/`, then waits for `$2` marks.
    const SCRIPT: &str = "mkdir -p started && : > started/$1 && \
        while [ \"$(ls started | wc -l)\" -lt $2 ]; do sleep 0.02; done; echo $1";
    let b = cx.new_box().await?;
    // One deadline for all: a provider that runs them one at a time is told so within it.
    let ctx = Ctx::background().with_timeout(WAIT);
    let runs = (0..N).map(|i| {
        let (b, ctx) = (b.clone(), ctx.clone());
        async move {
            let (n, total) = (i.to_string(), N.to_string());
            let args = argv(&["sh", "-c", SCRIPT, "sh", &n, &total]);
            let out = match b.exec(&args, &ExecOptions::default(), &ctx).await {
                Ok(p) => finish(p, FinishOptions::default()).await,
                Err(e) => Err(e),
            };
            match out {
                Ok(out) => {
                    ensure!(
                        out.status.code == 0 && out.stdout_text() == format!("{i}\n"),
                        "exec {i} exited {} printing {:?} ({})",
                        out.status.code,
                        out.stdout_text(),
                        out.stderr_text()
                    );
                    Ok(())
                }
                Err(e) if matches!(e.code(), ErrorCode::Timeout | ErrorCode::Aborted) => Err(format!(
                    "exec {i} did not see all {N} execs started within {WAIT:?} ({e}): they ran, \
                     if at all, not all at once"
                )),
                Err(e) => Err(format!("exec {i}: {e}")),
            }
        }
    });
    for r in futures_join_all(runs).await {
        r?;
    }
    Ok(())
}

/// A program is governed by its exec's context: a deadline or a cancel ends it, and a context
/// already ended starts nothing.
pub(super) async fn abort_and_deadline_through_ctx(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    // A deadline ends the program and wait answers timeout.
    let ctx = Ctx::background().with_timeout(Duration::from_millis(1500));
    let (mut p, pid) = cx.start_sleeper(&*b, &ctx).await?;
    let t = Instant::now();
    match p.wait().await {
        Err(e) if e.code() == ErrorCode::Timeout => {}
        other => return Err(format!("wait past the deadline answered {other:?}, expected timeout")),
    }
    ensure!(
        t.elapsed() < Duration::from_secs(15),
        "the deadline took {:?} to end the wait",
        t.elapsed()
    );
    cx.gone_soon(&*b, pid).await?;

    // A cancel ends the program and wait answers aborted.
    let ctx = Ctx::background();
    let (mut p, pid) = cx.start_sleeper(&*b, &ctx).await?;
    let c = ctx.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        c.cancel();
    });
    match p.wait().await {
        Err(e) if e.code() == ErrorCode::Aborted => {}
        other => return Err(format!("wait after a cancel answered {other:?}, expected aborted")),
    }
    cx.gone_soon(&*b, pid).await?;

    // A context that already ended starts nothing.
    let dead = Ctx::background();
    dead.cancel();
    match b.exec(&argv(&["true"]), &ExecOptions::default(), &dead).await {
        Err(e) if e.code() == ErrorCode::Aborted => {}
        Err(e) => return Err(format!("exec with a cancelled context: {e}, expected aborted")),
        Ok(_) => return Err("exec with a cancelled context started a program".into()),
    }
    match cx.provider.create(&cx.spec(), &dead).await {
        Err(e) if e.code() == ErrorCode::Aborted => {}
        Err(e) => return Err(format!("create with a cancelled context: {e}, expected aborted")),
        Ok(_) => return Err("create with a cancelled context made a box".into()),
    }
    Ok(())
}

/// Kill ends the program, which exits 137.
pub(super) async fn kill_ends_the_program(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let (mut p, pid) = cx.start_sleeper(&*b, &ctx).await?;
    p.kill().await.map_err(|e| format!("kill: {e}"))?;
    let st = p.wait().await.map_err(|e| format!("wait after kill: {e}"))?;
    ensure!(st.code == 137, "a killed program exited {}", st.code);
    cx.gone_soon(&*b, pid).await
}

/// A program starts in the exec's cwd, relative to the workspace or absolute; a missing one is
/// `not_found`.
pub(super) async fn working_directory(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    b.upload("wd/inner/f", b"x", &ctx).await.map_err(|e| e.to_string())?;
    let opts = ExecOptions {
        cwd: Some("wd/inner".into()),
        ..Default::default()
    };
    let out = cx.run_opts(&*b, &["sh", "-c", "pwd; cat f"], &opts, vec![]).await?;
    let text = out.stdout_text();
    ensure!(text.ends_with("/wd/inner\nx"), "a relative cwd gave {text:?}");
    let opts = ExecOptions {
        cwd: Some("/".into()),
        ..Default::default()
    };
    let out = cx.run_opts(&*b, &["pwd"], &opts, vec![]).await?;
    ensure!(out.stdout == b"/\n", "cwd / gave {:?}", out.stdout_text());
    let opts = ExecOptions {
        cwd: Some("wd/no-such-dir".into()),
        ..Default::default()
    };
    match b.exec(&argv(&["pwd"]), &opts, &ctx).await {
        Err(e) if e.code() == ErrorCode::NotFound => Ok(()),
        Err(e) => Err(format!("a missing cwd answered {e}, expected not_found")),
        Ok(_) => Err("a missing cwd started a program".into()),
    }
}

/// A program that does not exist is `not_found`, or exit code 127.
pub(super) async fn a_missing_program(cx: &Cx) -> CaseResult {
    let b = cx.new_box().await?;
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    match b
        .exec(
            &argv(&["agentbox-conformance-no-such-program"]),
            &ExecOptions::default(),
            &ctx,
        )
        .await
    {
        Err(e) if e.code() == ErrorCode::NotFound => Ok(()),
        Err(e) => Err(format!("a missing program answered {e}, expected not_found")),
        Ok(p) => {
            let out = finish(p, FinishOptions::default()).await.map_err(|e| e.to_string())?;
            ensure!(
                out.status.code == 127,
                "a missing program exited {}, expected not_found or 127",
                out.status.code
            );
            Ok(())
        }
    }
}

/// Where the provider says it keeps no program running between calls: that holds. Its
/// `honours()` and every box's facts say so, and a program's stdin is refused.
pub(super) async fn without_live_processes(cx: &Cx) -> CaseResult {
    lacks(cx, Need::LiveProcesses)?;
    let b = cx.new_box().await?;
    ensure!(
        !b.facts().live_processes,
        "the facts say live_processes, but honours() and the options say the provider has none"
    );
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let mut p = b
        .exec(&argv(&["cat"]), &ExecOptions::default(), &ctx)
        .await
        .map_err(|e| e.to_string())?;
    match p.stdin.as_mut() {
        None => Ok(()),
        Some(stdin) => match stdin.write_all(b"x").await {
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => Ok(()),
            other => Err(format!(
                "stdin of a box without live processes answered {other:?}, expected unsupported"
            )),
        },
    }
}

/// Where the provider says its boxes carry no environment: that holds. Its `honours()` says
/// so, and a spec with env is refused `unsupported`, naming env.
pub(super) async fn without_env(cx: &Cx) -> CaseResult {
    lacks(cx, Need::Env)?;
    let spec = cx.spec().env("AGENTBOX_CONFORMANCE", "1");
    match cx.provider.create(&spec, &Ctx::background()).await {
        Err(e) if e.code() == ErrorCode::Unsupported && e.message().contains("env") => Ok(()),
        Err(e) => Err(format!("a spec with env answered {e}, expected unsupported naming env")),
        Ok(_) => Err("a spec with env made a box, but the options say boxes carry none".into()),
    }
}

/// The first check of a need's absence: the provider's `honours()` does not declare it
/// (options that leave out what the provider says it has are wrong, not a reason).
pub(super) fn lacks(cx: &Cx, need: Need) -> CaseResult {
    ensure!(
        !need.declared(&cx.suite.honours),
        "Options::{} says {:?}, but honours() declares {}",
        need.option(),
        need.reason(cx.options()).unwrap_or_default(),
        need.field()
    );
    Ok(())
}

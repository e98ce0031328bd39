//! `agentbox box exec` and `agentbox box shell`: a program in a box, its output streamed, its
//! stdin passed on, a terminal where one is asked for, exits as `timeout(1)` gives them.

use std::time::Duration;

use agentbox_core::{Ctx, Error, ExecOptions, Result, SandboxId};

use super::args::ExecArgs;
use super::provider::attach;
use crate::{procs, term};

pub(super) async fn exec(a: ExecArgs) -> Result<i32> {
    let ctx = Ctx::background();
    // Read first: a secret that is not where the flag says is said before the box is reached.
    let secret_fd = a
        .secret_fd
        .as_deref()
        .map(agentbox_core::FdSecret::from_flag)
        .transpose()
        .map_err(crate::usage)?;
    let b = attach(&a.id, &ctx).await?;
    if a.detach {
        procs::of(&*b, &a.id)?;
    } else if a.tty && a.interactive && !term::stdin_is_terminal() {
        return Err(Error::invalid(
            "--tty with --interactive: stdin is not a terminal (without -t, a pipe is passed to the program)",
        ));
    }
    let opts = ExecOptions {
        cwd: a.cwd,
        env: a.env.into_iter().collect(),
        tty: a.tty.then(term::tty_here),
        detach: a.detach,
        timeout: a.timeout,
        secret_fd,
    };
    // A box whose programs take no input (each exec one call carrying the command alone)
    // refuses stdin that has bytes, as its own API does, rather than dropping them: before the
    // program runs when they come within STDIN_LOOK, else as soon as they come.
    let mut refused_input = None;
    // Stdin is the program's unless detached, or -t without -i.
    let forwarded = !a.detach && (!a.tty || a.interactive);
    if !b.facts().live_processes && forwarded && !term::stdin_is_terminal() {
        let mut chunks = procs::stdin_chunks();
        match tokio::time::timeout(STDIN_LOOK, next_bytes(&mut chunks)).await {
            Ok(true) => return Err(no_input(&a.id, "the program was not run")),
            // The end of stdin (/dev/null, an empty pipe): nothing is dropped.
            Ok(false) => {}
            Err(_) => refused_input = Some(chunks),
        }
    }
    let mut p = b.exec(&a.argv, &opts, &ctx).await?;
    if let Some(mut chunks) = refused_input {
        if let Some(w) = p.stdin.take() {
            procs::leave_open(w);
        }
        let session = procs::session(p, a.tty, procs::Input::None, procs::OnSignal::Kill);
        let late = async {
            if next_bytes(&mut chunks).await {
                return;
            }
            std::future::pending::<()>().await
        };
        return tokio::select! {
            biased;
            _ = late => Err(no_input(&a.id, "it came after the program started, and was not sent")),
            r = session => r,
        };
    }
    if a.detach {
        if let Some(w) = p.stdin.take() {
            procs::leave_open(w);
        }
        let handle = p
            .handle()
            .ok_or_else(|| Error::unknown(format!("box {}: the detached program got no handle", a.id)))?;
        if a.json {
            println!("{}", serde_json::json!({ "id": a.id, "handle": handle }));
        } else {
            println!("{handle}");
        }
        return Ok(0);
    }
    let input = if a.tty && !a.interactive {
        procs::Input::None
    } else {
        procs::Input::Forward
    };
    match procs::session(p, a.tty, input, procs::OnSignal::Kill).await {
        // The box ended the program at its --timeout: 124, as timeout(1) exits.
        Err(e) if a.timeout.is_some() && e.code() == agentbox_core::ErrorCode::Timeout => {
            term::say(&format!("box exec: {}", crate::one_line(e.message())));
            Ok(TIMED_OUT)
        }
        r => r,
    }
}

/// How long `box exec` waits for stdin's first bytes (or its end) before it runs a program in a
/// box that takes no input; past it, stdin is still watched while the program runs.
const STDIN_LOOK: Duration = Duration::from_secs(1);

/// Whether stdin gives bytes before its end.
async fn next_bytes(chunks: &mut tokio::sync::mpsc::Receiver<Vec<u8>>) -> bool {
    while let Some(c) = chunks.recv().await {
        if !c.is_empty() {
            return true;
        }
    }
    false
}

/// The refusal of stdin's bytes by a box whose programs take no input.
fn no_input(id: &SandboxId, what: &str) -> Error {
    Error::unsupported(format!(
        "box {id}: stdin has data, and this box's programs take no input (its facts say live_processes: false: each exec is one call that carries the command alone); {what}. Copy the input in (box cp - {id}:FILE) and name the file instead"
    ))
}

/// `box exec`'s exit when its `--timeout` ended the program, as `timeout(1)`'s.
const TIMED_OUT: i32 = 124;

/// The box's shell: bash where it has it, else sh.
const SHELL: &str = "command -v bash >/dev/null 2>&1 && exec bash; exec sh";

pub(super) async fn shell(id: &SandboxId, cwd: Option<String>) -> Result<i32> {
    if !term::stdin_is_terminal() {
        return Err(Error::invalid(
            "box shell: stdin is not a terminal (box exec ID -- sh runs a script from a pipe)",
        ));
    }
    let args = ExecArgs {
        id: id.clone(),
        cwd,
        env: Vec::new(),
        interactive: true,
        tty: true,
        detach: false,
        json: false,
        timeout: None,
        secret_fd: None,
        argv: vec!["sh".into(), "-c".into(), SHELL.into()],
    };
    exec(args).await
}

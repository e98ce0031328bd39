//! Commands in a box, by whichever of two ways the box offers.
//!
//! Over a runner, a command is the runner's own process, started directly (`bash -c` for a
//! string): the runner starts every program as the leader of a process group of its own and
//! its `kill` signals that group, so a stop asks the group to end (TERM), kills it a second
//! later (KILL) while the leader still runs, and is confirmed by the leader's exit. No process
//! is started beside the command.
//!
//! Without one, a command starts through [`scripts::OUTER`] and [`scripts::COMMAND`]: a session
//! of its own, written down in `$TMPDIR/.agentbox-hands/<pgid>` with the leader's start time,
//! and a stop is [`scripts::KILL_GROUP`] in a second exec, which confirms that no live process
//! of the group is left (tried again at 1, 2 and 4 s, 10 s in all).
//!
//! On a box without live processes, a command is one call run to its end, with nothing to
//! track or kill (`one_call.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use agentbox_core::{
    ByteReader, Ctx, ErrorCode, ExecOptions as BoxExecOptions, FileType, FinishOptions, Killer, Process, SIGKILL,
    SIGTERM, Sandbox, finish,
};
use tokio::io::AsyncReadExt;

use super::{BoxEnv, KILL_BUDGET, START_TIMEOUT, scripts};
use crate::output::{Ran, run_command, stopped_message};
use crate::path::absolute;
use crate::{Command, ExecCode, ExecError, ExecOptions, ExecOutcome, StartOptions};

/// Where a box's shell may be, in the order looked for.
const SHELLS: [&str; 5] = [
    "/bin/bash",
    "/usr/bin/bash",
    "/usr/local/bin/bash",
    "/bin/sh",
    "/usr/bin/sh",
];

/// How long a stopped command has to end on TERM before its group is killed.
const GRACE: Duration = Duration::from_secs(1);

/// The commands an environment runs through the box's runner, so [`BoxEnv::cleanup`] can end
/// them: each one's killer while it runs, and the process of one whose stop was not
/// confirmed.
#[derive(Default)]
pub(super) struct Commands {
    next: u64,
    running: BTreeMap<u64, Killer>,
    unconfirmed: Vec<Process>,
}

impl BoxEnv {
    /// Run `command` in the box: through its runner when it has one, else by the scripts.
    pub(super) async fn run(&self, command: Command, opts: ExecOptions, ctx: &Ctx) -> Result<ExecOutcome, ExecError> {
        if let Some(lost) = self.lost_exec() {
            return Err(lost);
        }
        if let Command::Argv(a) = &command
            && (a.is_empty() || a[0].is_empty())
        {
            return Err(ExecError::new(ExecCode::SpawnError, "Empty argv: no program to run"));
        }
        let cwd = absolute(&self.cwd, opts.cwd.as_deref().unwrap_or("."));
        if self.one_call() {
            self.run_one_call(command, cwd, opts, ctx).await
        } else if self.sandbox.files().is_some() {
            match self
                .run_by_runner(command.clone(), cwd.clone(), opts.clone(), ctx)
                .await
            {
                // The runner, reached for the first time, has no file operations (it speaks
                // protocol 2 alone): nothing started, and the box's scripts serve instead.
                Err(e) if e.code == ExecCode::ShellUnavailable && self.sandbox.files().is_none() => {
                    self.run_by_script(command, cwd, opts, ctx).await
                }
                r => r,
            }
        } else {
            self.run_by_script(command, cwd, opts, ctx).await
        }
    }

    /// The box's shell, bash where it has one, looked for once through the runner.
    async fn shell(&self, ctx: &Ctx) -> Result<String, ExecError> {
        if let Some(s) = self.shell.get() {
            return Ok(s.clone());
        }
        let files = self
            .sandbox
            .files()
            .ok_or_else(|| ExecError::new(ExecCode::Unknown, "the box has no runner"))?;
        let c = ctx.with_timeout(self.op_timeout);
        for s in SHELLS {
            if files.stat(s, true, &c).await.is_ok_and(|m| m.kind == FileType::File) {
                return Ok(self.shell.get_or_init(|| s.to_string()).clone());
            }
        }
        Err(ExecError::new(
            ExecCode::ShellUnavailable,
            "the box has neither bash nor sh",
        ))
    }

    async fn run_by_runner(
        &self,
        command: Command,
        cwd: String,
        opts: ExecOptions,
        ctx: &Ctx,
    ) -> Result<ExecOutcome, ExecError> {
        let program = match &command {
            Command::Argv(a) => a[0].clone(),
            Command::Shell(_) => String::new(),
        };
        let mut argv = match command {
            Command::Argv(a) => a,
            Command::Shell(s) => vec![self.shell(ctx).await?, "-c".into(), s],
        };
        let mut env = opts.env.clone();
        if opts.inherit_env == Some(false) {
            // The box's variables go; the caller's and a default PATH stay.
            let mut wrapped = vec![
                self.shell(ctx).await?,
                "-c".into(),
                scripts::CLEAN_ENV.into(),
                "agentbox-env".into(),
            ];
            wrapped.append(&mut argv);
            argv = wrapped;
            if let Some(path) = env.remove("PATH") {
                env.insert("AGENTBOX_CALLER_PATH".into(), path);
            }
            let keep: Vec<&str> = opts.env.keys().filter(|k| *k != "PATH").map(String::as_str).collect();
            env.insert("AGENTBOX_KEEP".into(), keep.join(" "));
        }
        let box_opts = BoxExecOptions {
            cwd: Some(cwd.clone()),
            env,
            ..Default::default()
        };
        // The program lives by its own stop below, not by the start's deadline.
        let mut p = self.start_program(argv, box_opts, &cwd, &program, ctx).await?;
        drop(p.stdin.take()); // no input: the command reads EOF
        let killer = p.killer();
        let id = {
            let mut c = self.commands.lock().unwrap();
            c.next += 1;
            let id = c.next;
            c.running.insert(id, killer.clone());
            id
        };
        let (stdout, stderr) = (p.stdout.take(), p.stderr.take());
        let wait = async {
            p.wait()
                .await
                .map(|st| st.code)
                .map_err(|e| ExecError::new(ExecCode::Unknown, e.to_string()))
        };
        let ran = run_command(self, stdout, stderr, wait, &opts, ctx).await;
        self.commands.lock().unwrap().running.remove(&id);
        match ran? {
            Ran::Exited(outcome) => Ok(outcome),
            Ran::Stopped { code, drain } => {
                let confirmed = stop_by_runner(&killer, &mut p).await;
                // What the command printed as it was asked to end still reaches on_output.
                let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
                let what = stopped_message(code);
                if confirmed {
                    return Err(ExecError::new(code, what));
                }
                self.commands.lock().unwrap().unconfirmed.push(p);
                Err(ExecError {
                    kill_unconfirmed: true,
                    ..ExecError::new(code, format!("{what}, and it could not be confirmed gone within 10s"))
                })
            }
        }
    }

    /// Start a command the box keeps past this call (`detach`), its stdin left open: only a
    /// box whose runner keeps processes can. The box ends it at `timeout`, with no call from
    /// here. A start the deadline or the caller gave up on is killed once it is known, as
    /// [`BoxEnv::run`]'s is, so no command runs that nobody was given a handle for.
    pub(super) async fn start_detached(
        &self,
        command: Command,
        opts: StartOptions,
        ctx: &Ctx,
    ) -> Result<u64, ExecError> {
        if let Some(lost) = self.lost_exec() {
            return Err(lost);
        }
        if self.sandbox.processes().is_none() {
            let e = super::kept::no_runner(&*self.sandbox);
            return Err(ExecError {
                cause: Some(e.clone()),
                ..ExecError::new(ExecCode::SpawnError, e.message())
            });
        }
        let timeout = match opts.timeout {
            None => None,
            Some(t) => Some(
                Duration::try_from_secs_f64(t)
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| {
                        ExecError::new(
                            ExecCode::SpawnError,
                            format!("timeout {t}: not a number of seconds a box can keep"),
                        )
                    })?,
            ),
        };
        let (program, argv) = match command {
            Command::Argv(a) if a.is_empty() || a[0].is_empty() => {
                return Err(ExecError::new(ExecCode::SpawnError, "Empty argv: no program to run"));
            }
            Command::Argv(a) => (a[0].clone(), a),
            Command::Shell(s) => (String::new(), vec![self.shell(ctx).await?, "-c".into(), s]),
        };
        let cwd = absolute(&self.cwd, opts.cwd.as_deref().unwrap_or("."));
        let box_opts = BoxExecOptions {
            cwd: Some(cwd.clone()),
            env: opts.env,
            detach: true,
            timeout,
            ..Default::default()
        };
        let mut p = self.start_program(argv, box_opts, &cwd, &program, ctx).await?;
        match p.handle() {
            Some(h) => {
                if let Some(stdin) = p.stdin.take() {
                    self.stdins.lock().unwrap().insert(h, stdin);
                }
                Ok(h)
            }
            None => {
                // A box that said it keeps processes and gave this one no handle: nobody could
                // reach it again, so it does not run on.
                let _ = p.kill().await;
                Err(ExecError::new(
                    ExecCode::Unknown,
                    format!("box {} started the command but gave it no handle", self.sandbox.id()),
                ))
            }
        }
    }

    /// Start `argv` in the box, waiting for the start within [`START_TIMEOUT`] and `ctx`. The
    /// program lives by its own stop, not by the start's deadline; a start the deadline or the
    /// caller gave up on is killed once it is known.
    async fn start_program(
        &self,
        argv: Vec<String>,
        box_opts: BoxExecOptions,
        cwd: &str,
        program: &str,
        ctx: &Ctx,
    ) -> Result<agentbox_core::Process, ExecError> {
        let sandbox = self.sandbox.clone();
        let mut start = tokio::spawn(async move { sandbox.exec(&argv, &box_opts, &Ctx::background()).await });
        let started = match ctx.with_timeout(START_TIMEOUT).run(&mut start).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Err(ExecError::new(ExecCode::Unknown, format!("starting the command: {e}"))),
            Err(_) => {
                tokio::spawn(async move {
                    if let Ok(Ok(mut p)) = start.await {
                        let _ = p.kill().await;
                    }
                });
                if ctx.err().is_some() {
                    return Err(ExecError::new(
                        ExecCode::Aborted,
                        "the command was aborted as it started",
                    ));
                }
                let why = self.mark_lost(format!(
                    "box {} stopped answering: a command did not start within {}s",
                    self.sandbox.id(),
                    START_TIMEOUT.as_secs()
                ));
                return Err(self
                    .lost_exec()
                    .unwrap_or_else(|| ExecError::new(ExecCode::Unknown, why)));
            }
        };
        match started {
            Ok(p) => Ok(p),
            Err(e) => Err(self.refused_start(e, cwd, program, ctx).await),
        }
    }

    /// Why the runner would not start a command, in the words the host's exec uses.
    async fn refused_start(&self, e: agentbox_core::Error, cwd: &str, program: &str, ctx: &Ctx) -> ExecError {
        match e.code() {
            ErrorCode::Gone => {
                let why = self.mark_lost_by(format!("box {} is gone: {e}", self.sandbox.id()), e.clone());
                ExecError {
                    cause: Some(e),
                    ..ExecError::new(ExecCode::Unknown, why)
                }
            }
            ErrorCode::NotFound => {
                // The runner refuses a missing working directory and a missing program alike.
                let c = ctx.with_timeout(self.op_timeout);
                let is_dir = match self.sandbox.files() {
                    Some(f) => f.stat(cwd, true, &c).await.is_ok_and(|m| m.kind == FileType::Dir),
                    None => true,
                };
                let message = if !is_dir {
                    format!("Working directory does not exist: {cwd}")
                } else if program.is_empty() {
                    format!("the box's shell could not be started: {e}")
                } else {
                    format!("{program}: program not found")
                };
                ExecError {
                    cause: Some(e),
                    ..ExecError::new(ExecCode::SpawnError, message)
                }
            }
            _ => ExecError {
                cause: Some(e.clone()),
                ..ExecError::new(ExecCode::SpawnError, e.to_string())
            },
        }
    }

    async fn run_by_script(
        &self,
        command: Command,
        cwd: String,
        opts: ExecOptions,
        ctx: &Ctx,
    ) -> Result<ExecOutcome, ExecError> {
        let mut argv = vec![
            "sh".to_string(),
            "-c".into(),
            scripts::OUTER.into(),
            "agentbox-cmd".into(),
            scripts::COMMAND.into(),
        ];
        match &command {
            Command::Argv(a) => {
                argv.push("argv".into());
                argv.push(cwd.clone());
                argv.extend(a.iter().cloned());
            }
            Command::Shell(s) => {
                argv.push("shell".into());
                argv.push(cwd.clone());
                argv.push(s.clone());
            }
        }
        let mut env = BTreeMap::new();
        for (k, v) in &opts.env {
            if k == "PATH" {
                env.insert("AGENTBOX_CALLER_PATH".to_string(), v.clone());
            } else {
                env.insert(k.clone(), v.clone());
            }
        }
        if opts.inherit_env == Some(false) {
            env.insert("AGENTBOX_NOINHERIT".into(), "1".into());
            let keep: Vec<&str> = opts.env.keys().filter(|k| *k != "PATH").map(String::as_str).collect();
            env.insert("AGENTBOX_KEEP".into(), keep.join(" "));
        }
        let start_ctx = ctx.with_timeout(START_TIMEOUT);
        // The program runs under its own control below, not the start's deadline.
        let mut p = match self
            .sandbox
            .exec(
                &argv,
                &BoxExecOptions {
                    env,
                    ..Default::default()
                },
                &Ctx::background(),
            )
            .await
        {
            Ok(p) => p,
            Err(e) if e.code() == ErrorCode::Gone => {
                let why = self.mark_lost_by(format!("box {} is gone: {e}", self.sandbox.id()), e.clone());
                return Err(ExecError {
                    cause: Some(e),
                    ..ExecError::new(ExecCode::Unknown, why)
                });
            }
            Err(e) if e.code() == ErrorCode::NotFound => {
                return Err(ExecError::new(
                    ExecCode::SpawnError,
                    format!("the box cannot start commands (it needs setsid): {e}"),
                ));
            }
            Err(e) => {
                return Err(ExecError {
                    cause: Some(e.clone()),
                    ..ExecError::new(ExecCode::SpawnError, e.to_string())
                });
            }
        };
        drop(p.stdin.take()); // no input: the command reads EOF
        let mut stdout = p
            .stdout
            .take()
            .ok_or_else(|| ExecError::new(ExecCode::Unknown, "no stdout"))?;
        let Ok(header) = start_ctx.run(read_header(&mut stdout)).await else {
            let _ = p.kill().await;
            let why = self.mark_lost(format!(
                "box {} stopped answering: a command did not start within {}s",
                self.sandbox.id(),
                START_TIMEOUT.as_secs()
            ));
            return Err(ExecError {
                cause: self.lost_cause(),
                ..ExecError::new(
                    if ctx.err().is_some() {
                        ExecCode::Aborted
                    } else {
                        ExecCode::Unknown
                    },
                    why,
                )
            });
        };
        let line = String::from_utf8_lossy(&header).into_owned();
        let pgid: u32 = match line.strip_prefix("\0agentbox-cmd ") {
            Some("nocwd") => {
                return Err(ExecError::new(
                    ExecCode::SpawnError,
                    format!("Working directory does not exist: {cwd}"),
                ));
            }
            Some("noprog") => {
                return Err(ExecError::new(
                    ExecCode::SpawnError,
                    format!(
                        "{}: program not found",
                        match &command {
                            Command::Argv(a) => a[0].clone(),
                            Command::Shell(_) => String::new(),
                        }
                    ),
                ));
            }
            Some("noshell") => {
                return Err(ExecError::new(
                    ExecCode::ShellUnavailable,
                    "the box has neither bash nor sh",
                ));
            }
            Some(g) => g
                .parse()
                .map_err(|_| ExecError::new(ExecCode::Unknown, format!("unexpected header {line:?}")))?,
            None => {
                let status = p.wait().await;
                if !matches!(
                    self.sandbox.status(&Ctx::background()).await,
                    Ok(agentbox_core::Status::Running)
                ) {
                    let why = self.mark_lost(format!("box {} is gone", self.sandbox.id()));
                    return Err(self
                        .lost_exec()
                        .unwrap_or_else(|| ExecError::new(ExecCode::Unknown, why)));
                }
                return Err(ExecError::new(
                    ExecCode::SpawnError,
                    format!("the command did not start ({status:?})"),
                ));
            }
        };
        self.groups.lock().unwrap().insert(pgid);
        let stderr = p.stderr.take();
        let wait = async {
            p.wait()
                .await
                .map(|st| st.code)
                .map_err(|e| ExecError::new(ExecCode::Unknown, e.to_string()))
        };
        let ran = run_command(self, Some(stdout), stderr, wait, &opts, ctx).await;
        match ran {
            Ok(Ran::Exited(outcome)) => {
                self.groups.lock().unwrap().remove(&pgid);
                Ok(outcome)
            }
            Err(e) => {
                self.groups.lock().unwrap().remove(&pgid);
                Err(e)
            }
            Ok(Ran::Stopped { code, drain }) => {
                let confirmed = self.stop_group(pgid).await;
                // What the command printed as it was asked to end still reaches on_output.
                let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
                let what = stopped_message(code);
                if confirmed {
                    Err(ExecError::new(code, what))
                } else {
                    Err(ExecError {
                        kill_unconfirmed: true,
                        ..ExecError::new(
                            code,
                            format!("{what}, and its process group {pgid} could not be confirmed gone within 10s"),
                        )
                    })
                }
            }
        }
    }

    /// Kill a group a script started and confirm it is gone, trying again at 1, 2 and 4 s
    /// within 10 s.
    pub(super) async fn stop_group(&self, pgid: u32) -> bool {
        let start = tokio::time::Instant::now();
        for wait in [0u64, 1, 2, 4] {
            let at = start + Duration::from_secs(wait);
            if at >= start + KILL_BUDGET {
                break;
            }
            tokio::time::sleep_until(at).await;
            let left = (start + KILL_BUDGET).saturating_duration_since(tokio::time::Instant::now());
            let ctx = Ctx::background().with_timeout(left);
            let argv: Vec<String> = ["sh", "-c", scripts::KILL_GROUP, "agentbox-kill", &pgid.to_string()]
                .map(String::from)
                .to_vec();
            let said = match self.sandbox.exec(&argv, &BoxExecOptions::default(), &ctx).await {
                Ok(p) => finish(p, FinishOptions::default()).await.ok().map(|f| f.stdout_text()),
                Err(_) => None,
            };
            if said.is_some_and(|s| s.trim() == "gone") {
                self.groups.lock().unwrap().remove(&pgid);
                return true;
            }
        }
        false
    }

    /// End every command this environment started through the runner: those still running
    /// (their own exec then returns) and those whose stop was not confirmed.
    pub(super) async fn end_runner_commands(&self) {
        let (running, unconfirmed) = {
            let mut c = self.commands.lock().unwrap();
            (
                std::mem::take(&mut c.running).into_values().collect::<Vec<_>>(),
                std::mem::take(&mut c.unconfirmed),
            )
        };
        for k in &running {
            let _ = k.signal(SIGTERM).await;
        }
        for mut p in unconfirmed {
            if !stop_by_runner(&p.killer(), &mut p).await {
                self.commands.lock().unwrap().unconfirmed.push(p);
            }
        }
        if !running.is_empty() {
            tokio::time::sleep(GRACE).await;
            for k in &running {
                let _ = k.signal(SIGKILL).await;
            }
        }
    }
}

/// Ask a runner's process group to end, kill it a second later unless its leader ended, and
/// say whether the leader's end was seen within [`KILL_BUDGET`]. The runner signals the whole
/// group the program leads; once the leader ended on TERM the runner forgets the group, so a
/// member that outlives its leader is not killed (the runner offers no signal past that).
async fn stop_by_runner(killer: &Killer, p: &mut Process) -> bool {
    let ended = |r: agentbox_core::Result<agentbox_core::ExitStatus>| match r {
        Ok(_) => true,
        // A box that is gone holds no process.
        Err(e) => e.code() == ErrorCode::Gone,
    };
    let _ = killer.signal(SIGTERM).await;
    if let Ok(r) = tokio::time::timeout(GRACE, p.wait()).await {
        return ended(r);
    }
    let _ = killer.signal(SIGKILL).await;
    match tokio::time::timeout(KILL_BUDGET - GRACE, p.wait()).await {
        Ok(r) => ended(r),
        Err(_) => false,
    }
}

/// A command's header line (up to its newline, 64 bytes at most), which [`scripts::COMMAND`]
/// and [`scripts::ONE_CALL`] write before the command's own output.
pub(super) async fn read_header(stdout: &mut ByteReader) -> Vec<u8> {
    let mut header = Vec::new();
    let mut b = [0u8; 1];
    while header.len() < 64 {
        match stdout.read(&mut b).await {
            Ok(0) | Err(_) => break,
            Ok(_) if b[0] == b'\n' => break,
            Ok(_) => header.push(b[0]),
        }
    }
    header
}

/// Kill every command group a host that died left running in `sandbox`; the host that takes
/// a box over calls it once, before its first command. Returns the groups it killed.
///
/// These are the groups the scripts wrote down: a command started through the box's runner is
/// the runner's process, which this does not see.
pub async fn end_left_commands(sandbox: &dyn Sandbox, ctx: &Ctx) -> agentbox_core::Result<Vec<u32>> {
    let argv: Vec<String> = ["sh", "-c", scripts::END_LEFT, "agentbox-end-left"]
        .map(String::from)
        .to_vec();
    let p = sandbox.exec(&argv, &BoxExecOptions::default(), ctx).await?;
    let out = finish(p, FinishOptions::default()).await?;
    Ok(out
        .stdout_text()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect())
}

//! Boxes without live processes (their facts say `live_processes: false`, as Archil's do):
//! each exec is one call that answers only once its command ended, takes no stdin and no
//! variables of its own, and cannot be stopped while it runs; the box runs one call at a time.
//!
//! So over such a box nothing goes by a script's stdin or a process group:
//! - a write is one upload and a whole-file read one download, every byte exact (a command's
//!   output on such a box is text). A reader checks the file first by a script, which needs no
//!   stdin ([`scripts::READER_CHECKS`]), refuses it past its bound before a byte moves, then
//!   downloads it within that bound. A transfer that fails for a reason of the file (no such
//!   file, a directory, one on the way) is asked again of the box by a script that opens it and
//!   moves nothing, so the error is the one the host's own call gives;
//! - an append uploads its bytes to a file of their own under the workspace, then one command
//!   ([`scripts::APPEND_FROM`]) appends that file to the target and removes it, so a command the
//!   box runs beside it keeps its own change (a download and an upload of the whole would lose
//!   it);
//! - uploads and downloads reach only the workspace: a path outside it is read as text through
//!   a script's output, and never written;
//! - temporary and spill files go under the workspace, in [`WORKSPACE_TEMP_DIR`];
//! - a command ([`scripts::ONE_CALL`]) runs to its end, its own deadline the caller's timeout
//!   (or what is left of the caller's context) within the box's bound on one call. A caller
//!   that gives up is answered at once; its command, which nothing can reach, runs on to that
//!   deadline while the box's next call waits for it, and one that had not started is never
//!   run. A per-call variable is refused, PATH too: such a box carries none.

use std::time::Duration;

use agentbox_core::{Ctx, ErrorCode, ExecOptions as BoxExecOptions};

use super::exec::read_header;
use super::runner::Op;
use super::script::{parse_info, refused_link, text};
use super::{BoxEnv, scripts};
use crate::output::{Ran, race, run_command, stopped_message};
use crate::path::join;
use crate::{BinaryReader, Command, ExecCode, ExecError, ExecOptions, ExecOutcome, FsCode, FsError};

/// The directory under the workspace holding an environment's temporary files and the bytes of
/// appends on their way: the workspace is the one place an upload reaches.
pub const WORKSPACE_TEMP_DIR: &str = ".agentbox-hands";

/// How long past the caller's timeout a command's call may take to answer: the box starts the
/// command's own deadline when the command starts, a little after the call was sent, and the
/// answer (with what the command printed until then) comes after it.
const ANSWER_GRACE: Duration = Duration::from_secs(5);

/// Ends a context when dropped: however a command's run returns, a call of it the box has not
/// started yet is never started later.
struct EndOnDrop(Ctx);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

impl BoxEnv {
    /// Whether the box runs each command as one call that answers once it ended, with no
    /// program living between calls: what every operation here decides by.
    pub(super) fn one_call(&self) -> bool {
        !self.sandbox.facts().live_processes
    }

    /// The box's workspace, folded, where its facts name one.
    fn workspace(&self) -> Option<String> {
        self.sandbox.facts().workspace.as_deref().map(crate::path::normalize)
    }

    /// `path` (absolute and folded, as [`BoxEnv::p`] makes it) relative to the workspace, where
    /// it lies within it: what an upload or a download is given. The workspace itself is `.`.
    pub(super) fn in_workspace(&self, path: &str) -> Option<String> {
        let ws = self.workspace()?;
        if path == ws {
            return Some(".".into());
        }
        let rest = if ws == "/" {
            path.strip_prefix('/')?
        } else {
            path.strip_prefix(ws.as_str())?.strip_prefix('/')?
        };
        (!rest.is_empty()).then(|| rest.to_string())
    }

    /// Where this environment's temporary files go: under the workspace on a box without live
    /// processes (a spill file is written there by upload), `None` on any other box.
    pub(super) fn temp_base(&self) -> Option<String> {
        if !self.one_call() {
            return None;
        }
        self.workspace().map(|ws| join(&[&ws, WORKSPACE_TEMP_DIR]))
    }

    /// A refusal of `what` on a path outside the workspace, naming the path and why.
    fn outside(&self, path: &str, what: &str, why: &str) -> FsError {
        let place = match self.workspace() {
            Some(ws) => format!("it is outside the workspace {ws} of box {}", self.sandbox.id()),
            None => format!("box {} names no workspace", self.sandbox.id()),
        };
        FsError::new(
            FsCode::NotSupported,
            path,
            format!(
                "{path}: cannot {what} it: {place}, which runs each command as one call that takes no input and answers in text, so {why}"
            ),
        )
    }

    /// The command's own deadline on such a box: `asked`, no later than what is left of `ctx`,
    /// within the box's bound on one call (`max_exec_ms`), so nothing runs on past the caller.
    pub(super) fn own_deadline(&self, asked: Option<Duration>, ctx: &Ctx) -> Option<Duration> {
        let limit = self.sandbox.facts().max_exec_ms.map(Duration::from_millis);
        let left = ctx.remaining().filter(|d| !d.is_zero());
        [asked, left, limit].into_iter().flatten().min()
    }

    /// A transfer's failure: the box's loss, a deadline or a bound as any operation's; any other
    /// (the file's own, or the provider's words for it) asked again of the box by `why`, a
    /// script that opens the path and moves nothing, so the error is the host's.
    async fn transfer_failed(&self, e: agentbox_core::Error, op: &Op, why: &str) -> FsError {
        match e.code() {
            ErrorCode::Aborted | ErrorCode::Timeout | ErrorCode::Gone | ErrorCode::TooLarge => {
                self.box_error(e, &op.path, &op.caller)
            }
            _ => match self.ok(why, &[&op.path], vec![], &op.caller).await {
                Err(found) => found,
                Ok(_) => FsError::new(FsCode::Unknown, &op.path, format!("box {}: {e}", self.sandbox.id())),
            },
        }
    }

    /// A file's bytes by one download within `max` bytes (`rel` within the workspace).
    async fn download(&self, op: &Op, rel: &str, max: u64) -> Result<Vec<u8>, FsError> {
        match self.sandbox.download(rel, max, &op.ctx).await {
            Ok(b) => Ok(b),
            Err(e) => Err(self.transfer_failed(e, op, scripts::WHY_NOT_READ).await),
        }
    }

    /// A whole file: its bytes by download within the workspace (bounded as a reader is);
    /// outside it, its text through a script's output where `text_ok`, else refused.
    pub(super) async fn read_one_call(&self, op: &Op, text_ok: bool) -> Result<Vec<u8>, FsError> {
        match self.in_workspace(&op.path) {
            Some(rel) => self.download(op, &rel, self.max_reader_bytes).await,
            None if text_ok => self.ok(scripts::READ, &[&op.path], vec![], &op.caller).await,
            None => Err(self.outside(
                &op.path,
                "read the bytes of",
                "bytes come exactly only by download, which reads within the workspace alone (it can be read as text)",
            )),
        }
    }

    /// A binary reader: the host's checks by a script (a link with `no_follow`, a directory,
    /// the bound), then the bytes by one download within the bound, so a file over it moves
    /// nothing.
    pub(super) async fn reader_one_call(&self, op: &Op, no_follow: bool) -> Result<BinaryReader, FsError> {
        let p = op.path.as_str();
        let Some(rel) = self.in_workspace(p) else {
            return Err(self.outside(
                p,
                "open a binary reader on",
                "bytes come exactly only by download, which reads within the workspace alone (it can be read as text)",
            ));
        };
        let max = self.max_reader_bytes;
        let nf = if no_follow { "1" } else { "0" };
        let out = self
            .ok(scripts::READER_CHECKS, &[p, &max.to_string(), nf], vec![], &op.caller)
            .await
            .map_err(|e| refused_link(e, p, no_follow))?;
        let info = parse_info(p, text(out).trim_end_matches('\n'))?;
        let bytes = self.download(op, &rel, max).await?;
        Ok(BinaryReader::new(info, bytes))
    }

    /// A write by one upload, or an append by an upload of its bytes to a file of their own
    /// and one command that appends it; refused outside the workspace.
    pub(super) async fn put_one_call(&self, op: &Op, data: &[u8], append: bool) -> Result<(), FsError> {
        let (Some(rel), Some(ws)) = (self.in_workspace(&op.path), self.workspace()) else {
            return Err(self.outside(
                &op.path,
                if append { "append to" } else { "write" },
                "bytes reach it only by upload, which writes within the workspace alone",
            ));
        };
        if !append {
            return match self.sandbox.upload(&rel, data, &op.ctx).await {
                Ok(()) => Ok(()),
                Err(e) => Err(self.transfer_failed(e, op, scripts::WHY_NOT_WRITTEN).await),
            };
        }
        let name = format!("append-{}", crate::host::random_suffix(&op.path)?);
        let tmp = join(&[&ws, WORKSPACE_TEMP_DIR, &name]);
        // Kept as a temporary until the command removed it: one an abort left is cleanup's.
        self.temps.lock().unwrap().insert(tmp.clone());
        self.sandbox
            .upload(&format!("{WORKSPACE_TEMP_DIR}/{name}"), data, &op.ctx)
            .await
            .map_err(|e| self.box_error(e, &op.path, &op.caller))?;
        self.ok(scripts::APPEND_FROM, &[&op.path, &tmp], vec![], &op.caller)
            .await?;
        self.temps.lock().unwrap().remove(&tmp);
        Ok(())
    }

    /// Run a command as one call: to its end, with no group to track and nothing to kill.
    pub(super) async fn run_one_call(
        &self,
        command: Command,
        cwd: String,
        opts: ExecOptions,
        ctx: &Ctx,
    ) -> Result<ExecOutcome, ExecError> {
        let id = self.sandbox.id();
        if !opts.env.is_empty() {
            let names: Vec<&str> = opts.env.keys().map(String::as_str).collect();
            return Err(ExecError::new(
                ExecCode::SpawnError,
                format!(
                    "env ({}): box {id} takes no variables for one command: it runs each command as one call that carries the command alone (its facts say live_processes: false); set them in the command itself",
                    names.join(", ")
                ),
            ));
        }
        let asked = match opts.timeout {
            None => None,
            Some(t) if t.is_finite() && t <= 0.0 => {
                return Err(ExecError::new(
                    ExecCode::Timeout,
                    format!("the command timed out before it started: a timeout of {t} seconds leaves it no time"),
                ));
            }
            Some(t) => Some(Duration::try_from_secs_f64(t).map_err(|_| {
                ExecError::new(
                    ExecCode::SpawnError,
                    format!("timeout {t}: not a number of seconds a box can keep"),
                )
            })?),
        };
        if let Some(e) = ctx.err() {
            let code = exec_code(e.code());
            return Err(ExecError::new(
                code,
                format!("{} before it started", stopped_message(code)),
            ));
        }
        let own = self.own_deadline(asked, ctx);
        // The call answers once the command ended; past the caller's timeout (and a grace for
        // the answer) it is given up, and so is it when the caller's context ends.
        let run_ctx = match asked {
            Some(d) => ctx.with_timeout(d.saturating_add(ANSWER_GRACE)),
            None => ctx.child(),
        };
        let _end = EndOnDrop(run_ctx.clone());
        let program = match &command {
            Command::Argv(a) => a[0].clone(),
            Command::Shell(_) => String::new(),
        };
        let vars = if opts.inherit_env == Some(false) {
            "clean"
        } else {
            "keep"
        };
        let mut argv = vec![
            "sh".to_string(),
            "-c".into(),
            scripts::ONE_CALL.into(),
            "agentbox-cmd".into(),
        ];
        match command {
            Command::Argv(a) => {
                argv.extend(["argv".to_string(), cwd.clone(), vars.into()]);
                argv.extend(a);
            }
            Command::Shell(s) => argv.extend(["shell".to_string(), cwd.clone(), vars.into(), s]),
        }
        let box_opts = BoxExecOptions {
            timeout: own,
            ..Default::default()
        };
        // The exec itself may answer only once the command ended: its start is raced against
        // the caller as the rest is.
        let started = race(
            async {
                let mut p = self.sandbox.exec(&argv, &box_opts, &run_ctx).await?;
                if let Some(mut stdin) = p.stdin.take() {
                    // Nothing was written: the close is the command's EOF.
                    let _ = stdin.close().await;
                }
                let mut stdout = p.stdout.take();
                let header = match stdout.as_mut() {
                    Some(s) => read_header(s).await,
                    None => Vec::new(),
                };
                Ok::<_, agentbox_core::Error>((p, stdout, header))
            },
            &run_ctx,
            None,
        )
        .await;
        let (mut p, stdout, header) = match started {
            Err(code) => return Err(self.gave_up(code, own)),
            Ok(Err(e)) => return Err(self.call_failed(e, true, asked, own, &run_ctx)),
            Ok(Ok(started)) => started,
        };
        match String::from_utf8_lossy(&header).strip_prefix("\0agentbox-cmd ") {
            Some("run") => {}
            Some("nocwd") => {
                return Err(ExecError::new(
                    ExecCode::SpawnError,
                    format!("Working directory does not exist: {cwd}"),
                ));
            }
            Some("noprog") => {
                return Err(ExecError::new(
                    ExecCode::SpawnError,
                    format!("{program}: program not found"),
                ));
            }
            Some("noshell") => {
                return Err(ExecError::new(
                    ExecCode::ShellUnavailable,
                    "the box has neither bash nor sh",
                ));
            }
            _ => {
                // No header: the command never ran as asked; how the call ended says why.
                return Err(match race(p.wait(), &run_ctx, None).await {
                    Err(code) => self.gave_up(code, own),
                    Ok(Err(e)) => self.call_failed(e, false, asked, own, &run_ctx),
                    Ok(Ok(st)) => ExecError::new(
                        ExecCode::SpawnError,
                        format!(
                            "the command did not start in box {id} (its call ended with exit {})",
                            st.code
                        ),
                    ),
                });
            }
        }
        let stderr = p.stderr.take();
        let wait = async {
            match p.wait().await {
                Ok(st) => Ok(st.code),
                Err(e) => Err(self.call_failed(e, false, asked, own, &run_ctx)),
            }
        };
        // The run's context carries the deadline: the output arrives at the end, all at once.
        let run_opts = ExecOptions { timeout: None, ..opts };
        match run_command(self, stdout, stderr, wait, &run_opts, &run_ctx).await {
            Ok(Ran::Exited(outcome)) => Ok(outcome),
            Ok(Ran::Stopped { code, drain }) => {
                // Its output comes only with the call's answer, which nobody waits for now.
                drain.abort();
                Err(self.gave_up(code, own))
            }
            // Its own failure, or one the wait already read as a stop.
            Err(e) if e.code == ExecCode::CallbackError || e.kill_unconfirmed => Err(e),
            Err(e) => Err(match run_ctx.err() {
                Some(c) => self.gave_up(exec_code(c.code()), own),
                None => e,
            }),
        }
    }

    /// A command this environment gave up on: nothing can stop it, so say what becomes of it.
    fn gave_up(&self, code: ExecCode, own: Option<Duration>) -> ExecError {
        let until = match own {
            Some(d) => format!("its own deadline, {} seconds after it started", secs(d)),
            None => "the box's own bound on one call".into(),
        };
        ExecError {
            kill_unconfirmed: true,
            ..ExecError::new(
                code,
                format!(
                    "{}: box {} runs each command as one call that nothing reaches once it runs, so it could not be stopped: a command that started runs on until it ends or {until}, and the box's next call waits for it (one that had not started is never run)",
                    stopped_message(code),
                    self.sandbox.id()
                ),
            )
        }
    }

    /// A call that failed: given up where the run's context ended; else the box's loss, its
    /// own deadline, or a refusal (`starting`) or failure of the command.
    fn call_failed(
        &self,
        e: agentbox_core::Error,
        starting: bool,
        asked: Option<Duration>,
        own: Option<Duration>,
        run_ctx: &Ctx,
    ) -> ExecError {
        if let Some(c) = run_ctx.err() {
            return self.gave_up(exec_code(c.code()), own);
        }
        let id = self.sandbox.id();
        let (code, message) = match e.code() {
            ErrorCode::Gone => (
                ExecCode::Unknown,
                self.mark_lost_by(format!("box {id} is gone: {e}"), e.clone()),
            ),
            ErrorCode::Timeout => {
                let at = match (own, asked) {
                    (Some(o), Some(a)) if o < a => format!(
                        "its bound on one call, {} seconds, before the {} asked",
                        secs(o),
                        secs(a)
                    ),
                    (Some(o), _) => format!("its own deadline, {} seconds after it started", secs(o)),
                    (None, _) => "its own bound on one call".into(),
                };
                (
                    ExecCode::Timeout,
                    format!("the command timed out: box {id} ended it at {at} ({})", e.message()),
                )
            }
            _ if starting => (ExecCode::SpawnError, format!("starting the command in box {id}: {e}")),
            _ => (ExecCode::Unknown, format!("box {id}: {e}")),
        };
        ExecError {
            cause: Some(e),
            ..ExecError::new(code, message)
        }
    }
}

/// A context's end as a stop's code.
fn exec_code(c: ErrorCode) -> ExecCode {
    if c == ErrorCode::Timeout {
        ExecCode::Timeout
    } else {
        ExecCode::Aborted
    }
}

/// Seconds as a person reads them: `300`, `1.5`.
fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}")
    } else {
        format!("{s:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reader_checks_are_the_open_readers_own() {
        assert_eq!(
            scripts::OPEN_READER,
            format!("{}\nexec cat -- \"$1\"", scripts::READER_CHECKS)
        );
        assert!(scripts::READER_CHECKS.ends_with("printf '%s\\n' \"$info\""));
    }

    #[test]
    fn seconds_read_as_people_write_them() {
        assert_eq!(secs(Duration::from_secs(300)), "300");
        assert_eq!(secs(Duration::from_millis(1500)), "1.5");
    }
}

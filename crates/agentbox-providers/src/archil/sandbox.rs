//! One archil box: its record, its per-box queue, and each operation as Archil calls.

use crate::shell::quote;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use agentbox_core::{
    Ctx, Endpoint, Error, ErrorCode, ExecOptions, ExitStatus, Facts, Labels, NoInput, Process, ProcessControl, Result,
    Sandbox, SandboxId, Status, now_ms, within_workspace,
};
use async_trait::async_trait;
use serde_json::json;
use tracing::Instrument;

use super::api::{Api, ExecAnswer};
use super::record::{MAX_RECORD, Record};
use super::{ArchilOptions, BOXES, WORKSPACE};

/// What every box of one provider shares: the API and the options.
pub(crate) struct Shared {
    pub api: Api,
    pub opts: ArchilOptions,
    pub queues: Queues,
}

/// Time for the VM to start and the answer to come back, past a command's own deadline.
const CALL_SLACK: Duration = Duration::from_secs(60);
/// The deadline of the command that removes a box's directory.
const REMOVE_DEADLINE: Duration = Duration::from_secs(60);
/// How long `timeout` waits after its TERM before it kills: short enough that a command which
/// ignores TERM still ends before the platform cuts the call.
const KILL_AFTER_S: u32 = 2;
/// The exit code the command line answers when the cwd asked for is not a directory, with
/// the call's own mark on stderr (so no program's exit can pass for it).
const NO_CWD_EXIT: i32 = 254;

impl Shared {
    /// Write `record` (replacing one of its box).
    pub(crate) async fn write_record(&self, ctx: &Ctx, disk: &str, record: &Record) -> Result<()> {
        self.api
            .put_object(ctx, disk, &Record::key(&record.id), &record.to_bytes())
            .await
            .map_err(|e| e.context(format!("writing the record of archil box {}", record.id)))
    }

    /// The record of box `name`, `None` where there is none (it ended, or never was).
    pub(crate) async fn read_record(&self, ctx: &Ctx, disk: &str, name: &str) -> Result<Option<Record>> {
        match self.api.get_object(ctx, disk, &Record::key(name), MAX_RECORD).await {
            Ok(Some(bytes)) => Record::parse(&bytes, name).map(Some),
            Ok(None) => Ok(None),
            Err(e) if e.code() == ErrorCode::TooLarge => Err(Error::invalid(format!(
                "the record of archil box {name} is over {MAX_RECORD} bytes"
            ))),
            Err(e) => Err(e),
        }
    }

    /// Whether box `name`'s record is still there (one HEAD).
    async fn recorded(&self, ctx: &Ctx, disk: &str, name: &str) -> Result<bool> {
        Ok(self.api.head_object(ctx, disk, &Record::key(name)).await?.is_some())
    }

    /// Remove box `name`'s directory through its parent: one exec with `boxes/` mounted and
    /// the box's directory checked out, so it waits [`ArchilOptions::destroy_wait`] for a
    /// command that holds it, and no longer.
    pub(crate) async fn remove_dir(&self, ctx: &Ctx, disk: &str, name: &str) -> Result<()> {
        if !super::is_box_name(name) {
            return Err(Error::invalid(format!(
                "{name:?} is not a box's directory (16 lowercase hex digits): left as it is"
            )));
        }
        let body = json!({
            "disks": { "boxes": {
                "disk": disk,
                "subdirectory": BOXES,
                "checkoutPaths": [name],
                "queueMs": self.opts.destroy_wait.as_millis() as u64,
            }},
            "command": format!(
                "timeout {} rm -rf -- {}",
                REMOVE_DEADLINE.as_secs(),
                quote(&format!("/mnt/archil/boxes/{name}"))
            ),
        });
        let timeout = self.opts.destroy_wait + REMOVE_DEADLINE + CALL_SLACK;
        let ctx = ctx.child();
        let a = self.api.exec(&ctx.with_timeout(timeout), &body, timeout).await?;
        if a.exit_code != 0 {
            return Err(Error::unknown(format!(
                "removing the directory of archil box {name}: rm exited {}: {}",
                a.exit_code,
                a.stderr.trim()
            )));
        }
        Ok(())
    }
}

/// Each box's queue in this provider, by box: calls to one box go one at a time, in the order
/// they were asked (tokio's mutex is fair), whichever handle of the box asks. A queue is let go
/// when no handle of its box is left. Another provider (another process, or a second one in
/// this) shares none of it: Archil's checkout keeps them apart.
#[derive(Default)]
pub(crate) struct Queues(Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>);

impl Queues {
    fn of(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, q| q.strong_count() > 0);
        if let Some(q) = map.get(name).and_then(Weak::upgrade) {
            return q;
        }
        let q = Arc::new(tokio::sync::Mutex::new(()));
        map.insert(name.to_string(), Arc::downgrade(&q));
        q
    }
}

/// A box of an Archil disk. See the [module documentation](super).
pub struct ArchilSandbox {
    shared: Arc<Shared>,
    disk: String,
    id: SandboxId,
    /// The box's own name: its directory `boxes/<name>/` and its record.
    name: String,
    labels: Labels,
    facts: Facts,
    ends_at_ms: u64,
    queue: Arc<tokio::sync::Mutex<()>>,
    /// Why the box ended, once this handle knows it did.
    ended: Mutex<Option<String>>,
}

impl ArchilSandbox {
    pub(crate) fn new(shared: Arc<Shared>, disk: String, id: SandboxId, record: Record) -> Self {
        let facts = record.facts(shared.opts.exec_limit.as_millis() as u64);
        ArchilSandbox {
            queue: shared.queues.of(&record.id),
            name: record.id,
            labels: record.labels,
            ends_at_ms: record.ends_at_ms,
            shared,
            disk,
            id,
            facts,
            ended: Mutex::new(None),
        }
    }

    /// The box's lifetime has passed.
    pub(crate) fn past_end(&self) -> bool {
        now_ms() >= self.ends_at_ms
    }

    fn ended_why(&self) -> Option<String> {
        self.ended.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn mark_ended(&self, why: &str) {
        let mut e = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        if e.is_none() {
            *e = Some(why.to_string());
        }
    }

    /// End the box as a call found it (its lifetime passed): the record deleted, then the
    /// directory removed, each failure logged and left to the next list's sweep.
    pub(crate) async fn end(&self, ctx: &Ctx, why: &str) {
        self.mark_ended(why);
        tracing::info!(box_id = %self.id, why, "archil: box ended");
        let ctx = ctx.child().with_timeout(self.shared.opts.request_timeout);
        if let Err(e) = self
            .shared
            .api
            .delete_object(&ctx, &self.disk, &Record::key(&self.name))
            .await
        {
            tracing::warn!(box_id = %self.id, "archil: the record of an ended box was not deleted: {e}");
            return;
        }
        if let Err(e) = self.shared.remove_dir(&ctx, &self.disk, &self.name).await {
            tracing::warn!(box_id = %self.id, "archil: the directory of an ended box is left to the next list: {e}");
        }
    }

    /// The check every call makes first: the box has not ended by this handle, by its
    /// lifetime, or by another client (its record is gone).
    async fn check(&self, ctx: &Ctx) -> Result<()> {
        if let Some(why) = self.ended_why() {
            return Err(Error::gone(format!("archil box {} ended: {why}", self.id)));
        }
        if self.past_end() {
            self.end(ctx, "its lifetime passed").await;
            return Err(Error::gone(format!(
                "archil box {} ended: its lifetime passed",
                self.id
            )));
        }
        if !self.shared.recorded(ctx, &self.disk, &self.name).await? {
            self.mark_ended("destroyed (its record is gone)");
            return Err(Error::gone(format!(
                "archil box {} ended: destroyed (its record is gone)",
                self.id
            )));
        }
        Ok(())
    }

    /// The object key of `path` (relative to the workspace, or absolute within it). The key is
    /// under the box's directory; a link a command made there is followed by the object API,
    /// within the disk, as the shared disk allows (see the module documentation).
    fn key_of(&self, path: &str) -> Result<String> {
        let rel = relative_to_workspace(path)?;
        Ok(format!("{BOXES}/{}/{rel}", self.name))
    }

    /// The command's own deadline: the exec's timeout, else [`ArchilOptions::own_deadline`],
    /// no later than the caller's context or the box's end.
    fn deadline(&self, asked: Option<Duration>, ctx: &Ctx) -> Duration {
        let mut d = asked
            .unwrap_or(self.shared.opts.own_deadline)
            .min(self.shared.opts.own_deadline);
        if let Some(left) = ctx.remaining() {
            d = d.min(left);
        }
        d = d.min(Duration::from_millis(self.ends_at_ms.saturating_sub(now_ms())));
        d.max(Duration::from_millis(100))
    }

    /// Send one exec call for this box once its turn in this process's queue comes, and
    /// answer when it ends or when `ctx` does. The call itself runs on (holding the queue) to
    /// its end: nothing can stop a running command, so the next call waits for it; a call
    /// whose caller gave up before its turn is never sent.
    ///
    /// The command's own deadline is worked out once its turn came (a wait behind another
    /// command comes off the caller's time), and `command` makes the command line from it.
    /// Archil's queue waits no longer than the caller would.
    async fn call(
        &self,
        ctx: &Ctx,
        asked: Option<Duration>,
        command: impl FnOnce(Duration) -> String,
    ) -> Result<(ExecAnswer, Duration)> {
        // Until the call is sent, a failure is of a call never made (receipts do not count it).
        let turn = ctx
            .run(self.queue.clone().lock_owned())
            .await
            .map_err(Error::not_made)?;
        self.check(ctx).await.map_err(Error::not_made)?;
        ctx.check().map_err(Error::not_made)?;
        let deadline = self.deadline(asked, ctx);
        let mut queue = self.shared.opts.queue;
        if let Some(left) = ctx.remaining() {
            queue = queue.min(left);
        }
        let body = json!({
            "disks": { "box": {
                "disk": self.disk,
                "subdirectory": format!("{BOXES}/{}", self.name),
                "queueMs": queue.as_millis() as u64,
            }},
            "command": command(deadline),
        });
        let timeout = queue + deadline + CALL_SLACK;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let api = self.shared.api.clone();
        let id = self.id.clone();
        tokio::spawn(async move {
            let t = std::time::Instant::now();
            let r = api.exec(&Ctx::background().with_timeout(timeout), &body, timeout).await;
            match &r {
                Ok(a) => tracing::debug!(
                    box_id = %id,
                    exit = a.exit_code,
                    queue_ms = a.timing.as_ref().map(|t| t.queue_ms),
                    execute_ms = a.timing.as_ref().map(|t| t.execute_ms),
                    took_ms = t.elapsed().as_millis() as u64,
                    "archil: exec answered"
                ),
                Err(e) => tracing::debug!(box_id = %id, "archil: exec failed: {e}"),
            }
            drop(turn);
            let _ = tx.send(r);
        });
        tokio::select! {
            r = rx => r
                .unwrap_or_else(|_| Err(Error::unknown("the exec call's task ended without an answer")))
                .map(|a| (a, deadline)),
            e = ctx.done() => Err(Error::new(e.code(), format!(
                "{}: the command cannot be stopped in Archil and runs on to its own deadline of {:.1}s; \
                 the box's next call waits for it",
                e.message(),
                deadline.as_secs_f64()
            ))),
        }
    }
}

/// `path` as a path under the workspace ([`within_workspace`]).
fn relative_to_workspace(path: &str) -> Result<String> {
    within_workspace(
        path,
        WORKSPACE,
        ": an archil box moves files only by paths within its own directory of the disk",
    )
}

/// The shell line one exec sends: into the box's directory, into `cwd` (or mark that it is
/// missing), then `argv` under `timeout` with the command's own deadline.
fn command_line(argv: &[String], cwd: Option<&str>, deadline: Duration, mark: &str) -> String {
    let mut s = format!("cd {WORKSPACE} || exit 1; ");
    if let Some(cwd) = cwd {
        s.push_str(&format!(
            "cd -- {} 2>/dev/null || {{ echo {mark} >&2; exit {NO_CWD_EXIT}; }}; ",
            quote(cwd)
        ));
    }
    s.push_str(&format!(
        "exec timeout -k {KILL_AFTER_S} {:.3} ",
        deadline.as_secs_f64()
    ));
    let words: Vec<String> = argv.iter().map(|a| quote(a)).collect();
    s.push_str(&words.join(" "));
    s
}

/// How an answered exec ended, as the contract reads it.
fn outcome(a: &ExecAnswer, deadline: Duration) -> Result<ExitStatus> {
    let ran_ms = a.timing.as_ref().map(|t| t.execute_ms);
    match a.exit_code {
        124 => Err(Error::timeout(format!(
            "the command passed its deadline of {:.1}s in the box (exit 124, as `timeout` ends it)",
            deadline.as_secs_f64()
        ))),
        // `timeout` kills a command that ignored its TERM, and then exits 137: a deadline
        // only where the call ran that long.
        137 if ran_ms.is_some_and(|ms| ms >= deadline.as_millis() as u64) => Err(Error::timeout(format!(
            "the command passed its deadline of {:.1}s in the box and was killed {KILL_AFTER_S}s after \
             its TERM (exit 137)",
            deadline.as_secs_f64()
        ))),
        n if n < 0 => match n.checked_neg() {
            Some(sig) => Ok(ExitStatus::signaled(sig)),
            None => Err(Error::unknown(format!("Archil answered the exit code {n}"))),
        },
        n => Ok(ExitStatus::exited(n)),
    }
}

/// A program that ended before it was handed out.
struct Ended(Result<ExitStatus>);

#[async_trait]
impl ProcessControl for Ended {
    async fn wait(&self) -> Result<ExitStatus> {
        self.0.clone()
    }
    async fn signal(&self, _signal: i32) -> Result<()> {
        // It has ended: a signal to an ended program is no error.
        Ok(())
    }
}

/// The stdin of a program in an archil box: every write is refused `unsupported`.
const NO_STDIN: NoInput = NoInput(
    "stdin: an archil box's program takes no input (Archil's exec carries only the command); upload a file and \
     name it instead",
);

#[async_trait]
impl Sandbox for ArchilSandbox {
    fn id(&self) -> &SandboxId {
        &self.id
    }

    fn facts(&self) -> &Facts {
        &self.facts
    }

    fn labels(&self) -> &Labels {
        &self.labels
    }

    async fn exec(&self, argv: &[String], opts: &ExecOptions, ctx: &Ctx) -> Result<Process> {
        opts.validate(argv)?;
        opts.refuse(
            false,
            false,
            true,
            "an archil box runs each command as one call that ends with it, with no terminal",
        )?;
        if !opts.env.is_empty() {
            let names: Vec<&str> = opts.env.keys().map(String::as_str).collect();
            return Err(Error::unsupported(format!(
                "exec env ({}): an archil box carries no environment (Archil's exec takes only the command, and a \
                 value written into it or onto the disk is readable by every command there)",
                names.join(", ")
            )));
        }
        let limit = self.shared.opts.exec_limit;
        if let Some(t) = opts.timeout
            && t > limit
        {
            return Err(Error::invalid(format!(
                "exec timeout: {}ms is over Archil's {}ms limit of one exec call",
                t.as_millis(),
                limit.as_millis()
            )));
        }
        ctx.check()?;
        let mark = format!("agentbox-no-cwd-{}", crate::random::random_hex(8)?);
        let cwd = opts.cwd.as_deref();
        let span = tracing::debug_span!("archil exec", box_id = %self.id, program = %argv[0]);
        let made = |deadline| command_line(argv, cwd, deadline, &mark);
        let (a, deadline) = match self.call(ctx, opts.timeout, made).instrument(span).await {
            Err(e) if e.message().contains("checkout_timeout") => {
                return Err(e.context(format!(
                    "another process held archil box {} past the queue's wait",
                    self.id
                )));
            }
            r => r?,
        };
        if a.exit_code == NO_CWD_EXIT && a.stderr.trim_end() == mark {
            return Err(Error::not_found(format!(
                "exec cwd: {:?}: no such directory in archil box {}",
                opts.cwd.as_deref().unwrap_or_default(),
                self.id
            )));
        }
        let status = outcome(&a, deadline);
        let stdout: agentbox_core::ByteReader = Box::pin(std::io::Cursor::new(a.stdout.into_bytes()));
        let stderr: agentbox_core::ByteReader = Box::pin(std::io::Cursor::new(a.stderr.into_bytes()));
        Ok(Process::new(
            Some(Box::pin(NO_STDIN)),
            Some(stdout),
            Some(stderr),
            Arc::new(Ended(status)),
            ctx,
        ))
    }

    async fn status(&self, ctx: &Ctx) -> Result<Status> {
        match self.check(ctx).await {
            Ok(()) => Ok(Status::Running),
            Err(e) if e.code() == ErrorCode::Gone => Ok(Status::Ended),
            Err(e) => Err(e),
        }
    }

    async fn upload(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<()> {
        let key = self.key_of(path)?;
        let _turn = ctx.run(self.queue.lock()).await?;
        self.check(ctx).await?;
        // No checkout: while another process's command holds the directory, Archil refuses the
        // write, and it is tried again for as long as an exec would queue.
        let until = std::time::Instant::now() + self.shared.opts.queue;
        let mut pause = Duration::from_millis(100);
        loop {
            match self.shared.api.put_object(ctx, &self.disk, &key, data).await {
                Err(e) if e.code() == ErrorCode::Refused && std::time::Instant::now() + pause < until => {
                    tracing::debug!(box_id = %self.id, path, "archil: the directory is held; the upload waits");
                    ctx.run(tokio::time::sleep(pause)).await?;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                r => return r.map_err(|e| e.context(format!("uploading {path} to archil box {}", self.id))),
            }
        }
    }

    async fn download(&self, path: &str, max_bytes: u64, ctx: &Ctx) -> Result<Vec<u8>> {
        let key = self.key_of(path)?;
        let _turn = ctx.run(self.queue.lock()).await?;
        self.check(ctx).await?;
        let api = &self.shared.api;
        let missing = || Error::not_found(format!("{path}: no such file in archil box {}", self.id));
        // The size first, so a file over the bound is refused before a byte of it moves.
        let size = api.head_object(ctx, &self.disk, &key).await?.ok_or_else(missing)?;
        if size > max_bytes {
            return Err(Error::too_large(format!(
                "{path}: {size} bytes, over the {max_bytes} asked for at most"
            )));
        }
        api.get_object(ctx, &self.disk, &key, max_bytes)
            .await?
            .ok_or_else(missing)
    }

    async fn endpoint(&self, port: u16, _ctx: &Ctx) -> Result<Endpoint> {
        Err(Error::unsupported(format!(
            "endpoint {port}: an archil box exposes no port (no program runs between calls)"
        )))
    }

    async fn destroy(&self, ctx: &Ctx) -> Result<()> {
        if self.ended_why().is_some() {
            return Ok(());
        }
        // The record first: with it gone the box has ended for every client at once, whatever
        // still runs in it.
        self.shared
            .api
            .delete_object(ctx, &self.disk, &Record::key(&self.name))
            .await
            .map_err(|e| e.context(format!("destroying archil box {}", self.id)))?;
        self.mark_ended("destroyed");
        if let Err(e) = self.shared.remove_dir(ctx, &self.disk, &self.name).await {
            tracing::warn!(box_id = %self.id, "archil: the box's directory is left to the next list's sweep: {e}");
        }
        tracing::info!(box_id = %self.id, "archil: box destroyed");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_in_the_workspace() {
        assert_eq!(relative_to_workspace("a/./b/../c").unwrap(), "a/c");
        assert_eq!(relative_to_workspace("/mnt/archil/box/x/y").unwrap(), "x/y");
        assert_eq!(
            relative_to_workspace("/etc/passwd").unwrap_err().code(),
            ErrorCode::Unsupported
        );
        assert_eq!(
            relative_to_workspace("/mnt/archil/boxes/x").unwrap_err().code(),
            ErrorCode::Unsupported
        );
        assert_eq!(relative_to_workspace("../x").unwrap_err().code(), ErrorCode::Invalid);
        assert_eq!(relative_to_workspace("a/../..").unwrap_err().code(), ErrorCode::Invalid);
        assert_eq!(relative_to_workspace(".").unwrap_err().code(), ErrorCode::Invalid);
        assert!(relative_to_workspace("a\0").is_err());
    }

    #[test]
    fn the_command_line_quotes_every_word() {
        let argv = vec!["printf".to_string(), "%s\\n".into(), "it's; rm -rf /".into()];
        let s = command_line(&argv, Some("d ir"), Duration::from_millis(1500), "m");
        assert_eq!(
            s,
            "cd /mnt/archil/box || exit 1; cd -- 'd ir' 2>/dev/null || { echo m >&2; exit 254; }; \
             exec timeout -k 2 1.500 'printf' '%s\\n' 'it'\\''s; rm -rf /'"
        );
    }

    #[test]
    fn exit_124_is_a_timeout() {
        let a = |code| ExecAnswer {
            exit_code: code,
            stdout: String::new(),
            stderr: String::new(),
            timing: None,
        };
        let d = Duration::from_secs(5);
        assert_eq!(outcome(&a(124), d).unwrap_err().code(), ErrorCode::Timeout);
        assert_eq!(outcome(&a(3), d).unwrap().code, 3);
        assert_eq!(outcome(&a(-9), d).unwrap(), ExitStatus::signaled(9));
        assert_eq!(outcome(&a(i32::MIN), d).unwrap_err().code(), ErrorCode::Unknown);
        // 137: the deadline's kill only where the call ran past the deadline.
        assert_eq!(outcome(&a(137), d).unwrap().code, 137);
        let killed = ExecAnswer {
            timing: Some(super::super::api::Timing {
                queue_ms: 0,
                execute_ms: 7000,
            }),
            ..a(137)
        };
        assert_eq!(outcome(&killed, d).unwrap_err().code(), ErrorCode::Timeout);
    }
}

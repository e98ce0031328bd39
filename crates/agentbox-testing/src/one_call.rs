//! [`OneCall`]: any box made to behave as one without live processes, whose every exec is one
//! call that answers only once its command has ended (Archil's serverless exec), so what runs
//! over such boxes (the hands' `BoxEnv`) is tested with no vendor account. For tests only.
//!
//! What it does, as such a box does:
//! - its facts say `live_processes: false`, `max_exec_ms` (300 s by default), no runner and no
//!   secret channel; `files()` and `processes()` are `None`;
//! - the box runs one call at a time, in the order they were asked (tokio's mutex is fair): an
//!   exec, an upload or a download waits for the calls before it, within its context, and one
//!   whose caller gave up before its turn is never run;
//! - an exec runs the inner box's program to its end in a task of its own, under its own
//!   deadline (the exec's `timeout`, else the bound less 5 s, no later than what is left of the
//!   caller's context), and answers only then, its output as text (bytes that are not UTF-8 as
//!   U+FFFD, as an HTTP answer's JSON string carries them). A command its deadline ended, or
//!   that exited 124 (`timeout`'s code), waits `timeout`;
//! - a caller that gives up while its command runs is answered at once; nothing reaches the
//!   command, which runs on, holding the box, to its own deadline;
//! - its stdin refuses every write `Unsupported` (a close is fine); an exec's env, a terminal and
//!   detach are refused `unsupported`, naming each; a timeout over the bound `invalid`;
//! - upload and download go to the inner box by a path within the workspace (relative to it, or
//!   absolute within it); a path outside it is refused `unsupported`, one that climbs out or
//!   names the workspace itself `invalid`;
//! - it counts the calls of each kind it was asked ([`OneCall::calls`]).
//!
//! ```no_run
//! # async fn f(inner: std::sync::Arc<dyn agentbox_core::Sandbox>) -> agentbox_core::Result<()> {
//! use std::sync::Arc;
//! use agentbox_core::Sandbox;
//! use agentbox_testing::one_call::OneCall;
//! let b = Arc::new(OneCall::new(inner)?);
//! assert!(!b.facts().live_processes && b.files().is_none());
//! assert_eq!(b.calls().downloads, 0);
//! # Ok(()) }
//! ```

use std::io::Cursor;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use agentbox_core::{
    ByteReader, Ctx, Endpoint, Error, ErrorCode, ExecOptions, ExitStatus, Facts, Labels, NoInput, Process,
    ProcessControl, Result, Sandbox, SandboxId, Status,
};
use async_trait::async_trait;
use tokio::io::AsyncReadExt;

/// The bound on one exec call unless set otherwise: Archil's.
pub const MAX_EXEC: Duration = Duration::from_secs(300);

/// How much earlier than the bound a command's own deadline falls when its exec asks none,
/// leaving the call time to answer.
const ANSWER_ROOM: Duration = Duration::from_secs(5);

/// How long a command its deadline ended has to let go of its output before the call answers
/// with what it had (`timeout -k 5`).
const KILL_AFTER: Duration = Duration::from_secs(5);

/// At most this much of each stream is kept, as an HTTP answer's bound would.
const MAX_OUTPUT: u64 = 64 << 20;

/// How many calls of each kind a [`OneCall`] box was asked, refused ones included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Calls {
    /// Execs.
    pub execs: u64,
    /// Uploads.
    pub uploads: u64,
    /// Downloads.
    pub downloads: u64,
}

#[derive(Default)]
struct Counters {
    execs: AtomicU64,
    uploads: AtomicU64,
    downloads: AtomicU64,
}

/// A box without live processes over `inner`. See the [module documentation](self).
pub struct OneCall {
    inner: Arc<dyn Sandbox>,
    facts: Facts,
    workspace: String,
    limit: Duration,
    /// One call at a time: an exec's task holds its turn until its command ended.
    queue: Arc<tokio::sync::Mutex<()>>,
    counters: Counters,
}

impl OneCall {
    /// Over `inner`, with [`MAX_EXEC`] the bound on one call. `invalid` when the inner box names
    /// no absolute workspace (uploads and downloads are relative to it).
    pub fn new(inner: Arc<dyn Sandbox>) -> Result<Self> {
        OneCall::with_limit(inner, MAX_EXEC)
    }

    /// Over `inner`, with `limit` the bound on one call (`max_exec_ms`), over a second.
    pub fn with_limit(inner: Arc<dyn Sandbox>, limit: Duration) -> Result<Self> {
        if limit <= Duration::from_secs(1) {
            return Err(Error::invalid(format!(
                "limit: {}ms: a bound on one call must be over a second",
                limit.as_millis()
            )));
        }
        let workspace = match inner.facts().workspace.as_deref() {
            Some(w) if w.starts_with('/') => w.trim_end_matches('/').to_string(),
            other => {
                return Err(Error::invalid(format!(
                    "box {}: its workspace is {other:?}: a one-call box moves files relative to an absolute workspace",
                    inner.id()
                )));
            }
        };
        let facts = Facts {
            live_processes: false,
            max_exec_ms: Some(limit.as_millis() as u64),
            runner: None,
            secrets_via: None,
            ..inner.facts().clone()
        };
        Ok(OneCall {
            inner,
            facts,
            workspace,
            limit,
            queue: Arc::new(tokio::sync::Mutex::new(())),
            counters: Counters::default(),
        })
    }

    /// The calls asked of this box so far.
    pub fn calls(&self) -> Calls {
        Calls {
            execs: self.counters.execs.load(Ordering::SeqCst),
            uploads: self.counters.uploads.load(Ordering::SeqCst),
            downloads: self.counters.downloads.load(Ordering::SeqCst),
        }
    }

    /// The box underneath.
    pub fn inner(&self) -> &Arc<dyn Sandbox> {
        &self.inner
    }

    /// `path` relative to the workspace, as such a box's file API takes it.
    fn relative(&self, path: &str) -> Result<String> {
        agentbox_core::within_workspace(path, &self.workspace, ": a one-call box moves files only within it")
    }

    /// The command's own deadline: the exec's timeout, else the bound less [`ANSWER_ROOM`], no
    /// later than what is left of the caller's context.
    fn deadline(&self, asked: Option<Duration>, ctx: &Ctx) -> Duration {
        let own = self.limit.saturating_sub(ANSWER_ROOM);
        let mut d = asked.unwrap_or(own).min(self.limit);
        if let Some(left) = ctx.remaining() {
            d = d.min(left);
        }
        d.max(Duration::from_millis(100))
    }
}

/// Run `argv` in `inner` to its end under `deadline`, its output read whole (and what a
/// program its deadline ended left, [`KILL_AFTER`] later).
async fn run_to_end(
    inner: &dyn Sandbox,
    argv: &[String],
    opts: &ExecOptions,
    deadline: Duration,
) -> Result<(Result<ExitStatus>, Vec<u8>, Vec<u8>)> {
    let until = tokio::time::Instant::now() + deadline + KILL_AFTER;
    let ctx = Ctx::background().with_timeout(deadline);
    let mut p = inner.exec(argv, opts, &ctx).await?;
    if let Some(mut stdin) = p.stdin.take() {
        let _ = stdin.close().await;
    }
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (so, se) = (p.stdout.take(), p.stderr.take());
    let read = async {
        tokio::join!(read_into(so, &mut out), read_into(se, &mut err));
    };
    // What was read before the bound is kept: the call answers with it.
    let _ = tokio::time::timeout_at(until, read).await;
    let status = match tokio::time::timeout_at(until, p.wait()).await {
        Ok(Ok(st)) if st.code == 124 => Err(Error::timeout(
            "the command exited 124, which a one-call box reads as its deadline (as `timeout` ends it)",
        )),
        Ok(Ok(st)) => Ok(st),
        Ok(Err(e)) if e.code() == ErrorCode::Timeout => Err(Error::timeout(format!(
            "the command passed its deadline of {:.1}s in the box",
            deadline.as_secs_f64()
        ))),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::timeout(format!(
            "the command did not end within {:.1}s of its deadline of {:.1}s",
            KILL_AFTER.as_secs_f64(),
            deadline.as_secs_f64()
        ))),
    };
    Ok((status, out, err))
}

/// Read a stream to its end (or [`MAX_OUTPUT`]) into `buf`, keeping what came before a failure.
async fn read_into(r: Option<ByteReader>, buf: &mut Vec<u8>) {
    if let Some(r) = r {
        let _ = r.take(MAX_OUTPUT).read_to_end(buf).await;
    }
}

/// Bytes as an HTTP answer's text carries them.
fn as_text(b: Vec<u8>) -> ByteReader {
    Box::pin(Cursor::new(String::from_utf8_lossy(&b).into_owned().into_bytes()))
}

/// A program that ended before it was handed out.
struct Ended(Result<ExitStatus>);

#[async_trait]
impl ProcessControl for Ended {
    async fn wait(&self) -> Result<ExitStatus> {
        self.0.clone()
    }
    async fn signal(&self, _signal: i32) -> Result<()> {
        // It ended: a signal to an ended program is no error.
        Ok(())
    }
}

/// What a write to a one-call box's stdin answers.
const NO_STDIN: NoInput = NoInput("stdin: a one-call box's program takes no input (its call carries only the command)");

#[async_trait]
impl Sandbox for OneCall {
    fn id(&self) -> &SandboxId {
        self.inner.id()
    }

    fn facts(&self) -> &Facts {
        &self.facts
    }

    fn labels(&self) -> &Labels {
        self.inner.labels()
    }

    async fn exec(&self, argv: &[String], opts: &ExecOptions, ctx: &Ctx) -> Result<Process> {
        self.counters.execs.fetch_add(1, Ordering::SeqCst);
        opts.validate(argv)?;
        opts.refuse(
            false,
            false,
            true,
            "a one-call box runs each command as one call that ends with it, with no terminal",
        )?;
        if !opts.env.is_empty() {
            let names: Vec<&str> = opts.env.keys().map(String::as_str).collect();
            return Err(Error::unsupported(format!(
                "exec env ({}): a one-call box carries no environment (its call takes only the command)",
                names.join(", ")
            )));
        }
        if let Some(t) = opts.timeout
            && t > self.limit
        {
            return Err(Error::invalid(format!(
                "exec timeout: {}ms is over the box's {}ms bound on one call",
                t.as_millis(),
                self.limit.as_millis()
            )));
        }
        ctx.check()?;
        let turn = ctx.run(self.queue.clone().lock_owned()).await?;
        ctx.check()?;
        let deadline = self.deadline(opts.timeout, ctx);
        let inner = self.inner.clone();
        let argv = argv.to_vec();
        let inner_opts = ExecOptions {
            cwd: opts.cwd.clone(),
            ..Default::default()
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let r = run_to_end(&*inner, &argv, &inner_opts, deadline).await;
            drop(turn);
            let _ = tx.send(r);
        });
        let (status, out, err) = tokio::select! {
            r = rx => r.unwrap_or_else(|_| Err(Error::unknown("the exec call's task ended without an answer")))?,
            e = ctx.done() => return Err(Error::new(e.code(), format!(
                "{}: a one-call box cannot stop a running command: it runs on to its own deadline of {:.1}s, and the box's next call waits for it",
                e.message(),
                deadline.as_secs_f64()
            ))),
        };
        Ok(Process::new(
            Some(Box::pin(NO_STDIN)),
            Some(as_text(out)),
            Some(as_text(err)),
            Arc::new(Ended(status)),
            ctx,
        ))
    }

    async fn status(&self, ctx: &Ctx) -> Result<Status> {
        self.inner.status(ctx).await
    }

    async fn upload(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<()> {
        self.counters.uploads.fetch_add(1, Ordering::SeqCst);
        let rel = self.relative(path)?;
        let _turn = ctx.run(self.queue.lock()).await?;
        self.inner.upload(&rel, data, ctx).await
    }

    async fn download(&self, path: &str, max_bytes: u64, ctx: &Ctx) -> Result<Vec<u8>> {
        self.counters.downloads.fetch_add(1, Ordering::SeqCst);
        let rel = self.relative(path)?;
        let _turn = ctx.run(self.queue.lock()).await?;
        self.inner.download(&rel, max_bytes, ctx).await
    }

    async fn endpoint(&self, port: u16, _ctx: &Ctx) -> Result<Endpoint> {
        Err(Error::unsupported(format!(
            "endpoint {port}: a one-call box exposes no port (no program runs between calls)"
        )))
    }

    async fn destroy(&self, ctx: &Ctx) -> Result<()> {
        self.inner.destroy(ctx).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdin_refuses_every_write_and_closes() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            use tokio::io::AsyncWriteExt;
            let mut w = NO_STDIN;
            let e = w.write_all(b"x").await.unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::Unsupported);
            assert!(w.shutdown().await.is_ok());
        });
    }

    #[test]
    fn output_is_text() {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let mut r = as_text(vec![b'a', 0xff, b'b']);
            let mut s = String::new();
            r.read_to_string(&mut s).await.unwrap();
            assert_eq!(s, "a\u{fffd}b");
        });
    }
}

//! A program running in a box: its pipes, its exit, and a bounded way to collect it all.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::ctx::Ctx;
use crate::error::{Error, Result};

/// A byte stream out of a box (a program's stdout or stderr).
pub type ByteReader = Pin<Box<dyn AsyncRead + Send>>;
/// A byte stream into a box (a program's stdin).
pub type ByteWriter = Pin<Box<dyn AsyncWrite + Send>>;

/// The signals a box's programs may be sent ([`Process::signal`], [`crate::Processes::signal`]),
/// by their bare names, the commonest first; their numbers are Linux's, which every box uses.
pub const SIGNALS: [(&str, i32); 15] = [
    ("TERM", 15),
    ("KILL", 9),
    ("INT", 2),
    ("HUP", 1),
    ("QUIT", 3),
    ("USR1", 10),
    ("USR2", 12),
    ("STOP", 19),
    ("CONT", 18),
    ("TSTP", 20),
    ("ABRT", 6),
    ("ALRM", 14),
    ("PIPE", 13),
    ("SEGV", 11),
    ("WINCH", 28),
];

/// SIGKILL, for [`Process::signal`].
pub const SIGKILL: i32 = 9;
/// SIGTERM, for [`Process::signal`].
pub const SIGTERM: i32 = 15;

/// How long a program killed because its context ended may take to be reaped before
/// [`Process::wait`] answers anyway.
const KILL_GRACE: Duration = Duration::from_secs(10);

/// The largest terminal an exec may ask for, in rows and in columns.
pub const MAX_TTY: u16 = 4096;

/// A terminal for a program: its stdin, stdout and stderr are one pty's, and its output comes
/// on stdout alone (with the terminal's own line endings, `\r\n`). Its stdin carries keys;
/// closing it types the end-of-file key (Ctrl-D), as a person would, rather than hanging the
/// terminal up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tty {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
    /// `TERM` in the program's environment; `xterm-256color` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<String>,
}

impl Default for Tty {
    fn default() -> Self {
        Tty {
            rows: 24,
            cols: 80,
            term: None,
        }
    }
}

/// Options of one exec.
///
/// A provider that cannot give one of `tty`, `detach` or `timeout` refuses the exec with
/// `unsupported`, naming it; none is ever dropped silently.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOptions {
    /// The working directory; relative paths are taken from the box's workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Variables for this program alone, over the spec's env.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Run the program in a terminal of this size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tty: Option<Tty>,
    /// The program outlives its caller: the exec's context governs only its start, and the
    /// program runs on after the [`Process`] is dropped and after this host process exits,
    /// until it ends, is signalled, or its `timeout` passes. It has a handle
    /// ([`Process::handle`]) by which any host process reaches it again through
    /// [`crate::Sandbox::processes`]. Its output is kept in the box as a ring of a bounded
    /// number of bytes while nobody reads it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub detach: bool,
    /// The box ends the program this long after it started, with no call from the host (so
    /// a host that is gone still leaves no program running past it); its wait then answers
    /// `timeout`, also to whoever attaches later.
    #[serde(
        default,
        with = "opt_ms",
        skip_serializing_if = "Option::is_none",
        rename = "timeout_ms"
    )]
    pub timeout: Option<Duration>,
    /// One secret for this program alone, on an inherited pipe ([`crate::FdSecret`]): never
    /// serialized, never in argv, env or a file. Only a box whose programs agentbox's runner
    /// starts gives it; every other refuses it ([`ExecOptions::refuse`]).
    #[serde(skip)]
    pub secret_fd: Option<crate::FdSecret>,
}

/// An optional duration as whole milliseconds.
mod opt_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&(d.as_millis() as u64)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

impl ExecOptions {
    /// Check the options and `argv` the way every provider must: a program to run, and
    /// well-formed variable names.
    pub fn validate(&self, argv: &[String]) -> Result<()> {
        if argv.is_empty() || argv[0].is_empty() {
            return Err(Error::invalid("argv is empty: no program to run"));
        }
        if argv.iter().any(|a| a.contains('\0')) {
            return Err(Error::invalid("argv: an argument holds a NUL byte"));
        }
        if let Some(f) = &self.secret_fd {
            crate::spec::validate_env(&f.name, "").map_err(|e| e.context("exec secret_fd"))?;
        }
        for (k, v) in &self.env {
            crate::spec::validate_env(k, v).map_err(|e| e.context("exec env"))?;
        }
        if let Some(cwd) = &self.cwd
            && (cwd.is_empty() || cwd.contains('\0'))
        {
            return Err(Error::invalid("exec cwd: must be a non-empty path with no NUL"));
        }
        if let Some(t) = &self.tty {
            if t.rows == 0 || t.cols == 0 || t.rows > MAX_TTY || t.cols > MAX_TTY {
                return Err(Error::invalid(format!(
                    "exec tty: {} rows by {} columns: each must be 1 to {MAX_TTY}",
                    t.rows, t.cols
                )));
            }
            if let Some(term) = &t.term
                && (term.is_empty() || term.len() > 64 || !term.bytes().all(|b| b.is_ascii_graphic()))
            {
                return Err(Error::invalid(format!(
                    "exec tty: TERM {term:?} is not a terminal name (1 to 64 printable characters)"
                )));
            }
        }
        if let Some(t) = self.timeout
            && (t.is_zero() || t > crate::spec::MAX_LIFETIME)
        {
            return Err(Error::invalid(format!(
                "exec timeout: {}ms: must be over 0 and at most {} days",
                t.as_millis(),
                crate::spec::MAX_LIFETIME.as_secs() / 86400
            )));
        }
        Ok(())
    }

    /// Refuse, naming each, the options a box without them cannot give (`unsupported`).
    ///
    /// ```
    /// use agentbox_core::{ErrorCode, ExecOptions};
    /// let opts = ExecOptions { detach: true, ..Default::default() };
    /// let e = opts.refuse(false, false, false, "it has no runner").unwrap_err();
    /// assert_eq!(e.code(), ErrorCode::Unsupported);
    /// assert!(e.message().contains("detach"));
    /// ```
    pub fn refuse(&self, tty: bool, detach: bool, timeout: bool, why: &str) -> Result<()> {
        let mut no = Vec::new();
        if self.tty.is_some() && !tty {
            no.push("tty");
        }
        if self.detach && !detach {
            no.push("detach");
        }
        if self.timeout.is_some() && !timeout {
            no.push("timeout");
        }
        // Only agentbox's runner hands a program a descriptor: a box that calls this has none.
        if self.secret_fd.is_some() {
            no.push("secret_fd");
        }
        if no.is_empty() {
            return Ok(());
        }
        Err(Error::unsupported(format!(
            "exec {}: this box cannot give it: {why}",
            no.join(", ")
        )))
    }
}

/// How a program ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExitStatus {
    /// The exit code; 128 + the signal number for a program a signal ended.
    pub code: i32,
    /// The signal that ended it, where the provider knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
}

impl ExitStatus {
    /// A program that exited with `code`.
    pub fn exited(code: i32) -> Self {
        ExitStatus { code, signal: None }
    }

    /// A program that `signal` ended: code 128 + signal.
    pub fn signaled(signal: i32) -> Self {
        ExitStatus {
            code: 128 + signal,
            signal: Some(signal),
        }
    }

    /// Exit code 0.
    pub fn success(&self) -> bool {
        self.code == 0
    }
}

/// What a provider implements for one running program. [`Process`] builds the rest on it.
#[async_trait]
pub trait ProcessControl: Send + Sync + 'static {
    /// Wait for the program to end. [`Process`] calls this exactly once.
    async fn wait(&self) -> Result<ExitStatus>;
    /// Send `signal` to the program. A program that already ended is no error.
    async fn signal(&self, signal: i32) -> Result<()>;
    /// Set the size of the program's terminal. `unsupported` for one without a terminal.
    async fn resize(&self, _rows: u16, _cols: u16) -> Result<()> {
        Err(Error::unsupported("resize: the program has no terminal"))
    }
}

/// The write end of a program's stdin. [`Stdin::close`] delivers EOF, also when nothing was
/// written.
pub struct Stdin {
    inner: Option<ByteWriter>,
}

impl Stdin {
    /// Wrap a provider's writer.
    pub fn new(inner: ByteWriter) -> Self {
        Stdin { inner: Some(inner) }
    }

    /// Flush, shut down and drop the writer, so the program reads EOF. Closing twice is no error.
    pub async fn close(&mut self) -> Result<()> {
        if let Some(mut w) = self.inner.take() {
            match w.shutdown().await {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                Err(e) => return Err(Error::io(e, "closing stdin")),
            }
        }
        Ok(())
    }
}

impl AsyncWrite for Stdin {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.inner.as_mut() {
            Some(w) => w.as_mut().poll_write(cx, buf),
            None => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "stdin was closed",
            ))),
        }
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.inner.as_mut() {
            Some(w) => w.as_mut().poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.inner.as_mut() {
            Some(w) => w.as_mut().poll_shutdown(cx),
            None => Poll::Ready(Ok(())),
        }
    }
}

/// The stdin of a program that takes no input (a box whose each exec is one call carrying only
/// the command): every write fails [`std::io::ErrorKind::Unsupported`] with `why`, and closing
/// it is no error, so [`finish`] with no input works.
///
/// ```
/// # tokio_test_block_on(async {
/// use tokio::io::AsyncWriteExt;
/// let mut w = agentbox_core::NoInput("stdin: this box's programs take no input");
/// assert_eq!(w.write_all(b"x").await.unwrap_err().kind(), std::io::ErrorKind::Unsupported);
/// assert!(w.shutdown().await.is_ok());
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct NoInput(pub &'static str);

impl AsyncWrite for NoInput {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, _buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::Unsupported, self.0)))
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

type Outcome = Option<Result<ExitStatus>>;

/// A program started by [`crate::Sandbox::exec`].
///
/// The context given to `exec` governs the program: when it is cancelled or its deadline
/// passes, the program is killed and [`Process::wait`] answers `aborted` or `timeout`. Its
/// exit is collected whether or not anyone waits, so dropping a `Process` leaves nothing
/// behind but the program itself, which runs on until it ends or its context does.
///
/// ```no_run
/// # async fn f(b: &dyn agentbox_core::Sandbox) -> agentbox_core::Result<()> {
/// use agentbox_core::{finish, Ctx, ExecOptions, FinishOptions};
/// let argv = vec!["echo".to_string(), "hi".to_string()];
/// let p = b.exec(&argv, &ExecOptions::default(), &Ctx::background()).await?;
/// let out = finish(p, FinishOptions::default()).await?;
/// assert_eq!(out.stdout, b"hi\n");
/// # Ok(()) }
/// ```
pub struct Process {
    /// The program's stdin, if it takes one.
    pub stdin: Option<Stdin>,
    /// The program's stdout.
    pub stdout: Option<ByteReader>,
    /// The program's stderr.
    pub stderr: Option<ByteReader>,
    control: Arc<dyn ProcessControl>,
    outcome: watch::Receiver<Outcome>,
    handle: Option<u64>,
}

impl Process {
    /// Assemble a process from a provider's parts. `ctx` is the exec's context: when it ends,
    /// the program is killed.
    pub fn new(
        stdin: Option<ByteWriter>,
        stdout: Option<ByteReader>,
        stderr: Option<ByteReader>,
        control: Arc<dyn ProcessControl>,
        ctx: &Ctx,
    ) -> Self {
        let (tx, rx) = watch::channel(None);
        let ctrl = control.clone();
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let outcome = tokio::select! {
                r = ctrl.wait() => r,
                e = ctx.done() => {
                    // The kill and its wait are bounded together: a box that died with its
                    // transport answers neither, and the deadline has already passed.
                    let grace = tokio::time::Instant::now() + KILL_GRACE;
                    let _ = tokio::time::timeout_at(grace, ctrl.signal(SIGKILL)).await;
                    match tokio::time::timeout_at(grace, ctrl.wait()).await {
                        Ok(_) => Err(e),
                        Err(_) => Err(Error::new(
                            e.code(),
                            format!("{}, and the program did not end within {}s of its kill", e.message(), KILL_GRACE.as_secs()),
                        )),
                    }
                }
            };
            let _ = tx.send(Some(outcome));
        });
        Process {
            stdin: stdin.map(Stdin::new),
            stdout,
            stderr,
            control,
            outcome: rx,
            handle: None,
        }
    }

    /// The same process, named in its box by `handle` (see [`Process::handle`]).
    pub fn with_handle(mut self, handle: u64) -> Self {
        self.handle = Some(handle);
        self
    }

    /// The process's number in its box, where the box keeps its processes
    /// ([`crate::Sandbox::processes`]): with the box's id, what any host process reaches it
    /// by again. `None` where the box keeps none.
    pub fn handle(&self) -> Option<u64> {
        self.handle
    }

    /// Set the size of the program's terminal (its foreground group gets SIGWINCH).
    /// `unsupported` for a program run without one.
    pub async fn resize(&self, rows: u16, cols: u16) -> Result<()> {
        if rows == 0 || cols == 0 || rows > MAX_TTY || cols > MAX_TTY {
            return Err(Error::invalid(format!(
                "resize: {rows} rows by {cols} columns: each must be 1 to {MAX_TTY}"
            )));
        }
        self.control.resize(rows, cols).await
    }

    /// Wait for the program to end. Close stdin first if the program reads it.
    pub async fn wait(&mut self) -> Result<ExitStatus> {
        let got = self
            .outcome
            .wait_for(Option::is_some)
            .await
            .map_err(|_| Error::unknown("the process watcher ended without an outcome"))?;
        got.clone().unwrap_or_else(|| Err(Error::unknown("no outcome")))
    }

    /// The exit status if the program has ended, without waiting.
    pub fn try_wait(&self) -> Option<Result<ExitStatus>> {
        self.outcome.borrow().clone()
    }

    /// Kill the program (SIGKILL). Its [`Process::wait`] then answers 137.
    ///
    /// Takes `&mut self` so a `Process` need not be `Sync`; [`Process::killer`] kills from
    /// another task.
    pub async fn kill(&mut self) -> Result<()> {
        self.control.signal(SIGKILL).await
    }

    /// Send a signal to the program.
    pub async fn signal(&mut self, signal: i32) -> Result<()> {
        self.control.signal(signal).await
    }

    /// A handle that can kill the program from another task.
    pub fn killer(&self) -> Killer {
        Killer(self.control.clone())
    }
}

/// Kills (or resizes) a [`Process`] from elsewhere.
#[derive(Clone)]
pub struct Killer(Arc<dyn ProcessControl>);

impl Killer {
    /// Send `signal` to the program.
    pub async fn signal(&self, signal: i32) -> Result<()> {
        self.0.signal(signal).await
    }

    /// Set the size of the program's terminal.
    pub async fn resize(&self, rows: u16, cols: u16) -> Result<()> {
        self.0.resize(rows, cols).await
    }
}

/// Output a box let go before a reader took it: the read that meets it fails with an
/// [`std::io::Error`] carrying this (see [`OutputGap::of`]), and the next read goes on with
/// the byte numbered `from`.
///
/// A box keeps a bounded tail of each process's output. A reader that holds its process (the
/// caller of an exec) never meets one from a runner that keeps its window; a reader that
/// comes late to a process nobody held, or a box that lost output, does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputGap {
    /// The number of the first byte the reader did not get.
    pub after: u64,
    /// The number of the byte the output goes on from.
    pub from: u64,
}

impl std::fmt::Display for OutputGap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "output bytes {}..{} were let go before they were read ({} bytes lost to the box's bound)",
            self.after,
            self.from,
            self.from - self.after
        )
    }
}

impl std::error::Error for OutputGap {}

impl OutputGap {
    /// The gap an I/O error carries, if it is one.
    ///
    /// ```
    /// use agentbox_core::OutputGap;
    /// let e: std::io::Error = OutputGap { after: 10, from: 50 }.into();
    /// assert_eq!(OutputGap::of(&e), Some(OutputGap { after: 10, from: 50 }));
    /// ```
    pub fn of(e: &std::io::Error) -> Option<OutputGap> {
        e.get_ref()?.downcast_ref::<OutputGap>().copied()
    }
}

impl From<OutputGap> for std::io::Error {
    fn from(g: OutputGap) -> Self {
        std::io::Error::other(g)
    }
}

/// Bounds for [`finish`].
#[derive(Clone, Debug)]
pub struct FinishOptions {
    /// Bytes written to stdin before it is closed.
    pub stdin: Vec<u8>,
    /// At most this many bytes of stdout, and as many of stderr; past it the program is
    /// killed and `finish` answers `too_large`.
    pub max_output: usize,
}

impl Default for FinishOptions {
    fn default() -> Self {
        FinishOptions {
            stdin: Vec::new(),
            max_output: 64 << 20,
        }
    }
}

/// What [`finish`] collected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    /// How the program ended.
    pub status: ExitStatus,
    /// All of stdout.
    pub stdout: Vec<u8>,
    /// All of stderr.
    pub stderr: Vec<u8>,
}

impl Finished {
    /// stdout as text, with invalid UTF-8 replaced.
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    /// stderr as text, with invalid UTF-8 replaced.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// Write `opts.stdin`, close it, read stdout and stderr together up to `opts.max_output`
/// each, and wait for the exit. Reading both at once means a program that fills one pipe
/// never stalls on the other.
pub async fn finish(p: Process, opts: FinishOptions) -> Result<Finished> {
    collect(p, opts, false).await.map(|(f, _)| f)
}

/// What [`finish_cut`] left out of each stream, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cut {
    /// Bytes of stdout past `max_output`, read and dropped.
    pub stdout_dropped: u64,
    /// Bytes of stderr past `max_output`, read and dropped.
    pub stderr_dropped: u64,
}

/// As [`finish`], but past `opts.max_output` a stream's first bytes are kept and the rest is
/// read and dropped (counted in [`Cut`]), and the program runs to its end: for a caller that
/// answers with bounded output and says when it was cut.
///
/// ```no_run
/// # async fn f(b: &dyn agentbox_core::Sandbox) -> agentbox_core::Result<()> {
/// use agentbox_core::{Ctx, ExecOptions, FinishOptions, finish_cut};
/// let p = b.exec(&["seq".into(), "1000000".into()], &ExecOptions::default(), &Ctx::background()).await?;
/// let (done, cut) = finish_cut(p, FinishOptions { max_output: 1024, ..Default::default() }).await?;
/// assert_eq!(done.stdout.len(), 1024);
/// assert!(cut.stdout_dropped > 0);
/// # Ok(()) }
/// ```
pub async fn finish_cut(p: Process, opts: FinishOptions) -> Result<(Finished, Cut)> {
    collect(p, opts, true).await
}

async fn collect(mut p: Process, opts: FinishOptions, cut: bool) -> Result<(Finished, Cut)> {
    let stdin = p.stdin.take();
    let stdout = p.stdout.take();
    let stderr = p.stderr.take();
    let write = async move {
        if let Some(mut w) = stdin {
            if !opts.stdin.is_empty() {
                match w.write_all(&opts.stdin).await {
                    Ok(()) => {}
                    // The program ended without reading all of it: its exit code says the rest.
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
                    Err(e) => return Err(Error::io(e, "writing stdin")),
                }
            }
            w.close().await?;
        }
        Ok(())
    };
    let max = opts.max_output;
    let streams = async {
        tokio::join!(
            write,
            read_up_to(stdout, max, cut, "stdout"),
            read_up_to(stderr, max, cut, "stderr")
        )
    };
    tokio::pin!(streams);
    // The program's end is watched beside its output: one that failed (its deadline passed,
    // its box is gone) answers now, whether or not its output streams ever end (a box that
    // died with its transport never ends them). One that exited lets its output drain.
    let (w, out, err) = tokio::select! {
        all = &mut streams => all,
        ended = p.wait() => match ended {
            Err(e) => return Err(e),
            Ok(_) => streams.await,
        },
    };
    if let Err(e) = out.as_ref().and(err.as_ref()) {
        let _ = p.kill().await;
        let _ = p.wait().await;
        return Err(e.clone());
    }
    let status = p.wait().await?;
    w?;
    let ((stdout, stdout_dropped), (stderr, stderr_dropped)) = (out?, err?);
    Ok((
        Finished { status, stdout, stderr },
        Cut {
            stdout_dropped,
            stderr_dropped,
        },
    ))
}

/// Read a stream to its end, refusing past `max` bytes with `too_large`.
pub async fn read_bounded(r: Option<ByteReader>, max: usize, what: &str) -> Result<Vec<u8>> {
    read_up_to(r, max, false, what).await.map(|(buf, _)| buf)
}

/// Read a stream to its end: past `max` bytes, `too_large`, or with `cut` the rest read and
/// counted but not kept.
async fn read_up_to(r: Option<ByteReader>, max: usize, cut: bool, what: &str) -> Result<(Vec<u8>, u64)> {
    let Some(mut r) = r else { return Ok((Vec::new(), 0)) };
    let mut buf = Vec::new();
    let mut dropped = 0u64;
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = r
            .read(&mut chunk)
            .await
            .map_err(|e| Error::io(e, format!("reading {what}")))?;
        if n == 0 {
            return Ok((buf, dropped));
        }
        let room = max - buf.len();
        if n > room && !cut {
            return Err(Error::too_large(format!("{what}: more than {max} bytes")));
        }
        buf.extend_from_slice(&chunk[..n.min(room)]);
        dropped += (n - n.min(room)) as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tokio::sync::Notify;

    /// A program that ends when signalled or when `exit` is notified.
    struct Fake {
        ended: Notify,
        signals: Mutex<Vec<i32>>,
        code: Mutex<Option<ExitStatus>>,
    }

    #[async_trait]
    impl ProcessControl for Fake {
        async fn wait(&self) -> Result<ExitStatus> {
            loop {
                if let Some(s) = *self.code.lock().unwrap() {
                    return Ok(s);
                }
                self.ended.notified().await;
            }
        }
        async fn signal(&self, signal: i32) -> Result<()> {
            self.signals.lock().unwrap().push(signal);
            *self.code.lock().unwrap() = Some(ExitStatus::signaled(signal));
            self.ended.notify_waiters();
            Ok(())
        }
    }

    fn fake() -> Arc<Fake> {
        Arc::new(Fake {
            ended: Notify::new(),
            signals: Mutex::new(vec![]),
            code: Mutex::new(None),
        })
    }

    #[tokio::test]
    async fn a_deadline_kills_the_program_and_wait_says_timeout() {
        let f = fake();
        let ctx = Ctx::background().with_timeout(Duration::from_millis(20));
        let mut p = Process::new(None, None, None, f.clone(), &ctx);
        let e = p.wait().await.unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::Timeout);
        assert_eq!(*f.signals.lock().unwrap(), vec![SIGKILL]);
    }

    #[tokio::test]
    async fn an_abort_kills_the_program_and_wait_says_aborted() {
        let f = fake();
        let ctx = Ctx::background();
        let mut p = Process::new(None, None, None, f.clone(), &ctx);
        ctx.cancel();
        assert_eq!(p.wait().await.unwrap_err().code(), crate::ErrorCode::Aborted);
    }

    #[tokio::test]
    async fn finish_refuses_output_past_its_bound() {
        let f = fake();
        let (mut w, r) = tokio::io::duplex(1024);
        let mut p = Process::new(None, Some(Box::pin(r)), None, f.clone(), &Ctx::background());
        tokio::spawn(async move {
            let _ = w.write_all(&[7u8; 5000]).await;
        });
        p.stdin = None;
        let e = finish(
            p,
            FinishOptions {
                max_output: 100,
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::TooLarge);
        assert!(e.message().contains("stdout"));
        assert_eq!(*f.signals.lock().unwrap(), vec![SIGKILL]);
    }

    /// A program whose box died with its transport: a kill is never answered, its output never
    /// ends.
    struct Dead;

    #[async_trait]
    impl ProcessControl for Dead {
        async fn wait(&self) -> Result<ExitStatus> {
            std::future::pending().await
        }
        async fn signal(&self, _: i32) -> Result<()> {
            std::future::pending().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn finish_answers_at_the_deadline_when_the_output_never_ends() {
        let (_w, r) = tokio::io::duplex(1024);
        let ctx = Ctx::background().with_timeout(Duration::from_secs(20));
        let p = Process::new(None, Some(Box::pin(r)), None, Arc::new(Dead), &ctx);
        let start = tokio::time::Instant::now();
        let e = finish(p, FinishOptions::default()).await.unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::Timeout, "{e}");
        assert!(e.message().contains("did not end"), "{e}");
        // The deadline, then the one grace for the kill and its wait together.
        assert_eq!(start.elapsed(), Duration::from_secs(20) + KILL_GRACE);
    }

    #[test]
    fn argv_must_name_a_program() {
        let o = ExecOptions::default();
        assert!(o.validate(&[]).unwrap_err().message().contains("argv is empty"));
        assert!(o.validate(&["".into()]).is_err());
        assert!(o.validate(&["a\0".into()]).is_err());
        assert!(o.validate(&["true".into()]).is_ok());
    }
}

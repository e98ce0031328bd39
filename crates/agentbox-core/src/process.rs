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

/// SIGKILL, for [`Process::signal`].
pub const SIGKILL: i32 = 9;
/// SIGTERM, for [`Process::signal`].
pub const SIGTERM: i32 = 15;

/// How long a program killed because its context ended may take to be reaped before
/// [`Process::wait`] answers anyway.
const KILL_GRACE: Duration = Duration::from_secs(10);

/// Options of one exec.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOptions {
    /// The working directory; relative paths are taken from the box's workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Variables for this program alone, over the spec's env.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
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
        for (k, v) in &self.env {
            crate::spec::validate_env(k, v).map_err(|e| e.context("exec env"))?;
        }
        if let Some(cwd) = &self.cwd
            && (cwd.is_empty() || cwd.contains('\0'))
        {
            return Err(Error::invalid("exec cwd: must be a non-empty path with no NUL"));
        }
        Ok(())
    }
}

/// How a program ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
                    let _ = ctrl.signal(SIGKILL).await;
                    match tokio::time::timeout(KILL_GRACE, ctrl.wait()).await {
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
        }
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

/// Kills a [`Process`] from elsewhere.
#[derive(Clone)]
pub struct Killer(Arc<dyn ProcessControl>);

impl Killer {
    /// Send `signal` to the program.
    pub async fn signal(&self, signal: i32) -> Result<()> {
        self.0.signal(signal).await
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
pub async fn finish(mut p: Process, opts: FinishOptions) -> Result<Finished> {
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
    let (w, out, err) = tokio::join!(
        write,
        read_bounded(stdout, max, "stdout"),
        read_bounded(stderr, max, "stderr")
    );
    if let Err(e) = out.as_ref().and(err.as_ref()) {
        let _ = p.kill().await;
        let _ = p.wait().await;
        return Err(e.clone());
    }
    let status = p.wait().await?;
    w?;
    Ok(Finished {
        status,
        stdout: out?,
        stderr: err?,
    })
}

/// Read a stream to its end, refusing past `max` bytes with `too_large`.
pub async fn read_bounded(r: Option<ByteReader>, max: usize, what: &str) -> Result<Vec<u8>> {
    let Some(mut r) = r else { return Ok(Vec::new()) };
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = r
            .read(&mut chunk)
            .await
            .map_err(|e| Error::io(e, format!("reading {what}")))?;
        if n == 0 {
            return Ok(buf);
        }
        if buf.len() + n > max {
            return Err(Error::too_large(format!("{what}: more than {max} bytes")));
        }
        buf.extend_from_slice(&chunk[..n]);
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

    #[test]
    fn argv_must_name_a_program() {
        let o = ExecOptions::default();
        assert!(o.validate(&[]).unwrap_err().message().contains("argv is empty"));
        assert!(o.validate(&["".into()]).is_err());
        assert!(o.validate(&["a\0".into()]).is_err());
        assert!(o.validate(&["true".into()]).is_ok());
    }
}

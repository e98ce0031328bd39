//! Collecting a command's output the same way on the host and in a box: streamed to
//! `on_output` as text (a UTF-8 sequence never split across two calls), counted against the
//! spill thresholds, and kept in memory up to a bound (its tail past it).

use tokio::io::{AsyncRead, AsyncReadExt};

use std::sync::{Arc, Mutex};

use crate::{ExecCode, ExecError, OnOutput, Spill, Stream, Window};

/// At most this much output is kept in memory; past it, its tail.
pub const MAX_KEPT: usize = 32 << 20;

/// Everything a command wrote, merged in arrival order.
#[derive(Default)]
pub struct Collected {
    /// The kept bytes (the tail, when `dropped` > 0).
    pub bytes: Vec<u8>,
    /// Bytes dropped from the head to stay within [`MAX_KEPT`].
    pub dropped: u64,
    /// Lines seen in all.
    pub lines: u64,
}

impl Collected {
    /// All bytes seen.
    pub fn total(&self) -> u64 {
        self.dropped + self.bytes.len() as u64
    }

    /// Whether `spill` says this output goes to a file.
    pub fn spills(&self, spill: Option<Spill>) -> bool {
        spill.is_some_and(|s| {
            s.after_bytes.is_some_and(|b| self.total() > b) || s.after_lines.is_some_and(|l| self.lines > l)
        })
    }

    fn push(&mut self, chunk: &[u8]) {
        self.lines += chunk.iter().filter(|&&b| b == b'\n').count() as u64;
        self.bytes.extend_from_slice(chunk);
        if self.bytes.len() > MAX_KEPT {
            let cut = self.bytes.len() - MAX_KEPT;
            self.bytes.drain(..cut);
            self.dropped += cut as u64;
        }
    }
}

/// Hands out text a valid UTF-8 sequence at a time.
#[derive(Default)]
struct Utf8Chunks {
    pending: Vec<u8>,
}

impl Utf8Chunks {
    fn feed(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let text = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
        self.pending.drain(..valid);
        text
    }
    fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

/// Run `fut` until it ends, the context ends, or `timeout` seconds pass; the last two are
/// the stop's code (`aborted` or `timeout`).
pub async fn race<T>(
    fut: impl std::future::Future<Output = T>,
    ctx: &agentbox_core::Ctx,
    timeout: Option<f64>,
) -> Result<T, ExecCode> {
    let deadline = timeout.map(|t| std::time::Duration::from_secs_f64(t.max(0.0)));
    tokio::select! {
        r = fut => Ok(r),
        e = ctx.done() => Err(if e.code() == agentbox_core::ErrorCode::Timeout { ExecCode::Timeout } else { ExecCode::Aborted }),
        _ = async { match deadline { Some(d) => tokio::time::sleep(d).await, None => std::future::pending().await } } => Err(ExecCode::Timeout),
    }
}

/// How a started command's run ended.
pub enum Ran {
    /// It exited; its output was delivered (and spilled, when past the threshold).
    Exited(crate::ExecOutcome),
    /// Its context or timeout ended it first: the caller stops its group, then awaits
    /// `drain` (bounded) so what it prints while ending still reaches `on_output`.
    Stopped {
        /// `timeout` or `aborted`.
        code: ExecCode,
        /// The output collector, still reading.
        drain: tokio::task::JoinHandle<Result<Collected, ExecError>>,
    },
}

/// Everything after a command started that the host and the box do alike: `on_output`
/// (windowed when asked), the race against the context and the timeout, and the spill of
/// the whole output to a temporary file of `env`. `wait` resolves to the exit code.
pub async fn run_command(
    env: &dyn crate::ExecutionEnv,
    stdout: Option<impl AsyncRead + Unpin + Send + 'static>,
    stderr: Option<impl AsyncRead + Unpin + Send + 'static>,
    wait: impl std::future::Future<Output = Result<i32, ExecError>>,
    opts: &crate::ExecOptions,
    ctx: &agentbox_core::Ctx,
) -> Result<Ran, ExecError> {
    let (on_output, window) = match (opts.on_output.clone(), opts.window) {
        (Some(cb), Some(w)) => {
            let (cb, f) = windowed(cb, w);
            (Some(cb), Some(f))
        }
        (cb, _) => (cb, None),
    };
    let mut output = spawn_collect(stdout, stderr, on_output);
    let run = async {
        let c = (&mut output)
            .await
            .map_err(|e| ExecError::new(ExecCode::Unknown, e.to_string()))??;
        Ok::<_, ExecError>((c, wait.await?))
    };
    let (collected, exit_code) = match race(run, ctx, opts.timeout).await {
        Ok(r) => r?,
        Err(code) => return Ok(Ran::Stopped { code, drain: output }),
    };
    if let Some(f) = &window {
        f.flush()?;
    }
    let unknown = |e: crate::FsError| ExecError::new(ExecCode::Unknown, e.message);
    let spill_path = if collected.spills(opts.spill) {
        let bg = agentbox_core::Ctx::background();
        let f = env
            .create_temp_file("agentbox-output-", ".log", &bg)
            .await
            .map_err(unknown)?;
        env.write_file(&f, &collected.bytes, &bg).await.map_err(unknown)?;
        Some(f)
    } else {
        None
    };
    Ok(Ran::Exited(crate::ExecOutcome { exit_code, spill_path }))
}

/// The message of a stop.
pub fn stopped_message(code: ExecCode) -> &'static str {
    if code == ExecCode::Timeout {
        "the command timed out"
    } else {
        "the command was aborted"
    }
}

/// [`collect`] in a task of its own, so a stop can keep draining output (what a command
/// prints as it is asked to end) while the group is killed.
pub fn spawn_collect(
    stdout: Option<impl AsyncRead + Unpin + Send + 'static>,
    stderr: Option<impl AsyncRead + Unpin + Send + 'static>,
    on_output: Option<OnOutput>,
) -> tokio::task::JoinHandle<Result<Collected, ExecError>> {
    tokio::spawn(async move { collect(stdout, stderr, on_output.as_ref()).await })
}

/// Read stdout and stderr to their ends together, merged in arrival order.
pub async fn collect(
    stdout: Option<impl AsyncRead + Unpin>,
    stderr: Option<impl AsyncRead + Unpin>,
    on_output: Option<&OnOutput>,
) -> Result<Collected, ExecError> {
    let mut out = stdout;
    let mut err = stderr;
    let mut collected = Collected::default();
    let (mut dec_out, mut dec_err) = (Utf8Chunks::default(), Utf8Chunks::default());
    let mut buf_out = vec![0u8; 64 * 1024];
    let mut buf_err = vec![0u8; 64 * 1024];
    let call = |text: String, stream: Stream| -> Result<(), ExecError> {
        if let Some(cb) = on_output
            && !text.is_empty()
        {
            cb(&text, stream).map_err(|e| ExecError::new(ExecCode::CallbackError, format!("on_output failed: {e}")))?;
        }
        Ok(())
    };
    while out.is_some() || err.is_some() {
        tokio::select! {
            n = async { out.as_mut().unwrap().read(&mut buf_out).await }, if out.is_some() => {
                match n {
                    Ok(0) | Err(_) => { out = None; call(dec_out.finish(), Stream::Stdout)?; }
                    Ok(n) => { collected.push(&buf_out[..n]); call(dec_out.feed(&buf_out[..n]), Stream::Stdout)?; }
                }
            }
            n = async { err.as_mut().unwrap().read(&mut buf_err).await }, if err.is_some() => {
                match n {
                    Ok(0) | Err(_) => { err = None; call(dec_err.finish(), Stream::Stderr)?; }
                    Ok(n) => { collected.push(&buf_err[..n]); call(dec_err.feed(&buf_err[..n]), Stream::Stderr)?; }
                }
            }
        }
    }
    Ok(collected)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_utf8_sequence_is_never_split() {
        let mut d = Utf8Chunks::default();
        let bytes = "é✓".as_bytes();
        assert_eq!(d.feed(&bytes[..1]), "");
        assert_eq!(d.feed(&bytes[1..3]), "é");
        assert_eq!(d.feed(&bytes[3..]), "✓");
        assert_eq!(d.feed(&[0xff, b'a']), "\u{fffd}a");
    }

    #[test]
    fn the_tail_is_kept_past_the_bound() {
        let mut c = Collected::default();
        c.push(&vec![b'a'; MAX_KEPT]);
        c.push(b"tail\n");
        assert_eq!(c.bytes.len(), MAX_KEPT);
        assert!(c.bytes.ends_with(b"tail\n"));
        assert_eq!(c.total(), MAX_KEPT as u64 + 5);
        assert!(c.spills(Some(Spill {
            after_bytes: Some(10),
            after_lines: None
        })));
        assert!(!c.spills(Some(Spill {
            after_bytes: None,
            after_lines: Some(1)
        })));
    }
}

/// Wrap `on_output` so it is called at most once per `window.interval_ms` with what arrived
/// since, cut to the window's last bytes and lines. A final call on drop delivers the rest.
pub fn windowed(on_output: OnOutput, window: Window) -> (OnOutput, WindowFlush) {
    let state = Arc::new(Mutex::new((String::new(), std::time::Instant::now(), None::<Stream>)));
    let st = state.clone();
    let cb = on_output.clone();
    let wrapped: OnOutput = Arc::new(move |text: &str, stream: Stream| {
        let mut s = st.lock().unwrap();
        s.0.push_str(text);
        s.2 = Some(stream);
        if s.1.elapsed().as_millis() as u64 >= window.interval_ms {
            let batch = cut(std::mem::take(&mut s.0), window);
            s.1 = std::time::Instant::now();
            drop(s);
            if !batch.is_empty() {
                return cb(&batch, stream);
            }
        }
        Ok(())
    });
    (
        wrapped,
        WindowFlush {
            state,
            on_output,
            window,
        },
    )
}

/// Delivers what a window still holds.
pub struct WindowFlush {
    state: Arc<Mutex<(String, std::time::Instant, Option<Stream>)>>,
    on_output: OnOutput,
    window: Window,
}

impl WindowFlush {
    /// Pass what is left to `on_output`.
    pub fn flush(&self) -> Result<(), ExecError> {
        let mut s = self.state.lock().unwrap();
        let batch = cut(std::mem::take(&mut s.0), self.window);
        let stream = s.2.unwrap_or(Stream::Stdout);
        drop(s);
        if batch.is_empty() {
            return Ok(());
        }
        (self.on_output)(&batch, stream)
            .map_err(|e| ExecError::new(ExecCode::CallbackError, format!("on_output failed: {e}")))
    }
}

fn cut(mut text: String, w: Window) -> String {
    if let Some(max) = w.max_lines {
        let n = text.matches('\n').count();
        if n > max {
            let mut skip = n - max;
            let at = text
                .char_indices()
                .find(|&(_, c)| {
                    if c == '\n' {
                        skip -= 1;
                    }
                    skip == 0 && c == '\n'
                })
                .map(|(i, _)| i + 1)
                .unwrap_or(0);
            text.drain(..at);
        }
    }
    if let Some(max) = w.max_bytes
        && text.len() > max
    {
        let mut at = text.len() - max;
        while !text.is_char_boundary(at) {
            at += 1;
        }
        text.drain(..at);
    }
    text
}

#[cfg(test)]
mod window_tests {
    use super::*;

    #[test]
    fn a_window_batches_and_keeps_the_tail() {
        let got = Arc::new(Mutex::new(Vec::<String>::new()));
        let g = got.clone();
        let cb: OnOutput = Arc::new(move |t: &str, _| {
            g.lock().unwrap().push(t.to_string());
            Ok(())
        });
        let (w, flush) = windowed(
            cb,
            Window {
                max_bytes: Some(8),
                max_lines: Some(2),
                interval_ms: 60_000,
            },
        );
        for l in ["a\n", "b\n", "c\n", "dddddddddd\n"] {
            w(l, Stream::Stdout).unwrap();
        }
        assert!(got.lock().unwrap().is_empty(), "nothing before the interval");
        flush.flush().unwrap();
        assert_eq!(*got.lock().unwrap(), vec!["ddddddd\n".to_string()]);
        assert_eq!(
            cut(
                "1\n2\n3\n".into(),
                Window {
                    max_bytes: None,
                    max_lines: Some(2),
                    interval_ms: 0
                }
            ),
            "2\n3\n"
        );
    }
}

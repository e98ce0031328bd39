//! One client connection: its requests, in the order they came, against the runner's table of
//! processes. Whatever carries the messages (a WebSocket, a byte stream) hands them here.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use agentbox_protocol::runner::{
    Answer, EXTENDED, FILE, MAX_KEY, MAX_TTY, Message, PROTOCOL, Request, STDIN, Tty, frame, signal_number, unframe,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::Runner;
use super::files;
use super::process::{self, Proc, Reading, json};
use super::pty;

/// What arrives on a connection: a message, or a frame its transport could not read (which is
/// answered, and the connection goes on).
pub(super) enum Inbound {
    /// A message.
    Message(Message),
    /// A frame that was not a message, and why.
    Bad(String),
}

/// A process as this connection reads it.
struct Mine {
    proc: Arc<Proc>,
}

/// How many `write`s or `append`s may wait for their bytes on one connection.
const MAX_PENDING_WRITES: usize = 256;
/// Bytes of `input` one connection may have waiting for processes to read them.
const MAX_INPUT_HELD: usize = 16 << 20;
/// How long an `input` waits for its process to take it.
const INPUT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// A `write`, `append` or `input` waiting for its bytes.
enum PendingWrite {
    /// To a file.
    File {
        path: String,
        mode: Option<u32>,
        append: bool,
    },
    /// To a process's stdin, which then ends when `close`.
    Input { proc: Arc<Proc>, close: bool },
}

/// Serve one connection until `rx` ends; its processes run on. With `half_close`, the end of
/// `rx` is only the end of requests (stdin closed): the processes' output and exits still go
/// out on `tx` until they end.
pub(super) async fn serve(
    runner: Arc<Runner>,
    mut rx: mpsc::Receiver<Inbound>,
    tx: mpsc::Sender<Message>,
    half_close: bool,
) {
    let conn = runner.next_conn.fetch_add(1, Ordering::Relaxed);
    let mut c = Conn {
        runner,
        conn,
        tx,
        extended: false,
        window: None,
        mine: HashMap::new(),
        writes: HashMap::new(),
        input_held: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
    };
    while let Some(inbound) = rx.recv().await {
        match inbound {
            Inbound::Bad(why) => {
                let code = if why.contains("over the") {
                    "too_large"
                } else {
                    "invalid"
                };
                c.answer(Answer::error(None, code, why)).await
            }
            Inbound::Message(Message::Text(t)) => c.text(&t).await,
            Inbound::Message(Message::Binary(b)) => c.binary(b).await,
        }
    }
    if half_close {
        return;
    }
    for (id, m) in c.mine.drain() {
        m.proc.detach((conn, id), true);
    }
}

struct Conn {
    runner: Arc<Runner>,
    conn: u64,
    tx: mpsc::Sender<Message>,
    extended: bool,
    /// The flow-control window this connection's hello asked for and was granted.
    window: Option<u64>,
    mine: HashMap<u32, Mine>,
    writes: HashMap<u32, PendingWrite>,
    /// Bytes of `input` waiting for their processes ([`MAX_INPUT_HELD`]).
    input_held: Arc<std::sync::atomic::AtomicUsize>,
}

impl Conn {
    async fn answer(&self, a: Answer) {
        let _ = self.tx.send(Message::Text(json(&a))).await;
    }

    async fn text(&mut self, t: &str) {
        let req: Request = match serde_json::from_str(t) {
            Ok(r) => r,
            Err(e) => {
                // Name the id when the frame has one, so the client's waiter hears of it.
                let id = serde_json::from_str::<serde_json::Value>(t)
                    .ok()
                    .and_then(|v| v.get("id")?.as_u64())
                    .and_then(|n| u32::try_from(n).ok());
                return self
                    .answer(Answer::error(
                        id,
                        "invalid",
                        format!("a request the runner cannot read: {e}"),
                    ))
                    .await;
            }
        };
        let id = req.id();
        if self.runner.protocol_2_only && matches!(req, Request::Hello { .. }) {
            // What a runner of protocol 2 alone answers a request it does not know.
            return self
                .answer(Answer::error(
                    Some(id),
                    "invalid",
                    "a request the runner cannot read: unknown op \"hello\" (this runner speaks protocol 2 only)",
                ))
                .await;
        }
        if req.is_extended() && !self.extended {
            return self
                .answer(Answer::error(
                    Some(id),
                    "unsupported",
                    format!("this request needs protocol {EXTENDED}: send hello first"),
                ))
                .await;
        }
        match req {
            Request::Hello { protocol, window, .. } => {
                let granted = if protocol >= EXTENDED { EXTENDED } else { PROTOCOL };
                self.extended = granted == EXTENDED;
                // A window is kept within what the runner keeps of a process (or nothing
                // could be sent once the buffer is full), and at least one chunk.
                let max = self.runner.limits.max_buffered as u64;
                self.window = window.filter(|_| self.extended).map(|w| w.clamp(1, max.max(1)));
                self.answer(Answer::Hello {
                    id,
                    protocol: granted,
                    pid: std::process::id(),
                    window: self.window,
                })
                .await
            }
            Request::Ack { stream, seq, .. } => {
                if let Some(m) = self.mine.get(&id) {
                    m.proc.ack((self.conn, id), stream, seq);
                }
            }
            Request::Run {
                command,
                argv,
                cwd,
                env,
                stdin,
                key,
                tty,
                detach,
                timeout_ms,
                secret,
                ..
            } => {
                let run = Run {
                    command,
                    argv,
                    cwd,
                    env,
                    stdin,
                    key,
                    tty,
                    detach,
                    timeout_ms,
                    secret,
                };
                if let Err(a) = self.run(id, run).await {
                    self.answer(a).await
                }
            }
            Request::StdinEnd { .. } => {
                let tx = self.mine.get(&id).and_then(|m| m.proc.stdin.lock().unwrap().take());
                if let Some(tx) = tx {
                    let _ = tx.send(None).await;
                }
            }
            Request::Kill { signal, handle, .. } => {
                let sig = match signal.as_deref().map(signal_number) {
                    None => 9,
                    Some(Some(n)) => n,
                    Some(None) => {
                        return self
                            .answer(Answer::error(
                                Some(id),
                                "invalid",
                                format!(
                                    "kill: signal {:?} is not one the runner sends",
                                    signal.unwrap_or_default()
                                ),
                            ))
                            .await;
                    }
                };
                let target = self.target(id, handle);
                if let Some(p) = &target {
                    process::kill_group(p.pid as i32, sig);
                }
                // Protocol 3 answers, so a client knows its signal went to a process (the
                // seed's protocol-2 client expects no answer, and gets none).
                if self.extended {
                    match target {
                        Some(_) => self.answer(Answer::Ok { id }).await,
                        None => self.answer(self.unknown(id, handle, "kill")).await,
                    }
                }
            }
            Request::Stop { .. } => {
                self.runner.stop_all().await;
                self.answer(Answer::Ok { id }).await
            }
            Request::Forget { handle, .. } => {
                let target = match handle {
                    Some(h) => self.runner.proc(h),
                    None => self.mine.remove(&id).map(|m| m.proc),
                };
                if let Some(p) = target
                    && p.forget()
                {
                    self.runner.procs.lock().unwrap().remove(&p.handle);
                }
                // Answered whether or not the process was still kept: forgetting is idempotent.
                self.answer(Answer::Ok { id }).await
            }
            Request::Release { .. } => {
                if let Some(m) = self.mine.remove(&id) {
                    m.proc.detach((self.conn, id), false);
                }
                self.answer(Answer::Ok { id }).await
            }
            Request::Ps { .. } => {
                let mut all: Vec<Arc<Proc>> = self.runner.procs.lock().unwrap().values().cloned().collect();
                all.sort_by_key(|p| p.handle);
                let processes = all.iter().map(|p| p.info()).collect();
                self.answer(Answer::Processes { id, processes }).await
            }
            Request::Resize { handle, rows, cols, .. } => {
                let a = match self.target(id, handle) {
                    None => self.unknown(id, handle, "resize"),
                    Some(p) => match (&p.tty, check_size(rows, cols)) {
                        (_, Err(why)) => Answer::error(Some(id), "invalid", format!("resize: {why}")),
                        (None, _) => Answer::error(
                            Some(id),
                            "unsupported",
                            format!("resize: process {} has no terminal (run it with tty)", p.handle),
                        ),
                        (Some(t), Ok(())) => match t.resize(rows, cols) {
                            Ok(()) => Answer::Ok { id },
                            Err(e) => Answer::error(Some(id), "unknown", format!("resize: {e}")),
                        },
                    },
                };
                self.answer(a).await
            }
            Request::Input { handle, close, .. } => match self.runner.proc(handle) {
                None => self.answer(self.unknown(id, Some(handle), "input")).await,
                Some(_) if self.writes.len() >= MAX_PENDING_WRITES => self.answer(too_many_writes(id)).await,
                Some(proc) => {
                    self.writes.insert(id, PendingWrite::Input { proc, close });
                }
            },
            Request::Resume {
                handle,
                key,
                after,
                hold,
                window,
                ..
            } => {
                if let Err(a) = self.resume(id, handle, key, after, hold, window).await {
                    self.answer(a).await
                }
            }
            Request::Write { .. } | Request::Append { .. } if self.writes.len() >= MAX_PENDING_WRITES => {
                self.answer(too_many_writes(id)).await
            }
            Request::Write { path, mode, .. } => {
                self.writes.insert(
                    id,
                    PendingWrite::File {
                        path,
                        mode,
                        append: false,
                    },
                );
            }
            Request::Append { path, .. } => {
                self.writes.insert(
                    id,
                    PendingWrite::File {
                        path,
                        mode: None,
                        append: true,
                    },
                );
            }
            Request::Read {
                path, offset, length, ..
            } => {
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    let read = tokio::task::spawn_blocking(move || files::read(id, &path, offset, length)).await;
                    let msg = match read {
                        Ok(Ok(Some(bytes))) => Message::Binary(frame(id, FILE, &bytes)),
                        Ok(Ok(None)) => Message::Text(json(&Answer::Absent { id })),
                        Ok(Err(a)) => Message::Text(json(&a)),
                        Err(e) => Message::Text(json(&Answer::error(Some(id), "unknown", format!("read: {e}")))),
                    };
                    let _ = tx.send(msg).await;
                });
            }
            other => {
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    let a = tokio::task::spawn_blocking(move || files::other(&other))
                        .await
                        .unwrap_or_else(|e| Answer::error(Some(id), "unknown", format!("{e}")));
                    let _ = tx.send(Message::Text(json(&a))).await;
                });
            }
        }
    }

    async fn binary(&mut self, b: Vec<u8>) {
        let Some((id, stream, bytes)) = unframe(&b) else {
            return self
                .answer(Answer::error(
                    None,
                    "invalid",
                    format!("a binary frame of {} bytes is shorter than its 5-byte header", b.len()),
                ))
                .await;
        };
        match stream {
            STDIN if matches!(self.writes.get(&id), Some(PendingWrite::Input { .. })) => {
                let Some(PendingWrite::Input { proc, close }) = self.writes.remove(&id) else {
                    return;
                };
                let Some(tx) = proc.stdin.lock().unwrap().clone() else {
                    return self
                        .answer(Answer::error(
                            Some(id),
                            "gone",
                            format!("input: the stdin of process {} has ended", proc.handle),
                        ))
                        .await;
                };
                // Queued off the connection: a process that does not read its stdin holds up
                // only the answer to this input, never the connection's other requests.
                let held = self.input_held.clone();
                if held.load(Ordering::SeqCst) + bytes.len() > MAX_INPUT_HELD {
                    return self
                        .answer(Answer::error(
                            Some(id),
                            "too_large",
                            format!(
                                "input: {MAX_INPUT_HELD} bytes of input on this connection already wait for processes to read them"
                            ),
                        ))
                        .await;
                }
                held.fetch_add(bytes.len(), Ordering::SeqCst);
                let (bytes, answers) = (bytes.to_vec(), self.tx.clone());
                tokio::spawn(async move {
                    let n = bytes.len();
                    let queue = async {
                        let mut ok = bytes.is_empty() || tx.send(Some(bytes)).await.is_ok();
                        let end = if close { proc.stdin.lock().unwrap().take() } else { None };
                        if let Some(tx) = end {
                            ok &= tx.send(None).await.is_ok();
                        }
                        ok
                    };
                    let a = match tokio::time::timeout(INPUT_TIMEOUT, queue).await {
                        Ok(true) => Answer::Ok { id },
                        Ok(false) => {
                            Answer::error(Some(id), "gone", format!("input: process {} has ended", proc.handle))
                        }
                        Err(_) => Answer::error(
                            Some(id),
                            "timeout",
                            format!(
                                "input: process {} read none of its stdin within {}s",
                                proc.handle,
                                INPUT_TIMEOUT.as_secs()
                            ),
                        ),
                    };
                    held.fetch_sub(n, Ordering::SeqCst);
                    let _ = answers.send(Message::Text(json(&a))).await;
                });
            }
            STDIN => {
                // Stdin for an id this connection does not know, or whose stdin ended, is dropped.
                let tx = self.mine.get(&id).and_then(|m| m.proc.stdin.lock().unwrap().clone());
                if let Some(tx) = tx {
                    let _ = tx.send(Some(bytes.to_vec())).await;
                }
            }
            FILE => {
                let Some(PendingWrite::File { path, mode, append }) = self.writes.remove(&id) else {
                    return;
                };
                let bytes = bytes.to_vec();
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    let a = tokio::task::spawn_blocking(move || files::write(id, &path, &bytes, mode, append))
                        .await
                        .unwrap_or_else(|e| Answer::error(Some(id), "unknown", format!("{e}")));
                    let _ = tx.send(Message::Text(json(&a))).await;
                });
            }
            other => {
                self.answer(Answer::error(
                    Some(id),
                    "invalid",
                    format!("stream {other} is not one a client sends (stdin 0, file 3)"),
                ))
                .await
            }
        }
    }

    /// The process a request names: by `handle`, else by its id on this connection.
    fn target(&self, id: u32, handle: Option<u64>) -> Option<Arc<Proc>> {
        match handle {
            Some(h) => self.runner.proc(h),
            None => self.mine.get(&id).map(|m| m.proc.clone()),
        }
    }

    fn unknown(&self, id: u32, handle: Option<u64>, op: &str) -> Answer {
        let what = match handle {
            Some(h) => format!("no process {h}"),
            None => format!("no process {id} on this connection"),
        };
        Answer::error(
            Some(id),
            "not_found",
            format!("{op}: {what} (it ended and was forgotten, or never ran)"),
        )
    }

    fn reading(&self, id: u32, hold: bool, window: Option<u64>) -> Reading {
        Reading {
            id,
            extended: self.extended,
            hold,
            window,
            tx: self.tx.clone(),
        }
    }

    async fn run(&mut self, id: u32, r: Run) -> Result<(), Answer> {
        let invalid = |why: String| Answer::error(Some(id), "invalid", why);
        if self.mine.contains_key(&id) {
            return Err(invalid(format!(
                "run: id {id} already names a process on this connection"
            )));
        }
        if let Some(k) = &r.key {
            if k.is_empty() || k.len() > MAX_KEY {
                return Err(invalid(format!("run: key: {} bytes, not 1 to {MAX_KEY}", k.len())));
            }
            // Sent again after a drop that lost its answer: the process it started, not a second.
            if let Some(p) = self.runner.by_key(k) {
                self.answer(Answer::Started {
                    id,
                    handle: p.handle,
                    pid: p.pid,
                })
                .await;
                self.mine.insert(id, Mine { proc: p.clone() });
                p.attach(self.conn, self.reading(id, true, self.window), 0, false);
                return Ok(());
            }
        }
        let argv = match (r.command, r.argv) {
            (Some(c), None) => vec![self.runner.shell.clone(), "-c".into(), c],
            (None, Some(a)) if !a.is_empty() && !a[0].is_empty() => a,
            (None, Some(_)) => return Err(invalid("run: argv is empty: no program to run".into())),
            (None, None) => return Err(invalid("run: give a command (or argv)".into())),
            (Some(_), Some(_)) => return Err(invalid("run: give a command or argv, not both".into())),
        };
        if argv.iter().any(|a| a.contains('\0')) {
            return Err(invalid("run: an argument holds a NUL byte".into()));
        }
        if let Some(t) = &r.tty {
            check_size(t.rows, t.cols).map_err(|why| invalid(format!("run: tty: {why}")))?;
            if let Some(term) = &t.term
                && (term.is_empty() || term.len() > 64 || !term.bytes().all(|b| b.is_ascii_graphic()))
            {
                return Err(invalid(format!(
                    "run: tty: TERM {term:?} is not a terminal name (1 to 64 printable characters)"
                )));
            }
        }
        if r.timeout_ms == Some(0) {
            return Err(invalid("run: timeout_ms: must be over 0".into()));
        }
        if let Some(d) = &r.cwd
            && !std::path::Path::new(d).is_dir()
        {
            return Err(Answer::error(
                Some(id),
                "not_found",
                format!("run: working directory {d} does not exist"),
            ));
        }
        // The secret's pipe, filled and closed before the process starts: it reads the value,
        // then EOF, on descriptor 3, and nothing else of the box's holds it.
        let secret = match &r.secret {
            Some(sf) => {
                let bad = |why: String| Answer::error(Some(id), "invalid", format!("run: secret: {why}"));
                if agentbox_core::validate_env(&sf.name, "").is_err() {
                    return Err(bad(format!("{:?} is not a variable's name", sf.name)));
                }
                if sf.value.is_empty() || sf.value.len() > agentbox_core::MAX_SECRET_BYTES {
                    return Err(bad(format!("1 to {} bytes", agentbox_core::MAX_SECRET_BYTES)));
                }
                Some(
                    secret_pipe(sf.value.as_bytes())
                        .map_err(|e| Answer::error(Some(id), "unknown", format!("run: the secret's pipe: {e}")))?,
                )
            }
            None => None,
        };
        let handle = self.runner.admit(id)?;
        let mut cmd = tokio::process::Command::new(&argv[0]);
        cmd.args(&argv[1..]).envs(r.env.unwrap_or_default()).kill_on_drop(false);
        if let (Some(read), Some(sf)) = (&secret, &r.secret) {
            use std::os::fd::AsRawFd;
            let fd = read.as_raw_fd();
            cmd.env("AGENTBOX_SECRET_FD", agentbox_core::SECRET_FD.to_string())
                .env("AGENTBOX_SECRET_NAME", &sf.name);
            // SAFETY: between fork and exec only async-signal-safe calls: dup2(2), or fcntl(2)
            // when the pipe is descriptor 3 already (dup2 onto itself would keep CLOEXEC).
            #[allow(unsafe_code)]
            unsafe {
                cmd.pre_exec(move || {
                    let target = agentbox_core::SECRET_FD;
                    if fd == target {
                        if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                            return Err(std::io::Error::last_os_error());
                        }
                    } else if libc::dup2(fd, target) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        if let Some(d) = &r.cwd {
            cmd.current_dir(d);
        }
        let terminal = match &r.tty {
            None => {
                cmd.stdin(if r.stdin { Stdio::piped() } else { Stdio::null() })
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .process_group(0);
                None
            }
            Some(t) => {
                let (master, slave) = pty::open(t.rows, t.cols)
                    .map_err(|e| Answer::error(Some(id), "unknown", format!("run: opening a terminal: {e}")))?;
                let io = |f: &std::os::fd::OwnedFd| {
                    f.try_clone()
                        .map(Stdio::from)
                        .map_err(|e| Answer::error(Some(id), "unknown", format!("run: the terminal: {e}")))
                };
                cmd.stdin(io(&slave)?).stdout(io(&slave)?).stderr(io(&slave)?);
                cmd.env("TERM", t.term.as_deref().unwrap_or("xterm-256color"));
                // SAFETY: between fork and exec only async-signal-safe calls: setsid(2), and
                // the ioctl that makes the terminal on fd 0 the session's controlling one.
                #[allow(unsafe_code)]
                unsafe {
                    cmd.pre_exec(|| {
                        rustix::process::setsid()?;
                        rustix::process::ioctl_tiocsctty(std::os::fd::BorrowedFd::borrow_raw(0))?;
                        Ok(())
                    });
                }
                Some(master)
            }
        };
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let (code, why) = match e.kind() {
                    std::io::ErrorKind::NotFound => ("not_found", "not found"),
                    std::io::ErrorKind::PermissionDenied => ("permission_denied", "not executable"),
                    _ => ("unknown", "cannot be started"),
                };
                return Err(Answer::error(
                    Some(id),
                    code,
                    format!("run: program {:?} {why}: {e}", argv[0]),
                ));
            }
        };
        // The slave's last copy here: the terminal's output ends when the process's does.
        drop(cmd);
        // The process has its own copy of the secret's pipe; this one goes.
        drop(secret);
        let pid = child.id().unwrap_or(0);
        let (stdout, stderr, writer): (Option<process::Pipe>, Option<process::Pipe>, Option<Writer>) = match &terminal {
            Some(t) => (
                Some(Box::new(pty::Reader(t.clone()))),
                None,
                r.stdin.then(|| Box::new(pty::Writer(t.clone())) as Writer),
            ),
            None => (
                child.stdout.take().map(|s| Box::new(s) as _),
                child.stderr.take().map(|s| Box::new(s) as _),
                child.stdin.take().map(|s| Box::new(s) as Writer),
            ),
        };
        let stdin_tx = writer.map(|mut w| {
            let (tx, mut rx) = mpsc::channel::<Option<Vec<u8>>>(16);
            tokio::spawn(async move {
                while let Some(Some(b)) = rx.recv().await {
                    if w.write_all(&b).await.is_err() {
                        break;
                    }
                }
                let _ = w.shutdown().await;
            });
            tx
        });
        let proc = Proc::new(
            process::Start {
                handle,
                key: r.key,
                argv,
                tty: terminal,
                detach: r.detach,
                resumable: self.extended,
                max_buffered: self.runner.limits.max_buffered,
                stdin: stdin_tx,
            },
            pid,
        );
        self.runner.procs.lock().unwrap().insert(handle, proc.clone());
        self.mine.insert(id, Mine { proc: proc.clone() });
        if self.extended {
            // Ahead of any output: the reader's task starts after this is queued.
            self.answer(Answer::Started { id, handle, pid }).await;
        }
        proc.attach(self.conn, self.reading(id, true, self.window), 0, false);
        let deadline = r
            .timeout_ms
            .map(|ms| tokio::time::Instant::now() + std::time::Duration::from_millis(ms));
        let runner = self.runner.clone();
        tokio::spawn(process::run(proc, child, stdout, stderr, deadline, move || {
            runner.procs.lock().unwrap().remove(&handle);
        }));
        Ok(())
    }

    async fn resume(
        &mut self,
        id: u32,
        handle: Option<u64>,
        key: Option<String>,
        after: u64,
        hold: Option<bool>,
        window: Option<u64>,
    ) -> Result<(), Answer> {
        if self.mine.contains_key(&id) {
            return Err(Answer::error(
                Some(id),
                "invalid",
                format!("resume: id {id} already names a process on this connection"),
            ));
        }
        let found = match (handle, &key) {
            (Some(h), None) => self.runner.proc(h),
            (None, Some(k)) => self.runner.by_key(k),
            _ => {
                return Err(Answer::error(
                    Some(id),
                    "invalid",
                    "resume: name the process by its handle or by its key, one of them",
                ));
            }
        };
        let Some(proc) = found else {
            let what = match (handle, key) {
                (Some(h), _) => format!("no process {h}"),
                (_, k) => format!("no process of key {:?}", k.unwrap_or_default()),
            };
            return Err(Answer::error(
                Some(id),
                "not_found",
                format!("resume: {what}: it ended and was forgotten, or never ran"),
            ));
        };
        let end = proc.info().end;
        if after > end {
            return Err(Answer::error(
                Some(id),
                "invalid",
                format!(
                    "resume: after {after} is past the {end} bytes process {} wrote",
                    proc.handle
                ),
            ));
        }
        let max = self.runner.limits.max_buffered as u64;
        let window = match window {
            Some(w) => Some(w.min(max)),
            None => self.window,
        };
        let hold = hold.unwrap_or(true);
        self.mine.insert(id, Mine { proc: proc.clone() });
        // The reader's task says `resumed` first, ahead of every frame.
        proc.attach(self.conn, self.reading(id, hold, window), after, true);
        Ok(())
    }
}

/// A `run`'s fields.
struct Run {
    command: Option<String>,
    argv: Option<Vec<String>>,
    cwd: Option<String>,
    env: Option<std::collections::BTreeMap<String, String>>,
    stdin: bool,
    key: Option<String>,
    tty: Option<Tty>,
    detach: bool,
    timeout_ms: Option<u64>,
    secret: Option<agentbox_protocol::runner::SecretFd>,
}

type Writer = Box<dyn tokio::io::AsyncWrite + Unpin + Send>;

/// A pipe holding `value` and then EOF: its reading end (close-on-exec: the child's copy is
/// made by dup2 in the child alone). The value fits the pipe's buffer (at most 16 KiB of the
/// kernel's 64), so the write never waits.
fn secret_pipe(value: &[u8]) -> std::io::Result<std::os::fd::OwnedFd> {
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let mut w = std::fs::File::from(write);
    std::io::Write::write_all(&mut w, value)?;
    drop(w);
    Ok(read)
}

fn too_many_writes(id: u32) -> Answer {
    Answer::error(
        Some(id),
        "too_large",
        format!("{MAX_PENDING_WRITES} writes already wait for their bytes on this connection"),
    )
}

/// A terminal's size within bounds.
fn check_size(rows: u16, cols: u16) -> Result<(), String> {
    if rows == 0 || cols == 0 || rows > MAX_TTY || cols > MAX_TTY {
        return Err(format!("{rows} rows by {cols} columns: each must be 1 to {MAX_TTY}"));
    }
    Ok(())
}

//! One client connection: its requests, in the order they came, against the runner's table of
//! processes. Whatever carries the messages (a WebSocket, a byte stream) hands them here.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use agentbox_protocol::runner::{
    Answer, EXTENDED, FILE, Message, PROTOCOL, Request, STDIN, frame, signal_number, unframe,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::Runner;
use super::files;
use super::process::{self, Attachment, Command, Handle, json};

/// What arrives on a connection: a message, or a frame its transport could not read (which is
/// answered, and the connection goes on).
pub(super) enum Inbound {
    /// A message.
    Message(Message),
    /// A frame that was not a message, and why.
    Bad(String),
}

/// A process as this connection knows it.
struct Mine {
    handle: u64,
    stdin: Option<mpsc::Sender<Option<Vec<u8>>>>,
}

/// How many `write`s or `append`s may wait for their bytes on one connection.
const MAX_PENDING_WRITES: usize = 256;

/// A `write` or `append` waiting for its bytes.
struct PendingWrite {
    path: String,
    mode: Option<u32>,
    append: bool,
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
    for m in c.mine.values() {
        if let Some(h) = c.runner.procs.lock().unwrap().get(&m.handle) {
            let _ = h.tx.try_send(Command::Detach(conn));
        }
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
                let task = self
                    .mine
                    .get(&id)
                    .and_then(|m| self.runner.procs.lock().unwrap().get(&m.handle).map(|h| h.tx.clone()));
                // Never dropped: the last ack may be the one that frees a stalled window.
                if let Some(tx) = task {
                    let _ = tx.send(Command::Ack(self.conn, stream, seq)).await;
                }
            }
            Request::Run {
                command,
                argv,
                cwd,
                env,
                stdin,
                ..
            } => {
                if let Err(a) = self.run(id, command, argv, cwd, env, stdin).await {
                    self.answer(a).await
                }
            }
            Request::StdinEnd { .. } => {
                if let Some(tx) = self.mine.get_mut(&id).and_then(|m| m.stdin.take()) {
                    let _ = tx.send(None).await;
                }
            }
            Request::Kill { signal, .. } => {
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
                let known = match self.mine.get(&id) {
                    Some(m) => {
                        self.runner.signal(m.handle, sig);
                        true
                    }
                    None => false,
                };
                // Protocol 3 answers, so a client knows its signal went to a process (the
                // seed's protocol-2 client expects no answer, and gets none).
                if self.extended {
                    if known {
                        self.answer(Answer::Ok { id }).await
                    } else {
                        self.answer(Answer::error(
                            Some(id),
                            "not_found",
                            format!(
                                "kill: no process {id} on this connection (it ended and was forgotten, or never ran)"
                            ),
                        ))
                        .await
                    }
                }
            }
            Request::Stop { .. } => {
                self.runner.stop_all().await;
                self.answer(Answer::Ok { id }).await
            }
            Request::Forget { .. } => {
                if let Some(m) = self.mine.remove(&id)
                    && let Some(h) = self.runner.procs.lock().unwrap().get(&m.handle)
                {
                    let _ = h.tx.try_send(Command::Forget);
                }
                // Answered whether or not the process was still kept: forgetting is idempotent.
                self.answer(Answer::Ok { id }).await
            }
            Request::Resume { handle, after, .. } => self.resume(id, handle, after).await,
            Request::Write { .. } | Request::Append { .. } if self.writes.len() >= MAX_PENDING_WRITES => {
                self.answer(Answer::error(
                    Some(id),
                    "too_large",
                    format!("{MAX_PENDING_WRITES} writes already wait for their bytes on this connection"),
                ))
                .await
            }
            Request::Write { path, mode, .. } => {
                self.writes.insert(
                    id,
                    PendingWrite {
                        path,
                        mode,
                        append: false,
                    },
                );
            }
            Request::Append { path, .. } => {
                self.writes.insert(
                    id,
                    PendingWrite {
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
            STDIN => {
                // Stdin for an id this connection does not know, or whose stdin ended, is dropped.
                if let Some(tx) = self.mine.get(&id).and_then(|m| m.stdin.clone()) {
                    let _ = tx.send(Some(bytes.to_vec())).await;
                }
            }
            FILE => {
                let Some(w) = self.writes.remove(&id) else { return };
                let bytes = bytes.to_vec();
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    let a = tokio::task::spawn_blocking(move || files::write(id, &w.path, &bytes, w.mode, w.append))
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

    fn attachment(&self, id: u32) -> Attachment {
        Attachment {
            conn: self.conn,
            id,
            extended: self.extended,
            window: self.window,
            tx: self.tx.clone(),
        }
    }

    async fn run(
        &mut self,
        id: u32,
        command: Option<String>,
        argv: Option<Vec<String>>,
        cwd: Option<String>,
        env: Option<std::collections::BTreeMap<String, String>>,
        stdin: bool,
    ) -> Result<(), Answer> {
        let invalid = |why: String| Answer::error(Some(id), "invalid", why);
        if self.mine.contains_key(&id) {
            return Err(invalid(format!(
                "run: id {id} already names a process on this connection"
            )));
        }
        let argv = match (command, argv) {
            (Some(c), None) => vec![self.runner.shell.clone(), "-c".into(), c],
            (None, Some(a)) if !a.is_empty() && !a[0].is_empty() => a,
            (None, Some(_)) => return Err(invalid("run: argv is empty: no program to run".into())),
            (None, None) => return Err(invalid("run: give a command (or argv)".into())),
            (Some(_), Some(_)) => return Err(invalid("run: give a command or argv, not both".into())),
        };
        if argv.iter().any(|a| a.contains('\0')) {
            return Err(invalid("run: an argument holds a NUL byte".into()));
        }
        if let Some(d) = &cwd
            && !std::path::Path::new(d).is_dir()
        {
            return Err(Answer::error(
                Some(id),
                "not_found",
                format!("run: working directory {d} does not exist"),
            ));
        }
        let handle = self.runner.admit(id)?;
        let mut cmd = tokio::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .envs(env.unwrap_or_default())
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(false);
        if let Some(d) = &cwd {
            cmd.current_dir(d);
        }
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
        let pid = child.id().unwrap_or(0);
        let stdin_tx = child.stdin.take().map(|mut w| {
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
        let (ctl, ctl_rx) = mpsc::channel(16);
        let delivered = Arc::new(AtomicBool::new(false));
        let settled = Arc::new(AtomicBool::new(false));
        self.runner.procs.lock().unwrap().insert(
            handle,
            Handle {
                tx: ctl,
                pgid: pid as i32,
                delivered: delivered.clone(),
                stdin: stdin_tx.clone(),
                settled: settled.clone(),
            },
        );
        self.mine.insert(
            id,
            Mine {
                handle,
                stdin: stdin_tx,
            },
        );
        if self.extended {
            // Ahead of any output: the process task starts after this is queued.
            self.answer(Answer::Started { id, handle, pid }).await;
        }
        let runner = self.runner.clone();
        let first = self.attachment(id);
        let resumable = self.extended;
        let max = self.runner.limits.max_buffered;
        let task = process::Task {
            child,
            resumable,
            max_buffered: max,
            first,
            rx: ctl_rx,
            delivered,
            settled,
        };
        tokio::spawn(process::run(task, move || {
            runner.procs.lock().unwrap().remove(&handle);
        }));
        Ok(())
    }

    async fn resume(&mut self, id: u32, handle: u64, after: u64) {
        if self.mine.contains_key(&id) {
            return self
                .answer(Answer::error(
                    Some(id),
                    "invalid",
                    format!("resume: id {id} already names a process on this connection"),
                ))
                .await;
        }
        let found = self
            .runner
            .procs
            .lock()
            .unwrap()
            .get(&handle)
            .map(|h| (h.tx.clone(), h.stdin.clone()));
        let Some((tx, stdin)) = found else {
            return self
                .answer(Answer::error(
                    Some(id),
                    "not_found",
                    format!("resume: no process {handle}: it ended and was forgotten, or never ran"),
                ))
                .await;
        };
        self.mine.insert(id, Mine { handle, stdin });
        if tx.send(Command::Attach(self.attachment(id), after)).await.is_err() {
            self.mine.remove(&id);
            self.answer(Answer::error(
                Some(id),
                "not_found",
                format!("resume: process {handle} just ended"),
            ))
            .await
        }
    }
}

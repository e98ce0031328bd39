//! The box's processes through its runner ([`Processes`]): each call one request on the
//! client's connection, a read one reader that does not hold its process up.

use std::time::Duration;

use agentbox_core::{
    Ctx, Error, ExitStatus, MAX_READ, MAX_READ_WAIT, OutputChunk, OutputRead, Process, ProcessInfo, ProcessState,
    Processes, Result,
};
use agentbox_protocol::runner::{Answer, ProcExit, Request, STDIN};
use async_trait::async_trait;
use tokio::sync::mpsc;

use super::{Client, Reply, Seen, send};

/// After output came, how long a read waits for more before it answers.
const SETTLE: Duration = Duration::from_millis(20);
/// How many dropped connections one read reads past.
const MAX_DROPS: u32 = 10;

fn state(exit: Option<ProcExit>) -> ProcessState {
    match exit {
        None => ProcessState::Running,
        Some(e) => {
            let status = ExitStatus {
                code: e.code,
                signal: e.signal,
            };
            if e.timeout {
                ProcessState::TimedOut { status }
            } else {
                ProcessState::Exited { status }
            }
        }
    }
}

impl Client {
    /// One reader that does not hold the process, from `got.next` on until `until`, `want`
    /// bytes, or the exit, adding what came to `got`.
    async fn read_once(
        &self,
        handle: u64,
        got: &mut OutputRead,
        until: tokio::time::Instant,
        want: usize,
        ctx: &Ctx,
    ) -> Result<()> {
        let tx = self.link(ctx).await?;
        if self.protocol_2_only() {
            return Err(self.refused_by_protocol_2("read"));
        }
        let id = self.id();
        let (wtx, mut wrx) = mpsc::unbounded_channel();
        self.shared.lock().unwrap().watching.insert(id, wtx);
        let req = Request::Resume {
            id,
            handle: Some(handle),
            key: None,
            after: got.next,
            hold: Some(false),
            window: Some(want as u64),
        };
        let collected = async {
            send(&tx, &req).await?;
            let mut resumed = false;
            // What the runner already held when it answered (and whether the process had
            // ended): that comes at once, whatever the wait, and is waited for as a request.
            let mut kept = (0u64, false);
            let mut bytes = 0usize;
            loop {
                let now = tokio::time::Instant::now();
                let by = if !resumed || got.next < kept.0 || kept.1 {
                    now + super::REQUEST_TIMEOUT
                } else if bytes > 0 {
                    // Answer soon once output came: the caller asks again from `next`.
                    until.min(now + SETTLE)
                } else {
                    until
                };
                let seen = match ctx.run(tokio::time::timeout_at(by, wrx.recv())).await? {
                    Ok(Some(s)) => s,
                    Ok(None) => return Err(self.dropped()),
                    Err(_) if !resumed || got.next < kept.0 || kept.1 => {
                        return Err(Error::timeout(format!(
                            "{} did not answer within {}s",
                            self.describe(),
                            super::REQUEST_TIMEOUT.as_secs()
                        )));
                    }
                    Err(_) => return Ok(()),
                };
                match seen {
                    Seen::Resumed(from, at) => {
                        if from > got.next && got.gap_from.is_none() {
                            got.gap_from = Some(from);
                        }
                        got.next = got.next.max(from);
                        if let Some(at) = at {
                            kept = at;
                        }
                        resumed = true;
                    }
                    Seen::Output(c) => {
                        if c.seq > got.next && got.gap_from.is_none() {
                            got.gap_from = Some(c.seq);
                        }
                        got.next = c.seq + c.bytes.len() as u64;
                        bytes += c.bytes.len();
                        got.chunks.push(c);
                        if bytes >= want {
                            return Ok(());
                        }
                    }
                    Seen::Exit(e) => {
                        got.exit = Some(state(Some(e)));
                        return Ok(());
                    }
                    Seen::Error(e) => return Err(e),
                }
            }
        }
        .await;
        self.shared.lock().unwrap().watching.remove(&id);
        // Whatever came of it, this reader lets go (a dropped connection let go already).
        let _ = send(&tx, &Request::Release { id }).await;
        collected
    }

    /// The answer `ok`, or the runner's error as the contract's.
    async fn ok_or(&self, req: impl FnOnce(u32) -> Request, bytes: Option<(u8, &[u8])>, ctx: &Ctx) -> Result<()> {
        match self.ask_on(req, bytes, ctx).await? {
            Reply::Answer(Answer::Ok { .. }) => Ok(()),
            other => Err(self.answer_error(other)),
        }
    }

    fn answer_error(&self, r: Reply) -> Error {
        match r {
            Reply::Answer(Answer::Error { message, code, .. }) => Error::new(super::code_of(code.as_deref()), message),
            Reply::Lost => self.dropped(),
            _ => Error::unknown(format!("{} gave an answer out of place", self.describe())),
        }
    }
}

#[async_trait]
impl Processes for Client {
    async fn list(&self, ctx: &Ctx) -> Result<Vec<ProcessInfo>> {
        match self.ask(|id| Request::Ps { id }, None, ctx).await? {
            Reply::Answer(Answer::Processes { processes, .. }) => Ok(processes
                .into_iter()
                .map(|p| ProcessInfo {
                    handle: p.handle,
                    argv: p.argv,
                    pid: p.pid,
                    started_ms: p.started_ms,
                    state: state(p.exit),
                    tty: p.tty,
                    detach: p.detach,
                    first: p.first,
                    end: p.end,
                    readers: p.readers,
                })
                .collect()),
            other => Err(self.answer_error(other)),
        }
    }

    async fn read(&self, handle: u64, after: u64, wait: Duration, max_bytes: usize, ctx: &Ctx) -> Result<OutputRead> {
        if max_bytes == 0 || max_bytes > MAX_READ {
            return Err(Error::invalid(format!(
                "read: max_bytes {max_bytes}: must be 1 to {MAX_READ}"
            )));
        }
        if wait > MAX_READ_WAIT {
            return Err(Error::invalid(format!(
                "read: wait {}s: at most {}s",
                wait.as_secs(),
                MAX_READ_WAIT.as_secs()
            )));
        }
        let mut got = OutputRead {
            chunks: Vec::new(),
            gap_from: None,
            next: after,
            exit: None,
        };
        let until = tokio::time::Instant::now() + wait;
        // A read is idempotent (it names the byte it starts at): a drop is read past by
        // reading again from the next byte on the next connection.
        let mut drops = 0;
        loop {
            let want = max_bytes - got.chunks.iter().map(|c| c.bytes.len()).sum::<usize>();
            match self.read_once(handle, &mut got, until, want, ctx).await {
                Err(e) if e.code() == agentbox_core::ErrorCode::TransferFailed && drops < MAX_DROPS => drops += 1,
                r => return r.map(|()| merge(got)),
            }
        }
    }

    async fn attach(&self, handle: u64, after: u64, ctx: &Ctx) -> Result<Process> {
        let id = self.id();
        self.start(id, None, Some(handle), after, false, None, ctx, &Ctx::background())
            .await
    }

    async fn write(&self, handle: u64, data: &[u8], close: bool, ctx: &Ctx) -> Result<()> {
        if data.len() > agentbox_protocol::runner::MAX_MESSAGE - 64 {
            return Err(Error::too_large(format!(
                "write: {} bytes in one write; write at most {} at a time",
                data.len(),
                agentbox_protocol::runner::MAX_MESSAGE - 64
            )));
        }
        self.ok_or(|id| Request::Input { id, handle, close }, Some((STDIN, data)), ctx)
            .await
    }

    async fn signal(&self, handle: u64, signal: i32, ctx: &Ctx) -> Result<()> {
        let name = super::wire_signal(signal)?;
        self.ok_or(
            |id| Request::Kill {
                id,
                signal: Some(name.to_string()),
                handle: Some(handle),
            },
            None,
            ctx,
        )
        .await
    }

    async fn resize(&self, handle: u64, rows: u16, cols: u16, ctx: &Ctx) -> Result<()> {
        self.ok_or(
            |id| Request::Resize {
                id,
                handle: Some(handle),
                rows,
                cols,
            },
            None,
            ctx,
        )
        .await
    }

    async fn forget(&self, handle: u64, ctx: &Ctx) -> Result<()> {
        self.ok_or(
            |id| Request::Forget {
                id,
                handle: Some(handle),
            },
            None,
            ctx,
        )
        .await
    }
}

/// Neighbouring chunks of one stream joined, so a reader gets whole runs of text.
fn merge(mut got: OutputRead) -> OutputRead {
    let mut out: Vec<OutputChunk> = Vec::with_capacity(got.chunks.len());
    for c in got.chunks.drain(..) {
        match out.last_mut() {
            Some(l) if l.stream == c.stream && l.seq + l.bytes.len() as u64 == c.seq => l.bytes.extend(c.bytes),
            _ => out.push(c),
        }
    }
    got.chunks = out;
    got
}

#[cfg(test)]
mod tests {
    /// The signals the contract names are the ones the runner's wire carries, by the same
    /// numbers (the runner cannot depend on the contract, so each has its table).
    #[test]
    fn the_contracts_signals_are_the_wires() {
        for (name, n) in agentbox_core::SIGNALS {
            assert_eq!(agentbox_protocol::runner::signal_number(name), Some(n), "{name}");
            assert_eq!(
                agentbox_protocol::runner::signal_name(n),
                Some(format!("SIG{name}").as_str())
            );
        }
    }
}

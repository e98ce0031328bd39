//! The host side of one exec through a box's supervisor.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Error, ExitStatus, Process, ProcessControl, Result};
use agentbox_protocol::frame;
use agentbox_protocol::supervisor::{Reply, Request};
use async_trait::async_trait;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use rustix::pipe::{PipeFlags, pipe_with};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf, pipe};
use tokio::sync::{Mutex, oneshot};

use crate::frames::read_frame;

/// How long the supervisor may take to answer that a program started.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Start `req` (an exec) through the supervisor listening on `sock`.
pub(super) async fn start(sock: &Path, req: Request, ctx: &Ctx) -> Result<Process> {
    let pipe_err = |e: rustix::io::Errno| Error::unknown(format!("making a pipe: {e}"));
    let (stdin_r, stdin_w) = pipe_with(PipeFlags::CLOEXEC).map_err(pipe_err)?;
    let (stdout_r, stdout_w) = pipe_with(PipeFlags::CLOEXEC).map_err(pipe_err)?;
    let (stderr_r, stderr_w) = pipe_with(PipeFlags::CLOEXEC).map_err(pipe_err)?;

    let stream =
        std::os::unix::net::UnixStream::connect(sock).map_err(|e| Error::io(e, "reaching the box's supervisor"))?;
    send_with_fds(&stream, &req, [stdin_r, stdout_w, stderr_w])?;
    stream
        .set_nonblocking(true)
        .map_err(|e| Error::io(e, "setting up the exec"))?;
    let stream = tokio::net::UnixStream::from_std(stream).map_err(|e| Error::io(e, "setting up the exec"))?;
    let (mut rd, wr) = stream.into_split();

    let first = tokio::time::timeout(START_TIMEOUT, read_frame::<Reply>(&mut rd)).await;
    match first {
        Ok(Ok(Some(Reply::Started { .. }))) => {}
        Ok(Ok(Some(Reply::Error { code, message }))) => {
            return Err(Error::new(agentbox_core::ErrorCode::from_wire(&code), message));
        }
        Ok(Ok(Some(other))) => return Err(Error::unknown(format!("the supervisor answered {other:?} to an exec"))),
        Ok(Ok(None)) => return Err(Error::gone("the box's supervisor hung up")),
        Ok(Err(e)) => return Err(Error::io(e, "reading the supervisor's answer")),
        Err(_) => {
            return Err(Error::timeout(
                "the box's supervisor did not start the program within 10s",
            ));
        }
    }

    let (tx, rx) = oneshot::channel();
    tokio::spawn(read_exit(rd, tx));
    let control = Arc::new(LocalControl {
        writer: Mutex::new(Some(wr)),
        exit: Mutex::new(Some(rx)),
    });
    let io = |e: std::io::Error| Error::io(e, "setting up the program's pipes");
    let stdin = pipe::Sender::from_owned_fd(stdin_w).map_err(io)?;
    let stdout = pipe::Receiver::from_owned_fd(stdout_r).map_err(io)?;
    let stderr = pipe::Receiver::from_owned_fd(stderr_r).map_err(io)?;
    Ok(Process::new(
        Some(Box::pin(stdin)),
        Some(Box::pin(stdout)),
        Some(Box::pin(stderr)),
        control,
        ctx,
    ))
}

async fn read_exit(mut rd: OwnedReadHalf, tx: oneshot::Sender<Result<ExitStatus>>) {
    let r = match read_frame::<Reply>(&mut rd).await {
        Ok(Some(Reply::Exit { code, signal })) => Ok(ExitStatus { code, signal }),
        Ok(Some(Reply::Error { code, message })) => {
            Err(Error::new(agentbox_core::ErrorCode::from_wire(&code), message))
        }
        Ok(Some(other)) => Err(Error::unknown(format!(
            "the supervisor sent {other:?} in place of an exit"
        ))),
        Ok(None) => Err(Error::gone("the box ended while the program ran")),
        Err(e) => Err(Error::io(e, "reading the program's exit")),
    };
    let _ = tx.send(r);
}

/// Send a request frame with three descriptors riding on its first byte.
fn send_with_fds(stream: &std::os::unix::net::UnixStream, req: &Request, fds: [OwnedFd; 3]) -> Result<()> {
    let bytes = frame::encode(req).map_err(|e| Error::invalid(e.to_string()))?;
    let borrowed = [fds[0].as_fd(), fds[1].as_fd(), fds[2].as_fd()];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    if !cmsg.push(SendAncillaryMessage::ScmRights(&borrowed)) {
        return Err(Error::unknown("no room for the descriptors"));
    }
    let sent = rustix::net::sendmsg(stream, &[IoSlice::new(&bytes)], &mut cmsg, SendFlags::NOSIGNAL)
        .map_err(|e| Error::unknown(format!("sending the exec to the supervisor: {e}")))?;
    if sent < bytes.len() {
        use std::io::Write;
        (&mut &*stream)
            .write_all(&bytes[sent..])
            .map_err(|e| Error::io(e, "sending the exec to the supervisor"))?;
    }
    // Our copies of the child's ends close here: the program holds the only ones.
    drop(fds);
    Ok(())
}

struct LocalControl {
    writer: Mutex<Option<OwnedWriteHalf>>,
    exit: Mutex<Option<oneshot::Receiver<Result<ExitStatus>>>>,
}

#[async_trait]
impl ProcessControl for LocalControl {
    async fn wait(&self) -> Result<ExitStatus> {
        let Some(rx) = self.exit.lock().await.take() else {
            return Err(Error::unknown("wait was called twice"));
        };
        let r = rx
            .await
            .unwrap_or_else(|_| Err(Error::unknown("the exit reader ended")));
        // The program has ended: no signal may reach a reused pid.
        self.writer.lock().await.take();
        r
    }

    async fn signal(&self, signal: i32) -> Result<()> {
        let mut w = self.writer.lock().await;
        if let Some(wr) = w.as_mut() {
            let bytes = frame::encode(&Request::Signal { signal }).map_err(|e| Error::invalid(e.to_string()))?;
            // A supervisor that hung up has ended the program already.
            let _ = wr.write_all(&bytes).await;
        }
        Ok(())
    }
}

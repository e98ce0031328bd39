//! The host's side of a namespace box's control socket: one request to the box's init (see
//! `agentbox_protocol::namespace::CONTROL`).
//!
//! Only the host moves a box's deadline or sleeps it. The socket is in the box's directory on
//! the host, which is not in the box's mount tree (the box sees its `work/`, `home/`, `tmp/`
//! and `run/` alone, bound at their places); the init keeps only the listening socket, which
//! `/proc/1/fd` cannot reopen and `pidfd_getfd` cannot take (seccomp refuses it); and the init
//! answers `refused` to a peer inside the box's pid namespace. The record, which says the
//! deadline to attach and list, is in that same unreachable directory.

use std::path::Path;
use std::time::Duration;

use agentbox_core::{Error, ErrorCode, Result};
use agentbox_protocol::namespace::CONTROL;
use agentbox_protocol::supervisor::{Reply, Request};
use tokio::io::AsyncWriteExt;

/// How long one request may take: a sleep ends every program of the box, for at most 10 s.
const LIMIT: Duration = Duration::from_secs(15);

/// Ask the init of the box in `dir`; `what` names the operation in errors.
pub(super) async fn ask(dir: &Path, req: &Request, what: &str) -> Result<()> {
    // Through a descriptor of the directory: the socket's own path may be longer than a unix
    // socket address holds (108 bytes), `/proc/self/fd/N/control.sock` never is.
    let fd = rustix::fs::open(
        dir,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| Error::io(e.into(), format!("{what}: opening {}", dir.display())))?;
    let path = format!("/proc/self/fd/{}/{CONTROL}", std::os::fd::AsRawFd::as_raw_fd(&fd));
    let talk = async {
        let stream = tokio::net::UnixStream::connect(&path)
            .await
            .map_err(|e| Error::io(e, format!("{what}: reaching the box's init")))?;
        let (mut rd, mut wr) = stream.into_split();
        let bytes = agentbox_protocol::frame::encode(req).map_err(|e| Error::unknown(e.to_string()))?;
        wr.write_all(&bytes)
            .await
            .map_err(|e| Error::io(e, format!("{what}: asking the box's init")))?;
        match crate::frames::read_frame::<Reply>(&mut rd).await {
            Ok(Some(Reply::Ok)) => Ok(()),
            Ok(Some(Reply::Error { code, message })) => {
                Err(Error::new(ErrorCode::from_wire(&code), format!("{what}: {message}")))
            }
            Ok(Some(other)) => Err(Error::unknown(format!("{what}: the box's init answered {other:?}"))),
            Ok(None) => Err(Error::unknown(format!(
                "{what}: the box's init closed without an answer"
            ))),
            Err(e) => Err(Error::io(e, format!("{what}: reading the box's init"))),
        }
    };
    let r = match tokio::time::timeout(LIMIT, talk).await {
        Ok(r) => r,
        Err(_) => Err(Error::timeout(format!(
            "{what}: the box's init did not answer within {} s",
            LIMIT.as_secs()
        ))),
    };
    drop(fd);
    r
}

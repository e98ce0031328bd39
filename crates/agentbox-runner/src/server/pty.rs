//! A terminal for a process: the pty's master end, read and written without blocking the
//! runtime, and resized on request. The process gets the slave end as its stdin, stdout and
//! stderr, in a session of its own whose controlling terminal it is.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The master end of a process's terminal.
pub(super) struct Pty {
    master: AsyncFd<OwnedFd>,
}

/// A new terminal of `rows` by `cols`: its master, and the slave end for the process.
pub(super) fn open(rows: u16, cols: u16) -> io::Result<(Arc<Pty>, OwnedFd)> {
    let master = rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let name = rustix::pty::ptsname(&master, Vec::new())?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    rustix::io::ioctl_fionbio(&master, true)?;
    // SAFETY: an OwnedFd's descriptor is open, and stays that file until the AsyncFd drops it.
    #[allow(unsafe_code)]
    let master = unsafe { AsyncFd::register(master) }.map_err(|e| io::Error::other(e.to_string()))?;
    let pty = Pty { master };
    pty.resize(rows, cols)?;
    Ok((Arc::new(pty), slave))
}

impl Pty {
    /// Set the terminal's size; the kernel sends SIGWINCH to its foreground group.
    pub(super) fn resize(&self, rows: u16, cols: u16) -> io::Result<()> {
        let size = Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        rustix::termios::tcsetwinsize(self.master.get_ref().as_fd(), size)?;
        Ok(())
    }
}

/// The terminal's output (what the process wrote to it). It ends when no process holds the
/// slave end any more (the kernel then answers EIO, read here as the end).
pub(super) struct Reader(pub Arc<Pty>);

impl AsyncRead for Reader {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.master.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| rustix::io::read(fd.get_ref(), &mut *unfilled).map_err(io::Error::from)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.raw_os_error() == Some(rustix::io::Errno::IO.raw_os_error()) => {
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

/// The terminal's input (the keys the process reads). Shutting it down types the terminal's
/// end-of-file key (Ctrl-D) rather than closing it, which would hang the terminal up.
pub(super) struct Writer(pub Arc<Pty>);

impl AsyncWrite for Writer {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.0.master.poll_write_ready(cx))?;
            match guard.try_io(|fd| rustix::io::write(fd.get_ref(), buf).map_err(io::Error::from)) {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_write(cx, b"\x04").map_ok(|_| ())
    }
}

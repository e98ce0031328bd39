//! The ports of a namespace box with a network of its own, reached from this machine.
//!
//! The keeper listens on a port of the host's loopback for each of the box's ([`listen`]),
//! while it is still in the host's network, and names them to the host. Once it has left for
//! the box's network, each connection it accepts there is carried to `127.0.0.1:PORT` of the
//! box ([`serve_until`]): a socket made after the unshare is the box's, one made before is the
//! host's. Only the ports asked for are reached; the box's other listeners are in its own
//! network, which nothing on the host shares.
//!
//! The keeper cannot start a thread (it unshared a pid namespace: the kernel refuses
//! `CLONE_THREAD` to such a process), so it carries every connection on one thread, with a
//! current-thread tokio runtime, which starts none, until the box's init ends.

use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::OwnedFd;

/// One listener of the host's per port of the box's: `(box port, listener)`.
pub(super) fn listen(ports: &[u16]) -> Result<Vec<(u16, TcpListener)>, String> {
    ports
        .iter()
        .map(|&p| {
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .map(|l| (p, l))
                .map_err(|e| format!("listening on this machine's loopback for the box's port {p}: {e}"))
        })
        .collect()
}

/// The keeper's line naming each port: `8080=41234 5432=41235`.
pub(super) fn line(listeners: &[(u16, TcpListener)]) -> Result<String, String> {
    let mut parts = Vec::new();
    for (p, l) in listeners {
        let host = l
            .local_addr()
            .map_err(|e| format!("the listener of port {p}: {e}"))?
            .port();
        parts.push(format!("{p}={host}"));
    }
    Ok(parts.join(" "))
}

/// Carry every connection to each listener to its port in the box until the process `init`
/// (a pidfd) ends. A port nothing in the box listens on closes the connection.
pub(super) fn serve_until(listeners: Vec<(u16, TcpListener)>, init: OwnedFd) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| format!("the ports' runtime: {e}"))?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        for (port, listener) in listeners {
            listener
                .set_nonblocking(true)
                .map_err(|e| format!("the listener of port {port}: {e}"))?;
            let listener =
                tokio::net::TcpListener::from_std(listener).map_err(|e| format!("the listener of port {port}: {e}"))?;
            tokio::task::spawn_local(async move {
                loop {
                    let Ok((mut conn, _)) = listener.accept().await else {
                        tokio::time::sleep(crate::egress::ACCEPT_BACKOFF).await;
                        continue;
                    };
                    tokio::task::spawn_local(async move {
                        let Ok(mut inside) = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await else {
                            return;
                        };
                        let _ = conn.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional_with_sizes(&mut conn, &mut inside, 256 << 10, 256 << 10)
                            .await;
                    });
                }
            });
        }
        // A pidfd reads as readable once its process ends.
        // SAFETY: the AsyncFd owns the OwnedFd, which stays open and the same descriptor until
        // the AsyncFd drops.
        #[allow(unsafe_code)]
        let ended =
            unsafe { tokio::io::unix::AsyncFd::register(init) }.map_err(|e| format!("watching the init: {e}"))?;
        let _ = ended.readable().await;
        Ok(())
    })
}

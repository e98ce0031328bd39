//! Serving the router on a listener: HTTP/1.1 and HTTP/2 (h2c) on one port, a deadline on a
//! request's headers (a client that sends them a byte at a time is cut off; an HTTP/2
//! connection that stops answering pings is ended), and a graceful
//! end: once `shutdown` resolves no connection is accepted, requests in flight finish within
//! [`DRAIN`], and what is left is cut.

use std::future::Future;
use std::time::Duration;

use agentbox_core::{Error, Result};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};

/// How long a client has to send a request's headers.
pub const HEADER_DEADLINE: Duration = Duration::from_secs(10);
/// How long requests in flight may take to finish once the server is told to stop.
pub const DRAIN: Duration = Duration::from_secs(30);

/// A listener of TCP or unix connections.
pub trait Accept: Send {
    /// Its connections.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection.
    fn accept(&mut self) -> impl Future<Output = std::io::Result<Self::Io>> + Send;
}

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept(&mut self) -> std::io::Result<Self::Io> {
        let (s, _) = tokio::net::TcpListener::accept(self).await?;
        no_delay(&s);
        Ok(s)
    }
}

/// Send each write at once (no Nagle): a response's head and its body, or a stream's small
/// messages, written separately, would otherwise wait for the client's ACK of the first, which
/// a client that delays its ACKs holds 40 ms (measured: every E2B command run by the Python
/// SDK over a kept connection took 40 ms more).
pub(crate) fn no_delay(s: &tokio::net::TcpStream) {
    if let Err(e) = s.set_nodelay(true) {
        tracing::debug!("TCP_NODELAY on an accepted connection: {e}");
    }
}

impl Accept for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept(&mut self) -> std::io::Result<Self::Io> {
        tokio::net::UnixListener::accept(self).await.map(|(s, _)| s)
    }
}

/// Serve `app` on `listener` until `shutdown` resolves, then drain. See the
/// [module documentation](self).
///
/// ```no_run
/// # async fn f(app: axum::Router) -> agentbox_core::Result<()> {
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await.unwrap();
/// agentbox_server::serve(listener, app, async { let _ = tokio::signal::ctrl_c().await; }).await
/// # }
/// ```
pub async fn serve<L: Accept>(mut listener: L, app: axum::Router, shutdown: impl Future<Output = ()>) -> Result<()> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_DEADLINE);
    // HTTP/2 has no header deadline of its own: a connection that stops answering pings ends.
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(20)))
        .keep_alive_timeout(HEADER_DEADLINE)
        .max_concurrent_streams(256);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let io = tokio::select! {
            r = listener.accept() => match r {
                Ok(io) => io,
                Err(e) => {
                    // A full file table or a client gone before it was accepted: go on.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let service = TowerToHyperService::new(app.clone());
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("a connection ended: {e}");
            }
        });
    }
    tracing::info!("no new connections; the requests in flight finish");
    match tokio::time::timeout(DRAIN, graceful.shutdown()).await {
        Ok(()) => Ok(()),
        Err(_) => Err(Error::timeout(format!(
            "requests still in flight {} s after the server was told to stop: cut",
            DRAIN.as_secs()
        ))),
    }
}

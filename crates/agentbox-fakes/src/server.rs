//! The fakes' HTTP servers: the plain-HTTP accept loop every fake serves on, and [`Server`], one
//! handle for a fake's start, shutdown and drop.

use std::time::Duration;

use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;

/// Accept plain HTTP/1.1 connections (with upgrades: a log's WebSocket, a preview's) until
/// told to stop; each connection is a task, aborted at the stop.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            got = listener.accept() => {
                let (tcp, _) = match got {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let app = app.clone();
                conns.spawn(async move {
                    let svc = TowerToHyperService::new(app);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .with_upgrades()
                        .await;
                });
            }
        }
    }
    conns.abort_all();
}

/// A fake's server and what it owns, started and ended the same way by every fake: the task
/// serving its port, the signal that stops it, the tasks that run beside it (a clock,
/// controllers), and its directory, removed last (after the fake's boxes in it are ended).
pub(crate) struct Server {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    beside: Vec<tokio::task::JoinHandle<()>>,
    dir: Option<tempfile::TempDir>,
}

impl Server {
    /// Serve with `serve` (given the signal that stops it) on this runtime, owning `dir`.
    pub(crate) fn spawn<F>(
        serve: impl FnOnce(tokio::sync::oneshot::Receiver<()>) -> F,
        dir: tempfile::TempDir,
    ) -> Server
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        Server {
            stop: Some(stop),
            task: Some(tokio::spawn(serve(stopped))),
            beside: Vec::new(),
            dir: Some(dir),
        }
    }

    /// A task that ends with the server.
    pub(crate) fn beside(&mut self, task: tokio::task::JoinHandle<()>) {
        self.beside.push(task);
    }

    /// Stop serving and wait for it (at most five seconds); the tasks beside it end first.
    pub(crate) async fn stopped(&mut self) {
        self.signal();
        for t in self.beside.drain(..) {
            t.abort();
            let _ = t.await;
        }
        if let Some(s) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), s).await;
        }
    }

    /// Its directory, until removed.
    pub(crate) fn dir(&self) -> Option<&std::path::Path> {
        self.dir.as_ref().map(tempfile::TempDir::path)
    }

    /// Remove its directory (its boxes ended).
    pub(crate) fn remove_dir(&mut self) {
        if let Some(d) = self.dir.take() {
            let _ = d.close();
        }
    }

    /// Stop serving at once: the signal sent, its tasks aborted (for a fake's `Drop`, which
    /// cannot wait).
    pub(crate) fn halt(&mut self) {
        self.signal();
        for t in self.beside.drain(..) {
            t.abort();
        }
        if let Some(s) = self.task.take() {
            s.abort();
        }
    }

    fn signal(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// Dropped without [`Server::stopped`]: it stops serving, its tasks are aborted, and its
/// directory goes (a fake's own `Drop` ends its boxes first).
impl Drop for Server {
    fn drop(&mut self) {
        self.halt();
    }
}

/// End a fake's boxes from its `Drop`, which cannot await: `end` runs on a thread with a
/// runtime of its own (at most 30 s) and is waited for, so no box outlives the fake.
pub(crate) fn end_on_own_runtime(end: impl std::future::Future<Output = ()> + Send + 'static) {
    let ended = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
            rt.block_on(async { tokio::time::timeout(std::time::Duration::from_secs(30), end).await })
                .ok();
        }
    });
    let _ = ended.join();
}

//! A run's files between this machine and a box.
//!
//! Nothing that comes out of a box is trusted: [`extract`] unpacks a tar with its own reader
//! into one directory, and nothing escapes it. [`seed_dir`] and [`pull_dir`] move a run's
//! files in and out of any box through exec alone, every pulled member through [`extract`].

mod extract;
#[doc(hidden)]
pub mod fuzzing;
mod movers;
pub mod names;
pub mod pax;
mod receipt;
mod remove;

pub use extract::{Admit, Kind, MAX_BYTES, MAX_ENTRIES, MAX_EXTENSION, Observe, Options, Written, extract};
pub use movers::{
    Fetched, LEARNING, MAX_LISTING_BYTES, Mark, MarkEntry, Packed, PullOptions, Pulled, STALL_LIMIT, SeedOptions,
    Seeded, fetch, fetch_within, list_box, pack_dir, pull_agent_home, pull_dir, seed_agent_home, seed_dir,
};
pub use receipt::{MAX_NAMED_SKIPS, Receipt, Skip, SkipReason, StopReason, Stopped};
pub use remove::{Removed, remove_entries};

use std::path::PathBuf;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

/// The same reader as [`extract`], fed a chunk at a time: write until [`Extractor::write`]
/// answers false (the extraction stopped), then [`Extractor::finish`].
///
/// ```no_run
/// # async fn f() {
/// let mut x = agentbox_sync::Extractor::new("/tmp/out".into(), Default::default());
/// for chunk in [vec![0u8; 512]] {
///     if !x.write(chunk).await { break }
/// }
/// let receipt = x.finish().await;
/// # }
/// ```
pub struct Extractor {
    tx: Option<mpsc::Sender<Vec<u8>>>,
    task: tokio::task::JoinHandle<Receipt>,
}

struct ChannelReader {
    rx: mpsc::Receiver<Vec<u8>>,
    buf: Vec<u8>,
    pos: usize,
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.pos >= self.buf.len() {
            match self.rx.blocking_recv() {
                Some(chunk) => {
                    self.buf = chunk;
                    self.pos = 0;
                }
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl Extractor {
    /// Start an extraction into `dest`.
    pub fn new(dest: PathBuf, opts: Options) -> Self {
        let (tx, rx) = mpsc::channel(8);
        let task = tokio::task::spawn_blocking(move || {
            extract(
                ChannelReader {
                    rx,
                    buf: Vec::new(),
                    pos: 0,
                },
                &dest,
                &opts,
            )
        });
        Extractor { tx: Some(tx), task }
    }

    /// Feed a chunk; false once the extraction has stopped.
    pub async fn write(&mut self, chunk: Vec<u8>) -> bool {
        match &self.tx {
            Some(tx) => tx.send(chunk).await.is_ok(),
            None => false,
        }
    }

    /// End the input and wait for the receipt.
    pub async fn finish(mut self) -> Receipt {
        self.tx.take();
        self.task.await.unwrap_or_else(|e| Receipt {
            stopped: Some(Stopped {
                reason: StopReason::TransferFailed,
                message: format!("the extractor failed: {e}"),
            }),
            ..Default::default()
        })
    }
}

/// Extract a tar read from an async stream (a box program's stdout) into `dest`.
pub async fn extract_tar(mut reader: impl AsyncRead + Unpin, dest: PathBuf, opts: Options) -> Receipt {
    let mut x = Extractor::new(dest, opts);
    loop {
        let mut chunk = vec![0u8; 64 * 1024];
        match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                chunk.truncate(n);
                if !x.write(chunk).await {
                    break;
                }
            }
        }
    }
    x.finish().await
}

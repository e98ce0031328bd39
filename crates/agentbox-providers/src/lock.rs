//! Exclusive locks on files, between processes of this machine: a box's record changed by two
//! hosts at once, a snapshot's name taken once. The kernel lets go of a lock when its process
//! dies, so a host that crashed holds nothing.

use std::path::Path;
use std::time::Duration;

use agentbox_core::{Error, Result};

/// `flock(LOCK_EX | LOCK_NB)`: what `File::try_lock` is, in the Rust this workspace supports
/// (1.85; `File::lock` is 1.89's).
pub(crate) fn try_flock(f: &std::fs::File) -> rustix::io::Result<()> {
    rustix::fs::flock(f, rustix::fs::FlockOperation::NonBlockingLockExclusive)
}

/// An exclusive lock on a file, held until dropped (the kernel lets go of it when this
/// process dies, too).
pub(crate) struct Locked(#[allow(dead_code)] pub(crate) std::fs::File);

/// Take the exclusive lock on `path` (made when missing), waiting at most `wait`: `what` names
/// the operation in the timeout's error. `None` when `path`'s directory is gone (the box was
/// removed meanwhile).
pub(crate) async fn lock(path: &Path, wait: Duration, what: &str) -> Result<Option<Locked>> {
    let f = match std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(e, format!("{what}: opening {}", path.display()))),
    };
    let until = tokio::time::Instant::now() + wait;
    loop {
        match try_flock(&f) {
            Ok(()) => return Ok(Some(Locked(f))),
            Err(rustix::io::Errno::WOULDBLOCK) if tokio::time::Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(Error::timeout(format!(
                    "{what}: {} was held for over {} s",
                    path.display(),
                    wait.as_secs()
                )));
            }
            Err(e) => {
                return Err(Error::io(e.into(), format!("{what}: locking {}", path.display())));
            }
        }
    }
}

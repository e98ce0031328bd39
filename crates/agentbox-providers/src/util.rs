//! Small helpers shared by the providers.
#![cfg_attr(not(all(feature = "local", feature = "docker")), allow(dead_code))]

use std::path::Path;
use std::time::Duration;

use agentbox_core::{Error, Result};
use tokio::io::AsyncReadExt;

/// Milliseconds since the Unix epoch.
pub(crate) use agentbox_core::now_ms;

/// `n` random bytes as lowercase hex, from the kernel (`getrandom`); its failure is an error,
/// never a predictable name.
pub(crate) fn random_hex(n: usize) -> Result<String> {
    let mut buf = vec![0u8; n];
    getrandom::fill(&mut buf).map_err(|e| Error::unknown(format!("the kernel gave no random bytes: {e}")))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Write `bytes` to `path` so a reader sees the old file or the whole new one: a temporary
/// file beside it, synced, then renamed over it.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(|e| Error::io(e, format!("creating {}", tmp.display())))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::io(e, format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(e, format!("renaming {} into place", tmp.display())))
}

/// Read one length-prefixed frame from an async reader. `Ok(None)` at a clean end.
pub(crate) async fn read_frame<T: serde::de::DeserializeOwned>(
    r: &mut (impl tokio::io::AsyncRead + Unpin),
) -> std::io::Result<Option<T>> {
    let mut prefix = [0u8; 4];
    match r.read_exact(&mut prefix).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let n = agentbox_protocol::frame::body_len(prefix)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    let mut body = vec![0u8; n];
    r.read_exact(&mut body).await?;
    agentbox_protocol::frame::decode(&body)
        .map(Some)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

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

/// The directory a program starts in: `cwd` as given where absolute, else taken from the box's
/// `workspace` (the workspace itself where none is given). The rule every exec-API box shares.
pub(crate) fn exec_cwd(workspace: &str, cwd: Option<&str>) -> String {
    match cwd {
        None => workspace.to_string(),
        Some(c) if c.starts_with('/') => c.to_string(),
        Some(c) => format!("{}/{c}", workspace.trim_end_matches('/')),
    }
}

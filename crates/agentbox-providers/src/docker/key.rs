//! This machine's key for the tokens of its Docker boxes' runners.
//!
//! A runner listening on a container's address takes a bearer token. The token is
//! HMAC-SHA256 of the container's name under one key per machine (`$AGENTBOX_HOME/runner.key`),
//! so no token is stored anywhere, any process on this machine can compute a box's token
//! again after a restart, and no other machine can.
//!
//! The key is made once, by whichever process needs it first: 32 random bytes written to a
//! temporary file of that process's own (created exclusively), then hard-linked into place,
//! which fails if another process linked first. The live file is never opened for writing, so
//! two first uses at once both end up reading the one key that won.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use agentbox_core::{Error, Result};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The key's length in bytes.
const KEY_LEN: usize = 32;

/// The token of the runner in the box named `name`, under the key in `home` (made at first use).
pub(crate) fn runner_token(home: &Path, name: &str) -> Result<String> {
    let key = machine_key(home)?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key)
        .map_err(|e| Error::unknown(format!("the runner key does not fit HMAC-SHA256: {e}")))?;
    mac.update(name.as_bytes());
    Ok(mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect())
}

fn key_path(home: &Path) -> PathBuf {
    home.join("runner.key")
}

/// The machine's key, made if there is none.
fn machine_key(home: &Path) -> Result<[u8; KEY_LEN]> {
    let path = key_path(home);
    if let Some(k) = read_key(&path)? {
        return Ok(k);
    }
    std::fs::create_dir_all(home).map_err(|e| Error::io(e, format!("creating {}", home.display())))?;
    let mut key = [0u8; KEY_LEN];
    getrandom::fill(&mut key)
        .map_err(|e| Error::unknown(format!("the kernel gave no random bytes for {}: {e}", path.display())))?;
    let mut suffix = [0u8; 8];
    getrandom::fill(&mut suffix).map_err(|e| Error::unknown(format!("the kernel gave no random bytes: {e}")))?;
    let tmp = home.join(format!(
        ".runner.key.{}.{}",
        std::process::id(),
        suffix.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&key)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(e, format!("writing a new runner key to {}", tmp.display())));
    }
    let linked = std::fs::hard_link(&tmp, &path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(key),
        // Another process made it first: its key is the machine's.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            read_key(&path)?.ok_or_else(|| Error::unknown(format!("{} vanished as it was made", path.display())))
        }
        Err(e) => Err(Error::io(
            e,
            format!("putting the runner key in place at {}", path.display()),
        )),
    }
}

/// The key at `path`, `None` where there is none. A file that is not exactly 32 bytes, or
/// that others than its owner may read, is refused: a key is never guessed at or replaced,
/// since every runner started with it would be locked out.
fn read_key(path: &Path) -> Result<Option<[u8; KEY_LEN]>> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(e, format!("reading the runner key {}", path.display()))),
    };
    let meta = f
        .metadata()
        .map_err(|e| Error::io(e, format!("reading the runner key {}", path.display())))?;
    if meta.mode() & 0o077 != 0 {
        return Err(Error::unsafe_(format!(
            "the runner key {} has mode {:o}: others than its owner may read it (chmod 600 it, or remove it to make a new one)",
            path.display(),
            meta.mode() & 0o777
        )));
    }
    let mut bytes = Vec::with_capacity(KEY_LEN + 1);
    Read::take(&mut f, KEY_LEN as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(e, format!("reading the runner key {}", path.display())))?;
    let key: [u8; KEY_LEN] = bytes.as_slice().try_into().map_err(|_| {
        Error::invalid(format!(
            "the runner key {} is not {KEY_LEN} bytes ({} bytes): remove it to make a new one \
             (runners started with the old key are then reached through a relay exec)",
            path.display(),
            meta.len()
        ))
    })?;
    Ok(Some(key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentbox_core::ErrorCode;

    #[test]
    fn the_token_is_hmac_sha256_of_the_name() {
        let home = tempfile::tempdir().unwrap();
        let path = key_path(home.path());
        let key: Vec<u8> = (0u8..32).collect();
        std::fs::write(&path, &key).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        // Python: hmac.new(bytes(range(32)), b"agentbox-0011", hashlib.sha256).hexdigest()
        assert_eq!(
            runner_token(home.path(), "agentbox-0011").unwrap(),
            "72cb531c346303e8b6c2f6874dd42275a5a3a43996d5611b0c79a9a38d7eaeb1"
        );
    }

    #[test]
    fn a_key_of_the_wrong_length_is_refused_naming_the_file() {
        for len in [0usize, 5, 31, 33, 4096] {
            let home = tempfile::tempdir().unwrap();
            let path = key_path(home.path());
            std::fs::write(&path, vec![7u8; len]).unwrap();
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
            let e = runner_token(home.path(), "agentbox-x").unwrap_err();
            assert_eq!(e.code(), ErrorCode::Invalid, "{len} bytes: {e}");
            assert!(e.message().contains(&path.display().to_string()), "{e}");
            assert_eq!(
                std::fs::read(&path).unwrap(),
                vec![7u8; len],
                "the file is left as it was"
            );
        }
    }

    #[test]
    fn a_key_others_may_read_is_refused() {
        let home = tempfile::tempdir().unwrap();
        let path = key_path(home.path());
        std::fs::write(&path, [1u8; 32]).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        let e = runner_token(home.path(), "agentbox-x").unwrap_err();
        assert_eq!(e.code(), ErrorCode::Unsafe, "{e}");
    }

    #[test]
    fn first_uses_at_once_agree_on_one_key_that_never_changes() {
        // 100 rounds: the old code let first uses disagree in about 1 round of 18 (measured: 11 of 200).
        for round in 0..100 {
            let home = tempfile::tempdir().unwrap();
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
            let tokens: Vec<String> = (0..8)
                .map(|_| {
                    let (home, barrier) = (home.path().to_path_buf(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        runner_token(&home, "agentbox-x").unwrap()
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|t| t.join().unwrap())
                .collect();
            let key = std::fs::read(key_path(home.path())).unwrap();
            assert_eq!(key.len(), 32, "round {round}");
            let now = runner_token(home.path(), "agentbox-x").unwrap();
            assert!(
                tokens.iter().all(|t| *t == now),
                "round {round}: every first use got the key that stayed"
            );
            let left: Vec<_> = std::fs::read_dir(home.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(
                left,
                vec![std::ffi::OsString::from("runner.key")],
                "round {round}: no temporary left"
            );
        }
    }
}

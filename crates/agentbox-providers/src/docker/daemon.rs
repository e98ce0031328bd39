//! Whether the Docker daemon is this machine's: only then do bind mounts bind this machine's
//! paths. Read the way that fails closed: anything unreadable is "not this machine".

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// True when `DOCKER_HOST` (if set) and the docker context (`DOCKER_CONTEXT`, else the
/// config's `currentContext`) both name a unix socket of this machine.
pub fn is_local() -> bool {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let config = var("DOCKER_CONFIG")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".docker")));
    is_local_with(
        var("DOCKER_HOST").as_deref(),
        var("DOCKER_CONTEXT").as_deref(),
        config.as_deref(),
    )
}

/// [`is_local`] over given values, for tests.
pub fn is_local_with(host: Option<&str>, context: Option<&str>, config_dir: Option<&Path>) -> bool {
    let host_ok = host.is_none_or(|h| h.starts_with("unix://"));
    host_ok && context_is_local(context, config_dir)
}

fn context_is_local(context: Option<&str>, config_dir: Option<&Path>) -> bool {
    let name = match context {
        Some(n) => n.to_string(),
        None => {
            let Some(dir) = config_dir else { return true };
            match std::fs::read(dir.join("config.json")) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
                Err(_) => return false,
                Ok(bytes) => match serde_json::from_slice::<serde_json::Value>(&bytes) {
                    Ok(v) => match v.get("currentContext").and_then(|c| c.as_str()) {
                        None | Some("") => return true,
                        Some(n) => n.to_string(),
                    },
                    Err(_) => return false,
                },
            }
        }
    };
    if name == "default" {
        return true;
    }
    let Some(dir) = config_dir else { return false };
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let meta = dir.join("contexts/meta").join(hex).join("meta.json");
    let Ok(bytes) = std::fs::read(meta) else { return false };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return false;
    };
    v.pointer("/Endpoints/docker/Host")
        .and_then(|h| h.as_str())
        .is_some_and(|h| h.starts_with("unix://"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_unix_socket_is_this_machine() {
        assert!(is_local_with(None, None, None));
        assert!(is_local_with(Some("unix:///var/run/docker.sock"), None, None));
        assert!(!is_local_with(Some("tcp://10.0.0.1:2375"), None, None));
        assert!(!is_local_with(Some("ssh://me@far"), None, None));
        assert!(is_local_with(None, Some("default"), None));
    }

    #[test]
    fn a_context_is_read_from_its_meta_file_and_an_unreadable_one_is_remote() {
        let dir = tempfile::tempdir().unwrap();
        let write_ctx = |name: &str, host: &str| {
            let hex: String = Sha256::digest(name.as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let meta = dir.path().join("contexts/meta").join(hex);
            std::fs::create_dir_all(&meta).unwrap();
            let body = serde_json::json!({ "Name": name, "Endpoints": { "docker": { "Host": host } } });
            std::fs::write(meta.join("meta.json"), body.to_string()).unwrap();
        };
        write_ctx("near", "unix:///run/docker.sock");
        write_ctx("far", "tcp://192.0.2.1:2376");
        assert!(is_local_with(None, Some("near"), Some(dir.path())));
        assert!(!is_local_with(None, Some("far"), Some(dir.path())));
        assert!(!is_local_with(None, Some("missing"), Some(dir.path())));
        // Both must be local.
        assert!(!is_local_with(Some("tcp://x:1"), Some("near"), Some(dir.path())));
        std::fs::write(dir.path().join("config.json"), r#"{"currentContext":"far"}"#).unwrap();
        assert!(!is_local_with(None, None, Some(dir.path())));
        std::fs::write(dir.path().join("config.json"), r#"{"currentContext":"near"}"#).unwrap();
        assert!(is_local_with(None, None, Some(dir.path())));
    }
}

//! Pulling an image the engine does not have, as `docker run` does: through the engine's own
//! registry access (`create_image`), with its progress in the logs and a plain error when no
//! registry can be reached.

use std::collections::BTreeMap;
use std::time::Duration;

use agentbox_core::{Ctx, Error, Result};
use bollard::Docker;
use futures_util::StreamExt;

/// The longest a pull may take, whatever the caller's context allows.
const PULL_TIMEOUT: Duration = Duration::from_secs(600);

/// Pull `image` through `docker`'s engine: each layer's state and the bytes fetched are logged
/// (`tracing`, info) as they change. `not_found` naming the image when no registry can be
/// reached from the engine or the registry has no such image, saying which; the end of `ctx`
/// (or ten minutes) is its error.
pub(super) async fn pull(docker: &Docker, image: &str, ctx: &Ctx) -> Result<()> {
    let (from_image, tag) = split_reference(image);
    tracing::info!(image, "image not on the Docker daemon: pulling it");
    let opts = bollard::query_parameters::CreateImageOptions {
        from_image: Some(from_image.to_string()),
        tag: tag.map(str::to_string),
        ..Default::default()
    };
    let mut stream = docker.create_image(Some(opts), None, None);
    // Each layer's last status and (current, total) bytes.
    let mut layers: BTreeMap<String, (String, i64, i64)> = BTreeMap::new();
    let ctx = ctx.with_timeout(PULL_TIMEOUT);
    let run = async {
        while let Some(item) = stream.next().await {
            let info = item.map_err(|e| pull_error(image, &e.to_string()))?;
            if let Some(detail) = info.error_detail.and_then(|d| d.message) {
                return Err(pull_error(image, &detail));
            }
            let (Some(id), Some(status)) = (info.id, info.status) else {
                continue;
            };
            let (current, total) = info
                .progress_detail
                .map(|p| (p.current.unwrap_or(0), p.total.unwrap_or(0)))
                .unwrap_or((0, 0));
            let entry = layers.entry(id.clone()).or_insert((String::new(), 0, 0));
            let changed = entry.0 != status;
            entry.0 = status.clone();
            if total > 0 {
                entry.1 = current;
                entry.2 = total;
            }
            // One line per layer and state (not one per chunk): "Pulling fs layer",
            // "Downloading", "Extracting", "Pull complete".
            if changed {
                tracing::info!(image, layer = %id, status = %status, bytes = entry.1, of = entry.2, "pulling");
            }
        }
        Ok(())
    };
    // The pull's own error names the image; the context's end is told what it ended.
    ctx.run(run)
        .await
        .map_err(|e| e.context(format!("pulling image {image}")))??;
    let bytes: i64 = layers.values().map(|l| l.2).sum();
    tracing::info!(image, layers = layers.len(), bytes, "image pulled");
    Ok(())
}

/// `name[:tag]` (a digest, `name@sha256:…`, is all `from_image`); a registry's port is not a
/// tag.
fn split_reference(image: &str) -> (&str, Option<&str>) {
    if image.contains('@') {
        return (image, None);
    }
    match image.rfind(':') {
        Some(i) if !image[i + 1..].contains('/') => (&image[..i], Some(&image[i + 1..])),
        _ => (image, None),
    }
}

/// The pull's failure, saying plainly whether a registry was reached at all.
fn pull_error(image: &str, text: &str) -> Error {
    let unreachable = [
        "no such host",
        "dial tcp",
        "connection refused",
        "i/o timeout",
        "network is unreachable",
        "TLS handshake",
        "Client.Timeout",
        "server misbehaving",
    ]
    .iter()
    .any(|s| text.contains(s));
    if unreachable {
        Error::not_found(format!(
            "image {image}: not on the Docker daemon, and no registry is reachable from the engine to \
             pull it ({text}); load it into the engine (docker load, docker import, or scripts/box-image \
             for agentbox's own)"
        ))
    } else {
        Error::not_found(format!(
            "image {image}: not on the Docker daemon, and the engine could not pull it ({text})"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_splits_into_name_and_tag() {
        assert_eq!(split_reference("alpine:3.19"), ("alpine", Some("3.19")));
        assert_eq!(split_reference("alpine"), ("alpine", None));
        assert_eq!(
            split_reference("localhost:5000/x/y:1"),
            ("localhost:5000/x/y", Some("1"))
        );
        assert_eq!(split_reference("localhost:5000/x"), ("localhost:5000/x", None));
        assert_eq!(split_reference("a@sha256:00"), ("a@sha256:00", None));
    }

    #[test]
    fn an_unreachable_registry_is_said_plainly() {
        let e = pull_error(
            "alpine:3.19",
            "Get \"https://registry-1.docker.io/v2/\": dial tcp: lookup registry-1.docker.io: no such host",
        );
        assert!(e.message().contains("no registry is reachable"), "{e}");
        let e = pull_error("nope:1", "manifest for nope:1 not found: manifest unknown");
        assert!(
            !e.message().contains("no registry is reachable") && e.message().contains("could not pull it"),
            "{e}"
        );
    }
}

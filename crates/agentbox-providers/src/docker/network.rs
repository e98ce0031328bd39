//! The networks of Docker boxes.
//!
//! A box with the open network is on a bridge of agentbox's own,
//! [`BOX_NETWORK`], with inter-container traffic off, so that one box cannot reach another's
//! listeners (Docker's default bridge lets every container reach every other).
//!
//! The network is made by the first create that needs it, and every create checks it is
//! still what agentbox made: a network of that name with inter-container traffic on (made by
//! hand, say) is refused rather than joined, naming how to fix it.
//!
//! A box with an allowlist has network `none` (loopback alone), and its init bridges
//! `127.0.0.1:3128` to the egress proxy's socket in its runner directory: the proxy is
//! `agentbox-runner egress`, a process of this machine's started beside the container
//! ([`start_proxy`]), which ends when the box's deadline file says the box's time is up or is
//! gone (destroy removes it).

use std::collections::HashMap;

use agentbox_core::{Ctx, Error, Result};
use tokio::io::AsyncBufReadExt;

use crate::helper::HelperCommand;
use bollard::Docker;
use bollard::models::NetworkCreateRequest;

/// The name of agentbox's network.
pub const BOX_NETWORK: &str = "agentbox";

/// The bridge driver's option that lets containers of one network reach each other.
const ICC: &str = "com.docker.network.bridge.enable_icc";

/// Make sure [`BOX_NETWORK`] exists with inter-container traffic off; made when missing (two
/// makers at once: the second finds the first's).
pub(crate) async fn ensure(docker: &Docker, ctx: &Ctx) -> Result<()> {
    let ctx = &ctx.with_timeout(std::time::Duration::from_secs(30));
    for _ in 0..2 {
        match ctx.run(docker.inspect_network(BOX_NETWORK, None)).await? {
            Ok(n) => return check(n.driver.as_deref(), n.options.as_ref()),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
            Err(e) => {
                return Err(Error::unknown(format!(
                    "inspecting the Docker network {BOX_NETWORK}: {e}"
                )));
            }
        }
        let made = ctx
            .run(docker.create_network(NetworkCreateRequest {
                name: BOX_NETWORK.into(),
                driver: Some("bridge".into()),
                options: Some(HashMap::from([(ICC.to_string(), "false".to_string())])),
                labels: Some(HashMap::from([("agentbox.managed".to_string(), "true".to_string())])),
                ..Default::default()
            }))
            .await?;
        match made {
            Ok(_) => {
                tracing::info!(
                    network = BOX_NETWORK,
                    "made the Docker boxes' network, inter-container traffic off"
                );
                return Ok(());
            }
            // Made by another create in between: inspected again.
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 409, .. }) => {}
            Err(e) => return Err(Error::unknown(format!("making the Docker network {BOX_NETWORK}: {e}"))),
        }
    }
    Err(Error::unknown(format!(
        "the Docker network {BOX_NETWORK} was neither found nor made"
    )))
}

/// A network of agentbox's name is joined only when it is a bridge with inter-container
/// traffic off.
fn check(driver: Option<&str>, options: Option<&HashMap<String, String>>) -> Result<()> {
    let icc = options.and_then(|o| o.get(ICC)).map(String::as_str);
    if driver == Some("bridge") && icc == Some("false") {
        return Ok(());
    }
    Err(Error::unsupported(format!(
        "the Docker network {BOX_NETWORK} exists as a {} network with {ICC}={}: boxes on it could \
         reach each other, so none is put on it; remove it (docker network rm {BOX_NETWORK}) and \
         agentbox makes it again with inter-container traffic off",
        driver.unwrap_or("(unstated)"),
        icc.unwrap_or("(unset, on)")
    )))
}

/// Start the egress proxy of box `name` with `allow`, detached (its own process group, no
/// environment but PATH and this machine's choice of roots, its stderr in
/// `docker/<name>.proxy`), hand it the box's `secrets` line on its stdin (then closed), and wait
/// (10 s at most) for it to say it is ready.
pub(crate) async fn start_proxy(
    runner: &HelperCommand,
    name: &str,
    allow: &[String],
    secrets: Option<&str>,
) -> Result<()> {
    let socket = super::runner_dir(name, false)?.join(agentbox_protocol::namespace::EGRESS_SOCKET);
    let mut cmd = tokio::process::Command::new(&runner.program);
    cmd.args(&runner.args)
        .arg("egress")
        .arg("--socket")
        .arg(&socket)
        .arg("--log")
        .arg(super::state::refusals_path(name)?)
        .arg("--deadline-file")
        .arg(super::state::deadline_path(name)?);
    if secrets.is_some() {
        cmd.arg("--secrets-on-stdin");
    }
    for entry in allow {
        cmd.arg("--allow").arg(entry);
    }
    // Its stderr (what it refused, and why it ended) is kept beside the box's other files.
    let err_path = super::state::proxy_log_path(name)?;
    let err = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&err_path)
        .map_err(|e| Error::io(e, format!("opening {}", err_path.display())))?;
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(crate::egress::roots_env())
        .stdin(if secrets.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(err)
        .process_group(0)
        .kill_on_drop(false);
    let mut child = cmd.spawn().map_err(|e| {
        Error::io(
            e,
            format!("starting the egress proxy ({} egress)", runner.program.display()),
        )
    })?;
    if let Some(line) = secrets {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| Error::unknown("the egress proxy's stdin"))?;
        stdin
            .write_all(line.as_bytes())
            .await
            .map_err(|e| Error::io(e, format!("box {name}: handing its egress proxy the secrets")))?;
        // Closed: the proxy of a Docker box ends by its deadline file, not its stdin.
        drop(stdin);
    }
    let out = child
        .stdout
        .take()
        .ok_or_else(|| Error::unknown("the egress proxy's stdout"))?;
    let mut lines = tokio::io::BufReader::new(out).lines();
    let said = tokio::time::timeout(std::time::Duration::from_secs(10), lines.next_line())
        .await
        .map_err(|_| Error::timeout(format!("box {name}: its egress proxy did not say it was ready in 10 s")))?
        .map_err(|e| Error::io(e, "reading the egress proxy's first line"))?;
    match said.as_deref() {
        Some(agentbox_protocol::namespace::EGRESS_READY) => {
            tracing::debug!(container = %name, entries = allow.len(), "egress proxy ready");
            Ok(())
        }
        Some(other) => Err(Error::unknown(format!(
            "box {name}: its egress proxy did not start: {}",
            other.strip_prefix("error ").unwrap_or(other)
        ))),
        None => Err(Error::unknown(format!(
            "box {name}: its egress proxy ended before it was ready"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bridge_with_inter_container_traffic_off_is_joined() {
        let off = HashMap::from([(ICC.to_string(), "false".to_string())]);
        let on = HashMap::from([(ICC.to_string(), "true".to_string())]);
        assert!(check(Some("bridge"), Some(&off)).is_ok());
        let e = check(Some("bridge"), Some(&on)).unwrap_err();
        assert!(e.message().contains("docker network rm agentbox"), "{e}");
        assert!(check(Some("bridge"), None).is_err());
        assert!(check(Some("overlay"), Some(&off)).is_err());
        assert!(check(None, Some(&off)).is_err());
    }
}

//! What namespace and Docker boxes share about an allowlist enforced on this machine: the
//! port the box's programs are told is their proxy, the variables that tell them, and reading
//! what the proxy refused.
//!
//! The proxy itself is `agentbox-runner egress` (crates `agentbox-egress` and
//! `agentbox-runner`); the bridge from the box's loopback to it is a thread of the box's init.

use std::collections::BTreeMap;

use agentbox_core::{Error, NetRefusal, Result, Spec};

/// The port the egress bridge listens on in a box with an allowlist (on its own loopback).
pub const EGRESS_PORT: u16 = 3128;

/// The variables a box with an allowlist is told its proxy in: four naming the proxy, two the
/// names it is not used for.
const PROXY_VARIABLES: [&str; 6] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// Refuse a spec whose box goes out through the egress proxy (`proxied`: an allowlist, or a
/// namespace box's default network) and whose env sets one of the proxy's variables: they are
/// the provider's to set.
pub(crate) fn check_env(spec: &Spec, proxied: bool) -> Result<()> {
    if proxied {
        for k in PROXY_VARIABLES {
            if spec.env.contains_key(k) {
                return Err(Error::invalid(format!(
                    "spec.env.{k}: a box whose way out is agentbox's egress proxy is told the proxy in \
                     this variable; it cannot be set too"
                )));
            }
        }
    }
    Ok(())
}

/// The proxy's variables, for a box with an allowlist.
pub(crate) fn proxy_env() -> BTreeMap<String, String> {
    let proxy = format!("http://127.0.0.1:{EGRESS_PORT}");
    let mut env = BTreeMap::new();
    for k in &PROXY_VARIABLES[..4] {
        env.insert(k.to_string(), proxy.clone());
    }
    for k in &PROXY_VARIABLES[4..] {
        env.insert(k.to_string(), "localhost,127.0.0.1,::1".into());
    }
    env
}

/// Prove box `b`'s allowlist from inside it, with the runner's binary at `runner` in the box:
/// `agentbox-runner probe egress:PORT` reaches the proxy, finds loopback alone and fails to
/// connect directly. A box that fails it is not to be handed out (`unsupported`, saying what
/// the probe saw).
pub(crate) async fn prove(b: &dyn agentbox_core::Sandbox, runner: &str, ctx: &agentbox_core::Ctx) -> Result<()> {
    let argv = vec![runner.to_string(), "probe".into(), format!("egress:{EGRESS_PORT}")];
    let p = b
        .exec(
            &argv,
            &Default::default(),
            &ctx.with_timeout(std::time::Duration::from_secs(30)),
        )
        .await?;
    let out = agentbox_core::finish(p, Default::default()).await?;
    if out.status.code != 0 {
        return Err(Error::unsupported(format!(
            "spec.network: the box's allowlist could not be proven from inside it ({}{}); the box was ended",
            out.stdout_text().trim(),
            out.stderr_text().trim()
        )));
    }
    tracing::info!(box_id = %b.id(), "the box's allowlist is enforced: its proxy answered and a direct connect failed");
    Ok(())
}

/// The newest `max` refusals in the proxy's log at `path` (none when the proxy refused
/// nothing yet), for box `box_id`, which must go out through the proxy (`proxied`).
pub(crate) async fn refusals(
    proxied: bool,
    path: std::path::PathBuf,
    max: usize,
    box_id: &str,
) -> Result<Vec<NetRefusal>> {
    if !proxied {
        return Err(Error::unsupported(format!(
            "box {box_id}: its network does not go through agentbox's egress proxy, so no proxy records refusals"
        )));
    }
    tokio::task::spawn_blocking(move || agentbox_egress::read_refusals(&path, max))
        .await
        .map_err(|e| Error::unknown(format!("box {box_id}: reading its egress proxy's refusals: {e}")))?
        .map_err(|e| Error::io(e, format!("box {box_id}: reading its egress proxy's refusals")))
}

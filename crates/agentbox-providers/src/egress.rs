//! What namespace and Docker boxes share about an allowlist enforced on this machine: the
//! port the box's programs are told is their proxy, the variables that tell them, and reading
//! what the proxy refused.
//!
//! The proxy itself is `agentbox-runner egress` (crates `agentbox-egress` and
//! `agentbox-runner`); the bridge from the box's loopback to it is a thread of the box's init.

use std::collections::BTreeMap;

use agentbox_core::{Error, NetRefusal, Network, Result, Spec};
use agentbox_egress::{SecretPlan, SecretRule};
use agentbox_protocol::namespace::{CA_BUNDLE, EGRESS_CA, RUN_DIR};

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

/// The variables a box with secrets is told its trust in: three naming the bundle of its roots
/// and its own authority, one (Node's, which adds to its roots) the authority alone.
const CA_VARIABLES: [&str; 4] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
];

/// What a box's secrets are at its make: the line its proxy reads (values in it), and the
/// variables its programs see (placeholders, and where the authority is).
pub(crate) struct BoxSecrets {
    /// The proxy's plan as one JSON line: only ever written to the proxy's stdin.
    pub(crate) line: String,
    /// Each secret's variable with its placeholder, and [`CA_VARIABLES`].
    pub(crate) env: BTreeMap<String, String>,
    /// The secrets' names.
    pub(crate) names: Vec<String>,
}

impl std::fmt::Debug for BoxSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoxSecrets")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl BoxSecrets {
    /// Read the values of `spec`'s secrets where they are on this machine and give each a new
    /// placeholder (a fork, or a box made from a snapshot, never shares one): `None` when the
    /// spec has none.
    pub(crate) fn prepare(spec: &Spec) -> Result<Option<BoxSecrets>> {
        if spec.secrets.is_empty() {
            return Ok(None);
        }
        let mut plan = SecretPlan::default();
        let mut env = BTreeMap::new();
        for s in &spec.secrets {
            let value = s.read_value()?;
            let placeholder = format!("agentbox-placeholder-{}", crate::random::random_hex(16)?);
            env.insert(s.name.clone(), placeholder.clone());
            plan.secrets.push(SecretRule {
                name: s.name.clone(),
                placeholder,
                hosts: s.hosts.clone(),
                value: value.expose().to_string(),
            });
        }
        let bundle = format!("{RUN_DIR}/{CA_BUNDLE}");
        for k in &CA_VARIABLES[..3] {
            env.insert(k.to_string(), bundle.clone());
        }
        env.insert(CA_VARIABLES[3].to_string(), format!("{RUN_DIR}/{EGRESS_CA}"));
        let mut line = serde_json::to_string(&plan).map_err(|e| Error::unknown(format!("the secrets' plan: {e}")))?;
        line.push('\n');
        Ok(Some(BoxSecrets {
            line,
            env,
            names: spec.secrets.iter().map(|s| s.name.clone()).collect(),
        }))
    }
}

/// Refuse a spec's secrets where the box does not go out through the egress proxy
/// (`proxied`), where a secret's host is not one its network reaches, or where its env sets a
/// variable the provider sets for them.
pub(crate) fn check_secrets(spec: &Spec, proxied: bool) -> Result<()> {
    if spec.secrets.is_empty() {
        return Ok(());
    }
    if !proxied {
        return Err(Error::unsupported(
            "spec.secrets: the box's network does not go through agentbox's egress proxy (network none, \
             host, or a Docker box's open network), which is what keeps a secret's value outside the box; \
             give it an allowlist naming the secrets' hosts",
        ));
    }
    for k in CA_VARIABLES {
        if spec.env.contains_key(k) {
            return Err(Error::invalid(format!(
                "spec.env.{k}: a box with secrets is told the bundle that trusts its own authority in this \
                 variable; it cannot be set too"
            )));
        }
    }
    if let Some(Network::Allow(list)) = &spec.network {
        let allow = agentbox_core::Allowlist::parse(list)?;
        for (i, s) in spec.secrets.iter().enumerate() {
            for entry in s.host_entries()? {
                let port = entry.port.unwrap_or(443);
                let probe = match &entry.target {
                    agentbox_core::AllowTarget::Domain(d) => d.clone(),
                    agentbox_core::AllowTarget::Below(d) => format!("a.{d}"),
                    _ => continue,
                };
                if allow.name_rule(&probe, port).is_none() {
                    return Err(Error::invalid(format!(
                        "spec.secrets[{i}].hosts: {entry} is not reached by spec.network's allowlist; \
                         add it there too"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// This machine's choice of roots (`SSL_CERT_FILE`, `SSL_CERT_DIR`), passed to a proxy started
/// with a cleared environment: what it checks a secret's host against.
pub(crate) fn roots_env() -> impl Iterator<Item = (&'static str, std::ffi::OsString)> {
    ["SSL_CERT_FILE", "SSL_CERT_DIR"]
        .into_iter()
        .filter_map(|k| std::env::var_os(k).map(|v| (k, v)))
}

/// Run the runner's `argv` in box `b` to its end, within 30 s.
async fn run_to_end(
    b: &dyn agentbox_core::Sandbox,
    argv: &[String],
    ctx: &agentbox_core::Ctx,
) -> Result<agentbox_core::Finished> {
    let p = b
        .exec(
            argv,
            &Default::default(),
            &ctx.with_timeout(std::time::Duration::from_secs(30)),
        )
        .await?;
    agentbox_core::finish(p, Default::default()).await
}

/// Make box `b` trust its own authority, whose certificate its proxy wrote: the bundle
/// [`CA_VARIABLES`] name, and the box's own store where it may be written.
pub(crate) async fn trust(b: &dyn agentbox_core::Sandbox, runner: &str, ctx: &agentbox_core::Ctx) -> Result<()> {
    let argv = vec![
        runner.to_string(),
        "trust".into(),
        format!("{RUN_DIR}/{EGRESS_CA}"),
        format!("{RUN_DIR}/{CA_BUNDLE}"),
    ];
    let out = run_to_end(b, &argv, ctx).await?;
    if out.status.code != 0 {
        return Err(Error::unknown(format!(
            "box {}: trusting its own authority for its secrets: {}",
            b.id(),
            out.stderr_text().trim()
        )));
    }
    tracing::info!(box_id = %b.id(), said = %out.stdout_text().trim(), "the box trusts its own authority for its secrets");
    Ok(())
}

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
    let out = run_to_end(b, &argv, ctx).await?;
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

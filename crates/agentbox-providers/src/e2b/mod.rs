//! E2B boxes: a box is an E2B sandbox (a Firecracker VM), made through E2B's REST API and run
//! through envd, its in-sandbox daemon (Connect RPC with JSON), with reqwest over rustls.
//!
//! What the provider promises, and how:
//! - **Lifetime** is E2B's own timeout: the spec's lifetime in whole seconds, at most the plan's
//!   maximum ([`E2bOptions::max_lifetime`], 1 hour on E2B's base plan; `facts.ends_at_ms` says
//!   the end E2B read back). E2B kills the sandbox when it passes, whatever becomes of this
//!   host. **Extend** is E2B's timeout call (a new end from now).
//! - **Sleep and wake** are pause and resume: a sleep keeps the files, not the programs
//!   (`facts.sleep` is `files`: the pause asks for no memory snapshot), and a paused sandbox's
//!   clock is stopped (`sleep_clock` `paused`): E2B keeps it until it is resumed or killed. A
//!   wake gives the box its whole lifetime again.
//! - **Network**: `none` is E2B's internet access off; an allowlist is E2B's `allowOut` with all
//!   else denied. The facts say what E2B read back about the sandbox, never what was asked.
//! - **Programs** run through envd's process stream, each behind the `sh` shim; the stream has
//!   an idle deadline against envd's keepalives, so a sandbox that dies under a program is a
//!   typed error, never a hang, and a caller that gives up kills the program in the box.
//! - **Files** move through envd's file API, every byte value; a download reads the size
//!   first, so nothing over the caller's bound moves.
//! - **The runner** ([`E2bOptions::runner`], on where the registry finds one): this machine's
//!   static runner, uploaded and started in each sandbox and reached through E2B's proxy to
//!   its port (see `runner`). Through it the box keeps its processes, which any host holding
//!   the key lists, reads and attaches to, and serves files one message per operation.
//! - **Labels** are E2B's metadata, the providers' namespace refused; every box carries
//!   `agentbox=1` and the lifetime it was made with.
//!
//! The key (`E2B_API_KEY`) stays on this host: never logged, never in an error, never given to
//! a box (envd's access token, E2B's own per sandbox, goes only to envd).
//!
//! ```no_run
//! # async fn f() -> agentbox_core::Result<()> {
//! use std::time::Duration;
//! use agentbox_core::{Ctx, Provider, Spec};
//! use agentbox_providers::e2b::{E2bOptions, E2bProvider};
//! // E2B_API_KEY (and E2B_API_URL, E2B_SANDBOX_URL or E2B_DOMAIN for another E2B).
//! let provider = E2bProvider::new(E2bOptions::from_env()?)?;
//! let b = provider.create(&Spec::new(Duration::from_secs(600)), &Ctx::background()).await?;
//! b.upload("notes.txt", b"hello", &Ctx::background()).await?;
//! b.destroy(&Ctx::background()).await?;
//! # Ok(()) }
//! ```

mod api;
mod envd;
mod exec;
mod lifecycle;
mod options;
mod runner;
mod sandbox;

pub use options::E2bOptions;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{
    Ctx, Error, ErrorCode, Facts, Honours, Labels, Lifecycle, Network, NetworkFact, Provider, Result, Sandbox,
    SandboxId, Spec, check_spec,
};
use async_trait::async_trait;
use reqwest::Method;
use serde_json::{Value, json};

pub use crate::vendor::ApiKey;
pub use sandbox::E2bSandbox;

use api::Api;
use envd::Envd;

/// The provider's name and id prefix.
pub const NAME: &str = "e2b";

/// The variables [`E2bOptions::from_env`] reads: the `e2b` SDK's own, the template and the
/// workspace.
pub const VARIABLES: [&str; 6] = [
    "E2B_API_KEY",
    "E2B_DOMAIN",
    "E2B_API_URL",
    "E2B_SANDBOX_URL",
    "AGENTBOX_E2B_TEMPLATE",
    "AGENTBOX_E2B_WORKSPACE",
];

/// The longest timeout on E2B's base plan (Pro: 24 hours; set [`E2bOptions::max_lifetime`]).
pub const PLAN_MAX_LIFETIME: Duration = Duration::from_secs(3600);
/// Where programs start: the base template's user home.
pub const WORKSPACE: &str = "/home/user";

const TAG_LIFETIME: &str = "agentbox.lifetime";
const TAG_WORKSPACE: &str = "agentbox.workspace";

/// Makes E2B sandboxes.
pub struct E2bProvider {
    o: E2bOptions,
    api: Arc<Api>,
    http: reqwest::Client,
    /// The runner's bytes, read once.
    runner_bytes: tokio::sync::OnceCell<Arc<Vec<u8>>>,
}

/// How a box found is handed out where the provider has a runner.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Runner {
    /// Through the runner its box names, unchecked, or as it is (a list starts nothing).
    Lazily,
    /// Through a runner that answers: the one the box names, else one started now.
    Checked,
    /// Through a runner started now (the box has none: just made, or woken).
    Fresh,
}

impl E2bProvider {
    /// A provider over `o`; a missing key is refused here, naming the variable.
    pub fn new(o: E2bOptions) -> Result<Self> {
        let key = o
            .api_key
            .clone()
            .ok_or_else(|| Error::invalid("E2B_API_KEY: an E2B API key is needed (the dashboard's API keys)"))?;
        let http = crate::vendor::client(api::VENDOR, o.connect_timeout)?;
        let base = crate::vendor::base_url(&o.api_url, api::VENDOR, "E2B_API_URL")?;
        if let Some(u) = &o.sandbox_url {
            crate::vendor::base_url(u, api::VENDOR, "E2B_SANDBOX_URL")?;
        }
        Ok(E2bProvider {
            api: Arc::new(Api {
                http: http.clone(),
                base,
                key,
                timeout: o.request_timeout,
            }),
            http,
            o,
            runner_bytes: Default::default(),
        })
    }

    /// E2B's proxy to `port` of a sandbox: `E2B_SANDBOX_URL` where set (the sandbox and port
    /// then ride in headers), else the port's own host.
    fn port_url(&self, sandbox_id: &str, domain: Option<&str>, port: u16) -> String {
        let domain = domain.filter(|d| !d.is_empty()).unwrap_or(&self.o.domain);
        match &self.o.sandbox_url {
            Some(u) => u.trim_end_matches('/').to_string(),
            None => format!("https://{port}-{sandbox_id}.{domain}"),
        }
    }

    /// `b` (read from `d`, its detail) as handed out: through its runner where the provider has
    /// one and the sandbox runs, else as it is.
    async fn boxed(&self, b: E2bSandbox, d: &Value, how: Runner, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let Some(helper) = &self.o.runner else {
            return Ok(Arc::new(b));
        };
        if d.get("state").and_then(Value::as_str) == Some("paused") {
            // Asleep: no program runs, the runner neither; a wake starts one.
            return Ok(Arc::new(b));
        }
        let b = Arc::new(b);
        let domain = d.get("domain").and_then(Value::as_str);
        let token = crate::vendor::runner_token(&self.api.key, b.id.name());
        let dial = |port| runner::ProxyDial {
            http: self.http.clone(),
            url: self.port_url(b.id.name(), domain, port),
            sandbox: b.id.name().to_string(),
            port,
            runner_token: token.clone(),
        };
        if how != Runner::Fresh
            && let Some(port) = runner::port_of(&b, ctx).await?
        {
            let r = runner::through(b.clone(), dial(port));
            if how == Runner::Lazily || r.check(ctx).await.is_ok() {
                return Ok(Arc::new(r));
            }
            tracing::info!(sandbox = %b.id.name(), port, "e2b: the box's runner does not answer: starting another");
        }
        if how == Runner::Lazily {
            return Ok(b);
        }
        let bytes = self
            .runner_bytes
            .get_or_try_init(|| async {
                tokio::fs::read(&helper.program)
                    .await
                    .map(Arc::new)
                    .map_err(|e| Error::io(e, format!("reading the runner {}", helper.program.display())))
            })
            .await?
            .clone();
        let started = async {
            let port = runner::install(&b, helper, &bytes, &token, ctx).await?;
            let r = runner::through(b.clone(), dial(port));
            r.check(ctx).await?;
            Ok::<_, Error>(r)
        };
        match started.await {
            Ok(r) => Ok(Arc::new(r)),
            // A box whose runner cannot start or be reached is still a box: its programs then
            // live as long as their envd streams (no `processes`, detach refused), and the
            // facts say it has no runner.
            Err(e) if ctx.check().is_ok() && e.code() != ErrorCode::Gone => {
                tracing::warn!(sandbox = %b.id.name(), error = %e, "e2b: the box goes without its runner");
                Ok(b)
            }
            Err(e) => Err(e),
        }
    }

    fn envd(&self, sandbox_id: &str, domain: Option<&str>, token: Option<&str>) -> Envd {
        let domain = domain.filter(|d| !d.is_empty()).unwrap_or(&self.o.domain);
        let base = match &self.o.sandbox_url {
            Some(u) => u.trim_end_matches('/').to_string(),
            None if crate::e2b::supported_domain(domain) => format!("https://sandbox.{domain}"),
            None => format!("https://{}-{sandbox_id}.{domain}", envd::PORT),
        };
        Envd {
            http: self.http.clone(),
            base,
            sandbox_id: sandbox_id.to_string(),
            token: token.filter(|t| !t.is_empty()).map(ApiKey::new),
            keepalive: self.o.keepalive,
            timeout: self.o.request_timeout,
        }
    }

    /// A handle from a sandbox's detail (GET), `None` for one not this provider's.
    fn handle(&self, d: &Value) -> Result<Option<E2bSandbox>> {
        let Some(id) = d.get("sandboxID").and_then(Value::as_str) else {
            return Ok(None);
        };
        let meta: BTreeMap<String, String> = d
            .get("metadata")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        if meta.get("agentbox").map(String::as_str) != Some("1") {
            return Ok(None);
        }
        let workspace = meta
            .get(TAG_WORKSPACE)
            .cloned()
            .unwrap_or_else(|| self.o.workspace.clone());
        let labels: Labels = meta
            .iter()
            .filter(|(k, _)| k.as_str() != "agentbox" && !k.starts_with("agentbox."))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let time = |k: &str| {
            d.get(k)
                .and_then(Value::as_str)
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .map(|t| t.as_millisecond().max(0) as u64)
        };
        let network = match (
            d.get("allowInternetAccess").and_then(Value::as_bool),
            d.pointer("/network/allowOut"),
        ) {
            (_, Some(Value::Array(a))) if !a.is_empty() => Some(NetworkFact::Allowlist(
                a.iter().filter_map(Value::as_str).map(String::from).collect(),
            )),
            (Some(false), _) => Some(NetworkFact::None),
            (Some(true), _) => Some(NetworkFact::Open),
            // Not said: unknown.
            (None, _) => None,
        };
        let facts = Facts {
            provider: NAME.into(),
            isolation: "vm".into(),
            cpus: d.get("cpuCount").and_then(Value::as_f64),
            memory_mb: d.get("memoryMB").and_then(Value::as_u64),
            disk_gb: d.get("diskSizeMB").and_then(Value::as_u64).map(|mb| mb / 1024),
            network,
            ports: Some(Vec::new()),
            started_at_ms: time("startedAt"),
            ends_at_ms: time("endAt"),
            live_processes: true,
            secrets_via: Some("fd".into()),
            workspace: Some(workspace.clone()),
            sleep: Some("files".into()),
            sleep_clock: Some("paused".into()),
            ..Default::default()
        };
        Ok(Some(E2bSandbox {
            id: SandboxId::new(NAME, id)?,
            facts,
            labels,
            api: self.api.clone(),
            envd: self.envd(
                id,
                d.get("domain").and_then(Value::as_str),
                d.get("envdAccessToken").and_then(Value::as_str),
            ),
            workspace,
        }))
    }

    /// The box of `sandbox_id` as E2B reads it now, handed out as `how` says; `None` when gone
    /// or not this provider's.
    async fn read_boxed(&self, sandbox_id: &str, how: Runner, ctx: &Ctx) -> Result<Option<Arc<dyn Sandbox>>> {
        let Some((_, d)) = sandbox::state(&self.api, sandbox_id, ctx).await? else {
            return Ok(None);
        };
        match self.handle(&d)? {
            None => Ok(None),
            Some(b) => Ok(Some(self.boxed(b, &d, how, ctx).await?)),
        }
    }

    fn lifetime_secs(&self, lifetime: Duration) -> u64 {
        lifetime.min(self.o.max_lifetime).as_secs_f64().ceil().max(1.0) as u64
    }
}

/// `k=v&…`, each part form-encoded.
fn encode<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut u = reqwest::Url::parse("http://x/").expect("a fixed URL");
    u.query_pairs_mut().extend_pairs(pairs);
    u.query().unwrap_or_default().to_string()
}

/// `s` percent-encoded but for letters, digits and `-._~/` (Python's `urllib.parse.quote`).
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The domains E2B's SDK reaches through its one sandbox proxy (`sandbox.<domain>`).
fn supported_domain(d: &str) -> bool {
    [
        "e2b.app",
        "e2b.dev",
        "e2b.pro",
        "e2b-staging.dev",
        "e2b-tango.dev",
        "e2b-juliett.dev",
        "foxtrot-2.e2b.dev",
    ]
    .contains(&d)
}

#[async_trait]
impl Provider for E2bProvider {
    fn name(&self) -> &str {
        NAME
    }

    fn honours(&self) -> Honours {
        Honours {
            isolation: vec!["vm".into()],
            network_none: true,
            network_allowlist: true,
            env: true,
            live_processes: true,
            sleep: true,
            extend: true,
            ..Default::default()
        }
    }

    async fn create(&self, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        check_spec(spec, &self.honours(), NAME)?;
        if let Some(Network::Allow(list)) = &spec.network {
            agentbox_core::Allowlist::parse(list)?.refuse(true, "E2B's allowOut")?;
        }
        let secs = self.lifetime_secs(spec.max_lifetime);
        let mut metadata: BTreeMap<String, String> = spec.labels.clone().into_iter().collect();
        metadata.insert("agentbox".into(), "1".into());
        metadata.insert(TAG_LIFETIME.into(), secs.to_string());
        metadata.insert(TAG_WORKSPACE.into(), self.o.workspace.clone());
        let mut body = json!({
            "templateID": self.o.template,
            "timeout": secs,
            "metadata": metadata,
            "envVars": spec.env,
            "autoPause": false,
        });
        match &spec.network {
            Some(Network::None) => body["allow_internet_access"] = json!(false),
            Some(Network::Allow(list)) => {
                body["network"] = json!({"allowOut": list, "denyOut": ["0.0.0.0/0"]});
            }
            // Said outright, so E2B's read-back says it too (unsaid reads back as unknown).
            _ => body["allow_internet_access"] = json!(true),
        }
        let made = self
            .api
            .call(
                ctx,
                Method::POST,
                "/v2/sandboxes",
                Some(&body),
                false,
                "POST /v2/sandboxes",
            )
            .await?;
        if made.status == 404 {
            return Err(api::error(404, &made.body, "POST /v2/sandboxes (the template)"));
        }
        let id = made
            .body
            .get("sandboxID")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::unknown("e2b: POST /v2/sandboxes answered no sandboxID"))?
            .to_string();
        tracing::info!(sandbox = %id, lifetime_s = secs, "e2b: sandbox made");
        let ready = async {
            let gone = || Error::gone(format!("e2b: sandbox {id} ended as it was made"));
            let (_, detail) = sandbox::state(&self.api, &id, ctx).await?.ok_or_else(gone)?;
            let b = self.handle(&detail)?.ok_or_else(gone)?;
            // What E2B read back must be what was asked, or the box is not handed out.
            let want = match &spec.network {
                Some(Network::None) => Some(NetworkFact::None),
                Some(Network::Allow(l)) => Some(NetworkFact::Allowlist(l.clone())),
                _ => None,
            };
            if want.is_some() && b.facts.network != want {
                return Err(Error::unsupported(format!(
                    "spec.network: E2B read back {:?} for sandbox {id}, not what was asked (the box was killed)",
                    b.facts.network
                )));
            }
            let mk = ["mkdir", "-p", "--", &self.o.workspace].map(String::from);
            let p = exec::start(&b.envd, &mk, "/", &Default::default(), ctx).await?;
            let out = agentbox_core::finish(p, agentbox_core::FinishOptions::default()).await?;
            if out.status.code != 0 {
                return Err(Error::unknown(format!(
                    "making the workspace {}: {}",
                    self.o.workspace,
                    out.stderr_text().trim()
                )));
            }
            self.boxed(b, &detail, Runner::Fresh, ctx).await
        }
        .await;
        match ready {
            Ok(b) => Ok(b),
            Err(e) => {
                let _ = self
                    .api
                    .call(
                        &Ctx::background().with_timeout(self.o.request_timeout),
                        Method::DELETE,
                        &format!("/sandboxes/{id}"),
                        None,
                        true,
                        "DELETE /sandboxes/{id}",
                    )
                    .await;
                Err(e)
            }
        }
    }

    async fn attach(&self, id: &SandboxId, ctx: &Ctx) -> Result<Option<Arc<dyn Sandbox>>> {
        id.expect_provider(NAME)?;
        self.read_boxed(id.name(), Runner::Checked, ctx).await
    }

    async fn list(&self, labels: &Labels, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        let mut want: BTreeMap<String, String> = labels.clone().into_iter().collect();
        want.insert("agentbox".into(), "1".into());
        // `k=v&k2=v2`, each part encoded, the whole one query value.
        // As the `e2b` SDK sends it, and E2B's server decodes it three times: each key and
        // value escaped, the pairs form-encoded, the whole a query value.
        let quoted: Vec<(String, String)> = want.iter().map(|(k, v)| (quote(k), quote(v))).collect();
        let query = encode(quoted.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let mut out: Vec<Arc<dyn Sandbox>> = Vec::new();
        let mut next: Option<String> = None;
        for _ in 0..1000 {
            let mut q = vec![
                ("metadata", query.as_str()),
                ("state", "running,paused"),
                ("limit", "100"),
            ];
            if let Some(n) = &next {
                q.push(("nextToken", n));
            }
            let a = self
                .api
                .call(
                    ctx,
                    Method::GET,
                    &format!("/v2/sandboxes?{}", encode(q)),
                    None,
                    true,
                    "GET /v2/sandboxes",
                )
                .await?;
            for d in a.body.as_array().into_iter().flatten() {
                // A listing carries no envd token and no network: each match is read whole.
                if let Some(b) = self.handle(d)?
                    && labels.iter().all(|(k, v)| b.labels.get(k) == Some(v))
                    && let Some(b) = self.read_boxed(b.id.name(), Runner::Lazily, ctx).await?
                {
                    out.push(b);
                }
            }
            next = a.next;
            if next.is_none() {
                return Ok(out);
            }
        }
        Err(Error::unknown("e2b: GET /v2/sandboxes: more than 1000 pages"))
    }

    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        Some(self)
    }
}

impl E2bProvider {
    async fn read_metadata(&self, sandbox_id: &str, ctx: &Ctx) -> Result<BTreeMap<String, String>> {
        Ok(sandbox::state(&self.api, sandbox_id, ctx)
            .await?
            .and_then(|(_, d)| {
                d.get("metadata").and_then(Value::as_object).map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                        .collect()
                })
            })
            .unwrap_or_default())
    }
}

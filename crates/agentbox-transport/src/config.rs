//! The transport config: which environments exist, which one runs a conversation's tools
//! (the hands, or roles of them), and whether a box serves the session or each conversation.
//!
//! ```toml
//! scope = "session"                       # or "conversation"
//! hands = { default = "sandbox", build = "gpu" }   # or hands = "sandbox"
//!
//! [environments.sandbox]
//! provider = "local"
//! max_lifetime = "6h"
//!
//! [environments.gpu]
//! provider = "docker"
//! max_lifetime = "2h"
//! cpus = 4
//! pool = 4                                # ready boxes kept warm (0 to 64; 0: none)
//! ```
//!
//! An environment may also name a `snapshot`, `ports` (`[8080, { port = 5432, kind = "tcp" }]`),
//! `capabilities` (`["fuse"]`) and `mounts` (`[{ source = "/data", target = "/data",
//! read_only = true }]`). The same keys in JSON. The camelCase keys of the library agentbox grew
//! from (`maxLifetime`, `memoryMb`, `readOnly`) are read beside these. Every error names the key
//! and why; unknown keys are refused.
//! `provider` is one of agentbox's providers (its registry: `local`, `docker`…), which
//! [`TransportConfig::registry_providers`] makes, or a name the host gives a provider of its own.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Error, Network, Provider, Result, Spec, parse_duration, validate_env, validate_labels};
use agentbox_providers::pool::MAX_POOL;
use agentbox_providers::registry;
use serde::Deserialize;

/// A box's lifetime when an environment names none.
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);

/// One declared environment: a provider and the spec its boxes are made from.
#[derive(Clone, Debug, PartialEq)]
pub struct Environment {
    /// The provider's name, as the host passes its providers: one of agentbox's
    /// ([`agentbox_providers::registry::choices`]: local, docker…), which
    /// [`TransportConfig::registry_providers`] makes, or a name of the host's own.
    pub provider: String,
    /// What its boxes are asked for.
    pub spec: Spec,
    /// Ready boxes of this spec kept warm (`agentbox_providers::pool`), 0 to
    /// [`agentbox_providers::pool::MAX_POOL`]; 0 (the default) makes each box on demand.
    pub pool: usize,
}

/// Which environment runs a conversation's tools: the default role, and named roles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hands {
    /// The environment a conversation's tools run in unless assigned elsewhere.
    pub default: String,
    /// Other roles, each an environment's name.
    pub roles: BTreeMap<String, String>,
}

/// Whether one box serves the whole session or each conversation has its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    /// One box per environment for the session.
    #[default]
    Session,
    /// One box per environment and conversation.
    Conversation,
}

/// A parsed, checked transport config.
#[derive(Clone, Debug, PartialEq)]
pub struct TransportConfig {
    /// The declared environments, by name.
    pub environments: BTreeMap<String, Environment>,
    /// Where tools run; `None`: on the host itself.
    pub hands: Option<Hands>,
    /// One box per session or per conversation.
    pub scope: Scope,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    environments: BTreeMap<String, RawEnvironment>,
    #[serde(default)]
    hands: Option<RawHands>,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    expose: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawHands {
    One(String),
    Roles(BTreeMap<String, String>),
}

/// An environment as written. The library agentbox grew from wrote its configs in camelCase
/// (`maxLifetime`, `memoryMb`, a mount's `readOnly`): each such key is taken beside agentbox's
/// own, and a config that gives both is refused as a duplicate.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEnvironment {
    provider: String,
    #[serde(default, alias = "maxLifetime")]
    max_lifetime: Option<String>,
    #[serde(default)]
    image: Option<String>,
    /// A snapshot to make the box from (one `box snapshot` took, or the vendor's own).
    #[serde(default)]
    snapshot: Option<String>,
    #[serde(default)]
    cpus: Option<f64>,
    #[serde(default, alias = "memoryMb")]
    memory_mb: Option<u64>,
    /// `[8080, { port = 5432, kind = "tcp" }]`: a bare number is `https`. Any value, checked
    /// in [`ports`] so that a wrong shape's error names the key.
    #[serde(default)]
    ports: Option<serde_json::Value>,
    /// Capabilities such as `fuse`.
    #[serde(default)]
    capabilities: Vec<String>,
    /// `[{ source, target, read_only }]`: directories of this machine bound into the box.
    #[serde(default)]
    mounts: Option<serde_json::Value>,
    #[serde(default)]
    gpu: Option<String>,
    #[serde(default)]
    region: Option<String>,
    #[serde(default)]
    isolation: Option<String>,
    /// `"open"`, `"none"`, `"host"` or `{ allow = [...] }`: any value, checked in [`network`] so that
    /// a wrong shape's error names the key.
    #[serde(default)]
    network: Option<serde_json::Value>,
    #[serde(default)]
    workspace: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    /// Any value, checked in [`environment`] so that a wrong type's error names the key.
    #[serde(default)]
    pool: Option<serde_json::Value>,
    /// `[{ name, from, hosts }]`: any value, checked in [`environment`] so that a wrong shape's
    /// error names the key.
    #[serde(default)]
    secrets: Option<serde_json::Value>,
}

impl TransportConfig {
    /// Parse TOML.
    ///
    /// ```
    /// use agentbox_transport::TransportConfig;
    /// let c = TransportConfig::from_toml("hands = \"sandbox\"\n[environments.sandbox]\nprovider = \"local\"\nmax_lifetime = \"6h\"\n").unwrap();
    /// assert_eq!(c.hands.unwrap().default, "sandbox");
    /// ```
    pub fn from_toml(text: &str) -> Result<Self> {
        let raw: RawConfig =
            toml::from_str(text).map_err(|e| Error::invalid(format!("transport config: {}", e.message().trim())))?;
        Self::from_raw(raw)
    }

    /// Parse JSON.
    pub fn from_json(text: &str) -> Result<Self> {
        let raw: RawConfig =
            serde_json::from_str(text).map_err(|e| Error::invalid(format!("transport config: {e}")))?;
        Self::from_raw(raw)
    }

    /// Read a `.toml` or `.json` file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(e, format!("reading {}", path.display())))?;
        let parsed = match path.extension().and_then(|e| e.to_str()) {
            Some("json") => Self::from_json(&text),
            Some("toml") => Self::from_toml(&text),
            _ => {
                return Err(Error::invalid(format!(
                    "{}: a transport config is a .toml or a .json file",
                    path.display()
                )));
            }
        };
        parsed.map_err(|e| e.context(path.display()))
    }

    fn from_raw(raw: RawConfig) -> Result<Self> {
        if raw.expose.is_some() {
            return Err(Error::unsupported(
                "transport config: expose: not available yet (no secret is passed into a box)",
            ));
        }
        let mut environments = BTreeMap::new();
        for (name, e) in raw.environments {
            check_name(&name, "environments")?;
            environments.insert(name.clone(), environment(&name, e)?);
        }
        let hands = match raw.hands {
            None => None,
            Some(RawHands::One(env)) => Some(Hands {
                default: env,
                roles: BTreeMap::new(),
            }),
            Some(RawHands::Roles(mut roles)) => {
                let default = roles
                    .remove("default")
                    .ok_or_else(|| Error::invalid("transport config: hands: a table of roles needs a default role"))?;
                Some(Hands { default, roles })
            }
        };
        if let Some(h) = &hands {
            for (role, env) in
                std::iter::once(("default", &h.default)).chain(h.roles.iter().map(|(k, v)| (k.as_str(), v)))
            {
                if env == "auto" {
                    return Err(Error::unsupported(
                        "transport config: hands: \"auto\" (the placer) is not available: name an environment",
                    ));
                }
                if !environments.contains_key(env) {
                    return Err(Error::invalid(format!(
                        "transport config: hands.{role}: {env:?} is not a declared environment ({})",
                        names(&environments)
                    )));
                }
            }
        }
        let scope = match raw.scope.as_deref() {
            None | Some("session") => Scope::Session,
            Some("conversation") => Scope::Conversation,
            Some(other) => {
                return Err(Error::invalid(format!(
                    "transport config: scope: {other:?} is neither \"session\" nor \"conversation\""
                )));
            }
        };
        Ok(TransportConfig {
            environments,
            hands,
            scope,
        })
    }

    /// The providers the environments name, each made once by agentbox's registry with
    /// `options` and `env`: the `providers` of a [`crate::TransportHost`] whose providers are
    /// agentbox's own. A name the registry does not have is refused, naming the environment
    /// and every provider there is.
    ///
    /// ```no_run
    /// # async fn f(config: agentbox_transport::TransportConfig) -> agentbox_core::Result<()> {
    /// use agentbox_providers::registry::{Environment, Options};
    /// let providers = config.registry_providers(&Options::default(), &Environment::from_process()).await?;
    /// # Ok(()) }
    /// ```
    pub async fn registry_providers(
        &self,
        options: &registry::Options,
        env: &registry::Environment,
    ) -> Result<BTreeMap<String, Arc<dyn Provider>>> {
        let mut entries = BTreeMap::new();
        for (name, e) in &self.environments {
            let entry = registry::find(&e.provider)
                .map_err(|err| err.context(format!("transport config: environments.{name}.provider")))?;
            entries.insert(e.provider.clone(), entry);
        }
        let mut made = BTreeMap::new();
        for (name, entry) in entries {
            made.insert(name, entry.make(options, env).await?);
        }
        Ok(made)
    }

    /// The environment a role or an environment's name points at.
    pub fn resolve(&self, role_or_env: &str) -> Option<&str> {
        let h = self.hands.as_ref()?;
        if role_or_env == "default" {
            return Some(&h.default);
        }
        if let Some(env) = h.roles.get(role_or_env) {
            return Some(env);
        }
        self.environments.get_key_value(role_or_env).map(|(k, _)| k.as_str())
    }
}

fn names(envs: &BTreeMap<String, Environment>) -> String {
    if envs.is_empty() {
        return "none is declared".into();
    }
    let list: Vec<&str> = envs.keys().map(String::as_str).collect();
    format!("declared: {}", list.join(", "))
}

fn check_name(name: &str, key: &str) -> Result<()> {
    let ok =
        !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "transport config: {key}.{name:?}: a name is 1 to 64 letters, digits, '-' or '_'"
        )))
    }
}

/// An environment's `network`: `"open"`, `"none"`, `"host"`, or `{ allow = ["HOST[:PORT]", ...] }`
/// (each entry parsed here, so a bad one is refused with the key named).
fn network(v: serde_json::Value, at: &str) -> Result<Network> {
    use serde_json::Value;
    match v {
        Value::String(s) if s == "open" => Ok(Network::Open),
        Value::String(s) if s == "none" => Ok(Network::None),
        Value::String(s) if s == "host" => Ok(Network::Host),
        Value::Object(mut o) if o.len() == 1 && o.contains_key("allow") => {
            let Some(Value::Array(items)) = o.remove("allow") else {
                return Err(Error::invalid(format!("{at}.allow: not a list of strings")));
            };
            let list = items
                .into_iter()
                .map(|i| match i {
                    Value::String(s) => Ok(s),
                    other => Err(Error::invalid(format!("{at}.allow: {other} is not a string"))),
                })
                .collect::<Result<Vec<String>>>()?;
            agentbox_core::Allowlist::parse(&list).map_err(|e| {
                Error::invalid(format!(
                    "{at}.allow: {}",
                    e.message().trim_start_matches("spec.network.allow: ")
                ))
            })?;
            Ok(Network::Allow(list))
        }
        other => Err(Error::invalid(format!(
            "{at}: {other} is neither \"open\", \"none\", \"host\" nor {{ allow = [...] }}"
        ))),
    }
}

/// An environment's `ports`: each a number (`https`) or `{ port, kind = "https" | "tcp" }`.
fn ports(v: serde_json::Value, at: &str) -> Result<Vec<agentbox_core::PortSpec>> {
    use serde_json::Value;
    let Value::Array(items) = v else {
        return Err(Error::invalid(format!("{at}: {v} is not a list of ports")));
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let port = match &item {
                Value::Number(_) => serde_json::from_value::<u16>(item.clone()).map(|port| agentbox_core::PortSpec {
                    port,
                    kind: Default::default(),
                }),
                _ => serde_json::from_value::<agentbox_core::PortSpec>(item.clone()),
            };
            port.map_err(|e| {
                Error::invalid(format!(
                    "{at}[{i}]: {item} is neither a port number nor {{ port = N, kind = \"https\" or \"tcp\" }} ({e})"
                ))
            })
        })
        .collect()
}

/// A mount as written: agentbox's `read_only` or the library's `readOnly`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMount {
    source: String,
    target: String,
    #[serde(default, alias = "readOnly")]
    read_only: bool,
}

/// An environment's `mounts`: `[{ source, target, read_only }]`.
fn mounts(v: serde_json::Value, at: &str) -> Result<Vec<agentbox_core::Mount>> {
    let raw: Vec<RawMount> = serde_json::from_value(v)
        .map_err(|e| Error::invalid(format!("{at}: {e}; give a list of {{ source, target, read_only }}")))?;
    Ok(raw
        .into_iter()
        .map(|m| agentbox_core::Mount {
            source: m.source,
            target: m.target,
            read_only: m.read_only,
        })
        .collect())
}

fn environment(name: &str, e: RawEnvironment) -> Result<Environment> {
    let at = |field: &str| format!("transport config: environments.{name}.{field}");
    if e.provider.is_empty() {
        return Err(Error::invalid(format!(
            "{}: empty (agentbox's providers: {})",
            at("provider"),
            registry::choices()
        )));
    }
    let lifetime = match &e.max_lifetime {
        Some(s) => {
            parse_duration(s).map_err(|err| Error::invalid(format!("{}: {}", at("max_lifetime"), err.message())))?
        }
        None => DEFAULT_LIFETIME,
    };
    let mut spec = Spec::new(lifetime);
    spec.image = e.image;
    spec.snapshot = e.snapshot;
    spec.cpus = e.cpus;
    if let Some(c) = spec.cpus
        && !(c.is_finite() && c > 0.0)
    {
        return Err(Error::invalid(format!("{}: {c} is not a positive number", at("cpus"))));
    }
    spec.memory_mb = e.memory_mb;
    if spec.memory_mb == Some(0) {
        return Err(Error::invalid(format!("{}: 0 is no memory", at("memory_mb"))));
    }
    spec.gpu = e.gpu;
    spec.region = e.region;
    spec.isolation = e.isolation;
    spec.workspace = e.workspace;
    spec.network = e.network.map(|v| network(v, &at("network"))).transpose()?;
    if let Some(v) = e.ports {
        spec.ports = ports(v, &at("ports"))?;
    }
    spec.capabilities = e.capabilities;
    if let Some(v) = e.mounts {
        spec.mounts = mounts(v, &at("mounts"))?;
    }
    // What the spec itself checks (lifetime bounds, mounts' paths, ports' numbers, names),
    // named under this environment.
    spec.validate()
        .map_err(|err| Error::invalid(format!("transport config: environments.{name}: {}", err.message())))?;
    for (k, v) in &e.env {
        validate_env(k, v).map_err(|err| Error::invalid(format!("{}: {}", at("env"), err.message())))?;
    }
    spec.env = e.env;
    if let Some(v) = e.secrets {
        spec.secrets = serde_json::from_value(v).map_err(|err| {
            Error::invalid(format!(
                "{}: {err}; give a list of {{ name = \"NAME\", from = \"env:VARIABLE\" or \"file:/path\", hosts = [\"host\"] }}",
                at("secrets")
            ))
        })?;
        for (i, s) in spec.secrets.iter().enumerate() {
            s.validate(i)
                .map_err(|err| Error::invalid(format!("{}: {}", at("secrets"), err.message())))?;
        }
    }
    spec.labels = e.labels;
    validate_labels(&spec.labels).map_err(|err| Error::invalid(format!("{}: {}", at("labels"), err.message())))?;
    let pool = match e.pool {
        None => 0,
        Some(v) => match v.as_u64() {
            Some(n) if n <= MAX_POOL as u64 => n as usize,
            _ => {
                return Err(Error::invalid(format!(
                    "{}: {v} is not a count of ready boxes a pool keeps (0 to {MAX_POOL})",
                    at("pool")
                )));
            }
        },
    };
    Ok(Environment {
        provider: e.provider,
        spec,
        pool,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        TransportConfig::from_toml(text).unwrap_err().message().to_string()
    }

    #[test]
    fn toml_and_json_say_the_same() {
        let t = TransportConfig::from_toml(
            "scope = \"conversation\"\nhands = { default = \"sandbox\", build = \"gpu\" }\n\
             [environments.sandbox]\nprovider = \"local\"\nmax_lifetime = \"6h\"\n\
             [environments.gpu]\nprovider = \"docker\"\ncpus = 4\nenv = { MODE = \"x\" }\n\
             network = { allow = [\"pypi.org\", \"*.github.com:443\"] }\n\
             secrets = [{ name = \"GH\", from = \"env:GH_TOKEN\", hosts = [\"api.github.com\"] }]\n",
        )
        .unwrap();
        let j = TransportConfig::from_json(
            r#"{"scope":"conversation","hands":{"default":"sandbox","build":"gpu"},
               "environments":{"sandbox":{"provider":"local","max_lifetime":"6h"},
                               "gpu":{"provider":"docker","cpus":4,"env":{"MODE":"x"},
                                      "network":{"allow":["pypi.org","*.github.com:443"]},
                                      "secrets":[{"name":"GH","from":"env:GH_TOKEN","hosts":["api.github.com"]}]}}}"#,
        )
        .unwrap();
        assert_eq!(t, j);
        assert_eq!(
            t.environments["gpu"].spec.network,
            Some(Network::Allow(vec!["pypi.org".into(), "*.github.com:443".into()]))
        );
        assert_eq!(t.environments["gpu"].spec.secrets[0].from, "env:GH_TOKEN");
        assert_eq!(t.scope, Scope::Conversation);
        assert_eq!(
            t.environments["sandbox"].spec.max_lifetime,
            Duration::from_secs(6 * 3600)
        );
        assert_eq!(t.resolve("build"), Some("gpu"));
        assert_eq!(t.resolve("sandbox"), Some("sandbox"));
        assert_eq!(t.resolve("nothing"), None);
    }

    #[test]
    fn errors_name_the_key_and_why() {
        let bad = err("[environments.a]\nprovider = \"local\"\nsecrets = [{ name = \"GH\" }]");
        assert!(
            bad.contains("environments.a.secrets") && bad.contains("missing field"),
            "{bad}"
        );
        let bad = err(
            "[environments.a]\nprovider = \"local\"\nsecrets = [{ name = \"GH\", from = \"x\", hosts = [\"a.com\"] }]",
        );
        assert!(
            bad.contains("environments.a.secrets") && bad.contains("names no source"),
            "{bad}"
        );
        assert!(err("hands = \"x\"").contains("hands.default: \"x\" is not a declared environment"));
        assert!(
            err("[environments.a]\nprovider = \"local\"\nmax_lifetime = \"soon\"")
                .contains("environments.a.max_lifetime")
        );
        assert!(err("[environments.a]\nprovider = \"local\"\ncolour = \"red\"").contains("colour"));
        assert!(err("surprise = 1").contains("surprise"));
        assert!(err("hands = { build = \"a\" }\n[environments.a]\nprovider = \"local\"").contains("default role"));
        assert!(err("scope = \"forever\"").contains("scope"));
        assert!(err("hands = \"auto\"\n[environments.auto]\nprovider = \"local\"").contains("auto"));
        assert!(err("expose = [1]").contains("expose"));
        assert!(err("[environments.a]\nprovider = \"local\"\nnetwork = \"some\"").contains("environments.a.network"));
        assert!(
            err("[environments.a]\nprovider = \"local\"\nnetwork = { deny = [] }").contains("environments.a.network")
        );
        assert!(
            err("[environments.a]\nprovider = \"local\"\nnetwork = { allow = [] }")
                .contains("environments.a.network.allow: an empty allowlist")
        );
        assert!(
            err("[environments.a]\nprovider = \"local\"\nnetwork = { allow = [\"x.com:0\"] }")
                .contains("environments.a.network.allow: \"x.com:0\"")
        );
        assert!(
            err("[environments.a]\nprovider = \"local\"\nnetwork = { allow = [1] }")
                .contains("environments.a.network.allow: 1 is not a string")
        );
        assert!(err("[environments.\"a b\"]\nprovider = \"local\"").contains("a name is"));
        assert!(
            err("[environments.a]\nprovider = \"local\"\nlabels = { \"agentbox.x\" = \"1\" }")
                .contains("environments.a.labels")
        );
        assert!(err("[environments.a]\nprovider = \"local\"\ncpus = -1.0").contains("environments.a.cpus"));
        assert!(err("[environments.a\nprovider").contains("transport config"));
    }

    #[test]
    fn a_pool_is_0_to_64_boxes_naming_its_environment() {
        let c = TransportConfig::from_toml("[environments.a]\nprovider = \"local\"\npool = 4").unwrap();
        assert_eq!(c.environments["a"].pool, 4);
        let j = TransportConfig::from_json(r#"{"environments":{"a":{"provider":"local","pool":4}}}"#).unwrap();
        assert_eq!(c, j);
        let none = TransportConfig::from_toml("[environments.a]\nprovider = \"local\"").unwrap();
        assert_eq!(none.environments["a"].pool, 0);
        for bad in ["65", "-1", "1000000000000"] {
            let e = err(&format!("[environments.gpu]\nprovider = \"local\"\npool = {bad}"));
            assert!(e.contains("environments.gpu.pool"), "{bad}: {e}");
            assert!(e.contains("0 to 64"), "{bad}: {e}");
        }
        for bad in ["\"four\"", "1.5", "true"] {
            let e = err(&format!("[environments.a]\nprovider = \"local\"\npool = {bad}"));
            assert!(e.contains("environments.a.pool") && e.contains("0 to 64"), "{bad}: {e}");
        }
    }

    #[test]
    fn no_hands_means_the_host_itself() {
        let c = TransportConfig::from_toml("[environments.a]\nprovider = \"local\"").unwrap();
        assert!(c.hands.is_none());
        assert_eq!(c.environments["a"].spec.max_lifetime, DEFAULT_LIFETIME);
    }

    /// A config as the library agentbox grew from wrote it (JSON, camelCase keys) reads the
    /// same as agentbox's own, with a snapshot, ports, capabilities and mounts.
    #[test]
    fn the_librarys_own_configs_are_read() {
        let mount = std::env::temp_dir().canonicalize().unwrap();
        let seed = format!(
            r#"{{"environments": {{"sandbox": {{"provider": "modal", "maxLifetime": "6h", "memoryMb": 2048,
                "snapshot": "base", "ports": [8080, {{"port": 5432, "kind": "tcp"}}], "capabilities": ["fuse"],
                "mounts": [{{"source": "{}", "target": "/data", "readOnly": true}}]}}}},
              "hands": "sandbox"}}"#,
            mount.display()
        );
        let c = TransportConfig::from_json(&seed).unwrap();
        let spec = &c.environments["sandbox"].spec;
        assert_eq!(spec.max_lifetime, Duration::from_secs(6 * 3600));
        assert_eq!(spec.memory_mb, Some(2048));
        assert_eq!(spec.snapshot.as_deref(), Some("base"));
        assert_eq!(
            spec.ports,
            vec![
                agentbox_core::PortSpec {
                    port: 8080,
                    kind: agentbox_core::PortKind::Https
                },
                agentbox_core::PortSpec {
                    port: 5432,
                    kind: agentbox_core::PortKind::Tcp
                },
            ]
        );
        assert_eq!(spec.capabilities, vec!["fuse"]);
        assert_eq!(spec.mounts.len(), 1);
        assert!(spec.mounts[0].read_only);
        assert_eq!(spec.mounts[0].target, "/data");
        // The same in agentbox's own keys, in TOML.
        let toml = format!(
            "hands = \"sandbox\"\n[environments.sandbox]\nprovider = \"modal\"\nmax_lifetime = \"6h\"\nmemory_mb = 2048\n\
             snapshot = \"base\"\nports = [8080, {{ port = 5432, kind = \"tcp\" }}]\ncapabilities = [\"fuse\"]\n\
             mounts = [{{ source = \"{}\", target = \"/data\", read_only = true }}]\n",
            mount.display()
        );
        assert_eq!(TransportConfig::from_toml(&toml).unwrap(), c);

        // Each wrong shape is named.
        assert!(err("[environments.a]\nprovider = \"local\"\nports = [\"http\"]").contains("environments.a.ports[0]"));
        assert!(err("[environments.a]\nprovider = \"local\"\nports = [70000]").contains("environments.a.ports[0]"));
        assert!(
            err("[environments.a]\nprovider = \"local\"\nmounts = [{ source = \"/x\" }]")
                .contains("environments.a.mounts")
        );
        assert!(
            err("[environments.a]\nprovider = \"local\"\nmounts = [{ source = \"relative\", target = \"/x\" }]")
                .contains("environments.a")
        );
        let both = TransportConfig::from_json(
            r#"{"environments":{"a":{"provider":"local","maxLifetime":"1h","max_lifetime":"2h"}}}"#,
        )
        .unwrap_err()
        .message()
        .to_string();
        assert!(both.contains("duplicate") && both.contains("max_lifetime"), "{both}");
    }
}

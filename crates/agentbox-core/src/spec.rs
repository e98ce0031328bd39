//! What a caller asks of a box, and what a provider can honour.
//!
//! A [`Spec`] names every field the reference contract has. A provider never ignores one:
//! [`check_spec`] compares a spec with the provider's [`Honours`] and refuses, naming the
//! field, what the provider cannot give (`unsupported`) or what is malformed (`invalid`).
//! Every provider calls it first, so every provider refuses the same way.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Labels: the host's key/value marks on a box, used to list boxes again.
pub type Labels = BTreeMap<String, String>;

/// The label namespace that belongs to providers: `agentbox` and every key under `agentbox.`.
pub const RESERVED_LABEL_PREFIX: &str = "agentbox";

/// The longest lifetime a spec may ask for (30 days): past it a timer overflows somewhere.
pub const MAX_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);

/// At most this many bind mounts in one spec.
pub const MAX_MOUNTS: usize = 8;

/// A request for a box.
///
/// Only `max_lifetime` is required; everything else is asked for only when set.
///
/// ```
/// use std::time::Duration;
/// use agentbox_core::Spec;
/// let spec = Spec::new(Duration::from_secs(600)).label("team", "infra").env("MODE", "test");
/// assert!(spec.validate().is_ok());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// How long the box may live. The provider ends it then, with no call from the host.
    #[serde(with = "duration_ms", rename = "max_lifetime_ms")]
    #[cfg_attr(feature = "schema", schemars(with = "u64"))]
    pub max_lifetime: Duration,
    /// The image to start from (Docker, cloud providers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// A snapshot to start from: one `Lifecycle::snapshot` took, or the vendor's own (Daytona,
    /// Modal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// CPUs (fractions allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Memory in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// A GPU model, or `any`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// Where the box should run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The isolation asked for: `none`, `container`, `gvisor`, `vm`, `namespace`...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<String>,
    /// Plain settings every program of the box sees. Never a secret: a provider may store it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The host's labels. Keys under `agentbox` are the providers' and refused here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: Labels,
    /// What the box may reach. Absent means the provider's default (open).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// Ports to expose.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortSpec>,
    /// Capabilities such as `fuse`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    /// Directories of this machine bound into the box.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// The box's working directory, where programs start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// Credentials the box uses without holding them: its variable holds a placeholder, and
    /// this machine's egress proxy puts the value into requests bound for the named hosts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<crate::secret::SecretSpec>,
}

/// What a box may reach over the network.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Network {
    /// Everything the provider's open network reaches. On a box of this machine with a network
    /// of its own (a namespace box), that is the internet through agentbox's egress proxy, with
    /// this machine, loopback, link-local and private ranges refused: the same as no policy.
    Open,
    /// Nothing.
    None,
    /// This machine's own network, shared: the box's programs reach every service of this
    /// machine's, loopback included, and listen on its ports. Only a provider whose boxes run on
    /// this machine can give it (namespace boxes; a local box has nothing else); named outright,
    /// never a default.
    Host,
    /// Only these domains (`api.example.com`, `*.example.com`) and IPv4 or IPv6 addresses and
    /// CIDRs (`10.0.0.0/8`, `2001:db8::/32`), each with an optional port (`example.com:443`,
    /// `[2001:db8::/32]:443`): see [`crate::Allowlist`].
    Allow(Vec<String>),
}

/// A port to expose: TLS (https) by default, or a raw TCP socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PortSpec {
    /// The port inside the box.
    pub port: u16,
    /// `https` or `tcp`.
    #[serde(default)]
    pub kind: PortKind,
}

/// How an exposed port is reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum PortKind {
    /// Through TLS (an https URL).
    #[default]
    Https,
    /// As a raw TCP socket.
    Tcp,
}

/// A directory of this machine bound into the box.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Mount {
    /// A canonical absolute path on this machine.
    pub source: String,
    /// An absolute path in the box.
    pub target: String,
    /// Bound read-only.
    #[serde(default)]
    pub read_only: bool,
}

impl Spec {
    /// A spec with only a lifetime.
    pub fn new(max_lifetime: Duration) -> Self {
        Spec {
            max_lifetime,
            ..Default::default()
        }
    }

    /// Add a label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Add an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Check the spec's own shape, whatever the provider: a positive lifetime, labels outside
    /// the providers' namespace, well-formed names, network entries, ports and mounts.
    /// Fails `invalid`, naming the field.
    pub fn validate(&self) -> Result<()> {
        if self.max_lifetime.is_zero() {
            return Err(Error::invalid("spec.max_lifetime: must be positive"));
        }
        if self.max_lifetime > MAX_LIFETIME {
            return Err(Error::invalid(format!(
                "spec.max_lifetime: {}s is more than the 30 days a box may live",
                self.max_lifetime.as_secs()
            )));
        }
        validate_labels(&self.labels)?;
        for (k, v) in &self.env {
            validate_env(k, v).map_err(|e| e.context("spec.env"))?;
        }
        crate::secret::validate_secrets(&self.secrets, &self.env)?;
        if let Some(c) = self.cpus
            && !(c.is_finite() && (0.01..=1024.0).contains(&c))
        {
            return Err(Error::invalid(format!("spec.cpus: {c} is not between 0.01 and 1024")));
        }
        if self.memory_mb == Some(0) {
            return Err(Error::invalid("spec.memory_mb: must be positive"));
        }
        for (field, value) in [
            ("image", &self.image),
            ("snapshot", &self.snapshot),
            ("gpu", &self.gpu),
            ("region", &self.region),
            ("isolation", &self.isolation),
            ("workspace", &self.workspace),
        ] {
            if let Some(v) = value
                && (v.is_empty() || v.len() > 1024 || v.chars().any(char::is_control))
            {
                return Err(Error::invalid(format!(
                    "spec.{field}: must be 1 to 1024 characters with no control characters"
                )));
            }
        }
        if let Some(Network::Allow(list)) = &self.network {
            crate::allow::Allowlist::parse(list)?;
        }
        let mut seen = std::collections::BTreeSet::new();
        for p in &self.ports {
            if p.port == 0 {
                return Err(Error::invalid("spec.ports: port 0 is not a port"));
            }
            if !seen.insert(p.port) {
                return Err(Error::invalid(format!("spec.ports: port {} is named twice", p.port)));
            }
        }
        if !self.ports.is_empty() && self.network == Some(Network::None) {
            return Err(Error::invalid(
                "spec.ports: a box with network none cannot expose ports",
            ));
        }
        for c in &self.capabilities {
            if c.is_empty()
                || !c
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'_' || b.is_ascii_digit())
            {
                return Err(Error::invalid(format!(
                    "spec.capabilities: {c:?} is not a capability name"
                )));
            }
        }
        if self.mounts.len() > MAX_MOUNTS {
            return Err(Error::invalid(format!(
                "spec.mounts: {} mounts, at most {MAX_MOUNTS}",
                self.mounts.len()
            )));
        }
        let mut targets = std::collections::BTreeSet::new();
        for m in &self.mounts {
            for (field, p) in [("source", &m.source), ("target", &m.target)] {
                if !is_normal_absolute(p) {
                    return Err(Error::invalid(format!(
                        "spec.mounts.{field}: {p:?} is not an absolute path in normal form"
                    )));
                }
            }
            if !targets.insert(m.target.as_str()) {
                return Err(Error::invalid(format!(
                    "spec.mounts.target: {:?} is bound twice",
                    m.target
                )));
            }
        }
        Ok(())
    }
}

/// Check labels: keys 1 to 128 bytes of `[A-Za-z0-9._/-]`, values at most 256 bytes with no
/// control characters, and no key in the providers' namespace (`agentbox`, `agentbox.*`).
pub fn validate_labels(labels: &Labels) -> Result<()> {
    for (k, v) in labels {
        if k.is_empty()
            || k.len() > 128
            || !k
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'/' | b'-'))
        {
            return Err(Error::invalid(format!(
                "spec.labels: key {k:?} must be 1 to 128 characters of letters, digits and . _ / -"
            )));
        }
        if is_reserved_label(k) {
            return Err(Error::invalid(format!(
                "spec.labels: key {k:?} is in the providers' namespace ({RESERVED_LABEL_PREFIX})"
            )));
        }
        if v.len() > 256 || v.chars().any(char::is_control) {
            return Err(Error::invalid(format!(
                "spec.labels: the value of {k:?} must be at most 256 bytes with no control characters"
            )));
        }
    }
    Ok(())
}

/// Whether a label key belongs to providers.
pub fn is_reserved_label(key: &str) -> bool {
    key == RESERVED_LABEL_PREFIX
        || key
            .strip_prefix(RESERVED_LABEL_PREFIX)
            .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('/'))
}

/// Check one environment variable: a name of `[A-Za-z_][A-Za-z0-9_]*` and a value with no NUL.
pub fn validate_env(name: &str, value: &str) -> Result<()> {
    let mut bytes = name.bytes();
    let ok = matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 256;
    if !ok {
        return Err(Error::invalid(format!(
            "{name:?} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"
        )));
    }
    if value.contains('\0') {
        return Err(Error::invalid(format!("the value of {name} holds a NUL byte")));
    }
    if value.len() > 128 * 1024 {
        return Err(Error::invalid(format!("the value of {name} is over 128 KiB")));
    }
    Ok(())
}

/// Whether `p` is absolute with no `.`, `..` or empty segment and no NUL.
pub fn is_normal_absolute(p: &str) -> bool {
    if p == "/" {
        return true;
    }
    match p.strip_prefix('/') {
        Some(rest) => {
            !p.contains('\0') && p.len() <= 4095 && rest.split('/').all(|s| !s.is_empty() && s != "." && s != "..")
        }
        None => false,
    }
}

/// What a provider can honour. [`check_spec`] refuses everything else.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Honours {
    /// `image` is honoured.
    pub image: bool,
    /// A spec's `snapshot` is honoured (boxes made from a snapshot).
    pub snapshot: bool,
    /// `cpus` is honoured.
    pub cpus: bool,
    /// `memory_mb` is honoured.
    pub memory: bool,
    /// `gpu` is honoured.
    pub gpu: bool,
    /// `region` is honoured.
    pub region: bool,
    /// The isolations taken; the first is the default.
    pub isolation: Vec<String>,
    /// `network: none` is honoured.
    pub network_none: bool,
    /// `network: allow` is honoured.
    pub network_allowlist: bool,
    /// `network: host` (this machine's network, shared) is honoured.
    #[serde(default)]
    pub network_host: bool,
    /// `ports` are honoured.
    pub ports: bool,
    /// The capabilities taken.
    pub capabilities: Vec<String>,
    /// Bind `mounts` are honoured.
    pub mounts: bool,
    /// `workspace` is honoured (as an absolute path in the box).
    pub workspace: bool,
    /// A spec's `env` is honoured (false for a box that carries no environment).
    pub env: bool,
    /// Programs keep running between calls and take stdin.
    pub live_processes: bool,
    /// `Lifecycle::open` and `discard`: boxes by name.
    #[serde(default)]
    pub names: bool,
    /// `Lifecycle::sleep` and `wake`.
    #[serde(default)]
    pub sleep: bool,
    /// `Lifecycle::extend`: a deadline moved after the make.
    #[serde(default)]
    pub extend: bool,
    /// `Lifecycle::relabel`: labels changed after the make.
    #[serde(default)]
    pub relabel: bool,
    /// `Lifecycle::snapshot`, `snapshots` and `delete_snapshot`: a box's files taken under a
    /// name (which a spec's `snapshot` then starts from, see `snapshot` above).
    #[serde(default)]
    pub snapshots: bool,
    /// `Lifecycle::fork`.
    #[serde(default)]
    pub fork: bool,
    /// A spec's `secrets` are honoured: the box's network passes through agentbox's egress
    /// proxy, which keeps each value outside the box.
    #[serde(default)]
    pub secrets: bool,
}

/// Refuse what `honours` cannot give, naming the field, after [`Spec::validate`].
///
/// ```
/// use std::time::Duration;
/// use agentbox_core::{check_spec, ErrorCode, Honours, Spec};
/// let honours = Honours { isolation: vec!["none".into()], env: true, ..Default::default() };
/// let mut spec = Spec::new(Duration::from_secs(60));
/// spec.image = Some("debian".into());
/// let err = check_spec(&spec, &honours, "local").unwrap_err();
/// assert_eq!(err.code(), ErrorCode::Unsupported);
/// assert!(err.message().contains("spec.image"));
/// ```
pub fn check_spec(spec: &Spec, honours: &Honours, provider: &str) -> Result<()> {
    spec.validate()?;
    let refuse = |field: &str, why: &str| Err(Error::unsupported(format!("spec.{field}: {provider} boxes {why}")));
    if spec.image.is_some() && !honours.image {
        return refuse("image", "take no image");
    }
    if spec.snapshot.is_some() && !honours.snapshot {
        return refuse("snapshot", "cannot start from a snapshot");
    }
    if spec.cpus.is_some() && !honours.cpus {
        return refuse("cpus", "cannot set a CPU count");
    }
    if spec.memory_mb.is_some() && !honours.memory {
        return refuse("memory_mb", "cannot set memory");
    }
    if spec.gpu.is_some() && !honours.gpu {
        return refuse("gpu", "have no GPU");
    }
    if spec.region.is_some() && !honours.region {
        return refuse("region", "cannot choose a region");
    }
    if let Some(iso) = &spec.isolation
        && !honours.isolation.iter().any(|i| i == iso)
    {
        return Err(Error::unsupported(format!(
            "spec.isolation: {provider} boxes take {} and not {iso:?}",
            honours.isolation.join(" or ")
        )));
    }
    match &spec.network {
        Some(Network::None) if !honours.network_none => return refuse("network", "cannot block the network"),
        Some(Network::Allow(_)) if !honours.network_allowlist => {
            return refuse("network", "cannot restrict the network to an allowlist");
        }
        Some(Network::Host) if !honours.network_host => {
            return refuse("network", "cannot share this machine's network (host)");
        }
        _ => {}
    }
    if !spec.ports.is_empty() && !honours.ports {
        return refuse("ports", "cannot expose ports");
    }
    for c in &spec.capabilities {
        if !honours.capabilities.contains(c) {
            return Err(Error::unsupported(format!(
                "spec.capabilities: {provider} boxes cannot give {c:?}"
            )));
        }
    }
    if !spec.mounts.is_empty() && !honours.mounts {
        return refuse("mounts", "cannot bind this machine's directories");
    }
    if spec.workspace.is_some() && !honours.workspace {
        return refuse("workspace", "cannot place the workspace");
    }
    if !spec.env.is_empty() && !honours.env {
        return refuse("env", "carry no environment");
    }
    if !spec.secrets.is_empty() && !honours.secrets {
        return refuse(
            "secrets",
            "have no network of agentbox's egress proxy, which is what keeps a secret's value outside \
             a box (namespace and Docker boxes of this machine have one)",
        );
    }
    Ok(())
}

/// Parse a duration as people write it: `90s`, `10m`, `6h`, `2d`, `500ms`, or a bare number
/// of seconds. Refuses zero-length units, overflow and unknown suffixes with `invalid`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(agentbox_core::parse_duration("10m").unwrap(), Duration::from_secs(600));
/// assert!(agentbox_core::parse_duration("10 parsecs").is_err());
/// ```
pub fn parse_duration(s: &str) -> Result<Duration> {
    let s = s.trim();
    let bad = || Error::invalid(format!("{s:?} is not a duration (use 500ms, 90s, 10m, 6h or 2d)"));
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() || num.len() > 12 {
        return Err(bad());
    }
    let n: u64 = num.parse().map_err(|_| bad())?;
    let ms = match unit {
        "ms" => Some(n),
        "" | "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        _ => None,
    }
    .ok_or_else(bad)?;
    Ok(Duration::from_millis(ms))
}

mod duration_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis().min(u64::MAX as u128) as u64)
    }
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        Spec::new(Duration::from_secs(60))
    }

    #[test]
    fn a_zero_lifetime_is_invalid() {
        let e = Spec::new(Duration::ZERO).validate().unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::Invalid);
        assert!(e.message().contains("max_lifetime"));
    }

    #[test]
    fn labels_in_the_providers_namespace_are_refused() {
        for key in ["agentbox", "agentbox.provider", "agentbox/x"] {
            let e = spec().label(key, "1").validate().unwrap_err();
            assert!(e.message().contains("providers' namespace"), "{key}: {e}");
        }
        assert!(spec().label("agentboxes", "1").validate().is_ok());
        assert!(spec().label("bad key", "1").validate().is_err());
    }

    #[test]
    fn env_names_are_checked() {
        assert!(spec().env("A_1", "x").validate().is_ok());
        assert!(spec().env("1A", "x").validate().is_err());
        assert!(spec().env("A=B", "x").validate().is_err());
        assert!(spec().env("A", "x\0y").validate().is_err());
    }

    #[test]
    fn network_allowlist_entries_are_checked() {
        let with = |l: &[&str]| {
            let mut s = spec();
            s.network = Some(Network::Allow(l.iter().map(|s| s.to_string()).collect()));
            s.validate()
        };
        assert!(with(&["api.example.com", "*.example.com", "10.0.0.0/8"]).is_ok());
        for bad in ["", "exa mple.com", "10.0.0.0/33", "localhost", "-a.com", "300.0.0.0/8"] {
            assert!(with(&[bad]).is_err(), "{bad}");
        }
        assert!(with(&[]).is_err());
    }

    #[test]
    fn mounts_must_be_normal_absolute_paths() {
        let mut s = spec();
        s.mounts.push(Mount {
            source: "/data/../etc".into(),
            target: "/w".into(),
            read_only: false,
        });
        assert!(s.validate().unwrap_err().message().contains("mounts.source"));
        s.mounts[0].source = "/data".into();
        assert!(s.validate().is_ok());
        s.mounts[0].target = "rel".into();
        assert!(s.validate().is_err());
    }

    #[test]
    fn check_spec_names_each_unhonoured_field() {
        let h = Honours {
            isolation: vec!["none".into()],
            env: true,
            ..Default::default()
        };
        type Set = Box<dyn Fn(&mut Spec)>;
        let cases: Vec<(&str, Set)> = vec![
            ("image", Box::new(|s| s.image = Some("x".into()))),
            ("snapshot", Box::new(|s| s.snapshot = Some("x".into()))),
            ("cpus", Box::new(|s| s.cpus = Some(1.0))),
            ("memory_mb", Box::new(|s| s.memory_mb = Some(10))),
            ("gpu", Box::new(|s| s.gpu = Some("T4".into()))),
            ("region", Box::new(|s| s.region = Some("eu".into()))),
            ("isolation", Box::new(|s| s.isolation = Some("vm".into()))),
            ("network", Box::new(|s| s.network = Some(Network::None))),
            ("network", Box::new(|s| s.network = Some(Network::Host))),
            (
                "ports",
                Box::new(|s| {
                    s.ports.push(PortSpec {
                        port: 80,
                        kind: PortKind::Tcp,
                    })
                }),
            ),
            ("capabilities", Box::new(|s| s.capabilities.push("fuse".into()))),
            ("workspace", Box::new(|s| s.workspace = Some("/w".into()))),
        ];
        for (field, set) in cases {
            let mut s = spec();
            set(&mut s);
            let e = check_spec(&s, &h, "local").unwrap_err();
            assert_eq!(e.code(), crate::ErrorCode::Unsupported, "{field}");
            assert!(e.message().contains(&format!("spec.{field}")), "{field}: {e}");
        }
        let mut s = spec();
        s.isolation = Some("none".into());
        s.network = Some(Network::Open);
        assert!(check_spec(&s, &h, "local").is_ok());
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("6h").unwrap(), Duration::from_secs(6 * 3600));
        for bad in ["", "h", "1x", "-1s", "99999999999999999d", "1.5h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn specs_round_trip_through_json_and_refuse_unknown_fields() {
        let s = spec().label("a", "b").env("X", "1");
        let j = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Spec>(&j).unwrap(), s);
        assert!(serde_json::from_str::<Spec>(r#"{"max_lifetime_ms":1,"imagee":"x"}"#).is_err());
    }
}

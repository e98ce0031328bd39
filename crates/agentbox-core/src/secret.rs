//! Secrets a box uses without holding them.
//!
//! A spec's `secrets` name a credential, the hosts it may be sent to, and where its value is on
//! the machine that makes the box (an environment variable or a file: never the spec's own
//! text, which is stored and echoed). The box gets a random placeholder in the variable; the
//! egress proxy of this machine puts the value into the requests bound for the named hosts. This
//! module is the spec's side: the shape, its checks, and reading a value where it lives.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::allow::{AllowEntry, AllowTarget};
use crate::error::{Error, Result};

/// At most this many secrets in one spec.
pub const MAX_SECRETS: usize = 16;
/// At most this many hosts for one secret.
pub const MAX_SECRET_HOSTS: usize = 16;
/// The longest value a secret may have (a header's worth, with room for a key file).
pub const MAX_SECRET_BYTES: usize = 16 << 10;

/// One secret of a spec: the variable the box sees (holding a placeholder), where the value is
/// on this machine, and the hosts it may be sent to.
///
/// ```
/// use agentbox_core::SecretSpec;
/// let s = SecretSpec::parse_flag("GITHUB_TOKEN=env:GH_TOKEN@api.github.com,uploads.github.com").unwrap();
/// assert_eq!(s.name, "GITHUB_TOKEN");
/// assert_eq!(s.from, "env:GH_TOKEN");
/// assert_eq!(s.hosts, ["api.github.com", "uploads.github.com"]);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SecretSpec {
    /// The variable the box's programs find the placeholder in.
    pub name: String,
    /// Where the value is on the machine that makes the box: `env:VARIABLE` or `file:/path`.
    pub from: String,
    /// The hosts the value may be sent to, in the allowlist's syntax (`api.example.com`,
    /// `*.example.com`, each with an optional port): names only, never an address.
    pub hosts: Vec<String>,
}

/// Where a secret's value is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretSource {
    /// An environment variable of the process that makes the box.
    Env(String),
    /// A file of the machine that makes the box (one trailing newline is not part of it).
    File(PathBuf),
}

/// A secret's value: kept out of `Debug` and `Display`, so no log or error can print it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    /// Check a value read elsewhere as [`SecretSpec::read_value`] checks one: 1 to
    /// [`MAX_SECRET_BYTES`] bytes with no control character. The error never holds it.
    pub fn new(value: String) -> Result<SecretValue> {
        if value.is_empty() {
            return Err(Error::invalid("the value is empty"));
        }
        if value.len() > MAX_SECRET_BYTES {
            return Err(Error::invalid(format!("the value is over {MAX_SECRET_BYTES} bytes")));
        }
        if !value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(Error::invalid(
                "the value holds a character a request's header cannot carry (a newline, a control \
                 character or one outside ASCII)",
            ));
        }
        Ok(SecretValue(value))
    }

    /// Check a value for a program's descriptor ([`FdSecret`]): 1 to [`MAX_SECRET_BYTES`] bytes
    /// with no NUL. Newlines are kept: a key file is many lines.
    pub fn for_descriptor(value: String) -> Result<SecretValue> {
        if value.is_empty() {
            return Err(Error::invalid("the value is empty"));
        }
        if value.len() > MAX_SECRET_BYTES {
            return Err(Error::invalid(format!("the value is over {MAX_SECRET_BYTES} bytes")));
        }
        if value.contains('\0') {
            return Err(Error::invalid("the value holds a NUL byte"));
        }
        Ok(SecretValue(value))
    }

    /// The value, for the one place it is meant for.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(<not shown>)")
    }
}

impl SecretSpec {
    /// Parse the CLI's `NAME=env:VARIABLE@host[,host...]` (or `NAME=file:/path@host`): the last
    /// `@` ends the source, so a file's path may hold one. Checked as a spec's entry would be.
    pub fn parse_flag(flag: &str) -> Result<SecretSpec> {
        let bad = |why: &str| {
            Error::invalid(format!(
                "--secret {flag:?}: {why}; give NAME=env:VARIABLE@host or NAME=file:/path@host (hosts comma-separated)"
            ))
        };
        let (name, rest) = flag.split_once('=').ok_or_else(|| bad("no ="))?;
        let (from, hosts) = rest.rsplit_once('@').ok_or_else(|| bad("no @host"))?;
        let s = SecretSpec {
            name: name.to_string(),
            from: from.to_string(),
            hosts: hosts.split(',').map(str::to_string).collect(),
        };
        s.validate(0).map_err(|e| bad(e.message()))?;
        Ok(s)
    }

    /// Check the entry's shape; `i` is its index, for the field named in an error.
    pub fn validate(&self, i: usize) -> Result<()> {
        let field = |f: &str| format!("spec.secrets[{i}].{f}");
        crate::spec::validate_env(&self.name, "")
            .map_err(|e| Error::invalid(format!("{}: {}", field("name"), e.message())))?;
        self.source()
            .map_err(|e| Error::invalid(format!("{}: {}", field("from"), e.message())))?;
        if self.hosts.is_empty() || self.hosts.len() > MAX_SECRET_HOSTS {
            return Err(Error::invalid(format!(
                "{}: 1 to {MAX_SECRET_HOSTS} hosts, not {}",
                field("hosts"),
                self.hosts.len()
            )));
        }
        for h in &self.hosts {
            let entry = AllowEntry::parse(h).map_err(|e| {
                let why = e.message().strip_prefix("spec.network.allow: ").unwrap_or(e.message());
                Error::invalid(format!("{}: {why}", field("hosts")))
            })?;
            if !matches!(entry.target, AllowTarget::Domain(_) | AllowTarget::Below(_)) {
                return Err(Error::invalid(format!(
                    "{}: {h:?} is not a name: a secret is sent only to hosts named (api.example.com, \
                     *.example.com), whose certificate the proxy checks",
                    field("hosts")
                )));
            }
        }
        Ok(())
    }

    /// The parsed hosts.
    pub fn host_entries(&self) -> Result<Vec<AllowEntry>> {
        self.hosts.iter().map(|h| AllowEntry::parse(h)).collect()
    }

    /// Where the value is: `env:VARIABLE` or `file:/absolute/path`.
    pub fn source(&self) -> Result<SecretSource> {
        if let Some(var) = self.from.strip_prefix("env:") {
            crate::spec::validate_env(var, "")?;
            return Ok(SecretSource::Env(var.to_string()));
        }
        if let Some(path) = self.from.strip_prefix("file:") {
            if !crate::spec::is_normal_absolute(path) || path == "/" {
                return Err(Error::invalid(format!(
                    "{path:?} is not an absolute path in normal form"
                )));
            }
            return Ok(SecretSource::File(PathBuf::from(path)));
        }
        Err(Error::invalid(format!(
            "{:?} names no source: give env:VARIABLE or file:/path (a value is never written in a spec)",
            self.from
        )))
    }

    /// Read the value where it is, on this machine, for a request's header: 1 to
    /// [`MAX_SECRET_BYTES`] bytes of visible ASCII (one trailing newline of a file is not part
    /// of it). An error names the secret and its source, never a byte of the value.
    pub fn read_value(&self) -> Result<SecretValue> {
        let raw = self.read_raw()?;
        let value = raw
            .strip_suffix("\r\n")
            .or_else(|| raw.strip_suffix('\n'))
            .unwrap_or(&raw);
        SecretValue::new(value.to_string()).map_err(|e| self.named(e.message().to_string()))
    }

    /// Read the value where it is, for one program's descriptor ([`FdSecret`]): exactly as it
    /// is (a key file's newlines are part of it), 1 to [`MAX_SECRET_BYTES`] bytes, no NUL.
    pub fn read_for_descriptor(&self) -> Result<SecretValue> {
        SecretValue::for_descriptor(self.read_raw()?).map_err(|e| self.named(e.message().to_string()))
    }

    /// The error for this secret: its name and source, and why.
    fn named(&self, why: String) -> Error {
        Error::invalid(format!("secret {} ({}): {why}", self.name, self.from))
    }

    /// The value exactly as it is where it lives (at most a little past [`MAX_SECRET_BYTES`],
    /// so an oversized one is told apart), UTF-8.
    fn read_raw(&self) -> Result<String> {
        match self.source()? {
            SecretSource::Env(var) => match std::env::var_os(&var) {
                Some(v) => v
                    .into_string()
                    .map_err(|_| self.named("the variable is not UTF-8".into())),
                None => {
                    Err(self.named("the variable is not set in the environment of the process making the box".into()))
                }
            },
            SecretSource::File(path) => {
                use std::io::Read;
                let f = std::fs::File::open(&path).map_err(|e| self.named(format!("opening it: {e}")))?;
                let mut bytes = Vec::new();
                f.take(MAX_SECRET_BYTES as u64 + 3)
                    .read_to_end(&mut bytes)
                    .map_err(|e| self.named(format!("reading it: {e}")))?;
                String::from_utf8(bytes).map_err(|_| self.named("the file is not UTF-8".into()))
            }
        }
    }
}

/// One secret handed to one program on an inherited pipe: its descriptor (3) is named in the
/// program's `AGENTBOX_SECRET_FD`, the secret's name in `AGENTBOX_SECRET_NAME`; the value is
/// never in its argv, its environment or a file. Only boxes whose programs agentbox's runner
/// starts take it (`exec --secret-fd`); every other refuses it as `unsupported`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FdSecret {
    /// The secret's name (a variable's shape).
    pub name: String,
    /// Its value.
    pub value: SecretValue,
}

/// The descriptor a program finds its [`FdSecret`] on.
pub const SECRET_FD: i32 = 3;

impl FdSecret {
    /// Read `--secret-fd NAME` (the value in this process's variable NAME) or
    /// `NAME=env:VARIABLE` / `NAME=file:/path`, where it is.
    ///
    /// ```
    /// use agentbox_core::FdSecret;
    /// let e = FdSecret::from_flag("KEY=file:/no/such/file").unwrap_err();
    /// assert!(e.message().contains("secret KEY"));
    /// ```
    pub fn from_flag(flag: &str) -> Result<FdSecret> {
        let (name, from) = match flag.split_once('=') {
            Some((n, f)) => (n.to_string(), f.to_string()),
            None => (flag.to_string(), format!("env:{flag}")),
        };
        let spec = SecretSpec {
            name: name.clone(),
            from,
            hosts: vec!["secret-fd.invalid".into()],
        };
        spec.validate(0).map_err(|e| {
            Error::invalid(format!(
                "--secret-fd {flag:?}: {}",
                e.message().replace("spec.secrets[0].", "")
            ))
        })?;
        Ok(FdSecret {
            value: spec.read_for_descriptor()?,
            name,
        })
    }
}

/// Check a spec's secrets: at most [`MAX_SECRETS`], each well-formed, names distinct and not
/// set in `env` too.
pub(crate) fn validate_secrets(secrets: &[SecretSpec], env: &std::collections::BTreeMap<String, String>) -> Result<()> {
    if secrets.len() > MAX_SECRETS {
        return Err(Error::invalid(format!(
            "spec.secrets: {} secrets, at most {MAX_SECRETS}",
            secrets.len()
        )));
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, s) in secrets.iter().enumerate() {
        s.validate(i)?;
        if !names.insert(s.name.as_str()) {
            return Err(Error::invalid(format!(
                "spec.secrets[{i}].name: {} is named twice",
                s.name
            )));
        }
        if env.contains_key(&s.name) {
            return Err(Error::invalid(format!(
                "spec.secrets[{i}].name: {} is set in spec.env too; the box's {} holds the secret's placeholder",
                s.name, s.name
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, from: &str, hosts: &[&str]) -> SecretSpec {
        SecretSpec {
            name: name.into(),
            from: from.into(),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
        }
    }

    #[test]
    fn flags_and_entries_are_checked_naming_the_field() {
        let s = SecretSpec::parse_flag("KEY=file:/etc/a@b/key@*.example.com:443").unwrap();
        assert_eq!(s.source().unwrap(), SecretSource::File("/etc/a@b/key".into()));
        assert_eq!(s.hosts, ["*.example.com:443"]);
        for (flag, word) in [
            ("KEY", "no ="),
            ("KEY=env:X", "no @host"),
            ("1KEY=env:X@a.com", "spec.secrets[0].name"),
            ("KEY=X@a.com", "names no source"),
            ("KEY=file:rel/path@a.com", "absolute"),
            ("KEY=env:X@10.0.0.1", "not a name"),
            ("KEY=env:X@*", "not a name"),
            ("KEY=env:X@a b", "spec.secrets[0].hosts"),
        ] {
            let e = SecretSpec::parse_flag(flag).unwrap_err();
            assert!(e.message().contains(word), "{flag}: {e}");
        }
        let env = std::collections::BTreeMap::from([("B".to_string(), "x".to_string())]);
        let two = [spec("A", "env:X", &["a.com"]), spec("A", "env:Y", &["b.com"])];
        assert!(
            validate_secrets(&two, &env)
                .unwrap_err()
                .message()
                .contains("named twice")
        );
        let clash = [spec("B", "env:X", &["a.com"])];
        assert!(
            validate_secrets(&clash, &env)
                .unwrap_err()
                .message()
                .contains("spec.env too")
        );
        let many: Vec<_> = (0..17).map(|i| spec(&format!("S{i}"), "env:X", &["a.com"])).collect();
        assert!(
            validate_secrets(&many, &env)
                .unwrap_err()
                .message()
                .contains("at most 16")
        );
    }

    #[test]
    fn values_are_read_where_they_are_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cr3t-value\n").unwrap();
        let s = spec("TOKEN", &format!("file:{}", path.display()), &["a.com"]);
        let v = s.read_value().unwrap();
        assert_eq!(v.expose(), "s3cr3t-value");
        assert!(!format!("{v:?}").contains("s3cr3t"));
        for (text, word) in [
            ("", "empty"),
            ("a\nb", "cannot carry"),
            ("\u{1}", "cannot carry"),
            ("é", "cannot carry"),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = s.read_value().unwrap_err();
            assert!(e.message().contains(word), "{text:?}: {e}");
            assert!(e.message().contains("TOKEN"), "{e}");
        }
        // For a descriptor the value is kept exactly, newlines and all (a key file).
        let key = "-----BEGIN KEY-----\nAAAA\n-----END KEY-----\n";
        std::fs::write(&path, key).unwrap();
        let fd = FdSecret::from_flag(&format!("K=file:{}", path.display())).unwrap();
        assert_eq!(fd.value.expose(), key);
        assert!(s.read_value().is_err(), "a many-line value is no header's");
        std::fs::write(&path, "x".repeat(MAX_SECRET_BYTES + 1)).unwrap();
        assert!(s.read_value().unwrap_err().message().contains("over"));
        // A variable of this process's (PATH: every test process has one).
        let path = std::env::var("PATH").unwrap();
        assert_eq!(spec("P", "env:PATH", &["a.com"]).read_value().unwrap().expose(), path);
        assert_eq!(FdSecret::from_flag("PATH").unwrap().value.expose(), path);
        assert_eq!(FdSecret::from_flag("P=env:PATH").unwrap().name, "P");
        let missing = spec("TOKEN", "env:AGENTBOX_TEST_NO_SUCH_VARIABLE", &["a.com"]);
        let e = missing.read_value().unwrap_err();
        assert!(e.message().contains("not set"), "{e}");
    }
}

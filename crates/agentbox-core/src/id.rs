//! Box ids that carry their provider: `local:3f9a…`, `docker:a1b2…`.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A box's id: `<provider>:<the provider's own id>`.
///
/// One CLI and one session document can name boxes of any provider, and a provider refuses
/// an id that is not its own.
///
/// ```
/// use agentbox_core::SandboxId;
/// let id: SandboxId = "local:3f9a".parse().unwrap();
/// assert_eq!(id.provider(), "local");
/// assert_eq!(id.name(), "3f9a");
/// assert!("no-colon".parse::<SandboxId>().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxId(String);

impl SandboxId {
    /// Join a provider name and its own id.
    pub fn new(provider: &str, name: &str) -> Result<Self> {
        format!("{provider}:{name}").parse()
    }

    /// The provider part.
    pub fn provider(&self) -> &str {
        self.0.split_once(':').map(|(p, _)| p).unwrap_or_default()
    }

    /// The provider's own id.
    pub fn name(&self) -> &str {
        self.0.split_once(':').map(|(_, n)| n).unwrap_or_default()
    }

    /// The whole id.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `Ok` when the id is `provider`'s, else `invalid` naming both.
    pub fn expect_provider(&self, provider: &str) -> Result<()> {
        if self.provider() == provider {
            Ok(())
        } else {
            Err(Error::invalid(format!("box id {self}: not a {provider} box")))
        }
    }
}

impl std::str::FromStr for SandboxId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |why: &str| Error::invalid(format!("box id {s:?}: {why}"));
        let (provider, name) = s.split_once(':').ok_or_else(|| bad("must be <provider>:<id>"))?;
        if provider.is_empty()
            || provider.len() > 32
            || !provider
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(bad("the provider must be 1 to 32 of a-z, 0-9 and -"));
        }
        if name.is_empty()
            || name.starts_with('.')
            || name.len() > 256
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
        {
            return Err(bad(
                "the id must be 1 to 256 of letters, digits and - _ . : not starting with .",
            ));
        }
        Ok(SandboxId(s.to_string()))
    }
}

impl TryFrom<String> for SandboxId {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<SandboxId> for String {
    fn from(id: SandboxId) -> String {
        id.0
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        for bad in [
            "",
            ":x",
            "local:",
            "Local:x",
            "local:a b",
            "local:../x",
            "local:..",
            "local:.x",
            "x:y/z",
        ] {
            assert!(bad.parse::<SandboxId>().is_err(), "{bad}");
        }
        let id: SandboxId = "docker:abc:def".parse().unwrap();
        assert_eq!(id.provider(), "docker");
        assert_eq!(id.name(), "abc:def");
        assert!(id.expect_provider("local").is_err());
    }
}

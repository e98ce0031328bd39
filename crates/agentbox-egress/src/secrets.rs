//! The secrets one proxy holds for its box: each a placeholder the box knows, the value it
//! stands for, and the hosts it may be sent to; and the checks a request passes before it
//! leaves.
//!
//! A placeholder is replaced by its value only in the headers of a request the proxy itself
//! decrypted on its way to one of the secret's hosts (Authorization, custom headers, and the
//! password of basic auth, which is base64 in its header). A placeholder of any secret in a
//! request to another host, in its URL or a header, is an attempted leak: the request is
//! refused and the refusal recorded.

use std::fmt;

use agentbox_core::AllowEntry;
use base64::Engine;
use serde::{Deserialize, Serialize};

/// One secret as the host hands it to the proxy (on its stdin, never argv or a file).
#[derive(Clone, Serialize, Deserialize)]
pub struct SecretRule {
    /// The variable's name in the box (for records: never the value).
    pub name: String,
    /// What the box's variable holds.
    pub placeholder: String,
    /// Where the value may go, in the allowlist's syntax.
    pub hosts: Vec<String>,
    /// The value.
    pub value: String,
}

impl fmt::Debug for SecretRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretRule")
            .field("name", &self.name)
            .field("placeholder", &self.placeholder)
            .field("hosts", &self.hosts)
            .field("value", &"<not shown>")
            .finish()
    }
}

/// Every secret of one box: the one line its proxy reads on stdin before it listens.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SecretPlan {
    /// The secrets.
    pub secrets: Vec<SecretRule>,
}

/// The shortest placeholder taken: one shorter could be guessed, or be found by chance in a
/// request that holds no secret.
const MIN_PLACEHOLDER: usize = 24;

/// A placeholder of a secret found where it may not go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leak {
    /// The secret's name.
    pub secret: String,
    /// Where in the request: `the URL`, `header x-api-key`...
    pub place: String,
    /// The hosts it may go to.
    pub hosts: Vec<String>,
}

impl Leak {
    /// The rule a refusal for it records.
    pub fn rule(&self) -> String {
        format!("attempted leak of secret {}", self.secret)
    }

    /// Why, for the refusal's record and the client's 403.
    pub fn why(&self, host: &str) -> String {
        format!(
            "the placeholder of secret {} in {} of a request to {host}: it may be sent only to {}",
            self.secret,
            self.place,
            self.hosts.join(", ")
        )
    }
}

struct Rule {
    name: String,
    placeholder: String,
    hosts: Vec<AllowEntry>,
    host_text: Vec<String>,
    value: String,
}

/// A box's secrets, checked.
pub struct Secrets {
    rules: Vec<Rule>,
}

impl Secrets {
    /// Check a plan: every placeholder long enough and of `[A-Za-z0-9_-]`, distinct, and not a
    /// part of another; every host a name entry; every value fit for a header.
    pub fn new(plan: SecretPlan) -> Result<Secrets, String> {
        let mut rules = Vec::with_capacity(plan.secrets.len());
        for s in plan.secrets {
            let p = &s.placeholder;
            if p.len() < MIN_PLACEHOLDER || !p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
                return Err(format!(
                    "secret {}: its placeholder must be {MIN_PLACEHOLDER} or more of [A-Za-z0-9_-]",
                    s.name
                ));
            }
            if s.value.is_empty() || s.value.chars().any(char::is_control) {
                return Err(format!(
                    "secret {}: its value is empty or holds a control character",
                    s.name
                ));
            }
            let hosts = s
                .hosts
                .iter()
                .map(|h| AllowEntry::parse(h).map_err(|e| format!("secret {}: {}", s.name, e.message())))
                .collect::<Result<Vec<_>, _>>()?;
            if hosts.is_empty() {
                return Err(format!("secret {}: no host", s.name));
            }
            rules.push(Rule {
                name: s.name,
                placeholder: s.placeholder,
                hosts,
                host_text: s.hosts,
                value: s.value,
            });
        }
        for (i, a) in rules.iter().enumerate() {
            for b in &rules[i + 1..] {
                if a.placeholder.contains(&b.placeholder) || b.placeholder.contains(&a.placeholder) {
                    return Err(format!(
                        "secrets {} and {}: one placeholder holds the other",
                        a.name, b.name
                    ));
                }
            }
        }
        Ok(Secrets { rules })
    }

    /// No secret at all.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The secrets' names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.rules.iter().map(|r| r.name.as_str())
    }

    /// The hosts some secret names, for the proxy's authority's name constraints.
    pub(crate) fn host_entries(&self) -> impl Iterator<Item = &AllowEntry> {
        self.rules.iter().flat_map(|r| r.hosts.iter())
    }

    /// Whether some secret may be sent to `host` on `port`: its connections are decrypted.
    pub fn intercepts(&self, host: &str, port: u16) -> bool {
        self.rules.iter().any(|r| r.bound_to(host, port))
    }

    /// The first placeholder in `bytes` (a request head the proxy reads in the clear, bound
    /// nowhere a secret goes): where it is, as a [`Leak`].
    pub fn find_in(&self, bytes: &[u8], place: &str) -> Option<Leak> {
        let text = String::from_utf8_lossy(bytes);
        let decoded = basic_credentials(&text);
        self.rules.iter().find_map(|r| {
            (text.contains(&r.placeholder) || decoded.iter().any(|d| d.contains(&r.placeholder))).then(|| r.leak(place))
        })
    }

    /// Check one decrypted request to `host:port` and put each value in its headers: a
    /// placeholder of a secret bound elsewhere, anywhere in the request's URL or headers, is a
    /// [`Leak`] and nothing is changed. Answers how many placeholders were replaced.
    pub fn rewrite(&self, host: &str, port: u16, uri: &str, headers: &mut hyper::HeaderMap) -> Result<usize, Leak> {
        let (here, elsewhere): (Vec<&Rule>, Vec<&Rule>) = self.rules.iter().partition(|r| r.bound_to(host, port));
        for r in &self.rules {
            // The value goes in headers only: in a URL it would land in the server's logs.
            if uri.contains(&r.placeholder) {
                return Err(r.leak("the URL"));
            }
        }
        for (name, value) in headers.iter() {
            let text = String::from_utf8_lossy(value.as_bytes());
            let decoded = basic_credentials(&text);
            for r in &elsewhere {
                if text.contains(&r.placeholder) || decoded.iter().any(|d| d.contains(&r.placeholder)) {
                    return Err(r.leak(&format!("header {name}")));
                }
            }
        }
        let mut replaced = 0;
        for value in headers.values_mut() {
            let Ok(text) = value.to_str() else { continue };
            let mut new = text.to_string();
            let mut changed = false;
            for r in &here {
                if new.contains(&r.placeholder) {
                    new = new.replace(&r.placeholder, &r.value);
                    replaced += 1;
                    changed = true;
                }
            }
            if let Some(rewritten) = rewrite_basic(&new, &here) {
                new = rewritten;
                replaced += 1;
                changed = true;
            }
            if changed {
                let sensitive = hyper::header::HeaderValue::from_str(&new);
                if let Ok(mut v) = sensitive {
                    v.set_sensitive(true);
                    *value = v;
                }
            }
        }
        Ok(replaced)
    }
}

impl Rule {
    fn bound_to(&self, host: &str, port: u16) -> bool {
        self.hosts.iter().any(|h| h.allows_name(host, port))
    }

    fn leak(&self, place: &str) -> Leak {
        Leak {
            secret: self.name.clone(),
            place: place.to_string(),
            hosts: self.host_text.clone(),
        }
    }
}

/// The decoded `user:password` of each `Basic` credential in `text` (a header's value, or a
/// whole request head).
fn basic_credentials(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = find_ignore_case(rest, "basic ") {
        let after = rest[i + 6..].trim_start();
        let token: String = after
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '='))
            .collect();
        if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(token.as_bytes()) {
            out.push(String::from_utf8_lossy(&bytes).into_owned());
        }
        rest = &rest[i + 6..];
    }
    out
}

fn find_ignore_case(hay: &str, needle: &str) -> Option<usize> {
    hay.as_bytes()
        .windows(needle.len())
        .position(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// A header's `Basic` credential with each placeholder of `rules` in it replaced, re-encoded;
/// `None` when it holds none.
fn rewrite_basic(value: &str, rules: &[&Rule]) -> Option<String> {
    let (scheme, token) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(token.trim()).ok()?;
    let mut text = String::from_utf8(bytes).ok()?;
    let mut changed = false;
    for r in rules {
        if text.contains(&r.placeholder) {
            text = text.replace(&r.placeholder, &r.value);
            changed = true;
        }
    }
    changed.then(|| format!("{scheme} {}", base64::engine::general_purpose::STANDARD.encode(text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GH: &str = "agentbox-placeholder-0123456789abcdef0123456789abcdef";
    const DB: &str = "agentbox-placeholder-fedcba9876543210fedcba9876543210";

    fn secrets() -> Secrets {
        Secrets::new(SecretPlan {
            secrets: vec![
                SecretRule {
                    name: "GITHUB_TOKEN".into(),
                    placeholder: GH.into(),
                    hosts: vec!["api.github.com".into()],
                    value: "ghp_real".into(),
                },
                SecretRule {
                    name: "DB_PASSWORD".into(),
                    placeholder: DB.into(),
                    hosts: vec!["*.db.example:443".into()],
                    value: "hunter2".into(),
                },
            ],
        })
        .unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> hyper::HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (k.parse::<hyper::header::HeaderName>().unwrap(), v.parse().unwrap()))
            .collect()
    }

    #[test]
    fn values_go_into_the_headers_of_their_own_hosts_only() {
        let s = secrets();
        assert!(s.intercepts("api.github.com", 443));
        assert!(s.intercepts("eu.db.example", 443));
        assert!(!s.intercepts("eu.db.example", 8443));
        assert!(!s.intercepts("example.com", 443));
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{GH}"));
        let mut h = headers(&[
            ("authorization", &format!("Bearer {GH}")),
            ("x-custom", &format!("token={GH};again={GH}")),
            ("proxy-note", "nothing here"),
        ]);
        assert_eq!(s.rewrite("api.github.com", 443, "/user", &mut h), Ok(2));
        assert_eq!(h["authorization"], "Bearer ghp_real");
        assert_eq!(h["x-custom"], "token=ghp_real;again=ghp_real");
        assert!(h["authorization"].is_sensitive());
        let mut h = headers(&[("authorization", &format!("Basic {basic}"))]);
        assert_eq!(s.rewrite("API.github.com", 443, "/", &mut h), Ok(1));
        let sent = h["authorization"].to_str().unwrap().strip_prefix("Basic ").unwrap();
        let sent = base64::engine::general_purpose::STANDARD.decode(sent).unwrap();
        assert_eq!(sent, b"x-access-token:ghp_real");
    }

    #[test]
    fn a_placeholder_bound_elsewhere_is_a_leak_and_nothing_changes() {
        let s = secrets();
        let mut h = headers(&[("authorization", &format!("Bearer {GH}")), ("x-db", DB)]);
        let leak = s.rewrite("api.github.com", 443, "/", &mut h).unwrap_err();
        assert_eq!(
            (leak.secret.as_str(), leak.place.as_str()),
            ("DB_PASSWORD", "header x-db")
        );
        assert_eq!(
            h["authorization"],
            format!("Bearer {GH}").as_str(),
            "nothing was replaced"
        );
        assert!(leak.why("api.github.com").contains("*.db.example:443"));
        // In the URL, even to its own host: a value never goes into a URL.
        let leak = s
            .rewrite("api.github.com", 443, &format!("/x?t={GH}"), &mut headers(&[]))
            .unwrap_err();
        assert_eq!(leak.place, "the URL");
        // Hidden in basic auth.
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("u:{GH}"));
        let leak = s
            .rewrite(
                "evil.example",
                443,
                "/",
                &mut headers(&[("authorization", &format!("basic {basic}"))]),
            )
            .unwrap_err();
        assert_eq!(leak.secret, "GITHUB_TOKEN");
        // In a head read in the clear.
        let head = format!("GET http://a.test/ HTTP/1.1\r\nAuthorization: Basic {basic}\r\n\r\n");
        assert_eq!(
            s.find_in(head.as_bytes(), "a plain http request").unwrap().secret,
            "GITHUB_TOKEN"
        );
        assert!(s.find_in(b"GET http://a.test/ HTTP/1.1\r\n\r\n", "x").is_none());
    }

    #[test]
    fn plans_that_could_not_be_kept_are_refused() {
        let rule = |placeholder: &str, value: &str, host: &str| SecretRule {
            name: "S".into(),
            placeholder: placeholder.into(),
            hosts: vec![host.into()],
            value: value.into(),
        };
        for (r, word) in [
            (rule("short", "v", "a.com"), "placeholder"),
            (rule(&format!("{GH}!"), "v", "a.com"), "placeholder"),
            (rule(GH, "a\r\nb", "a.com"), "control"),
            (rule(GH, "", "a.com"), "empty"),
            (rule(GH, "v", "a b"), "not an entry"),
        ] {
            let e = Secrets::new(SecretPlan { secrets: vec![r] }).err().unwrap();
            assert!(e.contains(word), "{e}");
            assert!(!e.contains("a\r\nb"));
        }
        let twice = SecretPlan {
            secrets: vec![rule(GH, "v", "a.com"), rule(&format!("{GH}x"), "v", "a.com")],
        };
        assert!(Secrets::new(twice).err().unwrap().contains("holds the other"));
        let shown = format!("{:?}", rule(GH, "the-value", "a.com"));
        assert!(!shown.contains("the-value"), "{shown}");
    }
}

//! A network allowlist's entries (`network: { allow: [...] }`), parsed and matched.
//!
//! An entry is a domain (`api.example.com`), a wildcard (`*.example.com`: every name below
//! `example.com`, not that name itself), `*` (the public internet: every name, and every
//! address that is not this machine's, loopback, link-local or private, which only a CIDR
//! entry can allow), or an IPv4 or IPv6 address or CIDR (`10.0.0.0/8`,
//! `192.0.2.7`, `2001:db8::/32`), each with an optional port: `example.com:443`,
//! `10.0.0.0/8:5432`, and for IPv6 in brackets, `[2001:db8::/32]:443`. Names are matched
//! without regard to case or a trailing dot; an IPv4 address written as IPv6
//! (`::ffff:192.0.2.7`) is matched as the IPv4 address it is.
//!
//! Parsing and matching only: the egress proxy (`agentbox-egress`) enforces a list, and a
//! provider whose platform takes only some entries refuses the rest ([`Allowlist::refuse`]).
//!
//! ```
//! use agentbox_core::Allowlist;
//! let list = Allowlist::parse(&["*.example.com:443".into(), "10.0.0.0/8".into()]).unwrap();
//! assert!(list.name_rule("api.example.com", 443).is_some());
//! assert!(list.name_rule("api.example.com", 80).is_none());
//! assert!(list.addr_rule("10.1.2.3".parse().unwrap(), 22).is_some());
//! ```

use std::fmt;
use std::net::IpAddr;

use crate::error::{Error, Result};

/// What an entry allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllowTarget {
    /// One name, lowercase, without a trailing dot.
    Domain(String),
    /// Every name below this one (lowercase): `*.example.com` holds `example.com`.
    Below(String),
    /// `*`: every name and every public address. Unlike a CIDR, it never allows an address
    /// the egress proxy keeps out unless a CIDR lists it (loopback, private ranges, this
    /// machine's own): it is what a namespace box with no network policy gets.
    Public,
    /// The addresses of a network: `bits` leading bits of `addr` (the rest zero).
    Cidr {
        /// The network's first address.
        addr: IpAddr,
        /// Its prefix length.
        bits: u8,
    },
}

/// One entry of an allowlist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowEntry {
    /// What it allows.
    pub target: AllowTarget,
    /// The one port it allows, or every port.
    pub port: Option<u16>,
}

impl AllowEntry {
    /// Parse an entry; an error names it and says why it is none.
    ///
    /// ```
    /// use agentbox_core::{AllowEntry, AllowTarget};
    /// let e = AllowEntry::parse("[2001:db8::/32]:443").unwrap();
    /// assert_eq!(e.port, Some(443));
    /// assert!(matches!(e.target, AllowTarget::Cidr { bits: 32, .. }));
    /// assert!(AllowEntry::parse("localhost").is_err());
    /// ```
    pub fn parse(entry: &str) -> Result<AllowEntry> {
        let bad = |why: &str| {
            Error::invalid(format!(
                "spec.network.allow: {entry:?} is not an entry ({why}); give a domain, *.domain, * or a CIDR, \
                 each with an optional :PORT"
            ))
        };
        if entry.is_empty() || entry.len() > 300 {
            return Err(bad("1 to 300 characters"));
        }
        // `[v6 or v6/bits]` with an optional `:port`.
        if let Some(rest) = entry.strip_prefix('[') {
            let (inside, after) = rest.split_once(']').ok_or_else(|| bad("an unclosed ["))?;
            let port = match after {
                "" => None,
                p => Some(
                    port_of(p.strip_prefix(':').ok_or_else(|| bad("text after ]"))?)
                        .ok_or_else(|| bad("a bad port"))?,
                ),
            };
            let target = cidr(inside).filter(|t| {
                matches!(
                    t,
                    AllowTarget::Cidr {
                        addr: IpAddr::V6(_),
                        ..
                    }
                )
            });
            return Ok(AllowEntry {
                target: target.ok_or_else(|| bad("not an IPv6 address or CIDR"))?,
                port,
            });
        }
        // A bare IPv6 address or CIDR (no port: the colons are its own).
        if entry.matches(':').count() > 1 {
            return match cidr(entry) {
                Some(
                    t @ AllowTarget::Cidr {
                        addr: IpAddr::V6(_), ..
                    },
                ) => Ok(AllowEntry { target: t, port: None }),
                _ => Err(bad("not an IPv6 address or CIDR; a port after one goes as [ADDR]:PORT")),
            };
        }
        let (body, port) = match entry.rsplit_once(':') {
            Some((b, p)) => (b, Some(port_of(p).ok_or_else(|| bad("a bad port"))?)),
            None => (entry, None),
        };
        if body == "*" {
            return Ok(AllowEntry {
                target: AllowTarget::Public,
                port,
            });
        }
        if body.bytes().next().is_some_and(|b| b.is_ascii_digit()) && !body.contains(|c: char| c.is_ascii_alphabetic())
        {
            return match cidr(body) {
                Some(
                    t @ AllowTarget::Cidr {
                        addr: IpAddr::V4(_), ..
                    },
                ) => Ok(AllowEntry { target: t, port }),
                _ => Err(bad("not an IPv4 address or CIDR")),
            };
        }
        let (below, host) = match body.strip_prefix("*.") {
            Some(h) => (true, h),
            None => (false, body),
        };
        let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if host.len() > 253 || !host.contains('.') || !host.split('.').all(label_ok) {
            return Err(bad("not a domain of two or more labels"));
        }
        Ok(AllowEntry {
            target: if below {
                AllowTarget::Below(host)
            } else {
                AllowTarget::Domain(host)
            },
            port,
        })
    }

    /// Whether the entry allows the name `host` (any case, a trailing dot or none) on `port`.
    /// An address entry allows no name.
    pub fn allows_name(&self, host: &str, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        let host = host.strip_suffix('.').unwrap_or(host);
        match &self.target {
            AllowTarget::Domain(d) => host.eq_ignore_ascii_case(d),
            AllowTarget::Below(d) => {
                host.len() > d.len() + 1
                    && host.as_bytes()[host.len() - d.len() - 1] == b'.'
                    && host[host.len() - d.len()..].eq_ignore_ascii_case(d)
            }
            AllowTarget::Public => true,
            AllowTarget::Cidr { .. } => false,
        }
    }

    /// Whether the entry allows the address `ip` on `port`. A name entry allows no address.
    pub fn allows_addr(&self, ip: IpAddr, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match &self.target {
            AllowTarget::Cidr { addr, bits } => in_network(canonical(ip), *addr, *bits),
            _ => false,
        }
    }
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = match &self.target {
            AllowTarget::Domain(d) => d.clone(),
            AllowTarget::Below(d) => format!("*.{d}"),
            AllowTarget::Public => "*".into(),
            AllowTarget::Cidr { addr, bits } => format!("{addr}/{bits}"),
        };
        match (self.port, &self.target) {
            (None, _) => f.write_str(&target),
            (
                Some(p),
                AllowTarget::Cidr {
                    addr: IpAddr::V6(_), ..
                },
            ) => write!(f, "[{target}]:{p}"),
            (Some(p), _) => write!(f, "{target}:{p}"),
        }
    }
}

/// One connection an egress proxy refused ([`crate::Sandbox::net_refusals`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetRefusal {
    /// When, in ms since the epoch.
    pub at_ms: u64,
    /// The host asked for: a name, or an address.
    pub host: String,
    /// The port asked for.
    pub port: u16,
    /// The address the name resolved to, where the address was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// What refused it: `no entry`, or the never-allowed range the address is in.
    pub rule: String,
    /// Why, in words.
    pub why: String,
}

/// A whole allowlist: at least one entry, each parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowlist(Vec<AllowEntry>);

impl Allowlist {
    /// The most entries a list may hold.
    pub const MAX_ENTRIES: usize = 256;

    /// Parse a spec's list: empty, too long or with an entry that is none is `invalid`.
    pub fn parse(list: &[String]) -> Result<Allowlist> {
        if list.is_empty() {
            return Err(Error::invalid(
                "spec.network.allow: an empty allowlist; use network none",
            ));
        }
        if list.len() > Self::MAX_ENTRIES {
            return Err(Error::invalid(format!(
                "spec.network.allow: {} entries, at most {}",
                list.len(),
                Self::MAX_ENTRIES
            )));
        }
        list.iter()
            .map(|e| AllowEntry::parse(e))
            .collect::<Result<_>>()
            .map(Allowlist)
    }

    /// The entries.
    pub fn entries(&self) -> &[AllowEntry] {
        &self.0
    }

    /// The first entry allowing the name `host` on `port`.
    pub fn name_rule(&self, host: &str, port: u16) -> Option<&AllowEntry> {
        self.0.iter().find(|e| e.allows_name(host, port))
    }

    /// The `*` entry allowing public addresses on `port`, if the list has one: an address
    /// written as the host itself is then let through where no range keeps it out.
    ///
    /// ```
    /// use agentbox_core::Allowlist;
    /// let list = Allowlist::parse(&["*:443".into()]).unwrap();
    /// assert!(list.public_rule(443).is_some());
    /// assert!(list.public_rule(80).is_none());
    /// assert!(list.name_rule("example.org", 443).is_some());
    /// assert!(list.addr_rule("10.1.2.3".parse().unwrap(), 443).is_none());
    /// ```
    pub fn public_rule(&self, port: u16) -> Option<&AllowEntry> {
        self.0
            .iter()
            .find(|e| e.target == AllowTarget::Public && e.port.is_none_or(|p| p == port))
    }

    /// The first entry allowing the address `ip` on `port`.
    pub fn addr_rule(&self, ip: IpAddr, port: u16) -> Option<&AllowEntry> {
        self.0.iter().find(|e| e.allows_addr(ip, port))
    }

    /// Refuse (`unsupported`, naming `platform`) every entry a platform that takes only domains,
    /// wildcards and IPv4 CIDRs, with no port, cannot honour; `cidrs: false` refuses CIDRs too.
    ///
    /// ```
    /// use agentbox_core::Allowlist;
    /// let l = Allowlist::parse(&["example.com:443".into()]).unwrap();
    /// assert!(l.refuse(true, "Modal").is_err());
    /// ```
    pub fn refuse(&self, cidrs: bool, platform: &str) -> Result<()> {
        for e in &self.0 {
            let why = match (&e.target, e.port) {
                (AllowTarget::Public, _) => "the public internet with this machine's and private ranges kept out (*)",
                (_, Some(_)) => "a port in an entry",
                (AllowTarget::Cidr { .. }, _) if !cidrs => "a CIDR",
                (
                    AllowTarget::Cidr {
                        addr: IpAddr::V6(_), ..
                    },
                    _,
                ) => "an IPv6 CIDR",
                _ => continue,
            };
            return Err(Error::unsupported(format!(
                "spec.network.allow: {e}: {platform} cannot honour {why}"
            )));
        }
        Ok(())
    }
}

fn port_of(p: &str) -> Option<u16> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse().ok().filter(|p| *p > 0)
}

/// `a.b.c.d`, `a.b.c.d/n`, `v6` or `v6/n`, the network's first address kept (host bits that are
/// set are refused: `10.0.0.1/8` is a mistake for `10.0.0.0/8`, not a network).
fn cidr(s: &str) -> Option<AllowTarget> {
    let (addr, bits) = match s.split_once('/') {
        Some((a, b)) => {
            if b.is_empty() || b.len() > 3 || !b.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            (a, Some(b.parse::<u8>().ok()?))
        }
        None => (s, None),
    };
    let addr: IpAddr = addr.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let bits = bits.unwrap_or(max);
    if bits > max || mask(addr, bits) != addr {
        return None;
    }
    Some(AllowTarget::Cidr { addr, bits })
}

/// `ip` with its host bits past `bits` cleared.
fn mask(ip: IpAddr, bits: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let m = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
            IpAddr::V4((u32::from(a) & m).into())
        }
        IpAddr::V6(a) => {
            let m = if bits == 0 { 0 } else { u128::MAX << (128 - bits) };
            IpAddr::V6((u128::from(a) & m).into())
        }
    }
}

/// Whether `ip` is in the network `net/bits` (of the same family).
fn in_network(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    ip.is_ipv4() == net.is_ipv4() && mask(ip, bits) == mask(net, bits)
}

/// An IPv4 address written as IPv6 (`::ffff:a.b.c.d`) as the IPv4 address it is.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(s: &str) -> AllowEntry {
        AllowEntry::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn every_form_parses_and_prints_back() {
        for s in [
            "example.com",
            "*.example.com",
            "example.com:443",
            "*.example.com:8443",
            "10.0.0.0/8",
            "192.0.2.7/32",
            "10.0.0.0/8:5432",
            "2001:db8::/32",
            "[2001:db8::/32]:443",
            "::1/128",
            "*",
            "*:443",
        ] {
            assert_eq!(entry(s).to_string(), s);
        }
        assert_eq!(entry("192.0.2.7").to_string(), "192.0.2.7/32");
        assert_eq!(entry("[2001:db8::1]").to_string(), "2001:db8::1/128");
        assert_eq!(entry("API.Example.COM.").to_string(), "api.example.com");
    }

    #[test]
    fn bad_entries_are_refused_naming_the_entry() {
        for bad in [
            "",
            "localhost",
            "exa mple.com",
            "-a.com",
            "a..com",
            "10.0.0.0/33",
            "300.0.0.0/8",
            "10.0.0.1/8",
            "10.0.0.0/",
            "example.com:",
            "example.com:0",
            "example.com:65536",
            "example.com:http",
            "*.com.:x",
            "[2001:db8::/32",
            "[10.0.0.0/8]:1",
            "2001:db8::/129",
            "2001:db8::/32:443",
            "*.*.example.com",
            "http://example.com",
        ] {
            let e = AllowEntry::parse(bad).expect_err(bad);
            assert!(e.message().contains("spec.network.allow"), "{e}");
            assert!(e.message().contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn names_match_exactly_or_below_a_wildcard_on_its_port() {
        let d = entry("example.com");
        assert!(d.allows_name("EXAMPLE.com.", 1));
        assert!(!d.allows_name("api.example.com", 1));
        assert!(!d.allows_name("badexample.com", 1));
        let w = entry("*.example.com:443");
        assert!(w.allows_name("a.b.example.com", 443));
        assert!(!w.allows_name("example.com", 443));
        assert!(!w.allows_name("xexample.com", 443));
        assert!(!w.allows_name("a.example.com", 80));
        assert!(!w.allows_addr("10.0.0.1".parse().unwrap(), 443));
    }

    #[test]
    fn addresses_match_their_network_and_mapped_v4_is_v4() {
        let n = entry("10.0.0.0/8");
        assert!(n.allows_addr("10.255.0.1".parse().unwrap(), 9));
        assert!(n.allows_addr("::ffff:10.1.1.1".parse().unwrap(), 9));
        assert!(!n.allows_addr("11.0.0.1".parse().unwrap(), 9));
        assert!(!n.allows_name("10.0.0.1", 9));
        let v6 = entry("[2001:db8::/32]:443");
        assert!(v6.allows_addr("2001:db8:1::5".parse().unwrap(), 443));
        assert!(!v6.allows_addr("2001:db9::5".parse().unwrap(), 443));
        assert!(!v6.allows_addr("2001:db8::5".parse().unwrap(), 80));
        let all = entry("0.0.0.0/0");
        assert!(all.allows_addr("192.0.2.1".parse().unwrap(), 1));
        assert!(!all.allows_addr("2001:db8::1".parse().unwrap(), 1));
    }

    #[test]
    fn lists_are_bounded_and_platforms_refuse_what_they_cannot_honour() {
        assert!(Allowlist::parse(&[]).is_err());
        let many: Vec<String> = (0..=Allowlist::MAX_ENTRIES)
            .map(|i| format!("h{i}.example.com"))
            .collect();
        assert!(Allowlist::parse(&many).unwrap_err().message().contains("at most"));
        let plain = Allowlist::parse(&["example.com".into(), "*.b.org".into(), "10.0.0.0/8".into()]).unwrap();
        assert!(plain.refuse(true, "X").is_ok());
        let e = plain.refuse(false, "Daytona").unwrap_err();
        assert!(
            e.message().contains("10.0.0.0/8") && e.message().contains("Daytona"),
            "{e}"
        );
        assert!(
            Allowlist::parse(&["2001:db8::/32".into()])
                .unwrap()
                .refuse(true, "X")
                .is_err()
        );
    }

    #[test]
    fn star_is_every_name_and_no_address_by_itself() {
        let list = Allowlist::parse(&["*".into()]).unwrap();
        assert!(list.name_rule("example.org", 80).is_some());
        assert!(
            list.name_rule("localhost", 80).is_some(),
            "names are checked again once resolved"
        );
        assert!(list.addr_rule("127.0.0.1".parse().unwrap(), 80).is_none());
        assert!(list.public_rule(80).is_some());
        let e = list.refuse(true, "E2B").unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::Unsupported);
        assert!(e.message().contains("(*)"), "{e}");
        assert!(AllowEntry::parse("*.*").is_err());
    }
}

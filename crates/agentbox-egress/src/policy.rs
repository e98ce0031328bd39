//! What the proxy lets through: a box's allowlist, and the ranges no name may lead to unless a
//! CIDR of the list names them.

use std::net::IpAddr;
use std::sync::Arc;

use agentbox_core::{Allowlist, canonical};

/// A check's outcome: the rule that allowed it, or the rule that refused it and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Let through by this entry of the list.
    Allowed {
        /// The entry, as the list would print it.
        rule: String,
    },
    /// Refused.
    Refused {
        /// What refused it: `no entry`, or the never-allowed range the address is in.
        rule: String,
        /// Why, in words.
        why: String,
    },
}

/// A box's egress policy.
#[derive(Clone)]
pub struct Policy {
    allow: Allowlist,
    own: Arc<dyn Fn(IpAddr) -> bool + Send + Sync>,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy").field("allow", &self.allow).finish()
    }
}

impl Policy {
    /// The policy of `allow`, with this machine's own addresses found as they are asked about.
    pub fn new(allow: Allowlist) -> Self {
        Policy {
            allow,
            own: Arc::new(is_this_machines),
        }
    }

    /// The same policy taking `own` as the test of this machine's own addresses (for tests that
    /// cannot change the machine's).
    pub fn with_own_addresses(mut self, own: impl Fn(IpAddr) -> bool + Send + Sync + 'static) -> Self {
        self.own = Arc::new(own);
        self
    }

    /// The list.
    pub fn allowlist(&self) -> &Allowlist {
        &self.allow
    }

    /// The first step, before any resolving: whether the name `host` may be asked for on `port`.
    ///
    /// ```
    /// use agentbox_core::Allowlist;
    /// use agentbox_egress::{Decision, Policy};
    /// let p = Policy::new(Allowlist::parse(&["*.example.com".into()]).unwrap());
    /// assert!(matches!(p.check_name("a.example.com", 443), Decision::Allowed { .. }));
    /// assert!(matches!(p.check_name("example.org", 443), Decision::Refused { .. }));
    /// ```
    pub fn check_name(&self, host: &str, port: u16) -> Decision {
        match self.allow.name_rule(host, port) {
            Some(e) => Decision::Allowed { rule: e.to_string() },
            None => Decision::Refused {
                rule: "no entry".into(),
                why: format!("{host}:{port} matches no entry of the allowlist"),
            },
        }
    }

    /// The second step: whether `ip` may be connected to on `port`, reached by an allowed name
    /// (`by_name`, the name's rule) or written as the host itself (`None`: it must be in a
    /// listed CIDR). A listed CIDR allows any address in it; a name leads nowhere
    /// [`never_allowed`], nor to this machine's own addresses.
    pub fn check_addr(&self, ip: IpAddr, port: u16, by_name: Option<&str>) -> Decision {
        let ip = canonical(ip);
        if let Some(e) = self.allow.addr_rule(ip, port) {
            return Decision::Allowed { rule: e.to_string() };
        }
        // An address written as the host needs a CIDR, or `*`, which lets it through where
        // no range below keeps it out, as a name's address would be.
        let public = self.allow.public_rule(port).map(|e| e.to_string());
        let Some(rule) = by_name.or(public.as_deref()) else {
            return Decision::Refused {
                rule: "no entry".into(),
                why: format!("{ip}:{port} is in no CIDR of the allowlist"),
            };
        };
        let what = if by_name.is_some() {
            "the name resolved to"
        } else {
            "the address is"
        };
        if let Some(range) = never_allowed(ip) {
            return Decision::Refused {
                rule: range.into(),
                why: format!("{what} {ip}, in {range}, which only a listed CIDR allows"),
            };
        }
        if (self.own)(ip) {
            return Decision::Refused {
                rule: "this machine's address".into(),
                why: format!("{what} {ip}, an address of this machine, which only a listed CIDR allows"),
            };
        }
        Decision::Allowed { rule: rule.to_string() }
    }
}

/// The range `ip` is in, of those no name may lead to unless a CIDR lists it: what is not the
/// internet (this network, loopback, link-local with the cloud metadata address, private and
/// shared address space, benchmarking, multicast and reserved ranges) and the IPv6 forms that
/// carry an IPv4 address inside (NAT64, 6to4), which could hide any of those.
///
/// ```
/// use agentbox_egress::policy::never_allowed;
/// assert_eq!(never_allowed("169.254.169.254".parse().unwrap()), Some("the cloud metadata address"));
/// assert_eq!(never_allowed("93.184.215.14".parse().unwrap()), None);
/// ```
pub fn never_allowed(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(a) => {
            let o = a.octets();
            Some(match o {
                [169, 254, 169, 254] => "the cloud metadata address",
                [0, ..] => "this network (0.0.0.0/8)",
                [127, ..] => "loopback (127.0.0.0/8)",
                [10, ..] => "private (10.0.0.0/8)",
                [172, b, ..] if (16..32).contains(&b) => "private (172.16.0.0/12)",
                [192, 168, ..] => "private (192.168.0.0/16)",
                [100, b, ..] if (64..128).contains(&b) => "shared address space (100.64.0.0/10)",
                [169, 254, ..] => "link-local (169.254.0.0/16)",
                [192, 0, 0, _] => "IETF protocol assignments (192.0.0.0/24)",
                [198, b, ..] if b == 18 || b == 19 => "benchmarking (198.18.0.0/15)",
                [a, ..] if a >= 224 => "multicast and reserved (224.0.0.0/3)",
                _ => return None,
            })
        }
        IpAddr::V6(a) => {
            let s = a.segments();
            Some(match s {
                [0, 0, 0, 0, 0, 0, 0, 0] => "unspecified (::)",
                [0, 0, 0, 0, 0, 0, 0, 1] => "loopback (::1)",
                [x, ..] if x & 0xffc0 == 0xfe80 => "link-local (fe80::/10)",
                [x, ..] if x & 0xfe00 == 0xfc00 => "unique local (fc00::/7)",
                [x, ..] if x & 0xff00 == 0xff00 => "multicast (ff00::/8)",
                [0x64, 0xff9b, ..] => "NAT64 (64:ff9b::/96)",
                [0x2002, ..] => "6to4 (2002::/16)",
                [x, ..] if x & 0xffc0 == 0xfec0 => "site-local (fec0::/10)",
                [0x100, 0, 0, 0, ..] => "discard-only (100::/64)",
                [0, 0, 0, 0, 0xffff, 0, _, _] => "IPv4-translated (::ffff:0:0:0/96)",
                [0, 0, 0, 0, 0, 0, _, _] => "IPv4-compatible (::/96)",
                _ => return None,
            })
        }
    }
}

/// Whether `ip` is an address of this machine (in the proxy's network): one a socket can be
/// bound to. Cheaper and surer than listing the interfaces, which change.
fn is_this_machines(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(list: &[&str]) -> Policy {
        Policy::new(Allowlist::parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap())
            .with_own_addresses(|ip| ip == IpAddr::from([203, 0, 113, 9]))
    }

    fn allowed(d: Decision) -> bool {
        matches!(d, Decision::Allowed { .. })
    }

    #[test]
    fn a_name_leads_only_to_the_internet_unless_a_cidr_lists_more() {
        let p = policy(&["api.example.com", "10.1.0.0/16:5432"]);
        let by = Some("api.example.com");
        assert!(allowed(p.check_addr("93.184.215.14".parse().unwrap(), 443, by)));
        for inside in [
            "127.0.0.1",
            "::1",
            "169.254.169.254",
            "10.9.9.9",
            "192.168.1.1",
            "172.20.0.1",
            "100.100.0.1",
            "fe80::1",
            "fd00:ec2::254",
            "::ffff:127.0.0.1",
            "64:ff9b::a00:1",
            "fec0::1",
            "100::1",
            "::ffff:0:a00:1",
            "0.0.0.0",
            "203.0.113.9",
        ] {
            let d = p.check_addr(inside.parse().unwrap(), 443, by);
            assert!(!allowed(d.clone()), "{inside}: {d:?}");
        }
        // A listed CIDR allows its addresses, on its port alone, by name or not.
        assert!(allowed(p.check_addr("10.1.2.3".parse().unwrap(), 5432, None)));
        assert!(allowed(p.check_addr("10.1.2.3".parse().unwrap(), 5432, by)));
        assert!(!allowed(p.check_addr("10.1.2.3".parse().unwrap(), 22, by)));
        // An address written as the host must be listed.
        assert!(!allowed(p.check_addr("93.184.215.14".parse().unwrap(), 443, None)));
    }

    #[test]
    fn the_metadata_address_is_named_and_refused() {
        let p = policy(&["metadata.google.internal"]);
        match p.check_addr("169.254.169.254".parse().unwrap(), 80, Some("metadata.google.internal")) {
            Decision::Refused { rule, .. } => assert_eq!(rule, "the cloud metadata address"),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn star_lets_any_public_address_through_and_nothing_of_this_machine_or_a_private_range() {
        let p = policy(&["*"]);
        assert!(allowed(p.check_name("example.org", 443)));
        assert!(allowed(p.check_addr("93.184.215.14".parse().unwrap(), 443, None)));
        assert!(allowed(p.check_addr("93.184.215.14".parse().unwrap(), 80, Some("*"))));
        for inside in [
            "127.0.0.1",
            "::1",
            "169.254.169.254",
            "10.9.9.9",
            "192.168.1.1",
            "203.0.113.9",
        ] {
            let d = p.check_addr(inside.parse().unwrap(), 443, None);
            assert!(!allowed(d.clone()), "{inside}: {d:?}");
            let d = p.check_addr(inside.parse().unwrap(), 443, Some("*"));
            assert!(!allowed(d.clone()), "{inside} by name: {d:?}");
        }
        // A port on `*` holds it to that port.
        let p = policy(&["*:443"]);
        assert!(!allowed(p.check_name("example.org", 80)));
        assert!(!allowed(p.check_addr("93.184.215.14".parse().unwrap(), 80, None)));
    }
}

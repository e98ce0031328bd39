//! A wildcard DNS record for a test: every name under one domain is one IPv4 address.
//!
//! E2B's domain mode names a sandbox's hosts `PORT-ID.DOMAIN`, ids made as sandboxes are, so no
//! hosts file can hold them; the clients judged resolve them through the system's resolver
//! (`/etc/resolv.conf`), some (the Python SDK's Rust transport) with a DNS client of their own
//! rather than the C library's. [`Wildcard`] answers UDP queries as a zone with
//! `*.DOMAIN IN A addr` would: an `A` for a name under the domain (or the domain itself), no
//! record of any other type for it (so `AAAA` is empty, and the client takes the `A`), and
//! NXDOMAIN for any other name. [`Wildcard::resolving`] runs a program in a mount namespace of
//! its own whose `/etc/resolv.conf` names this server, so nothing else on the machine is
//! touched (root only, as CI runs the tests).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

/// The server: answering until dropped.
pub struct Wildcard {
    at: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    resolv: PathBuf,
}

impl Drop for Wildcard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Wildcard {
    /// Answer for every name under `domain` with `addr`, on UDP port 53 of `listen` (a loopback
    /// address; a resolver asks port 53 alone). `dir` holds the `resolv.conf` that names it.
    pub async fn start(domain: &str, addr: Ipv4Addr, listen: Ipv4Addr, dir: &Path) -> std::io::Result<Wildcard> {
        let socket = tokio::net::UdpSocket::bind((listen, 53)).await?;
        let at = socket.local_addr()?;
        let resolv = dir.join("resolv.conf");
        std::fs::write(&resolv, format!("nameserver {listen}\noptions timeout:2 attempts:2\n"))?;
        let domain = domain.trim_end_matches('.').to_ascii_lowercase();
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                    continue;
                };
                if let Some(answer) = answer(&buf[..n], &domain, addr) {
                    let _ = socket.send_to(&answer, from).await;
                }
            }
        });
        Ok(Wildcard { at, task, resolv })
    }

    /// Where it answers.
    pub fn addr(&self) -> SocketAddr {
        self.at
    }

    /// `program args...` in a mount namespace of its own whose `/etc/resolv.conf` names this
    /// server (`unshare --mount`, then a bind mount over the file): the command to spawn.
    pub fn resolving(&self, program: &Path) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(r#"mount --bind "$0" /etc/resolv.conf && exec "$@""#)
            .arg(&self.resolv)
            .arg(program);
        c
    }
}

/// The answer to one query, or `None` for what is no query (dropped, as a server would).
fn answer(q: &[u8], domain: &str, addr: Ipv4Addr) -> Option<Vec<u8>> {
    if q.len() < 12 || q[2] & 0x80 != 0 || u16::from_be_bytes([q[4], q[5]]) != 1 {
        return None;
    }
    // The question: its name's labels, then its type and class.
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let len = *q.get(i)? as usize;
        i += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None;
        }
        labels.push(std::str::from_utf8(q.get(i..i + len)?).ok()?.to_ascii_lowercase());
        i += len;
    }
    let qtype = u16::from_be_bytes([*q.get(i)?, *q.get(i + 1)?]);
    let question_end = i + 4;
    q.get(..question_end)?;
    let name = labels.join(".");
    let ours = name == domain || name.ends_with(&format!(".{domain}"));
    let a = ours && qtype == 1;
    let mut out = Vec::with_capacity(question_end + 16);
    out.extend_from_slice(&q[..2]);
    // A response, authoritative, recursion as asked and available; NXDOMAIN for others' names.
    out.push(0x84 | (q[2] & 0x01));
    out.push(if ours { 0x80 } else { 0x83 });
    out.extend_from_slice(&[0, 1, 0, u8::from(a), 0, 0, 0, 0]);
    out.extend_from_slice(&q[12..question_end]);
    if a {
        // The question's name (a pointer to it), A, IN, 60 s, four bytes.
        out.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
        out.extend_from_slice(&addr.octets());
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for l in name.split('.') {
            q.push(l.len() as u8);
            q.extend_from_slice(l.as_bytes());
        }
        q.push(0);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&[0, 1]);
        q
    }

    #[test]
    fn a_name_under_the_domain_is_the_address_and_any_other_is_nxdomain() {
        let addr = Ipv4Addr::new(127, 0, 2, 1);
        let q = query("49983-abc.E2B.test", 1);
        let a = answer(&q, "e2b.test", addr).unwrap();
        assert_eq!(&a[..2], &[0x12, 0x34], "the query's id");
        assert_eq!(a[3] & 0x0f, 0, "no error");
        assert_eq!(u16::from_be_bytes([a[6], a[7]]), 1, "one answer");
        assert_eq!(&a[a.len() - 4..], &[127, 0, 2, 1]);
        let aaaa = answer(&query("api.e2b.test", 28), "e2b.test", addr).unwrap();
        assert_eq!((aaaa[3] & 0x0f, aaaa[7]), (0, 0), "no AAAA, no error");
        let other = answer(&query("example.com", 1), "e2b.test", addr).unwrap();
        assert_eq!((other[3] & 0x0f, other[7]), (3, 0), "NXDOMAIN");
        assert_eq!(
            answer(&query("notae2b.test", 1), "e2b.test", addr).unwrap()[3] & 0x0f,
            3
        );
        assert!(answer(&q[..20], "e2b.test", addr).is_none(), "a cut query");
        assert!(answer(&[], "e2b.test", addr).is_none());
    }
}

//! The proxy's side of one client connection: its request head read (bounded, within a
//! deadline), the target checked by the [`Policy`], resolved and checked again, connected to,
//! and the bytes then copied both ways.
//!
//! `CONNECT host:port` is answered `200` and becomes a tunnel. A plain HTTP request in absolute
//! form (`GET http://host/path`) is sent on in origin form with the URL's own `Host` (never
//! the client's) and `Connection: close`; what the client sends after the head is carried to
//! the same checked address, so a second request on the connection can only reach the host
//! that was checked. A request in origin form for [`PROBE_PATH`] is answered by the
//! proxy itself (how a box proves it reaches the proxy); any other is `400`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::intercept::{Interceptor, Prefixed};
use crate::policy::{Decision, Policy};
use crate::refusal::Refusal;
use crate::resolve::Resolver;

/// Where refusals go (the daemon's log, a test's list).
pub type Refusals = Arc<dyn Fn(Refusal) + Send + Sync>;

/// The longest request head taken.
const MAX_HEAD: usize = 16 << 10;
/// The most headers a request may carry.
const MAX_HEADERS: usize = 100;
/// How long a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// The buffer of each direction of a tunnel.
const COPY_BUFFER: usize = 256 << 10;
/// How long a name may take to resolve.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client answered with the proxy's own (closing) answer may go on sending before
/// its connection is dropped, and how much it may send: a lingering close (RFC 9112 §9.6).
/// Closing a socket with unread bytes resets it, and a reset can destroy the answer on its way
/// (or kill the client's next write with `SIGPIPE`): a client that pipelined a request after a
/// refused `CONNECT`, or sent a body with a refused request, would see a reset, not the `403`.
const LINGER_TIME: Duration = Duration::from_secs(5);
const LINGER_BYTES: u64 = 1 << 20;
/// The path a client asks the proxy itself for, in origin form: answered `200`.
pub const PROBE_PATH: &str = "/.agentbox-egress";

/// The proxy: cheap to clone, one [`Proxy::serve`] per client connection.
#[derive(Clone)]
pub struct Proxy {
    policy: Policy,
    resolver: Arc<dyn Resolver>,
    refusals: Refusals,
    intercept: Option<Arc<Interceptor>>,
}

/// What a request asks to reach.
struct Target {
    host: String,
    port: u16,
    /// A plain HTTP request: its head as it goes to the origin.
    forward: Option<Vec<u8>>,
}

impl Proxy {
    /// A proxy enforcing `policy`, resolving with `resolver`, telling `refusals` of each refusal.
    pub fn new(policy: Policy, resolver: Arc<dyn Resolver>, refusals: Refusals) -> Self {
        Proxy {
            policy,
            resolver,
            refusals,
            intercept: None,
        }
    }

    /// The same proxy holding a box's secrets: HTTPS to a host a secret names is decrypted and
    /// gets the values ([`Interceptor`]); a placeholder anywhere else is refused.
    pub fn with_secrets(mut self, intercept: Arc<Interceptor>) -> Self {
        self.intercept = Some(intercept);
        self
    }

    /// Serve one client connection to its end. `Err` says why it ended early (the client was
    /// answered where it could be); nothing is refused without a record.
    pub async fn serve<S>(&self, mut client: S) -> Result<(), String>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let (head, rest) = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client)).await {
            Err(_) => return Err("no request head within 30 s".into()),
            Ok(Err(e)) => {
                let _ = answer(&mut client, 400, &e).await;
                return Err(e);
            }
            Ok(Ok(h)) => h,
        };
        let target = match parse(&head) {
            Ok(Some(t)) => t,
            Ok(None) => {
                answer(&mut client, 200, "agentbox egress proxy")
                    .await
                    .map_err(|e| e.to_string())?;
                return Ok(());
            }
            Err((status, why)) => {
                let _ = answer(&mut client, status, &why).await;
                return Err(why);
            }
        };
        if let Some(i) = &self.intercept {
            let place = if target.forward.is_some() {
                "a plain http request (a secret goes only over https)"
            } else {
                "a CONNECT request"
            };
            if let Some(leak) = i.secrets().find_in(&head, place) {
                let why = leak.why(&target.host);
                self.record(Refusal {
                    at_ms: now_ms(),
                    host: target.host.clone(),
                    port: target.port,
                    address: None,
                    rule: leak.rule(),
                    why: why.clone(),
                });
                let _ = answer(&mut client, 403, &why).await;
                return Err(why);
            }
        }
        let upstream = match self.reach(&target.host, target.port).await {
            Ok(s) => s,
            Err(Reached::Refused(r)) => {
                let why = format!("{}:{} refused ({}): {}", r.host, r.port, r.rule, r.why);
                self.record(r);
                let _ = answer(&mut client, 403, &why).await;
                return Err(why);
            }
            Err(Reached::Failed(why)) => {
                let _ = answer(&mut client, 502, &why).await;
                return Err(why);
            }
        };
        let mut upstream = upstream;
        let _ = upstream.set_nodelay(true);
        if let Some(i) = &self.intercept
            && target.forward.is_none()
            && i.secrets().intercepts(&target.host, target.port)
        {
            // The proxy's own TLS to the host first: a host whose certificate fails is answered
            // 502 saying so, before the box's TLS starts.
            let upstream = match i.connect_upstream(&target.host, upstream).await {
                Ok(s) => s,
                Err(why) => {
                    let _ = answer(&mut client, 502, &why).await;
                    return Err(why);
                }
            };
            client
                .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                .await
                .map_err(|e| e.to_string())?;
            return i
                .serve(
                    Prefixed::new(rest, client),
                    &target.host,
                    target.port,
                    upstream,
                    self.refusals.clone(),
                )
                .await;
        }
        match &target.forward {
            None => client
                .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                .await
                .map_err(|e| e.to_string())?,
            Some(h) => upstream.write_all(h).await.map_err(|e| e.to_string())?,
        }
        upstream.write_all(&rest).await.map_err(|e| e.to_string())?;
        // Buffers of 256 KiB rather than tokio's 8 KiB: a bulk download through the proxy
        // then costs a syscall per 256 KiB, not per 8 (`agentbox bench egress`).
        tokio::io::copy_bidirectional_with_sizes(&mut client, &mut upstream, COPY_BUFFER, COPY_BUFFER)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Put a refusal on record: a tracing event, and the proxy's sink.
    fn record(&self, r: Refusal) {
        tracing::warn!(host = %r.host, port = r.port, address = r.address.as_deref().unwrap_or(""), rule = %r.rule, "egress refused");
        (self.refusals)(r);
    }

    /// Check `host:port`, resolve it, check what it resolved to, and connect to the first
    /// address allowed: the very address checked, never resolved again.
    async fn reach(&self, host: &str, port: u16) -> Result<tokio::net::TcpStream, Reached> {
        let refuse = |address: Option<IpAddr>, rule: String, why: String| {
            Reached::Refused(Refusal {
                at_ms: now_ms(),
                host: host.to_string(),
                port,
                address: address.map(|a| a.to_string()),
                rule,
                why,
            })
        };
        let literal = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
            .parse::<IpAddr>()
            .ok();
        let (addresses, by_name) = match literal {
            Some(ip) => (vec![ip], None),
            None => {
                let rule = match self.policy.check_name(host, port) {
                    Decision::Allowed { rule } => rule,
                    Decision::Refused { rule, why } => return Err(refuse(None, rule, why)),
                };
                let resolved = tokio::time::timeout(RESOLVE_TIMEOUT, self.resolver.resolve(host))
                    .await
                    .map_err(|_| Reached::Failed(format!("{host} did not resolve within 10 s")))?
                    .map_err(|e| Reached::Failed(format!("{host} did not resolve: {e}")))?;
                if resolved.is_empty() {
                    return Err(Reached::Failed(format!("{host} has no address")));
                }
                (resolved, Some(rule))
            }
        };
        let mut first_refusal = None;
        let mut last_failure = None;
        for ip in addresses.into_iter().take(16) {
            match self.policy.check_addr(ip, port, by_name.as_deref()) {
                Decision::Refused { rule, why } => {
                    first_refusal.get_or_insert_with(|| refuse(Some(ip), rule, why));
                }
                Decision::Allowed { .. } => {
                    let to = SocketAddr::new(ip, port);
                    match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(to)).await {
                        Ok(Ok(s)) => {
                            // An address of the name's that was refused on the way is still a
                            // refusal, and on record.
                            if let Some(Reached::Refused(r)) = first_refusal {
                                self.record(r);
                            }
                            return Ok(s);
                        }
                        Ok(Err(e)) => last_failure = Some(format!("connecting to {to}: {e}")),
                        Err(_) => last_failure = Some(format!("connecting to {to}: no answer within 10 s")),
                    }
                }
            }
        }
        match (last_failure, first_refusal) {
            (Some(why), refused) => {
                if let Some(Reached::Refused(r)) = refused {
                    self.record(r);
                }
                Err(Reached::Failed(why))
            }
            (None, Some(r)) => Err(r),
            (None, None) => Err(Reached::Failed(format!("{host}: no address to try"))),
        }
    }
}

enum Reached {
    Refused(Refusal),
    Failed(String),
}

use agentbox_core::now_ms;

/// The request head (through its blank line) and whatever came after it.
async fn read_head<S: AsyncRead + Unpin>(client: &mut S) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = client.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the connection ended before its request head".into());
        }
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            let end = from + i + 4;
            let rest = buf.split_off(end);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(format!("a request head over {MAX_HEAD} bytes"));
        }
    }
}

/// What the head asks: a target, `None` for the proxy's own probe, or the status and reason
/// of a request the proxy does not take.
fn parse(head: &[u8]) -> Result<Option<Target>, (u16, String)> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err((400, "an incomplete request head".into())),
        Err(e) => return Err((400, format!("a request head that is not HTTP: {e}"))),
    }
    let (method, path) = (req.method.unwrap_or(""), req.path.unwrap_or(""));
    if method == "CONNECT" {
        let (host, port) = authority(path).ok_or((400, format!("CONNECT {path:?}: not host:port")))?;
        return Ok(Some(Target {
            host,
            port: port.ok_or((400, format!("CONNECT {path:?}: no port")))?,
            forward: None,
        }));
    }
    if path == PROBE_PATH {
        return Ok(None);
    }
    let Some(after) = path.strip_prefix("http://") else {
        let why = if path.starts_with("https://") {
            "an https URL goes through CONNECT (set HTTPS_PROXY)".to_string()
        } else {
            format!("{path:?} is not an absolute http URL: this is a proxy")
        };
        return Err((400, why));
    };
    let (auth, rest) = match after.find(['/', '?']) {
        Some(i) => (&after[..i], &after[i..]),
        None => (after, ""),
    };
    if auth.contains('@') {
        return Err((400, "credentials in a proxied URL are not taken".into()));
    }
    let (host, port) = authority(auth).ok_or((400, format!("{auth:?} is not a host")))?;
    let port = port.unwrap_or(80);
    let origin_path = match rest {
        "" => "/".to_string(),
        r if r.starts_with('?') => format!("/{r}"),
        r => r.to_string(),
    };
    let mut out = format!("{method} {origin_path} HTTP/1.{}\r\n", req.version.unwrap_or(1)).into_bytes();
    // The Host is the URL's authority, whatever the client sent (RFC 9112 3.2.2): a Host of
    // its own would reach another site served at the checked address.
    out.extend_from_slice(format!("Host: {auth}\r\n").as_bytes());
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        if name.starts_with("proxy-") || name == "connection" || name == "keep-alive" || name == "host" {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(Some(Target {
        host,
        port,
        forward: Some(out),
    }))
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`: the host (an IPv6 literal in brackets) and port.
fn authority(a: &str) -> Option<(String, Option<u16>)> {
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        h.parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (format!("[{h}]"), port)
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (a.to_string(), None),
        }
    };
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._[]:".contains(&b));
    if !host_ok {
        return None;
    }
    let port = match port {
        None => None,
        Some(p) => Some(p.parse::<u16>().ok().filter(|p| *p > 0)?),
    };
    Some((host, port))
}

/// A short answer of the proxy's own, closing the connection: written, the writing half shut,
/// and what the client still sends read and dropped until it closes too (bounded by
/// [`LINGER_TIME`] and [`LINGER_BYTES`]).
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(client: &mut S, status: u16, body: &str) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        _ => "Bad Gateway",
    };
    let body = format!("agentbox egress: {body}\n");
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nX-Agentbox-Egress: {}\r\nConnection: close\r\n\r\n",
        body.len(),
        if status == 403 { "refused" } else { "proxy" }
    );
    client.write_all(head.as_bytes()).await?;
    client.write_all(body.as_bytes()).await?;
    client.shutdown().await?;
    linger(client).await;
    Ok(())
}

/// Read and drop what `client` sends until it closes, for at most [`LINGER_TIME`] and
/// [`LINGER_BYTES`].
async fn linger<S: AsyncRead + Unpin>(client: &mut S) {
    let drain = async {
        let mut buf = [0u8; 8192];
        let mut taken = 0u64;
        while taken < LINGER_BYTES {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => taken += n as u64,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIME, drain).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(head: &str) -> Result<Option<Target>, (u16, String)> {
        parse(head.as_bytes())
    }

    #[test]
    fn connect_and_absolute_requests_name_their_target() {
        let t = target("CONNECT a.example.com:443 HTTP/1.1\r\nHost: a.example.com:443\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.forward.is_none()),
            ("a.example.com", 443, true)
        );
        let t = target("CONNECT [2001:db8::1]:8443 HTTP/1.1\r\n\r\n").unwrap().unwrap();
        assert_eq!((t.host.as_str(), t.port), ("[2001:db8::1]", 8443));
        let t = target(
            "GET http://a.example.com:8080/x?y=1 HTTP/1.1\r\nHost: a.example.com:8080\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: x\r\nAccept: */*\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!((t.host.as_str(), t.port), ("a.example.com", 8080));
        let fwd = String::from_utf8(t.forward.unwrap()).unwrap();
        assert!(fwd.starts_with("GET /x?y=1 HTTP/1.1\r\n"), "{fwd}");
        assert!(!fwd.to_ascii_lowercase().contains("proxy-"), "{fwd}");
        assert!(fwd.ends_with("Accept: */*\r\nConnection: close\r\n\r\n"), "{fwd}");
        let t = target("GET http://b.example.com HTTP/1.0\r\n\r\n").unwrap().unwrap();
        let fwd = String::from_utf8(t.forward.unwrap()).unwrap();
        assert!(fwd.starts_with("GET / HTTP/1.0\r\nHost: b.example.com\r\n"), "{fwd}");
        // A Host of the client's own never reaches the checked address: the URL's is sent.
        let t = target("GET http://b.example.com/ HTTP/1.1\r\nHost: internal.example\r\n\r\n")
            .unwrap()
            .unwrap();
        let fwd = String::from_utf8(t.forward.unwrap()).unwrap();
        assert!(fwd.starts_with("GET / HTTP/1.1\r\nHost: b.example.com\r\n"), "{fwd}");
        assert!(!fwd.contains("internal.example"), "{fwd}");
        assert!(target("GET /.agentbox-egress HTTP/1.1\r\n\r\n").unwrap().is_none());
    }

    #[test]
    fn requests_the_proxy_does_not_take_are_bad_requests_saying_why() {
        for (head, word) in [
            ("CONNECT a.example.com HTTP/1.1\r\n\r\n", "no port"),
            ("CONNECT a.example.com:0 HTTP/1.1\r\n\r\n", "not host:port"),
            ("CONNECT a b:1 HTTP/1.1\r\n\r\n", "not HTTP"),
            ("GET https://a.example.com/ HTTP/1.1\r\n\r\n", "CONNECT"),
            ("GET /x HTTP/1.1\r\n\r\n", "not an absolute"),
            ("GET http://u:p@a.example.com/ HTTP/1.1\r\n\r\n", "credentials"),
            ("GET http://a%2e.com/ HTTP/1.1\r\n\r\n", "not a host"),
            ("\u{1}\u{2}\r\n\r\n", "not HTTP"),
        ] {
            match target(head) {
                Err((400, why)) => assert!(why.contains(word), "{head:?}: {why}"),
                Err((s, why)) => panic!("{head:?}: {s} {why}"),
                Ok(_) => panic!("{head:?} was taken"),
            }
        }
    }

    /// A resolver that is never to be asked (the refusals below come before any name resolves).
    struct Unasked;

    #[async_trait::async_trait]
    impl Resolver for Unasked {
        async fn resolve(&self, host: &str) -> std::io::Result<Vec<IpAddr>> {
            panic!("{host} was resolved")
        }
    }

    /// A client that pipelines its request after a refused `CONNECT` (or sends a body after a
    /// refused head) may go on writing after the `403`: the proxy takes what it sends until it
    /// closes, so its writes succeed and the answer is read whole, never lost to a reset.
    #[tokio::test]
    async fn a_refused_client_may_finish_sending_and_still_reads_the_whole_answer() {
        let list = agentbox_core::Allowlist::parse(&["pkg.test:80".to_string()]).unwrap();
        let proxy = Proxy::new(Policy::new(list), Arc::new(Unasked), Arc::new(|_| {}));
        let (mut client, theirs) = tokio::io::duplex(64);
        let served = tokio::spawn(async move { proxy.serve(theirs).await });
        client
            .write_all(b"CONNECT pkg.test:81 HTTP/1.1\r\nHost: pkg.test:81\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
        assert!(answer.contains("refused (no entry)"), "{answer}");
        // The proxy answered and shut its side; on this one-thread runtime it has run as far
        // as it goes. Without the lingering close its half is dropped by now and this fails
        // with a broken pipe.
        for _ in 0..100 {
            client
                .write_all(b"GET / HTTP/1.1\r\nHost: pkg.test\r\n\r\n")
                .await
                .expect("the proxy still takes what the client sends");
        }
        assert!(!served.is_finished());
        drop(client);
        let why = served.await.unwrap().unwrap_err();
        assert!(why.contains("no entry"), "{why}");
    }
}

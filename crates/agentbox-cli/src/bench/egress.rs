//! `agentbox bench egress`: a namespace box's traffic through its egress proxy beside the
//! same traffic on a direct loopback connection, in one run.
//!
//! Both sides are a program in a namespace box reading from a server this process runs on
//! `127.0.0.1`: the baseline box has network host (this machine's, so it connects straight to
//! the server); the subject box has an allowlist naming the server
//! (`127.0.0.1/32:PORT`), so its connection goes to the bridge on the box's loopback, over the
//! unix socket to the proxy on the host, and from there to the server. The program is the
//! same on both sides (bash's `/dev/tcp` and `cat`), so the ratio is what the proxy's path
//! costs: bulk transfer (one download of [`BULK_BYTES`]) and request rate ([`REQUESTS`]
//! small requests, each on a connection of its own, as a package manager's index fetches are).
//! Then HTTPS with a secret put in against a direct TLS connection and a tunnel
//! ([`super::egress_tls`]).

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Error, Network, Result, Sandbox, Spec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::BenchArgs;
use super::measure::{measure, pair, print_pairs};

/// The body of one bulk download.
const BULK_BYTES: u64 = 256 << 20;
/// The requests of one request-rate sample.
const REQUESTS: u32 = 50;
/// The body of each of those.
const SMALL_BYTES: u64 = 1024;

/// A server on `127.0.0.1`: each connection's request (`GET /N`, directly or after a
/// `CONNECT`, which it answers `200` itself) answered with N zero bytes, then closed.
async fn serve() -> Result<u16> {
    let (l, port) = listen().await?;
    tokio::spawn(async move {
        while let Ok((c, _)) = l.accept().await {
            tokio::spawn(async move {
                let _ = answer(c).await;
            });
        }
    });
    Ok(port)
}

/// A listener on a port of `127.0.0.1` the kernel picks, and the port.
pub(super) async fn listen() -> Result<(tokio::net::TcpListener, u16)> {
    let l = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|e| Error::io(e, "bench egress: binding a loopback port"))?;
    let port = l
        .local_addr()
        .map_err(|e| Error::io(e, "bench egress: the listener's port"))?
        .port();
    Ok((l, port))
}

/// One connection of the server's.
async fn answer(mut c: tokio::net::TcpStream) -> std::io::Result<()> {
    let mut head = read_head(&mut c).await?;
    if head.starts_with("CONNECT ") {
        // The proxy connects to the server itself: a CONNECT never reaches it. Answered all
        // the same, so that the server is not what a wrong setup trips on.
        c.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await?;
        head = read_head(&mut c).await?;
    }
    let n: u64 = head
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.trim_start_matches('/').parse().ok())
        .unwrap_or(0)
        .min(BULK_BYTES);
    c.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    write_zeros(&mut c, n).await?;
    c.shutdown().await
}

/// `n` zero bytes, in blocks of 256 KiB: a body.
pub(super) async fn write_zeros<W: tokio::io::AsyncWrite + Unpin>(w: &mut W, n: u64) -> std::io::Result<()> {
    let block = vec![0u8; 256 << 10];
    let mut left = n;
    while left > 0 {
        let k = left.min(block.len() as u64) as usize;
        w.write_all(&block[..k]).await?;
        left -= k as u64;
    }
    Ok(())
}

/// A request's (or an answer's) head, up to its blank line (16 KiB at most).
pub(super) async fn read_head<R: tokio::io::AsyncRead + Unpin>(c: &mut R) -> std::io::Result<String> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 << 10 || c.read(&mut b).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.push(b[0]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// The program a box runs for one sample: `count` fetches of `bytes` each from the server on
/// `port`, directly or through the proxy at `$HTTP_PROXY`, every byte read; it fails unless
/// each answer was whole.
fn fetch_script(port: u16, bytes: u64, count: u32, through_proxy: bool) -> String {
    let (connect_to, preamble) = if through_proxy {
        (
            r#"p=${HTTP_PROXY#http://}; p=${p%/}; h=${p%:*}; q=${p##*:}"#.to_string(),
            format!(r#"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"#),
        )
    } else {
        (format!("h=127.0.0.1; q={port}"), String::new())
    };
    // The answer's length: the body plus the heads (the proxy's 200, then the server's).
    format!(
        r#"{connect_to}
want={bytes}
for i in $(seq {count}); do
  exec 3<>"/dev/tcp/$h/$q" || exit 7
  printf '{preamble}GET /{bytes} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n' >&3
  got=$(cat <&3 | wc -c)
  exec 3<&-
  [ "$got" -gt "$want" ] || {{ echo "fetch $i: $got bytes, under the body's $want" >&2; exit 8; }}
done"#
    )
}

/// Run `script` in `b` with bash; an error unless it exits 0.
async fn run_script(b: &dyn Sandbox, script: &str) -> Result<()> {
    let argv = vec!["bash".to_string(), "-c".to_string(), script.to_string()];
    let ctx = Ctx::background().with_timeout(Duration::from_secs(300));
    let p = b.exec(&argv, &Default::default(), &ctx).await?;
    let out = agentbox_core::finish(p, Default::default()).await?;
    if out.status.code != 0 {
        return Err(Error::unknown(format!(
            "bench egress: the box's fetch exited {}: {}",
            out.status.code,
            out.stderr_text().trim()
        )));
    }
    Ok(())
}

/// `agentbox bench egress`.
pub(crate) async fn egress(args: BenchArgs) -> Result<()> {
    let env = crate::boxes::environment()?;
    let provider: Arc<dyn agentbox_core::Provider> =
        agentbox_providers::registry::make("namespace", &agentbox_providers::registry::Options::default(), &env)
            .await
            .map_err(|e| Error::unsupported(format!("bench egress needs namespace boxes: {e}")))?;
    let port = serve().await?;
    let ctx = Ctx::background();
    let mut host = Spec::new(Duration::from_secs(1800));
    host.network = Some(Network::Host);
    let open = provider.create(&host, &ctx).await?;
    let mut spec = Spec::new(Duration::from_secs(1800));
    spec.network = Some(Network::Allow(vec![format!("127.0.0.1/32:{port}")]));
    let guarded = match provider.create(&spec, &ctx).await {
        Ok(b) => b,
        Err(e) => {
            let _ = open.destroy(&ctx).await;
            return Err(e);
        }
    };
    let n = args.iterations;
    eprintln!(
        "agentbox bench egress: {n} samples of each side, interleaved; boxes {} (network host) and {} (allowlist)",
        open.id(),
        guarded.id()
    );
    let measured = async {
        let mut pairs = Vec::new();
        let direct = fetch_script(port, BULK_BYTES, 1, false);
        let proxied = fetch_script(port, BULK_BYTES, 1, true);
        let (a, b) = measure(
            n,
            || run_script(open.as_ref(), &direct),
            || run_script(guarded.as_ref(), &proxied),
        )
        .await?;
        pairs.push(pair(
            "egress: 256 MiB download",
            "a box's direct loopback connection",
            "the same through the bridge and the egress proxy",
            a,
            b,
        ));
        let direct = fetch_script(port, SMALL_BYTES, REQUESTS, false);
        let proxied = fetch_script(port, SMALL_BYTES, REQUESTS, true);
        let (a, b) = measure(
            n,
            || run_script(open.as_ref(), &direct),
            || run_script(guarded.as_ref(), &proxied),
        )
        .await?;
        pairs.push(pair(
            "egress: 50 requests, 1 KiB each",
            "a box's direct loopback connections",
            "the same, each a CONNECT through the proxy",
            a,
            b,
        ));
        Ok::<_, Error>(pairs)
    }
    .await;
    let _ = open.destroy(&ctx).await;
    let _ = guarded.destroy(&ctx).await;
    let mut pairs = measured?;
    pairs.extend(super::egress_tls::pairs(n).await?);
    print_pairs(&pairs, &[], args.json)?;
    if !args.json {
        let mib = (BULK_BYTES >> 20) as f64;
        let bulk = &pairs[0];
        println!(
            "throughput: direct {:.0} MiB/s, through the proxy {:.0} MiB/s ({:.0}% of direct)",
            mib / (bulk.baseline_median_ms() / 1000.0),
            mib / (bulk.subject_median_ms() / 1000.0),
            100.0 / bulk.ratio()
        );
        let rate = &pairs[1];
        println!(
            "request rate: direct {:.0}/s, through the proxy {:.0}/s ({:.0}% of direct)",
            f64::from(REQUESTS) / (rate.baseline_median_ms() / 1000.0),
            f64::from(REQUESTS) / (rate.subject_median_ms() / 1000.0),
            100.0 / rate.ratio()
        );
        use super::egress_tls::{BULK_BYTES as TLS_BULK, REQUESTS as TLS_REQUESTS};
        let (latency, bulk) = (&pairs[2], &pairs[4]);
        println!(
            "https with a secret put in: {:.2} ms added per request (each on a connection of its own), \
             throughput {:.0} MiB/s against {:.0} MiB/s direct ({:.2}x)",
            (latency.subject_median_ms() - latency.baseline_median_ms()) / f64::from(TLS_REQUESTS),
            (TLS_BULK >> 20) as f64 / (bulk.subject_median_ms() / 1000.0),
            (TLS_BULK >> 20) as f64 / (bulk.baseline_median_ms() / 1000.0),
            bulk.ratio()
        );
    }
    Ok(())
}

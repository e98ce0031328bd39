//! What every provider that speaks a vendor's HTTP API shares: the key that is never printed,
//! one HTTP client setup (rustls with ring and the system's roots, no proxy from the
//! environment), answers read with a cap, and failures turned into our typed errors naming the
//! vendor. Each vendor's own error body and retry rules stay in its module.

use std::sync::Arc;
#[cfg(feature = "vendor-http")]
use std::time::Duration;

#[cfg(feature = "vendor-http")]
use agentbox_core::{Error, ErrorCode, Result};

/// The most of a vendor's error message kept in one of ours.
pub(crate) const MAX_MESSAGE: usize = 600;

/// An API key: never printed, never in an error, never given to a box.
///
/// ```
/// let k = agentbox_providers::vendor::ApiKey::new("secret-value");
/// assert!(!format!("{k:?}").contains("secret"));
/// ```
#[derive(Clone)]
pub struct ApiKey(Arc<str>);

impl ApiKey {
    /// A key as given.
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(Arc::from(key.into()))
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<withheld>)")
    }
}

#[cfg(feature = "vendor-http")]
/// The error code an HTTP status stands for, where the vendor says no more.
pub(crate) fn code_of_status(status: u16) -> ErrorCode {
    match status {
        400 | 422 => ErrorCode::Invalid,
        401 | 403 => ErrorCode::PermissionDenied,
        404 => ErrorCode::NotFound,
        408 | 504 => ErrorCode::Timeout,
        409 | 429 => ErrorCode::Refused,
        410 => ErrorCode::Gone,
        413 => ErrorCode::TooLarge,
        _ => ErrorCode::Unknown,
    }
}

/// `s` cut to at most [`MAX_MESSAGE`] bytes at a character boundary, marked where cut.
pub(crate) fn cut(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

#[cfg(feature = "vendor-http")]
/// A transport failure (no answer) as one of ours.
pub(crate) fn transport_error(e: &reqwest::Error, vendor: &str, what: &str, timeout: Duration) -> Error {
    if e.is_timeout() {
        Error::timeout(format!(
            "{what}: {vendor} did not answer within {}s",
            timeout.as_secs_f64()
        ))
    } else if e.is_connect() {
        Error::transfer_failed(format!("{what}: no connection to {vendor}: {}", chain(e)))
    } else {
        Error::transfer_failed(format!("{what}: {}", chain(e)))
    }
}

#[cfg(feature = "vendor-http")]
/// An error and its causes on one line (reqwest's top line alone says little).
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut c = e.source();
    while let Some(x) = c {
        s.push_str(": ");
        s.push_str(&x.to_string());
        c = x.source();
    }
    s
}

#[cfg(feature = "vendor-http")]
/// `Retry-After` in whole seconds, else `None`.
pub(crate) fn retry_after(r: &reqwest::Response) -> Option<Duration> {
    let v = r.headers().get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    v.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// How many times a throttled request is tried.
#[cfg(feature = "vendor-http")]
const TRIES: u32 = 6;
/// The longest pause between tries when the answer names none.
#[cfg(feature = "vendor-http")]
const MAX_PAUSE: Duration = Duration::from_secs(10);

#[cfg(feature = "vendor-http")]
/// How [`send`] ended.
pub(crate) enum Sent {
    /// The answer, whatever its status.
    Answer(reqwest::Response),
    /// A throttled answer whose `Retry-After` (or the next pause) is past the caller's deadline:
    /// not waited out.
    PastDeadline(reqwest::Response, Duration),
}

#[cfg(feature = "vendor-http")]
/// Send what `build` makes (`authorize` adds the vendor's credentials) with `timeout`; again
/// on 429 (refused before any work) and, where the request is `idempotent`, on 503, after what
/// `Retry-After` says or a pause doubling to [`MAX_PAUSE`], while `ctx` allows, at most
/// [`TRIES`] times. The one retry policy of every vendor's client.
pub(crate) async fn send(
    ctx: &agentbox_core::Ctx,
    vendor: &str,
    what: &str,
    timeout: Duration,
    idempotent: bool,
    build: impl Fn() -> reqwest::RequestBuilder,
) -> Result<Sent> {
    let mut pause = Duration::from_millis(250);
    for n in 1..=TRIES {
        ctx.check()?;
        let r = match ctx.run(build().timeout(timeout).send()).await? {
            Ok(r) => r,
            Err(e) => return Err(transport_error(&e, vendor, what, timeout)),
        };
        let status = r.status().as_u16();
        if (status == 429 || (status == 503 && idempotent)) && n < TRIES {
            let wait = retry_after(&r).unwrap_or(pause).min(Duration::from_secs(60));
            if ctx.remaining().is_some_and(|left| left < wait) {
                return Ok(Sent::PastDeadline(r, wait));
            }
            tracing::debug!(
                status,
                attempt = n,
                wait_ms = wait.as_millis() as u64,
                what,
                "{vendor} asked to retry"
            );
            ctx.run(tokio::time::sleep(wait)).await?;
            pause = (pause * 2).min(MAX_PAUSE);
            continue;
        }
        return Ok(Sent::Answer(r));
    }
    unreachable!("the last try returns")
}

#[cfg(feature = "vendor-http")]
/// At most `cap` bytes of an answer's body; a longer one is `too_large`, refused before it is
/// read where the answer states its length.
pub(crate) async fn read_capped(mut r: reqwest::Response, cap: usize, vendor: &str, what: &str) -> Result<Vec<u8>> {
    let over = || Error::too_large(format!("{what}: {vendor}'s answer is over {cap} bytes"));
    if r.content_length().is_some_and(|n| n > cap as u64) {
        return Err(over());
    }
    let mut out = Vec::new();
    loop {
        match r.chunk().await {
            Ok(Some(c)) => {
                if out.len() + c.len() > cap {
                    return Err(over());
                }
                out.extend_from_slice(&c);
            }
            Ok(None) => return Ok(out),
            Err(e) => return Err(transport_error(&e, vendor, what, Duration::ZERO)),
        }
    }
}

#[cfg(feature = "vendor-http")]
/// The HTTP client for `vendor`: HTTP/1.1 (a WebSocket is an upgrade of it), rustls with ring
/// and the system's roots, the connect deadline, and no proxy from the environment (the key
/// must not go to a proxy the user did not name for this vendor).
pub(crate) fn client(vendor: &str, connect_timeout: Duration) -> Result<reqwest::Client> {
    use rustls_platform_verifier::BuilderVerifierExt;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::unknown(format!("TLS for {vendor}: {e}")))?
        .with_platform_verifier()
        .map_err(|e| Error::unknown(format!("TLS for {vendor}: the system's roots: {e}")))?
        .with_no_client_auth();
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .http1_only()
        .no_proxy()
        .connect_timeout(connect_timeout)
        .user_agent(concat!("agentbox/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| Error::unknown(format!("the HTTP client for {vendor}: {}", chain(&e))))
}

#[cfg(feature = "vendor-http")]
/// A vendor's base URL checked: parsed, http or https, with no trailing slash.
pub(crate) fn base_url(url: &str, vendor: &str, what: &str) -> Result<String> {
    let base = url.trim_end_matches('/').to_string();
    let parsed =
        reqwest::Url::parse(&base).map_err(|e| Error::invalid(format!("{what} {base:?} is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(Error::invalid(format!(
            "{what} {base:?}: only http and https are spoken to {vendor}"
        )));
    }
    Ok(base)
}

#[cfg(feature = "vendor-runner")]
/// The bearer token of the runner in a vendor's sandbox: an HMAC of the sandbox's id under the
/// vendor's key, so every host holding the key reaches the runner another host started, and
/// nothing of the token is kept in the box or with the vendor.
pub(crate) fn runner_token(key: &ApiKey, sandbox: &str) -> String {
    use hmac::{Hmac, KeyInit, Mac};
    let mut mac =
        Hmac::<sha2::Sha256>::new_from_slice(key.expose().as_bytes()).expect("HMAC takes a key of any length");
    mac.update(b"agentbox-runner:");
    mac.update(sandbox.as_bytes());
    mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(feature = "vendor-runner")]
/// A WebSocket to the runner in a vendor's sandbox, opened by `request` (the vendor's proxy to a
/// port of the sandbox, with its own headers) as an HTTP/1.1 upgrade through the vendor's
/// client: its TLS, its connect deadline. `describe` names the runner in errors. Any answer
/// but 101 with the right `Sec-WebSocket-Accept` is `transfer_failed`, with the proxy's words.
pub(crate) async fn runner_websocket(
    request: reqwest::RequestBuilder,
    runner_token: &str,
    describe: &str,
) -> Result<crate::runner::Link> {
    use tokio_tungstenite::tungstenite::handshake::client::generate_key;
    use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
    use tokio_tungstenite::tungstenite::protocol::Role;
    let key = generate_key();
    let r = request
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header("Sec-WebSocket-Key", &key)
        // Not Authorization: a vendor's proxy may take any bearer as its own credential.
        .header(agentbox_protocol::runner::TOKEN_HEADER, runner_token)
        .send()
        .await
        .map_err(|e| Error::transfer_failed(format!("{describe}: {}", chain(&e))))?;
    if r.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
        let status = r.status().as_u16();
        let body = read_capped(r, 64 << 10, "the proxy", "its answer")
            .await
            .unwrap_or_default();
        return Err(Error::transfer_failed(cut(format!(
            "{describe}: the proxy answered {status}, not a WebSocket: {}",
            String::from_utf8_lossy(&body).trim()
        ))));
    }
    let accept = r
        .headers()
        .get("sec-websocket-accept")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    if accept.as_deref() != Some(derive_accept_key(key.as_bytes()).as_str()) {
        return Err(Error::transfer_failed(format!(
            "{describe}: the upgrade's Sec-WebSocket-Accept is wrong"
        )));
    }
    let io = r
        .upgrade()
        .await
        .map_err(|e| Error::transfer_failed(format!("{describe}: {}", chain(&e))))?;
    let ws =
        tokio_tungstenite::WebSocketStream::from_raw_socket(io, Role::Client, Some(crate::runner::ws_config())).await;
    Ok(crate::runner::websocket_link(ws))
}

#[cfg(all(test, feature = "vendor-http"))]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_typed_codes() {
        assert_eq!(code_of_status(401), ErrorCode::PermissionDenied);
        assert_eq!(code_of_status(429), ErrorCode::Refused);
        assert_eq!(code_of_status(504), ErrorCode::Timeout);
        assert_eq!(code_of_status(502), ErrorCode::Unknown);
    }

    #[test]
    fn long_messages_are_cut_on_a_character() {
        let s = cut("é".repeat(MAX_MESSAGE));
        assert!(s.len() <= MAX_MESSAGE + '…'.len_utf8());
        assert!(s.ends_with('…'));
    }

    #[test]
    fn base_urls_must_be_http() {
        assert_eq!(base_url("http://a:1/api/", "V", "the URL").unwrap(), "http://a:1/api");
        assert!(
            base_url("ftp://a", "V", "the URL")
                .unwrap_err()
                .message()
                .contains("http")
        );
        assert!(base_url("not a url", "V", "the URL").is_err());
    }
}

//! Modal's two gRPC services as the provider calls them: the client service (apps, images,
//! sandboxes, tags, snapshots, tunnels) with the account's token on every call, and the
//! command router of each sandbox's task (execs) with the short-lived token the client
//! service hands out for it.
//!
//! Every call has a deadline (the smaller of the call's own and the caller's context), and a
//! call the caller gives up on is dropped at once. A call that is safe to repeat is tried
//! again while Modal answers `unavailable` (the connection dropped, the server restarting).
//! Modal's statuses become our typed errors here, naming the call; the tokens never appear in
//! one.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentbox_core::{Ctx, Error, ErrorCode, Result};
use agentbox_modal_proto::client as pb;
use agentbox_modal_proto::client::modal_client_client::ModalClientClient;
use agentbox_modal_proto::task_command_router::task_command_router_client::TaskCommandRouterClient;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::vendor::{ApiKey, cut};

/// The client version the provider says it speaks: the `modal` package whose protocol files
/// it was built from (Modal's server refuses clients it no longer supports by this header).
pub(crate) const CLIENT_VERSION: &str = "1.6.4";
/// `CLIENT_TYPE_CLIENT`: an SDK on a user's machine.
const CLIENT_TYPE: &str = "1";
/// How many times a call that is safe to repeat is tried while Modal is `unavailable`.
const TRIES: u32 = 5;

/// The account's token, as the `modal` client reads it (`MODAL_TOKEN_ID`,
/// `MODAL_TOKEN_SECRET`).
#[derive(Clone, Debug)]
pub(crate) struct Token {
    pub id: String,
    pub secret: ApiKey,
}

/// Adds the token (marked sensitive, so no log of a request shows it) and the client's
/// headers to every call of the client service.
#[derive(Clone)]
pub(crate) struct Auth {
    id: AsciiMetadataValue,
    secret: AsciiMetadataValue,
}

impl Auth {
    fn new(token: &Token) -> Result<Self> {
        let bad = |what: &str| Error::invalid(format!("{what}: not a value an HTTP header can carry"));
        let id = AsciiMetadataValue::try_from(token.id.as_str()).map_err(|_| bad("MODAL_TOKEN_ID"))?;
        let mut secret = AsciiMetadataValue::try_from(token.secret.expose()).map_err(|_| bad("MODAL_TOKEN_SECRET"))?;
        secret.set_sensitive(true);
        Ok(Auth { id, secret })
    }
}

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut r: tonic::Request<()>) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        let m = r.metadata_mut();
        m.insert("x-modal-token-id", self.id.clone());
        m.insert("x-modal-token-secret", self.secret.clone());
        m.insert("x-modal-client-type", MetadataValue::from_static(CLIENT_TYPE));
        m.insert("x-modal-client-version", MetadataValue::from_static(CLIENT_VERSION));
        Ok(r)
    }
}

/// Adds a task's router token to every call of its command router.
#[derive(Clone)]
pub(crate) struct Bearer(AsciiMetadataValue);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut r: tonic::Request<()>) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        r.metadata_mut().insert("authorization", self.0.clone());
        Ok(r)
    }
}

pub(crate) type Client = ModalClientClient<InterceptedService<Channel, Auth>>;
pub(crate) type Router = TaskCommandRouterClient<InterceptedService<Channel, Bearer>>;

/// The provider's connection to Modal: one channel to the client service (HTTP/2, many calls
/// at once), one per command router, made on first use and kept.
pub(crate) struct Api {
    client: Client,
    connect_timeout: Duration,
    /// The command router of each task, with the token it was opened with.
    routers: Mutex<HashMap<String, (Router, String)>>,
}

impl Api {
    pub(crate) fn new(server_url: &str, token: &Token, connect_timeout: Duration) -> Result<Self> {
        let channel = channel(server_url, connect_timeout, "MODAL_SERVER_URL")?;
        Ok(Api {
            client: ModalClientClient::with_interceptor(channel, Auth::new(token)?).max_decoding_message_size(64 << 20),
            connect_timeout,
            routers: Mutex::new(HashMap::new()),
        })
    }

    /// The client service.
    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    /// The command router of `task_id`: asked of the client service once (its address and a
    /// token for this task), then kept. `fresh` asks again (the token expired, or the router
    /// moved).
    pub(crate) async fn router(&self, task_id: &str, fresh: bool, ctx: &Ctx) -> Result<Router> {
        if !fresh && let Some((r, _)) = self.routers.lock().unwrap().get(task_id) {
            return Ok(r.clone());
        }
        let access = call(ctx, "TaskGetCommandRouterAccess", CALL_TIMEOUT, true, || {
            let mut c = self.client();
            let req = pb::TaskGetCommandRouterAccessRequest {
                task_id: task_id.to_string(),
            };
            async move { c.task_get_command_router_access(req).await }
        })
        .await?;
        let url = access.url.trim_end_matches('/').to_string();
        let channel = channel(&url, self.connect_timeout, "the command router's url")?;
        let mut bearer = AsciiMetadataValue::try_from(format!("Bearer {}", access.jwt))
            .map_err(|_| Error::unknown("TaskGetCommandRouterAccess: the token is not a header value"))?;
        bearer.set_sensitive(true);
        let router =
            TaskCommandRouterClient::with_interceptor(channel, Bearer(bearer)).max_decoding_message_size(64 << 20);
        self.routers
            .lock()
            .unwrap()
            .insert(task_id.to_string(), (router.clone(), url));
        Ok(router)
    }

    /// Forget the router of a task that ended.
    pub(crate) fn forget(&self, task_id: &str) {
        self.routers.lock().unwrap().remove(task_id);
    }
}

/// The deadline of one call that does no long work (everything but waits and snapshots).
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A channel to `url` (`http://` for a fake on loopback, `https://` with the system's roots
/// otherwise). Nothing connects until the first call.
fn channel(url: &str, connect_timeout: Duration, what: &str) -> Result<Channel> {
    let https = url.starts_with("https://");
    if !https && !url.starts_with("http://") {
        return Err(Error::invalid(format!(
            "{what} {url:?}: must be an http:// or https:// URL"
        )));
    }
    // A token goes over cleartext to nothing but this machine (a fake Modal on loopback), as
    // the `modal` client allows.
    if !https && !loopback(url) {
        return Err(Error::invalid(format!(
            "{what} {url:?}: plain http:// is taken only for a server on loopback; use https://"
        )));
    }
    let mut e = Endpoint::from_shared(url.to_string())
        .map_err(|e| Error::invalid(format!("{what} {url:?} is not a URL: {e}")))?
        .connect_timeout(connect_timeout)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20))
        .keep_alive_while_idle(true);
    if https {
        e = e
            .tls_config(ClientTlsConfig::new().with_native_roots())
            .map_err(|e| Error::invalid(format!("{what} {url:?}: TLS: {e}")))?;
    }
    Ok(e.connect_lazy())
}

/// Whether `url`'s host is this machine's loopback (`localhost`, `127.0.0.0/8`, `::1`).
fn loopback(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback())
}

/// Make the call `f` builds, within `timeout` and the caller's context; again (while both
/// allow, at most [`TRIES`] times) on `unavailable` where `idempotent`. Answers the message.
pub(crate) async fn call<T, F, Fut>(ctx: &Ctx, what: &str, timeout: Duration, idempotent: bool, f: F) -> Result<T>
where
    F: Fn() -> Fut,
    Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
{
    let until = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(200);
    let mut tries = 0;
    loop {
        tries += 1;
        let r = ctx
            .run(async {
                tokio::time::timeout_at(until, f())
                    .await
                    .map_err(|_| Error::timeout(format!("modal: {what}: no answer within {} s", timeout.as_secs())))
            })
            .await??;
        match r {
            Ok(a) => return Ok(a.into_inner()),
            Err(s) if s.code() == tonic::Code::Unavailable && idempotent && tries < TRIES => {
                tracing::debug!(call = what, tries, "modal: unavailable, trying again: {}", s.message());
                if tokio::time::Instant::now() + pause >= until {
                    return Err(status_error(what, &s));
                }
                ctx.run(tokio::time::sleep(pause)).await?;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            Err(s) => return Err(status_error(what, &s)),
        }
    }
}

/// Modal's status as one of our errors, naming the call. A status's message is Modal's own
/// (it never holds the caller's token), cut to a bounded length.
pub(crate) fn status_error(what: &str, s: &tonic::Status) -> Error {
    use tonic::Code;
    let code = match s.code() {
        Code::NotFound => ErrorCode::NotFound,
        Code::InvalidArgument | Code::OutOfRange => ErrorCode::Invalid,
        Code::Unauthenticated | Code::PermissionDenied => ErrorCode::PermissionDenied,
        Code::DeadlineExceeded => ErrorCode::Timeout,
        Code::ResourceExhausted | Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => ErrorCode::Refused,
        Code::Unimplemented => ErrorCode::Unsupported,
        Code::Cancelled => ErrorCode::Aborted,
        _ => ErrorCode::Unknown,
    };
    Error::new(code, cut(format!("modal: {what}: {} ({:?})", s.message(), s.code())))
}

/// A Modal sandbox tag list from labels.
pub(crate) fn tags(labels: impl IntoIterator<Item = (String, String)>) -> Vec<pb::SandboxTag> {
    labels
        .into_iter()
        .map(|(tag_name, tag_value)| pb::SandboxTag { tag_name, tag_value })
        .collect()
}

/// Shared between a provider and its boxes.
pub(crate) type Shared = Arc<Api>;

#[cfg(test)]
mod tests {
    #[test]
    fn plain_http_is_for_loopback_alone() {
        for ok in [
            "http://127.0.0.1:9000",
            "http://localhost",
            "http://[::1]:80/x",
            "http://127.9.0.1",
        ] {
            assert!(super::loopback(ok), "{ok}");
        }
        for no in [
            "http://api.modal.com",
            "http://10.0.0.1:80",
            "http://127.0.0.1.evil.com",
            "http://[::2]",
        ] {
            assert!(!super::loopback(no), "{no}");
        }
        let e = super::channel(
            "http://api.modal.com",
            std::time::Duration::from_secs(1),
            "MODAL_SERVER_URL",
        )
        .unwrap_err();
        assert!(e.message().contains("loopback"), "{e}");
    }
}

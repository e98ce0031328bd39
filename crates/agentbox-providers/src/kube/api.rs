//! The Kubernetes API as the provider calls it: its errors in the contract's words, a call retried
//! where the server asks again (conflicts, throttling, a server that went away a moment), and the
//! deletes of a box's pod and network policy.

use std::time::Duration;

use agentbox_core::{Ctx, Error, ErrorCode, Labels, Result};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::DeleteParams;
use kube::{Api, Client};

use super::{NAME, pod};

/// The name of the network policy that keeps a box of no network to itself.
pub(super) fn policy_name(pod: &str) -> String {
    format!("{pod}-deny-all")
}

/// A kube-rs error as one of ours, naming `what` was being done. Never the request's
/// headers (the token).
pub(super) fn api_error(e: kube::Error, what: &str) -> Error {
    match &e {
        kube::Error::Api(s) => {
            let msg = format!("{what}: {} ({} {})", s.message, s.code, s.reason);
            match s.code {
                404 => Error::not_found(msg),
                409 => Error::new(ErrorCode::Refused, msg),
                400 | 422 => Error::invalid(msg),
                401 | 403 => Error::new(ErrorCode::PermissionDenied, msg),
                429 => Error::new(ErrorCode::Refused, msg),
                _ => Error::unknown(msg),
            }
        }
        // A credential plugin's error may quote its output, which can hold a token.
        kube::Error::Auth(_) => Error::new(
            ErrorCode::PermissionDenied,
            format!("{what}: the kubeconfig's credentials could not be had (details withheld: they may hold a secret)"),
        ),
        _ => {
            let text = e.to_string();
            // kube-rs's own deadlines (connect, read, write) surface as service errors.
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            let mut timed_out = false;
            while let Some(c) = cause {
                let t = c.to_string();
                timed_out |= t.contains("timed out") || t.contains("deadline has elapsed");
                cause = c.source();
            }
            if timed_out {
                Error::timeout(format!("{what}: the API server did not answer in time ({text})"))
            } else {
                Error::unknown(format!("{what}: {text}"))
            }
        }
    }
}

/// How many times a throttled (429) or briefly unavailable (503) request is tried.
pub(super) const TRIES: u32 = 6;

/// Run one API call, again after a pause where the server said it is throttling (429) or
/// not ready (503), at most [`TRIES`] times; every other error is the answer.
pub(super) async fn retry<T, F, Fut>(ctx: &Ctx, what: &str, call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, kube::Error>>,
{
    attempt(ctx, call).await?.map_err(|e| api_error(e, what))
}

/// [`retry`], answering the API's own error for the caller to read (a 409, say); the outer
/// error is the context's end.
pub(super) async fn attempt<T, F, Fut>(ctx: &Ctx, mut call: F) -> Result<std::result::Result<T, kube::Error>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, kube::Error>>,
{
    let mut pause = Duration::from_millis(200);
    for n in 1..=TRIES {
        match ctx.run(call()).await? {
            Err(kube::Error::Api(s)) if (s.code == 429 || s.code == 503) && n < TRIES => {
                tracing::debug!(code = s.code, attempt = n, "the API server asked to retry");
                ctx.run(tokio::time::sleep(pause)).await?;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            r => return Ok(r),
        }
    }
    unreachable!("the last attempt returns")
}

pub(super) fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Delete a pod now (grace 0): absent already is done.
pub(super) async fn delete_pod(api: &Api<Pod>, name: &str, ctx: &Ctx) -> Result<()> {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    match retry(ctx, "deleting the pod", || api.delete(name, &dp)).await {
        Ok(_) => Ok(()),
        Err(e) if e.code() == ErrorCode::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Delete the network policy of the box whose pod is `pod_name`: absent already is done.
pub(super) async fn delete_policy(client: &Client, namespace: &str, pod_name: &str, ctx: &Ctx) -> Result<()> {
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), namespace);
    let (name, dp) = (policy_name(pod_name), DeleteParams::default());
    match retry(ctx, "deleting the network policy", || policies.delete(&name, &dp)).await {
        Ok(_) => Ok(()),
        Err(e) if e.code() == ErrorCode::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// A label selector: the provider's own label and the host's.
pub(super) fn selector(labels: &Labels) -> String {
    let mut s = format!("{}={NAME}", pod::LABEL_PROVIDER);
    for (k, v) in labels {
        s.push_str(&format!(",{k}={v}"));
    }
    s
}

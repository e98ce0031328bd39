//! The runner in an E2B sandbox: this machine's static `agentbox-runner`, uploaded through
//! envd, started on a port of its own (its token on stdin, never in a file or argv of the box),
//! and reached through E2B's proxy to that port as a WebSocket.
//!
//! Through it a box keeps its processes (listed, read from a byte number and attached to by any
//! host holding the key, outliving the caller that started them) and serves its files one
//! message per operation. envd alone cannot: its process `Connect` streams only from the moment
//! of attaching and keeps no exit status, so a program's output before the attach, or its end
//! while no one listened, would be lost.
//!
//! The port is written in the box ([`PORT_FILE`]) because E2B's metadata cannot change after a
//! create; the token is derived from the key and the sandbox id
//! ([`crate::vendor::runner_token`]), so no host needs to keep anything. A pause ends every
//! program of the sandbox, the runner too: a wake starts another.

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Error, ErrorCode, Result};
use async_trait::async_trait;

use super::E2bSandbox;
use crate::helper::HelperCommand;
use crate::runner::{Dial, Link, RunnerSandbox};

/// Where the port of the box's runner is written in the box.
pub(crate) const PORT_FILE: &str = "/tmp/agentbox/runner-port";
/// Where the runner binary is written in the sandbox (a suffix of its own per start: a runner
/// of an earlier start may still run from the last one).
const RUNNER_IN_BOX: &str = "/tmp/agentbox/agentbox-runner";
/// How long the WebSocket's upgrade may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// The ports the runner is started on: below Linux's ephemeral range, so no connection of the
/// box's own programs holds one.
const PORTS: std::ops::Range<u16> = 20000..32000;

/// The runner of one sandbox, behind E2B's proxy to its port.
pub(crate) struct ProxyDial {
    pub(crate) http: reqwest::Client,
    /// The proxy's URL for the port (`E2B_SANDBOX_URL`, else `https://{port}-{id}.{domain}`).
    pub(crate) url: String,
    pub(crate) sandbox: String,
    pub(crate) port: u16,
    pub(crate) runner_token: String,
}

#[async_trait]
impl Dial for ProxyDial {
    async fn dial(&self, ctx: &Ctx) -> Result<Link> {
        // The headers are how E2B's proxy is told the sandbox and port where one URL serves
        // them all (`E2B_SANDBOX_URL`); a host of the port's own ignores them.
        let request = self
            .http
            .get(&self.url)
            .header("E2b-Sandbox-Id", &self.sandbox)
            .header("E2b-Sandbox-Port", self.port.to_string());
        let describe = self.describe();
        let open = crate::vendor::runner_websocket(request, &self.runner_token, &describe);
        match ctx.run(tokio::time::timeout(OPEN_TIMEOUT, open)).await? {
            Ok(r) => r,
            Err(_) => Err(Error::timeout(format!(
                "{} did not answer within {} s",
                self.describe(),
                OPEN_TIMEOUT.as_secs()
            ))),
        }
    }

    fn describe(&self) -> String {
        format!(
            "the runner in E2B sandbox {} (port {}, through E2B's proxy)",
            self.sandbox, self.port
        )
    }
}

/// The port the box's runner was started on, as written in the box; `None` where none was (a
/// file that is not a port is taken as none: the box may have written anything there).
pub(crate) async fn port_of(b: &E2bSandbox, ctx: &Ctx) -> Result<Option<u16>> {
    match b.envd.download(ctx, PORT_FILE, 16).await {
        Ok(bytes) => Ok(std::str::from_utf8(&bytes)
            .ok()
            .and_then(|t| t.trim().parse::<u16>().ok())
            .filter(|p| PORTS.contains(p))),
        Err(e) if matches!(e.code(), ErrorCode::NotFound | ErrorCode::TooLarge) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Upload `bytes` (the runner) into the box, start it on a free port with `token`, and write
/// the port in the box. A port taken is tried again elsewhere, six times in all.
pub(crate) async fn install(
    b: &Arc<E2bSandbox>,
    helper: &HelperCommand,
    bytes: &[u8],
    token: &str,
    ctx: &Ctx,
) -> Result<u16> {
    let path = format!("{RUNNER_IN_BOX}-{}", crate::random::random_hex(4)?);
    b.envd.upload(ctx, &path, bytes).await?;
    let mut program = ["sh", "-c", r#"chmod 755 "$1" && exec "$@""#, "agentbox-runner", &path]
        .map(String::from)
        .to_vec();
    program.extend(helper.args.iter().cloned());
    let mut last = None;
    for _ in 0..6 {
        let mut r = [0u8; 2];
        getrandom::fill(&mut r).map_err(|e| Error::unknown(format!("the kernel gave no random bytes: {e}")))?;
        let port = PORTS.start + u16::from_le_bytes(r) % (PORTS.end - PORTS.start);
        let listen = [format!("0.0.0.0:{port}")];
        match crate::runner::start(&**b, &program, &listen, Some(token), ctx).await {
            Ok(_) => {
                b.envd.upload(ctx, PORT_FILE, port.to_string().as_bytes()).await?;
                tracing::info!(sandbox = %b.id.name(), port, "e2b: runner started");
                return Ok(port);
            }
            Err(e) if e.message().contains("already listens") || e.message().contains("in use") => {
                last = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| Error::unknown("the runner found no free port")))
}

/// The box through its runner on `port`.
pub(crate) fn through(b: Arc<E2bSandbox>, dial: ProxyDial) -> RunnerSandbox {
    RunnerSandbox::new(b, Arc::new(dial))
}

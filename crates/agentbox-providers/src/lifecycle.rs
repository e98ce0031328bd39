//! What every provider's lifecycle shares: the provider's own name for a box opened by name,
//! the handle of a box that sleeps, and that of a box a list could not read.
//!
//! See `agentbox_core::Provider::open` and friends for the contract.

use std::sync::Arc;

use agentbox_core::{
    Ctx, Endpoint, Error, ExecOptions, Facts, Labels, Process, Result, Sandbox, SandboxId, Status, validate_name,
};
use async_trait::async_trait;

/// The provider's own id of the box named `name` among boxes labelled exactly `labels`:
/// `<name>-<12 hex digits of the labels>`, the same from every process, so that two opens of
/// one name meet at one id (a directory, a container name) and the platform's own refusal of
/// a second make of it (`mkdir`, the engine's name conflict) decides which made it.
///
/// The hash only spreads label sets apart; a provider checks the box it finds carries exactly
/// this name and these labels before it hands it out.
///
/// For example `dev` with no labels is `dev-` and twelve hex digits, the same from every
/// process (the unit test below holds it).
#[cfg_attr(
    not(any(
        feature = "local",
        feature = "namespace",
        feature = "docker",
        feature = "kube",
        feature = "daytona"
    )),
    allow(dead_code)
)]
pub(crate) fn name_key(name: &str, labels: &Labels) -> Result<String> {
    validate_name("name", name)?;
    // FNV-1a over the labels with separators no key or value holds (labels are validated to
    // carry no control characters).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (k, v) in labels {
        for b in k.bytes().chain([0u8]).chain(v.bytes()).chain([1u8]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    Ok(format!("{name}-{:012x}", h & 0xffff_ffff_ffff))
}

/// A fork's `n` boxes, each from `make`: all or none. A make that fails ends the boxes made
/// before it (each within 30 s), and the error says whose fork it was.
#[cfg(any(feature = "local", feature = "namespace", feature = "docker"))]
pub(crate) async fn all_or_none<F, Fut>(id: &SandboxId, n: usize, mut make: F) -> Result<Vec<Arc<dyn Sandbox>>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Arc<dyn Sandbox>>>,
{
    let mut made: Vec<Arc<dyn Sandbox>> = Vec::with_capacity(n);
    for _ in 0..n {
        match make().await {
            Ok(b) => made.push(b),
            Err(e) => {
                for b in &made {
                    let _ = b
                        .destroy(&Ctx::background().with_timeout(std::time::Duration::from_secs(30)))
                        .await;
                }
                return Err(Error::new(e.code(), format!("fork of {id}: {}", e.message())));
            }
        }
    }
    tracing::info!(box_id = %id, n, "forked");
    Ok(made)
}

/// The refusal of a sleeping box for anything but status and destroy.
pub(crate) fn asleep_error(id: &SandboxId) -> Error {
    Error::refused(format!("box {id}: it sleeps; wake it first (agentbox box wake {id})"))
}

/// A box that sleeps: its id, facts and labels as the box under it says, its status
/// [`Status::Sleeping`] (or ended, once it has), and every program or file refused
/// ([`asleep_error`]) until the provider wakes it. Destroy ends it as it would an awake one.
pub struct Asleep {
    inner: Arc<dyn Sandbox>,
}

impl Asleep {
    /// The sleeping handle of `inner`, as the trait object every provider answers.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(inner: Arc<dyn Sandbox>) -> Arc<dyn Sandbox> {
        Arc::new(Asleep { inner })
    }
}

#[async_trait]
impl Sandbox for Asleep {
    fn id(&self) -> &SandboxId {
        self.inner.id()
    }

    fn facts(&self) -> &Facts {
        self.inner.facts()
    }

    fn labels(&self) -> &Labels {
        self.inner.labels()
    }

    async fn exec(&self, _argv: &[String], _opts: &ExecOptions, _ctx: &Ctx) -> Result<Process> {
        Err(asleep_error(self.id()))
    }

    async fn status(&self, ctx: &Ctx) -> Result<Status> {
        Ok(match self.inner.status(ctx).await? {
            Status::Ended => Status::Ended,
            _ => Status::Sleeping,
        })
    }

    async fn upload(&self, _path: &str, _data: &[u8], _ctx: &Ctx) -> Result<()> {
        Err(asleep_error(self.id()))
    }

    async fn download(&self, _path: &str, _max_bytes: u64, _ctx: &Ctx) -> Result<Vec<u8>> {
        Err(asleep_error(self.id()))
    }

    async fn endpoint(&self, _port: u16, _ctx: &Ctx) -> Result<Endpoint> {
        Err(asleep_error(self.id()))
    }

    async fn destroy(&self, ctx: &Ctx) -> Result<()> {
        self.inner.destroy(ctx).await
    }

    async fn net_refusals(&self, max: usize, ctx: &Ctx) -> Result<Vec<agentbox_core::NetRefusal>> {
        // The proxy's log is the host's: readable while the box sleeps.
        self.inner.net_refusals(max, ctx).await
    }
}

/// A box a list found and could not read (its runner does not answer this machine, say): its
/// id, facts and labels as found, [`Sandbox::status`] and every program or file refused with
/// the reason, and destroy as the box under it does. A list hands it out rather than leaving
/// the box out or starting anything in it.
pub struct Unreadable {
    inner: Arc<dyn Sandbox>,
    why: String,
}

impl Unreadable {
    /// The unreadable handle of `inner`, `why` saying what could not be read.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(inner: Arc<dyn Sandbox>, why: impl Into<String>) -> Arc<dyn Sandbox> {
        Arc::new(Unreadable { inner, why: why.into() })
    }

    fn error(&self) -> Error {
        Error::unknown(format!("box {}: unreadable: {}", self.id(), self.why))
    }
}

#[async_trait]
impl Sandbox for Unreadable {
    fn id(&self) -> &SandboxId {
        self.inner.id()
    }

    fn facts(&self) -> &Facts {
        self.inner.facts()
    }

    fn labels(&self) -> &Labels {
        self.inner.labels()
    }

    async fn exec(&self, _argv: &[String], _opts: &ExecOptions, _ctx: &Ctx) -> Result<Process> {
        Err(self.error())
    }

    async fn status(&self, _ctx: &Ctx) -> Result<Status> {
        Err(self.error())
    }

    async fn upload(&self, _path: &str, _data: &[u8], _ctx: &Ctx) -> Result<()> {
        Err(self.error())
    }

    async fn download(&self, _path: &str, _max_bytes: u64, _ctx: &Ctx) -> Result<Vec<u8>> {
        Err(self.error())
    }

    async fn endpoint(&self, _port: u16, _ctx: &Ctx) -> Result<Endpoint> {
        Err(self.error())
    }

    async fn destroy(&self, ctx: &Ctx) -> Result<()> {
        self.inner.destroy(ctx).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_key_is_the_name_and_its_label_set() {
        let none = Labels::new();
        let team = Labels::from([("team".to_string(), "a".to_string())]);
        let other = Labels::from([("team".to_string(), "b".to_string())]);
        let a = name_key("dev", &none).unwrap();
        assert!(a.starts_with("dev-") && a.len() == "dev-".len() + 12, "{a}");
        assert_eq!(a, name_key("dev", &none).unwrap(), "the same from every call");
        assert_ne!(name_key("dev", &team).unwrap(), name_key("dev", &other).unwrap());
        assert_ne!(a, name_key("dev", &team).unwrap());
        // A key and a value cannot trade bytes across the separator.
        let ab = Labels::from([("a".to_string(), "bc".to_string())]);
        let abc = Labels::from([("ab".to_string(), "c".to_string())]);
        assert_ne!(name_key("x", &ab).unwrap(), name_key("x", &abc).unwrap());
        assert!(name_key("Dev", &none).is_err());
    }
}

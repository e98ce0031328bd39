//! What every provider's lifecycle shares: the provider's own name for a box opened by name,
//! the handle of a box that sleeps, and that of a box a list could not read.
//!
//! See `agentbox_core::Lifecycle::open` and friends for the contract.

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

/// What [`open_as_asked`] keeps of an open under `$AGENTBOX_HOME/opened`: the spec asked and
/// the box's deadline then (past it, the box may have ended and been made again).
#[derive(serde::Serialize, serde::Deserialize)]
struct Opened {
    spec: serde_json::Value,
    ends_at_ms: Option<u64>,
}

/// [`Lifecycle::open`](agentbox_core::Lifecycle::open), refusing (`refused`) a box found by the
/// name whose spec differs from `spec` in any field but its labels (the labels are part of the
/// name's place), naming each field that differs; the lifetime compared is the one asked, not
/// the time left. With `replace`, the box of the name is discarded first and one made from
/// `spec`. The spec each open asked is kept in this home, so a box another home made (or one
/// made before this home kept specs) is taken as it is and its spec kept from then on.
pub async fn open_as_asked(
    p: &dyn agentbox_core::Provider,
    name: &str,
    spec: &agentbox_core::Spec,
    replace: bool,
    ctx: &Ctx,
) -> Result<Arc<dyn Sandbox>> {
    let dir = crate::home::default_home()?.join("opened").join(p.name());
    let path = dir.join(format!("{}.json", name_key(name, &spec.labels)?));
    let asked = serde_json::to_value(spec).map_err(|e| Error::unknown(format!("open {name:?}: the spec: {e}")))?;
    if replace {
        if p.discard(name, &spec.labels, ctx).await? {
            tracing::info!(
                provider = p.name(),
                name,
                "open --replace: the box of the name discarded"
            );
        }
        forget_opened(p.name(), name, &spec.labels)?;
    }
    let b = p.open(name, spec, ctx).await?;
    let kept: Option<Opened> = std::fs::read(&path)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok());
    if let Some(kept) = kept
        && kept.ends_at_ms.is_some_and(|e| e > agentbox_core::now_ms())
    {
        let differ = differing(&kept.spec, &asked);
        if !differ.is_empty() {
            return Err(Error::refused(format!(
                "open {name:?}: box {} was opened with another spec ({} differ); open it as it was, \
                 or --replace to end it and make one of this spec",
                b.id(),
                differ.join(", ")
            )));
        }
        return Ok(b);
    }
    let record = Opened {
        spec: asked,
        ends_at_ms: b.facts().ends_at_ms,
    };
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(e, format!("creating {}", dir.display())))?;
    let bytes = serde_json::to_vec(&record).map_err(|e| Error::unknown(e.to_string()))?;
    crate::atomic::write_atomic(&path, &bytes)?;
    Ok(b)
}

/// Forget the spec [`open_as_asked`] kept of the box named `name` (labels `labels`) of the
/// provider `provider`: the box was discarded, and the next open makes one of its own spec.
pub fn forget_opened(provider: &str, name: &str, labels: &Labels) -> Result<()> {
    let path = crate::home::default_home()?
        .join("opened")
        .join(provider)
        .join(format!("{}.json", name_key(name, labels)?));
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(e, format!("removing {}", path.display()))),
    }
}

/// The fields of two specs (as JSON) that differ, labels apart, by the names a person gives
/// them (`lifetime` for the one asked).
fn differing(was: &serde_json::Value, now: &serde_json::Value) -> Vec<String> {
    let empty = serde_json::Map::new();
    let (was, now) = (was.as_object().unwrap_or(&empty), now.as_object().unwrap_or(&empty));
    let mut keys: Vec<&String> = was.keys().chain(now.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| k.as_str() != "labels" && was.get(*k) != now.get(*k))
        .map(|k| match k.as_str() {
            "max_lifetime_ms" => "lifetime".to_string(),
            other => other.to_string(),
        })
        .collect()
}

/// The refusal of a sleeping box for anything but status and destroy.
pub(crate) fn asleep_error(id: &SandboxId) -> Error {
    Error::refused(format!("box {id}: it sleeps; wake it first (agentbox box wake {id})"))
}

/// A box that sleeps: its id, facts and labels as the box under it says, its status
/// [`Status::Sleeping`] (or ended, once it has), and every program or file refused
/// (`asleep_error`) until the provider wakes it. Destroy ends it as it would an awake one.
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

    #[test]
    fn specs_differ_by_the_fields_asked_not_the_labels() {
        let mut a = agentbox_core::Spec::new(std::time::Duration::from_secs(60));
        a.labels.insert("team".into(), "a".into());
        let mut b = a.clone();
        b.labels.clear();
        let v = |s: &agentbox_core::Spec| serde_json::to_value(s).unwrap();
        assert!(differing(&v(&a), &v(&b)).is_empty());
        b.max_lifetime = std::time::Duration::from_secs(120);
        b.env.insert("K".into(), "V".into());
        b.image = Some("x".into());
        assert_eq!(differing(&v(&a), &v(&b)), ["env", "image", "lifetime"]);
    }
}

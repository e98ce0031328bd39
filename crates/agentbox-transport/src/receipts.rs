//! What each box cost, at the host's prices: [`Receipts::wrap`] is the same provider, and each
//! box it makes gets one receipt when it ends (destroyed through it, found ended by status, or
//! found gone by attach), written as one JSON line:
//!
//! `{box, provider, kind, from, to, seconds, usd_per_second | usd_per_call and calls, cost_usd, source, priced}`
//!
//! in the envelope of a live line: `{"source": "transport", "kind": "box.receipt", "at":
//! RFC 3339, "data": {…}}`, so a recording that holds lines of many sources tells a receipt by
//! its kind ([`receipt_in`] reads a line of either shape, the flat one of older files too).
//!
//! `box` is a label (`box-1`, `box-2`, … numbered on past those a recording already holds),
//! never the provider's id, or the host's own ([`Hooks::label`]). A box's kind comes from its
//! facts, or from the host's [`Hooks::kind_of`]. This crate holds no price table: a box with
//! no price gets no receipt, so its cost stays unknown, never 0. `cost_usd` is an estimate at
//! list price.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use agentbox_core::{
    Clock, Ctx, Endpoint, Error, ErrorCode, ExecOptions, Facts, Files, Labels, Lifecycle, Process, Provider, Result,
    Sandbox, SandboxId, Spec, Status, SystemClock,
};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// One price the host read somewhere.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Price {
    /// The provider's name.
    pub provider: String,
    /// The kind of box: `gpu:<gpu>` for one with a GPU, else its isolation (`container`, `none`).
    pub kind: String,
    /// Billed by the second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd_per_second: Option<f64>,
    /// Billed by the exec call (and then never by the second).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd_per_call: Option<f64>,
    /// Where the price was read.
    pub source: String,
    /// When it was read.
    pub priced: String,
}

/// The kind of a box, from its facts.
pub fn kind_of(facts: &Facts) -> String {
    match &facts.gpu {
        Some(g) => format!("gpu:{g}"),
        None => facts.isolation.clone(),
    }
}

/// The source of a receipt's live line.
pub const LINE_SOURCE: &str = "transport";
/// The kind of a receipt's live line.
pub const LINE_KIND: &str = "box.receipt";

/// The receipt a line of a receipts file or recording holds: the `data` of a `box.receipt`
/// envelope, or a flat receipt (a file written before the envelope); `None` for any other line.
pub fn receipt_in(line: &serde_json::Value) -> Option<&serde_json::Value> {
    match line.get("kind").and_then(|k| k.as_str()) {
        Some(LINE_KIND) if line.get("source").and_then(|s| s.as_str()) == Some(LINE_SOURCE) => {
            line.get("data").filter(|d| d.is_object())
        }
        _ if line.get("box").is_some() && line.get("cost_usd").is_some() => Some(line),
        _ => None,
    }
}

/// A box just made, as the host's hooks see it: its provider, the kind found from its facts,
/// the request it was made from and its facts (never its id: a host labels a box by what it
/// asked for, not by the order boxes came back in).
pub struct Made<'a> {
    /// The provider's name.
    pub provider: &'a str,
    /// Its kind, found from its facts ([`kind_of`]) or by [`Hooks::kind_of`].
    pub kind: &'a str,
    /// The request it was made from.
    pub spec: &'a Spec,
    /// What it got.
    pub facts: &'a Facts,
}

/// The host's own labeler: called once for each box made.
pub type Labeler = Arc<dyn Fn(&Made<'_>) -> String + Send + Sync>;
/// The host's own kinds: a kind for a box of this provider and facts, or `None` for the one
/// [`kind_of`] finds.
pub type KindOf = Arc<dyn Fn(&str, &Facts) -> Option<String> + Send + Sync>;

/// What a host may change in its receipts: their clock, their labels, their kinds.
#[derive(Clone, Default)]
pub struct Hooks {
    /// Times the receipts (the system clock when absent).
    pub clock: Option<Arc<dyn Clock>>,
    /// Labels each box (`box-1`, `box-2`, … when absent).
    pub label: Option<Labeler>,
    /// Finds a box's kind first.
    pub kind_of: Option<KindOf>,
}

struct Entry {
    label: String,
    provider: String,
    kind: String,
    from_ms: u64,
    /// Billed by the call ([`Facts::billed_per_call`]): only a per-call price applies.
    per_call: bool,
    calls: AtomicU64,
    done: AtomicBool,
}

/// The ledger of the boxes its providers make. See the [module documentation](self).
///
/// ```no_run
/// # fn f(local: std::sync::Arc<dyn agentbox_core::Provider>) -> agentbox_core::Result<()> {
/// use agentbox_transport::receipts::{Price, Receipts};
/// let prices = vec![Price { provider: "local".into(), kind: "none".into(), usd_per_second: Some(0.00001),
///     usd_per_call: None, source: "our own".into(), priced: "2026-11-30".into() }];
/// let receipts = Receipts::open("receipts.jsonl".as_ref(), prices)?;
/// let provider = receipts.wrap(local); // hand this one to everything that makes boxes
/// # Ok(()) }
/// ```
pub struct Receipts {
    prices: Vec<Price>,
    path: PathBuf,
    file: Mutex<std::fs::File>,
    next: AtomicU64,
    boxes: Mutex<HashMap<SandboxId, Arc<Entry>>>,
    clock: Arc<dyn Clock>,
    label: Option<Labeler>,
    kind_of: Option<KindOf>,
}

impl Receipts {
    /// Append receipts to the JSONL file at `path`, numbering boxes on past the labels it holds.
    pub fn open(path: &Path, prices: Vec<Price>) -> Result<Arc<Self>> {
        Self::open_with_clock(path, prices, Arc::new(SystemClock))
    }

    /// As [`Receipts::open`], timed by `clock`.
    pub fn open_with_clock(path: &Path, prices: Vec<Price>, clock: Arc<dyn Clock>) -> Result<Arc<Self>> {
        Self::open_with(
            path,
            prices,
            Hooks {
                clock: Some(clock),
                ..Default::default()
            },
        )
    }

    /// As [`Receipts::open`], with the host's [`Hooks`].
    ///
    /// ```no_run
    /// # fn f() -> agentbox_core::Result<()> {
    /// use std::sync::Arc;
    /// use agentbox_transport::receipts::{Hooks, Receipts};
    /// let hooks = Hooks {
    ///     // The host's own label, read from the request it made.
    ///     label: Some(Arc::new(|made| made.spec.labels.get("task").cloned().unwrap_or_else(|| "untasked".into()))),
    ///     ..Default::default()
    /// };
    /// let receipts = Receipts::open_with("receipts.jsonl".as_ref(), vec![], hooks)?;
    /// # Ok(()) }
    /// ```
    pub fn open_with(path: &Path, prices: Vec<Price>, hooks: Hooks) -> Result<Arc<Self>> {
        let clock = hooks.clock.unwrap_or_else(|| Arc::new(SystemClock));
        for p in &prices {
            match (p.usd_per_second, p.usd_per_call) {
                (Some(x), None) | (None, Some(x)) if x.is_finite() && x >= 0.0 => {}
                _ => {
                    return Err(Error::invalid(format!(
                        "price of {} {}: give exactly one of usd_per_second and usd_per_call, a number 0 or more",
                        p.provider, p.kind
                    )));
                }
            }
        }
        let taken = match std::fs::read_to_string(path) {
            Ok(text) => text
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter_map(|v| {
                    receipt_in(&v)?
                        .get("box")?
                        .as_str()?
                        .strip_prefix("box-")?
                        .parse::<u64>()
                        .ok()
                })
                .max()
                .unwrap_or(0),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(Error::io(e, format!("reading {}", path.display()))),
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| Error::io(e, format!("opening {}", path.display())))?;
        Ok(Arc::new(Receipts {
            prices,
            path: path.to_path_buf(),
            file: Mutex::new(file),
            next: AtomicU64::new(taken + 1),
            boxes: Mutex::new(HashMap::new()),
            clock,
            label: hooks.label,
            kind_of: hooks.kind_of,
        }))
    }

    /// The same provider, whose boxes get receipts.
    pub fn wrap(self: &Arc<Self>, provider: Arc<dyn Provider>) -> Arc<dyn Provider> {
        Arc::new(ReceiptProvider {
            inner: provider,
            receipts: self.clone(),
        })
    }

    /// The price of a box of `provider` and `kind` billed the way it is: a per-call price for a
    /// box billed per call, a per-second price for any other. A price that bills it the other
    /// way is passed over, loudly, so a box's cost stays unknown rather than wrong.
    fn price(&self, provider: &str, kind: &str, per_call: bool) -> Option<&Price> {
        let mut found = self.prices.iter().filter(|p| p.provider == provider && p.kind == kind);
        let price = found.clone().find(|p| p.usd_per_call.is_some() == per_call);
        if price.is_none() && found.next().is_some() {
            tracing::warn!(
                provider,
                kind,
                "receipts: the only price given bills {} but the box is billed {}: no receipt",
                if per_call { "by the second" } else { "by the call" },
                if per_call { "by the call" } else { "by the second" },
            );
        }
        price
    }

    fn register(&self, b: &dyn Sandbox, provider: &str, spec: &Spec) -> Arc<Entry> {
        let facts = b.facts();
        let kind = self
            .kind_of
            .as_ref()
            .and_then(|k| k(provider, facts))
            .unwrap_or_else(|| kind_of(facts));
        let label = match &self.label {
            Some(l) => l(&Made {
                provider,
                kind: &kind,
                spec,
                facts,
            }),
            None => format!("box-{}", self.next.fetch_add(1, Ordering::SeqCst)),
        };
        let entry = Arc::new(Entry {
            label,
            provider: provider.to_string(),
            kind,
            from_ms: b.facts().started_at_ms.unwrap_or_else(|| self.clock.now_ms()),
            per_call: b.facts().billed_per_call,
            calls: AtomicU64::new(0),
            done: AtomicBool::new(false),
        });
        self.boxes.lock().unwrap().insert(b.id().clone(), entry.clone());
        entry
    }

    /// Write `entry`'s receipt once, ended now.
    fn finish(&self, id: &SandboxId, entry: &Entry) -> Result<()> {
        if entry.done.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.boxes.lock().unwrap().remove(id);
        let Some(price) = self.price(&entry.provider, &entry.kind, entry.per_call) else {
            return Ok(());
        };
        let to = self.clock.now_ms().max(entry.from_ms);
        let seconds = (to - entry.from_ms) as f64 / 1000.0;
        let mut r = json!({
            "box": entry.label,
            "provider": entry.provider,
            "kind": entry.kind,
            "from": agentbox_core::rfc3339(entry.from_ms as i64),
            "to": agentbox_core::rfc3339(to as i64),
            "seconds": seconds,
            "source": price.source,
            "priced": price.priced,
        });
        let cost = match (price.usd_per_second, price.usd_per_call) {
            (Some(per_s), _) => {
                r["usd_per_second"] = json!(per_s);
                per_s * seconds
            }
            (None, Some(per_call)) => {
                let calls = entry.calls.load(Ordering::SeqCst);
                r["usd_per_call"] = json!(per_call);
                r["calls"] = json!(calls);
                (per_call * calls as f64 * 1e9).round() / 1e9
            }
            (None, None) => return Ok(()),
        };
        r["cost_usd"] = json!(cost);
        let line = json!({
            "source": LINE_SOURCE,
            "kind": LINE_KIND,
            "at": agentbox_core::rfc3339(to as i64),
            "data": r,
        });
        let mut f = self.file.lock().unwrap();
        writeln!(f, "{line}")
            .and_then(|_| f.sync_data())
            .map_err(|e| Error::io(e, format!("writing a receipt to {}", self.path.display())))
    }
}

struct ReceiptProvider {
    inner: Arc<dyn Provider>,
    receipts: Arc<Receipts>,
}

impl ReceiptProvider {
    fn ours(&self, b: Arc<dyn Sandbox>) -> Arc<dyn Sandbox> {
        let entry = self.receipts.boxes.lock().unwrap().get(b.id()).cloned();
        match entry {
            Some(entry) => Arc::new(ReceiptSandbox {
                inner: b,
                entry,
                receipts: self.receipts.clone(),
            }),
            // Another process's or host's box: its maker's to receipt.
            None => b,
        }
    }
}

#[async_trait]
impl Provider for ReceiptProvider {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn honours(&self) -> agentbox_core::Honours {
        self.inner.honours()
    }
    async fn create(&self, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let b = self.inner.create(spec, ctx).await?;
        self.receipts.register(b.as_ref(), self.inner.name(), spec);
        Ok(self.ours(b))
    }
    async fn attach(&self, id: &SandboxId, ctx: &Ctx) -> Result<Option<Arc<dyn Sandbox>>> {
        match self.inner.attach(id, ctx).await? {
            Some(b) => Ok(Some(self.ours(b))),
            None => {
                let entry = self.receipts.boxes.lock().unwrap().get(id).cloned();
                if let Some(e) = entry {
                    self.receipts.finish(id, &e)?;
                }
                Ok(None)
            }
        }
    }
    async fn list(&self, labels: &Labels, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        Ok(self
            .inner
            .list(labels, ctx)
            .await?
            .into_iter()
            .map(|b| self.ours(b))
            .collect())
    }

    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        Some(self)
    }
}

#[async_trait]
impl Lifecycle for ReceiptProvider {
    // The lifecycle passes through: a box opened or forked here is receipted as one made here;
    // one woken, extended or relabelled keeps the receipt it had.
    async fn open(&self, name: &str, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let b = self.inner.open(name, spec, ctx).await?;
        if !self.receipts.boxes.lock().unwrap().contains_key(b.id()) {
            self.receipts.register(b.as_ref(), self.inner.name(), spec);
        }
        Ok(self.ours(b))
    }

    async fn discard(&self, name: &str, labels: &Labels, ctx: &Ctx) -> Result<bool> {
        self.inner.discard(name, labels, ctx).await
    }

    async fn sleep(&self, id: &SandboxId, ctx: &Ctx) -> Result<()> {
        self.inner.sleep(id, ctx).await
    }

    async fn wake(&self, id: &SandboxId, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        Ok(self.ours(self.inner.wake(id, ctx).await?))
    }

    async fn extend(&self, id: &SandboxId, ends_at_ms: u64, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        Ok(self.ours(self.inner.extend(id, ends_at_ms, ctx).await?))
    }

    async fn relabel(&self, id: &SandboxId, labels: &Labels, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        Ok(self.ours(self.inner.relabel(id, labels, ctx).await?))
    }

    async fn snapshot(&self, id: &SandboxId, name: &str, ctx: &Ctx) -> Result<agentbox_core::Snapshot> {
        self.inner.snapshot(id, name, ctx).await
    }

    async fn snapshots(&self, ctx: &Ctx) -> Result<Vec<agentbox_core::Snapshot>> {
        self.inner.snapshots(ctx).await
    }

    async fn delete_snapshot(&self, name: &str, ctx: &Ctx) -> Result<bool> {
        self.inner.delete_snapshot(name, ctx).await
    }

    async fn fork(&self, id: &SandboxId, n: usize, spec: &Spec, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        let made = self.inner.fork(id, n, spec, ctx).await?;
        Ok(made
            .into_iter()
            .map(|b| {
                self.receipts.register(b.as_ref(), self.inner.name(), spec);
                self.ours(b)
            })
            .collect())
    }
}

struct ReceiptSandbox {
    inner: Arc<dyn Sandbox>,
    entry: Arc<Entry>,
    receipts: Arc<Receipts>,
}

#[async_trait]
impl Sandbox for ReceiptSandbox {
    fn id(&self) -> &SandboxId {
        self.inner.id()
    }
    fn facts(&self) -> &Facts {
        self.inner.facts()
    }
    fn labels(&self) -> &Labels {
        self.inner.labels()
    }
    async fn exec(&self, argv: &[String], opts: &ExecOptions, ctx: &Ctx) -> Result<Process> {
        // A call refused before it is made (malformed, not supported, the box ended, or given
        // up on before its turn: `Error::is_not_made`) is not counted; one made and then given
        // up on is.
        opts.validate(argv)?;
        let r = self.inner.exec(argv, opts, ctx).await;
        let refused = matches!(&r, Err(e) if e.is_not_made()
            || matches!(e.code(), ErrorCode::Invalid | ErrorCode::Unsupported | ErrorCode::Gone));
        if !refused {
            self.entry.calls.fetch_add(1, Ordering::SeqCst);
        }
        r
    }
    async fn status(&self, ctx: &Ctx) -> Result<Status> {
        let s = self.inner.status(ctx).await?;
        if s == Status::Ended {
            self.receipts.finish(self.inner.id(), &self.entry)?;
        }
        Ok(s)
    }
    async fn upload(&self, path: &str, data: &[u8], ctx: &Ctx) -> Result<()> {
        self.inner.upload(path, data, ctx).await
    }
    async fn download(&self, path: &str, max_bytes: u64, ctx: &Ctx) -> Result<Vec<u8>> {
        self.inner.download(path, max_bytes, ctx).await
    }
    async fn endpoint(&self, port: u16, ctx: &Ctx) -> Result<Endpoint> {
        self.inner.endpoint(port, ctx).await
    }
    async fn destroy(&self, ctx: &Ctx) -> Result<()> {
        self.inner.destroy(ctx).await?;
        self.receipts.finish(self.inner.id(), &self.entry)
    }
    fn files(&self) -> Option<&dyn Files> {
        self.inner.files()
    }
    fn processes(&self) -> Option<&dyn agentbox_core::Processes> {
        self.inner.processes()
    }
    async fn net_refusals(&self, max: usize, ctx: &Ctx) -> Result<Vec<agentbox_core::NetRefusal>> {
        self.inner.net_refusals(max, ctx).await
    }
}

/// What the receipts of one provider and kind add up to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Total {
    /// The provider.
    pub provider: String,
    /// The kind of box.
    pub kind: String,
    /// How many boxes.
    pub boxes: u64,
    /// Their seconds together.
    pub seconds: f64,
    /// Their estimated cost together.
    pub usd: f64,
}

/// The totals of a receipts file by provider and kind.
pub fn totals(path: &Path) -> Result<Vec<Total>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(e, format!("reading {}", path.display())))?;
    let mut by: std::collections::BTreeMap<(String, String), Total> = Default::default();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let line: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| Error::invalid(format!("{} line {}: not JSON: {e}", path.display(), n + 1)))?;
        // A recording's other lines are not receipts; a receipt's line that holds none is an
        // error, never a cost left out of the totals.
        let Some(v) = receipt_in(&line) else {
            let kind = line.get("kind").and_then(|k| k.as_str());
            if kind == Some(LINE_KIND) {
                return Err(Error::invalid(format!(
                    "{} line {}: a {LINE_KIND} line whose source is not {LINE_SOURCE:?} or whose data is not a receipt",
                    path.display(),
                    n + 1
                )));
            }
            if kind.is_some() {
                continue;
            }
            return Err(Error::invalid(format!(
                "{} line {}: neither a receipt nor a live line with a kind",
                path.display(),
                n + 1
            )));
        };
        let field = |k: &str| {
            v.get(k)
                .ok_or_else(|| Error::invalid(format!("{} line {}: no {k:?}", path.display(), n + 1)))
        };
        let key = (
            field("provider")?.as_str().unwrap_or_default().to_string(),
            field("kind")?.as_str().unwrap_or_default().to_string(),
        );
        let seconds = field("seconds")?.as_f64().unwrap_or(0.0);
        let usd = field("cost_usd")?
            .as_f64()
            .ok_or_else(|| Error::invalid(format!("{} line {}: cost_usd is not a number", path.display(), n + 1)))?;
        let t = by.entry(key.clone()).or_insert_with(|| Total {
            provider: key.0,
            kind: key.1,
            ..Default::default()
        });
        t.boxes += 1;
        t.seconds += seconds;
        t.usd += usd;
    }
    Ok(by.into_values().collect())
}

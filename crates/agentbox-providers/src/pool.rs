//! A warm pool: boxes of one spec made ahead, so a create of that spec is handed one at once
//! instead of waiting for an engine to start a container.
//!
//! [`Pool`] wraps any provider and is a [`Provider`] itself (its name, honours and ids are the
//! inner provider's). It keeps [`PoolOptions::size`] ready boxes of its spec, made by tasks in
//! the background and made again after each hand-out. A create whose spec is the pool's apart
//! from `max_lifetime` and `labels` takes a ready box: its deadline is moved to now plus the
//! asked lifetime (`Lifecycle::extend`) and its labels become the caller's
//! (`Lifecycle::relabel`), so it is the box the inner provider would have made, found by
//! `attach` and `list` like any other. A create that finds no ready box while the pool makes
//! one waits for it (one create a make at most), so a pool never makes a first call slower.
//! Any other spec, or an empty pool with no make for the caller, is the inner provider's
//! create.
//!
//! Nothing leaks: a ready box is made with the short [`PoolOptions::idle_lifetime`], which the
//! provider enforces with no call from the host, and the pool moves its deadline on while the
//! pool lives. A host that dies (a SIGKILL) leaves its ready boxes to end by that lifetime.
//! Ready boxes carry the label [`POOL_LABEL`] (the pool's random id), which the hand-out's
//! relabel removes; the pool's `list` and `attach` never answer a ready box.
//!
//! Where the inner provider cannot move a deadline, a ready box is handed out only when what
//! is left of its lifetime meets the ask, never outliving it (and ready boxes near their end
//! are replaced); where it cannot change labels, ready boxes carry no pool label (a `list` in
//! another process may then see one) and are handed out only to a spec whose labels are the
//! pool spec's.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentbox_core::{
    Ctx, Error, Honours, Labels, Lifecycle, MAX_LIFETIME, Provider, Result, Sandbox, SandboxId, Snapshot, Spec, Status,
    check_spec, now_ms,
};
use async_trait::async_trait;
use tokio::sync::{Notify, watch};

use crate::random::random_hex;

/// The label a ready box carries: the key, whose value is the pool's random id. Not under the
/// providers' `agentbox` namespace, which a spec (and so a pool's make) may not use.
pub const POOL_LABEL: &str = "agentbox-pool";

/// At most this many ready boxes in one pool.
pub const MAX_POOL: usize = 64;

/// How a pool keeps its boxes.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// Ready boxes to keep, 0 to [`MAX_POOL`] (0: every create is the inner provider's).
    pub size: usize,
    /// The lifetime a ready box is made with and extended by while the pool lives: what a
    /// ready box outlives a dead host by, at most.
    pub idle_lifetime: Duration,
    /// The first wait after a make that failed; doubled after each further failure.
    pub retry_min: Duration,
    /// The longest wait between makes that fail.
    pub retry_max: Duration,
    /// The deadline of each call the pool makes on its own (a make, an extend, a destroy).
    pub call_timeout: Duration,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            size: 4,
            idle_lifetime: Duration::from_secs(120),
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
            call_timeout: Duration::from_secs(120),
        }
    }
}

/// One ready box and the earliest instant it may end (the provider's fact, or, where the box
/// says none, the make's start plus its lifetime, which is never later than the truth).
struct Ready {
    sandbox: Arc<dyn Sandbox>,
    ends_at_ms: u64,
}

#[derive(Default)]
struct State {
    ready: VecDeque<Ready>,
    /// Makes under way.
    making: usize,
    /// Creates waiting for a box a make under way adds, at most `making` (each make is
    /// waited for by one create at most, so a burst of creates is not queued behind a few
    /// makes).
    waiting: usize,
    /// Ready boxes out of `ready` for a keep-alive (extended or replaced), or being destroyed.
    transit: usize,
    /// Ids of every box the pool holds and has not handed out: ready, in transit.
    members: HashSet<String>,
    /// No make before this instant (after failures).
    retry_at: Option<tokio::time::Instant>,
    /// The wait after the next failure.
    backoff: Duration,
    closed: bool,
}

struct Shared {
    inner: Arc<dyn Provider>,
    honours: Honours,
    /// The spec the pool answers (its lifetime and labels aside).
    spec: Spec,
    /// The spec ready boxes are made from: the pool's, with the idle lifetime and the pool's
    /// label.
    make_spec: Spec,
    id: String,
    opts: PoolOptions,
    state: Mutex<State>,
    /// Something changed the maintainer should look at (a hand-out, a make done, a close).
    changed: Notify,
    /// The count of ready boxes, for [`Pool::warm`].
    ready_count: watch::Sender<usize>,
    /// The count of makes and keep-alives under way, for [`Pool::close`].
    busy_count: watch::Sender<usize>,
    /// Any count changed (a box ready, a make over, a close), for creates waiting on a make.
    counts_changed: Notify,
    /// Ends the maintainer at close.
    shutdown: Ctx,
    rt: tokio::runtime::Handle,
}

/// A warm pool over a provider. See the [module documentation](self).
///
/// ```no_run
/// # async fn f(inner: std::sync::Arc<dyn agentbox_core::Provider>) -> agentbox_core::Result<()> {
/// use std::time::Duration;
/// use agentbox_core::{Ctx, Provider, Spec};
/// use agentbox_providers::pool::{Pool, PoolOptions};
/// let spec = Spec::new(Duration::from_secs(3600));
/// let pool = Pool::new(inner, spec.clone(), PoolOptions::default())?;
/// let b = pool.create(&spec.label("task", "7"), &Ctx::background()).await?; // a ready box
/// pool.close(&Ctx::background().with_timeout(Duration::from_secs(60))).await?;
/// # Ok(()) }
/// ```
pub struct Pool {
    s: Arc<Shared>,
}

impl Pool {
    /// A pool of `opts.size` boxes of `spec` over `inner`, filled from now on in the
    /// background. Refuses (naming the field) a spec `inner` cannot honour, a spec carrying
    /// [`POOL_LABEL`], a size over [`MAX_POOL`] and an idle lifetime of zero or over 30 days.
    /// Must be called within a tokio runtime, whose tasks make the boxes.
    pub fn new(inner: Arc<dyn Provider>, spec: Spec, opts: PoolOptions) -> Result<Pool> {
        let honours = inner.honours();
        check_spec(&spec, &honours, inner.name()).map_err(|e| e.context("pool"))?;
        refuse_pool_label(&spec.labels)?;
        if opts.size > MAX_POOL {
            return Err(Error::invalid(format!(
                "pool.size: {} boxes; a pool keeps 0 to {MAX_POOL}",
                opts.size
            )));
        }
        if opts.idle_lifetime.is_zero() || opts.idle_lifetime > MAX_LIFETIME {
            return Err(Error::invalid(
                "pool.idle_lifetime: must be positive and at most 30 days",
            ));
        }
        if opts.retry_min.is_zero() || opts.retry_max < opts.retry_min || opts.call_timeout.is_zero() {
            return Err(Error::invalid(
                "pool: retry_min and call_timeout must be positive, retry_max at least retry_min",
            ));
        }
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::unsupported("pool: made outside a tokio runtime, which makes its boxes"))?;
        let id = random_hex(6)?;
        let mut make_spec = spec.clone();
        make_spec.max_lifetime = opts.idle_lifetime;
        // A label the hand-out cannot take off again would tell the caller's box apart.
        if honours.relabel {
            make_spec.labels.insert(POOL_LABEL.to_string(), id.clone());
        }
        let s = Arc::new(Shared {
            inner,
            honours,
            spec,
            make_spec,
            id,
            opts,
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            ready_count: watch::channel(0).0,
            busy_count: watch::channel(0).0,
            counts_changed: Notify::new(),
            shutdown: Ctx::background(),
            rt,
        });
        if s.opts.size > 0 {
            tracing::debug!(pool = %s.id, provider = s.inner.name(), size = s.opts.size, "pool filling");
            // The first makes are counted before `new` returns, so a create right after it
            // waits for one of them (see [`Pool::await_make`]) rather than make a box more.
            {
                let mut st = s.state.lock().unwrap();
                st.making = s.opts.size;
                s.publish(&st);
            }
            for _ in 0..s.opts.size {
                s.rt.spawn(make(s.clone()));
            }
            s.rt.spawn(maintain(s.clone()));
        }
        Ok(Pool { s })
    }

    /// The pool's id, the value of [`POOL_LABEL`] on its ready boxes.
    pub fn id(&self) -> &str {
        &self.s.id
    }

    /// How many ready boxes it holds now.
    pub fn ready(&self) -> usize {
        self.s.state.lock().unwrap().ready.len()
    }

    /// Wait until the pool holds `size` ready boxes, or `ctx` ends (`timeout`, `aborted`).
    pub async fn warm(&self, ctx: &Ctx) -> Result<()> {
        let mut rx = self.s.ready_count.subscribe();
        let size = self.s.opts.size;
        ctx.run_result(async move {
            rx.wait_for(|n| *n >= size)
                .await
                .map(|_| ())
                .map_err(|_| Error::unknown("pool: closed while warming"))
        })
        .await
        .map_err(|e| e.context("pool: warming"))
    }

    /// Stop making boxes and destroy the ready ones, waiting (until `ctx` ends) for makes and
    /// keep-alives under way, whose boxes are destroyed as they come. Handed-out boxes are the
    /// callers' and left alone. Closing a closed pool is no error.
    pub async fn close(&self, ctx: &Ctx) -> Result<()> {
        let drained = self.s.close_now();
        let mut first = None;
        let destroys = drained.into_iter().map(|r| {
            let s = self.s.clone();
            async move {
                let r = s.destroy_member(&r.sandbox, ctx).await;
                s.settle();
                r
            }
        });
        for r in futures_util::future::join_all(destroys).await {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        }
        let mut rx = self.s.busy_count.subscribe();
        ctx.run_result(async move {
            rx.wait_for(|n| *n == 0)
                .await
                .map(|_| ())
                .map_err(|_| Error::unknown("pool: lost its counts"))
        })
        .await
        .map_err(|e| e.context("pool: closing"))?;
        match first {
            Some(e) => Err(e.context("pool: closing")),
            None => Ok(()),
        }
    }

    /// Take a ready box that can serve `spec`, under the lock, so no box goes out twice.
    fn take(&self, spec: &Spec) -> Option<Ready> {
        let s = &self.s;
        let now = now_ms();
        let mut st = s.state.lock().unwrap();
        if st.closed {
            return None;
        }
        let at = st.ready.iter().position(|r| self.fits(r.ends_at_ms, spec, now))?;
        let r = st.ready.remove(at)?;
        st.members.remove(r.sandbox.id().as_str());
        s.publish(&st);
        // The refill waits for the hand-out ([`Provider::create`] tells the maintainer once it
        // is over): a make started now would compete with it for the engine.
        Some(r)
    }

    /// Whether a ready box that ends at `ends_at_ms` can serve `spec` at `now`. Without
    /// extend, a ready box serves an ask its deadline meets: never later than the ask (a box
    /// lives at most its spec's lifetime), and at most a twentieth (or a second) sooner.
    fn fits(&self, ends_at_ms: u64, spec: &Spec, now: u64) -> bool {
        let s = &self.s;
        let ask = spec.max_lifetime.as_millis() as u64;
        let slack = (ask / 20).max(1000);
        let lifetime_ok = s.honours.extend
            || (ends_at_ms <= now.saturating_add(ask) && ends_at_ms + slack >= now.saturating_add(ask));
        // Still ended on time: one about to end is the keep-alive's.
        let alive = ends_at_ms > now.saturating_add(1000);
        let labels_ok = s.honours.relabel || spec.labels == s.spec.labels;
        lifetime_ok && alive && labels_ok
    }

    /// Wait for the box a make under way adds, where no ready box serves `spec` but a make
    /// is under way that no other create waits for: a create that comes while the pool fills
    /// (an MCP session's first call, made as the pool starts) takes the pool's box rather than
    /// make one more beside the pool's, which would compete with them for the engine and be
    /// no sooner. `Ok(true)` once a ready box serves `spec` (take again); `Ok(false)` when no
    /// make is left for this create to wait for, or a box made now could not serve it (the
    /// caller makes its own); the end of `ctx` is its error.
    async fn await_make(&self, spec: &Spec, ctx: &Ctx) -> Result<bool> {
        let s = &self.s;
        // A box made now would end at now plus the idle lifetime: whether that could serve.
        if !self.fits(
            now_ms().saturating_add(s.opts.idle_lifetime.as_millis() as u64),
            spec,
            now_ms(),
        ) {
            return Ok(false);
        }
        {
            let mut st = s.state.lock().unwrap();
            if st.closed || st.making <= st.waiting {
                return Ok(false);
            }
            st.waiting += 1;
        }
        /// One fewer create waiting, however the wait ends (a drop of the create included).
        struct Waiting<'a>(&'a Shared);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                let mut st = self.0.state.lock().unwrap();
                st.waiting = st.waiting.saturating_sub(1);
            }
        }
        let _waiting = Waiting(s);
        tracing::debug!(pool = %s.id, "pool: a create waits for a ready box being made");
        loop {
            let changed = s.counts_changed.notified();
            tokio::pin!(changed);
            // Registered before the state is read, so no change between the two is missed.
            changed.as_mut().enable();
            {
                let st = s.state.lock().unwrap();
                let now = now_ms();
                if st.ready.iter().any(|r| self.fits(r.ends_at_ms, spec, now)) {
                    return Ok(true);
                }
                // Fewer makes than waiters: one of them (this one) makes its own.
                if st.closed || st.making < st.waiting {
                    return Ok(false);
                }
            }
            ctx.run(changed)
                .await
                .map_err(|e| e.context("pool: waiting for a ready box"))?;
        }
    }

    /// Make a taken box the caller's: its deadline now plus the ask, the caller's labels.
    async fn hand_out(&self, r: &Ready, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let s = &self.s;
        let id = r.sandbox.id().clone();
        let started = std::time::Instant::now();
        let mut b = r.sandbox.clone();
        if s.honours.extend {
            let ends = now_ms().saturating_add(spec.max_lifetime.as_millis() as u64);
            b = s.inner.extend(&id, ends, ctx).await?;
        }
        let extended = started.elapsed();
        if s.honours.relabel {
            b = s.inner.relabel(&id, &spec.labels, ctx).await?;
        }
        if !s.honours.extend && !s.honours.relabel && b.status(ctx).await? != Status::Running {
            return Err(Error::gone(format!("box {id}: it ended in the pool")));
        }
        tracing::debug!(
            pool = %s.id,
            box_id = %id,
            extend_ms = extended.as_secs_f64() * 1000.0,
            total_ms = started.elapsed().as_secs_f64() * 1000.0,
            "pooled box handed out"
        );
        Ok(b)
    }

    /// Hand out ready boxes serving `spec` until one is the caller's (`Some`), or none is left
    /// (`None`).
    async fn take_and_hand_out(&self, spec: &Spec, ctx: &Ctx) -> Result<Option<Arc<dyn Sandbox>>> {
        while let Some(r) = self.take(spec) {
            // Out of the pool and not yet the caller's: a hand-out that fails, or whose caller
            // drops this create part way (a timeout around it, a cancelled request), ends
            // the box rather than leave it in no one's hands.
            let mut handing = Handing {
                sandbox: Some(r.sandbox.clone()),
                rt: self.s.rt.clone(),
                timeout: self.s.opts.call_timeout,
            };
            let handed = self.hand_out(&r, spec, ctx).await;
            self.s.changed.notify_one();
            match handed {
                Ok(b) => {
                    handing.sandbox = None;
                    return Ok(Some(b));
                }
                Err(e) => {
                    tracing::warn!(pool = %self.s.id, box_id = %r.sandbox.id(), code = %e.code(), "pool: a ready box failed its hand-out (destroyed; the next is tried): {}", e.message());
                    drop(handing);
                    // The caller's own end is its error, not a reason to try the next box.
                    ctx.check()?;
                }
            }
        }
        Ok(None)
    }

    /// Whether `spec` is the pool's, its lifetime and labels aside.
    fn serves(&self, spec: &Spec) -> bool {
        let mut a = spec.clone();
        a.max_lifetime = self.s.spec.max_lifetime;
        a.labels = self.s.spec.labels.clone();
        a == self.s.spec
    }

    fn is_member(&self, id: &SandboxId) -> bool {
        self.s.state.lock().unwrap().members.contains(id.as_str())
    }

    /// Refuse `operation` on a ready box (not the caller's: the pool's, to hand out): a ready
    /// box moved past its idle lifetime would outlive a dead host, one put to sleep would be
    /// handed out asleep. `not_found`, as attach answers for it.
    fn refuse_ready(&self, id: &SandboxId, operation: &str) -> Result<()> {
        if self.is_member(id) {
            return Err(Error::not_found(format!(
                "{operation}: box {id} is one of the warm pool's ready boxes, not handed out"
            )));
        }
        Ok(())
    }
}

impl Drop for Pool {
    /// Best effort: the ready boxes are destroyed by tasks on the pool's runtime (those the
    /// runtime does not run before it ends end by their idle lifetime).
    fn drop(&mut self) {
        let drained = self.s.close_now();
        for r in drained {
            let s = self.s.clone();
            self.s.rt.spawn(async move {
                let ctx = Ctx::background().with_timeout(s.opts.call_timeout);
                let _ = s.destroy_member(&r.sandbox, &ctx).await;
                s.settle();
            });
        }
    }
}

fn refuse_pool_label(labels: &Labels) -> Result<()> {
    if labels.contains_key(POOL_LABEL) {
        return Err(Error::invalid(format!(
            "spec.labels: key {POOL_LABEL:?} is the warm pool's own (it marks boxes not yet handed out)"
        )));
    }
    Ok(())
}

impl Shared {
    /// Mark the pool closed, end the maintainer, and take the ready boxes out (counted in
    /// transit until [`Shared::settle`]).
    fn close_now(&self) -> Vec<Ready> {
        let drained: Vec<Ready> = {
            let mut st = self.state.lock().unwrap();
            st.closed = true;
            let d: Vec<Ready> = st.ready.drain(..).collect();
            st.transit += d.len();
            self.publish(&st);
            d
        };
        self.shutdown.cancel();
        self.changed.notify_one();
        drained
    }

    /// One piece of transit work is over.
    fn settle(&self) {
        {
            let mut st = self.state.lock().unwrap();
            st.transit = st.transit.saturating_sub(1);
            self.publish(&st);
        }
        self.changed.notify_one();
    }

    /// Tell the waiters of [`Pool::warm`] and [`Pool::close`] the counts, under the state's
    /// lock so no count overtakes a later one.
    fn publish(&self, st: &State) {
        self.ready_count.send_replace(st.ready.len());
        self.busy_count.send_replace(st.making + st.transit);
        self.counts_changed.notify_waiters();
    }

    async fn destroy_member(&self, b: &Arc<dyn Sandbox>, ctx: &Ctx) -> Result<()> {
        let r = b.destroy(ctx).await;
        self.state.lock().unwrap().members.remove(b.id().as_str());
        if let Err(e) = &r {
            tracing::warn!(pool = %self.id, box_id = %b.id(), code = %e.code(), "pool: destroying a ready box: {}", e.message());
        }
        r
    }

    /// Put a box (made or kept alive) among the ready, or destroy it when the pool closed.
    async fn admit(&self, sandbox: Arc<dyn Sandbox>, floor_ms: u64) {
        // The provider's fact where it says one; else the lower bound the caller computed.
        let ends_at_ms = sandbox.facts().ends_at_ms.unwrap_or(floor_ms);
        let closed = {
            let mut st = self.state.lock().unwrap();
            st.members.insert(sandbox.id().to_string());
            if st.closed {
                true
            } else {
                st.ready.push_back(Ready {
                    sandbox: sandbox.clone(),
                    ends_at_ms,
                });
                self.publish(&st);
                false
            }
        };
        if closed {
            let ctx = Ctx::background().with_timeout(self.opts.call_timeout);
            let _ = self.destroy_member(&sandbox, &ctx).await;
        }
    }
}

/// The maintainer: keeps ready boxes alive before they run out and makes boxes until the pool
/// holds its size, waiting between rounds for a change or the next box due, never spinning.
async fn maintain(s: Arc<Shared>) {
    let idle = s.opts.idle_lifetime.as_millis() as u64;
    // A ready box is kept alive once less than half its idle lifetime is left.
    let margin = idle / 2;
    loop {
        if s.shutdown.check().is_err() {
            return;
        }
        let now = now_ms();
        let (due, need, next_due, retry_at) = {
            let mut st = s.state.lock().unwrap();
            if st.closed {
                return;
            }
            let mut due = Vec::new();
            let mut keep = VecDeque::new();
            for r in st.ready.drain(..) {
                if r.ends_at_ms < now.saturating_add(margin) {
                    due.push(r);
                } else {
                    keep.push_back(r);
                }
            }
            st.ready = keep;
            st.transit += due.len();
            let held = st.ready.len() + st.making + st.transit;
            let waiting = st.retry_at.is_some_and(|t| t > tokio::time::Instant::now());
            let need = if waiting { 0 } else { s.opts.size.saturating_sub(held) };
            st.making += need;
            let next_due = st.ready.iter().map(|r| r.ends_at_ms.saturating_sub(margin)).min();
            s.publish(&st);
            (due, need, next_due, st.retry_at)
        };
        for r in due {
            s.rt.spawn(keep_alive(s.clone(), r));
        }
        for _ in 0..need {
            s.rt.spawn(make(s.clone()));
        }
        // Sleep until the next box is due, the retry time, a change, or the close.
        let mut until = tokio::time::Instant::now() + Duration::from_secs(3600);
        if let Some(at) = next_due {
            let wait = Duration::from_millis(at.saturating_sub(now_ms()));
            until = until.min(tokio::time::Instant::now() + wait);
        }
        if let Some(at) = retry_at
            && at > tokio::time::Instant::now()
        {
            until = until.min(at);
        }
        tokio::select! {
            _ = s.changed.notified() => {}
            _ = tokio::time::sleep_until(until) => {}
            _ = s.shutdown.done() => return,
        }
    }
}

/// Make one ready box; on failure, say so and hold makes back (doubling the wait).
async fn make(s: Arc<Shared>) {
    let ctx = Ctx::background().with_timeout(s.opts.call_timeout);
    let floor = now_ms().saturating_add(s.opts.idle_lifetime.as_millis() as u64);
    let made = s.inner.create(&s.make_spec, &ctx).await;
    match made {
        Ok(b) => {
            s.state.lock().unwrap().backoff = Duration::ZERO;
            s.admit(b, floor).await;
        }
        Err(e) => {
            let wait = {
                let mut st = s.state.lock().unwrap();
                st.backoff = if st.backoff.is_zero() {
                    s.opts.retry_min
                } else {
                    (st.backoff * 2).min(s.opts.retry_max)
                };
                st.retry_at = Some(tokio::time::Instant::now() + st.backoff);
                st.backoff
            };
            tracing::warn!(
                pool = %s.id,
                provider = s.inner.name(),
                code = %e.code(),
                retry_in_ms = wait.as_millis() as u64,
                "pool: making a ready box failed: {}",
                e.message()
            );
        }
    }
    {
        let mut st = s.state.lock().unwrap();
        st.making = st.making.saturating_sub(1);
        s.publish(&st);
    }
    s.changed.notify_one();
}

/// Keep one ready box alive: its deadline moved to now plus the idle lifetime, or, where the
/// provider cannot move it, the box destroyed (the maintainer makes another).
async fn keep_alive(s: Arc<Shared>, r: Ready) {
    let ctx = Ctx::background().with_timeout(s.opts.call_timeout);
    let id = r.sandbox.id().clone();
    if s.honours.extend {
        let floor = now_ms().saturating_add(s.opts.idle_lifetime.as_millis() as u64);
        match s.inner.extend(&id, floor, &ctx).await {
            Ok(b) => {
                s.admit(b, floor).await;
                s.settle();
                return;
            }
            Err(e) => {
                tracing::warn!(pool = %s.id, box_id = %id, code = %e.code(), "pool: keeping a ready box alive failed (it is replaced): {}", e.message());
            }
        }
    }
    let _ = s.destroy_member(&r.sandbox, &ctx).await;
    s.settle();
}

/// A box between the pool and its caller: destroyed when dropped unless the hand-out took
/// it (`sandbox` set back to `None`).
struct Handing {
    sandbox: Option<Arc<dyn Sandbox>>,
    rt: tokio::runtime::Handle,
    timeout: Duration,
}

impl Drop for Handing {
    fn drop(&mut self) {
        if let Some(sandbox) = self.sandbox.take() {
            let timeout = self.timeout;
            self.rt.spawn(async move {
                let _ = sandbox.destroy(&Ctx::background().with_timeout(timeout)).await;
            });
        }
    }
}

#[async_trait]
impl Provider for Pool {
    fn name(&self) -> &str {
        self.s.inner.name()
    }

    fn honours(&self) -> Honours {
        self.s.honours.clone()
    }

    async fn create(&self, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        refuse_pool_label(&spec.labels)?;
        if !self.serves(spec) {
            return self.s.inner.create(spec, ctx).await;
        }
        check_spec(spec, &self.s.honours, self.s.inner.name())?;
        // A caller already gone takes no ready box (its hand-out would fail and waste it).
        ctx.check()?;
        loop {
            if let Some(b) = self.take_and_hand_out(spec, ctx).await? {
                return Ok(b);
            }
            // None ready: a box the pool is making already is the sooner one.
            if !self.await_make(spec, ctx).await? {
                break;
            }
        }
        self.s.inner.create(spec, ctx).await
    }

    async fn attach(&self, id: &SandboxId, ctx: &Ctx) -> Result<Option<Arc<dyn Sandbox>>> {
        if self.is_member(id) {
            id.expect_provider(self.name())?;
            return Ok(None);
        }
        Ok(self
            .s
            .inner
            .attach(id, ctx)
            .await?
            .filter(|b| !b.labels().contains_key(POOL_LABEL)))
    }

    async fn list(&self, labels: &Labels, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        let all = self.s.inner.list(labels, ctx).await?;
        Ok(all
            .into_iter()
            .filter(|b| !b.labels().contains_key(POOL_LABEL) && !self.is_member(b.id()))
            .collect())
    }

    fn lifecycle(&self) -> Option<&dyn Lifecycle> {
        Some(self)
    }
}

#[async_trait]
impl Lifecycle for Pool {
    async fn open(&self, name: &str, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        refuse_pool_label(&spec.labels)?;
        self.s.inner.open(name, spec, ctx).await
    }

    async fn discard(&self, name: &str, labels: &Labels, ctx: &Ctx) -> Result<bool> {
        self.s.inner.discard(name, labels, ctx).await
    }

    async fn sleep(&self, id: &SandboxId, ctx: &Ctx) -> Result<()> {
        self.refuse_ready(id, "sleep")?;
        self.s.inner.sleep(id, ctx).await
    }

    async fn wake(&self, id: &SandboxId, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        self.refuse_ready(id, "wake")?;
        self.s.inner.wake(id, ctx).await
    }

    async fn extend(&self, id: &SandboxId, ends_at_ms: u64, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        self.refuse_ready(id, "extend")?;
        self.s.inner.extend(id, ends_at_ms, ctx).await
    }

    async fn relabel(&self, id: &SandboxId, labels: &Labels, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        refuse_pool_label(labels)?;
        self.refuse_ready(id, "relabel")?;
        self.s.inner.relabel(id, labels, ctx).await
    }

    async fn snapshot(&self, id: &SandboxId, name: &str, ctx: &Ctx) -> Result<Snapshot> {
        self.refuse_ready(id, "snapshot")?;
        self.s.inner.snapshot(id, name, ctx).await
    }

    async fn snapshots(&self, ctx: &Ctx) -> Result<Vec<Snapshot>> {
        self.s.inner.snapshots(ctx).await
    }

    async fn delete_snapshot(&self, name: &str, ctx: &Ctx) -> Result<bool> {
        self.s.inner.delete_snapshot(name, ctx).await
    }

    async fn fork(&self, id: &SandboxId, n: usize, spec: &Spec, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        refuse_pool_label(&spec.labels)?;
        self.refuse_ready(id, "fork")?;
        self.s.inner.fork(id, n, spec, ctx).await
    }
}

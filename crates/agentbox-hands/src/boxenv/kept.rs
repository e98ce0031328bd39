//! The processes a box keeps, owned: [`agentbox_core::Sandbox::processes`] borrows from the
//! box, and an environment hands its processes out past its own borrow (a lazy one opens its
//! box per call), so this holds the box and asks it each time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentbox_core::{Ctx, Error, OutputRead, Process, ProcessInfo, Processes, Result, Sandbox, Stdin};
use async_trait::async_trait;

/// The stdin writers an environment holds open, by handle.
pub(super) type Stdins = Arc<Mutex<BTreeMap<u64, Stdin>>>;

/// A box's [`Processes`], through the box itself.
pub(super) struct Kept {
    pub sandbox: Arc<dyn Sandbox>,
    /// The environment's held stdins: one a write closed is let go.
    pub stdins: Stdins,
}

impl Kept {
    fn ps(&self) -> Result<&dyn Processes> {
        self.sandbox.processes().ok_or_else(|| no_runner(&*self.sandbox))
    }
}

/// Why a box keeps no processes: it has no runner, or no program lives between its calls.
pub(super) fn no_runner(b: &dyn Sandbox) -> Error {
    if !b.facts().live_processes {
        return Error::unsupported(format!(
            "box {} runs each command as one call that answers once the command ended (its facts say live_processes: false), so it keeps no processes: nothing runs between its calls, and nothing takes input",
            b.id()
        ));
    }
    Error::unsupported(format!(
        "box {} has no runner, so it keeps no processes: a command lives only as long as the call that started it",
        b.id()
    ))
}

#[async_trait]
impl Processes for Kept {
    async fn list(&self, ctx: &Ctx) -> Result<Vec<ProcessInfo>> {
        self.ps()?.list(ctx).await
    }
    async fn read(&self, handle: u64, after: u64, wait: Duration, max_bytes: usize, ctx: &Ctx) -> Result<OutputRead> {
        self.ps()?.read(handle, after, wait, max_bytes, ctx).await
    }
    async fn attach(&self, handle: u64, after: u64, ctx: &Ctx) -> Result<Process> {
        self.ps()?.attach(handle, after, ctx).await
    }
    async fn write(&self, handle: u64, data: &[u8], close: bool, ctx: &Ctx) -> Result<()> {
        self.ps()?.write(handle, data, close, ctx).await?;
        if close {
            self.stdins.lock().unwrap().remove(&handle);
        }
        Ok(())
    }
    async fn signal(&self, handle: u64, signal: i32, ctx: &Ctx) -> Result<()> {
        self.ps()?.signal(handle, signal, ctx).await
    }
    async fn resize(&self, handle: u64, rows: u16, cols: u16, ctx: &Ctx) -> Result<()> {
        self.ps()?.resize(handle, rows, cols, ctx).await
    }
    async fn forget(&self, handle: u64, ctx: &Ctx) -> Result<()> {
        self.ps()?.forget(handle, ctx).await
    }
}

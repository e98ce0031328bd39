//! The processes a box keeps, owned: [`agentbox_core::Sandbox::processes`] borrows from the
//! box, and an environment hands its processes out past its own borrow (a lazy one opens its
//! box per call), so this holds the box and asks it each time.

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Error, OutputRead, Process, ProcessInfo, Processes, Result, Sandbox};
use async_trait::async_trait;

/// A box's [`Processes`], through the box itself.
pub(super) struct Kept(pub Arc<dyn Sandbox>);

impl Kept {
    fn ps(&self) -> Result<&dyn Processes> {
        self.0.processes().ok_or_else(|| no_runner(&*self.0))
    }
}

/// Why a box keeps no processes.
pub(super) fn no_runner(b: &dyn Sandbox) -> Error {
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
        self.ps()?.write(handle, data, close, ctx).await
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

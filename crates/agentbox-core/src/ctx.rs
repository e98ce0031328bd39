//! Cancellation plus an optional deadline, passed to every call that can wait.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};

/// What a call may wait for: a cancellation token and an optional deadline.
///
/// Cheap to clone. [`Ctx::child`] makes a context that ends with its parent and can also be
/// cancelled alone; [`Ctx::with_timeout`] makes one whose deadline is the earlier of the
/// parent's and `now + timeout`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// use agentbox_core::{Ctx, ErrorCode};
/// let ctx = Ctx::background().with_timeout(Duration::from_millis(10));
/// let r = ctx.run(tokio::time::sleep(Duration::from_secs(5))).await;
/// assert_eq!(r.unwrap_err().code(), ErrorCode::Timeout);
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Ctx {
    token: CancellationToken,
    deadline: Option<Instant>,
}

impl Default for Ctx {
    fn default() -> Self {
        Ctx::background()
    }
}

impl Ctx {
    /// A context that never ends by itself.
    pub fn background() -> Self {
        Ctx {
            token: CancellationToken::new(),
            deadline: None,
        }
    }

    /// A context that ends when this one does, and that can be cancelled on its own.
    pub fn child(&self) -> Self {
        Ctx {
            token: self.token.child_token(),
            deadline: self.deadline,
        }
    }

    /// A child whose deadline is at most `timeout` from now.
    pub fn with_timeout(&self, timeout: Duration) -> Self {
        let at = Instant::now().checked_add(timeout);
        self.with_deadline_opt(at)
    }

    /// A child whose deadline is at most `deadline`.
    pub fn with_deadline(&self, deadline: Instant) -> Self {
        self.with_deadline_opt(Some(deadline))
    }

    fn with_deadline_opt(&self, at: Option<Instant>) -> Self {
        let deadline = match (self.deadline, at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ctx {
            token: self.token.child_token(),
            deadline,
        }
    }

    /// Cancel this context and its children.
    pub fn cancel(&self) {
        self.token.cancel();
    }

    /// The deadline, if any.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Time left before the deadline (zero when passed), or `None` with no deadline.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline.map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// The error this context has ended with, if it has: `aborted` or `timeout`.
    pub fn err(&self) -> Option<Error> {
        if self.token.is_cancelled() {
            return Some(Error::aborted("the call was cancelled"));
        }
        match self.deadline {
            Some(d) if Instant::now() >= d => Some(Error::timeout("the deadline passed")),
            _ => None,
        }
    }

    /// `Ok(())` while the context is live, else its error. Call before starting work.
    pub fn check(&self) -> Result<()> {
        match self.err() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Resolves when the context ends, with the reason.
    pub async fn done(&self) -> Error {
        match self.deadline {
            Some(d) => tokio::select! {
                _ = self.token.cancelled() => Error::aborted("the call was cancelled"),
                _ = tokio::time::sleep_until(d) => Error::timeout("the deadline passed"),
            },
            None => {
                self.token.cancelled().await;
                Error::aborted("the call was cancelled")
            }
        }
    }

    /// Run `fut` until it completes or the context ends, whichever is first.
    pub async fn run<F: Future>(&self, fut: F) -> Result<F::Output> {
        self.check()?;
        tokio::select! {
            biased;
            e = self.done() => Err(e),
            v = fut => Ok(v),
        }
    }

    /// Like [`Ctx::run`] for a future that returns a [`Result`] itself.
    pub async fn run_result<T, F: Future<Output = Result<T>>>(&self, fut: F) -> Result<T> {
        self.run(fut).await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn cancel_reaches_children() {
        let parent = Ctx::background();
        let child = parent.child().with_timeout(Duration::from_secs(60));
        parent.cancel();
        let e = child.done().await;
        assert_eq!(e.code(), crate::ErrorCode::Aborted);
        assert!(child.check().is_err());
    }

    #[tokio::test]
    async fn a_child_cancelled_alone_leaves_the_parent() {
        let parent = Ctx::background();
        let child = parent.child();
        child.cancel();
        assert!(parent.check().is_ok());
    }

    #[tokio::test]
    async fn the_earlier_deadline_wins() {
        let a = Ctx::background().with_timeout(Duration::from_millis(5));
        let b = a.with_timeout(Duration::from_secs(100));
        assert!(b.remaining().unwrap() <= Duration::from_millis(5));
        let r = b.run(std::future::pending::<()>()).await;
        assert_eq!(r.unwrap_err().code(), crate::ErrorCode::Timeout);
    }
}

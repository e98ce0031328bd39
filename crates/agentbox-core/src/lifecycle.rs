//! A box's life beyond create and destroy: names, sleep and wake, a moved deadline,
//! snapshots, forks and labels changed after the make.
//!
//! The operations are one optional capability, [`Lifecycle`], which a provider answers from
//! [`crate::Provider::lifecycle`] (as a box answers [`crate::Sandbox::files`]). Each method's
//! default refuses it (`unsupported`, naming the operation and the provider), and each is a
//! field of [`crate::Honours`] a caller can read first. A provider with no lifecycle writes
//! nothing; one with a lifecycle implements it in one file, filling what its platform can do
//! and leaving the default for the rest: the contract never emulates one operation with
//! another behind the caller's back. Callers use the same methods on `dyn Provider`, which
//! refuse them where a provider has no lifecycle.
//!
//! The operations act on a box by id and answer a fresh handle where the box changed, so a
//! handle's facts and labels are always those of its making: the one an operation answers
//! says the new deadline, the new labels, the woken box.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::ctx::Ctx;
use crate::error::{Error, Result};
use crate::id::SandboxId;
use crate::sandbox::{Provider, Sandbox};
use crate::spec::{Labels, MAX_LIFETIME, Spec};

/// At most this many boxes from one fork.
pub const MAX_FORK: usize = 16;

/// A snapshot: a box's files kept under a name, which a spec's `snapshot` makes new boxes
/// from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Its name, unique per provider.
    pub name: String,
    /// The provider that keeps it.
    pub provider: String,
    /// The box it was taken of, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<SandboxId>,
    /// When it was taken, as milliseconds since the Unix epoch; absent is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at_ms: Option<u64>,
    /// Bytes it holds, where the provider can say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// It holds the box's memory too (its programs resume where they were), not only files.
    #[serde(default)]
    pub memory: bool,
}

/// Check a box's or a snapshot's name: 1 to 63 bytes of lowercase letters, digits and `-`,
/// starting and ending with a letter or digit: a DNS label, which every provider can carry
/// (a container name, an image tag, a pod name, a vendor's label). `field` names it in the
/// error.
///
/// ```
/// use agentbox_core::validate_name;
/// assert!(validate_name("name", "agent-7").is_ok());
/// assert!(validate_name("name", "Agent_7").is_err());
/// assert!(validate_name("name", "-x").is_err());
/// ```
pub fn validate_name(field: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{field}: {name:?} is not a name (1 to 63 lowercase letters, digits and '-', starting and ending with a letter or digit)"
        )))
    }
}

/// Check a new deadline for a box: after `now_ms`, and at most [`MAX_LIFETIME`] past it.
/// Every provider's `extend` calls it first, so every provider refuses the same way.
///
/// ```
/// use agentbox_core::check_deadline;
/// assert!(check_deadline(2_000, 1_000).is_ok());
/// assert!(check_deadline(500, 1_000).is_err());
/// ```
pub fn check_deadline(ends_at_ms: u64, now_ms: u64) -> Result<()> {
    if ends_at_ms <= now_ms {
        return Err(Error::invalid(format!(
            "extend: the deadline {} is not in the future (destroy the box to end it now)",
            crate::time::rfc3339(ends_at_ms.min(i64::MAX as u64) as i64)
        )));
    }
    let most = now_ms.saturating_add(MAX_LIFETIME.as_millis() as u64);
    if ends_at_ms > most {
        return Err(Error::invalid(format!(
            "extend: the deadline {} is more than the 30 days a box may live from now",
            crate::time::rfc3339(ends_at_ms.min(i64::MAX as u64) as i64)
        )));
    }
    Ok(())
}

/// Check a fork's count: 1 to [`MAX_FORK`].
pub fn check_fork_count(n: usize) -> Result<()> {
    if n == 0 || n > MAX_FORK {
        return Err(Error::invalid(format!("fork: {n} boxes; a fork makes 1 to {MAX_FORK}")));
    }
    Ok(())
}

/// Check a fork of `n` boxes from `spec` before any is made: [`check_fork_count`], and no
/// `snapshot` in the spec (a fork's boxes start from the box forked's files). Every provider's
/// `fork` calls it first, so every provider refuses the same way. (Where a provider's image
/// holds the files, as Docker's does, it refuses `image` too.)
pub fn check_fork(n: usize, spec: &crate::spec::Spec) -> Result<()> {
    check_fork_count(n)?;
    if spec.snapshot.is_some() {
        return Err(Error::invalid(
            "fork: spec.snapshot is set, but a fork's boxes start from the box forked",
        ));
    }
    Ok(())
}

/// The lifecycle of a provider's boxes beyond create and destroy. A provider that has one
/// implements it (in its `lifecycle.rs`) and answers `Some(self)` from
/// [`Provider::lifecycle`]; every method it leaves out is refused `unsupported`, and
/// [`crate::Honours`] says which it fills.
///
/// ```no_run
/// use std::sync::Arc;
/// use agentbox_core::{Ctx, Error, Honours, Labels, Lifecycle, Provider, Result, Sandbox, SandboxId, Spec};
/// struct Mine;
/// #[async_trait::async_trait]
/// impl Provider for Mine {
///     fn name(&self) -> &str { "mine" }
///     fn honours(&self) -> Honours { Honours { relabel: true, ..Honours::default() } }
///     async fn create(&self, _: &Spec, _: &Ctx) -> Result<Arc<dyn Sandbox>> {
///         Err(Error::unsupported("mine makes no boxes"))
///     }
///     async fn attach(&self, _: &SandboxId, _: &Ctx) -> Result<Option<Arc<dyn Sandbox>>> { Ok(None) }
///     async fn list(&self, _: &Labels, _: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> { Ok(vec![]) }
///     fn lifecycle(&self) -> Option<&dyn Lifecycle> { Some(self) }
/// }
/// #[async_trait::async_trait]
/// impl Lifecycle for Mine {
///     // Only this; every other operation is refused.
///     async fn relabel(&self, id: &SandboxId, _: &Labels, _: &Ctx) -> Result<Arc<dyn Sandbox>> {
///         Err(Error::gone(format!("box {id}: there is none")))
///     }
/// }
/// ```
#[async_trait]
pub trait Lifecycle: Provider {
    /// The box named `name` among this provider's boxes whose labels are exactly
    /// `spec.labels`: made from `spec` when there is none (or it ended), woken when it sleeps.
    /// Two opens of one name at once answer one box. `Honours::names`.
    async fn open(&self, name: &str, spec: &Spec, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let _ = (name, spec, ctx);
        Err(refuse(self.name(), "open"))
    }

    /// End the box named `name` (labels exactly `labels`) and delete whatever was kept of it:
    /// the next [`Lifecycle::open`] finds none. `false` when there was none. `Honours::names`.
    async fn discard(&self, name: &str, labels: &Labels, ctx: &Ctx) -> Result<bool> {
        let _ = (name, labels, ctx);
        Err(refuse(self.name(), "discard"))
    }

    /// Put the box to sleep: its files are kept, its programs end (or are frozen, where the
    /// box's facts say `sleep: frozen`), and its lifetime goes on being enforced with no call
    /// from the host. A sleeping box is listed and attached as [`Status::Sleeping`] and
    /// refuses programs and files until woken. Sleeping a sleeping box is no error.
    /// `Honours::sleep`.
    async fn sleep(&self, id: &SandboxId, ctx: &Ctx) -> Result<()> {
        let _ = (id, ctx);
        Err(refuse(self.name(), "sleep"))
    }

    /// Wake a sleeping box (a running one is answered as it is). `gone` for a box that ended.
    /// `Honours::sleep`.
    async fn wake(&self, id: &SandboxId, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let _ = (id, ctx);
        Err(refuse(self.name(), "wake"))
    }

    /// Move the box's deadline to `ends_at_ms` (milliseconds since the Unix epoch), later or
    /// earlier, still enforced with no call from the host. Refuses a deadline that
    /// [`crate::check_deadline`] refuses. Answers the box with its new facts.
    /// `Honours::extend`.
    async fn extend(&self, id: &SandboxId, ends_at_ms: u64, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let _ = (id, ends_at_ms, ctx);
        Err(refuse(self.name(), "extend"))
    }

    /// Replace the host's labels of the box (the provider's own are kept). Answers the box with
    /// its new labels. `Honours::relabel`.
    async fn relabel(&self, id: &SandboxId, labels: &Labels, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
        let _ = (id, labels, ctx);
        Err(refuse(self.name(), "relabel"))
    }

    /// Keep the box's files (and its memory, where [`Snapshot::memory`] says so) under `name`,
    /// unique per provider: `refused` when one of that name exists. A spec naming it in
    /// `snapshot` makes boxes from it. `Honours::snapshots`.
    async fn snapshot(&self, id: &SandboxId, name: &str, ctx: &Ctx) -> Result<Snapshot> {
        let _ = (id, name, ctx);
        Err(refuse(self.name(), "snapshot"))
    }

    /// The snapshots this provider keeps. `Honours::snapshots`.
    async fn snapshots(&self, ctx: &Ctx) -> Result<Vec<Snapshot>> {
        let _ = ctx;
        Err(refuse(self.name(), "snapshots"))
    }

    /// Delete the snapshot `name`; `false` when there was none. Boxes made from it are not
    /// touched. `Honours::snapshots`.
    async fn delete_snapshot(&self, name: &str, ctx: &Ctx) -> Result<bool> {
        let _ = (name, ctx);
        Err(refuse(self.name(), "delete_snapshot"))
    }

    /// `n` new boxes made from `spec` holding the box's files as they are now, each on its own
    /// from then on (its own lifetime, its own changes). All or none: a fork that fails part
    /// way destroys the boxes it made. `spec.snapshot` must be unset. `Honours::fork`.
    async fn fork(&self, id: &SandboxId, n: usize, spec: &Spec, ctx: &Ctx) -> Result<Vec<Arc<dyn Sandbox>>> {
        let _ = (id, n, spec, ctx);
        Err(refuse(self.name(), "fork"))
    }
}

/// The refusal every provider answers for an operation it does not fill: `unsupported`,
/// naming the operation and the provider, the same words everywhere.
pub fn refuse(provider: &str, operation: &str) -> Error {
    let why = match operation {
        "open" | "discard" => "have no names",
        "sleep" | "wake" => "cannot sleep",
        "extend" => "cannot move their deadline",
        "snapshot" | "snapshots" | "delete_snapshot" => "take no snapshots",
        "fork" => "cannot fork",
        "relabel" => "cannot change their labels",
        _ => "cannot do this",
    };
    Error::unsupported(format!("{operation}: {provider} boxes {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    #[test]
    fn names_are_dns_labels() {
        for good in ["a", "dev", "agent-7", &"x".repeat(63)] {
            assert!(validate_name("name", good).is_ok(), "{good}");
        }
        for bad in ["", "A", "a_b", "a.b", "-a", "a-", &"x".repeat(64), "a b", "é"] {
            let e = validate_name("name", bad).unwrap_err();
            assert_eq!(e.code(), ErrorCode::Invalid, "{bad}");
            assert!(e.message().starts_with("name: "), "{e}");
        }
    }

    #[test]
    fn deadlines_are_in_the_future_and_bounded() {
        assert!(check_deadline(1_001, 1_000).is_ok());
        assert_eq!(check_deadline(1_000, 1_000).unwrap_err().code(), ErrorCode::Invalid);
        let month = MAX_LIFETIME.as_millis() as u64;
        assert!(check_deadline(1_000 + month, 1_000).is_ok());
        assert!(check_deadline(1_001 + month, 1_000).is_err());
        assert!(check_deadline(u64::MAX, 1_000).is_err());
    }

    #[test]
    fn fork_counts_are_bounded() {
        assert!(check_fork_count(1).is_ok() && check_fork_count(MAX_FORK).is_ok());
        assert!(check_fork_count(0).is_err() && check_fork_count(MAX_FORK + 1).is_err());
        let mut spec = crate::Spec::new(std::time::Duration::from_secs(60));
        assert!(check_fork(2, &spec).is_ok());
        spec.snapshot = Some("base".into());
        assert_eq!(check_fork(2, &spec).unwrap_err().code(), ErrorCode::Invalid);
        assert!(check_fork(2, &spec).unwrap_err().message().contains("spec.snapshot"));
    }

    #[test]
    fn refusals_name_the_operation_and_provider() {
        let e = refuse("archil", "sleep");
        assert_eq!(e.code(), ErrorCode::Unsupported);
        assert_eq!(e.message(), "sleep: archil boxes cannot sleep");
    }
}

//! Fakes of the vendor APIs agentbox's providers speak, one module per vendor, each a real
//! server on a local port that the vendor's own clients can be pointed at.
//!
//! A fake is judged by clients nobody here wrote (for Kubernetes: kubectl and the `kubernetes`
//! Python client, in `tests/kube_judges.rs`; for Daytona: its Python SDK, in
//! `tests/daytona_judges.rs`; for Archil: its Python SDK and generated client, in
//! `tests/archil_judges.rs`; for Modal: its Python SDK, in `tests/modal_judges.rs`; for E2B: its Python SDK, in `tests/e2b_judges.rs`): where such a client and the fake disagree, the
//! fake is wrong. Each module's documentation lists every place it is simpler than the real
//! service; `docs/fakes.md` is the overview.

pub mod archil;
pub mod daytona;
pub mod e2b;
pub mod kube;
pub mod modal;
mod shared;

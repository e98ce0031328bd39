//! Fakes of the vendor APIs agentbox's providers speak, one module per vendor, each a real
//! server on a local port that the vendor's own clients can be pointed at.
//!
//! A fake is judged by clients nobody here wrote (for Kubernetes: kubectl and the `kubernetes`
//! Python client; for each other vendor: its Python SDK), in the `judged` module of the vendor's
//! test file in the providers crate (`tests/e2b.rs` and the others): where such a client and
//! the fake disagree, the fake is wrong. Each module's documentation lists every place it is simpler than the real
//! service; `docs/fakes.md` is the overview.

pub mod archil;
pub mod daytona;
pub mod e2b;
pub mod faults;
mod http;
mod ids;
pub mod kube;
pub mod modal;
mod server;

//! agentbox's providers: each makes boxes of one kind behind the [`agentbox_core::Provider`]
//! contract, and each passes the one conformance suite of `agentbox-testing`.
//!
//! | provider | module | isolation | lifetime enforced by |
//! | --- | --- | --- | --- |
//! | local | [`local`] | none (development, tests) | the box's supervisor, a detached process |
//!
//! This crate knows nothing of hands, tools, transport or runs.

#![warn(missing_docs)]

pub mod helper;
#[cfg(feature = "local")]
pub mod local;
pub(crate) mod util;

#[cfg(feature = "local")]
pub use local::{LocalOptions, LocalProvider};

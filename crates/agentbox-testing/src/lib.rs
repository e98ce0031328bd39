//! Testing support for agentbox: the conformance suite every provider passes.
//!
//! Never a dependency of non-test code.

#![warn(missing_docs)]

pub mod conformance;
pub mod fake;
pub mod outside;
pub mod reexec;
pub mod services;

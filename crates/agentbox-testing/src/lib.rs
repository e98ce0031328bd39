//! Testing support for agentbox: the conformance suite every provider passes, the fake
//! provider, and what tests share (outside views, services, re-executed children, the runner
//! binary).
//!
//! Never a dependency of non-test code.

pub mod conformance;
pub mod fake;
pub mod isolation;
pub mod outside;
pub mod processes;
pub mod reexec;
pub mod runner;
pub mod services;

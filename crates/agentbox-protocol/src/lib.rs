//! Wire types shared by agentbox's in-box programs and the host side that talks to them.
//!
//! This crate holds data and framing only: no sockets, no runtime. Both ends (the runner
//! binary, and the providers in the host) depend on it, and on nothing of each other.

pub mod frame;
#[doc(hidden)]
pub mod fuzzing;
pub mod namespace;
pub mod runner;
pub mod supervisor;

//! Where a conversation's tools run, and what that cost.
//!
//! - [`config`]: the transport config (environments, hands and roles, scope), parsed into
//!   typed values; an error names the key and why.
//! - [`documents`]: the session's documents, where the transport writes each box's id before
//!   any tool runs in it, so a later host finds the box again (SQLite and in memory).
//! - [`transport`]: [`Transport`] hands out a lazy [`agentbox_hands::ExecutionEnv`] per
//!   conversation, whose box is made at its first operation.
//! - [`receipts`]: one receipt per box a wrapped provider made, at the host's prices.
//! - [`ledger`]: every tool call, readable by run and by target (JSONL, SQLite, PostgreSQL,
//!   in memory).
//! - [`postgres`]: a PostgreSQL client that keeps why its connection ended.

pub mod config;
pub mod documents;
#[doc(hidden)]
pub mod fuzzing;
pub mod ledger;
pub mod postgres;
pub mod receipts;
mod sqlite;
pub mod transport;

pub use config::{Environment, Hands, Scope, TransportConfig};
pub use documents::{Documents, MemoryDocuments, SqliteDocuments};
pub use transport::{Lost, Prepare, Transport, TransportHost};

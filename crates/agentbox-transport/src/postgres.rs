//! One way to reach PostgreSQL, for every store that keeps its rows there (the ledger here,
//! the run leases in `agentbox-runs`).
//!
//! tokio-postgres hands back a client and a connection future that must be driven for the
//! client to work. When that future ends in an error (the server went away, a backend was
//! terminated), the client's later calls fail only with "connection closed": the cause is in
//! the future's result. [`Postgres`] keeps that cause, logs it once, and puts it in the error of
//! every call that fails afterwards, so a caller reads why.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentbox_core::{Error, Result};

/// How long connecting (and the first exchange) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A client whose connection's end is kept.
pub struct Postgres {
    client: tokio_postgres::Client,
    ended: Arc<Mutex<Option<String>>>,
    what: &'static str,
}

/// The advisory lock key every schema change takes (any fixed number; this one spells
/// "agentbox" in ASCII, truncated to fit a bigint).
const SCHEMA_LOCK: i64 = 0x6167_656e_7462_6f78;

impl Postgres {
    /// Connect with a libpq-style string (`host=… port=… user=… dbname=…`), within
    /// [`CONNECT_TIMEOUT`]. `what` names the store in errors and logs (`ledger`, `run leases`).
    /// The string may hold a password: it is never put in an error or a log.
    pub async fn connect(config: &str, what: &'static str) -> Result<Self> {
        let connecting = tokio_postgres::connect(config, tokio_postgres::NoTls);
        let (client, conn) = match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(Error::unknown(format!("{what}: connecting to PostgreSQL: {e}"))),
            Err(_) => {
                return Err(Error::timeout(format!(
                    "{what}: PostgreSQL did not answer within {}s",
                    CONNECT_TIMEOUT.as_secs()
                )));
            }
        };
        let ended = Arc::new(Mutex::new(None));
        let slot = ended.clone();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::warn!(store = what, error = %text(&e), "the PostgreSQL connection ended");
                slot.lock().unwrap().get_or_insert_with(|| text(&e));
            }
        });
        Ok(Postgres { client, ended, what })
    }

    /// Run `ddl` (`CREATE … IF NOT EXISTS` statements) under a transaction-scoped advisory
    /// lock that every store's schema takes: PostgreSQL's `IF NOT EXISTS` is not safe against
    /// a second session making the same table at the same moment (it fails with a duplicate
    /// key in `pg_type`, seen in CI when two tests connected at once).
    pub async fn make_schema(&self, ddl: &str) -> Result<()> {
        self.client
            .batch_execute(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock({SCHEMA_LOCK}); {ddl}; COMMIT;"
            ))
            .await
            .map_err(|e| self.error(e, "making the table"))
    }

    /// The client, for queries.
    pub fn client(&self) -> &tokio_postgres::Client {
        &self.client
    }

    /// The error of a failed call while `doing` something, naming the store and, where the
    /// connection ended under it, why it ended.
    pub fn error(&self, e: tokio_postgres::Error, doing: &str) -> Error {
        let what = self.what;
        let mut ended = self.ended.lock().unwrap();
        // A server that ends the connection says why to the request in flight; the calls
        // after it see only "connection closed", so the reason is kept for them. The server's
        // own words replace whatever the connection task kept: that task may have ended first
        // with a bare "connection closed" (seen in CI), which names no cause.
        if e.as_db_error().is_some_and(|d| d.severity() == "FATAL") {
            tracing::warn!(store = what, error = %text(&e), "PostgreSQL ended the connection");
            *ended = Some(text(&e));
        }
        match ended.as_deref() {
            Some(why) if e.is_closed() => {
                Error::unknown(format!("{what}: {doing}: the connection to PostgreSQL ended: {why}"))
            }
            _ => Error::unknown(format!("{what}: {doing}: {}", text(&e))),
        }
    }
}

/// An error as a person reads it: a server's own message and code (tokio-postgres prints a
/// server's error as "db error" alone), else the client's.
fn text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} {}: {}", d.severity(), d.code().code(), d.message()),
        None => {
            // tokio-postgres leaves the I/O cause out of its message: the chain says it.
            let mut t = e.to_string();
            let mut cause = std::error::Error::source(e);
            while let Some(c) = cause {
                let c_text = c.to_string();
                if !t.contains(&c_text) {
                    t = format!("{t}: {c_text}");
                }
                cause = c.source();
            }
            t
        }
    }
}

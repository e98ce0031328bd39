//! The one way this crate opens SQLite: WAL, every commit synced, a busy timeout so several
//! processes may share a file, and the caller's schema made if missing.

use std::path::Path;

use agentbox_core::{Error, Result};

/// `what: doing: error`, for every SQLite failure.
pub(crate) fn error(what: &str, doing: &str, e: rusqlite::Error) -> Error {
    Error::unknown(format!("{what}: {doing}: {e}"))
}

/// Set up `conn` for `what` (named in errors) with `schema`.
pub(crate) fn prepare(conn: rusqlite::Connection, what: &str, schema: &str) -> Result<rusqlite::Connection> {
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(|e| error(what, "setting the busy timeout", e))?;
    conn.execute_batch(&format!("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; {schema}"))
        .map_err(|e| error(what, "making its tables", e))?;
    Ok(conn)
}

/// Open (or make) the database at `path` for `what`, with `schema`.
pub(crate) fn open(path: &Path, what: &str, schema: &str) -> Result<rusqlite::Connection> {
    let conn = rusqlite::Connection::open(path).map_err(|e| error(what, &format!("opening {}", path.display()), e))?;
    prepare(conn, what, schema)
}

//! Keys in a SQLite file (WAL, every commit synced), which servers on one machine may share.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use agentbox_core::Result;
use rusqlite::{Connection, OptionalExtension};

use super::{COLUMNS, Row, db};

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    hash TEXT NOT NULL UNIQUE,
    admin INTEGER NOT NULL,
    max_boxes INTEGER,
    max_lifetime_ms INTEGER,
    providers TEXT,
    created_ms INTEGER NOT NULL,
    requests_per_minute INTEGER
);";

pub(super) struct Sqlite {
    conn: Mutex<Connection>,
}

/// A store made before a column was added gets it (each `ALTER` once).
fn migrate(conn: &Connection) -> Result<()> {
    let mut st = conn
        .prepare("SELECT name FROM pragma_table_info('keys')")
        .map_err(|e| db("reading its columns", e))?;
    let columns = st
        .query_map([], |r| r.get::<_, String>(0))
        .map_err(|e| db("reading its columns", e))?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(|e| db("reading its columns", e))?;
    if !columns.iter().any(|c| c == "requests_per_minute") {
        conn.execute_batch("ALTER TABLE keys ADD COLUMN requests_per_minute INTEGER")
            .map_err(|e| db("adding requests_per_minute", e))?;
    }
    Ok(())
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        id: r.get(0)?,
        name: r.get(1)?,
        admin: r.get(2)?,
        max_boxes: r.get(3)?,
        max_lifetime_ms: r.get(4)?,
        providers: r.get(5)?,
        requests_per_minute: r.get(6)?,
        created_ms: r.get(7)?,
    })
}

impl Sqlite {
    pub(super) fn open(path: &Path) -> Result<Self> {
        let conn = Connection::open(path).map_err(|e| db(&format!("opening {}", path.display()), e))?;
        conn.busy_timeout(Duration::from_secs(10))
            .map_err(|e| db("setting the busy timeout", e))?;
        conn.execute_batch(&format!("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; {SCHEMA}"))
            .map_err(|e| db("making its table", e))?;
        migrate(&conn)?;
        Ok(Sqlite { conn: Mutex::new(conn) })
    }

    pub(super) fn in_memory() -> Result<Self> {
        let conn = Connection::open_in_memory().map_err(|e| db("opening a store in memory", e))?;
        conn.execute_batch(SCHEMA).map_err(|e| db("making its table", e))?;
        Ok(Sqlite { conn: Mutex::new(conn) })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Insert `r`; false when its name is taken.
    pub(super) fn add(&self, r: &Row, hash: &str) -> Result<bool> {
        let n = self
            .conn()
            .execute(
                "INSERT INTO keys (id, name, hash, admin, max_boxes, max_lifetime_ms, providers, requests_per_minute, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT (name) DO NOTHING",
                rusqlite::params![
                    r.id,
                    r.name,
                    hash,
                    r.admin,
                    r.max_boxes,
                    r.max_lifetime_ms,
                    r.providers,
                    r.requests_per_minute,
                    r.created_ms,
                ],
            )
            .map_err(|e| db("writing the key", e))?;
        Ok(n == 1)
    }

    pub(super) fn find(&self, hash: &str) -> Result<Option<Row>> {
        self.conn()
            .query_row(&format!("SELECT {COLUMNS} FROM keys WHERE hash = ?1"), [hash], row)
            .optional()
            .map_err(|e| db("looking a key up", e))
    }

    pub(super) fn list(&self) -> Result<Vec<Row>> {
        let conn = self.conn();
        let mut st = conn
            .prepare(&format!("SELECT {COLUMNS} FROM keys ORDER BY name"))
            .map_err(|e| db("listing the keys", e))?;
        let rows = st.query_map([], row).map_err(|e| db("listing the keys", e))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| db("listing the keys", e))
    }

    pub(super) fn remove(&self, name: &str) -> Result<bool> {
        let n = self
            .conn()
            .execute("DELETE FROM keys WHERE name = ?1", [name])
            .map_err(|e| db("removing the key", e))?;
        Ok(n > 0)
    }
}

//! A session's documents: small JSON values by key, where the transport writes each box's id
//! (before any tool runs in it) and each conversation's assigned role, so a host that opens
//! the session again finds both. The run's store holds them in a run directory; SQLite and
//! memory implementations are here.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use agentbox_core::{Error, Result};
use async_trait::async_trait;
use serde_json::Value;

/// A session's documents. Every write is durable once it returns.
///
/// ```
/// # tokio_test_block(async {
/// use agentbox_transport::{Documents, MemoryDocuments};
/// let docs = MemoryDocuments::default();
/// docs.put("s1", "transport.boxes/session/sandbox", &serde_json::json!("local:ab12")).await.unwrap();
/// assert_eq!(docs.list("s1", "transport.boxes/").await.unwrap().len(), 1);
/// # });
/// # fn tokio_test_block(f: impl std::future::Future<Output = ()>) {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
#[async_trait]
pub trait Documents: Send + Sync {
    /// The document `key` of `session`.
    async fn get(&self, session: &str, key: &str) -> Result<Option<Value>>;
    /// Write the document `key` of `session`.
    async fn put(&self, session: &str, key: &str, value: &Value) -> Result<()>;
    /// Remove the document `key` of `session` (no error when there is none).
    async fn delete(&self, session: &str, key: &str) -> Result<()>;
    /// Every document of `session` whose key starts with `prefix`, by key.
    async fn list(&self, session: &str, prefix: &str) -> Result<Vec<(String, Value)>>;
}

/// Documents in this process's memory: for tests, and hosts that keep nothing.
#[derive(Default)]
pub struct MemoryDocuments {
    docs: Mutex<BTreeMap<(String, String), Value>>,
}

#[async_trait]
impl Documents for MemoryDocuments {
    async fn get(&self, session: &str, key: &str) -> Result<Option<Value>> {
        Ok(self.docs.lock().unwrap().get(&(session.into(), key.into())).cloned())
    }
    async fn put(&self, session: &str, key: &str, value: &Value) -> Result<()> {
        self.docs
            .lock()
            .unwrap()
            .insert((session.into(), key.into()), value.clone());
        Ok(())
    }
    async fn delete(&self, session: &str, key: &str) -> Result<()> {
        self.docs.lock().unwrap().remove(&(session.into(), key.into()));
        Ok(())
    }
    async fn list(&self, session: &str, prefix: &str) -> Result<Vec<(String, Value)>> {
        Ok(self
            .docs
            .lock()
            .unwrap()
            .iter()
            .filter(|((s, k), _)| s == session && k.starts_with(prefix))
            .map(|((_, k), v)| (k.clone(), v.clone()))
            .collect())
    }
}

/// Documents in a SQLite database (WAL, every commit synced), which several processes may
/// open one after another or at once.
pub struct SqliteDocuments {
    conn: Mutex<rusqlite::Connection>,
}

fn db_error(e: rusqlite::Error, what: &str) -> Error {
    crate::sqlite::error("session documents", what, e)
}

/// The documents' table and its statements, on any SQLite connection (or transaction): the
/// run store keeps the same table and calls these inside its fenced writes.
pub mod sql {
    use agentbox_core::{Error, Result};
    use rusqlite::{Connection, OptionalExtension};
    use serde_json::Value;

    /// The table.
    pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS documents (
        session TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (session, key));";

    /// A document's stored text.
    pub fn get(c: &Connection, session: &str, key: &str) -> rusqlite::Result<Option<String>> {
        c.query_row(
            "SELECT value FROM documents WHERE session = ?1 AND key = ?2",
            (session, key),
            |r| r.get(0),
        )
        .optional()
    }

    /// Write a document.
    pub fn put(c: &Connection, session: &str, key: &str, value: &Value) -> rusqlite::Result<()> {
        c.execute(
            "INSERT INTO documents (session, key, value) VALUES (?1, ?2, ?3)
             ON CONFLICT (session, key) DO UPDATE SET value = excluded.value",
            (session, key, value.to_string()),
        )
        .map(|_| ())
    }

    /// Remove a document.
    pub fn delete(c: &Connection, session: &str, key: &str) -> rusqlite::Result<()> {
        c.execute("DELETE FROM documents WHERE session = ?1 AND key = ?2", (session, key))
            .map(|_| ())
    }

    /// A session's documents whose key starts with `prefix`, as stored text, by key.
    pub fn list(c: &Connection, session: &str, prefix: &str) -> rusqlite::Result<Vec<(String, String)>> {
        let mut st = c.prepare("SELECT key, value FROM documents WHERE session = ?1 ORDER BY key")?;
        let rows = st.query_map([session], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        let mut out = Vec::new();
        for row in rows {
            let (k, v) = row?;
            if k.starts_with(prefix) {
                out.push((k, v));
            }
        }
        Ok(out)
    }

    /// A stored document's value.
    pub fn decode(key: &str, text: &str) -> Result<Value> {
        serde_json::from_str(text).map_err(|e| Error::unknown(format!("session documents: {key} is not JSON: {e}")))
    }
}

impl SqliteDocuments {
    /// Open (or make) the database at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = crate::sqlite::open(path, "session documents", sql::SCHEMA)?;
        Ok(SqliteDocuments { conn: Mutex::new(conn) })
    }
}

#[async_trait]
impl Documents for SqliteDocuments {
    async fn get(&self, session: &str, key: &str) -> Result<Option<Value>> {
        let text = sql::get(&self.conn.lock().unwrap(), session, key).map_err(|e| db_error(e, "reading a document"))?;
        text.map(|t| sql::decode(key, &t)).transpose()
    }

    async fn put(&self, session: &str, key: &str, value: &Value) -> Result<()> {
        sql::put(&self.conn.lock().unwrap(), session, key, value).map_err(|e| db_error(e, "writing a document"))
    }

    async fn delete(&self, session: &str, key: &str) -> Result<()> {
        sql::delete(&self.conn.lock().unwrap(), session, key).map_err(|e| db_error(e, "removing a document"))
    }

    async fn list(&self, session: &str, prefix: &str) -> Result<Vec<(String, Value)>> {
        let rows =
            sql::list(&self.conn.lock().unwrap(), session, prefix).map_err(|e| db_error(e, "listing documents"))?;
        rows.into_iter()
            .map(|(k, v)| sql::decode(&k, &v).map(|v| (k, v)))
            .collect()
    }
}

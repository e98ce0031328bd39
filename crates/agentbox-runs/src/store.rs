//! A run's store: SQLite (`store.db`), every commit synced, holding the conversation
//! (messages), its tasks and the session's documents. Every write is fenced: it commits only
//! while the store's fence still holds this holder's generation, so a holder whose claim was
//! taken (a later generation opened the run) gets [`agentbox_core::ErrorCode::Fenced`] and
//! writes nothing.
//!
//! Its journal depends on who may open it ([`Journal`]): WAL where every holder is on one
//! machine (WAL's index is shared memory, which only one kernel can share), a rollback journal
//! where hosts share the disk (it needs only the file system's byte-range locks). Released,
//! a store is one file: the WAL checkpointed into it and removed, so the next host needs
//! nothing of this one.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use agentbox_core::{Error, ErrorCode, Result};
use agentbox_transport::Documents;
use agentbox_transport::documents::sql;
use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior};
use serde::{Deserialize, Serialize};
use serde_json::Value;

const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS fence (one INTEGER PRIMARY KEY CHECK (one = 1), generation INTEGER NOT NULL);
    CREATE TABLE IF NOT EXISTS messages (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, generation INTEGER NOT NULL,
        role TEXT NOT NULL, content TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS tasks (id TEXT PRIMARY KEY, generation INTEGER NOT NULL, state TEXT NOT NULL);";

/// One message of the conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Its place, from 1.
    pub seq: i64,
    /// The generation that wrote it.
    pub generation: u64,
    /// `user`, `assistant`, `tool` or `system`.
    pub role: String,
    /// What it says (text, tool calls, a tool's result).
    pub content: Value,
}

/// How a store journals its writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Journal {
    /// Write-ahead log: fast, for holders on one machine (the log's index is shared memory).
    Wal,
    /// A rollback journal: for a disk hosts share (NFS, a cluster volume), which gives
    /// byte-range locks but no memory shared between hosts.
    Rollback,
}

impl Journal {
    fn pragma(self) -> &'static str {
        match self {
            Journal::Wal => "WAL",
            Journal::Rollback => "DELETE",
        }
    }
}

/// What is told of each message once it is durable: its seq and role.
type Kept = Box<dyn Fn(i64, &str) + Send + Sync>;

/// A run's store, held by one generation.
pub struct Store {
    conn: Mutex<Connection>,
    generation: u64,
    path: PathBuf,
    kept: std::sync::OnceLock<Kept>,
    released: std::sync::atomic::AtomicBool,
}

fn db(e: rusqlite::Error, what: &str) -> Error {
    Error::unknown(format!("run store: {what}: {e}"))
}

impl Store {
    /// Open the store at `path` as `generation`, taking the fence: refused when the store
    /// already saw this generation or a later one.
    pub fn take(path: &Path, generation: u64, journal: Journal) -> Result<Self> {
        let store = Self::open_as(path, generation, journal)?;
        {
            let mut conn = store.conn.lock().unwrap();
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(|e| db(e, "taking the fence"))?;
            let current: Option<i64> = tx
                .query_row("SELECT generation FROM fence WHERE one = 1", [], |r| r.get(0))
                .optional()
                .map_err(|e| db(e, "reading the fence"))?;
            if current.is_some_and(|c| c as u64 >= generation) {
                tracing::warn!(
                    generation,
                    store = current,
                    "fence not taken: the store saw this generation already"
                );
                return Err(Error::new(
                    ErrorCode::Fenced,
                    format!(
                        "run store: generation {generation} is not past the store's {}: another holder opened it since",
                        current.unwrap_or(0)
                    ),
                ));
            }
            tx.execute(
                "INSERT INTO fence (one, generation) VALUES (1, ?1) ON CONFLICT (one) DO UPDATE SET generation = excluded.generation",
                [generation as i64],
            )
            .map_err(|e| db(e, "writing the fence"))?;
            tx.commit().map_err(|e| db(e, "committing the fence"))?;
        }
        tracing::debug!(generation, "fence taken");
        Ok(store)
    }

    /// Open the store for reading (and fenced writing) as `generation`, without taking the fence.
    pub fn open_as(path: &Path, generation: u64, journal: Journal) -> Result<Self> {
        let conn = Connection::open(path).map_err(|e| db(e, &format!("opening {}", path.display())))?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(|e| db(e, "setting the busy timeout"))?;
        let mode: String = conn
            .query_row(&format!("PRAGMA journal_mode={}", journal.pragma()), [], |r| r.get(0))
            .map_err(|e| db(e, "setting the journal"))?;
        if !mode.eq_ignore_ascii_case(journal.pragma()) {
            return Err(Error::unknown(format!(
                "run store {}: the journal is {mode}, not {} (another connection holds it open in that mode)",
                path.display(),
                journal.pragma()
            )));
        }
        conn.execute_batch(&format!("PRAGMA synchronous=FULL; {SCHEMA} {}", sql::SCHEMA))
            .map_err(|e| db(e, "making its tables"))?;
        Ok(Store {
            conn: Mutex::new(conn),
            generation,
            path: path.to_path_buf(),
            kept: std::sync::OnceLock::new(),
            released: Default::default(),
        })
    }

    /// Open a store from outside, read-only and with no claim: it writes nothing, its journal
    /// mode included.
    ///
    /// ```no_run
    /// let store = agentbox_runs::Store::read("runs/r1/store.db".as_ref()).unwrap();
    /// println!("{} messages", store.messages().unwrap().len());
    /// ```
    pub fn read(path: &Path) -> Result<Self> {
        let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| db(e, &format!("opening {} to read", path.display())))?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(|e| db(e, "setting the busy timeout"))?;
        Ok(Store {
            conn: Mutex::new(conn),
            generation: 0,
            path: path.to_path_buf(),
            kept: std::sync::OnceLock::new(),
            released: Default::default(),
        })
    }

    /// Be told of each message [`Store::append`] made durable (its seq and role), after its
    /// commit: what a caller may count as acknowledged. Set once; later calls are ignored.
    pub fn on_kept(&self, f: impl Fn(i64, &str) + Send + Sync + 'static) {
        let _ = self.kept.set(Box::new(f));
    }

    /// The generation this store writes as.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Run `f` (a write outside the store, run.json) while the store's write lock is held and
    /// the fence is this generation's: a next generation takes the fence before or after, never
    /// between the check and the write.
    /// A store already sealed ([`Store::seal`]) takes this too: it is how release writes
    /// run.json after the store is whole in its file.
    pub fn fenced_with<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let mut outside = None;
        self.fenced_as(false, |_| {
            outside = Some(f());
            Ok(())
        })?;
        outside.unwrap_or_else(|| Err(Error::unknown("run store: the fenced write did not run")))
    }

    /// Run `f` in a write transaction that commits only while the fence is this generation's.
    /// Returned, the write is durable.
    pub fn fenced<T>(&self, f: impl FnOnce(&rusqlite::Transaction) -> rusqlite::Result<T>) -> Result<T> {
        self.fenced_as(true, f)
    }

    /// [`Store::fenced`]; `refuse_released`: a store sealed by this holder writes nothing.
    fn fenced_as<T>(
        &self,
        refuse_released: bool,
        f: impl FnOnce(&rusqlite::Transaction) -> rusqlite::Result<T>,
    ) -> Result<T> {
        if refuse_released && self.released.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::new(
                ErrorCode::Fenced,
                format!(
                    "run store: generation {} released the run, and writes nothing more",
                    self.generation
                ),
            ));
        }
        let mut conn = self.conn.lock().unwrap();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| db(e, "starting a write"))?;
        let fence: Option<i64> = tx
            .query_row("SELECT generation FROM fence WHERE one = 1", [], |r| r.get(0))
            .optional()
            .map_err(|e| db(e, "reading the fence"))?;
        if fence != Some(self.generation as i64) {
            tracing::warn!(
                generation = self.generation,
                run_at = fence.unwrap_or(0),
                "fenced: this holder's claim was taken, nothing written"
            );
            return Err(Error::new(
                ErrorCode::Fenced,
                format!(
                    "run store: this holder is generation {}, and the run is at generation {}: its claim was taken, and nothing was written",
                    self.generation,
                    fence.unwrap_or(0)
                ),
            ));
        }
        let v = f(&tx).map_err(|e| db(e, "writing"))?;
        tx.commit().map_err(|e| db(e, "committing"))?;
        Ok(v)
    }

    /// Append a message; returns its seq once it is durable.
    pub fn append(&self, role: &str, content: &Value) -> Result<i64> {
        let g = self.generation as i64;
        let seq = self.fenced(|tx| {
            tx.execute(
                "INSERT INTO messages (generation, role, content) VALUES (?1, ?2, ?3)",
                (g, role, content.to_string()),
            )?;
            Ok(tx.last_insert_rowid())
        })?;
        if let Some(kept) = self.kept.get() {
            kept(seq, role);
        }
        Ok(seq)
    }

    /// The conversation, in order.
    pub fn messages(&self) -> Result<Vec<Message>> {
        let conn = self.conn.lock().unwrap();
        let mut st = conn
            .prepare("SELECT seq, generation, role, content FROM messages ORDER BY seq")
            .map_err(|e| db(e, "reading messages"))?;
        let rows = st
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                ))
            })
            .map_err(|e| db(e, "reading messages"))?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, generation, role, content) = row.map_err(|e| db(e, "reading messages"))?;
            out.push(Message {
                seq,
                generation: generation as u64,
                role,
                content: serde_json::from_str(&content).map_err(|e| Error::unknown(format!("message {seq}: {e}")))?,
            });
        }
        Ok(out)
    }

    /// Set a task's state.
    pub fn put_task(&self, id: &str, state: &Value) -> Result<()> {
        let g = self.generation as i64;
        self.fenced(|tx| {
            tx.execute(
                "INSERT INTO tasks (id, generation, state) VALUES (?1, ?2, ?3)
                 ON CONFLICT (id) DO UPDATE SET generation = excluded.generation, state = excluded.state",
                (id, g, state.to_string()),
            )
            .map(|_| ())
        })
    }

    /// Every task's state, by id.
    pub fn tasks(&self) -> Result<Vec<(String, Value)>> {
        let conn = self.conn.lock().unwrap();
        let mut st = conn
            .prepare("SELECT id, state FROM tasks ORDER BY id")
            .map_err(|e| db(e, "reading tasks"))?;
        let rows = st
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .map_err(|e| db(e, "reading tasks"))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, state) = row.map_err(|e| db(e, "reading tasks"))?;
            out.push((id, serde_json::from_str(&state).unwrap_or(Value::Null)));
        }
        Ok(out)
    }

    /// Seal the store as its holder lets it go: no write after this one, the WAL checkpointed
    /// into the database file and left (removing the log and its index), the file synced. What
    /// release leaves behind is one file whose every commit is on disk, which a host with no
    /// memory shared with this one opens whole.
    pub fn seal(&self) -> Result<()> {
        let conn = self.conn.lock().unwrap();
        self.released.store(true, std::sync::atomic::Ordering::SeqCst);
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .map_err(|e| db(e, "checkpointing"))?;
        let mode: String = conn
            .query_row("PRAGMA journal_mode=DELETE", [], |r| r.get(0))
            .map_err(|e| db(e, "leaving WAL"))?;
        if !mode.eq_ignore_ascii_case("delete") {
            return Err(Error::unknown(format!(
                "run store: the journal stayed {mode} after asking for a rollback journal (another connection has it open?)"
            )));
        }
        std::fs::File::open(&self.path)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::io(e, format!("syncing {}", self.path.display())))
    }
}

/// The session's documents in the run's store, each write fenced like every other.
pub struct RunDocuments(pub Arc<Store>);

#[async_trait]
impl Documents for RunDocuments {
    async fn get(&self, session: &str, key: &str) -> Result<Option<Value>> {
        let text = sql::get(&self.0.conn.lock().unwrap(), session, key).map_err(|e| db(e, "reading a document"))?;
        text.map(|t| sql::decode(key, &t)).transpose()
    }
    async fn put(&self, session: &str, key: &str, value: &Value) -> Result<()> {
        self.0.fenced(|tx| sql::put(tx, session, key, value))
    }
    async fn delete(&self, session: &str, key: &str) -> Result<()> {
        self.0.fenced(|tx| sql::delete(tx, session, key))
    }
    async fn list(&self, session: &str, prefix: &str) -> Result<Vec<(String, Value)>> {
        let rows = sql::list(&self.0.conn.lock().unwrap(), session, prefix).map_err(|e| db(e, "listing documents"))?;
        rows.into_iter()
            .map(|(k, v)| sql::decode(&k, &v).map(|v| (k, v)))
            .collect()
    }
}

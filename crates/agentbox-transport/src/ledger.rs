//! The tool-call ledger: every tool call a run made, as an `op.called` record (run, seq, op,
//! target, time, outcome), kept in a store that reads a run in `seq` order and a target's
//! history newest first across runs. Stores: JSONL files, SQLite, PostgreSQL, memory; the
//! same behaviour suite runs against each (`tests/ledger.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use agentbox_core::{Ctx, Error, Result};
use agentbox_hands::ExecutionEnv;
use agentbox_hands::tools::{self, ToolResult};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// One tool call.
///
/// The fields of the workflow ledger this one follows (`type: op.called`, `seq`, `op`,
/// `target`, `at`), with three differences: the run is `run` (`runId` there, read under that
/// name too); the outcome is kept (`ok`, and `error` when it failed), which a tool call's
/// history needs; and the workflow platform's own fields (the `connection` snapshot, the
/// outline `path` of the step) are not, since agentbox runs tools, not workflows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The run that made it.
    #[serde(alias = "runId")]
    pub run: String,
    /// Its place in the run, from 1.
    pub seq: u64,
    /// Always `op.called`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The tool (`read`, `bash`, …).
    pub op: String,
    /// What it acted on: the absolute path of a file tool, the box of a command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// When it was called, in ms since the epoch.
    pub at: u64,
    /// Whether it succeeded.
    pub ok: bool,
    /// What the model read when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Where records are kept.
#[async_trait]
pub trait LedgerStore: Send + Sync {
    /// Keep a record (durable once it returns).
    async fn append(&self, record: &Record) -> Result<()>;
    /// A run's records in `seq` order.
    async fn read(&self, run: &str) -> Result<Vec<Record>>;
    /// The records whose target is `target`, across every run, newest first (by time, then
    /// seq), at most `limit`.
    async fn read_by_target(&self, target: &str, limit: usize) -> Result<Vec<Record>>;
}

fn acted_on(mut records: Vec<Record>, target: &str, limit: usize) -> Vec<Record> {
    records.retain(|r| r.kind == "op.called" && r.target.as_deref() == Some(target));
    records.sort_by(|a, b| b.at.cmp(&a.at).then(b.seq.cmp(&a.seq)));
    records.truncate(limit);
    records
}

fn check_run(run: &str) -> Result<()> {
    let ok = !run.is_empty()
        && run.len() <= 128
        && run
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !run.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "ledger: run id {run:?}: 1 to 128 letters, digits, '-', '_' or '.', not starting with '.'"
        )))
    }
}

/// Records in memory.
#[derive(Default)]
pub struct MemoryLedger {
    runs: Mutex<BTreeMap<String, Vec<Record>>>,
}

#[async_trait]
impl LedgerStore for MemoryLedger {
    async fn append(&self, record: &Record) -> Result<()> {
        check_run(&record.run)?;
        self.runs
            .lock()
            .unwrap()
            .entry(record.run.clone())
            .or_default()
            .push(record.clone());
        Ok(())
    }
    async fn read(&self, run: &str) -> Result<Vec<Record>> {
        let mut r = self.runs.lock().unwrap().get(run).cloned().unwrap_or_default();
        r.sort_by_key(|x| x.seq);
        Ok(r)
    }
    async fn read_by_target(&self, target: &str, limit: usize) -> Result<Vec<Record>> {
        let all = self.runs.lock().unwrap().values().flatten().cloned().collect();
        Ok(acted_on(all, target, limit))
    }
}

/// One JSONL file per run in a directory, each record a line appended and synced.
pub struct JsonlLedger {
    dir: PathBuf,
    write: Mutex<()>,
}

impl JsonlLedger {
    /// Keep files in `dir` (made if missing).
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(e, format!("making {}", dir.display())))?;
        Ok(JsonlLedger {
            dir: dir.to_path_buf(),
            write: Mutex::new(()),
        })
    }

    fn load(path: &Path) -> Result<Vec<Record>> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(Error::io(e, format!("reading {}", path.display()))),
        };
        let mut out = Vec::new();
        let lines: Vec<&str> = text.split_inclusive('\n').collect();
        for (n, line) in lines.iter().enumerate() {
            // A last line cut short by a crash mid-write was never acknowledged: it is skipped.
            if !line.ends_with('\n') && n + 1 == lines.len() {
                break;
            }
            let r: Record = serde_json::from_str(line.trim_end())
                .map_err(|e| Error::invalid(format!("{} line {}: not a ledger record: {e}", path.display(), n + 1)))?;
            out.push(r);
        }
        Ok(out)
    }
}

#[async_trait]
impl LedgerStore for JsonlLedger {
    async fn append(&self, record: &Record) -> Result<()> {
        use std::io::Write;
        check_run(&record.run)?;
        let path = self.dir.join(format!("{}.jsonl", record.run));
        let line = serde_json::to_string(record).map_err(|e| Error::unknown(e.to_string()))?;
        let _g = self.write.lock().unwrap();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::io(e, format!("opening {}", path.display())))?;
        writeln!(f, "{line}")
            .and_then(|_| f.sync_data())
            .map_err(|e| Error::io(e, format!("writing {}", path.display())))
    }
    async fn read(&self, run: &str) -> Result<Vec<Record>> {
        check_run(run)?;
        let mut r = Self::load(&self.dir.join(format!("{run}.jsonl")))?;
        r.retain(|x| x.run == run);
        r.sort_by_key(|x| x.seq);
        Ok(r)
    }
    async fn read_by_target(&self, target: &str, limit: usize) -> Result<Vec<Record>> {
        let entries =
            std::fs::read_dir(&self.dir).map_err(|e| Error::io(e, format!("listing {}", self.dir.display())))?;
        let mut all = Vec::new();
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "jsonl") {
                all.extend(Self::load(&p)?);
            }
        }
        Ok(acted_on(all, target, limit))
    }
}

/// Records in a SQLite database.
pub struct SqliteLedger {
    conn: Mutex<rusqlite::Connection>,
}

fn sql_error(e: rusqlite::Error, what: &str) -> Error {
    crate::sqlite::error("ledger", what, e)
}

impl SqliteLedger {
    /// Open (or make) the database at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = crate::sqlite::open(
            path,
            "ledger",
            "CREATE TABLE IF NOT EXISTS ledger (
                 n INTEGER PRIMARY KEY AUTOINCREMENT, run TEXT NOT NULL, seq INTEGER NOT NULL,
                 target TEXT, at INTEGER NOT NULL, record TEXT NOT NULL);
             CREATE INDEX IF NOT EXISTS ledger_run ON ledger (run, seq);
             CREATE INDEX IF NOT EXISTS ledger_target ON ledger (target, at);",
        )?;
        Ok(SqliteLedger { conn: Mutex::new(conn) })
    }

    fn rows(&self, sql: &str, params: impl rusqlite::Params) -> Result<Vec<Record>> {
        let conn = self.conn.lock().unwrap();
        let mut st = conn.prepare(sql).map_err(|e| sql_error(e, "reading"))?;
        let rows = st
            .query_map(params, |r| r.get::<_, String>(0))
            .map_err(|e| sql_error(e, "reading"))?;
        let mut out = Vec::new();
        for row in rows {
            let text = row.map_err(|e| sql_error(e, "reading"))?;
            out.push(serde_json::from_str(&text).map_err(|e| Error::unknown(format!("ledger: a stored record: {e}")))?);
        }
        Ok(out)
    }
}

#[async_trait]
impl LedgerStore for SqliteLedger {
    async fn append(&self, record: &Record) -> Result<()> {
        check_run(&record.run)?;
        let text = serde_json::to_string(record).map_err(|e| Error::unknown(e.to_string()))?;
        self.conn
            .lock()
            .unwrap()
            .execute(
                "INSERT INTO ledger (run, seq, target, at, record) VALUES (?1, ?2, ?3, ?4, ?5)",
                (&record.run, record.seq as i64, &record.target, record.at as i64, text),
            )
            .map_err(|e| sql_error(e, "appending"))?;
        Ok(())
    }
    async fn read(&self, run: &str) -> Result<Vec<Record>> {
        self.rows("SELECT record FROM ledger WHERE run = ?1 ORDER BY seq, n", [run])
    }
    async fn read_by_target(&self, target: &str, limit: usize) -> Result<Vec<Record>> {
        self.rows(
            "SELECT record FROM ledger WHERE target = ?1 ORDER BY at DESC, seq DESC, n DESC LIMIT ?2",
            (target, limit as i64),
        )
    }
}

/// Records in PostgreSQL (table `agentbox_ledger`, made if missing).
pub struct PostgresLedger {
    pg: crate::postgres::Postgres,
}

impl PostgresLedger {
    /// Connect with a libpq-style string (`host=… port=… user=… dbname=…`). The password, if
    /// any, belongs in that string or `PGPASSWORD`, never in an argv.
    pub async fn connect(config: &str) -> Result<Self> {
        let pg = crate::postgres::Postgres::connect(config, "ledger").await?;
        pg.make_schema(
            "CREATE TABLE IF NOT EXISTS agentbox_ledger (
                 n BIGSERIAL PRIMARY KEY, run TEXT NOT NULL, seq BIGINT NOT NULL,
                 target TEXT, at BIGINT NOT NULL, record JSONB NOT NULL);
             CREATE INDEX IF NOT EXISTS agentbox_ledger_run ON agentbox_ledger (run, seq);
             CREATE INDEX IF NOT EXISTS agentbox_ledger_target ON agentbox_ledger (target, at)",
        )
        .await?;
        Ok(PostgresLedger { pg })
    }

    fn records(rows: Vec<tokio_postgres::Row>) -> Result<Vec<Record>> {
        rows.into_iter()
            .map(|r| {
                let text: String = r.get(0);
                serde_json::from_str(&text).map_err(|e| Error::unknown(format!("ledger: a stored record: {e}")))
            })
            .collect()
    }
}

#[async_trait]
impl LedgerStore for PostgresLedger {
    async fn append(&self, record: &Record) -> Result<()> {
        check_run(&record.run)?;
        let text = serde_json::to_string(record).map_err(|e| Error::unknown(e.to_string()))?;
        self.pg
            .client()
            .execute(
                "INSERT INTO agentbox_ledger (run, seq, target, at, record) VALUES ($1, $2, $3, $4, $5::text::jsonb)",
                &[
                    &record.run,
                    &(record.seq as i64),
                    &record.target,
                    &(record.at as i64),
                    &text,
                ],
            )
            .await
            .map_err(|e| self.pg.error(e, "appending"))?;
        Ok(())
    }
    async fn read(&self, run: &str) -> Result<Vec<Record>> {
        let rows = self
            .pg
            .client()
            .query(
                "SELECT record::text FROM agentbox_ledger WHERE run = $1 ORDER BY seq, n",
                &[&run],
            )
            .await
            .map_err(|e| self.pg.error(e, "reading"))?;
        Self::records(rows)
    }
    async fn read_by_target(&self, target: &str, limit: usize) -> Result<Vec<Record>> {
        let rows = self
            .pg
            .client()
            .query(
                "SELECT record::text FROM agentbox_ledger WHERE target = $1 ORDER BY at DESC, seq DESC, n DESC LIMIT $2",
                &[&target, &(limit as i64)],
            )
            .await
            .map_err(|e| self.pg.error(e, "reading"))?;
        Self::records(rows)
    }
}

/// Calls tools and records each call in a run's ledger.
///
/// ```no_run
/// # async fn f(env: &dyn agentbox_hands::ExecutionEnv) -> agentbox_core::Result<()> {
/// use agentbox_core::Ctx;
/// use agentbox_transport::ledger::{MemoryLedger, Recorder};
/// let recorder = Recorder::open(std::sync::Arc::new(MemoryLedger::default()), "run-1").await?;
/// let r = recorder.call("bash", env, serde_json::json!({"command": "ls"}), &Ctx::background()).await?;
/// # Ok(()) }
/// ```
pub struct Recorder {
    store: std::sync::Arc<dyn LedgerStore>,
    run: String,
    seq: AtomicU64,
}

impl Recorder {
    /// A recorder for `run`, numbering on past what the store already holds of it.
    pub async fn open(store: std::sync::Arc<dyn LedgerStore>, run: &str) -> Result<Self> {
        check_run(run)?;
        let last = store.read(run).await?.iter().map(|r| r.seq).max().unwrap_or(0);
        Ok(Recorder {
            store,
            run: run.to_string(),
            seq: AtomicU64::new(last + 1),
        })
    }

    /// Call `tool` with `args` on `env`, then record the call (its target: the absolute path a
    /// file tool names, the environment a command ran in).
    pub async fn call(
        &self,
        tool: &str,
        env: &dyn ExecutionEnv,
        args: serde_json::Value,
        ctx: &Ctx,
    ) -> Result<ToolResult> {
        let at = agentbox_core::Clock::now_ms(&agentbox_core::SystemClock);
        let r = tools::call(tool, env, args.clone(), ctx).await;
        let target = match tool {
            "bash" => Some(env.id()),
            _ => args
                .get("path")
                .and_then(|p| p.as_str())
                .or(Some("."))
                .map(|p| env.absolute_path(p)),
        };
        let record = Record {
            run: self.run.clone(),
            seq: self.seq.fetch_add(1, Ordering::SeqCst),
            kind: "op.called".into(),
            op: tool.to_string(),
            target,
            at,
            ok: !r.is_error,
            error: r.is_error.then(|| r.text()),
        };
        self.store.append(&record).await?;
        Ok(r)
    }
}

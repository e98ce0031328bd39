//! `agentbox receipts FILE` and `agentbox ledger`: what boxes cost, and what tool calls did.

use std::path::PathBuf;
use std::sync::Arc;

use agentbox_core::{Error, Result};
use agentbox_transport::ledger::{JsonlLedger, LedgerStore, PostgresLedger, Record, SqliteLedger};
use clap::Args;

#[derive(Args)]
pub(crate) struct ReceiptsArgs {
    /// A receipts file (JSON lines).
    file: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Totals by provider and kind.
pub(crate) fn receipts(a: ReceiptsArgs) -> Result<i32> {
    let totals = agentbox_transport::receipts::totals(&a.file)?;
    if a.json {
        let rows: Vec<_> = totals
            .iter()
            .map(|t| serde_json::json!({"provider": t.provider, "kind": t.kind, "boxes": t.boxes, "seconds": t.seconds, "cost_usd": t.usd}))
            .collect();
        println!("{}", serde_json::Value::Array(rows));
        return Ok(0);
    }
    println!(
        "{:<12} {:<16} {:>6} {:>12} {:>12}",
        "provider", "kind", "boxes", "seconds", "usd"
    );
    let (mut boxes, mut secs, mut usd) = (0, 0.0, 0.0);
    for t in &totals {
        println!(
            "{:<12} {:<16} {:>6} {:>12.1} {:>12.6}",
            t.provider, t.kind, t.boxes, t.seconds, t.usd
        );
        boxes += t.boxes;
        secs += t.seconds;
        usd += t.usd;
    }
    println!("{:<12} {:<16} {:>6} {:>12.1} {:>12.6}", "total", "", boxes, secs, usd);
    Ok(0)
}

#[derive(Args)]
pub(crate) struct LedgerArgs {
    /// Where the ledger is: `jsonl:DIR`, `sqlite:FILE`, `postgres:@FILE` (a file holding the
    /// libpq connection string, so a password is in no argument) or `postgres:CONNINFO` (a
    /// password belongs in PGPASSWORD, never here). Default: `jsonl:$AGENTBOX_HOME/ledger`.
    #[arg(long)]
    store: Option<String>,
    /// The calls that acted on this target (an absolute path, or a box), newest first.
    #[arg(long, conflicts_with = "run", required_unless_present = "run")]
    target: Option<String>,
    /// A run's calls, in order.
    #[arg(long)]
    run: Option<String>,
    /// At most this many calls of a target.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// Print JSON lines.
    #[arg(long)]
    json: bool,
}

/// Open the store a `--store` names.
pub(crate) async fn store(spec: Option<&str>) -> Result<Arc<dyn LedgerStore>> {
    let spec = match spec {
        Some(s) => s.to_string(),
        None => format!(
            "jsonl:{}",
            agentbox_providers::home::default_home()?.join("ledger").display()
        ),
    };
    let (kind, rest) = spec.split_once(':').ok_or_else(|| {
        Error::invalid(format!(
            "--store {spec:?}: not jsonl:DIR, sqlite:FILE, postgres:@FILE or postgres:CONNINFO"
        ))
    })?;
    Ok(match kind {
        "jsonl" => Arc::new(JsonlLedger::open(rest.as_ref())?),
        "sqlite" => Arc::new(SqliteLedger::open(rest.as_ref())?),
        "postgres" => match rest.strip_prefix('@') {
            Some(file) => {
                let text =
                    std::fs::read_to_string(file).map_err(|e| Error::io(e, format!("--store postgres:@{file}")))?;
                let conninfo = text.trim();
                if conninfo.is_empty() {
                    return Err(Error::invalid(format!(
                        "postgres:@{file}: the file is empty (it holds a libpq connection string)"
                    )));
                }
                Arc::new(PostgresLedger::connect(conninfo).await?)
            }
            None => {
                if rest.contains("password") {
                    return Err(Error::invalid(
                        "postgres:CONNINFO holds a password, which would show in this process's arguments: \
                         put the connection string in a file and give postgres:@FILE",
                    ));
                }
                Arc::new(PostgresLedger::connect(rest).await?)
            }
        },
        other => {
            return Err(Error::invalid(format!(
                "--store: {other:?} is not a store (jsonl, sqlite, postgres)"
            )));
        }
    })
}

pub(crate) async fn ledger(a: LedgerArgs) -> Result<i32> {
    let s = store(a.store.as_deref()).await?;
    let records = match (&a.target, &a.run) {
        (Some(t), _) => s.read_by_target(t, a.limit).await?,
        (None, Some(r)) => s.read(r).await?,
        (None, None) => return Err(Error::invalid("give --target or --run")),
    };
    for r in &records {
        if a.json {
            println!(
                "{}",
                serde_json::to_string(r).map_err(|e| Error::unknown(e.to_string()))?
            );
        } else {
            println!("{}", line(r));
        }
    }
    Ok(0)
}

fn line(r: &Record) -> String {
    let at = agentbox_core::rfc3339(i64::try_from(r.at).unwrap_or(i64::MAX));
    let outcome = if r.ok {
        "ok".to_string()
    } else {
        format!(
            "error: {}",
            r.error.as_deref().unwrap_or("").lines().next().unwrap_or("")
        )
    };
    format!(
        "{at} {} #{} {} {} {outcome}",
        r.run,
        r.seq,
        r.op,
        r.target.as_deref().unwrap_or("-")
    )
}

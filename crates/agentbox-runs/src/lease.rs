//! Claims across hosts: PostgreSQL leases (run, holder, generation, expiry). A claim is granted
//! when no lease is live, and each grant is the next generation, which the run's store then
//! fences every write with: a holder whose lease expired and was granted to another cannot
//! write, whatever it believes.

use std::time::Duration;

use agentbox_core::{Error, ErrorCode, Result};
use agentbox_transport::postgres::Postgres;

/// The lease table on one PostgreSQL server.
pub struct Leases {
    pg: Postgres,
}

impl Leases {
    /// Connect with a libpq-style string, making the table if missing.
    pub async fn connect(config: &str) -> Result<Self> {
        let pg = Postgres::connect(config, "run leases").await?;
        pg.make_schema(
            "CREATE TABLE IF NOT EXISTS agentbox_run_leases (
                 run TEXT PRIMARY KEY, holder TEXT NOT NULL, generation BIGINT NOT NULL,
                 expires_at TIMESTAMPTZ NOT NULL)",
        )
        .await?;
        Ok(Leases { pg })
    }

    /// Claim `run` for `holder` for `ttl`: its new generation, or `refused` naming the holder
    /// whose lease is live.
    pub async fn claim(&self, run: &str, holder: &str, ttl: Duration) -> Result<u64> {
        let secs = ttl.as_secs_f64();
        let granted = self
            .pg
            .client()
            .query_opt(
                "INSERT INTO agentbox_run_leases AS l (run, holder, generation, expires_at)
                 VALUES ($1, $2, 1, now() + make_interval(secs => $3))
                 ON CONFLICT (run) DO UPDATE
                   SET holder = excluded.holder, generation = l.generation + 1, expires_at = excluded.expires_at
                   WHERE l.expires_at < now()
                 RETURNING generation",
                &[&run, &holder, &secs],
            )
            .await
            .map_err(|e| self.pg.error(e, "claiming"))?;
        if let Some(row) = granted {
            let generation = row.get::<_, i64>(0) as u64;
            tracing::debug!(run, generation, ttl_s = secs, "lease claimed");
            return Ok(generation);
        }
        let held = self
            .pg
            .client()
            .query_opt(
                "SELECT holder, extract(epoch from expires_at - now())::float8 FROM agentbox_run_leases WHERE run = $1",
                &[&run],
            )
            .await
            .map_err(|e| self.pg.error(e, "reading the lease"))?;
        let (who, left): (String, f64) = held.map(|r| (r.get(0), r.get(1))).unwrap_or_default();
        tracing::debug!(run, holder = %who, left_s = left, "lease refused");
        Err(Error::refused(format!(
            "run {run} is held by {who} (its lease has {left:.1}s left)"
        )))
    }

    /// Extend the lease of `generation` by `ttl` from now; `fenced` when it is no longer the
    /// holder's (it expired and another claimed the run).
    pub async fn renew(&self, run: &str, generation: u64, ttl: Duration) -> Result<()> {
        let n = self
            .pg
            .client()
            .execute(
                "UPDATE agentbox_run_leases SET expires_at = now() + make_interval(secs => $3)
                 WHERE run = $1 AND generation = $2 AND expires_at >= now()",
                &[&run, &(generation as i64), &ttl.as_secs_f64()],
            )
            .await
            .map_err(|e| self.pg.error(e, "renewing"))?;
        if n == 0 {
            tracing::warn!(run, generation, "fenced: the lease expired or was taken");
            return Err(Error::new(
                ErrorCode::Fenced,
                format!("run {run}: the lease of generation {generation} has expired or was taken"),
            ));
        }
        Ok(())
    }

    /// Give the lease of `generation` up now (no error when it was already taken).
    pub async fn release(&self, run: &str, generation: u64) -> Result<()> {
        self.pg
            .client()
            .execute(
                "UPDATE agentbox_run_leases SET expires_at = now() - interval '1 second'
                 WHERE run = $1 AND generation = $2",
                &[&run, &(generation as i64)],
            )
            .await
            .map_err(|e| self.pg.error(e, "releasing"))?;
        tracing::debug!(run, generation, "lease released");
        Ok(())
    }
}

//! Keys in PostgreSQL, which servers on many machines share. A connection that ended (the
//! database restarted, a backend was terminated) is made again at the next call.

use agentbox_core::Result;
use tokio::sync::Mutex;

use super::{COLUMNS, Row};

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS agentbox_keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    hash TEXT NOT NULL UNIQUE,
    admin BOOLEAN NOT NULL,
    max_boxes BIGINT,
    max_lifetime_ms BIGINT,
    providers TEXT,
    requests_per_minute BIGINT,
    created_ms BIGINT NOT NULL
)";

const WHAT: &str = "API keys";

pub(super) struct Postgres {
    config: String,
    client: Mutex<std::sync::Arc<agentbox_transport::postgres::Postgres>>,
}

/// A row read back; a column of another type (a table someone changed) is an error, not a
/// panic.
fn row(r: &tokio_postgres::Row) -> Result<Row> {
    let bad =
        |e: tokio_postgres::Error| agentbox_core::Error::unknown(format!("API keys: a row of agentbox_keys: {e}"));
    Ok(Row {
        id: r.try_get(0).map_err(bad)?,
        name: r.try_get(1).map_err(bad)?,
        admin: r.try_get(2).map_err(bad)?,
        max_boxes: r.try_get(3).map_err(bad)?,
        max_lifetime_ms: r.try_get(4).map_err(bad)?,
        providers: r.try_get(5).map_err(bad)?,
        requests_per_minute: r.try_get(6).map_err(bad)?,
        created_ms: r.try_get(7).map_err(bad)?,
    })
}

impl Postgres {
    pub(super) async fn connect(config: &str) -> Result<Self> {
        let pg = agentbox_transport::postgres::Postgres::connect(config, WHAT).await?;
        pg.make_schema(SCHEMA).await?;
        Ok(Postgres {
            config: config.to_string(),
            client: Mutex::new(std::sync::Arc::new(pg)),
        })
    }

    /// The client, connected again if its connection ended.
    async fn client(&self) -> Result<std::sync::Arc<agentbox_transport::postgres::Postgres>> {
        let mut held = self.client.lock().await;
        if held.client().is_closed() {
            tracing::info!("API keys: connecting to PostgreSQL again");
            *held = std::sync::Arc::new(agentbox_transport::postgres::Postgres::connect(&self.config, WHAT).await?);
        }
        Ok(held.clone())
    }

    pub(super) async fn add(&self, r: &Row, hash: &str) -> Result<bool> {
        let pg = self.client().await?;
        let n = pg
            .client()
            .execute(
                "INSERT INTO agentbox_keys (id, name, hash, admin, max_boxes, max_lifetime_ms, providers, requests_per_minute, created_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (name) DO NOTHING",
                &[
                    &r.id,
                    &r.name,
                    &hash,
                    &r.admin,
                    &r.max_boxes,
                    &r.max_lifetime_ms,
                    &r.providers,
                    &r.requests_per_minute,
                    &r.created_ms,
                ],
            )
            .await
            .map_err(|e| pg.error(e, "writing the key"))?;
        Ok(n == 1)
    }

    pub(super) async fn find(&self, hash: &str) -> Result<Option<Row>> {
        let pg = self.client().await?;
        let found = pg
            .client()
            .query_opt(
                &format!("SELECT {COLUMNS} FROM agentbox_keys WHERE hash = $1"),
                &[&hash],
            )
            .await
            .map_err(|e| pg.error(e, "looking a key up"))?;
        found.as_ref().map(row).transpose()
    }

    pub(super) async fn list(&self) -> Result<Vec<Row>> {
        let pg = self.client().await?;
        let rows = pg
            .client()
            .query(&format!("SELECT {COLUMNS} FROM agentbox_keys ORDER BY name"), &[])
            .await
            .map_err(|e| pg.error(e, "listing the keys"))?;
        rows.iter().map(row).collect()
    }

    pub(super) async fn remove(&self, name: &str) -> Result<bool> {
        let pg = self.client().await?;
        let n = pg
            .client()
            .execute("DELETE FROM agentbox_keys WHERE name = $1", &[&name])
            .await
            .map_err(|e| pg.error(e, "removing the key"))?;
        Ok(n > 0)
    }
}

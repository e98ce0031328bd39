//! API keys: who may call the service, and within what limits.
//!
//! A key is shown once, when it is made; the store keeps only its SHA-256, so a stolen
//! database names no key. A request's key is found by hashing what it sent and looking the
//! hash up: the time that takes does not depend on how much of a wrong key was right. Each key
//! has an id (never the key) that the service writes on every box the key makes, as its owner.
//!
//! The store is a SQLite file by default (WAL, every commit synced: [`sqlite`]), which several
//! servers on one machine may share, or a PostgreSQL database ([`postgres`]), which servers on
//! many machines share: replicas behind one load balancer then know the same keys, and (the
//! boxes' owners being labels on the boxes themselves) serve the same boxes.

use std::path::Path;
use std::time::Duration;

use agentbox_core::{Error, Result};
use base64::Engine;
use sha2::{Digest, Sha256};

mod postgres;
mod sqlite;

/// What a key may do beyond calling the service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// The most boxes it may own at once.
    pub max_boxes: Option<u32>,
    /// The longest lifetime a box of it may ask for.
    pub max_lifetime: Option<Duration>,
    /// The providers it may use; `None`: every one the server serves.
    pub providers: Option<Vec<String>>,
    /// The most requests it may make in a minute (in bursts of up to as many); past it, 429
    /// with `Retry-After`. Counted by each server on its own.
    pub requests_per_minute: Option<u32>,
}

/// A key as the store knows it (never the key itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyInfo {
    /// Its id: what the service writes on its boxes as their owner.
    pub id: String,
    /// Its name, for people and the access log.
    pub name: String,
    /// An admin key sees and acts on every box.
    pub admin: bool,
    /// Its limits.
    pub limits: Limits,
    /// When it was made, in ms since the epoch.
    pub created_ms: u64,
}

/// The prefix of every key: a key found in a log or a file says what it is.
pub const KEY_PREFIX: &str = "abk_";

/// The store of API keys. See the [module documentation](self).
///
/// ```
/// # async fn f() {
/// let keys = agentbox_server::Keys::in_memory().unwrap();
/// let (info, secret) = keys.add("ci", false, Default::default()).await.unwrap();
/// assert_eq!(keys.find(&secret).await.unwrap().unwrap().id, info.id);
/// assert!(keys.find("abk_wrong").await.unwrap().is_none());
/// # }
/// ```
pub struct Keys {
    store: Store,
}

enum Store {
    Sqlite(sqlite::Sqlite),
    Postgres(postgres::Postgres),
}

/// How long one call of the PostgreSQL store may take (a half-open connection never answers).
pub const STORE_DEADLINE: Duration = Duration::from_secs(10);

/// `call` within [`STORE_DEADLINE`], else `timeout` naming what it was doing.
async fn within<T>(doing: &str, call: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    match tokio::time::timeout(STORE_DEADLINE, call).await {
        Ok(r) => r,
        Err(_) => Err(Error::timeout(format!(
            "API keys: {doing}: PostgreSQL did not answer within {} s",
            STORE_DEADLINE.as_secs()
        ))),
    }
}

/// The columns of a key, in the order both stores read them.
const COLUMNS: &str = "id, name, admin, max_boxes, max_lifetime_ms, providers, requests_per_minute, created_ms";

fn db(doing: &str, e: impl std::fmt::Display) -> Error {
    Error::unknown(format!("API keys: {doing}: {e}"))
}

fn hash(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn random(bytes: usize) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(|e| Error::unknown(format!("API keys: no randomness: {e}")))?;
    Ok(buf)
}

/// Whether `name` is one a key may have: 1 to 64 of letters, digits, `-`, `_` and `.`.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A key's row as both stores hold it.
struct Row {
    id: String,
    name: String,
    admin: bool,
    max_boxes: Option<i64>,
    max_lifetime_ms: Option<i64>,
    providers: Option<String>,
    requests_per_minute: Option<i64>,
    created_ms: i64,
}

impl Row {
    fn of(info: &KeyInfo) -> Self {
        Row {
            id: info.id.clone(),
            name: info.name.clone(),
            admin: info.admin,
            max_boxes: info.limits.max_boxes.map(i64::from),
            max_lifetime_ms: info.limits.max_lifetime.map(|d| d.as_millis() as i64),
            providers: info.limits.providers.as_ref().map(|p| p.join(",")),
            requests_per_minute: info.limits.requests_per_minute.map(i64::from),
            created_ms: info.created_ms as i64,
        }
    }

    fn info(self) -> KeyInfo {
        let small = |n: Option<i64>| n.map(|n| u32::try_from(n.max(0)).unwrap_or(u32::MAX));
        KeyInfo {
            id: self.id,
            name: self.name,
            admin: self.admin,
            limits: Limits {
                max_boxes: small(self.max_boxes),
                max_lifetime: self.max_lifetime_ms.map(|ms| Duration::from_millis(ms.max(0) as u64)),
                providers: self.providers.map(|p| p.split(',').map(String::from).collect()),
                requests_per_minute: small(self.requests_per_minute),
            },
            created_ms: self.created_ms.max(0) as u64,
        }
    }
}

impl Keys {
    /// Open (or make) the SQLite store at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        Ok(Keys {
            store: Store::Sqlite(sqlite::Sqlite::open(path)?),
        })
    }

    /// A store in this process's memory, for tests.
    pub fn in_memory() -> Result<Self> {
        Ok(Keys {
            store: Store::Sqlite(sqlite::Sqlite::in_memory()?),
        })
    }

    /// Connect to the PostgreSQL store at `config` (a libpq connection string, which may hold
    /// a password: it is never put in an error or a log), making its table if missing.
    pub async fn postgres(config: &str) -> Result<Self> {
        Ok(Keys {
            store: Store::Postgres(postgres::Postgres::connect(config).await?),
        })
    }

    /// Which store this is, for logs: `sqlite` or `postgres`.
    pub fn kind(&self) -> &'static str {
        match self.store {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    }

    /// Make a key called `name`: its record, and the key itself, which nothing keeps (show it
    /// once). A name already taken is `refused`.
    pub async fn add(&self, name: &str, admin: bool, limits: Limits) -> Result<(KeyInfo, String)> {
        if !valid_name(name) {
            return Err(Error::invalid(format!(
                "key name {name:?}: 1 to 64 letters, digits, '-', '_' or '.'"
            )));
        }
        if let Some(p) = &limits.providers
            && p.is_empty()
        {
            return Err(Error::invalid("--providers: name at least one provider"));
        }
        if limits.requests_per_minute == Some(0) {
            return Err(Error::invalid("--requests-per-minute: at least 1"));
        }
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let secret = format!("{KEY_PREFIX}{}", b64.encode(random(32)?));
        let id = random(8)?.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let info = KeyInfo {
            id,
            name: name.to_string(),
            admin,
            limits,
            created_ms: agentbox_core::now_ms(),
        };
        let row = Row::of(&info);
        let h = hash(&secret);
        let added = match &self.store {
            Store::Sqlite(s) => s.add(&row, &h)?,
            Store::Postgres(p) => within("writing the key", p.add(&row, &h)).await?,
        };
        if !added {
            return Err(Error::refused(format!("key name {name:?}: a key of that name exists")));
        }
        Ok((info, secret))
    }

    /// The key whose secret this is, if any.
    pub async fn find(&self, secret: &str) -> Result<Option<KeyInfo>> {
        let h = hash(secret);
        let row = match &self.store {
            Store::Sqlite(s) => s.find(&h)?,
            Store::Postgres(p) => within("looking a key up", p.find(&h)).await?,
        };
        Ok(row.map(Row::info))
    }

    /// Every key, by name.
    pub async fn list(&self) -> Result<Vec<KeyInfo>> {
        let rows = match &self.store {
            Store::Sqlite(s) => s.list()?,
            Store::Postgres(p) => within("listing the keys", p.list()).await?,
        };
        Ok(rows.into_iter().map(Row::info).collect())
    }

    /// Remove the key called `name`; whether there was one. Its boxes keep their owner's id
    /// and only an admin key reaches them.
    pub async fn remove(&self, name: &str) -> Result<bool> {
        match &self.store {
            Store::Sqlite(s) => s.remove(name),
            Store::Postgres(p) => within("removing the key", p.remove(name)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_key_is_kept_hashed_and_found_by_its_secret_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.db");
        let keys = Keys::open(&path).unwrap();
        let limits = Limits {
            max_boxes: Some(3),
            max_lifetime: Some(Duration::from_secs(600)),
            providers: Some(vec!["local".into(), "docker".into()]),
            requests_per_minute: Some(120),
        };
        let (info, secret) = keys.add("team-a", false, limits.clone()).await.unwrap();
        assert!(secret.starts_with(KEY_PREFIX) && secret.len() > 40, "{secret}");
        drop(keys);
        let text = std::fs::read(&path).unwrap();
        assert!(
            !text.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "the key itself is nowhere in the file"
        );
        let keys = Keys::open(&path).unwrap();
        let found = keys.find(&secret).await.unwrap().expect("found again after a reopen");
        assert_eq!((found.id.as_str(), found.limits), (info.id.as_str(), limits));
        assert!(keys.find(&format!("{secret}x")).await.unwrap().is_none());
        assert_eq!(
            keys.add("team-a", true, Limits::default()).await.unwrap_err().code(),
            agentbox_core::ErrorCode::Refused
        );
        assert_eq!(
            keys.add("bad name", false, Limits::default()).await.unwrap_err().code(),
            agentbox_core::ErrorCode::Invalid
        );
        assert!(keys.remove("team-a").await.unwrap());
        assert!(keys.find(&secret).await.unwrap().is_none());
        assert!(!keys.remove("team-a").await.unwrap());
    }
}

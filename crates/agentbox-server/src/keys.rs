//! API keys: who may call the service, and within what limits.
//!
//! A key is shown once, when it is made; the store keeps only its SHA-256, so a stolen
//! database names no key. A request's key is found by hashing what it sent and looking the
//! hash up: the time that takes does not depend on how much of a wrong key was right. Each key
//! has an id (never the key) that the service writes on every box the key makes, as its owner.
//!
//! The store is a SQLite file (WAL, every commit synced), which several servers on one machine
//! may share.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use agentbox_core::{Error, Result};
use base64::Engine;
use rusqlite::{Connection, OptionalExtension};
use sha2::{Digest, Sha256};

/// What a key may do beyond calling the service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// The most boxes it may own at once.
    pub max_boxes: Option<u32>,
    /// The longest lifetime a box of it may ask for.
    pub max_lifetime: Option<Duration>,
    /// The providers it may use; `None`: every one the server serves.
    pub providers: Option<Vec<String>>,
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
/// let keys = agentbox_server::Keys::in_memory().unwrap();
/// let (info, secret) = keys.add("ci", false, Default::default()).unwrap();
/// assert_eq!(keys.find(&secret).unwrap().unwrap().id, info.id);
/// assert!(keys.find("abk_wrong").unwrap().is_none());
/// ```
pub struct Keys {
    conn: Mutex<Connection>,
}

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    hash TEXT NOT NULL UNIQUE,
    admin INTEGER NOT NULL,
    max_boxes INTEGER,
    max_lifetime_ms INTEGER,
    providers TEXT,
    created_ms INTEGER NOT NULL
);";

fn db(doing: &str, e: rusqlite::Error) -> Error {
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

impl Keys {
    /// Open (or make) the store at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = Connection::open(path).map_err(|e| db(&format!("opening {}", path.display()), e))?;
        conn.busy_timeout(Duration::from_secs(10))
            .map_err(|e| db("setting the busy timeout", e))?;
        conn.execute_batch(&format!("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; {SCHEMA}"))
            .map_err(|e| db("making its table", e))?;
        Ok(Keys { conn: Mutex::new(conn) })
    }

    /// A store in this process's memory, for tests.
    pub fn in_memory() -> Result<Self> {
        let conn = Connection::open_in_memory().map_err(|e| db("opening a store in memory", e))?;
        conn.execute_batch(SCHEMA).map_err(|e| db("making its table", e))?;
        Ok(Keys { conn: Mutex::new(conn) })
    }

    /// Make a key called `name`: its record, and the key itself, which nothing keeps (show it
    /// once). A name already taken is `refused`.
    pub fn add(&self, name: &str, admin: bool, limits: Limits) -> Result<(KeyInfo, String)> {
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
        let providers = info.limits.providers.as_ref().map(|p| p.join(","));
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let taken: Option<String> = conn
            .query_row("SELECT id FROM keys WHERE name = ?1", [name], |r| r.get(0))
            .optional()
            .map_err(|e| db("looking the name up", e))?;
        if taken.is_some() {
            return Err(Error::refused(format!("key name {name:?}: a key of that name exists")));
        }
        conn.execute(
            "INSERT INTO keys (id, name, hash, admin, max_boxes, max_lifetime_ms, providers, created_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            rusqlite::params![
                info.id,
                info.name,
                hash(&secret),
                info.admin,
                info.limits.max_boxes,
                info.limits.max_lifetime.map(|d| d.as_millis() as i64),
                providers,
                info.created_ms as i64,
            ],
        )
        .map_err(|e| db("writing the key", e))?;
        Ok((info, secret))
    }

    /// The key whose secret this is, if any.
    pub fn find(&self, secret: &str) -> Result<Option<KeyInfo>> {
        let h = hash(secret);
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        conn.query_row(
            "SELECT id, name, admin, max_boxes, max_lifetime_ms, providers, created_ms FROM keys WHERE hash = ?1",
            [h],
            row,
        )
        .optional()
        .map_err(|e| db("looking a key up", e))
    }

    /// Every key, by name.
    pub fn list(&self) -> Result<Vec<KeyInfo>> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let mut st = conn
            .prepare(
                "SELECT id, name, admin, max_boxes, max_lifetime_ms, providers, created_ms FROM keys ORDER BY name",
            )
            .map_err(|e| db("listing the keys", e))?;
        let rows = st.query_map([], row).map_err(|e| db("listing the keys", e))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| db("listing the keys", e))
    }

    /// Remove the key called `name`; whether there was one. Its boxes keep their owner's id
    /// and only an admin key reaches them.
    pub fn remove(&self, name: &str) -> Result<bool> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let n = conn
            .execute("DELETE FROM keys WHERE name = ?1", [name])
            .map_err(|e| db("removing the key", e))?;
        Ok(n > 0)
    }
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<KeyInfo> {
    let providers: Option<String> = r.get(5)?;
    let max_lifetime: Option<i64> = r.get(4)?;
    let created: i64 = r.get(6)?;
    Ok(KeyInfo {
        id: r.get(0)?,
        name: r.get(1)?,
        admin: r.get(2)?,
        limits: Limits {
            max_boxes: r.get(3)?,
            max_lifetime: max_lifetime.map(|ms| Duration::from_millis(ms.max(0) as u64)),
            providers: providers.map(|p| p.split(',').map(String::from).collect()),
        },
        created_ms: created.max(0) as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_kept_hashed_and_found_by_its_secret_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.db");
        let keys = Keys::open(&path).unwrap();
        let limits = Limits {
            max_boxes: Some(3),
            max_lifetime: Some(Duration::from_secs(600)),
            providers: Some(vec!["local".into(), "docker".into()]),
        };
        let (info, secret) = keys.add("team-a", false, limits.clone()).unwrap();
        assert!(secret.starts_with(KEY_PREFIX) && secret.len() > 40, "{secret}");
        drop(keys);
        let text = std::fs::read(&path).unwrap();
        assert!(
            !text.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "the key itself is nowhere in the file"
        );
        let keys = Keys::open(&path).unwrap();
        let found = keys.find(&secret).unwrap().expect("found again after a reopen");
        assert_eq!((found.id.as_str(), found.limits), (info.id.as_str(), limits));
        assert!(keys.find(&format!("{secret}x")).unwrap().is_none());
        assert_eq!(
            keys.add("team-a", true, Limits::default()).unwrap_err().code(),
            agentbox_core::ErrorCode::Refused
        );
        assert_eq!(
            keys.add("bad name", false, Limits::default()).unwrap_err().code(),
            agentbox_core::ErrorCode::Invalid
        );
        assert!(keys.remove("team-a").unwrap());
        assert!(keys.find(&secret).unwrap().is_none());
        assert!(!keys.remove("team-a").unwrap());
    }
}

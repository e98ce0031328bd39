//! Watching a directory, as envd's `WatchDir` (a stream of events) and its watcher API
//! (`CreateWatcher`, then `GetWatcherEvents` to drain, `RemoveWatcher`) give it: each event a
//! name (relative to the watched directory) and a type (create, write, remove, chmod).
//!
//! A box has no inotify the host can reach through agentbox's contract, so a watch is a poll:
//! the directory (and, with `recursive`, every directory under it) listed through the box's
//! `files()` every [`POLL`], the listing compared with the last. A rename is seen as a remove
//! and a create; a change and its undo within one poll are not seen; at most [`MAX_ENTRIES`]
//! entries are watched (past them, the rest are not listed and a watch reports nothing of them).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentbox_core::{Ctx, FileError, FileType, Sandbox};
use serde_json::{Value, json};

/// How often a watched directory is listed.
pub(crate) const POLL: Duration = Duration::from_millis(250);
/// The most entries one watch lists.
const MAX_ENTRIES: usize = 10_000;
/// The most events a watcher keeps until they are drained (the oldest let go).
const MAX_KEPT: usize = 10_000;
/// How long one listing may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(30);

/// What a poll remembers of an entry: its kind, size, mtime and mode.
pub(crate) type Seen = BTreeMap<String, (FileType, u64, i64, u32)>;

/// One listing of `root` (every level under it with `recursive`), by name relative to it.
pub(crate) async fn list(b: &dyn Sandbox, root: &str, recursive: bool) -> Result<Seen, FileError> {
    let Some(f) = b.files() else {
        return Err(FileError::Box(agentbox_core::Error::unsupported(
            "the box serves no files",
        )));
    };
    let ctx = Ctx::background().with_timeout(LIST_TIMEOUT);
    let mut seen = Seen::new();
    let mut todo = vec![String::new()];
    while let Some(rel) = todo.pop() {
        let dir = if rel.is_empty() {
            root.to_string()
        } else {
            format!("{}/{rel}", root.trim_end_matches('/'))
        };
        let entries = match f.list(&dir, &ctx).await {
            Ok(e) => e,
            // A directory under the root gone between two listings: its entries are gone.
            Err(FileError::Os(2 | 20)) if !rel.is_empty() => continue,
            Err(e) => return Err(e),
        };
        for m in entries {
            if seen.len() >= MAX_ENTRIES {
                return Ok(seen);
            }
            let name = if rel.is_empty() {
                m.name.clone()
            } else {
                format!("{rel}/{}", m.name)
            };
            if recursive && m.kind == FileType::Dir {
                todo.push(name.clone());
            }
            seen.insert(name, (m.kind, m.size, m.mtime_ms, m.mode));
        }
    }
    Ok(seen)
}

/// The events from `old` to `new`, as envd's `FilesystemEvent`s: removes, then creates, then
/// writes and mode changes, each in name order.
pub(crate) fn changes(old: &Seen, new: &Seen) -> Vec<Value> {
    let event = |name: &str, kind: &str| json!({"name": name, "type": kind});
    let mut out: Vec<Value> = old
        .keys()
        .filter(|k| !new.contains_key(*k))
        .map(|k| event(k, "EVENT_TYPE_REMOVE"))
        .collect();
    out.extend(
        new.keys()
            .filter(|k| !old.contains_key(*k))
            .map(|k| event(k, "EVENT_TYPE_CREATE")),
    );
    for (k, (kind, size, mtime, mode)) in new {
        let Some((was_kind, was_size, was_mtime, was_mode)) = old.get(k) else {
            continue;
        };
        if kind == was_kind && *kind != FileType::Dir && (size != was_size || mtime != was_mtime) {
            out.push(event(k, "EVENT_TYPE_WRITE"));
        }
        if mode != was_mode {
            out.push(event(k, "EVENT_TYPE_CHMOD"));
        }
    }
    out
}

/// A watcher of the watcher API: its events kept until drained, its poll ended when it is
/// dropped (removed, or its sandbox gone).
pub(crate) struct Watcher {
    events: Arc<Mutex<Vec<Value>>>,
    poll: tokio::task::AbortHandle,
}

impl Watcher {
    /// Watch `root` of `b`, its first listing `first`.
    pub(crate) fn start(b: Arc<dyn Sandbox>, root: String, recursive: bool, first: Seen) -> Watcher {
        let events: Arc<Mutex<Vec<Value>>> = Default::default();
        let kept = events.clone();
        let poll = tokio::spawn(async move {
            let mut last = first;
            loop {
                tokio::time::sleep(POLL).await;
                let Ok(now) = list(b.as_ref(), &root, recursive).await else {
                    continue;
                };
                let new = changes(&last, &now);
                last = now;
                if new.is_empty() {
                    continue;
                }
                let mut e = kept.lock().unwrap_or_else(|p| p.into_inner());
                e.extend(new);
                if e.len() > MAX_KEPT {
                    let over = e.len() - MAX_KEPT;
                    e.drain(..over);
                }
            }
        })
        .abort_handle();
        Watcher { events, poll }
    }

    /// The events since the last drain.
    pub(crate) fn drain(&self) -> Vec<Value> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.poll.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(entries: &[(&str, FileType, u64, i64, u32)]) -> Seen {
        entries
            .iter()
            .map(|(n, k, s, m, mode)| (n.to_string(), (*k, *s, *m, *mode)))
            .collect()
    }

    #[test]
    fn changes_are_removes_creates_writes_and_mode_changes() {
        let old = seen(&[
            ("a", FileType::File, 1, 10, 0o644),
            ("b", FileType::File, 1, 10, 0o644),
            ("d", FileType::Dir, 4096, 10, 0o755),
            ("gone", FileType::File, 1, 10, 0o644),
        ]);
        let new = seen(&[
            ("a", FileType::File, 2, 11, 0o644),
            ("b", FileType::File, 1, 10, 0o600),
            ("d", FileType::Dir, 4096, 12, 0o755),
            ("new", FileType::File, 0, 12, 0o644),
        ]);
        let got: Vec<(String, String)> = changes(&old, &new)
            .iter()
            .map(|e| (e["name"].as_str().unwrap().into(), e["type"].as_str().unwrap().into()))
            .collect();
        let want = [
            ("gone", "EVENT_TYPE_REMOVE"),
            ("new", "EVENT_TYPE_CREATE"),
            ("a", "EVENT_TYPE_WRITE"),
            ("b", "EVENT_TYPE_CHMOD"),
        ];
        assert_eq!(got, want.map(|(n, t)| (n.to_string(), t.to_string())));
        assert!(changes(&new, &new).is_empty(), "no change, no event");
    }
}

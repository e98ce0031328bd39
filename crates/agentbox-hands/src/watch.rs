//! Watching paths by polling: each environment gives a snapshot of the targets (one call on
//! the host, one exec in a box), and changes are the differences between two snapshots.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::fs::FileKind;

/// One thing to watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchTarget {
    /// The path.
    pub path: String,
    /// Its whole subtree.
    pub recursive: bool,
    /// Names (a segment) left out.
    pub exclude: Vec<String>,
}

/// A change a watcher saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The path that changed.
    pub path: String,
    /// `created`, `changed` or `removed`.
    pub kind: ChangeKind,
}

/// What happened to a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    /// It appeared.
    Created,
    /// Its kind, size or time changed.
    Changed,
    /// It went away.
    Removed,
}

/// How a watcher learns of changes. Every agentbox watcher polls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchMode {
    /// The kernel tells.
    Native,
    /// The watcher looks again every interval.
    Polling,
}

/// What a snapshot records of a path.
pub type Seen = BTreeMap<String, (FileKind, u64, i64)>;

/// Takes one snapshot; `None` when it failed (the next poll tries again).
pub type Snapshot = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Option<Seen>> + Send>> + Send + Sync>;

/// A running watcher. Dropping it, or [`Watcher::close`], stops it.
pub struct Watcher {
    /// Always [`WatchMode::Polling`].
    pub mode: WatchMode,
    task: tokio::task::JoinHandle<()>,
}

impl Watcher {
    /// Poll `snapshot` every `interval`, calling `on_change` for each difference.
    pub fn start(snapshot: Snapshot, interval: Duration, on_change: Arc<dyn Fn(Change) + Send + Sync>) -> Watcher {
        let task = tokio::spawn(async move {
            let mut last = snapshot().await.unwrap_or_default();
            loop {
                tokio::time::sleep(interval).await;
                let Some(now) = snapshot().await else { continue };
                for change in diff(&last, &now) {
                    on_change(change);
                }
                last = now;
            }
        });
        Watcher {
            mode: WatchMode::Polling,
            task,
        }
    }

    /// Stop watching.
    pub fn close(self) {}
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The changes from `a` to `b`, in path order.
pub fn diff(a: &Seen, b: &Seen) -> Vec<Change> {
    let mut out = Vec::new();
    for (p, v) in b {
        match a.get(p) {
            None => out.push(Change {
                path: p.clone(),
                kind: ChangeKind::Created,
            }),
            Some(old) if old != v => out.push(Change {
                path: p.clone(),
                kind: ChangeKind::Changed,
            }),
            _ => {}
        }
    }
    for p in a.keys() {
        if !b.contains_key(p) {
            out.push(Change {
                path: p.clone(),
                kind: ChangeKind::Removed,
            });
        }
    }
    out.sort_by(|x, y| x.path.cmp(&y.path));
    out
}

/// The targets with their paths made absolute against `cwd`.
pub fn absolute_targets(cwd: &str, targets: Vec<WatchTarget>) -> Vec<WatchTarget> {
    targets
        .into_iter()
        .map(|t| WatchTarget {
            path: crate::path::absolute(cwd, &t.path),
            ..t
        })
        .collect()
}

/// Whether `path` under `root` passes the target's excludes (a name matching any segment).
pub fn excluded(root: &str, path: &str, exclude: &[String]) -> bool {
    let rel = path.strip_prefix(root).unwrap_or(path);
    rel.split('/').any(|seg| exclude.iter().any(|e| e == seg))
}

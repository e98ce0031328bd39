//! Delegation checkouts: the exclusive hold an exec's writable mount takes on the path it
//! exposes (the disk and its subdirectory, or each of `checkoutPaths` under it), so two
//! clients never write one tree at once. Two paths conflict when they are on one disk and one
//! is the other or an ancestor of it (`a` and `a/b`; the disk's root conflicts with every
//! path of the disk).
//!
//! A request waits in one FIFO queue: it takes its paths once none of them conflicts with a
//! held checkout or with a request queued before it (so a later request never overtakes an
//! earlier one it conflicts with, while one that conflicts with nobody passes), or gives up
//! when its own wait (`queueMs`; none: it does not wait) ends. An exec takes every path of all
//! its mounts at once, all or none, so two execs never hold half of each other's paths. The
//! hold ends when its [`Held`] is dropped, at the end of the call. Object API writes under a
//! held path are refused (`Checkouts::blocks`); reads are not.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One path a checkout holds: a disk and the segments under its root (none: the root).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CoPath {
    pub(crate) disk: String,
    pub(crate) segs: Vec<String>,
}

impl CoPath {
    /// The same disk, and one path is the other or under it.
    pub(crate) fn conflicts(&self, other: &CoPath) -> bool {
        let n = self.segs.len().min(other.segs.len());
        self.disk == other.disk && self.segs[..n] == other.segs[..n]
    }
}

/// Every checkout held, and every request waiting for one.
#[derive(Default)]
pub(crate) struct Checkouts {
    state: Mutex<State>,
    changed: tokio::sync::watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    next: u64,
    held: Vec<(u64, Vec<CoPath>)>,
    queue: VecDeque<(u64, Vec<CoPath>)>,
}

/// A checkout held until dropped.
pub(crate) struct Held {
    id: u64,
    owner: Arc<Checkouts>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.owner.release(self.id);
    }
}

/// Why a checkout was not had.
#[derive(Debug)]
pub(crate) struct NotHad {
    /// A held checkout or a request before this one that conflicts, for the message.
    pub(crate) blocker: Option<CoPath>,
    /// How long the request waited.
    pub(crate) waited: Duration,
}

/// The most requests that may wait at once (past it, a request gives up at once).
const MAX_QUEUE: usize = 1024;

impl Checkouts {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take all of `paths` at once, waiting up to `wait` in FIFO order behind every request
    /// that conflicts with it. No paths: held at once, holding nothing.
    pub(crate) async fn acquire(self: &Arc<Self>, paths: Vec<CoPath>, wait: Duration) -> Result<Held, NotHad> {
        let start = Instant::now();
        let deadline = tokio::time::Instant::now() + wait;
        let mut rx = self.changed.subscribe();
        let id = {
            let mut s = self.lock();
            let id = s.next;
            s.next += 1;
            if s.queue.len() >= MAX_QUEUE {
                return Err(NotHad {
                    blocker: s.held.first().and_then(|(_, p)| p.first().cloned()),
                    waited: Duration::ZERO,
                });
            }
            s.queue.push_back((id, paths));
            id
        };
        loop {
            rx.borrow_and_update();
            let blocker = {
                let mut s = self.lock();
                match s.blocker_of(id) {
                    None => {
                        if let Some(i) = s.queue.iter().position(|(q, _)| *q == id) {
                            let (_, p) = s.queue.remove(i).unwrap_or((id, Vec::new()));
                            s.held.push((id, p));
                        }
                        return Ok(Held {
                            id,
                            owner: self.clone(),
                        });
                    }
                    Some(b) => b,
                }
            };
            let timed_out = tokio::time::timeout_at(deadline, rx.changed()).await.is_err();
            if timed_out || tokio::time::Instant::now() >= deadline {
                // One last look: a release may have come with the deadline.
                let mut s = self.lock();
                if s.blocker_of(id).is_none() {
                    if let Some(i) = s.queue.iter().position(|(q, _)| *q == id) {
                        let (_, p) = s.queue.remove(i).unwrap_or((id, Vec::new()));
                        s.held.push((id, p));
                    }
                    return Ok(Held {
                        id,
                        owner: self.clone(),
                    });
                }
                s.queue.retain(|(q, _)| *q != id);
                drop(s);
                // Leaving the queue may let a request behind this one go.
                self.changed.send_modify(|n| *n += 1);
                return Err(NotHad {
                    blocker: Some(blocker),
                    waited: start.elapsed(),
                });
            }
        }
    }

    fn release(&self, id: u64) {
        self.lock().held.retain(|(h, _)| *h != id);
        self.changed.send_modify(|n| *n += 1);
    }

    /// A held checkout that conflicts with `path`: an object API write there is refused.
    pub(crate) fn blocks(&self, path: &CoPath) -> Option<CoPath> {
        self.lock()
            .held
            .iter()
            .flat_map(|(_, ps)| ps.iter())
            .find(|p| p.conflicts(path))
            .cloned()
    }
}

impl State {
    /// What keeps request `id` from taking its paths now: a held path, or one of a request
    /// queued before it.
    fn blocker_of(&self, id: u64) -> Option<CoPath> {
        let mine = &self.queue.iter().find(|(q, _)| *q == id)?.1;
        let conflict = |theirs: &Vec<CoPath>| theirs.iter().find(|t| mine.iter().any(|m| m.conflicts(t))).cloned();
        if let Some(b) = self.held.iter().find_map(|(_, p)| conflict(p)) {
            return Some(b);
        }
        self.queue
            .iter()
            .take_while(|(q, _)| *q != id)
            .find_map(|(_, p)| conflict(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(disk: &str, path: &str) -> CoPath {
        CoPath {
            disk: disk.into(),
            segs: path.split('/').filter(|s| !s.is_empty()).map(str::to_string).collect(),
        }
    }

    #[test]
    fn paths_conflict_when_one_holds_the_other() {
        assert!(p("d", "a").conflicts(&p("d", "a/b")));
        assert!(p("d", "a/b").conflicts(&p("d", "a")));
        assert!(p("d", "").conflicts(&p("d", "x/y")));
        assert!(p("d", "a").conflicts(&p("d", "a")));
        assert!(!p("d", "a").conflicts(&p("d", "ab")));
        assert!(!p("d", "a/b").conflicts(&p("d", "a/c")));
        assert!(!p("d", "a").conflicts(&p("e", "a")));
    }

    #[tokio::test]
    async fn a_conflicting_request_waits_its_turn_and_an_unrelated_one_passes() {
        let c = Arc::new(Checkouts::default());
        let first = c.acquire(vec![p("d", "a")], Duration::ZERO).await.unwrap();
        // No wait: refused at once, naming what holds it.
        let e = c.acquire(vec![p("d", "a/b")], Duration::ZERO).await.err().unwrap();
        assert_eq!(e.blocker, Some(p("d", "a")));
        // Another path of the disk is free.
        let other = c.acquire(vec![p("d", "b")], Duration::ZERO).await.unwrap();
        assert!(c.blocks(&p("d", "b/x")).is_some());
        drop(other);
        assert!(c.blocks(&p("d", "b/x")).is_none());
        let c2 = c.clone();
        let waiter = tokio::spawn(async move { c2.acquire(vec![p("d", "")], Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(first);
        let held = waiter.await.unwrap().unwrap();
        assert!(c.blocks(&p("d", "z")).is_some());
        drop(held);
        assert!(c.blocks(&p("d", "z")).is_none());
    }
}

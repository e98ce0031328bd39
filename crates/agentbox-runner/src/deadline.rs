//! A box's deadline as the instant it ends on this machine's monotonic clock.
//!
//! The host says a deadline as a wall-clock time (milliseconds since the Unix epoch), which is
//! what a record keeps and what other hosts can read. But the wall clock jumps (an NTP step, a
//! clock set by hand): a box that measured its end against it would live an hour longer when
//! the clock is set an hour back, or end at once when it is set forward. So the wall time is
//! turned into "this long from now" once, when it is given, and the wait is on the monotonic
//! clock, which no one sets. (The monotonic clock stops while the machine is suspended: a box
//! on a host that slept lives that much longer. Hosts that run boxes do not sleep.)

use std::time::{Duration, Instant};

use agentbox_core::now_ms;

/// The instant, on the monotonic clock, at which the wall-clock time `ms` falls as the wall
/// clock reads now (now, for a time already past).
///
/// ```
/// use std::time::{Duration, Instant};
/// let soon = agentbox_runner::deadline::until(agentbox_core::now_ms() + 60_000);
/// assert!(soon > Instant::now() + Duration::from_secs(59));
/// assert!(agentbox_runner::deadline::until(0) <= Instant::now());
/// ```
pub fn until(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms.saturating_sub(now_ms()))
}

/// Wait on `moved` until the deadline `deadline_of(state)` names has come, measured on the
/// monotonic clock from when each deadline was first seen; a deadline moved (a new value) is
/// measured again from when it is seen.
pub fn wait<'a, T>(
    mut state: std::sync::MutexGuard<'a, T>,
    moved: &std::sync::Condvar,
    deadline_of: impl Fn(&T) -> u64,
) -> std::sync::MutexGuard<'a, T> {
    let mut seen = deadline_of(&state);
    let mut end = until(seen);
    loop {
        let now = deadline_of(&state);
        if now != seen {
            seen = now;
            end = until(seen);
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return state;
        }
        state = moved.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
    }
}

//! Tests that run their own test binary again as a child playing a part (a holder to SIGKILL,
//! a writer to crash mid-commit, a second host).
//!
//! The child is the same test, run again alone with `--exact`, told its part by
//! [`PART_ENV`]. So there is no test of its own for the child that, run in the ordinary way
//! with the variable unset, would report `ok` having done nothing: every test runs its whole
//! scenario unless it is the child of that very scenario. The variable names the parent's
//! pid beside the part, and a process whose parent is another takes no part, so a stray
//! variable in a shell never turns a test into a child.
//!
//! ```no_run
//! use agentbox_testing::reexec;
//! #[test]
//! fn a_holder_killed_leaves_nothing() {
//!     if reexec::part().as_deref() == Some("holder") {
//!         // ... make things, say so on stdout, wait to be killed.
//!         reexec::done();
//!     }
//!     let child = reexec::child("a_holder_killed_leaves_nothing", "holder").spawn().unwrap();
//!     // ... read what it says, kill it, check what is left.
//! #   drop(child);
//! }
//! ```

use std::io::Write;
use std::process::Command;

/// The variable that tells a child its part: `<parent pid>:<part>`.
pub const PART_ENV: &str = "AGENTBOX_TEST_PART";

/// The part this process plays, when the test running it was started by [`child`] from its
/// parent; `None` otherwise (the test then plays the parent, its whole scenario).
pub fn part() -> Option<String> {
    let value = std::env::var(PART_ENV).ok()?;
    let (pid, part) = value.split_once(':')?;
    (pid.parse::<u32>().ok()? == std::os::unix::process::parent_id()).then(|| part.to_string())
}

/// A command that runs the test `test` of this test binary again, alone and with its output
/// uncaptured (what the child prints is how it talks to its parent), as `part`.
///
/// Panics when this executable cannot be found, which no test can go on without.
pub fn child(test: &str, part: &str) -> Command {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("finding this test binary to run it again: {e}"));
    let mut c = Command::new(exe);
    c.args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(PART_ENV, format!("{}:{part}", std::process::id()));
    c
}

/// End a child whose part is over: its output flushed, exit code 0, and no test result
/// printed (the child is not a test of its own).
pub fn done() -> ! {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::process::exit(0)
}

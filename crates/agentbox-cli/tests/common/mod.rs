//! What the CLI's test binaries share: a home of their own for the `agentbox` binary.

#![allow(dead_code)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// An `$AGENTBOX_HOME` of the test's own, removed when it drops.
pub(crate) struct Home(pub(crate) tempfile::TempDir);

impl Home {
    pub(crate) fn new() -> Self {
        Home(tempfile::tempdir().unwrap())
    }

    /// `agentbox ARGS` in this home, `stdin` written to it, run to its end.
    pub(crate) fn run(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut child = Command::new(env!("CARGO_BIN_EXE_agentbox"))
            .args(args)
            .env("AGENTBOX_HOME", self.0.path())
            // The default provider is the tests' to choose.
            .env_remove("AGENTBOX_PROVIDER")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        child.wait_with_output().unwrap()
    }

    /// `agentbox ARGS`, which must succeed: its stdout.
    pub(crate) fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args, b"");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

/// The run record (`run.json`) in `dir` once it says `f`, read again every 50 ms for at most a
/// minute (a record being replaced is simply read again); panics naming `what` past that.
pub(crate) fn record_until(
    dir: &std::path::Path,
    what: &str,
    f: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let t = std::time::Instant::now();
    loop {
        if let Ok(bytes) = std::fs::read(dir.join("run.json"))
            && let Ok(r) = serde_json::from_slice::<serde_json::Value>(&bytes)
            && f(&r)
        {
            return r;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(60),
            "{}: never {what}",
            dir.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

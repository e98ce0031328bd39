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

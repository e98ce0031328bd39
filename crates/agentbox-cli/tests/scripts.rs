//! What a script relies on from the `agentbox` binary: exit codes, errors, listings and JSON.

use std::process::Output;

mod common;
use common::Home;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `out` exited `code` with one line on stderr naming `needle`.
fn one_line_error(out: &Output, code: i32, needle: &str) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
    assert!(
        err.starts_with("agentbox: ") && err.contains(needle),
        "{err:?} should name {needle:?}"
    );
}

/// A local box, ended when the test ends.
struct Boxed<'a> {
    home: &'a Home,
    id: String,
}

impl<'a> Boxed<'a> {
    fn new(home: &'a Home, args: &[&str]) -> Self {
        let mut all = vec!["box", "create", "--lifetime", "5m"];
        all.extend(args);
        let id = home.ok(&all).trim().to_string();
        Boxed { home, id }
    }
}

impl Drop for Boxed<'_> {
    fn drop(&mut self) {
        let _ = self.home.run(&["box", "rm", &self.id], b"");
    }
}

#[test]
fn agentboxs_own_checks_of_arguments_exit_2_as_usage_errors() {
    let h = Home::new();
    one_line_error(&h.run(&["box", "cp", "a", "b"], b""), 2, "one side must be ID:PATH");
    one_line_error(
        &h.run(&["box", "cp", "local:ab12:x", "local:cd34:y"], b""),
        2,
        "two steps",
    );
    for args in [
        vec!["box", "create", "--provider", "foo"],
        vec!["box", "ls", "--provider", "foo"],
        vec!["box", "snapshots", "--provider", "foo"],
    ] {
        one_line_error(&h.run(&args, b""), 2, "--provider: \"foo\" is not a provider");
    }
    one_line_error(
        &h.run(&["box", "create", "--provider", "local", "--network", "sideways"], b""),
        2,
        "--network: \"sideways\"",
    );
    one_line_error(
        &h.run(&["box", "create", "--provider", "local", "--mount", "nocolon"], b""),
        2,
        "--mount: \"nocolon\"",
    );
    // A box that is not there is no usage error.
    one_line_error(
        &h.run(&["box", "exec", "local:feedfeed", "true"], b""),
        1,
        "local:feedfeed",
    );
}

#[test]
fn exec_whose_timeout_kills_the_program_exits_124() {
    let h = Home::new();
    let b = Boxed::new(&h, &["--provider", "local"]);
    let out = h.run(&["box", "exec", &b.id, "--timeout", "1s", "--", "sleep", "60"], b"");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "stderr: {err}");
    assert!(err.starts_with("agentbox: box exec: "), "{err}");
    // A program that exits on its own within its timeout exits with its own code.
    let out = h.run(
        &["box", "exec", &b.id, "--timeout", "1m", "--", "sh", "-c", "exit 3"],
        b"",
    );
    assert_eq!(out.status.code(), Some(3), "stderr: {}", text(&out.stderr));
}

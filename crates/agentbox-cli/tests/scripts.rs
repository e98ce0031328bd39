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

/// A container labelled as a Docker box with a runner whose runner cannot start (another
/// agentbox home or version made it), removed when the test ends.
struct Foreign(String);

impl Foreign {
    fn run(label: &str) -> Self {
        let name = format!("agentbox-foreign{}", std::process::id());
        let ends = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
            + 600_000;
        let out = std::process::Command::new("docker")
            .args(["run", "-d", "--rm", "--name", &name])
            .args(["--label", "agentbox.provider=docker", "--label", "agentbox.runner=1"])
            .args(["--label", &format!("agentbox.ends_at_ms={ends}")])
            .args(["--label", &format!("agentbox.labels={{\"foreign\":\"{label}\"}}")])
            .args([agentbox_providers::docker::DEFAULT_IMAGE, "sleep", "600"])
            .output()
            .unwrap();
        assert!(out.status.success(), "docker run: {}", text(&out.stderr));
        Foreign(name)
    }

    /// The execs the engine ran in it: none, where nothing was started in it.
    fn execs(&self) -> String {
        let out = std::process::Command::new("docker")
            .args(["inspect", "-f", "{{json .ExecIDs}}", &self.0])
            .output()
            .unwrap();
        text(&out.stdout).trim().to_string()
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "-f", &self.0])
            .output();
    }
}

#[test]
fn ls_lists_a_docker_box_it_cannot_read_as_such_and_starts_nothing_in_it() {
    if !agentbox_testing::services::docker_available(
        "ls_lists_a_docker_box_it_cannot_read_as_such_and_starts_nothing_in_it",
    ) {
        return;
    }
    let h = Home::new();
    let label = format!("f{}", std::process::id());
    let foreign = Foreign::run(&label);
    let id = format!("docker:{}", foreign.0);
    let by = format!("foreign={label}");
    for args in [
        vec!["box", "ls", "--provider", "docker", "--label", &by, "--json"],
        vec!["box", "ls", "--label", &by, "--json"],
    ] {
        let out = h.run(&args, b"");
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        let ls: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let rows = ls.as_array().unwrap();
        assert_eq!(rows.len(), 1, "{ls}");
        assert_eq!(rows[0]["id"], id.as_str());
        assert_eq!(rows[0]["state"], "unknown", "{ls}");
        let why = rows[0]["why"].as_str().unwrap_or_default();
        assert!(why.contains("unreadable") && why.contains("runner"), "{why}");
    }
    // In a table: its state, with the reason on stderr.
    let out = h.run(&["box", "ls", "--provider", "docker", "--label", &by], b"");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains(" unknown "), "{row}");
    assert!(
        text(&out.stderr).contains(&format!("box {id}: unreadable")),
        "{}",
        text(&out.stderr)
    );
    // Listing ran nothing in the box.
    assert!(matches!(foreign.execs().as_str(), "null" | "[]"), "{}", foreign.execs());
}

#[test]
fn kill_signals_a_detached_process_and_ps_prints_one_line_each() {
    let h = Home::new();
    let b = Boxed::new(&h, &["--provider", "local"]);
    // exec --detach --json: the box and the handle.
    let out = h.ok(&[
        "box",
        "exec",
        "--detach",
        "--json",
        &b.id,
        "--",
        "sh",
        "-c",
        "trap 'exit 7' USR1\nwhile :; do sleep 0.1; done",
    ]);
    let started: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(started["id"], b.id.as_str(), "{started}");
    let handle = started["handle"].as_u64().unwrap_or_else(|| panic!("{started}"));
    // One line a process, its newline written as an escape.
    let table = h.ok(&["box", "ps", &b.id]);
    assert_eq!(table.lines().count(), 2, "a header and one line: {table}");
    assert!(table.contains(r"$'trap \'exit 7\' USR1\nwhile"), "{table}");
    h.ok(&["box", "kill", &b.id, &handle.to_string(), "--signal", "usr1"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let ps: serde_json::Value = serde_json::from_str(&h.ok(&["box", "ps", &b.id, "--json"])).unwrap();
        let row = ps.as_array().unwrap().iter().find(|p| p["handle"] == handle).cloned();
        let row = row.unwrap_or_else(|| panic!("{ps}"));
        if row["state"] == "exited" {
            assert_eq!(row["status"]["code"], 7, "{row}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never ended: {row}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // An ended process, one the box never had, and a signal there is not.
    one_line_error(
        &h.run(&["box", "kill", &b.id, &handle.to_string()], b""),
        1,
        "already ended",
    );
    one_line_error(&h.run(&["box", "kill", &b.id, "999"], b""), 1, "no process 999");
    one_line_error(&h.run(&["box", "kill", &b.id, "1", "--signal", "NOPE"], b""), 2, "NOPE");
}

#[test]
fn commands_a_script_reads_print_json() {
    let h = Home::new();
    let b = Boxed::new(&h, &["--provider", "local"]);
    let out = h.ok(&["box", "extend", &b.id, "--in", "7m", "--json"]);
    let ext: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(ext["id"], b.id.as_str(), "{ext}");
    assert!(
        ext["ends_at_ms"].as_u64().is_some() && ext["ends_at"].as_str().is_some(),
        "{ext}"
    );
    let out = h.ok(&["box", "fork", &b.id, "-n", "2", "--lifetime", "2m", "--json"]);
    let forks: serde_json::Value = serde_json::from_str(&out).unwrap();
    let forks = forks.as_array().unwrap().clone();
    assert_eq!(forks.len(), 2, "{forks:?}");
    for f in &forks {
        let id = f["id"].as_str().unwrap();
        assert!(id.starts_with("local:") && f["facts"]["provider"] == "local", "{f}");
        h.ok(&["box", "rm", id]);
    }
    let out = h.ok(&["box", "endpoint", &b.id, "8080", "--json"]);
    let e: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (e["host"].as_str(), e["port"].as_u64()),
        (Some("127.0.0.1"), Some(8080)),
        "{e}"
    );
    // box ls: a header, the state and the time left as a duration.
    let table = h.ok(&["box", "ls", "--provider", "local"]);
    let mut lines = table.lines();
    let header = lines.next().unwrap_or_default();
    assert!(
        header.starts_with("ID") && header.contains("STATE") && header.contains("LEFT"),
        "{table}"
    );
    let row = lines
        .find(|l| l.starts_with(&b.id))
        .unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1], "running", "{row}");
    assert!(
        cells[2].starts_with('6') && cells[2].contains('m') && cells[2].ends_with('s'),
        "{row}"
    );
    let ls: serde_json::Value = serde_json::from_str(&h.ok(&["box", "ls", "--provider", "local", "--json"])).unwrap();
    let mine = ls
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == b.id.as_str())
        .cloned();
    assert_eq!(mine.unwrap_or_default()["state"], "running", "{ls}");
}

#[test]
fn open_refuses_a_box_of_another_spec_unless_replace() {
    let h = Home::new();
    let name = format!("spec{}", std::process::id());
    let open = |extra: &[&str]| {
        let mut args = vec!["box", "open", &name, "--provider", "local"];
        args.extend(extra);
        h.run(&args, b"")
    };
    let first = open(&["--lifetime", "5m"]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let id = text(&first.stdout).trim().to_string();
    let _b = Boxed {
        home: &h,
        id: id.clone(),
    };
    // The same spec again: the same box.
    let again = open(&["--lifetime", "5m"]);
    assert_eq!(text(&again.stdout).trim(), id, "{}", text(&again.stderr));
    // Another lifetime and env: refused, naming both.
    let other = open(&["--lifetime", "10m", "--env", "K=V"]);
    one_line_error(&other, 1, "another spec");
    let err = text(&other.stderr);
    assert!(
        err.contains("env") && err.contains("lifetime") && err.contains("--replace"),
        "{err}"
    );
    // --replace ends it and makes one of the spec asked.
    let replaced = open(&["--lifetime", "10m", "--env", "K=V", "--replace"]);
    assert!(replaced.status.success(), "{}", text(&replaced.stderr));
    let new_id = text(&replaced.stdout).trim().to_string();
    assert_eq!(h.ok(&["box", "exec", &new_id, "--", "printenv", "K"]), "V\n");
    let again = open(&["--lifetime", "10m", "--env", "K=V"]);
    assert_eq!(text(&again.stdout).trim(), new_id, "{}", text(&again.stderr));
    // Discarded, the name takes any spec.
    h.ok(&["box", "discard", &name, "--provider", "local"]);
    let fresh = open(&["--lifetime", "3m"]);
    assert!(fresh.status.success(), "{}", text(&fresh.stderr));
    let fresh_id = text(&fresh.stdout).trim().to_string();
    let _f = Boxed { home: &h, id: fresh_id };
}

#[test]
fn ps_leaves_out_agentboxs_own_helpers_unless_all() {
    let h = Home::new();
    let b = Boxed::new(&h, &["--provider", "local"]);
    let dir = tempfile::tempdir().unwrap();
    let helper = dir.path().join("agentbox-runner");
    std::os::unix::fs::symlink("/bin/sleep", &helper).unwrap();
    h.ok(&["box", "exec", "--detach", &b.id, "--", helper.to_str().unwrap(), "30"]);
    h.ok(&["box", "exec", "--detach", &b.id, "--", "sleep", "30"]);
    let shown = h.ok(&["box", "ps", &b.id]);
    assert_eq!(shown.lines().count(), 2, "a header and the one of the user's: {shown}");
    assert!(!shown.contains("agentbox-runner"), "{shown}");
    let all = h.ok(&["box", "ps", &b.id, "--all"]);
    assert_eq!(all.lines().count(), 3, "{all}");
    assert!(all.contains("agentbox-runner"), "{all}");
}

#[test]
fn a_program_still_running_at_its_boxs_lifetime_is_told_so() {
    let h = Home::new();
    let id = h
        .ok(&["box", "create", "--provider", "namespace", "--lifetime", "3s"])
        .trim()
        .to_string();
    let _b = Boxed {
        home: &h,
        id: id.clone(),
    };
    let out = h.run(&["box", "exec", &id, "--", "sleep", "60"], b"");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("the box reached its lifetime at 20"), "{err}");
    assert!(!err.contains("Connection refused"), "{err}");
}

#[test]
fn human_output_gives_times_as_dates_not_epoch_milliseconds() {
    let h = Home::new();
    let b = Boxed::new(&h, &["--provider", "local"]);
    let args = r#"{"path":"a.txt","content":"x"}"#;
    h.ok(&["tool", &b.id, "write", "--run", "r1", "--args", args]);
    let line = h.ok(&["ledger", "--run", "r1"]);
    let at = line.split_whitespace().next().unwrap_or_default();
    assert!(at.starts_with("20") && at.contains('T'), "a date first: {line}");
}

#[test]
fn a_parked_runs_deadline_reads_as_a_date() {
    let h = Home::new();
    h.ok(&["runs", "new", "later"]);
    let out = h.ok(&["runs", "park", "later", "--for", "1h"]);
    let deadline = out
        .split_whitespace()
        .find_map(|w| w.strip_prefix("deadline="))
        .unwrap_or_else(|| panic!("a deadline: {out}"));
    assert!(deadline.starts_with("20") && deadline.contains('T'), "{out}");
    assert!(!out.contains("deadline_ms"), "{out}");
}

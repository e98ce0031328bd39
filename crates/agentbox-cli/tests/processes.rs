//! The processes a box keeps, through the `agentbox` binary as a script uses it: `box exec
//! --detach`, `box ps`, `box logs` and `box attach` on local boxes with a runner (the binary
//! under test is their runner).

use std::time::{Duration, Instant};

mod common;
use common::Home;

/// What these tests ask of a home beyond running the binary.
impl Home {
    /// A local box with a runner, ended when the test ends.
    fn local_box(&self, extra: &[&str]) -> Boxed<'_> {
        let mut args = vec!["box", "create", "--provider", "local", "--lifetime", "5m"];
        args.extend(extra);
        Boxed {
            home: self,
            id: self.ok(&args).trim().to_string(),
        }
    }

    /// `box ps ID --json`, the process `handle`'s row.
    fn row(&self, id: &str, handle: u64) -> serde_json::Value {
        let ps: serde_json::Value = serde_json::from_str(&self.ok(&["box", "ps", id, "--json"])).unwrap();
        ps.as_array()
            .unwrap()
            .iter()
            .find(|p| p["handle"] == handle)
            .cloned()
            .unwrap_or_else(|| panic!("no process {handle} in {ps}"))
    }

    /// Ask `box ps` until the process `handle` has written `end` bytes (deadline 20 s).
    fn wait_for_end(&self, id: &str, handle: u64, end: u64) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let row = self.row(id, handle);
            if row["end"].as_u64() >= Some(end) {
                return row;
            }
            assert!(
                Instant::now() < deadline,
                "process {handle} never wrote {end} bytes: {row}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

struct Boxed<'a> {
    home: &'a Home,
    id: String,
}

impl Drop for Boxed<'_> {
    fn drop(&mut self) {
        let _ = self.home.run(&["box", "rm", &self.id], b"");
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn detach(h: &Home, id: &str, script: &str) -> u64 {
    let out = h.ok(&["box", "exec", "--detach", id, "--", "sh", "-c", script]);
    assert_eq!(out.lines().count(), 1, "one line, the handle: {out:?}");
    out.trim().parse().unwrap_or_else(|_| panic!("a handle: {out:?}"))
}

#[test]
fn a_detached_process_is_listed_read_from_a_byte_and_attached_to() {
    let h = Home::new();
    let b = h.local_box(&[]);
    let id = b.id.as_str();
    // stdout first, then stderr: bytes 0..4 are "one\n", 4..8 "two\n".
    let handle = detach(
        &h,
        id,
        "echo one; sleep 0.2; echo two >&2; read line; echo \"got $line\"; exit 4",
    );

    let row = h.wait_for_end(id, handle, 8);
    assert_eq!(row["state"], "running", "{row}");
    assert_eq!(row["tty"], false, "{row}");
    assert_eq!(row["detach"], true, "{row}");
    assert_eq!(row["argv"][0], "sh", "{row}");
    let table = h.ok(&["box", "ps", id]);
    let mut lines = table.lines();
    let header = lines.next().unwrap();
    for col in ["HANDLE", "STATE/EXIT", "STARTED", "TTY", "ARGV"] {
        assert!(header.contains(col), "{header}");
    }
    let line = lines
        .find(|l| l.split_whitespace().next() == Some(&handle.to_string()))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        line.contains("running") && line.contains("s ago") && line.contains("sh -c 'echo one;"),
        "{line}"
    );

    // logs: stdout's bytes on stdout, stderr's on stderr; --after skips by byte number.
    let out = h.run(&["box", "logs", id, &handle.to_string()], b"");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!((text(&out.stdout), text(&out.stderr)), ("one\n".into(), "two\n".into()));
    let out = h.run(&["box", "logs", id, &handle.to_string(), "--after", "2"], b"");
    assert_eq!((text(&out.stdout), text(&out.stderr)), ("e\n".into(), "two\n".into()));
    let out = h.run(&["box", "logs", id, &handle.to_string(), "--after", "4"], b"");
    assert_eq!((text(&out.stdout), text(&out.stderr)), ("".into(), "two\n".into()));

    // attach: the output replayed from --after, stdin in, the exit code out.
    let out = h.run(&["box", "attach", id, &handle.to_string(), "--after", "4"], b"hello\n");
    assert_eq!(out.status.code(), Some(4), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "got hello\n");
    assert_eq!(text(&out.stderr), "two\n");

    let row = h.row(id, handle);
    assert_eq!(
        (row["state"].as_str(), row["status"]["code"].as_i64()),
        (Some("exited"), Some(4)),
        "{row}"
    );
    assert!(h.ok(&["box", "ps", id]).contains("exit 4"));
    // An ended process is read again in full, and attached to again: its exit code.
    let out = h.run(&["box", "logs", id, &handle.to_string(), "--follow"], b"");
    assert_eq!(text(&out.stdout), "one\ngot hello\n");
    let out = h.run(&["box", "attach", id, &handle.to_string(), "--no-stdin"], b"");
    assert_eq!(out.status.code(), Some(4), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "one\ngot hello\n");
}

#[test]
fn logs_follow_waits_for_output_until_the_process_ends() {
    let h = Home::new();
    let b = h.local_box(&[]);
    let handle = detach(&h, &b.id, "echo early; sleep 1.5; echo late; exit 3");
    let t = Instant::now();
    let out = h.run(&["box", "logs", &b.id, &handle.to_string(), "-f"], b"");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "early\nlate\n");
    assert!(
        t.elapsed() >= Duration::from_millis(800),
        "it waited for the end: {:?}",
        t.elapsed()
    );
    // Without --follow, what there is now, at once.
    let handle = detach(&h, &b.id, "echo now; sleep 30");
    h.wait_for_end(&b.id, handle, 4);
    let t = Instant::now();
    let out = h.run(&["box", "logs", &b.id, &handle.to_string()], b"");
    assert_eq!(text(&out.stdout), "now\n");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    h.ok(&["box", "exec", &b.id, "--", "true"]);
}

#[test]
fn output_the_box_let_go_is_said_with_its_numbers() {
    let h = Home::new();
    let b = h.local_box(&[]);
    // More than the runner keeps of a process nobody holds (4 MiB).
    let total: u64 = 6 << 20;
    let handle = detach(&h, &b.id, &format!("head -c {total} /dev/zero"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while h.row(&b.id, handle)["state"] == "running" {
        assert!(Instant::now() < deadline, "the writer never ended");
        std::thread::sleep(Duration::from_millis(50));
    }
    let row = h.row(&b.id, handle);
    assert_eq!(row["end"].as_u64(), Some(total), "{row}");
    let first = row["first"].as_u64().unwrap();
    assert!(first > 0, "the box let bytes go: {row}");
    let out = h.run(&["box", "logs", &b.id, &handle.to_string()], b"");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("output bytes 0..{first} were let go")) && err.contains(&format!("{first} bytes lost")),
        "{err}"
    );
    assert_eq!(out.stdout.len() as u64, total - first);
    // attach meets the same gap, says it, and goes on.
    let out = h.run(&["box", "attach", &b.id, &handle.to_string(), "--no-stdin"], b"");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!("output bytes 0..{first}")),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(out.stdout.len() as u64, total - first);
}

#[test]
fn a_box_without_a_runner_says_it_keeps_no_processes() {
    let h = Home::new();
    let b = h.local_box(&["--no-runner"]);
    for args in [
        vec!["box", "ps", &b.id],
        vec!["box", "logs", &b.id, "1"],
        vec!["box", "attach", &b.id, "1"],
        vec!["box", "exec", "--detach", &b.id, "--", "true"],
    ] {
        let out = h.run(&args, b"");
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("this box keeps no processes: it has no runner"),
            "{args:?}: {err}"
        );
    }
    // Nor can it give a program a terminal: refused, never dropped silently.
    let out = h.run(&["box", "exec", "-t", &b.id, "--", "true"], b"");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("exec tty"), "{}", text(&out.stderr));
}

#[test]
fn an_unknown_handle_is_named() {
    let h = Home::new();
    let b = h.local_box(&[]);
    for args in [
        vec!["box", "logs", &b.id, "99999"],
        vec!["box", "attach", &b.id, "99999"],
    ] {
        let out = h.run(&args, b"");
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(text(&out.stderr).contains("no process 99999"), "{}", text(&out.stderr));
    }
    // A terminal asked for from a pipe is refused before anything runs.
    let out = h.run(&["box", "exec", "-it", &b.id, "--", "true"], b"");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("stdin is not a terminal"),
        "{}",
        text(&out.stderr)
    );
    let out = h.run(&["box", "shell", &b.id], b"");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("stdin is not a terminal"),
        "{}",
        text(&out.stderr)
    );
    // -t alone from a pipe: a terminal in the box, output through it (the pty's CR LF).
    let out = h.run(&["box", "exec", "-t", &b.id, "--", "sh", "-c", "tty; exit 5"], b"");
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("/dev/pts/"), "{}", text(&out.stdout));
}

/// A shell without job control starts a background command with SIGINT and SIGQUIT ignored
/// (`trap '' INT QUIT` does the same), and an ignored signal stays ignored across exec: a box
/// made from such a command still starts its programs with every signal's default action, so
/// Ctrl-C reaches them (before, an interactive bash in the box kept them ignored for its
/// children, and `exec -it`'s Ctrl-C never ended a `sleep`).
#[test]
fn a_box_made_with_signals_ignored_starts_its_programs_with_the_default_actions() {
    for provider in ["local", "namespace"] {
        let h = Home::new();
        let out = std::process::Command::new("sh")
            .args([
                "-c",
                "trap '' INT QUIT; exec \"$0\" box create --provider \"$1\" --lifetime 2m",
                env!("CARGO_BIN_EXE_agentbox"),
                provider,
            ])
            .env("AGENTBOX_HOME", h.0.path())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{provider}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let status = h.ok(&["box", "exec", &id, "--", "cat", "/proc/self/status"]);
        let ignored = status
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or_else(|| panic!("{provider}: no SigIgn in {status}"));
        // Bit N-1 is signal N: SIGINT is 2, SIGQUIT 3.
        assert_eq!(
            ignored & 0b110,
            0,
            "{provider}: a program of the box starts with SIGINT or SIGQUIT ignored (SigIgn {ignored:016x})"
        );
        h.ok(&["box", "rm", &id]);
    }
}

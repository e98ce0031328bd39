//! The `agentbox` binary as a person or a script uses it.

use std::process::{Command, Output};

mod common;
use common::Home;

fn one_line_error(out: &Output, code: i32, needle: &str) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
    assert!(
        err.starts_with("agentbox: ") && err.contains(needle),
        "{err:?} should name {needle:?}"
    );
}

#[test]
fn usage_errors_exit_2_with_one_line() {
    let h = Home::new();
    one_line_error(&h.run(&["box", "create", "--bogus"], b""), 2, "--bogus");
    one_line_error(&h.run(&["box", "create", "--lifetime", "ten"], b""), 2, "lifetime");
    one_line_error(&h.run(&["box", "exec", "not-an-id", "true"], b""), 2, "not-an-id");
    one_line_error(&h.run(&["box", "create", "--label", "novalue"], b""), 2, "K=V");
}

#[test]
fn other_errors_exit_1_with_one_line_naming_the_problem() {
    let h = Home::new();
    one_line_error(&h.run(&["box", "create", "--image", "debian"], b""), 1, "spec.image");
    one_line_error(
        &h.run(&["box", "create", "--provider", "local", "--pids-limit", "5"], b""),
        1,
        "--pids-limit: local boxes do not take it",
    );
    one_line_error(
        &h.run(&["box", "create", "--provider", "namespace", "--user", "1:1"], b""),
        1,
        "--user: namespace boxes do not take it",
    );
    one_line_error(
        &h.run(&["box", "exec", "local:feedfeed", "true"], b""),
        1,
        "local:feedfeed",
    );
    one_line_error(
        &h.run(&["box", "create", "--label", "agentbox.x=1"], b""),
        1,
        "providers' namespace",
    );
}

#[test]
fn a_box_from_create_to_rm() {
    let h = Home::new();
    // Unique: `box ls` without --provider asks the Docker engine too, which other tests share.
    let team = format!("team=infra-{}", std::process::id());
    let id = h
        .ok(&[
            "box",
            "create",
            "--provider",
            "local",
            "--lifetime",
            "2m",
            "--label",
            &team,
            "--env",
            "MODE=test",
        ])
        .trim()
        .to_string();
    assert!(id.starts_with("local:"), "{id}");

    // stdin in, stdout and stderr apart, the program's exit code out.
    let out = h.run(
        &[
            "box",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "cat; echo \"$MODE\"; echo oops >&2; exit 7",
        ],
        b"piped\n",
    );
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "piped\ntest\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "oops\n");
    let out = h.run(&["box", "exec", &id, "--env", "ONE=1", "--", "printenv", "ONE"], b"");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1\n");

    // Without --provider, every provider of the build is asked.
    let ls: serde_json::Value = serde_json::from_str(&h.ok(&["box", "ls", "--label", &team, "--json"])).unwrap();
    assert_eq!(ls.as_array().unwrap().len(), 1, "{ls}");
    assert_eq!(ls[0]["id"], id.as_str());
    assert_eq!(ls[0]["labels"]["team"], team.trim_start_matches("team="));
    let text = h.ok(&["box", "ls", "--provider", "local"]);
    assert!(text.lines().any(|l| l.starts_with(&format!("{id} "))), "{text}");
    assert_eq!(
        h.ok(&["box", "ls", "--provider", "local", "--label", "team=other", "--json"])
            .trim(),
        "[]"
    );

    let facts: serde_json::Value = serde_json::from_str(&h.ok(&["box", "facts", &id])).unwrap();
    assert_eq!(facts["provider"], "local");
    assert_eq!(facts["network"], "host");
    // Its disk keeps what it acknowledged; a directory it cannot write in is an error.
    let probe = h.ok(&["box", "probe", &id]);
    assert!(
        probe.contains("10 of 10 acknowledged records kept") && probe.ends_with("passed\n"),
        "{probe}"
    );
    one_line_error(&h.run(&["box", "probe", &id, "--dir", "/proc"], b""), 1, "/proc");

    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.bin");
    let bytes: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    std::fs::write(&src, &bytes).unwrap();
    h.ok(&["box", "cp", src.to_str().unwrap(), &format!("{id}:sub/in.bin")]);
    assert_eq!(
        h.ok(&["box", "exec", &id, "--", "sh", "-c", "wc -c < sub/in.bin"])
            .trim(),
        "100000"
    );
    let back = dir.path().join("back.bin");
    h.ok(&["box", "cp", &format!("{id}:sub/in.bin"), back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&back).unwrap(), bytes);
    one_line_error(&h.run(&["box", "cp", "a", "b"], b""), 2, "ID:PATH");

    assert_eq!(h.ok(&["box", "rm", &id]).trim(), id);
    one_line_error(&h.run(&["box", "exec", &id, "true"], b""), 1, "no such box");
    assert_eq!(h.ok(&["box", "ls", "--provider", "local", "--json"]).trim(), "[]");
}

#[test]
fn the_demo_picks_up_one_run_three_times() {
    let h = Home::new();
    let out = h.ok(&["demo"]);
    for g in 1..=3 {
        assert!(out.contains(&format!("generation {g} (pid ")), "{out}");
    }
    // Three processes, one after another: three pids.
    let pids: std::collections::BTreeSet<&str> = out
        .lines()
        .filter_map(|l| l.split("(pid ").nth(1)?.split(')').next())
        .collect();
    assert_eq!(pids.len(), 3, "{out}");
    // One box, found again by each generation.
    let boxes: std::collections::BTreeSet<&str> = out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("tool call ran in box "))
        .collect();
    assert_eq!(boxes.len(), 1, "{out}");
    assert!(
        out.contains("Your first question was \"What is the box's machine called?\""),
        "{out}"
    );
    assert!(out.contains("the run is Sealed at generation 3"), "{out}");
    assert_eq!(
        h.ok(&["box", "ls", "--provider", "local", "--json"]).trim(),
        "[]",
        "the last generation ended the box"
    );
    // The run read from outside as the demo prints it (`run ID lives in DIR`), and by its id.
    let first = out.lines().next().unwrap();
    let (id, dir) = first
        .strip_prefix("run ")
        .and_then(|l| l.split_once(" lives in "))
        .unwrap_or_else(|| panic!("{first:?}"));
    let root = h.0.path().join("demo");
    for args in [
        vec!["runs", "status", dir],
        vec!["runs", "status", id, "--root", root.to_str().unwrap()],
    ] {
        let status: serde_json::Value = serde_json::from_str(&h.ok(&args)).unwrap();
        assert_eq!(
            (
                status["id"].as_str(),
                status["status"].as_str(),
                status["generation"].as_u64()
            ),
            (Some(id), Some("sealed"), Some(3)),
            "{args:?}"
        );
    }
    // A directory needs no root, and a directory that is no run's says so.
    one_line_error(
        &h.run(&["runs", "status", dir, "--root", root.to_str().unwrap()], b""),
        1,
        "needs no root",
    );
    one_line_error(
        &h.run(&["runs", "status", root.to_str().unwrap()], b""),
        1,
        "no such run",
    );
}

#[test]
fn runs_status_help_names_both_forms_and_the_root() {
    let h = Home::new();
    let help = h.ok(&["runs", "status", "--help"]);
    assert!(help.contains("<ID|DIR>") && help.contains("its directory"), "{help}");
    assert!(help.contains("--root <ROOT>  Where runs live"), "{help}");
}

#[test]
fn runs_from_the_command_line() {
    let h = Home::new();
    let id = h.ok(&["runs", "new", "r1"]).trim().to_string();
    assert_eq!(id, "r1");
    // Held by a command: status reads it from outside meanwhile, and a second open is refused.
    let script = "echo gen=$AGENTBOX_RUN_GENERATION; agentbox_status=$(\"$AGENTBOX_BIN\" runs status r1); echo \"$agentbox_status\" | grep -c '\"open\"'; \"$AGENTBOX_BIN\" runs open r1 true 2>&1 | head -1";
    let out = Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args(["runs", "open", "r1", "--", "sh", "-c", script])
        .env("AGENTBOX_HOME", h.0.path())
        .env("AGENTBOX_BIN", env!("CARGO_BIN_EXE_agentbox"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "gen=1");
    assert_eq!(lines[1], "1", "status read the open run from outside: {text}");
    assert!(lines[2].contains("held by pid"), "{text}");
    let ls = h.ok(&["runs", "ls"]);
    assert!(ls.contains("r1 Sealed generation=1"), "{ls}");
    assert_eq!(
        h.ok(&["runs", "fork", "r1", "-n", "2"]).lines().collect::<Vec<_>>(),
        ["r1.fork-1", "r1.fork-2"]
    );
    let forked: serde_json::Value = serde_json::from_str(&h.ok(&["runs", "status", "r1.fork-2"])).unwrap();
    assert_eq!(forked["parent"], "r1");
    assert!(h.ok(&["runs", "release", "r1"]).contains("generation=2"));
    one_line_error(&h.run(&["runs", "status", "r 1"], b""), 1, "run id");
    one_line_error(&h.run(&["runs", "status", "../etc"], b""), 1, "no such run");
    one_line_error(&h.run(&["runs", "open", "nope", "true"], b""), 1, "nope");
    // Nothing parked: supervise starts nothing.
    let home = h.0.path().to_str().unwrap().to_string();
    assert_eq!(h.ok(&["runs", "supervise", &home, "--command", "false"]), "");
    // A run parked until later is not due; one whose deadline came is started again.
    h.ok(&["runs", "new", "later"]);
    h.ok(&["runs", "new", "due"]);
    assert!(h.ok(&["runs", "park", "later", "--for", "1h"]).contains("Parked"));
    assert!(h.ok(&["runs", "park", "due", "--for", "0s"]).contains("Parked"));
    let pick = r#"echo "picked $AGENTBOX_RUN" >> "$AGENTBOX_RUNS/picked""#;
    let out = h.ok(&["runs", "supervise", &home, "--command", "sh", "-c", pick]);
    assert!(out.contains("starting due"), "{out}");
    assert!(!out.contains("later"), "{out}");
    assert_eq!(
        std::fs::read_to_string(h.0.path().join("picked")).unwrap(),
        "picked due\n"
    );
    // A sealed run a move was asked of is started by the supervisor of that driver alone, and
    // its start and exit recorded.
    h.ok(&["runs", "new", "mv"]);
    let ask = r#"printf '{"to":"local","by":"t","asked_ms":1}' > "$AGENTBOX_RUN_DIR/move.json""#;
    h.ok(&["runs", "open", "mv", "--", "sh", "-c", ask]);
    let out = h.ok(&["runs", "supervise", &home, "--driver", "docker", "--command", "false"]);
    assert!(!out.contains("mv"), "{out}");
    let out = h.ok(&[
        "runs",
        "supervise",
        &home,
        "--driver",
        "local",
        "--command",
        "sh",
        "-c",
        pick,
    ]);
    assert!(
        out.contains("starting mv (a move to local asked by t)") && out.contains("exited 0"),
        "{out}"
    );
    let starts = std::fs::read_to_string(h.0.path().join("runs/mv/starts.jsonl")).unwrap();
    let start: serde_json::Value = serde_json::from_str(starts.trim()).unwrap();
    assert_eq!(
        (start["driver"].as_str(), start["exit"].as_i64()),
        (Some("local"), Some(0))
    );
    // The systemd driver: where systemd is this machine's init, the generation is a transient
    // unit and exits as the command did; elsewhere it is refused, saying why, and nothing is
    // recorded as started.
    h.ok(&["runs", "new", "unit"]);
    let out = h.run(
        &[
            "runs",
            "start",
            "unit",
            "--driver",
            "systemd",
            "--command",
            "sh",
            "-c",
            pick,
        ],
        b"",
    );
    if std::path::Path::new("/run/systemd/system").is_dir() {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(
            std::fs::read_to_string(h.0.path().join("picked")).unwrap(),
            "picked due\npicked mv\npicked unit\n"
        );
    } else {
        one_line_error(
            &out,
            1,
            "systemd is not this machine's init (/run/systemd/system does not exist)",
        );
        assert!(!h.0.path().join("runs/unit/starts.jsonl").exists());
    }
    // The daytona driver needs the volume that holds the runs' root.
    one_line_error(
        &h.run(
            &["runs", "start", "unit", "--driver", "daytona", "--command", "true"],
            b"",
        ),
        1,
        "--volume",
    );
    one_line_error(
        &h.run(&["demo", "--move", "daytona"], b""),
        1,
        "--volume NAME and --root DIR",
    );
    // A move asked of a run that is not there, or to no driver, is refused naming it.
    one_line_error(
        &h.run(&["runs", "move", "nope", "--to", "local", "--command", "true"], b""),
        1,
        "no such run",
    );
    one_line_error(
        &h.run(&["runs", "move", "mv", "--to", "mars", "--command", "true"], b""),
        2,
        "mars",
    );
}

#[test]
fn a_docker_box_from_the_cli() {
    if !agentbox_testing::services::docker_available("a_docker_box_from_the_cli") {
        return;
    }
    let h = Home::new();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in.txt"), "bound\n").unwrap();
    let mount = format!("{}:/mnt/in:ro", dir.path().display());
    let id = h
        .ok(&[
            "box",
            "create",
            "--provider",
            "docker",
            "--lifetime",
            "2m",
            "--pids-limit",
            "50",
            "--memory",
            "256m",
            "--network",
            "none",
            "--mount",
            &mount,
            "--user",
            "1000:1000",
            "--label",
            "cli=docker",
        ])
        .trim()
        .to_string();
    assert!(id.starts_with("docker:"), "{id}");
    let out = h.run(
        &[
            "box",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "id -u; cat /mnt/in/in.txt; cat; exit 4",
        ],
        b"stdin\n",
    );
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1000\nbound\nstdin\n");
    let facts: serde_json::Value = serde_json::from_str(&h.ok(&["box", "facts", &id])).unwrap();
    assert_eq!(
        (facts["pids_limit"].as_u64(), facts["memory_mb"].as_u64()),
        (Some(50), Some(256))
    );
    assert_eq!(facts["network"], "none");
    let ls = h.ok(&["box", "ls", "--provider", "docker", "--label", "cli=docker"]);
    assert!(ls.contains(&id), "{ls}");
    h.ok(&["box", "rm", &id]);
    one_line_error(&h.run(&["box", "exec", &id, "true"], b""), 1, "no such box");
}

#[test]
fn a_tool_call_prints_what_the_model_reads() {
    let h = Home::new();
    let id = h.ok(&["box", "create"]).trim().to_string();
    assert_eq!(
        h.ok(&[
            "tool",
            &id,
            "write",
            "--args",
            r#"{"path":"notes/a.md","content":"one\ntwo\n"}"#
        ])
        .trim(),
        "Successfully wrote 8 bytes to notes/a.md"
    );
    assert_eq!(
        h.ok(&["tool", &id, "read", "--args", r#"{"path":"notes/a.md","limit":1}"#]),
        "one\n\n[2 more lines in file. Use offset=2 to continue.]\n"
    );
    let out = h.run(
        &["tool", &id, "bash", "--args", r#"{"command":"echo partial; exit 4"}"#],
        b"",
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "partial\n\n\nCommand exited with code 4\n"
    );
    let json: serde_json::Value = serde_json::from_str(&h.ok(&["tool", &id, "ls", "--json"])).unwrap();
    assert_eq!(json["content"][0]["text"], "notes/");
    assert_eq!(json["isError"], false);
    one_line_error(&h.run(&["tool", &id, "frobnicate"], b""), 1, "not a tool");
    one_line_error(&h.run(&["tool", &id, "read", "--args", "[1]"], b""), 2, "JSON object");
    h.ok(&["box", "rm", &id]);
}

#[test]
fn sync_extract_reads_stdin_and_prints_the_receipt() {
    let h = Home::new();
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir(src.path().join("d")).unwrap();
    std::fs::write(src.path().join("d/f.txt"), "content").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", src.path().join("link")).unwrap();
    let tar = Command::new("tar")
        .args(["-c", "-f", "-", "-C"])
        .arg(src.path())
        .arg(".")
        .output()
        .unwrap()
        .stdout;
    let dest = tempfile::tempdir().unwrap();
    let out = h.run(&["sync", "extract", dest.path().to_str().unwrap()], &tar);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["written"], 2);
    assert_eq!(r["skipped"]["symlink"], 1);
    assert_eq!(r["skips"][0]["target"], "/etc/passwd");
    assert_eq!(std::fs::read_to_string(dest.path().join("d/f.txt")).unwrap(), "content");
    // Cut short: exit 1, the stop in the receipt.
    let out = h.run(
        &["sync", "extract", dest.path().to_str().unwrap(), "--max-bytes", "1024"],
        &tar,
    );
    assert_eq!(out.status.code(), Some(1));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["stopped"]["reason"], "too_large");
}

#[test]
fn sync_seed_then_pull_keeps_its_mark_between_calls() {
    let h = Home::new();
    let id = h.ok(&["box", "create"]).trim().to_string();
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("a.txt"), "one").unwrap();
    let seeded: serde_json::Value = serde_json::from_str(&h.ok(&[
        "sync",
        "seed",
        &id,
        "--from",
        src.path().to_str().unwrap(),
        "--to",
        "proj",
    ]))
    .unwrap();
    assert_eq!(seeded["sent"], 1);
    h.ok(&["box", "exec", &id, "--", "sh", "-c", "echo two > proj/b.txt"]);
    // The pull goes back into the seeded directory: only the new file moves.
    let pulled: serde_json::Value = serde_json::from_str(&h.ok(&[
        "sync",
        "pull",
        &id,
        "--from",
        "proj",
        "--to",
        src.path().to_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(pulled["fetched"], 1, "{pulled}");
    assert_eq!(std::fs::read_to_string(src.path().join("b.txt")).unwrap(), "two\n");
    let again: serde_json::Value = serde_json::from_str(&h.ok(&[
        "sync",
        "pull",
        &id,
        "--from",
        "proj",
        "--to",
        src.path().to_str().unwrap(),
    ]))
    .unwrap();
    assert_eq!(again["fetched"], 0);
    h.ok(&["box", "rm", &id]);
}

#[test]
fn an_unknown_provider_names_every_provider_there_is() {
    let h = Home::new();
    let names = agentbox_providers::registry::names();
    assert!(names.contains(&"docker"), "docker is a default feature: {names:?}");
    for args in [
        vec!["box", "create", "--provider", "nowhere"],
        vec!["box", "ls", "--provider", "nowhere"],
        vec!["bench", "--provider", "nowhere", "--iterations", "3"],
    ] {
        let out = h.run(&args, b"");
        // A usage error: the flag names no provider.
        one_line_error(&out, 2, "\"nowhere\" is not a provider");
        let err = String::from_utf8_lossy(&out.stderr);
        for name in &names {
            assert!(err.contains(name), "{args:?}: {err} should name {name}");
        }
    }
    // A box id naming a provider there is not.
    let out = h.run(&["box", "exec", "nowhere:ab12", "true"], b"");
    one_line_error(&out, 1, "box nowhere:ab12: \"nowhere\" is not a provider");
    assert!(String::from_utf8_lossy(&out.stderr).contains("docker"));
    // And --help lists them.
    let help = h.ok(&["box", "create", "--help"]);
    assert!(help.contains(&format!("The provider: {}", names.join(", "))), "{help}");
}

#[test]
fn a_box_gets_a_runner_unless_told_not_to() {
    let h = Home::new();
    let id = h
        .ok(&["box", "create", "--provider", "local", "--lifetime", "2m"])
        .trim()
        .to_string();
    let facts: serde_json::Value = serde_json::from_str(&h.ok(&["box", "facts", &id])).unwrap();
    assert!(
        facts["runner"].as_str().is_some_and(|r| r.contains("runner.sock")),
        "{facts}"
    );
    let out = h.run(
        &["box", "exec", &id, "--", "sh", "-c", "cat; echo done; exit 4"],
        b"piped in\n",
    );
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "piped in\ndone\n");
    h.ok(&["tool", &id, "write", "--args", r#"{"path":"a.txt","content":"one\n"}"#]);
    let read = h.ok(&["tool", &id, "read", "--args", r#"{"path":"a.txt"}"#]);
    assert!(read.contains("one"), "{read}");
    h.ok(&["box", "rm", &id]);
    let id = h
        .ok(&[
            "box",
            "create",
            "--provider",
            "local",
            "--no-runner",
            "--lifetime",
            "2m",
        ])
        .trim()
        .to_string();
    let facts: serde_json::Value = serde_json::from_str(&h.ok(&["box", "facts", &id])).unwrap();
    assert!(facts.get("runner").is_none_or(|r| r.is_null()), "{facts}");
    assert_eq!(h.ok(&["box", "exec", &id, "--", "echo", "no runner"]), "no runner\n");
    h.ok(&["box", "rm", &id]);
    // The old opt-in is gone: a usage error, not a silent no-op.
    one_line_error(&h.run(&["box", "create", "--runner"], b""), 2, "--runner");
    if agentbox_testing::services::docker_available("a_box_gets_a_runner_unless_told_not_to (docker)") {
        let id = h
            .ok(&["box", "create", "--provider", "docker", "--lifetime", "2m"])
            .trim()
            .to_string();
        let facts: serde_json::Value = serde_json::from_str(&h.ok(&["box", "facts", &id])).unwrap();
        assert!(
            facts["runner"].as_str().is_some_and(|r| r.contains("runner.sock")),
            "{facts}"
        );
        assert_eq!(h.ok(&["box", "exec", &id, "--", "echo", "in docker"]), "in docker\n");
        h.ok(&["box", "rm", &id]);
        let id = h
            .ok(&[
                "box",
                "create",
                "--provider",
                "docker",
                "--no-runner",
                "--lifetime",
                "2m",
            ])
            .trim()
            .to_string();
        let facts: serde_json::Value = serde_json::from_str(&h.ok(&["box", "facts", &id])).unwrap();
        assert!(facts.get("runner").is_none_or(|r| r.is_null()), "{facts}");
        h.ok(&["box", "rm", &id]);
    }
}

#[test]
fn the_runner_serves_stdio_and_refuses_bad_arguments_in_one_line() {
    let h = Home::new();
    // A run over stdio: length, kind, payload.
    let payload = br#"{"op":"run","id":1,"command":"echo over stdio","stdin":false}"#;
    let mut msg = ((payload.len() + 1) as u32).to_be_bytes().to_vec();
    msg.push(b't');
    msg.extend_from_slice(payload);
    let out = h.run(&["runner", "--stdio"], &msg);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("over stdio") && text.contains(r#""op":"exit""#),
        "{text:?}"
    );
    let out = h.run(&["runner", "--bogus"], b"");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err:?}");
    assert!(err.contains("--bogus"), "{err:?}");
}

#[test]
fn tool_calls_go_to_the_ledger_and_receipts_are_totalled() {
    let h = Home::new();
    let id = h.ok(&["box", "create", "--lifetime", "2m"]).trim().to_string();
    h.ok(&[
        "tool",
        &id,
        "write",
        "--run",
        "r1",
        "--args",
        r#"{"path":"a.txt","content":"x"}"#,
    ]);
    h.ok(&["tool", &id, "read", "--run", "r1", "--args", r#"{"path":"a.txt"}"#]);
    let out = h.run(
        &["tool", &id, "read", "--run", "r2", "--args", r#"{"path":"none.txt"}"#],
        b"",
    );
    assert_eq!(out.status.code(), Some(1));
    let run: Vec<serde_json::Value> = h
        .ok(&["ledger", "--run", "r1", "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(run.len(), 2);
    assert_eq!(
        (run[0]["seq"].as_u64(), run[0]["op"].as_str()),
        (Some(1), Some("write"))
    );
    let target = run[0]["target"].as_str().unwrap().to_string();
    assert!(target.ends_with("/a.txt"), "{target}");
    let history = h.ok(&["ledger", "--target", &target]);
    assert_eq!(history.lines().count(), 2, "{history}");
    assert!(
        history.lines().next().unwrap().contains(" read "),
        "newest first: {history}"
    );
    let failed = h.ok(&["ledger", "--run", "r2"]);
    assert!(failed.contains("error:"), "{failed}");
    one_line_error(
        &h.run(&["ledger", "--store", "nowhere:x", "--run", "r1"], b""),
        1,
        "--store",
    );
    one_line_error(&h.run(&["ledger"], b""), 2, "--target");
    h.ok(&["box", "rm", &id]);

    let receipts = h.0.path().join("receipts.jsonl");
    std::fs::write(
        &receipts,
        concat!(
            r#"{"box":"box-1","provider":"modal","kind":"vm","seconds":90.0,"cost_usd":0.009}"#,
            "\n",
            r#"{"box":"box-2","provider":"modal","kind":"vm","seconds":10.0,"cost_usd":0.001}"#,
            "\n",
            r#"{"box":"box-3","provider":"daytona","kind":"container","seconds":5.0,"calls":3,"cost_usd":0.006}"#,
            "\n",
        ),
    )
    .unwrap();
    let totals = h.ok(&["receipts", receipts.to_str().unwrap()]);
    let modal = totals.lines().find(|l| l.starts_with("modal")).unwrap();
    assert!(
        modal.contains(" 2 ") && modal.contains("100.0") && modal.contains("0.010000"),
        "{totals}"
    );
    assert!(totals.lines().last().unwrap().contains("0.016000"), "{totals}");
    one_line_error(&h.run(&["receipts", "/no/such/file"], b""), 1, "/no/such/file");
}

/// `agentbox` alone in a `bin` directory, as `cargo install --path crates/agentbox-cli --root
/// ROOT` lays it out (`ROOT/bin/agentbox` and nothing else): no `agentbox-runner` beside it.
fn fresh_install() -> (tempfile::TempDir, std::path::PathBuf) {
    let root = tempfile::tempdir().unwrap();
    let bin = root.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let exe = bin.join("agentbox");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_agentbox"), &exe).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_agentbox"), &exe).unwrap();
    }
    (root, exe)
}

fn docker_ps(label: &str) -> String {
    let out = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label={label}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_fresh_install_finds_its_runner_for_docker_boxes() {
    if !agentbox_testing::services::docker_available("a_fresh_install_finds_its_runner_for_docker_boxes") {
        return;
    }
    let (_root, exe) = fresh_install();
    let home = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(&exe)
            .args(args)
            .env("AGENTBOX_HOME", home.path())
            .env_remove("AGENTBOX_RUNNER")
            .output()
            .unwrap()
    };
    let out = run(&["box", "create", "--provider", "docker", "--lifetime", "2m", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let made: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = made["id"].as_str().unwrap().to_string();
    assert!(
        made["facts"]["runner"]
            .as_str()
            .is_some_and(|r| r.contains("runner.sock")),
        "the box's runner is this agentbox itself: {made}"
    );
    let out = run(&[
        "tool",
        &id,
        "write",
        "--args",
        r#"{"path":"a.txt","content":"via the runner\n"}"#,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run(&["box", "exec", &id, "--", "cat", "a.txt"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "via the runner\n");
    assert!(run(&["box", "rm", &id]).status.success());
}

/// With `agentbox` alone installed (no `agentbox-runner` beside it, no `AGENTBOX_RUNNER`),
/// every part of the runner a box needs is `agentbox` itself: the namespace box's keeper, init
/// and runner, the allowlist's probe inside the box, a Docker box's init, runner, relay and
/// egress proxy, and the probe inside it.
#[test]
fn agentbox_alone_serves_as_every_part_of_the_runner() {
    let (_root, exe) = fresh_install();
    let home = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(&exe)
            .args(args)
            .env("AGENTBOX_HOME", home.path())
            .env_remove("AGENTBOX_RUNNER")
            .env_remove("AGENTBOX_PROVIDER")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let mut providers = vec!["namespace"];
    if agentbox_testing::services::docker_available("agentbox_alone_serves_as_every_part_of_the_runner (docker)") {
        providers.push("docker");
    }
    for provider in providers {
        // A box with an allowlist is proven from inside before it is handed out.
        let id = run(&[
            "box",
            "create",
            "--provider",
            provider,
            "--lifetime",
            "2m",
            "--allow",
            "example.com",
        ]);
        let id = id.trim();
        assert!(id.starts_with(&format!("{provider}:")), "{id}");
        let out = run(&[
            "box",
            "exec",
            id,
            "--",
            "sh",
            "-c",
            "echo in the box; echo $HTTPS_PROXY",
        ]);
        assert!(out.starts_with("in the box\nhttp://127.0.0.1:"), "{provider}: {out}");
        assert_eq!(run(&["box", "rm", id]).trim(), id);
        // And one with no allowlist.
        let id = run(&["box", "create", "--provider", provider, "--lifetime", "2m"]);
        let id = id.trim();
        assert_eq!(
            run(&["box", "exec", id, "--", "echo", "plain"]),
            "plain\n",
            "{provider}"
        );
        assert_eq!(run(&["box", "rm", id]).trim(), id);
    }
}

/// An image the engine does not have is pulled through the engine, its progress in the logs;
/// where no registry can be reached (here a registry at a port nothing listens on, as a
/// machine with no way out meets Docker Hub), the error says so plainly, naming the image,
/// and no container is left.
#[test]
fn an_image_not_on_the_engine_is_pulled_or_the_error_says_no_registry_is_reachable() {
    if !agentbox_testing::services::docker_available("an_image_not_on_the_engine_is_pulled") {
        return;
    }
    let h = Home::new();
    let label = format!("cli-pull={}", std::process::id());
    let image = "127.0.0.1:1/agentbox-test/none:1";
    let out = h.run(
        &[
            "box",
            "create",
            "--provider",
            "docker",
            "--lifetime",
            "2m",
            "--image",
            image,
            "--label",
            &label,
        ],
        b"",
    );
    // The pull's progress is on stderr without -v (here its start, then the error, last).
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.trim_end().lines().collect();
    assert!(
        lines
            .first()
            .is_some_and(|l| l.contains("pulling it") && l.contains(image)),
        "{err}"
    );
    let last = lines.last().copied().unwrap_or_default();
    assert!(
        last.starts_with("agentbox: ")
            && last.contains(&format!(
                "image {image}: not on the Docker daemon, and no registry is reachable"
            )),
        "{err}"
    );
    assert_eq!(docker_ps(&label), "", "no container is left");
}

/// A default Docker box (agentbox's image, `scripts/box-image`) has what agents expect of a
/// base image: python3, curl and git, as other sandboxes' base images do.
#[test]
fn a_default_docker_box_has_python3_curl_and_git() {
    if !agentbox_testing::services::docker_available("a_default_docker_box_has_python3_curl_and_git") {
        return;
    }
    let h = Home::new();
    let id = h.ok(&["box", "create", "--provider", "docker", "--lifetime", "2m"]);
    let id = id.trim();
    let out = h.run(
        &[
            "box",
            "exec",
            id,
            "--",
            "sh",
            "-c",
            "python3 -c 'print(6 * 7)' && curl --version >/dev/null && git --version >/dev/null && echo all",
        ],
        b"",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "42\nall\n",
        "python3, curl and git in the box (an image older than scripts/box-image's package list is \
         built again by scripts/box-image): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(h.ok(&["box", "rm", id]).trim(), id);
}

#[test]
fn a_runner_that_cannot_run_in_the_box_says_what_to_do() {
    if !agentbox_testing::services::docker_available("a_runner_that_cannot_run_in_the_box_says_what_to_do") {
        return;
    }
    // A dynamic build whose loader the image lacks, as an image with no glibc (or an older one)
    // lacks what this machine's agentbox was linked against: /bin/true with its interpreter
    // renamed.
    let dir = tempfile::tempdir().unwrap();
    let mut elf = std::fs::read("/bin/true").unwrap();
    let interp = b"/lib64/ld-linux-x86-64.so.2";
    let at = elf
        .windows(interp.len())
        .position(|w| w == interp)
        .expect("/bin/true names its loader");
    elf[at + interp.len() - 1] = b'9';
    let runner = dir.path().join("agentbox-runner");
    std::fs::write(&runner, &elf).unwrap();
    std::fs::set_permissions(&runner, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let h = Home::new();
    let label = format!("cli-unrunnable={}", std::process::id());
    let out = Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args([
            "box",
            "create",
            "--provider",
            "docker",
            "--lifetime",
            "2m",
            "--label",
            &label,
        ])
        .env("AGENTBOX_HOME", h.0.path())
        .env("AGENTBOX_RUNNER", &runner)
        .output()
        .unwrap();
    one_line_error(&out, 1, "starting the box's runner");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("dynamically linked") && err.contains("scripts/runner-static") && err.contains("AGENTBOX_RUNNER"),
        "{err}"
    );
    assert_eq!(docker_ps(&label), "", "the box that could not get its runner is gone");
}

#[test]
fn verbose_logs_go_to_stderr_and_stdout_stays_the_commands() {
    let h = Home::new();
    let quiet = h.run(
        &["box", "create", "--lifetime", "1m", "--env", "MODE=not-for-logs"],
        b"",
    );
    assert!(quiet.status.success());
    assert_eq!(String::from_utf8_lossy(&quiet.stderr), "", "no -v, no logs");
    let out = h.run(
        &["-v", "box", "create", "--lifetime", "1m", "--env", "MODE=not-for-logs"],
        b"",
    );
    assert!(out.status.success());
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    let id = stdout.trim();
    assert!(
        id.starts_with("namespace:") && stdout.lines().count() == 1,
        "stdout is the id alone: {stdout:?}"
    );
    assert!(
        stderr.contains("INFO") && stderr.contains("box made") && stderr.contains(id),
        "{stderr}"
    );
    assert!(!stderr.contains("DEBUG"), "-v is info: {stderr}");
    assert!(
        !stderr.contains("not-for-logs"),
        "an env value never reaches the logs: {stderr}"
    );
    // -vv is debug, after the subcommand too; a run's claim, fence and release are logged.
    h.ok(&["runs", "new", "r1"]);
    let out = h.run(&["runs", "open", "r1", "-vv", "--", "true"], b"");
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for needle in ["DEBUG", "claimed", "fence taken", "run opened", "run released"] {
        assert!(stderr.contains(needle), "{needle:?} in {stderr}");
    }
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    // RUST_LOG, when set, is the filter: sync's counts at info, and nothing from the runs crate.
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("f.txt"), "file contents stay out of logs\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args(["sync", "seed", id, "--from", src.path().to_str().unwrap(), "--to", "w"])
        .env("AGENTBOX_HOME", h.0.path())
        .env("RUST_LOG", "agentbox_sync=info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("seeded") && stderr.contains("sent=") && stderr.contains(id),
        "{stderr}"
    );
    assert!(!stderr.contains("file contents"), "{stderr}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("seeded"),
        "logs are not stdout's"
    );
    h.ok(&["box", "rm", id]);
}

/// A new run's id comes from the kernel's random bytes (`getrandom`), not from reading
/// `/dev/urandom`: with that file unreadable (here: /dev/null bound over it in a mount namespace
/// of the test's own), two runs still get two distinct ids (a failed read made every id
/// `run-000000000000`, so the second `runs new` collided with the first).
#[test]
fn run_ids_are_random_without_dev_urandom() {
    let h = Home::new();
    let script = "mount --bind /dev/null /dev/urandom && \"$AGENTBOX_BIN\" runs new && \"$AGENTBOX_BIN\" runs new";
    let out = Command::new("unshare")
        .args(["--mount", "--map-root-user", "sh", "-c", script])
        .env("AGENTBOX_HOME", h.0.path())
        .env("AGENTBOX_BIN", env!("CARGO_BIN_EXE_agentbox"))
        .output()
        .expect("unshare (util-linux) runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("unshare failed"),
        "this test needs a mount namespace of its own (root, or unprivileged user namespaces): {stderr}"
    );
    assert!(out.status.success(), "{stderr}");
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_ne!(ids[0], ids[1]);
    assert!(
        ids.iter().all(|id| id.starts_with("run-") && id != "run-000000000000"),
        "{ids:?}"
    );
}

/// `--drop-capabilities --user` makes a box (it failed with `chown 1000:1000 /workspace:
/// Operation not permitted`), and `box facts` says what it keeps; `--keep-capabilities` keeps
/// Docker's set and says so.
#[test]
fn docker_capabilities_from_the_cli() {
    if !agentbox_testing::services::docker_available("docker_capabilities_from_the_cli") {
        return;
    }
    let h = Home::new();
    let id = h
        .ok(&[
            "box",
            "create",
            "--provider",
            "docker",
            "--lifetime",
            "2m",
            "--drop-capabilities",
            "--user",
            "1000:1000",
        ])
        .trim()
        .to_string();
    let facts: serde_json::Value = serde_json::from_str(&h.ok(&["box", "facts", &id])).unwrap();
    assert_eq!(
        (facts["capabilities"].as_str(), facts["no_new_privs"].as_bool()),
        (Some("none"), Some(true)),
        "{facts}"
    );
    assert_eq!(
        h.ok(&["box", "exec", &id, "--", "sh", "-c", "touch f && stat -c %u:%g ."]),
        "1000:1000\n"
    );
    h.ok(&["box", "rm", &id]);
    let id = h
        .ok(&[
            "box",
            "create",
            "--provider",
            "docker",
            "--lifetime",
            "2m",
            "--keep-capabilities",
        ])
        .trim()
        .to_string();
    let facts: serde_json::Value = serde_json::from_str(&h.ok(&["box", "facts", &id])).unwrap();
    assert_eq!(
        (facts["capabilities"].as_str(), facts["no_new_privs"].as_bool()),
        (Some("docker-default"), Some(false)),
        "{facts}"
    );
    h.ok(&["box", "rm", &id]);
    one_line_error(
        &h.run(
            &[
                "box",
                "create",
                "--provider",
                "docker",
                "--keep-capabilities",
                "--drop-capabilities",
            ],
            b"",
        ),
        2,
        "--keep-capabilities",
    );
}

/// With no `--provider` a box is a namespace box where they work (they do on the machines these
/// tests run on: root, or unprivileged user namespaces), with nothing said on stderr: a box of
/// its own user, pid and mount namespaces, no capability, no new privileges.
#[test]
fn a_box_is_a_namespace_box_unless_asked_otherwise() {
    let h = Home::new();
    let out = h.run(&["box", "create", "--lifetime", "2m", "--json"], b"");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr, "", "namespace boxes work here: nothing to say");
    let made: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = made["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("namespace:"), "{made}");
    let facts: serde_json::Value = serde_json::from_str(&h.ok(&["box", "facts", &id])).unwrap();
    assert_eq!(facts["provider"], "namespace");
    assert_eq!(
        (facts["capabilities"].as_str(), facts["no_new_privs"].as_bool()),
        (Some("none"), Some(true)),
        "{facts}"
    );
    // What the box's programs see of themselves, beside this test's own user namespace.
    let out = h.run(
        &[
            "box",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "cat; grep -E '^(NoNewPrivs|CapEff):' /proc/self/status; readlink /proc/self/ns/user; exit 3",
        ],
        b"piped\n",
    );
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.get(..3),
        Some(&["piped", "CapEff:\t0000000000000000", "NoNewPrivs:\t1"][..]),
        "{text}"
    );
    let host_user_ns = std::fs::read_link("/proc/self/ns/user").unwrap();
    assert_ne!(
        lines.get(3).copied(),
        Some(host_user_ns.to_str().unwrap()),
        "a user namespace of its own: {text}"
    );
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.txt");
    std::fs::write(&src, "in and out\n").unwrap();
    h.ok(&["box", "cp", src.to_str().unwrap(), &format!("{id}:sub/in.txt")]);
    let back = dir.path().join("back.txt");
    h.ok(&["box", "cp", &format!("{id}:sub/in.txt"), back.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "in and out\n");
    let ls = h.ok(&["box", "ls", "--provider", "namespace"]);
    assert!(ls.lines().any(|l| l.starts_with(&format!("{id} "))), "{ls}");
    assert_eq!(h.ok(&["box", "rm", &id]).trim(), id);
    one_line_error(&h.run(&["box", "exec", &id, "true"], b""), 1, "no such box");
}

/// A runner whose user-namespace probe the kernel refuses, as a machine with user namespaces
/// off answers it (`refused: …`, exit 3), and which notes in `probed` each time it is asked.
fn refusing_runner(dir: &std::path::Path) -> std::path::PathBuf {
    let runner = dir.join("agentbox-runner");
    let script = format!(
        "#!/bin/sh\necho \"$*\" >> '{}'\necho 'refused: Operation not permitted (os error 1)'\nexit 3\n",
        dir.join("probed").display()
    );
    std::fs::write(&runner, script).unwrap();
    std::fs::set_permissions(&runner, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    runner
}

/// Where namespace boxes cannot be made, a box made with no `--provider` is a local one, and
/// agentbox says so once, with the probe's answer; `--provider local` or
/// `AGENTBOX_PROVIDER=local` never probes and says nothing; an `AGENTBOX_PROVIDER` naming no
/// provider is an error naming the variable.
#[test]
fn where_namespace_boxes_cannot_be_made_a_box_is_local_and_says_why_once() {
    let h = Home::new();
    let dir = tempfile::tempdir().unwrap();
    let runner = refusing_runner(dir.path());
    let probed = dir.path().join("probed");
    let create = |args: &[&str], vars: &[(&str, &str)]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_agentbox"));
        c.args(["box", "create", "--lifetime", "1m"])
            .args(args)
            .env("AGENTBOX_HOME", h.0.path())
            .env("AGENTBOX_RUNNER", &runner)
            .env_remove("AGENTBOX_PROVIDER");
        for (k, v) in vars {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let out = create(&[], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(id.starts_with("local:"), "{id}");
    assert_eq!(stderr.lines().count(), 1, "said once: {stderr:?}");
    assert!(
        stderr.starts_with("agentbox: namespace boxes cannot be made here: ")
            && stderr.contains("refused: Operation not permitted")
            && stderr.contains("local box, which isolates nothing")
            && stderr.contains("--provider local"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&probed).unwrap(), "probe user-namespace\n");
    h.ok(&["box", "rm", &id]);

    std::fs::remove_file(&probed).unwrap();
    for (args, vars) in [
        (&["--provider", "local"][..], &[][..]),
        (&[][..], &[("AGENTBOX_PROVIDER", "local")][..]),
    ] {
        let out = create(args, vars);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?} {vars:?}: {stderr}");
        assert_eq!(stderr, "", "{args:?} {vars:?}: a provider chosen is not warned about");
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(id.starts_with("local:"), "{id}");
        assert!(!probed.exists(), "{args:?} {vars:?}: a provider chosen is not probed");
        h.ok(&["box", "rm", &id]);
    }
    // Named, namespace boxes are not replaced by local ones: the probe's answer is the error.
    let out = create(&["--provider", "namespace"], &[]);
    one_line_error(&out, 1, "refused: Operation not permitted");
    let out = create(&[], &[("AGENTBOX_PROVIDER", "nowhere")]);
    one_line_error(&out, 1, "AGENTBOX_PROVIDER: \"nowhere\" is not a provider");
}

/// `bench boxes --provider namespace` times a namespace box's create → first exec → destroy
/// beside a host spawn, a local box and a Docker box in one run, then its exec round trip; an
/// engine that does not answer is named in the table, not a failure.
#[test]
fn the_namespace_bench_measures_local_and_docker_boxes_beside_it() {
    let h = Home::new();
    let bench = |json: bool, docker_host: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_agentbox"));
        c.args(["bench", "boxes", "--provider", "namespace", "--iterations", "3"])
            .env("AGENTBOX_HOME", h.0.path());
        if json {
            c.arg("--json");
        }
        if let Some(d) = docker_host {
            c.env("DOCKER_HOST", d);
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (table, stderr) = bench(false, Some("unix:///nonexistent/docker.sock"));
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("create → first exec → destroy") || l.starts_with("exec round trip"))
        .collect();
    assert_eq!(rows.len(), 3, "host, local box, exec: {table}");
    assert!(
        rows.iter().all(|r| r.contains("(p90 ") && r.trim_end().ends_with('x')),
        "{table}"
    );
    for needle in [
        "baseline: spawn true on the host; agentbox: namespace box",
        "baseline: a local box, the same cycle; agentbox: namespace box",
        "baseline: spawn true on the host; agentbox: exec in a namespace box",
        "not measured: docker boxes, beside namespace boxes: ",
    ] {
        assert!(table.contains(needle), "{needle:?} in {table}");
    }
    assert!(stderr.contains("/nonexistent/docker.sock"), "{stderr}");
    if !agentbox_testing::services::docker_available("the_namespace_bench_measures_local_and_docker_boxes_beside_it") {
        return;
    }
    let (json, _) = bench(true, None);
    let pairs: serde_json::Value = serde_json::from_str(&json).unwrap();
    let baselines: Vec<(&str, &str)> = pairs
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["baseline"].as_str().unwrap()))
        .collect();
    assert_eq!(
        baselines,
        [
            ("create → first exec → destroy", "spawn true on the host"),
            ("create → first exec → destroy", "a local box, the same cycle"),
            ("create → first exec → destroy", "a docker box, the same cycle"),
            ("exec round trip of true", "spawn true on the host"),
            // Then a warm pool of 4 beside plain creates, for local and Docker boxes.
            ("create → first exec (pooled)", "a local box made, then true in it"),
            ("create → first exec (pooled)", "a docker box made, then true in it"),
        ]
    );
    for p in pairs.as_array().unwrap() {
        let (base, subject) = (
            p["baseline_ms"]["median"].as_f64().unwrap(),
            p["subject_ms"]["median"].as_f64().unwrap(),
        );
        assert!(base > 0.0 && subject > 0.0, "{p}");
        assert!((p["ratio"].as_f64().unwrap() - subject / base).abs() < 1e-9, "{p}");
        assert!(p["subject_ms"]["p90"].as_f64().unwrap() >= subject, "{p}");
    }
}

/// `--allow` makes a namespace box whose egress proxy is the only way out, and `box net` says
/// what it refused; a bad entry, a local box and `--allow` beside `--network` are refused.
#[test]
fn an_allowlisted_box_and_what_its_proxy_refused() {
    let h = Home::new();
    one_line_error(
        &h.run(
            &["box", "create", "--provider", "namespace", "--allow", "exa mple.com"],
            b"",
        ),
        2,
        "--allow: \"exa mple.com\" is not an entry",
    );
    one_line_error(
        &h.run(&["box", "create", "--provider", "local", "--allow", "example.com"], b""),
        1,
        "a local box cannot enforce an allowlist",
    );
    let out = h.run(
        &[
            "box",
            "create",
            "--provider",
            "namespace",
            "--allow",
            "example.com",
            "--network",
            "none",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    one_line_error(
        &h.run(
            &[
                "box",
                "create",
                "--provider",
                "namespace",
                "--network",
                "host",
                "--port",
                "8080:tcp",
            ],
            b"",
        ),
        1,
        "shares this machine's network",
    );
    let out = h.run(&["box", "create", "--port", "8080:udp"], b"");
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));

    let id = h
        .ok(&[
            "box",
            "create",
            "--provider",
            "namespace",
            "--lifetime",
            "2m",
            "--allow",
            "example.com:443",
            "--allow",
            "*.example.org",
            "--port",
            "8080:tcp",
        ])
        .trim()
        .to_string();
    let at = h.ok(&["box", "endpoint", &id, "8080"]);
    assert!(at.starts_with("127.0.0.1:"), "{at}");
    one_line_error(
        &h.run(&["box", "endpoint", &id, "8081"], b""),
        1,
        "port 8081 was not asked for",
    );
    let facts: serde_json::Value = serde_json::from_str(&h.ok(&["box", "facts", &id])).unwrap();
    assert_eq!(
        facts["network"],
        serde_json::json!({"allowlist": ["example.com:443", "*.example.org"]}),
        "{facts}"
    );
    assert_eq!(
        facts["ports"],
        serde_json::json!([{"port": 8080, "kind": "tcp"}]),
        "{facts}"
    );
    let err = h.run(&["box", "net", &id], b"");
    assert!(err.status.success());
    assert!(String::from_utf8_lossy(&err.stderr).contains("nothing refused"));
    // A name the list does not hold: refused before it is resolved (no network is needed).
    let said = h.ok(&[
        "box",
        "exec",
        &id,
        "--",
        "bash",
        "-c",
        "exec 3<>/dev/tcp/127.0.0.1/3128 && printf 'CONNECT nowhere.test:443 HTTP/1.1\\r\\n\\r\\n' >&3 && cat <&3",
    ]);
    assert!(said.starts_with("HTTP/1.1 403"), "{said}");
    let net = h.ok(&["box", "net", &id]);
    assert!(net.contains("nowhere.test:443  no entry: "), "{net}");
    let json: serde_json::Value = serde_json::from_str(&h.ok(&["box", "net", &id, "--json"])).unwrap();
    assert_eq!(json[0]["host"], "nowhere.test", "{json}");
    assert_eq!(json[0]["port"], 443, "{json}");
    h.ok(&["box", "rm", &id]);
}

/// `bench egress` puts a download and requests through a namespace box's egress proxy beside
/// the same on a direct connection, and HTTPS with a secret put in beside a direct TLS
/// connection and a tunnel; each fetch is checked whole (and the secret's value arrived), so a
/// proxy that drops, cuts or fails to rewrite fails the bench.
#[test]
fn the_egress_bench_puts_the_proxy_beside_a_direct_connection() {
    let h = Home::new();
    let out = Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args(["bench", "egress", "--iterations", "3", "--json"])
        .env("AGENTBOX_HOME", h.0.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let pairs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = pairs
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "egress: 256 MiB download",
            "egress: 50 requests, 1 KiB each",
            "https: 20 requests, secret put in",
            "https: 20 requests, vs tunnel",
            "https: 64 MiB download, secret put in",
            "https: 64 MiB download, vs tunnel",
        ]
    );
    for p in pairs.as_array().unwrap() {
        let ratio = p["ratio"].as_f64().unwrap();
        assert!(ratio.is_finite() && ratio > 0.0, "{p}");
    }
}

/// `agentbox ARGS` in `h`'s home with `env` set; stdin `/dev/null` for `None`, else a pipe
/// that gives `stdin` and ends.
fn run_with(h: &Home, args: &[&str], env: &[(&str, String)], stdin: Option<&[u8]>) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args(args)
        .env("AGENTBOX_HOME", h.0.path())
        .env_remove("AGENTBOX_PROVIDER")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(bytes) = stdin {
        let mut w = child.stdin.take().unwrap();
        // A program that refuses its stdin may have ended before reading it.
        let _ = w.write_all(bytes);
    }
    child.wait_with_output().unwrap()
}

#[test]
fn sync_pull_keeps_host_edits_and_remembers_deletions() {
    let h = Home::new();
    let id = h
        .ok(&["box", "create", "--provider", "local", "--lifetime", "5m"])
        .trim()
        .to_string();
    let host = tempfile::tempdir().unwrap();
    let to = host.path().to_str().unwrap();
    std::fs::write(host.path().join("a.txt"), "one").unwrap();
    std::fs::write(host.path().join("gone.txt"), "bye").unwrap();
    h.ok(&["sync", "seed", &id, "--from", to, "--to", "proj"]);
    h.ok(&[
        "box",
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "echo box > proj/a.txt && rm proj/gone.txt",
    ]);
    std::fs::write(host.path().join("a.txt"), "host").unwrap();
    let pull = |extra: &[&str]| {
        let mut args = vec!["sync", "pull", &id, "--from", "proj", "--to", to];
        args.extend_from_slice(extra);
        let out = h.run(&args, b"");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (report, String::from_utf8_lossy(&out.stderr).into_owned())
    };

    // The host's edit stays, and is named in the report and for people on stderr.
    let (report, said) = pull(&[]);
    assert_eq!(report["host_changed"], serde_json::json!(["a.txt"]), "{report}");
    assert!(said.contains("\"a.txt\"") && said.contains("--force"), "{said}");
    assert_eq!(std::fs::read_to_string(host.path().join("a.txt")).unwrap(), "host");
    assert!(host.path().join("gone.txt").exists(), "a plain pull removes nothing");

    // The deletion that pull saw is still the mirror's to make; the host's edit is named again.
    let (report, _) = pull(&["--mirror-deletes"]);
    assert_eq!(report["deleted"], 1, "{report}");
    assert!(!host.path().join("gone.txt").exists());
    assert_eq!(report["host_changed"], serde_json::json!(["a.txt"]), "{report}");
    assert_eq!(std::fs::read_to_string(host.path().join("a.txt")).unwrap(), "host");

    // --force takes the box's.
    let (report, _) = pull(&["--force"]);
    assert_eq!(report["host_changed"], serde_json::json!([]), "{report}");
    assert_eq!(std::fs::read_to_string(host.path().join("a.txt")).unwrap(), "box\n");
    h.ok(&["box", "rm", &id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_box_that_takes_no_input_refuses_stdin_with_bytes() {
    use agentbox_fakes::archil::{FakeArchil, FakeArchilOptions};
    let Some(rootfs) = agentbox_testing::services::rootfs("a_box_that_takes_no_input_refuses_stdin_with_bytes") else {
        return;
    };
    // The fake's key. Not a secret: the fake's own.
    const KEY: &str = "archil-fake-key-for-tests-0123456789";
    let fake = FakeArchil::start(FakeArchilOptions {
        rootfs: Some(rootfs.into()),
        api_key: KEY.into(),
        ..Default::default()
    })
    .await
    .expect("the fake Archil starts");
    let env = vec![
        ("ARCHIL_API_KEY", KEY.to_string()),
        ("ARCHIL_REGION", "aws-us-east-1".to_string()),
        ("ARCHIL_BASE_URL", fake.base_url()),
        ("ARCHIL_S3_BASE_URL", fake.s3_base_url()),
        ("ARCHIL_DISK", fake.create_disk("work").unwrap()),
    ];
    let h = Home::new();
    // The CLI runs as a child process; this runtime's workers keep serving the fake meanwhile.
    let run = |args: &[&str], stdin: Option<&[u8]>| tokio::task::block_in_place(|| run_with(&h, args, &env, stdin));
    let out = run(&["box", "create", "--provider", "archil", "--lifetime", "5m"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let execs = || {
        fake.requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path.contains("exec"))
            .count()
    };

    // Bytes on stdin: refused as the provider's own API refuses them, and nothing runs.
    let before = execs();
    let out = run(&["box", "exec", &id, "--", "cat"], Some(b"data\n"));
    one_line_error(&out, 1, "unsupported");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stdin") && err.contains(&id), "{err}");
    assert!(out.stdout.is_empty(), "{:?}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(execs(), before, "the program was not run");

    // No bytes: /dev/null, or a pipe that ends at once, runs the program.
    for stdin in [None, Some(&b""[..])] {
        let out = run(&["box", "exec", &id, "--", "echo", "ran"], stdin);
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
    }
    let out = run(&["box", "rm", &id], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    fake.shutdown().await;
}

#[test]
fn box_cp_copies_directories_streams_and_into_directories() {
    let h = Home::new();
    let id = h
        .ok(&["box", "create", "--provider", "local", "--lifetime", "5m"])
        .trim()
        .to_string();
    let at = |p: &str| format!("{id}:{p}");
    let cat = |p: &str| h.ok(&["box", "exec", &id, "--", "cat", p]);
    let here = tempfile::tempdir().unwrap();
    let tree = here.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::write(tree.join("f.txt"), "eff").unwrap();
    std::fs::write(tree.join("sub/g.txt"), "gee").unwrap();
    let tree_s = tree.to_str().unwrap();

    // A directory into a box: to a new path, and into one that ends in /.
    h.ok(&["box", "cp", tree_s, &at("copied")]);
    assert_eq!(cat("copied/f.txt"), "eff");
    assert_eq!(cat("copied/sub/g.txt"), "gee");
    h.ok(&["box", "cp", tree_s, &at("into/")]);
    assert_eq!(cat("into/tree/sub/g.txt"), "gee");
    // A file into a box directory keeps its name, with or without the /.
    h.ok(&["box", "cp", tree.join("f.txt").to_str().unwrap(), &at("into/")]);
    assert_eq!(cat("into/f.txt"), "eff");
    h.ok(&["box", "exec", &id, "--", "mkdir", "plain"]);
    h.ok(&["box", "cp", tree.join("f.txt").to_str().unwrap(), &at("plain")]);
    assert_eq!(cat("plain/f.txt"), "eff");

    // A directory out of a box, through the extractor: a link in it is not followed.
    h.ok(&["box", "exec", &id, "--", "ln", "-s", "/etc/passwd", "copied/link"]);
    let out_dir = here.path().join("out");
    let out = h.run(&["box", "cp", &at("copied"), out_dir.to_str().unwrap()], b"");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(out_dir.join("sub/g.txt")).unwrap(), "gee");
    assert!(
        std::fs::symlink_metadata(out_dir.join("link")).is_err(),
        "the link is not made"
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("not copied (symlink)"), "{said}");
    // Into an existing directory (or one named with /): under the source's name.
    h.ok(&["box", "cp", &at("copied"), out_dir.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(out_dir.join("copied/f.txt")).unwrap(), "eff");
    let fresh = format!("{}/fresh/", here.path().display());
    h.ok(&["box", "cp", &at("copied/f.txt"), &fresh]);
    assert_eq!(std::fs::read_to_string(here.path().join("fresh/f.txt")).unwrap(), "eff");

    // - is stdout: a file's bytes, or a tar of a directory under its name.
    assert_eq!(h.ok(&["box", "cp", &at("copied/sub/g.txt"), "-"]), "gee");
    let out = h.run(&["box", "cp", &at("copied/sub"), "-"], b"");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listing = tar_list(&out.stdout);
    assert!(listing.contains(&"sub/g.txt".to_string()), "{listing:?}");

    // - is stdin: a file's bytes, or a tar unpacked into a destination that ends in /.
    let out = h.run(&["box", "cp", "-", &at("piped.txt")], b"from stdin");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(cat("piped.txt"), "from stdin");
    let tar = Command::new("tar")
        .args(["-c", "-f", "-", "-C", tree_s, "."])
        .output()
        .unwrap()
        .stdout;
    let out = h.run(&["box", "cp", "-", &at("untarred/")], &tar);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(cat("untarred/sub/g.txt"), "gee");

    // Bad cases, each one line naming the problem.
    let file = tree.join("f.txt");
    one_line_error(
        &h.run(&["box", "cp", &at("copied"), file.to_str().unwrap()], b""),
        1,
        "not a directory here",
    );
    one_line_error(
        &h.run(&["box", "cp", "-", &at("copied")], b"x"),
        1,
        "is a directory in the box",
    );
    one_line_error(&h.run(&["box", "cp", "-", "-"], b""), 2, "ID:PATH");
    one_line_error(&h.run(&["box", "cp", &at("nothing-here"), "-"], b""), 1, "nothing-here");
    h.ok(&["box", "rm", &id]);
}

/// The member names of a tar, as `tar -t` lists them.
fn tar_list(tar: &[u8]) -> Vec<String> {
    use std::io::Write;
    let mut child = Command::new("tar")
        .args(["-t", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(tar).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_end_matches('/').to_string())
        .collect()
}

/// `bench serve` measures the service beside its baselines in one run (a tool call beside
/// `agentbox mcp` and a host spawn, a wrong key beside none, 200 streams beside one, boxes
/// through the service beside the provider) and leaves no box behind.
#[test]
fn the_service_bench_measures_each_side_beside_its_baseline() {
    let h = Home::new();
    let out = h.ok(&[
        "bench",
        "serve",
        "--provider",
        "namespace",
        "--iterations",
        "3",
        "--json",
    ]);
    let (names, _) = common::bench_pairs(&out);
    assert_eq!(
        names,
        [
            "tool call: agentbox mcp vs host",
            "tool call: service vs mcp",
            "10,000 requests: wrong key vs none",
            "200 streams at once vs one",
            "30 boxes made and ended",
        ],
        "{out}"
    );
    common::no_box_left(&h);
}

/// A ledger in PostgreSQL is named by a file holding its connection string; one whose
/// password would sit in this process's arguments is refused before anything connects.
#[test]
fn a_postgres_ledgers_password_never_goes_in_an_argument() {
    let h = Home::new();
    let out = h.run(
        &[
            "ledger",
            "--store",
            "postgres:host=db user=a password=hunter2",
            "--run",
            "r1",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("postgres:@FILE") && !said.contains("hunter2"), "{said}");
    let empty = h.0.path().join("pg");
    std::fs::write(&empty, "\n").unwrap();
    let out = h.run(
        &[
            "ledger",
            "--store",
            &format!("postgres:@{}", empty.display()),
            "--run",
            "r1",
        ],
        b"",
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the file is empty"),
        "{out:?}"
    );
}

/// `box create --secret` gives the box a placeholder and never the value; `box exec
/// --secret-fd` hands one program the value on descriptor 3; a malformed flag is a usage
/// error naming it.
#[test]
fn a_box_has_a_placeholder_and_one_program_the_value() {
    let h = Home::new();
    let value = "cli-s3cr3t-value";
    let file = h.0.path().join("token");
    std::fs::write(&file, format!("{value}\n")).unwrap();
    let secret = format!("TOKEN=file:{}@api.example.com", file.display());
    let made = h.ok(&[
        "box",
        "create",
        "--provider",
        "namespace",
        "--secret",
        &secret,
        "--json",
    ]);
    assert!(!made.contains(value), "{made}");
    let made: serde_json::Value = serde_json::from_str(&made).unwrap();
    assert_eq!(made["facts"]["secrets"], serde_json::json!(["TOKEN"]));
    let id = made["id"].as_str().unwrap();
    let seen = h.ok(&["box", "exec", id, "--", "sh", "-c", "printf %s \"$TOKEN\""]);
    assert!(seen.starts_with("agentbox-placeholder-"), "{seen}");
    let fd = format!("DEPLOY=file:{}", file.display());
    let seen = h.ok(&[
        "box",
        "exec",
        "--secret-fd",
        &fd,
        id,
        "--",
        "sh",
        "-c",
        "cat <&3; echo \" $AGENTBOX_SECRET_NAME\"",
    ]);
    // Exactly as the file holds it, its newline too.
    assert_eq!(seen, format!("{value}\n DEPLOY\n"));
    h.ok(&["box", "rm", id]);
    one_line_error(
        &h.run(
            &["box", "create", "--provider", "namespace", "--secret", "TOKEN=env:X"],
            b"",
        ),
        2,
        "--secret",
    );
    one_line_error(
        &h.run(&["box", "exec", "--secret-fd", "A=file:/no/such/file", id, "true"], b""),
        2,
        "secret A",
    );
}

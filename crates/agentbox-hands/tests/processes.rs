//! bash's `background` and the process tools (process_read, process_write, process_kill,
//! process_list): their messages over a fake box whose processes say exactly what a test
//! wants (gaps, cuts, exits), their refusals where no processes are kept, and what they do in
//! real local boxes with and without a runner.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentbox_core::{
    Ctx, Endpoint, Error, ExecOptions as BoxExecOptions, ExitStatus, Facts, FileError, FileMeta, FileType, Files,
    Labels, OutputChunk, OutputRead, Process, ProcessControl, ProcessInfo, ProcessState, Processes, Provider, Sandbox,
    SandboxId, Spec, Status, Stream,
};
use agentbox_hands::tools::{self, ToolResult};
use agentbox_hands::{BoxEnv, ExecutionEnv, HostEnv};
use async_trait::async_trait;
use serde_json::{Value, json};

/// The one process a fake box keeps (handle 1), and what the tools asked of it.
#[derive(Default)]
struct Kept {
    /// Every byte it wrote.
    output: Vec<u8>,
    /// The number of the first byte still kept.
    first: u64,
    /// How it ended, once it did.
    exit: Option<ProcessState>,
    /// `(after, wait, max_bytes)` of each read.
    reads: Vec<(u64, Duration, usize)>,
    /// `(bytes, close)` of each write.
    writes: Vec<(Vec<u8>, bool)>,
    signals: Vec<i32>,
    /// `(argv, options)` of each exec.
    started: Vec<(Vec<String>, BoxExecOptions)>,
}

struct FakePs(Arc<Mutex<Kept>>);

fn no_such(handle: u64) -> Error {
    Error::not_found(format!("no process {handle}"))
}

#[async_trait]
impl Processes for FakePs {
    async fn list(&self, _ctx: &Ctx) -> agentbox_core::Result<Vec<ProcessInfo>> {
        let k = self.0.lock().unwrap();
        Ok(vec![ProcessInfo {
            handle: 1,
            argv: vec!["/bin/bash".into(), "-c".into(), "exec 2>&1\nnpm run dev".into()],
            pid: 4242,
            started_ms: 1_795_962_245_000,
            state: k.exit.unwrap_or(ProcessState::Running),
            tty: false,
            detach: true,
            first: k.first,
            end: k.output.len() as u64,
            readers: 0,
        }])
    }

    /// What the box keeps from `after` on, up to `max_bytes`, in chunks of at most 10 000
    /// bytes (so a read gets several); the exit once all of it was read.
    async fn read(
        &self,
        handle: u64,
        after: u64,
        wait: Duration,
        max_bytes: usize,
        _ctx: &Ctx,
    ) -> agentbox_core::Result<OutputRead> {
        if handle != 1 {
            return Err(no_such(handle));
        }
        let mut k = self.0.lock().unwrap();
        k.reads.push((after, wait, max_bytes));
        let (gap_from, from) = if after < k.first {
            (Some(k.first), k.first)
        } else {
            (None, after)
        };
        let len = k.output.len() as u64;
        let to = (from + max_bytes as u64).min(len).max(from);
        let mut chunks = Vec::new();
        let mut at = from;
        while at < to {
            let end = (at + 10_000).min(to);
            chunks.push(OutputChunk {
                seq: at,
                stream: Stream::Stdout,
                bytes: k.output[at as usize..end as usize].to_vec(),
            });
            at = end;
        }
        Ok(OutputRead {
            chunks,
            gap_from,
            next: to,
            exit: if to == len { k.exit } else { None },
        })
    }

    async fn attach(&self, handle: u64, _after: u64, _ctx: &Ctx) -> agentbox_core::Result<Process> {
        Err(no_such(handle))
    }

    async fn write(&self, handle: u64, data: &[u8], close: bool, _ctx: &Ctx) -> agentbox_core::Result<()> {
        if handle != 1 {
            return Err(no_such(handle));
        }
        self.0.lock().unwrap().writes.push((data.to_vec(), close));
        Ok(())
    }

    async fn signal(&self, handle: u64, signal: i32, _ctx: &Ctx) -> agentbox_core::Result<()> {
        if handle != 1 {
            return Err(no_such(handle));
        }
        self.0.lock().unwrap().signals.push(signal);
        Ok(())
    }

    async fn resize(&self, handle: u64, _rows: u16, _cols: u16, _ctx: &Ctx) -> agentbox_core::Result<()> {
        Err(no_such(handle))
    }

    async fn forget(&self, _handle: u64, _ctx: &Ctx) -> agentbox_core::Result<()> {
        Ok(())
    }
}

/// The box's shell is `/bin/bash`; nothing else is there.
struct FakeFiles;

#[async_trait]
impl Files for FakeFiles {
    async fn read(&self, _: &str, _: &Ctx) -> Result<Option<Vec<u8>>, FileError> {
        Ok(None)
    }
    async fn write(&self, _: &str, _: &[u8], _: bool, _: &Ctx) -> Result<(), FileError> {
        Err(FileError::Os(30))
    }
    async fn truncate(&self, _: &str, _: u64, _: &Ctx) -> Result<(), FileError> {
        Err(FileError::Os(30))
    }
    async fn stat(&self, path: &str, _: bool, _: &Ctx) -> Result<FileMeta, FileError> {
        if path != "/bin/bash" {
            return Err(FileError::Os(2));
        }
        Ok(FileMeta {
            name: "bash".into(),
            kind: FileType::File,
            size: 1,
            mode: 0o755,
            mtime_ms: 0,
        })
    }
    async fn list(&self, _: &str, _: &Ctx) -> Result<Vec<FileMeta>, FileError> {
        Err(FileError::Os(2))
    }
    async fn mkdir(&self, _: &str, _: bool, _: &Ctx) -> Result<(), FileError> {
        Err(FileError::Os(30))
    }
    async fn remove(&self, _: &str, _: bool, _: bool, _: &Ctx) -> Result<(), FileError> {
        Err(FileError::Os(30))
    }
    async fn rename(&self, _: &str, _: &str, _: &Ctx) -> Result<(), FileError> {
        Err(FileError::Os(30))
    }
}

/// A started program that runs until the test ends.
struct Forever;

#[async_trait]
impl ProcessControl for Forever {
    async fn wait(&self) -> agentbox_core::Result<ExitStatus> {
        std::future::pending().await
    }
    async fn signal(&self, _signal: i32) -> agentbox_core::Result<()> {
        Ok(())
    }
}

/// A box with a runner (`runner`) or without; its detached execs are recorded and get
/// handle 1.
struct FakeBox {
    id: SandboxId,
    facts: Facts,
    labels: Labels,
    runner: bool,
    ps: FakePs,
    files: FakeFiles,
}

#[async_trait]
impl Sandbox for FakeBox {
    fn id(&self) -> &SandboxId {
        &self.id
    }
    fn facts(&self) -> &Facts {
        &self.facts
    }
    fn labels(&self) -> &Labels {
        &self.labels
    }
    async fn exec(&self, argv: &[String], opts: &BoxExecOptions, ctx: &Ctx) -> agentbox_core::Result<Process> {
        if !opts.detach || !self.runner {
            return Err(Error::unsupported("the fake box runs detached programs alone"));
        }
        self.ps.0.lock().unwrap().started.push((argv.to_vec(), opts.clone()));
        Ok(Process::new(None, None, None, Arc::new(Forever), ctx).with_handle(1))
    }
    async fn status(&self, _ctx: &Ctx) -> agentbox_core::Result<Status> {
        Ok(Status::Running)
    }
    async fn upload(&self, _: &str, _: &[u8], _: &Ctx) -> agentbox_core::Result<()> {
        Err(Error::unsupported("fake"))
    }
    async fn download(&self, _: &str, _: u64, _: &Ctx) -> agentbox_core::Result<Vec<u8>> {
        Err(Error::unsupported("fake"))
    }
    async fn endpoint(&self, _: u16, _: &Ctx) -> agentbox_core::Result<Endpoint> {
        Err(Error::unsupported("fake"))
    }
    async fn destroy(&self, _: &Ctx) -> agentbox_core::Result<()> {
        Ok(())
    }
    fn files(&self) -> Option<&dyn Files> {
        self.runner.then_some(&self.files as &dyn Files)
    }
    fn processes(&self) -> Option<&dyn Processes> {
        self.runner.then_some(&self.ps as &dyn Processes)
    }
}

fn fake(runner: bool) -> (BoxEnv, Arc<Mutex<Kept>>) {
    let kept = Arc::new(Mutex::new(Kept::default()));
    let b = FakeBox {
        id: SandboxId::new("fake", "b1").unwrap(),
        facts: Facts {
            provider: "fake".into(),
            workspace: Some("/work".into()),
            // Programs live between calls, runner or not: a box without live processes is
            // served another way (tests/one_call.rs).
            live_processes: true,
            ..Default::default()
        },
        labels: BTreeMap::new(),
        runner,
        ps: FakePs(kept.clone()),
        files: FakeFiles,
    };
    (BoxEnv::new(Arc::new(b)), kept)
}

async fn call(env: &dyn ExecutionEnv, name: &str, args: Value) -> ToolResult {
    tools::call(name, env, args, &Ctx::background()).await
}

fn ok(r: &ToolResult) -> String {
    assert!(!r.is_error, "expected success: {}", r.text());
    r.text()
}

fn err(r: &ToolResult) -> String {
    assert!(r.is_error, "expected an error: {}", r.text());
    r.text()
}

#[tokio::test]
async fn background_bash_starts_a_detached_command_and_answers_its_handle() {
    let (env, kept) = fake(true);
    let r = call(
        &env,
        "bash",
        json!({"command": "npm run dev", "background": true, "timeout": 90}),
    )
    .await;
    assert_eq!(
        ok(&r),
        "Started in the background as process 1. It is ended after 90 seconds. Read its output with process_read {\"handle\": 1}; write its stdin with process_write, stop it with process_kill."
    );
    assert_eq!(r.details, json!({"handle": 1}));
    let (argv, opts) = kept.lock().unwrap().started[0].clone();
    assert_eq!(argv, ["/bin/bash", "-c", "exec 2>&1\nnpm run dev"]);
    assert!(opts.detach);
    assert_eq!(opts.timeout, Some(Duration::from_secs(90)));
    assert_eq!(opts.cwd.as_deref(), Some("/work"));
    assert_eq!(opts.tty, None);
    // Without a timeout, none; `background: false` is bash as before (this box runs nothing
    // but detached programs, so the foreground call fails, and starts nothing detached).
    ok(&call(&env, "bash", json!({"command": "sleep 1", "background": true})).await);
    assert_eq!(kept.lock().unwrap().started[1].1.timeout, None);
    err(&call(&env, "bash", json!({"command": "true", "background": false})).await);
    assert_eq!(kept.lock().unwrap().started.len(), 2);
}

#[tokio::test]
async fn process_read_reads_from_after_waits_and_says_where_to_go_on() {
    let (env, kept) = fake(true);
    kept.lock().unwrap().output = b"hello\nworld\n".to_vec();
    let r = call(&env, "process_read", json!({"handle": 1})).await;
    assert_eq!(
        ok(&r),
        "hello\nworld\n\n\n[Process 1 is still running. Use after=12 to read on.]"
    );
    assert_eq!(r.details["next"], json!(12));
    assert_eq!(r.details["exit"], Value::Null);
    let t = ok(&call(&env, "process_read", json!({"handle": 1, "after": 6, "wait": 0.5})).await);
    assert_eq!(t, "world\n\n\n[Process 1 is still running. Use after=12 to read on.]");
    let t = ok(&call(&env, "process_read", json!({"handle": 1, "after": 12, "wait": 0})).await);
    assert_eq!(
        t,
        "(no new output)\n\n[Process 1 is still running. Use after=12 to read on.]"
    );
    let reads = kept.lock().unwrap().reads.clone();
    let waits: Vec<Duration> = reads.iter().map(|r| r.1).collect();
    assert_eq!(
        waits,
        [Duration::from_secs(5), Duration::from_millis(500), Duration::ZERO],
        "5 s when not told"
    );
    assert_eq!(reads[1].0, 6);
    // One byte over what is shown is asked for, to know whether more follows.
    assert_eq!(reads[0].2, tools::truncate::MAX_BYTES + 1);
}

#[tokio::test]
async fn process_read_says_how_a_process_ended() {
    let (env, kept) = fake(true);
    kept.lock().unwrap().output = b"done\n".to_vec();
    for (state, said) in [
        (
            ProcessState::Exited {
                status: ExitStatus::exited(0),
            },
            "[Process 1 exited with code 0]",
        ),
        (
            ProcessState::Exited {
                status: ExitStatus::exited(3),
            },
            "[Process 1 exited with code 3]",
        ),
        (
            ProcessState::Exited {
                status: ExitStatus::signaled(15),
            },
            "[Process 1 was ended by SIGTERM (exit code 143)]",
        ),
        (
            ProcessState::TimedOut {
                status: ExitStatus::signaled(9),
            },
            "[Process 1 timed out and was killed (exit code 137)]",
        ),
    ] {
        kept.lock().unwrap().exit = Some(state);
        let r = call(&env, "process_read", json!({"handle": 1})).await;
        assert_eq!(ok(&r), format!("done\n\n\n{said}"));
        assert_eq!(r.details["next"], json!(5));
        assert!(r.details["exit"]["code"].is_number(), "{}", r.details);
    }
    let r = call(&env, "process_read", json!({"handle": 1, "after": 5})).await;
    assert_eq!(
        ok(&r),
        "(no new output)\n\n[Process 1 timed out and was killed (exit code 137)]"
    );
    assert_eq!(r.details["exit"]["state"], json!("timed_out"));
}

#[tokio::test]
async fn process_read_names_the_bytes_the_box_let_go() {
    let (env, kept) = fake(true);
    {
        let mut k = kept.lock().unwrap();
        k.output = b"0123456789tail\n".to_vec();
        k.first = 10;
    }
    let r = call(&env, "process_read", json!({"handle": 1, "after": 4})).await;
    assert_eq!(
        ok(&r),
        "tail\n\n\n[Output bytes 4-10 were let go before they were read: the box keeps only the last part of a process's output (6B lost)]\n[Process 1 is still running. Use after=15 to read on.]"
    );
    assert_eq!(r.details["lost"], json!({"from": 4, "to": 10}));
}

#[tokio::test]
async fn process_read_shows_2000_lines_or_50kb_and_the_exit_only_after_the_rest() {
    let (env, kept) = fake(true);
    let lines: String = (1..=3000).map(|i| format!("{i}\n")).collect();
    let first_2000: usize = (1..=2000).map(|i| format!("{i}\n").len()).sum();
    {
        let mut k = kept.lock().unwrap();
        k.output = lines.clone().into_bytes();
        k.exit = Some(ProcessState::Exited {
            status: ExitStatus::exited(0),
        });
    }
    let r = call(&env, "process_read", json!({"handle": 1})).await;
    let t = ok(&r);
    assert!(
        t.starts_with("1\n2\n") && t.contains("\n2000\n") && !t.contains("\n2001\n"),
        "{t}"
    );
    assert!(
        t.ends_with(&format!(
            "\n\n[Showing output bytes 0-{first_2000} (2000 lines limit). Use after={first_2000} to continue.]"
        )),
        "{}",
        &t[t.len() - 120..]
    );
    assert_eq!(r.details["exit"], Value::Null, "not ended while output is unread");
    let t = ok(&call(&env, "process_read", json!({"handle": 1, "after": first_2000})).await);
    assert!(
        t.starts_with("2001\n") && t.ends_with("3000\n\n\n[Process 1 exited with code 0]"),
        "{t}"
    );

    // By bytes: one long line, with a character cut in two by the bound held for the next read.
    let mut wide = vec![b'a'; tools::truncate::MAX_BYTES - 1];
    wide.extend_from_slice("é and more".as_bytes());
    kept.lock().unwrap().output = wide;
    let r = call(&env, "process_read", json!({"handle": 1})).await;
    let t = ok(&r);
    let shown = tools::truncate::MAX_BYTES - 1;
    assert!(
        t.ends_with(&format!(
            "a\n\n[Showing output bytes 0-{shown} (50.0KB limit). Use after={shown} to continue.]"
        )),
        "{}",
        &t[t.len() - 100..]
    );
    assert!(!t.contains('\u{FFFD}'));
    let t = ok(&call(&env, "process_read", json!({"handle": 1, "after": shown})).await);
    assert_eq!(t, "é and more\n\n[Process 1 exited with code 0]");
}

#[tokio::test]
async fn process_write_kill_and_list_say_what_they_did() {
    let (env, kept) = fake(true);
    assert_eq!(
        ok(&call(&env, "process_write", json!({"handle": 1, "text": "yes\n"})).await),
        "Wrote 4 bytes to process 1."
    );
    assert_eq!(
        ok(&call(&env, "process_write", json!({"handle": 1, "text": "é", "close": true})).await),
        "Wrote 2 bytes to process 1 and closed its stdin."
    );
    assert_eq!(
        ok(&call(&env, "process_write", json!({"handle": 1, "close": true})).await),
        "Closed the stdin of process 1."
    );
    assert_eq!(
        kept.lock().unwrap().writes,
        vec![
            (b"yes\n".to_vec(), false),
            ("é".as_bytes().to_vec(), true),
            (vec![], true)
        ]
    );
    assert_eq!(
        ok(&call(&env, "process_kill", json!({"handle": 1})).await),
        "Sent SIGTERM to process 1. Use process_read to see how it ended."
    );
    for (name, number) in [("KILL", 9), ("SIGINT", 2), ("hup", 1)] {
        let t = ok(&call(&env, "process_kill", json!({"handle": 1, "signal": name})).await);
        assert!(t.starts_with("Sent SIG"), "{t}");
        assert_eq!(kept.lock().unwrap().signals.last(), Some(&number));
    }
    assert_eq!(kept.lock().unwrap().signals, vec![15, 9, 2, 1]);
    kept.lock().unwrap().output = vec![b'x'; 1536];
    let r = call(&env, "process_list", json!({})).await;
    assert_eq!(
        ok(&r),
        "handle  state    started              output  command\n\
         1       running  2026-11-29 14:24:05  1.5KB   npm run dev"
    );
    assert_eq!(r.details["processes"][0]["outputBytes"], json!(1536));
    kept.lock().unwrap().exit = Some(ProcessState::Exited {
        status: ExitStatus::signaled(15),
    });
    let t = ok(&call(&env, "process_list", json!({})).await);
    assert!(
        t.ends_with("\n1       SIGTERM (143)  2026-11-29 14:24:05  1.5KB   npm run dev"),
        "{t}"
    );
}

#[tokio::test]
async fn a_handle_the_box_does_not_know_is_named() {
    let (env, _kept) = fake(true);
    for (tool, args) in [
        ("process_read", json!({"handle": 7, "wait": 0})),
        ("process_write", json!({"handle": 7, "text": "x"})),
        ("process_kill", json!({"handle": 7})),
    ] {
        assert_eq!(
            err(&call(&env, tool, args).await),
            "No process 7 in this box. process_list shows the processes it keeps.",
            "{tool}"
        );
    }
}

#[tokio::test]
async fn arguments_are_refused_naming_the_argument_and_why() {
    let (env, kept) = fake(true);
    for (tool, args, said) in [
        ("process_read", json!({}), "Invalid arguments: handle is required"),
        (
            "process_read",
            json!({"handle": -1}),
            "Invalid arguments: handle must be a non-negative whole number",
        ),
        (
            "process_read",
            json!({"handle": 1, "after": 1.5}),
            "Invalid arguments: after must be a non-negative whole number",
        ),
        (
            "process_read",
            json!({"handle": 1, "wait": 301}),
            "Invalid arguments: wait must be a number of seconds from 0 to 300",
        ),
        (
            "process_read",
            json!({"handle": 1, "wait": -1}),
            "Invalid arguments: wait must be a number of seconds from 0 to 300",
        ),
        (
            "process_write",
            json!({"handle": 1, "text": 3}),
            "Invalid arguments: text must be a string",
        ),
        (
            "process_write",
            json!({"handle": 1, "close": "yes"}),
            "Invalid arguments: close must be a boolean",
        ),
        (
            "process_kill",
            json!({"handle": 1, "signal": "FOO"}),
            "Invalid arguments: signal \"FOO\" is not a signal this box can send (one of TERM, KILL, INT, HUP, QUIT, USR1, USR2, STOP, CONT, TSTP, ABRT, ALRM, PIPE, SEGV, WINCH)",
        ),
        (
            "bash",
            json!({"command": "x", "background": "yes"}),
            "Invalid arguments: background must be a boolean",
        ),
    ] {
        assert_eq!(err(&call(&env, tool, args.clone()).await), said, "{tool} {args}");
    }
    let k = kept.lock().unwrap();
    assert!(
        k.reads.is_empty() && k.writes.is_empty() && k.signals.is_empty() && k.started.is_empty(),
        "nothing reached the box"
    );
}

/// Every process tool and bash's background, where nothing keeps processes: the message says
/// why.
async fn refused_everywhere(env: &dyn ExecutionEnv, why: &str) {
    let t = err(&call(env, "bash", json!({"command": "sleep 60", "background": true})).await);
    assert_eq!(t, format!("Could not start the command in the background: {why}"));
    for (tool, args) in [
        ("process_read", json!({"handle": 1})),
        ("process_write", json!({"handle": 1, "text": "x"})),
        ("process_kill", json!({"handle": 1})),
        ("process_list", json!({})),
    ] {
        assert_eq!(
            err(&call(env, tool, args).await),
            format!("No processes here: {why}"),
            "{tool}"
        );
    }
}

#[tokio::test]
async fn the_host_and_a_box_without_a_runner_refuse_saying_why() {
    let d = tempfile::tempdir().unwrap();
    let host = HostEnv::new(d.path().to_string_lossy()).unwrap();
    refused_everywhere(
        &host,
        "the host environment keeps no processes: a command that runs in the background needs a box with a runner",
    )
    .await;
    // bash in the foreground is as it was.
    assert_eq!(ok(&call(&host, "bash", json!({"command": "echo hi"})).await), "hi\n");
    let (env, kept) = fake(false);
    refused_everywhere(
        &env,
        "box fake:b1 has no runner, so it keeps no processes: a command lives only as long as the call that started it",
    )
    .await;
    assert!(kept.lock().unwrap().started.is_empty());
}

#[test]
fn the_seven_are_pis_and_all_adds_the_four_after_them() {
    let names = |v: Vec<Box<dyn tools::Tool>>| v.iter().map(|t| t.name()).collect::<Vec<_>>();
    let seven = ["read", "bash", "edit", "write", "grep", "find", "ls"];
    assert_eq!(names(tools::seven()), seven);
    let mut eleven = seven.to_vec();
    eleven.extend(["process_read", "process_write", "process_kill", "process_list"]);
    assert_eq!(names(tools::all()), eleven);
    let pi_bash = tools::seven().into_iter().find(|t| t.name() == "bash").unwrap();
    assert!(pi_bash.schema()["properties"].get("background").is_none());
    // pi's bash ignores `background` as it ignores any argument it does not know.
    pi_bash.check(json!({"command": "x", "background": true})).unwrap();
}

// What they do in real boxes.

fn local_provider(home: &std::path::Path, runner: bool) -> agentbox_providers::LocalProvider {
    agentbox_testing::runner::ensure();
    let mut opts = agentbox_providers::LocalOptions::at(home).unwrap();
    opts.runner = runner;
    agentbox_providers::LocalProvider::new(opts).unwrap()
}

async fn local_box(runner: bool) -> (tempfile::TempDir, Arc<dyn Sandbox>) {
    let home = tempfile::tempdir().unwrap();
    let b = local_provider(home.path(), runner)
        .create(&Spec::new(Duration::from_secs(300)), &Ctx::background())
        .await
        .unwrap();
    (home, b)
}

/// Read process `handle` from `after` until `until` holds of all read so far (or 30 s pass):
/// the text read, and the last answer.
async fn read_until(env: &dyn ExecutionEnv, handle: u64, until: impl Fn(&str, &ToolResult) -> bool) -> String {
    let mut after = 0u64;
    let mut all = String::new();
    let start = std::time::Instant::now();
    loop {
        let r = call(
            env,
            "process_read",
            json!({"handle": handle, "after": after, "wait": 2}),
        )
        .await;
        let t = ok(&r);
        after = r.details["next"].as_u64().unwrap();
        all.push_str(&t);
        all.push('\n');
        if until(&all, &r) {
            return all;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "waited 30 s: {all}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_local_box_with_a_runner_a_background_command_is_read_written_and_killed() {
    let (_home, b) = local_box(true).await;
    let env = BoxEnv::new(b.clone());
    let r = call(
        &env,
        "bash",
        json!({"command": "echo started; echo to-stderr >&2; read line; echo \"got $line\"; exec sleep 120", "background": true}),
    )
    .await;
    let handle = r.details["handle"].as_u64().unwrap_or_else(|| panic!("{}", r.text()));
    let seen = read_until(&env, handle, |all, _| all.contains("to-stderr")).await;
    assert!(seen.contains("started\n"), "{seen}");
    ok(&call(&env, "process_write", json!({"handle": handle, "text": "hello\n"})).await);
    let seen = read_until(&env, handle, |all, _| all.contains("got hello")).await;
    assert!(seen.contains("is still running"), "{seen}");
    let listed = ok(&call(&env, "process_list", json!({})).await);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with(&format!("{handle} ")) && l.contains("running")),
        "{listed}"
    );
    ok(&call(&env, "process_kill", json!({"handle": handle})).await);
    let seen = read_until(&env, handle, |_, r| !r.details["exit"].is_null()).await;
    assert!(seen.contains("was ended by SIGTERM (exit code 143)"), "{seen}");
    let listed = ok(&call(&env, "process_list", json!({})).await);
    assert!(listed.contains("SIGTERM (143)"), "{listed}");
    // Reading marks nothing as read: from 0 again, the same output and the same end.
    let again = ok(&call(&env, "process_read", json!({"handle": handle, "wait": 0})).await);
    assert!(
        again.starts_with("started\n") && again.contains("got hello") && again.contains("SIGTERM"),
        "{again}"
    );
    b.destroy(&Ctx::background()).await.unwrap();
}

/// A process is the box's: another host connection to the box (the box attached again, as
/// another host process would) lists it, reads it and stops it by the same handle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_command_is_reached_again_through_the_box_attached_anew() {
    let home = tempfile::tempdir().unwrap();
    let provider = local_provider(home.path(), true);
    let b = provider
        .create(&Spec::new(Duration::from_secs(300)), &Ctx::background())
        .await
        .unwrap();
    let r = call(
        &BoxEnv::new(b.clone()),
        "bash",
        json!({"command": "echo one; sleep 1; echo two; exec sleep 120", "background": true}),
    )
    .await;
    let handle = r.details["handle"].as_u64().unwrap_or_else(|| panic!("{}", r.text()));
    let again = provider
        .attach(b.id(), &Ctx::background())
        .await
        .unwrap()
        .expect("the box is there");
    let env = BoxEnv::new(again);
    let listed = ok(&call(&env, "process_list", json!({})).await);
    assert!(listed.contains("echo one; sleep 1; echo two"), "{listed}");
    let seen = read_until(&env, handle, |all, _| all.contains("two")).await;
    assert!(seen.contains("one\n"), "{seen}");
    ok(&call(&env, "process_kill", json!({"handle": handle, "signal": "KILL"})).await);
    let seen = read_until(&env, handle, |_, r| !r.details["exit"].is_null()).await;
    assert!(seen.contains("was ended by SIGKILL (exit code 137)"), "{seen}");
    b.destroy(&Ctx::background()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_local_box_with_a_runner_the_timeout_ends_a_background_command() {
    let (_home, b) = local_box(true).await;
    let env = BoxEnv::new(b.clone());
    let t0 = std::time::Instant::now();
    let r = call(
        &env,
        "bash",
        json!({"command": "echo up; sleep 60", "background": true, "timeout": 1}),
    )
    .await;
    assert!(t0.elapsed() < Duration::from_secs(10), "answered at once");
    let handle = r.details["handle"].as_u64().unwrap_or_else(|| panic!("{}", r.text()));
    let seen = read_until(&env, handle, |_, r| !r.details["exit"].is_null()).await;
    assert!(
        seen.contains("up\n") && seen.contains("timed out and was killed"),
        "{seen}"
    );
    // Its stdin closed, a `cat` ends.
    let r = call(&env, "bash", json!({"command": "cat; echo eof", "background": true})).await;
    let handle = r.details["handle"].as_u64().unwrap();
    ok(&call(
        &env,
        "process_write",
        json!({"handle": handle, "text": "line\n", "close": true}),
    )
    .await);
    let seen = read_until(&env, handle, |_, r| !r.details["exit"].is_null()).await;
    assert!(
        seen.contains("line\neof\n") && seen.contains("exited with code 0"),
        "{seen}"
    );
    b.destroy(&Ctx::background()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_local_box_without_a_runner_the_tools_refuse_saying_why() {
    let (_home, b) = local_box(false).await;
    let env = BoxEnv::new(b.clone());
    let why = format!(
        "box {} has no runner, so it keeps no processes: a command lives only as long as the call that started it",
        b.id()
    );
    refused_everywhere(&env, &why).await;
    b.destroy(&Ctx::background()).await.unwrap();
}

//! Faults on agentbox's own processes and on the clock: the process making a box or running
//! a pull SIGKILLed, `agentbox serve` SIGKILLed under streaming clients, a box's deadline
//! edited, and the host's wall clock jumping under a box's supervisor.
//!
//! Each family drives the CLI as separate processes, as a user (or a crash) meets it: an
//! `AGENTBOX_HOME` of its own, every process waited for within a deadline, and the boxes it
//! made read from outside (a new process's `box ls`, the provider's directory, the processes
//! left on this machine) once, after the lifetime of the last box it made has passed.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use base64::Engine;
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use super::{BIN, CALL_DEADLINE, HUNG_AFTER, LIFETIME, Outcome, Report, Rng, guard, kill9, pids_with};

const MAKER: &str = "maker killed";
const PULLER: &str = "puller killed";
const SERVE: &str = "serve killed mid-stream";
const BACK: &str = "deadline edited back";
const FORWARD: &str = "deadline edited forward";

/// Past a box's lifetime, how long its supervisor may take to end its programs and remove it.
const END_MARGIN: Duration = Duration::from_secs(5);

/// How a child process ended, and what it printed.
struct Ended {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// The round SIGKILLed it: it had not ended by the fault's point.
    killed: bool,
}

impl Ended {
    fn ok(&self) -> bool {
        self.status.success()
    }

    fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.stdout).ok()
    }

    /// How it failed, for a message: its exit and its one line of error.
    fn why(&self) -> String {
        format!(
            "exit {:?}: {}",
            self.status.code(),
            String::from_utf8_lossy(&self.stderr).trim()
        )
    }

    /// It panicked (a Rust panic exits 101 and says so on stderr), rather than answering.
    fn panicked(&self) -> bool {
        self.status.code() == Some(101) || String::from_utf8_lossy(&self.stderr).contains("panicked")
    }
}

/// The CLI with its home at `home`, and no provider or log filter taken from this environment.
fn cli(home: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("AGENTBOX_HOME", home)
        .env_remove("AGENTBOX_PROVIDER")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// `--lifetime` of every box the families make.
fn lifetime() -> String {
    format!("{}ms", LIFETIME.as_millis())
}

/// A pipe's bytes, read on a thread of its own, so neither pipe fills while the process is
/// waited for.
fn drain(pipe: Option<impl Read + Send + 'static>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    if let Some(mut pipe) = pipe {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
    }
    rx
}

/// Run `cmd`, SIGKILLed at the fault's point: the first time `point` (asked every
/// millisecond or so, with the time since the start) says it has come, if it has not ended by
/// then. Never waited for past [`HUNG_AFTER`] (then killed, and counted hung).
fn run_until(mut cmd: Command, what: &str, point: &mut dyn FnMut(Duration) -> bool) -> Result<Ended, Outcome> {
    let t0 = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| Outcome::Lost(format!("{what}: {BIN} did not start: {e}")))?;
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let mut killed = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => {}
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Outcome::Lost(format!("{what}: waiting for it failed: {e}")));
            }
        }
        if !killed && point(t0.elapsed()) {
            let _ = child.kill();
            killed = true;
        }
        if t0.elapsed() > HUNG_AFTER {
            let _ = child.kill();
            // SIGKILLed: its end is the kernel's, not its own.
            let _ = child.wait();
            return Err(Outcome::Hung(format!(
                "{what} did not end within {}s",
                HUNG_AFTER.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    // The pipes end with the process, unless a process it left behind holds them open.
    let collect = |rx: mpsc::Receiver<Vec<u8>>, which: &str| match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(b) => Ok(b),
        Err(mpsc::RecvTimeoutError::Disconnected) => Ok(Vec::new()),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(Outcome::Hung(format!(
            "{what} ended, but its {which} stayed open: a process it left holds it"
        ))),
    };
    Ok(Ended {
        status,
        stdout: collect(out, "stdout")?,
        stderr: collect(err, "stderr")?,
        killed,
    })
}

fn run(cmd: Command, what: &str) -> Result<Ended, Outcome> {
    run_until(cmd, what, &mut |_| false)
}

/// [`run`] off the runtime's threads.
async fn run_async(cmd: Command, what: &str) -> Result<Ended, Outcome> {
    let w = what.to_string();
    tokio::task::spawn_blocking(move || run(cmd, &w))
        .await
        .unwrap_or_else(|e| Err(Outcome::Lost(format!("{what}: its thread failed: {e}"))))
}

fn sleep_until(t: Instant) {
    if let Some(d) = t.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

/// `box create` of a local box with the families' lifetime, its answer as JSON.
fn create_cmd(home: &Path) -> Command {
    cli(
        home,
        &[
            "box",
            "create",
            "--provider",
            "local",
            "--lifetime",
            &lifetime(),
            "--json",
        ],
    )
}

/// A local box made by `box create` in a new process: its id and its workspace.
fn create(home: &Path, what: &str) -> Result<(String, PathBuf), Outcome> {
    let made = run(create_cmd(home), what)?;
    if !made.ok() {
        return Err(Outcome::Lost(format!("{what} failed: {}", made.why())));
    }
    let v = made.json().unwrap_or_default();
    match (v["id"].as_str(), v["facts"]["workspace"].as_str()) {
        (Some(id), Some(ws)) => Ok((id.to_string(), PathBuf::from(ws))),
        _ => Err(Outcome::Lost(format!(
            "{what} printed no id and workspace: {:?}",
            String::from_utf8_lossy(&made.stdout)
        ))),
    }
}

/// A new box made, and a command run in it: the operation after a fault.
fn create_and_use(home: &Path, what: &str) -> Result<String, Outcome> {
    let (id, _) = create(home, what)?;
    let ran = run(
        cli(home, &["box", "exec", &id, "--", "sh", "-c", "echo ok"]),
        "an exec in the new box",
    )?;
    if !ran.ok() || ran.stdout != b"ok\n" {
        return Err(Outcome::Lost(format!(
            "{what}: a command in {id} answered {:?} ({})",
            String::from_utf8_lossy(&ran.stdout),
            ran.why()
        )));
    }
    Ok(id)
}

/// The ids `box ls --provider local`, in a new process, lists.
fn listed(home: &Path, what: &str) -> Result<Vec<String>, Outcome> {
    let ls = run(cli(home, &["box", "ls", "--provider", "local", "--json"]), what)?;
    if !ls.ok() || ls.panicked() {
        return Err(Outcome::Lost(format!("{what} failed: {}", ls.why())));
    }
    match ls.json() {
        Some(Value::Array(rows)) => Ok(rows
            .iter()
            .filter_map(|r| r["id"].as_str().map(str::to_string))
            .collect()),
        _ => Err(Outcome::Lost(format!(
            "{what} printed no JSON list: {:?}",
            String::from_utf8_lossy(&ls.stdout)
        ))),
    }
}

/// A box found alive from outside: its name (the directory's, the id's after `local:`) where
/// known, and all that was found of it.
struct Alive {
    name: Option<String>,
    what: String,
}

/// The boxes of `home` alive now, seen from outside, one entry a box: listed by a new
/// process's `box ls`, a process on this machine running in its directory (a supervisor, a
/// runner, a program), its directory still holding a record or a supervisor's socket. The
/// processes found are SIGKILLed once counted, so nothing is left to the next family. A
/// directory of a box whose make died before its record (no record, no socket, no process) is
/// no box: the provider sweeps it once it is old.
fn alive(home: &Path) -> Result<Vec<Alive>, Outcome> {
    let boxes = home.join("boxes");
    let mut found: BTreeMap<Option<String>, Vec<String>> = BTreeMap::new();
    for id in listed(home, "box ls past the lifetime")? {
        let name = id.strip_prefix("local:").map(str::to_string);
        found.entry(name).or_default().push(format!("box {id} listed"));
    }
    let prefix = format!("{}/", boxes.to_string_lossy());
    for pid in pids_with(&prefix) {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .unwrap_or_default();
        let name = cmdline
            .split_once(&prefix)
            .map(|(_, rest)| rest.split(['/', ' ']).next().unwrap_or_default().to_string());
        found
            .entry(name)
            .or_default()
            .push(format!("process {pid} running ({})", cmdline.trim()));
        kill9(pid);
    }
    for entry in std::fs::read_dir(&boxes).into_iter().flatten().flatten() {
        let dir = entry.path();
        let kept: Vec<&str> = ["record.json", "supervisor.sock"]
            .into_iter()
            .filter(|f| dir.join(f).exists())
            .collect();
        if !kept.is_empty() {
            let name = entry.file_name().to_string_lossy().into_owned();
            found
                .entry(Some(name))
                .or_default()
                .push(format!("its directory holding {}", kept.join(", ")));
        }
    }
    Ok(found
        .into_iter()
        .map(|(name, seen)| Alive {
            what: format!(
                "box {} alive past its lifetime: {}",
                name.as_deref().unwrap_or("(unnamed)"),
                seen.join("; ")
            ),
            name,
        })
        .collect())
}

/// The process making a box, or running a pull, SIGKILLed at a seeded point; the same
/// operation then run again by a new process.
pub(super) fn maker_faults(report: &mut Report, rounds: u64, rng: &mut Rng) {
    let (Ok(maker), Ok(puller)) = (tempfile::tempdir(), tempfile::tempdir()) else {
        report.add(
            MAKER,
            "local",
            Outcome::Lost("no temporary directory for the homes".into()),
        );
        return;
    };
    let mut last_made = Instant::now();
    maker_rounds(report, rounds, rng, maker.path(), &mut last_made);
    puller_rounds(report, rounds, rng, puller.path(), &mut last_made);
    // Once for the family: past the lifetime of the last box it made, none is alive.
    sleep_until(last_made + LIFETIME + END_MARGIN);
    for (row, home) in [(MAKER, maker.path()), (PULLER, puller.path())] {
        match alive(home) {
            Ok(found) => {
                for a in found {
                    report.leaked(row, "local", a.what);
                }
            }
            Err(o) => report.add(row, "local", o),
        }
    }
}

/// The names in `dir` (none when it is missing).
fn names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// `box create` SIGKILLed at a drawn point of its make: a drawn time within what a whole one
/// takes here, or the moment its directory, its supervisor's socket or its record appears
/// (each step of a make a crash can fall between); then a list and a new create (and a
/// command in it) by new processes must work.
fn maker_rounds(report: &mut Report, rounds: u64, rng: &mut Rng, home: &Path, last_made: &mut Instant) {
    // How long a whole create takes on this machine now, for the drawn times.
    let t0 = Instant::now();
    let whole = match create(home, "a create with no fault") {
        Ok(_) => t0.elapsed(),
        Err(o) => {
            report.add(MAKER, "local", o);
            return;
        }
    };
    *last_made = Instant::now();
    let boxes = home.join("boxes");
    for _ in 0..rounds {
        let before = names(&boxes);
        let at = Duration::from_millis(rng.below(whole.as_millis() as u64 + 1));
        // 0: the drawn time; 1, 2, 3: the new box's directory, its socket, its record.
        let step = rng.below(4);
        let mut point = |since: Duration| {
            if step == 0 {
                return since >= at;
            }
            let file = ["", "", "supervisor.sock", "record.json"][step as usize];
            names(&boxes)
                .iter()
                .any(|n| !before.contains(n) && boxes.join(n).join(file).exists())
        };
        let cmd = create_cmd(home);
        let outcome = match run_until(cmd, "the create that is killed", &mut point) {
            Err(o) => o,
            Ok(first) if !first.killed && !first.ok() => {
                Outcome::Lost(format!("the create ended before its fault, failing: {}", first.why()))
            }
            Ok(first) => {
                *last_made = Instant::now();
                // What the killed process left must not break a list, nor the next make.
                let next = listed(home, "box ls after the kill")
                    .and_then(|_| create_and_use(home, "the create after the kill"));
                *last_made = Instant::now();
                match next {
                    Ok(_) if !first.killed => Outcome::Missed("the create ended before its kill point".into()),
                    Ok(_) => Outcome::Survived,
                    Err(o) => o,
                }
            }
        };
        report.add(MAKER, "local", outcome);
    }
}

/// The files of a pull's box: each name, and its bytes in the first version and the next.
struct Files(Vec<(String, Vec<u8>, Vec<u8>)>);

impl Files {
    /// About 8 MiB: 24 files of 256 KiB and one of 2 MiB two directories down; each file's
    /// next version is other bytes and a few more of them, so a part of either is neither.
    fn new(seed: u64) -> Files {
        let bytes = |seed: u64, n: usize| -> Vec<u8> {
            let mut x = seed | 1;
            (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        };
        let mut files: Vec<(String, usize)> = (0..24).map(|i| (format!("f{i:02}.bin"), 256 << 10)).collect();
        files.push(("deep/er/big.bin".into(), 2 << 20));
        Files(
            files
                .into_iter()
                .enumerate()
                .map(|(i, (name, n))| {
                    let s = seed.wrapping_add(i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    (name, bytes(s, n), bytes(!s, n + 4099))
                })
                .collect(),
        )
    }

    /// Write version `next` (or the first) of every file into `dir`.
    fn write(&self, dir: &Path, next: bool) -> std::io::Result<()> {
        for (name, first, second) in &self.0 {
            let path = dir.join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(path, if next { second } else { first })?;
        }
        Ok(())
    }

    /// How many files of `dir` are their next version, by their size (a file is renamed into
    /// place whole: what is there at its name is one version or the other).
    fn placed(&self, dir: &Path) -> usize {
        self.0
            .iter()
            .filter(|(name, _, second)| std::fs::metadata(dir.join(name)).is_ok_and(|m| m.len() == second.len() as u64))
            .count()
    }

    /// A file of `dir` is being written: a temporary file beside the files, with bytes in it.
    fn part_written(&self, dir: &Path) -> bool {
        let mut dirs: Vec<PathBuf> = self
            .0
            .iter()
            .filter_map(|(name, ..)| dir.join(name).parent().map(Path::to_path_buf))
            .collect();
        dirs.sort();
        dirs.dedup();
        dirs.iter().any(|d| {
            std::fs::read_dir(d).into_iter().flatten().flatten().any(|e| {
                !self.0.iter().any(|(f, ..)| dir.join(f) == e.path())
                    && e.metadata().is_ok_and(|m| m.is_file() && m.len() > 0)
            })
        })
    }

    /// The first file of `dir` that is not its version `next` whole: its name and size.
    fn not_whole(&self, dir: &Path, next: bool) -> Option<(String, Option<usize>)> {
        self.0.iter().find_map(|(name, first, second)| {
            let want = if next { second } else { first };
            match std::fs::read(dir.join(name)) {
                Ok(got) if got == *want => None,
                Ok(got) => Some((name.clone(), Some(got.len()))),
                Err(_) => Some((name.clone(), None)),
            }
        })
    }
}

/// Every regular file under `dir`, relative to it.
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => {
                    if let Ok(rel) = e.path().strip_prefix(dir) {
                        out.push(rel.to_string_lossy().into_owned());
                    }
                }
                _ => {}
            }
        }
    }
    out.sort();
    out
}

/// `sync pull` SIGKILLed mid-way through bringing a box's changed files over the ones an
/// earlier pull brought: each file here is the old one or the new one whole, and the pull
/// run again by a new process brings every one.
fn puller_rounds(report: &mut Report, rounds: u64, rng: &mut Rng, home: &Path, last_made: &mut Instant) {
    // How long a whole pull takes here, from the first round's pull with no fault.
    let mut whole: Option<Duration> = None;
    for round in 0..rounds {
        let outcome = match puller_round(home, round, rng, &mut whole, last_made) {
            Ok(true) => Outcome::Survived,
            Ok(false) => Outcome::Missed("the pull ended before its kill point".into()),
            Err(o) => o,
        };
        report.add(PULLER, "local", outcome);
    }
}

fn puller_round(
    home: &Path,
    round: u64,
    rng: &mut Rng,
    whole: &mut Option<Duration>,
    last_made: &mut Instant,
) -> Result<bool, Outcome> {
    let (id, ws) = create(home, "the pull's box")?;
    *last_made = Instant::now();
    let files = Files::new(rng.next());
    files
        .write(&ws, false)
        .map_err(|e| Outcome::Lost(format!("writing the box's files in {}: {e}", ws.display())))?;
    let to = home.join("host").join(round.to_string());
    let to_arg = to.to_string_lossy().into_owned();
    let pull = || cli(home, &["sync", "pull", &id, "--from", ".", "--to", &to_arg]);

    // The first pull, with no fault: it brings the first version and keeps the mark.
    let t0 = Instant::now();
    let first = run(pull(), "the first pull")?;
    let took = t0.elapsed();
    if !first.ok() {
        return Err(Outcome::Lost(format!(
            "the first pull (no fault yet) failed: {}",
            first.why()
        )));
    }
    if let Some((name, len)) = files.not_whole(&to, false) {
        return Err(Outcome::Lost(format!(
            "the first pull (no fault yet) left {name} at {len:?} bytes"
        )));
    }
    let whole = *whole.get_or_insert(took);

    // The box changes every file; the pull that brings them is killed at a drawn point.
    files
        .write(&ws, true)
        .map_err(|e| Outcome::Lost(format!("changing the box's files in {}: {e}", ws.display())))?;
    // The point: a drawn time within what a whole pull takes here; or once a drawn number of
    // the new files are in place; or while a file is part written (under its temporary name).
    let at = Duration::from_millis(rng.below(whole.as_millis() as u64 + 1));
    let step = rng.below(3);
    let placed = 1 + rng.below(files.0.len() as u64 - 1) as usize;
    let mut point = |since: Duration| match step {
        0 => since >= at,
        1 => files.placed(&to) >= placed,
        _ => files.part_written(&to),
    };
    let killed = run_until(pull(), "the pull that is killed", &mut point)?.killed;
    for (name, first, second) in &files.0 {
        match std::fs::read(to.join(name)) {
            Ok(got) if got == *first || got == *second => {}
            Ok(got) => {
                return Err(Outcome::Lost(format!(
                    "{name} is {} bytes after the killed pull: neither the old ({}) nor the new ({}) whole",
                    got.len(),
                    first.len(),
                    second.len()
                )));
            }
            Err(e) => {
                return Err(Outcome::Lost(format!(
                    "{name}, brought whole by the first pull, is gone after the killed pull: {e}"
                )));
            }
        }
    }

    // The pull again, by a new process: every file, new and whole.
    let again = run(pull(), "the pull after the kill")?;
    if !again.ok() {
        return Err(Outcome::Lost(format!(
            "the pull after the kill failed: {}",
            again.why()
        )));
    }
    if let Some((name, len)) = files.not_whole(&to, true) {
        return Err(Outcome::Lost(format!(
            "after the pull again, {name} is {len:?} bytes, not the box's {} whole",
            files.0.iter().find(|f| f.0 == name).map_or(0, |f| f.2.len())
        )));
    }
    // Nothing changed here: a file the pull says it left "as it is here" is one it did not
    // bring, and will not bring when the box changes it again (until --force).
    let report = again.json().unwrap_or_default();
    let left: Vec<&str> = report["host_changed"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if !left.is_empty() {
        return Err(Outcome::Lost(format!(
            "the pull again left {} of the {} files as \"changed here since the last pull\" (first: {}), which \
             no one here changed: the killed pull wrote them and kept no mark of it",
            left.len(),
            files.0.len(),
            left[0]
        )));
    }
    let strays: Vec<String> = files_under(&to)
        .into_iter()
        .filter(|f| !files.0.iter().any(|(name, ..)| name == f))
        .collect();
    if !strays.is_empty() {
        eprintln!(
            "faults: {PULLER}: the killed pull left {} file(s) no pull removes: {strays:?}",
            strays.len()
        );
    }
    Ok(killed)
}

/// A running `agentbox serve`, SIGKILLed when dropped.
struct Served {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    url: String,
    /// Its stderr's last lines, for a message.
    log: Arc<Mutex<VecDeque<String>>>,
}

impl Served {
    /// `agentbox serve --provider local` on `listen`, with its state in `home`, once it says
    /// where it serves.
    async fn start(home: &Path, listen: &str) -> Result<Served, String> {
        let mut child = Command::new(BIN)
            .args(["serve", "--provider", "local", "--listen", listen])
            .env("AGENTBOX_HOME", home)
            .env_remove("AGENTBOX_PROVIDER")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{BIN} serve did not start: {e}"))?;
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, rx) = tokio::sync::oneshot::channel();
        if let Some(stderr) = child.stderr.take() {
            let log = log.clone();
            // Read to its end, so the access log never fills the pipe and holds the server.
            std::thread::spawn(move || {
                let mut tx = Some(tx);
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Some(url) = line.split_once("serving on ").map(|(_, u)| u.trim().to_string())
                        && let Some(tx) = tx.take()
                    {
                        let _ = tx.send(url);
                    }
                    let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
                    log.push_back(line);
                    if log.len() > 30 {
                        log.pop_front();
                    }
                }
            });
        }
        let mut served = Served {
            child,
            url: String::new(),
            log,
        };
        match tokio::time::timeout(CALL_DEADLINE, rx).await {
            Ok(Ok(url)) => {
                served.url = url;
                Ok(served)
            }
            _ => {
                served.kill().await;
                Err(format!(
                    "serve on {listen} did not say where it serves within {}s: {}",
                    CALL_DEADLINE.as_secs(),
                    served.log()
                ))
            }
        }
    }

    /// The address it listens on, for the next server to listen on too.
    fn addr(&self) -> &str {
        self.url.trim_start_matches("http://")
    }

    fn log(&self) -> String {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.iter().cloned().collect::<Vec<_>>().join(" | ")
    }

    /// SIGKILL, and reap it.
    async fn kill(&mut self) {
        kill9(self.child.id() as i32);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client of the service over plain HTTP on loopback, with no deadline of its own: a call
/// that does not come back is caught by the round's.
fn client() -> Result<reqwest::Client, String> {
    // Plain HTTP: TLS is configured only because the client must have it.
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .no_proxy()
        .build()
        .map_err(|e| format!("an HTTP client: {e}"))
}

/// `method path` with `body` and the key: the status and the JSON answer (null for none).
async fn call(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> Result<(u16, Value), String> {
    let mut r = http.request(method, format!("{url}{path}")).bearer_auth(key);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let answer = r.send().await.map_err(|e| format!("{path}: {e}"))?;
    let status = answer.status().as_u16();
    let text = answer.text().await.map_err(|e| format!("{path}: {e}"))?;
    Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
}

/// A program that prints `1`, `2`, `3`... a line each, about 500 a second, until its box ends.
const COUNTER: &str = "i=0; while [ $i -lt 10000000 ]; do i=$((i+1)); echo $i; case $i in *0) sleep 0.02;; esac; done";

/// What a reader of the program's output has been given so far.
#[derive(Default)]
struct Seen {
    bytes: Vec<u8>,
    /// The number of the next byte it waits for.
    cursor: u64,
}

/// The numbered lines of `text` go on one by one from `1`: nothing repeated, nothing skipped
/// (the last line may be cut).
fn counts_on(text: &[u8]) -> Result<(), String> {
    let text = String::from_utf8_lossy(text);
    let mut lines = text.split('\n').peekable();
    let mut want = 1u64;
    while let Some(line) = lines.next() {
        if lines.peek().is_none() {
            break;
        }
        if line != want.to_string() {
            return Err(format!("line {want} of the output reads {line:?}"));
        }
        want += 1;
    }
    Ok(())
}

/// A WebSocket to `path` of the service at `url`, with the key.
async fn ws_connect(
    url: &str,
    key: &str,
    path: &str,
) -> Result<tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>, String> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let host = url.trim_start_matches("http://");
    let mut req = format!("ws://{host}{path}")
        .into_client_request()
        .map_err(|e| format!("a WebSocket request for {path}: {e}"))?;
    let auth = format!("Bearer {key}")
        .parse()
        .map_err(|e| format!("the key as a header: {e}"))?;
    req.headers_mut().insert("authorization", auth);
    let tcp = tokio::net::TcpStream::connect(host)
        .await
        .map_err(|e| format!("connecting to {host}: {e}"))?;
    let (ws, _) = tokio_tungstenite::client_async(req, tcp)
        .await
        .map_err(|e| format!("the WebSocket upgrade of {path}: {e}"))?;
    Ok(ws)
}

/// How one frame of a stream read: bytes at a number, a gap, or its end.
enum Frame {
    Output(u64, Vec<u8>),
    Gap(u64, u64),
    /// The stream ended: a close, an error frame, a broken connection.
    End(String),
}

async fn next_frame(ws: &mut tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>) -> Result<Frame, String> {
    loop {
        let m = match ws.next().await {
            None => return Ok(Frame::End("the connection ended".into())),
            Some(Err(e)) => return Ok(Frame::End(format!("an error: {e}"))),
            Some(Ok(Message::Close(c))) => return Ok(Frame::End(format!("a close: {c:?}"))),
            Some(Ok(Message::Text(t))) => t,
            Some(Ok(_)) => continue,
        };
        let v: Value = serde_json::from_str(&m).map_err(|e| format!("a frame that is not JSON ({e}): {m}"))?;
        return match v["type"].as_str() {
            Some("output") => {
                let data = base64::engine::general_purpose::STANDARD
                    .decode(v["data"].as_str().unwrap_or_default())
                    .map_err(|e| format!("an output frame whose data is not base64 ({e}): {m}"))?;
                Ok(Frame::Output(v["seq"].as_u64().unwrap_or(u64::MAX), data))
            }
            Some("gap") => Ok(Frame::Gap(
                v["from"].as_u64().unwrap_or_default(),
                v["to"].as_u64().unwrap_or_default(),
            )),
            Some("exit") => Err(format!("the stream said the program ended, which runs on: {m}")),
            Some("error") => Ok(Frame::End(format!("an error frame: {m}"))),
            _ => continue,
        };
    }
}

/// A client streaming the program's output over a WebSocket from byte 0, until the stream
/// ends: how it ended, or what it was told wrongly.
async fn ws_client(url: String, key: String, path: String, seen: Arc<Mutex<Seen>>) -> Result<String, String> {
    let mut ws = ws_connect(&url, &key, &format!("{path}/stream?after=0")).await?;
    loop {
        match next_frame(&mut ws).await? {
            Frame::Output(seq, data) => {
                let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
                if seq != s.cursor {
                    return Err(format!("output from byte {seq}, the stream being at byte {}", s.cursor));
                }
                s.cursor += data.len() as u64;
                s.bytes.extend_from_slice(&data);
            }
            Frame::Gap(from, to) => return Err(format!("a gap of bytes {from}..{to} in a short output")),
            Frame::End(how) => return Ok(how),
        }
    }
}

/// A client reading the program's output by long polls from byte 0, until a read fails: how
/// it ended, or what it was told wrongly.
async fn poll_client(http: reqwest::Client, url: String, key: String, path: String) -> Result<String, String> {
    let mut seen = Vec::new();
    let mut after = 0u64;
    loop {
        let read = format!("{path}/output?after={after}&wait_ms=2000");
        let answer = match http.get(format!("{url}{read}")).bearer_auth(&key).send().await {
            Ok(a) => a,
            Err(e) => return counts_on(&seen).map(|_| format!("a read failed: {e}")),
        };
        let status = answer.status();
        let body = match answer.text().await {
            Ok(b) => b,
            Err(e) => return counts_on(&seen).map(|_| format!("a read's body failed: {e}")),
        };
        if !status.is_success() {
            return counts_on(&seen).map(|_| format!("a read answered {status}: {body}"));
        }
        let v: Value =
            serde_json::from_str(&body).map_err(|e| format!("a read answered what is not JSON ({e}): {body:.200}"))?;
        if let Some(from) = v["gap_from"].as_u64() {
            return Err(format!("a gap from byte {after} to {from} in a short output"));
        }
        if !v["exit"].is_null() {
            return Err(format!("a read said the program ended, which runs on: {body:.300}"));
        }
        for c in v["chunks"].as_array().into_iter().flatten() {
            let data = base64::engine::general_purpose::STANDARD
                .decode(c["data"].as_str().unwrap_or_default())
                .map_err(|e| format!("a chunk whose data is not base64: {e}"))?;
            // Bytes are numbered from the program's start: each chunk goes on where the last ended.
            if c["seq"].as_u64() != Some(seen.len() as u64) {
                return Err(format!(
                    "a chunk from byte {}, the reader being at {}",
                    c["seq"],
                    seen.len()
                ));
            }
            seen.extend_from_slice(&data);
        }
        after = v["next"]
            .as_u64()
            .ok_or_else(|| format!("a read with no next: {body:.200}"))?;
    }
}

/// `agentbox serve` SIGKILLed while clients stream, and started again.
pub(super) async fn serve_faults(report: &mut Report, rounds: u64, rng: &mut Rng) {
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            report.add(SERVE, "serve", Outcome::Lost(format!("no temporary directory: {e}")));
            return;
        }
    };
    let home = dir.path().to_path_buf();
    let key = match run_async(
        cli(&home, &["serve", "keys", "add", "faults", "--providers", "local"]),
        "serve keys add",
    )
    .await
    {
        Ok(k) if k.ok() => String::from_utf8_lossy(&k.stdout).trim().to_string(),
        Ok(k) => {
            report.add(
                SERVE,
                "serve",
                Outcome::Lost(format!("serve keys add failed: {}", k.why())),
            );
            return;
        }
        Err(o) => {
            report.add(SERVE, "serve", o);
            return;
        }
    };
    let mut last_made = Instant::now();
    let mut served: Option<Served> = None;
    for _ in 0..rounds {
        if served.is_none() {
            match Served::start(&home, "127.0.0.1:0").await {
                Ok(s) => served = Some(s),
                Err(e) => {
                    report.add(SERVE, "serve", Outcome::Lost(e));
                    continue;
                }
            }
        }
        let Some(s) = served.take() else { continue };
        let (outcome, next) = serve_round(&home, s, &key, rng, &mut last_made).await;
        served = next;
        report.add(SERVE, "serve", outcome);
    }
    // The last server goes as the others did: its boxes are left to their lifetimes.
    drop(served);
    tokio::time::sleep_until((last_made + LIFETIME + END_MARGIN).into()).await;
    let h = home.clone();
    match tokio::task::spawn_blocking(move || alive(&h)).await {
        Ok(Ok(found)) => {
            for a in found {
                report.leaked(SERVE, "serve", a.what);
            }
        }
        Ok(Err(o)) => report.add(SERVE, "serve", o),
        Err(e) => report.add(
            SERVE,
            "serve",
            Outcome::Lost(format!("the check past the lifetime failed: {e}")),
        ),
    }
}

/// One round on the server `s`: a box and a counting program, three clients on it (a
/// WebSocket stream, long polls of its output, an exec in flight), the server SIGKILLed at a
/// drawn point, started again on the same address and home. Answers the round's outcome and
/// the server now running.
async fn serve_round(
    home: &Path,
    mut s: Served,
    key: &str,
    rng: &mut Rng,
    last_made: &mut Instant,
) -> (Outcome, Option<Served>) {
    let http = match client() {
        Ok(h) => h,
        Err(e) => return (Outcome::Lost(e), Some(s)),
    };
    let post = reqwest::Method::POST;
    let spec = json!({"provider": "local", "spec": {"max_lifetime_ms": LIFETIME.as_millis() as u64}});
    let made = guard(
        "a create",
        call(&http, &s.url, key, post.clone(), "/v1/boxes", Some(spec.clone())),
    )
    .await;
    *last_made = Instant::now();
    let id = match made {
        Ok(Ok((201, b))) => b["id"].as_str().unwrap_or_default().to_string(),
        Ok(Ok((st, b))) => return (Outcome::Lost(format!("a create answered {st}: {b}")), Some(s)),
        Ok(Err(e)) => return (Outcome::Lost(format!("a create failed: {e}")), Some(s)),
        Err(o) => return (o, Some(s)),
    };
    let started = guard(
        "a process's start",
        call(
            &http,
            &s.url,
            key,
            post.clone(),
            &format!("/v1/boxes/{id}/processes"),
            Some(json!({"command": COUNTER})),
        ),
    )
    .await;
    let handle = match started {
        Ok(Ok((201, b))) if b["handle"].is_u64() => b["handle"].as_u64().unwrap_or_default(),
        Ok(Ok((st, b))) => return (Outcome::Lost(format!("a process's start answered {st}: {b}")), Some(s)),
        Ok(Err(e)) => return (Outcome::Lost(format!("a process's start failed: {e}")), Some(s)),
        Err(o) => return (o, Some(s)),
    };
    let path = format!("/v1/boxes/{id}/processes/{handle}");

    // The clients, each on its own task.
    let seen = Arc::new(Mutex::new(Seen::default()));
    let clients: Vec<(&str, tokio::task::JoinHandle<Result<String, String>>)> = vec![
        (
            "WebSocket stream",
            tokio::spawn(ws_client(s.url.clone(), key.to_string(), path.clone(), seen.clone())),
        ),
        (
            "long-poll reader",
            tokio::spawn(poll_client(http.clone(), s.url.clone(), key.to_string(), path.clone())),
        ),
        ("exec in flight", {
            let (http, url, key, id) = (http.clone(), s.url.clone(), key.to_string(), id.clone());
            tokio::spawn(async move {
                let body = json!({"command": "sleep 8; echo late"});
                match call(
                    &http,
                    &url,
                    &key,
                    reqwest::Method::POST,
                    &format!("/v1/boxes/{id}/exec"),
                    Some(body),
                )
                .await
                {
                    Err(e) => Ok(format!("failed: {e}")),
                    Ok((200, b)) => Err(format!("answered a whole run from a killed server: {b}")),
                    Ok((st, b)) => Ok(format!("answered {st}: {b}")),
                }
            })
        }),
    ];
    // The kill, at a drawn point once the stream has output.
    let t0 = Instant::now();
    while seen.lock().unwrap_or_else(|p| p.into_inner()).cursor == 0 {
        if t0.elapsed() > CALL_DEADLINE {
            for (_, c) in &clients {
                c.abort();
            }
            return (
                Outcome::Lost(format!(
                    "no output reached the stream within {}s: {}",
                    CALL_DEADLINE.as_secs(),
                    s.log()
                )),
                Some(s),
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(rng.below(1500))).await;
    s.kill().await;
    let killed = tokio::time::Instant::now();

    // Every client's call ends, typed, soon after: none waits on a server that is gone.
    let mut outcome = None;
    for (name, mut c) in clients {
        match tokio::time::timeout_at(killed + HUNG_AFTER, &mut c).await {
            Err(_) => {
                c.abort();
                outcome.get_or_insert(Outcome::Hung(format!(
                    "the {name} client did not end within {}s of the server's kill",
                    HUNG_AFTER.as_secs()
                )));
            }
            Ok(Err(e)) => {
                outcome.get_or_insert(Outcome::Lost(format!("the {name} client failed: {e}")));
            }
            Ok(Ok(Err(wrong))) => {
                outcome.get_or_insert(Outcome::Lost(format!("the {name} client: {wrong}")));
            }
            Ok(Ok(Ok(_how))) => {}
        }
    }
    let before = {
        let s = seen.lock().unwrap_or_else(|p| p.into_inner());
        (s.bytes.clone(), s.cursor)
    };
    if let Err(e) = counts_on(&before.0) {
        outcome.get_or_insert(Outcome::Lost(format!("the stream before the kill: {e}")));
    }

    // Started again on the same address and state.
    let addr = s.addr().to_string();
    drop(s);
    let again = match Served::start(home, &addr).await {
        Ok(a) => a,
        Err(e) => return (Outcome::Lost(format!("serve did not start again: {e}")), None),
    };
    if let Some(o) = outcome {
        return (o, Some(again));
    }
    let after = match after_restart(&again, key, &id, &path, before, &spec).await {
        Ok(()) => Outcome::Survived,
        Err(o) => o,
    };
    (after, Some(again))
}

/// What a restarted server must answer: the key's box listed and running, the program's
/// output going on from the stream's cursor with nothing repeated or skipped, and a new box
/// made and used.
async fn after_restart(
    s: &Served,
    key: &str,
    id: &str,
    path: &str,
    (before, cursor): (Vec<u8>, u64),
    spec: &Value,
) -> Result<(), Outcome> {
    // A new client: the old one's connections were to the server that is gone.
    let http = client().map_err(Outcome::Lost)?;
    let get = reqwest::Method::GET;
    let lost = |what: &str, r: Result<(u16, Value), String>| match r {
        Ok((st, b)) => Outcome::Lost(format!("after the restart, {what} answered {st}: {b}")),
        Err(e) => Outcome::Lost(format!("after the restart, {what} failed: {e}")),
    };

    let list = guard(
        "the key's boxes",
        call(&http, &s.url, key, get.clone(), "/v1/boxes", None),
    )
    .await?;
    match &list {
        Ok((200, Value::Array(boxes))) if boxes.iter().any(|b| b["id"] == id) => {}
        _ => return Err(lost(&format!("the key's boxes (to hold {id})"), list)),
    }
    let one = guard(
        "the box",
        call(&http, &s.url, key, get, &format!("/v1/boxes/{id}"), None),
    )
    .await?;
    match &one {
        Ok((200, b)) if b["status"] == "running" => {}
        _ => return Err(lost(&format!("box {id} (running)"), one)),
    }

    // The stream again from its cursor: the program ran on, and the bytes go on from there.
    let more = guard("the stream again", async {
        let mut ws = ws_connect(&s.url, key, &format!("{path}/stream?after={cursor}")).await?;
        let mut got = Vec::new();
        let t0 = Instant::now();
        while got.iter().filter(|b| **b == b'\n').count() < 20 {
            if t0.elapsed() > CALL_DEADLINE {
                return Err(format!("{} bytes in {}s", got.len(), CALL_DEADLINE.as_secs()));
            }
            match next_frame(&mut ws).await? {
                Frame::Output(seq, data) if seq == cursor + got.len() as u64 => got.extend_from_slice(&data),
                Frame::Output(seq, _) => {
                    return Err(format!(
                        "output from byte {seq}, asked from {cursor} and {} read since",
                        got.len()
                    ));
                }
                Frame::Gap(from, to) => return Err(format!("a gap of bytes {from}..{to} in a short output")),
                Frame::End(how) => return Err(format!("the stream ended: {how}")),
            }
        }
        Ok(got)
    })
    .await?
    .map_err(|e| Outcome::Lost(format!("after the restart, the stream from byte {cursor}: {e}")))?;
    let mut all = before;
    all.extend_from_slice(&more);
    counts_on(&all).map_err(|e| Outcome::Lost(format!("across the restart, {e}")))?;

    // The next box, and a command in it.
    let made = guard(
        "a create",
        call(
            &http,
            &s.url,
            key,
            reqwest::Method::POST,
            "/v1/boxes",
            Some(spec.clone()),
        ),
    )
    .await?;
    let next = match &made {
        Ok((201, b)) => b["id"].as_str().unwrap_or_default().to_string(),
        _ => return Err(lost("a new box", made)),
    };
    let ran = guard(
        "an exec",
        call(
            &http,
            &s.url,
            key,
            reqwest::Method::POST,
            &format!("/v1/boxes/{next}/exec"),
            Some(json!({"command": "echo ok"})),
        ),
    )
    .await?;
    match &ran {
        Ok((200, b)) if b["stdout"] == "ok\n" => {}
        _ => return Err(lost(&format!("a command in the new box {next}"), ran)),
    }
    let gone = guard(
        "a delete",
        call(
            &http,
            &s.url,
            key,
            reqwest::Method::DELETE,
            &format!("/v1/boxes/{next}"),
            None,
        ),
    )
    .await?;
    match &gone {
        Ok((204, _)) => Ok(()),
        _ => Err(lost(&format!("the delete of {next}"), gone)),
    }
}

/// A box's deadline file edited back and forward.
pub(super) fn clock_faults(report: &mut Report, rounds: u64, rng: &mut Rng) {
    let home = match tempfile::tempdir() {
        Ok(h) => h,
        Err(e) => {
            report.add(BACK, "local", Outcome::Lost(format!("no temporary directory: {e}")));
            return;
        }
    };
    let home = home.path();
    // Every box the family made, by its name: its row, and the last deadline of any of them.
    let mut made: BTreeMap<String, &'static str> = BTreeMap::new();
    // The deadline each edited box's supervisor was given.
    let mut deadlines: Vec<u64> = Vec::new();
    let mut last_end_ms = agentbox_core::now_ms();
    for _ in 0..rounds {
        for row in [BACK, FORWARD] {
            let outcome = match clock_round(home, row, rng, &mut made, &mut deadlines) {
                Ok(()) => Outcome::Survived,
                Err(o) => o,
            };
            report.add(row, "local", outcome);
        }
        // The boxes made after the edits end by their lifetime too.
        last_end_ms = agentbox_core::now_ms() + LIFETIME.as_millis() as u64;
    }
    let last_end_ms = deadlines.iter().copied().fold(last_end_ms, u64::max);
    // Once for the family: past the real lifetime of every box, whatever its record says.
    let wait = last_end_ms.saturating_sub(agentbox_core::now_ms());
    std::thread::sleep(Duration::from_millis(wait) + END_MARGIN);
    match alive(home) {
        Ok(found) => {
            for a in found {
                let row = a.name.as_ref().and_then(|n| made.get(n)).copied().unwrap_or(BACK);
                report.leaked(row, "local", a.what);
            }
        }
        Err(o) => report.add(BACK, "local", o),
    }
}

/// A box made, a program left running in it, its record's deadline rewritten in place (back
/// into the past, or far ahead) by a process that is not agentbox; then a list, the box's
/// facts and a new box, each by a new process.
fn clock_round(
    home: &Path,
    row: &'static str,
    rng: &mut Rng,
    made: &mut BTreeMap<String, &'static str>,
    deadlines: &mut Vec<u64>,
) -> Result<(), Outcome> {
    let (id, ws) = create(home, "the box whose record is edited")?;
    let name = id.trim_start_matches("local:").to_string();
    made.insert(name.clone(), row);
    let Some(dir) = ws.parent().map(Path::to_path_buf) else {
        return Err(Outcome::Lost(format!(
            "box {id}: its workspace {} has no parent",
            ws.display()
        )));
    };
    // A program that runs until its box ends, its box's directory in its command line.
    let program = run(
        cli(
            home,
            &[
                "box",
                "exec",
                "--detach",
                &id,
                "--",
                "sh",
                "-c",
                "while :; do sleep 1; done",
                &dir.to_string_lossy(),
            ],
        ),
        "a program left running",
    )?;
    if !program.ok() {
        return Err(Outcome::Lost(format!(
            "box {id}: a detached program did not start: {}",
            program.why()
        )));
    }

    // The record edited in place, as a confused or hostile process writes it.
    let file = dir.join("record.json");
    let mut record: Value = std::fs::read(&file)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| Outcome::Lost(format!("box {id}: {} does not read as JSON", file.display())))?;
    let ends_at_ms = record["ends_at_ms"]
        .as_u64()
        .ok_or_else(|| Outcome::Lost(format!("box {id}: its record holds no ends_at_ms: {record}")))?;
    deadlines.push(ends_at_ms);
    let now = agentbox_core::now_ms();
    let created = record["created_at_ms"].as_u64().unwrap_or(now);
    let to = if row == BACK {
        [0, created, now.saturating_sub(1), now.saturating_sub(86_400_000)][rng.below(4) as usize]
    } else {
        let year = 365 * 86_400_000;
        [now + 30 * 86_400_000, now + 100 * year, i64::MAX as u64, u64::MAX][rng.below(4) as usize]
    };
    record["ends_at_ms"] = to.into();
    let bytes = serde_json::to_vec_pretty(&record).map_err(|e| Outcome::Lost(format!("the record as JSON: {e}")))?;
    std::fs::write(&file, bytes).map_err(|e| Outcome::Lost(format!("editing {}: {e}", file.display())))?;

    // Reads of the record: a list, and the box's facts, answer (a box, or that it has ended)
    // rather than fail or panic.
    listed(home, &format!("box ls with {id}'s deadline edited to {to}"))?;
    let facts = run(cli(home, &["box", "facts", &id]), "box facts")?;
    if facts.panicked() || !matches!(facts.status.code(), Some(0 | 1)) {
        return Err(Outcome::Lost(format!(
            "box facts {id} with its deadline edited to {to}: {}",
            facts.why()
        )));
    }

    // The next box works.
    let next = create_and_use(home, &format!("a create after {id}'s deadline was edited"))?;
    made.insert(next.trim_start_matches("local:").to_string(), row);
    Ok(())
}

const JUMPED_BACK: &str = "host clock jumped back";
const JUMPED_FORWARD: &str = "host clock jumped forward";

/// Debian's libfaketime (package `faketime`, which scripts/test installs).
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The host's wall clock jumping under a box's supervisor, the process that ends the box at
/// its lifetime: an hour or a day back, or forward, a drawn time into the box's life (as an
/// NTP step or a clock set by hand does). libfaketime, preloaded into the supervisor (the
/// dynamically linked runner beside the CLI), reads the jump from a file the round writes;
/// its monotonic clock is left as it is, as a real jump leaves it. The box must end by its
/// real lifetime, not an hour later; and a jump forward must not end it early.
pub(super) async fn host_clock_faults(report: &mut Report, rounds: u64, rng: &mut Rng) {
    let runner = Path::new(BIN).with_file_name("agentbox-runner");
    for (what, path) in [
        ("Debian's libfaketime", Path::new(FAKETIME)),
        ("the debug runner", &runner),
    ] {
        if !path.exists() {
            assert!(
                std::env::var_os("CI").is_none(),
                "the host clock faults need {what} at {} (scripts/test installs faketime and builds every binary)",
                path.display()
            );
            eprintln!(
                "\n!!!! faults: the host clock faults did NOT run: no {what} at {} !!!!\n",
                path.display()
            );
            return;
        }
    }
    let home = match tempfile::tempdir() {
        Ok(h) => h,
        Err(e) => {
            report.add(
                JUMPED_BACK,
                "local",
                Outcome::Lost(format!("no temporary directory: {e}")),
            );
            return;
        }
    };
    let home = home.path();
    let mut made: BTreeMap<String, &'static str> = BTreeMap::new();
    let mut n = 0;
    for _ in 0..rounds {
        for row in [JUMPED_BACK, JUMPED_FORWARD] {
            n += 1;
            let outcome = match jump_round(home, &runner, n, row, rng, &mut made).await {
                Ok(()) => Outcome::Survived,
                Err(o) => o,
            };
            report.add(row, "local", outcome);
        }
    }
    // Once for the family: past the real lifetime of the last box.
    tokio::time::sleep(LIFETIME + END_MARGIN).await;
    let found = tokio::task::block_in_place(|| alive(home));
    match found {
        Ok(found) => {
            for a in found {
                let row = a
                    .name
                    .as_ref()
                    .and_then(|n| made.get(n))
                    .copied()
                    .unwrap_or(JUMPED_BACK);
                report.leaked(row, "local", a.what);
            }
        }
        Err(o) => report.add(JUMPED_BACK, "local", o),
    }
}

/// A box whose supervisor's wall clock jumps a drawn time into its life.
async fn jump_round(
    home: &Path,
    runner: &Path,
    n: u32,
    row: &'static str,
    rng: &mut Rng,
    made: &mut BTreeMap<String, &'static str>,
) -> Result<(), Outcome> {
    let lost = |what: String| Outcome::Lost(what);
    let clock = home.join(format!("clock-{n}"));
    std::fs::write(&clock, "+0").map_err(|e| lost(format!("writing {}: {e}", clock.display())))?;
    let mut opts = agentbox_providers::LocalOptions::at(home).map_err(|e| lost(format!("the local options: {e}")))?;
    // The supervisor is started with an empty environment: `env` gives it libfaketime's.
    opts.supervisor = agentbox_providers::helper::HelperCommand {
        program: "/usr/bin/env".into(),
        args: vec![
            format!("LD_PRELOAD={FAKETIME}"),
            format!("FAKETIME_TIMESTAMP_FILE={}", clock.display()),
            "FAKETIME_NO_CACHE=1".into(),
            "DONT_FAKE_MONOTONIC=1".into(),
            runner.to_string_lossy().into_owned(),
        ],
    };
    let p = agentbox_providers::LocalProvider::new(opts).map_err(|e| lost(format!("the local provider: {e}")))?;
    let ctx = agentbox_core::Ctx::background().with_timeout(CALL_DEADLINE);
    let b = guard(
        "create",
        agentbox_core::Provider::create(&p, &agentbox_core::Spec::new(LIFETIME), &ctx),
    )
    .await?
    .map_err(|e| lost(format!("a create with no fault failed: {e}")))?;
    made.insert(b.id().name().to_string(), row);
    let jump = if row == JUMPED_BACK {
        ["-1h", "-1d"][rng.below(2) as usize]
    } else {
        ["+1h", "+1d"][rng.below(2) as usize]
    };
    tokio::time::sleep(Duration::from_millis(200 + rng.below(2000))).await;
    std::fs::write(&clock, jump).map_err(|e| lost(format!("writing {}: {e}", clock.display())))?;
    // Past the jump, the box still lives: its lifetime is a time from its start, not a time
    // of day that a clock set forward has passed.
    tokio::time::sleep(Duration::from_secs(1)).await;
    match guard("an exec after the jump", super::sh(&*b, "echo ok", &ctx)).await? {
        Ok(out) if out == "ok\n" => Ok(()),
        Ok(out) => Err(lost(format!("after the clock jumped {jump}, the box answered {out:?}"))),
        Err(e) => Err(lost(format!(
            "after the clock jumped {jump}, {} seconds into a {} s lifetime, the box failed: {e}",
            "about 1 to 3",
            LIFETIME.as_secs()
        ))),
    }
}

//! Faults on boxes themselves: the Docker engine restarted under running boxes, a box's init
//! killed, and the disk filling under a snapshot and a fork.
//!
//! The Docker rounds take turns between a box without agentbox's runner (its first process is
//! `sleep`, its programs run through the engine's exec, whose stream the engine carries) and
//! one with it (`agentbox-runner init` first, its programs through the runner's socket, which
//! the engine does not carry): the two ways a Docker box's output reaches the host, which a
//! fault breaks differently.
//!
//! The disk rounds put a local provider's whole home on a small tmpfs and fill it two ways:
//! its bytes (a copy is refused before it writes, since it must leave the copy reserve free)
//! and its inodes (which no byte count foresees, so a copy meets `ENOSPC` half-way through).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use agentbox_core::{Ctx, ErrorCode, ExecOptions, FinishOptions, Finished, Labels, Provider, Sandbox, Spec, finish};
use agentbox_providers::docker::{DockerOptions, DockerProvider};
use agentbox_providers::helper::HelperCommand;
use agentbox_testing::outside::running;

use super::{
    CALL_DEADLINE, HUNG_AFTER, LIFETIME, Outcome, Report, Rng, Tmpfs, argv, fill, guard, kill9, pids_with, sh,
};

/// The label every Docker box of the family carries, its value this run's own: the containers
/// a run made are found from outside, through the `docker` CLI, by it.
const RUN_LABEL: &str = "faults.run";

/// The lines the streamed program prints, one each 10 ms or so: long enough (about 15 s)
/// that a fault lands in its middle, also one that takes the engine's 10 s stop timeout to
/// end a box whose `sleep` ignores SIGTERM.
const STREAM_LINES: usize = 1500;

/// How long the engine may take to stop (its containers' stop timeout, then its own
/// shutdown) and to answer again once started.
const ENGINE_LIMIT: Duration = Duration::from_secs(60);

/// The lifetime of a box a fault is put on: past [`HUNG_AFTER`], so that a call its fault
/// leaves waiting is not let go by the box's lifetime before it counts as hung. (Every other
/// box lives [`LIFETIME`].)
const FAULTED_LIFETIME: Duration = Duration::from_secs(HUNG_AFTER.as_secs() + LIFETIME.as_secs());

/// How long past its lifetime a container may take to be removed by the engine.
const REMOVAL: Duration = Duration::from_secs(5);

/// The program streamed while a fault meets it: numbered lines.
fn stream_script() -> String {
    format!("i=0; while [ $i -lt {STREAM_LINES} ]; do echo line$i; i=$((i+1)); sleep 0.01; done")
}

/// All the program streams when nothing stops it.
fn stream_whole() -> String {
    (0..STREAM_LINES).map(|i| format!("line{i}\n")).collect()
}

/// Start the streamed program in `b`, tell `started` once it runs, and read it to its end.
async fn stream(
    b: &dyn Sandbox,
    started: tokio::sync::oneshot::Sender<()>,
    ctx: &Ctx,
) -> agentbox_core::Result<Finished> {
    let p = b.exec(&argv(&stream_script()), &ExecOptions::default(), ctx).await?;
    let _ = started.send(());
    finish(p, FinishOptions::default()).await
}

/// What a stream that met a fault answered, judged: a typed error, or output that is the
/// start of the program's own (all of it where it says it exited 0). A wrong line, or a part
/// passed off as a clean exit, is lost output.
fn judge_stream(what: &str, ran: &agentbox_core::Result<Finished>) -> Result<(), Outcome> {
    let Ok(f) = ran else { return Ok(()) };
    let whole = stream_whole();
    let out = f.stdout_text();
    if !whole.starts_with(&out) {
        let at = out.bytes().zip(whole.bytes()).take_while(|(a, b)| a == b).count();
        let wrong = String::from_utf8_lossy(&out.as_bytes()[at..out.len().min(at + 40)]).into_owned();
        return Err(Outcome::Lost(format!(
            "{what}: the stream answered output that is not the program's, from byte {at}: {wrong:?}"
        )));
    }
    if f.status.code == 0 && out.len() != whole.len() {
        return Err(Outcome::Lost(format!(
            "{what}: the stream said the program exited 0 with {} of its {} bytes",
            out.len(),
            whole.len()
        )));
    }
    Ok(())
}

/// After a fault that may have ended box `b`: the handle held and the box found again by id
/// each read it as gone (nothing found, or a typed `gone` or `not_found`) or answer a command
/// rightly. Never a hang, never a wrong answer, never another error.
async fn gone_or_answers(p: &Arc<dyn Provider>, b: &Arc<dyn Sandbox>, ctx: &Ctx) -> Result<(), Outcome> {
    let id = b.id().clone();
    let gone = |e: &agentbox_core::Error| matches!(e.code(), ErrorCode::Gone | ErrorCode::NotFound);
    match guard("a command on the held handle after the fault", sh(&**b, "echo ok", ctx)).await? {
        Ok(o) if o == "ok\n" => {}
        Ok(o) => {
            return Err(Outcome::Lost(format!(
                "box {id}: after the fault, a command answered {o:?}"
            )));
        }
        Err(e) if gone(&e) => {}
        Err(e) => {
            return Err(Outcome::Lost(format!(
                "box {id}: after the fault, a command failed ({e}): neither gone nor an answer"
            )));
        }
    }
    match guard("attach after the fault", p.attach(&id, ctx)).await? {
        Ok(None) => Ok(()),
        Err(e) if gone(&e) => Ok(()),
        Err(e) => Err(Outcome::Lost(format!(
            "box {id}: after the fault, attach failed ({e}): neither gone nor found"
        ))),
        Ok(Some(again)) => match guard("a command on the box attached again", sh(&*again, "echo ok", ctx)).await? {
            Ok(o) if o == "ok\n" => Ok(()),
            Ok(o) => Err(Outcome::Lost(format!(
                "box {id}: attached again after the fault, a command answered {o:?}"
            ))),
            Err(e) if gone(&e) => Ok(()),
            Err(e) => Err(Outcome::Lost(format!(
                "box {id}: attached again after the fault, a command failed ({e})"
            ))),
        },
    }
}

/// The Docker boxes the family made: the row each belongs to, its container, and the end of
/// its lifetime.
type Made = Vec<(&'static str, String, Instant)>;

/// The operation after a fault: a new box made from `spec`, a command run in it, the box
/// ended. Each step must work.
async fn next_box_works(p: &Arc<dyn Provider>, spec: &Spec, row: &'static str, made: &mut Made) -> Outcome {
    let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
    let b = match guard("the next create", p.create(spec, &ctx)).await {
        Err(o) => return o,
        Ok(Err(e)) => return Outcome::Lost(format!("after the fault, a new box could not be made: {e}")),
        Ok(Ok(b)) => b,
    };
    made.push((row, b.id().name().to_string(), Instant::now() + spec.max_lifetime));
    let out = match guard("the next exec", sh(&*b, "echo ok", &ctx)).await {
        Err(o) => return o,
        Ok(r) => r,
    };
    let ended = match guard("the next destroy", b.destroy(&ctx)).await {
        Err(o) => return o,
        Ok(r) => r,
    };
    match (out, ended) {
        (Ok(o), _) if o != "ok\n" => Outcome::Lost(format!("after the fault, a new box {} answered {o:?}", b.id())),
        (Err(e), _) => Outcome::Lost(format!(
            "after the fault, a command in a new box {} failed: {e}",
            b.id()
        )),
        (_, Err(e)) => Outcome::Lost(format!("after the fault, a new box {} could not be ended: {e}", b.id())),
        _ => Outcome::Survived,
    }
}

/// The pids of this machine's running `dockerd`s, by their command name.
fn dockerd_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter(|pid| {
                    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "dockerd")
                        && running(*pid as u32)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the engine answers the `docker` CLI.
fn engine_answers() -> bool {
    // Within a deadline: an engine half up can leave the CLI waiting.
    Command::new("timeout")
        .args(["20", "docker", "version", "--format", "{{.Server.Version}}"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// This machine's Docker engine as it was found running: its command line, environment and
/// directory, so it is started again as it was. Dropped, it makes sure an engine runs and
/// answers, whatever a round did: the test binaries after this one need it.
struct Engine {
    argv: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    cwd: PathBuf,
    /// Where its output goes (appended): where the engine found wrote it, else
    /// `target/dockerd.log` of its directory, as `scripts/test` starts it.
    log: PathBuf,
    /// The engine this process started, reaped once it is stopped.
    child: Option<std::process::Child>,
}

impl Engine {
    /// The one `dockerd` running on this machine.
    fn find() -> Result<Engine, String> {
        use std::os::unix::ffi::OsStrExt;
        let pid = match dockerd_pids()[..] {
            [pid] => pid,
            [] => return Err("no dockerd runs on this machine (an engine elsewhere, by DOCKER_HOST?)".into()),
            ref many => {
                return Err(format!(
                    "{} dockerd processes run ({many:?}): which to restart?",
                    many.len()
                ));
            }
        };
        let split = |bytes: Vec<u8>| -> Vec<OsString> {
            bytes
                .split(|b| *b == 0)
                .filter(|s| !s.is_empty())
                .map(|s| std::ffi::OsStr::from_bytes(s).to_owned())
                .collect()
        };
        let argv = split(
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map_err(|e| format!("reading dockerd {pid}'s command line: {e}"))?,
        );
        if argv.is_empty() {
            return Err(format!("dockerd {pid} has an empty command line"));
        }
        if argv.iter().any(|a| a.to_string_lossy().contains("fd://")) {
            return Err(format!(
                "dockerd {pid} takes its sockets from systemd (fd://): started again by hand it would not be the same engine"
            ));
        }
        let env = split(
            std::fs::read(format!("/proc/{pid}/environ"))
                .map_err(|e| format!("reading dockerd {pid}'s environment: {e}"))?,
        )
        .into_iter()
        .filter_map(|kv| {
            let kv = kv.as_bytes();
            let eq = kv.iter().position(|b| *b == b'=')?;
            Some((
                std::ffi::OsStr::from_bytes(&kv[..eq]).to_owned(),
                std::ffi::OsStr::from_bytes(&kv[eq + 1..]).to_owned(),
            ))
        })
        .collect();
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd"))
            .map_err(|e| format!("reading dockerd {pid}'s directory: {e}"))?;
        let log = std::fs::read_link(format!("/proc/{pid}/fd/2"))
            .ok()
            .filter(|p| p.is_absolute() && p.is_file())
            .unwrap_or_else(|| cwd.join("target").join("dockerd.log"));
        Ok(Engine {
            argv,
            env,
            cwd,
            log,
            child: None,
        })
    }

    /// SIGTERM every `dockerd` and wait until none runs (SIGKILL past [`ENGINE_LIMIT`]).
    fn stop(&mut self) -> Result<(), String> {
        let t = Instant::now();
        for pid in dockerd_pids() {
            if let Some(p) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
            }
        }
        let mut killed = false;
        while !dockerd_pids().is_empty() {
            if t.elapsed() > ENGINE_LIMIT && !killed {
                dockerd_pids().into_iter().for_each(kill9);
                killed = true;
            }
            if t.elapsed() > ENGINE_LIMIT * 2 {
                return Err(format!(
                    "dockerd did not exit within {}s of SIGTERM",
                    ENGINE_LIMIT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
        if killed {
            return Err(format!(
                "dockerd did not exit within {}s of SIGTERM and was SIGKILLed",
                ENGINE_LIMIT.as_secs()
            ));
        }
        Ok(())
    }

    /// Start the engine as it was found, in a session of its own, unless one runs; then wait
    /// until it answers.
    fn start(&mut self) -> Result<(), String> {
        if dockerd_pids().is_empty() {
            if let Some(dir) = self.log.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)
                .map_err(|e| format!("opening {}: {e}", self.log.display()))?;
            let err = log
                .try_clone()
                .map_err(|e| format!("opening {}: {e}", self.log.display()))?;
            let child = Command::new("setsid")
                .args(&self.argv)
                .env_clear()
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .current_dir(&self.cwd)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(err)
                .spawn()
                .map_err(|e| format!("starting {:?}: {e}", self.argv))?;
            self.child = Some(child);
        }
        let t = Instant::now();
        while !engine_answers() {
            if t.elapsed() > ENGINE_LIMIT {
                return Err(format!(
                    "the engine did not answer within {}s of its start (see {})",
                    ENGINE_LIMIT.as_secs(),
                    self.log.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Err(e) = self.start() {
            eprintln!("\n!!!! faults: THE DOCKER ENGINE COULD NOT BE STARTED AGAIN: {e} !!!!\n");
        }
    }
}

fn lock(e: &Mutex<Engine>) -> MutexGuard<'_, Engine> {
    e.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One round of `docker engine restarted`: the engine stopped `delay` after a box's stream
/// started, and started again. The stream comes back typed; the box is gone or answers; a new
/// box works.
async fn engine_round(
    p: &Arc<dyn Provider>,
    engine: &Arc<Mutex<Engine>>,
    [spec, next]: [&Spec; 2],
    delay: Duration,
    made: &mut Made,
) -> Outcome {
    const ROW: &str = "docker engine restarted";
    let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
    let b = match guard("create", p.create(spec, &ctx)).await {
        Err(o) => return o,
        Ok(Err(e)) => return Outcome::Lost(format!("before the fault, a box could not be made: {e}")),
        Ok(Ok(b)) => b,
    };
    made.push((ROW, b.id().name().to_string(), Instant::now() + spec.max_lifetime));
    let (tx, rx) = tokio::sync::oneshot::channel();
    let call = guard("the stream under the engine's restart", stream(&*b, tx, &ctx));
    let fault = async {
        let started = rx.await.is_ok();
        if started {
            tokio::time::sleep(delay).await;
        }
        let e = engine.clone();
        let restarted = tokio::task::spawn_blocking(move || {
            let mut e = lock(&e);
            e.stop()?;
            e.start()
        })
        .await
        .map_err(|e| format!("the restart's thread: {e}"))
        .and_then(|r| r);
        (started, restarted)
    };
    let (ran, (started, restarted)) = tokio::join!(call, fault);
    if let Err(why) = restarted {
        return Outcome::Lost(format!("the engine could not be restarted: {why}"));
    }
    after_the_fault(p, &b, ran, started, next, ROW, made).await
}

/// One round of `box init killed`: the box's first process SIGKILLed from this machine
/// `delay` after its stream started. The stream comes back typed; the box is gone or answers;
/// a new box works.
async fn init_round(p: &Arc<dyn Provider>, [spec, next]: [&Spec; 2], delay: Duration, made: &mut Made) -> Outcome {
    const ROW: &str = "box init killed";
    let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
    let b = match guard("create", p.create(spec, &ctx)).await {
        Err(o) => return o,
        Ok(Err(e)) => return Outcome::Lost(format!("before the fault, a box could not be made: {e}")),
        Ok(Ok(b)) => b,
    };
    let name = b.id().name().to_string();
    made.push((ROW, name.clone(), Instant::now() + spec.max_lifetime));
    let init = agentbox_testing::outside::docker(&["inspect", "--format", "{{.State.Pid}}", &name])
        .and_then(|s| s.parse::<i32>().ok())
        .filter(|pid| *pid > 0);
    let Some(init) = init else {
        let _ = b.destroy(&ctx).await;
        return Outcome::Lost(format!("box {}: the engine states no pid of its init", b.id()));
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let call = guard("the stream under the init's kill", stream(&*b, tx, &ctx));
    let fault = async {
        let started = rx.await.is_ok();
        if started {
            tokio::time::sleep(delay).await;
        }
        kill9(init);
        started
    };
    let (ran, started) = tokio::join!(call, fault);
    after_the_fault(p, &b, ran, started, next, ROW, made).await
}

/// The containers labelled as this run's (`docker ps -a`: running or not), by name; `None`
/// when the engine does not answer.
fn containers_of(run: &str) -> Option<Vec<String>> {
    let label = format!("label={RUN_LABEL}={run}");
    agentbox_testing::outside::docker(&["ps", "-a", "--filter", &label, "--format", "{{.Names}}"])
        .map(|s| s.lines().map(str::to_string).filter(|l| !l.is_empty()).collect())
}

/// Past the lifetime of each box the family made, no container of this run is left: each
/// left is counted against its round's row, then removed so the machine stays clean.
async fn docker_leaks(report: &mut Report, run: &str, made: &Made) {
    let last = made.iter().map(|(_, _, ends)| *ends).max().unwrap_or_else(Instant::now);
    let deadline = last + REMOVAL;
    let left = loop {
        let left = containers_of(run);
        if left.as_ref().is_some_and(Vec::is_empty) {
            return;
        }
        if Instant::now() >= deadline {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let Some(left) = left else {
        report.add(
            "docker (leak check)",
            "docker",
            Outcome::Lost("the engine did not answer a listing of the run's containers".into()),
        );
        return;
    };
    for name in left {
        let row = made.iter().find(|(_, n, _)| *n == name);
        let what = format!("container {name} alive past its lifetime");
        match row {
            Some((row, _, _)) => report.leaked(row, "docker", what),
            None => report.add("docker (a box of no round)", "docker", Outcome::Leaked(what)),
        }
        let _ = agentbox_testing::outside::docker(&["rm", "-f", &name]);
    }
}

/// The Docker engine stopped and started while boxes run commands and streams are open; a
/// Docker box's init killed.
pub(super) async fn docker_faults(report: &mut Report, rounds: u64, rng: &mut Rng) {
    if !agentbox_testing::services::docker_available("faults_are_survived_and_counted") {
        return;
    }
    let t = Instant::now();
    let plain = DockerProvider::new(DockerOptions::default()).await;
    let runner = DockerProvider::new(DockerOptions {
        runner: Some(HelperCommand::new(agentbox_testing::runner::ensure(), vec![])),
        ..DockerOptions::default()
    })
    .await;
    let (plain, runner): (Arc<dyn Provider>, Arc<dyn Provider>) = match (plain, runner) {
        (Ok(a), Ok(b)) => (Arc::new(a), Arc::new(b)),
        (Err(e), _) | (_, Err(e)) => {
            for row in ["docker engine restarted", "box init killed"] {
                report.add(
                    row,
                    "docker",
                    Outcome::Lost(format!("the docker provider could not be made: {e}")),
                );
            }
            return;
        }
    };
    // Before any fault: the guard that starts the engine again however this returns.
    let engine = Engine::find().map(|e| Arc::new(Mutex::new(e)));
    let run = format!("{}-{}", std::process::id(), agentbox_core::now_ms());
    let faulted = Spec::new(FAULTED_LIFETIME).label(RUN_LABEL, &run);
    let next = Spec::new(LIFETIME).label(RUN_LABEL, &run);
    let mut made = Made::new();
    for round in 0..rounds {
        let (p, how) = if round % 2 == 0 {
            (&plain, "through the engine's exec")
        } else {
            (&runner, "through the runner")
        };
        let outcome = match &engine {
            Ok(engine) => {
                let delay = Duration::from_millis(rng.below(1500));
                engine_round(p, engine, [&faulted, &next], delay, &mut made).await
            }
            Err(why) => Outcome::Lost(format!("the engine cannot be restarted: {why}")),
        };
        report.add("docker engine restarted", "docker", with_how(outcome, how));
        let delay = Duration::from_millis(rng.below(1500));
        let outcome = init_round(p, [&faulted, &next], delay, &mut made).await;
        report.add("box init killed", "docker", with_how(outcome, how));
    }
    docker_leaks(report, &run, &made).await;
    // The guard starts the engine again if a round left it down; then it must answer, for the
    // test binaries after this one.
    drop(engine);
    if !engine_answers() {
        report.add(
            "docker engine restarted",
            "docker",
            Outcome::Lost("the Docker engine does not answer after the family".into()),
        );
    }
    eprintln!("faults: the docker family took {:.1}s", t.elapsed().as_secs_f64());
}

/// What a docker round shows once its fault is over: the stream came back (a typed error, or
/// output that is the program's own), the box reads as gone or answers, and a new box works.
async fn after_the_fault(
    p: &Arc<dyn Provider>,
    b: &Arc<dyn Sandbox>,
    ran: Result<agentbox_core::Result<Finished>, Outcome>,
    started: bool,
    next: &Spec,
    row: &'static str,
    made: &mut Made,
) -> Outcome {
    let ran = match ran {
        Err(o) => return o,
        Ok(r) => r,
    };
    if !started {
        let why = ran.err().map(|e| e.to_string()).unwrap_or_default();
        return Outcome::Lost(format!(
            "box {}: the stream did not start before the fault: {why}",
            b.id()
        ));
    }
    if let Err(o) = judge_stream(&format!("box {}", b.id()), &ran) {
        return o;
    }
    let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
    if let Err(o) = gone_or_answers(p, b, &ctx).await {
        return o;
    }
    let _ = guard("destroy", b.destroy(&ctx)).await;
    next_box_works(p, next, row, made).await
}

/// `o`, its reason saying which kind of box met the fault.
fn with_how(o: Outcome, how: &str) -> Outcome {
    match o {
        Outcome::Survived => Outcome::Survived,
        Outcome::Lost(w) => Outcome::Lost(format!("{w} ({how})")),
        Outcome::Hung(w) => Outcome::Hung(format!("{w} ({how})")),
        Outcome::Leaked(w) => Outcome::Leaked(format!("{w} ({how})")),
        Outcome::Missed(w) => Outcome::Missed(format!("{w} ({how})")),
    }
}

/// What a snapshot or a fork refuses to leave free on its file system
/// (`agentbox_providers::boxdir::COPY_RESERVE`): the round's tmpfs holds it besides the boxes.
const COPY_RESERVE: u64 = 1 << 30;

/// The round's tmpfs, as mount options (`Tmpfs` takes them as its size): the copy reserve and
/// 64 MiB, and few inodes, so that using them all up is quick.
const ROOT_FS: &str = "1088m,nr_inodes=4096";

/// The small files a box's workspace holds beside its big one: entries for a copy to run out
/// of inodes among.
const SMALL_FILES: usize = 24;

/// What a round writes in its box's workspace: a file of `size` bytes and a directory of
/// small ones; `salt` makes each round's its own.
fn workspace_files(size: usize, salt: u8) -> Vec<(String, Vec<u8>)> {
    let mut files = vec![(
        "big.bin".to_string(),
        (0..size).map(|i| (i % 251) as u8 ^ salt).collect::<Vec<u8>>(),
    )];
    for i in 0..SMALL_FILES {
        files.push((
            format!("many/f{i:02}"),
            format!("file {i} of round {salt}\n").repeat(40).into_bytes(),
        ));
    }
    files
}

fn bytes_of(files: &[(String, Vec<u8>)]) -> u64 {
    files.iter().map(|(_, b)| b.len() as u64).sum()
}

fn write_files(dir: &Path, files: &[(String, Vec<u8>)]) -> Result<(), String> {
    for (name, bytes) in files {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
        }
        std::fs::write(&path, bytes).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Every file of `files` is in `dir`, whole; else which is not, and how.
fn files_whole(dir: &Path, files: &[(String, Vec<u8>)]) -> Result<(), String> {
    for (name, bytes) in files {
        match std::fs::read(dir.join(name)) {
            Ok(got) if got == *bytes => {}
            Ok(got) => {
                return Err(format!(
                    "{name} is {} bytes of {}, or other bytes",
                    got.len(),
                    bytes.len()
                ));
            }
            Err(e) => return Err(format!("{name}: {e}")),
        }
    }
    Ok(())
}

/// Use up the inodes of `fs` but about `left`: empty files in `inodes/` until the file system
/// refuses one, then that many removed.
fn fill_inodes(fs: &Path, left: u64) -> Result<(), String> {
    let dir = fs.join("inodes");
    std::fs::create_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let mut n: u64 = 0;
    loop {
        match std::fs::File::create(dir.join(n.to_string())) {
            Ok(_) => n += 1,
            Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
            Err(e) => return Err(format!("filling the inodes of {}: {e}", fs.display())),
        }
        if n > 1 << 20 {
            return Err(format!(
                "{} took a million files without running out of inodes",
                fs.display()
            ));
        }
    }
    for i in 0..left.min(n) {
        let _ = std::fs::remove_file(dir.join((n - 1 - i).to_string()));
    }
    Ok(())
}

/// Remove what [`fill`] and [`fill_inodes`] put in `fs`: room again.
fn unfill(fs: &Path) -> Result<(), String> {
    match std::fs::remove_file(fs.join("filler")) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("removing the filler: {e}")),
    }
    match std::fs::remove_dir_all(fs.join("inodes")) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("removing the inodes' filler: {e}")),
    }
}

/// A provider's home on a round's tmpfs, seen from outside.
struct Home {
    root: PathBuf,
    /// The tmpfs `root` is on, where the fillers go.
    fs: PathBuf,
}

impl Home {
    fn boxes(&self) -> PathBuf {
        self.root.join("boxes")
    }

    fn snapshot_dir(&self, name: &str) -> PathBuf {
        self.root.join("snapshots").join("local").join(name)
    }

    /// What a snapshot left under its directory's own names (`.tmp-…`): a partial copy.
    fn partial_snapshots(&self) -> Vec<String> {
        std::fs::read_dir(self.root.join("snapshots").join("local"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The boxes of this home but `keep`, seen from outside: their directories, and the
    /// processes (supervisors) that run for them.
    fn others(&self, keep: Option<&str>) -> Vec<String> {
        let boxes = self.boxes();
        let mut out: Vec<String> = std::fs::read_dir(&boxes)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| Some(n.as_str()) != keep)
                    .map(|n| format!("directory {n}"))
                    .collect()
            })
            .unwrap_or_default();
        let mine = keep.map(|k| boxes.join(k).to_string_lossy().into_owned());
        for pid in pids_with(&boxes.to_string_lossy()) {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            if !mine.as_ref().is_some_and(|m| cmd.contains(m.as_str())) {
                out.push(format!("process {pid}"));
            }
        }
        out
    }

    /// [`Self::others`], given `within` to be gone: what is left then.
    async fn others_after(&self, keep: Option<&str>, within: Duration) -> Vec<String> {
        let t = Instant::now();
        loop {
            let left = self.others(keep);
            if left.is_empty() || t.elapsed() >= within {
                return left;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A local box made on `home`'s disk with `files` in its workspace; its workspace's path.
async fn box_with(
    p: &Arc<dyn Provider>,
    files: &[(String, Vec<u8>)],
    ctx: &Ctx,
) -> Result<(Arc<dyn Sandbox>, PathBuf), Outcome> {
    let b = match guard("create", p.create(&Spec::new(LIFETIME), ctx)).await? {
        Ok(b) => b,
        Err(e) => return Err(Outcome::Lost(format!("with room, a box could not be made: {e}"))),
    };
    let Some(ws) = b.facts().workspace.clone() else {
        let _ = b.destroy(ctx).await;
        return Err(Outcome::Lost(format!("box {}: its facts state no workspace", b.id())));
    };
    let ws = PathBuf::from(ws);
    if let Err(e) = write_files(&ws, files) {
        let _ = b.destroy(ctx).await;
        return Err(Outcome::Lost(format!("box {}: {e}", b.id())));
    }
    Ok((b, ws))
}

/// One way the disk is full, for a round to meet.
#[derive(Clone, Copy)]
enum Full {
    /// Its bytes, but for `room` (past the copy reserve).
    Bytes(u64),
    /// Its inodes, but for about this many.
    Inodes(u64),
}

impl Full {
    fn fill(self, fs: &Path) -> Result<(), String> {
        match self {
            Full::Bytes(room) => {
                fill(fs, COPY_RESERVE + room);
                Ok(())
            }
            Full::Inodes(left) => fill_inodes(fs, left),
        }
    }

    fn name(self) -> String {
        match self {
            Full::Bytes(room) => format!("its bytes full but for the reserve and {room}"),
            Full::Inodes(left) => format!("its inodes full but for {left}"),
        }
    }
}

/// One round of `disk full: snapshot`: a box's snapshot taken on a disk full of bytes, then of
/// inodes, then with room again. Full, it is refused typed (or taken whole), nothing partial
/// is listed, and an earlier snapshot is still listed and whole; with room again, it is taken
/// and a box made from it has the files whole.
async fn snapshot_round(p: &Arc<dyn Provider>, home: &Home, round: u64, rng: &mut Rng) -> Outcome {
    let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
    let files = workspace_files(((1 + rng.below(4)) << 20) as usize, round as u8);
    let need = bytes_of(&files);
    let (b, _) = match box_with(p, &files, &ctx).await {
        Ok(b) => b,
        Err(o) => return o,
    };
    let outcome = async {
        let kept = format!("kept-{round}");
        match guard("a snapshot with room", p.snapshot(b.id(), &kept, &ctx)).await? {
            Ok(_) => {}
            Err(e) => return Err(Outcome::Lost(format!("with room, a snapshot failed: {e}"))),
        }
        let name = format!("full-{round}");
        let fulls = [
            Full::Bytes(rng.below(need)),
            Full::Inodes(rng.below(SMALL_FILES as u64)),
        ];
        for full in fulls {
            full.fill(&home.fs).map_err(Outcome::Lost)?;
            let taken = guard("a snapshot on a full disk", p.snapshot(b.id(), &name, &ctx)).await;
            unfill(&home.fs).map_err(Outcome::Lost)?;
            let taken = taken?;
            let listed = match guard("snapshots", p.snapshots(&ctx)).await? {
                Ok(l) => l,
                Err(e) => {
                    return Err(Outcome::Lost(format!(
                        "after a snapshot on a full disk, the listing failed: {e}"
                    )));
                }
            };
            let names: Vec<&str> = listed.iter().map(|s| s.name.as_str()).collect();
            if !names.contains(&kept.as_str()) {
                return Err(Outcome::Lost(format!(
                    "with {}, snapshot {kept} taken before is no longer listed (listed: {names:?})",
                    full.name()
                )));
            }
            if let Err(e) = files_whole(&home.snapshot_dir(&kept).join("work"), &files) {
                return Err(Outcome::Lost(format!(
                    "with {}, snapshot {kept} taken before: {e}",
                    full.name()
                )));
            }
            let partial = home.partial_snapshots();
            if !partial.is_empty() {
                return Err(Outcome::Lost(format!(
                    "with {}, a failed snapshot left a partial copy: {partial:?}",
                    full.name()
                )));
            }
            match taken {
                Err(_) if names.contains(&name.as_str()) => {
                    return Err(Outcome::Lost(format!(
                        "with {}, the snapshot was refused and is listed all the same",
                        full.name()
                    )));
                }
                Err(_) => {}
                // Taken all the same: then whole, and out of the way of the one with room.
                Ok(_) => {
                    if let Err(e) = files_whole(&home.snapshot_dir(&name).join("work"), &files) {
                        return Err(Outcome::Lost(format!(
                            "with {}, the snapshot was taken, but: {e}",
                            full.name()
                        )));
                    }
                    let _ = p.delete_snapshot(&name, &ctx).await;
                }
            }
        }
        // Room again: the same snapshot is taken, and a box made from it has the files.
        match guard("a snapshot with room again", p.snapshot(b.id(), &name, &ctx)).await? {
            Ok(_) => {}
            Err(e) => return Err(Outcome::Lost(format!("with room again, the snapshot failed: {e}"))),
        }
        let mut spec = Spec::new(LIFETIME);
        spec.snapshot = Some(name.clone());
        let from = match guard("a box from the snapshot", p.create(&spec, &ctx)).await? {
            Ok(b) => b,
            Err(e) => {
                return Err(Outcome::Lost(format!(
                    "a box from snapshot {name} could not be made: {e}"
                )));
            }
        };
        let ws = from.facts().workspace.clone().unwrap_or_default();
        let whole = files_whole(Path::new(&ws), &files);
        let _ = guard("destroy", from.destroy(&ctx)).await;
        whole.map_err(|e| Outcome::Lost(format!("a box from snapshot {name}: {e}")))
    }
    .await;
    let _ = guard("destroy", b.destroy(&ctx)).await;
    match outcome {
        Ok(()) => Outcome::Survived,
        Err(o) => o,
    }
}

/// One round of `disk full: fork`: a box forked in two on a disk full of bytes (with room for
/// none of the copies, or for one), then of inodes, then with room again. Full, the fork is
/// refused typed (or made whole) and leaves no box made half-way alive; with room again, it
/// makes two boxes with the files whole.
async fn fork_round(p: &Arc<dyn Provider>, home: &Home, round: u64, rng: &mut Rng) -> Outcome {
    let ctx = Ctx::background().with_timeout(CALL_DEADLINE);
    let files = workspace_files(((1 + rng.below(4)) << 20) as usize, 100 + round as u8);
    let need = bytes_of(&files);
    let (b, _) = match box_with(p, &files, &ctx).await {
        Ok(b) => b,
        Err(o) => return o,
    };
    let keep = b.id().name().to_string();
    let outcome = async {
        // Room for no copy, or for the first of the two (its directory and files, then the
        // second refused).
        let room = if rng.below(2) == 0 {
            rng.below(need)
        } else {
            need + rng.below(need / 2)
        };
        let fulls = [Full::Bytes(room), Full::Inodes(rng.below(2 * SMALL_FILES as u64))];
        for full in fulls {
            full.fill(&home.fs).map_err(Outcome::Lost)?;
            let forked = guard("a fork on a full disk", p.fork(b.id(), 2, &Spec::new(LIFETIME), &ctx)).await;
            // Looked at on the full disk, as the fork left it: no box of it is alive.
            let left = match &forked {
                Ok(Err(_)) => home.others_after(Some(&keep), Duration::from_secs(2)).await,
                _ => Vec::new(),
            };
            unfill(&home.fs).map_err(Outcome::Lost)?;
            match forked? {
                Err(e) if !left.is_empty() => {
                    return Err(Outcome::Lost(format!(
                        "with {}, the fork was refused ({e}) and left {left:?} of boxes made half-way",
                        full.name()
                    )));
                }
                Err(_) => {}
                Ok(made) => {
                    let mut whole = Ok(());
                    for m in &made {
                        let ws = m.facts().workspace.clone().unwrap_or_default();
                        if let Err(e) = files_whole(Path::new(&ws), &files) {
                            whole = Err(format!("with {}, fork {} was made, but: {e}", full.name(), m.id()));
                        }
                        let _ = guard("destroy", m.destroy(&ctx)).await;
                    }
                    whole.map_err(Outcome::Lost)?;
                }
            }
            match guard("list", p.list(&Labels::new(), &ctx)).await? {
                Ok(l) if l.len() == 1 && l[0].id() == b.id() => {}
                Ok(l) => {
                    let ids: Vec<String> = l.iter().map(|b| b.id().to_string()).collect();
                    return Err(Outcome::Lost(format!(
                        "with {}, after the fork the provider lists {ids:?}, not the one box forked",
                        full.name()
                    )));
                }
                Err(e) => {
                    return Err(Outcome::Lost(format!(
                        "after a fork on a full disk, the listing failed: {e}"
                    )));
                }
            }
        }
        // Room again: the fork makes its two boxes, each with the files whole.
        let made = match guard("a fork with room again", p.fork(b.id(), 2, &Spec::new(LIFETIME), &ctx)).await? {
            Ok(m) => m,
            Err(e) => return Err(Outcome::Lost(format!("with room again, the fork failed: {e}"))),
        };
        let mut whole = if made.len() == 2 {
            Ok(())
        } else {
            Err(Outcome::Lost(format!(
                "with room again, a fork of 2 made {}",
                made.len()
            )))
        };
        for m in &made {
            let ws = m.facts().workspace.clone().unwrap_or_default();
            if let Err(e) = files_whole(Path::new(&ws), &files) {
                whole = Err(Outcome::Lost(format!("with room again, fork {}: {e}", m.id())));
            }
            let _ = guard("destroy", m.destroy(&ctx)).await;
        }
        whole
    }
    .await;
    let _ = guard("destroy", b.destroy(&ctx)).await;
    match outcome {
        Ok(()) => Outcome::Survived,
        Err(o) => o,
    }
}

/// The processes holding something under `dir` (their directory, their root, an open file),
/// as `pid command`.
fn holders(dir: &Path) -> Vec<String> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let under = |link: PathBuf| std::fs::read_link(link).is_ok_and(|t| t.starts_with(dir));
    let mut out = Vec::new();
    for pid in procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
    {
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.flatten().any(|e| under(e.path())))
            .unwrap_or(false);
        if fds || under(format!("/proc/{pid}/cwd").into()) || under(format!("/proc/{pid}/root").into()) {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            out.push(format!(
                "{pid} {}",
                String::from_utf8_lossy(&cmd).replace('\0', " ").trim()
            ));
        }
    }
    out
}

/// Unmount the round's tmpfs at `at`, given `within` for what holds it to let go; past it,
/// it is unmounted lazily (so nothing stays mounted) and what held it is named.
async fn unmount(at: &Path, within: Duration) -> Result<(), String> {
    let t = Instant::now();
    loop {
        let out = Command::new("umount").arg(at).stdin(Stdio::null()).output();
        match out {
            Ok(o) if o.status.success() => return Ok(()),
            Err(e) => return Err(format!("running umount {}: {e}", at.display())),
            Ok(o) if t.elapsed() >= within => {
                let held = holders(at);
                let _ = Command::new("umount").arg("-l").arg(at).status();
                return Err(format!(
                    "the round's tmpfs stayed busy {}s after its boxes ended ({}), held by {held:?}",
                    within.as_secs(),
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// The disk filling during a snapshot and a fork.
pub(super) async fn snapshot_faults(report: &mut Report, rounds: u64, rng: &mut Rng) {
    if !super::can_mount("snapshot") {
        return;
    }
    agentbox_testing::runner::ensure();
    let t = Instant::now();
    for round in 0..rounds {
        let fs = Tmpfs::new(ROOT_FS);
        let home = Home {
            root: fs.at.join("home"),
            fs: fs.at.clone(),
        };
        let p: Arc<dyn Provider> =
            match agentbox_providers::LocalOptions::at(&home.root).and_then(agentbox_providers::LocalProvider::new) {
                Ok(p) => Arc::new(p),
                Err(e) => {
                    for row in ["disk full: snapshot", "disk full: fork"] {
                        report.add(
                            row,
                            "local",
                            Outcome::Lost(format!("the local provider could not be made: {e}")),
                        );
                    }
                    continue;
                }
            };
        let outcome = snapshot_round(&p, &home, round, rng).await;
        report.add("disk full: snapshot", "local", outcome);
        let outcome = fork_round(&p, &home, round, rng).await;
        report.add("disk full: fork", "local", outcome);
        // Every box the round made ended, none past its lifetime; what is left is killed, so
        // the tmpfs can be unmounted.
        let left = home.others_after(None, LIFETIME).await;
        if !left.is_empty() {
            report.add(
                "disk full (a late box)",
                "local",
                Outcome::Leaked(format!("{left:?} of the round's boxes alive past their lifetime")),
            );
            pids_with(&home.boxes().to_string_lossy()).into_iter().for_each(kill9);
        }
        drop(p);
        if let Err(e) = unmount(&fs.at, Duration::from_secs(5)).await {
            report.add("disk full (a late box)", "local", Outcome::Leaked(e));
        }
        drop(fs);
    }
    eprintln!("faults: the snapshot family took {:.1}s", t.elapsed().as_secs_f64());
}

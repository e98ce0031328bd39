//! Runs that move between hosts, with real containers and a real PostgreSQL: a run moved from
//! this host to a container and on to a second container sharing its Docker volume; two
//! containers racing for one run; a stale holder that wakes after the move; a holder SIGKILLed
//! mid-step whose lease runs out; and the demo's moves, to Docker and to a (fake) Daytona
//! sandbox. The "hosts" are this machine and Docker boxes, each in its own network namespace,
//! reaching PostgreSQL by its unix socket, and Daytona sandboxes sharing a volume.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

mod common;

use agentbox_fakes::daytona::{FakeDaytona, FakeDaytonaOptions};
use agentbox_runs::{Message, Store};
use agentbox_testing::services::{docker_available, postgres_socket};

const BIN: &str = env!("CARGO_BIN_EXE_agentbox");

/// A Docker named volume of the test's own, removed when it drops; the runs' root is its
/// directory on this machine.
struct Volume {
    name: String,
    root: PathBuf,
}

impl Volume {
    fn new(tag: &str) -> Self {
        let name = format!("agentbox-test-{tag}-{}", std::process::id());
        let made = Command::new("docker")
            .args(["volume", "create", &name])
            .output()
            .unwrap();
        assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
        let at = Command::new("docker")
            .args(["volume", "inspect", "-f", "{{.Mountpoint}}", &name])
            .output()
            .unwrap();
        let root = PathBuf::from(String::from_utf8(at.stdout).unwrap().trim());
        assert!(root.is_dir(), "{}", root.display());
        Volume { name, root }
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["volume", "rm", "-f", &self.name]).output();
    }
}

/// Everything a move test needs: a home, a volume, the PostgreSQL connection file.
struct World {
    home: tempfile::TempDir,
    vol: Volume,
    pg: PathBuf,
}

impl World {
    fn new(test: &str, tag: &str) -> Option<Self> {
        if !docker_available(test) {
            return None;
        }
        let conn = postgres_socket(test)?;
        let home = tempfile::tempdir().unwrap();
        let pg = home.path().join("postgres");
        std::fs::write(&pg, format!("{conn}\n")).unwrap();
        Some(World {
            home,
            vol: Volume::new(tag),
            pg,
        })
    }

    fn root(&self) -> &str {
        self.vol.root.to_str().unwrap()
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .env("AGENTBOX_HOME", self.home.path())
            .env("AGENTBOX_RUNS_POSTGRES_FILE", &self.pg)
            .stdin(Stdio::null());
        c
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    }

    /// `runs start` on the docker driver, the run's root the volume: the command there.
    fn on_docker(&self, id: &str, command: &[&str]) -> Command {
        let mut args = vec![
            "runs",
            "start",
            id,
            "--root",
            self.root(),
            "--driver",
            "docker",
            "--volume",
            &self.vol.name,
            "--command",
        ];
        args.extend_from_slice(command);
        self.cmd(&args)
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.vol.root.join("runs").join(id)
    }

    fn record(&self, id: &str) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.dir(id).join("run.json")).unwrap()).unwrap()
    }

    fn messages(&self, id: &str) -> Vec<Message> {
        Store::read(&self.dir(id).join("store.db")).unwrap().messages().unwrap()
    }

    /// Wait (at most a minute) until the run's record says `f`.
    fn until(&self, id: &str, what: &str, f: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        common::record_until(&self.dir(id), what, f)
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string()
}

fn wait_output(child: Child) -> Output {
    child.wait_with_output().unwrap()
}

/// The pid of the `agentbox runs agent` of run `id` (in a container or not: its processes are
/// this machine's too).
fn agent_pid(id: &str) -> Option<i32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(argv) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let argv: Vec<&[u8]> = argv.split(|b| *b == 0).collect();
        let is_agent = argv.len() > 2 && argv[1] == b"runs" && argv[2] == b"agent";
        let ours = std::fs::read(e.path().join("environ")).is_ok_and(|env| {
            env.split(|b| *b == 0)
                .any(|v| v == format!("AGENTBOX_RUN={id}").as_bytes())
        }) || argv.contains(&id.as_bytes());
        if is_agent && ours {
            return Some(pid);
        }
    }
    None
}

fn signal(pid: i32, sig: &str) {
    assert!(
        Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
}

#[test]
fn a_run_moves_to_a_container_then_to_a_second_sharing_its_volume() {
    const TEST: &str = "a_run_moves_to_a_container_then_to_a_second_sharing_its_volume";
    let Some(w) = World::new(TEST, "move") else { return };
    // Leases are kept by run id on the server, which outlives the test: an id of its own.
    let id = &format!("moving-{}", std::process::id());
    w.ok(&["runs", "new", id, "--root", w.root()]);
    let agent = ["agentbox", "runs", "agent", "--steps", "10", "--step-time", "1s"];
    // Generation 1 on this host, its lease in PostgreSQL.
    let first = w
        .cmd(&[
            "runs",
            "agent",
            id,
            "--root",
            w.root(),
            "--steps",
            "10",
            "--step-time",
            "1s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    w.until(id, "open", |r| r["status"] == "open");
    // Moved to a container: asked now, done at the holder's next step boundary.
    let mut to_first: Vec<&str> = vec!["runs", "move", id, "--root", w.root(), "--to", "docker"];
    to_first.extend(["--volume", &w.vol.name, "--command"]);
    to_first.extend(agent);
    let moved_once = w
        .cmd(&to_first)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let second = w.until(id, "held by a container", |r| {
        r["status"] == "open" && r["generation"] == 2
    });
    let container_1 = second["holder"]["host"].as_str().unwrap().to_string();
    assert_ne!(container_1, this_host());
    // And on to a second container, which shares the volume.
    let moved_twice = w.cmd(&to_first).output().unwrap();
    assert!(moved_twice.status.success(), "{}", text(&moved_twice.stderr));
    let (first, moved_once) = (wait_output(first), wait_output(moved_once));
    assert!(first.status.success(), "{}", text(&first.stderr));
    assert!(moved_once.status.success(), "{}", text(&moved_once.stderr));
    assert!(
        text(&first.stdout).contains("moving to docker"),
        "{}",
        text(&first.stdout)
    );
    assert!(
        text(&moved_twice.stdout).contains("generation 3 ran in docker box"),
        "{}",
        text(&moved_twice.stdout)
    );

    // The run: sealed at generation 3, one store file, its conversation and workspace whole.
    let end = w.record(id);
    assert_eq!(
        (end["status"].as_str(), end["generation"].as_u64()),
        (Some("sealed"), Some(3))
    );
    let container_2 = end["holder"]["host"].as_str().unwrap().to_string();
    assert!(container_2 != container_1 && container_2 != this_host());
    let mut files: Vec<String> = std::fs::read_dir(w.dir(id))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        ["generations.jsonl", "run.json", "starts.jsonl", "store.db", "workspace"]
    );
    // Its timeline: each generation where it ran, each one let go (none taken over).
    let timeline: Vec<(u64, String, String)> = agentbox_runs::history::read(&w.dir(id))
        .unwrap()
        .into_iter()
        .map(|g| (g.generation, g.host, g.ended))
        .collect();
    assert_eq!(
        timeline,
        [
            (1, this_host(), "sealed".to_string()),
            (2, container_1.clone(), "sealed".to_string()),
            (3, container_2.clone(), "sealed".to_string())
        ]
    );
    let conv = w.messages(id);
    assert_eq!(conv.iter().filter(|m| m.role == "user").count(), 1);
    let gens: std::collections::BTreeSet<u64> = conv.iter().map(|m| m.generation).collect();
    assert_eq!(gens.into_iter().collect::<Vec<_>>(), [1, 2, 3]);
    let notes: Vec<String> = conv
        .iter()
        .filter(|m| m.role == "system")
        .map(|m| m.content["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(notes.len(), 4, "{notes:?}");
    assert!(
        notes[0].starts_with("Moving to docker") && notes[0].contains(&this_host()),
        "{notes:?}"
    );
    assert!(
        notes[1].contains(&format!("from host {} to host {container_1}", this_host())),
        "{notes:?}"
    );
    assert!(
        notes[3].contains(&format!("from host {container_1} to host {container_2}")),
        "{notes:?}"
    );
    assert_eq!(conv.last().unwrap().content["text"], "Counted to 10.");
    // Each step once, in order, on the three hosts.
    let log = std::fs::read_to_string(w.dir(id).join("workspace/count.log")).unwrap();
    let steps: Vec<(u32, String)> = log
        .lines()
        .map(|l| {
            let (n, host) = l.split_once(" on ").unwrap();
            (n.parse().unwrap(), host.to_string())
        })
        .collect();
    assert_eq!(
        steps.iter().map(|s| s.0).collect::<Vec<_>>(),
        (1..=10).collect::<Vec<u32>>(),
        "{log}"
    );
    let hosts: std::collections::BTreeSet<&str> = steps.iter().map(|s| s.1.as_str()).collect();
    assert_eq!(hosts.len(), 3, "{log}");
    // Each start and its exit recorded.
    let starts = std::fs::read_to_string(w.dir(id).join("starts.jsonl")).unwrap();
    let starts: Vec<serde_json::Value> = starts.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(starts.len(), 2);
    assert!(
        starts.iter().all(|s| s["driver"] == "docker" && s["exit"] == 0),
        "{starts:?}"
    );
}

#[test]
fn two_hosts_race_for_a_run_and_a_stale_holder_that_wakes_is_fenced() {
    const TEST: &str = "two_hosts_race_for_a_run_and_a_stale_holder_that_wakes_is_fenced";
    let Some(w) = World::new(TEST, "race") else { return };
    // Leases are kept by run id on the server, which outlives the test: an id of its own.
    let id = &format!("raced-{}", std::process::id());
    w.ok(&["runs", "new", id, "--root", w.root()]);
    // Two containers claim the run at once: one holds it, the other is refused, naming it.
    // The winner holds it long enough that the loser, however late it starts, finds it held.
    let hold = ["agentbox", "runs", "open", id, "--root", "/runs", "--", "sleep", "8"];
    let racers: Vec<Child> = (0..2)
        .map(|_| {
            w.on_docker(id, &hold)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<Output> = racers.into_iter().map(wait_output).collect();
    let won: Vec<&Output> = outs.iter().filter(|o| o.status.success()).collect();
    let lost: Vec<&Output> = outs.iter().filter(|o| !o.status.success()).collect();
    assert_eq!((won.len(), lost.len()), (1, 1), "{outs:?}");
    let why = text(&lost[0].stderr);
    assert!(why.contains("refused") && why.contains("is held by pid"), "{why}");
    assert_eq!(w.record(id)["generation"], 1);

    // A holder in a container stops (a host that froze) mid-step; its 2 s lease runs out.
    let agent = [
        "agentbox",
        "runs",
        "agent",
        "--root",
        "/runs",
        "--steps",
        "3",
        "--step-time",
        "2s",
        "--lease",
        "2s",
    ];
    let mut stale = w
        .on_docker(id, &agent)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(stale.stdout.take().unwrap()).lines();
    // Its second step's call (a 2 s sleep) has begun once its second reply is kept.
    let mut seen = Vec::new();
    for l in lines.by_ref() {
        let l = l.unwrap();
        seen.push(l.clone());
        if seen
            .iter()
            .filter(|l| l.starts_with("kept ") && l.ends_with(" assistant"))
            .count()
            == 2
        {
            break;
        }
    }
    let Some(pid) = agent_pid(id) else {
        let _ = stale.kill();
        panic!(
            "no stale holder: it said {seen:?}, {}",
            text(&wait_output(stale).stderr)
        );
    };
    signal(pid, "-STOP");
    // The next host takes the run once the lease is out, and counts to the end.
    let mut next: Vec<&str> = agent.to_vec();
    next.extend(["--claim-wait", "30s"]);
    let taken = w.on_docker(id, &next).output().unwrap();
    assert!(taken.status.success(), "{}", text(&taken.stderr));
    assert!(
        text(&taken.stdout).contains("generation 3 on host"),
        "{}",
        text(&taken.stdout)
    );
    // The stale holder wakes: it writes nothing and says it was fenced.
    signal(pid, "-CONT");
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let stale = wait_output(stale);
    assert!(!stale.status.success());
    let said = text(&stale.stderr);
    assert!(
        said.contains("fenced") && said.contains("generation 2") && said.contains("generation 3"),
        "{said}"
    );
    assert!(!rest.iter().any(|l| l.starts_with("kept")), "{rest:?}");
    let conv = w.messages(id);
    let first_of_3 = conv.iter().position(|m| m.generation == 3).unwrap();
    assert!(conv[first_of_3..].iter().all(|m| m.generation == 3), "{conv:?}");
    assert_eq!(conv.last().unwrap().content["text"], "Counted to 3.");
    assert_eq!(w.record(id)["status"], "sealed");
}

#[test]
fn a_holder_killed_mid_step_loses_no_acknowledged_write_and_the_next_host_goes_on() {
    const TEST: &str = "a_holder_killed_mid_step_loses_no_acknowledged_write_and_the_next_host_goes_on";
    let Some(w) = World::new(TEST, "kill") else { return };
    // Leases are kept by run id on the server, which outlives the test: an id of its own.
    let id = &format!("killed-{}", std::process::id());
    w.ok(&["runs", "new", id, "--root", w.root()]);
    let mut holder = w
        .cmd(&[
            "runs",
            "agent",
            id,
            "--root",
            w.root(),
            "--steps",
            "4",
            "--step-time",
            "3s",
            "--lease",
            "2s",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Every message the holder was told is durable, until it is killed mid-step.
    let mut acknowledged: Vec<(i64, String)> = Vec::new();
    for l in BufReader::new(holder.stdout.take().unwrap()).lines() {
        let l = l.unwrap();
        if let Some(kept) = l.strip_prefix("kept ") {
            let (seq, role) = kept.split_once(' ').unwrap();
            acknowledged.push((seq.parse().unwrap(), role.to_string()));
            // Step 2's call is running: kill the holder in the middle of it.
            if acknowledged.len() == 4 {
                holder.kill().unwrap();
                break;
            }
        }
    }
    holder.wait().unwrap();
    assert_eq!(w.record(id)["status"], "open", "the killed holder released nothing");
    // The next host waits out the lease and takes the run at the next generation.
    let agent = [
        "agentbox",
        "runs",
        "agent",
        "--root",
        "/runs",
        "--steps",
        "4",
        "--claim-wait",
        "30s",
    ];
    let next = w.on_docker(id, &agent).output().unwrap();
    assert!(next.status.success(), "{}", text(&next.stderr));
    let conv = w.messages(id);
    for (seq, role) in &acknowledged {
        let m = conv
            .iter()
            .find(|m| m.seq == *seq)
            .unwrap_or_else(|| panic!("seq {seq} lost: {conv:?}"));
        assert_eq!((&m.role, m.generation), (role, 1));
    }
    let end = w.record(id);
    assert_eq!(
        (end["status"].as_str(), end["generation"].as_u64()),
        (Some("sealed"), Some(2))
    );
    assert_eq!(conv.last().unwrap().content["text"], "Counted to 4.");
    assert!(conv.iter().any(|m| m.generation == 2 && m.role == "tool"));
    // The call the killed holder never answered is answered as interrupted, then made again.
    assert!(
        conv.iter()
            .any(|m| m.generation == 2 && m.content["text"] == agentbox_runs::agent::INTERRUPTED),
        "{conv:?}"
    );
}

#[test]
fn the_demo_moves_its_run_to_a_container_and_back() {
    if !docker_available("the_demo_moves_its_run_to_a_container_and_back") {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["demo", "--move", "docker"])
        .env("AGENTBOX_HOME", home.path())
        .output()
        .unwrap();
    assert_moved_there_and_back(&out);
}

/// The demo's move with the daytona driver, against the fake Daytona: the run lives on a
/// volume, which this machine sees as the fake's volume directory and the sandbox at /runs;
/// this binary is uploaded into the sandbox, and the sandbox is deleted after.
#[test]
fn the_demo_moves_its_run_to_a_daytona_sandbox_and_back() {
    let test = "the_demo_moves_its_run_to_a_daytona_sandbox_and_back";
    let Some(rootfs) = agentbox_testing::services::rootfs(test) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let volumes = tempfile::tempdir().unwrap();
    let key = "demo-key-0123456789";
    let fake = rt
        .block_on(FakeDaytona::start(FakeDaytonaOptions {
            rootfs: Some(rootfs.into()),
            api_key: key.into(),
            volumes_dir: Some(volumes.path().to_path_buf()),
            // This machine writes the run's files, and so does the sandbox.
            boxes_as_this_user: true,
            index_lag: std::time::Duration::from_millis(100),
            ..Default::default()
        }))
        .expect("the fake Daytona starts");
    let home = tempfile::tempdir().unwrap();
    let root = volumes.path().join("demo-runs");
    let out = Command::new(BIN)
        .args(["demo", "--move", "daytona", "--volume", "demo-runs", "--root"])
        .arg(&root)
        .env("AGENTBOX_HOME", home.path())
        .env("DAYTONA_API_URL", fake.api_url())
        .env("DAYTONA_API_KEY", key)
        .output()
        .unwrap();
    assert_moved_there_and_back(&out);
    assert!(
        text(&out.stderr).contains("started in daytona sandbox"),
        "{}",
        text(&out.stderr)
    );
    // The volume the driver made is the directory the run lives in.
    assert_eq!(fake.volume_dir("demo-runs").as_deref(), Some(root.as_path()));
    let left: Vec<_> = fake
        .sandboxes()
        .into_iter()
        .filter(|s| s.desired_state != "destroyed")
        .collect();
    assert!(left.is_empty(), "the generation's sandbox is left: {left:?}");
    rt.block_on(fake.shutdown());
}

/// What the demo said, moving its second generation to another host and back: three hosts,
/// the middle one another, the agent told of both moves, the note written there read here.
fn assert_moved_there_and_back(out: &Output) {
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    let here = this_host();
    let hosts: Vec<String> = said
        .lines()
        .filter_map(|l| l.split(" on host ").nth(1))
        .filter(|l| l.ends_with('"') || l.contains("): asked"))
        .map(|l| l.split(')').next().unwrap().to_string())
        .collect();
    assert_eq!(hosts.len(), 3, "{said}");
    assert_eq!(hosts[0], here);
    assert_ne!(hosts[1], here);
    assert_eq!(hosts[2], here);
    assert!(
        said.contains(&format!("from host {here} to host {}", hosts[1])),
        "{said}"
    );
    assert!(
        said.contains(&format!("from host {} to host {here}", hosts[1])),
        "{said}"
    );
    // The note generation 2 wrote there is read back here.
    assert!(
        said.contains(&format!("note.md says: The box's machine is called {here}.")),
        "{said}"
    );
    assert!(said.contains("the run is Sealed at generation 3"), "{said}");
}

//! `agentbox demo`: the seed's pick-up-a-run on local defaults, with no key. One run
//! directory; three processes one after another, each opening the run (the next
//! generation), answering one question of the same chat with a scripted model whose tool call
//! runs in a local box, and releasing it. The last still knows the first question.
//!
//! `--move docker`: the second generation runs in a Docker container (the supervisor's
//! docker driver, the run's directory bound in), the third back on this host; each says
//! where it ran, and the agent is told each time the run moved. `--move systemd`: the second
//! is a transient unit of this machine's systemd. `--move daytona --volume NAME --root DIR`:
//! the second runs in a Daytona sandbox (`DAYTONA_API_KEY`, `DAYTONA_API_URL`) whose volume
//! NAME holds the run, which this machine sees at DIR (a fake Daytona's volume directory, or
//! the volume mounted here).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentbox_core::{Ctx, Error, Result};
use agentbox_runs::agent::{self, Reply, ScriptedModel, text_of};
use agentbox_runs::{Runs, read_status};
use agentbox_transport::ledger::{Recorder, SqliteLedger};
use agentbox_transport::{Transport, TransportConfig, TransportHost};
use serde_json::json;

/// The questions, one a generation.
const QUESTIONS: [&str; 3] = [
    "What is the box's machine called?",
    "Keep a note of that in the workspace, please.",
    "What was my first question?",
];

/// `agentbox demo`'s options.
#[derive(clap::Args)]
pub(crate) struct DemoArgs {
    /// Start the second generation there (docker: a container of this machine's engine,
    /// from the box image `scripts/box-image` builds).
    #[arg(long = "move", value_enum, value_name = "DRIVER")]
    pub move_to: Option<crate::drivers::DriverKind>,
    /// Where the run lives [default: $AGENTBOX_HOME/demo]. With `--move daytona`: the volume
    /// as this machine sees it.
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// With `--move daytona`: the Daytona volume that holds --root, mounted at /runs in the
    /// sandbox (made when missing).
    #[arg(long, value_name = "NAME")]
    pub volume: Option<String>,
}

/// The parent: make the run, start the three generations one after another, say where it lives.
pub(crate) async fn run(args: DemoArgs) -> Result<()> {
    if args.move_to == Some(crate::drivers::DriverKind::Kube) {
        return Err(Error::unsupported(
            "--move kube: the demo's run lives on this machine's disk, which a pod reaches only through a volume claim; move a run with `agentbox runs move RUN --to kube --claim NAME`",
        ));
    }
    use crate::drivers::DriverKind;
    let daytona = args.move_to == Some(DriverKind::Daytona);
    if daytona && (args.volume.is_none() || args.root.is_none()) {
        return Err(Error::invalid(
            "--move daytona: the run must live on a Daytona volume both sides see: give --volume NAME and --root DIR, the volume as this machine sees it",
        ));
    }
    if args.volume.is_some() && !daytona {
        return Err(Error::invalid("--volume: only with --move daytona"));
    }
    let root = match &args.root {
        Some(r) => {
            std::fs::create_dir_all(r).map_err(|e| Error::io(e, format!("--root {}", r.display())))?;
            std::fs::canonicalize(r).map_err(|e| Error::io(e, format!("--root {}", r.display())))?
        }
        None => agentbox_providers::home::default_home()?.join("demo"),
    };
    let runs = Runs::new(&root);
    let rec = runs.create(None)?;
    let dir = runs.dir(&rec.id);
    println!("run {} lives in {}", rec.id, dir.display());
    let exe = std::env::current_exe().map_err(|e| Error::io(e, "finding the agentbox executable"))?;
    for step in 1..=3 {
        if step == 2
            && let Some(to) = args.move_to
        {
            println!("moving the run to {} for generation 2", to.name());
            agentbox_runs::moves::ask(&dir, to.name(), &agentbox_runs::run::host_name())?;
            let driver = crate::drivers::DriverArgs {
                driver: to,
                volume: args.volume.clone(),
                lifetime: "10m".into(),
                kube: Default::default(),
            };
            // On this machine, this binary; in a box, the one its driver put on its PATH.
            let exe_in = match to {
                DriverKind::Local | DriverKind::Systemd => exe.to_string_lossy().into_owned(),
                _ => "agentbox".to_string(),
            };
            // Where the sandbox sees the run's root: the volume's mount, else the same path.
            let root_in = match to {
                DriverKind::Daytona => crate::drivers::DAYTONA_RUNS.to_string(),
                _ => root.to_string_lossy().into_owned(),
            };
            let command = [
                exe_in,
                "demo-step".into(),
                "--root".into(),
                root_in,
                "--run".into(),
                rec.id.clone(),
                "--step".into(),
                "2".into(),
                "--in-workspace".into(),
            ];
            let ran = crate::drivers::start(&driver, &root, &rec.id, None, &command).await?;
            if ran.exit != 0 {
                return Err(Error::unknown(format!(
                    "generation 2 in {} exited {}",
                    ran.place, ran.exit
                )));
            }
            continue;
        }
        if step == 3 && args.move_to.is_some() {
            println!("moving the run back to this host for generation 3");
            agentbox_runs::moves::ask(&dir, "local", &agentbox_runs::run::host_name())?;
        }
        let out = tokio::process::Command::new(&exe)
            .args(["demo-step", "--root"])
            .arg(&root)
            .args(["--run", &rec.id, "--step", &step.to_string()])
            .args(args.move_to.map(|_| "--in-workspace"))
            .env(crate::drivers::DRIVER_ENV, "local")
            .output()
            .await
            .map_err(|e| Error::io(e, "starting a generation"))?;
        print!("{}", String::from_utf8_lossy(&out.stdout));
        if !out.status.success() {
            return Err(Error::unknown(format!(
                "generation {step} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    let end = read_status(&dir)?;
    println!(
        "the run is {:?} at generation {}; its conversation is in {}, its tool calls in {}",
        end.status,
        end.generation,
        dir.join("store.db").display(),
        dir.join("ledger.db").display()
    );
    println!(
        "read it from outside: agentbox runs status {} --root {}",
        rec.id,
        root.display()
    );
    Ok(())
}

/// One generation, in a process of its own.
///
/// Its tool calls run in a local box the generations share through the run's documents; with
/// `in_workspace` (the moving demo, whose generations are on different machines, where a
/// local box cannot follow) they run where the generation runs, in the run's workspace, which
/// moves with the run.
pub(crate) async fn step(root: &Path, id: &str, step: usize, in_workspace: bool) -> Result<()> {
    let question = *QUESTIONS
        .get(step.wrapping_sub(1))
        .ok_or_else(|| Error::invalid(format!("--step {step}: 1 to 3")))?;
    let runs = crate::drivers::started_here(Runs::new(root));
    let run = runs.open(id).await?;
    let moved = agent::note_move(&run, runs.host())?;
    let ctx = Ctx::background();
    let (transport, env): (Option<Transport>, Arc<dyn agentbox_hands::ExecutionEnv>) = if in_workspace {
        (None, Arc::new(run.host_env()?))
    } else {
        let config = TransportConfig::from_toml(
            "hands = \"sandbox\"\n[environments.sandbox]\nprovider = \"local\"\nmax_lifetime = \"10m\"\n",
        )?;
        let providers = config
            .registry_providers(&Default::default(), &crate::boxes::environment()?)
            .await?;
        let transport = Transport::new(
            config,
            TransportHost {
                providers,
                documents: run.documents(),
                session: id.to_string(),
                labels: BTreeMap::from([("agentbox-demo".to_string(), id.to_string())]),
                on_lost: None,
                prepare: None,
            },
        )?;
        // A holder that died left its box's programs running: they end before this step.
        if run.took_over() {
            let ended = transport.end_left_programs(&ctx).await?;
            if ended > 0 {
                eprintln!("agentbox: ended {ended} programs an earlier holder left in the run's box");
            }
        }
        let env = transport
            .env("chat")
            .ok_or_else(|| Error::unknown("the demo's config names hands"))?;
        (Some(transport), env)
    };
    let ledger = Arc::new(SqliteLedger::open(&run.dir().join("ledger.db"))?);
    let recorder = Recorder::open(ledger, id).await?;
    let model = match step {
        1 => ScriptedModel::new()
            .then_call("bash", json!({"command": "hostname"}))
            .then(|c| Reply {
                text: format!("The box's machine is called {}.", last_tool_text(c).trim()),
                tool_calls: vec![],
                wait_ms: None,
            }),
        2 => ScriptedModel::new()
            .then(|c| {
                let name = c
                    .iter()
                    .rev()
                    .find(|m| m.role == "assistant" && !text_of(m).is_empty())
                    .map(|m| text_of(m).to_string())
                    .unwrap_or_default();
                Reply {
                    text: String::new(),
                    tool_calls: vec![agent::ToolCall {
                        id: "note".into(),
                        name: "write".into(),
                        args: json!({"path": "note.md", "content": format!("{name}\n")}),
                    }],
                    wait_ms: None,
                }
            })
            .then(|_| Reply {
                text: "Noted in note.md.".into(),
                tool_calls: vec![],
                wait_ms: None,
            }),
        _ => ScriptedModel::new()
            .then_call("read", json!({"path": "note.md"}))
            .then(|c| {
                let first = c.iter().find(|m| m.role == "user").map(text_of).unwrap_or("(none)");
                Reply {
                    text: format!(
                        "Your first question was \"{first}\", and note.md says: {}",
                        last_tool_text(c).trim()
                    ),
                    tool_calls: vec![],
                    wait_ms: None,
                }
            }),
    };
    let answer = agent::answer(&run, &model, &*env, Some(&recorder), question, &ctx).await?;
    let place = match &transport {
        Some(_) => format!("box {}", env.id()),
        None => format!("the run's workspace on host {}", runs.host()),
    };
    println!(
        "generation {} (pid {} on host {}): asked \"{question}\"",
        run.generation(),
        std::process::id(),
        runs.host()
    );
    if let Some(note) = moved {
        println!("  told the agent: {note}");
    }
    println!("  tool call ran in {place}\n  answered: {answer}");
    if let Some(transport) = transport.as_ref().filter(|_| step == 3) {
        let ended = transport.destroy(&ctx).await?;
        println!(
            "  ended the box{} {}",
            if ended.len() == 1 { "" } else { "es" },
            ids(&ended)
        );
    } else if let Some(transport) = transport {
        // The box stays for the next generation, which finds it in the run's documents.
        transport.release();
    }
    let rec = run.release().await?;
    println!(
        "  released: {:?}, {} messages in the store",
        rec.status,
        message_count(&runs, id)?
    );
    Ok(())
}

fn ids(ids: &[agentbox_core::SandboxId]) -> String {
    ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
}

fn message_count(runs: &Runs, id: &str) -> Result<usize> {
    let store = agentbox_runs::Store::read(&runs.dir(id).join("store.db"))?;
    Ok(store.messages()?.len())
}

fn last_tool_text(c: &[agentbox_runs::Message]) -> String {
    c.iter()
        .rev()
        .find(|m| m.role == "tool")
        .map(|m| text_of(m).to_string())
        .unwrap_or_default()
}

/// The hidden arguments of one generation.
#[derive(clap::Args)]
pub(crate) struct StepArgs {
    #[arg(long)]
    pub root: PathBuf,
    #[arg(long)]
    pub run: String,
    #[arg(long)]
    pub step: usize,
    /// Tool calls in the run's workspace, where this generation runs, not in a local box.
    #[arg(long)]
    pub in_workspace: bool,
}

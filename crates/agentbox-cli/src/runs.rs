//! `agentbox runs …`: durable runs from the command line.

use std::path::PathBuf;

use agentbox_core::{Error, Result};
use agentbox_runs::{RunRecord, Runs, read_status};
use clap::Subcommand;

#[derive(Subcommand)]
pub(crate) enum RunsCommand {
    /// Make a run and print its id.
    New {
        /// Its id (a new one when left out).
        id: Option<String>,
        #[arg(long, help = ROOT_HELP)]
        root: Option<PathBuf>,
    },
    /// Open a run (the next generation), run a command in its workspace, and release it.
    Open {
        /// The run.
        id: String,
        #[arg(long, help = ROOT_HELP)]
        root: Option<PathBuf>,
        /// The command, run with AGENTBOX_RUN, AGENTBOX_RUN_DIR and AGENTBOX_RUN_GENERATION set;
        /// with none, the run is held until stdin ends.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// A run's record, read with no claim (also while another process holds it).
    Status {
        /// The run: its id (under `--root`), or its directory (a path with a `/`, as the demo
        /// prints it).
        #[arg(value_name = "ID|DIR")]
        run: String,
        #[arg(long, help = ROOT_HELP)]
        root: Option<PathBuf>,
    },
    /// Seal a run whose holder is gone (its claim is free): open it and release it.
    Release {
        /// The run.
        id: String,
        #[arg(long, help = ROOT_HELP)]
        root: Option<PathBuf>,
    },
    /// Park a run: open it and release it until a deadline, when `supervise` starts it again.
    Park {
        /// The run.
        id: String,
        /// How long from now (90s, 10m, 6h).
        #[arg(long = "for", value_name = "DURATION")]
        wait: String,
        #[arg(long, help = ROOT_HELP)]
        root: Option<PathBuf>,
    },
    /// Fork a sealed run into N runs, each with its parent recorded.
    Fork {
        /// The run.
        id: String,
        /// How many.
        #[arg(short, long, default_value_t = 1)]
        n: usize,
        #[arg(long, help = ROOT_HELP)]
        root: Option<PathBuf>,
    },
    /// Every run.
    Ls {
        #[arg(long, help = ROOT_HELP)]
        root: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Start each parked run whose deadline has come: `CMD` with AGENTBOX_RUN and AGENTBOX_RUNS set.
    Supervise {
        /// Where runs live.
        root: PathBuf,
        /// The command that picks a run up.
        #[arg(long, num_args = 1.., allow_hyphen_values = true, required = true)]
        command: Vec<String>,
    },
}

/// `--root`'s help, the same for every subcommand.
const ROOT_HELP: &str = "Where runs live: <ROOT>/runs/<ID> [default: $AGENTBOX_HOME]";

fn root(r: Option<PathBuf>) -> Result<PathBuf> {
    match r {
        Some(r) => Ok(r),
        None => agentbox_providers::home::default_home(),
    }
}

fn show(r: &RunRecord) -> String {
    let holder = r
        .holder
        .as_ref()
        .map(|h| format!(" holder=pid {} on {}", h.pid, h.host))
        .unwrap_or_default();
    let parent = r.parent.as_ref().map(|p| format!(" parent={p}")).unwrap_or_default();
    let deadline = r.deadline_ms.map(|d| format!(" deadline_ms={d}")).unwrap_or_default();
    format!(
        "{} {:?} generation={}{holder}{parent}{deadline}",
        r.id, r.status, r.generation
    )
    .replace(" New ", " new ")
}

pub(crate) async fn run(cmd: RunsCommand) -> Result<i32> {
    match cmd {
        RunsCommand::New { id, root: r } => {
            let rec = Runs::new(root(r)?).create(id.as_deref())?;
            println!("{}", rec.id);
            Ok(0)
        }
        RunsCommand::Status { run, root: r } => {
            let dir = if run.contains('/') {
                if r.is_some() {
                    return Err(Error::invalid(format!(
                        "--root: {run} is a run's directory, which needs no root"
                    )));
                }
                PathBuf::from(&run)
            } else {
                agentbox_runs::run::check_id(&run).map_err(|e| {
                    Error::new(
                        e.code(),
                        format!("{} (a run's directory is a path with a '/')", e.message()),
                    )
                })?;
                Runs::new(root(r)?).dir(&run)
            };
            if !dir.join("run.json").is_file() {
                return Err(Error::not_found(format!(
                    "{}: no such run (its directory holds no run.json)",
                    dir.display()
                )));
            }
            let rec = read_status(&dir)?;
            println!(
                "{}",
                serde_json::to_string_pretty(&rec).map_err(|e| Error::unknown(e.to_string()))?
            );
            Ok(0)
        }
        RunsCommand::Release { id, root: r } => {
            let run = Runs::new(root(r)?).open(&id).await?;
            let rec = run.release().await?;
            println!("{}", show(&rec));
            Ok(0)
        }
        RunsCommand::Park { id, wait, root: r } => {
            let wait = agentbox_core::parse_duration(&wait).map_err(|e| e.context("--for"))?;
            let run = Runs::new(root(r)?).open(&id).await?;
            let rec = match agentbox_runs::agent::park_if_waiting(run, wait, std::time::Duration::ZERO).await? {
                Ok(rec) => rec,
                Err(run) => run.release().await?,
            };
            println!("{}", show(&rec));
            Ok(0)
        }
        RunsCommand::Fork { id, n, root: r } => {
            for kid in Runs::new(root(r)?).fork(&id, n)? {
                println!("{kid}");
            }
            Ok(0)
        }
        RunsCommand::Ls { root: r, json } => {
            let all = Runs::new(root(r)?).list()?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&all).map_err(|e| Error::unknown(e.to_string()))?
                );
            } else {
                for rec in &all {
                    println!("{}", show(rec));
                }
            }
            Ok(0)
        }
        RunsCommand::Open { id, root: r, command } => {
            let run = Runs::new(root(r)?).open(&id).await?;
            eprintln!("agentbox: holding run {id} as generation {}", run.generation());
            let code = if command.is_empty() {
                let mut sink = Vec::new();
                tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut sink)
                    .await
                    .map_err(|e| Error::io(e, "reading stdin"))?;
                0
            } else {
                let status = tokio::process::Command::new(&command[0])
                    .args(&command[1..])
                    .current_dir(run.workspace())
                    .env("AGENTBOX_RUN", &id)
                    .env("AGENTBOX_RUN_DIR", run.dir())
                    .env("AGENTBOX_RUN_GENERATION", run.generation().to_string())
                    .status()
                    .await
                    .map_err(|e| Error::io(e, format!("running {:?}", command[0])))?;
                status.code().unwrap_or(1)
            };
            let rec = run.release().await?;
            eprintln!("agentbox: released: {}", show(&rec));
            Ok(code)
        }
        RunsCommand::Supervise { root: r, command } => {
            let runs = Runs::new(&r);
            use agentbox_core::Clock;
            let due = runs.due(agentbox_core::SystemClock.now_ms())?;
            for rec in due {
                println!("starting {} (parked until {} ms)", rec.id, rec.deadline_ms.unwrap_or(0));
                let status = tokio::process::Command::new(&command[0])
                    .args(&command[1..])
                    .env("AGENTBOX_RUN", &rec.id)
                    .env("AGENTBOX_RUNS", &r)
                    .status()
                    .await
                    .map_err(|e| Error::io(e, format!("running {:?}", command[0])))?;
                println!("{}: {}", rec.id, status);
            }
            Ok(0)
        }
    }
}

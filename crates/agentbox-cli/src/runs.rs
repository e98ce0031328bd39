//! `agentbox runs …`: durable runs from the command line.

use std::path::PathBuf;

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Error, ErrorCode, Result};
use agentbox_runs::lease::Leases;
use agentbox_runs::{RunRecord, RunStatus, Runs, read_status};
use clap::Subcommand;

use crate::drivers::{self, DriverArgs};

/// How runs are claimed: on this machine (the directory's lock) unless a PostgreSQL
/// connection file is given, when by leases across hosts.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct Claims {
    /// Claim runs across hosts by PostgreSQL leases: a file whose first line is the libpq
    /// connection string (a file, so a password stays out of argv, env and logs).
    #[arg(long, env = "AGENTBOX_RUNS_POSTGRES_FILE", value_name = "FILE")]
    pub postgres_file: Option<PathBuf>,
    /// How long a lease lasts unrenewed (a holder renews it every third of this).
    #[arg(long, default_value = "30s", value_name = "DURATION")]
    pub lease: String,
}

impl Claims {
    /// The runs under `root`, claimed as these options say.
    async fn runs(&self, root: PathBuf) -> Result<Runs> {
        // Started by a driver: this open completes a move asked to it.
        Ok(drivers::started_here(self.claimed(root).await?))
    }

    async fn claimed(&self, root: PathBuf) -> Result<Runs> {
        let Some(f) = &self.postgres_file else {
            return Ok(Runs::new(root));
        };
        let ttl = agentbox_core::parse_duration(&self.lease).map_err(|e| e.context("--lease"))?;
        if ttl < Duration::from_secs(1) {
            return Err(Error::invalid(format!("--lease: {}: at least 1s", self.lease)));
        }
        let config = drivers::read_postgres_file(f)?;
        let leases = Leases::connect(&config).await?;
        Ok(Runs::with_leases(root, Arc::new(leases), ttl))
    }
}

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
        #[command(flatten)]
        claims: Claims,
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
    /// Start each parked run whose deadline has come, and each sealed run a move asked for
    /// this driver: `CMD` on the driver, with AGENTBOX_RUN and AGENTBOX_RUNS set; each start and
    /// its exit recorded in the run's starts.jsonl.
    Supervise {
        /// Where runs live.
        root: PathBuf,
        #[command(flatten)]
        start: Generation,
    },
    /// Start one generation of a run on a driver, wait for it, and record it.
    Start {
        /// The run.
        id: String,
        #[arg(long, help = ROOT_HELP)]
        root: Option<PathBuf>,
        #[command(flatten)]
        start: Generation,
    },
    /// Move a run: ask its holder to let it go at its next step boundary (never mid-step),
    /// then start the next generation on the target's driver, which tells the agent where it
    /// now runs.
    Move {
        /// The run.
        id: String,
        /// Where the next generation runs.
        #[arg(long, value_enum)]
        to: drivers::DriverKind,
        /// How long the holder may take to reach a step boundary.
        #[arg(long, default_value = "10m", value_name = "DURATION")]
        wait: String,
        #[arg(long, help = ROOT_HELP)]
        root: Option<PathBuf>,
        /// docker: the runs' root is this named volume (mounted at /runs); daytona
        /// (required): the Daytona volume holding it, mounted at /runs.
        #[arg(long, value_name = "NAME")]
        volume: Option<String>,
        /// docker, kube, systemd, daytona: the generation's lifetime.
        #[arg(long, default_value = "1h", value_name = "DURATION")]
        lifetime: String,
        #[command(flatten)]
        kube: drivers::KubeArgs,
        #[command(flatten)]
        claims: Claims,
        /// The command that opens the run on the target.
        #[arg(long, num_args = 1.., allow_hyphen_values = true, required = true)]
        command: Vec<String>,
    },
    /// A scripted agent (no key): opens the run, counts to --steps one tool call a step
    /// (each `sleep`ing --step-time in the workspace), honours a move at each step boundary,
    /// and releases the run. A later generation goes on with an unfinished count. It prints
    /// `kept SEQ ROLE` once each message is durable.
    #[command(hide = true)]
    Agent {
        /// The run.
        #[arg(env = "AGENTBOX_RUN")]
        id: String,
        #[arg(long, env = "AGENTBOX_RUNS", help = ROOT_HELP)]
        root: Option<PathBuf>,
        #[command(flatten)]
        claims: Claims,
        /// How many steps the count takes.
        #[arg(long, default_value_t = 3)]
        steps: usize,
        /// How long each step's tool call sleeps.
        #[arg(long, default_value = "0s", value_name = "DURATION")]
        step_time: String,
        /// How long to try the claim again while another holds the run (a holder letting go,
        /// or a dead holder's lease running out).
        #[arg(long, default_value = "10s", value_name = "DURATION")]
        claim_wait: String,
    },
}

/// How `start` and `supervise` start a generation: where, claimed how, with what command.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct Generation {
    #[command(flatten)]
    driver: DriverArgs,
    #[command(flatten)]
    claims: Claims,
    /// The command that opens the run there (`agentbox runs agent`, say), with AGENTBOX_RUN and
    /// AGENTBOX_RUNS set.
    #[arg(long, num_args = 1.., allow_hyphen_values = true, required = true)]
    command: Vec<String>,
}

impl Generation {
    /// Start one generation of run `id` under `root`, and wait for it.
    async fn start(&self, root: &std::path::Path, id: &str) -> Result<drivers::Start> {
        drivers::start(
            &self.driver,
            root,
            id,
            self.claims.postgres_file.as_deref(),
            &self.command,
        )
        .await
    }
}

/// `--root`'s help, the same for every subcommand.
const ROOT_HELP: &str = "Where runs live: <ROOT>/runs/<ID> [default: $AGENTBOX_HOME]";

fn root(r: Option<PathBuf>) -> Result<PathBuf> {
    match r {
        Some(r) => Ok(r),
        None => agentbox_providers::home::default_home(),
    }
}

pub(crate) fn show(r: &RunRecord) -> String {
    let holder = r
        .holder
        .as_ref()
        .map(|h| format!(" holder=pid {} on {}", h.pid, h.host))
        .unwrap_or_default();
    let parent = r.parent.as_ref().map(|p| format!(" parent={p}")).unwrap_or_default();
    let deadline = r
        .deadline_ms
        .map(|d| {
            format!(
                " deadline={}",
                agentbox_core::rfc3339(i64::try_from(d).unwrap_or(i64::MAX))
            )
        })
        .unwrap_or_default();
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
            let mut shown = serde_json::to_value(&rec).map_err(|e| Error::unknown(e.to_string()))?;
            shown["generations"] =
                serde_json::to_value(agentbox_runs::history::read(&dir)?).map_err(|e| Error::unknown(e.to_string()))?;
            println!(
                "{}",
                serde_json::to_string_pretty(&shown).map_err(|e| Error::unknown(e.to_string()))?
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
        RunsCommand::Open {
            id,
            root: r,
            claims,
            command,
        } => {
            let run = claims.runs(root(r)?).await?.open(&id).await?;
            let _keeper = run.keep_claim();
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
        RunsCommand::Supervise { root: r, start } => {
            let runs = Runs::new(&r);
            use agentbox_core::Clock;
            let mut todo: Vec<(RunRecord, String)> = runs
                .due(agentbox_core::SystemClock.now_ms())?
                .into_iter()
                .map(|rec| {
                    let until = i64::try_from(rec.deadline_ms.unwrap_or(0)).unwrap_or(i64::MAX);
                    let why = format!("parked until {}", agentbox_core::rfc3339(until));
                    (rec, why)
                })
                .collect();
            for rec in runs.list()? {
                let asked = agentbox_runs::moves::asked(&runs.dir(&rec.id)).unwrap_or_else(|e| {
                    eprintln!("agentbox: run {}: {}", rec.id, e.message());
                    None
                });
                if rec.status == RunStatus::Sealed
                    && let Some(m) = asked
                    && m.to == start.driver.driver.name()
                {
                    let why = format!("a move to {} asked by {}", m.to, m.by);
                    todo.push((rec, why));
                }
            }
            for (rec, why) in todo {
                println!("starting {} ({why})", rec.id);
                let ran = start.start(&r, &rec.id).await?;
                println!("{}: {} exited {}", rec.id, ran.place, ran.exit);
            }
            Ok(0)
        }
        RunsCommand::Start { id, root: r, start } => {
            let r = root(r)?;
            agentbox_runs::run::check_id(&id)?;
            let ran = start.start(&r, &id).await?;
            println!("{id}: {} exited {}", ran.place, ran.exit);
            Ok(ran.exit)
        }
        RunsCommand::Move {
            id,
            to,
            wait,
            root: r,
            volume,
            lifetime,
            kube,
            claims,
            command,
        } => {
            let wait = agentbox_core::parse_duration(&wait).map_err(|e| e.context("--wait"))?;
            let r = root(r)?;
            let runs = Runs::new(&r);
            agentbox_runs::run::check_id(&id)?;
            let dir = runs.dir(&id);
            let before = read_status(&dir).map_err(|e| match e.code() {
                ErrorCode::NotFound => Error::not_found(format!("run {id}: no such run under {}", r.display())),
                _ => e,
            })?;
            agentbox_runs::moves::ask(&dir, to.name(), runs.host())?;
            if before.status == RunStatus::Open {
                let who = before.holder.as_ref().map(|h| format!("pid {} on {}", h.pid, h.host));
                println!(
                    "asked {} to let run {id} go at its next step boundary (waiting up to {}s)",
                    who.as_deref().unwrap_or("its holder"),
                    wait.as_secs()
                );
            }
            let deadline = tokio::time::Instant::now() + wait;
            let released = loop {
                let now = read_status(&dir)?;
                if now.status != RunStatus::Open {
                    break now;
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(Error::timeout(format!(
                        "move: run {id} is still held by {} after {}s: it reached no step boundary (the request stays in {}; a holder that is gone is released with `agentbox runs release`, or its lease runs out)",
                        now.holder
                            .map(|h| format!("pid {} on {}", h.pid, h.host))
                            .unwrap_or_default(),
                        wait.as_secs(),
                        dir.join("move.json").display()
                    )));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            println!(
                "run {id} let go at generation {} by {}; starting the next on {}",
                released.generation,
                released.holder.as_ref().map(|h| h.host.as_str()).unwrap_or("nobody"),
                to.name()
            );
            let driver = DriverArgs {
                driver: to,
                volume,
                lifetime,
                kube,
            };
            let ran = drivers::start(&driver, &r, &id, claims.postgres_file.as_deref(), &command).await?;
            let after = read_status(&dir)?;
            println!(
                "run {id}: generation {} ran in {} and exited {}",
                after.generation, ran.place, ran.exit
            );
            Ok(ran.exit)
        }
        RunsCommand::Agent {
            id,
            root: r,
            claims,
            steps,
            step_time,
            claim_wait,
        } => {
            let step_time = agentbox_core::parse_duration(&step_time).map_err(|e| e.context("--step-time"))?;
            let claim_wait = agentbox_core::parse_duration(&claim_wait).map_err(|e| e.context("--claim-wait"))?;
            let runs = claims.runs(root(r)?).await?;
            crate::scripted_agent::run(&runs, &id, steps, step_time, claim_wait).await
        }
    }
}

//! `agentbox`: make boxes, run programs in them, measure them.
//!
//! Exit codes: a usage error is 2 (clap's, and agentbox's own checks of arguments marked with
//! [`usage`]), any other error 1, each with one line naming the problem on stderr; `box exec`
//! exits with the program's own code, or 124 when its `--timeout` ended it.

mod bench;
mod boxes;
mod cp;
mod demo;
mod drivers;
mod ledger;
mod mcp;
mod procs;
mod runs;
mod scripted_agent;
mod serve;
mod sync;
mod term;
mod tool;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Sandboxes for AI agents' tool calls.
#[derive(Parser)]
#[command(name = "agentbox", version, about, propagate_version = true)]
struct Cli {
    /// Log to stderr: -v info, -vv debug (RUST_LOG wins when set).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Make, use and end boxes.
    #[command(name = "box", subcommand)]
    Box(boxes::BoxCommand),
    /// Run one of the agent's tools (read, write, edit, bash, ls, grep, find) on a box.
    Tool(tool::ToolArgs),
    /// A run's files between this machine and a box: extract, seed, pull.
    #[command(subcommand)]
    Sync(sync::SyncCommand),
    /// Pick up a run: three processes, one after another, each the next generation of one run
    /// answering one question of the same chat with a tool call in a local box. No key.
    /// `--move docker` starts the second generation in a Docker container.
    Demo(demo::DemoArgs),
    /// One generation of the demo (the demo runs it).
    #[command(hide = true)]
    DemoStep(demo::StepArgs),
    /// Hands in a box for any MCP client, over stdio.
    Mcp(mcp::McpArgs),
    /// The service: the HTTP API over every provider, for programs in any language, with API
    /// keys (`agentbox serve keys add NAME`). See docs/serve.md.
    Serve(serve::ServeArgs),
    /// Durable runs: new, open, status, release, park, fork, ls, supervise, start, move.
    #[command(subcommand)]
    Runs(runs::RunsCommand),
    /// Measure boxes side by side with their baseline, as ratios.
    Bench(bench::BenchArgs),
    /// What boxes cost: a receipts file's totals by provider and kind.
    Receipts(ledger::ReceiptsArgs),
    /// What tool calls did: a target's history across runs, or a run's calls.
    Ledger(ledger::LedgerArgs),
    /// The in-box runner: one connection for every process and file of a box. `--listen ADDR`
    /// (repeatable; `unix:PATH` for a unix socket; default 0.0.0.0:7700) or `--stdio`; see
    /// `agentbox runner --help`.
    #[command(disable_help_flag = true)]
    Runner {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// The file name a box's copy of its runner has (`/run/agentbox-runner` in a namespace box,
/// `/opt/agentbox/agentbox-runner` in a container), whichever binary was copied there.
const RUNNER_NAME: &str = "agentbox-runner";

/// The runner's arguments when this executable runs under the runner's own name: providers
/// start a box's runner by its path with the runner's subcommands (`probe`, `serve`, `relay`,
/// ...), and with `agentbox` alone installed that path is this binary, so it answers them as
/// `agentbox-runner` would. A leading `runner` (the prefix `agentbox` passes itself) is
/// dropped, so `agentbox-runner runner serve` is `agentbox-runner serve`. `None` under any
/// other name.
fn as_runner(argv: &[std::ffi::OsString]) -> Option<Result<Vec<String>, String>> {
    let name = std::path::Path::new(argv.first()?).file_name()?;
    if name != RUNNER_NAME {
        return None;
    }
    let args: Result<Vec<String>, String> = argv[1..]
        .iter()
        .map(|a| {
            a.clone()
                .into_string()
                .map_err(|a| format!("argument {a:?} is not UTF-8"))
        })
        .collect();
    Some(args.map(|mut a| {
        if a.first().map(String::as_str) == Some("runner") {
            a.remove(0);
        }
        a
    }))
}

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    match as_runner(&argv) {
        Some(Ok(args)) => return ExitCode::from(agentbox_runner::main_with_args(&args).clamp(0, 255) as u8),
        Some(Err(e)) => {
            eprintln!("{RUNNER_NAME}: {e}");
            return ExitCode::from(2);
        }
        None => {}
    }
    let cli = match Cli::try_parse_from(&argv) {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                return ExitCode::from(2);
            }
            let text = e.render().to_string();
            let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
            let first = lines.next().unwrap_or("usage error").trim_start_matches("error: ");
            // "the following required arguments were not provided:" names them on the next line.
            let line = match (first.ends_with(':'), lines.next()) {
                (true, Some(next)) => format!("{first} {next}"),
                _ => first.to_string(),
            };
            eprintln!("agentbox: {line} (see agentbox --help)");
            return ExitCode::from(2);
        }
    };
    if let Command::Runner { args } = &cli.command {
        // The supervisor is synchronous and must not start inside a runtime.
        return ExitCode::from(agentbox_runner::main_with_args(args).clamp(0, 255) as u8);
    }
    logging(cli.verbose, matches!(cli.command, Command::Serve(_)));
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agentbox: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = rt.block_on(async {
        match cli.command {
            Command::Box(cmd) => boxes::run(cmd).await,
            Command::Tool(args) => tool::run(args).await,
            Command::Sync(cmd) => sync::run(cmd).await,
            Command::Demo(a) => demo::run(a).await.map(|_| 0),
            Command::DemoStep(a) => demo::step(&a.root, &a.run, a.step, a.in_workspace).await.map(|_| 0),
            Command::Runs(cmd) => runs::run(cmd).await,
            Command::Mcp(a) => mcp::run(a).await,
            Command::Serve(a) => serve::run(a).await,
            Command::Bench(args) => bench::run(args).await.map(|_| 0),
            Command::Receipts(args) => ledger::receipts(args),
            Command::Ledger(args) => ledger::ledger(args).await,
            Command::Runner { .. } => unreachable!("handled above"),
        }
    });
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("agentbox: {}", one_line(&e.to_string()));
            ExitCode::from(if is_usage(&e) { 2 } else { 1 })
        }
    }
}

/// What marks an error as one of the command line's arguments (see [`usage`]).
#[derive(Debug)]
struct Usage;

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a usage error")
    }
}

impl std::error::Error for Usage {}

/// `e`, marked as a usage error: an argument agentbox's own checks refused (an unknown
/// `--provider`, `box cp` with neither side a box), so the command exits 2 as clap's own
/// usage errors do.
pub(crate) fn usage(e: agentbox_core::Error) -> agentbox_core::Error {
    e.with_source(Usage)
}

/// Whether [`usage`] marked `e`.
fn is_usage(e: &agentbox_core::Error) -> bool {
    std::error::Error::source(e).is_some_and(|s| s.downcast_ref::<Usage>().is_some())
}

/// Logs go to stderr, so stdout carries only what a command prints (for `mcp`, only protocol
/// messages). `RUST_LOG` (tracing's filter syntax) wins when set; otherwise agentbox's own
/// warnings and every crate's errors, agentbox at info (and others' warnings) with `-v`, and
/// agentbox at debug with `-vv`. `agentbox serve` logs each request (its access log) always;
/// another command running the service inside (`bench serve`) only when asked.
fn logging(verbose: u8, serving: bool) {
    use tracing_subscriber::EnvFilter;
    let from_verbosity = || {
        EnvFilter::new(match (verbose, serving) {
            // Other crates' warnings (rmcp's for every client error, say) only with -v; an
            // image pull's progress (its layers and bytes) always, as `docker pull` shows it,
            // and the service's access log (one line per request).
            (0, true) => "error,agentbox=warn,agentbox_providers::docker::pull=info,agentbox_server::access=info",
            (0, false) => "error,agentbox=warn,agentbox_providers::docker::pull=info",
            (1, _) => "warn,agentbox=info",
            _ => "warn,agentbox=debug",
        })
    };
    let filter = match std::env::var("RUST_LOG") {
        Ok(s) if !s.trim().is_empty() => EnvFilter::try_new(&s).unwrap_or_else(|e| {
            eprintln!("agentbox: RUST_LOG: {e}; logging as without it");
            from_verbosity()
        }),
        _ => from_verbosity(),
    };
    // A second subscriber cannot be installed; nothing in this process installs one.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

pub(crate) fn one_line(s: &str) -> String {
    s.lines().map(str::trim).collect::<Vec<_>>().join(" ")
}

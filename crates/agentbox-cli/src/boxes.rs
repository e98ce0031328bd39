//! `agentbox box …`: the contract, one subcommand per call.

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{
    Ctx, Error, ExecOptions, Labels, Mount, Network, Provider, Result, Sandbox, SandboxId, Spec, parse_duration,
};
use agentbox_providers::helper::HelperCommand;
use agentbox_providers::registry::{self, Entry, Environment, Options};
use clap::{Args, Subcommand};

use crate::{procs, term};

#[derive(Subcommand)]
pub(crate) enum BoxCommand {
    /// Make a box and print its id.
    Create(Box<CreateArgs>),
    /// Run a program in a box, passing stdin and streaming stdout and stderr; exit with its code.
    /// `-it` gives it a terminal, as `docker exec -it` does; `--detach` leaves it running.
    Exec(Box<ExecArgs>),
    /// A shell in a box, in a terminal (bash where the box has it, else sh): `exec -it` with
    /// the box's shell.
    Shell {
        /// The box's id.
        id: SandboxId,
        /// The working directory, relative to the box's workspace.
        #[arg(long)]
        cwd: Option<String>,
    },
    /// List the processes a box keeps (running, and ended ones not yet forgotten), one line
    /// each; agentbox's own helpers in the box (its runner's probes and relays) only with --all.
    Ps {
        /// The box's id.
        id: SandboxId,
        /// Agentbox's own helper processes too.
        #[arg(short, long)]
        all: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Send a signal to a process of a box (`box exec --detach` prints its handle).
    Kill {
        /// The box's id.
        id: SandboxId,
        /// The process's handle.
        handle: u64,
        /// The signal: TERM, KILL, INT, HUP... (with or without SIG), or its number.
        #[arg(short, long, default_value = "TERM", value_parser = procs::signal)]
        signal: i32,
    },
    /// Print a process's output (stdout on stdout, stderr on stderr), from a byte number on.
    Logs {
        /// The box's id.
        id: SandboxId,
        /// The process's handle (`box exec --detach` prints it; `box ps` lists them).
        handle: u64,
        /// Wait for more output until the process ends.
        #[arg(short, long)]
        follow: bool,
        /// From this byte of its output on (stdout and stderr counted together from 0).
        #[arg(long, default_value_t = 0)]
        after: u64,
    },
    /// Attach to a process: its output from a byte number on, this stdin to its stdin, this
    /// terminal to its terminal (raw, when it has one); exit with its code. Ctrl-P Ctrl-Q (in
    /// its terminal) or a signal here (Ctrl-C where it has no terminal) lets go of it, and it
    /// runs on.
    Attach {
        /// The box's id.
        id: SandboxId,
        /// The process's handle.
        handle: u64,
        /// Replay its output from this byte on (0: all the box still keeps).
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Leave its stdin alone (without it, the end of this stdin ends the program's).
        #[arg(long)]
        no_stdin: bool,
    },
    /// List running boxes: every provider's this build has, or one provider's.
    Ls {
        /// Without it, each provider of this build is asked, and one that cannot answer (no
        /// Docker engine, say) is left out with a line on stderr.
        #[arg(long, help = provider_help("Only this provider's boxes (else every provider's)"))]
        provider: Option<String>,
        /// Only boxes with this label (repeatable).
        #[arg(long = "label", value_name = "K=V", value_parser = key_value)]
        labels: Vec<(String, String)>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a box's facts as JSON.
    Facts {
        /// The box's id.
        id: SandboxId,
    },
    /// Where a port of the box is reached from this machine (`--port` at create): host and
    /// port, or an URL.
    Endpoint {
        /// The box's id.
        id: SandboxId,
        /// The port in the box.
        port: u16,
        /// Print JSON: host, port, and url where it has one.
        #[arg(long)]
        json: bool,
    },
    /// What a box's egress proxy refused (a box made with `--allow`): time, host, port, the
    /// address the name resolved to, and the rule, oldest first.
    Net {
        /// The box's id.
        id: SandboxId,
        /// At most this many, the newest.
        #[arg(long, default_value_t = 100)]
        last: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Whether the box's disk keeps what it acknowledged, before a run lives on it: a writer
    /// appends ten records, each followed by an fsync, and is killed; a second process counts
    /// them. Exits 1 when an acknowledged record was lost.
    Probe {
        /// The box's id.
        id: SandboxId,
        /// The directory to probe, in the box [default: its workspace].
        #[arg(long)]
        dir: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// End boxes and every program in them.
    Rm {
        /// The boxes' ids.
        #[arg(required = true)]
        ids: Vec<SandboxId>,
    },
    /// Copy a file or a directory between this machine and a box, as `docker cp` does:
    /// `cp SRC ID:PATH` or `cp ID:PATH DEST`. A destination that is a directory, or ends in
    /// `/`, takes the source into it under its own name. `-` is stdin or stdout: a file's
    /// bytes, or a tar stream for a directory (out of a box) or a destination ending in `/`
    /// (into one).
    Cp {
        /// The source: a path here, ID:PATH, or - (stdin).
        src: String,
        /// The destination: a path here, ID:PATH, or - (stdout).
        dst: String,
    },
    /// The box of a name (and labels): made as `create` would when there is none, woken when
    /// it sleeps. Prints its id.
    ///
    /// A box of the name opened with another spec (lifetime, env, image...) is refused,
    /// naming each field that differs, unless --replace.
    Open {
        /// Its name: 1 to 63 lowercase letters, digits and '-'.
        name: String,
        /// End the box of the name, if any, and make one of this spec.
        #[arg(long)]
        replace: bool,
        #[command(flatten)]
        create: Box<CreateArgs>,
    },
    /// End the box of a name (and labels) and delete what was kept of it.
    Discard {
        /// Its name.
        name: String,
        /// The provider (without it, the default).
        #[arg(long, help = default_help("The provider"))]
        provider: Option<String>,
        /// A label of its label set (repeatable).
        #[arg(long = "label", value_name = "K=V", value_parser = key_value)]
        labels: Vec<(String, String)>,
    },
    /// Put a box to sleep: its files kept, its programs ended, its lifetime still counting.
    Sleep {
        /// The box's id.
        id: SandboxId,
    },
    /// Wake a sleeping box.
    Wake {
        /// The box's id.
        id: SandboxId,
    },
    /// Move a box's deadline: later `--by` a duration, or to `--in` a duration from now
    /// (which may be earlier). Prints the new deadline.
    Extend {
        /// The box's id.
        id: SandboxId,
        /// Later by this much (500ms, 90s, 10m, 6h, 2d).
        #[arg(long, value_parser = lifetime, required_unless_present = "within", conflicts_with = "within")]
        by: Option<Duration>,
        /// To this long from now.
        #[arg(long = "in", value_parser = lifetime)]
        within: Option<Duration>,
        /// Print JSON: the id and the deadline (`ends_at`, and `ends_at_ms` since the epoch).
        #[arg(long)]
        json: bool,
    },
    /// Keep a box's files as the snapshot NAME (`create --from-snapshot NAME` starts from it).
    Snapshot {
        /// The box's id.
        id: SandboxId,
        /// The snapshot's name.
        name: String,
    },
    /// List a provider's snapshots, or delete one with `--delete NAME`.
    Snapshots {
        /// The provider (without it, the default).
        #[arg(long, help = default_help("The provider"))]
        provider: Option<String>,
        /// Delete this snapshot.
        #[arg(long, value_name = "NAME")]
        delete: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make N boxes holding a box's files as they are now, each on its own from then on.
    /// Prints their ids.
    Fork {
        /// The box's id.
        id: SandboxId,
        /// How many (1 to 16).
        #[arg(short, default_value_t = 1)]
        n: usize,
        /// How long each may live.
        #[arg(long, default_value = "10m", value_parser = lifetime)]
        lifetime: Duration,
        /// A label of each (repeatable).
        #[arg(long = "label", value_name = "K=V", value_parser = key_value)]
        labels: Vec<(String, String)>,
        /// Print JSON: an array of each box's id and facts.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
pub(crate) struct ExecArgs {
    /// The box's id.
    id: SandboxId,
    /// The working directory, relative to the box's workspace.
    #[arg(long)]
    cwd: Option<String>,
    /// A variable for this program alone (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = key_value)]
    env: Vec<(String, String)>,
    /// Keep stdin open: with -t, this terminal's keys go to the program. (Without -t, stdin
    /// is passed to the program in any case.)
    #[arg(short, long)]
    interactive: bool,
    /// Give the program a terminal of this one's size, TERM from the environment; with -i,
    /// this terminal is raw while the program runs and follows its size.
    #[arg(short, long)]
    tty: bool,
    /// Leave the program running in the box and print its handle (for `box ps`, `box logs`,
    /// `box attach`); stdin is left open for a later attach.
    #[arg(short, long)]
    detach: bool,
    /// With --detach, print JSON: the box's id and the process's handle.
    #[arg(long, requires = "detach")]
    json: bool,
    /// The box ends the program this long after it starts (500ms, 90s, 10m, 6h, 2d).
    #[arg(long, value_parser = lifetime)]
    timeout: Option<Duration>,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    argv: Vec<String>,
}

#[derive(Args)]
pub(crate) struct CreateArgs {
    /// The provider (without it, the default: see `default_provider`).
    #[arg(long, help = default_help("The provider"))]
    provider: Option<String>,
    /// How long the box may live (500ms, 90s, 10m, 6h, 2d).
    #[arg(long, default_value = "10m", value_parser = lifetime)]
    lifetime: Duration,
    /// A label (repeatable).
    #[arg(long = "label", value_name = "K=V", value_parser = key_value)]
    labels: Vec<(String, String)>,
    /// A variable every program of the box sees (repeatable). Never a secret.
    #[arg(long = "env", value_name = "K=V", value_parser = key_value)]
    env: Vec<(String, String)>,
    /// The image (providers that take one).
    #[arg(long)]
    image: Option<String>,
    /// Start from this snapshot (`box snapshot`).
    #[arg(long, value_name = "NAME")]
    from_snapshot: Option<String>,
    /// CPUs.
    #[arg(long)]
    cpus: Option<f64>,
    /// Memory: MiB, or with a unit (512m, 4g).
    #[arg(long, value_parser = memory_mb)]
    memory: Option<u64>,
    /// `open`, `none` or `host`. Without it a namespace box has a network of its own whose way
    /// out is agentbox's egress proxy (the internet, never this machine or a private range);
    /// `host` shares this machine's network, loopback services included (namespace boxes only).
    #[arg(long, conflicts_with = "allow")]
    network: Option<String>,
    /// Reach only this (repeatable): a name, `*.name` (any name below it), an IPv4 or IPv6
    /// address or CIDR, each with an optional `:PORT` (IPv6 in brackets: `[2001:db8::/32]:443`).
    /// Enforced by agentbox's egress proxy (namespace and Docker boxes); `box net ID` shows what
    /// it refused.
    #[arg(long = "allow", value_name = "HOST[:PORT]")]
    allow: Vec<String>,
    /// Expose a port of the box (repeatable): `5432:tcp` a raw TCP socket on this machine's
    /// loopback (namespace boxes with `--allow`, Docker boxes), a bare number https (the
    /// clouds'); `box endpoint ID PORT` says where it is reached.
    #[arg(long = "port", value_name = "PORT[:tcp|:https]", value_parser = port_spec)]
    ports: Vec<agentbox_core::PortSpec>,
    /// The isolation asked for.
    #[arg(long)]
    isolation: Option<String>,
    /// Bind a directory of this machine: SRC:DST or SRC:DST:ro (repeatable; docker).
    #[arg(long = "mount", value_name = "SRC:DST[:ro]")]
    mounts: Vec<String>,
    /// At most this many processes in the box (docker).
    #[arg(long)]
    pids_limit: Option<i64>,
    /// Run every program as UID:GID (docker), so files written in a bind stay yours.
    #[arg(long, value_name = "UID:GID")]
    user: Option<String>,
    /// Drop every capability and forbid new privileges (docker): the default, kept so scripts
    /// that ask for it still work.
    #[arg(long, conflicts_with = "keep_capabilities")]
    drop_capabilities: bool,
    /// At most this much of the box's own files, as 10g or 512m (docker: where the engine can
    /// enforce a size; refused, naming why, where it cannot).
    #[arg(long, value_parser = parse_disk)]
    disk: Option<i64>,
    /// Keep Docker's default capabilities, with no-new-privileges off (docker), for programs
    /// that must change user; `box facts` says which a box got.
    #[arg(long)]
    keep_capabilities: bool,
    /// No in-box runner: each command and file operation is then a process of its own in the
    /// box (without it, a runner started in the box serves them all over one connection).
    #[arg(long)]
    no_runner: bool,
    /// Print the id and the facts as JSON.
    #[arg(long)]
    json: bool,
}

/// `SRC:DST[:ro]`, with SRC made canonical (it must exist on this machine).
fn mount(s: &str) -> Result<Mount> {
    let (rest, read_only) = match s.strip_suffix(":ro") {
        Some(r) => (r, true),
        None => (s.strip_suffix(":rw").unwrap_or(s), false),
    };
    let (src, dst) = rest
        .split_once(':')
        .ok_or_else(|| crate::usage(Error::invalid(format!("--mount: {s:?} is not SRC:DST or SRC:DST:ro"))))?;
    let source = std::fs::canonicalize(src).map_err(|e| Error::io(e, format!("--mount: source {src}")))?;
    Ok(Mount {
        source: source.to_string_lossy().into_owned(),
        target: dst.to_string(),
        read_only,
    })
}

fn port_spec(s: &str) -> std::result::Result<agentbox_core::PortSpec, String> {
    let (port, kind) = match s.split_once(':') {
        None => (s, agentbox_core::PortKind::Https),
        Some((p, "tcp")) => (p, agentbox_core::PortKind::Tcp),
        Some((p, "https")) => (p, agentbox_core::PortKind::Https),
        Some((_, k)) => return Err(format!("{s:?}: {k:?} is neither tcp nor https")),
    };
    match port.parse::<u16>() {
        Ok(port) if port > 0 => Ok(agentbox_core::PortSpec { port, kind }),
        _ => Err(format!("{s:?}: {port:?} is not a port (1 to 65535)")),
    }
}

fn key_value(s: &str) -> std::result::Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not K=V")),
    }
}

fn lifetime(s: &str) -> std::result::Result<Duration, String> {
    parse_duration(s).map_err(|e| e.message().to_string())
}

fn memory_mb(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    // A bare number is MiB here; with a unit it is Docker's size.
    let mb = if t.bytes().all(|b| b.is_ascii_digit()) {
        t.parse::<u64>().ok()
    } else {
        agentbox_providers::docker::parse_size(t).ok().map(|b| b as u64 >> 20)
    };
    mb.filter(|&n| n > 0)
        .ok_or_else(|| format!("{s:?} is not a memory size (512, 512m, 4g)"))
}

/// `--provider`'s help: `what`, and every provider there is.
pub(crate) fn provider_help(what: &str) -> String {
    format!("{what}: {}", registry::choices())
}

/// `--provider`'s help where it may be left out: [`provider_help`], and the default.
pub(crate) fn default_help(what: &str) -> String {
    format!(
        "{}. Without it: ${PROVIDER_ENV} when set, else namespace where namespace boxes work on this machine, \
         else local (saying why on stderr)",
        provider_help(what)
    )
}

/// The variable naming the provider of a command that names none (`box create`, `mcp`,
/// `bench`): a machine where namespace boxes cannot work sets it to `local` (or `docker`) once
/// rather than passing `--provider` to every command, and hears no warning.
pub(crate) const PROVIDER_ENV: &str = "AGENTBOX_PROVIDER";

/// The provider of a command that names none, and, when it is `local` only because namespace
/// boxes do not work here, why not (the probe's answer, for the caller to say).
///
/// `$AGENTBOX_PROVIDER` when set (a choice the user made: no probe, no fallback); else
/// `namespace` where its boxes work on this machine, since an agent's commands should be
/// isolated unless the user asks for less; else `local`, which isolates nothing. Whether they
/// work is the provider's own probe ([`agentbox_providers::namespace::available`]: one short
/// process of the runner that `env` finds) after the registry says this build has them.
pub(crate) async fn default_provider(env: &Environment) -> Result<(&'static str, Option<String>)> {
    if let Some(name) = env.var(PROVIDER_ENV).filter(|v| !v.is_empty()) {
        let name = name
            .to_str()
            .ok_or_else(|| Error::invalid(format!("{PROVIDER_ENV}: {name:?} is not UTF-8")))?;
        return Ok((entry(name, PROVIDER_ENV)?.name, None));
    }
    match namespace_works(env).await {
        Ok(()) => Ok(("namespace", None)),
        Err(e) => Ok(("local", Some(crate::one_line(e.message())))),
    }
}

async fn namespace_works(env: &Environment) -> Result<()> {
    registry::find("namespace")?;
    // The registry has no namespace entry compiled in off Linux, so this is Linux's alone.
    #[cfg(target_os = "linux")]
    agentbox_providers::namespace::available(&env.runner()?).await?;
    #[cfg(not(target_os = "linux"))]
    let _ = env;
    Ok(())
}

/// The registry's entry for `--provider NAME`, or without one the default
/// ([`default_provider`]), saying once on stderr why it is `local` when namespace boxes do not
/// work. A named provider is never probed.
pub(crate) async fn chosen(flag: Option<&str>, env: &Environment) -> Result<&'static Entry> {
    if let Some(name) = flag {
        return entry(name, "--provider");
    }
    let (name, why_not) = default_provider(env).await?;
    if let Some(why) = why_not {
        eprintln!(
            "agentbox: namespace boxes cannot be made here: {why}; using a local box, which isolates nothing \
             (--provider local or {PROVIDER_ENV}=local chooses it without this line)"
        );
    }
    entry(name, "the default provider")
}

/// What providers are made from: this process's variables, and this executable as the boxes'
/// helper (`agentbox runner …`: local boxes' supervisor, and the runner of a Docker box where no
/// `agentbox-runner` is found), so an installed `agentbox` needs no second file.
pub(crate) fn environment() -> Result<Environment> {
    let exe = std::env::current_exe().map_err(|e| Error::io(e, "finding the agentbox executable"))?;
    Ok(Environment::from_process().with_program(HelperCommand::new(exe, vec!["runner".into()])))
}

/// The registry's entry for `name`, an unknown one's error naming `flag` and every provider
/// (a usage error where `flag` is one: `--provider`).
pub(crate) fn entry(name: &str, flag: &str) -> Result<&'static Entry> {
    registry::find(name).map_err(|e| {
        let e = e.context(flag);
        if flag.starts_with("--") { crate::usage(e) } else { e }
    })
}

/// The provider called `name`, on its defaults (a runner in each box where it can start one):
/// how boxes are found by id, listed and measured.
pub(crate) async fn provider(name: &str) -> Result<Arc<dyn Provider>> {
    provider_with(name, &Options::default()).await
}

/// The provider called `name`, made by the registry with `options`.
pub(crate) async fn provider_with(name: &str, options: &Options) -> Result<Arc<dyn Provider>> {
    entry(name, "--provider")?.make(options, &environment()?).await
}

pub(crate) async fn attach(id: &SandboxId, ctx: &Ctx) -> Result<Arc<dyn Sandbox>> {
    entry(id.provider(), &format!("box {id}"))?
        .make(&Options::default(), &environment()?)
        .await?
        .attach(id, ctx)
        .await?
        .ok_or_else(|| Error::not_found(format!("box {id}: no such box, or it has ended")))
}

pub(crate) async fn run(cmd: BoxCommand) -> Result<i32> {
    let ctx = Ctx::background();
    match cmd {
        BoxCommand::Create(a) => {
            let json = a.json;
            let (spec, provider) = spec_and_provider(*a).await?;
            let b = provider.create(&spec, &ctx).await?;
            tracing::info!(box_id = %b.id(), runner = ?b.facts().runner, "box made");
            print_box(&*b, json);
            Ok(0)
        }
        BoxCommand::Open { name, replace, create } => {
            let json = create.json;
            let (spec, provider) = spec_and_provider(*create).await?;
            let b = agentbox_providers::lifecycle::open_as_asked(&*provider, &name, &spec, replace, &ctx).await?;
            tracing::info!(box_id = %b.id(), name, "box opened");
            print_box(&*b, json);
            Ok(0)
        }
        BoxCommand::Discard { name, provider, labels } => {
            let env = environment()?;
            let p = chosen(provider.as_deref(), &env)
                .await?
                .make(&Options::default(), &env)
                .await?;
            let labels: Labels = labels.into_iter().collect();
            let discarded = p.discard(&name, &labels, &ctx).await?;
            agentbox_providers::lifecycle::forget_opened(p.name(), &name, &labels)?;
            if discarded {
                println!("{name}");
                Ok(0)
            } else {
                eprintln!(
                    "agentbox: box discard: no {} box is named {name:?} with those labels",
                    p.name()
                );
                Ok(1)
            }
        }
        BoxCommand::Sleep { id } => {
            provider(id.provider()).await?.sleep(&id, &ctx).await?;
            println!("{id}");
            Ok(0)
        }
        BoxCommand::Wake { id } => {
            let b = provider(id.provider()).await?.wake(&id, &ctx).await?;
            println!("{}", b.id());
            Ok(0)
        }
        BoxCommand::Extend { id, by, within, json } => {
            let p = provider(id.provider()).await?;
            let now = {
                use agentbox_core::Clock;
                agentbox_core::SystemClock.now_ms()
            };
            let to = match (by, within) {
                (Some(by), _) => {
                    let b = p
                        .attach(&id, &ctx)
                        .await?
                        .ok_or_else(|| Error::not_found(format!("box {id}: no such box, or it has ended")))?;
                    let from = b
                        .facts()
                        .ends_at_ms
                        .ok_or_else(|| Error::unsupported(format!("box {id}: its facts state no deadline to move")))?;
                    from.saturating_add(by.as_millis() as u64)
                }
                (None, Some(d)) => now.saturating_add(d.as_millis() as u64),
                (None, None) => return Err(Error::invalid("extend: give --by or --in")),
            };
            let b = p.extend(&id, to, &ctx).await?;
            let ends = b.facts().ends_at_ms.unwrap_or(to);
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "id": b.id(), "ends_at": agentbox_core::rfc3339(ends as i64), "ends_at_ms": ends })
                );
            } else {
                println!("{}", agentbox_core::rfc3339(ends as i64));
            }
            Ok(0)
        }
        BoxCommand::Snapshot { id, name } => {
            let snap = provider(id.provider()).await?.snapshot(&id, &name, &ctx).await?;
            println!("{}", snap.name);
            Ok(0)
        }
        BoxCommand::Snapshots {
            provider: p,
            delete,
            json,
        } => {
            let env = environment()?;
            let p = chosen(p.as_deref(), &env)
                .await?
                .make(&Options::default(), &env)
                .await?;
            if let Some(name) = delete {
                if p.delete_snapshot(&name, &ctx).await? {
                    println!("{name}");
                    return Ok(0);
                }
                eprintln!(
                    "agentbox: box snapshots --delete: {} has no snapshot {name:?}",
                    p.name()
                );
                return Ok(1);
            }
            let snaps = p.snapshots(&ctx).await?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&snaps).map_err(|e| Error::unknown(e.to_string()))?
                );
            } else {
                for s in snaps {
                    let from = s.from.as_ref().map(|f| f.to_string()).unwrap_or_else(|| "-".into());
                    let at = s
                        .created_at_ms
                        .map(|t| agentbox_core::rfc3339(t as i64))
                        .unwrap_or_else(|| "-".into());
                    println!("{}\t{from}\t{at}", s.name);
                }
            }
            Ok(0)
        }
        BoxCommand::Fork {
            id,
            n,
            lifetime,
            labels,
            json,
        } => {
            let mut spec = Spec::new(lifetime);
            spec.labels = labels.into_iter().collect();
            let forks = provider(id.provider()).await?.fork(&id, n, &spec, &ctx).await?;
            if json {
                let rows: Vec<_> = forks
                    .iter()
                    .map(|b| serde_json::json!({ "id": b.id(), "facts": b.facts() }))
                    .collect();
                println!("{}", serde_json::Value::Array(rows));
            } else {
                for b in forks {
                    println!("{}", b.id());
                }
            }
            Ok(0)
        }
        BoxCommand::Exec(a) => exec(*a).await,
        BoxCommand::Shell { id, cwd } => shell(&id, cwd).await,
        BoxCommand::Ps { id, all, json } => procs::ps(&*attach(&id, &ctx).await?, &id, all, json).await,
        BoxCommand::Kill { id, handle, signal } => procs::kill(&*attach(&id, &ctx).await?, &id, handle, signal).await,
        BoxCommand::Logs {
            id,
            handle,
            follow,
            after,
        } => procs::logs(&*attach(&id, &ctx).await?, &id, handle, after, follow).await,
        BoxCommand::Attach {
            id,
            handle,
            after,
            no_stdin,
        } => procs::attach(&*attach(&id, &ctx).await?, &id, handle, after, no_stdin).await,
        BoxCommand::Ls {
            provider: p,
            labels,
            json,
        } => {
            let labels: Labels = labels.into_iter().collect();
            let boxes = match p {
                Some(p) => provider(&p).await?.list(&labels, &ctx).await?,
                None => list_everywhere(&labels).await,
            };
            let mut rows = Vec::with_capacity(boxes.len());
            for b in &boxes {
                rows.push((b, state_of(&**b).await));
            }
            if json {
                let rows: Vec<_> = rows
                    .iter()
                    .map(|(b, state)| {
                        let mut row = serde_json::json!({
                            "id": b.id(),
                            "state": state.word(),
                            "labels": b.labels(),
                            "facts": b.facts(),
                        });
                        if let State::Unknown(why) = state {
                            row["why"] = why.clone().into();
                        }
                        row
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(rows));
                return Ok(0);
            }
            let now = now_ms();
            let width = rows
                .iter()
                .map(|(b, _)| b.id().as_str().len())
                .max()
                .unwrap_or(0)
                .max(2);
            println!("{:<width$}  {:<10} {:<9} LABELS", "ID", "STATE", "LEFT");
            for (b, state) in &rows {
                let left = b
                    .facts()
                    .ends_at_ms
                    .map(|e| duration(e.saturating_sub(now)))
                    .unwrap_or_else(|| "-".into());
                let labels: Vec<String> = b.labels().iter().map(|(k, v)| format!("{k}={v}")).collect();
                let labels = if labels.is_empty() {
                    "-".to_string()
                } else {
                    labels.join(",")
                };
                println!("{:<width$}  {:<10} {left:<9} {labels}", b.id().as_str(), state.word());
            }
            for (_, state) in &rows {
                if let State::Unknown(why) = state {
                    term::say(&format!("box ls: {why}"));
                }
            }
            Ok(0)
        }
        BoxCommand::Facts { id } => {
            let b = attach(&id, &ctx).await?;
            println!(
                "{}",
                serde_json::to_string_pretty(b.facts()).map_err(|e| Error::unknown(e.to_string()))?
            );
            Ok(0)
        }
        BoxCommand::Endpoint { id, port, json } => {
            let e = attach(&id, &ctx).await?.endpoint(port, &ctx).await?;
            if json {
                println!("{}", serde_json::json!(e));
                return Ok(0);
            }
            match &e.url {
                Some(url) => println!("{url}"),
                None => println!("{}:{}", e.host, e.port),
            }
            Ok(0)
        }
        BoxCommand::Probe { id, dir, json } => {
            let b = attach(&id, &ctx).await?;
            let probe = agentbox_core::durability::probe_acknowledged_writes(&*b, dir.as_deref(), &ctx).await?;
            tracing::info!(box_id = %id, %probe, "acknowledged writes probed");
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&probe).map_err(|e| Error::unknown(e.to_string()))?
                );
            } else {
                println!("box {id}: {probe}");
            }
            Ok(if probe.passed() { 0 } else { 1 })
        }
        BoxCommand::Net { id, last, json } => {
            let b = attach(&id, &ctx).await?;
            let refusals = b.net_refusals(last, &ctx).await?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&refusals).map_err(|e| Error::unknown(e.to_string()))?
                );
                return Ok(0);
            }
            if refusals.is_empty() {
                eprintln!("box {id}: nothing refused");
            }
            for r in &refusals {
                let address = r.address.as_deref().map(|a| format!(" ({a})")).unwrap_or_default();
                println!(
                    "{}  {}:{}{address}  {}: {}",
                    agentbox_core::rfc3339(i64::try_from(r.at_ms).unwrap_or(i64::MAX)),
                    r.host,
                    r.port,
                    r.rule,
                    r.why
                );
            }
            Ok(0)
        }
        BoxCommand::Rm { ids } => {
            for id in ids {
                attach(&id, &ctx).await?.destroy(&ctx).await?;
                tracing::info!(box_id = %id, "box ended");
                println!("{id}");
            }
            Ok(0)
        }
        BoxCommand::Cp { src, dst } => crate::cp::copy(&src, &dst, &ctx).await.map(|_| 0),
    }
}

/// The spec and the provider `create` (and `open`) flags ask for; a provider option the
/// chosen provider does not take is refused, naming the flag.
async fn spec_and_provider(a: CreateArgs) -> Result<(Spec, Arc<dyn Provider>)> {
    let mut spec = Spec::new(a.lifetime);
    spec.labels = a.labels.into_iter().collect();
    spec.env = a.env.into_iter().collect();
    spec.image = a.image;
    spec.snapshot = a.from_snapshot;
    spec.cpus = a.cpus;
    spec.memory_mb = a.memory;
    spec.isolation = a.isolation;
    spec.network = match a.network.as_deref() {
        None => None,
        Some("open") => Some(Network::Open),
        Some("none") => Some(Network::None),
        // The namespace provider warns once the box is made (a refused one needs no warning).
        Some("host") => Some(Network::Host),
        Some(other) => {
            return Err(crate::usage(Error::invalid(format!(
                "--network: {other:?} is not open, none or host"
            ))));
        }
    };
    if !a.allow.is_empty() {
        // Each entry is checked here too, so the flag is named in what is wrong.
        agentbox_core::Allowlist::parse(&a.allow).map_err(|e| {
            crate::usage(Error::invalid(format!(
                "--allow: {}",
                e.message().trim_start_matches("spec.network.allow: ")
            )))
        })?;
        spec.network = Some(Network::Allow(a.allow));
    }
    for m in &a.mounts {
        spec.mounts.push(mount(m)?);
    }
    spec.ports = a.ports;
    let env = environment()?;
    let entry = chosen(a.provider.as_deref(), &env).await?;
    let options = Options {
        runner: !a.no_runner,
        user: a.user.clone(),
        pids_limit: a.pids_limit,
        keep_capabilities: a.keep_capabilities,
        disk_bytes: a.disk,
    };
    if let Some(opt) = options.set().into_iter().find(|o| !entry.takes(*o)) {
        return Err(Error::unsupported(format!(
            "--{}: {} boxes do not take it",
            opt.name(),
            entry.name
        )));
    }
    Ok((spec, entry.make(&options, &env).await?))
}

/// Print a box's id, or with `json` its id and facts.
fn print_box(b: &dyn Sandbox, json: bool) {
    if json {
        println!("{}", serde_json::json!({ "id": b.id(), "facts": b.facts() }));
    } else {
        println!("{}", b.id());
    }
}

/// The boxes of every provider this build has, within a deadline each; the providers that
/// cannot be made or cannot list (no Docker engine) are left out, named in one line on stderr,
/// each one's reason logged (`-v` shows them).
async fn list_everywhere(labels: &Labels) -> Vec<Arc<dyn Sandbox>> {
    let mut all = Vec::new();
    let mut left_out = Vec::new();
    for name in registry::names() {
        let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
        let listed = match provider(name).await {
            Ok(p) => p.list(labels, &ctx).await,
            Err(e) => Err(e),
        };
        match listed {
            Ok(boxes) => all.extend(boxes),
            Err(e) => {
                tracing::info!(provider = name, reason = %crate::one_line(e.message()), "box ls: provider left out");
                left_out.push(name);
            }
        }
    }
    if !left_out.is_empty() {
        term::say(&format!(
            "box ls: left out {} boxes: they could not be listed here (-v says why; --provider NAME to see one fail)",
            left_out.join(", ")
        ));
    }
    all
}

/// A listed box's state, as `box ls` prints it.
enum State {
    Running,
    Asleep,
    Ended,
    /// Its status could not be read: why.
    Unknown(String),
}

impl State {
    fn word(&self) -> &'static str {
        match self {
            State::Running => "running",
            State::Asleep => "asleep",
            State::Ended => "ended",
            State::Unknown(_) => "unknown",
        }
    }
}

/// The state of `b`, asked of its box within 10 s.
async fn state_of(b: &dyn Sandbox) -> State {
    let ctx = Ctx::background().with_timeout(Duration::from_secs(10));
    match b.status(&ctx).await {
        Ok(agentbox_core::Status::Running) => State::Running,
        Ok(agentbox_core::Status::Sleeping) => State::Asleep,
        Ok(agentbox_core::Status::Ended) => State::Ended,
        Err(e) => State::Unknown(crate::one_line(e.message())),
    }
}

fn now_ms() -> u64 {
    use agentbox_core::Clock;
    agentbox_core::SystemClock.now_ms()
}

/// A duration as a person reads it: `42s`, `9m12s`, `3h05m`, `2d04h`.
pub(crate) fn duration(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// Split `ID:PATH`, when `s` starts with a box id.
pub(crate) fn box_path(s: &str) -> Option<(SandboxId, String)> {
    let (provider, rest) = s.split_once(':')?;
    let (name, path) = rest.split_once(':')?;
    let id = SandboxId::new(provider, name).ok()?;
    Some((id, path.to_string()))
}

async fn exec(a: ExecArgs) -> Result<i32> {
    let ctx = Ctx::background();
    let b = attach(&a.id, &ctx).await?;
    if a.detach {
        procs::of(&*b, &a.id)?;
    } else if a.tty && a.interactive && !term::stdin_is_terminal() {
        return Err(Error::invalid(
            "--tty with --interactive: stdin is not a terminal (without -t, a pipe is passed to the program)",
        ));
    }
    let opts = ExecOptions {
        cwd: a.cwd,
        env: a.env.into_iter().collect(),
        tty: a.tty.then(term::tty_here),
        detach: a.detach,
        timeout: a.timeout,
    };
    // A box whose programs take no input (each exec one call carrying the command alone)
    // refuses stdin that has bytes, as its own API does, rather than dropping them: before the
    // program runs when they come within STDIN_LOOK, else as soon as they come.
    let mut refused_input = None;
    // Stdin is the program's unless detached, or -t without -i.
    let forwarded = !a.detach && (!a.tty || a.interactive);
    if !b.facts().live_processes && forwarded && !term::stdin_is_terminal() {
        let mut chunks = procs::stdin_chunks();
        match tokio::time::timeout(STDIN_LOOK, next_bytes(&mut chunks)).await {
            Ok(true) => return Err(no_input(&a.id, "the program was not run")),
            // The end of stdin (/dev/null, an empty pipe): nothing is dropped.
            Ok(false) => {}
            Err(_) => refused_input = Some(chunks),
        }
    }
    let mut p = b.exec(&a.argv, &opts, &ctx).await?;
    if let Some(mut chunks) = refused_input {
        if let Some(w) = p.stdin.take() {
            procs::leave_open(w);
        }
        let session = procs::session(p, a.tty, procs::Input::None, procs::OnSignal::Kill);
        let late = async {
            if next_bytes(&mut chunks).await {
                return;
            }
            std::future::pending::<()>().await
        };
        return tokio::select! {
            biased;
            _ = late => Err(no_input(&a.id, "it came after the program started, and was not sent")),
            r = session => r,
        };
    }
    if a.detach {
        if let Some(w) = p.stdin.take() {
            procs::leave_open(w);
        }
        let handle = p
            .handle()
            .ok_or_else(|| Error::unknown(format!("box {}: the detached program got no handle", a.id)))?;
        if a.json {
            println!("{}", serde_json::json!({ "id": a.id, "handle": handle }));
        } else {
            println!("{handle}");
        }
        return Ok(0);
    }
    let input = if a.tty && !a.interactive {
        procs::Input::None
    } else {
        procs::Input::Forward
    };
    match procs::session(p, a.tty, input, procs::OnSignal::Kill).await {
        // The box ended the program at its --timeout: 124, as timeout(1) exits.
        Err(e) if a.timeout.is_some() && e.code() == agentbox_core::ErrorCode::Timeout => {
            term::say(&format!("box exec: {}", crate::one_line(e.message())));
            Ok(TIMED_OUT)
        }
        r => r,
    }
}

/// How long `box exec` waits for stdin's first bytes (or its end) before it runs a program in a
/// box that takes no input; past it, stdin is still watched while the program runs.
const STDIN_LOOK: Duration = Duration::from_secs(1);

/// Whether stdin gives bytes before its end.
async fn next_bytes(chunks: &mut tokio::sync::mpsc::Receiver<Vec<u8>>) -> bool {
    while let Some(c) = chunks.recv().await {
        if !c.is_empty() {
            return true;
        }
    }
    false
}

/// The refusal of stdin's bytes by a box whose programs take no input.
fn no_input(id: &SandboxId, what: &str) -> Error {
    Error::unsupported(format!(
        "box {id}: stdin has data, and this box's programs take no input (its facts say live_processes: false: each exec is one call that carries the command alone); {what}. Copy the input in (box cp - {id}:FILE) and name the file instead"
    ))
}

/// `box exec`'s exit when its `--timeout` ended the program, as `timeout(1)`'s.
const TIMED_OUT: i32 = 124;

/// The box's shell: bash where it has it, else sh.
const SHELL: &str = "command -v bash >/dev/null 2>&1 && exec bash; exec sh";

async fn shell(id: &SandboxId, cwd: Option<String>) -> Result<i32> {
    if !term::stdin_is_terminal() {
        return Err(Error::invalid(
            "box shell: stdin is not a terminal (box exec ID -- sh runs a script from a pipe)",
        ));
    }
    let args = ExecArgs {
        id: id.clone(),
        cwd,
        env: Vec::new(),
        interactive: true,
        tty: true,
        detach: false,
        json: false,
        timeout: None,
        argv: vec!["sh".into(), "-c".into(), SHELL.into()],
    };
    exec(args).await
}

fn parse_disk(t: &str) -> std::result::Result<i64, String> {
    agentbox_providers::docker::parse_size(t).map_err(|e| e.message().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn box_paths_and_sizes_parse() {
        let (id, p) = box_path("local:ab12:dir/f.txt").unwrap();
        assert_eq!((id.as_str(), p.as_str()), ("local:ab12", "dir/f.txt"));
        assert!(box_path("./file.txt").is_none());
        assert!(box_path("/abs/x").is_none());
        assert_eq!(memory_mb("4g").unwrap(), 4096);
        assert_eq!(memory_mb("512").unwrap(), 512);
        assert!(memory_mb("lots").is_err());
        assert!(memory_mb("0").is_err());
    }

    #[test]
    fn durations_read_as_a_person_reads_them() {
        assert_eq!(duration(999), "0s");
        assert_eq!(duration(42_000), "42s");
        assert_eq!(duration(552_000), "9m12s");
        assert_eq!(duration(3_600_000 + 5 * 60_000 + 59_000), "1h05m");
        assert_eq!(duration(2 * 86_400_000 + 4 * 3_600_000), "2d04h");
    }
}

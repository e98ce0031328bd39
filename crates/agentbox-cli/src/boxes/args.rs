//! The shape of `agentbox box …` on the command line: clap's types and the parsers of their
//! values.

use std::time::Duration;

use agentbox_core::{Error, Mount, Result, SandboxId, parse_duration};
use agentbox_providers::registry;
use clap::{Args, Subcommand};

use super::provider::PROVIDER_ENV;
use crate::procs;

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
    pub(super) id: SandboxId,
    /// The working directory, relative to the box's workspace.
    #[arg(long)]
    pub(super) cwd: Option<String>,
    /// A variable for this program alone (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = key_value)]
    pub(super) env: Vec<(String, String)>,
    /// Keep stdin open: with -t, this terminal's keys go to the program. (Without -t, stdin
    /// is passed to the program in any case.)
    #[arg(short, long)]
    pub(super) interactive: bool,
    /// Give the program a terminal of this one's size, TERM from the environment; with -i,
    /// this terminal is raw while the program runs and follows its size.
    #[arg(short, long)]
    pub(super) tty: bool,
    /// Leave the program running in the box and print its handle (for `box ps`, `box logs`,
    /// `box attach`); stdin is left open for a later attach.
    #[arg(short, long)]
    pub(super) detach: bool,
    /// With --detach, print JSON: the box's id and the process's handle.
    #[arg(long, requires = "detach")]
    pub(super) json: bool,
    /// The box ends the program this long after it starts (500ms, 90s, 10m, 6h, 2d).
    #[arg(long, value_parser = lifetime)]
    pub(super) timeout: Option<Duration>,
    /// Hand the program one secret on a pipe it inherits as descriptor 3 (named in its
    /// AGENTBOX_SECRET_FD), never in its argv, environment or a file: NAME takes the value of
    /// this shell's variable NAME; NAME=env:VARIABLE or NAME=file:/path say where it is.
    /// Boxes whose programs agentbox's runner starts (namespace, Docker and local boxes).
    #[arg(long, value_name = "NAME[=env:VAR|file:PATH]")]
    pub(super) secret_fd: Option<String>,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub(super) argv: Vec<String>,
}

#[derive(Args)]
pub(crate) struct CreateArgs {
    /// The provider (without it, the default: see `default_provider`).
    #[arg(long, help = default_help("The provider"))]
    pub(super) provider: Option<String>,
    /// How long the box may live (500ms, 90s, 10m, 6h, 2d).
    #[arg(long, default_value = "10m", value_parser = lifetime)]
    pub(super) lifetime: Duration,
    /// A label (repeatable).
    #[arg(long = "label", value_name = "K=V", value_parser = key_value)]
    pub(super) labels: Vec<(String, String)>,
    /// A variable every program of the box sees (repeatable). Never a secret.
    #[arg(long = "env", value_name = "K=V", value_parser = key_value)]
    pub(super) env: Vec<(String, String)>,
    /// The image (providers that take one).
    #[arg(long)]
    pub(super) image: Option<String>,
    /// Start from this snapshot (`box snapshot`).
    #[arg(long, value_name = "NAME")]
    pub(super) from_snapshot: Option<String>,
    /// CPUs.
    #[arg(long)]
    pub(super) cpus: Option<f64>,
    /// Memory: MiB, or with a unit (512m, 4g).
    #[arg(long, value_parser = memory_mb)]
    pub(super) memory: Option<u64>,
    /// `open`, `none` or `host`. Without it a namespace box has a network of its own whose way
    /// out is agentbox's egress proxy (the internet, never this machine or a private range);
    /// `host` shares this machine's network, loopback services included (namespace boxes only).
    #[arg(long, conflicts_with = "allow")]
    pub(super) network: Option<String>,
    /// Reach only this (repeatable): a name, `*.name` (any name below it), an IPv4 or IPv6
    /// address or CIDR, each with an optional `:PORT` (IPv6 in brackets: `[2001:db8::/32]:443`).
    /// Enforced by agentbox's egress proxy (namespace and Docker boxes); `box net ID` shows what
    /// it refused.
    #[arg(long = "allow", value_name = "HOST[:PORT]")]
    pub(super) allow: Vec<String>,
    /// A credential the box uses without holding it (repeatable): `NAME=env:VARIABLE@host` or
    /// `NAME=file:/path@host` (hosts comma-separated, in `--allow`'s syntax). The box's NAME
    /// holds a placeholder; the egress proxy puts the value, read here on this machine, into
    /// HTTPS requests to those hosts alone (namespace boxes, and Docker boxes with `--allow`).
    #[arg(long = "secret", value_name = "NAME=env:VAR@HOST")]
    pub(super) secrets: Vec<String>,
    /// Expose a port of the box (repeatable): `5432:tcp` a raw TCP socket on this machine's
    /// loopback (namespace boxes with `--allow`, Docker boxes), a bare number https (the
    /// clouds'); `box endpoint ID PORT` says where it is reached.
    #[arg(long = "port", value_name = "PORT[:tcp|:https]", value_parser = port_spec)]
    pub(super) ports: Vec<agentbox_core::PortSpec>,
    /// The isolation asked for.
    #[arg(long)]
    pub(super) isolation: Option<String>,
    /// Bind a directory of this machine: SRC:DST or SRC:DST:ro (repeatable; docker).
    #[arg(long = "mount", value_name = "SRC:DST[:ro]")]
    pub(super) mounts: Vec<String>,
    /// At most this many processes in the box (docker).
    #[arg(long)]
    pub(super) pids_limit: Option<i64>,
    /// Run every program as UID:GID (docker), so files written in a bind stay yours.
    #[arg(long, value_name = "UID:GID")]
    pub(super) user: Option<String>,
    /// Drop every capability and forbid new privileges (docker): the default, kept so scripts
    /// that ask for it still work.
    #[arg(long, conflicts_with = "keep_capabilities")]
    pub(super) drop_capabilities: bool,
    /// At most this much of the box's own files, as 10g or 512m (docker: where the engine can
    /// enforce a size; refused, naming why, where it cannot).
    #[arg(long, value_parser = parse_disk)]
    pub(super) disk: Option<i64>,
    /// Keep Docker's default capabilities, with no-new-privileges off (docker), for programs
    /// that must change user; `box facts` says which a box got.
    #[arg(long)]
    pub(super) keep_capabilities: bool,
    /// No in-box runner: each command and file operation is then a process of its own in the
    /// box (without it, a runner started in the box serves them all over one connection).
    #[arg(long)]
    pub(super) no_runner: bool,
    /// Print the id and the facts as JSON.
    #[arg(long)]
    pub(super) json: bool,
}

/// `SRC:DST[:ro]`, with SRC made canonical (it must exist on this machine).
pub(super) fn mount(s: &str) -> Result<Mount> {
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

pub(super) fn lifetime(s: &str) -> std::result::Result<Duration, String> {
    parse_duration(s).map_err(|e| e.message().to_string())
}

pub(super) fn memory_mb(s: &str) -> std::result::Result<u64, String> {
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

fn parse_disk(t: &str) -> std::result::Result<i64, String> {
    agentbox_providers::docker::parse_size(t).map_err(|e| e.message().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(memory_mb("4g").unwrap(), 4096);
        assert_eq!(memory_mb("512").unwrap(), 512);
        assert!(memory_mb("lots").is_err());
        assert!(memory_mb("0").is_err());
    }
}

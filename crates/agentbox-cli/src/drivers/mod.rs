//! Where a run's next generation is started: the supervisor's drivers. A driver starts a
//! command that opens the run (the next generation) on its target, streams its output here,
//! waits for it, and records the start and the exit in the run's `starts.jsonl`.
//!
//! - `local`: a process of this machine.
//! - `docker`: a Docker box (this machine's engine) with this `agentbox` binary bound in, the
//!   runs' root bound at the same path (or a named volume at `/runs`), and, for lease claims,
//!   the PostgreSQL connection file bound read-only (its unix socket directory too, when it
//!   names one). The box has the driver's lifetime, so a supervisor that dies leaves no
//!   generation running past it.
//! - `kube`: a pod of the kubeconfig's cluster whose volume claim (`--claim`) holds the runs'
//!   root at `/runs`; the connection file in a Secret mounted read-only at
//!   `/tmp/agentbox/secret/postgres`; `agentbox` from the image's PATH, or this machine's binary
//!   by a hostPath volume at `/tmp/agentbox/bin/agentbox` (`--host-binary`, for a one-node
//!   cluster). Its `activeDeadlineSeconds` is the lifetime; its log is streamed here;
//!   the pod and the Secret are deleted when it ends.
//! - `systemd`: a transient service of this machine's systemd (`systemd-run --wait --pipe`),
//!   its lifetime the unit's `RuntimeMaxSec`; refused, saying why, where systemd is not the
//!   init.
//! - `daytona`: a Daytona sandbox whose volume (`--volume`, made when missing) holds the runs'
//!   root at `/runs`; this binary uploaded into it; its lifetime Daytona's; deleted when it
//!   ends.

mod daytona;
mod docker;
mod kube;
mod systemd;

pub(crate) use daytona::RUNS_IN_BOX as DAYTONA_RUNS;

use std::io::Write;
use std::path::Path;

use agentbox_core::{Clock, Error, Result, SystemClock};
use serde::Serialize;

/// The drivers there are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DriverKind {
    /// A process of this machine.
    Local,
    /// A container of this machine's Docker engine.
    Docker,
    /// A pod of the kubeconfig's cluster, the runs' root on a volume claim.
    Kube,
    /// A transient service of this machine's systemd.
    Systemd,
    /// A Daytona sandbox, the runs' root on a Daytona volume.
    Daytona,
}

impl DriverKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            DriverKind::Local => "local",
            DriverKind::Docker => "docker",
            DriverKind::Kube => "kube",
            DriverKind::Systemd => "systemd",
            DriverKind::Daytona => "daytona",
        }
    }
}

/// What a driver needs beyond the command.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct DriverArgs {
    /// Where the next generation runs.
    #[arg(long, value_enum, default_value = "local")]
    pub driver: DriverKind,
    /// docker: the runs' root is this named volume (mounted at /runs) rather than a bind of
    /// the root's directory. daytona (required): the Daytona volume holding the runs' root,
    /// mounted at /runs, made when missing.
    #[arg(long, value_name = "NAME")]
    pub volume: Option<String>,
    /// docker, kube, systemd, daytona: the generation's lifetime, which the box's provider,
    /// the cluster or systemd enforces (the generation ends with it).
    #[arg(long, default_value = "1h", value_name = "DURATION")]
    pub lifetime: String,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// The kube driver's settings.
#[derive(Clone, Debug, Default, clap::Args)]
pub(crate) struct KubeArgs {
    /// kube: the PersistentVolumeClaim holding the runs' root (mounted at /runs).
    #[arg(long, value_name = "NAME")]
    pub claim: Option<String>,
    /// kube: the pod's image, with `agentbox` on its PATH unless --host-binary.
    #[arg(long, env = "AGENTBOX_KUBE_IMAGE", default_value = "debian:bookworm-slim")]
    pub image: String,
    /// kube: the namespace [default: the kubeconfig context's].
    #[arg(long, env = "AGENTBOX_KUBE_NAMESPACE", value_name = "NAME")]
    pub namespace: Option<String>,
    /// kube: bind this machine's agentbox binary (and a PostgreSQL socket directory) into the
    /// pod by hostPath volumes: for a one-node cluster whose node is this machine.
    #[arg(long)]
    pub host_binary: bool,
}

/// Where a run's generation was started, and how it ended: a line of `starts.jsonl`.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Start {
    pub run: String,
    pub driver: &'static str,
    /// The process, or the box, that ran it.
    pub place: String,
    pub started_ms: u64,
    pub ended_ms: u64,
    /// The command's exit code (128 + the signal for one a signal ended).
    pub exit: i32,
}

/// The variable that tells a generation which driver started it, so its open completes a
/// move asked to that driver (`Runs::started_by`).
pub(crate) const DRIVER_ENV: &str = "AGENTBOX_RUNS_DRIVER";

/// `runs` as the driver that started this process (`DRIVER_ENV`) says they are opened: what
/// every generation's command (`runs agent`, the demo's step) opens its run with.
pub(crate) fn started_here(runs: agentbox_runs::Runs) -> agentbox_runs::Runs {
    match std::env::var(DRIVER_ENV) {
        Ok(d) if !d.is_empty() => runs.started_by(&d),
        _ => runs,
    }
}

/// Start `command` for run `id` under `root` on the driver, with `AGENTBOX_RUN`,
/// `AGENTBOX_RUNS` and (for lease claims) `AGENTBOX_RUNS_POSTGRES_FILE` set; wait for it;
/// record it.
pub(crate) async fn start(
    args: &DriverArgs,
    root: &Path,
    id: &str,
    postgres_file: Option<&Path>,
    command: &[String],
) -> Result<Start> {
    if command.is_empty() {
        return Err(Error::invalid("--command: a program to start"));
    }
    let started_ms = SystemClock.now_ms();
    let (place, exit) = match args.driver {
        DriverKind::Local => local(root, id, postgres_file, command).await?,
        DriverKind::Docker => docker::run(args, root, id, postgres_file, command).await?,
        DriverKind::Kube => kube::run(args, id, postgres_file, command).await?,
        DriverKind::Systemd => systemd::run(args, root, id, postgres_file, command).await?,
        DriverKind::Daytona => daytona::run(args, id, postgres_file, command).await?,
    };
    let start = Start {
        run: id.to_string(),
        driver: args.driver.name(),
        place,
        started_ms,
        ended_ms: SystemClock.now_ms(),
        exit,
    };
    record(&root.join("runs").join(id), &start)?;
    tracing::info!(run = id, driver = start.driver, place = %start.place, exit, "generation ended");
    Ok(start)
}

/// Append `start` to the run's `starts.jsonl`, synced.
fn record(dir: &Path, start: &Start) -> Result<()> {
    let path = dir.join("starts.jsonl");
    let mut line = serde_json::to_vec(start).map_err(|e| Error::unknown(e.to_string()))?;
    line.push(b'\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| Error::io(e, format!("opening {}", path.display())))?;
    f.write_all(&line)
        .and_then(|_| f.sync_all())
        .map_err(|e| Error::io(e, format!("writing {}", path.display())))
}

async fn local(root: &Path, id: &str, postgres_file: Option<&Path>, command: &[String]) -> Result<(String, i32)> {
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..])
        .env("AGENTBOX_RUN", id)
        .env("AGENTBOX_RUNS", root);
    if let Some(f) = postgres_file {
        cmd.env("AGENTBOX_RUNS_POSTGRES_FILE", f);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::io(e, format!("starting {:?}", command[0])))?;
    let place = format!("pid {} on {}", child.id().unwrap_or(0), agentbox_runs::run::host_name());
    eprintln!("agentbox: run {id}: started {place}");
    let status = child
        .wait()
        .await
        .map_err(|e| Error::io(e, format!("waiting for {:?}", command[0])))?;
    use std::os::unix::process::ExitStatusExt;
    Ok((
        place,
        status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
    ))
}

/// Run `command` in box `b` with `env`, its output streamed here as it comes; its exit code.
/// Its wait is the box's lifetime, which its provider enforces.
pub(crate) async fn run_in_box(
    b: &dyn agentbox_core::Sandbox,
    command: &[String],
    env: std::collections::BTreeMap<String, String>,
) -> Result<i32> {
    let mut p = b
        .exec(
            command,
            &agentbox_core::ExecOptions {
                env,
                ..Default::default()
            },
            &agentbox_core::Ctx::background(),
        )
        .await?;
    let (out, err) = (p.stdout.take(), p.stderr.take());
    let copy = |r: Option<agentbox_core::ByteReader>, mut w: Box<dyn tokio::io::AsyncWrite + Unpin + Send>| async move {
        if let Some(mut r) = r {
            let _ = tokio::io::copy(&mut r, &mut w).await;
        }
        let _ = tokio::io::AsyncWriteExt::flush(&mut w).await;
    };
    tokio::join!(
        copy(out, Box::new(tokio::io::stdout())),
        copy(err, Box::new(tokio::io::stderr()))
    );
    Ok(p.wait().await?.code)
}

/// The unix socket directory a libpq keyword/value string's `host=` names, if any.
pub(crate) fn socket_dir(config: &str) -> Option<String> {
    config
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("host="))
        .filter(|h| h.starts_with('/'))
        .map(str::to_string)
}

/// A canonical path, for a bind mount's source.
pub(crate) fn canonical(p: &Path, what: &str) -> Result<String> {
    std::fs::canonicalize(p)
        .map(|c| c.to_string_lossy().into_owned())
        .map_err(|e| Error::io(e, format!("{what}: {}", p.display())))
}

/// The PostgreSQL connection string in `f` (the first non-empty line), bounded.
pub(crate) fn read_postgres_file(f: &Path) -> Result<String> {
    const MAX: u64 = 64 << 10;
    let file = std::fs::File::open(f).map_err(|e| Error::io(e, format!("--postgres-file: {}", f.display())))?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX + 1), &mut bytes)
        .map_err(|e| Error::io(e, format!("--postgres-file: {}", f.display())))?;
    if bytes.len() as u64 > MAX {
        return Err(Error::too_large(format!(
            "--postgres-file: {}: over 64 KiB",
            f.display()
        )));
    }
    let text =
        String::from_utf8(bytes).map_err(|_| Error::invalid(format!("--postgres-file: {}: not UTF-8", f.display())))?;
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_string)
        .ok_or_else(|| Error::invalid(format!("--postgres-file: {}: empty", f.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_directory_is_found_only_where_host_names_one() {
        assert_eq!(
            socket_dir("host=/var/run/pg port=5432 user=x").as_deref(),
            Some("/var/run/pg")
        );
        assert_eq!(socket_dir("host=127.0.0.1 port=5432"), None);
        assert_eq!(socket_dir("port=5432"), None);
    }
}

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

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Clock, Ctx, Error, ExecOptions, Provider, Result, Spec, SystemClock};
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
}

impl DriverKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            DriverKind::Local => "local",
            DriverKind::Docker => "docker",
            DriverKind::Kube => "kube",
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
    /// the root's directory.
    #[arg(long, value_name = "NAME")]
    pub volume: Option<String>,
    /// docker, kube: the generation's lifetime, which the box's provider or the cluster
    /// enforces (the generation ends with it).
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

/// The PostgreSQL connection file a generation claims its run with, where it is in the box.
const POSTGRES_IN_BOX: &str = "/run/agentbox-runs/postgres";

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
        DriverKind::Docker => docker(args, root, id, postgres_file, command).await?,
        DriverKind::Kube => crate::drivers_kube::run(args, id, postgres_file, command).await?,
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

async fn docker(
    args: &DriverArgs,
    root: &Path,
    id: &str,
    postgres_file: Option<&Path>,
    command: &[String],
) -> Result<(String, i32)> {
    use agentbox_providers::docker::{DockerOptions, DockerProvider, NamedVolume};
    let lifetime = agentbox_core::parse_duration(&args.lifetime).map_err(|e| e.context("--lifetime"))?;
    let env = crate::boxes::environment()?;
    let runner = match env.runner() {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!("docker driver: the box gets no runner: {}", e.message());
            None
        }
    };
    // Files the generation writes in the runs' root stay this user's.
    let user = format!(
        "{}:{}",
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw()
    );
    let provider: Arc<dyn Provider> = Arc::new(
        DockerProvider::new(DockerOptions {
            user: Some(user),
            runner,
            volumes: args
                .volume
                .iter()
                .map(|v| NamedVolume {
                    name: v.clone(),
                    target: "/runs".into(),
                    read_only: false,
                })
                .collect(),
            ..Default::default()
        })
        .await?,
    );
    let mut spec = Spec::new(lifetime).label("run", id);
    let bind = |source: String, target: String, read_only: bool| agentbox_core::Mount {
        source,
        target,
        read_only,
    };
    let exe = std::env::current_exe().map_err(|e| Error::io(e, "finding the agentbox executable"))?;
    spec.mounts.push(bind(
        canonical(&exe, "the agentbox executable")?,
        "/usr/local/bin/agentbox".into(),
        true,
    ));
    let root_in_box = match &args.volume {
        Some(_) => "/runs".to_string(),
        None => {
            let r = canonical(root, "the runs' root")?;
            spec.mounts.push(bind(r.clone(), r.clone(), false));
            r
        }
    };
    // The connection file is copied to a directory of this driver's own, so the box sees that
    // file alone; its socket directory, where it names one, is bound read-only.
    let secrets = tempfile_dir()?;
    let mut exec_env = std::collections::BTreeMap::from([
        ("AGENTBOX_RUN".to_string(), id.to_string()),
        ("AGENTBOX_RUNS".to_string(), root_in_box),
        (DRIVER_ENV.to_string(), "docker".to_string()),
        ("AGENTBOX_HOME".to_string(), "/tmp/agentbox-home".to_string()),
        ("HOME".to_string(), "/tmp".to_string()),
    ]);
    if let Some(f) = postgres_file {
        let config = read_postgres_file(f)?;
        let copy = secrets.0.join("postgres");
        write_private(&copy, config.as_bytes())?;
        spec.mounts.push(bind(
            canonical(&secrets.0, "the connection file's directory")?,
            "/run/agentbox-runs".into(),
            true,
        ));
        if let Some(dir) = socket_dir(&config) {
            spec.mounts
                .push(bind(canonical(Path::new(&dir), "postgres host")?, dir, true));
        }
        exec_env.insert("AGENTBOX_RUNS_POSTGRES_FILE".into(), POSTGRES_IN_BOX.into());
    }
    let ctx = Ctx::background().with_timeout(Duration::from_secs(120));
    let b = provider.create(&spec, &ctx).await?;
    let place = format!("docker box {}", b.id());
    eprintln!("agentbox: run {id}: started in {place}");
    let ran = async {
        let mut p = b
            .exec(
                command,
                &ExecOptions {
                    env: exec_env,
                    ..Default::default()
                },
                &Ctx::background(),
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
        p.wait().await
    }
    .await;
    if let Err(e) = b.destroy(&ctx).await {
        tracing::warn!(box_id = %b.id(), "ending the generation's box: {e}");
    }
    drop(secrets);
    Ok((place, ran?.code))
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

/// A directory of this process's own (mode 0700), removed when dropped.
struct PrivateDir(PathBuf);

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempfile_dir() -> Result<PrivateDir> {
    use std::os::unix::fs::DirBuilderExt;
    let mut tag = [0u8; 8];
    getrandom::fill(&mut tag).map_err(|e| Error::unknown(format!("the kernel gave no random bytes: {e}")))?;
    let name: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    let dir = std::env::temp_dir().join(format!("agentbox-driver-{name}"));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| Error::io(e, format!("making {}", dir.display())))?;
    Ok(PrivateDir(dir))
}

fn write_private(path: &Path, data: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io(e, format!("creating {}", path.display())))?;
    f.write_all(data)
        .map_err(|e| Error::io(e, format!("writing {}", path.display())))
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

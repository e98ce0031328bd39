//! The docker driver: one generation of a run in a Docker box of this machine's engine.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Error, Provider, Result, Spec};

use super::{DRIVER_ENV, DriverArgs, canonical, read_postgres_file, socket_dir};

/// The PostgreSQL connection file a generation claims its run with, where it is in the box.
const POSTGRES_IN_BOX: &str = "/run/agentbox-runs/postgres";

/// Run `command` for run `id` in a Docker box; its place and exit code.
pub(super) async fn run(
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
    let mut secrets = None;
    let mut exec_env = std::collections::BTreeMap::from([
        ("AGENTBOX_RUN".to_string(), id.to_string()),
        ("AGENTBOX_RUNS".to_string(), root_in_box),
        (DRIVER_ENV.to_string(), "docker".to_string()),
        ("AGENTBOX_HOME".to_string(), "/tmp/agentbox-home".to_string()),
        ("HOME".to_string(), "/tmp".to_string()),
    ]);
    if let Some(f) = postgres_file {
        let config = read_postgres_file(f)?;
        // tempfile makes it 0700, and removes it when dropped.
        let dir = tempfile::Builder::new()
            .prefix("agentbox-driver-")
            .tempdir()
            .map_err(|e| Error::io(e, "making the connection file's directory"))?;
        write_private(&dir.path().join("postgres"), config.as_bytes())?;
        spec.mounts.push(bind(
            canonical(dir.path(), "the connection file's directory")?,
            "/run/agentbox-runs".into(),
            true,
        ));
        if let Some(dir) = socket_dir(&config) {
            spec.mounts
                .push(bind(canonical(Path::new(&dir), "postgres host")?, dir, true));
        }
        exec_env.insert("AGENTBOX_RUNS_POSTGRES_FILE".into(), POSTGRES_IN_BOX.into());
        secrets = Some(dir);
    }
    let ctx = Ctx::background().with_timeout(Duration::from_secs(120));
    let b = provider.create(&spec, &ctx).await?;
    let place = format!("docker box {}", b.id());
    eprintln!("agentbox: run {id}: started in {place}");
    let ran = super::run_in_box(b.as_ref(), command, exec_env).await;
    if let Err(e) = b.destroy(&ctx).await {
        tracing::warn!(box_id = %b.id(), "ending the generation's box: {e}");
    }
    drop(secrets);
    Ok((place, ran?))
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

//! The daytona driver: one generation of a run in a Daytona sandbox whose volume holds the
//! runs' root at `/runs`. This `agentbox` binary is uploaded into the sandbox (Daytona's
//! images have no agentbox), the PostgreSQL connection file, for lease claims, into a
//! directory only the sandbox's user reads. The sandbox has the driver's lifetime, which
//! Daytona enforces, and is deleted when the generation ends.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Error, FinishOptions, Provider, Result, Spec, finish};
use agentbox_providers::daytona::{DaytonaOptions, DaytonaProvider, VolumeMount};

use super::{DRIVER_ENV, DriverArgs, read_postgres_file};

/// Where the runs' root is in the sandbox.
pub(crate) const RUNS_IN_BOX: &str = "/runs";
/// Where the uploaded binary is, on the generation's PATH.
const BIN_IN_BOX: &str = "/tmp/agentbox-bin";
/// The directory of the connection file (mode 0700).
const SECRET_IN_BOX: &str = "/tmp/agentbox-secret";

/// Run `command` for run `id` in a Daytona sandbox; its place and exit code.
pub(super) async fn run(
    args: &DriverArgs,
    id: &str,
    postgres_file: Option<&Path>,
    command: &[String],
) -> Result<(String, i32)> {
    let volume = args.volume.clone().ok_or_else(|| {
        Error::invalid(
            "--volume: the daytona driver needs the Daytona volume that holds the runs' root (mounted at /runs in the sandbox)",
        )
    })?;
    let lifetime = agentbox_core::parse_duration(&args.lifetime).map_err(|e| e.context("--lifetime"))?;
    let mut opts = DaytonaOptions::from_env()?;
    opts.volumes = vec![VolumeMount {
        name: volume,
        mount_path: RUNS_IN_BOX.into(),
    }];
    let provider: Arc<dyn Provider> = Arc::new(DaytonaProvider::new(opts)?);
    let ctx = Ctx::background().with_timeout(Duration::from_secs(300));
    let spec = Spec::new(lifetime).label("run", id);
    let b = provider.create(&spec, &ctx).await?;
    let place = format!("daytona sandbox {}", b.id().name());
    eprintln!("agentbox: run {id}: started in {place}");
    let ran = async {
        let mut env = BTreeMap::from([
            ("AGENTBOX_RUN".to_string(), id.to_string()),
            ("AGENTBOX_RUNS".to_string(), RUNS_IN_BOX.to_string()),
            (DRIVER_ENV.to_string(), "daytona".to_string()),
            ("AGENTBOX_HOME".to_string(), "/tmp/agentbox-home".to_string()),
            ("HOME".to_string(), "/tmp".to_string()),
            (
                "PATH".to_string(),
                format!("{BIN_IN_BOX}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
            ),
        ]);
        let exe = std::env::current_exe().map_err(|e| Error::io(e, "finding the agentbox executable"))?;
        let bytes = tokio::fs::read(&exe)
            .await
            .map_err(|e| Error::io(e, format!("reading {}", exe.display())))?;
        sh(
            b.as_ref(),
            &format!("umask 077 && mkdir -p {BIN_IN_BOX} {SECRET_IN_BOX}"),
            &ctx,
        )
        .await?;
        b.upload(&format!("{BIN_IN_BOX}/agentbox"), &bytes, &ctx)
            .await
            .map_err(|e| e.context("uploading agentbox into the sandbox"))?;
        sh(b.as_ref(), &format!("chmod 700 {BIN_IN_BOX}/agentbox"), &ctx).await?;
        if let Some(f) = postgres_file {
            let config = read_postgres_file(f)?;
            let at = format!("{SECRET_IN_BOX}/postgres");
            b.upload(&at, config.as_bytes(), &ctx)
                .await
                .map_err(|e| e.context("writing the connection file in the sandbox"))?;
            sh(b.as_ref(), &format!("chmod 600 {at}"), &ctx).await?;
            env.insert("AGENTBOX_RUNS_POSTGRES_FILE".into(), at);
        }
        super::run_in_box(b.as_ref(), command, env).await
    }
    .await;
    if let Err(e) = b
        .destroy(&Ctx::background().with_timeout(Duration::from_secs(120)))
        .await
    {
        tracing::warn!(sandbox = %b.id(), "ending the generation's sandbox: {e}");
    }
    Ok((place, ran?))
}

/// Run a line of `sh` in the sandbox, refused unless it exits 0.
async fn sh(b: &dyn agentbox_core::Sandbox, line: &str, ctx: &Ctx) -> Result<()> {
    let argv = ["sh".to_string(), "-c".into(), line.to_string()];
    let out = finish(
        b.exec(&argv, &Default::default(), ctx).await?,
        FinishOptions {
            stdin: Vec::new(),
            max_output: 64 << 10,
        },
    )
    .await?;
    if out.status.code != 0 {
        return Err(Error::unknown(format!(
            "daytona driver: `{line}` exited {} in the sandbox: {}",
            out.status.code,
            out.stderr_text().trim()
        )));
    }
    Ok(())
}

//! The systemd driver: one generation of a run as a transient service of this machine's
//! systemd (`systemd-run --wait --pipe`), so systemd, not this process, holds it: its lifetime
//! is the unit's `RuntimeMaxSec`, its output comes here, and the unit is collected when it
//! ends. As root it is a system service; as any other user, a service of that user's manager
//! (`--user`).
//!
//! A machine whose init is not systemd (a container, most CI runners) has no manager to ask:
//! the driver refuses, saying so, before anything is started.

use std::path::Path;

use agentbox_core::{Error, Result};

use super::{DRIVER_ENV, DriverArgs};

/// Where systemd says it is this machine's init (`sd_booted(3)`).
const BOOTED: &str = "/run/systemd/system";

/// Why this machine cannot take a transient unit, if it cannot.
pub(super) fn refusal() -> Option<String> {
    if !Path::new(BOOTED).is_dir() {
        return Some(format!(
            "the systemd driver starts a generation as a transient unit of systemd, and systemd is not this machine's init ({BOOTED} does not exist): use --driver local or docker here"
        ));
    }
    if !rustix::process::geteuid().is_root() {
        let user_manager = std::env::var_os("XDG_RUNTIME_DIR")
            .map(|d| Path::new(&d).join("systemd").join("private").exists())
            .unwrap_or(false);
        if !user_manager {
            return Some(
                "the systemd driver starts a non-root user's generation as a unit of that user's manager, and this user has none ($XDG_RUNTIME_DIR/systemd/private does not exist): log in through systemd, or enable lingering (loginctl enable-linger)"
                    .into(),
            );
        }
    }
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("systemd-run").is_file()))
        .unwrap_or(false);
    if !found {
        return Some("the systemd driver needs systemd-run, which is not on PATH".into());
    }
    None
}

/// A unit name of the run's own: `agentbox-run-`, the run's id as systemd takes it, and a
/// random suffix (a unit of an earlier generation may still be collected).
fn unit_name(id: &str) -> Result<String> {
    let mut tag = [0u8; 4];
    getrandom::fill(&mut tag).map_err(|e| Error::unknown(format!("the kernel gave no random bytes: {e}")))?;
    let base: String = id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
        .take(64)
        .collect();
    let suffix: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("agentbox-run-{base}-{suffix}"))
}

/// The `systemd-run` arguments that start `command` for run `id` under `root`.
fn arguments(
    unit: &str,
    lifetime_s: u64,
    root: &Path,
    id: &str,
    postgres_file: Option<&Path>,
    command: &[String],
) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    if !rustix::process::geteuid().is_root() {
        a.push("--user".into());
    }
    a.extend(
        [
            "--wait",
            "--pipe",
            "--collect",
            "--quiet",
            "--same-dir",
            "--service-type=exec",
        ]
        .map(String::from),
    );
    a.push(format!("--unit={unit}"));
    a.push(format!("--property=RuntimeMaxSec={lifetime_s}"));
    let mut env = vec![
        ("AGENTBOX_RUN".to_string(), id.to_string()),
        ("AGENTBOX_RUNS".to_string(), root.to_string_lossy().into_owned()),
        (DRIVER_ENV.to_string(), "systemd".to_string()),
    ];
    // A transient unit starts with the manager's environment, not this one's.
    for k in ["PATH", "HOME", "AGENTBOX_HOME", "RUST_LOG"] {
        if let Ok(v) = std::env::var(k) {
            env.push((k.to_string(), v));
        }
    }
    if let Some(f) = postgres_file {
        env.push((
            "AGENTBOX_RUNS_POSTGRES_FILE".to_string(),
            f.to_string_lossy().into_owned(),
        ));
    }
    for (k, v) in env {
        a.push(format!("--setenv={k}={v}"));
    }
    a.push("--".into());
    a.extend(command.iter().cloned());
    a
}

/// Run `command` for run `id` as a transient unit; its place and exit code.
pub(super) async fn run(
    args: &DriverArgs,
    root: &Path,
    id: &str,
    postgres_file: Option<&Path>,
    command: &[String],
) -> Result<(String, i32)> {
    if let Some(why) = refusal() {
        return Err(Error::unsupported(why));
    }
    let lifetime = agentbox_core::parse_duration(&args.lifetime).map_err(|e| e.context("--lifetime"))?;
    let unit = unit_name(id)?;
    let argv = arguments(&unit, lifetime.as_secs().max(1), root, id, postgres_file, command);
    let place = format!("unit {unit}.service on {}", agentbox_runs::run::host_name());
    eprintln!("agentbox: run {id}: started as {place}");
    let status = tokio::process::Command::new("systemd-run")
        .args(&argv)
        .status()
        .await
        .map_err(|e| Error::io(e, "starting systemd-run"))?;
    use std::os::unix::process::ExitStatusExt;
    Ok((
        place,
        status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_is_named_for_its_run_and_carries_the_runs_variables() {
        let unit = unit_name("run/1 x").unwrap();
        assert!(unit.starts_with("agentbox-run-run_1_x-"), "{unit}");
        let a = arguments(
            &unit,
            60,
            Path::new("/srv/runs"),
            "r1",
            Some(Path::new("/etc/pg")),
            &["agentbox".into(), "runs".into(), "agent".into()],
        );
        for want in [
            "--wait",
            "--pipe",
            "--collect",
            "--property=RuntimeMaxSec=60",
            "--setenv=AGENTBOX_RUN=r1",
            "--setenv=AGENTBOX_RUNS=/srv/runs",
            "--setenv=AGENTBOX_RUNS_DRIVER=systemd",
            "--setenv=AGENTBOX_RUNS_POSTGRES_FILE=/etc/pg",
        ] {
            assert!(a.iter().any(|x| x == want), "{want} in {a:?}");
        }
        let tail = a.iter().position(|x| x == "--").unwrap();
        assert_eq!(&a[tail + 1..], ["agentbox", "runs", "agent"]);
    }
}

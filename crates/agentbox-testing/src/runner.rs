//! The `agentbox-runner` binary that tests of local boxes (their supervisor) and of runners
//! need, found or built, so `cargo test -p <crate>` passes on a fresh clone, where cargo has
//! built no binary of another package.
//!
//! [`ensure`] answers `$AGENTBOX_RUNNER` when it is set (`scripts/test` sets it to the static
//! build), else `agentbox-runner` where cargo puts this test's binaries (beside its `deps/`
//! directory, which is where `HelperCommand::discover`, and so `LocalOptions::at`, looks),
//! building it there first when it is missing. Once per test process; cargo's own lock on
//! the target directory keeps two test processes from building at once.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The variable naming the runner binary (as `agentbox_providers::helper::RUNNER_ENV`).
pub const RUNNER_ENV: &str = "AGENTBOX_RUNNER";

/// How long building the runner may take: a cold build on a loaded two-core machine takes
/// minutes, never this long.
const BUILD_LIMIT: Duration = Duration::from_secs(30 * 60);

/// The runner binary, built first when missing, so that `HelperCommand::discover` (and
/// `LocalOptions::at`) find it after this call. Where none can be had, the calling test
/// fails with a message saying why and what to do, and no backtrace.
pub fn ensure() -> PathBuf {
    match find_or_build() {
        Ok(p) => p.clone(),
        Err(why) => fail(why),
    }
}

/// The runner binary, or why there is none; found or built once per process.
pub fn find_or_build() -> &'static Result<PathBuf, String> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FOUND.get_or_init(|| {
        let exe = std::env::current_exe().map_err(|e| format!("finding this test binary: {e}"))?;
        locate(std::env::var_os(RUNNER_ENV).map(PathBuf::from), &exe)
    })
}

/// `named` when given, else the runner beside `exe`'s profile directory, built when missing.
fn locate(named: Option<PathBuf>, exe: &Path) -> Result<PathBuf, String> {
    if let Some(p) = named.filter(|p| !p.as_os_str().is_empty()) {
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "{RUNNER_ENV}={}: no such file. Unset it to have the tests build agentbox-runner, or \
                 name a built one (scripts/runner-static builds the static runner)",
                p.display()
            ))
        };
    }
    let (target_dir, profile) = layout(exe)?;
    let beside = target_dir.join(&profile).join("agentbox-runner");
    if beside.is_file() {
        return Ok(beside);
    }
    build(&target_dir, &profile)?;
    if beside.is_file() {
        Ok(beside)
    } else {
        Err(format!(
            "cargo built agentbox-runner, but {} is not there",
            beside.display()
        ))
    }
}

/// The target directory and profile directory name of a test binary at
/// `<target>/<profile>/deps/<test>`.
fn layout(exe: &Path) -> Result<(PathBuf, String), String> {
    let deps = exe.parent().filter(|d| d.file_name().is_some_and(|n| n == "deps"));
    let profile_dir = deps.and_then(Path::parent);
    match (
        profile_dir.and_then(Path::parent),
        profile_dir.and_then(Path::file_name),
    ) {
        (Some(target), Some(profile)) => Ok((target.to_path_buf(), profile.to_string_lossy().into_owned())),
        _ => Err(format!(
            "{} is not a test binary in a cargo target directory (<target>/<profile>/deps/): \
             set {RUNNER_ENV} to an agentbox-runner binary",
            exe.display()
        )),
    }
}

/// `cargo build -p agentbox-runner --bin agentbox-runner` into `target_dir` for `profile`,
/// from this workspace, within [`BUILD_LIMIT`].
fn build(target_dir: &Path, profile: &str) -> Result<(), String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    if !manifest.is_file() {
        return Err(format!(
            "agentbox-runner is not built and {} (the workspace that would build it) is missing: \
             set {RUNNER_ENV} to an agentbox-runner binary",
            manifest.display()
        ));
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.args([
        "build",
        "-p",
        "agentbox-runner",
        "--bin",
        "agentbox-runner",
        "--manifest-path",
    ])
    .arg(&manifest)
    .arg("--target-dir")
    .arg(target_dir)
    .stdin(Stdio::null());
    match profile {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    eprintln!(
        "agentbox-runner is not built: building it into {} (cargo build -p agentbox-runner)",
        target_dir.display()
    );
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting {} to build agentbox-runner: {e}", cargo.to_string_lossy()))?;
    let t = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => {
                return Err(format!(
                    "cargo build -p agentbox-runner failed ({status}); its errors are above. Build \
                     it yourself, or set {RUNNER_ENV} to an agentbox-runner binary"
                ));
            }
            Ok(None) if t.elapsed() > BUILD_LIMIT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "cargo build -p agentbox-runner took over {BUILD_LIMIT:?} and was stopped"
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => return Err(format!("waiting for cargo build -p agentbox-runner: {e}")),
        }
    }
}

/// Fail the calling test with `why` and no backtrace: the message is the whole story.
fn fail(why: &str) -> ! {
    eprintln!("\n!!!! {why} !!!!\n");
    std::panic::resume_unwind(Box::new(why.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_runner_that_is_missing_is_refused_naming_the_variable() {
        let e = locate(
            Some("/nonexistent/agentbox-runner".into()),
            Path::new("/x/debug/deps/t"),
        )
        .unwrap_err();
        assert!(
            e.contains("AGENTBOX_RUNNER=/nonexistent/agentbox-runner: no such file"),
            "{e}"
        );
    }

    #[test]
    fn a_test_binary_names_its_target_directory_and_profile() {
        let (t, p) = layout(Path::new("/w/target/debug/deps/fake-123")).unwrap();
        assert_eq!((t, p.as_str()), (PathBuf::from("/w/target"), "debug"));
        let e = layout(Path::new("/usr/bin/agentbox")).unwrap_err();
        assert!(e.contains("set AGENTBOX_RUNNER"), "{e}");
    }
}

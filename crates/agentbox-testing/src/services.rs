//! Whether the services a test needs are here. A developer's machine without them is told
//! so loudly; CI (`CI=true`) is never allowed to skip.

/// True when the Docker engine answers the `docker` CLI. Without one: panics under CI, else
/// prints a loud notice and returns false so the caller returns early.
pub fn docker_available(test: &str) -> bool {
    let ok = std::process::Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: CI needs a Docker engine and none answers (scripts/test starts one)");
    }
    eprintln!(
        "\n!!!! {test}: NO DOCKER ENGINE ANSWERS: this test did NOT run. Run scripts/test, which starts one. !!!!\n"
    );
    false
}

/// True when the Docker engine answers and has gVisor's `runsc` as a runtime (`scripts/test`
/// installs Debian's runsc and registers it). Without: panics under CI, else a loud notice and
/// false.
pub fn gvisor_available(test: &str) -> bool {
    if !docker_available(test) {
        return false;
    }
    let runtimes = std::process::Command::new("docker")
        .args(["info", "--format", "{{json .Runtimes}}"])
        .stderr(std::process::Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if runtimes.contains("\"runsc\"") {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: CI needs gVisor's runsc registered with the Docker engine (scripts/gvisor does it)");
    }
    eprintln!(
        "\n!!!! {test}: THE DOCKER ENGINE HAS NO runsc RUNTIME: this test did NOT run. Run scripts/gvisor. !!!!\n"
    );
    false
}

/// The variable naming the PostgreSQL server tests use, as a libpq connection string.
pub const POSTGRES_ENV: &str = "AGENTBOX_TEST_POSTGRES";

/// The PostgreSQL connection string `scripts/test` exports, or `None` (after a loud notice)
/// where there is none; under CI a missing server is a failure.
pub fn postgres(test: &str) -> Option<String> {
    if let Ok(c) = std::env::var(POSTGRES_ENV)
        && !c.is_empty()
    {
        return Some(c);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: CI needs PostgreSQL and {POSTGRES_ENV} is not set (scripts/test starts one)");
    }
    eprintln!("\n!!!! {test}: NO POSTGRESQL ({POSTGRES_ENV} unset): this test did NOT run. Run scripts/test. !!!!\n");
    None
}

/// The variable naming the same server by its unix socket directory (`scripts/postgres
/// --socket`), which a container reaches with the directory bound in.
pub const POSTGRES_SOCKET_ENV: &str = "AGENTBOX_TEST_POSTGRES_SOCKET";

/// The PostgreSQL connection string by socket directory that `scripts/test` exports, or `None`
/// (after a loud notice); under CI a missing one is a failure.
pub fn postgres_socket(test: &str) -> Option<String> {
    if let Ok(c) = std::env::var(POSTGRES_SOCKET_ENV)
        && !c.is_empty()
    {
        return Some(c);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: CI needs PostgreSQL and {POSTGRES_SOCKET_ENV} is not set (scripts/test starts one)");
    }
    eprintln!(
        "\n!!!! {test}: NO POSTGRESQL SOCKET ({POSTGRES_SOCKET_ENV} unset): this test did NOT run. Run scripts/test. !!!!\n"
    );
    None
}

/// The variable naming an unpacked root file system (`scripts/box-rootfs`) for namespace
/// boxes with a `rootfs` root.
pub const ROOTFS_ENV: &str = "AGENTBOX_TEST_ROOTFS";

/// The rootfs directory `scripts/test` exports, or `None` (after a loud notice) where there is
/// none; under CI a missing one is a failure.
pub fn rootfs(test: &str) -> Option<String> {
    if let Ok(d) = std::env::var(ROOTFS_ENV)
        && !d.is_empty()
    {
        return Some(d);
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: CI needs a box rootfs and {ROOTFS_ENV} is not set (scripts/test unpacks one)");
    }
    eprintln!("\n!!!! {test}: NO ROOTFS ({ROOTFS_ENV} unset): this test did NOT run. Run scripts/box-rootfs. !!!!\n");
    None
}

/// The path `var` names (a tool or a client the test scripts installed), or `None` after a loud
/// notice saying to run `script`; under CI a missing one is a failure.
pub fn path_from(var: &str, script: &str, test: &str) -> Option<std::path::PathBuf> {
    if let Ok(p) = std::env::var(var)
        && !p.is_empty()
    {
        return Some(p.into());
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: CI needs {var} (scripts/test runs {script})");
    }
    eprintln!("\n!!!! {test}: {var} UNSET: this test did NOT run. Run {script} and export it. !!!!\n");
    None
}

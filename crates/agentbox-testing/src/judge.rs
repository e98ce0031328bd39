//! Running a vendor's SDK as the judge of its fake (`tests/<vendor>_judge.py` of the providers
//! crate with the Python SDK, `tests/<vendor>-js/judge.mjs` with the npm SDK): the SDK's
//! python (or the judge's directory) from the variable `scripts/test` exports, the script's
//! `OK <step>` lines, its `WAIT <what>` requests answered once the test acted on the fake, its
//! end within a deadline.
//!
//! ```no_run
//! # async fn f() {
//! use std::time::Duration;
//! use agentbox_testing::judge;
//! let Some(python) = judge::python("acme", "the_python_sdk_judges_the_fake") else { return };
//! let mut command = tokio::process::Command::new(python);
//! command.arg("tests/acme_judge.py").env("ACME_API_URL", "http://127.0.0.1:41234");
//! let judged = judge::run(command, Duration::from_secs(600), |_line| {}).await;
//! judged.assert_steps(&["create", "run"]);
//! # }
//! ```

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// The python of `vendor`'s SDK, from `AGENTBOX_TEST_<VENDOR>_PYTHON`, or `None` after the loud
/// notice (a failure under CI). `scripts/judge-clients <vendor>` installs it.
pub fn python(vendor: &str, test: &str) -> Option<PathBuf> {
    installed(
        &format!("AGENTBOX_TEST_{}_PYTHON", vendor.to_uppercase()),
        &format!("scripts/judge-clients {vendor}"),
        test,
    )
}

/// The directory of `vendor`'s JavaScript judge with its npm SDK installed
/// (`tests/<vendor>-js` of the providers crate), from `AGENTBOX_TEST_<VENDOR>_JS`, or `None`
/// after the loud notice (a failure under CI). `scripts/judge-clients-js <vendor>` installs it.
pub fn node(vendor: &str, test: &str) -> Option<PathBuf> {
    installed(
        &format!("AGENTBOX_TEST_{}_JS", vendor.to_uppercase()),
        &format!("scripts/judge-clients-js {vendor}"),
        test,
    )
}

/// The path in `var`, or `None` after the loud notice that `test` did not run (a failure under
/// CI, which always installs it with `installer`).
fn installed(var: &str, installer: &str, test: &str) -> Option<PathBuf> {
    if let Ok(p) = std::env::var(var)
        && !p.is_empty()
    {
        return Some(PathBuf::from(p));
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: CI needs {var} (scripts/test runs {installer})");
    }
    eprintln!("\n!!!! {test}: {var} UNSET: this test did NOT run. Run {installer} and export it. !!!!\n");
    None
}

/// What a judge printed.
pub struct Judged {
    /// Its stdout.
    pub said: String,
    /// Its stderr.
    pub errs: String,
}

impl Judged {
    /// Every one of `steps` was passed (`OK <step>`).
    pub fn assert_steps(&self, steps: &[&str]) {
        for step in steps {
            assert!(
                self.said.lines().any(|l| l == format!("OK {step}")),
                "no `OK {step}` in:\n{}\n{}",
                self.said,
                self.errs
            );
        }
    }
}

/// Run `judge` (its program, script and environment set) to its end within `limit`: each line
/// it prints is echoed and given to `act`; after `act` sees a line starting `WAIT `, the judge
/// is told to go on. Panics, with all it said, unless it exits 0.
pub async fn run(mut judge: tokio::process::Command, limit: Duration, mut act: impl FnMut(&str)) -> Judged {
    let mut child = judge
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the judge starts");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut err = child.stderr.take().expect("stderr");
    let errs = tokio::spawn(async move {
        let mut s = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut err, &mut s).await;
        s
    });
    let mut said = String::new();
    let talk = async {
        while let Some(line) = lines.next_line().await.expect("reading the judge") {
            println!("{line}");
            said.push_str(&line);
            said.push('\n');
            act(&line);
            if line.starts_with("WAIT ") {
                stdin.write_all(b"go\n").await.expect("answering the judge");
                stdin.flush().await.expect("answering the judge");
            }
        }
    };
    tokio::time::timeout(limit, talk)
        .await
        .expect("the judge ends within its time");
    let status = child.wait().await.expect("the judge's exit");
    let errs = errs.await.unwrap_or_default();
    assert!(status.success(), "the SDK's judge failed:\n{said}\n{errs}");
    Judged { said, errs }
}

/// The judges of E2B's API (`agentbox-e2b`): E2B's Python SDK (`tests/e2b_judge.py` of the
/// providers crate) and its npm SDK (`tests/e2b-js/judge.mjs`), the same steps in both, run
/// against the fake E2B (`fake`) and `agentbox serve --e2b` (`serve`).
pub mod e2b {
    use std::path::{Path, PathBuf};

    /// Every step a judge passes in either mode; `serve` adds [`SERVE_STEPS`].
    pub const STEPS: &[&str] = &[
        "create",
        "run",
        "envs",
        "no-internet",
        "connect",
        "stdin",
        "list",
        "kill",
        "pty",
        "files-rw",
        "files-ops",
        "watch",
        "timeout",
        "metrics",
        "unserved",
        "timeout-max",
        "list-paging",
        "pause-resume",
        "snapshot",
        "fork",
        "vanish",
        "kill-sandbox",
        "bad-key",
    ];

    /// The steps only `serve` has: two keys that see nothing of each other's, E2B's network
    /// lists as the box's allowlist.
    pub const SERVE_STEPS: &[&str] = &["owners", "network"];

    /// Which SDK judges.
    pub enum Sdk {
        /// The Python SDK: its venv's python.
        Python(PathBuf),
        /// The npm SDK: the judge's directory, its packages installed.
        Node(PathBuf),
    }

    /// Where the judge runs and what it is told.
    pub struct Setup<'a> {
        /// E2B's one URL (both `E2B_API_URL` and `E2B_SANDBOX_URL`).
        pub url: &'a str,
        /// `E2B_API_KEY`.
        pub key: &'a str,
        /// `fake` or `serve`.
        pub mode: &'a str,
        /// The page the judge lists by (it pages past it).
        pub list_page: usize,
        /// The plan's longest timeout, in seconds.
        pub max_timeout_secs: u64,
        /// Its `HOME`.
        pub home: &'a Path,
        /// The authority the server's TLS certificate is signed by, when it serves https: the
        /// SDKs then trust it (`SSL_CERT_FILE`, `NODE_EXTRA_CA_CERTS`) and speak their own
        /// default HTTP version (2); over plain http they are told 1.1, which the fake speaks.
        pub ca: Option<&'a Path>,
    }

    /// The judge's command, E2B's variables set and every proxy and E2B variable of this
    /// process's left out; a `serve` judge also needs `AGENTBOX_URL` and `JUDGE_OTHER_KEY`.
    pub fn command(sdk: &Sdk, s: &Setup<'_>) -> tokio::process::Command {
        let tests = Path::new(env!("CARGO_MANIFEST_DIR")).join("../agentbox-providers/tests");
        let mut c = match sdk {
            Sdk::Python(py) => {
                let mut c = tokio::process::Command::new(py);
                c.arg(tests.join("e2b_judge.py"));
                c
            }
            Sdk::Node(dir) => {
                let mut c = tokio::process::Command::new("node");
                c.arg(dir.join("judge.mjs")).current_dir(dir);
                c
            }
        };
        match s.ca {
            Some(ca) => {
                c.env("SSL_CERT_FILE", ca)
                    .env("NODE_EXTRA_CA_CERTS", ca)
                    .env_remove("E2B_HTTP_VERSION");
            }
            None => {
                c.env("E2B_HTTP_VERSION", "1.1");
            }
        }
        c.env("E2B_API_URL", s.url)
            .env("E2B_SANDBOX_URL", s.url)
            .env("E2B_API_KEY", s.key)
            .env("JUDGE_LIST_PAGE", s.list_page.to_string())
            .env("JUDGE_MODE", s.mode)
            .env("JUDGE_MAX_TIMEOUT", s.max_timeout_secs.to_string())
            .env("HOME", s.home)
            .env("NO_PROXY", "127.0.0.1")
            .env_remove("E2B_DOMAIN")
            .env_remove("E2B_DEBUG")
            .env_remove("E2B_ACCESS_TOKEN")
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .env_remove("ALL_PROXY");
        c
    }
}

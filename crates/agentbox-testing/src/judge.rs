//! Running a vendor's Python SDK as the judge of its fake (`tests/<vendor>_judge.py` of the
//! providers crate): the SDK's python from the variable `scripts/test` exports, the script's
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
    let var = format!("AGENTBOX_TEST_{}_PYTHON", vendor.to_uppercase());
    let installer = format!("scripts/judge-clients {vendor}");
    if let Ok(p) = std::env::var(&var)
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
    assert!(status.success(), "the Python SDK judge failed:\n{said}\n{errs}");
    Judged { said, errs }
}

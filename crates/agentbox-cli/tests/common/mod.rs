//! What the CLI's test binaries share: a home of their own for the `agentbox` binary.

#![allow(dead_code)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// An `$AGENTBOX_HOME` of the test's own, removed when it drops.
pub(crate) struct Home(pub(crate) tempfile::TempDir);

impl Home {
    pub(crate) fn new() -> Self {
        Home(tempfile::tempdir().unwrap())
    }

    /// `agentbox ARGS` in this home, `stdin` written to it, run to its end.
    pub(crate) fn run(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut child = Command::new(env!("CARGO_BIN_EXE_agentbox"))
            .args(args)
            .env("AGENTBOX_HOME", self.0.path())
            // The default provider is the tests' to choose.
            .env_remove("AGENTBOX_PROVIDER")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        child.wait_with_output().unwrap()
    }

    /// `agentbox ARGS`, which must succeed: its stdout.
    pub(crate) fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args, b"");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

/// A bench's `--json` pairs: each one's ratio finite and positive and its baseline's median
/// positive; their names, in order, and the pairs themselves.
pub(crate) fn bench_pairs(out: &str) -> (Vec<String>, Vec<serde_json::Value>) {
    let pairs: serde_json::Value = serde_json::from_str(out).unwrap();
    let pairs = pairs.as_array().unwrap().clone();
    for p in &pairs {
        let ratio = p["ratio"].as_f64().unwrap();
        assert!(ratio.is_finite() && ratio > 0.0, "{p}");
        assert!(p["baseline_ms"]["median"].as_f64().unwrap() > 0.0, "{p}");
    }
    let names = pairs.iter().map(|p| p["name"].as_str().unwrap().to_string()).collect();
    (names, pairs)
}

/// No namespace box is left in `home`.
pub(crate) fn no_box_left(home: &Home) {
    let listed = home.ok(&["box", "ls", "--provider", "namespace", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(0), "no box left: {listed}");
}

/// The run record (`run.json`) in `dir` once it says `f`, read again every 50 ms for at most a
/// minute (a record being replaced is simply read again); panics naming `what` past that.
pub(crate) fn record_until(
    dir: &std::path::Path,
    what: &str,
    f: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let t = std::time::Instant::now();
    loop {
        if let Ok(bytes) = std::fs::read(dir.join("run.json"))
            && let Ok(r) = serde_json::from_slice::<serde_json::Value>(&bytes)
            && f(&r)
        {
            return r;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(60),
            "{}: never {what}",
            dir.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A key made in `home`'s store, printed once.
pub(crate) fn key(home: &std::path::Path, name: &str) -> String {
    key_with(home, name, &[])
}

/// A key made in `home`'s store with `flags` (`--admin`, its limits), printed once.
pub(crate) fn key_with(home: &std::path::Path, name: &str, flags: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args(["serve", "keys", "add", name])
        .args(flags)
        .env("AGENTBOX_HOME", home)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// `command` (an `agentbox serve`, its flags given) started over `home`: killed when dropped, its
/// stderr piped for [`announced`].
pub(crate) fn started(command: &mut tokio::process::Command, home: &std::path::Path) -> tokio::process::Child {
    command
        .env("AGENTBOX_HOME", home)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// `agentbox serve` over `home` on a loopback port, its default provider `provider`: the
/// process (killed when dropped) and its URL once it serves (its log copied to this test's).
pub(crate) async fn serve(home: &std::path::Path, provider: &str) -> (tokio::process::Child, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"));
    command.args(["serve", "--listen", "127.0.0.1:0", "--provider", provider]);
    let mut server = started(&mut command, home);
    let url = serving_url(&mut server).await;
    (server, url)
}

/// The URL a starting `agentbox serve` says it serves on (its stderr piped), within 60 s; its
/// log from then on is copied to this test's.
pub(crate) async fn serving_url(server: &mut tokio::process::Child) -> String {
    announced(server, &["agentbox serve: serving on "]).await.remove(0)
}

/// What a starting `agentbox serve` says after each of `prefixes` (its stderr piped), in their
/// order, once it said them all, within 60 s; its log from then on is copied to this test's.
pub(crate) async fn announced(server: &mut tokio::process::Child, prefixes: &[&str]) -> Vec<String> {
    announced_kept(server, prefixes).await.0
}

/// A server's log from its announcement on, kept for the test to read (and copied to its).
#[derive(Clone, Default)]
pub(crate) struct Kept(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Kept {
    /// Every line so far.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// [`announced`], the log from then on also kept.
pub(crate) async fn announced_kept(server: &mut tokio::process::Child, prefixes: &[&str]) -> (Vec<String>, Kept) {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(server.stderr.take().unwrap()).lines();
    let said = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        let mut said: Vec<Option<String>> = vec![None; prefixes.len()];
        while let Some(line) = lines.next_line().await.unwrap() {
            eprintln!("{line}");
            for (i, p) in prefixes.iter().enumerate() {
                if let Some(rest) = line.strip_prefix(p) {
                    said[i] = Some(rest.to_string());
                }
            }
            if said.iter().all(Option::is_some) {
                return said.into_iter().flatten().collect::<Vec<_>>();
            }
        }
        panic!("the server ended before it served");
    })
    .await
    .expect("the server serves within 60 s");
    let kept = Kept::default();
    let keep = kept.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("{line}");
            keep.0.lock().unwrap().push(line);
        }
    });
    (said, kept)
}

/// A client's suite run to its end within 15 minutes, its output printed: the output, after
/// checking it passed.
pub(crate) async fn run_suite(suite: &mut tokio::process::Command, what: &str) -> String {
    let out = tokio::time::timeout(std::time::Duration::from_secs(900), suite.output())
        .await
        .expect("the suite ends within 15 minutes")
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{said}");
    assert!(out.status.success(), "{what}'s suite failed:\n{said}");
    said
}

/// `npm run check` (its type check, format and lint) in the package `dir`, passed.
pub(crate) fn npm_check(dir: &std::path::Path) {
    let out = Command::new("npm")
        .args(["run", "--silent", "check"])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "npm run check in {}: {}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

//! `agentbox serve` as a user meets it: keys made (shown once), listed and removed; the
//! service on a unix socket only its user may open, answering with a key and refusing without;
//! a non-loopback address refused unless said outright; SIGTERM ending it cleanly.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn agentbox(home: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args(args)
        .env("AGENTBOX_HOME", home)
        .env_remove("AGENTBOX_PROVIDER")
        .output()
        .unwrap()
}

/// One HTTP/1.1 request over the unix socket: the status line and the body.
async fn request(socket: &Path, key: Option<&str>, path: &str) -> (String, String) {
    let mut s = tokio::net::UnixStream::connect(socket).await.unwrap();
    let auth = key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).await.unwrap();
    let status = answer.lines().next().unwrap_or_default().to_string();
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[test]
fn keys_are_shown_once_listed_without_the_key_and_removed() {
    let home = tempfile::tempdir().unwrap();
    let made = agentbox(
        home.path(),
        &["serve", "keys", "add", "ci", "--max-boxes", "3", "--providers", "local"],
    );
    assert!(made.status.success(), "{made:?}");
    let key = String::from_utf8(made.stdout).unwrap().trim().to_string();
    assert!(
        key.starts_with("abk_") && !key.contains('\n'),
        "the key alone on stdout: {key:?}"
    );
    let again = agentbox(home.path(), &["serve", "keys", "add", "ci"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("\"ci\""), "{again:?}");
    let bad = agentbox(home.path(), &["serve", "keys", "add", "x", "--providers", "teleport"]);
    assert_eq!(
        bad.status.code(),
        Some(2),
        "an unknown provider is a usage error: {bad:?}"
    );
    let listed = agentbox(home.path(), &["serve", "keys", "list"]);
    let text = String::from_utf8(listed.stdout).unwrap();
    assert!(
        text.starts_with("ci\t") && text.contains("max-boxes 3") && text.contains("providers local"),
        "{text}"
    );
    assert!(!text.contains(&key), "a list never shows a key");
    let store = std::fs::read(home.path().join("server/keys.db")).unwrap();
    assert!(
        !store.windows(key.len()).any(|w| w == key.as_bytes()),
        "the store keeps only a hash"
    );
    assert!(
        agentbox(home.path(), &["serve", "keys", "remove", "ci"])
            .status
            .success()
    );
    assert_eq!(
        agentbox(home.path(), &["serve", "keys", "remove", "ci"]).status.code(),
        Some(1)
    );
    assert!(agentbox(home.path(), &["serve", "keys", "list"]).stdout.is_empty());
}

#[test]
fn keys_kept_in_postgres_are_named_by_a_file_never_an_argument() {
    let Some(conn) = agentbox_testing::services::postgres("serve::keys_kept_in_postgres") else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let file = home.path().join("pg");
    std::fs::write(&file, format!("{conn}\n")).unwrap();
    let pg = file.to_str().unwrap();
    let name = format!("cli-{:x}", std::process::id());
    let made = agentbox(
        home.path(),
        &[
            "serve",
            "keys",
            "add",
            &name,
            "--requests-per-minute",
            "90",
            "--postgres",
            pg,
        ],
    );
    assert!(made.status.success(), "{made:?}");
    let listed = String::from_utf8(agentbox(home.path(), &["serve", "keys", "list", "--postgres", pg]).stdout).unwrap();
    let line = listed
        .lines()
        .find(|l| l.starts_with(&format!("{name}\t")))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(line.ends_with("requests-per-minute 90"), "{line}");
    assert!(!home.path().join("server/keys.db").exists(), "nothing kept in SQLite");
    assert!(
        agentbox(home.path(), &["serve", "keys", "remove", &name, "--postgres", pg])
            .status
            .success()
    );
    std::fs::write(&file, "  \n").unwrap();
    let empty = agentbox(home.path(), &["serve", "keys", "list", "--postgres", pg]);
    assert_eq!(empty.status.code(), Some(2), "{empty:?}");
    assert!(
        String::from_utf8_lossy(&empty.stderr).contains("the file is empty"),
        "{empty:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_on_a_unix_socket_answers_a_key_and_ends_on_sigterm() {
    let home = tempfile::tempdir().unwrap();
    let key = String::from_utf8(agentbox(home.path(), &["serve", "keys", "add", "me"]).stdout)
        .unwrap()
        .trim()
        .to_string();
    let socket = home.path().join("agentbox.sock");
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentbox"))
        .args(["serve", "--provider", "local", "--socket", socket.to_str().unwrap()])
        .env("AGENTBOX_HOME", home.path())
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut err = server.stderr.take().unwrap();
    let logged = tokio::spawn(async move {
        let mut all = String::new();
        let _ = err.read_to_string(&mut all).await;
        all
    });
    for _ in 0..200 {
        if socket.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mode = std::fs::metadata(&socket)
        .expect("the socket is made")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "this user's alone");
    let (status, body) = request(&socket, None, "/v1/providers").await;
    assert!(status.contains(" 401 "), "{status} {body}");
    assert!(body.contains("\"unauthenticated\""), "{body}");
    let (status, body) = request(&socket, Some(&key), "/v1/providers").await;
    assert!(status.contains(" 200 "), "{status} {body}");
    assert!(
        body.contains("\"name\":\"local\"") && body.contains("\"default\":true"),
        "{body}"
    );
    let pid = server.id().unwrap() as i32;
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(20), server.wait())
        .await
        .expect("SIGTERM ends it")
        .unwrap();
    assert!(ended.success(), "{ended}");
    let log = logged.await.unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("path=/v1/providers") && l.contains("status=200"))
        .unwrap_or_else(|| panic!("an access-log line for the request: {log}"));
    assert!(line.contains("key=me") && line.contains("method=GET"), "{line}");
    assert!(
        log.lines()
            .any(|l| l.contains("path=/v1/providers") && l.contains("status=401") && l.contains("key=-")),
        "the refused request is logged too: {log}"
    );
    assert!(!log.contains(&key), "never the key itself");
    assert!(log.contains("stopping"), "{log}");
}

#[test]
fn plain_http_beyond_loopback_is_refused_unless_said_outright() {
    let home = tempfile::tempdir().unwrap();
    let out = agentbox(home.path(), &["serve", "--listen", "0.0.0.0:0"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--insecure-listen"),
        "{out:?}"
    );
    // TLS takes both files, and says which one is not what it should be.
    let half = agentbox(home.path(), &["serve", "--tls-cert", "c.pem"]);
    assert_eq!(half.status.code(), Some(2), "{half:?}");
    assert!(String::from_utf8_lossy(&half.stderr).contains("--tls-key"), "{half:?}");
    let junk = home.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let j = junk.to_str().unwrap();
    let bad = agentbox(
        home.path(),
        &["serve", "--listen", "0.0.0.0:0", "--tls-cert", j, "--tls-key", j],
    );
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--tls-cert"), "{bad:?}");
}

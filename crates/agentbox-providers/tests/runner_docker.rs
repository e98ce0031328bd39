//! Docker boxes through their runner: the conformance suite over the container's address, a
//! box with no network reached through a relay exec, and a box found again by a new provider.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, ExecOptions, FinishOptions, Network, Provider, Spec, finish};
use agentbox_providers::docker::{DockerOptions, DockerProvider};
use agentbox_providers::helper::HelperCommand;
use agentbox_testing::conformance::{self, Options};
use agentbox_testing::outside::{DockerCli, docker};
use agentbox_testing::services::docker_available;

fn with_runner() -> DockerOptions {
    DockerOptions {
        runner: Some(HelperCommand::new(agentbox_testing::runner::ensure(), vec![])),
        ..DockerOptions::default()
    }
}

async fn provider(opts: DockerOptions) -> Arc<dyn Provider> {
    Arc::new(DockerProvider::new(opts).await.expect("the Docker daemon answers"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_boxes_through_their_runner_pass_the_conformance_suite() {
    if !docker_available("docker_boxes_through_their_runner_pass_the_conformance_suite") {
        return;
    }
    let options = Options::new(
        "docker+runner",
        Duration::from_secs(5),
        Duration::from_secs(10),
        Arc::new(DockerCli),
    );
    let report = conformance::run(
        conformance::factory(|| async { provider(with_runner()).await }),
        options,
    )
    .await;
    report.assert_all_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_boxes_with_no_network_pass_the_conformance_suite_through_their_socket() {
    if !docker_available("docker_boxes_with_no_network_pass_the_conformance_suite_through_their_socket") {
        return;
    }
    // No network: this machine reaches the runner by its socket all the same (the relay is
    // the way of a host that cannot open it, tested below). A lifetime long enough that a
    // loaded machine still makes the box and scatters its programs within it.
    let mut options = Options::new(
        "docker+runner, network none",
        Duration::from_secs(15),
        Duration::from_secs(10),
        Arc::new(DockerCli),
    );
    options.base.network = Some(Network::None);
    let report = conformance::run(
        conformance::factory(|| async { provider(with_runner()).await }),
        options,
    )
    .await;
    // typed_refusals adds ports to the base spec, which a box with no network refuses first,
    // as invalid (the open-network run above passes it): every other case must pass.
    for (name, outcome, _) in &report.cases {
        match outcome {
            conformance::Outcome::Passed => {}
            conformance::Outcome::Failed(why)
                if name == "typed_refusals" && why.contains("network none cannot expose ports") => {}
            other => panic!("{name}: {other:?}"),
        }
    }
    assert!(report.cases.len() >= 17, "{:?}", report.cases);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_box_with_no_network_is_reached_through_a_relay() {
    if !docker_available("a_box_with_no_network_is_reached_through_a_relay") {
        return;
    }
    let p = provider(with_runner()).await;
    let ctx = Ctx::background().with_timeout(Duration::from_secs(120));
    let mut spec = Spec::new(Duration::from_secs(120));
    spec.network = Some(Network::None);
    let made = p.create(&spec, &ctx).await.unwrap();
    // This machine reaches it by the socket in its runner directory, with no network.
    let runner = made.facts().runner.clone().unwrap_or_default();
    assert!(runner.contains("unix:") && runner.contains("runner.sock"), "{runner}");
    // Where this machine cannot open that socket (here: it is gone), a relay exec is the way.
    remove_host_socket(made.id().name());
    let b = provider(with_runner())
        .await
        .attach(made.id(), &ctx)
        .await
        .unwrap()
        .unwrap();
    let runner = b.facts().runner.clone().unwrap_or_default();
    assert!(runner.contains("relay"), "{runner}");
    let files = b.files().unwrap();
    files.write("x/y", b"through the relay", false, &ctx).await.unwrap();
    assert_eq!(
        files.read("x/y", &ctx).await.unwrap(),
        Some(b"through the relay".to_vec())
    );
    let argv: Vec<String> = ["cat", "x/y"].iter().map(|s| s.to_string()).collect();
    let out = finish(
        b.exec(&argv, &ExecOptions::default(), &ctx).await.unwrap(),
        FinishOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(out.stdout_text(), "through the relay");
    b.destroy(&ctx).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_provider_finds_the_runner_and_the_token_is_never_in_the_box() {
    if !docker_available("a_new_provider_finds_the_runner_and_the_token_is_never_in_the_box") {
        return;
    }
    let ctx = Ctx::background().with_timeout(Duration::from_secs(120));
    let b = provider(with_runner())
        .await
        .create(&Spec::new(Duration::from_secs(120)), &ctx)
        .await
        .unwrap();
    let runner = b.facts().runner.clone().unwrap_or_default();
    assert!(
        runner.contains("unix:"),
        "over the socket in its runner directory: {runner}"
    );
    // The runner and its directory are not among the spec's mounts.
    assert!(b.facts().mounts.is_empty(), "{:?}", b.facts().mounts);
    // A host that cannot open that socket goes by the container's address, with the token.
    remove_host_socket(b.id().name());
    let again = provider(with_runner())
        .await
        .attach(b.id(), &ctx)
        .await
        .unwrap()
        .unwrap();
    assert!(again.files().is_some());
    let runner = again.facts().runner.clone().unwrap_or_default();
    assert!(runner.contains(":7700"), "over the container's address: {runner}");
    again.files().unwrap().write("seen", b"1", false, &ctx).await.unwrap();
    // Neither the runner's argv nor its environment, nor any file, holds the token.
    let name = b.id().name().to_string();
    let cmdlines = docker(&[
        "exec",
        &name,
        "sh",
        "-c",
        "cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null | tr '\\0' ' '",
    ])
    .unwrap();
    assert!(cmdlines.contains("agentbox-runner"), "{cmdlines}");
    assert!(cmdlines.contains("--token-stdin"), "{cmdlines}");
    // The token is 64 hex digits: no such run appears in any argv or environment of the box.
    let longest_hex = cmdlines
        .split(|c: char| !c.is_ascii_hexdigit())
        .map(str::len)
        .max()
        .unwrap_or(0);
    assert!(longest_hex < 64, "a token-like string in the box: {cmdlines}");
    let files = docker(&[
        "exec",
        &name,
        "sh",
        "-c",
        "grep -rlE '[0-9a-f]{64}' /tmp /workspace /root /home /etc 2>/dev/null || true",
    ])
    .unwrap();
    assert!(files.is_empty(), "token-like bytes in files of the box: {files}");
    let home = agentbox_providers::home::default_home().unwrap();
    let key = std::fs::read(home.join("runner.key")).unwrap();
    assert_eq!(key.len(), 32);
    b.destroy(&ctx).await.unwrap();
}

/// Take away this machine's end of a box's runner socket, as a host user the socket refuses
/// would find it.
fn remove_host_socket(container: &str) {
    let home = agentbox_providers::home::default_home().unwrap();
    let sock = home.join("docker").join(container).join("runner.sock");
    std::fs::remove_file(&sock).unwrap_or_else(|e| panic!("{}: {e}", sock.display()));
}

/// Whether `path` is an ELF file with no program interpreter (static), read from its headers.
fn is_static_elf(path: &std::path::Path) -> bool {
    let Ok(b) = std::fs::read(path) else { return false };
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 {
        return false;
    }
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(b[32..40].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    (0..phnum).all(|i| {
        let at = phoff + i * phentsize;
        // PT_INTERP (3) names the dynamic loader a dynamic binary needs.
        b.get(at..at + 4)
            .is_some_and(|t| u32::from_le_bytes(t.try_into().unwrap()) != 3)
    })
}

#[test]
fn the_runner_needs_nothing_in_the_box() {
    if !docker_available("the_runner_needs_nothing_in_the_box") {
        return;
    }
    let helper = HelperCommand::new(agentbox_testing::runner::ensure(), vec![]);
    if !is_static_elf(&helper.program) {
        let why = format!(
            "{} is not a static build: set AGENTBOX_RUNNER to scripts/runner-static's (scripts/test does)",
            helper.program.display()
        );
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("the_runner_needs_nothing_in_the_box: {why}");
        }
        eprintln!("\n!!!! the_runner_needs_nothing_in_the_box did NOT run: {why} !!!!\n");
        return;
    }
    // An image holding the runner and nothing else: no libc, no shell, no loader.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&helper.program, dir.path().join("agentbox-runner")).unwrap();
    let image = "agentbox-runner-only:test";
    let tar = Command::new("tar")
        .args(["-C", &dir.path().to_string_lossy(), "-cf", "-", "agentbox-runner"])
        .output()
        .unwrap();
    let mut import = Command::new("docker")
        .args(["import", "-", image])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut import.stdin.take().unwrap(), &tar.stdout).unwrap();
    assert!(import.wait().unwrap().success(), "docker import");
    let id = docker(&[
        "run",
        "-d",
        "--rm",
        "--entrypoint",
        "/agentbox-runner",
        image,
        "--listen",
        "0.0.0.0:7700",
    ])
    .expect("a container of the runner alone");
    let ip = docker(&[
        "inspect",
        "-f",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        &id,
    ])
    .unwrap();
    let mut answer = String::new();
    for _ in 0..50 {
        if let Ok(mut s) = std::net::TcpStream::connect(format!("{ip}:7700")) {
            use std::io::{Read, Write};
            s.write_all(b"GET /runner/health HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
            let _ = s.read_to_string(&mut answer);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = docker(&["rm", "-f", &id]);
    let _ = docker(&["rmi", image]);
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains(r#""protocol":2"#),
        "{answer:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_box_removed_behind_the_hosts_back_is_gone_not_a_hang() {
    if !docker_available("a_box_removed_behind_the_hosts_back_is_gone_not_a_hang") {
        return;
    }
    let ctx = Ctx::background().with_timeout(Duration::from_secs(120));
    let b = provider(with_runner())
        .await
        .create(&Spec::new(Duration::from_secs(120)), &ctx)
        .await
        .unwrap();
    b.upload("before", b"1", &ctx).await.unwrap();
    // The engine removes it; its address then answers nothing at all.
    docker(&["rm", "-f", b.id().name()]).unwrap();
    let t = std::time::Instant::now();
    let e = b.upload("after", b"2", &ctx).await.unwrap_err();
    assert_eq!(e.code(), agentbox_core::ErrorCode::Gone, "{e}");
    assert!(t.elapsed() < Duration::from_secs(60), "took {:?}", t.elapsed());
}

fn drops() -> agentbox_testing::processes::DropConnections {
    Arc::new(|name: String| Box::pin(async move { agentbox_providers::runner::drop_connections(&name).await }))
}

/// Terminals, dropped connections, late readers and processes that outlive their host, in
/// Docker boxes through their runner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_runner_boxes_keep_their_processes() {
    let name = "docker_runner_boxes_keep_their_processes";
    if !docker_available(name) {
        return;
    }
    let p = provider(with_runner()).await;
    if agentbox_testing::reexec::part().is_none() {
        agentbox_testing::processes::terminal(&*p).await.unwrap();
        agentbox_testing::processes::curses_output_whole(&*p).await.unwrap();
        agentbox_testing::processes::drops_lose_nothing(&*p, drops(), false)
            .await
            .unwrap();
        agentbox_testing::processes::drops_lose_nothing(&*p, drops(), true)
            .await
            .unwrap();
        agentbox_testing::processes::late_reader_told_the_gap(&*p)
            .await
            .unwrap();
    }
    agentbox_testing::processes::outlive_the_host(name, &*p, &[])
        .await
        .unwrap();
}

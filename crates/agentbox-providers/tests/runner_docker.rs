//! Docker boxes through their runner: the conformance suite over the container's address, a
//! box with no network reached through a relay exec, and a box found again by a new provider.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, ExecOptions, FinishOptions, Network, Provider, SandboxId, Spec, finish};
use agentbox_providers::docker::{DockerOptions, DockerProvider};
use agentbox_providers::helper::HelperCommand;
use agentbox_testing::conformance::{self, Options, Outside};
use agentbox_testing::services::docker_available;
use async_trait::async_trait;

struct DockerCli;

fn docker(args: &[&str]) -> Option<String> {
    let out = Command::new("docker").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn container_running(name: &str) -> bool {
    docker(&["inspect", "--format", "{{.State.Running}}", name]).is_some_and(|s| s == "true")
}

#[async_trait]
impl Outside for DockerCli {
    async fn ended(&self, id: &SandboxId) -> bool {
        !container_running(id.name())
    }
    async fn any_alive(&self, id: &SandboxId, pids: &[u32]) -> bool {
        if !container_running(id.name()) {
            return false;
        }
        pids.iter().any(|p| {
            let script = format!("sed -n 's/.*) \\(.\\).*/\\1/p' /proc/{p}/stat 2>/dev/null");
            docker(&["exec", id.name(), "sh", "-c", &script]).is_some_and(|s| !s.is_empty() && s != "Z" && s != "X")
        })
    }
}

fn with_runner() -> DockerOptions {
    DockerOptions {
        runner: Some(HelperCommand::discover().expect("the agentbox-runner binary")),
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
    report.assert_passed();
    assert!(
        report.cases.iter().all(|(_, o, _)| *o == conformance::Outcome::Passed),
        "no case is left out"
    );
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
    let b = p.create(&spec, &ctx).await.unwrap();
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
    assert!(runner.contains(":7700"), "over the container's address: {runner}");
    // The runner is not one of the spec's mounts.
    assert!(b.facts().mounts.is_empty(), "{:?}", b.facts().mounts);
    let again = provider(with_runner())
        .await
        .attach(b.id(), &ctx)
        .await
        .unwrap()
        .unwrap();
    assert!(again.files().is_some());
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
    let home = agentbox_providers::local::default_home().unwrap();
    let key = std::fs::read(home.join("runner.key")).unwrap();
    assert_eq!(key.len(), 32);
    b.destroy(&ctx).await.unwrap();
}

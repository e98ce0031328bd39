//! `BoxEnv` over an Archil exec box of the repository's fake Archil, as the seed says hands
//! behave there: files by upload and download through the disk's object API (every byte, and
//! a binary reader that refuses past its bound before a byte moves), an append as its own
//! upload and one command, a path outside the workspace read as text only, no per-call env, a
//! command's deadline the caller's timeout. The differential test holds the rest to the host's
//! answers (`host_and_an_archil_box_agree`).

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Provider, Sandbox, Spec};
use agentbox_fakes::archil::{FakeArchil, FakeArchilOptions};
use agentbox_hands::*;
use agentbox_providers::archil::{ApiKey, ArchilOptions, ArchilProvider};

const KEY: &str = "archil-hands-fake-key";

/// The fake, its disk id and a box on it; `None` (loudly, or a panic under CI) without a
/// rootfs.
async fn archil_box(test: &str) -> Option<(FakeArchil, String, Arc<dyn Sandbox>)> {
    let rootfs = agentbox_testing::services::rootfs(test)?;
    let fake = FakeArchil::start(FakeArchilOptions {
        rootfs: Some(rootfs.into()),
        api_key: KEY.into(),
        ..Default::default()
    })
    .await
    .expect("the fake Archil starts");
    let disk = fake.create_disk("hands").expect("the fake makes a disk");
    let p = ArchilProvider::new(ArchilOptions {
        base_url: fake.base_url(),
        s3_base_url: fake.s3_base_url(),
        api_key: Some(ApiKey::new(KEY)),
        disk: Some(disk.clone()),
        ..Default::default()
    })
    .unwrap();
    let b = p
        .create(&Spec::new(Duration::from_secs(600)), &Ctx::background())
        .await
        .unwrap();
    Some((fake, disk, b))
}

#[path = "common/sink.rs"]
mod common_sink;

async fn sh(env: &dyn ExecutionEnv, script: &str, opts: ExecOptions) -> Result<(i32, String), ExecError> {
    let (out, collect) = common_sink::sink();
    let opts = ExecOptions {
        on_output: collect.on_output,
        ..opts
    };
    let r = env
        .exec(Command::Shell(script.into()), opts, &Ctx::background())
        .await?;
    let text = out.lock().unwrap().clone();
    Ok((r.exit_code, text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hands_over_an_archil_box_move_bytes_exactly_and_refuse_what_they_cannot_do() {
    let Some((fake, disk, b)) = archil_box("hands_over_an_archil_box").await else {
        return;
    };
    let ctx = Ctx::background();
    let env = BoxEnv::new(b.clone()).with_max_reader_bytes(1000);
    let count = |method: &str, tail: &str| {
        fake.requests()
            .iter()
            .filter(|r| r.method == method && r.path.starts_with(&format!("/s3/{disk}/")) && r.path.ends_with(tail))
            .count()
    };

    // Every byte value, by one PUT and one GET of the object API.
    let bytes: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    env.write_file("bin/all", &bytes, &ctx).await.unwrap();
    assert_eq!(env.read_binary_file("bin/all", &ctx).await.unwrap(), bytes);
    assert_eq!(count("PUT", "/bin/all"), 1);
    assert_eq!(count("GET", "/bin/all"), 1);

    // A binary reader refuses a file over its bound before a byte of it moves.
    env.write_file("big", &[b'x'; 1001], &ctx).await.unwrap();
    let e = env.open_binary_reader("big", false, &ctx).await.unwrap_err();
    assert_eq!(e.code, FsCode::NotSupported, "{e}");
    assert_eq!(count("GET", "/big"), 0, "the file over the bound was read");

    // An append: its own upload, then one command; a command queued beside it keeps its change.
    env.write_file("log", b"start\n", &ctx).await.unwrap();
    let queued = {
        let env = BoxEnv::new(b.clone());
        tokio::spawn(async move { sh(&env, "sleep 1; echo command >> log", ExecOptions::default()).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.append_file("log", b"appended \xff\n", &ctx).await.unwrap();
    assert_eq!(queued.await.unwrap().unwrap().0, 0);
    assert_eq!(
        env.read_binary_file("log", &ctx).await.unwrap(),
        b"start\ncommand\nappended \xff\n"
    );
    assert_eq!(count("GET", "/log"), 1, "the append read nothing back");

    // Outside the workspace: read as text, never written.
    let hostname = env.read_text_file("/etc/debian_version", &ctx).await.unwrap();
    assert!(!hostname.trim().is_empty());
    let e = env.write_file("/tmp/outside", b"x", &ctx).await.unwrap_err();
    assert_eq!(e.code, FsCode::NotSupported, "{e}");

    // A per-call env, PATH included, never reaches such a box.
    for name in ["MODE", "PATH"] {
        let opts = ExecOptions {
            env: [(name.to_string(), "x".to_string())].into(),
            ..Default::default()
        };
        let e = sh(&env, "true", opts).await.unwrap_err();
        assert_eq!(e.code, ExecCode::SpawnError, "{name}: {}", e.message);
    }

    // The caller's timeout is the command's own deadline, in the box.
    let opts = ExecOptions {
        timeout: Some(1.0),
        ..Default::default()
    };
    let started = std::time::Instant::now();
    let e = sh(&env, "echo before; sleep 20", opts).await.unwrap_err();
    assert_eq!(e.code, ExecCode::Timeout, "{}", e.message);
    // Ended in the box by its own deadline, not given up on by the caller.
    assert!(!e.kill_unconfirmed, "{}", e.message);
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    let (code, out) = sh(&env, "echo after", ExecOptions::default()).await.unwrap();
    assert_eq!(
        (code, out.as_str()),
        (0, "after\n"),
        "the next call went once the first ended"
    );

    env.cleanup(&ctx).await.unwrap();
    b.destroy(&ctx).await.unwrap();
    fake.shutdown().await;
}

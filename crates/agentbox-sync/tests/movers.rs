//! Seed and pull round trips on a local box and a Docker box.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, ErrorCode, ExecOptions, FinishOptions, Provider, Sandbox, Spec, finish};
use agentbox_providers::docker::{DockerOptions, DockerProvider};
use agentbox_providers::{LocalOptions, LocalProvider};
use agentbox_sync::{PullOptions, SeedOptions, pull_dir, seed_dir};

async fn sh(b: &dyn Sandbox, script: &str) -> String {
    let argv = vec!["sh".to_string(), "-c".into(), script.into()];
    let out = finish(
        b.exec(&argv, &ExecOptions::default(), &Ctx::background())
            .await
            .unwrap(),
        FinishOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(out.status.code, 0, "{script}: {}", out.stderr_text());
    out.stdout_text()
}

async fn boxes(home: &std::path::Path) -> Vec<Arc<dyn Sandbox>> {
    agentbox_testing::runner::ensure();
    let spec = Spec::new(Duration::from_secs(600));
    let mut v = vec![
        LocalProvider::new(LocalOptions::at(home).unwrap())
            .unwrap()
            .create(&spec, &Ctx::background())
            .await
            .unwrap(),
    ];
    if agentbox_testing::services::docker_available("seed and pull on a Docker box") {
        v.push(
            DockerProvider::new(DockerOptions::default())
                .await
                .unwrap()
                .create(&spec, &Ctx::background())
                .await
                .unwrap(),
        );
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_then_incremental_pulls_round_trip_a_tree() {
    let home = tempfile::tempdir().unwrap();
    for b in boxes(home.path()).await {
        let name = b.id().provider().to_string();
        let ctx = Ctx::background();
        let work = format!("{}/run", b.facts().workspace.clone().unwrap());
        let src = tempfile::tempdir().unwrap();
        let s = src.path();
        std::fs::create_dir_all(s.join("src/deep")).unwrap();
        std::fs::write(s.join("src/deep/a.txt"), "alpha\n").unwrap();
        std::fs::write(s.join("run.sh"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(s.join("run.sh"), std::fs::Permissions::from_mode(0o4777)).unwrap();
        std::fs::write(s.join(".hidden"), "dot\n").unwrap();
        std::fs::create_dir_all(s.join("skipme")).unwrap();
        std::fs::write(s.join("skipme/x"), "x").unwrap();
        std::fs::create_dir_all(s.join("learning")).unwrap();
        std::fs::write(s.join("learning/notes"), "keep").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", s.join("link")).unwrap();

        let seeded = seed_dir(
            &*b,
            &SeedOptions {
                from: s.to_path_buf(),
                to: work.clone(),
                exclude: vec!["skipme".into()],
                read_only: vec!["learning".into()],
                ..Default::default()
            },
            &ctx,
        )
        .await
        .unwrap();
        assert_eq!(seeded.skipped.get("link"), Some(&1), "{name}");
        let listing = sh(
            &*b,
            &format!("cd {work} && find . | sort && stat -c '%a %n' run.sh learning/notes"),
        )
        .await;
        assert!(
            listing.contains("./src/deep/a.txt") && listing.contains("./.hidden"),
            "{name}: {listing}"
        );
        assert!(
            !listing.contains("skipme") && !listing.contains("./link"),
            "{name}: {listing}"
        );
        assert!(
            listing.contains("755 run.sh") && listing.contains("444 learning/notes"),
            "{name}: {listing}"
        );
        assert!(seeded.mark.entries["src/deep/a.txt"].sha256.is_some(), "{name}");

        // Nothing changed: nothing moves.
        let dest = tempfile::tempdir().unwrap();
        let opts = |since| PullOptions {
            from: work.clone(),
            to: dest.path().to_path_buf(),
            since,
            mirror_deletes: true,
            ..Default::default()
        };
        let first = pull_dir(&*b, &opts(None), &ctx).await.unwrap();
        assert!(first.receipt.stopped.is_none(), "{name}: {:?}", first.receipt);
        assert_eq!(
            std::fs::read_to_string(dest.path().join("src/deep/a.txt")).unwrap(),
            "alpha\n"
        );
        let again = pull_dir(&*b, &opts(Some(first.mark.clone())), &ctx).await.unwrap();
        assert_eq!(again.fetched, 0, "{name}");

        // One file changed, one new, one restored with an old time, one deleted, a link made.
        sh(&*b, &format!("cd {work} && echo beta >> src/deep/a.txt && echo new > new.txt && ln new.txt twin.txt && touch -d 2001-01-01 .hidden && rm run.sh && ln -s /etc/shadow evil")).await;
        let next = pull_dir(&*b, &opts(Some(again.mark.clone())), &ctx).await.unwrap();
        assert_eq!((next.fetched, next.deleted), (4, 1), "{name}: {:?}", next.receipt);
        // Two names of one inode both come back as files.
        assert_eq!(
            std::fs::read_to_string(dest.path().join("twin.txt")).unwrap(),
            "new\n",
            "{name}"
        );
        assert_eq!(
            std::fs::read_to_string(dest.path().join("src/deep/a.txt")).unwrap(),
            "alpha\nbeta\n"
        );
        assert_eq!(std::fs::read_to_string(dest.path().join("new.txt")).unwrap(), "new\n");
        assert!(
            !dest.path().join("run.sh").exists() && !dest.path().join("evil").exists(),
            "{name}"
        );

        // A host copy changed since the mark wins; the box's file is not fetched.
        std::fs::write(dest.path().join("new.txt"), "host edit\n").unwrap();
        sh(&*b, &format!("cd {work} && echo box edit > new.txt")).await;
        let guarded = PullOptions {
            if_unchanged: true,
            ..opts(Some(next.mark.clone()))
        };
        let kept = pull_dir(&*b, &guarded, &ctx).await.unwrap();
        assert_eq!(kept.host_changed, vec!["new.txt"], "{name}");
        assert_eq!(
            std::fs::read_to_string(dest.path().join("new.txt")).unwrap(),
            "host edit\n"
        );

        // A host copy that is what the box holds is no change here (a pull killed after it
        // renamed the file in, before its mark was kept): taken as pulled, so the box's next
        // change comes back.
        std::fs::write(dest.path().join("new.txt"), "box edit\n").unwrap();
        let agreed = pull_dir(&*b, &guarded, &ctx).await.unwrap();
        assert!(agreed.host_changed.is_empty(), "{name}: {:?}", agreed.host_changed);
        sh(&*b, &format!("cd {work} && echo box again > new.txt")).await;
        let guarded = PullOptions {
            if_unchanged: true,
            ..opts(Some(agreed.mark.clone()))
        };
        let again = pull_dir(&*b, &guarded, &ctx).await.unwrap();
        assert!(again.host_changed.is_empty(), "{name}: {:?}", again.host_changed);
        assert_eq!(
            std::fs::read_to_string(dest.path().join("new.txt")).unwrap(),
            "box again\n",
            "{name}"
        );

        // A pull that stops keeps the asked-for paths' old entries: the next pull asks again.
        sh(&*b, &format!("cd {work} && head -c 4096 /dev/zero > big.bin")).await;
        let bounded = PullOptions {
            max_bytes: Some(2048),
            ..opts(Some(again.mark.clone()))
        };
        let stopped = pull_dir(&*b, &bounded, &ctx).await.unwrap();
        assert_eq!(
            stopped.receipt.stopped.as_ref().map(|s| s.reason),
            Some(agentbox_sync::StopReason::TooLarge),
            "{name}"
        );
        assert!(!dest.path().join("big.bin").exists(), "{name}");
        let second = pull_dir(&*b, &opts(Some(stopped.mark)), &ctx).await.unwrap();
        assert!(second.receipt.stopped.is_none(), "{name}");
        assert_eq!(
            std::fs::metadata(dest.path().join("big.bin")).unwrap().len(),
            4096,
            "{name}: asked for again"
        );

        // A listing over its bound is too_large.
        let tiny = PullOptions {
            max_listing_bytes: Some(10),
            ..opts(None)
        };
        assert_eq!(
            pull_dir(&*b, &tiny, &ctx).await.unwrap_err().code(),
            ErrorCode::TooLarge,
            "{name}"
        );
        b.destroy(&ctx).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_home_keeps_its_learning() {
    agentbox_testing::runner::ensure();
    let home = tempfile::tempdir().unwrap();
    let b = LocalProvider::new(LocalOptions::at(home.path()).unwrap())
        .unwrap()
        .create(&Spec::new(Duration::from_secs(300)), &Ctx::background())
        .await
        .unwrap();
    let ctx = Ctx::background();
    let h = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(h.path().join("learning")).unwrap();
    std::fs::write(h.path().join("learning/lesson"), "one").unwrap();
    std::fs::write(h.path().join("notes"), "n").unwrap();
    let to = format!("{}/home", b.facts().workspace.clone().unwrap());
    let seeded = agentbox_sync::seed_agent_home(
        &*b,
        &SeedOptions {
            from: h.path().to_path_buf(),
            to: to.clone(),
            ..Default::default()
        },
        &ctx,
    )
    .await
    .unwrap();
    assert_eq!(sh(&*b, &format!("stat -c %a {to}/learning/lesson")).await.trim(), "444");
    sh(
        &*b,
        &format!("chmod u+w {to}/learning {to}/learning/lesson; echo changed > {to}/learning/lesson; rm {to}/notes"),
    )
    .await;
    let pulled = agentbox_sync::pull_agent_home(
        &*b,
        &PullOptions {
            from: to,
            to: h.path().to_path_buf(),
            since: Some(seeded.mark),
            mirror_deletes: true,
            ..Default::default()
        },
        &ctx,
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(h.path().join("learning/lesson")).unwrap(),
        "one",
        "learning never comes back"
    );
    assert!(!h.path().join("notes").exists(), "other deletions mirror");
    assert_eq!(pulled.deleted, 1);
    b.destroy(&ctx).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_and_a_host_edit_are_kept_in_the_mark_until_acted_on() {
    agentbox_testing::runner::ensure();
    let home = tempfile::tempdir().unwrap();
    let b = LocalProvider::new(LocalOptions::at(home.path()).unwrap())
        .unwrap()
        .create(&Spec::new(Duration::from_secs(300)), &Ctx::background())
        .await
        .unwrap();
    let ctx = Ctx::background();
    let work = format!("{}/run", b.facts().workspace.clone().unwrap());
    let host = tempfile::tempdir().unwrap();
    let h = host.path();
    for f in ["a.txt", "b.txt", "c.txt"] {
        std::fs::write(h.join(f), f).unwrap();
    }
    let seeded = seed_dir(
        &*b,
        &SeedOptions {
            from: h.to_path_buf(),
            to: work.clone(),
            ..Default::default()
        },
        &ctx,
    )
    .await
    .unwrap();
    let opts = |since, mirror_deletes, if_unchanged| PullOptions {
        from: work.clone(),
        to: h.to_path_buf(),
        since: Some(since),
        mirror_deletes,
        if_unchanged,
        ..Default::default()
    };

    // A deletion a plain pull saw is still there for the mirror after it.
    sh(&*b, &format!("rm {work}/a.txt")).await;
    let plain = pull_dir(&*b, &opts(seeded.mark, false, true), &ctx).await.unwrap();
    assert_eq!(plain.deleted, 0);
    assert!(plain.mark.entries["a.txt"].gone, "{:?}", plain.mark);
    assert!(h.join("a.txt").exists(), "a plain pull removes nothing");
    let mirrored = pull_dir(&*b, &opts(plain.mark, true, true), &ctx).await.unwrap();
    assert_eq!(mirrored.deleted, 1);
    assert!(!h.join("a.txt").exists(), "the later mirror removes it");
    assert!(!mirrored.mark.entries.contains_key("a.txt"), "{:?}", mirrored.mark);

    // A file changed on both sides is left as the host has it, and named again on every pull
    // until a pull without the guard takes the box's.
    sh(&*b, &format!("echo box > {work}/b.txt")).await;
    std::fs::write(h.join("b.txt"), "host").unwrap();
    let kept = pull_dir(&*b, &opts(mirrored.mark, false, true), &ctx).await.unwrap();
    assert_eq!(kept.host_changed, vec!["b.txt"]);
    assert_eq!(std::fs::read_to_string(h.join("b.txt")).unwrap(), "host");
    let again = pull_dir(&*b, &opts(kept.mark, false, true), &ctx).await.unwrap();
    assert_eq!(again.host_changed, vec!["b.txt"], "named again");
    let forced = pull_dir(&*b, &opts(again.mark, false, false), &ctx).await.unwrap();
    assert!(forced.host_changed.is_empty());
    assert_eq!(std::fs::read_to_string(h.join("b.txt")).unwrap(), "box\n");

    // A file deleted in the box and changed here is kept by a guarded mirror, and named; it
    // stays in the mark, so an unguarded mirror later removes it.
    sh(&*b, &format!("rm {work}/c.txt")).await;
    std::fs::write(h.join("c.txt"), "host edit").unwrap();
    let guarded = pull_dir(&*b, &opts(forced.mark, true, true), &ctx).await.unwrap();
    assert_eq!(
        (guarded.deleted, guarded.host_changed.clone()),
        (0, vec!["c.txt".to_string()])
    );
    assert_eq!(std::fs::read_to_string(h.join("c.txt")).unwrap(), "host edit");
    let forced = pull_dir(&*b, &opts(guarded.mark, true, false), &ctx).await.unwrap();
    assert_eq!(forced.deleted, 1);
    assert!(!h.join("c.txt").exists());
    b.destroy(&ctx).await.unwrap();
}

/// A box whose pack, while `hide` names a file, cannot find that file: it is moved aside for
/// the pack's length and back after, as a program in the box might (a save by rename), so the
/// box lists it the same before and after.
struct Hiding {
    inner: Arc<dyn Sandbox>,
    hide: std::sync::Mutex<Option<String>>,
    /// The box hangs: its pack sends a little and then nothing, its unpack takes nothing.
    hang: std::sync::atomic::AtomicBool,
}

impl Hiding {
    /// A local box under `home`, nothing hidden, not hung.
    async fn local(home: &std::path::Path) -> Hiding {
        agentbox_testing::runner::ensure();
        let inner = LocalProvider::new(LocalOptions::at(home).unwrap())
            .unwrap()
            .create(&Spec::new(Duration::from_secs(300)), &Ctx::background())
            .await
            .unwrap();
        Hiding {
            inner,
            hide: std::sync::Mutex::new(None),
            hang: Default::default(),
        }
    }
}

#[async_trait::async_trait]
impl Sandbox for Hiding {
    fn id(&self) -> &agentbox_core::SandboxId {
        self.inner.id()
    }
    fn facts(&self) -> &agentbox_core::Facts {
        self.inner.facts()
    }
    fn labels(&self) -> &agentbox_core::Labels {
        self.inner.labels()
    }
    async fn exec(
        &self,
        argv: &[String],
        opts: &ExecOptions,
        ctx: &Ctx,
    ) -> agentbox_core::Result<agentbox_core::Process> {
        let hide = self.hide.lock().unwrap().clone();
        if self.hang.load(std::sync::atomic::Ordering::SeqCst) {
            let script = match argv.get(3).map(String::as_str) {
                Some("agentbox-pull") => "head -c 512 /dev/zero; exec sleep 60",
                Some("agentbox-seed") => "exec sleep 60",
                _ => return self.inner.exec(argv, opts, ctx).await,
            };
            let argv = ["sh", "-c", script].map(String::from);
            return self.inner.exec(&argv, opts, ctx).await;
        }
        match hide {
            Some(name) if argv.get(3).is_some_and(|a| a == "agentbox-pull") => {
                let script = format!(
                    "cd -- \"$1\" || exit 3; mv {name} .aside; \
                     tar -c -f - --null --no-recursion --hard-dereference -T -; s=$?; \
                     mv .aside {name}; exit $s"
                );
                let argv = ["sh", "-c", &script, "agentbox-pull", &argv[4]].map(String::from);
                self.inner.exec(&argv, opts, ctx).await
            }
            _ => self.inner.exec(argv, opts, ctx).await,
        }
    }
    async fn status(&self, ctx: &Ctx) -> agentbox_core::Result<agentbox_core::Status> {
        self.inner.status(ctx).await
    }
    async fn upload(&self, path: &str, data: &[u8], ctx: &Ctx) -> agentbox_core::Result<()> {
        self.inner.upload(path, data, ctx).await
    }
    async fn download(&self, path: &str, max: u64, ctx: &Ctx) -> agentbox_core::Result<Vec<u8>> {
        self.inner.download(path, max, ctx).await
    }
    async fn endpoint(&self, port: u16, ctx: &Ctx) -> agentbox_core::Result<agentbox_core::Endpoint> {
        self.inner.endpoint(port, ctx).await
    }
    async fn destroy(&self, ctx: &Ctx) -> agentbox_core::Result<()> {
        self.inner.destroy(ctx).await
    }
}

/// A file the box listed and then could not send is named by the pull, keeps its old mark
/// entry, and comes on the next pull; a file the box would not let the seed write is named by
/// the seed and gets no hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_was_not_copied_is_named_and_not_marked() {
    let home = tempfile::tempdir().unwrap();
    let b = Hiding::local(home.path()).await;
    let ctx = Ctx::background();
    let work = format!("{}/run", b.facts().workspace.clone().unwrap());
    let host = tempfile::tempdir().unwrap();
    let h = host.path();
    std::fs::write(h.join("a.txt"), "one").unwrap();
    std::fs::write(h.join("b.txt"), "two").unwrap();
    std::fs::write(h.join("c.txt"), "three").unwrap();
    // The seed: the box holds a directory where c.txt goes, so its tar cannot write it.
    sh(&b, &format!("mkdir -p {work}/c.txt/inner")).await;
    let seeded = seed_dir(
        &b,
        &SeedOptions {
            from: h.to_path_buf(),
            to: work.clone(),
            ..Default::default()
        },
        &ctx,
    )
    .await
    .unwrap();
    let stop = seeded.stopped.clone().expect("the seed says it stopped");
    assert_eq!(stop.reason, agentbox_sync::StopReason::CopyFailed);
    assert!(stop.message.contains("c.txt"), "tar's words: {}", stop.message);
    assert_eq!(seeded.copy_failed, vec!["c.txt"]);
    assert_eq!(seeded.mark.entries["c.txt"].kind, "d");
    assert_eq!(
        seeded.mark.entries["c.txt"].sha256, None,
        "no hash for what was not sent"
    );
    assert!(seeded.mark.entries["a.txt"].sha256.is_some());
    let whole = seeded.clone().whole().unwrap_err();
    assert_eq!(whole.code(), ErrorCode::TransferFailed);
    assert!(whole.message().contains("not written in the box: c.txt"), "{whole}");

    // The pull: both files changed in the box, and b.txt cannot be read by the pack.
    sh(&b, &format!("echo ONE! > {work}/a.txt; echo TWO! > {work}/b.txt")).await;
    *b.hide.lock().unwrap() = Some("b.txt".into());
    let opts = |since| PullOptions {
        from: work.clone(),
        to: h.to_path_buf(),
        since: Some(since),
        ..Default::default()
    };
    let pulled = pull_dir(&b, &opts(seeded.mark.clone()), &ctx).await.unwrap();
    let stop = pulled.receipt.stopped.clone().expect("the pull says the copy failed");
    assert_eq!(stop.reason, agentbox_sync::StopReason::CopyFailed);
    assert!(stop.message.contains("b.txt"), "tar's words: {}", stop.message);
    assert_eq!(pulled.copy_failed, vec!["b.txt"]);
    assert_eq!(std::fs::read_to_string(h.join("a.txt")).unwrap(), "ONE!\n");
    assert_eq!(std::fs::read_to_string(h.join("b.txt")).unwrap(), "two");
    assert_eq!(
        pulled.mark.entries["b.txt"], seeded.mark.entries["b.txt"],
        "b.txt keeps its old entry"
    );
    assert_ne!(pulled.mark.entries["a.txt"], seeded.mark.entries["a.txt"]);

    // The next pull asks for it again, and it comes.
    *b.hide.lock().unwrap() = None;
    let next = pull_dir(&b, &opts(pulled.mark), &ctx).await.unwrap();
    assert!(next.receipt.stopped.is_none(), "{:?}", next.receipt);
    assert!(next.copy_failed.is_empty());
    assert_eq!(std::fs::read_to_string(h.join("b.txt")).unwrap(), "TWO!\n");
    b.destroy(&ctx).await.unwrap();
}

/// A box that hangs mid-transfer never holds the host: a pull whose box sends nothing for the
/// stall limit stops (`stalled`, the pack killed, nothing marked), and so does a seed whose box
/// takes nothing (`timeout`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_that_stalls_is_stopped_at_the_stall_limit() {
    let home = tempfile::tempdir().unwrap();
    let b = Hiding::local(home.path()).await;
    let ctx = Ctx::background();
    let work = format!("{}/run", b.facts().workspace.clone().unwrap());
    let host = tempfile::tempdir().unwrap();
    let h = host.path();
    std::fs::write(h.join("a.txt"), "one").unwrap();
    // 1 MiB: more than a pipe holds, so a box that reads nothing blocks the sender.
    std::fs::write(h.join("big"), vec![7u8; 1 << 20]).unwrap();
    let seed = |stall| SeedOptions {
        from: h.to_path_buf(),
        to: work.clone(),
        stall: Some(stall),
        ..Default::default()
    };
    let seeded = seed_dir(&b, &seed(STALL), &ctx).await.unwrap();
    sh(&b, &format!("echo changed > {work}/a.txt")).await;

    b.hang.store(true, std::sync::atomic::Ordering::SeqCst);
    let t = std::time::Instant::now();
    // The listing runs before the pack and is not hung: only the pack is.
    let opts = PullOptions {
        from: work.clone(),
        to: h.to_path_buf(),
        since: Some(seeded.mark.clone()),
        stall: Some(STALL),
        ..Default::default()
    };
    let pulled = pull_dir(&b, &opts, &ctx).await.unwrap();
    let stop = pulled.receipt.stopped.clone().expect("the pull stopped");
    assert_eq!(stop.reason, agentbox_sync::StopReason::Stalled, "{stop:?}");
    assert!(stop.message.contains("stall limit"), "{}", stop.message);
    assert!(
        t.elapsed() < Duration::from_secs(50),
        "stopped at the limit, not the box's sleep"
    );
    assert_eq!(pulled.copy_failed, vec!["a.txt"]);
    assert_eq!(std::fs::read_to_string(h.join("a.txt")).unwrap(), "one");
    assert_eq!(pulled.mark.entries["a.txt"], seeded.mark.entries["a.txt"], "not marked");

    let t = std::time::Instant::now();
    let e = seed_dir(&b, &seed(STALL), &ctx).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Timeout, "{e}");
    assert!(e.message().contains("took no byte"), "{e}");
    assert!(
        t.elapsed() < Duration::from_secs(50),
        "stopped at the limit, not the box's sleep"
    );
    b.destroy(&ctx).await.unwrap();
}

/// The stall limit of the test above: long enough that a loaded machine starting the pack
/// never trips it, short enough to keep the test quick.
const STALL: Duration = Duration::from_secs(3);

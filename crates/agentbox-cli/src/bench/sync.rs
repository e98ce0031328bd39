//! `agentbox bench sync`: agentbox's extractor beside GNU tar.

use std::time::{Duration, Instant};

use agentbox_core::{Ctx, Error, ExecOptions, FinishOptions, Result, Spec, finish};

use super::BenchArgs;
use super::measure::{measure, pair, stats};

/// Extraction of a 10,000-file tree into an empty directory: agentbox's extractor vs GNU tar,
/// the same archive, interleaved.
pub(super) async fn sync(args: BenchArgs) -> Result<()> {
    let work = std::env::temp_dir().join(format!("agentbox-bench-sync-{}", std::process::id()));
    let src = work.join("src");
    for i in 0..10_000 {
        let p = src.join(format!("d{:02}/s{:02}/f{i}.txt", i % 50, (i / 50) % 20));
        std::fs::create_dir_all(p.parent().unwrap_or(&src)).map_err(|e| Error::io(e, "making the tree"))?;
        std::fs::write(&p, format!("file {i}\n").repeat(1 + i % 40)).map_err(|e| Error::io(e, "making the tree"))?;
    }
    let out = std::process::Command::new("tar")
        .args(["-c", "-f", "-", "-C"])
        .arg(&src)
        .arg(".")
        .output()
        .map_err(|e| Error::io(e, "running GNU tar"))?;
    let archive = std::sync::Arc::new(out.stdout);
    eprintln!(
        "agentbox bench sync: a {}-byte archive of 10,000 files, {} samples of each side",
        archive.len(),
        args.iterations
    );
    let n = args.iterations;
    let (mut ka, mut kb) = (0u32, 0u32);
    let (a, b) = measure(
        n,
        || {
            ka += 1;
            let dest = work.join(format!("gnu-{ka}"));
            let archive = archive.clone();
            async move {
                std::fs::create_dir_all(&dest).map_err(|e| Error::io(e, "bench"))?;
                let mut child = std::process::Command::new("tar")
                    .args(["-x", "-f", "-", "-C"])
                    .arg(&dest)
                    .stdin(std::process::Stdio::piped())
                    .spawn()
                    .map_err(|e| Error::io(e, "running GNU tar"))?;
                use std::io::Write;
                child
                    .stdin
                    .take()
                    .map(|mut s| s.write_all(&archive))
                    .transpose()
                    .map_err(|e| Error::io(e, "feeding tar"))?;
                let st = child.wait().map_err(|e| Error::io(e, "waiting for tar"))?;
                let _ = std::fs::remove_dir_all(&dest);
                if st.success() {
                    Ok(())
                } else {
                    Err(Error::unknown("GNU tar failed"))
                }
            }
        },
        || {
            kb += 1;
            let dest = work.join(format!("ours-{kb}"));
            let archive = archive.clone();
            async move {
                let r = agentbox_sync::extract(&archive[..], &dest, &Default::default());
                let _ = std::fs::remove_dir_all(&dest);
                match r.stopped {
                    None if r.written >= 10_000 => Ok(()),
                    _ => Err(Error::unknown(format!("the extraction stopped: {:?}", r.stopped))),
                }
            }
        },
    )
    .await?;
    let p = pair("extract 10,000 files", "GNU tar -x", "agentbox_sync::extract", a, b);

    // A full pull of the tree from a local box vs an incremental one after one file changed.
    let ctx = Ctx::background().with_timeout(Duration::from_secs(1800));
    let provider = crate::boxes::provider("local").await?;
    let sandbox = provider
        .create(&Spec::new(Duration::from_secs(1800)).label("agentbox-bench", "1"), &ctx)
        .await?;
    let seed = agentbox_sync::SeedOptions {
        from: src.clone(),
        to: "tree".into(),
        ..Default::default()
    };
    let seeded = agentbox_sync::seed_dir(&*sandbox, &seed, &ctx).await?;
    let rounds = n.min(3);
    let (mut full_ms, mut inc_ms, mut full_bytes, mut inc_bytes) = (Vec::new(), Vec::new(), 0, 0);
    let mut mark = seeded.mark.clone();
    for i in 0..rounds {
        let dest = work.join(format!("full-{i}"));
        let t = Instant::now();
        let all = agentbox_sync::PullOptions {
            from: "tree".into(),
            to: dest.clone(),
            ..Default::default()
        };
        let full = agentbox_sync::pull_dir(&*sandbox, &all, &ctx).await?;
        full_ms.push(t.elapsed());
        full_bytes = full.bytes;
        let _ = std::fs::remove_dir_all(&dest);
        let argv = vec![
            "sh".to_string(),
            "-c".into(),
            format!("echo change {i} >> tree/d00/s00/f0.txt"),
        ];
        finish(
            sandbox.exec(&argv, &ExecOptions::default(), &ctx).await?,
            FinishOptions::default(),
        )
        .await?;
        let t = Instant::now();
        let since = agentbox_sync::PullOptions {
            from: "tree".into(),
            to: src.clone(),
            since: Some(mark.clone()),
            ..Default::default()
        };
        let inc = agentbox_sync::pull_dir(&*sandbox, &since, &ctx).await?;
        inc_ms.push(t.elapsed());
        inc_bytes = inc.bytes;
        if inc.fetched != 1 {
            return Err(Error::unknown(format!(
                "the incremental pull fetched {} paths, not 1",
                inc.fetched
            )));
        }
        mark = inc.mark;
    }
    sandbox.destroy(&ctx).await?;
    let _ = std::fs::remove_dir_all(&work);
    let q = pair(
        "pull after 1 of 10,000 changed",
        "a full pull",
        "an incremental pull",
        stats(full_ms),
        stats(inc_ms),
    );
    if args.json {
        let v = serde_json::json!({ "extract": p, "pull": q, "full_pull_bytes": full_bytes, "incremental_pull_bytes": inc_bytes });
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| Error::unknown(e.to_string()))?
        );
    } else {
        println!(
            "{:<32} {:>14} {:>14} {:>8}",
            "operation", "baseline ms", "agentbox ms", "ratio"
        );
        for x in [&p, &q] {
            println!(
                "{:<32} {:>14.1} {:>14.1} {:>7.3}x",
                x.name, x.baseline_ms.median, x.subject_ms.median, x.ratio
            );
            println!("    baseline: {}; agentbox: {}", x.baseline, x.subject);
        }
        println!("bytes out of the box: full pull {full_bytes}, incremental pull {inc_bytes}");
    }
    Ok(())
}

//! `agentbox bench hands`: each of the hands' operations on the host and in boxes.

use std::time::{Duration, Instant};

use agentbox_core::{Ctx, Error, Result, Spec};

use super::BenchArgs;
use super::measure::{Stats, stats};

/// One sample of an operation on an environment.
async fn hand_op(env: &dyn agentbox_hands::ExecutionEnv, op: &str, i: u32) -> Result<()> {
    use agentbox_hands::tools;
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let fail = |e: String| Error::unknown(format!("{op} on {}: {e}", env.id()));
    match op {
        "read 4 KB" => env
            .read_binary_file("bench/4k.bin", &ctx)
            .await
            .map(|_| ())
            .map_err(|e| fail(e.message)),
        "write 4 KB" => env
            .write_file("bench/out.bin", &[b'w'; 4096], &ctx)
            .await
            .map_err(|e| fail(e.message)),
        "edit" => {
            let (from, to) = if i.is_multiple_of(2) {
                ("alpha", "omega")
            } else {
                ("omega", "alpha")
            };
            let args = serde_json::json!({"path": "bench/edit.txt", "edits": [{"oldText": from, "newText": to}]});
            let r = tools::call("edit", env, args, &ctx).await;
            if r.is_error { Err(fail(r.text())) } else { Ok(()) }
        }
        _ => {
            let r = tools::call("bash", env, serde_json::json!({"command": "true"}), &ctx).await;
            if r.is_error { Err(fail(r.text())) } else { Ok(()) }
        }
    }
}

/// Each operation on the host, in a local box (without and with a runner) and in a Docker
/// box, interleaved; ratios against the host.
pub(super) async fn hands(args: BenchArgs) -> Result<()> {
    use agentbox_hands::{BoxEnv, ExecutionEnv, HostEnv};
    let ctx = Ctx::background().with_timeout(Duration::from_secs(600));
    let host_dir = std::env::temp_dir().join(format!("agentbox-bench-{}", std::process::id()));
    std::fs::create_dir_all(&host_dir).map_err(|e| Error::io(e, "making the bench directory"))?;
    let mut envs: Vec<(String, std::sync::Arc<dyn ExecutionEnv>)> = vec![(
        "host".into(),
        std::sync::Arc::new(HostEnv::new(host_dir.to_string_lossy()).map_err(|e| Error::unknown(e.message))?),
    )];
    let spec = Spec::new(Duration::from_secs(900)).label("agentbox-bench", "1");
    let mut boxes = Vec::new();
    // A local box with no runner and one with a runner; a Docker box (with the runner when
    // its binary is found).
    let no_runner = agentbox_providers::registry::Options {
        runner: false,
        ..Default::default()
    };
    for (p, provider) in [
        ("local", crate::boxes::provider_with("local", &no_runner).await),
        ("local", crate::boxes::provider("local").await),
        ("docker", crate::boxes::provider("docker").await),
    ] {
        match provider {
            Ok(provider) => {
                let b = provider.create(&spec, &ctx).await?;
                let name = if b.files().is_some() {
                    format!("{p} runner box")
                } else {
                    format!("{p} box")
                };
                envs.push((name, std::sync::Arc::new(BoxEnv::new(b.clone()))));
                boxes.push(b);
            }
            Err(e) => eprintln!("agentbox bench: no {p} boxes ({e}); measuring without them"),
        }
    }
    for (_, env) in &envs {
        env.write_file("bench/4k.bin", &[b'r'; 4096], &ctx)
            .await
            .map_err(|e| Error::unknown(e.message))?;
        env.write_file("bench/edit.txt", b"alpha\nbeta\n", &ctx)
            .await
            .map_err(|e| Error::unknown(e.message))?;
    }
    let ops = ["read 4 KB", "write 4 KB", "edit", "bash true"];
    let n = args.iterations;
    eprintln!("agentbox bench hands: {n} samples of each operation on each environment, interleaved");
    let mut rows = Vec::new();
    for op in ops {
        let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); envs.len()];
        for (_, env) in &envs {
            hand_op(&**env, op, 0).await?;
        }
        for i in 0..n {
            for (k, (_, env)) in envs.iter().enumerate() {
                let t = Instant::now();
                hand_op(&**env, op, i + 1).await?;
                samples[k].push(t.elapsed());
            }
        }
        let stats: Vec<Stats> = samples.into_iter().map(stats).collect();
        let base = stats[0].median;
        let cells: Vec<serde_json::Value> = envs
            .iter()
            .zip(&stats)
            .map(|((name, _), s)| serde_json::json!({"env": name, "median_ms": s.median, "p90_ms": s.p90, "ratio_to_host": s.median / base}))
            .collect();
        rows.push(serde_json::json!({"operation": op, "results": cells}));
    }
    for b in boxes {
        let _ = b.destroy(&ctx).await;
    }
    let _ = std::fs::remove_dir_all(&host_dir);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(|e| Error::unknown(e.to_string()))?
        );
        return Ok(());
    }
    print!("{:<12}", "operation");
    for (name, _) in &envs {
        print!(" {:>30}", format!("{name} ms (×host)"));
    }
    println!();
    for row in &rows {
        print!("{:<12}", row["operation"].as_str().unwrap_or_default());
        for c in row["results"].as_array().into_iter().flatten() {
            let cell = format!(
                "{:.2} ({:.1}×)",
                c["median_ms"].as_f64().unwrap_or(0.0),
                c["ratio_to_host"].as_f64().unwrap_or(0.0)
            );
            print!(" {cell:>30}");
        }
        println!();
    }
    Ok(())
}

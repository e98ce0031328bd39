//! `agentbox bench boxes`: create → first exec → destroy beside the baseline (the host, or the
//! docker CLI), and create through a warm pool beside the provider alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentbox_core::{Ctx, Error, ExecOptions, FinishOptions, Provider, Result, Sandbox, Spec, finish};

use super::BenchArgs;
use super::measure::{Pair, SETTLE, measure, measure_all, pair, print_pairs, side, stats};

async fn host_true() -> Result<()> {
    let out = tokio::process::Command::new("true")
        .env_clear()
        .output()
        .await
        .map_err(|e| Error::io(e, "spawning true on the host"))?;
    if !out.status.success() {
        return Err(Error::unknown("true failed on the host"));
    }
    Ok(())
}

pub(super) async fn box_true(b: &dyn Sandbox) -> Result<()> {
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let p = b.exec(&["true".to_string()], &ExecOptions::default(), &ctx).await?;
    let out = finish(p, FinishOptions::default()).await?;
    if !out.status.success() {
        return Err(Error::unknown(format!("true exited {} in the box", out.status.code)));
    }
    Ok(())
}

pub(super) async fn create_exec_destroy(p: &Arc<dyn Provider>) -> Result<()> {
    let ctx = Ctx::background().with_timeout(Duration::from_secs(120));
    let spec = Spec::new(Duration::from_secs(300)).label("agentbox-bench", "1");
    let b = p.create(&spec, &ctx).await?;
    let r = box_true(&*b).await;
    b.destroy(&ctx).await?;
    r
}

/// Run `docker ARGS…` and return its trimmed stdout.
async fn docker_cli(args: &[&str]) -> Result<String> {
    let out = tokio::process::Command::new("docker")
        .args(args)
        .output()
        .await
        .map_err(|e| Error::io(e, "running the docker CLI"))?;
    if !out.status.success() {
        return Err(Error::unknown(format!(
            "docker {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// What the docker CLI does for one create → first exec → destroy.
async fn docker_cli_cycle() -> Result<()> {
    let image = agentbox_providers::docker::DEFAULT_IMAGE;
    let id = docker_cli(&["run", "-d", "--rm", "--entrypoint", "sleep", image, "300"]).await?;
    let r = docker_cli(&["exec", &id, "true"]).await;
    docker_cli(&["rm", "-f", &id]).await?;
    r.map(|_| ())
}

/// How many ready boxes the pool of `bench boxes` keeps.
const POOL: usize = 4;

/// Create → first exec of `true` on `name`'s boxes (with their runner, as agents get them),
/// made by the provider beside taken from a warm pool of [`POOL`], sample by sample; each
/// box destroyed after, untimed. A pool that is empty when its sample starts makes the box
/// as the provider does (that sample is then counted in the note).
async fn pooled(name: &str, n: u32) -> Result<(Pair, String)> {
    use agentbox_providers::pool::{Pool, PoolOptions};
    let provider = usable(name, &agentbox_providers::registry::Options::default()).await?;
    let spec = Spec::new(Duration::from_secs(300)).label("agentbox-bench", "1");
    let opts = PoolOptions {
        size: POOL,
        ..Default::default()
    };
    let pool = Pool::new(provider.clone(), spec.clone(), opts)?;
    let ctx = Ctx::background().with_timeout(Duration::from_secs(600));
    pool.warm(&ctx).await?;
    let first_exec = async |p: &dyn Provider| -> Result<(Duration, Arc<dyn Sandbox>)> {
        let t = Instant::now();
        let b = p.create(&spec, &ctx).await?;
        box_true(&*b).await?;
        Ok((t.elapsed(), b))
    };
    // One warm-up of each, not counted.
    for p in [&*provider, &pool as &dyn Provider] {
        let (_, b) = first_exec(p).await?;
        b.destroy(&ctx).await?;
    }
    pool.warm(&ctx).await?;
    let (mut plain, mut warm, mut empty) = (Vec::new(), Vec::new(), 0);
    let mut run = async || -> Result<()> {
        for _ in 0..n {
            let (d, b) = first_exec(&*provider).await?;
            plain.push(d);
            b.destroy(&ctx).await?;
            tokio::time::sleep(SETTLE).await;
            if pool.ready() == 0 {
                empty += 1;
            }
            let (d, b) = first_exec(&pool).await?;
            warm.push(d);
            b.destroy(&ctx).await?;
            tokio::time::sleep(SETTLE).await;
        }
        Ok(())
    };
    let r = run().await;
    let closed = pool.close(&ctx).await;
    r?;
    closed?;
    let (a, b) = (stats(plain), stats(warm));
    let p = pair(
        "create → first exec (pooled)",
        &format!("a {name} box made, then true in it"),
        &format!("the same through a warm pool of {POOL}"),
        a,
        b,
    );
    let note = format!(
        "{name} boxes through a warm pool of {POOL}: {:.1} times faster at the median; {empty} of {n} samples found the pool empty and made their box",
        a.median / b.median.max(f64::MIN_POSITIVE)
    );
    Ok((p, note))
}

/// The providers whose boxes `bench boxes` measures beside `name`'s: namespace boxes stand
/// between local boxes (no isolation, no daemon) and Docker boxes (isolation through a
/// daemon), so they are timed beside both.
fn compared_with(name: &str) -> &'static [&'static str] {
    match name {
        "namespace" => &["local", "docker"],
        _ => &[],
    }
}

/// The provider `name` (bare, like the one measured), once it has made a box, run `true` in
/// it and ended it: a provider that cannot (no Docker engine answers, no image) is left out
/// with its error rather than failing the run.
async fn usable(name: &str, bare: &agentbox_providers::registry::Options) -> Result<Arc<dyn Provider>> {
    let p = crate::boxes::provider_with(name, bare).await?;
    create_exec_destroy(&p).await?;
    Ok(p)
}

/// Create → first exec → destroy on the chosen provider's boxes beside its baseline, and
/// create through a warm pool beside the provider alone.
pub(super) async fn boxes(args: BenchArgs) -> Result<()> {
    // The bare box against its baseline, which starts no runner either (`bench runner`
    // measures the runner).
    let bare = agentbox_providers::registry::Options {
        runner: false,
        ..Default::default()
    };
    let env = crate::boxes::environment()?;
    let entry = crate::boxes::chosen(args.provider.as_deref(), &env).await?;
    let provider = entry.make(&bare, &env).await?;
    let n = args.iterations;
    let name = provider.name().to_string();
    let docker = name == "docker";
    let mut pairs = Vec::new();
    let mut notes = Vec::new();
    eprintln!("agentbox bench: {n} samples of each side, interleaved");

    // The cycle beside its baseline (the docker CLI's for Docker boxes, a host spawn for the
    // others) and beside the boxes of the providers it is compared with, one run for all.
    let mut beside = Vec::new();
    for &other in compared_with(&name) {
        match usable(other, &bare).await {
            Ok(p) => beside.push(p),
            Err(e) => {
                let note = format!("{other} boxes, beside {name} boxes: {}", crate::one_line(e.message()));
                eprintln!("agentbox bench: not measured: {note}");
                notes.push(note);
            }
        }
    }
    let mut labels = Vec::new();
    let mut sides = Vec::new();
    if docker {
        labels.push("docker run -d + docker exec true + docker rm -f".to_string());
        sides.push(side(docker_cli_cycle));
    } else {
        labels.push("spawn true on the host".to_string());
        sides.push(side(host_true));
    }
    for p in &beside {
        labels.push(format!("a {} box, the same cycle", p.name()));
        sides.push(side(move || create_exec_destroy(p)));
    }
    sides.push(side(|| create_exec_destroy(&provider)));
    let stats = measure_all(n, sides).await?;
    let (subject, baselines) = stats
        .split_last()
        .ok_or_else(|| Error::unknown("bench: no sides measured"))?;
    for (base, a) in labels.iter().zip(baselines) {
        pairs.push(pair(
            "create → first exec → destroy",
            base,
            &format!("{name} box"),
            *a,
            *subject,
        ));
    }

    let ctx = Ctx::background().with_timeout(Duration::from_secs(600));
    let sandbox = provider
        .create(&Spec::new(Duration::from_secs(600)).label("agentbox-bench", "1"), &ctx)
        .await?;
    let measured = if docker {
        let container = sandbox.id().name().to_string();
        measure(
            n,
            || async { docker_cli(&["exec", &container, "true"]).await.map(|_| ()) },
            || box_true(&*sandbox),
        )
        .await
    } else {
        measure(n, host_true, || box_true(&*sandbox)).await
    };
    sandbox.destroy(&ctx).await?;
    let (a, b) = measured?;
    let base = if docker {
        "docker exec <box> true (the CLI)"
    } else {
        "spawn true on the host"
    };
    pairs.push(pair(
        "exec round trip of true",
        base,
        &format!("exec in a {name} box"),
        a,
        b,
    ));

    for name in ["local", "docker"] {
        match pooled(name, n).await {
            Ok((p, said)) => {
                eprintln!("agentbox bench: {said}");
                pairs.push(p);
            }
            Err(e) => {
                let note = format!("{name} boxes through a warm pool: {}", crate::one_line(e.message()));
                eprintln!("agentbox bench: not measured: {note}");
                notes.push(note);
            }
        }
    }

    print_pairs(&pairs, &notes, args.json)
}

//! `agentbox bench`: each operation beside its baseline, in one run, reported as ratios.
//!
//! Absolute times drift on shared machines; a ratio measured in one run, with the two sides
//! interleaved sample by sample, does not drift with them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentbox_core::{Ctx, Error, ExecOptions, FinishOptions, Provider, Result, Sandbox, Spec, finish};
use clap::Args;

#[derive(Args)]
pub(crate) struct BenchArgs {
    /// What to measure: `boxes` (create, exec, and create through a warm pool), `hands` (each file operation and a command,
    /// on the host and in boxes), `runner` (exec, read and write through a box's runner vs
    /// one exec per operation, and attaching to a process to read its output from a byte
    /// number vs `exec tail -c`, on local and Docker boxes) or `sync` (extracting a
    /// 10,000-file tree vs GNU tar).
    /// `kube` (create and exec on Kubernetes boxes against the fake API server, beside bare
    /// kube-rs calls; needs `agentbox-fake` and `AGENTBOX_TEST_ROOTFS`). `egress` (a
    /// namespace box's download and requests through its egress proxy vs a direct loopback
    /// connection).
    #[arg(default_value = "boxes", value_parser = ["boxes", "hands", "runner", "sync", "kube", "egress"])]
    what: String,
    /// Samples of each side.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(3..=10_000))]
    pub(crate) iterations: u32,
    /// The provider to measure (boxes; without it, the default of `box create`).
    #[arg(long, help = crate::boxes::default_help("The provider to measure (boxes)"))]
    provider: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// One comparison: the same work through agentbox and through its baseline.
#[derive(serde::Serialize)]
pub(crate) struct Pair {
    name: String,
    baseline: String,
    subject: String,
    baseline_ms: Stats,
    subject_ms: Stats,
    /// subject median / baseline median: how many times slower (or, below 1, faster).
    ratio: f64,
}

#[derive(Clone, Copy, serde::Serialize)]
pub(crate) struct Stats {
    median: f64,
    p90: f64,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1000.0;
    Stats {
        median: at(0.5),
        p90: at(0.9),
    }
}

/// The pause after each sample, untimed.
const SETTLE: Duration = Duration::from_millis(20);

/// One side of a measurement: each call is one sample's work.
type Side<'a> = Box<dyn FnMut() -> Pin<Box<dyn Future<Output = Result<()>> + 'a>> + 'a>;

/// A [`Side`] from a closure returning a future.
pub(crate) fn side<'a, F, Fut>(mut f: F) -> Side<'a>
where
    F: FnMut() -> Fut + 'a,
    Fut: Future<Output = Result<()>> + 'a,
{
    Box::new(move || Box::pin(f()))
}

/// Time `baseline` and `subject` alternately, `n` times each.
pub(crate) async fn measure<'a, B, BF, S, SF>(n: u32, baseline: B, subject: S) -> Result<(Stats, Stats)>
where
    B: FnMut() -> BF + 'a,
    BF: Future<Output = Result<()>> + 'a,
    S: FnMut() -> SF + 'a,
    SF: Future<Output = Result<()>> + 'a,
{
    let mut stats = measure_all(n, vec![side(baseline), side(subject)]).await?.into_iter();
    match (stats.next(), stats.next()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(Error::unknown("bench: two sides measured, two answers expected")),
    }
}

/// Time every side in turn, `n` rounds, so each sample of one side is taken between samples
/// of the others (a drift of the machine falls on every side alike); the stats in the sides'
/// order.
pub(crate) async fn measure_all(n: u32, mut sides: Vec<Side<'_>>) -> Result<Vec<Stats>> {
    // One warm-up of each, not counted.
    for s in sides.iter_mut() {
        s().await?;
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); sides.len()];
    for _ in 0..n {
        for (s, taken) in sides.iter_mut().zip(samples.iter_mut()) {
            let t = Instant::now();
            s().await?;
            taken.push(t.elapsed());
            // What one side leaves running (a daemon's clean-up after an exec) must not be
            // timed as the next's: every side settles alike after each sample.
            tokio::time::sleep(SETTLE).await;
        }
    }
    Ok(samples.into_iter().map(stats).collect())
}

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

pub(crate) async fn box_true(b: &dyn Sandbox) -> Result<()> {
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let p = b.exec(&["true".to_string()], &ExecOptions::default(), &ctx).await?;
    let out = finish(p, FinishOptions::default()).await?;
    if !out.status.success() {
        return Err(Error::unknown(format!("true exited {} in the box", out.status.code)));
    }
    Ok(())
}

pub(crate) async fn create_exec_destroy(p: &Arc<dyn Provider>) -> Result<()> {
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

pub(crate) async fn run(args: BenchArgs) -> Result<()> {
    if args.what == "hands" {
        return hands(args).await;
    }
    if args.what == "sync" {
        return sync(args).await;
    }
    if args.what == "runner" {
        return runner(args).await;
    }
    if args.what == "kube" {
        return crate::bench_kube::kube(args).await;
    }
    if args.what == "egress" {
        return crate::bench_egress::egress(args).await;
    }
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

/// The pairs as a table (or JSON), then what was not measured and why.
pub(crate) fn print_pairs(pairs: &[Pair], notes: &[String], json: bool) -> Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(pairs).map_err(|e| Error::unknown(e.to_string()))?
        );
        return Ok(());
    }
    println!(
        "{:<32} {:>20} {:>20} {:>8}",
        "operation", "baseline ms", "agentbox ms", "ratio"
    );
    for p in pairs {
        println!(
            "{:<32} {:>20} {:>20} {:>7.2}x",
            p.name,
            format!("{:.2} (p90 {:.2})", p.baseline_ms.median, p.baseline_ms.p90),
            format!("{:.2} (p90 {:.2})", p.subject_ms.median, p.subject_ms.p90),
            p.ratio
        );
        println!("    baseline: {}; agentbox: {}", p.baseline, p.subject);
    }
    for note in notes {
        println!("not measured: {note}");
    }
    Ok(())
}

impl Pair {
    /// The baseline's median, in ms.
    pub(crate) fn baseline_median_ms(&self) -> f64 {
        self.baseline_ms.median
    }

    /// The subject's median, in ms.
    pub(crate) fn subject_median_ms(&self) -> f64 {
        self.subject_ms.median
    }

    /// Subject median over baseline median.
    pub(crate) fn ratio(&self) -> f64 {
        self.ratio
    }
}

pub(crate) fn pair(name: &str, baseline: &str, subject: &str, a: Stats, b: Stats) -> Pair {
    let ratio = if a.median > 0.0 { b.median / a.median } else { f64::NAN };
    Pair {
        name: name.into(),
        baseline: baseline.into(),
        subject: subject.into(),
        baseline_ms: a,
        subject_ms: b,
        ratio,
    }
}

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
async fn hands(args: BenchArgs) -> Result<()> {
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

/// Extraction of a 10,000-file tree into an empty directory: agentbox's extractor vs GNU tar,
/// the same archive, interleaved.
async fn sync(args: BenchArgs) -> Result<()> {
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

/// A box twice over: `plain`, whose every operation is an exec, and `through`, the same box
/// through its runner.
struct Twin {
    plain: Arc<dyn Sandbox>,
    through: Arc<dyn Sandbox>,
}

async fn twin(provider: &str, ctx: &Ctx) -> Result<Twin> {
    let spec = Spec::new(Duration::from_secs(900)).label("agentbox-bench", "1");
    let without = agentbox_providers::registry::Options {
        runner: false,
        ..Default::default()
    };
    if provider == "docker" {
        let through = crate::boxes::provider("docker").await?.create(&spec, ctx).await?;
        if through.facts().runner.is_none() {
            let _ = through.destroy(ctx).await;
            return Err(Error::unsupported(
                "the Docker box got no runner (see the warning above)",
            ));
        }
        let plain = crate::boxes::provider_with("docker", &without)
            .await?
            .attach(through.id(), ctx)
            .await?
            .ok_or_else(|| Error::gone("the bench's Docker box ended"))?;
        return Ok(Twin { plain, through });
    }
    let plain = crate::boxes::provider_with(provider, &without)
        .await?
        .create(&spec, ctx)
        .await?;
    let sock = agentbox_providers::home::default_home()?
        .join("boxes")
        .join(plain.id().name())
        .join("bench-runner.sock");
    let helper = crate::boxes::environment()?.runner()?;
    let mut program = vec![helper.program.to_string_lossy().into_owned()];
    program.extend(helper.args);
    agentbox_providers::runner::start(
        plain.as_ref(),
        &program,
        &[format!("unix:{}", sock.display())],
        None,
        ctx,
    )
    .await?;
    let through: Arc<dyn Sandbox> = Arc::new(agentbox_providers::runner::RunnerSandbox::new(
        plain.clone(),
        Arc::new(agentbox_providers::runner::Address::Unix(sock)),
    ));
    Ok(Twin { plain, through })
}

/// One exec of `argv` with `stdin`, required to exit 0; its stdout.
async fn exec_ok(b: &dyn Sandbox, argv: &[&str], stdin: &[u8]) -> Result<Vec<u8>> {
    let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
    let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
    let p = b.exec(&argv, &ExecOptions::default(), &ctx).await?;
    let out = finish(
        p,
        FinishOptions {
            stdin: stdin.to_vec(),
            ..Default::default()
        },
    )
    .await?;
    if !out.status.success() {
        return Err(Error::unknown(format!(
            "{argv:?} exited {}: {}",
            out.status.code,
            out.stderr_text()
        )));
    }
    Ok(out.stdout)
}

fn file_err(e: agentbox_core::FileError) -> Error {
    match e {
        agentbox_core::FileError::Box(e) => e,
        agentbox_core::FileError::Os(n) => Error::io(std::io::Error::from_raw_os_error(n), "a file operation"),
    }
}

/// Exec, read and write through the runner vs one exec per operation, on local and Docker
/// boxes: the same box on both sides, interleaved sample by sample.
async fn runner(args: BenchArgs) -> Result<()> {
    let ctx = Ctx::background().with_timeout(Duration::from_secs(900));
    let n = args.iterations;
    let mut pairs = Vec::new();
    let mut notes = Vec::new();
    eprintln!("agentbox bench runner: {n} samples of each side, interleaved");
    for provider in ["local", "docker"] {
        let t = match twin(provider, &ctx).await {
            Ok(t) => t,
            Err(e) => {
                eprintln!("agentbox bench runner: no {provider} box ({e}); measuring without it");
                continue;
            }
        };
        let block = vec![b'r'; 4096];
        let files = t
            .through
            .files()
            .ok_or_else(|| Error::unknown("the runner box serves no files"))?;
        files
            .write("bench/4k.bin", &block, false, &ctx)
            .await
            .map_err(file_err)?;
        let measured = async {
            let (a, b) = measure(
                n,
                || async { exec_ok(&*t.plain, &["true"], b"").await.map(|_| ()) },
                || async { exec_ok(&*t.through, &["true"], b"").await.map(|_| ()) },
            )
            .await?;
            pairs.push(pair(
                "exec round trip of true",
                "one exec",
                &format!("{provider} box's runner"),
                a,
                b,
            ));
            let (a, b) = measure(
                n,
                || async {
                    let got = exec_ok(&*t.plain, &["cat", "bench/4k.bin"], b"").await?;
                    if got.len() == 4096 {
                        Ok(())
                    } else {
                        Err(Error::unknown("a short read"))
                    }
                },
                || async {
                    let got = files.read("bench/4k.bin", &Ctx::background()).await.map_err(file_err)?;
                    if got.is_some_and(|g| g.len() == 4096) {
                        Ok(())
                    } else {
                        Err(Error::unknown("a short read"))
                    }
                },
            )
            .await?;
            pairs.push(pair("read 4 KB", "exec cat", &format!("{provider} box's runner"), a, b));
            let (a, b) = measure(
                n,
                || async {
                    exec_ok(&*t.plain, &["sh", "-c", "cat > bench/w.bin"], &block)
                        .await
                        .map(|_| ())
                },
                || async {
                    files
                        .write("bench/w.bin", &block, false, &Ctx::background())
                        .await
                        .map_err(file_err)
                },
            )
            .await?;
            pairs.push(pair(
                "write 4 KB",
                "exec sh -c 'cat > f'",
                &format!("{provider} box's runner"),
                a,
                b,
            ));
            // A runner that keeps no processes (an older one in a Docker box) leaves this row
            // out, named under the table, rather than the rows above.
            match attach_and_read(n, &t, files, &ctx).await {
                Ok((a, b)) => pairs.push(pair(
                    "attach, read 32 KB from byte 32K",
                    "exec tail -c +32769 of the same 64 KB in a file",
                    &format!("{provider} box's runner: attach to an ended process at byte 32768, read to its end"),
                    a,
                    b,
                )),
                Err(e) => {
                    let note = format!("attach and read, {provider} box: {}", crate::one_line(e.message()));
                    eprintln!("agentbox bench runner: not measured: {note}");
                    notes.push(note);
                }
            }
            Ok::<_, Error>(())
        }
        .await;
        let _ = t.through.destroy(&ctx).await;
        measured?;
    }
    print_pairs(&pairs, &notes, args.json)
}

/// The second half of a process's 64 KB output read again by attaching to it at byte 32768
/// (it ended: its output is kept by the runner) vs the same 32 KB of a file by one exec of
/// `tail -c`, the way to get bytes from an offset without a runner.
async fn attach_and_read(n: u32, t: &Twin, files: &dyn agentbox_core::Files, ctx: &Ctx) -> Result<(Stats, Stats)> {
    const FROM: u64 = 32 << 10;
    const ALL: usize = 64 << 10;
    files
        .write("bench/64k.bin", &vec![b'a'; ALL], false, ctx)
        .await
        .map_err(file_err)?;
    let ps = t
        .through
        .processes()
        .ok_or_else(|| Error::unknown("the runner box keeps no processes"))?;
    let argv = vec!["cat".to_string(), "bench/64k.bin".to_string()];
    let opts = ExecOptions {
        detach: true,
        ..Default::default()
    };
    let handle = t
        .through
        .exec(&argv, &opts, ctx)
        .await?
        .handle()
        .ok_or_else(|| Error::unknown("the detached cat got no handle"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = ps.list(ctx).await?;
        let p = listed
            .iter()
            .find(|p| p.handle == handle)
            .ok_or_else(|| Error::unknown("the detached cat is not listed"))?;
        if p.state != agentbox_core::ProcessState::Running && p.end == ALL as u64 {
            break;
        }
        if Instant::now() > deadline {
            return Err(Error::timeout("the detached cat did not end within 60 s"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let want = ALL - FROM as usize;
    let measured = measure(
        n,
        || async {
            let got = exec_ok(&*t.plain, &["tail", "-c", "+32769", "bench/64k.bin"], b"").await?;
            if got.len() == want {
                Ok(())
            } else {
                Err(Error::unknown(format!("tail -c read {} bytes, not {want}", got.len())))
            }
        },
        || async {
            let ctx = Ctx::background().with_timeout(Duration::from_secs(60));
            let mut p = ps.attach(handle, FROM, &ctx).await?;
            let got = agentbox_core::read_bounded(p.stdout.take(), ALL, "the attached output").await?;
            p.wait().await?;
            if got.len() == want {
                Ok(())
            } else {
                Err(Error::unknown(format!(
                    "the attach read {} bytes, not {want}",
                    got.len()
                )))
            }
        },
    )
    .await;
    let _ = ps.forget(handle, ctx).await;
    measured
}

//! How `agentbox bench` measures: two sides (or more) timed in turn, sample by sample, and
//! their ratios printed as a table or JSON.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use agentbox_core::{Error, Result};

/// One comparison: the same work through agentbox and through its baseline.
#[derive(serde::Serialize)]
pub(super) struct Pair {
    pub(super) name: String,
    pub(super) baseline: String,
    pub(super) subject: String,
    pub(super) baseline_ms: Stats,
    pub(super) subject_ms: Stats,
    /// subject median / baseline median: how many times slower (or, below 1, faster).
    pub(super) ratio: f64,
}

#[derive(Clone, Copy, serde::Serialize)]
pub(super) struct Stats {
    pub(super) median: f64,
    pub(super) p90: f64,
}

pub(super) fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1000.0;
    Stats {
        median: at(0.5),
        p90: at(0.9),
    }
}

/// The pause after each sample, untimed.
pub(super) const SETTLE: Duration = Duration::from_millis(20);

/// One side of a measurement: each call is one sample's work.
type Side<'a> = Box<dyn FnMut() -> Pin<Box<dyn Future<Output = Result<()>> + 'a>> + 'a>;

/// A [`Side`] from a closure returning a future.
pub(super) fn side<'a, F, Fut>(mut f: F) -> Side<'a>
where
    F: FnMut() -> Fut + 'a,
    Fut: Future<Output = Result<()>> + 'a,
{
    Box::new(move || Box::pin(f()))
}

/// Time `baseline` and `subject` alternately, `n` times each.
pub(super) async fn measure<'a, B, BF, S, SF>(n: u32, baseline: B, subject: S) -> Result<(Stats, Stats)>
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
pub(super) async fn measure_all(n: u32, mut sides: Vec<Side<'_>>) -> Result<Vec<Stats>> {
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

/// The pairs as a table (or JSON), then what was not measured and why.
pub(super) fn print_pairs(pairs: &[Pair], notes: &[String], json: bool) -> Result<()> {
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

pub(super) fn pair(name: &str, baseline: &str, subject: &str, a: Stats, b: Stats) -> Pair {
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

//! A sandbox's metrics (`GET /sandboxes/{id}/metrics`, `GET /sandboxes/metrics`), measured in
//! the box as envd measures them in E2B's VM: the CPUs it may use and how busy they were, its
//! memory used (and page cache) of what it may have, its disk used of the file system its
//! workspace is on.
//!
//! One sample is taken when metrics are asked (a program in the box reads its cgroup, `/proc`
//! and `df`, 200 ms apart for the CPU), and every sample taken is kept with the sandbox (the
//! last [`KEPT`]), so a later call's `start`..`end` window answers the ones in it. Where the
//! box has no cgroup of its own to read (`/sys/fs/cgroup` without `cpu.stat`), the machine's
//! `/proc/stat` and `/proc/meminfo` stand in. A paused sandbox is sampled never: its kept
//! samples are answered.

use std::collections::VecDeque;
use std::time::Duration;

use agentbox_core::{Ctx, Sandbox};
use serde_json::{Value, json};

/// The samples kept per sandbox.
pub(crate) const KEPT: usize = 1000;
/// How long one sample may take in the box.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the box says, one `key values...` a line. The CPU is read twice, 200 ms apart.
const SCRIPT: &str = r#"cg=/sys/fs/cgroup
cpu() { sed -n 's/^usage_usec //p' "$cg/cpu.stat" 2>/dev/null; }
jiffies() { sed -n 's/^cpu  *//p' /proc/stat 2>/dev/null | head -n 1; }
c1=$(cpu); j1=$(jiffies)
sleep 0.2
c2=$(cpu); j2=$(jiffies)
echo "cpus $(nproc 2>/dev/null || echo 1)"
echo "cgcpu $c1 $c2"
echo "jiffies1 $j1"
echo "jiffies2 $j2"
echo "cgmem $(cat "$cg/memory.current" 2>/dev/null) $(cat "$cg/memory.max" 2>/dev/null)"
echo "cgcache $(sed -n 's/^file //p' "$cg/memory.stat" 2>/dev/null)"
sed -n 's/^\(MemTotal\|MemAvailable\|Cached\): *\([0-9]*\) kB/\1 \2/p' /proc/meminfo 2>/dev/null
echo "disk $(df -P -B1 "$1" 2>/dev/null | tail -n 1)"
"#;

/// One sample, as E2B's `SandboxMetric`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sample {
    pub(crate) unix: u64,
    pub(crate) cpu_count: u64,
    pub(crate) cpu_used_pct: f64,
    pub(crate) mem_used: u64,
    pub(crate) mem_total: u64,
    pub(crate) mem_cache: u64,
    pub(crate) disk_used: u64,
    pub(crate) disk_total: u64,
}

impl Sample {
    pub(crate) fn json(&self) -> Value {
        json!({
            "timestamp": crate::state::rfc3339(self.unix * 1000),
            "timestampUnix": self.unix,
            "cpuCount": self.cpu_count,
            "cpuUsedPct": self.cpu_used_pct,
            "memUsed": self.mem_used,
            "memTotal": self.mem_total,
            "memCache": self.mem_cache,
            "diskUsed": self.disk_used,
            "diskTotal": self.disk_total,
        })
    }
}

/// A sample of box `b`, its workspace `home`, taken now; the reason when the box gave none.
pub(crate) async fn sample(b: &dyn Sandbox, home: &str) -> Result<Sample, String> {
    let argv = ["sh", "-c", SCRIPT, "metrics", home].map(str::to_string);
    let ctx = Ctx::background().with_timeout(SAMPLE_TIMEOUT);
    let p = b
        .exec(&argv, &Default::default(), &ctx)
        .await
        .map_err(|e| format!("measuring the sandbox: {}", e.message()))?;
    let opts = agentbox_core::FinishOptions {
        max_output: 64 << 10,
        ..Default::default()
    };
    let done = agentbox_core::finish(p, opts)
        .await
        .map_err(|e| format!("measuring the sandbox: {}", e.message()))?;
    parse(&done.stdout_text(), crate::state::now_ms() / 1000)
}

/// The box's words as a sample taken at `unix`.
fn parse(said: &str, unix: u64) -> Result<Sample, String> {
    let mut lines = std::collections::BTreeMap::new();
    for l in said.lines() {
        let mut w = l.split_whitespace();
        if let Some(k) = w.next() {
            lines.insert(k.to_string(), w.map(str::to_string).collect::<Vec<_>>());
        }
    }
    let nums = |k: &str| -> Vec<u64> {
        lines
            .get(k)
            .map(|v| v.iter().filter_map(|x| x.parse().ok()).collect())
            .unwrap_or_default()
    };
    let first = |k: &str| nums(k).first().copied();
    let cpu_count = first("cpus").filter(|&n| n > 0).unwrap_or(1);
    let cpu_used_pct = match nums("cgcpu").as_slice() {
        [a, b] if b >= a => (b - a) as f64 / (0.2 * 1e6 * cpu_count as f64) * 100.0,
        _ => {
            // The machine's: busy jiffies over all of them (idle and iowait are not busy).
            let (j1, j2) = (nums("jiffies1"), nums("jiffies2"));
            let total = |j: &[u64]| j.iter().take(8).sum::<u64>();
            let idle = |j: &[u64]| j.get(3).copied().unwrap_or(0) + j.get(4).copied().unwrap_or(0);
            let all = total(&j2).saturating_sub(total(&j1));
            let quiet = idle(&j2).saturating_sub(idle(&j1));
            if all == 0 {
                0.0
            } else {
                all.saturating_sub(quiet) as f64 / all as f64 * 100.0
            }
        }
    };
    let kib = |k: &str| first(k).map(|v| v * 1024);
    let machine_total = kib("MemTotal");
    let (mem_used, mem_total) = match nums("cgmem").as_slice() {
        // `memory.max` is a number, or `max` (no limit: the machine's memory).
        [used, max] => (*used, *max),
        [used] => (*used, machine_total.unwrap_or(0)),
        _ => {
            let total = machine_total.ok_or("the box said no memory figures")?;
            (total.saturating_sub(kib("MemAvailable").unwrap_or(total)), total)
        }
    };
    let mem_cache = first("cgcache").or_else(|| kib("Cached")).unwrap_or(0);
    // df -P: file system, 1-blocks (here bytes), used, available, capacity, mount point.
    let disk = lines.get("disk").cloned().unwrap_or_default();
    let at = |i: usize| disk.get(i).and_then(|x| x.parse::<u64>().ok());
    let (disk_total, disk_used) = match (at(1), at(2)) {
        (Some(t), Some(u)) => (t, u),
        _ => return Err(format!("the box said no disk figures: {:?}", disk.join(" "))),
    };
    Ok(Sample {
        unix,
        cpu_count,
        cpu_used_pct: (cpu_used_pct * 100.0).round() / 100.0,
        mem_used,
        mem_total,
        mem_cache,
        disk_used,
        disk_total,
    })
}

/// `s` kept, the oldest dropped past [`KEPT`].
pub(crate) fn keep(kept: &mut VecDeque<Sample>, s: Sample) {
    if kept.len() >= KEPT {
        kept.pop_front();
    }
    kept.push_back(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_boxs_words_are_a_sample_from_its_cgroup_or_the_machines() {
        let cg = "cpus 2\ncgcpu 1000000 1100000\njiffies1 1 2 3 4 5 6 7 8 0 0\njiffies2 1 2 3 4 5 6 7 8 0 0\n\
                  cgmem 52428800 536870912\ncgcache 1048576\nMemTotal 8000000\nMemAvailable 4000000\nCached 100\n\
                  disk /dev/vda 1000000 250000 750000 25% /\n";
        let s = parse(cg, 7).unwrap();
        assert_eq!(
            s,
            Sample {
                unix: 7,
                cpu_count: 2,
                cpu_used_pct: 25.0,
                mem_used: 52428800,
                mem_total: 536870912,
                mem_cache: 1048576,
                disk_used: 250000,
                disk_total: 1000000,
            }
        );
        // No cgroup: the machine's jiffies and memory; `memory.max` of `max` is the machine's.
        let machine = "cpus 4\ncgcpu\njiffies1 100 0 100 700 100 0 0 0\njiffies2 150 0 150 900 100 0 0 0\n\
                       cgmem\ncgcache\nMemTotal 1000\nMemAvailable 400\nCached 10\ndisk fs 10 4 6 40% /\n";
        let s = parse(machine, 0).unwrap();
        assert_eq!(
            (s.cpu_used_pct, s.mem_used, s.mem_total, s.mem_cache),
            (33.33, 600 * 1024, 1000 * 1024, 10 * 1024)
        );
        let unlimited = "cpus 1\ncgmem 2048 max\nMemTotal 10\ndisk fs 10 4 6 40% /\n";
        assert_eq!(parse(unlimited, 0).unwrap().mem_total, 10 * 1024);
        assert!(parse("cpus 1\nMemTotal 10\n", 0).unwrap_err().contains("disk"));
        assert!(parse("", 0).is_err());
    }
}

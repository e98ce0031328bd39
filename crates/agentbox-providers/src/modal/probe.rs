//! What a Modal box has, read in the box by one program: the GPUs `nvidia-smi` names, whether
//! root can open `/dev/fuse`, the workspace's file system size and the Yama ptrace scope.
//!
//! The program's output is one fact per line (`key value`), so a missing tool or an odd
//! value leaves that fact out rather than failing the others. A fact that does not parse is
//! left out: absent is unknown, and an unknown fact never grants anything.

use agentbox_core::{Ctx, Error, ExecOptions, FinishOptions, Result, Sandbox, finish};

/// The probe: `sh -c PROBE agentbox-probe WORKSPACE`.
const PROBE: &str = r#"ws=$1
echo "uid $(id -u)"
k=$(df -Pk -- "$ws" 2>/dev/null | awk 'NR==2 {print $2}') && echo "disk_kib $k"
f=/proc/sys/kernel/yama/ptrace_scope
if [ -e "$f" ]; then echo "ptrace $(cat "$f" 2>/dev/null || echo unreadable)"; else echo "ptrace 0"; fi
if [ -c /dev/fuse ] && (exec 3<>/dev/fuse) 2>/dev/null; then echo "fuse yes"; else echo "fuse no"; fi
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | while IFS= read -r g; do echo "gpu $g"; done
fi
echo end"#;

/// The most output the probe may give.
const MAX_OUTPUT: usize = 64 * 1024;
/// Over a PiB of "disk" is gVisor's file system's claim, not a size: left out.
const MAX_DISK_GB: u64 = 1 << 20;

/// What the probe read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Probed {
    /// The GPU models, in the order first seen, one name for identical cards, joined by ` + `.
    pub gpu: Option<String>,
    /// Root can open `/dev/fuse`, a character device (the probe runs as the box's user, which
    /// must be root for this to be true).
    pub fuse: bool,
    /// Whole GiB of the workspace's file system.
    pub disk_gb: Option<u64>,
    /// `kernel.yama.ptrace_scope` (0 where the file does not exist).
    pub ptrace_scope: Option<i32>,
}

/// Run the probe in `b`, its workspace `workspace`.
pub(crate) async fn probe(b: &dyn Sandbox, workspace: &str, ctx: &Ctx) -> Result<Probed> {
    let argv = ["sh", "-c", PROBE, "agentbox-probe", workspace].map(String::from);
    // From `/`: a workspace that is gone fails its own fact (disk), not the whole reading.
    let opts = ExecOptions {
        cwd: Some("/".into()),
        ..Default::default()
    };
    let p = b.exec(&argv, &opts, ctx).await?;
    let out = finish(
        p,
        FinishOptions {
            stdin: Vec::new(),
            max_output: MAX_OUTPUT,
        },
    )
    .await?;
    if out.status.code != 0 {
        return Err(Error::unknown(format!(
            "reading the box's facts: exit {}: {}",
            out.status.code,
            out.stderr_text().trim()
        )));
    }
    parse(&out.stdout_text())
}

/// The facts in the probe's output; an error when it did not run to its end.
pub(crate) fn parse(out: &str) -> Result<Probed> {
    let mut p = Probed::default();
    let mut root = false;
    let mut gpus: Vec<String> = Vec::new();
    let mut ended = false;
    for line in out.lines() {
        let (k, v) = line.split_once(' ').unwrap_or((line, ""));
        let v = v.trim();
        match k {
            "uid" => root = v == "0",
            "disk_kib" => {
                p.disk_gb = v
                    .parse::<u64>()
                    .ok()
                    .map(|kib| kib / (1 << 20))
                    .filter(|gb| *gb <= MAX_DISK_GB);
            }
            "ptrace" => p.ptrace_scope = v.parse().ok(),
            "fuse" => p.fuse = v == "yes",
            "gpu" if !v.is_empty() && !gpus.iter().any(|g| g == v) => gpus.push(v.to_string()),
            "end" => ended = true,
            _ => {}
        }
    }
    if !ended {
        return Err(Error::unknown("reading the box's facts: the probe did not finish"));
    }
    p.fuse &= root;
    p.gpu = (!gpus.is_empty()).then(|| gpus.join(" + "));
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_reads_each_fact_and_leaves_out_what_it_cannot() {
        let p = parse(
            "uid 0\ndisk_kib 52428800\nptrace 1\nfuse yes\ngpu NVIDIA A100\ngpu NVIDIA H100 80GB HBM3\ngpu NVIDIA A100\nend\n",
        )
        .unwrap();
        assert_eq!(p.gpu.as_deref(), Some("NVIDIA A100 + NVIDIA H100 80GB HBM3"));
        assert_eq!(p.disk_gb, Some(50));
        assert_eq!(p.ptrace_scope, Some(1));
        assert!(p.fuse);

        let same = parse("uid 0\ngpu NVIDIA T4\ngpu NVIDIA T4\nend\n").unwrap();
        assert_eq!(same.gpu.as_deref(), Some("NVIDIA T4"), "identical cards are one name");

        // gVisor claims exabytes; an unreadable scope is unknown; FUSE is root's only.
        let g = parse("uid 1000\ndisk_kib 9007199254740991\nptrace unreadable\nfuse yes\nend\n").unwrap();
        assert_eq!(g, Probed::default());

        assert!(parse("uid 0\nfuse yes\n").is_err(), "a probe cut short is no reading");
    }
}

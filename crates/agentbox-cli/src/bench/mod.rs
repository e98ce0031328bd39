//! `agentbox bench`: each operation beside its baseline, in one run, reported as ratios.
//!
//! Absolute times drift on shared machines; a ratio measured in one run, with the two sides
//! interleaved sample by sample, does not drift with them.

mod boxes;
mod e2b;
mod egress;
mod egress_tls;
mod hands;
mod kube;
mod measure;
mod runner;
mod serve;
mod service;
mod sync;

use agentbox_core::Result;
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
    /// connection). `serve` (a tool call through `agentbox serve` vs `agentbox mcp` and a host
    /// spawn, a wrong key vs none over 10,000 requests each, 200 streams at once vs one, and
    /// boxes made and ended through the service vs the provider, with memory before and after;
    /// `--iterations 100` makes that 1,000 boxes). `e2b` (E2B's Python SDK against
    /// `agentbox serve --e2b`, beside the service's own API: a sandbox made and `true` run in
    /// it, and 16 MiB of a command's output streamed; needs `--python` with `e2b` installed).
    #[arg(default_value = "boxes", value_parser = ["boxes", "hands", "runner", "sync", "kube", "egress", "serve", "e2b"])]
    what: String,
    /// Samples of each side.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(3..=10_000))]
    pub(crate) iterations: u32,
    /// The provider to measure (boxes; without it, the default of `box create`).
    #[arg(long, help = crate::boxes::default_help("The provider to measure (boxes)"))]
    provider: Option<String>,
    /// The Python that runs E2B's SDK (e2b): for `e2b`; `python3` without it.
    #[arg(long, value_name = "PATH")]
    python: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

pub(crate) async fn run(args: BenchArgs) -> Result<()> {
    match args.what.as_str() {
        "hands" => hands::hands(args).await,
        "sync" => sync::sync(args).await,
        "runner" => runner::runner(args).await,
        "kube" => kube::kube(args).await,
        "egress" => egress::egress(args).await,
        "serve" => serve::serve(args).await,
        "e2b" => e2b::e2b(args).await,
        _ => boxes::boxes(args).await,
    }
}

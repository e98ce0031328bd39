//! `agentbox-fake`: a fake vendor API on a local port, for pointing real clients at.
//!
//! ```text
//! agentbox-fake kube --listen 127.0.0.1:0 --kubeconfig FILE [--rootfs DIR] [--image NAME=DIR]...
//!                    [--no-v5] [--no-network-policy] [--namespace NS]... [--no-tls]
//! ```
//!
//! Prints `listening https://ADDR` (`http://` with `--no-tls`) once it serves, and runs until SIGTERM or SIGINT, which
//! end every pod's box before it exits.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use agentbox_fakes::kube::{FakeKube, FakeKubeOptions};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "agentbox-fake",
    about = "Fake vendor APIs that real clients can be pointed at"
)]
struct Cli {
    #[command(subcommand)]
    vendor: Vendor,
}

#[derive(Subcommand)]
enum Vendor {
    /// A Kubernetes API server whose pods run as namespace boxes.
    Kube {
        /// Address to listen on (port 0: any free one).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// Where to write the kubeconfig (server, token, context).
        #[arg(long)]
        kubeconfig: PathBuf,
        /// Root file system for any image not named by --image.
        #[arg(long)]
        rootfs: Option<PathBuf>,
        /// An image and its root file system, NAME=DIR (repeatable).
        #[arg(long = "image", value_parser = image)]
        images: Vec<(String, PathBuf)>,
        /// Do not offer v5.channel.k8s.io for exec (a server before Kubernetes 1.30).
        #[arg(long)]
        no_v5: bool,
        /// Do not enforce NetworkPolicies (a CNI that ignores them).
        #[arg(long)]
        no_network_policy: bool,
        /// A namespace besides `default` (repeatable).
        #[arg(long = "namespace")]
        namespaces: Vec<String>,
        /// Serve plain HTTP (kubectl then sends no token, so only other clients can use it).
        #[arg(long)]
        no_tls: bool,
        /// Install kubernetes-sigs/agent-sandbox (its v1beta1 CRDs and controllers).
        #[arg(long)]
        agent_sandbox: bool,
    },
}

fn image(s: &str) -> Result<(String, PathBuf), String> {
    let (name, dir) = s
        .split_once('=')
        .ok_or_else(|| format!("--image {s:?}: expected NAME=DIR"))?;
    if name.is_empty() || dir.is_empty() {
        return Err(format!("--image {s:?}: expected NAME=DIR, both non-empty"));
    }
    Ok((name.to_string(), PathBuf::from(dir)))
}

fn main() {
    // Its own log on stderr, so stdout carries only the `listening` line.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .try_init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agentbox-fake: starting the runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = rt.block_on(async {
        match cli.vendor {
            Vendor::Kube {
                listen,
                kubeconfig,
                rootfs,
                images,
                no_v5,
                no_network_policy,
                namespaces,
                no_tls,
                agent_sandbox,
            } => {
                let opts = FakeKubeOptions {
                    listen,
                    kubeconfig: Some(kubeconfig),
                    rootfs,
                    images: images.into_iter().collect(),
                    v5: !no_v5,
                    network_policy: !no_network_policy,
                    namespaces,
                    runner: None,
                    tls: !no_tls,
                    agent_sandbox,
                };
                let kube = match FakeKube::start(opts).await {
                    Ok(k) => k,
                    Err(e) => {
                        eprintln!("agentbox-fake kube: {e}");
                        return 1;
                    }
                };
                let mut out = std::io::stdout();
                let _ = writeln!(out, "listening {}", kube.url());
                let _ = out.flush();
                wait_for_signal().await;
                kube.shutdown().await;
                0
            }
        }
    });
    std::process::exit(code);
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

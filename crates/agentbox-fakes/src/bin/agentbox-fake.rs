//! `agentbox-fake`: a fake vendor API on a local port, for pointing real clients at.
//!
//! ```text
//! agentbox-fake kube --listen 127.0.0.1:0 --kubeconfig FILE [--rootfs DIR] [--image NAME=DIR]...
//!                    [--no-v5] [--no-network-policy] [--namespace NS]... [--no-tls]
//!
//! agentbox-fake daytona --listen 127.0.0.1:0 [--rootfs DIR]
//!                    [--snapshot NAME=DIR[:cpu,memGB,diskGB[,linux-vm]]]... [--api-key KEY]
//!                    [--index-lag-ms N] [--minute-ms N] [--delete-lag-ms N] [--network-unenforced]
//!
//! agentbox-fake archil --listen 127.0.0.1:0 [--api-key KEY] [--region R] [--root DIR]
//!                    [--rootfs DIR] [--exec-limit-ms N] [--disk NAME]...
//!
//! agentbox-fake modal --listen 127.0.0.1:0 [--token-id ID] [--rootfs DIR] [--root DIR]
//!                    [--gpu TYPE=NAME[,NAME]...]... [--fuse] [--list-page N]
//!
//! agentbox-fake e2b --listen 127.0.0.1:0 [--api-key KEY] [--rootfs DIR] [--root DIR]
//!                    [--keepalive-secs N] [--max-timeout-secs N] [--list-page-max N]
//! ```
//!
//! `kube` prints `listening https://ADDR` (`http://` with `--no-tls`), `daytona` prints
//! `listening http://ADDR` (its API at `/api`), `archil` prints `listening http://ADDR` (its
//! control plane at `/api`, its object API at `/s3`) and then `disk NAME=ID` for each
//! `--disk`, once it serves; each runs until SIGTERM or SIGINT, which end every box before it
//! exits. Daytona's key is `--api-key`, else `$DAYTONA_API_KEY`, and Archil's `--api-key`,
//! else `$ARCHIL_API_KEY` (which keeps it out of argv). `modal` prints `listening http://ADDR`
//! (its `MODAL_SERVER_URL`, and its command router's url); its token id is `--token-id`, else
//! `$MODAL_TOKEN_ID`, and its token secret `$MODAL_TOKEN_SECRET` alone. `e2b` prints
//! `listening http://ADDR` (its `E2B_API_URL` and `E2B_SANDBOX_URL` both); its key is
//! `--api-key`, else `$E2B_API_KEY`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use std::time::Duration;

use agentbox_fakes::archil::{FakeArchil, FakeArchilOptions};
use agentbox_fakes::daytona::{FakeDaytona, FakeDaytonaOptions, FakeSnapshot};
use agentbox_fakes::e2b::{FakeE2B, FakeE2BOptions};
use agentbox_fakes::kube::{FakeKube, FakeKubeOptions};
use agentbox_fakes::modal::{FakeModal, FakeModalOptions};
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
    /// Daytona's API, toolbox and preview proxy, whose sandboxes run as namespace boxes.
    Daytona {
        /// Address to listen on (port 0: any free one).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// Root file system of the default snapshot and of snapshots given without one
        /// (none: this machine's /).
        #[arg(long)]
        rootfs: Option<PathBuf>,
        /// A snapshot, NAME=DIR[:cpu,memGB,diskGB[,linux-vm]] (repeatable; DIR may be empty
        /// for --rootfs).
        #[arg(long = "snapshot", value_parser = snapshot)]
        snapshots: Vec<FakeSnapshot>,
        /// The default snapshot's name.
        #[arg(long, default_value = agentbox_fakes::daytona::DEFAULT_SNAPSHOT)]
        default_snapshot: String,
        /// The API key (else $DAYTONA_API_KEY, which keeps it out of argv).
        #[arg(long)]
        api_key: Option<String>,
        /// How far the label index trails a change, in ms.
        #[arg(long, default_value_t = 1000)]
        index_lag_ms: u64,
        /// How long the API's minute lasts, in ms.
        #[arg(long, default_value_t = 60_000)]
        minute_ms: u64,
        /// How long a deleted sandbox's record stays before it is destroyed, in ms.
        #[arg(long, default_value_t = 1000)]
        delete_lag_ms: u64,
        /// Where volumes keep their files, a directory each by name (default: the fake's own,
        /// removed at its end).
        #[arg(long, value_name = "DIR")]
        volumes_dir: Option<PathBuf>,
        /// The sandboxes' root is this machine's user (root, when the fake runs as root), so
        /// this machine and the sandboxes write the same files of a volume.
        #[arg(long)]
        boxes_as_this_user: bool,
        /// An organization whose tier has no network settings.
        #[arg(long)]
        network_unenforced: bool,
    },
    /// Archil's control plane and S3-style object API, whose disks are directories and
    /// whose execs run as namespace boxes.
    Archil {
        /// Address to listen on (port 0: any free one).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// The API key (else $ARCHIL_API_KEY, which keeps it out of argv).
        #[arg(long)]
        api_key: Option<String>,
        /// The disks' region.
        #[arg(long, default_value = agentbox_fakes::archil::DEFAULT_REGION)]
        region: String,
        /// Where the disks live, one directory each (none: a directory of the fake's own).
        #[arg(long)]
        root: Option<PathBuf>,
        /// Root file system of the exec boxes (none: this machine's /).
        #[arg(long)]
        rootfs: Option<PathBuf>,
        /// How long one exec's command may run, in ms (Archil's: 300 s).
        #[arg(long, default_value_t = 300_000)]
        exec_limit_ms: u64,
        /// A disk to make at start (repeatable); its id is printed as `disk NAME=ID`.
        #[arg(long = "disk")]
        disks: Vec<String>,
    },
    /// Modal's client API and task command router (gRPC, plain HTTP/2), whose sandboxes run
    /// as namespace boxes.
    Modal {
        /// Address to listen on (port 0: any free one); loopback, for the SDK's plain-http router.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// The token id calls must show (else $MODAL_TOKEN_ID); the secret is $MODAL_TOKEN_SECRET.
        #[arg(long)]
        token_id: Option<String>,
        /// Root file system of every sandbox (default: this machine's /, read only).
        #[arg(long)]
        rootfs: Option<PathBuf>,
        /// Where boxes and snapshots live (default: a directory of the fake's own).
        #[arg(long)]
        root: Option<PathBuf>,
        /// The GPUs a sandbox asking TYPE sees, TYPE=NAME[,NAME]... (repeatable).
        #[arg(long = "gpu", value_parser = gpu)]
        gpus: Vec<(String, Vec<String>)>,
        /// Give sandboxes of runtime `vm` this machine's /dev/fuse.
        #[arg(long)]
        fuse: bool,
        /// The most sandboxes one SandboxList page holds.
        #[arg(long, default_value_t = 100)]
        list_page: usize,
    },
    /// E2B's control plane and each sandbox's envd (plain HTTP/1.1, one port), whose
    /// sandboxes run as namespace boxes.
    E2b {
        /// Address to listen on (port 0: any free one).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// The key calls must show in X-API-KEY (else $E2B_API_KEY).
        #[arg(long)]
        api_key: Option<String>,
        /// Root file system of every sandbox (default: this machine's /, read only).
        #[arg(long)]
        rootfs: Option<PathBuf>,
        /// Where boxes live (default: a directory of the fake's own).
        #[arg(long)]
        root: Option<PathBuf>,
        /// A process stream's keepalive interval when the client names none (envd's: 90).
        #[arg(long, default_value_t = 90)]
        keepalive_secs: u64,
        /// The longest sandbox timeout (the plan's: 3600 on E2B's default plan, 86400 on Pro).
        #[arg(long, default_value_t = 3600)]
        max_timeout_secs: u64,
        /// The most sandboxes one listing page holds.
        #[arg(long, default_value_t = 100)]
        list_page_max: usize,
    },
}

/// `NAME=DIR[:cpu,memGB,diskGB[,linux-vm]]`.
fn snapshot(s: &str) -> Result<FakeSnapshot, String> {
    let (name, rest) = s
        .split_once('=')
        .ok_or_else(|| format!("--snapshot {s:?}: expected NAME=DIR[:cpu,memGB,diskGB[,linux-vm]]"))?;
    if name.is_empty() {
        return Err(format!("--snapshot {s:?}: the name is empty"));
    }
    let (dir, size) = match rest.split_once(':') {
        Some((d, z)) => (d, Some(z)),
        None => (rest, None),
    };
    let mut snap = FakeSnapshot {
        name: name.to_string(),
        rootfs: (!dir.is_empty()).then(|| PathBuf::from(dir)),
        cpu: 1,
        memory_gb: 1,
        disk_gb: 3,
        class: "container".into(),
    };
    if let Some(z) = size {
        let parts: Vec<&str> = z.split(',').collect();
        if !(3..=4).contains(&parts.len()) {
            return Err(format!("--snapshot {s:?}: the size is cpu,memGB,diskGB[,linux-vm]"));
        }
        let num = |i: usize, what: &str| {
            parts[i]
                .parse::<u32>()
                .map_err(|_| format!("--snapshot {s:?}: {what} {:?} is not a whole number", parts[i]))
        };
        snap.cpu = num(0, "cpu")?;
        snap.memory_gb = num(1, "memGB")?;
        snap.disk_gb = num(2, "diskGB")?;
        if let Some(c) = parts.get(3) {
            if *c != "linux-vm" && *c != "container" {
                return Err(format!(
                    "--snapshot {s:?}: the class is linux-vm or container, not {c:?}"
                ));
            }
            snap.class = c.to_string();
        }
    }
    Ok(snap)
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
                    faults: None,
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
            Vendor::Daytona {
                listen,
                rootfs,
                snapshots,
                default_snapshot,
                api_key,
                index_lag_ms,
                minute_ms,
                delete_lag_ms,
                volumes_dir,
                boxes_as_this_user,
                network_unenforced,
            } => {
                let Some(api_key) = api_key
                    .or_else(|| std::env::var("DAYTONA_API_KEY").ok())
                    .filter(|k| !k.is_empty())
                else {
                    eprintln!("agentbox-fake daytona: no API key: give --api-key or set DAYTONA_API_KEY");
                    return 2;
                };
                let opts = FakeDaytonaOptions {
                    listen,
                    rootfs,
                    snapshots,
                    default_snapshot,
                    api_key,
                    index_lag: Duration::from_millis(index_lag_ms),
                    minute: Duration::from_millis(minute_ms),
                    network_unenforced,
                    delete_lag: Duration::from_millis(delete_lag_ms),
                    volumes_dir,
                    boxes_as_this_user,
                    ..Default::default()
                };
                let d = match FakeDaytona::start(opts).await {
                    Ok(d) => d,
                    Err(e) => {
                        eprintln!("agentbox-fake daytona: {e}");
                        return 1;
                    }
                };
                let mut out = std::io::stdout();
                let _ = writeln!(out, "listening http://{}", d.addr());
                let _ = out.flush();
                wait_for_signal().await;
                d.shutdown().await;
                0
            }
            Vendor::Archil {
                listen,
                api_key,
                region,
                root,
                rootfs,
                exec_limit_ms,
                disks,
            } => {
                let Some(api_key) = api_key
                    .or_else(|| std::env::var("ARCHIL_API_KEY").ok())
                    .filter(|k| !k.is_empty())
                else {
                    eprintln!("agentbox-fake archil: no API key: give --api-key or set ARCHIL_API_KEY");
                    return 2;
                };
                let opts = FakeArchilOptions {
                    listen,
                    api_key,
                    region,
                    root,
                    exec_limit: Duration::from_millis(exec_limit_ms),
                    rootfs,
                    faults: None,
                };
                let a = match FakeArchil::start(opts).await {
                    Ok(a) => a,
                    Err(e) => {
                        eprintln!("agentbox-fake archil: {e}");
                        return 1;
                    }
                };
                let mut made = Vec::new();
                for name in &disks {
                    match a.create_disk(name) {
                        Ok(id) => made.push((name, id)),
                        Err(e) => {
                            eprintln!("agentbox-fake archil: --disk {name}: {e}");
                            a.shutdown().await;
                            return 1;
                        }
                    }
                }
                let mut out = std::io::stdout();
                let _ = writeln!(out, "listening {}", a.base_url());
                for (name, id) in made {
                    let _ = writeln!(out, "disk {name}={id}");
                }
                let _ = out.flush();
                wait_for_signal().await;
                a.shutdown().await;
                0
            }
            Vendor::Modal {
                listen,
                token_id,
                rootfs,
                root,
                gpus,
                fuse,
                list_page,
            } => {
                let token_id = token_id.or_else(|| std::env::var("MODAL_TOKEN_ID").ok());
                let token_secret = std::env::var("MODAL_TOKEN_SECRET").ok();
                let (Some(token_id), Some(token_secret)) = (
                    token_id.filter(|t| !t.is_empty()),
                    token_secret.filter(|t| !t.is_empty()),
                ) else {
                    eprintln!(
                        "agentbox-fake modal: no token: give --token-id (or MODAL_TOKEN_ID) and set MODAL_TOKEN_SECRET"
                    );
                    return 2;
                };
                let opts = FakeModalOptions {
                    listen,
                    token_id,
                    token_secret,
                    rootfs,
                    root,
                    gpus,
                    fuse,
                    list_page,
                    ..Default::default()
                };
                let m = match FakeModal::start(opts).await {
                    Ok(m) => m,
                    Err(e) => {
                        eprintln!("agentbox-fake modal: {e}");
                        return 1;
                    }
                };
                let mut out = std::io::stdout();
                let _ = writeln!(out, "listening {}", m.url());
                let _ = out.flush();
                wait_for_signal().await;
                m.shutdown().await;
                0
            }
            Vendor::E2b {
                listen,
                api_key,
                rootfs,
                root,
                keepalive_secs,
                max_timeout_secs,
                list_page_max,
            } => {
                let Some(api_key) = api_key
                    .or_else(|| std::env::var("E2B_API_KEY").ok())
                    .filter(|k| !k.is_empty())
                else {
                    eprintln!("agentbox-fake e2b: no key: give --api-key or set E2B_API_KEY");
                    return 2;
                };
                let opts = FakeE2BOptions {
                    listen,
                    api_key,
                    rootfs,
                    root,
                    keepalive: Duration::from_secs(keepalive_secs),
                    max_timeout: Duration::from_secs(max_timeout_secs),
                    list_page_max,
                    faults: None,
                };
                let e = match FakeE2B::start(opts).await {
                    Ok(e) => e,
                    Err(e) => {
                        eprintln!("agentbox-fake e2b: {e}");
                        return 1;
                    }
                };
                let mut out = std::io::stdout();
                let _ = writeln!(out, "listening {}", e.url());
                let _ = out.flush();
                wait_for_signal().await;
                e.shutdown().await;
                0
            }
        }
    });
    std::process::exit(code);
}

/// `TYPE=NAME[,NAME]...`: the GPU names a sandbox asking TYPE sees (`TYPE=` for none).
fn gpu(s: &str) -> Result<(String, Vec<String>), String> {
    let (t, names) = s.split_once('=').ok_or_else(|| format!("{s:?}: TYPE=NAME[,NAME]..."))?;
    if t.is_empty() {
        return Err(format!("{s:?}: no GPU type"));
    }
    let names = names.split(',').filter(|n| !n.is_empty()).map(str::to_string).collect();
    Ok((t.to_string(), names))
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

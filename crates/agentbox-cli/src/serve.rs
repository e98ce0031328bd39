//! `agentbox serve`: the service (crate `agentbox-server`) on a loopback port or a unix
//! socket, and `agentbox serve keys` for its API keys. This module only parses flags and
//! starts it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Error, Result, parse_duration};
use agentbox_server::{Keys, Limits, ServerOptions};
use clap::{Args, Subcommand};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct ServeArgs {
    #[command(subcommand)]
    command: Option<ServeCommand>,
    /// The TCP address to serve on. Only a loopback address unless --insecure-listen.
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    listen: std::net::SocketAddr,
    /// Serve on this unix socket instead (made mode 0600: this user's alone).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Serve plain HTTP on an address other than loopback (anyone who reaches it sees the
    /// keys in flight).
    #[arg(long)]
    insecure_listen: bool,
    /// Serve TLS with this PEM certificate chain (with --tls-key): any address may then be
    /// served.
    #[arg(long, value_name = "FILE", requires = "tls_key", conflicts_with = "socket")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The API keys' store (default: AGENTBOX_HOME's server/keys.db).
    #[arg(long, value_name = "FILE", global = true, conflicts_with = "postgres")]
    keys: Option<PathBuf>,
    /// Keep the API keys in PostgreSQL instead, so replicas on many machines share them: the
    /// file holds a libpq connection string (a file, so its password is in no argv and no
    /// environment).
    #[arg(long, value_name = "FILE", global = true)]
    postgres: Option<PathBuf>,
    /// The provider of a create that names none (default: the one `box create` picks here).
    #[arg(long, help = crate::boxes::default_help("The provider of a create that names none"))]
    provider: Option<String>,
    /// No in-box runner in the boxes the service makes.
    #[arg(long)]
    no_runner: bool,
    /// The boxes the service makes keep their provider's default capabilities (Docker's set),
    /// with no-new-privileges off, for programs that must change user: sudo in E2B's base
    /// template. By default a box keeps none and cannot gain privileges by exec.
    #[arg(long)]
    keep_capabilities: bool,
    /// Where the runs `/v1/runs` shows live (`<DIR>/runs/<ID>`; default: AGENTBOX_HOME).
    #[arg(long, value_name = "DIR")]
    runs: Option<PathBuf>,
    /// The ledger `/v1/ledger` reads: `jsonl:DIR`, `sqlite:FILE` or `postgres:@FILE` (a file
    /// holding the connection string; default: `jsonl:$AGENTBOX_HOME/ledger`).
    #[arg(long, value_name = "STORE")]
    ledger: Option<String>,
    /// A receipts file (JSON lines) `/v1/receipts` adds up.
    #[arg(long, value_name = "FILE")]
    receipts: Option<PathBuf>,
    /// Serve E2B's API too, on this TCP address (TLS as the service's; only a loopback
    /// address unless TLS or --insecure-listen). E2B's SDKs reach it with E2B_API_URL and
    /// E2B_SANDBOX_URL set to its URL and one of this server's keys as E2B_API_KEY.
    #[arg(long, value_name = "ADDR")]
    e2b: Option<std::net::SocketAddr>,
    /// An E2B template, NAME=PROVIDER or NAME=PROVIDER:IMAGE, then optionally ,workspace=DIR
    /// where its programs start (repeat it). `base`, the SDKs' default, is a box of the
    /// default provider unless it is named here; scripts/box-image --e2b-base builds E2B's:
    /// base=docker:agentbox-e2b-base:bookworm,workspace=/home/user.
    #[arg(
        long = "e2b-template",
        value_name = "NAME=PROVIDER[:IMAGE][,workspace=DIR]",
        requires = "e2b"
    )]
    e2b_templates: Vec<String>,
    /// E2B's domain mode: the SDKs reach this server with E2B_DOMAIN=DOMAIN (no E2B_API_URL or
    /// E2B_SANDBOX_URL), at https://api.DOMAIN and https://PORT-ID.DOMAIN, so every name under
    /// DOMAIN must resolve to this server and its certificate cover `*.DOMAIN`; `get_host` and
    /// signed file URLs then name sandboxes here. The one-URL mode stays served beside it.
    #[arg(long = "e2b-domain", value_name = "DOMAIN", requires = "e2b")]
    e2b_domain: Option<String>,
    /// The ports of a sandbox E2B's proxy reaches (`get_host`), comma-separated, at most 32,
    /// where a provider forwards only the ports a box asks for (namespace, Docker); without
    /// it 3000,5000,5173,7860,8000,8080,8501,8888,9000,49999.
    #[arg(long = "e2b-ports", value_name = "PORT,...", value_delimiter = ',', requires = "e2b",
          value_parser = clap::value_parser!(u16).range(1..))]
    e2b_ports: Vec<u16>,
    /// A secret a create may ask for (repeat it): NAME=env:VARIABLE@host or
    /// NAME=file:/path@host, as `box create --secret`. A request's spec.secrets may name only
    /// these, with this source and hosts among these; nothing else of this server's is read.
    #[arg(long = "secret", value_name = "NAME=env:VAR@HOST")]
    secrets: Vec<String>,
}

/// `--e2b-template NAME=PROVIDER[:IMAGE][,workspace=DIR]`, each.
fn e2b_templates(flags: &[String]) -> Result<agentbox_server::e2b::Templates> {
    let mut out = agentbox_server::e2b::Templates::new();
    for f in flags {
        let bad = |why: String| crate::usage(Error::invalid(format!("--e2b-template {f:?}: {why}")));
        let (name, template) = f
            .split_once('=')
            .ok_or_else(|| bad("not NAME=PROVIDER[:IMAGE][,workspace=DIR]".into()))?;
        if name.is_empty() {
            return Err(bad("no template name before '='".into()));
        }
        let template = template.parse().map_err(bad)?;
        if out.insert(name.to_string(), template).is_some() {
            return Err(bad(format!("template {name:?} named twice")));
        }
    }
    Ok(out)
}

#[derive(Subcommand)]
enum ServeCommand {
    /// The service's API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Make a key; it is printed once and kept only hashed.
    Add {
        /// Its name (letters, digits, '-', '_', '.').
        name: String,
        /// It sees and acts on every box.
        #[arg(long)]
        admin: bool,
        /// The most boxes it may own at once.
        #[arg(long, value_name = "N")]
        max_boxes: Option<u32>,
        /// The longest lifetime a box of it may ask (90s, 10m, 6h).
        #[arg(long, value_name = "DURATION")]
        max_lifetime: Option<String>,
        /// The providers it may use, comma-separated (default: every one).
        #[arg(long, value_delimiter = ',', value_name = "NAMES")]
        providers: Option<Vec<String>>,
        /// The most requests it may make in a minute (past it: 429 with Retry-After).
        #[arg(long, value_name = "N")]
        requests_per_minute: Option<u32>,
    },
    /// The keys (never the keys themselves): name, id, admin, limits.
    List,
    /// Remove a key; its boxes stay, reached by an admin key alone.
    Remove {
        /// Its name.
        name: String,
    },
}

fn keys_path(flag: &Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = flag {
        return Ok(p.clone());
    }
    let home = crate::boxes::environment()?.home()?;
    let dir = home.join("server");
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(e, format!("making {}", dir.display())))?;
    Ok(dir.join("keys.db"))
}

/// The key store the flags name: PostgreSQL when `--postgres` names its file, else SQLite.
async fn key_store(a: &ServeArgs) -> Result<Keys> {
    match &a.postgres {
        Some(file) => {
            let config =
                std::fs::read_to_string(file).map_err(|e| Error::io(e, format!("--postgres {}", file.display())))?;
            let config = config.trim();
            if config.is_empty() {
                return Err(crate::usage(Error::invalid(format!(
                    "--postgres {}: the file is empty (it holds a libpq connection string)",
                    file.display()
                ))));
            }
            Keys::postgres(config).await
        }
        None => Keys::open(&keys_path(&a.keys)?),
    }
}

pub(crate) async fn run(a: ServeArgs) -> Result<i32> {
    let keys = key_store(&a).await?;
    if let Some(ServeCommand::Keys(k)) = a.command {
        return keys_command(&keys, k).await;
    }
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(cert), Some(key)) => Some(agentbox_server::tls::config(cert, key).map_err(crate::usage)?),
        _ => None,
    };
    if a.socket.is_none() && tls.is_none() && !a.listen.ip().is_loopback() && !a.insecure_listen {
        return Err(crate::usage(Error::invalid(format!(
            "--listen {}: not a loopback address; plain HTTP there shows every key in flight \
             (give --tls-cert and --tls-key, or say --insecure-listen to serve it anyway)",
            a.listen
        ))));
    }
    if let Some(at) = a.e2b
        && tls.is_none()
        && !at.ip().is_loopback()
        && !a.insecure_listen
    {
        return Err(crate::usage(Error::invalid(format!(
            "--e2b {at}: not a loopback address; plain HTTP there shows every key in flight \
             (give --tls-cert and --tls-key, or say --insecure-listen to serve it anyway)"
        ))));
    }
    let environment = crate::boxes::environment()?;
    let default_provider = crate::boxes::chosen(a.provider.as_deref(), &environment).await?;
    let mut options = ServerOptions::new(Arc::new(keys));
    options.environment = environment;
    options.default_provider = default_provider.name.to_string();
    options.provider_options.runner = !a.no_runner;
    options.provider_options.keep_capabilities = a.keep_capabilities;
    options.runs_root = a.runs.clone();
    if a.ledger.is_some() {
        options.ledger = Some(crate::ledger::store(a.ledger.as_deref()).await.map_err(crate::usage)?);
    }
    options.receipts = a.receipts.clone();
    options.e2b_templates = e2b_templates(&a.e2b_templates)?;
    for s in &a.secrets {
        let offered = agentbox_core::SecretSpec::parse_flag(s).map_err(crate::usage)?;
        // Read once now: a variable or file that is not there is said at start, not at the
        // first create that asks for it.
        offered.read_for_descriptor().map_err(crate::usage)?;
        options.secrets.push(offered);
    }
    options.e2b_domain = match &a.e2b_domain {
        Some(d) => Some(
            agentbox_server::e2b::Domain::new(d)
                .map_err(|why| crate::usage(Error::invalid(format!("--e2b-domain {why}"))))?,
        ),
        None => None,
    };
    if !a.e2b_ports.is_empty() {
        if a.e2b_ports.len() > 32 {
            return Err(crate::usage(Error::invalid(format!(
                "--e2b-ports: {} ports; at most 32 (each is a listener of every sandbox's box)",
                a.e2b_ports.len()
            ))));
        }
        options.e2b_ports = a.e2b_ports.clone();
    }
    let service = agentbox_server::service(options);
    let app = service.api.clone();
    // One signal stops both listeners.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let e2b = match a.e2b {
        Some(at) => {
            let listener = tokio::net::TcpListener::bind(at)
                .await
                .map_err(|e| Error::io(e, format!("--e2b {at}")))?;
            let at = listener.local_addr().map_err(|e| Error::io(e, "the bound address"))?;
            let (app, mut stopped) = (service.e2b.clone(), stopped.clone());
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            let served = Some(match tls.clone() {
                Some(config) => {
                    eprintln!("agentbox serve: E2B's API on https://{at}");
                    let listener = agentbox_server::tls::TlsListener::new(listener, config);
                    tokio::spawn(agentbox_server::serve(listener, app, shutdown))
                }
                None => {
                    eprintln!("agentbox serve: E2B's API on http://{at}");
                    tokio::spawn(agentbox_server::serve(listener, app, shutdown))
                }
            });
            if let Some(d) = &a.e2b_domain {
                let https = if tls.is_some() {
                    ""
                } else {
                    " (the SDKs ask https there: TLS in front of this)"
                };
                eprintln!("agentbox serve: E2B's domain mode: E2B_DOMAIN={d}, https://api.{d}{https}");
            }
            served
        }
        None => None,
    };
    let end_views = service.views_ender();
    let shutdown = async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let terminated = async {
            match term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminated => {}
        }
        eprintln!("agentbox serve: stopping: no new connections; the requests in flight finish");
        let _ = stop.send(true);
        // Open pages' live views end now, rather than hold the drain to its deadline.
        end_views();
    };
    let served: Result<()>;
    match &a.socket {
        Some(path) => {
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(e, format!("--socket {}", path.display()))),
            }
            let listener = tokio::net::UnixListener::bind(path)
                .map_err(|e| Error::io(e, format!("--socket {}", path.display())))?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| Error::io(e, format!("--socket {}: making it this user's alone", path.display())))?;
            eprintln!("agentbox serve: serving on unix:{}", path.display());
            served = agentbox_server::serve(listener, app, shutdown).await;
        }
        None => {
            let listener = tokio::net::TcpListener::bind(a.listen)
                .await
                .map_err(|e| Error::io(e, format!("--listen {}", a.listen)))?;
            let at = listener.local_addr().map_err(|e| Error::io(e, "the bound address"))?;
            match tls {
                Some(config) => {
                    eprintln!("agentbox serve: serving on https://{at}");
                    let listener = agentbox_server::tls::TlsListener::new(listener, config);
                    served = agentbox_server::serve(listener, app, shutdown).await;
                }
                None => {
                    eprintln!("agentbox serve: serving on http://{at}");
                    served = agentbox_server::serve(listener, app, shutdown).await;
                }
            }
        }
    }
    // E2B's sandboxes end whatever became of the listeners (a drain past its time included):
    // their records live in this process alone.
    let e2b_served = match e2b {
        Some(e2b) => {
            let r = match e2b.await {
                Ok(r) => r,
                Err(e) => Err(Error::new(agentbox_core::ErrorCode::Unknown, format!("E2B's API: {e}"))),
            };
            service.end_e2b().await;
            r
        }
        None => Ok(()),
    };
    served?;
    e2b_served?;
    Ok(0)
}

async fn keys_command(keys: &Keys, k: KeysCommand) -> Result<i32> {
    match k {
        KeysCommand::Add {
            name,
            admin,
            max_boxes,
            max_lifetime,
            providers,
            requests_per_minute,
        } => {
            let max_lifetime: Option<Duration> = max_lifetime
                .map(|d| parse_duration(&d).map_err(|e| crate::usage(e.context("--max-lifetime"))))
                .transpose()?;
            if let Some(names) = &providers {
                for p in names {
                    crate::boxes::entry(p, "--providers")?;
                }
            }
            let (info, secret) = keys
                .add(
                    &name,
                    admin,
                    Limits {
                        max_boxes,
                        max_lifetime,
                        providers,
                        requests_per_minute,
                    },
                )
                .await?;
            eprintln!(
                "agentbox serve: key {} (id {}) made; it is shown this once:",
                info.name, info.id
            );
            println!("{secret}");
        }
        KeysCommand::List => {
            for k in keys.list().await? {
                let mut limits = Vec::new();
                if let Some(n) = k.limits.max_boxes {
                    limits.push(format!("max-boxes {n}"));
                }
                if let Some(d) = k.limits.max_lifetime {
                    limits.push(format!("max-lifetime {}s", d.as_secs()));
                }
                if let Some(p) = &k.limits.providers {
                    limits.push(format!("providers {}", p.join(",")));
                }
                if let Some(n) = k.limits.requests_per_minute {
                    limits.push(format!("requests-per-minute {n}"));
                }
                println!(
                    "{}\t{}\t{}\t{}",
                    k.name,
                    k.id,
                    if k.admin { "admin" } else { "-" },
                    if limits.is_empty() {
                        "-".into()
                    } else {
                        limits.join(" ")
                    }
                );
            }
        }
        KeysCommand::Remove { name } => {
            if !keys.remove(&name).await? {
                return Err(Error::not_found(format!("key {name:?}: no such key")));
            }
            eprintln!("agentbox serve: key {name} removed");
        }
    }
    Ok(0)
}

//! agentbox's in-box program.
//!
//! Several programs in one binary: the runner server ([`server`]: one connection for every
//! process and file of a box, what a provider starts in a box on request), the supervisor of a
//! local box ([`supervisor`]), the init of a namespace box ([`namespace`]) and the first
//! process of a container box, whose deadline can move ([`init`]). It depends on the protocol crate, `agentbox-proc`, the contract
//! (for the allowlist's types) and the egress proxy, never on providers, hands or runs, so it stays small enough to copy into any box (a static build needs
//! nothing there).

pub mod deadline;
pub mod egress;
pub mod init;
pub mod namespace;
pub mod probe;
pub mod server;
pub mod supervisor;
pub mod trust;

/// Put back the default action of every signal this process was started ignoring, but
/// SIGPIPE (which the Rust runtime ignores on purpose, and a child gets back at its spawn).
///
/// A shell without job control starts a background command with SIGINT and SIGQUIT ignored,
/// and an ignored signal stays ignored across fork and exec: a runner started from such a
/// command would start every program of the box deaf to Ctrl-C (an interactive bash keeps a
/// signal it was started ignoring ignored for its children too). The runner, the supervisor,
/// the keeper and the init each start from here, so a box's programs start as a login's do.
fn default_signals() {
    for sig in 1..=31 {
        if [libc::SIGKILL, libc::SIGSTOP, libc::SIGPIPE].contains(&sig) {
            continue;
        }
        // SAFETY: sigaction with a null new action only reads the current one into `old`, a
        // live local; the second call sets the default action, which needs no handler.
        #[allow(unsafe_code)]
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
    }
}

/// The program's entry for a list of arguments (without the program name): what both the
/// `agentbox-runner` binary and `agentbox runner` run. Returns the exit code.
pub fn main_with_args(args: &[String]) -> i32 {
    default_signals();
    match args.first().map(String::as_str) {
        Some("supervise") => match supervisor::Config::from_args(&args[1..]).and_then(supervisor::run) {
            Ok(never) => match never {},
            Err(e) => {
                eprintln!("agentbox-runner supervise: {e}");
                1
            }
        },
        Some("init") => match init::Config::from_args(&args[1..]) {
            Ok(cfg) => init::run(cfg),
            Err(e) => {
                eprintln!("agentbox-runner init: {e}");
                2
            }
        },
        Some("relay") => match args.get(1) {
            Some(target) if args.len() == 2 => exit_code("relay", server::relay(target)),
            _ => {
                eprintln!("usage: agentbox-runner relay unix:PATH");
                2
            }
        },
        Some(sub @ ("namespace" | "namespace-init")) => match args.get(1) {
            Some(dir) if args.len() == 2 && dir.starts_with('/') => {
                let dir = std::path::Path::new(dir);
                let r = if sub == "namespace" {
                    namespace::keeper(dir)
                } else {
                    namespace::init(dir)
                };
                match r {
                    Ok(never) => match never {},
                    Err(e) => {
                        eprintln!("agentbox-runner {sub}: {e}");
                        1
                    }
                }
            }
            _ => {
                eprintln!("usage: agentbox-runner {sub} /ABSOLUTE/BOX/DIR");
                2
            }
        },
        Some("egress") => match args.get(1) {
            Some(dir) if args.len() == 2 && dir.starts_with('/') => egress::run(std::path::Path::new(dir)),
            Some(flag) if flag.starts_with("--") => egress::run_args(&args[1..]),
            _ => {
                eprintln!(
                    "usage: agentbox-runner egress /ABSOLUTE/BOX/DIR\n       \
                     agentbox-runner egress --socket PATH --log PATH --deadline-file PATH --allow ENTRY..."
                );
                2
            }
        },
        Some("trust") => match (args.get(1), args.get(2)) {
            (Some(ca), Some(bundle)) if args.len() == 3 => {
                trust::run(std::path::Path::new(ca), std::path::Path::new(bundle))
            }
            _ => {
                eprintln!("usage: agentbox-runner trust CA_PEM BUNDLE_PEM");
                2
            }
        },
        Some("probe") => match args.get(1) {
            Some(name) if args.len() == 2 => probe::run(name),
            _ => {
                eprintln!("usage: agentbox-runner probe NAME");
                2
            }
        },
        Some("--version") => {
            println!("agentbox-runner {}", env!("CARGO_PKG_VERSION"));
            0
        }
        Some("--help" | "-h" | "help") => {
            println!(
                "{}\n       agentbox-runner relay unix:PATH\n       agentbox-runner supervise --dir DIR --deadline-ms UNIX_MS\n       agentbox-runner init --deadline-file PATH [--egress-port PORT --egress-socket PATH]\n       agentbox-runner namespace BOX_DIR\n       agentbox-runner egress BOX_DIR\n       agentbox-runner egress --socket PATH --log PATH --deadline-file PATH [--secrets-on-stdin] --allow ENTRY...\n       agentbox-runner trust CA_PEM BUNDLE_PEM\n       agentbox-runner probe io_uring|user-namespace|mount-namespace|ptrace|keyctl|mount|abstract-unix:NAME|unix-connect:PATH|unix-sendto:PATH|unix-sendmsg:PATH|unix-sendmmsg:PATH|unix-self:DIR|egress:PORT",
                server::USAGE
            );
            0
        }
        Some("serve") if args[1..].iter().any(|a| a == "--help" || a == "-h") => {
            println!("{}", server::USAGE);
            0
        }
        first => {
            let rest = if first == Some("serve") { &args[1..] } else { args };
            match server::Config::from_args(rest) {
                Ok(c) => exit_code("serve", server::main(c)),
                Err(e) => {
                    eprintln!("agentbox-runner: {e} (see --help)");
                    2
                }
            }
        }
    }
}

fn exit_code(what: &str, r: Result<(), String>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("agentbox-runner {what}: {e}");
            1
        }
    }
}

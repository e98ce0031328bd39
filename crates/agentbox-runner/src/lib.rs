//! agentbox's in-box program.
//!
//! Today it is the supervisor of a local box ([`supervisor`]); the runner server (one
//! connection for every process and file of a box) joins it here. It depends on the protocol
//! crate alone, never on providers, hands or runs, so it stays small enough to copy into any
//! box.

#![warn(missing_docs)]

pub mod proctree;
pub mod supervisor;

/// The program's entry for a list of arguments (without the program name): what both the
/// `agentbox-runner` binary and `agentbox runner` run. Returns the exit code.
pub fn main_with_args(args: &[String]) -> i32 {
    match args.first().map(String::as_str) {
        Some("supervise") => match supervisor::Config::from_args(&args[1..]).and_then(supervisor::run) {
            Ok(never) => match never {},
            Err(e) => {
                eprintln!("agentbox-runner supervise: {e}");
                1
            }
        },
        Some("--version") => {
            println!("agentbox-runner {}", env!("CARGO_PKG_VERSION"));
            0
        }
        _ => {
            eprintln!("usage: agentbox-runner supervise --dir DIR --deadline-ms UNIX_MS");
            2
        }
    }
}

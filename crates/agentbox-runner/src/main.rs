//! `agentbox-runner`: see the library's documentation.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(agentbox_runner::main_with_args(&args));
}

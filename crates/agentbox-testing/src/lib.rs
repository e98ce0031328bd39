//! Testing support for agentbox: the conformance suite every provider passes, the fake
//! provider, a box without live processes over any box (`one_call`), and what tests share
//! (outside views, services, re-executed children, networks of a test's own, the runner
//! binary, a vendor's SDK run as the judge of its fake).
//!
//! Never a dependency of non-test code.

pub mod conformance;
pub mod dns;
pub mod fake;
pub mod isolation;
pub mod judge;
pub mod netns;
pub mod one_call;
pub mod outside;
pub mod processes;
pub mod reexec;
pub mod runner;
pub mod services;

/// Run `sh -c script` in `b` to its end (within two minutes), its output whole: what a test
/// asks of a box in one line. Panics on a failed exec, which no test goes on after.
pub async fn sh(b: &dyn agentbox_core::Sandbox, script: &str) -> agentbox_core::Finished {
    let ctx = agentbox_core::Ctx::background().with_timeout(std::time::Duration::from_secs(120));
    let argv = vec!["sh".to_string(), "-c".to_string(), script.to_string()];
    let p = b
        .exec(&argv, &agentbox_core::ExecOptions::default(), &ctx)
        .await
        .unwrap_or_else(|e| panic!("sh -c {script:?}: {e}"));
    agentbox_core::finish(p, agentbox_core::FinishOptions::default())
        .await
        .unwrap_or_else(|e| panic!("sh -c {script:?}: {e}"))
}

/// Start, in box `b`, a server on `addr:port` that tells each connection `port PORT` and a
/// newline and closes it (perl, which Debian's base system has); left running for the box's
/// life. Panics on a failed exec.
pub async fn greeter(b: &dyn agentbox_core::Sandbox, addr: &str, port: u16) {
    let script = format!(
        "perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(LocalAddr => \"{addr}\", \
         LocalPort => {port}, Listen => 5, ReuseAddr => 1) or die \"listen: $!\"; \
         while ($c = $s->accept) {{ print $c \"port {port}\\n\"; close $c }}'"
    );
    let argv = vec!["sh".to_string(), "-c".to_string(), script];
    let serving = b
        .exec(
            &argv,
            &agentbox_core::ExecOptions::default(),
            &agentbox_core::Ctx::background(),
        )
        .await
        .unwrap_or_else(|e| panic!("starting a server on port {port}: {e}"));
    // Its handle is let go of: the server runs on in the box.
    std::mem::forget(serving);
}

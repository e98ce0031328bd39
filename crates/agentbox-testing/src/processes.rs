//! The processes a box keeps, checked the same way on every provider whose boxes keep them
//! ([`Sandbox::processes`]): terminals, output that arrives whole across a hundred dropped
//! connections, a reader told of the bytes it came too late for, and processes that outlive
//! the host process that started them (read, written and killed by another; a deadline the box
//! keeps when that host was SIGKILLed).
//!
//! Each check makes its own box with the provider it is given and destroys it, and answers
//! `Err` with what went wrong. [`outlive_the_host`] re-runs its test as a child
//! ([`crate::reexec`]), so it takes its test's name.
//!
//! ```no_run
//! # async fn f(p: std::sync::Arc<dyn agentbox_core::Provider>) {
//! agentbox_testing::processes::terminal(&*p).await.unwrap();
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{
    Ctx, ErrorCode, ExecOptions, OutputGap, Process, ProcessState, Provider, Sandbox, SandboxId, Spec, Tty,
};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Drops every connection this host process has to the runner of the box it is given (by its
/// name), as a network fault would (the providers' test hook).
pub type DropConnections = Arc<dyn Fn(String) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

type R = Result<(), String>;

fn argv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

fn ctx() -> Ctx {
    Ctx::background().with_timeout(Duration::from_secs(120))
}

async fn new_box(p: &dyn Provider) -> Result<Arc<dyn Sandbox>, String> {
    p.create(&Spec::new(Duration::from_secs(300)), &ctx())
        .await
        .map_err(|e| format!("creating a box: {e}"))
}

/// Read `p`'s stdout until it holds `want`, within 30 s.
async fn read_until(p: &mut Process, seen: &mut Vec<u8>, want: &str) -> R {
    let out = p.stdout.as_mut().ok_or("the process has no stdout")?;
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut buf = vec![0u8; 4096];
    while !String::from_utf8_lossy(seen).contains(want) {
        let n = tokio::time::timeout_at(until, out.read(&mut buf))
            .await
            .map_err(|_| {
                format!(
                    "{want:?} did not come within 30 s; got {:?}",
                    String::from_utf8_lossy(seen)
                )
            })?
            .map_err(|e| format!("reading stdout: {e}"))?;
        if n == 0 {
            return Err(format!(
                "stdout ended before {want:?}: {:?}",
                String::from_utf8_lossy(seen)
            ));
        }
        seen.extend_from_slice(&buf[..n]);
    }
    Ok(())
}

/// A program in a terminal sees one (`tty`), of the size asked, then of the size a resize
/// set; its keys arrive on stdin; its exit is reported.
pub async fn terminal(p: &dyn Provider) -> R {
    let b = new_box(p).await?;
    let r = terminal_in(&*b).await;
    let _ = b.destroy(&ctx()).await;
    r
}

async fn terminal_in(b: &dyn Sandbox) -> R {
    let opts = ExecOptions {
        tty: Some(Tty {
            rows: 24,
            cols: 80,
            term: Some("xterm".into()),
        }),
        ..Default::default()
    };
    let script = "tty; stty size; echo \"term=$TERM\"; read line; stty size; echo \"got=$line\"; exit 7";
    let mut p = b
        .exec(&argv(&["sh", "-c", script]), &opts, &ctx())
        .await
        .map_err(|e| format!("exec with a tty: {e}"))?;
    let mut seen = Vec::new();
    read_until(&mut p, &mut seen, "term=xterm").await?;
    p.resize(40, 100).await.map_err(|e| format!("resize: {e}"))?;
    let stdin = p.stdin.as_mut().ok_or("the process has no stdin")?;
    stdin.write_all(b"typed\r").await.map_err(|e| format!("typing: {e}"))?;
    stdin.flush().await.map_err(|e| format!("typing: {e}"))?;
    read_until(&mut p, &mut seen, "got=typed").await?;
    let status = tokio::time::timeout(Duration::from_secs(30), p.wait())
        .await
        .map_err(|_| "the program did not end".to_string())?
        .map_err(|e| format!("wait: {e}"))?;
    let text = String::from_utf8_lossy(&seen).replace('\r', "");
    if !text.starts_with("/dev/pts/") {
        return Err(format!("tty said {text:?}, not a terminal"));
    }
    if !text.contains("24 80\n") || !text.contains("40 100\n") {
        return Err(format!("stty size before and after the resize: {text:?}"));
    }
    if status.code != 7 {
        return Err(format!("exit {} where the program exited 7", status.code));
    }
    Ok(())
}

/// A curses-style program's output (a full screen of escape sequences in the alternate
/// screen) arrives whole, byte for byte, through the terminal.
pub async fn curses_output_whole(p: &dyn Provider) -> R {
    let b = new_box(p).await?;
    let r = async {
        let script = "printf '\\033[?1049h\\033[2J'; i=1; while [ $i -le 60 ]; do printf '\\033[%d;1H\\033[7m row %d \\033[0m\\033[K' $i $i; i=$((i+1)); done; printf '\\033[?1049l'";
        let opts = ExecOptions {
            tty: Some(Tty {
                rows: 60,
                cols: 120,
                term: None,
            }),
            ..Default::default()
        };
        let p = b
            .exec(&argv(&["sh", "-c", script]), &opts, &ctx())
            .await
            .map_err(|e| format!("exec with a tty: {e}"))?;
        let out = agentbox_core::finish(p, Default::default())
            .await
            .map_err(|e| format!("finish: {e}"))?;
        let mut want = String::from("\x1b[?1049h\x1b[2J");
        for i in 1..=60 {
            want.push_str(&format!("\x1b[{i};1H\x1b[7m row {i} \x1b[0m\x1b[K"));
        }
        want.push_str("\x1b[?1049l");
        if out.stdout != want.as_bytes() {
            return Err(format!(
                "the screen came as {} bytes, not the {} written: {:?}",
                out.stdout.len(),
                want.len(),
                String::from_utf8_lossy(&out.stdout)
            ));
        }
        Ok(())
    }
    .await;
    let _ = b.destroy(&ctx()).await;
    r
}

/// A hundred and more connection drops in the middle of a stream lose no byte: the reader's
/// checksum of what it read is the box's checksum of what was written. `flat_out`: the
/// writer writes 32 MiB as fast as it can (a drop after every 256 KiB read); else it writes
/// 300 lines slowly (a drop after each read, which may take more than one line).
pub async fn drops_lose_nothing(p: &dyn Provider, drop_connections: DropConnections, flat_out: bool) -> R {
    let b = new_box(p).await?;
    let r = drops_in(&*b, drop_connections, flat_out).await;
    let _ = b.destroy(&ctx()).await;
    r
}

async fn drops_in(b: &dyn Sandbox, drop_connections: DropConnections, flat_out: bool) -> R {
    // What the box wrote is kept in a file beside the stream, and summed in the box.
    let script = if flat_out {
        "head -c 33554432 /dev/urandom > /tmp/agentbox-drops && sha256sum /tmp/agentbox-drops >&2 && cat /tmp/agentbox-drops"
    } else {
        "i=0; while [ $i -lt 300 ]; do echo \"line $i of a slow writer\"; i=$((i+1)); sleep 0.01; done | tee /tmp/agentbox-drops; \
         sha256sum /tmp/agentbox-drops >&2"
    };
    let mut p = b
        .exec(&argv(&["sh", "-c", script]), &ExecOptions::default(), &ctx())
        .await
        .map_err(|e| format!("exec: {e}"))?;
    let mut out = p.stdout.take().ok_or("no stdout")?;
    let err = p.stderr.take().ok_or("no stderr")?;
    let errs = tokio::spawn(async move { agentbox_core::read_bounded(Some(err), 1 << 20, "stderr").await });
    let mut hash = Sha256::new();
    let mut read = 0usize;
    let mut drops = 0u32;
    let mut since = 0usize;
    let every = if flat_out { 256 << 10 } else { 1 };
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(60), out.read(&mut buf))
            .await
            .map_err(|_| format!("no output for 60 s after {read} bytes and {drops} drops"))?
            .map_err(|e| format!("reading stdout after {read} bytes and {drops} drops: {e}"))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        read += n;
        since += n;
        if since >= every {
            since = 0;
            drop_connections(b.id().name().to_string()).await;
            drops += 1;
        }
    }
    let status = p.wait().await.map_err(|e| format!("wait after {drops} drops: {e}"))?;
    let stderr = errs
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("stderr: {e}"))?;
    let boxed = String::from_utf8_lossy(&stderr);
    let want = boxed.split_whitespace().next().unwrap_or_default().to_string();
    let got: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if status.code != 0 {
        return Err(format!("the writer exited {}: {boxed}", status.code));
    }
    if drops < 100 {
        return Err(format!("only {drops} drops in a stream of {read} bytes"));
    }
    if got != want {
        return Err(format!(
            "after {drops} drops the {read} bytes read sum to {got}, the box wrote {want:?}"
        ));
    }
    Ok(())
}

/// A detached process nobody reads is not held up; a reader that comes later for bytes no
/// longer kept is told where what it gets starts (a read's `gap_from`, an attach's
/// [`OutputGap`]), and then gets the rest whole.
pub async fn late_reader_told_the_gap(p: &dyn Provider) -> R {
    let b = new_box(p).await?;
    let r = late_reader_in(&*b).await;
    let _ = b.destroy(&ctx()).await;
    r
}

async fn late_reader_in(b: &dyn Sandbox) -> R {
    let ps = b.processes().ok_or("the box keeps no processes")?;
    let opts = ExecOptions {
        detach: true,
        ..Default::default()
    };
    // 12 MiB, past the runner's 4 MiB bound, then a last line.
    let script = "head -c 12582912 /dev/zero | tr '\\0' z; echo; echo the-end";
    let p = b
        .exec(&argv(&["sh", "-c", script]), &opts, &ctx())
        .await
        .map_err(|e| format!("exec detached: {e}"))?;
    let handle = p.handle().ok_or("a detached process has no handle")?;
    drop(p);
    let until = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let list = ps.list(&ctx()).await.map_err(|e| format!("list: {e}"))?;
        let me = list
            .iter()
            .find(|i| i.handle == handle)
            .ok_or_else(|| format!("process {handle} is not listed: {list:?}"))?;
        if me.state != ProcessState::Running {
            if me.first == 0 {
                return Err(format!("all {} bytes were kept: no bound was met", me.end));
            }
            break;
        }
        if tokio::time::Instant::now() > until {
            return Err("the detached program did not end within 60 s: was it held up?".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = ps
        .read(handle, 0, Duration::from_secs(5), 1 << 20, &ctx())
        .await
        .map_err(|e| format!("read from 0: {e}"))?;
    let from = first.gap_from.ok_or("a read from 0 was not told of the gap")?;
    if first.chunks.first().map(|c| c.seq) != Some(from) {
        return Err(format!(
            "the read's output does not start at {from}, where it said it goes on"
        ));
    }
    let mut tail = Vec::new();
    let mut next = from;
    let mut exit = None;
    for c in first.chunks {
        tail.extend(c.bytes);
    }
    next = next.max(first.next);
    while exit.is_none() {
        let more = ps
            .read(handle, next, Duration::from_secs(5), 1 << 20, &ctx())
            .await
            .map_err(|e| format!("read from {next}: {e}"))?;
        if more.gap_from.is_some() {
            return Err(format!("a read from {next}, which is kept, was told of a gap"));
        }
        for c in more.chunks {
            tail.extend(c.bytes);
        }
        next = more.next;
        exit = more.exit;
    }
    if !tail.ends_with(b"zz\nthe-end\n") {
        return Err("the kept tail does not end with the program's last line".into());
    }
    // An attach from 0 meets the same gap as an error on its stdout, then reads on.
    let mut a = ps.attach(handle, 0, &ctx()).await.map_err(|e| format!("attach: {e}"))?;
    let out = a.stdout.as_mut().ok_or("an attached process has no stdout")?;
    let mut buf = vec![0u8; 1 << 16];
    match out.read(&mut buf).await {
        Err(e) if OutputGap::of(&e) == Some(OutputGap { after: 0, from }) => {}
        other => return Err(format!("an attach from 0 read {other:?}, not the gap 0..{from}")),
    }
    let mut rest = Vec::new();
    out.read_to_end(&mut rest)
        .await
        .map_err(|e| format!("reading on after the gap: {e}"))?;
    if rest != tail {
        return Err(format!(
            "the attach read {} bytes after the gap, the reads {}",
            rest.len(),
            tail.len()
        ));
    }
    let status = a.wait().await.map_err(|e| format!("wait: {e}"))?;
    if status.code != 0 {
        return Err(format!("exit {}", status.code));
    }
    ps.forget(handle, &ctx()).await.map_err(|e| format!("forget: {e}"))?;
    let left = ps.list(&ctx()).await.map_err(|e| format!("list: {e}"))?;
    if left.iter().any(|i| i.handle == handle) {
        return Err("a forgotten process is still listed".into());
    }
    Ok(())
}

/// The variable that tells the child of [`outlive_the_host`] its box.
const BOX_ENV: &str = "AGENTBOX_TEST_PROCESSES_BOX";

/// Processes outlive the host process that started them. A child host process (this test,
/// re-run) starts a detached program and a program with a 2 s deadline in a box, says their
/// handles, and is SIGKILLed. Then this host process (a second one, with a client of its own)
/// lists them, reads the detached one's output from a byte number, writes its stdin and
/// kills it; and reads the other's end as `timeout`, which the box kept with no host.
///
/// The test calling this must be named `test` and do nothing before it that a child must not;
/// `env` goes to the child (what it needs to make the same provider, such as its root).
pub async fn outlive_the_host(test: &str, p: &dyn Provider, env: &[(&str, String)]) -> R {
    if crate::reexec::part().as_deref() == Some("starter") {
        let r = starter(p).await;
        if let Err(e) = r {
            println!("error {e}");
        }
        // Wait to be killed: the parent reads the handles, then SIGKILLs this process.
        tokio::time::sleep(Duration::from_secs(300)).await;
        crate::reexec::done();
    }
    let b = new_box(p).await?;
    let r = outlive_in(test, p, &*b, env).await;
    let _ = b.destroy(&ctx()).await;
    r
}

async fn starter(p: &dyn Provider) -> R {
    let id: SandboxId = std::env::var(BOX_ENV)
        .map_err(|_| format!("{BOX_ENV} is not set"))?
        .parse()
        .map_err(|e| format!("{BOX_ENV}: {e}"))?;
    let b = p
        .attach(&id, &ctx())
        .await
        .map_err(|e| format!("attach: {e}"))?
        .ok_or("the box is gone")?;
    let detached = ExecOptions {
        detach: true,
        ..Default::default()
    };
    let script = "echo started; read line; echo \"got $line\"; sleep 300";
    let d = b
        .exec(&argv(&["sh", "-c", script]), &detached, &ctx())
        .await
        .map_err(|e| format!("exec detached: {e}"))?;
    let deadline = ExecOptions {
        timeout: Some(Duration::from_secs(2)),
        ..Default::default()
    };
    let t = b
        .exec(&argv(&["sh", "-c", "echo waiting; sleep 300"]), &deadline, &ctx())
        .await
        .map_err(|e| format!("exec with a deadline: {e}"))?;
    let (dh, th) = (d.handle().ok_or("no handle")?, t.handle().ok_or("no handle")?);
    // Dropped, the detached program lets go of nothing: its stdin stays open for whoever
    // writes next (an unclosed stdin ends only for a program its caller holds).
    drop(d);
    tokio::time::sleep(Duration::from_millis(200)).await;
    println!("handles {dh} {th}");
    // The other outlives this process's end, which is a SIGKILL: nothing of it runs after.
    std::mem::forget(t);
    Ok(())
}

async fn outlive_in(test: &str, p: &dyn Provider, b: &dyn Sandbox, env: &[(&str, String)]) -> R {
    use std::io::BufRead;
    let mut child = crate::reexec::child(test, "starter")
        .env(BOX_ENV, b.id().as_str())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the child host process: {e}"))?;
    let stdout = child.stdout.take().ok_or("the child has no stdout")?;
    let line = tokio::task::spawn_blocking(move || {
        let mut r = std::io::BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return line;
            }
            // The harness's own "test … … " has no newline before what the child says.
            if let Some(at) = line.find("handles ").or_else(|| line.find("error ")) {
                return line[at..].to_string();
            }
        }
    })
    .await
    .map_err(|e| e.to_string())?;
    let _ = child.kill();
    let _ = child.wait();
    let handles: Vec<u64> = line
        .strip_prefix("handles ")
        .ok_or_else(|| format!("the child said {line:?}"))?
        .split_whitespace()
        .filter_map(|h| h.parse().ok())
        .collect();
    let [detached, timed] = handles[..] else {
        return Err(format!("the child said {line:?}"));
    };
    // A host process of its own: a new provider's handle on the box, a client of its own.
    let again = p
        .attach(b.id(), &ctx())
        .await
        .map_err(|e| format!("attach: {e}"))?
        .ok_or("the box ended with its host")?;
    let ps = again.processes().ok_or("the box keeps no processes")?;
    let list = ps.list(&ctx()).await.map_err(|e| format!("list: {e}"))?;
    for h in [detached, timed] {
        let me = list
            .iter()
            .find(|i| i.handle == h)
            .ok_or_else(|| format!("process {h} is not listed after its host died: {list:?}"))?;
        if me.state != ProcessState::Running && h == detached {
            return Err(format!("the detached process ended with its host: {:?}", me.state));
        }
    }
    let first = ps
        .read(detached, 0, Duration::from_secs(10), 1 << 16, &ctx())
        .await
        .map_err(|e| format!("read: {e}"))?;
    let text: Vec<u8> = first.chunks.iter().flat_map(|c| c.bytes.clone()).collect();
    if text != b"started\n" {
        return Err(format!("read from 0: {:?}", String::from_utf8_lossy(&text)));
    }
    ps.write(detached, b"hello\n", false, &ctx())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let more = ps
        .read(detached, first.next, Duration::from_secs(10), 1 << 16, &ctx())
        .await
        .map_err(|e| format!("read from {}: {e}", first.next))?;
    let text: Vec<u8> = more.chunks.iter().flat_map(|c| c.bytes.clone()).collect();
    if text != b"got hello\n" || more.chunks.first().map(|c| c.seq) != Some(8) {
        return Err(format!(
            "read from {}: {:?} at {:?}",
            first.next,
            String::from_utf8_lossy(&text),
            more.chunks.first().map(|c| c.seq)
        ));
    }
    ps.signal(detached, agentbox_core::SIGTERM, &ctx())
        .await
        .map_err(|e| format!("signal: {e}"))?;
    let end = ps
        .read(detached, more.next, Duration::from_secs(10), 1 << 16, &ctx())
        .await
        .map_err(|e| format!("read to the end: {e}"))?;
    match end.exit {
        Some(ProcessState::Exited { status }) if status.signal == Some(15) => {}
        other => return Err(format!("after SIGTERM the detached process reads {other:?}")),
    }
    // The deadline: the box ended the program at 2 s with no host to do it.
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let list = ps.list(&ctx()).await.map_err(|e| format!("list: {e}"))?;
        let me = list
            .iter()
            .find(|i| i.handle == timed)
            .ok_or("the timed process is gone")?;
        match me.state {
            ProcessState::TimedOut { .. } => break,
            ProcessState::Running if tokio::time::Instant::now() < until => {}
            other => return Err(format!("the program given 2 s reads {other:?}")),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut a = ps.attach(timed, 0, &ctx()).await.map_err(|e| format!("attach: {e}"))?;
    match a.wait().await {
        Err(e) if e.code() == ErrorCode::Timeout => Ok(()),
        other => Err(format!("the next attach's wait answered {other:?}, not timeout")),
    }
}

/// A box that keeps no processes refuses `detach` and `timeout` (`unsupported`), naming them,
/// rather than running a program that would not outlive its caller or keep its deadline.
pub async fn refused_without_processes(p: &dyn Provider) -> R {
    let b = new_box(p).await?;
    let r = async {
        if b.processes().is_some() {
            return Err("the box keeps processes: nothing to refuse".to_string());
        }
        for (opts, name) in [
            (
                ExecOptions {
                    detach: true,
                    ..Default::default()
                },
                "detach",
            ),
            (
                ExecOptions {
                    timeout: Some(Duration::from_secs(5)),
                    ..Default::default()
                },
                "timeout",
            ),
        ] {
            match b.exec(&argv(&["true"]), &opts, &ctx()).await {
                Err(e) if e.code() == ErrorCode::Unsupported && e.message().contains(name) => {}
                Err(e) => return Err(format!("{name} was refused as {e}, not unsupported naming it")),
                Ok(_) => return Err(format!("{name} was taken by a box that cannot keep it")),
            }
        }
        Ok(())
    }
    .await;
    let _ = b.destroy(&ctx()).await;
    r
}

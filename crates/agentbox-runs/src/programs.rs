//! The programs each generation runs in the workspace, written down so that a claim that moves
//! takes them with it: `programs/<generation>` in the run's directory, a line per process
//! group (`PGID START`, the group leader's start time in clock ticks since boot).
//!
//! A holder whose claim was taken must not change the run's files, but a tool call it started
//! (or a program that call left behind) runs on. So the next generation ends every program an
//! earlier one wrote down before its first step ([`end_earlier`]), and a holder that learns its
//! claim was taken ends its own ([`end`]). A group whose leader's pid now names another process
//! (the same pid, another start time) is not ours and is left alone. This machine's programs
//! only: a holder on another host ends its own when its lease is lost.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentbox_hands::GroupHook;

/// How long the next generation waits for a killed group to be gone.
const GONE_WITHIN: Duration = Duration::from_secs(5);

fn file(dir: &Path, generation: u64) -> PathBuf {
    dir.join("programs").join(generation.to_string())
}

/// The start time of process `pid` (clock ticks since boot), if it exists.
fn started(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: the fields after its ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}

/// The hook a generation's [`agentbox_hands::HostEnv`] writes its programs down with.
pub fn hook(dir: &Path, generation: u64) -> GroupHook {
    let path = file(dir, generation);
    let lock = std::sync::Arc::new(std::sync::Mutex::new(()));
    std::sync::Arc::new(move |pgid: i32, running: bool| {
        let _held = lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut lines: Vec<String> = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.split(' ').next() != Some(&pgid.to_string()))
            .map(str::to_string)
            .collect();
        if running {
            lines.push(format!("{pgid} {}", started(pgid).unwrap_or(0)));
        }
        let written = std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))
            .and_then(|_| std::fs::write(&path, lines.iter().map(|l| format!("{l}\n")).collect::<String>()));
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), pgid, "writing the generation's programs down: {e}");
        }
    })
}

/// End the programs generation `generation` wrote down, and forget them. Answers how many
/// groups were ended.
pub async fn end(dir: &Path, generation: u64) -> usize {
    let path = file(dir, generation);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return 0;
    };
    let mut ended = 0;
    for line in text.lines() {
        let mut parts = line.split(' ');
        let (Some(Ok(pgid)), Some(Ok(start))) =
            (parts.next().map(str::parse::<i32>), parts.next().map(str::parse::<u64>))
        else {
            continue;
        };
        let Some(pid) = rustix::process::Pid::from_raw(pgid).filter(|_| pgid > 1) else {
            continue;
        };
        // The leader's pid names another process now: its group is not this run's.
        if let Some(now) = started(pgid)
            && start != 0
            && now != start
        {
            continue;
        }
        if rustix::process::test_kill_process_group(pid).is_err() {
            continue;
        }
        tracing::warn!(generation, pgid, "ending a program of an earlier holder of the run");
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        let until = tokio::time::Instant::now() + GONE_WITHIN;
        while rustix::process::test_kill_process_group(pid).is_ok() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        ended += 1;
    }
    let _ = std::fs::remove_file(&path);
    ended
}

/// End every program a generation before `generation` wrote down (before this one's first
/// step). Answers how many groups were ended.
pub async fn end_earlier(dir: &Path, generation: u64) -> usize {
    let Ok(entries) = std::fs::read_dir(dir.join("programs")) else {
        return 0;
    };
    let mut earlier: Vec<u64> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|g| *g < generation)
        .collect();
    earlier.sort();
    let mut ended = 0;
    for g in earlier {
        ended += end(dir, g).await;
    }
    ended
}

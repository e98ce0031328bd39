//! The programs each generation runs in the workspace, written down so that a claim that moves
//! takes them with it: `programs/<generation>.<machine>` in the run's directory (the machine's
//! boot id: a run directory on a shared disk holds the files of many hosts), a line per process
//! group (`PGID START`, the group leader's start time in clock ticks since boot).
//!
//! A holder whose claim was taken must not change the run's files, but a tool call it started
//! (or a program that call left behind) runs on. So the next generation ends every program an
//! earlier one on this machine wrote down before its first step ([`end_earlier`]), and a holder
//! that learns its claim was taken ends its own ([`end`]); another host's files are its own
//! holder's to act on. A group whose leader's pid now names another process (the same pid,
//! another start time) is not ours and is left alone.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentbox_hands::GroupHook;

/// How long the next generation waits for a killed group to be gone.
const GONE_WITHIN: Duration = Duration::from_secs(5);

/// This machine, as long as it runs: its boot id (a pid means nothing on another machine, or
/// after a reboot), else its host name.
fn machine() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|id| id.trim().to_string())
        .ok()
        .filter(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-'))
        .unwrap_or_else(crate::run::host_name)
}

fn file(dir: &Path, generation: u64) -> PathBuf {
    dir.join("programs").join(format!("{generation}.{}", machine()))
}

/// Writes of every generation's file in this process, one at a time.
static WRITING: std::sync::Mutex<()> = std::sync::Mutex::new(());

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
    std::sync::Arc::new(move |pgid: i32, running: bool| {
        let _held = WRITING.lock().unwrap_or_else(|e| e.into_inner());
        let mut lines: Vec<String> = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.split(' ').next() != Some(&pgid.to_string()))
            .map(str::to_string)
            .collect();
        if running {
            lines.push(format!("{pgid} {}", started(pgid).unwrap_or(0)));
        }
        // None left: no file (and no directory once no generation has one), so a run let go
        // with nothing running leaves no trace of them.
        if lines.is_empty() {
            forget(&path);
            return;
        }
        // Written whole under another name and renamed into place: a reader never sees half.
        // Tried twice: another process may remove the emptied directory in between.
        let tmp = path.with_extension("tmp");
        let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
        let write = || {
            std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))
                .and_then(|_| std::fs::write(&tmp, &body))
                .and_then(|_| std::fs::rename(&tmp, &path))
        };
        if let Err(e) = write().or_else(|_| write()) {
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
        // The leader's pid names another process now (or its start was never read): its group
        // is not known to be this run's. With no leader, a live group is still the one written
        // down: a pid is not given out while a group of that number has members.
        match started(pgid) {
            Some(now) if start == 0 || now != start => continue,
            _ => {}
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
    forget(&path);
    ended
}

/// Remove a generation's file, and the directory when it was the last.
fn forget(path: &Path) {
    let _ = std::fs::remove_file(path);
    if let Some(dir) = path.parent() {
        let _ = std::fs::remove_dir(dir);
    }
}

/// End every program a generation before `generation` wrote down on this machine (before this
/// one's first step). Answers how many groups were ended.
pub async fn end_earlier(dir: &Path, generation: u64) -> usize {
    let Ok(entries) = std::fs::read_dir(dir.join("programs")) else {
        return 0;
    };
    let here = format!(".{}", machine());
    let mut earlier: Vec<u64> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(here.as_str())?.parse().ok())
        .filter(|g| *g < generation)
        .collect();
    earlier.sort();
    let mut ended = 0;
    for g in earlier {
        ended += end(dir, g).await;
    }
    ended
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// A `sleep` in a process group of its own, as a tool call's program is.
    fn program() -> std::process::Child {
        std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .expect("sleep starts")
    }

    fn alive(child: &mut std::process::Child) -> bool {
        child.try_wait().expect("waiting on the child").is_none()
    }

    fn write(dir: &Path, name: &str, line: &str) {
        std::fs::create_dir_all(dir.join("programs")).unwrap();
        std::fs::write(dir.join("programs").join(name), format!("{line}\n")).unwrap();
    }

    /// This machine's earlier generation's program is ended and its file forgotten; another
    /// machine's file, and a line whose leader's pid now names another process, are left alone.
    #[tokio::test]
    async fn only_this_machines_programs_of_an_earlier_generation_are_ended() {
        let dir = tempfile::tempdir().unwrap();
        let (mut ours, mut theirs, mut recycled) = (program(), program(), program());
        let line = |c: &std::process::Child| format!("{} {}", c.id(), started(c.id() as i32).unwrap());
        write(dir.path(), &format!("1.{}", machine()), &line(&ours));
        write(dir.path(), "1.another-machine", &line(&theirs));
        let wrong_start = started(recycled.id() as i32).unwrap() + 1;
        write(
            dir.path(),
            &format!("2.{}", machine()),
            &format!("{} {wrong_start}", recycled.id()),
        );
        // Its parent reaps it once killed, as a holder's runtime does (a zombie is not gone).
        let reaped = std::thread::spawn(move || ours.wait());
        // Generation 3 claims here: generation 1 and 2's programs on this machine are its to end.
        assert_eq!(end_earlier(dir.path(), 3).await, 1);
        assert!(!reaped.join().unwrap().unwrap().success(), "ended by a signal");
        assert!(
            !dir.path().join(format!("1.{}", machine())).exists(),
            "forgotten once ended"
        );
        assert!(
            alive(&mut theirs),
            "another machine's pid is not this machine's process"
        );
        assert!(
            dir.path().join("programs/1.another-machine").exists(),
            "its holder's to act on"
        );
        assert!(
            alive(&mut recycled),
            "a leader started at another time is not the one written down"
        );
        for c in [&mut theirs, &mut recycled] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

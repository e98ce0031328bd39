//! Reading the process tree from /proc: who descends from whom, who is a zombie, what a
//! process's status says and which namespaces it is in.
//!
//! A crate of its own, with no dependency beyond std, so that a host telling whether a local
//! box's supervisor still runs (`agentbox-providers`) reads `/proc` the same way as the
//! supervisor killing its descendants (`agentbox-runner`) without linking the runner's server.

use std::collections::HashMap;

/// One process as /proc/<pid>/stat shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat {
    /// Its pid.
    pub pid: i32,
    /// Its parent's pid.
    pub ppid: i32,
    /// Its state letter (`R`, `S`, `Z`...).
    pub state: char,
    /// Its start time in clock ticks after boot: with the pid, it names one process for ever.
    pub start_time: u64,
}

impl ProcStat {
    /// A zombie: ended, not yet reaped.
    pub fn is_zombie(&self) -> bool {
        self.state == 'Z' || self.state == 'X'
    }
}

/// Parse the text of /proc/<pid>/stat. The command name may hold spaces and parentheses, so
/// the fields are read after its last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let mut rest = text.get(close + 1..)?.split_ascii_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    // After state and ppid, start time is the 20th remaining field (field 22 of the line).
    let start_time = rest.nth(17)?.parse().ok()?;
    Some(ProcStat {
        pid,
        ppid,
        state,
        start_time,
    })
}

/// The stat of one process, if it exists.
pub fn stat(pid: i32) -> Option<ProcStat> {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .as_deref()
        .and_then(parse_stat)
}

/// The value of the `key:` line of a /proc/<pid>/status text (`NoNewPrivs`, `CapEff`,
/// `NSpid`...), trimmed.
pub fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':').map(str::trim))
}

/// The text of /proc/<pid>/status (`pid` may be `self`).
pub fn status(pid: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/status")).ok()
}

/// The inode of the namespace `name` (`pid`, `user`, `mnt`...) that `pid` (or `self`) is in:
/// two processes are in the same namespace when these are equal.
pub fn namespace_inode(pid: &str, name: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/{name}"))
        .ok()
        .map(|m| m.ino())
}

/// Every process on the machine.
pub fn all() -> Vec<ProcStat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter_map(stat)
        .collect()
}

/// The children of `pid`, zombies included, from each of its threads' `children` file: a read
/// of a handful of files where [`descendants`] reads every process of the machine. `None` where
/// the kernel keeps no such file (built without `CONFIG_PROC_CHILDREN`).
pub fn children(pid: i32) -> Option<Vec<ProcStat>> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut out = Vec::new();
    let mut seen = false;
    for task in tasks.filter_map(|e| e.ok()) {
        let Ok(text) = std::fs::read_to_string(task.path().join("children")) else {
            continue;
        };
        seen = true;
        out.extend(
            text.split_ascii_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
                .filter_map(stat),
        );
    }
    seen.then_some(out)
}

/// Every descendant of `root` (not `root` itself), zombies included.
pub fn descendants(root: i32) -> Vec<ProcStat> {
    let procs = all();
    let mut children: HashMap<i32, Vec<ProcStat>> = HashMap::new();
    for p in procs {
        children.entry(p.ppid).or_default().push(p);
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(pid) = stack.pop() {
        if let Some(kids) = children.get(&pid) {
            for k in kids {
                if k.pid != root {
                    out.push(*k);
                    stack.push(k.pid);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_field_is_read_by_its_whole_key_and_this_process_has_namespaces() {
        let text = "Name:\tsh\nCapEff:\t0000000000000000\nCapEffX:\t1\nNSpid:\t4242\t7\n";
        assert_eq!(status_field(text, "CapEff"), Some("0000000000000000"));
        assert_eq!(status_field(text, "NSpid"), Some("4242\t7"));
        assert_eq!(status_field(text, "Cap"), None, "a prefix of a key is not the key");
        assert_eq!(status_field(text, "Seccomp"), None);
        let own = status("self").unwrap();
        assert_eq!(status_field(&own, "Pid"), Some(std::process::id().to_string().as_str()));
        assert!(namespace_inode("self", "pid").is_some());
        assert_eq!(namespace_inode("self", "no-such-namespace"), None);
    }

    #[test]
    fn a_name_with_spaces_and_parens_is_skipped_whole() {
        let line = "1234 (a) b (c)) S 77 1234 1234 0 -1 4194304 1 0 0 0 0 0 0 0 20 0 1 0 98765 1 2 3";
        let s = parse_stat(line).unwrap();
        assert_eq!((s.pid, s.ppid, s.state, s.start_time), (1234, 77, 'S', 98765));
    }

    #[test]
    fn this_process_is_found_and_is_its_parents_descendant() {
        let me = std::process::id() as i32;
        let s = stat(me).unwrap();
        assert!(!s.is_zombie());
        assert!(descendants(s.ppid).iter().any(|p| p.pid == me));
    }
}

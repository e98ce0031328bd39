//! Reading the process tree from /proc: who descends from whom, and who is a zombie.
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

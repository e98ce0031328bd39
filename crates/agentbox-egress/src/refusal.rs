//! A refusal as recorded, and the log the proxy's daemon keeps of them: JSON lines in a file of
//! the host's (never the box's), bounded by turning it over into `<file>.1` past a size.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

/// One connection the proxy refused (the contract's own type: a box answers them).
pub use agentbox_core::NetRefusal as Refusal;

/// The refusals of one box, appended one JSON line each.
#[derive(Clone, Debug)]
pub struct RefusalLog {
    path: PathBuf,
    max_bytes: u64,
}

impl RefusalLog {
    /// The log at `path`, turned over into `<path>.1` once it passes `max_bytes`.
    pub fn new(path: impl Into<PathBuf>, max_bytes: u64) -> Self {
        RefusalLog {
            path: path.into(),
            max_bytes,
        }
    }

    /// Append `r` (one write of one line, so lines of two writers do not mix).
    pub fn append(&self, r: &Refusal) -> std::io::Result<()> {
        if std::fs::metadata(&self.path).is_ok_and(|m| m.len() >= self.max_bytes) {
            std::fs::rename(&self.path, older(&self.path))?;
        }
        let mut line = serde_json::to_vec(r).map_err(std::io::Error::other)?;
        line.push(b'\n');
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?
            .write_all(&line)
    }
}

fn older(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".1");
    PathBuf::from(p)
}

/// The last `max` refusals of the log at `path` (the turned-over file first), oldest first; a
/// line that is not a refusal is skipped. No log yet is no refusal.
pub fn read_refusals(path: &Path, max: usize) -> std::io::Result<Vec<Refusal>> {
    let mut out = std::collections::VecDeque::new();
    for p in [older(path), path.to_path_buf()] {
        let f = match std::fs::File::open(&p) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        // Each line bounded: a log is the daemon's, but a bound costs nothing.
        for line in std::io::BufReader::new(std::io::Read::take(f, 64 << 20)).split(b'\n') {
            let line = line?;
            if line.len() > 16 << 10 {
                continue;
            }
            if let Ok(r) = serde_json::from_slice::<Refusal>(&line) {
                if out.len() == max {
                    out.pop_front();
                }
                out.push_back(r);
            }
        }
    }
    Ok(out.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_turns_over_and_reads_back_the_last_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("egress.log");
        let log = RefusalLog::new(&path, 200);
        for i in 0..10u16 {
            log.append(&Refusal {
                at_ms: i as u64,
                host: "evil.example".into(),
                port: i,
                address: None,
                rule: "no entry".into(),
                why: "x".into(),
            })
            .unwrap();
        }
        assert!(std::fs::metadata(&path).unwrap().len() < 200 + 100);
        let all = read_refusals(&path, 100).unwrap();
        assert_eq!(all.last().unwrap().port, 9);
        assert!(all.len() < 10, "the oldest were turned over and dropped");
        assert!(all.windows(2).all(|w| w[0].at_ms < w[1].at_ms));
        assert_eq!(read_refusals(&path, 2).unwrap().len(), 2);
        assert!(read_refusals(&dir.path().join("none"), 5).unwrap().is_empty());
    }
}

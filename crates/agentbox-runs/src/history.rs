//! `generations.jsonl`: a run's generations, one line when each is opened and one when it lets
//! go, so anyone can see the run's life as a timeline (who held it, where, for how long, how it
//! ended) with no claim.
//!
//! `run.json` says only who holds the run now (or held it last); this file keeps the rest. A
//! generation with no line of its end ended without letting go: its holder died or was fenced,
//! and the next generation took the run over at its start.
//!
//! A line is written after the step it tells of (a claim, a seal): a crash between the two
//! loses a line, never invents one, and [`read`] says what it cannot tell as `taken over`.

use std::io::Write;
use std::path::Path;

use agentbox_core::{Error, Result};
use serde::{Deserialize, Serialize};

/// The file's name in a run's directory.
pub const FILE: &str = "generations.jsonl";

/// The most bytes of the file read: past it, the oldest generations are left out.
const MOST_READ: u64 = 4 << 20;

/// One line of the file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
enum Line {
    /// A generation claimed the run.
    Opened {
        generation: u64,
        host: String,
        pid: u32,
        at_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        driver: Option<String>,
    },
    /// A generation let go: `sealed` or `parked`.
    Ended { generation: u64, how: String, at_ms: u64 },
}

/// One generation of a run, as [`read`] gives it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Generation {
    /// Its number (the first open is 1).
    pub generation: u64,
    /// The host that held it.
    pub host: String,
    /// The process that held it.
    pub pid: u32,
    /// The driver that started it (`local`, `docker`, `kube`...), when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// When it claimed the run, in ms since the epoch.
    pub started_ms: u64,
    /// When it ended, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
    /// How it ended: `sealed`, `parked`, `taken over` (it never let go: the next generation
    /// claimed the run), or `holding` (it has the run now).
    pub ended: String,
}

/// Add the line of generation `generation` opening the run in `dir`.
pub(crate) fn opened(dir: &Path, generation: u64, host: &str, pid: u32, at_ms: u64, driver: Option<&str>) {
    append(
        dir,
        &Line::Opened {
            generation,
            host: host.to_string(),
            pid,
            at_ms,
            driver: driver.map(str::to_string),
        },
    );
}

/// Add the line of generation `generation` letting go of the run in `dir`.
pub(crate) fn ended(dir: &Path, generation: u64, how: &str, at_ms: u64) {
    append(
        dir,
        &Line::Ended {
            generation,
            how: how.to_string(),
            at_ms,
        },
    );
}

/// The history is what a person reads: a line that could not be written is logged, and the
/// run goes on (its record and store are what hold it).
fn append(dir: &Path, line: &Line) {
    let path = dir.join(FILE);
    let written = (|| -> std::io::Result<()> {
        let mut text = serde_json::to_vec(line).map_err(std::io::Error::other)?;
        text.push(b'\n');
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
        // One write of one line: two writers' lines never interleave.
        f.write_all(&text)
    })();
    if let Err(e) = written {
        tracing::warn!("{}: a generation's line not written: {e}", path.display());
    }
}

/// The generations of the run in `dir`, oldest first; none for a run never opened (or one made
/// before this file was kept). A line that is not one of the file's (a torn last line) is
/// skipped.
///
/// ```no_run
/// for g in agentbox_runs::history::read("runs/r1".as_ref()).unwrap() {
///     println!("{} pid {} on {}: {}", g.generation, g.pid, g.host, g.ended);
/// }
/// ```
pub fn read(dir: &Path) -> Result<Vec<Generation>> {
    use std::io::{Read, Seek, SeekFrom};
    let path = dir.join(FILE);
    let mut f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(e, format!("opening {}", path.display()))),
    };
    let len = f
        .metadata()
        .map_err(|e| Error::io(e, format!("reading {}", path.display())))?
        .len();
    let from = len.saturating_sub(MOST_READ);
    f.seek(SeekFrom::Start(from))
        .map_err(|e| Error::io(e, format!("reading {}", path.display())))?;
    let mut text = Vec::new();
    f.take(MOST_READ)
        .read_to_end(&mut text)
        .map_err(|e| Error::io(e, format!("reading {}", path.display())))?;
    let mut out: Vec<Generation> = Vec::new();
    // Past the bound, the first (partial) line is not one to read.
    let lines = text.split(|b| *b == b'\n').skip(usize::from(from > 0));
    for line in lines.filter(|l| !l.is_empty()) {
        match serde_json::from_slice::<Line>(line) {
            Ok(Line::Opened {
                generation,
                host,
                pid,
                at_ms,
                driver,
            }) => {
                if let Some(last) = out.last_mut()
                    && last.ended == "holding"
                {
                    last.ended = "taken over".into();
                    last.ended_ms = Some(at_ms);
                }
                out.push(Generation {
                    generation,
                    host,
                    pid,
                    driver,
                    started_ms: at_ms,
                    ended_ms: None,
                    ended: "holding".into(),
                });
            }
            Ok(Line::Ended { generation, how, at_ms }) => {
                if let Some(g) = out.iter_mut().rev().find(|g| g.generation == generation) {
                    g.ended = how;
                    g.ended_ms = Some(at_ms);
                }
            }
            Err(e) => tracing::debug!("{}: a line skipped: {e}", path.display()),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_read_as_a_timeline() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read(dir.path()).unwrap().is_empty());
        opened(dir.path(), 1, "a", 10, 1_000, Some("local"));
        ended(dir.path(), 1, "parked", 2_000);
        opened(dir.path(), 2, "b", 20, 3_000, None);
        // Generation 2 never let go: 3 took the run over.
        opened(dir.path(), 3, "c", 30, 5_000, None);
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join(FILE))
            .unwrap()
            .write_all(b"{\"event\":\"ended\",\"gen")
            .unwrap();
        let g = read(dir.path()).unwrap();
        let seen: Vec<(u64, &str, Option<u64>, &str)> = g
            .iter()
            .map(|g| (g.generation, g.host.as_str(), g.ended_ms, g.ended.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                (1, "a", Some(2_000), "parked"),
                (2, "b", Some(5_000), "taken over"),
                (3, "c", None, "holding")
            ]
        );
        assert_eq!(g[0].driver.as_deref(), Some("local"));
    }
}

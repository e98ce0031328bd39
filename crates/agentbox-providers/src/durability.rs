//! Whether a box's disk keeps what it acknowledged: [`probe_acknowledged_writes`]. A runtime
//! is fit to hold a run's directory only when every write a program was told was durable
//! survives that program's death.

use agentbox_core::{Ctx, Error, ExecOptions, FinishOptions, Result, Sandbox, finish};
use serde::Serialize;

/// How many records the writer appends.
pub const RECORDS: u32 = 10;

/// What [`probe_acknowledged_writes`] found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WriteProbe {
    /// The directory written in, in the box.
    pub dir: String,
    /// Its file system's type, as `stat -f` names it (`ext2/ext3`, `overlayfs`, `nfs`, …).
    pub file_system: String,
    /// Records the writer was told were durable (each appended, then fsynced) before it was
    /// killed.
    pub acknowledged: u32,
    /// Records a second process found, in order.
    pub kept: u32,
    /// The writer ended by SIGKILL, as the probe means it to.
    pub writer_killed: bool,
}

impl WriteProbe {
    /// Every record acknowledged, every acknowledged record kept, the writer killed.
    pub fn passed(&self) -> bool {
        self.writer_killed && self.acknowledged == RECORDS && self.kept >= self.acknowledged
    }
}

impl std::fmt::Display for WriteProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): {} of {} acknowledged records kept after the writer was {}: {}",
            if self.dir == "." { "the workspace" } else { &self.dir },
            self.file_system,
            self.kept.min(self.acknowledged),
            self.acknowledged,
            if self.writer_killed { "killed" } else { "not killed" },
            if self.passed() { "passed" } else { "FAILED" }
        )
    }
}

/// The writer: ten records, each appended by `dd` and fsynced (`conv=fsync`) before it is
/// acknowledged on stdout; then it kills itself with SIGKILL, so nothing runs at its exit.
const WRITER: &str = r#"f="$1/.agentbox-probe-$2"
: > "$f" || exit 3
i=1
while [ "$i" -le 10 ]; do
  printf 'record %02d\n' "$i" | dd of="$f" oflag=append conv=notrunc,fsync status=none || exit 4
  echo "acknowledged $i"
  i=$((i + 1))
done
kill -KILL $$"#;

/// The reader, another process: the file system's type, then the records found.
const READER: &str = r#"f="$1/.agentbox-probe-$2"
stat -f -c %T "$1" 2>/dev/null || echo unknown
echo --
cat "$f"
rm -f "$f""#;

/// Probe the disk of `dir` in `b` (the box's workspace when `None`): a writer appends ten
/// records, each followed by an fsync, then is killed; a second process counts them.
///
/// ```no_run
/// # async fn f(b: &dyn agentbox_core::Sandbox) -> agentbox_core::Result<()> {
/// let probe = agentbox_providers::durability::probe_acknowledged_writes(b, None, &agentbox_core::Ctx::background()).await?;
/// assert!(probe.passed(), "{probe}");
/// # Ok(()) }
/// ```
pub async fn probe_acknowledged_writes(b: &dyn Sandbox, dir: Option<&str>, ctx: &Ctx) -> Result<WriteProbe> {
    let dir = dir.unwrap_or(".").to_string();
    // A name of this probe's own, so two probes of one directory never share a file.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tag = format!("{}-{nanos}", std::process::id());
    let run = |script: &'static str| {
        let argv: Vec<String> = vec![
            "sh".into(),
            "-c".into(),
            script.into(),
            "probe".into(),
            dir.clone(),
            tag.clone(),
        ];
        async move {
            let p = b.exec(&argv, &ExecOptions::default(), ctx).await?;
            finish(
                p,
                FinishOptions {
                    max_output: 64 << 10,
                    ..Default::default()
                },
            )
            .await
        }
    };
    let wrote = run(WRITER).await?;
    let acknowledged = wrote
        .stdout_text()
        .lines()
        .filter(|l| l.starts_with("acknowledged "))
        .count() as u32;
    let writer_killed = wrote.status.signal == Some(agentbox_core::SIGKILL) || wrote.status.code == 137;
    if !writer_killed && acknowledged == 0 {
        return Err(Error::unknown(format!(
            "the probe's writer could not write in {dir}: {} (exit {})",
            wrote.stderr_text().trim(),
            wrote.status.code
        )));
    }
    let read = run(READER).await?;
    let text = read.stdout_text();
    let (fs, records) = text.split_once("--\n").unwrap_or((&text, ""));
    let kept = records
        .lines()
        .enumerate()
        .take_while(|(i, l)| *l == format!("record {:02}", i + 1))
        .count() as u32;
    let probe = WriteProbe {
        dir: dir.clone(),
        file_system: fs.trim().to_string(),
        acknowledged,
        kept,
        writer_killed,
    };
    Ok(probe)
}

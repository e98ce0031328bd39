//! Finding agentbox's helper binary (`agentbox-runner`), which local boxes run as their
//! supervisor.

use std::path::{Path, PathBuf};

use agentbox_core::{Error, Result};

/// The variable that names the helper binary explicitly.
pub const RUNNER_ENV: &str = "AGENTBOX_RUNNER";

/// A command line that runs the helper: `program args… supervise …`.
///
/// The `agentbox` binary passes itself with `["runner"]`, so an installed `agentbox` needs no
/// second file; a library user passes nothing and [`HelperCommand::discover`] finds
/// `agentbox-runner`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelperCommand {
    /// The executable.
    pub program: PathBuf,
    /// Arguments before the helper's own subcommand.
    pub args: Vec<String>,
}

impl HelperCommand {
    /// A helper at an explicit path.
    pub fn new(program: impl Into<PathBuf>, args: Vec<String>) -> Self {
        HelperCommand {
            program: program.into(),
            args,
        }
    }

    /// `$AGENTBOX_RUNNER`, else `agentbox-runner` beside this executable or one directory up
    /// (where cargo puts binaries when this executable is a test), else `not_found` saying how
    /// to get one.
    pub fn discover() -> Result<Self> {
        Self::discover_with(std::env::var_os(RUNNER_ENV).as_deref())
    }

    /// [`HelperCommand::discover`] with `runner` for the value of `$AGENTBOX_RUNNER` (a
    /// registry's environment passes its own).
    pub fn discover_with(runner: Option<&std::ffi::OsStr>) -> Result<Self> {
        if let Some(p) = runner {
            let p = PathBuf::from(p);
            if !p.is_file() {
                return Err(Error::not_found(format!("{RUNNER_ENV}={}: no such file", p.display())));
            }
            return Ok(HelperCommand::new(p, vec![]));
        }
        let exe = std::env::current_exe().map_err(|e| Error::io(e, "finding this executable"))?;
        let mut dir: Option<&Path> = exe.parent();
        for _ in 0..2 {
            let Some(d) = dir else { break };
            let candidate = d.join("agentbox-runner");
            if candidate.is_file() {
                return Ok(HelperCommand::new(candidate, vec![]));
            }
            dir = d.parent();
        }
        Err(Error::not_found(format!(
            "the agentbox-runner binary is not beside {} and {RUNNER_ENV} is not set: build it with \
             `cargo build -p agentbox-runner`, or set {RUNNER_ENV} to its path",
            exe.display()
        )))
    }

    /// Whether the program is a static executable, which runs in any box of this machine's
    /// architecture. A dynamic one (an ELF with an interpreter) needs the box to have a C
    /// library at least as new as the one it was linked against; `false` also when the file
    /// cannot be read as an ELF.
    pub fn is_static(&self) -> bool {
        elf_is_static(&self.program).unwrap_or(false)
    }

    /// `e` with what to do when this program could not start in a box: a dynamic build
    /// (`agentbox` itself, as `cargo install` makes it) cannot run in an image whose C library
    /// is older or absent; the static runner can.
    pub fn explain(&self, e: Error) -> Error {
        if self.is_static() {
            return e;
        }
        let hint = format!(
            "{} is dynamically linked, and runs only in a box whose image has this machine's C library \
             (glibc) or a newer one: build the static runner (scripts/runner-static) and put it beside \
             agentbox as agentbox-runner, or set {RUNNER_ENV} to it; or make the box without a runner \
             (agentbox: --no-runner)",
            self.program.display()
        );
        Error::new(e.code(), format!("{} ({hint})", e.message()))
    }
}

/// Reads the ELF header and program headers alone (a few KiB, whatever the file's size) and
/// looks for `PT_INTERP`, the dynamic loader a dynamic executable names.
fn elf_is_static(path: &Path) -> std::io::Result<bool> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    let mut head = [0u8; 64];
    f.read_exact(&mut head)?;
    // 64-bit little-endian ELF only: the runner is built for x86_64 and aarch64 Linux.
    if &head[..4] != b"\x7fELF" || head[4] != 2 || head[5] != 1 {
        return Ok(false);
    }
    let phoff = u64::from_le_bytes(head[32..40].try_into().expect("8 bytes"));
    let phentsize = u16::from_le_bytes([head[54], head[55]]) as usize;
    let phnum = u16::from_le_bytes([head[56], head[57]]) as usize;
    if phentsize < 4 || phentsize * phnum > 64 << 10 {
        return Ok(false);
    }
    let mut table = vec![0u8; phentsize * phnum];
    f.seek(SeekFrom::Start(phoff))?;
    f.read_exact(&mut table)?;
    const PT_INTERP: u32 = 3;
    Ok(table
        .chunks_exact(phentsize)
        .all(|h| u32::from_le_bytes(h[..4].try_into().expect("4 bytes")) != PT_INTERP))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_build_is_told_apart_and_explained() {
        // This test binary is a dynamic build (cargo's default on linux-gnu).
        let me = HelperCommand::new(std::env::current_exe().unwrap(), vec![]);
        assert!(!me.is_static());
        let e = me.explain(Error::unknown("the runner did not start"));
        assert!(
            e.message().starts_with("the runner did not start (")
                && e.message().contains("scripts/runner-static")
                && e.message().contains(RUNNER_ENV),
            "{e}"
        );
        let not_elf = HelperCommand::new("/etc/hostname", vec![]);
        assert!(!not_elf.is_static());
        // An ELF whose program headers name no interpreter is static, and explains nothing.
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let elf = |kind: u32| {
            let mut b = vec![0u8; 64 + 56];
            b[..6].copy_from_slice(b"\x7fELF\x02\x01");
            b[32..40].copy_from_slice(&64u64.to_le_bytes());
            b[54..56].copy_from_slice(&56u16.to_le_bytes());
            b[56..58].copy_from_slice(&1u16.to_le_bytes());
            b[64..68].copy_from_slice(&kind.to_le_bytes());
            b
        };
        std::fs::write(dir.join("static"), elf(1)).unwrap();
        std::fs::write(dir.join("dynamic"), elf(3)).unwrap();
        let s = HelperCommand::new(dir.join("static"), vec![]);
        assert!(s.is_static());
        assert_eq!(s.explain(Error::unknown("x")).message(), "x");
        assert!(!HelperCommand::new(dir.join("dynamic"), vec![]).is_static());
    }
}

//! The box's file system, built by its init in the box's own mount namespace.
//!
//! The new root is a small tmpfs (`DIR/root` on the host) holding a read-only bind of every
//! top-level entry of the source root (this machine's `/`, or an unpacked image), except what
//! the box gets its own of: a new `/proc`, a minimal `/dev`, `/tmp`, `/run` (an empty tmpfs, so
//! every daemon's socket under it is gone, `/run/user` with the SSH and D-Bus sockets too),
//! `/home` (empty: every person's home is masked), `/root` (the box's home) and `/workspace`;
//! `/sys` is read-only, also over a rootfs: a sysfs of the box's own where it has a network of
//! its own (so `/sys/class/net` lists the box's interfaces, never this machine's), else this
//! machine's.
//! Everything bound from the host is made read-only, nosuid and nodev at once with
//! `mount_setattr(AT_RECURSIVE)`, then the writable directories are bound over it, and the
//! init pivots into the new root, leaving the host's tree unreachable.

use std::ffi::CString;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use agentbox_protocol::namespace::{BoxConfig, HOME, RUN_DIR, RUNNER, Root, WORKSPACE};
use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};

/// Top-level names the box gets its own of, never the source root's.
const OWN: &[&str] = &["proc", "dev", "sys", "tmp", "run", "home", "root", "workspace"];

/// Device nodes bound from the host's `/dev`.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const AT_RECURSIVE: libc::c_uint = 0x8000;

fn err(what: impl std::fmt::Display, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// The keeper's descriptors, as the init uses them.
pub(super) use agentbox_protocol::namespace::Descriptors as Fds;

/// How the init reaches and lets go of the keeper's descriptors.
trait Reach {
    fn path(fd: i32) -> PathBuf;
    fn close(&self);
}

impl Reach for Fds {
    fn path(fd: i32) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{fd}"))
    }

    /// Close them all: none may reach the runner, whose programs could walk up from a
    /// descriptor of a host directory.
    fn close(&self) {
        for fd in std::iter::once(self.dir)
            .chain(self.rootfs)
            .chain(self.mounts.iter().copied())
        {
            // SAFETY: the keeper handed these descriptors to this process alone, and nothing
            // here holds them but this list, which is used no more.
            #[allow(unsafe_code)]
            drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
        }
    }
}

/// Build the box's root and pivot into it.
pub(super) fn build(cfg: &BoxConfig, fds: &Fds) -> Result<(), String> {
    let r = build_inner(cfg, fds);
    fds.close();
    r
}

fn build_inner(cfg: &BoxConfig, fds: &Fds) -> Result<(), String> {
    let dir_path = Fds::path(fds.dir);
    let dir = dir_path.as_path();
    let new = dir.join("root");
    // Nothing mounted here is seen by the host, and nothing of the host's later mounts here.
    rustix::mount::mount_change("/", MountPropagationFlags::REC | MountPropagationFlags::PRIVATE)
        .map_err(|e| err("making the mounts private", e))?;
    rustix::mount::mount(
        "tmpfs",
        &new,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        c"mode=0755,size=4m",
    )
    .map_err(|e| err(format!("mounting the new root at {}", new.display()), e))?;

    let source = match (&cfg.root, fds.rootfs) {
        (Root::Host, _) => PathBuf::from("/"),
        (Root::Rootfs(_), Some(fd)) => Fds::path(fd),
        (Root::Rootfs(p), None) => return Err(format!("the keeper opened no rootfs for {p}")),
    };
    let entries = std::fs::read_dir(&source).map_err(|e| err(format!("reading {}", source.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| err(format!("reading {}", source.display()), e))?;
        let name = entry.file_name();
        let Some(n) = name.to_str() else { continue };
        if OWN.contains(&n) {
            continue;
        }
        let from = source.join(n);
        let to = new.join(n);
        let kind = entry.file_type().map_err(|e| err(from.display(), e))?;
        if kind.is_symlink() {
            let target = std::fs::read_link(&from).map_err(|e| err(from.display(), e))?;
            symlink(&target, &to).map_err(|e| err(to.display(), e))?;
        } else if kind.is_dir() {
            std::fs::create_dir(&to).map_err(|e| err(to.display(), e))?;
            rustix::mount::mount_bind_recursive(&from, &to)
                .map_err(|e| err(format!("binding {}", from.display()), e))?;
        } else if kind.is_file() {
            std::fs::write(&to, b"").map_err(|e| err(to.display(), e))?;
            rustix::mount::mount_bind(&from, &to).map_err(|e| err(format!("binding {}", from.display()), e))?;
        }
    }
    for n in OWN {
        std::fs::create_dir(new.join(n)).map_err(|e| err(format!("making /{n}"), e))?;
    }
    std::fs::set_permissions(new.join("tmp"), std::fs::Permissions::from_mode(0o1777)).map_err(|e| err("/tmp", e))?;
    sys(cfg, &new.join("sys"))?;
    // Where a spec's mount lands at the top level, it needs a directory of its own there.
    for m in &cfg.mounts {
        let first = m.target.trim_start_matches('/').split('/').next().unwrap_or("");
        let top = new.join(first);
        if !first.is_empty() && !top.exists() && std::fs::symlink_metadata(&top).is_err() {
            std::fs::create_dir(&top).map_err(|e| err(format!("making /{first}"), e))?;
        }
    }
    // Everything so far, the host's binds and the tmpfs root itself: read-only, nosuid, nodev.
    setattr(&new, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, true)?;

    // The box's own.
    rustix::mount::mount(
        "proc",
        new.join("proc"),
        "proc",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        None,
    )
    .map_err(|e| err("mounting /proc", e))?;
    dev(&new.join("dev"))?;
    bind_rw(&dir.join("tmp"), &new.join("tmp"))?;
    rustix::mount::mount(
        "tmpfs",
        new.join("run"),
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        c"mode=0755,size=1m",
    )
    .map_err(|e| err("mounting /run", e))?;
    let run = new.join(RUN_DIR.trim_start_matches('/'));
    std::fs::create_dir_all(&run).map_err(|e| err(RUN_DIR, e))?;
    bind_rw(&dir.join("run"), &run)?;
    // This very program, read-only, for the init to start the runner from: the host's path
    // to it may not be in the box at all (a rootfs), or not searchable by the box's user.
    let runner = new.join(RUNNER.trim_start_matches('/'));
    std::fs::write(&runner, b"").map_err(|e| err(RUNNER, e))?;
    rustix::mount::mount_bind("/proc/self/exe", &runner).map_err(|e| err(format!("binding {RUNNER}"), e))?;
    setattr(&runner, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, false)?;
    setattr(
        &new.join("run"),
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        false,
    )?;
    bind_rw(&dir.join("home"), &new.join(HOME.trim_start_matches('/')))?;
    bind_rw(&dir.join("work"), &new.join(WORKSPACE.trim_start_matches('/')))?;
    for (m, fd) in cfg.mounts.iter().zip(&fds.mounts) {
        let to = new.join(m.target.trim_start_matches('/'));
        let source = Fds::path(*fd);
        let source_is_dir = source.is_dir();
        if std::fs::symlink_metadata(&to).is_err() {
            // Only where the box can write (its workspace, home, tmp) can a new one be made.
            let made = if source_is_dir {
                std::fs::create_dir_all(&to)
            } else {
                to.parent()
                    .map(std::fs::create_dir_all)
                    .unwrap_or(Ok(()))
                    .and_then(|_| std::fs::write(&to, b""))
            };
            made.map_err(|e| {
                err(
                    format!("mount target {}", m.target),
                    format!("not in the box's root, and it cannot be made there ({e})"),
                )
            })?;
        }
        rustix::mount::mount_bind_recursive(&source, &to).map_err(|e| err(format!("binding {}", m.source), e))?;
        let attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | if m.read_only { MOUNT_ATTR_RDONLY } else { 0 };
        setattr(&to, attrs, true)?;
    }
    // What the config names (the host user's home, agentbox's home) is masked too, where the
    // host's tree shows it.
    if cfg.root == Root::Host {
        for m in &cfg.masks {
            // Under a top-level directory the box has its own of (`/root`, where root's
            // home is, or `/tmp`), the host's is not there to hide, and a mask would hide the
            // box's own (its home, made read-only and empty).
            let top = m.trim_start_matches('/').split('/').next().unwrap_or("");
            if OWN.contains(&top) {
                continue;
            }
            let inside = new.join(m.trim_start_matches('/'));
            if inside.is_dir() {
                rustix::mount::mount(
                    "tmpfs",
                    &inside,
                    "tmpfs",
                    MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
                    c"size=4k,mode=0755",
                )
                .map_err(|e| err(format!("masking {m}"), e))?;
            }
        }
    }

    std::env::set_current_dir(&new).map_err(|e| err("entering the new root", e))?;
    rustix::process::pivot_root(".", ".").map_err(|e| err("pivot_root", e))?;
    rustix::mount::unmount(".", UnmountFlags::DETACH).map_err(|e| err("leaving the host's root", e))?;
    std::env::set_current_dir("/").map_err(|e| err("chdir /", e))?;
    Ok(())
}

/// A minimal `/dev`: a tmpfs with the harmless devices bound from the host's, its own ptys
/// and shared memory.
fn dev(at: &Path) -> Result<(), String> {
    rustix::mount::mount(
        "tmpfs",
        at,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        c"mode=0755,size=64k",
    )
    .map_err(|e| err("mounting /dev", e))?;
    for d in DEVICES {
        let to = at.join(d);
        std::fs::write(&to, b"").map_err(|e| err(to.display(), e))?;
        rustix::mount::mount_bind(Path::new("/dev").join(d), &to).map_err(|e| err(format!("binding /dev/{d}"), e))?;
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        symlink(target, at.join(link)).map_err(|e| err(format!("/dev/{link}"), e))?;
    }
    std::fs::create_dir(at.join("pts")).map_err(|e| err("/dev/pts", e))?;
    rustix::mount::mount(
        "devpts",
        at.join("pts"),
        "devpts",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        c"newinstance,ptmxmode=0666,mode=620",
    )
    .map_err(|e| err("mounting /dev/pts", e))?;
    std::fs::create_dir(at.join("shm")).map_err(|e| err("/dev/shm", e))?;
    rustix::mount::mount(
        "tmpfs",
        at.join("shm"),
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        c"mode=1777,size=64m",
    )
    .map_err(|e| err("mounting /dev/shm", e))?;
    Ok(())
}

fn bind_rw(from: &Path, to: &Path) -> Result<(), String> {
    rustix::mount::mount_bind(from, to)
        .map_err(|e| err(format!("binding {} at {}", from.display(), to.display()), e))?;
    setattr(to, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, false)
}

/// `mount_setattr(2)`, which rustix does not wrap: set `attrs` on the mount at `path`, and on
/// every mount under it when `recursive`. Only adding restrictions, which a user namespace may
/// do to the mounts it inherited.
fn setattr(path: &Path, attrs: u64, recursive: bool) -> Result<(), String> {
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    let attr = MountAttr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| err(path.display(), "holds a NUL"))?;
    let flags = if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: the path is a valid C string and `attr` a live struct of the size passed, both
    // outliving the call, which writes to neither.
    #[allow(unsafe_code)]
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        let hint = if e.raw_os_error() == Some(libc::ENOSYS) {
            " (mount_setattr needs Linux 5.12 or later)"
        } else {
            ""
        };
        return Err(err(format!("making {} read-only{hint}", path.display()), e));
    }
    Ok(())
}

/// The box's `/sys` at `to`. A box with a network namespace of its own gets a sysfs mounted in
/// it, whose network devices are that namespace's alone; should the kernel refuse the mount,
/// this machine's `/sys` is bound with an empty `class/net` over its list of interfaces. A box
/// on this machine's network sees this machine's `/sys`, whose interfaces are its own too.
fn sys(cfg: &BoxConfig, to: &Path) -> Result<(), String> {
    let own_network = cfg.network_none || cfg.egress.is_some();
    if own_network {
        let flags = MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
        match rustix::mount::mount("sysfs", to, "sysfs", flags, None) {
            Ok(()) => return Ok(()),
            Err(e) => eprintln!("agentbox-runner: a sysfs of the box's own: {e}; masking this machine's interfaces"),
        }
    }
    rustix::mount::mount_bind_recursive("/sys", to).map_err(|e| err("binding /sys", e))?;
    if own_network {
        rustix::mount::mount(
            "tmpfs",
            to.join("class/net"),
            "tmpfs",
            MountFlags::RDONLY,
            Some(c"size=4k,mode=0555"),
        )
        .map_err(|e| err("masking /sys/class/net", e))?;
    }
    Ok(())
}

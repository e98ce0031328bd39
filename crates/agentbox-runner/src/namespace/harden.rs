//! The hardening a namespace box's init applies to itself before it starts the runner, so
//! every program of the box inherits it: rlimits, no_new_privs, landlock, no capability, and
//! a seccomp filter. The host reads no_new_privs, the filter and every capability set back
//! from `/proc/<init>/status` (the kernel's word, not the box's), and refuses a box where any
//! is missing; how landlock went, which `/proc` does not show, is said on the `ready` line.

use std::collections::BTreeMap;
use std::convert::TryInto;

use agentbox_protocol::namespace::{BoxConfig, HOME, RUN_DIR, WORKSPACE};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
};

/// Syscalls refused with EPERM: Docker's default profile refuses these or lets them through
/// only with capabilities a box never holds; io_uring, ptrace and pidfd_getfd are refused
/// outright.
const REFUSED: &[libc::c_long] = &[
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_add_key,
    libc::SYS_keyctl,
    libc::SYS_request_key,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_mount_setattr,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_quotactl_fd,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_syslog,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_vhangup,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    // Another process's descriptor taken by pid: the init's control socket is one.
    libc::SYS_pidfd_getfd,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_uselib,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_nfsservctl,
];

/// `clone` flags that make a namespace.
const NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
];

/// Drop the supplementary groups the init inherited from the host user. Where the host could
/// not allow setgroups (an unprivileged host must deny it to map a group), the call fails and
/// the init keeps the host user's own groups, which the box sees as nobody's.
pub(super) fn drop_host_groups() {
    // SAFETY: a plain syscall on this single-threaded process's own credentials.
    #[allow(unsafe_code)]
    let _ = unsafe { libc::setgroups(0, std::ptr::null()) };
}

/// Apply every lock, in the order each needs: rlimits and securebits while the init still
/// holds its capabilities, then no_new_privs, landlock, the capabilities dropped, and seccomp
/// last (it refuses calls the steps before make). Says how landlock went: `abi N`, or `none: why`.
pub(super) fn apply(cfg: &BoxConfig) -> Result<String, String> {
    if let Some(n) = cfg.max_processes {
        let lim = rustix::process::Rlimit {
            current: Some(n),
            maximum: Some(n),
        };
        rustix::process::setrlimit(rustix::process::Resource::Nproc, lim).map_err(|e| format!("RLIMIT_NPROC: {e}"))?;
    }
    // SAFETY: prctl calls on this process's own capability state, with no pointer arguments.
    #[allow(unsafe_code)]
    unsafe {
        // Root of the namespace gains nothing by exec either: no capability from being uid 0,
        // none kept across a uid change, and these bits locked.
        // NOROOT, NO_SETUID_FIXUP, KEEP_CAPS (off) and NO_CAP_AMBIENT_RAISE, each locked.
        const SECBITS: libc::c_ulong = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80;
        if libc::prctl(libc::PR_SET_SECUREBITS, SECBITS, 0, 0, 0) != 0 {
            return Err(format!("securebits: {}", std::io::Error::last_os_error()));
        }
        if libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 {
            return Err(format!(
                "clearing ambient capabilities: {}",
                std::io::Error::last_os_error()
            ));
        }
        for cap in 0..64 {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                // EINVAL past the last capability this kernel knows.
                break;
            }
        }
    }
    rustix::thread::set_no_new_privs(true).map_err(|e| format!("no_new_privs: {e}"))?;
    let landlock = if cfg.landlock {
        landlock(cfg)
    } else {
        "none: not asked for".to_string()
    };
    rustix::thread::set_capabilities(
        None,
        rustix::thread::CapabilitySets {
            effective: rustix::thread::CapabilitySet::empty(),
            permitted: rustix::thread::CapabilitySet::empty(),
            inheritable: rustix::thread::CapabilitySet::empty(),
        },
    )
    .map_err(|e| format!("dropping capabilities: {e}"))?;
    seccomp(cfg.network_none)?;
    Ok(landlock)
}

/// Bring the loopback interface of the box's own network up (a new net namespace's is down):
/// the egress bridge listens on it. Takes CAP_NET_ADMIN, which the init holds until it
/// hardens.
pub(super) fn loopback_up() -> Result<(), String> {
    let sock = std::net::UdpSocket::bind(("0.0.0.0", 0)).map_err(|e| format!("a socket to bring lo up: {e}"))?;
    use std::os::fd::AsRawFd;
    // SAFETY: `req` is a zeroed ifreq naming "lo", as SIOCGIFFLAGS and SIOCSIFFLAGS read and
    // write it; the socket is open for the two calls.
    #[allow(unsafe_code)]
    unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) != 0 {
            return Err(format!("reading lo's flags: {}", std::io::Error::last_os_error()));
        }
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) != 0 {
            return Err(format!("bringing lo up: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

fn landlock(cfg: &BoxConfig) -> String {
    use landlock::{
        ABI, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
    };
    let abi = ABI::V6;
    let mut writable: Vec<String> = [WORKSPACE, HOME, "/tmp", "/dev", RUN_DIR]
        .iter()
        .map(|s| s.to_string())
        .collect();
    writable.extend(cfg.mounts.iter().filter(|m| !m.read_only).map(|m| m.target.clone()));
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .and_then(|r| r.scope(Scope::AbstractUnixSocket | Scope::Signal))
        .and_then(|r| r.create())
        .and_then(|r| r.add_rules(path_beneath_rules(["/"], AccessFs::from_read(abi))))
        .and_then(|r| r.add_rules(path_beneath_rules(&writable, AccessFs::from_all(abi))))
        .and_then(|r| r.restrict_self());
    match status {
        Ok(s) => match s.ruleset {
            RulesetStatus::FullyEnforced => format!("abi {}", abi as i32),
            RulesetStatus::PartiallyEnforced => "partial: the kernel lacks some of landlock's rights".into(),
            RulesetStatus::NotEnforced => "none: the kernel has no landlock".into(),
        },
        Err(e) => format!("none: {e}"),
    }
}

fn seccomp(network_none: bool) -> Result<(), String> {
    let arch: seccompiler::TargetArch = std::env::consts::ARCH
        .try_into()
        .map_err(|e| format!("seccomp on {}: {e:?}", std::env::consts::ARCH))?;
    let cond = |arg: u8, op: SeccompCmpOp, v: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, v).map_err(|e| format!("seccomp rule: {e}"))
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = REFUSED.iter().map(|s| (*s, vec![])).collect();
    let mut clone = Vec::new();
    for f in NAMESPACE_FLAGS {
        clone.push(SeccompRule::new(vec![cond(0, SeccompCmpOp::MaskedEq(*f), *f)?]).map_err(|e| e.to_string())?);
    }
    rules.insert(libc::SYS_clone, clone);
    let mut families = vec![libc::AF_VSOCK as u64];
    if network_none {
        families.extend([libc::AF_INET as u64, libc::AF_INET6 as u64]);
    }
    let mut socket = Vec::new();
    for fam in families {
        socket.push(
            SeccompRule::new(vec![
                SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, fam)
                    .map_err(|e| format!("seccomp rule: {e}"))?,
            ])
            .map_err(|e| e.to_string())?,
        );
    }
    rules.insert(libc::SYS_socket, socket);
    let refuse = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| format!("seccomp filter: {e}"))?;
    // clone3 hides its flags in memory a filter cannot read: ENOSYS, so the C library falls
    // back to clone, where the rules above see them.
    let clone3 = SeccompFilter::new(
        [(libc::SYS_clone3, vec![])].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(|e| format!("seccomp filter: {e}"))?;
    for f in [refuse, clone3] {
        let prog: BpfProgram = f.try_into().map_err(|e| format!("seccomp filter: {e}"))?;
        seccompiler::apply_filter(&prog).map_err(|e| format!("applying seccomp: {e}"))?;
    }
    Ok(())
}

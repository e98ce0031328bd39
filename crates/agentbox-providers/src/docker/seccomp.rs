//! agentbox's seccomp profile for Docker boxes, given to the engine in place of its default.
//!
//! Docker's own default profile lets every box call `io_uring_setup` (a large kernel surface
//! with a long record of privilege escalations, which no agent's tool needs), and it is an
//! engine setting a user may have changed. agentbox states its own profile instead, written
//! here in our words rather than copied: everything a box's programs use stays allowed, and
//! these are refused with `EPERM`:
//!
//! - io_uring, whole (`io_uring_setup`, `io_uring_enter`, `io_uring_register`);
//! - the kernel keyrings, which are not namespaced (`add_key`, `keyctl`, `request_key`);
//! - new namespaces and mounts: `unshare`, `setns`, `clone` with any namespace flag (one rule
//!   per flag, since a rule matches one masked value), `mount` and the new mount API,
//!   `umount2`, `pivot_root`; `clone3` answers `ENOSYS`, so a C library falls back to `clone`,
//!   where the flags can be seen;
//! - the kernel's own machinery: modules, `kexec_*`, `reboot`, swap, `acct`, `quotactl`,
//!   clock setting, `bpf`, `perf_event_open`, `userfaultfd`, `syslog`, `iopl`, `ioperm`,
//!   `lookup_dcookie`, `open_by_handle_at` (reading files by handle, past any mount), the
//!   `nfsservctl`, `uselib`, and vsock sockets.
//!
//! The box has no capabilities either (unless asked), so most of these would fail anyway:
//! the profile is the second lock, and the one that holds for the box's root when
//! capabilities are kept. Its name in facts is [`NAME`].

use serde_json::{Value, json};

/// The profile's name as a box's facts state it.
pub(super) const NAME: &str = "agentbox";

/// Syscalls refused outright.
const REFUSED: &[&str] = &[
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "add_key",
    "keyctl",
    "request_key",
    "unshare",
    "setns",
    "mount",
    "mount_setattr",
    "umount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    "settimeofday",
    "clock_settime",
    "clock_settime64",
    "clock_adjtime",
    "clock_adjtime64",
    "adjtimex",
    "stime",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "syslog",
    "iopl",
    "ioperm",
    "lookup_dcookie",
    "open_by_handle_at",
    "nfsservctl",
    "uselib",
    "vhangup",
];

/// `clone` flags that make a namespace (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER,
/// NEWPID, NEWNET).
const NAMESPACE_FLAGS: &[u64] = &[
    0x0002_0000,
    0x0200_0000,
    0x0400_0000,
    0x0800_0000,
    0x1000_0000,
    0x2000_0000,
    0x4000_0000,
];

/// AF_VSOCK: a way out of a VM-backed engine to its host.
const AF_VSOCK: u64 = 40;

const EPERM: u32 = 1;
const ENOSYS: u32 = 38;

/// The profile as the engine takes it (`SecurityOpt: seccomp=<this JSON>`).
pub(super) fn profile() -> Value {
    let mut rules: Vec<Value> = vec![json!({
        "names": REFUSED,
        "action": "SCMP_ACT_ERRNO",
        "errnoRet": EPERM,
    })];
    rules.push(json!({ "names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS }));
    for flag in NAMESPACE_FLAGS {
        rules.push(json!({
            "names": ["clone"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": EPERM,
            "args": [{ "index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ" }],
        }));
    }
    rules.push(json!({
        "names": ["socket"],
        "action": "SCMP_ACT_ERRNO",
        "errnoRet": EPERM,
        "args": [{ "index": 0, "value": AF_VSOCK, "op": "SCMP_CMP_EQ" }],
    }));
    json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "archMap": [
            { "architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"] },
            { "architecture": "SCMP_ARCH_AARCH64", "subArchitectures": ["SCMP_ARCH_ARM"] },
        ],
        "syscalls": rules,
    })
}

/// The `SecurityOpt` entry that applies the profile.
pub(super) fn security_opt() -> String {
    format!("seccomp={}", profile())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_uring_and_the_keyrings_are_refused_and_the_rest_allowed() {
        let p = profile();
        assert_eq!(p["defaultAction"], "SCMP_ACT_ALLOW");
        let refused: Vec<&str> = p["syscalls"][0]["names"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        for s in [
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "keyctl",
            "unshare",
            "mount",
        ] {
            assert!(refused.contains(&s), "{s}");
        }
        assert!(!refused.contains(&"read") && !refused.contains(&"clone"));
        assert!(security_opt().starts_with("seccomp={"));
    }
}

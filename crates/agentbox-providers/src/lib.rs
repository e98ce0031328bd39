//! agentbox's providers: each makes boxes of one kind behind the [`agentbox_core::Provider`]
//! contract, and each passes the one conformance suite of `agentbox-testing`.
//!
//! | provider | module | isolation | lifetime enforced by |
//! | --- | --- | --- | --- |
//! | local | [`local`] | none (development, tests) | the box's supervisor, a detached process |
//! | namespace | [`namespace`] | user, mount, pid, ipc, uts, cgroup (and net) namespaces, no daemon | the box's init, pid 1 of its pid namespace |
//! | docker | [`docker`] | a container per box | the container's first process, `agentbox-runner init` (or `sleep <lifetime>`) |
//! | kube | [`kube`] | a pod per box (optionally gVisor or Kata by runtime class) | the pod's first process, and `activeDeadlineSeconds` as the cluster's backstop |
//! | daytona | [`daytona`] | a Daytona sandbox per box (a container, or a VM from a linux-vm snapshot) | Daytona, by the sandbox's time to live (`ttlMinutes`) |
//! | modal | [`modal`] | a Modal sandbox per box (gVisor, or a VM) | Modal, by the sandbox's timeout (at most 24 h) |
//! | e2b | [`e2b`] | an E2B sandbox per box (a Firecracker VM) | E2B, by the sandbox's timeout (at most the plan's) |
//! | archil | [`archil`] | one VM container per command, over a directory of an Archil disk | nobody: checked by every call that looks at the box, never by a timer |
//! | runner | [`runner`] | the box's under it | the box's under it |
//!
//! [`pool`] wraps any of them in a warm pool: boxes of one spec made ahead and handed out at
//! once.
//!
//! [`durability`] asks any box whether its disk keeps what a program was told was durable.
//!
//! [`registry`] names them all: each provider's name, a line on what its boxes are, whether this
//! build has it, and how it is made from options and the environment.
//!
//! This crate knows nothing of hands, tools, transport or runs.

#[cfg(feature = "archil")]
pub mod archil;
pub(crate) mod atomic;
#[cfg(any(feature = "local", feature = "namespace"))]
pub(crate) mod boxdir;
#[cfg(feature = "daytona")]
pub mod daytona;
#[cfg(feature = "docker")]
pub mod docker;
pub mod durability;
#[cfg(feature = "e2b")]
pub mod e2b;
#[cfg(any(feature = "docker", all(feature = "namespace", target_os = "linux")))]
pub(crate) mod egress;
#[cfg(any(feature = "local", all(feature = "namespace", target_os = "linux")))]
pub(crate) mod frames;
pub mod helper;
pub mod home;
#[cfg(feature = "kube")]
pub mod kube;
pub mod lifecycle;
#[cfg(feature = "local")]
pub mod local;
#[cfg(any(
    feature = "local",
    feature = "docker",
    all(feature = "namespace", target_os = "linux")
))]
pub(crate) mod lock;
#[cfg(feature = "modal")]
pub mod modal;
#[cfg(all(feature = "namespace", target_os = "linux"))]
pub mod namespace;
pub mod pool;
pub(crate) mod random;
pub mod registry;
pub mod runner;
pub(crate) mod shell;
#[cfg(any(
    feature = "docker",
    feature = "kube",
    feature = "daytona",
    feature = "modal",
    feature = "e2b"
))]
pub(crate) mod shim;
pub mod transfer;
#[cfg(feature = "vendor")]
pub mod vendor;

#[cfg(feature = "local")]
pub use local::{LocalOptions, LocalProvider};

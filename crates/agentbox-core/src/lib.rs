//! The sandbox contract of agentbox.
//!
//! One contract over every place a command can run: a [`Provider`] makes [`Sandbox`]es from a
//! [`Spec`], refusing what it cannot honour; a box reports [`Facts`] read the way that fails
//! closed; every call takes a [`Ctx`] and answers a [`Result`] whose [`Error`] has a code.
//!
//! This crate does no I/O of its own and knows no provider. See `ARCHITECTURE.md` at the
//! repository root for where it sits.

mod allow;
mod ctx;
mod error;
mod facts;
mod files;
mod id;
mod lifecycle;
mod process;
mod processes;
mod sandbox;
mod secret;
mod spec;
mod time;

pub use allow::{AllowEntry, AllowTarget, Allowlist, NetRefusal, canonical};
pub use ctx::Ctx;
pub use error::{Error, ErrorCode, Result};
pub use facts::{Bulk, Clock, Facts, KnownNetwork, NetworkFact, PortFact, SystemClock, now_ms};
pub use files::{FileError, FileMeta, FileType, Files, within_workspace};
pub use id::SandboxId;
pub use lifecycle::{
    Lifecycle, MAX_FORK, Snapshot, check_deadline, check_fork, check_fork_count, refuse, validate_name,
};
pub use process::{
    ByteReader, ByteWriter, Cut, ExecOptions, ExitStatus, FinishOptions, Finished, Killer, MAX_TTY, NoInput, OutputGap,
    Process, ProcessControl, SIGKILL, SIGNALS, SIGTERM, Stdin, Tty, finish, finish_cut, read_bounded,
};
pub use processes::{MAX_READ, MAX_READ_WAIT, OutputChunk, OutputRead, ProcessInfo, ProcessState, Processes, Stream};
pub use sandbox::{Endpoint, Provider, Sandbox, Status};
pub use secret::{
    FdSecret, MAX_SECRET_BYTES, MAX_SECRET_HOSTS, MAX_SECRETS, SECRET_FD, SecretSource, SecretSpec, SecretValue,
};
pub use spec::{
    Honours, Labels, MAX_LIFETIME, MAX_MOUNTS, Mount, Network, PortKind, PortSpec, RESERVED_LABEL_PREFIX, Spec,
    check_spec, is_normal_absolute, is_reserved_label, parse_duration, validate_env, validate_labels,
};
pub use time::{epoch_ms, http_date, rfc3339, utc_seconds};

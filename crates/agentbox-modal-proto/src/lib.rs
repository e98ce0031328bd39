//! Modal's gRPC API, compiled from the vendor's own protocol.
//!
//! `proto/modal-1.6.4.binpb` holds the compiled `api.proto` (the client service,
//! `modal.client.ModalClient`) and `task_command_router.proto` (each sandbox's command router,
//! `modal.task_command_router.TaskCommandRouter`) exactly as the `modal` 1.6.4 package on PyPI
//! ships them (Apache-2.0; see `proto/README.md`). Nothing here is written by hand: the build
//! compiles them with prost and tonic, so the provider and the fake in agentbox's tests speak
//! the messages the `modal` Python package speaks.

#![allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]

/// `package modal.client`: apps, images, sandboxes, tags, snapshots, tunnels.
pub mod client {
    tonic::include_proto!("modal.client");
}

/// `package modal.task_command_router`: exec start, stdio reads from an offset, stdin
/// writes with an explicit end, wait.
pub mod task_command_router {
    tonic::include_proto!("modal.task_command_router");
}

//! Modal's gRPC API, compiled from the vendor's own protocol files.
//!
//! `proto/modal_proto/api.proto` (the client service, `modal.client.ModalClient`) and
//! `proto/modal_proto/task_command_router.proto` (the in-sandbox command router,
//! `modal.task_command_router.TaskCommandRouter`) are copied unchanged from the
//! modal-labs/modal-client repository (Apache-2.0; see `proto/README.md`). Nothing here is
//! written by hand: the build compiles them with protox and tonic-prost-build, so the
//! provider and the fake in agentbox's tests speak the same messages the `modal` Python
//! package does.

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

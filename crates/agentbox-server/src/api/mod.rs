//! The native API, under `/v1`: one route per operation, each documented in the OpenAPI
//! document from its handler's own types.

use std::sync::Arc;

use aide::axum::ApiRouter;
use aide::axum::routing::{delete_with, get_with, post_with};

use crate::state::AppState;

pub mod archive;
pub mod boxes;
pub mod exec;
pub mod files;
pub mod lifecycle;
pub mod processes;
pub mod providers;
pub mod runs;
pub mod snapshots;
pub mod streams;
pub mod tools;

/// What a stream's WebSocket carries, for the OpenAPI document.
const STREAM_PROTOCOL: &str = "JSON text frames, one message each, tagged by `type`. The server sends \
`started` {handle} (a terminal), `output` {seq, stream, data (base64)}, `gap` {from, to}, \
`exit` {exit, next} (then it closes with 1000) and `error` {code, message}. A client sends \
`stdin` {data | data_base64, close}, `resize` {rows, cols} and `signal` {signal}. A frame out \
of protocol (binary, not JSON, an unknown type, over 1 MiB) is answered with `error` and a \
close (1003, 1008 or 1009). A client that reconnects asks for `after` = the next byte it wants.";

/// The `/v1` routes.
pub(crate) fn routes() -> ApiRouter<Arc<AppState>> {
    ApiRouter::new()
        .api_route(
            "/v1/providers",
            get_with(providers::list, |o| {
                o.summary("The providers, whether this server can make their boxes, and what each honours")
            }),
        )
        .api_route(
            "/v1/boxes",
            post_with(boxes::create, |o| {
                o.summary("Make a box from a spec; the calling key owns it")
                    .response::<201, axum::Json<boxes::BoxInfo>>()
            })
            .get_with(boxes::list, |o| {
                o.summary("The boxes the calling key owns (every box, for an admin key)")
            }),
        )
        .api_route(
            "/v1/boxes/open",
            post_with(lifecycle::open, |o| {
                o.summary("The box of a name: made from the spec, or found (and woken) when it is there")
            }),
        )
        .api_route(
            "/v1/boxes/{id}/sleep",
            post_with(lifecycle::sleep, |o| {
                o.summary("Put a box to sleep: files kept, programs ended, its lifetime going on")
                    .response::<204, ()>()
            }),
        )
        .api_route(
            "/v1/boxes/{id}/wake",
            post_with(lifecycle::wake, |o| o.summary("Wake a sleeping box")),
        )
        .api_route(
            "/v1/boxes/{id}/extend",
            post_with(lifecycle::extend, |o| {
                o.summary("Move a box's deadline (ends_at_ms, or by_ms from where it is)")
            }),
        )
        .api_route(
            "/v1/boxes/{id}",
            get_with(boxes::get, |o| o.summary("A box, with whether it runs")).delete_with(boxes::delete, |o| {
                o.summary("End a box, with every program in it").response::<204, ()>()
            }),
        )
        .api_route(
            "/v1/boxes/{id}/snapshots",
            post_with(snapshots::take, |o| {
                o.summary("Keep a box's files (and memory, where the provider can) under a name of the key's own")
                    .response::<201, axum::Json<snapshots::SnapshotInfo>>()
            }),
        )
        .api_route(
            "/v1/boxes/{id}/fork",
            post_with(snapshots::fork, |o| {
                o.summary("New boxes holding a box's files as they are now, owned by the calling key")
                    .response::<201, axum::Json<Vec<boxes::BoxInfo>>>()
            }),
        )
        .api_route(
            "/v1/snapshots",
            get_with(snapshots::list, |o| o.summary("The calling key's snapshots")),
        )
        .api_route(
            "/v1/snapshots/{provider}/{name}",
            delete_with(snapshots::delete, |o| {
                o.summary("Delete one of the key's snapshots (boxes made from it are not touched)")
                    .response::<204, ()>()
            }),
        )
        .api_route(
            "/v1/boxes/{id}/exec",
            post_with(exec::exec, |o| {
                o.summary("Run one program to its end: its exit, and its output up to a bound")
            }),
        )
        .api_route(
            "/v1/boxes/{id}/files",
            get_with(files::read, |o| o.summary("A file's bytes"))
                .put_with(files::write, |o| {
                    o.summary("Write a file whole (its parents made)").response::<204, ()>()
                })
                .delete_with(files::remove, |o| {
                    o.summary("Remove a file, a link or a directory (`recursive` for one with entries)")
                        .response::<204, ()>()
                }),
        )
        .api_route(
            "/v1/boxes/{id}/archive",
            get_with(archive::get, |o| {
                o.summary("A directory as a tar: unpacked on the server by the safe extractor, packed again, never trusted")
            })
            .put_with(archive::put, |o| {
                o.summary("A tar into a directory: unpacked by the safe extractor first; a bad archive leaves the box as it was")
            }),
        )
        .api_route(
            "/v1/boxes/{id}/archive/listing",
            get_with(archive::listing, |o| {
                o.summary("A directory's listing (kind, size, mode, mtime of each path, links not followed): what an incremental pull compares")
            }),
        )
        .api_route(
            "/v1/boxes/{id}/archive/pick",
            post_with(archive::pick, |o| {
                o.summary("The named files and directories of a directory as a tar, through the safe extractor")
            }),
        )
        .api_route(
            "/v1/boxes/{id}/files/stat",
            get_with(files::stat, |o| o.summary("What a path is (a link not followed)")),
        )
        .api_route(
            "/v1/boxes/{id}/files/list",
            get_with(files::list, |o| o.summary("A directory's entries")),
        )
        .api_route(
            "/v1/boxes/{id}/files/mkdir",
            post_with(files::mkdir, |o| o.summary("Make a directory").response::<204, ()>()),
        )
        .api_route(
            "/v1/boxes/{id}/files/rename",
            post_with(files::rename, |o| o.summary("Rename a path").response::<204, ()>()),
        )
        .api_route(
            "/v1/boxes/{id}/processes",
            post_with(processes::start, |o| {
                o.summary("Start a program detached: it outlives this request, kept by the box's runner")
                    .response::<201, axum::Json<processes::Started>>()
            })
            .get_with(processes::list, |o| o.summary("The box's processes, running and ended")),
        )
        .api_route(
            "/v1/boxes/{id}/processes/{handle}",
            delete_with(processes::forget, |o| {
                o.summary("Let the box forget a process (once it ended)")
                    .response::<204, ()>()
            }),
        )
        .api_route(
            "/v1/boxes/{id}/processes/{handle}/output",
            get_with(processes::output, |o| {
                o.summary("A process's output from byte `after` on, waiting up to `wait_ms` for some; a gap is said")
            }),
        )
        .api_route(
            "/v1/boxes/{id}/processes/{handle}/stdin",
            post_with(processes::stdin, |o| {
                o.summary("Write to a process's stdin (and end it)")
                    .response::<204, ()>()
            }),
        )
        .api_route(
            "/v1/boxes/{id}/processes/{handle}/signal",
            post_with(processes::signal, |o| {
                o.summary("Signal a process's group").response::<204, ()>()
            }),
        )
        .api_route(
            "/v1/boxes/{id}/processes/{handle}/resize",
            post_with(processes::resize, |o| {
                o.summary("Set the size of a process's terminal").response::<204, ()>()
            }),
        )
        .api_route(
            "/v1/boxes/{id}/processes/{handle}/stream",
            get_with(streams::stream, |o| {
                o.summary("A WebSocket: a process's output live from byte `after` (a gap said), its stdin, resize and signals")
                    .description(STREAM_PROTOCOL)
                    .response::<101, ()>()
            }),
        )
        .api_route(
            "/v1/boxes/{id}/terminal",
            get_with(streams::terminal, |o| {
                o.summary("A WebSocket: a program in a terminal (a login shell by default), started detached and streamed")
                    .description(STREAM_PROTOCOL)
                    .response::<101, ()>()
            }),
        )
        .api_route(
            "/v1/boxes/{id}/processes/{handle}/wait",
            post_with(processes::wait, |o| {
                o.summary("Wait for a process to end: how it ended")
            }),
        )
        .api_route(
            "/v1/runs",
            get_with(runs::list, |o| o.summary("This host's runs: each one's record (an admin key's alone)")),
        )
        .api_route(
            "/v1/runs/{id}",
            get_with(runs::get, |o| {
                o.summary("A run's record (status, generation, holder) and its generations as a timeline, read with no claim")
            }),
        )
        .api_route(
            "/v1/runs/{id}/ledger",
            get_with(runs::ledger_of_run, |o| o.summary("A run's tool calls, in order")),
        )
        .api_route(
            "/v1/ledger",
            get_with(runs::ledger_of_target, |o| {
                o.summary("The tool calls that acted on a target (a path or a box), newest first")
            }),
        )
        .api_route(
            "/v1/receipts",
            get_with(runs::receipts, |o| o.summary("What boxes cost: the receipts' totals by provider and kind")),
        )
        .api_route(
            "/v1/receipts/boxes",
            get_with(runs::receipts_of_boxes, |o| {
                o.summary("What each box cost: the receipts themselves, newest first")
            }),
        )
        .api_route(
            "/v1/tools",
            get_with(tools::list, |o| {
                o.summary("The agent's tools: names, descriptions, argument schemas")
            }),
        )
        .api_route(
            "/v1/boxes/{id}/tools/{name}",
            post_with(tools::call, |o| {
                o.summary("Call a tool on a box: the body is its arguments; a tool's failure is a result with isError")
            }),
        )
}

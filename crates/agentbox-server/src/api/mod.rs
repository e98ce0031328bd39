//! The native API, under `/v1`: one route per operation, each documented in the OpenAPI
//! document from its handler's own types.

use std::sync::Arc;

use aide::axum::ApiRouter;
use aide::axum::routing::{get_with, post_with};

use crate::state::AppState;

pub mod boxes;
pub mod exec;
pub mod providers;

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
            "/v1/boxes/{id}",
            get_with(boxes::get, |o| o.summary("A box, with whether it runs")).delete_with(boxes::delete, |o| {
                o.summary("End a box, with every program in it").response::<204, ()>()
            }),
        )
        .api_route(
            "/v1/boxes/{id}/exec",
            post_with(exec::exec, |o| {
                o.summary("Run one program to its end: its exit, and its output up to a bound")
            }),
        )
}

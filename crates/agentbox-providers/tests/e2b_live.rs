//! E2B boxes against the real E2B: the conformance suite, only where `E2B_API_KEY` is set (see
//! docs/e2b.md). Without it it says loudly that it did not run; CI has no key and runs the
//! fake's suite (`tests/e2b.rs`). Whatever the report, it kills every box it left. Sandboxes
//! are billed by the second.

#![cfg(feature = "e2b")]

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Labels, Provider};
use agentbox_providers::e2b::{E2bOptions, E2bProvider};
use agentbox_testing::conformance::{self, Options};

#[path = "common/e2b_view.rs"]
mod e2b_view;
use e2b_view::View;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_boxes_on_the_real_e2b_pass_the_conformance_suite() {
    let Ok(key) = std::env::var("E2B_API_KEY") else {
        eprintln!(
            "\n!!!! e2b_boxes_on_the_real_e2b_pass_the_conformance_suite: E2B_API_KEY unset: this test did NOT run \
             (it needs an E2B account; see docs/e2b.md) !!!!\n"
        );
        return;
    };
    let o = E2bOptions::from_env().expect("the E2B variables read");
    let view = View::new(&o.api_url, o.sandbox_url.as_deref(), &o.domain, &key);
    let make = o.clone();
    // The suite's own label, so the sweep below touches no one else's sandbox.
    let mine = Labels::from([("live-run".to_string(), std::process::id().to_string())]);
    let mut options = Options::new(
        "e2b-live",
        Duration::from_secs(20),
        Duration::from_secs(60),
        Arc::new(view),
    );
    options.base.labels = mine.clone();
    let report = conformance::run(
        conformance::factory(move || {
            let o = make.clone();
            async move { Arc::new(E2bProvider::new(o).unwrap()) as Arc<dyn Provider> }
        }),
        options,
    )
    .await;
    let p = E2bProvider::new(o).unwrap();
    let ctx = Ctx::background().with_timeout(Duration::from_secs(120));
    for b in p.list(&mine, &ctx).await.expect("listing agentbox's sandboxes") {
        eprintln!("e2b live suite: killing {} left running", b.id());
        let _ = b.destroy(&ctx).await;
    }
    report.assert_all_passed();
}

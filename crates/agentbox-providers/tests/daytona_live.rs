//! Daytona boxes against the real Daytona: the conformance suite, only where `DAYTONA_API_KEY`
//! is set (and `DAYTONA_API_URL`, `DAYTONA_TARGET`, `AGENTBOX_DAYTONA_SNAPSHOT` as the SDK and
//! the provider read them; see docs/daytona.md). Without a key it says loudly that it did not
//! run; CI has no key and runs the fake's suite (`tests/daytona.rs`). It makes real sandboxes,
//! which cost money, and takes minutes: a lifetime is at least one of Daytona's minutes.

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::Provider;
use agentbox_providers::daytona::{DaytonaOptions, DaytonaProvider};
use agentbox_providers::helper::HelperCommand;
use agentbox_testing::conformance::{self, Options};

#[path = "common/daytona_view.rs"]
mod daytona_view;
use daytona_view::View;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daytona_boxes_on_the_real_daytona_pass_the_conformance_suite() {
    let mut opts = DaytonaOptions::from_env().expect("the Daytona variables read");
    let Some(key) = opts.api_key.clone() else {
        eprintln!(
            "\n!!!! daytona_boxes_on_the_real_daytona_pass_the_conformance_suite: DAYTONA_API_KEY unset: this test \
             did NOT run (it needs a Daytona account; see docs/daytona.md) !!!!\n"
        );
        return;
    };
    opts.runner = std::env::var_os("AGENTBOX_RUNNER").map(|p| HelperCommand {
        program: p.into(),
        args: Vec::new(),
    });
    let view = View::new(
        &opts.api_url,
        std::env::var("DAYTONA_API_KEY").as_deref().unwrap_or_default(),
    );
    drop(key);
    let make = opts.clone();
    let options = Options::new(
        "daytona-live",
        Duration::from_secs(70),
        Duration::from_secs(90),
        Arc::new(view),
    );
    let report = conformance::run(
        conformance::factory(move || {
            let o = make.clone();
            async move { Arc::new(DaytonaProvider::new(o).unwrap()) as Arc<dyn Provider> }
        }),
        options,
    )
    .await;
    report.assert_all_passed();
}

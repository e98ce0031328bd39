//! Modal boxes against the real Modal: the conformance suite, and a VM with FUSE, only where
//! `MODAL_TOKEN_ID` and `MODAL_TOKEN_SECRET` are set (see docs/modal.md). Without them it
//! says loudly that it did not run; CI has no token and runs the fake's suite
//! (`tests/modal.rs`). Its boxes belong to an app of its own (`agentbox-live-PID`, or
//! `AGENTBOX_MODAL_APP`), and the suite checks that none is left running. Sandboxes are billed
//! by the second.

#![cfg(feature = "modal")]

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{Ctx, Labels, Provider, Spec};
use agentbox_providers::modal::{ModalOptions, ModalProvider};
use agentbox_testing::conformance::{self, Options};

#[path = "common/modal_view.rs"]
mod modal_view;
use modal_view::View;

/// The options from the environment, or `None` (said loudly) where there is no token.
fn live(test: &str) -> Option<ModalOptions> {
    if std::env::var("MODAL_TOKEN_ID").is_err() || std::env::var("MODAL_TOKEN_SECRET").is_err() {
        eprintln!(
            "\n!!!! {test}: MODAL_TOKEN_ID or MODAL_TOKEN_SECRET unset: this test did NOT run (it needs a Modal \
             account; see docs/modal.md) !!!!\n"
        );
        return None;
    }
    let mut o = ModalOptions::from_env().expect("the Modal variables read");
    if std::env::var("AGENTBOX_MODAL_APP").is_err() {
        o.app = format!("agentbox-live-{}", std::process::id());
    }
    Some(o)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modal_boxes_on_the_real_modal_pass_the_conformance_suite() {
    let Some(o) = live("modal_boxes_on_the_real_modal_pass_the_conformance_suite") else {
        return;
    };
    let view = View::new(
        &o.server_url,
        o.token_id.as_deref().unwrap(),
        &std::env::var("MODAL_TOKEN_SECRET").unwrap(),
    );
    let make = o.clone();
    let report = conformance::run(
        conformance::factory(move || {
            let o = make.clone();
            async move { Arc::new(ModalProvider::new(o).unwrap()) as Arc<dyn Provider> }
        }),
        Options::new(
            "modal-live",
            Duration::from_secs(20),
            Duration::from_secs(60),
            Arc::new(view),
        ),
    )
    .await;
    // Whatever the report, nothing of the suite's is left running.
    let p = ModalProvider::new(o).unwrap();
    let ctx = Ctx::background().with_timeout(Duration::from_secs(120));
    for b in p.list(&Labels::new(), &ctx).await.expect("listing the suite's app") {
        eprintln!("modal live suite: ending {} left running", b.id());
        let _ = b.destroy(&ctx).await;
    }
    report.assert_all_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_with_fuse_on_the_real_modal_reads_its_facts_in_the_box() {
    let Some(o) = live("a_vm_with_fuse_on_the_real_modal_reads_its_facts_in_the_box") else {
        return;
    };
    let p = ModalProvider::new(o).unwrap();
    let ctx = Ctx::background().with_timeout(Duration::from_secs(300));
    let spec = Spec {
        capabilities: vec!["fuse".into()],
        ..Spec::new(Duration::from_secs(120))
    };
    let b = p.create(&spec, &ctx).await.expect("a VM with FUSE");
    let f = b.facts().clone();
    b.destroy(&ctx).await.unwrap();
    assert_eq!(f.isolation, "vm");
    assert_eq!(f.fuse, Some(true));
    assert!(f.ptrace_scope.is_some(), "{f:?}");
    assert!(f.started_at_ms.is_some(), "{f:?}");
}

//! Kubernetes boxes against a real cluster: the conformance suite, only where
//! `AGENTBOX_TEST_KUBECONFIG` names a kubeconfig (see docs/kube.md). Without one it says
//! loudly that it did not run; CI has no cluster and runs the fake's suite (`tests/kube.rs`).

use std::sync::Arc;
use std::time::Duration;

use agentbox_core::Provider;
use agentbox_providers::helper::HelperCommand;
use agentbox_providers::kube::{KubeOptions, KubeProvider};
use agentbox_testing::conformance::{self, Options};

#[path = "common/kube_view.rs"]
mod kube_view;
use kube_view::ClusterView;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_boxes_on_a_live_cluster_pass_the_conformance_suite() {
    let Some(kubeconfig) = std::env::var_os("AGENTBOX_TEST_KUBECONFIG").filter(|v| !v.is_empty()) else {
        eprintln!(
            "\n!!!! kube_boxes_on_a_live_cluster_pass_the_conformance_suite: AGENTBOX_TEST_KUBECONFIG unset: \
             this test did NOT run (it needs a real cluster; see docs/kube.md) !!!!\n"
        );
        return;
    };
    let mut opts = KubeOptions {
        kubeconfig: Some(kubeconfig.into()),
        namespace: std::env::var("AGENTBOX_TEST_KUBE_NAMESPACE").unwrap_or_default(),
        ..Default::default()
    };
    if let Ok(i) = std::env::var("AGENTBOX_TEST_KUBE_IMAGE") {
        opts.image = i;
    }
    opts.runner = std::env::var_os("AGENTBOX_RUNNER").map(|p| HelperCommand {
        program: p.into(),
        args: Vec::new(),
    });
    let make = opts.clone();
    let view = ClusterView::new(opts.kubeconfig.as_deref().unwrap(), &opts.namespace).await;
    let options = Options::new(
        "kube-live",
        Duration::from_secs(20),
        Duration::from_secs(60),
        Arc::new(view),
    );
    let report = conformance::run(
        conformance::factory(move || {
            let o = make.clone();
            async move { Arc::new(KubeProvider::new(o).await.unwrap()) as Arc<dyn Provider> }
        }),
        options,
    )
    .await;
    report.assert_all_passed();
}

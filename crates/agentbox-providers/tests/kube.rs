//! Kubernetes boxes against the repository's fake API server (`agentbox-fakes`), whose pods
//! really run in namespace boxes and whose API kubectl and the `kubernetes` Python client
//! judge (in `judged` below): the conformance suite with and without the runner,
//! over v5 and v4 exec, and what is kube's own (the pod as the cluster holds it, network
//! policies proven from inside, throttling, extend against the backstop, the sweep of ended
//! pods, port-forward, pools).
//!
//! All of Kubernetes's proof is in this file: `view` reads Kubernetes from outside the provider;
//! the suites at the top run on the fake; `judged` holds the fake to kubectl and the `kubernetes`
//! Python client; `live` runs the conformance suite on the real Kubernetes, where
//! `AGENTBOX_TEST_KUBECONFIG` names a cluster.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use agentbox_core::{
    Ctx, ErrorCode, Labels, Lifecycle, Mount, Network, NetworkFact, PortKind, PortSpec, Provider, Spec,
};
use agentbox_fakes::kube::{FakeKube, FakeKubeOptions};
use agentbox_providers::helper::HelperCommand;
use agentbox_providers::kube::{KubeOptions, KubeProvider};
use agentbox_providers::pool::{Pool, PoolOptions};
use agentbox_testing::conformance::{self, Options, Outside};

use agentbox_testing::services::rootfs;
use agentbox_testing::sh;
use view::ClusterView;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn ctx() -> Ctx {
    Ctx::background().with_timeout(Duration::from_secs(120))
}

/// The fake's and the provider's logs at debug, in the test's captured output: a failing
/// test shows what the API server and the provider did.
fn logs() {
    use tracing_subscriber::prelude::*;
    let only: tracing_subscriber::filter::Targets = "agentbox_fakes=debug,agentbox_providers=debug"
        .parse()
        .expect("a filter");
    let _ = tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_test_writer())
        .with(only)
        .try_init();
}

/// The fake cluster, its pods on the test rootfs; `None` (after a loud notice, or a panic
/// under CI) where this machine has none.
async fn cluster(test: &str, tune: impl FnOnce(&mut FakeKubeOptions)) -> Option<FakeKube> {
    logs();
    let rootfs = rootfs(test)?;
    let mut o = FakeKubeOptions {
        rootfs: Some(rootfs.into()),
        ..Default::default()
    };
    tune(&mut o);
    Some(FakeKube::start(o).await.expect("the fake API server starts"))
}

/// The fake cluster with kubernetes-sigs/agent-sandbox's resources and controllers.
async fn sandbox_cluster(test: &str) -> Option<FakeKube> {
    cluster(test, |o| o.agent_sandbox = true).await
}

/// Whether `cond` holds within `tries` checks `every` apart.
async fn eventually<F, Fut>(tries: u32, every: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..tries {
        if cond().await {
            return true;
        }
        tokio::time::sleep(every).await;
    }
    false
}

/// The static runner the pods get (`AGENTBOX_RUNNER`, as scripts/test exports it).
fn runner() -> Option<HelperCommand> {
    std::env::var_os("AGENTBOX_RUNNER").map(|p| HelperCommand {
        program: p.into(),
        args: Vec::new(),
    })
}

fn options(fake: &FakeKube) -> KubeOptions {
    KubeOptions {
        kubeconfig: Some(fake.kubeconfig().to_path_buf()),
        start_timeout: Duration::from_secs(60),
        ..Default::default()
    }
}

/// The NetworkPolicies in the fake's `default` namespace, read over the API.
async fn policies(fake: &FakeKube) -> usize {
    let kc = kube::config::Kubeconfig::read_from(fake.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let api: kube::Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
        kube::Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
    api.list(&Default::default()).await.unwrap().items.len()
}

async fn provider(opts: KubeOptions) -> Arc<dyn Provider> {
    Arc::new(KubeProvider::new(opts).await.expect("the kubeconfig reads"))
}

async fn conformance_against(test: &str, tune: fn(&mut FakeKubeOptions), with_runner: bool) {
    conformance_against_with(test, tune, if with_runner { with_the_runner } else { |_| {} }).await;
}

fn with_the_runner(o: &mut KubeOptions) {
    o.runner = Some(runner().expect("AGENTBOX_RUNNER names the static runner (scripts/test exports it)"));
}

async fn conformance_against_with(test: &str, tune: fn(&mut FakeKubeOptions), opt: fn(&mut KubeOptions)) {
    let Some(fake) = cluster(test, tune).await else { return };
    let mut opts = options(&fake);
    opt(&mut opts);
    let outside = Arc::new(ClusterView::new(fake.kubeconfig(), "default").await);
    let options = Options::new("kube", Duration::from_secs(5), Duration::from_secs(10), outside);
    let report = conformance::run(
        conformance::factory(move || {
            let opts = opts.clone();
            async move { provider(opts).await }
        }),
        options,
    )
    .await;
    report.assert_all_passed();
    drop(fake);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_boxes_pass_the_conformance_suite() {
    conformance_against("kube_boxes_pass_the_conformance_suite", |_| {}, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_boxes_with_the_runner_pass_the_conformance_suite() {
    conformance_against("kube_boxes_with_the_runner_pass_the_conformance_suite", |_| {}, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_boxes_over_v4_exec_pass_the_conformance_suite() {
    // A server without v5 cannot end a program's stdin: uploads go as a tar whose end tar
    // reads, and the runner, once copied that way, carries the rest.
    conformance_against(
        "kube_boxes_over_v4_exec_pass_the_conformance_suite",
        |o| o.v5 = false,
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_as_the_cluster_holds_it_is_hardened_and_the_facts_say_so() {
    let Some(fake) = cluster(
        "the_pod_as_the_cluster_holds_it_is_hardened_and_the_facts_say_so",
        |_| {},
    )
    .await
    else {
        return;
    };
    let p = provider(KubeOptions {
        runtime_class: Some("gvisor".into()),
        ..options(&fake)
    })
    .await;
    let spec = Spec {
        cpus: Some(0.5),
        memory_mb: Some(256),
        ..Spec::new(Duration::from_secs(60))
    }
    .label("team", "infra");
    let b = p.create(&spec, &ctx()).await.unwrap();
    let view = ClusterView::new(fake.kubeconfig(), "default").await;
    let pod = view.pod(b.id()).await.expect("the pod exists");
    let s = pod.spec.as_ref().unwrap();
    assert_eq!(s.restart_policy.as_deref(), Some("Never"));
    assert_eq!(s.automount_service_account_token, Some(false));
    assert_eq!(s.enable_service_links, Some(false));
    assert_eq!(s.runtime_class_name.as_deref(), Some("gvisor"));
    assert_eq!(s.active_deadline_seconds, Some(24 * 3600));
    let c = &s.containers[0];
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(
        sc.capabilities.as_ref().unwrap().drop.as_deref(),
        Some(&["ALL".to_string()][..])
    );
    let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert_eq!(limits["cpu"].0, "500m");
    assert_eq!(limits["memory"].0, "256Mi");
    let labels = pod.metadata.labels.as_ref().unwrap();
    assert_eq!(labels["team"], "infra");
    assert_eq!(labels["agentbox.provider"], "kube");

    let f = b.facts();
    assert_eq!(f.isolation, "gvisor");
    assert_eq!(f.capabilities.as_deref(), Some("none"));
    assert_eq!(f.no_new_privs, Some(true));
    assert_eq!(f.root_mode.as_deref(), Some("read-only"));
    assert_eq!(f.cpus, Some(0.5));
    assert_eq!(f.memory_mb, Some(256));
    assert!(f.ends_at_ms.is_some());
    // The deadline the first process reads is the pod's annotation, through the downward API.
    let out = sh(b.as_ref(), "cat /agentbox-deadline/ends-at-ms").await;
    assert_eq!(out.stdout_text().trim(), f.ends_at_ms.unwrap().to_string().as_str());
    // The root is read-only; the workspace, home and /tmp are not.
    let out = sh(
        b.as_ref(),
        "touch /etc/x 2>/dev/null && echo wrote; touch /workspace/a /tmp/b $HOME/c && echo ok",
    )
    .await;
    assert_eq!(out.stdout_text().trim(), "ok", "{}", out.stderr_text());
    b.destroy(&ctx()).await.unwrap();
    assert!(view.pod(b.id()).await.is_none(), "destroy deletes the pod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn specs_a_pod_cannot_honour_are_refused_naming_the_field() {
    let Some(fake) = cluster("specs_a_pod_cannot_honour_are_refused_naming_the_field", |_| {}).await else {
        return;
    };
    let p = provider(options(&fake)).await;
    let base = Spec::new(Duration::from_secs(60));
    let cases: Vec<(Spec, &str, ErrorCode)> = vec![
        (
            Spec {
                mounts: vec![Mount {
                    source: "/tmp".into(),
                    target: "/mnt".into(),
                    read_only: true,
                }],
                ..base.clone()
            },
            "spec.mounts",
            ErrorCode::Unsupported,
        ),
        (
            Spec {
                ports: vec![PortSpec {
                    port: 443,
                    kind: PortKind::Https,
                }],
                ..base.clone()
            },
            "spec.ports",
            ErrorCode::Unsupported,
        ),
        (
            Spec {
                network: Some(Network::Allow(vec!["example.com".into()])),
                ..base.clone()
            },
            "spec.network",
            ErrorCode::Unsupported,
        ),
        (base.clone().label("team", "has space"), "team", ErrorCode::Invalid),
        (
            Spec::new(Duration::from_secs(25 * 3600)),
            "spec.max_lifetime",
            ErrorCode::Invalid,
        ),
        (
            Spec {
                isolation: Some("vm".into()),
                ..base.clone()
            },
            "spec.isolation",
            ErrorCode::Unsupported,
        ),
    ];
    for (spec, field, code) in cases {
        let e = p
            .create(&spec, &ctx())
            .await
            .err()
            .unwrap_or_else(|| panic!("{field}: made"));
        assert_eq!(e.code(), code, "{field}: {e}");
        assert!(e.message().contains(field), "{field}: {e}");
    }
    assert!(fake.pods().is_empty(), "a refused spec makes no pod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_none_is_a_policy_proven_from_inside_the_pod() {
    let test = "network_none_is_a_policy_proven_from_inside_the_pod";
    let Some(fake) = cluster(test, |_| {}).await else {
        return;
    };
    let p = provider(options(&fake)).await;
    let spec = Spec {
        network: Some(Network::None),
        ..Spec::new(Duration::from_secs(60))
    };
    let b = p.create(&spec, &ctx()).await.unwrap();
    assert_eq!(b.facts().network, Some(NetworkFact::None));
    assert_eq!(policies(&fake).await, 1, "one deny-all policy for the box");
    assert!(
        fake.pods()[0].isolated,
        "the fake made the pod's box with loopback only"
    );
    // Found again, the box still says what was proven.
    let again = p.attach(b.id(), &ctx()).await.unwrap().unwrap();
    assert_eq!(again.facts().network, Some(NetworkFact::None));
    b.destroy(&ctx()).await.unwrap();
    assert_eq!(policies(&fake).await, 0, "destroy deleted the box's policy");
    drop(fake);

    // A CNI that ignores policies: the probe reaches out, and the box is refused, not made.
    let Some(fake) = cluster(test, |o| o.network_policy = false).await else {
        return;
    };
    let p = provider(options(&fake)).await;
    let e = p.create(&spec, &ctx()).await.expect_err("refused");
    assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
    assert!(e.message().contains("does not enforce NetworkPolicies"), "{e}");
    assert!(fake.pods().is_empty(), "the refused box's pod was deleted");
    assert_eq!(policies(&fake).await, 0, "and its policy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttling_api_server_is_waited_out() {
    let Some(fake) = cluster("a_throttling_api_server_is_waited_out", |_| {}).await else {
        return;
    };
    let p = provider(options(&fake)).await;
    fake.throttle(3);
    let b = p.create(&Spec::new(Duration::from_secs(60)), &ctx()).await.unwrap();
    assert_eq!(sh(b.as_ref(), "echo hi").await.stdout_text(), "hi\n");
    b.destroy(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_moves_the_deadline_up_to_the_backstop_and_an_earlier_one_lowers_it() {
    let Some(fake) = cluster(
        "extend_moves_the_deadline_up_to_the_backstop_and_an_earlier_one_lowers_it",
        |_| {},
    )
    .await
    else {
        return;
    };
    let p = provider(KubeOptions {
        max_lifetime: Duration::from_secs(120),
        ..options(&fake)
    })
    .await;
    let b = p.create(&Spec::new(Duration::from_secs(30)), &ctx()).await.unwrap();
    let now = now_ms();
    // Later, within the backstop: the first process reads the new deadline.
    let later = now + 90_000;
    let b2 = p.extend(b.id(), later, &ctx()).await.unwrap();
    assert_eq!(b2.facts().ends_at_ms, Some(later));
    assert_eq!(
        sh(b2.as_ref(), "cat /agentbox-deadline/ends-at-ms")
            .await
            .stdout_text()
            .trim(),
        later.to_string()
    );
    // Past the backstop: refused, naming it.
    let e = p.extend(b.id(), now + 600_000, &ctx()).await.err().unwrap();
    assert_eq!(e.code(), ErrorCode::Invalid, "{e}");
    assert!(e.message().contains("activeDeadlineSeconds"), "{e}");
    // Earlier: the pod's activeDeadlineSeconds falls with it, and the box ends then.
    let soon = now_ms() + 3_000;
    p.extend(b.id(), soon, &ctx()).await.unwrap();
    let view = ClusterView::new(fake.kubeconfig(), "default").await;
    let pod = view.pod(b.id()).await.unwrap();
    assert!(pod.spec.unwrap().active_deadline_seconds.unwrap() < 120);
    let ended = eventually(100, Duration::from_millis(200), || view.ended(b.id())).await;
    assert!(ended, "the box ended at its earlier deadline");
    // The ended pod is deleted by the next list.
    assert!(p.list(&Labels::new(), &ctx()).await.unwrap().is_empty());
    assert!(view.pod(b.id()).await.is_none(), "list deleted the ended pod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_of_the_pod_is_reached_by_port_forward() {
    let Some(fake) = cluster("a_port_of_the_pod_is_reached_by_port_forward", |_| {}).await else {
        return;
    };
    let p = provider(KubeOptions {
        runner: Some(runner().expect("AGENTBOX_RUNNER names the static runner")),
        ..options(&fake)
    })
    .await;
    let b = p.create(&Spec::new(Duration::from_secs(60)), &ctx()).await.unwrap();
    // An HTTP server in the pod: the runner's own listener (it answers any request).
    let port = 17000 + (std::process::id() % 1000) as u16;
    let out = sh(
        b.as_ref(),
        &format!("/agentbox/agentbox-runner serve --listen 127.0.0.1:{port} --detach </dev/null"),
    )
    .await;
    assert_eq!(out.status.code, 0, "{}", out.stderr_text());
    let e = b.endpoint(port, &ctx()).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect((e.host.as_str(), e.port)).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut got = vec![0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert!(
        got[..n].starts_with(b"HTTP/1.1 "),
        "{:?}",
        String::from_utf8_lossy(&got[..n])
    );
    b.destroy(&ctx()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pool_hands_out_pods() {
    let Some(fake) = cluster("a_warm_pool_hands_out_pods", |_| {}).await else {
        return;
    };
    let inner = provider(options(&fake)).await;
    let spec = Spec::new(Duration::from_secs(120));
    let pool = Pool::new(
        inner.clone(),
        spec.clone(),
        PoolOptions {
            size: 1,
            ..Default::default()
        },
    )
    .unwrap();
    pool.warm(&ctx()).await.unwrap();
    let ready = fake.pods();
    assert_eq!(ready.len(), 1, "one ready pod");
    let b = pool.create(&spec.clone().label("who", "me"), &ctx()).await.unwrap();
    assert_eq!(b.labels().get("who").map(String::as_str), Some("me"));
    assert!(
        ready.iter().any(|p| b.id().as_str().ends_with(p.name.as_str())),
        "the ready pod was handed out"
    );
    assert_eq!(sh(b.as_ref(), "echo pooled").await.stdout_text(), "pooled\n");
    b.destroy(&ctx()).await.unwrap();
    pool.close(&ctx()).await.unwrap();
}

// The agent-sandbox mode: the fake serves kubernetes-sigs/agent-sandbox's resources and runs
// their controllers as the real ones do (agentbox-fakes' docs say how far).

fn agent_sandbox(fake: &FakeKube) -> KubeOptions {
    KubeOptions {
        agent_sandbox: true,
        ..options(fake)
    }
}

/// An agent-sandbox resource of the fake's `default` namespace, read over the API.
async fn resource(
    fake: &FakeKube,
    group: &str,
    kind: &str,
    plural: &str,
    name: &str,
) -> Option<kube::api::DynamicObject> {
    let kc = kube::config::Kubeconfig::read_from(fake.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let ar =
        kube::api::ApiResource::from_gvk_with_plural(&kube::api::GroupVersionKind::gvk(group, "v1beta1", kind), plural);
    let api: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(kube::Client::try_from(config).unwrap(), "default", &ar);
    api.get_opt(name).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_boxes_through_agent_sandbox_pass_the_conformance_suite() {
    conformance_against_with(
        "kube_boxes_through_agent_sandbox_pass_the_conformance_suite",
        |o| o.agent_sandbox = true,
        |o| o.agent_sandbox = true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_sandbox_mode_is_refused_where_the_cluster_has_none() {
    let Some(fake) = cluster("agent_sandbox_mode_is_refused_where_the_cluster_has_none", |_| {}).await else {
        return;
    };
    let e = KubeProvider::new(agent_sandbox(&fake)).await.err().expect("refused");
    assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
    assert!(e.message().contains("agents.x-k8s.io/v1beta1"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_owns_the_box_pod_and_destroy_ends_both() {
    let Some(fake) = sandbox_cluster("a_sandbox_owns_the_box_pod_and_destroy_ends_both").await else {
        return;
    };
    let p = provider(agent_sandbox(&fake)).await;
    let b = p
        .create(&Spec::new(Duration::from_secs(60)).label("team", "a"), &ctx())
        .await
        .unwrap();
    let pod_name = b.id().name().split_once(':').unwrap().1.to_string();
    let sb = resource(&fake, "agents.x-k8s.io", "Sandbox", "sandboxes", &pod_name)
        .await
        .expect("a Sandbox of the box's name");
    assert!(
        sb.data["spec"]["shutdownTime"].is_string(),
        "the Sandbox ends at the deadline too: {:?}",
        sb.data["spec"]
    );
    let view = ClusterView::new(fake.kubeconfig(), "default").await;
    let pod = view.pod(b.id()).await.expect("its pod");
    assert!(
        pod.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "Sandbox" && o.name == pod_name),
        "the Sandbox owns the pod"
    );
    assert!(
        b.facts()
            .limits
            .get("controller")
            .is_some_and(|c| c.contains("Sandbox")),
        "{:?}",
        b.facts().limits
    );
    assert_eq!(
        sh(b.as_ref(), "echo in-a-sandbox").await.stdout_text(),
        "in-a-sandbox\n"
    );
    // Extend moves the controller's end as well as the first process's.
    let later = now_ms() + 120_000;
    p.extend(b.id(), later, &ctx()).await.unwrap();
    let sb = resource(&fake, "agents.x-k8s.io", "Sandbox", "sandboxes", &pod_name)
        .await
        .unwrap();
    let at = sb.data["spec"]["shutdownTime"].as_str().unwrap().to_string();
    let at_ms = k8s_openapi::jiff::Timestamp::from_str(&at).unwrap().as_millisecond() as u64;
    assert!(
        at_ms >= later && at_ms < later + 1000,
        "shutdownTime {at} is the new deadline"
    );
    b.destroy(&ctx()).await.unwrap();
    assert!(
        resource(&fake, "agents.x-k8s.io", "Sandbox", "sandboxes", &pod_name)
            .await
            .is_none(),
        "the Sandbox is gone"
    );
    // The controller would make a deleted pod again under a live Sandbox: it must not.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(view.pod(b.id()).await.is_none(), "the pod is gone and stays gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_pool_hands_out_a_warm_pod_and_refills() {
    let Some(fake) = sandbox_cluster("a_claim_pool_hands_out_a_warm_pod_and_refills").await else {
        return;
    };
    let p = Arc::new(KubeProvider::new(agent_sandbox(&fake)).await.unwrap());
    let spec = Spec::new(Duration::from_secs(300));
    let pool = p.claim_pool(&spec, 2, &ctx()).await.unwrap();
    let running = |fake: &FakeKube| fake.pods().iter().filter(|p| p.phase == "Running").count();
    eventually(300, Duration::from_millis(100), || async { running(&fake) >= 2 }).await;
    assert_eq!(running(&fake), 2, "the controller keeps two ready");
    // Ready pods are no boxes yet.
    assert!(p.list(&Labels::new(), &ctx()).await.unwrap().is_empty());
    let warm: Vec<String> = fake.pods().into_iter().map(|p| p.name).collect();
    let b = pool.create(&spec.clone().label("who", "me"), &ctx()).await.unwrap();
    let pod_name = b.id().name().split_once(':').unwrap().1.to_string();
    assert!(
        warm.contains(&pod_name),
        "a ready pod was claimed: {pod_name} not in {warm:?}"
    );
    assert_eq!(b.labels().get("who").map(String::as_str), Some("me"));
    let ends = b.facts().ends_at_ms.unwrap();
    assert!(ends > now_ms() + 200_000, "the claim's deadline: {ends}");
    assert_eq!(
        sh(b.as_ref(), "cat /agentbox-deadline/ends-at-ms")
            .await
            .stdout_text()
            .trim(),
        ends.to_string(),
        "the first process reads the claim's deadline"
    );
    let listed = p
        .list(&[("who".to_string(), "me".to_string())].into(), &ctx())
        .await
        .unwrap();
    assert_eq!(listed.len(), 1, "the claimed box is listed by its labels");
    // The pool refills.
    eventually(300, Duration::from_millis(100), || async { running(&fake) >= 3 }).await;
    assert_eq!(running(&fake), 3, "two ready again beside the claimed one");

    // A claimed box's labels live in its claim's domain: a prefixed key is refused unwritten.
    let e = p
        .relabel(b.id(), &[("a/b".to_string(), "x".to_string())].into(), &ctx())
        .await
        .expect_err("refused");
    assert_eq!(e.code(), ErrorCode::Invalid, "{e}");
    assert_eq!(
        p.attach(b.id(), &ctx())
            .await
            .unwrap()
            .unwrap()
            .labels()
            .get("who")
            .map(String::as_str),
        Some("me")
    );

    // Closing the pool while a box is claimed empties it but keeps it (the claim controller
    // reaches the box's template through it), so extend and relabel still work.
    pool.close(&ctx()).await.unwrap();
    let kept = resource(
        &fake,
        "extensions.agents.x-k8s.io",
        "SandboxWarmPool",
        "sandboxwarmpools",
        pool.name(),
    )
    .await
    .expect("the pool is kept while a claim names it");
    assert_eq!(kept.data["spec"]["replicas"], 0);
    let later = now_ms() + 250_000;
    let b2 = p.extend(b.id(), later, &ctx()).await.unwrap();
    assert_eq!(b2.facts().ends_at_ms, Some(later));
    assert_eq!(
        sh(b2.as_ref(), "cat /agentbox-deadline/ends-at-ms")
            .await
            .stdout_text()
            .trim(),
        later.to_string()
    );
    let b3 = p
        .relabel(b.id(), &[("who".to_string(), "you".to_string())].into(), &ctx())
        .await
        .unwrap();
    assert_eq!(b3.labels(), &[("who".to_string(), "you".to_string())].into());
    b.destroy(&ctx()).await.unwrap();
    pool.close(&ctx()).await.unwrap();
    assert!(
        resource(
            &fake,
            "extensions.agents.x-k8s.io",
            "SandboxWarmPool",
            "sandboxwarmpools",
            pool.name()
        )
        .await
        .is_none(),
        "with no claim left, close deletes the pool"
    );
    eventually(100, Duration::from_millis(100), || async { fake.pods().is_empty() }).await;
    assert!(
        fake.pods().is_empty(),
        "closing the pool ends its ready pods: {:?}",
        fake.pods()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_boxes_network_policy_goes_with_it_at_its_deadline() {
    let Some(fake) = sandbox_cluster("a_sandbox_boxes_network_policy_goes_with_it_at_its_deadline").await else {
        return;
    };
    let p = provider(agent_sandbox(&fake)).await;
    let spec = Spec {
        network: Some(Network::None),
        ..Spec::new(Duration::from_secs(4))
    };
    let b = p.create(&spec, &ctx()).await.unwrap();
    assert_eq!(b.facts().network, Some(NetworkFact::None));
    assert_eq!(policies(&fake).await, 1);
    // No host call from here: the controller ends the Sandbox, and its policy follows it.
    drop(b);
    let gone = eventually(150, Duration::from_millis(100), || async { policies(&fake).await == 0 }).await;
    assert!(gone, "the box's policy outlived its Sandbox");
}

mod view {
    //! The cluster seen from outside the provider, shared by the fake's and the live suites.

    use agentbox_core::SandboxId;
    use agentbox_testing::conformance::Outside;
    use async_trait::async_trait;
    use k8s_openapi::api::core::v1::Pod;
    use kube::Api;

    /// The cluster as seen by kube-rs directly, not through the provider: a box has ended when
    /// its pod is gone or no longer runs; a pid is alive while `/proc/PID/stat` in the pod says
    /// so (an exec of kube-rs's own, not the provider's).
    pub(crate) struct ClusterView {
        pods: Api<Pod>,
    }

    impl ClusterView {
        /// Over the cluster of `kubeconfig`, in `namespace` (empty: the context's).
        pub(crate) async fn new(kubeconfig: &std::path::Path, namespace: &str) -> Self {
            let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
            let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .unwrap();
            let ns = if namespace.is_empty() {
                config.default_namespace.clone()
            } else {
                namespace.to_string()
            };
            let client = kube::Client::try_from(config).unwrap();
            ClusterView {
                pods: Api::namespaced(client, &ns),
            }
        }

        /// The box's pod, where it exists.
        pub(crate) async fn pod(&self, id: &SandboxId) -> Option<Pod> {
            let name = id.name().split_once(':').map(|(_, p)| p.to_string())?;
            self.pods.get_opt(&name).await.unwrap()
        }
    }

    #[async_trait]
    impl Outside for ClusterView {
        async fn ended(&self, id: &SandboxId) -> bool {
            match self.pod(id).await {
                None => true,
                Some(p) => !matches!(
                    p.status.and_then(|s| s.phase).as_deref(),
                    Some("Running") | Some("Pending")
                ),
            }
        }

        async fn any_alive(&self, id: &SandboxId, pids: &[u32]) -> bool {
            if self.ended(id).await {
                return false;
            }
            let name = id.name().split_once(':').map(|(_, p)| p.to_string()).unwrap();
            for pid in pids {
                let script = format!("sed -n 's/.*) \\(.\\).*/\\1/p' /proc/{pid}/stat 2>/dev/null");
                let ap = kube::api::AttachParams::default().stderr(false);
                let mut p = match self.pods.exec(&name, ["sh", "-c", &script], &ap).await {
                    Ok(p) => p,
                    // A pod that ended meanwhile runs nothing (its container can be gone a moment
                    // before its phase says so: the phase is given five seconds to); any other
                    // failure is the view's, and must not read as "not alive".
                    Err(e) => {
                        for _ in 0..20 {
                            if self.ended(id).await {
                                return false;
                            }
                            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                        }
                        panic!("outside: an exec in pod {name} to read /proc/{pid}/stat failed: {e}")
                    }
                };
                let mut out = String::new();
                if let Some(mut o) = p.stdout() {
                    use tokio::io::AsyncReadExt;
                    let _ = o.read_to_string(&mut out).await;
                }
                let _ = p.join().await;
                let s = out.trim();
                if !s.is_empty() && s != "Z" && s != "X" {
                    return true;
                }
            }
            false
        }
    }
}

mod judged {
    //! The judges: kubectl 1.35 and the `kubernetes` Python client, which nobody here wrote,
    //! against the fake (over TLS, as kubectl needs). Where they and the fake disagree, the fake
    //! is wrong. `scripts/kube-clients` installs both; `scripts/test` exports their paths as
    //! `AGENTBOX_TEST_KUBECTL` and `AGENTBOX_TEST_KUBE_PYTHON`.

    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use agentbox_fakes::kube::{FakeKube, FakeKubeOptions};
    use serde_json::Value;

    const WAIT: Duration = Duration::from_secs(30);

    /// A path from `var`, or `None` after the loud notice (a failure under CI).
    fn tool(var: &str, test: &str) -> Option<PathBuf> {
        agentbox_testing::services::path_from(var, "scripts/kube-clients", test)
    }

    async fn fake(test: &str, v5: bool) -> Option<FakeKube> {
        fake_with(test, v5, false).await
    }

    async fn fake_with(test: &str, v5: bool, agent_sandbox: bool) -> Option<FakeKube> {
        let rootfs = agentbox_testing::services::rootfs(test)?;
        Some(
            FakeKube::start(FakeKubeOptions {
                rootfs: Some(rootfs.into()),
                runner: Some(agentbox_testing::runner::ensure()),
                v5,
                agent_sandbox,
                ..Default::default()
            })
            .await
            .expect("the fake starts"),
        )
    }

    /// kubectl with the fake's kubeconfig: its exit code, stdout and stderr.
    async fn kubectl(k: &Path, kube: &FakeKube, args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
        use tokio::io::AsyncWriteExt;
        let mut child = tokio::process::Command::new(k)
            .args(args)
            .env("KUBECONFIG", kube.kubeconfig())
            .env("HOME", kube.kubeconfig().parent().unwrap())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("kubectl starts");
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).await.unwrap();
        }
        drop(input);
        let out = tokio::time::timeout(WAIT, child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} did not end within {WAIT:?}"))
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn ok(k: &Path, kube: &FakeKube, args: &[&str]) -> String {
        let (code, out, err) = kubectl(k, kube, args, None).await;
        assert_eq!(code, 0, "kubectl {args:?}: {out}{err}");
        out
    }

    const POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: judged
  labels: {k: v}
  annotations: {note: first}
spec:
  restartPolicy: Never
  securityContext: {runAsNonRoot: true, runAsUser: 1000, fsGroup: 2000}
  containers:
  - name: main
    image: debian:bookworm
    command: ["sh", "-c", "echo started; sleep 300"]
    securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
    volumeMounts:
    - {name: scratch, mountPath: /scratch}
    - {name: cache, mountPath: /tmp/cache}
    - {name: info, mountPath: /podinfo}
  volumes:
  - {name: scratch, emptyDir: {}}
  - {name: cache, emptyDir: {}}
  - name: info
    downwardAPI:
      items:
      - {path: name, fieldRef: {fieldPath: metadata.name}}
      - {path: note, fieldRef: {fieldPath: "metadata.annotations['note']"}}
      - {path: labels, fieldRef: {fieldPath: metadata.labels}}
---
apiVersion: v1
kind: Pod
metadata:
  name: other
  labels: {k: other}
spec:
  restartPolicy: Never
  containers:
  - {name: main, image: debian:bookworm, command: ["sleep", "300"]}
"#;

    const POLICY: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-egress}
spec:
  podSelector: {matchLabels: {sandbox: "true"}}
  policyTypes: [Egress]
"#;

    async fn running(kube: &FakeKube, name: &str) {
        kube.wait_phase("default", name, "Running", WAIT).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kubectl_judges_the_fake() {
        let test = "kubectl_judges_the_fake";
        let Some(k) = tool("AGENTBOX_TEST_KUBECTL", test) else {
            return;
        };
        let Some(kube) = fake(test, true).await else { return };
        let dir = kube.kubeconfig().parent().unwrap().to_path_buf();
        std::fs::write(dir.join("pod.yaml"), POD).unwrap();
        std::fs::write(dir.join("np.yaml"), POLICY).unwrap();
        let pod_yaml = dir.join("pod.yaml").to_string_lossy().into_owned();
        let np_yaml = dir.join("np.yaml").to_string_lossy().into_owned();
        let out = ok(&k, &kube, &["create", "-f", &pod_yaml]).await;
        assert!(
            out.contains("pod/judged created") && out.contains("pod/other created"),
            "{out}"
        );
        // Only the matching pod, and its security context as it was given.
        let list: Value =
            serde_json::from_str(&ok(&k, &kube, &["get", "pods", "-l", "k=v", "-o", "json"]).await).unwrap();
        let items = list["items"].as_array().unwrap();
        assert_eq!(items.len(), 1, "{list}");
        assert_eq!(items[0]["metadata"]["name"], "judged");
        assert_eq!(items[0]["spec"]["securityContext"]["runAsUser"], 1000);
        running(&kube, "judged").await;
        // An exit code, and stdin ended by v5's close.
        let (code, _, err) = kubectl(&k, &kube, &["exec", "judged", "--", "sh", "-c", "exit 3"], None).await;
        assert_eq!(code, 3, "{err}");
        let (code, out, err) = kubectl(
            &k,
            &kube,
            &["exec", "-i", "judged", "--", "cat"],
            Some("through stdin\n"),
        )
        .await;
        assert_eq!((code, out.as_str()), (0, "through stdin\n"), "{err}");
        let out = ok(
            &k,
            &kube,
            &[
                "exec",
                "judged",
                "--",
                "sh",
                "-c",
                "touch /scratch/f /tmp/cache/f && cat /podinfo/name /podinfo/note",
            ],
        )
        .await;
        assert_eq!(out, "judgedfirst");
        // Patches: get sees them, and so does the downward file in the pod.
        ok(&k, &kube, &["annotate", "pod", "judged", "note=second", "--overwrite"]).await;
        ok(&k, &kube, &["label", "pod", "judged", "extra=yes"]).await;
        let got: Value = serde_json::from_str(&ok(&k, &kube, &["get", "pod", "judged", "-o", "json"]).await).unwrap();
        assert_eq!(got["metadata"]["annotations"]["note"], "second");
        assert_eq!(got["metadata"]["labels"]["extra"], "yes");
        assert_eq!(
            ok(&k, &kube, &["exec", "judged", "--", "cat", "/podinfo/note"]).await,
            "second"
        );
        assert!(
            ok(&k, &kube, &["exec", "judged", "--", "cat", "/podinfo/labels"])
                .await
                .contains("extra=\"yes\"")
        );
        assert!(ok(&k, &kube, &["logs", "judged"]).await.contains("started"));
        // Delete waits (a watch) until the pod is gone.
        let out = ok(&k, &kube, &["delete", "pod", "judged"]).await;
        assert!(out.contains("\"judged\" deleted"), "{out}");
        let (code, _, err) = kubectl(&k, &kube, &["get", "pod", "judged"], None).await;
        assert_ne!(code, 0);
        assert!(err.contains("NotFound") || err.contains("not found"), "{err}");
        // NetworkPolicies.
        assert!(
            ok(&k, &kube, &["create", "-f", &np_yaml])
                .await
                .contains("deny-egress created")
        );
        let np: Value =
            serde_json::from_str(&ok(&k, &kube, &["get", "networkpolicy", "deny-egress", "-o", "json"]).await).unwrap();
        assert_eq!(np["spec"]["policyTypes"], serde_json::json!(["Egress"]));
        // A patch (kubectl label sends a strategic merge patch), as the provider gives a policy
        // its owner.
        assert!(
            ok(&k, &kube, &["label", "networkpolicy", "deny-egress", "owner=box"])
                .await
                .contains("labeled")
        );
        let np: Value =
            serde_json::from_str(&ok(&k, &kube, &["get", "networkpolicy", "deny-egress", "-o", "json"]).await).unwrap();
        assert_eq!(np["metadata"]["labels"]["owner"], "box");
        assert_eq!(
            np["spec"]["policyTypes"],
            serde_json::json!(["Egress"]),
            "the patch kept the rules"
        );
        assert!(ok(&k, &kube, &["delete", "-f", &np_yaml]).await.contains("deleted"));
        let (code, _, _) = kubectl(&k, &kube, &["get", "networkpolicy", "deny-egress"], None).await;
        assert_ne!(code, 0);
        kube.shutdown().await;
    }

    const STORAGE: &str = r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: judged-data}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: Secret
metadata: {name: judged-creds}
type: Opaque
stringData: {token: hunter2}
"#;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kubectl_applies_claims_and_secrets() {
        let test = "kubectl_applies_claims_and_secrets";
        let Some(k) = tool("AGENTBOX_TEST_KUBECTL", test) else {
            return;
        };
        let Some(kube) = fake(test, true).await else { return };
        let (code, out, err) = kubectl(&k, &kube, &["apply", "-f", "-"], Some(STORAGE)).await;
        assert_eq!(code, 0, "{out}{err}");
        for made in [
            "persistentvolumeclaim/judged-data created",
            "secret/judged-creds created",
        ] {
            assert!(out.contains(made), "{made} not in {out}");
        }
        // Bound at once, as a dynamic provisioner binds; found by its short name too.
        assert_eq!(
            ok(
                &k,
                &kube,
                &["get", "pvc", "judged-data", "-o", "jsonpath={.status.phase}"]
            )
            .await,
            "Bound"
        );
        assert!(
            ok(&k, &kube, &["get", "persistentvolumeclaims"])
                .await
                .contains("judged-data")
        );
        assert!(ok(&k, &kube, &["get", "secret"]).await.contains("judged-creds"));
        // stringData came back as data, base64.
        assert_eq!(
            ok(
                &k,
                &kube,
                &["get", "secret", "judged-creds", "-o", "jsonpath={.data.token}"]
            )
            .await,
            "aHVudGVyMg=="
        );
        // Applied again with a new value (a strategic merge patch: stringData is never stored, so
        // kubectl always sends it), and labels, as kubectl patches them.
        let changed = STORAGE.replace("hunter2", "hunter3");
        let (code, out, err) = kubectl(&k, &kube, &["apply", "-f", "-"], Some(&changed)).await;
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.contains("persistentvolumeclaim/judged-data unchanged"), "{out}");
        assert!(out.contains("secret/judged-creds configured"), "{out}");
        assert_eq!(
            ok(
                &k,
                &kube,
                &["get", "secret", "judged-creds", "-o", "jsonpath={.data.token}"]
            )
            .await,
            "aHVudGVyMw=="
        );
        ok(&k, &kube, &["label", "pvc", "judged-data", "judge=kubectl"]).await;
        assert_eq!(
            ok(
                &k,
                &kube,
                &[
                    "get",
                    "pvc",
                    "-l",
                    "judge=kubectl",
                    "-o",
                    "jsonpath={.items[0].status.phase}"
                ]
            )
            .await,
            "Bound"
        );
        // Delete waits (a watch) until both are gone: the claim, named by no pod, at once.
        let (code, out, err) = kubectl(&k, &kube, &["delete", "-f", "-"], Some(STORAGE)).await;
        assert_eq!(code, 0, "{out}{err}");
        assert!(
            out.contains("\"judged-data\" deleted") && out.contains("\"judged-creds\" deleted"),
            "{out}"
        );
        let (code, _, err) = kubectl(&k, &kube, &["get", "pvc", "judged-data"], None).await;
        assert_ne!(code, 0);
        assert!(err.contains("NotFound") || err.contains("not found"), "{err}");
        kube.shutdown().await;
    }

    /// A Deployment whose selector does not select its own pods.
    const MISMATCHED: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: mismatched}
spec:
  selector: {matchLabels: {app: one}}
  template:
    metadata: {labels: {app: other}}
    spec:
      containers: [{name: main, image: debian:bookworm}]
"#;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kubectl_applies_the_servers_deployment() {
        let test = "kubectl_applies_the_servers_deployment";
        let Some(k) = tool("AGENTBOX_TEST_KUBECTL", test) else {
            return;
        };
        let Some(kube) = fake(test, true).await else { return };
        // The manifests `agentbox serve` is deployed with, as a user applies them.
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/kubernetes");
        let objects = [
            "serviceaccount/agentbox",
            "role.rbac.authorization.k8s.io/agentbox",
            "rolebinding.rbac.authorization.k8s.io/agentbox",
            "secret/agentbox-postgres",
            "deployment.apps/agentbox",
            "service/agentbox",
        ];
        let out = ok(&k, &kube, &["apply", "-f", dir]).await;
        for o in objects {
            assert!(out.contains(&format!("{o} created")), "{o} not created: {out}");
        }
        // Applied again: nothing to change but the Secret, whose stringData is never stored (so
        // kubectl always sends it). Everything else came back as it was applied.
        let out = ok(&k, &kube, &["apply", "-f", dir]).await;
        for o in objects {
            let said = if o.starts_with("secret/") {
                "configured"
            } else {
                "unchanged"
            };
            assert!(out.contains(&format!("{o} {said}")), "{o} not {said}: {out}");
        }
        let d: Value =
            serde_json::from_str(&ok(&k, &kube, &["get", "deployment", "agentbox", "-o", "json"]).await).unwrap();
        assert_eq!(d["spec"]["replicas"], 2, "{d}");
        assert_eq!(d["spec"]["template"]["spec"]["serviceAccountName"], "agentbox", "{d}");
        assert_eq!(
            d["metadata"]["generation"], 1,
            "an unchanged apply is no new generation: {d}"
        );
        assert_eq!(d["spec"]["strategy"]["type"], "RollingUpdate", "defaulted: {d}");
        let svc: Value = serde_json::from_str(&ok(&k, &kube, &["get", "svc", "agentbox", "-o", "json"]).await).unwrap();
        assert!(
            svc["spec"]["clusterIP"]
                .as_str()
                .is_some_and(|ip| ip.starts_with("10.96.")),
            "{svc}"
        );
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], "https", "{svc}");
        let listed = ok(
            &k,
            &kube,
            &["get", "serviceaccount,service,role,rolebinding,deployment"],
        )
        .await;
        for o in objects.iter().filter(|o| !o.starts_with("secret/")) {
            assert!(listed.contains(o), "{o} not listed: {listed}");
        }
        // What the real server refuses, it refuses here, in its words (kubectl writes "The
        // Deployment ... is invalid" only of a 422 Invalid with causes), and makes nothing.
        let (code, out, err) = kubectl(&k, &kube, &["apply", "-f", "-"], Some(MISMATCHED)).await;
        assert_ne!(code, 0, "{out}{err}");
        assert!(
            err.contains(r#"The Deployment "mismatched" is invalid: spec.template.metadata.labels: Invalid value: {"app":"other"}: `selector` does not match template `labels`"#),
            "{err}"
        );
        let (code, _, err) = kubectl(&k, &kube, &["get", "deployment", "mismatched"], None).await;
        assert_ne!(code, 0);
        assert!(err.contains("NotFound") || err.contains("not found"), "{err}");
        // Delete waits (a watch) until each is gone.
        let out = ok(&k, &kube, &["delete", "-f", dir]).await;
        assert_eq!(out.matches("\"agentbox\" deleted").count(), 5, "{out}");
        assert!(out.contains("\"agentbox-postgres\" deleted"), "{out}");
        let (code, out, err) = kubectl(
            &k,
            &kube,
            &["get", "serviceaccount,service,role,rolebinding,deployment,secret"],
            None,
        )
        .await;
        assert_eq!((code, out.as_str()), (0, ""), "{err}");
        assert!(err.contains("No resources found"), "{err}");
        kube.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kubectl_without_v5_falls_back_to_spdy_which_the_fake_refuses() {
        // kubectl 1.35 asks only v5.channel.k8s.io of a WebSocket and falls back to SPDY, not to
        // v4, on a server without it; the fake speaks no SPDY and says so. This pins that gap.
        let test = "kubectl_without_v5_falls_back_to_spdy_which_the_fake_refuses";
        let Some(k) = tool("AGENTBOX_TEST_KUBECTL", test) else {
            return;
        };
        let Some(kube) = fake(test, false).await else { return };
        let dir = kube.kubeconfig().parent().unwrap().to_path_buf();
        std::fs::write(dir.join("pod.yaml"), POD).unwrap();
        ok(&k, &kube, &["create", "-f", &dir.join("pod.yaml").to_string_lossy()]).await;
        running(&kube, "other").await;
        let (code, _, err) = kubectl(&k, &kube, &["exec", "other", "--", "true"], None).await;
        assert_ne!(code, 0);
        assert!(err.contains("no SPDY"), "{err}");
        kube.shutdown().await;
    }

    const SANDBOX: &str = r#"
apiVersion: agents.x-k8s.io/v1beta1
kind: Sandbox
metadata:
  name: judged
spec:
  podTemplate:
    metadata:
      labels: {app: judged}
    spec:
      restartPolicy: Never
      containers:
      - {name: main, image: debian:bookworm, command: ["sleep", "300"]}
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata:
  name: tmpl
spec:
  networkPolicyManagement: Unmanaged
  podTemplate:
    spec:
      restartPolicy: Never
      containers:
      - {name: main, image: debian:bookworm, command: ["sleep", "300"]}
---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata:
  name: pool
spec:
  replicas: 1
  sandboxTemplateRef: {name: tmpl}
"#;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kubectl_judges_agent_sandbox_mode() {
        let test = "kubectl_judges_agent_sandbox_mode";
        let Some(k) = tool("AGENTBOX_TEST_KUBECTL", test) else {
            return;
        };
        let Some(kube) = fake_with(test, true, true).await else {
            return;
        };
        let dir = kube.kubeconfig().parent().unwrap().to_path_buf();
        std::fs::write(dir.join("sandbox.yaml"), SANDBOX).unwrap();
        let file = dir.join("sandbox.yaml").to_string_lossy().into_owned();
        let out = ok(&k, &kube, &["create", "-f", &file]).await;
        for made in [
            "sandbox.agents.x-k8s.io/judged created",
            "sandboxtemplate.extensions.agents.x-k8s.io/tmpl created",
            "sandboxwarmpool.extensions.agents.x-k8s.io/pool created",
        ] {
            assert!(out.contains(made), "{made} not in {out}");
        }
        running(&kube, "judged").await;
        let list: Value = serde_json::from_str(&ok(&k, &kube, &["get", "sandboxes", "-o", "json"]).await).unwrap();
        let names: Vec<&str> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"judged"), "{list}");
        // Ready, as the printer column's jsonpath reads it.
        let end = tokio::time::Instant::now() + WAIT;
        loop {
            let path = "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}";
            if ok(&k, &kube, &["get", "sandbox", "judged", "-o", path]).await == "True" {
                break;
            }
            assert!(tokio::time::Instant::now() < end, "the Sandbox is not Ready");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The short name, a label (a merge patch), and exec into the Sandbox's pod.
        ok(&k, &kube, &["label", "sandbox", "judged", "judge=kubectl"]).await;
        let got: Value =
            serde_json::from_str(&ok(&k, &kube, &["get", "sandbox", "-l", "judge=kubectl", "-o", "json"]).await)
                .unwrap();
        assert_eq!(got["items"][0]["metadata"]["name"], "judged", "{got}");
        let (code, out, err) = kubectl(
            &k,
            &kube,
            &["exec", "judged", "--", "sh", "-c", "echo inside; exit 3"],
            None,
        )
        .await;
        assert_eq!((code, out.as_str()), (3, "inside\n"), "{err}");
        // The pool and its member.
        let out = ok(&k, &kube, &["get", "sandboxwarmpools"]).await;
        assert!(out.contains("pool"), "{out}");
        let end = tokio::time::Instant::now() + WAIT;
        loop {
            let pool: Value =
                serde_json::from_str(&ok(&k, &kube, &["get", "swp", "pool", "-o", "json"]).await).unwrap();
            if pool["status"]["readyReplicas"] == 1 {
                break;
            }
            assert!(tokio::time::Instant::now() < end, "the pool is not ready: {pool}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Delete waits until the Sandbox is gone; its pod follows.
        let out = ok(&k, &kube, &["delete", "sandbox", "judged"]).await;
        assert!(out.contains("\"judged\" deleted"), "{out}");
        let (code, _, err) = kubectl(&k, &kube, &["get", "sandbox", "judged"], None).await;
        assert_ne!(code, 0);
        assert!(err.contains("NotFound") || err.contains("not found"), "{err}");
        let end = tokio::time::Instant::now() + WAIT;
        while kube.pod("default", "judged").is_some() {
            assert!(tokio::time::Instant::now() < end, "the Sandbox's pod outlived it");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // A 422 as kubectl prints it.
        let (code, _, err) = kubectl(
            &k,
            &kube,
            &["create", "-f", "-"],
            Some("apiVersion: agents.x-k8s.io/v1beta1\nkind: Sandbox\nmetadata: {name: bad}\nspec: {}\n"),
        )
        .await;
        assert_ne!(code, 0);
        assert!(err.contains("spec.podTemplate: Required value"), "{err}");
        kube.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_python_client_judges_agent_sandbox_mode() {
        let test = "the_python_client_judges_agent_sandbox_mode";
        let Some(py) = tool("AGENTBOX_TEST_KUBE_PYTHON", test) else {
            return;
        };
        let Some(kube) = fake_with(test, true, true).await else {
            return;
        };
        let said = run_python(&py, "kube_judge_sandbox.py", kube.kubeconfig()).await;
        for step in [
            "create-sandbox",
            "conflict-409",
            "invalid-422",
            "get-sandbox",
            "list-sandbox",
            "patch-sandbox",
            "create-claim",
            "get-claim py-pool-",
            "list-claim",
            "delete-claim",
            "delete-sandbox",
        ] {
            assert!(
                said.lines().any(|l| l == format!("OK {step}")),
                "no `OK {step}` in:\n{said}"
            );
        }
        kube.shutdown().await;
    }

    /// Run the Python judge `script` (of this crate's tests) against the fake of `kubeconfig`,
    /// within 180 s; what it printed, once it succeeded.
    async fn run_python(py: &Path, script: &str, kubeconfig: &Path) -> String {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(script);
        let out = tokio::time::timeout(
            Duration::from_secs(180),
            tokio::process::Command::new(py)
                .arg(&script)
                .env("KUBECONFIG", kubeconfig)
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("the Python judge ends within 180 s")
        .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "the Python judge failed:\n{said}\n{err}");
        said
    }

    async fn python(test: &str, v5: bool) {
        let Some(py) = tool("AGENTBOX_TEST_KUBE_PYTHON", test) else {
            return;
        };
        let Some(kube) = fake(test, v5).await else { return };
        let said = run_python(&py, "kube_judge.py", kube.kubeconfig()).await;
        let stdin_step = if v5 {
            "exec-stdin v5"
        } else {
            "exec-stdin v4.channel.k8s.io"
        };
        for step in [
            "create",
            "list-selector",
            "conflict-409",
            "missing-404",
            "exec-returncode 3",
            stdin_step,
            "deadline-lowered",
            "deadline-raised-422",
            "portforward",
            "delete",
            "deletecollection",
        ] {
            assert!(
                said.lines().any(|l| l == format!("OK {step}")),
                "no `OK {step}` in:\n{said}"
            );
        }
        kube.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_python_client_judges_the_fake() {
        python("the_python_client_judges_the_fake", true).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_python_client_judges_the_fake_without_v5() {
        python("the_python_client_judges_the_fake_without_v5", false).await;
    }
}

mod live {
    //! Kubernetes boxes against a real cluster: the conformance suite, only where
    //! `AGENTBOX_TEST_KUBECONFIG` names a kubeconfig (see docs/kube.md). Without one it says
    //! loudly that it did not run; CI has no cluster and runs the fake's suite (`tests/kube.rs`).

    use std::sync::Arc;
    use std::time::Duration;

    use agentbox_core::Provider;
    use agentbox_providers::helper::HelperCommand;
    use agentbox_providers::kube::{KubeOptions, KubeProvider};
    use agentbox_testing::conformance::{self, Options};

    use super::view::ClusterView;

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
}

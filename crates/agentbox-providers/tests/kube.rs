//! Kubernetes boxes against the repository's fake API server (`agentbox-fakes`), whose pods
//! really run in namespace boxes and whose API kubectl and the `kubernetes` Python client
//! judge (`agentbox-fakes`' own tests): the conformance suite with and without the runner,
//! over v5 and v4 exec, and what is kube's own (the pod as the cluster holds it, network
//! policies proven from inside, throttling, extend against the backstop, the sweep of ended
//! pods, port-forward, pools).

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

#[path = "common/kube_view.rs"]
mod kube_view;
use agentbox_testing::services::rootfs;
use agentbox_testing::sh;
use kube_view::ClusterView;

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

//! agent-sandbox in the fake (`agent_sandbox: true`): discovery only with the flag, the four
//! kinds' API answers, and the controllers doing what upstream's do (a Sandbox's pod, its
//! shutdown, the collector, a warm pool's members and a claim's adoption).

mod common;

use std::time::Duration;

use common::{call, call_as, fake, patch};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const WAIT: Duration = Duration::from_secs(30);
const SANDBOXES: &str = "/apis/agents.x-k8s.io/v1beta1/namespaces/default/sandboxes";
const EXT: &str = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default";
const PODS: &str = "/api/v1/namespaces/default/pods";

async fn installed(test: &str) -> Option<agentbox_fakes::kube::FakeKube> {
    fake(test, |o| o.agent_sandbox = true).await
}

fn sandbox(name: &str, extra: Value) -> Value {
    let mut v = json!({
        "apiVersion": "agents.x-k8s.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"podTemplate": {
            "metadata": {
                "labels": {"app": "judged", "agents.x-k8s.io/sandbox-name-hash": "forged"},
                "annotations": {"note": "from-template"},
            },
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "debian:bookworm", "command": ["sleep", "300"]}]},
        }},
    });
    common_merge(&mut v, &extra);
    v
}

fn common_merge(target: &mut Value, extra: &Value) {
    if let (Some(t), Some(e)) = (target.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            match t.get_mut(k) {
                Some(old) if old.is_object() && v.is_object() => common_merge(old, v),
                _ => {
                    t.insert(k.clone(), v.clone());
                }
            }
        }
    }
}

/// Poll `what` until it is `Some`, at most WAIT.
async fn until<T, F, Fut>(said: &str, mut what: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = what().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < end, "not within {WAIT:?}: {said}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn get(kube: &agentbox_fakes::kube::FakeKube, path: &str) -> Option<Value> {
    let a = call(kube, "GET", path, None).await;
    (a.status == 200).then(|| a.json())
}

fn ready(o: &Value) -> Option<&Value> {
    o["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
}

/// Exec over v4 (no stdin): stdout and the status frame.
async fn exec(kube: &agentbox_fakes::kube::FakeKube, pod: &str, cmd: &[&str]) -> (String, Value) {
    let mut q: Vec<String> = cmd
        .iter()
        .map(|c| {
            format!(
                "command={}",
                form_urlencoded::byte_serialize(c.as_bytes()).collect::<String>()
            )
        })
        .collect();
    q.push("stdout=true&stderr=true".into());
    let url = format!("ws://{}{PODS}/{pod}/exec?{}", kube.addr(), q.join("&"));
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("Authorization", format!("Bearer {}", kube.token()).parse().unwrap());
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", "v4.channel.k8s.io".parse().unwrap());
    let tcp = tokio::net::TcpStream::connect(kube.addr()).await.unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(req, tcp).await.expect("the upgrade");
    let (mut out, mut status) = (Vec::new(), Value::Null);
    while let Some(m) = tokio::time::timeout(WAIT, ws.next())
        .await
        .expect("frames within the wait")
    {
        match m {
            Ok(Message::Binary(d)) if !d.is_empty() => match d[0] {
                1 => out.extend_from_slice(&d[1..]),
                3 => status = serde_json::from_slice(&d[1..]).unwrap(),
                _ => {}
            },
            Ok(Message::Close(_)) | Err(_) => break,
            _ => {}
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), status)
}

/// FNV-1a 32, as upstream's NameHash: computed here apart from the fake's own.
fn fnv(s: &str) -> String {
    let h = s
        .bytes()
        .fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    format!("{h:08x}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_flag_the_cluster_has_no_agent_sandbox() {
    let Some(kube) = fake("without_the_flag_the_cluster_has_no_agent_sandbox", |_| {}).await else {
        return;
    };
    let apis = call(&kube, "GET", "/apis", None).await.json();
    let names: Vec<&str> = apis["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["apps", "networking.k8s.io", "rbac.authorization.k8s.io"],
        "{apis}"
    );
    for path in [
        "/apis/agents.x-k8s.io/v1beta1",
        "/apis/extensions.agents.x-k8s.io",
        SANDBOXES,
    ] {
        let a = call(&kube, "GET", path, None).await;
        assert_eq!(a.status, 404, "{path}");
    }
    let a = call(&kube, "POST", SANDBOXES, Some(&sandbox("nope", json!({})))).await;
    assert_eq!(a.status, 404);
    let openapi = call(&kube, "GET", "/openapi/v3", None).await.json();
    assert!(
        openapi["paths"].get("apis/agents.x-k8s.io/v1beta1").is_none(),
        "{openapi}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(kube.pods().is_empty());
    kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_flag_discovery_lists_both_groups_and_their_kinds() {
    let Some(kube) = installed("with_the_flag_discovery_lists_both_groups_and_their_kinds").await else {
        return;
    };
    let apis = call(&kube, "GET", "/apis", None).await.json();
    for g in ["agents.x-k8s.io", "extensions.agents.x-k8s.io"] {
        let e = apis["groups"].as_array().unwrap().iter().find(|x| x["name"] == g);
        let e = e.unwrap_or_else(|| panic!("{g} not in {apis}"));
        assert_eq!(e["preferredVersion"]["version"], "v1beta1");
        let one = call(&kube, "GET", &format!("/apis/{g}"), None).await.json();
        assert_eq!(one["kind"], "APIGroup");
        assert_eq!(one["name"], g);
    }
    let core = call(&kube, "GET", "/apis/agents.x-k8s.io/v1beta1", None).await.json();
    let names: Vec<&str> = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["sandboxes", "sandboxes/status"]);
    assert_eq!(core["resources"][0]["kind"], "Sandbox");
    assert_eq!(core["resources"][0]["namespaced"], true);
    assert_eq!(core["resources"][0]["shortNames"], json!(["sandbox"]));
    let ext = call(&kube, "GET", "/apis/extensions.agents.x-k8s.io/v1beta1", None)
        .await
        .json();
    let names: Vec<&str> = ext["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "sandboxclaims",
            "sandboxclaims/status",
            "sandboxtemplates",
            "sandboxwarmpools",
            "sandboxwarmpools/status"
        ]
    );
    let swp = ext["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "sandboxwarmpools");
    assert_eq!(swp.unwrap()["shortNames"], json!(["swp"]));
    let openapi = call(&kube, "GET", "/openapi/v3", None).await.json();
    let url = openapi["paths"]["apis/agents.x-k8s.io/v1beta1"]["serverRelativeURL"]
        .as_str()
        .expect("an OpenAPI document for the group version");
    let doc = call(&kube, "GET", url, None).await.json();
    let post = &doc["paths"]["/apis/agents.x-k8s.io/v1beta1/namespaces/{namespace}/sandboxes"]["post"];
    assert_eq!(
        post["x-kubernetes-group-version-kind"],
        json!({"group": "agents.x-k8s.io", "version": "v1beta1", "kind": "Sandbox"})
    );
    // v1alpha1 is not served.
    assert_eq!(
        call(
            &kube,
            "GET",
            "/apis/agents.x-k8s.io/v1alpha1/namespaces/default/sandboxes",
            None
        )
        .await
        .status,
        404
    );
    kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_four_kinds_answer_as_custom_resources_do() {
    let Some(kube) = installed("the_four_kinds_answer_as_custom_resources_do").await else {
        return;
    };
    // 422 naming the missing required fields.
    let cases = [
        (
            SANDBOXES.to_string(),
            json!({"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "metadata": {"name": "bad"}, "spec": {"shutdownPolicy": "Never"}}),
            vec!["spec.podTemplate", "spec.shutdownPolicy"],
            "Sandbox.agents.x-k8s.io \"bad\" is invalid",
        ),
        (
            format!("{EXT}/sandboxclaims"),
            json!({"metadata": {"name": "bad"}, "spec": {"lifecycle": {"shutdownTime": "tomorrow"}}}),
            vec!["spec.warmPoolRef", "spec.lifecycle.shutdownTime"],
            "SandboxClaim.extensions.agents.x-k8s.io \"bad\" is invalid",
        ),
        (
            format!("{EXT}/sandboxwarmpools"),
            json!({"metadata": {"name": "bad"}, "spec": {"replicas": -1}}),
            vec!["spec.sandboxTemplateRef", "spec.replicas"],
            "SandboxWarmPool.extensions.agents.x-k8s.io \"bad\" is invalid",
        ),
        (
            format!("{EXT}/sandboxtemplates"),
            json!({"metadata": {"name": "bad"}, "spec": {"podTemplate": {}}}),
            vec!["spec.podTemplate.spec"],
            "SandboxTemplate.extensions.agents.x-k8s.io \"bad\" is invalid",
        ),
        (
            SANDBOXES.to_string(),
            json!({"metadata": {"name": "nospec"}}),
            vec!["spec"],
            "Sandbox.agents.x-k8s.io \"nospec\" is invalid: spec: Required value",
        ),
    ];
    for (path, body, fields, message) in cases {
        let a = call(&kube, "POST", &path, Some(&body)).await;
        assert_eq!(a.status, 422, "{path}: {}", String::from_utf8_lossy(&a.body));
        let v = a.json();
        assert_eq!(v["reason"], "Invalid");
        assert!(v["message"].as_str().unwrap().starts_with(message), "{v}");
        let got: Vec<&str> = v["details"]["causes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["field"].as_str().unwrap())
            .collect();
        assert_eq!(got, fields, "{v}");
    }
    // A template (no status subresource), with the CRD's defaults; status on create ignored
    // where there is a status subresource.
    let t = json!({"metadata": {"name": "t", "labels": {"k": "v"}}, "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "debian:bookworm", "command": ["sleep", "300"]}]}}}});
    let a = call(&kube, "POST", &format!("{EXT}/sandboxtemplates"), Some(&t)).await;
    assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.body));
    let made = a.json();
    assert_eq!(made["apiVersion"], "extensions.agents.x-k8s.io/v1beta1");
    assert_eq!(made["kind"], "SandboxTemplate");
    assert_eq!(made["metadata"]["generation"], 1);
    assert_eq!(made["spec"]["networkPolicyManagement"], "Managed");
    assert_eq!(made["spec"]["envVarsInjectionPolicy"], "Disallowed");
    let a = call(&kube, "POST", &format!("{EXT}/sandboxtemplates"), Some(&t)).await;
    assert_eq!(a.status, 409);
    assert_eq!(
        a.json()["message"],
        "sandboxtemplates.extensions.agents.x-k8s.io \"t\" already exists"
    );
    let a = call(&kube, "GET", &format!("{EXT}/sandboxtemplates/missing"), None).await;
    assert_eq!(a.status, 404);
    assert_eq!(
        a.json()["message"],
        "sandboxtemplates.extensions.agents.x-k8s.io \"missing\" not found"
    );
    let pool = json!({"metadata": {"name": "p"}, "spec": {"sandboxTemplateRef": {"name": "nowhere"}}, "status": {"replicas": 9}});
    let a = call(&kube, "POST", &format!("{EXT}/sandboxwarmpools"), Some(&pool)).await;
    assert_eq!(a.status, 201);
    assert_eq!(a.json()["spec"]["replicas"], 1);
    assert!(a.json().get("status").is_none(), "{}", a.json());
    // Patches: merge and JSON, not strategic; spec changes raise the generation, a status
    // patch on the main resource is dropped, one on /status is taken.
    let path = format!("{EXT}/sandboxwarmpools/p");
    let a = patch(
        &kube,
        &path,
        "application/strategic-merge-patch+json",
        &json!({"spec": {"replicas": 0}}),
    )
    .await;
    assert_eq!(a.status, 415);
    assert!(
        a.json()["message"]
            .as_str()
            .unwrap()
            .contains("application/merge-patch+json")
    );
    let a = patch(
        &kube,
        &path,
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"x": "y"}}, "spec": {"replicas": 0}, "status": {"replicas": 7}}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
    let v = a.json();
    assert_eq!(
        (v["spec"]["replicas"].clone(), v["metadata"]["generation"].clone()),
        (json!(0), json!(2))
    );
    assert_ne!(v["status"]["replicas"], 7);
    let a = patch(
        &kube,
        &path,
        "application/merge-patch+json",
        &json!({"spec": {"replicas": -2}}),
    )
    .await;
    assert_eq!(a.status, 422);
    let a = patch(
        &kube,
        &path,
        "application/json-patch+json",
        &json!([{"op": "replace", "path": "/spec/sandboxTemplateRef/name", "value": "t"}]),
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["metadata"]["generation"], 3);
    let a = patch(
        &kube,
        &format!("{path}/status"),
        "application/merge-patch+json",
        &json!({"status": {"conditions": [{"type": "Mine", "status": "True"}]}, "spec": {"replicas": 5}}),
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["spec"]["replicas"], 0, "a status patch changes only status");
    // Lists with selectors, across namespaces too.
    let l = call(
        &kube,
        "GET",
        &format!("{EXT}/sandboxwarmpools?labelSelector=x%3Dy"),
        None,
    )
    .await
    .json();
    assert_eq!(l["kind"], "SandboxWarmPoolList");
    assert_eq!(l["items"].as_array().unwrap().len(), 1);
    let l = call(
        &kube,
        "GET",
        "/apis/extensions.agents.x-k8s.io/v1beta1/sandboxtemplates?labelSelector=k%3Dnope",
        None,
    )
    .await
    .json();
    assert_eq!(l["items"], json!([]));
    // The template got its ref-hash label and its default NetworkPolicy from the controller.
    let np = until("the template's network policy", || async {
        get(
            &kube,
            "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies/t-network-policy",
        )
        .await
    })
    .await;
    assert_eq!(
        np["spec"]["podSelector"]["matchLabels"]["agents.x-k8s.io/sandbox-template-ref-hash"],
        fnv("t")
    );
    assert_eq!(np["metadata"]["ownerReferences"][0]["kind"], "SandboxTemplate");
    let t = get(&kube, &format!("{EXT}/sandboxtemplates/t")).await.unwrap();
    assert_eq!(
        t["metadata"]["labels"]["agents.x-k8s.io/sandbox-template-ref-hash"],
        fnv("t")
    );
    // Deleting the template collects its policy.
    assert_eq!(
        call(&kube, "DELETE", &format!("{EXT}/sandboxtemplates/t"), None)
            .await
            .status,
        200
    );
    until("the policy collected", || async {
        get(
            &kube,
            "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies/t-network-policy",
        )
        .await
        .is_none()
        .then_some(())
    })
    .await;
    // 401 still.
    assert_eq!(
        call_as(&kube, None, "GET", SANDBOXES, "application/json", None)
            .await
            .status,
        401
    );
    kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_runs_its_pod_which_it_remakes_and_which_goes_with_it() {
    let Some(kube) = installed("a_sandbox_runs_its_pod_which_it_remakes_and_which_goes_with_it").await else {
        return;
    };
    // A watch from the start sees the Sandbox added and its status written.
    let watch = {
        let addr = kube.addr();
        let token = kube.token().to_string();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("GET {SANDBOXES}?watch=true&timeoutSeconds=4 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
            let mut raw = Vec::new();
            s.read_to_end(&mut raw).await.unwrap();
            String::from_utf8_lossy(&raw).to_string()
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let a = call(&kube, "POST", SANDBOXES, Some(&sandbox("box1", json!({})))).await;
    assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.body));
    let made = a.json();
    assert_eq!(made["spec"]["operatingMode"], "Running");
    assert_eq!(made["spec"]["shutdownPolicy"], "Retain");
    let sb_uid = made["metadata"]["uid"].as_str().unwrap().to_string();
    let pod = kube.wait_phase("default", "box1", "Running", WAIT).await.unwrap();
    // The pod as upstream's controller makes it.
    assert_eq!(pod["metadata"]["labels"]["app"], "judged");
    assert_eq!(
        pod["metadata"]["labels"]["agents.x-k8s.io/sandbox-name-hash"],
        fnv("box1")
    );
    assert_eq!(pod["metadata"]["annotations"]["note"], "from-template");
    let owner = &pod["metadata"]["ownerReferences"][0];
    assert_eq!(
        (
            owner["apiVersion"].as_str(),
            owner["kind"].as_str(),
            owner["uid"].as_str(),
            owner["controller"].as_bool()
        ),
        (
            Some("agents.x-k8s.io/v1beta1"),
            Some("Sandbox"),
            Some(sb_uid.as_str()),
            Some(true)
        )
    );
    let sb = until("the Sandbox Ready", || async {
        get(&kube, &format!("{SANDBOXES}/box1"))
            .await
            .filter(|s| ready(s).is_some_and(|r| r["status"] == "True"))
    })
    .await;
    assert_eq!(ready(&sb).unwrap()["reason"], "DependenciesReady");
    assert_eq!(sb["status"]["podIPs"], json!(["127.0.0.1"]));
    assert_eq!(sb["status"]["nodeName"], "agentbox-fake");
    assert_eq!(
        sb["status"]["selector"],
        format!("agents.x-k8s.io/sandbox-name-hash={}", fnv("box1"))
    );
    assert_eq!(sb["metadata"]["annotations"]["agents.x-k8s.io/pod-name"], "box1");
    // The status selector finds the pod.
    let l = call(
        &kube,
        "GET",
        &format!(
            "{PODS}?labelSelector=agents.x-k8s.io%2Fsandbox-name-hash%3D{}",
            fnv("box1")
        ),
        None,
    )
    .await
    .json();
    assert_eq!(l["items"].as_array().unwrap().len(), 1);
    let (out, status) = exec(&kube, "box1", &["sh", "-c", "echo in-the-box; exit 4"]).await;
    assert_eq!(out, "in-the-box\n");
    assert_eq!(status["details"]["causes"][0]["message"], "4", "{status}");
    // Settled controllers write nothing more: the resourceVersion stands still.
    let rv = |v: Value| v["metadata"]["resourceVersion"].as_str().unwrap().to_string();
    let before = rv(call(&kube, "GET", SANDBOXES, None).await.json());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(rv(call(&kube, "GET", SANDBOXES, None).await.json()), before);
    let events = watch.await.unwrap();
    assert!(events.contains("\"type\":\"ADDED\""), "{events}");
    assert!(events.contains("DependenciesReady"), "{events}");
    // A deleted pod is made again, a new one of the same name.
    let first_uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    assert_eq!(call(&kube, "DELETE", &format!("{PODS}/box1"), None).await.status, 200);
    let again = until("the pod made again", || async {
        kube.pod("default", "box1")
            .filter(|p| p["metadata"]["uid"] != first_uid.as_str() && p["status"]["phase"] == "Running")
    })
    .await;
    assert_eq!(again["metadata"]["ownerReferences"][0]["uid"], sb_uid.as_str());
    // A template label changed reaches the pod; one removed leaves it.
    let a = patch(
        &kube,
        &format!("{SANDBOXES}/box1"),
        "application/merge-patch+json",
        &json!({"spec": {"podTemplate": {"metadata": {"labels": {"app": null, "tier": "two"}}}}}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
    assert_eq!(a.json()["metadata"]["generation"], 2);
    until("the pod relabelled", || async {
        kube.pod("default", "box1")
            .filter(|p| p["metadata"]["labels"]["tier"] == "two" && p["metadata"]["labels"].get("app").is_none())
    })
    .await;
    // Deleting the Sandbox takes the pod (and its box) with it.
    assert_eq!(
        call(&kube, "DELETE", &format!("{SANDBOXES}/box1"), None).await.status,
        200
    );
    until("the pod collected", || async { kube.pods().is_empty().then_some(()) }).await;
    kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_time_ends_the_pod_and_the_policy_decides_the_sandbox() {
    let Some(kube) = installed("shutdown_time_ends_the_pod_and_the_policy_decides_the_sandbox").await else {
        return;
    };
    let soon = (jiff::Timestamp::now() + jiff::SignedDuration::from_secs(4))
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    for (name, policy) in [("gone", "Delete"), ("kept", "Retain")] {
        let sb = sandbox(name, json!({"spec": {"shutdownTime": soon, "shutdownPolicy": policy}}));
        assert_eq!(call(&kube, "POST", SANDBOXES, Some(&sb)).await.status, 201);
    }
    for name in ["gone", "kept"] {
        kube.wait_phase("default", name, "Running", WAIT).await.unwrap();
    }
    until("both pods ended", || async { kube.pods().is_empty().then_some(()) }).await;
    until("the Delete one deleted", || async {
        get(&kube, &format!("{SANDBOXES}/gone")).await.is_none().then_some(())
    })
    .await;
    let kept = until("the Retain one expired", || async {
        get(&kube, &format!("{SANDBOXES}/kept"))
            .await
            .filter(|s| ready(s).is_some_and(|r| r["reason"] == "SandboxExpired"))
    })
    .await;
    assert_eq!(ready(&kept).unwrap()["status"], "False");
    assert_eq!(ready(&kept).unwrap()["message"], "Sandbox has expired");
    assert!(kept["status"].get("podIPs").is_none(), "{kept}");
    // And no pod comes back.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(kube.pod("default", "kept").is_none());
    kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pool_keeps_its_replicas_and_a_claim_adopts_one() {
    let Some(kube) = installed("a_warm_pool_keeps_its_replicas_and_a_claim_adopts_one").await else {
        return;
    };
    let template = json!({"metadata": {"name": "tmpl"}, "spec": {
        "networkPolicyManagement": "Unmanaged",
        "podTemplate": {
            "metadata": {"labels": {"role": "agent"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "debian:bookworm", "command": ["sleep", "300"]}]},
        },
    }});
    assert_eq!(
        call(&kube, "POST", &format!("{EXT}/sandboxtemplates"), Some(&template))
            .await
            .status,
        201
    );
    let pool = json!({"metadata": {"name": "pool"}, "spec": {"replicas": 2, "sandboxTemplateRef": {"name": "tmpl"}}});
    assert_eq!(
        call(&kube, "POST", &format!("{EXT}/sandboxwarmpools"), Some(&pool))
            .await
            .status,
        201
    );
    let selector = format!("agents.x-k8s.io%2Fwarm-pool-sandbox%3D{}", fnv("pool"));
    let path = format!("{SANDBOXES}?labelSelector={selector}");
    let warm = until("two Ready members", || async {
        let l = get(&kube, &path).await?;
        let items = l["items"].as_array()?.clone();
        (items.len() == 2 && items.iter().all(|s| ready(s).is_some_and(|r| r["status"] == "True"))).then_some(items)
    })
    .await;
    for m in &warm {
        let name = m["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("pool-") && name.len() == "pool-".len() + 5, "{name}");
        assert_eq!(m["metadata"]["labels"]["agents.x-k8s.io/launch-type"], "warm");
        assert_eq!(m["metadata"]["ownerReferences"][0]["kind"], "SandboxWarmPool");
        assert_eq!(m["spec"]["podTemplate"]["spec"]["automountServiceAccountToken"], false);
        let pod = kube.pod("default", name).expect("the member's pod");
        assert_eq!(pod["metadata"]["labels"]["role"], "agent");
        assert_eq!(
            pod["metadata"]["labels"]["agents.x-k8s.io/warm-pool-sandbox"],
            fnv("pool")
        );
    }
    let p = until("the pool's status", || async {
        get(&kube, &format!("{EXT}/sandboxwarmpools/pool"))
            .await
            .filter(|p| p["status"]["readyReplicas"] == 2)
    })
    .await;
    assert_eq!(p["status"]["replicas"], 2);
    let rv = |v: Value| v["metadata"]["resourceVersion"].as_str().unwrap().to_string();
    let before = rv(call(&kube, "GET", SANDBOXES, None).await.json());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        rv(call(&kube, "GET", SANDBOXES, None).await.json()),
        before,
        "a settled pool writes nothing"
    );
    assert_eq!(
        p["status"]["selector"],
        format!("agents.x-k8s.io/warm-pool-sandbox={}", fnv("pool"))
    );
    // A claim adopts a Ready member: its name, now the claim's, its pod relabelled.
    let claim = json!({"metadata": {"name": "mine"}, "spec": {
        "warmPoolRef": {"name": "pool"},
        "additionalPodMetadata": {"labels": {"sandbox.users.io/owner": "me"}, "annotations": {"note": "hi"}},
    }});
    let a = call(&kube, "POST", &format!("{EXT}/sandboxclaims"), Some(&claim)).await;
    assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.body));
    let claim_uid = a.json()["metadata"]["uid"].as_str().unwrap().to_string();
    let c = until("the claim Ready", || async {
        get(&kube, &format!("{EXT}/sandboxclaims/mine"))
            .await
            .filter(|c| ready(c).is_some_and(|r| r["status"] == "True"))
    })
    .await;
    let adopted = c["status"]["sandbox"]["name"].as_str().unwrap().to_string();
    assert!(
        warm.iter().any(|m| m["metadata"]["name"] == adopted.as_str()),
        "{adopted} is not one of the pool's"
    );
    assert_eq!(c["status"]["sandbox"]["podIPs"], json!(["127.0.0.1"]));
    assert_eq!(
        c["metadata"]["annotations"]["agents.x-k8s.io/sandbox-name"],
        adopted.as_str()
    );
    let sb = get(&kube, &format!("{SANDBOXES}/{adopted}")).await.unwrap();
    assert_eq!(sb["metadata"]["ownerReferences"][0]["kind"], "SandboxClaim");
    assert_eq!(sb["metadata"]["ownerReferences"][0]["uid"], claim_uid.as_str());
    assert!(
        sb["metadata"]["labels"]
            .get("agents.x-k8s.io/warm-pool-sandbox")
            .is_none()
    );
    assert_eq!(
        sb["metadata"]["labels"]["agents.x-k8s.io/claim-uid"],
        claim_uid.as_str()
    );
    let pod = until("the adopted pod relabelled", || async {
        kube.pod("default", &adopted)
            .filter(|p| p["metadata"]["labels"]["sandbox.users.io/owner"] == "me")
    })
    .await;
    assert_eq!(pod["metadata"]["annotations"]["note"], "hi");
    assert!(
        pod["metadata"]["labels"]
            .get("agents.x-k8s.io/warm-pool-sandbox")
            .is_none(),
        "{pod}"
    );
    assert_eq!(pod["status"]["phase"], "Running", "the same pod, never restarted");
    // The pool makes a replacement: two warm members again, three Sandboxes in all.
    until("the pool refilled", || async {
        let l = get(&kube, &path).await?;
        (l["items"].as_array()?.len() == 2).then_some(())
    })
    .await;
    until("three Sandboxes", || async {
        let l = get(&kube, SANDBOXES).await?;
        (l["items"].as_array()?.len() == 3).then_some(())
    })
    .await;
    // A claim whose metadata upstream refuses is not Ready, and says why.
    let bad = json!({"metadata": {"name": "bad"}, "spec": {"warmPoolRef": {"name": "pool"}, "additionalPodMetadata": {"labels": {"owner": "me"}}}});
    assert_eq!(
        call(&kube, "POST", &format!("{EXT}/sandboxclaims"), Some(&bad))
            .await
            .status,
        201
    );
    let b = until("the bad claim's reason", || async {
        get(&kube, &format!("{EXT}/sandboxclaims/bad"))
            .await
            .filter(|c| ready(c).is_some_and(|r| r["reason"] == "InvalidMetadata"))
    })
    .await;
    assert!(
        ready(&b).unwrap()["message"]
            .as_str()
            .unwrap()
            .contains("domain prefix")
    );
    // A claim of a pool that does not exist says so.
    let lost = json!({"metadata": {"name": "lost"}, "spec": {"warmPoolRef": {"name": "nopool"}}});
    assert_eq!(
        call(&kube, "POST", &format!("{EXT}/sandboxclaims"), Some(&lost))
            .await
            .status,
        201
    );
    until("WarmPoolNotFound", || async {
        get(&kube, &format!("{EXT}/sandboxclaims/lost"))
            .await
            .filter(|c| ready(c).is_some_and(|r| r["reason"] == "WarmPoolNotFound"))
    })
    .await;
    // Deleting the claim takes its Sandbox and pod; the pool's stay.
    assert_eq!(
        call(&kube, "DELETE", &format!("{EXT}/sandboxclaims/mine"), None)
            .await
            .status,
        200
    );
    until("the adopted pod collected", || async {
        (kube.pod("default", &adopted).is_none() && get(&kube, &format!("{SANDBOXES}/{adopted}")).await.is_none())
            .then_some(())
    })
    .await;
    // Scaling the pool down deletes the surplus; deleting it, the rest.
    let a = patch(
        &kube,
        &format!("{EXT}/sandboxwarmpools/pool"),
        "application/merge-patch+json",
        &json!({"spec": {"replicas": 1}}),
    )
    .await;
    assert_eq!(a.status, 200);
    until("one member", || async {
        let l = get(&kube, &path).await?;
        (l["items"].as_array()?.len() == 1).then_some(())
    })
    .await;
    assert_eq!(
        call(&kube, "DELETE", &format!("{EXT}/sandboxwarmpools/pool"), None)
            .await
            .status,
        200
    );
    until("every pod collected", || async { kube.pods().is_empty().then_some(()) }).await;
    kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_without_a_warm_member_gets_its_own_sandbox_and_its_shutdown_time() {
    let Some(kube) = installed("a_claim_without_a_warm_member_gets_its_own_sandbox_and_its_shutdown_time").await else {
        return;
    };
    let template = json!({"metadata": {"name": "tmpl"}, "spec": {
        "envVarsInjectionPolicy": "Allowed",
        "networkPolicy": {},
        "podTemplate": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "debian:bookworm", "command": ["sleep", "300"]}]}},
    }});
    assert_eq!(
        call(&kube, "POST", &format!("{EXT}/sandboxtemplates"), Some(&template))
            .await
            .status,
        201
    );
    let pool = json!({"metadata": {"name": "empty"}, "spec": {"replicas": 0, "sandboxTemplateRef": {"name": "tmpl"}}});
    assert_eq!(
        call(&kube, "POST", &format!("{EXT}/sandboxwarmpools"), Some(&pool))
            .await
            .status,
        201
    );
    let soon = (jiff::Timestamp::now() + jiff::SignedDuration::from_secs(6))
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let claim = json!({"metadata": {"name": "cold"}, "spec": {
        "warmPoolRef": {"name": "empty"},
        "env": [{"name": "GREETING", "value": "hello"}],
        "lifecycle": {"shutdownTime": soon},
    }});
    let a = call(&kube, "POST", &format!("{EXT}/sandboxclaims"), Some(&claim)).await;
    assert_eq!(a.status, 201);
    assert_eq!(a.json()["spec"]["lifecycle"]["shutdownPolicy"], "Retain");
    let c = until("the claim Ready", || async {
        get(&kube, &format!("{EXT}/sandboxclaims/cold"))
            .await
            .filter(|c| ready(c).is_some_and(|r| r["status"] == "True"))
    })
    .await;
    assert_eq!(c["status"]["sandbox"]["name"], "cold");
    let sb = get(&kube, &format!("{SANDBOXES}/cold")).await.unwrap();
    assert_eq!(sb["metadata"]["labels"]["agents.x-k8s.io/launch-type"], "cold");
    assert_eq!(sb["metadata"]["ownerReferences"][0]["kind"], "SandboxClaim");
    // The claim's shutdown time is not the Sandbox's.
    assert!(sb["spec"].get("shutdownTime").is_none(), "{sb}");
    let (out, _) = exec(&kube, "cold", &["sh", "-c", "echo $GREETING"]).await;
    assert_eq!(out, "hello\n");
    // The template's own rules (none) are a deny-all egress the fake enforces.
    let view = kube.pods().into_iter().find(|p| p.name == "cold").unwrap();
    assert!(view.isolated, "{view:?}");
    // At the claim's shutdown time its Sandbox goes and the claim stays, expired.
    let c = until("the claim expired", || async {
        get(&kube, &format!("{EXT}/sandboxclaims/cold"))
            .await
            .filter(|c| ready(c).is_some_and(|r| r["reason"] == "ClaimExpired"))
    })
    .await;
    assert_eq!(ready(&c).unwrap()["status"], "False");
    until("the Sandbox and pod gone", || async {
        (get(&kube, &format!("{SANDBOXES}/cold")).await.is_none() && kube.pods().is_empty()).then_some(())
    })
    .await;
    kube.shutdown().await;
}

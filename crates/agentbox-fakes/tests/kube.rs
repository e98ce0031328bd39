//! The fake Kubernetes API server's own answers: status codes and Status shapes, selectors,
//! watch events, patch rules, phases, the deadline, and exec over v5 and v4.

mod common;

use std::time::Duration;

use common::{call, call_as, fake, patch, pod};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const PODS: &str = "/api/v1/namespaces/default/pods";
const WAIT: Duration = Duration::from_secs(20);

fn status_of(v: &Value, code: u64, reason: &str) {
    assert_eq!(v["kind"], "Status", "{v}");
    assert_eq!(v["apiVersion"], "v1", "{v}");
    assert_eq!(v["status"], "Failure", "{v}");
    assert_eq!(v["code"], code, "{v}");
    assert_eq!(v["reason"], reason, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_statuses_with_the_real_servers_codes() {
    let Some(kube) = fake("errors_are_statuses_with_the_real_servers_codes", |_| {}).await else {
        return;
    };
    // 401 without the token, or with another.
    for token in [None, Some("nope")] {
        let a = call_as(&kube, token, "GET", PODS, "application/json", None).await;
        assert_eq!(a.status, 401);
        status_of(&a.json(), 401, "Unauthorized");
    }
    // 404: a pod, a namespace to create in.
    let a = call(&kube, "GET", &format!("{PODS}/missing"), None).await;
    assert_eq!(a.status, 404);
    status_of(&a.json(), 404, "NotFound");
    assert_eq!(a.json()["message"], "pods \"missing\" not found");
    assert_eq!(a.json()["details"], json!({"name": "missing", "kind": "pods"}));
    let a = call(
        &kube,
        "POST",
        "/api/v1/namespaces/nowhere/pods",
        Some(&pod("a", json!({}), &["true"])),
    )
    .await;
    assert_eq!(a.status, 404);
    assert_eq!(a.json()["message"], "namespaces \"nowhere\" not found");
    // 409 for a name taken.
    let p = pod("twice", json!({}), &["sleep", "30"]);
    assert_eq!(call(&kube, "POST", PODS, Some(&p)).await.status, 201);
    let a = call(&kube, "POST", PODS, Some(&p)).await;
    assert_eq!(a.status, 409);
    status_of(&a.json(), 409, "AlreadyExists");
    assert_eq!(a.json()["message"], "pods \"twice\" already exists");
    // 422 naming every field, as the real server's causes do.
    let bad = json!({
        "metadata": {"name": "Bad_Name", "labels": {"ok": "bad value!"}},
        "spec": {"restartPolicy": "Sometimes", "containers": [{"name": "", "resources": {"limits": {"cpu": "-1"}}}]},
    });
    let a = call(&kube, "POST", PODS, Some(&bad)).await;
    assert_eq!(a.status, 422, "{}", String::from_utf8_lossy(&a.body));
    let v = a.json();
    status_of(&v, 422, "Invalid");
    let fields: Vec<&str> = v["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    for f in [
        "metadata.name",
        "metadata.labels",
        "spec.containers[0].name",
        "spec.containers[0].image",
        "spec.containers[0].resources.limits[cpu]",
        "spec.restartPolicy",
    ] {
        assert!(fields.contains(&f), "{f} not in {fields:?}");
    }
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .starts_with("Pod \"Bad_Name\" is invalid: ["),
        "{v}"
    );
    let a = call(
        &kube,
        "POST",
        PODS,
        Some(&json!({"metadata": {"name": "x"}, "spec": {"containers": []}})),
    )
    .await;
    assert_eq!(a.json()["details"]["causes"][0]["field"], "spec.containers");
    assert_eq!(a.json()["details"]["causes"][0]["reason"], "FieldValueRequired");
    // A quantity that does not parse is the decoder's 400, as the real server's.
    let mut q = pod("q", json!({}), &["true"]);
    q["spec"]["containers"][0]["resources"] = json!({"limits": {"memory": "1 gig"}});
    assert_eq!(call(&kube, "POST", PODS, Some(&q)).await.status, 400);
    q["spec"]["containers"][0]["resources"] = json!({"limits": {"memory": "1Gi", "cpu": "500m"}});
    assert_eq!(call(&kube, "POST", PODS, Some(&q)).await.status, 201);
    // 429 with Retry-After, for exactly the throttled number of requests.
    kube.throttle(2);
    for _ in 0..2 {
        let a = call(&kube, "GET", PODS, None).await;
        assert_eq!(a.status, 429);
        assert_eq!(a.header("retry-after"), Some("1"));
        status_of(&a.json(), 429, "TooManyRequests");
    }
    assert_eq!(call(&kube, "GET", PODS, None).await.status, 200);
    kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selectors_limits_and_namespaces_choose_what_a_list_answers() {
    let Some(kube) = fake("selectors_limits_and_namespaces_choose_what_a_list_answers", |_| {}).await else {
        return;
    };
    for (name, labels) in [
        ("a", json!({"app": "web", "tier": "front"})),
        ("b", json!({"app": "web", "tier": "back"})),
        ("c", json!({"app": "db"})),
    ] {
        assert_eq!(
            call(&kube, "POST", PODS, Some(&pod(name, labels, &["sleep", "30"])))
                .await
                .status,
            201
        );
    }
    let names = |v: Value| -> Vec<String> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    for (sel, want) in [
        ("app%3Dweb", vec!["a", "b"]),
        ("app%3D%3Dweb", vec!["a", "b"]),
        ("app%21%3Dweb", vec!["c"]),
        ("tier%20in%20(front,x)", vec!["a"]),
        ("tier%20notin%20(front)", vec!["b", "c"]),
        ("tier", vec!["a", "b"]),
        ("!tier", vec!["c"]),
        ("app%3Dweb,tier%3Dback", vec!["b"]),
    ] {
        let a = call(&kube, "GET", &format!("{PODS}?labelSelector={sel}"), None).await;
        assert_eq!(a.status, 200);
        assert_eq!(names(a.json()), want, "labelSelector={sel}");
    }
    let a = call(&kube, "GET", &format!("{PODS}?fieldSelector=metadata.name%3Dc"), None).await;
    assert_eq!(names(a.json()), vec!["c"]);
    let a = call(&kube, "GET", &format!("{PODS}?fieldSelector=spec.nope%3D1"), None).await;
    assert_eq!(a.status, 400);
    let a = call(&kube, "GET", &format!("{PODS}?labelSelector=a%20in%20(x"), None).await;
    assert_eq!(a.status, 400);
    // Pages of two, then the rest.
    let a = call(&kube, "GET", &format!("{PODS}?limit=2"), None).await.json();
    assert_eq!(names(a.clone()), vec!["a", "b"]);
    assert_eq!(a["metadata"]["remainingItemCount"], 1);
    let next = a["metadata"]["continue"].as_str().unwrap();
    let b = call(&kube, "GET", &format!("{PODS}?limit=2&continue={next}"), None)
        .await
        .json();
    assert_eq!(names(b.clone()), vec!["c"]);
    assert!(b["metadata"].get("continue").is_none());
    assert!(
        a["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 0
    );
    // Another namespace lists apart; all namespaces together.
    assert_eq!(
        call(
            &kube,
            "POST",
            "/api/v1/namespaces/team-a/pods",
            Some(&pod("d", json!({}), &["sleep", "30"]))
        )
        .await
        .status,
        201
    );
    assert_eq!(
        names(call(&kube, "GET", "/api/v1/namespaces/team-a/pods", None).await.json()),
        vec!["d"]
    );
    assert_eq!(
        names(call(&kube, "GET", "/api/v1/pods", None).await.json()),
        vec!["a", "b", "c", "d"]
    );
    // Delete a collection by label.
    let a = call(&kube, "DELETE", &format!("{PODS}?labelSelector=app%3Dweb"), None).await;
    assert_eq!(a.status, 200);
    assert_eq!(names(a.json()), vec!["a", "b"]);
    assert_eq!(names(call(&kube, "GET", PODS, None).await.json()), vec!["c"]);
    kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_runs_to_its_end_and_a_watch_sees_every_change() {
    let Some(kube) = fake("a_pod_runs_to_its_end_and_a_watch_sees_every_change", |_| {}).await else {
        return;
    };
    let rv = call(&kube, "GET", PODS, None).await.json()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let watch = {
        let addr = kube.addr();
        let token = kube.token().to_string();
        tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            s.write_all(
                format!(
                    "GET {PODS}?watch=true&resourceVersion={rv}&timeoutSeconds=8&labelSelector=w%3D1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
                )
                .as_bytes(),
            )
            .await
            .unwrap();
            let mut raw = Vec::new();
            s.read_to_end(&mut raw).await.unwrap();
            String::from_utf8_lossy(&raw).to_string()
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Succeeded with exit 0; Failed with its code.
    assert_eq!(
        call(
            &kube,
            "POST",
            PODS,
            Some(&pod("ok", json!({"w": "1"}), &["sh", "-c", "echo hi"]))
        )
        .await
        .status,
        201
    );
    assert_eq!(
        call(
            &kube,
            "POST",
            PODS,
            Some(&pod("bad", json!({}), &["sh", "-c", "exit 7"]))
        )
        .await
        .status,
        201
    );
    let done = kube.wait_phase("default", "ok", "Succeeded", WAIT).await.unwrap();
    let t = &done["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(t["exitCode"], 0);
    assert_eq!(t["reason"], "Completed");
    assert!(done["status"]["startTime"].is_string());
    let failed = kube.wait_phase("default", "bad", "Failed", WAIT).await.unwrap();
    assert_eq!(
        failed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        7
    );
    assert_eq!(
        failed["status"]["containerStatuses"][0]["state"]["terminated"]["reason"],
        "Error"
    );
    // Its log, and no box left behind (the object stays).
    let log = call(&kube, "GET", &format!("{PODS}/ok/log"), None).await;
    assert_eq!(log.body, b"hi\n");
    assert!(kube.pods().iter().all(|p| !p.has_box), "{:?}", kube.pods());
    // Unlabelled for the watch: the label leaves, so the watch sees it go.
    let a = patch(
        &kube,
        &format!("{PODS}/ok"),
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"w": null}}}),
    )
    .await;
    assert_eq!(a.status, 200);
    assert!(a.json()["metadata"].get("labels").is_none(), "{}", a.json());
    let a = call(&kube, "DELETE", &format!("{PODS}/ok"), None).await;
    assert_eq!(a.status, 200);
    assert!(a.json()["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(call(&kube, "GET", &format!("{PODS}/ok"), None).await.status, 404);
    let seen = watch.await.unwrap();
    let types: Vec<String> = seen
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .filter(|v| v["object"]["metadata"]["name"] == "ok")
        .map(|v| v["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(types.first().map(String::as_str), Some("ADDED"), "{seen}");
    assert!(types.iter().any(|t| t == "MODIFIED"), "{types:?}");
    // The label patch takes it out of the selection: DELETED, then nothing more of it.
    assert_eq!(types.last().map(String::as_str), Some("DELETED"), "{types:?}");
    assert_eq!(types.iter().filter(|t| *t == "DELETED").count(), 1, "{types:?}");
    kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patches_may_lower_the_deadline_and_the_deadline_ends_the_pod() {
    let Some(kube) = fake("patches_may_lower_the_deadline_and_the_deadline_ends_the_pod", |_| {}).await else {
        return;
    };
    let mut p = pod("slow", json!({}), &["sleep", "300"]);
    p["spec"]["activeDeadlineSeconds"] = json!(600);
    assert_eq!(call(&kube, "POST", PODS, Some(&p)).await.status, 201);
    kube.wait_phase("default", "slow", "Running", WAIT).await.unwrap();
    let path = format!("{PODS}/slow");
    let smp = "application/strategic-merge-patch+json";
    // Raising it, or another spec change, is the real server's 422.
    let a = patch(&kube, &path, smp, &json!({"spec": {"activeDeadlineSeconds": 900}})).await;
    assert_eq!(a.status, 422);
    assert_eq!(a.json()["details"]["causes"][0]["field"], "spec.activeDeadlineSeconds");
    let a = patch(&kube, &path, smp, &json!({"spec": {"restartPolicy": "Always"}})).await;
    assert_eq!(a.status, 422);
    assert!(
        a.json()["message"]
            .as_str()
            .unwrap()
            .contains("pod updates may not change fields other than")
    );
    let a = patch(&kube, &path, "application/apply-patch+yaml", &json!({})).await;
    assert_eq!(a.status, 415);
    // Labels and annotations may change; a JSON patch too.
    let a = patch(
        &kube,
        &path,
        smp,
        &json!({"metadata": {"labels": {"k": "v"}, "annotations": {"a": "1"}}}),
    )
    .await;
    assert_eq!(a.status, 200);
    let a = patch(
        &kube,
        &path,
        "application/json-patch+json",
        &json!([{"op": "add", "path": "/metadata/labels/j", "value": "2"}]),
    )
    .await;
    assert_eq!(a.json()["metadata"]["labels"], json!({"k": "v", "j": "2"}));
    // Lowered past the time it has run: Failed, DeadlineExceeded, its box ended.
    let a = patch(&kube, &path, smp, &json!({"spec": {"activeDeadlineSeconds": 1}})).await;
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
    let done = kube.wait_phase("default", "slow", "Failed", WAIT).await.unwrap();
    assert_eq!(done["status"]["reason"], "DeadlineExceeded");
    assert!(kube.pods().iter().all(|p| !p.has_box));
    kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_that_cannot_start_wait_as_a_kubelet_reports() {
    // Only the test image is known: any other is not found.
    let Some(kube) = fake("containers_that_cannot_start_wait_as_a_kubelet_reports", |o| {
        let rootfs = o.rootfs.take().unwrap();
        o.images.insert("debian:bookworm".into(), rootfs);
    })
    .await
    else {
        return;
    };
    let mut unknown = pod("img", json!({}), &["true"]);
    unknown["spec"]["containers"][0]["image"] = json!("nosuch/image:1");
    let mut root = pod("root", json!({}), &["true"]);
    root["spec"]["securityContext"] = json!({"runAsNonRoot": true});
    let mut nonroot = pod("nonroot", json!({}), &["sh", "-c", "id -u"]);
    nonroot["spec"]["securityContext"] = json!({"runAsNonRoot": true, "runAsUser": 1000});
    let nocmd =
        json!({"metadata": {"name": "nocmd"}, "spec": {"containers": [{"name": "c", "image": "debian:bookworm"}]}});
    for p in [&unknown, &root, &nonroot, &nocmd] {
        assert_eq!(call(&kube, "POST", PODS, Some(p)).await.status, 201);
    }
    let reason = |name: &'static str| {
        let kube = &kube;
        async move {
            for _ in 0..200 {
                if let Some(p) = kube.pod("default", name)
                    && let Some(r) = p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"].as_str()
                    && r != "ContainerCreating"
                    && r != "ErrImagePull"
                {
                    return r.to_string();
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("{name} never waited: {:?}", kube.pod("default", name));
        }
    };
    assert_eq!(reason("img").await, "ImagePullBackOff");
    assert_eq!(reason("root").await, "CreateContainerConfigError");
    assert_eq!(reason("nocmd").await, "CreateContainerError");
    // runAsUser is kept, and the program runs as the box's root all the same (documented).
    kube.wait_phase("default", "nonroot", "Succeeded", WAIT).await.unwrap();
    assert_eq!(
        call(&kube, "GET", &format!("{PODS}/nonroot/log"), None).await.body,
        b"0\n"
    );
    assert_eq!(kube.pod("default", "img").unwrap()["status"]["phase"], "Pending");
    kube.shutdown().await;
}

/// Exec over a WebSocket with `protocol`: stdout, stderr and the status frame.
async fn exec(
    kube: &agentbox_fakes::kube::FakeKube,
    pod: &str,
    protocol: &str,
    cmd: &[&str],
    stdin: Option<&[u8]>,
) -> (String, Vec<u8>, Vec<u8>, Value) {
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
    if stdin.is_some() {
        q.push("stdin=true".into());
    }
    let url = format!("ws://{}{PODS}/{pod}/exec?{}", kube.addr(), q.join("&"));
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("Authorization", format!("Bearer {}", kube.token()).parse().unwrap());
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", protocol.parse().unwrap());
    let tcp = tokio::net::TcpStream::connect(kube.addr()).await.unwrap();
    let (mut ws, resp) = tokio_tungstenite::client_async(req, tcp).await.expect("the upgrade");
    let chosen = resp
        .headers()
        .get("sec-websocket-protocol")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    if let Some(input) = stdin {
        let mut f = vec![0u8];
        f.extend_from_slice(input);
        ws.send(Message::binary(f)).await.unwrap();
        ws.send(Message::binary(vec![255u8, 0])).await.unwrap();
    }
    let (mut out, mut err, mut status) = (Vec::new(), Vec::new(), Value::Null);
    while let Some(m) = tokio::time::timeout(WAIT, ws.next())
        .await
        .expect("frames within the wait")
    {
        match m {
            Ok(Message::Binary(d)) if !d.is_empty() => match d[0] {
                1 => out.extend_from_slice(&d[1..]),
                2 => err.extend_from_slice(&d[1..]),
                3 => status = serde_json::from_slice(&d[1..]).unwrap(),
                _ => {}
            },
            Ok(Message::Close(_)) | Err(_) => break,
            _ => {}
        }
    }
    (chosen, out, err, status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_answers_exit_codes_over_v5_and_v4() {
    let Some(kube) = fake("exec_answers_exit_codes_over_v5_and_v4", |_| {}).await else {
        return;
    };
    assert_eq!(
        call(&kube, "POST", PODS, Some(&pod("e", json!({}), &["sleep", "300"])))
            .await
            .status,
        201
    );
    // Not running yet, or missing: refused before any upgrade.
    let a = call(
        &kube,
        "GET",
        &format!("{PODS}/missing/exec?command=true&stdout=true"),
        None,
    )
    .await;
    assert_eq!(a.status, 404);
    kube.wait_phase("default", "e", "Running", WAIT).await.unwrap();
    let (p, out, err, st) = exec(
        &kube,
        "e",
        "v5.channel.k8s.io, v4.channel.k8s.io",
        &["sh", "-c", "echo out; echo err >&2; exit 3"],
        None,
    )
    .await;
    assert_eq!(p, "v5.channel.k8s.io");
    assert_eq!(out, b"out\n");
    assert_eq!(err, b"err\n");
    assert_eq!(st["status"], "Failure");
    assert_eq!(st["reason"], "NonZeroExitCode");
    assert_eq!(st["details"]["causes"], json!([{"reason": "ExitCode", "message": "3"}]));
    // The client's order of preference picks.
    let (p, out, _, st) = exec(
        &kube,
        "e",
        "v4.channel.k8s.io, v5.channel.k8s.io",
        &["echo", "four"],
        None,
    )
    .await;
    assert_eq!(p, "v4.channel.k8s.io");
    assert_eq!(out, b"four\n");
    assert_eq!(st, json!({"metadata": {}, "status": "Success"}));
    // v5's close of stdin ends `cat`.
    let (_, out, _, st) = exec(&kube, "e", "v5.channel.k8s.io", &["cat"], Some(b"piped")).await;
    assert_eq!(out, b"piped");
    assert_eq!(st["status"], "Success");
    // A finished pod refuses with its phase.
    assert_eq!(
        call(&kube, "POST", PODS, Some(&pod("done", json!({}), &["true"])))
            .await
            .status,
        201
    );
    kube.wait_phase("default", "done", "Succeeded", WAIT).await.unwrap();
    let a = call(
        &kube,
        "GET",
        &format!("{PODS}/done/exec?command=true&stdout=true"),
        None,
    )
    .await;
    assert_eq!(a.status, 400);
    assert!(
        a.json()["message"]
            .as_str()
            .unwrap()
            .contains("current phase is Succeeded")
    );
    kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_v5_exec_speaks_v4() {
    let Some(kube) = fake("without_v5_exec_speaks_v4", |o| o.v5 = false).await else {
        return;
    };
    assert_eq!(
        call(&kube, "POST", PODS, Some(&pod("e", json!({}), &["sleep", "300"])))
            .await
            .status,
        201
    );
    kube.wait_phase("default", "e", "Running", WAIT).await.unwrap();
    let (p, _, _, st) = exec(
        &kube,
        "e",
        "v5.channel.k8s.io, v4.channel.k8s.io",
        &["sh", "-c", "exit 5"],
        None,
    )
    .await;
    assert_eq!(p, "v4.channel.k8s.io");
    assert_eq!(st["details"]["causes"][0]["message"], "5");
    drop(kube);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_all_egress_policy_isolates_the_pods_it_selects() {
    let Some(kube) = fake("a_deny_all_egress_policy_isolates_the_pods_it_selects", |_| {}).await else {
        return;
    };
    let np = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "deny"},
        "spec": {"podSelector": {"matchLabels": {"sandbox": "1"}}, "policyTypes": ["Egress"]},
    });
    let nps = "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies";
    assert_eq!(call(&kube, "POST", nps, Some(&np)).await.status, 201);
    assert_eq!(call(&kube, "POST", nps, Some(&np)).await.status, 409);
    assert_eq!(call(&kube, "GET", &format!("{nps}/deny"), None).await.status, 200);
    assert_eq!(
        call(
            &kube,
            "POST",
            PODS,
            Some(&pod("in", json!({"sandbox": "1"}), &["sleep", "300"]))
        )
        .await
        .status,
        201
    );
    assert_eq!(
        call(&kube, "POST", PODS, Some(&pod("out", json!({}), &["sleep", "300"])))
            .await
            .status,
        201
    );
    kube.wait_phase("default", "in", "Running", WAIT).await.unwrap();
    kube.wait_phase("default", "out", "Running", WAIT).await.unwrap();
    let isolated = |n: &str| kube.pods().into_iter().find(|p| p.name == n).unwrap().isolated;
    assert!(isolated("in"));
    assert!(!isolated("out"));
    let (_, out, _, _) = exec(&kube, "in", "v5.channel.k8s.io", &["cat", "/proc/net/dev"], None).await;
    let text = String::from_utf8_lossy(&out);
    assert_eq!(text.lines().skip(2).count(), 1, "loopback only: {text}");
    let a = call(&kube, "DELETE", &format!("{nps}?labelSelector="), None).await;
    assert_eq!(a.json()["items"].as_array().unwrap().len(), 1);
    kube.shutdown().await;
}

/// The processes of this machine whose command line names `dir` (a fake's boxes').
fn processes_under(dir: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(dir))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_box_outlives_its_pod_even_one_deleted_while_it_was_made() {
    let Some(kube) = fake("no_box_outlives_its_pod_even_one_deleted_while_it_was_made", |_| {}).await else {
        return;
    };
    let dir = kube.kubeconfig().parent().unwrap().to_string_lossy().into_owned();
    // Deleted a few milliseconds in, over the time a box takes to make (about 10 ms here), so
    // some are deleted while theirs is being made.
    for i in 0..12u64 {
        let name = format!("brief-{i}");
        assert_eq!(
            call(&kube, "POST", PODS, Some(&pod(&name, json!({}), &["sleep", "300"])))
                .await
                .status,
            201
        );
        tokio::time::sleep(Duration::from_millis(2 * i)).await;
        assert_eq!(call(&kube, "DELETE", &format!("{PODS}/{name}"), None).await.status, 200);
    }
    assert_eq!(
        call(&kube, "POST", PODS, Some(&pod("kept", json!({}), &["sleep", "300"])))
            .await
            .status,
        201
    );
    kube.wait_phase("default", "kept", "Running", WAIT).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Only the running pod's box (its keeper, the keeper's unix socket supervisor, the egress
    // proxy of its network and its init) is left while the fake runs.
    let live = processes_under(&dir);
    assert_eq!(live.len(), 4, "{live:?}");
    drop(kube);
    let t = std::time::Instant::now();
    while !processes_under(&dir).is_empty() && t.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(processes_under(&dir), Vec::<i32>::new());
}

const CLAIMS: &str = "/api/v1/namespaces/default/persistentvolumeclaims";
const SECRETS: &str = "/api/v1/namespaces/default/secrets";

/// A claim of `name` for 1Gi, ReadWriteOnce.
fn claim(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    })
}

/// A pod running `command` with `volumes`, each mounted as `mounts` says.
fn pod_with(name: &str, command: &[&str], volumes: Value, mounts: Value) -> Value {
    let mut p = pod(name, json!({}), command);
    p["spec"]["volumes"] = volumes;
    p["spec"]["containers"][0]["volumeMounts"] = mounts;
    p
}

/// The fields of a 422's causes.
fn fields_of(a: &common::Answer) -> Vec<String> {
    assert_eq!(a.status, 422, "{}", String::from_utf8_lossy(&a.body));
    a.json()["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap().to_string())
        .collect()
}

/// Wait until `name`'s container waits with a message, and answer its reason and message.
async fn waiting(kube: &agentbox_fakes::kube::FakeKube, name: &str) -> (String, String) {
    for _ in 0..400 {
        if let Some(p) = kube.pod("default", name) {
            let w = &p["status"]["containerStatuses"][0]["state"]["waiting"];
            if let Some(m) = w["message"].as_str() {
                return (w["reason"].as_str().unwrap_or("").to_string(), m.to_string());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{name} never waited with a message: {:?}", kube.pod("default", name));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_keeps_its_files_from_pod_to_pod_and_goes_with_its_last_pod() {
    let Some(kube) = fake(
        "a_claim_keeps_its_files_from_pod_to_pod_and_goes_with_its_last_pod",
        |_| {},
    )
    .await
    else {
        return;
    };
    // Refused as the real server refuses, each field named.
    let a = call(
        &kube,
        "POST",
        CLAIMS,
        Some(&json!({"metadata": {"name": "bad"}, "spec": {"accessModes": ["Sometimes"]}})),
    )
    .await;
    let fields = fields_of(&a);
    assert_eq!(
        fields,
        vec!["spec.accessModes", "spec.resources[storage]"],
        "{}",
        a.json()
    );
    let mut block = claim("block");
    block["spec"]["volumeMode"] = json!("Block");
    assert_eq!(
        fields_of(&call(&kube, "POST", CLAIMS, Some(&block)).await),
        vec!["spec.volumeMode"]
    );
    // Created Pending, as the server answers before the binder; bound at once after.
    let a = call(&kube, "POST", CLAIMS, Some(&claim("data"))).await;
    assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.body));
    let made = a.json();
    assert_eq!(made["status"]["phase"], "Pending");
    assert_eq!(made["spec"]["volumeMode"], "Filesystem");
    assert_eq!(made["metadata"]["finalizers"], json!(["kubernetes.io/pvc-protection"]));
    assert_eq!(call(&kube, "POST", CLAIMS, Some(&claim("data"))).await.status, 409);
    let got = call(&kube, "GET", &format!("{CLAIMS}/data"), None).await.json();
    assert_eq!(got["status"]["phase"], "Bound", "{got}");
    assert_eq!(got["status"]["capacity"]["storage"], "1Gi");
    let uid = made["metadata"]["uid"].as_str().unwrap();
    assert_eq!(got["spec"]["volumeName"], format!("pvc-{uid}"));
    // Its metadata may change, not its spec; its status is the controllers'.
    let merge = "application/merge-patch+json";
    let a = patch(
        &kube,
        &format!("{CLAIMS}/data"),
        merge,
        &json!({"metadata": {"labels": {"k": "v"}}, "status": {"phase": "Lost"}}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
    assert_eq!(a.json()["status"]["phase"], "Bound");
    let grow = json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}});
    assert_eq!(
        fields_of(&patch(&kube, &format!("{CLAIMS}/data"), merge, &grow).await),
        vec!["spec"]
    );
    let all = call(&kube, "GET", "/api/v1/persistentvolumeclaims", None).await.json();
    assert_eq!(all["kind"], "PersistentVolumeClaimList");
    assert_eq!(all["items"].as_array().unwrap().len(), 1);
    // A pod writes on the claim, a second one reads it back.
    let volumes = json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]);
    let mounts = json!([{"name": "data", "mountPath": "/data"}]);
    let writer = pod_with(
        "writer",
        &["sh", "-c", "echo kept > /data/note && mkdir /data/dir"],
        volumes.clone(),
        mounts.clone(),
    );
    assert_eq!(call(&kube, "POST", PODS, Some(&writer)).await.status, 201);
    kube.wait_phase("default", "writer", "Succeeded", WAIT).await.unwrap();
    let reader = pod_with(
        "reader",
        &["sh", "-c", "cat /data/note; ls /data"],
        volumes.clone(),
        mounts.clone(),
    );
    assert_eq!(call(&kube, "POST", PODS, Some(&reader)).await.status, 201);
    kube.wait_phase("default", "reader", "Succeeded", WAIT).await.unwrap();
    assert_eq!(
        call(&kube, "GET", &format!("{PODS}/reader/log"), None).await.body,
        b"kept\ndir\nnote\n"
    );
    // readOnly on the claim's volume: the mount refuses writes.
    let ro = pod_with(
        "ro",
        &[
            "sh",
            "-c",
            "cat /data/note; touch /data/other 2>/dev/null && echo wrote || echo refused",
        ],
        json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data", "readOnly": true}}]),
        mounts.clone(),
    );
    assert_eq!(call(&kube, "POST", PODS, Some(&ro)).await.status, 201);
    kube.wait_phase("default", "ro", "Succeeded", WAIT).await.unwrap();
    assert_eq!(
        call(&kube, "GET", &format!("{PODS}/ro/log"), None).await.body,
        b"kept\nrefused\n"
    );
    let dir = kube.kubeconfig().parent().unwrap().join("volumes/claims/default/data");
    assert!(dir.join("note").is_file(), "{}", dir.display());
    // Deleted while pods name it: marked, kept (pvc-protection) until the last of them goes.
    let a = call(&kube, "DELETE", &format!("{CLAIMS}/data"), None).await;
    assert_eq!(a.status, 200);
    assert!(a.json()["metadata"]["deletionTimestamp"].is_string());
    assert!(call(&kube, "GET", &format!("{CLAIMS}/data"), None).await.status == 200);
    // A pod made now is not scheduled: its claim is being deleted.
    let late = pod_with("late", &["true"], volumes.clone(), mounts.clone());
    assert_eq!(call(&kube, "POST", PODS, Some(&late)).await.status, 201);
    let mut said = Value::Null;
    for _ in 0..100 {
        said = kube.pod("default", "late").unwrap()["status"]["conditions"][0].clone();
        if said["reason"] == "Unschedulable" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        said["message"]
            .as_str()
            .unwrap_or("")
            .contains("persistentvolumeclaim \"data\" is being deleted"),
        "{said}"
    );
    // Gone before the claim is made again, so it makes no box as the test ends.
    assert_eq!(call(&kube, "DELETE", &format!("{PODS}/late"), None).await.status, 200);
    for p in ["writer", "reader", "ro"] {
        assert_eq!(call(&kube, "DELETE", &format!("{PODS}/{p}"), None).await.status, 200);
        if p != "ro" {
            assert_eq!(call(&kube, "GET", &format!("{CLAIMS}/data"), None).await.status, 200);
        }
    }
    assert_eq!(call(&kube, "GET", &format!("{CLAIMS}/data"), None).await.status, 404);
    assert!(!dir.exists(), "the claim's volume outlived it");
    // Made again: a new, empty volume.
    assert_eq!(call(&kube, "POST", CLAIMS, Some(&claim("data"))).await.status, 201);
    let again = pod_with(
        "again",
        &["sh", "-c", "ls -A /data | wc -l"],
        volumes.clone(),
        mounts.clone(),
    );
    assert_eq!(call(&kube, "POST", PODS, Some(&again)).await.status, 201);
    kube.wait_phase("default", "again", "Succeeded", WAIT).await.unwrap();
    assert_eq!(
        call(&kube, "GET", &format!("{PODS}/again/log"), None).await.body,
        b"0\n"
    );
    kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_volume_holds_its_keys_read_only() {
    let Some(kube) = fake("a_secret_volume_holds_its_keys_read_only", |_| {}).await else {
        return;
    };
    // data is base64 (the decoder's 400 otherwise); keys as config keys (422).
    let bad = json!({"metadata": {"name": "bad"}, "data": {"k": "not base64!"}});
    let a = call(&kube, "POST", SECRETS, Some(&bad)).await;
    assert_eq!(a.status, 400);
    assert!(
        a.json()["message"]
            .as_str()
            .unwrap()
            .contains("illegal base64 data at input byte 3"),
        "{}",
        a.json()
    );
    let bad = json!({"metadata": {"name": "bad"}, "stringData": {"no spaces": "x"}});
    assert_eq!(
        fields_of(&call(&kube, "POST", SECRETS, Some(&bad)).await),
        vec!["data[no spaces]"]
    );
    let tls = json!({"metadata": {"name": "tls"}, "type": "kubernetes.io/tls", "stringData": {"tls.crt": "c"}});
    assert_eq!(
        fields_of(&call(&kube, "POST", SECRETS, Some(&tls)).await),
        vec!["data[tls.key]"]
    );
    // stringData is merged into data, winning where both name a key, and not kept.
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "creds"},
        "data": {"a": "ZnJvbS1kYXRh", "b": "Yg=="},
        "stringData": {"a": "from-stringData", "c": "plain"},
    });
    let a = call(&kube, "POST", SECRETS, Some(&secret)).await;
    assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.body));
    let made = a.json();
    assert_eq!(made["type"], "Opaque");
    assert!(made.get("stringData").is_none(), "{made}");
    assert_eq!(
        made["data"],
        json!({"a": "ZnJvbS1zdHJpbmdEYXRh", "b": "Yg==", "c": "cGxhaW4="})
    );
    assert_eq!(
        call(&kube, "GET", &format!("{SECRETS}/creds"), None).await.json()["data"],
        made["data"]
    );
    let names: Vec<Value> = call(&kube, "GET", SECRETS, None).await.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].clone())
        .collect();
    assert_eq!(names, vec![json!("creds")]);
    // Every key as a file (0644 by default), and items at their paths with their modes.
    let volumes = json!([
        {"name": "creds", "secret": {"secretName": "creds"}},
        {"name": "some", "secret": {"secretName": "creds", "defaultMode": 0o440,
            "items": [{"key": "c", "path": "sub/plain.txt", "mode": 0o400}, {"key": "b", "path": "b.txt"}]}},
    ]);
    let mounts = json!([{"name": "creds", "mountPath": "/creds"}, {"name": "some", "mountPath": "/some"}]);
    // The shell's own word on a refused redirection goes to /dev/null: the log interleaves
    // stdout and stderr as they come.
    let script = "cat /creds/a; echo; stat -c %a /creds/a /some/sub/plain.txt /some/b.txt; \
                  cat /some/sub/plain.txt; echo; ls /some | tr '\\n' ' '; echo; \
                  if { echo x > /creds/a; } 2>/dev/null; then echo writable; else echo read-only; fi";
    let p = pod_with("reads", &["sh", "-c", script], volumes, mounts);
    let a = call(&kube, "POST", PODS, Some(&p)).await;
    assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.body));
    assert_eq!(a.json()["spec"]["volumes"][0]["secret"]["defaultMode"], 420);
    kube.wait_phase("default", "reads", "Succeeded", WAIT).await.unwrap();
    let log = String::from_utf8(call(&kube, "GET", &format!("{PODS}/reads/log"), None).await.body).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(
        lines,
        vec![
            "from-stringData",
            "644",
            "400",
            "440",
            "plain",
            "b.txt sub ",
            "read-only"
        ],
        "{log}"
    );
    // Patched: stringData merged in again; once immutable, its data may not change.
    let path = format!("{SECRETS}/creds");
    let merge = "application/merge-patch+json";
    let a = patch(
        &kube,
        &path,
        merge,
        &json!({"stringData": {"b": "new"}, "immutable": true}),
    )
    .await;
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
    assert_eq!(a.json()["data"]["b"], "bmV3");
    assert!(a.json().get("stringData").is_none());
    let a = patch(&kube, &path, merge, &json!({"data": {"b": "b2xk"}})).await;
    assert_eq!(fields_of(&a), vec!["data"]);
    let a = patch(&kube, &path, merge, &json!({"type": "kubernetes.io/basic-auth"})).await;
    // As ValidateSecretUpdate: the type may not change, and the new one's keys are checked too.
    assert_eq!(fields_of(&a), vec!["type", "data[username]", "data[password]"]);
    let a = patch(&kube, &path, merge, &json!({"metadata": {"labels": {"k": "v"}}})).await;
    assert_eq!(a.status, 200);
    assert_eq!(call(&kube, "DELETE", &path, None).await.status, 200);
    assert_eq!(call(&kube, "GET", &path, None).await.status, 404);
    kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_path_is_bound_as_its_type_says_and_read_only_where_the_mount_says() {
    let Some(kube) = fake(
        "a_host_path_is_bound_as_its_type_says_and_read_only_where_the_mount_says",
        |_| {},
    )
    .await
    else {
        return;
    };
    use std::os::unix::fs::PermissionsExt;
    let host = tempfile::tempdir().unwrap();
    std::fs::set_permissions(host.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = host.path().join("greeting");
    std::fs::write(&file, "hello from the host\n").unwrap();
    // Writable by anyone: only the read-only bind keeps the box from writing it.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
    let made = host.path().join("made");
    let volumes = json!([
        {"name": "greeting", "hostPath": {"path": file, "type": "File"}},
        {"name": "made", "hostPath": {"path": made, "type": "DirectoryOrCreate"}},
    ]);
    let mounts = json!([
        {"name": "greeting", "mountPath": "/tmp/host/greeting", "readOnly": true},
        {"name": "made", "mountPath": "/made"},
    ]);
    let script = "cat /tmp/host/greeting; \
                  if { echo x >> /tmp/host/greeting; } 2>/dev/null; then echo writable; else echo read-only; fi; \
                  test -d /made && echo made";
    let p = pod_with("host", &["sh", "-c", script], volumes, mounts);
    let a = call(&kube, "POST", PODS, Some(&p)).await;
    assert_eq!(a.status, 201, "{}", String::from_utf8_lossy(&a.body));
    kube.wait_phase("default", "host", "Succeeded", WAIT).await.unwrap();
    let log = String::from_utf8(call(&kube, "GET", &format!("{PODS}/host/log"), None).await.body).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines, vec!["hello from the host", "read-only", "made"], "{log}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "hello from the host\n");
    assert!(made.is_dir(), "DirectoryOrCreate made it on the host");
    // The same file without readOnly is written through.
    let p = pod_with(
        "host-rw",
        &["sh", "-c", "echo appended >> /tmp/host/greeting"],
        json!([{"name": "greeting", "hostPath": {"path": file, "type": "File"}}]),
        json!([{"name": "greeting", "mountPath": "/tmp/host/greeting"}]),
    );
    assert_eq!(call(&kube, "POST", PODS, Some(&p)).await.status, 201);
    kube.wait_phase("default", "host-rw", "Succeeded", WAIT).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "hello from the host\nappended\n"
    );
    kube.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_claims_secrets_and_host_paths_are_reported_as_a_cluster_reports_them() {
    let Some(kube) = fake(
        "missing_claims_secrets_and_host_paths_are_reported_as_a_cluster_reports_them",
        |_| {},
    )
    .await
    else {
        return;
    };
    // What the real server refuses of these volumes, each field named.
    let p = pod_with(
        "bad",
        &["true"],
        json!([
            {"name": "a", "hostPath": {"path": "/x", "type": "Bogus"}},
            {"name": "b", "secret": {"defaultMode": 0o1000}},
            {"name": "c", "persistentVolumeClaim": {}},
            {"name": "d", "emptyDir": {}, "hostPath": {"path": "/y"}},
            {"name": "e"},
            {"name": "f", "secret": {"secretName": "s", "items": [{"key": "k", "path": "../out"}]}},
        ]),
        json!([]),
    );
    let fields = fields_of(&call(&kube, "POST", PODS, Some(&p)).await);
    for f in [
        "spec.volumes[0].hostPath.type",
        "spec.volumes[1].secret.secretName",
        "spec.volumes[1].secret.defaultMode",
        "spec.volumes[2].persistentVolumeClaim.claimName",
        "spec.volumes[3].hostPath",
        "spec.volumes[4]",
        "spec.volumes[5].secret.items[0].path",
    ] {
        assert!(fields.iter().any(|x| x == f), "{f} not in {fields:?}");
    }
    // A claim that is not there: not scheduled, as the scheduler says; made, the pod runs.
    let p = pod_with(
        "noclaim",
        &["sh", "-c", "echo ran > /data/f && cat /data/f"],
        json!([{"name": "data", "persistentVolumeClaim": {"claimName": "later"}}]),
        json!([{"name": "data", "mountPath": "/data"}]),
    );
    assert_eq!(call(&kube, "POST", PODS, Some(&p)).await.status, 201);
    // A secret that is not there: ContainerCreating, with the kubelet's words.
    let p = pod_with(
        "nosecret",
        &["cat", "/creds/token"],
        json!([{"name": "creds", "secret": {"secretName": "absent"}}]),
        json!([{"name": "creds", "mountPath": "/creds"}]),
    );
    assert_eq!(call(&kube, "POST", PODS, Some(&p)).await.status, 201);
    // A hostPath failing its type check, likewise; a device, which the fake cannot give.
    let p = pod_with(
        "nohost",
        &["true"],
        json!([{"name": "h", "hostPath": {"path": "/nonexistent/agentbox-fake-test", "type": "Directory"}}]),
        json!([{"name": "h", "mountPath": "/h"}]),
    );
    assert_eq!(call(&kube, "POST", PODS, Some(&p)).await.status, 201);
    let p = pod_with(
        "device",
        &["true"],
        json!([{"name": "h", "hostPath": {"path": "/dev/null", "type": "CharDevice"}}]),
        json!([{"name": "h", "mountPath": "/h"}]),
    );
    assert_eq!(call(&kube, "POST", PODS, Some(&p)).await.status, 201);
    let mut cond = Value::Null;
    for _ in 0..100 {
        cond = kube.pod("default", "noclaim").unwrap()["status"]["conditions"][0].clone();
        if cond["reason"] == "Unschedulable" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cond["type"], "PodScheduled", "{cond}");
    assert_eq!(cond["status"], "False");
    assert_eq!(
        cond["message"],
        "0/1 nodes are available: persistentvolumeclaim \"later\" not found. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
    );
    let noclaim = kube.pod("default", "noclaim").unwrap();
    assert_eq!(noclaim["status"]["phase"], "Pending");
    assert!(noclaim["spec"].get("nodeName").is_none(), "{noclaim}");
    assert_eq!(
        waiting(&kube, "nosecret").await,
        (
            "ContainerCreating".to_string(),
            "MountVolume.SetUp failed for volume \"creds\" : secret \"absent\" not found".to_string()
        )
    );
    assert_eq!(
        waiting(&kube, "nohost").await,
        (
            "ContainerCreating".to_string(),
            "MountVolume.SetUp failed for volume \"h\" : hostPath type check failed: /nonexistent/agentbox-fake-test is not a directory".to_string()
        )
    );
    let (reason, message) = waiting(&kube, "device").await;
    assert_eq!(reason, "CreateContainerError");
    assert!(message.contains("CharDevice"), "{message}");
    // What was missing comes: each pod runs.
    assert_eq!(call(&kube, "POST", CLAIMS, Some(&claim("later"))).await.status, 201);
    let secret = json!({"metadata": {"name": "absent"}, "stringData": {"token": "at last"}});
    assert_eq!(call(&kube, "POST", SECRETS, Some(&secret)).await.status, 201);
    kube.wait_phase("default", "noclaim", "Succeeded", WAIT).await.unwrap();
    kube.wait_phase("default", "nosecret", "Succeeded", WAIT).await.unwrap();
    assert_eq!(
        call(&kube, "GET", &format!("{PODS}/noclaim/log"), None).await.body,
        b"ran\n"
    );
    assert_eq!(
        call(&kube, "GET", &format!("{PODS}/nosecret/log"), None).await.body,
        b"at last"
    );
    kube.shutdown().await;
}

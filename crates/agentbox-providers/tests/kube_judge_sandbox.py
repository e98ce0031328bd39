"""The `kubernetes` Python client's CustomObjectsApi against the fake in agent-sandbox mode
(KUBECONFIG): one `OK <step>` line per step that held; any failure raises, so the script
exits non-zero with a traceback. Run by tests/kube.rs (its `judged` module) with the venv's python from
scripts/kube-clients."""

import sys
import time

from kubernetes import client, config
from kubernetes.client.rest import ApiException

config.load_kube_config()
co = client.CustomObjectsApi()
v1 = client.CoreV1Api()
NS = "default"
CORE = ("agents.x-k8s.io", "v1beta1")
EXT = ("extensions.agents.x-k8s.io", "v1beta1")
POD_SPEC = {
    "restartPolicy": "Never",
    "containers": [{"name": "main", "image": "debian:bookworm", "command": ["sleep", "300"]}],
}


def ok(step):
    print("OK", step, flush=True)


def status_of(f):
    try:
        f()
    except ApiException as e:
        return e.status
    raise AssertionError("no ApiException")


def gone(f):
    """Whether `f` answers 404 (False while the object is still there)."""
    try:
        f()
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


def until(what, f, tries=300):
    for _ in range(tries):
        got = f()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"not within {tries / 10} s: {what}")


def ready(obj):
    for c in obj.get("status", {}).get("conditions", []):
        if c["type"] == "Ready":
            return c
    return None


sandbox = {
    "apiVersion": "agents.x-k8s.io/v1beta1",
    "kind": "Sandbox",
    "metadata": {"name": "py-sb", "labels": {"judge": "py"}},
    "spec": {"podTemplate": {"metadata": {"labels": {"app": "py"}}, "spec": POD_SPEC}},
}
made = co.create_namespaced_custom_object(*CORE, NS, "sandboxes", sandbox)
assert made["metadata"]["uid"], made
assert made["spec"]["operatingMode"] == "Running", made
ok("create-sandbox")
assert status_of(lambda: co.create_namespaced_custom_object(*CORE, NS, "sandboxes", sandbox)) == 409
ok("conflict-409")
bad = {"apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox", "metadata": {"name": "py-bad"}, "spec": {}}
assert status_of(lambda: co.create_namespaced_custom_object(*CORE, NS, "sandboxes", bad)) == 422
ok("invalid-422")

sb = until("py-sb Ready", lambda: (lambda s: s if (ready(s) or {}).get("status") == "True" else None)(
    co.get_namespaced_custom_object(*CORE, NS, "sandboxes", "py-sb")))
assert sb["status"]["podIPs"], sb
pod = v1.read_namespaced_pod("py-sb", NS)
assert pod.metadata.labels["app"] == "py", pod.metadata.labels
assert pod.metadata.owner_references[0].kind == "Sandbox"
ok("get-sandbox")
names = [o["metadata"]["name"] for o in co.list_namespaced_custom_object(*CORE, NS, "sandboxes", label_selector="judge=py")["items"]]
assert names == ["py-sb"], names
assert co.list_namespaced_custom_object(*CORE, NS, "sandboxes", label_selector="judge=other")["items"] == []
assert [o["metadata"]["name"] for o in co.list_cluster_custom_object(*CORE, "sandboxes")["items"]] == ["py-sb"]
ok("list-sandbox")
patched = co.patch_namespaced_custom_object(*CORE, NS, "sandboxes", "py-sb", {"metadata": {"labels": {"extra": "yes"}}})
assert patched["metadata"]["labels"]["extra"] == "yes", patched
ok("patch-sandbox")

co.create_namespaced_custom_object(*EXT, NS, "sandboxtemplates", {
    "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
    "metadata": {"name": "py-tmpl"},
    "spec": {"networkPolicyManagement": "Unmanaged", "podTemplate": {"spec": POD_SPEC}},
})
co.create_namespaced_custom_object(*EXT, NS, "sandboxwarmpools", {
    "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
    "metadata": {"name": "py-pool"},
    "spec": {"replicas": 1, "sandboxTemplateRef": {"name": "py-tmpl"}},
})
until("the pool Ready", lambda: co.get_namespaced_custom_object(*EXT, NS, "sandboxwarmpools", "py-pool").get("status", {}).get("readyReplicas") == 1)
claim = {
    "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
    "metadata": {"name": "py-claim"},
    "spec": {"warmPoolRef": {"name": "py-pool"}},
}
co.create_namespaced_custom_object(*EXT, NS, "sandboxclaims", claim)
ok("create-claim")
c = until("the claim Ready", lambda: (lambda c: c if (ready(c) or {}).get("status") == "True" else None)(
    co.get_namespaced_custom_object(*EXT, NS, "sandboxclaims", "py-claim")))
adopted = c["status"]["sandbox"]["name"]
assert adopted.startswith("py-pool-"), adopted
owner = co.get_namespaced_custom_object(*CORE, NS, "sandboxes", adopted)["metadata"]["ownerReferences"][0]
assert owner["kind"] == "SandboxClaim" and owner["name"] == "py-claim", owner
ok(f"get-claim {adopted[:len('py-pool-')]}")
names = [o["metadata"]["name"] for o in co.list_namespaced_custom_object(*EXT, NS, "sandboxclaims")["items"]]
assert names == ["py-claim"], names
ok("list-claim")
co.delete_namespaced_custom_object(*EXT, NS, "sandboxclaims", "py-claim")
assert status_of(lambda: co.get_namespaced_custom_object(*EXT, NS, "sandboxclaims", "py-claim")) == 404
until("the adopted Sandbox collected", lambda: gone(lambda: co.get_namespaced_custom_object(*CORE, NS, "sandboxes", adopted)))
ok("delete-claim")
co.delete_namespaced_custom_object(*CORE, NS, "sandboxes", "py-sb")
assert status_of(lambda: co.get_namespaced_custom_object(*CORE, NS, "sandboxes", "py-sb")) == 404
until("py-sb's pod collected", lambda: gone(lambda: v1.read_namespaced_pod("py-sb", NS)))
ok("delete-sandbox")
sys.exit(0)

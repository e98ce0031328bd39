"""The `kubernetes` Python client against the fake (KUBECONFIG): one `OK <step>` line per
step that held; any failure raises, so the script exits non-zero with a traceback. Run by
tests/kube.rs (its `judged` module) with the venv's python from scripts/kube-clients."""

import random
import socket
import sys
import time

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.stream import portforward, stream

config.load_kube_config()
v1 = client.CoreV1Api()
NS = "default"


def ok(step):
    print("OK", step, flush=True)


def pod(name, labels, command, deadline=600):
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(
            restart_policy="Never",
            active_deadline_seconds=deadline,
            containers=[client.V1Container(name="main", image="debian:bookworm", command=command)],
        ),
    )


def running(name):
    for _ in range(300):
        phase = v1.read_namespaced_pod(name, NS).status.phase
        if phase == "Running":
            return
        time.sleep(0.1)
    raise AssertionError(f"{name} is not Running: {phase}")


def status_of(f):
    try:
        f()
    except ApiException as e:
        return e.status
    raise AssertionError("no ApiException")


v1.create_namespaced_pod(NS, pod("py-a", {"judge": "py", "k": "a"}, ["sleep", "300"]))
v1.create_namespaced_pod(NS, pod("py-b", {"judge": "py", "k": "b"}, ["sleep", "300"]))
ok("create")
names = [p.metadata.name for p in v1.list_namespaced_pod(NS, label_selector="judge=py,k=a").items]
assert names == ["py-a"], names
ok("list-selector")
assert status_of(lambda: v1.create_namespaced_pod(NS, pod("py-a", {}, ["true"]))) == 409
ok("conflict-409")
assert status_of(lambda: v1.read_namespaced_pod("py-missing", NS)) == 404
ok("missing-404")

running("py-a")
r = stream(v1.connect_get_namespaced_pod_exec, "py-a", NS, command=["sh", "-c", "echo hi; exit 3"],
           stderr=True, stdin=False, stdout=True, tty=False, _preload_content=False)
r.run_forever(timeout=30)
assert r.returncode == 3, r.returncode
ok(f"exec-returncode {r.returncode}")

r = stream(v1.connect_get_namespaced_pod_exec, "py-a", NS, command=["cat"],
           stderr=True, stdin=True, stdout=True, tty=False, _preload_content=False)
r.write_stdin("piped\n")
if r.subprotocol == "v5.channel.k8s.io":
    r.close_channel(0)
    r.run_forever(timeout=30)
    out = r.read_channel(1)
    assert out == "piped\n", repr(out)
    assert r.returncode == 0, r.returncode
    ok("exec-stdin v5")
else:
    got = ""
    for _ in range(100):
        r.update(timeout=0.1)
        got += r.read_stdout() if r.peek_stdout() else ""
        if got:
            break
    assert got == "piped\n", repr(got)
    r.close()
    ok(f"exec-stdin {r.subprotocol}")

v1.patch_namespaced_pod("py-a", NS, {"spec": {"activeDeadlineSeconds": 500}})
assert v1.read_namespaced_pod("py-a", NS).spec.active_deadline_seconds == 500
ok("deadline-lowered")
assert status_of(lambda: v1.patch_namespaced_pod("py-a", NS, {"spec": {"activeDeadlineSeconds": 900}})) == 422
ok("deadline-raised-422")

# A TCP server in a pod: the runner's own health endpoint (the one program with a listening
# socket that every box has, at /run/agentbox-runner), on a port of this machine's network.
port = random.randint(20000, 40000)
v1.create_namespaced_pod(NS, pod("py-srv", {"judge": "py"}, ["/run/agentbox-runner", "serve", "--listen", f"127.0.0.1:{port}"]))
running("py-srv")
answer = b""
for attempt in range(50):
    pf = portforward(v1.connect_get_namespaced_pod_portforward, "py-srv", NS, ports=str(port))
    s = pf.socket(port)
    s.settimeout(10)
    s.sendall(b"GET /runner/health HTTP/1.0\r\nHost: box\r\n\r\n")
    answer = b""
    try:
        while True:
            b = s.recv(4096)
            if not b:
                break
            answer += b
    except socket.timeout:
        pass
    s.close()
    if b"protocol" in answer:
        break
    time.sleep(0.2)
assert b"protocol" in answer, (answer, pf.error(port))
ok("portforward")

v1.delete_namespaced_pod("py-a", NS)
assert status_of(lambda: v1.read_namespaced_pod("py-a", NS)) == 404
ok("delete")
v1.delete_collection_namespaced_pod(NS, label_selector="judge=py")
assert v1.list_namespaced_pod(NS, label_selector="judge=py").items == []
ok("deletecollection")
sys.exit(0)

"""The judge of agentbox's fake Modal: Modal's own Python SDK (`modal` 1.6.x), which nobody
here wrote, drives the fake and asserts each answer. Run by tests/modal.rs (its `judged` module), which
starts the fake and sets MODAL_SERVER_URL, MODAL_TOKEN_ID, MODAL_TOKEN_SECRET,
MODAL_CONFIG_PATH (an empty file) and MODAL_SANDBOX_V2=0 (the V1 sandbox calls, which the
agentbox provider uses), and JUDGE_LIST_PAGE (the fake's page size).

Each step prints `OK <step>`; `WAIT <what>` asks the Rust side to act on the fake first.
"""

# /// script
# dependencies = ["modal>=1.6,<1.7"]
# ///

import os
import sys
import time

import modal
import modal.exception


def ok(step):
    print(f"OK {step}", flush=True)


def wait(what):
    print(f"WAIT {what}", flush=True)
    assert sys.stdin.readline().strip() == "go"


def check(cond, what):
    if not cond:
        raise AssertionError(what)


LIST_PAGE = int(os.environ["JUDGE_LIST_PAGE"])

app = modal.App.lookup("agentbox-judge", create_if_missing=True)
check(app.app_id.startswith("ap-"), f"app id {app.app_id}")
again = modal.App.lookup("agentbox-judge")
check(again.app_id == app.app_id, "the same app by name")
try:
    modal.App.lookup("no-such-app-here")
    raise AssertionError("a missing app was found")
except modal.exception.NotFoundError:
    pass
ok("app-lookup")

try:
    app.set_tags({"team": "a", "cost": "1"})
    app.set_tags({"team": "b"})
    check(app.get_tags() == {"team": "b"}, f"app tags {app.get_tags()}")
    ok("app-tags")
except AttributeError:
    print("SKIP app-tags: the SDK has no App.set_tags", flush=True)

image = modal.Image.from_registry("debian:bookworm-slim")
sb = modal.Sandbox.create(
    "sleep",
    "infinity",
    app=app,
    image=image,
    timeout=120,
    env={"JUDGE_VAR": "from-env"},
    block_network=True,
)
check(sb.object_id.startswith("sb-"), f"sandbox id {sb.object_id}")
check(sb.poll() is None, "a new sandbox runs")
ok("create")

p = sb.exec("sh", "-c", "echo out; echo err >&2; exit 3")
check(p.stdout.read() == "out\n", "stdout")
check(p.stderr.read() == "err\n", "stderr")
check(p.wait() == 3, "exit code 3")
ok("exec")

p = sb.exec("sh", "-c", 'printf "%s" "$JUDGE_VAR"')
check(p.stdout.read() == "from-env", "the sandbox's env")
p.wait()
ok("env")

# An exec's own variables (the SDK sends them as a secret source of their own), over the
# sandbox's.
p = sb.exec("sh", "-c", 'printf "%s %s" "$JUDGE_VAR" "$EXEC_VAR"', env={"EXEC_VAR": "mine", "JUDGE_VAR": "over"})
check(p.stdout.read() == "over mine", "the exec's env over the sandbox's")
p.wait()
ok("exec-env")

p = sb.exec("cat")
p.stdin.write(b"hello ")
p.stdin.write(b"stdin")
p.stdin.write_eof()
p.stdin.drain()
check(p.stdout.read() == "hello stdin", "stdin read back")
check(p.wait() == 0, "cat exits 0")
ok("stdin")

p = sb.exec("sh", "-c", "head -c 3145728 /dev/zero | tr '\\0' 'x'", text=False)
big = p.stdout.read()
check(len(big) == 3 << 20 and set(big) == {ord("x")}, f"large output: {len(big)} bytes")
check(p.wait() == 0, "large output exit")
ok("large-output")

wait(f"cut {sb.object_id}")
p = sb.exec("sh", "-c", "head -c 200000 /dev/zero | tr '\\0' 'y'")
got = p.stdout.read()
check(got == "y" * 200000, f"resumed output: {len(got)} chars")
p.wait()
ok("stdio-resume")

p = sb.exec("no-such-program-here")
rc = p.wait()
check(rc == 127, f"program not found: {rc}")
ok("not-found")

p = sb.exec("sleep", "30")
check(p.poll() is None, "a running exec polls None")
p2 = sb.exec("sh", "-c", "sleep 30", timeout=1)
rc = p2.wait()
check(rc != 0, f"an exec past its timeout: {rc}")
ok("exec-poll-timeout")

p = sb.exec("sh", "-c", "tail -n +3 /proc/net/dev | wc -l")
out = p.stdout.read().split()
p.wait()
check(out and out[-1] == "1", f"blocked network: interfaces {out}")
ok("block-network")

sb.set_tags({"judge": "yes", "role": "main"})
check(sb.get_tags() == {"judge": "yes", "role": "main"}, f"tags {sb.get_tags()}")
sb.set_tags({"judge": "yes"})
check(sb.get_tags() == {"judge": "yes"}, f"tags replaced {sb.get_tags()}")
ok("tags")

found = [s.object_id for s in modal.Sandbox.list(app_id=app.app_id, tags={"judge": "yes"})]
check(found == [sb.object_id], f"list by tags: {found}")
ok("list-tags")

more = [
    modal.Sandbox.create("sleep", "infinity", app=app, image=image, timeout=60, tags={"batch": "paging"})
    for _ in range(LIST_PAGE + 2)
]
listed = [s.object_id for s in modal.Sandbox.list(app_id=app.app_id, tags={"batch": "paging"})]
check(sorted(listed) == sorted(s.object_id for s in more), f"paged list: {len(listed)} of {len(more)}")
check(len(set(listed)) == len(listed), "no sandbox twice")
check(listed == [s.object_id for s in reversed(more)], "newest first")
everything = [s.object_id for s in modal.Sandbox.list(app_id=app.app_id)]
check(len(everything) == len(more) + 1, f"all running: {len(everything)}")
for s in more:
    s.terminate()
ok("list-paging")

p = sb.exec("sh", "-c", "echo snapped > /root/judge-file")
check(p.wait() == 0, "wrote the file")
snap = sb.snapshot_filesystem()
check(snap.object_id.startswith("im-"), f"snapshot image {snap.object_id}")
sb2 = modal.Sandbox.create("sleep", "infinity", app=app, image=snap, timeout=60)
p = sb2.exec("cat", "/root/judge-file")
check(p.stdout.read() == "snapped\n", "the snapshot's file")
p.wait()
sb2.terminate()
ok("snapshot-sdk")

os.environ["MODAL_USE_LEGACY_FILESYSTEM_SNAPSHOT"] = "1"
snap = sb.snapshot_filesystem()
del os.environ["MODAL_USE_LEGACY_FILESYSTEM_SNAPSHOT"]
sb3 = modal.Sandbox.create("sleep", "infinity", app=app, image=snap, timeout=60)
p = sb3.exec("cat", "/root/judge-file")
check(p.stdout.read() == "snapped\n", "the legacy snapshot's file")
p.wait()
sb3.terminate()
ok("snapshot-legacy")

# A memory snapshot (SandboxSnapshot, SandboxSnapshotWait, SandboxRestore): only of a sandbox
# made with them enabled; the restored one has the files (the fake keeps no memory).
msb = modal.Sandbox.create("sleep", "infinity", app=app, image=image, timeout=60, _experimental_enable_snapshot=True)
p = msb.exec("sh", "-c", "echo in-memory > /root/mem-file")
check(p.wait() == 0, "wrote the file")
msnap = msb._experimental_snapshot()
rsb = modal.Sandbox._experimental_from_snapshot(msnap)
check(rsb.object_id != msb.object_id, "a new sandbox")
p = rsb.exec("cat", "/root/mem-file")
check(p.stdout.read() == "in-memory\n", "the restored sandbox's file")
p.wait()
rsb.terminate()
msb.terminate()
try:
    sb._experimental_snapshot()
    check(False, "a sandbox made without memory snapshots took one")
except Exception as e:
    check("memory snapshots" in str(e) or "snapshot" in str(e).lower(), f"refused: {e}")
ok("snapshot-memory")

tsb = modal.Sandbox.create(
    "sleep", "infinity", app=app, image=image, timeout=60, encrypted_ports=[8443], unencrypted_ports=[8080]
)
tunnels = tsb.tunnels()
check(set(tunnels) == {8443, 8080}, f"tunnels {tunnels}")
t = tunnels[8080]
check(t.unencrypted_host == "127.0.0.1" and t.unencrypted_port == 8080, f"unencrypted tunnel {t}")
check(tunnels[8443].host == "127.0.0.1" and tunnels[8443].port == 8443, f"tunnel {tunnels[8443]}")
check(not tunnels[8443].unencrypted_host, "an encrypted port has no unencrypted address")
tsb.terminate()
ok("tunnels")

gsb = modal.Sandbox.create("sleep", "infinity", app=app, image=image, timeout=60, gpu="T4")
p = gsb.exec("nvidia-smi", "--query-gpu=name", "--format=csv,noheader")
check(p.stdout.read() == "Tesla T4\n", "nvidia-smi's GPU")
check(p.wait() == 0, "nvidia-smi exit")
gsb.terminate()
p = sb.exec("sh", "-c", "command -v nvidia-smi || echo none")
check(p.stdout.read() == "none\n", "no nvidia-smi without a GPU")
p.wait()
ok("gpu")

vsb = modal.Sandbox.create("sleep", "infinity", app=app, image=image, timeout=60, runtime="vm")
p = vsb.exec("sh", "-c", "test -c /dev/fuse && echo fuse")
check(p.stdout.read() == "fuse\n", "a vm sandbox's /dev/fuse")
p.wait()
vsb.terminate()
p = sb.exec("sh", "-c", "test -e /dev/fuse || echo none")
check(p.stdout.read() == "none\n", "no /dev/fuse in a gvisor sandbox")
p.wait()
ok("fuse")

short = modal.Sandbox.create("sleep", "infinity", app=app, image=image, timeout=2)
try:
    short.wait()
    raise AssertionError("a timed-out sandbox waited without raising")
except modal.exception.SandboxTimeoutError:
    pass
check(short.returncode == 124, f"timeout returncode {short.returncode}")
ok("timeout")

done = modal.Sandbox.create("sh", "-c", "sleep 1; exit 5", app=app, image=image, timeout=60)
done.wait()
check(done.returncode == 5, f"entrypoint exit {done.returncode}")
ok("entrypoint-exit")

check(sb.poll() is None, "still running")
sb.terminate()
sb.wait(raise_on_termination=False)
check(sb.poll() is not None, "poll after terminate")
check(sb.returncode == 137, f"terminated returncode {sb.returncode}")
sb.terminate()
ok("terminate")

ended = modal.Sandbox.create("sleep", "infinity", app=app, image=image, timeout=60)
wait(f"end {ended.object_id}")
ended.wait(raise_on_termination=False)
check(ended.poll() is not None, "ended behind the client's back")
try:
    ended.exec("true")
    raise AssertionError("exec in an ended sandbox")
except (modal.exception.ConflictError, modal.exception.NotFoundError, modal.exception.SandboxTerminatedError):
    pass
ok("ended")

try:
    c = modal.Client.from_credentials(os.environ["MODAL_TOKEN_ID"], "wrong-secret")
    modal.App.lookup("agentbox-judge", client=c)
    raise AssertionError("a wrong token was let in")
except modal.exception.AuthError:
    pass
ok("bad-token")

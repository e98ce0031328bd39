"""The judge of agentbox's E2B API: E2B's own Python SDK (`e2b` 2.x), which nobody here
wrote, drives it and asserts each answer. The same API is judged twice (`JUDGE_MODE`):

- `fake`: the fake E2B, run by tests/e2b.rs of the providers (its `judged` module);
- `serve`: `agentbox serve --e2b`, run by tests/e2b_api.rs of the CLI, with two of its keys.

The runner sets E2B_API_URL and E2B_SANDBOX_URL (both the one url: envd calls carry
`E2b-Sandbox-Id`), E2B_API_KEY, E2B_HTTP_VERSION=1.1, JUDGE_LIST_PAGE (the listing's page)
and JUDGE_MAX_TIMEOUT (the plan's longest timeout, in seconds); for `serve`, AGENTBOX_URL (the
service's own API) and JUDGE_OTHER_KEY (a second key, which must see nothing of the first's).
JUDGE_LACKS names steps the provider under the server cannot take (pause-resume, snapshot,
fork, network): each is then asserted refused (501, as E2B refuses a feature it lacks; 400 for
a network the provider cannot keep), never as a sandbox not found, and passed as
`<step>-lacked`.

Each step prints `OK <step>`; in `fake` mode `VANISH <id>` (printed from a timer, mid-command)
asks the runner to make a sandbox vanish; in `serve` mode the judge ends that sandbox's box
itself, through the service's own API, as a box ended elsewhere.
"""

# /// script
# dependencies = ["e2b>=2.63,<3", "httpx"]
# ///

import datetime
import os
import threading
import time

import httpx
from e2b import (
    AuthenticationException,
    PtySize,
    CommandExitException,
    NotFoundException,
    Sandbox,
    SandboxQuery,
    SandboxState,
)


def ok(step):
    print(f"OK {step}", flush=True)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


LIST_PAGE = int(os.environ["JUDGE_LIST_PAGE"])
MAX_TIMEOUT = int(os.environ["JUDGE_MAX_TIMEOUT"])
MODE = os.environ["JUDGE_MODE"]
check(MODE in ("fake", "serve"), f"JUDGE_MODE {MODE!r}: fake or serve")
TAG = {"judge": "e2b", "run": str(os.getpid())}
# The judge's own calls (to the service's API, to envd unaided) trust what the SDK is told to;
# each on a connection of its own, as a pooled one may have been closed idle by the server.
VERIFY = os.environ.get("SSL_CERT_FILE") or True


def missing(what, attempt):
    """`attempt` raises the SDK's not-found for a path that is not there."""
    try:
        attempt()
    except Exception as e:
        check(type(e).__name__ in ("NotFoundException", "FileNotFoundException"), f"{what}: {type(e).__name__}")
        return
    raise AssertionError(f"{what}: nothing was refused")


def boxes_of(sandbox_id, key):
    """The service's own boxes labelled with an E2B sandbox's id, as `key` sees them."""
    r = httpx.get(
        os.environ["AGENTBOX_URL"] + "/v1/boxes",
        params={"labels": f"agentbox-server.e2b={sandbox_id}"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
        verify=VERIFY,
    )
    r.raise_for_status()
    return [b["id"] for b in r.json()]


def box_info(sandbox_id):
    """The service's own view of a sandbox's one box."""
    boxes = boxes_of(sandbox_id, os.environ["E2B_API_KEY"])
    check(len(boxes) == 1, f"{sandbox_id}: {boxes}")
    r = httpx.get(
        os.environ["AGENTBOX_URL"] + "/v1/boxes/" + boxes[0],
        headers={"Authorization": f"Bearer {os.environ['E2B_API_KEY']}"},
        timeout=30,
        verify=VERIFY,
    )
    r.raise_for_status()
    return r.json()


def end_elsewhere(sandbox_id):
    """End a sandbox's box through the service's own API, not E2B's."""
    for box in boxes_of(sandbox_id, os.environ["E2B_API_KEY"]):
        r = httpx.delete(
            os.environ["AGENTBOX_URL"] + "/v1/boxes/" + box,
            headers={"Authorization": f"Bearer {os.environ['E2B_API_KEY']}"},
            timeout=30,
            verify=VERIFY,
        )
        r.raise_for_status()

sbx = Sandbox.create(
    template="base",
    timeout=120,
    metadata=TAG,
    envs={"SBX_VAR": "from-sandbox"},
    allow_internet_access=False,
)
check(len(sbx.sandbox_id) == 20, f"sandbox id {sbx.sandbox_id}")
check(sbx.is_running(), "a new sandbox runs")
ok("create")

try:
    sbx.commands.run("echo out; echo err >&2; exit 3")
    raise AssertionError("exit 3 raised nothing")
except CommandExitException as e:
    check(e.exit_code == 3, f"exit code {e.exit_code}")
    check(e.stdout == "out\n", f"stdout {e.stdout!r}")
    check(e.stderr == "err\n", f"stderr {e.stderr!r}")
r = sbx.commands.run("echo fine")
check(r.exit_code == 0 and r.stdout == "fine\n", f"a fine command: {r}")
ok("run")

r = sbx.commands.run('printf "%s %s" "$SBX_VAR" "$CMD_VAR"', envs={"CMD_VAR": "mine"})
check(r.stdout == "from-sandbox mine", f"envs: {r.stdout!r}")
r = sbx.commands.run('printf "%s %s %s" "$E2B_SANDBOX" "$E2B_SANDBOX_ID" "$E2B_TEMPLATE_ID"')
check(r.stdout == f"true {sbx.sandbox_id} base", f"envd's variables: {r.stdout!r}")
r = sbx.commands.run("pwd", cwd="/tmp", user="root")
check(r.stdout == "/tmp\n", f"cwd: {r.stdout!r}")
ok("envs")

# No network: nothing but loopback.
r = sbx.commands.run("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '")
check(r.stdout.split() == ["lo"], f"interfaces: {r.stdout!r}")
ok("no-internet")

h = sbx.commands.run("sleep 2; echo done", background=True)
pid = h.pid
check(pid > 0, f"pid {pid}")
again = sbx.commands.connect(pid)
res = again.wait()
check(res.stdout == "done\n", f"reattached output {res.stdout!r}")
ok("connect")

h = sbx.commands.run("read line; echo got:$line", background=True, stdin=True)
sbx.commands.send_stdin(h.pid, "hello\n")
res = h.wait()
check(res.stdout == "got:hello\n", f"stdin: {res.stdout!r}")
h = sbx.commands.run("cat", background=True, stdin=True)
sbx.commands.send_stdin(h.pid, b"bytes\n")
sbx.commands.close_stdin(h.pid)
res = h.wait()
check(res.stdout == "bytes\n", f"close_stdin: {res.stdout!r}")
ok("stdin")

h = sbx.commands.run("sleep 60", background=True)
listed = sbx.commands.list()
mine = [p for p in listed if p.pid == h.pid]
check(len(mine) == 1, f"list: {listed}")
check(mine[0].cmd == "/bin/bash" and mine[0].args[-1] == "sleep 60", f"listed: {mine[0]}")
ok("list")

check(sbx.commands.kill(h.pid), "kill a running one")
try:
    h.wait()
    raise AssertionError("a killed command exited 0")
except CommandExitException as e:
    check(e.exit_code == -1, f"killed: exit {e.exit_code}")
check(not sbx.commands.kill(h.pid), "kill a gone one")
ok("kill")

# A terminal: its size as asked, then as resized, its exit code, its output as pty data.
t = sbx.pty.create(PtySize(rows=24, cols=80))
sbx.pty.send_stdin(t.pid, b"stty size; exit 5\n")
seen = []
try:
    t.wait(on_pty=lambda d: seen.append(bytes(d)))
    raise AssertionError("a terminal's exit 5 raised nothing")
except CommandExitException as e:
    check(e.exit_code == 5, f"the terminal's exit {e.exit_code}")
check(b"24 80" in b"".join(seen), f"the terminal's size: {b''.join(seen)!r}")
t = sbx.pty.create(PtySize(rows=24, cols=80))
sbx.pty.resize(t.pid, PtySize(rows=30, cols=100))
sbx.pty.send_stdin(t.pid, b"stty size; exit\n")
seen = []
t.wait(on_pty=lambda d: seen.append(bytes(d)))
check(b"30 100" in b"".join(seen), f"the resized terminal: {b''.join(seen)!r}")
t = sbx.pty.create(PtySize(rows=24, cols=80))
check(sbx.pty.kill(t.pid), "kill a terminal")
ok("pty")

data = bytes(range(256)) * 1024
sbx.files.write("/tmp/f", data)
got = sbx.files.read("/tmp/f", format="bytes")
check(bytes(got) == data, f"read back {len(got)} bytes")
check(sbx.files.read("/tmp/f", format="bytes")[:3] == b"\x00\x01\x02", "bytes")
# gzip both ways: the upload's body, the download's answer.
sbx.files.write("/tmp/z", data, gzip=True)
check(bytes(sbx.files.read("/tmp/z", format="bytes", gzip=True)) == data, "gzip both ways")
info = sbx.files.write("/tmp/deep/er/t.txt", "text")
check(info.path == "/tmp/deep/er/t.txt", f"write info {info}")
check(sbx.files.read("/tmp/deep/er/t.txt") == "text", "text read")
# A relative path is where a command starts: what one writes, the other reads.
sbx.files.write("rel.txt", "relative")
check(sbx.commands.run("cat rel.txt").stdout == "relative", "a relative file seen by a command")
sbx.commands.run("echo made > made.txt")
check(sbx.files.read("made.txt") == "made\n", "a command's file read by a relative path")
ok("files-rw")

check(sbx.files.make_dir("/tmp/d"), "make_dir")
check(not sbx.files.make_dir("/tmp/d"), "make_dir again")
sbx.files.write("/tmp/d/a", b"a")
entries = sbx.files.list("/tmp/d")
check([e.name for e in entries] == ["a"], f"list {entries}")
check(entries[0].size == 1, f"size {entries[0].size}")
moved = sbx.files.rename("/tmp/d/a", "/tmp/d/b")
check(moved.path == "/tmp/d/b", f"rename {moved}")
check(sbx.files.exists("/tmp/d/b") and not sbx.files.exists("/tmp/d/a"), "exists")
# As envd lists: depth first, each directory's entries in byte order, each followed by its own.
for p in ["/tmp/o/b", "/tmp/o/a-b", "/tmp/o/a/y", "/tmp/o/a/x"]:
    sbx.files.write(p, "o")
order = [e.path for e in sbx.files.list("/tmp/o", depth=2)]
check(order == ["/tmp/o/a", "/tmp/o/a/x", "/tmp/o/a/y", "/tmp/o/a-b", "/tmp/o/b"], f"list order: {order}")
sbx.commands.run("ln -s /tmp/o/a /tmp/o/link && ln -s /tmp/o/none /tmp/o/broken")
link = sbx.files.get_info("/tmp/o/link")
check(link.type is not None and link.type.value == "dir", f"a link to a dir: {link}")
check(link.symlink_target == "/tmp/o/a", f"its target: {link.symlink_target}")
check(link.permissions.startswith("L"), f"its permissions: {link.permissions}")
broken = sbx.files.get_info("/tmp/o/broken")
check(broken.symlink_target == "/tmp/o/broken", f"a broken link's target: {broken.symlink_target}")
sbx.files.remove("/tmp/o")
sbx.files.remove("/tmp/o")  # a missing path: no error, as envd's
gi = sbx.files.get_info("/tmp/d")
check(gi.type is not None and gi.type.value == "dir", f"get_info {gi}")
sbx.files.remove("/tmp/d")
check(not sbx.files.exists("/tmp/d"), "removed")
missing("a missing file's read", lambda: sbx.files.read("/tmp/nope"))
ok("files-ops")

# A watched directory: its events, down the tree, drained from the watcher as they come.
sbx.files.make_dir("/tmp/w/sub")
w = sbx.files.watch_dir("/tmp/w", recursive=True)
events = set()


def watched(want):
    """Drain the watcher until `want` (a name and a type) was seen, within 15 s."""
    deadline = time.monotonic() + 15
    while want not in events and time.monotonic() < deadline:
        events.update((e.name, e.type.value) for e in w.get_new_events())
        time.sleep(0.1)
    check(want in events, f"watch: no {want} in {events}")


sbx.files.write("/tmp/w/a", "1")
watched(("a", "create"))
sbx.files.write("/tmp/w/sub/b", "2")
watched(("sub/b", "create"))
sbx.files.remove("/tmp/w/sub/b")
watched(("sub/b", "remove"))
sbx.files.write("/tmp/w/a", "22")
watched(("a", "write"))
want = {("a", "create"), ("a", "write"), ("sub/b", "create"), ("sub/b", "remove")}
check(events == want, f"watch events beyond the steps: {events}")
w.stop()
missing("a missing directory's watch", lambda: sbx.files.watch_dir("/tmp/nope"))
ok("watch")

sbx.set_timeout(600)
end = sbx.get_info().end_at
left = (end - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
check(570 < left <= 601, f"end after set_timeout: {left}")
info = Sandbox.get_info(sbx.sandbox_id)
check(info.state == SandboxState.RUNNING, f"state {info.state}")
check(info.metadata == TAG, f"metadata {info.metadata}")
# A refresh (E2B's POST /sandboxes/{id}/refreshes) extends its life, never shortens it.
API = os.environ["E2B_API_URL"].rstrip("/")
KEY = {"X-API-KEY": os.environ["E2B_API_KEY"]}
for duration, least in ((900, 870), (60, 570)):
    r = httpx.post(f"{API}/sandboxes/{sbx.sandbox_id}/refreshes", json={"duration": duration}, headers=KEY, timeout=30, verify=VERIFY)
    check(r.status_code == 204, f"refresh {duration}: {r.status_code} {r.text}")
    left = (sbx.get_info().end_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    check(least < left <= 901, f"end after a refresh of {duration} s: {left}")
r = httpx.post(f"{API}/sandboxes/{sbx.sandbox_id}/refreshes", json={"duration": 4000}, headers=KEY, timeout=30, verify=VERIFY)
check(r.status_code == 400 and "duration" in r.text, f"a refresh past an hour: {r.status_code} {r.text}")
ok("timeout")

# Metrics, measured in the box: a sample now, and the ones kept since.
first = sbx.get_metrics()
check(len(first) >= 1, f"metrics: {first}")
m = first[-1]
check(m.cpu_count >= 1 and 0 <= m.cpu_used_pct, f"the CPUs: {m}")
check(0 < m.mem_used <= m.mem_total, f"the memory: {m}")
check(0 < m.disk_used <= m.disk_total, f"the disk: {m}")
kept = sbx.get_metrics(start=m.timestamp)
check(len(kept) >= 2 and kept[0].timestamp >= m.timestamp, f"the samples kept: {kept}")
# Many at once (GET /sandboxes/metrics): a sample of each sandbox named that the key owns.
r = httpx.get(f"{API}/sandboxes/metrics", params={"sandbox_ids": f"{sbx.sandbox_id},nosuchsandbox"}, headers=KEY, timeout=30, verify=VERIFY)
many = r.json().get("sandboxes", {}) if r.status_code == 200 else {}
check(list(many) == [sbx.sandbox_id] and many[sbx.sandbox_id]["memTotal"] > 0, f"metrics of many: {r.status_code} {r.text}")
ok("metrics")

# What is not served answers as a feature E2B lacks, never as a sandbox not found.
try:
    sbx.update_network({"allow_out": ["example.com"]})
    raise AssertionError("a network update was served")
except AssertionError:
    raise
except Exception as e:
    check(type(e).__name__ != "NotFoundException" and "501" in str(e), f"a network update: {type(e).__name__}: {e}")
check(sbx.is_running(), "running after a route it lacks")
for route in ("/templates", "/v2/templates", "/volumes", "/secrets"):
    r = httpx.get(API + route, headers=KEY, timeout=30, verify=VERIFY)
    check(r.status_code == 501 and r.json()["code"] == 501, f"GET {route}: {r.status_code} {r.text}")
# Connect's binary codec is refused, naming the JSON one.
r = httpx.post(
    (os.environ["E2B_SANDBOX_URL"].rstrip("/")) + "/process.Process/List",
    content=b"",
    headers={"Content-Type": "application/proto", "E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token or ""},
    timeout=30,
    verify=VERIFY,
)
check(r.status_code == 415 and "application/json" in r.text, f"the binary codec: {r.status_code} {r.text}")
ok("unserved")

try:
    Sandbox.create(template="base", timeout=MAX_TIMEOUT + 1)
    raise AssertionError("a timeout past the plan's was taken")
except Exception as e:
    check("Timeout cannot be greater" in str(e), f"over the plan: {e}")
ok("timeout-max")

others = [Sandbox.create(template="base", timeout=60, metadata=TAG) for _ in range(LIST_PAGE + 1)]
stranger = Sandbox.create(template="base", timeout=60, metadata={"judge": "other"})
pages = Sandbox.list(query=SandboxQuery(metadata=TAG), limit=LIST_PAGE)
found = []
n = 0
while pages.has_next:
    items = pages.next_items()
    check(len(items) <= LIST_PAGE, f"a page of {len(items)}")
    found += [i.sandbox_id for i in items]
    n += 1
want = {sbx.sandbox_id} | {o.sandbox_id for o in others}
check(set(found) == want and len(found) == len(want), f"listed {found}, want {want}")
check(n >= 2, f"pages {n}")
since = Sandbox.list(
    query=SandboxQuery(metadata=TAG, started_after=Sandbox.get_info(others[0].sandbox_id).started_at), limit=LIST_PAGE
)
later = []
while since.has_next:
    later += since.next_items()
check({i.sandbox_id for i in later} == {o.sandbox_id for o in others}, f"started after the first other: {later}")
for o in others + [stranger]:
    o.kill()
ok("list-paging")

LACKS = set(filter(None, os.environ.get("JUDGE_LACKS", "").split(",")))


def lacked(step, attempt, status="501"):
    """A step the provider cannot take: refused with `status` (501, a feature it lacks; 400, a
    create it cannot honour), never as a sandbox not found, the sandbox still there."""
    try:
        attempt()
        raise AssertionError(f"{step}: taken where the provider lacks it")
    except AssertionError:
        raise
    except Exception as e:
        check(status in str(e) and not isinstance(e, NotFoundException), f"{step}: {type(e).__name__}: {e}")
    check(sbx.is_running(), f"{step}: the sandbox runs on")
    ok(f"{step}-lacked")


def pause_and_resume():
    sbx.files.write("/tmp/kept", b"kept across the pause")
    bg = sbx.commands.run("sleep 100", background=True)
    sbx.pause()
    info = Sandbox.get_info(sbx.sandbox_id)
    check(info.state == SandboxState.PAUSED, f"paused state {info.state}")
    paused = Sandbox.list(query=SandboxQuery(metadata=TAG, state=[SandboxState.PAUSED])).next_items()
    check([p.sandbox_id for p in paused] == [sbx.sandbox_id], f"paused list {paused}")
    resumed = Sandbox.connect(sbx.sandbox_id)
    check(Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING, "running again")
    check(resumed.files.read("/tmp/kept", format="bytes") == b"kept across the pause", "the file kept")
    check(all(p.pid != bg.pid for p in resumed.commands.list()), "programs ended by the pause")
    check(resumed.commands.run("echo again").stdout == "again\n", "runs after resume")
    ok("pause-resume")
    return resumed


def snapshot(resumed):
    """A snapshot of the files: a sandbox made from it holds them; listed by its sandbox; deleted."""
    resumed.files.write("snap.txt", "in the snapshot")
    snap = resumed.create_snapshot()
    from_snap = Sandbox.create(snap.snapshot_id, timeout=60)
    check(from_snap.files.read("snap.txt") == "in the snapshot", "a sandbox from the snapshot has its files")
    from_snap.kill()
    listed = Sandbox.list_snapshots(sandbox_id=resumed.sandbox_id).next_items()
    check([x.snapshot_id for x in listed] == [snap.snapshot_id], f"the sandbox's snapshots: {listed}")
    if MODE == "serve":
        try:
            Sandbox.create(snap.snapshot_id, timeout=60, api_key=os.environ["JUDGE_OTHER_KEY"])
            raise AssertionError("another key started from the snapshot")
        except AssertionError:
            raise
        except Exception as e:  # the SDK reads a create's 404 as a SandboxException
            check("404" in str(e) and "not found" in str(e), f"another key's start from the snapshot: {e}")
    check(Sandbox.delete_snapshot(snap.snapshot_id), "delete the snapshot")
    check(not Sandbox.delete_snapshot(snap.snapshot_id), "delete it again")
    try:
        resumed.create_snapshot(mode="full")
        raise AssertionError("a memory snapshot was taken")
    except Exception as e:
        check("memory" in str(e), f"a memory snapshot: {e}")
    ok("snapshot")


def fork(resumed):
    resumed.files.write("fork.txt", "before the fork")
    forks = resumed.fork(count=2, timeout=60)
    check(len(forks) == 2 and not any(isinstance(f, Exception) for f in forks), f"forks: {forks}")
    check(len({f.sandbox_id for f in forks} | {resumed.sandbox_id}) == 3, "each fork a sandbox of its own")
    for f in forks:
        check(f.files.read("fork.txt") == "before the fork", "a fork holds the files")
        check(Sandbox.get_info(f.sandbox_id).metadata == TAG, "a fork's metadata")
        f.kill()
    ok("fork")


if "pause-resume" in LACKS:
    lacked("pause-resume", sbx.pause)
    resumed = sbx
else:
    resumed = pause_and_resume()
if "snapshot" in LACKS:
    lacked("snapshot", sbx.create_snapshot)
else:
    snapshot(resumed)
if "fork" in LACKS:
    lacked("fork", lambda: sbx.fork(count=1, timeout=60))
else:
    fork(resumed)

if MODE == "serve":
    other = os.environ["JUDGE_OTHER_KEY"]
    mine = boxes_of(sbx.sandbox_id, os.environ["E2B_API_KEY"])
    check(len(mine) == 1, f"the sandbox is one box of the service's: {mine}")
    check(boxes_of(sbx.sandbox_id, other) == [], "another key sees its box")
    theirs = Sandbox.list(api_key=other).next_items()
    check(all(i.sandbox_id != sbx.sandbox_id for i in theirs), f"another key lists it: {theirs}")
    try:
        Sandbox.get_info(sbx.sandbox_id, api_key=other)
        raise AssertionError("another key read the sandbox")
    except NotFoundException:
        pass
    try:
        Sandbox.connect(sbx.sandbox_id, api_key=other)
        raise AssertionError("another key connected to the sandbox")
    except NotFoundException:
        pass
    check(not Sandbox.kill(sbx.sandbox_id, api_key=other), "another key killed the sandbox")
    for name, attempt in [
        ("pause", lambda: Sandbox.pause(sbx.sandbox_id, api_key=other)),
        ("set_timeout", lambda: Sandbox.set_timeout(sbx.sandbox_id, 30, api_key=other)),
        ("snapshot", lambda: Sandbox.create_snapshot(sbx.sandbox_id, api_key=other)),
    ]:
        try:
            attempt()
            raise AssertionError(f"another key's {name} was taken")
        except AssertionError:
            raise
        except Exception as e:
            check("404" in str(e) or isinstance(e, NotFoundException), f"another key's {name}: {type(e).__name__}: {e}")
    # envd's calls carry no key: the sandbox's own token is what is asked, and nothing else passes.
    envd = os.environ["E2B_SANDBOX_URL"]
    for token in [None, "wrong"]:
        headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
        if token:
            headers["X-Access-Token"] = token
        r = httpx.post(envd + "/filesystem.Filesystem/Stat", json={"path": "/"}, headers=headers, timeout=30, verify=VERIFY)
        check(r.status_code == 401, f"envd with token {token}: {r.status_code} {r.text}")
        r = httpx.get(envd + "/files", params={"path": "/etc/hostname"}, headers=headers, timeout=30, verify=VERIFY)
        check(r.status_code == 401, f"a download with token {token}: {r.status_code} {r.text}")
    check(Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING, "still running")
    ok("owners")




def network():
    """E2B's network lists as agentbox's allowlist, kept by its egress proxy."""
    walled = Sandbox.create(
        template="base", timeout=60, network={"deny_out": ["0.0.0.0/0"], "allow_out": ["example.com"]}
    )
    facts = box_info(walled.sandbox_id)["facts"].get("network")
    check(facts == {"allowlist": ["example.com"]}, f"the box's network: {facts}")
    check(
        Sandbox.get_info(walled.sandbox_id).network == {"allow_out": ["example.com"], "deny_out": ["0.0.0.0/0"]},
        "the network answered back as asked",
    )
    walled.kill()
    try:
        Sandbox.create(template="base", timeout=60, network={"deny_out": ["192.0.2.1"]})
        raise AssertionError("a deny list other than all traffic was taken")
    except Exception as e:
        check("allowlists" in str(e), f"a partial deny list: {e}")
    ok("network")


if MODE == "serve":
    allowlist = {"deny_out": ["0.0.0.0/0"], "allow_out": ["example.com"]}
    if "network" in LACKS:
        lacked("network", lambda: Sandbox.create(template="base", timeout=60, network=allowlist), "400")
    else:
        network()


def vanish(sandbox_id):
    if MODE == "fake":
        print(f"VANISH {sandbox_id}", flush=True)
    else:
        end_elsewhere(sandbox_id)


victim = Sandbox.create(template="base", timeout=120)
threading.Timer(2.0, lambda: vanish(victim.sandbox_id)).start()
t0 = time.monotonic()
try:
    victim.commands.run("sleep 30")
    raise AssertionError("a vanished sandbox's command ended well")
except Exception as e:
    took = time.monotonic() - t0
    print(f"vanish: {type(e).__name__} after {took:.1f}s: {str(e)[:200]}", flush=True)
    check(took < 20, f"the vanish took {took}s to show")
    check(type(e).__name__ == "SandboxNotRunningException", f"vanish: {type(e).__name__}")
check(not Sandbox.kill(victim.sandbox_id), "kill of a vanished one")
if MODE == "serve":
    idle = Sandbox.create(template="base", timeout=60)
    end_elsewhere(idle.sandbox_id)
    check(not idle.is_running(), "an idle sandbox whose box ended elsewhere is not running")
ok("vanish")

check(resumed.kill(), "kill")
check(not Sandbox.kill(sbx.sandbox_id), "kill again")
try:
    Sandbox.get_info(sbx.sandbox_id)
    raise AssertionError("a killed sandbox has info")
except Exception as e:
    check("not found" in str(e).lower(), f"killed info: {e}")
if MODE == "serve":
    for s in [sbx, victim] + others + [stranger]:
        check(boxes_of(s.sandbox_id, os.environ["E2B_API_KEY"]) == [], f"{s.sandbox_id}: its box outlived it")
ok("kill-sandbox")

try:
    Sandbox.create(template="base", api_key="e2b_wrong")
    raise AssertionError("a wrong key created a sandbox")
except AuthenticationException:
    pass
ok("bad-key")

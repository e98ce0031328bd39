"""The judge: Daytona's own Python SDK (`daytona` 0.226.1), which nobody here wrote, against
agentbox's fake Daytona. Run by tests/daytona.rs (its `judged` module) with DAYTONA_API_URL and
DAYTONA_API_KEY in the environment (and JUDGE_RUNNER, a static server to start in a box).
Prints `OK <step>` per step and exits non-zero at the first failure. Where the test must act
on the fake (its throttle), it prints `WAIT <what>` and reads one line from stdin once the
test has acted.

Three parts: the SDK's own walk (`sdk_walk`), its volumes (`volume_walk`), and `provider_calls`, which makes every HTTP call
agentbox's `daytona` provider makes, each with the request shape the provider sends, through
Daytona's Python code: the SDK where it has the call, else its generated clients
(`daytona_api_client`, `daytona_toolbox_api_client`) over an ApiClient configured as the SDK
configures its own. Every answer is parsed into the generated models, and `strict` refuses
any value the models only tolerate (an enum they do not know, a field they do not name).
"""

# /// script
# dependencies = ["daytona==0.226.1"]
# ///

import asyncio
import enum
import json
import os
import socket
import sys
import time
import traceback

import daytona_api_client as api
import daytona_toolbox_api_client as tb
import httpx
from pydantic import BaseModel

from daytona import (
    CreateSandboxFromSnapshotParams,
    Daytona,
    DaytonaNotFoundError,
    DaytonaRateLimitError,
    DaytonaTimeoutError,
    FileDownloadRequest,
    FileUpload,
    ListSandboxesQuery,
    SessionExecuteRequest,
    VolumeMount,
)


def ok(step):
    print(f"OK {step}", flush=True)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def wait_for(what):
    print(f"WAIT {what}", flush=True)
    line = sys.stdin.readline()
    check(line != "", f"the test closed stdin instead of acting on {what}")


def running(sandbox, pattern):
    """How many processes of the sandbox have `pattern` in their command line."""
    # The bracket keeps the pipeline's own grep from matching itself.
    r = sandbox.process.exec(
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '"
        + pattern
        + "' || true"
    )
    return int(r.result.strip() or "0")


def sdk_walk(daytona):
    sandbox = daytona.create(
        CreateSandboxFromSnapshotParams(
            labels={"judge": "daytona", "run": "one"},
            env_vars={"JUDGE_VAR": "from-create"},
            auto_stop_interval=0,
            auto_archive_interval=60,
            auto_delete_interval=-1,
        ),
        timeout=60,
    )
    check(sandbox.state == "started", f"state after create: {sandbox.state}")
    check(sandbox.labels.get("judge") == "daytona", f"labels: {sandbox.labels}")
    check(sandbox.auto_stop_interval == 0, f"autoStop: {sandbox.auto_stop_interval}")
    check(sandbox.auto_archive_interval == 60, f"autoArchive: {sandbox.auto_archive_interval}")
    check(sandbox.auto_delete_interval == -1, f"autoDelete: {sandbox.auto_delete_interval}")
    check(sandbox.env.get("JUDGE_VAR") == "from-create", f"env: {sandbox.env}")
    ok("create")

    home, work = sandbox.get_user_home_dir(), sandbox.get_work_dir()
    check(home.startswith("/") and work.startswith("/"), f"home {home!r} work {work!r}")
    ok("dirs")

    r = sandbox.process.exec("echo out; echo err >&2; echo $JUDGE_VAR; exit 3")
    check(r.exit_code == 3, f"exit code {r.exit_code}")
    check(r.result == "out\nerr\nfrom-create\n", f"result {r.result!r}")
    r = sandbox.process.exec("pwd; echo $X", cwd="/tmp", env={"X": "given"})
    check(r.exit_code == 0 and r.result == "/tmp\ngiven\n", f"cwd/env: {r.exit_code} {r.result!r}")
    ok("exec")

    try:
        sandbox.process.exec("sleep 30", timeout=1)
        raise AssertionError("a 1 s timeout on sleep 30 did not fail")
    except DaytonaTimeoutError:
        pass
    ok("exec-timeout")

    sid = "judge-session"
    sandbox.process.create_session(sid)
    sandbox.process.execute_session_command(sid, SessionExecuteRequest(command="export JUDGE_A=persisted; cd /tmp"))
    r = sandbox.process.execute_session_command(sid, SessionExecuteRequest(command="echo $JUDGE_A; pwd; echo e >&2"))
    check(r.exit_code == 0, f"session exit {r.exit_code}")
    check(r.stdout == "persisted\n/tmp\n", f"session stdout {r.stdout!r}")
    check(r.stderr == "e\n", f"session stderr {r.stderr!r}")
    ok("session-sync")

    r = sandbox.process.execute_session_command(
        sid,
        SessionExecuteRequest(
            command="for i in 1 2 3; do echo line$i; echo eline$i >&2; sleep 0.3; done; sh -c 'exit 4'",
            run_async=True,
        ),
    )
    cid = r.cmd_id
    check(cid, "no cmd_id for an async command")
    out, err = [], []
    asyncio.run(
        sandbox.process.get_session_command_logs_async(sid, cid, lambda s: out.append(s), lambda s: err.append(s))
    )
    check("".join(out) == "line1\nline2\nline3\n", f"streamed stdout {''.join(out)!r}")
    check("".join(err) == "eline1\neline2\neline3\n", f"streamed stderr {''.join(err)!r}")
    cmd = sandbox.process.get_session_command(sid, cid)
    check(cmd.exit_code == 4, f"async exit code {cmd.exit_code}")
    logs = sandbox.process.get_session_command_logs(sid, cid)
    check(logs.stdout == "line1\nline2\nline3\n", f"logs stdout {logs.stdout!r}")
    check(logs.stderr == "eline1\neline2\neline3\n", f"logs stderr {logs.stderr!r}")
    session = sandbox.process.get_session(sid)
    check(len(session.commands) == 3, f"session commands {session.commands}")
    check(any(s.session_id == sid for s in sandbox.process.list_sessions()), "list_sessions")
    ok("session-async-logs")

    r = sandbox.process.execute_session_command(
        sid, SessionExecuteRequest(command="read -r got; echo got=$got", run_async=True)
    )
    time.sleep(0.3)
    sandbox.process.send_session_command_input(sid, r.cmd_id, "typed")
    for _ in range(100):
        cmd = sandbox.process.get_session_command(sid, r.cmd_id)
        if cmd.exit_code is not None:
            break
        time.sleep(0.1)
    logs = sandbox.process.get_session_command_logs(sid, r.cmd_id)
    check(cmd.exit_code == 0 and "got=typed" in logs.stdout, f"input: {cmd.exit_code} {logs.stdout!r}")
    sandbox.process.delete_session(sid)
    try:
        sandbox.process.get_session(sid)
        raise AssertionError("a deleted session is still there")
    except DaytonaNotFoundError:
        pass
    ok("session-input-delete")

    blob = bytes(range(256)) * 4 + b"\x00\x00\xff\xfe not utf-8 \xc3\x28"
    sandbox.fs.upload_file(blob, "/tmp/judge/deep/blob.bin")
    back = sandbox.fs.download_file("/tmp/judge/deep/blob.bin")
    check(back == blob, f"round trip: {len(back)} bytes back of {len(blob)}")
    ok("upload-download")

    res = sandbox.fs.download_files(
        [FileDownloadRequest(source="/tmp/judge/deep/blob.bin"), FileDownloadRequest(source="/tmp/judge/missing")]
    )
    check(res[0].error is None and res[0].result == blob, f"first of two: {res[0].error}")
    check(res[1].error is not None, "a missing file has no error")
    check(
        res[1].error_details is not None and res[1].error_details.code == "FILE_NOT_FOUND",
        f"error details {res[1].error_details}",
    )
    ok("download-missing")

    labels = sandbox.set_labels({"judge": "daytona", "run": "two"})
    check(labels.get("run") == "two", f"set_labels answered {labels}")
    sandbox.refresh_data()
    check(sandbox.labels.get("run") == "two" and sandbox.labels.get("judge") == "daytona", f"labels {sandbox.labels}")
    ok("set-labels")

    found = []
    deadline = time.time() + 20
    while time.time() < deadline:
        found = [s.id for s in daytona.list(ListSandboxesQuery(labels={"run": "two"}))]
        if sandbox.id in found:
            break
        time.sleep(0.25)
    check(sandbox.id in found, f"list by labels never showed {sandbox.id}: {found}")
    ok("list-labels")

    sandbox.process.exec("echo kept > /workspace/kept.txt")
    sandbox.process.exec("nohup sleep 1000 > /dev/null 2>&1 &")
    check(running(sandbox, "sleep 100[0]") == 1, "the background process is not running")
    sandbox.stop()
    check(sandbox.state == "stopped", f"state after stop {sandbox.state}")
    ok("stop")

    sandbox.start()
    check(sandbox.state == "started", f"state after start {sandbox.state}")
    r = sandbox.process.exec("cat /workspace/kept.txt")
    check(r.result == "kept\n", f"the file after start: {r.result!r}")
    check(running(sandbox, "sleep 100[0]") == 0, "a background process survived stop and start")
    ok("start")

    sandbox.stop()
    sandbox.archive()
    check(sandbox.state == "archived", f"state after archive {sandbox.state}")
    ok("archive")

    wait_for("throttle")
    try:
        daytona.get(sandbox.id)
        raise AssertionError("a throttled request succeeded")
    except DaytonaRateLimitError:
        pass
    ok("rate-limit-429")

    try:
        daytona.get("no-such-sandbox")
        raise AssertionError("an unknown sandbox was found")
    except DaytonaNotFoundError:
        pass
    ok("not-found-404")

    # A delete is soft: answered at once, the record renamed and destroying, still read by
    # id, its name free for a create at once; 404 once the runner has destroyed it.
    # This one is archived, and an archived sandbox being deleted reads `archived` (the DTO
    # shows `destroying` for a started or stopped one only).
    name = sandbox.name
    sandbox.delete()
    check(sandbox.state == "archived", f"state after delete {sandbox.state}")
    check(sandbox.desired_state == "destroyed", f"desiredState after delete {sandbox.desired_state}")
    got = daytona.get(sandbox.id)
    check(got.state == "archived" and got.desired_state == "destroyed", f"read after delete: {got.state} {got.desired_state}")
    check(got.name.startswith(f"DESTROYED_{name}_"), f"a deleted sandbox's name {got.name!r}")
    again = daytona.create(CreateSandboxFromSnapshotParams(name=name, auto_stop_interval=0), timeout=60)
    check(again.id != sandbox.id and again.name == name, f"the name again: {again.id} {again.name}")
    # This name is the deleted sandbox's id, and a read looks the id up first: until the
    # destroy it reads the deleted one, after it the new one.
    check(daytona.get(name).id == sandbox.id, "the deleted sandbox's id reads it while it is pending")

    def gone(sid):
        try:
            daytona.get(sid)
            return False
        except DaytonaNotFoundError:
            return True

    until("the deleted sandbox's destroy", lambda: daytona.get(name).id == again.id)
    # The SDK's delete(wait=True) reads until destroyed (a 404 is destroyed).
    again.delete(wait=True)
    check(gone(again.id) and gone(sandbox.id), "a sandbox deleted with wait=True is still there")
    ok("delete")


def volume_walk(daytona):
    """A volume made by name, ready, mounted by two sandboxes at once (one by its id, one by
    its name), whose files each sees; then deleted."""
    name = f"judge-volume-{os.getpid()}"
    volume = daytona.volume.get(name, create=True)
    check(volume.name == name, f"the volume's name: {volume.name}")
    check(daytona.volume.get(name).id == volume.id, "the volume read by name again")
    until("the volume is ready", lambda: daytona.volume.get(name).state == "ready")
    check(any(v.id == volume.id for v in daytona.volume.list()), "volume.list")
    key = os.environ["DAYTONA_API_KEY"]
    client = headers_of(api.ApiClient(api.Configuration(host=os.environ["DAYTONA_API_URL"])), key)
    strict(api.VolumesApi(client).get_volume(volume.id), "get_volume")
    strict(api.VolumesApi(client).get_volume_by_name(name), "get_volume_by_name")
    ok("volume-create")

    a = daytona.create(
        CreateSandboxFromSnapshotParams(
            volumes=[VolumeMount(volume_id=volume.id, mount_path="/shared")], auto_stop_interval=0
        ),
        timeout=60,
    )
    b = daytona.create(
        CreateSandboxFromSnapshotParams(
            volumes=[VolumeMount(volume_id=name, mount_path="/volume", subpath="sub")], auto_stop_interval=0
        ),
        timeout=60,
    )
    dto = strict(api.SandboxApi(client).get_sandbox(b.id), "get_sandbox with a volume")
    check(
        [(v.volume_id, v.mount_path, v.subpath) for v in dto.volumes] == [(volume.id, "/volume", "sub")],
        f"the sandbox's volumes: {dto.volumes}",
    )
    a.process.exec("mkdir -p /shared/sub && echo from-a > /shared/sub/note")
    r = b.process.exec("cat /volume/note")
    check(r.result == "from-a\n", f"b read a's file through the volume: {r.result!r}")
    b.process.exec("echo from-b >> /volume/note")
    r = a.process.exec("cat /shared/sub/note")
    check(r.result == "from-a\nfrom-b\n", f"a read b's line: {r.result!r}")
    ok("volume-shared")

    a.delete(wait=True)
    b.delete(wait=True)
    daytona.volume.delete(volume)

    def volume_gone():
        try:
            daytona.volume.get(name)
            return False
        except DaytonaNotFoundError:
            return True

    until("the volume's delete", volume_gone)
    ok("volume-delete")


# The provider's own names (crates/agentbox-providers/src/daytona/mod.rs).
PROVIDER_LABEL = "agentbox.provider"
PROVIDER = "daytona"
# The fake's default snapshot, which the provider names when told to.
SNAPSHOT = "daytonaio/sandbox:0.5.0"


class ProviderCreate(api.CreateSandbox):
    """CreateSandbox sending only the fields given, as the provider's body has them (the
    model would add its defaults, `kvm` and `spot` false, which the provider leaves out)."""

    def to_dict(self):
        given = {type(self).model_fields[f].serialization_alias or f for f in self.model_fields_set}
        return {k: v for k, v in super().to_dict().items() if k in given}


def strict(model, what):
    """`model` as parsed, refused where the generated models only tolerate the answer: an enum
    value they do not know (their `_missing_` turns it into UNKNOWN_DEFAULT_OPEN_API) or a field
    they do not name (kept in `additional_properties`)."""

    def walk(v, where):
        if isinstance(v, enum.Enum):
            check(v.name != "UNKNOWN_DEFAULT_OPEN_API", f"{what}: {where} is a value the model does not know")
        elif isinstance(v, BaseModel):
            extra = getattr(v, "additional_properties", None) or {}
            check(not extra, f"{what}: {where} has fields the model does not name: {sorted(extra)}")
            for name in type(v).model_fields:
                if name != "additional_properties":
                    walk(getattr(v, name), f"{where}.{name}")
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, f"{where}[{i}]")
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{where}[{k!r}]")

    check(model is not None, f"{what}: no answer parsed")
    walk(model, type(model).__name__)
    return model


def when(s):
    """An RFC 3339 time of the API's as seconds since the epoch."""
    from datetime import datetime

    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def headers_of(client, key):
    """Authorized as the SDK authorizes its clients (daytona.py), from the provider."""
    client.default_headers["Authorization"] = f"Bearer {key}"
    client.default_headers["X-Daytona-Source"] = "agentbox"
    return client


def api_error(call, status, what):
    """`call()` must fail with `status`; the answer's body (JSON) back."""
    try:
        call()
    except (api.ApiException, tb.ApiException) as e:
        check(e.status == status, f"{what}: answered {e.status}, not {status}: {e.body}")
        return e
    raise AssertionError(f"{what}: succeeded, not {status}")


def free_port():
    """A port preview URLs reach (3000 to 9999, as the provider picks) that nothing holds
    here (an open sandbox shares this machine's network in the fake)."""
    for port in range(7311, 9999, 37):
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
                return port
            except OSError:
                continue
    raise AssertionError("no free port in 3000..9999")


def until(what, f, within=30):
    deadline = time.time() + within
    while True:
        got = f()
        if got:
            return got
        check(time.time() < deadline, f"{what}: not within {within} s")
        time.sleep(0.2)


def provider_calls(daytona):
    """Each HTTP call agentbox's daytona provider makes, with the provider's request shape,
    made by Daytona's Python code."""
    key = os.environ["DAYTONA_API_KEY"]
    client = headers_of(api.ApiClient(api.Configuration(host=os.environ["DAYTONA_API_URL"])), key)
    sandboxes = api.SandboxApi(client)

    # POST /sandbox: SandboxApi.create_sandbox, the body exactly the provider's.
    def create(name, **network):
        labels = {PROVIDER_LABEL: PROVIDER, "agentbox.box": name, "agentbox.name": name}
        body = ProviderCreate(
            name=name,
            env={"JUDGE_P": name},
            labels=labels,
            public=False,
            auto_stop_interval=0,
            auto_delete_interval=-1,
            ttl_minutes=30,
            snapshot=SNAPSHOT,
            target="us",
            **network,
        )
        want = {
            "name": name,
            "env": {"JUDGE_P": name},
            "labels": labels,
            "public": False,
            "autoStopInterval": 0,
            "autoDeleteInterval": -1,
            "ttlMinutes": 30,
            "snapshot": SNAPSHOT,
            "target": "us",
        }
        for k, v in network.items():
            want[{"network_block_all": "networkBlockAll", "domain_allow_list": "domainAllowList"}[k]] = v
        check(body.to_dict() == want, f"the create's body {body.to_dict()} is not the provider's {want}")
        t0 = time.time()
        sb = strict(sandboxes.create_sandbox(body), "create_sandbox")
        check(sb.name == name and sb.state == api.SandboxState.STARTED, f"{name}: {sb.state}")
        check(sb.labels == labels and sb.env == {"JUDGE_P": name}, f"{name}: {sb.labels} {sb.env}")
        check(sb.auto_stop_interval == 0 and sb.auto_delete_interval == -1, f"{name}: intervals")
        check(sb.public is False and sb.snapshot == SNAPSHOT, f"{name}: {sb.public} {sb.snapshot}")
        check(sb.toolbox_proxy_url.startswith("http"), f"{name}: toolboxProxyUrl {sb.toolbox_proxy_url!r}")
        # ttlMinutes reads back as autoDestroyAt, 30 minutes after the creation.
        check(sb.auto_destroy_at is not None, f"{name}: no autoDestroyAt for ttlMinutes 30")
        ends = when(sb.auto_destroy_at) - when(sb.created_at)
        check(abs(ends - 1800) < 2, f"{name}: autoDestroyAt is {ends} s after createdAt")
        check(when(sb.created_at) >= t0 - 5, f"{name}: createdAt {sb.created_at}")
        return sb

    open_ = create("judge-p-open")
    none = create("judge-p-none", network_block_all=True)
    check(none.network_block_all is True, f"networkBlockAll reads {none.network_block_all}")
    allow = create("judge-p-allow", domain_allow_list="*.pypi.org,github.com")
    check(allow.network_block_all is False, f"allow: networkBlockAll {allow.network_block_all}")
    check(allow.domain_allow_list == "*.pypi.org,github.com", f"domainAllowList {allow.domain_allow_list!r}")
    ours = {open_.id, none.id, allow.id}
    ok("p-create")

    # GET /sandbox/{id or name}: SandboxApi.get_sandbox.
    by_id = strict(sandboxes.get_sandbox(open_.id), "get_sandbox")
    by_name = strict(sandboxes.get_sandbox("judge-p-open"), "get_sandbox")
    check(by_id.id == by_name.id == open_.id, f"by id {by_id.id}, by name {by_name.id}")
    check(strict(sandboxes.get_sandbox(none.id), "get_sandbox").network_block_all is True, "none's read")
    read = strict(sandboxes.get_sandbox(allow.id), "get_sandbox")
    check(read.domain_allow_list == "*.pypi.org,github.com", f"allow's read {read.domain_allow_list!r}")
    ok("p-get")

    # GET /sandbox?labels=<json>&limit=&cursor=: SandboxApi.list_sandboxes, the provider's
    # labels string (serde_json's, no spaces), paged through nextCursor.
    q = json.dumps({PROVIDER_LABEL: PROVIDER}, separators=(",", ":"))

    def walk_pages(limit):
        seen, pages, cursor = [], 0, None
        while True:
            r = strict(sandboxes.list_sandboxes(labels=q, limit=limit, cursor=cursor), "list_sandboxes")
            pages += 1
            check(len(r.items) <= limit, f"a page of {len(r.items)} for limit {limit}")
            seen += [i.id for i in r.items]
            for i in r.items:
                check(i.labels.get(PROVIDER_LABEL) == PROVIDER, f"listed {i.id} with labels {i.labels}")
            if not r.next_cursor:
                return seen, pages
            check(r.next_cursor != cursor and pages < 20, f"the cursor {r.next_cursor!r} does not move on")
            cursor = r.next_cursor

    def all_three():
        seen, pages = walk_pages(2)
        return (seen, pages) if ours <= set(seen) else None

    # The index trails the creates: walked again until it shows them.
    seen, pages = until("the index showing the three", all_three)
    check(pages >= 2, f"{len(seen)} sandboxes on {pages} page(s) of 2")
    check(len(seen) == len(set(seen)), f"a sandbox on two pages: {seen}")
    whole, one = walk_pages(200)
    check(one == 1 and set(whole) == set(seen), f"limit 200: {one} pages, {whole}")
    ok("p-list-pages")

    # PUT /sandbox/{id}/labels: SandboxApi.replace_labels (replaces them all).
    new = {PROVIDER_LABEL: PROVIDER, "agentbox.box": "judge-p-open", "team": "blue"}
    got = strict(sandboxes.replace_labels(open_.id, api.SandboxLabels(labels=new)), "replace_labels")
    check(got.labels == new, f"replace_labels answered {got.labels}")
    read = strict(sandboxes.get_sandbox(open_.id), "get_sandbox")
    check(read.labels == new, f"labels after replace {read.labels}")
    ok("p-labels")

    # POST /sandbox/{id}/ttl/{minutes}: SandboxApi.set_ttl, re-anchored from the request.
    # The sandbox is older than the tolerance, so a ttl counted from the creation is caught.
    before = read.auto_destroy_at
    time.sleep(max(0.0, when(read.created_at) + 2.5 - time.time()))
    asked = time.time()
    moved = strict(sandboxes.set_ttl(open_.id, 45), "set_ttl")
    check(moved.auto_destroy_at is not None and moved.auto_destroy_at != before, f"autoDestroyAt {before} stays")
    off = when(moved.auto_destroy_at) - (asked + 45 * 60)
    check(-0.5 < off < 2, f"autoDestroyAt is {off:+.2f} s off 45 minutes from the request")
    read = strict(sandboxes.get_sandbox(open_.id), "get_sandbox")
    check(read.auto_destroy_at == moved.auto_destroy_at, f"read back {read.auto_destroy_at}")
    ok("p-ttl")

    # The toolbox at {toolboxProxyUrl}/{sandboxId}, as the SDK's proxy client addresses it.
    tc = headers_of(tb.ApiClient(tb.Configuration(host=f"{open_.toolbox_proxy_url}/{open_.id}")), key)
    process, files = tb.ProcessApi(tc), tb.FileSystemApi(tc)

    # POST /process/execute {command, timeout}: ProcessApi.execute_command.
    req = tb.ExecuteRequest(command="echo out; echo err >&2; echo $JUDGE_P; exit 5", timeout=10)
    check(req.to_dict() == {"command": req.command, "timeout": 10}, f"execute's body {req.to_dict()}")
    r = strict(process.execute_command(req), "execute_command")
    check(r.exit_code == 5 and r.result == "out\nerr\njudge-p-open\n", f"execute: {r.exit_code} {r.result!r}")
    e = api_error(lambda: process.execute_command(tb.ExecuteRequest(command="sleep 30", timeout=1)), 408, "execute past its timeout")
    strict(e.data, "execute's 408 ErrorResponse")
    ok("p-execute")

    # POST /files/bulk-upload, two files (the second empty) in one request, parents made: the
    # SDK's fs.upload_files (the generated upload_files takes no files: the SDK builds the
    # multipart itself, as the provider does).
    sdk_box = daytona.get(open_.id)
    blob = bytes(range(256)) * 64 + b"\x00 tail \xff"
    sdk_box.fs.upload_files(
        [
            FileUpload(source=blob, destination="/tmp/p/deep/er/blob.bin"),
            FileUpload(source=b"", destination="/tmp/p/other/in.end"),
        ]
    )
    # The answer, which the SDK drops, parsed by the generated ApiClient's own multipart call
    # (the runner the preview step serves, one file).
    runner = open(os.environ["JUDGE_RUNNER"], "rb").read()
    rpath = "/tmp/p/bin/agentbox-runner"
    call = tc.param_serialize(
        method="POST",
        resource_path="/files/bulk-upload",
        header_params={"Content-Type": "multipart/form-data", "Accept": "*/*"},
        post_params=[("files[0].path", rpath)],
        files={"files[0].file": (rpath, runner)},
    )
    resp = tc.call_api(*call)
    resp.read()
    up = strict(tc.response_deserialize(resp, {"200": "UploadFilesResponse"}).data, "bulk-upload's answer")
    check(up.errors is None, f"upload errors {up.errors}")
    check([(f.path, f.bytes) for f in up.files] == [(rpath, len(runner))], f"uploaded {up.files}")
    ok("p-upload")

    # GET /files/download?path=: FileSystemApi.download_file; a missing file is 404
    # FILE_NOT_FOUND in the daemon's ErrorResponse.
    check(files.download_file(path="/tmp/p/deep/er/blob.bin") == blob, "the blob back")
    check(files.download_file(path="/tmp/p/other/in.end") == b"", "the empty file back")
    e = api_error(lambda: files.download_file(path="/tmp/p/missing"), 404, "a missing file")
    err = strict(e.data, "download's 404 ErrorResponse")
    check(err.code == tb.DaemonErrorCode.CodeFileNotFound, f"code {err.code}")
    check(err.status_code == 404 and "/tmp/p/missing" in err.message, f"{err}")
    ok("p-download")

    # POST /process/session {sessionId}, POST .../exec {command, runAsync, suppressInputEcho}:
    # ProcessApi.create_session and session_execute_command; the command is the provider's
    # runner start, left running.
    sid = "judge-p-session"
    check(process.create_session(tb.CreateSessionRequest(session_id=sid)) is None, "create_session")
    port = free_port()
    command = (
        f"sh -c 'chmod 755 \"$0\" && exec \"$0\" \"$@\"' {rpath} serve --listen 0.0.0.0:{port}"
    )
    req = tb.SessionExecuteRequest(command=command, run_async=True, suppress_input_echo=True)
    want = {"command": command, "runAsync": True, "suppressInputEcho": True}
    check(req.to_dict() == want, f"exec's body {req.to_dict()}")
    r = strict(process.session_execute_command(sid, req), "session_execute_command")
    check(r.cmd_id and r.exit_code is None, f"an async command: {r}")
    ok("p-session-exec")

    # GET /sandbox/{id}/ports/{port}/preview-url: SandboxApi.get_port_preview_url (and the
    # SDK's get_preview_link, the same call), then the URL with X-Daytona-Preview-Token, as
    # the SDK's own example fetches it (httpx); without the token, 401.
    link = strict(sandboxes.get_port_preview_url(open_.id, port), "get_port_preview_url")
    sdk_link = sdk_box.get_preview_link(port)
    check((link.url, link.token) == (sdk_link.url, sdk_link.token), f"{link} vs {sdk_link}")
    check(link.sandbox_id == open_.id and link.token, f"{link}")
    health = link.url.rstrip("/") + "/runner/health"
    with_token = {"X-Daytona-Preview-Token": link.token, "X-Daytona-Skip-Preview-Warning": "true"}

    def healthy():
        try:
            r = httpx.get(health, headers=with_token, timeout=5)
        except httpx.HTTPError:
            return None
        return r if r.status_code == 200 else None

    r = until("the runner answering through the preview URL", healthy, within=20)
    check("protocol" in r.json(), f"the runner's health {r.text!r}")
    r = httpx.get(health, headers={"X-Daytona-Skip-Preview-Warning": "true"}, timeout=5)
    check(r.status_code == 401, f"no token: {r.status_code} {r.text!r}")
    ok("p-preview")

    # DELETE /process/session/{sid}: ProcessApi.delete_session (204), which ends its
    # command; again is 404, which the provider takes as done.
    check(process.delete_session(sid) is None, "delete_session")
    until("the runner ending with its session", lambda: healthy() is None, within=10)
    e = api_error(lambda: process.delete_session(sid), 404, "a deleted session")
    strict(e.data, "delete_session's 404 ErrorResponse")
    ok("p-session-delete")

    # POST /sandbox/{id}/stop?force=false: SandboxApi.stop_sandbox(force=False), then reads
    # until stopped; POST /sandbox/{id}/start: start_sandbox, then reads until started.
    def settle(sid_, state):
        return until(
            f"{sid_} {state}",
            lambda: (lambda s: s if s.state == state else None)(strict(sandboxes.get_sandbox(sid_), "get_sandbox")),
        )

    strict(sandboxes.stop_sandbox(open_.id, force=False), "stop_sandbox")
    settle(open_.id, api.SandboxState.STOPPED)
    api_error(lambda: process.execute_command(tb.ExecuteRequest(command="true", timeout=5)), 400, "a stopped toolbox")
    ok("p-stop")
    strict(sandboxes.start_sandbox(open_.id), "start_sandbox")
    settle(open_.id, api.SandboxState.STARTED)
    r = strict(process.execute_command(tb.ExecuteRequest(command="cat /tmp/p/deep/er/blob.bin | wc -c", timeout=10)), "execute_command")
    check(r.exit_code == 0 and r.result.strip() == str(len(blob)), f"the file after start: {r.result!r}")
    ok("p-start")

    # POST /sandbox/{id}/archive: SandboxApi.archive_sandbox (a stopped sandbox).
    strict(sandboxes.stop_sandbox(open_.id, force=False), "stop_sandbox")
    settle(open_.id, api.SandboxState.STOPPED)
    strict(sandboxes.archive_sandbox(open_.id), "archive_sandbox")
    settle(open_.id, api.SandboxState.ARCHIVED)
    ok("p-archive")

    def gone(sid):
        try:
            sandboxes.get_sandbox(sid)
            return False
        except api.ApiException as e:
            check(e.status == 404, f"reading {sid}: {e.status} {e.body}")
            return True

    # DELETE /sandbox/{id}: SandboxApi.delete_sandbox, the soft delete: the answer and a read
    # by id show the record with desiredState destroyed, a second delete is 409, its name
    # takes a create at once; a read is 404 in the API's envelope once it is destroyed.
    for sb in (open_, none, allow):
        d = strict(sandboxes.delete_sandbox(sb.id), "delete_sandbox")
        check(d.desired_state == api.SandboxDesiredState.DESTROYED, f"{sb.name}: delete answered {d.desired_state}")
        check(d.name.startswith(f"DESTROYED_{sb.name}_"), f"{sb.name}: renamed {d.name!r}")
        r = strict(sandboxes.get_sandbox(sb.id), "get_sandbox of a deleted sandbox")
        check(r.desired_state == api.SandboxDesiredState.DESTROYED, f"{sb.name}: read {r.desired_state}")
        e = api_error(lambda: sandboxes.delete_sandbox(sb.id), 409, f"{sb.name} deleted twice")
        body = json.loads(e.body)
        check(body.get("message") == "Sandbox state change in progress", f"{body}")
    reborn = create("judge-p-open")
    check(reborn.id != open_.id, "the name of a deleted sandbox took a new create")
    for sb in (open_, none, allow):
        until(f"{sb.name}'s destroy", lambda: gone(sb.id))
    e = api_error(lambda: sandboxes.get_sandbox(open_.id), 404, "judge-p-open destroyed")
    body = json.loads(e.body)
    check(body.get("code") == "SANDBOX_NOT_FOUND" and body.get("source") == "DAYTONA_API", f"{body}")
    ok("p-delete")

    # A create whose answer a gateway lost (503) after the API made the sandbox: the SDK's
    # client raises, and the sandbox is there by its name all the same.
    wait_for("fail-after-create")
    e = api_error(lambda: create("judge-p-lost"), 503, "a create answered 503")
    body = json.loads(e.body)
    check(body.get("source") == "DAYTONA_API" and body.get("statusCode") == 503, f"{body}")
    lost = strict(sandboxes.get_sandbox("judge-p-lost"), "get_sandbox of a lost create")
    check(lost.state == api.SandboxState.STARTED, f"the lost create's sandbox: {lost.state}")
    for sb in (reborn, lost):
        strict(sandboxes.delete_sandbox(sb.id), "delete_sandbox")
    for sb in (reborn, lost):
        until(f"{sb.name}'s destroy", lambda: gone(sb.id))
    ok("p-create-lost-answer")


def main():
    daytona = Daytona()
    sdk_walk(daytona)
    volume_walk(daytona)
    provider_calls(daytona)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        print("FAILED", flush=True)
        sys.exit(1)

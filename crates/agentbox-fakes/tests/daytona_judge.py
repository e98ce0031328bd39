"""The judge: Daytona's own Python SDK (`daytona` 0.226.1), which nobody here wrote, against
agentbox's fake Daytona. Run by tests/daytona_judges.rs with DAYTONA_API_URL and
DAYTONA_API_KEY in the environment. Prints `OK <step>` per step and exits non-zero at the
first failure. Where the test must act on the fake (its throttle), it prints `WAIT <what>`
and reads one line from stdin once the test has acted.
"""

import asyncio
import sys
import time
import traceback

from daytona import (
    CreateSandboxFromSnapshotParams,
    Daytona,
    DaytonaNotFoundError,
    DaytonaRateLimitError,
    DaytonaTimeoutError,
    FileDownloadRequest,
    ListSandboxesQuery,
    SessionExecuteRequest,
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


def main():
    daytona = Daytona()

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

    sandbox.delete()
    try:
        daytona.get(sandbox.id)
        raise AssertionError("a deleted sandbox is still there")
    except DaytonaNotFoundError:
        pass
    ok("delete")


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        print("FAILED", flush=True)
        sys.exit(1)

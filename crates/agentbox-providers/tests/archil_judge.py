"""The judge: Archil's own Python SDK (`archil` 0.18.0) and its generated client
(`archil-openapi` 0.0.61), which nobody here wrote, against agentbox's fake Archil. Run by
tests/archil.rs (its `judged` module) with ARCHIL_BASE_URL, ARCHIL_S3_BASE_URL and ARCHIL_API_KEY in the
environment; the fake's exec limit is JUDGE_EXEC_LIMIT_S seconds. Prints `OK <step>` per
step and exits non-zero at the first failure. Where the test must act on the fake (a
scripted fault), it prints `WAIT <what> <disk id>` and reads one line from stdin once the test
has acted.

Two parts: the SDK's own calls (`sdk_walk`), which raise ArchilApiError / ArchilS3Error from
the fake's error bodies as they would from Archil's, and `openapi_walk`, which parses every
control-plane answer into the generated models (`strict`: no field they do not name), with
the openapi client's own `Bearer` key.
"""

# /// script
# dependencies = ["archil==0.18.0", "archil-openapi==0.0.61"]
# ///

import os
import sys
import threading
import time
import traceback

import httpx
from archil import Archil, ArchilApiError, ArchilS3Error, ExecMountSpec
from archil_openapi import AuthenticatedClient
from archil_openapi.api.disks import create_disk, delete_disk, exec_, exec_disk, get_disk, list_disks
from archil_openapi.models import (
    ApiResponseCreateDisk,
    ApiResponseDisk,
    ApiResponseDiskList,
    ApiResponseEmpty,
    ApiResponseExec,
    ApiResponseExecDisk,
    CreateDiskRequest,
    ErrorResponse,
    ExecDiskRequest,
    ExecMount,
    ExecRequest,
    ExecRequestDisks,
)

BASE = os.environ["ARCHIL_BASE_URL"]
S3 = os.environ["ARCHIL_S3_BASE_URL"]
KEY = os.environ["ARCHIL_API_KEY"]
LIMIT = float(os.environ["JUDGE_EXEC_LIMIT_S"])


def ok(step):
    print(f"OK {step}", flush=True)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def wait_for(what):
    print(f"WAIT {what}", flush=True)
    line = sys.stdin.readline()
    check(line != "", f"the test closed stdin instead of acting on {what}")


def raises(cls, fn, status, code=None):
    try:
        fn()
    except cls as e:
        check(e.status == status, f"{cls.__name__} status {e.status}, expected {status}: {e}")
        if code is not None:
            check(e.code == code, f"{cls.__name__} code {e.code!r}, expected {code!r}: {e}")
        return e
    raise AssertionError(f"no {cls.__name__} {status}")


def client(key=KEY):
    return Archil(api_key=key, region="aws-us-east-1", base_url=BASE, s3_base_url=S3, timeout=120)


def sdk_walk(archil):
    created = archil.disks.create(name="judge-one")
    disk = created.disk
    check(disk.id.startswith("dsk-") and len(disk.id) == 20, f"disk id {disk.id}")
    check(disk.status == "available", f"status {disk.status}")
    check(disk.name == "judge-one" and disk.region == "aws-us-east-1", repr(disk))
    check(created.authorized_users == [] and created.token is None, repr(created))
    ok("create")

    other = archil.disks.create(name="judge-two").disk
    third = archil.disks.create(name="judge-three").disk
    ids = [d.id for d in archil.disks.list()]
    check(ids == [disk.id, other.id, third.id], f"list: {ids}")
    pages = list(archil.disks.list_pages(page_size=2))
    check([len(p.disks) for p in pages] == [2, 1], f"pages: {[len(p.disks) for p in pages]}")
    check(pages[0].next_cursor and pages[-1].next_cursor is None, "cursors")
    check([d.id for d in archil.disks.list(name="judge-two")] == [other.id], "list by name")
    check([d.id for d in archil.disks.list(limit=1)] == [disk.id], "list with a limit")
    ok("list")

    got = archil.disks.get(disk.id)
    check(got.id == disk.id and got.name == "judge-one" and got.created_at, repr(got))
    check(got.refresh().id == disk.id, "refresh")
    raises(ArchilApiError, lambda: archil.disks.get("dsk-0000000000000000"), 404, "not_found")
    raises(ArchilApiError, lambda: archil.disks.create(name="judge-one"), 409, "conflict")
    raises(ArchilApiError, lambda: archil.disks.create(name="not a name"), 400, "invalid_request")
    ok("get")

    r = disk.exec("echo out; echo err >&2; printf 'bad \\377 byte'; cat; exit 7")
    check(r.exit_code == 7, f"exit code {r.exit_code}")
    check(r.stdout == "out\nbad \ufffd byte", f"stdout {r.stdout!r}")
    check(r.stderr == "err\n", f"stderr {r.stderr!r}")
    t = r.timing
    check(all(isinstance(x, int) for x in (t.total_ms, t.queue_ms, t.execute_ms)), repr(t))
    check(t.total_ms >= t.execute_ms, repr(t))
    r = disk.exec("echo \"$ARCHIL_DISK_ID\" > /mnt/archil/who; pwd; echo $ARCHIL_REGION")
    check((r.exit_code, r.stdout) == (0, "/\naws-us-east-1\n"), repr(r))
    check(disk.get_object("who") == (disk.id + "\n").encode(), "a file the exec wrote")
    ok("exec")

    disk.put_object("sub/x", b"in the subdirectory\n")
    r = archil.exec(
        disks={
            "box": ExecMountSpec(disk=disk, subdirectory="sub"),
            "ro": ExecMountSpec(disk=other, read_only=True),
            "plain": third.id,
        },
        command="cat /mnt/archil/box/x; touch /mnt/archil/ro/no 2>/dev/null || echo read-only; "
        "echo w > /mnt/archil/plain/w; ls /mnt/archil",
    )
    check(r.exit_code == 0, repr(r))
    check(r.stdout == "in the subdirectory\nread-only\nbox\nplain\nro\n", f"stdout {r.stdout!r}")
    check(third.get_object("w") == b"w\n", "the plain mount was written")
    e = raises(
        ArchilApiError,
        lambda: archil.exec(disks={"box": ExecMountSpec(disk=disk, subdirectory="missing")}, command="true"),
        404,
    )
    check("missing" in str(e), str(e))
    raises(ArchilApiError, lambda: archil.exec(disks={"../up": disk}, command="true"), 400, "invalid_request")
    ok("exec-mounts")

    every = bytes(range(256))
    put = disk.put_object("bytes/all.bin", every)
    check(put.etag and put.etag.startswith('"'), f"etag {put.etag!r}")
    check(disk.get_object("bytes/all.bin") == every, "every byte value round trips")
    check(disk.put_object("odd name/é?#%.txt", "text").etag, "an odd key")
    check(disk.get_object("odd name/é?#%.txt") == b"text", "an odd key reads back")
    ok("put-get")

    meta = disk.head_object("bytes/all.bin")
    check(meta is not None and meta.size == 256 and meta.etag == put.etag, repr(meta))
    check(meta.last_modified is not None, "last-modified")
    check(disk.head_object("nope") is None and not disk.object_exists("nope"), "head of a missing key")
    ok("head")

    disk.append_object("log.txt", b"one,")
    appended = disk.append_object("log.txt", "two")
    check(appended.etag, "append's etag")
    check(disk.get_object("log.txt") == b"one,two", "appended")
    raises(ArchilS3Error, lambda: disk.append_object("log.txt", b"x" * ((1 << 20) + 1)), 400, "EntityTooLarge")
    ok("append")

    disk.put_object("empty/", b"")
    listing = disk.list_objects()
    keys = [o.key for o in listing.objects]
    check(keys == ["log.txt", "who"], f"top level: {keys}")
    check(listing.common_prefixes == ["bytes/", "empty/", "odd name/", "sub/"], f"prefixes {listing.common_prefixes}")
    check(listing.objects[0].size == 7 and listing.objects[0].last_modified is not None, repr(listing.objects[0]))
    under = disk.list_objects(prefix="bytes/")
    check([o.key for o in under.objects] == ["bytes/all.bin"], repr(under))
    check(under.objects[0].etag == put.etag, "a listing's etag is HEAD's")
    everything = disk.list_objects(recursive=True)
    check(
        [o.key for o in everything.objects]
        == ["bytes/all.bin", "log.txt", "odd name/é?#%.txt", "sub/x", "who"],
        f"recursive: {[o.key for o in everything.objects]}",
    )
    paged = [o.key for p in disk.list_objects_pages(recursive=True) for o in p.objects]
    check(paged == [o.key for o in everything.objects], "pages")
    ok("list-objects")

    disk.delete_object("log.txt")
    disk.delete_object("log.txt")
    check(disk.head_object("log.txt") is None, "deleted")
    e = raises(ArchilS3Error, lambda: disk.get_object("log.txt"), 404, "NoSuchKey")
    check(e.request_id, "an S3 error's request id")
    raises(ArchilS3Error, lambda: disk.get_object("bytes"), 404, "NoSuchKey")
    # httpx resolves the `..` of the URL the SDK builds before it is sent: the request names
    # the bucket `escape`, which is no disk. (The fake's own refusal of `..` in a key is
    # tests/archil.rs's, over a raw connection; here a DeleteObjects key carries one.)
    raises(ArchilS3Error, lambda: disk.get_object("../escape"), 404, "NoSuchBucket")
    res = disk.delete_objects(["bytes/all.bin", "never-was", "../bad"])
    check(res.deleted == ["bytes/all.bin", "never-was"], repr(res))
    check([(x.key, x.code) for x in res.errors] == [("../bad", "InvalidArgument")], repr(res))
    ok("delete-objects")

    # A delegation checkout: an exec holds the disk; a write meanwhile is 409 (not retried by
    # the SDK), a read goes on, and a second exec with no queue is refused.
    holder = {}
    t = threading.Thread(target=lambda: holder.setdefault("r", client().disks.get(disk.id).exec("sleep 2")))
    t.start()
    time.sleep(0.7)
    raises(ArchilS3Error, lambda: disk.put_object("held", b"x"), 409, "OperationAborted")
    check(disk.get_object("who"), "a read while checked out")
    raises(ArchilApiError, lambda: archil.exec(disks={"d": disk}, command="true"), 400, "checkout_timeout")
    t.join(30)
    check(holder.get("r") is not None and holder["r"].exit_code == 0, f"the holder: {holder}")
    disk.put_object("held", b"x")
    ok("checkout")

    started = time.monotonic()
    raises(ArchilApiError, lambda: disk.exec(f"sleep {LIMIT * 4}"), 504, "timeout")
    check(time.monotonic() - started < LIMIT * 3, "the limit's 504 came late")
    ok("exec-timeout")

    wait_for(f"faults {disk.id}")
    # Two scripted 503s on a GetObject: the SDK retries them (three times at most).
    check(disk.get_object("who") == (disk.id + "\n").encode(), "retried past two 503s")
    # A scripted control-plane error surfaces with its code.
    raises(ArchilApiError, lambda: archil.disks.get(disk.id), 500, "scripted_fault")
    ok("faults")

    bad = client("not-the-key")
    raises(ArchilApiError, lambda: bad.disks.list(), 401, "unauthorized")
    raises(ArchilS3Error, lambda: bad_s3_get(disk.id), 403, "AccessDenied")
    ok("bad-key")

    for d in (disk, other, third):
        d.delete()
    raises(ArchilApiError, lambda: archil.disks.get(disk.id), 404)
    check(archil.disks.list() == [], "every disk deleted")
    ok("delete")


def bad_s3_get(disk_id):
    """GetObject with a wrong key, through the SDK's own transport and error parser (a Disk
    is had only through the control plane, which refuses the key first)."""
    import asyncio

    from archil._http import _Transport
    from archil.errors import parse_s3_error

    async def go():
        t = _Transport(BASE, "not-the-key", S3, timeout=120)
        try:
            resp = await t.s3_request("GET", disk_id, "who")
        finally:
            await t.aclose()
        if not resp.is_success:
            raise parse_s3_error("GetObject", resp.status_code, resp.reason_phrase, resp.text)

    asyncio.run(go())


def strict(model, what):
    """A parsed model holds no field its class does not name, nor does any model in it."""
    extra = getattr(model, "additional_properties", None)
    check(not extra, f"{what}: fields the model does not name: {extra}")
    for name in getattr(type(model), "__attrs_attrs__", ()):
        value = getattr(model, name.name, None)
        if name.name == "additional_properties":
            continue
        for v in value if isinstance(value, list) else [value]:
            if hasattr(v, "additional_properties") and not isinstance(v, ExecRequestDisks):
                strict(v, f"{what}.{name.name}")


def openapi_walk():
    api = AuthenticatedClient(base_url=BASE, token=KEY, raise_on_unexpected_status=True, timeout=httpx.Timeout(120))
    r = create_disk.sync_detailed(client=api, body=CreateDiskRequest(name="openapi-disk"))
    check(r.status_code == 200 and isinstance(r.parsed, ApiResponseCreateDisk), f"create: {r.status_code} {r.content}")
    strict(r.parsed, "create")
    disk_id = r.parsed.data.disk_id
    check(r.parsed.data.authorized_users == [], repr(r.parsed))

    r = get_disk.sync_detailed(disk_id, client=api)
    check(isinstance(r.parsed, ApiResponseDisk), f"get: {r.content}")
    strict(r.parsed, "get")
    d = r.parsed.data
    check(d.id == disk_id and d.status.value == "available" and d.sandbox_disk is False, repr(d))
    check(d.created_at.tzinfo is not None, "createdAt has a zone")

    r = list_disks.sync_detailed(client=api, limit=1)
    check(isinstance(r.parsed, ApiResponseDiskList), f"list: {r.content}")
    strict(r.parsed, "list")
    check([x.id for x in r.parsed.data] == [disk_id], repr(r.parsed))
    ok("p-disks")

    r = exec_disk.sync_detailed(disk_id, client=api, body=ExecDiskRequest(command="echo hi; exit 2"))
    check(isinstance(r.parsed, ApiResponseExecDisk), f"exec_disk: {r.content}")
    strict(r.parsed, "exec_disk")
    check((r.parsed.data.exit_code, r.parsed.data.stdout) == (2, "hi\n"), repr(r.parsed))
    disks = ExecRequestDisks()
    disks.additional_properties = {
        "a": disk_id,
        "b": ExecMount(disk=disk_id, read_only=True),
        "c/d": ExecMount(disk=disk_id, conditional=True, queue_ms=1000),
    }
    r = exec_.sync_detailed(client=api, body=ExecRequest(disks=disks, command="ls /mnt/archil /mnt/archil/c"))
    check(isinstance(r.parsed, ApiResponseExec), f"exec: {r.content}")
    strict(r.parsed, "exec")
    check(r.parsed.data.stdout == "/mnt/archil:\na\nb\nc\n\n/mnt/archil/c:\nd\n", repr(r.parsed.data.stdout))
    ok("p-exec")

    r = get_disk.sync_detailed("dsk-0000000000000000", client=api)
    check(r.status_code == 404 and isinstance(r.parsed, ErrorResponse), f"404: {r.content}")
    strict(r.parsed, "404")
    check(r.parsed.success is False and r.parsed.code == "not_found", repr(r.parsed))
    r = exec_.sync_detailed(client=api, body=ExecRequest(disks=ExecRequestDisks(), command="true"))
    check(r.status_code == 400 and isinstance(r.parsed, ErrorResponse), f"400: {r.content}")
    wrong = AuthenticatedClient(base_url=BASE, token="wrong", raise_on_unexpected_status=True)
    r = list_disks.sync_detailed(client=wrong)
    check(r.status_code == 401 and isinstance(r.parsed, ErrorResponse), f"401: {r.content}")
    ok("p-errors")

    r = delete_disk.sync_detailed(disk_id, client=api)
    check(isinstance(r.parsed, ApiResponseEmpty) and r.parsed.success, f"delete: {r.content}")
    strict(r.parsed, "delete")
    ok("p-delete")


def main():
    try:
        with client() as archil:
            sdk_walk(archil)
        openapi_walk()
    except Exception:
        traceback.print_exc()
        sys.exit(1)


if __name__ == "__main__":
    main()

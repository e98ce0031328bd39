"""Streams, terminals, directories as tar, snapshots and forks, against the suite's server (see
test_client.py for what names it)."""

from __future__ import annotations

import asyncio
import io
import os
import tarfile

import pytest

import agentbox

URL = os.environ.get("AGENTBOX_URL", "")
KEY_A = os.environ.get("AGENTBOX_TEST_KEY_A", "")
KEY_B = os.environ.get("AGENTBOX_TEST_KEY_B", "")
PROVIDERS = os.environ.get("AGENTBOX_TEST_PROVIDERS", "").split(",")


@pytest.fixture
def client() -> agentbox.Client:
    if not (URL and KEY_A and KEY_B):
        raise RuntimeError("run through `cargo test -p agentbox-cli --test python_client`")
    return agentbox.Client(URL, KEY_A)


def _read_until(stream: agentbox.Stream, want: str) -> str:
    text = ""
    for ev in stream:
        assert ev.type == "output", ev
        text += ev.text
        if want in text:
            return text
    raise AssertionError(f"the stream ended before {want!r}: {text!r}")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_stream_goes_on_from_its_cursor_after_a_drop(
    client: agentbox.Client, provider: str
) -> None:
    box = client.create_box(provider, max_lifetime_ms=600_000)
    try:
        p = box.start(command="echo one; read x; echo got:$x; read y; echo three; exit 5")
        with p.stream() as s:
            first = _read_until(s, "one\n")
            s.write("hi\n")
            second = _read_until(s, "got:hi\n")
            cursor = s.next
        # Dropped; opened again from where it was.
        with p.stream(after=cursor) as s:
            s.write(b"x\n")
            third = _read_until(s, "three\n")
            end = next(iter(s))
        assert first + second + third == "one\ngot:hi\nthree\n"
        assert end.type == "exit" and end.exit is not None
        assert end.exit["status"]["code"] == 5
        # Another key's process is not there.
        other = agentbox.Client(URL, KEY_B)
        with pytest.raises(agentbox.NotFound):
            agentbox.Process(agentbox.Box(other, box.refresh()), p.handle).stream()
    finally:
        box.delete()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_terminal_is_resized_and_reattached(client: agentbox.Client, provider: str) -> None:
    box = client.create_box(provider, max_lifetime_ms=600_000)
    try:
        with box.terminal(30, 90, command="stty size; read x; stty size; echo done") as t:
            started = next(iter(t))
            assert started.type == "started" and started.handle is not None
            _read_until(t, "30 90")
            t.resize(40, 100)
        with box.process(started.handle).stream() as t:
            _read_until(t, "30 90")
            t.write("\n")
            assert "40 100" in _read_until(t, "done")
    finally:
        box.delete()


def _tar(members: dict[str, bytes], link: bool = True) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo("evil")
            info.type = tarfile.SYMTYPE
            info.linkname = "/etc/passwd"
            t.addfile(info)
    return buf.getvalue()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_directory_goes_in_and_out_as_a_tar(client: agentbox.Client, provider: str) -> None:
    box = client.create_box(provider, max_lifetime_ms=600_000)
    try:
        got = box.upload_tar("proj", _tar({"a.txt": b"alpha", "src/b.py": b"print(1)\n"}))
        assert got.skipped == {"symlink": 1}, got
        assert box.read_file("proj/src/b.py") == b"print(1)\n"
        with tarfile.open(fileobj=io.BytesIO(box.download_tar("proj"))) as t:
            names = sorted(m.name.rstrip("/") for m in t.getmembers())
            a = t.extractfile("a.txt")
            assert a is not None and a.read() == b"alpha"
        assert names == ["a.txt", "src", "src/b.py"]
        with pytest.raises(agentbox.AgentboxError) as bad:
            box.upload_tar("other", b"not a tar at all" * 64)
        assert bad.value.code == "invalid"
    finally:
        box.delete()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_snapshots_are_a_keys_own_and_forks_its_boxes(
    client: agentbox.Client, provider: str
) -> None:
    other = agentbox.Client(URL, KEY_B)
    box = client.create_box(provider, max_lifetime_ms=600_000)
    name = f"py-{os.getpid()}"
    made: list[agentbox.Box] = []
    try:
        box.write_file("kept.txt", "kept")
        snap = box.snapshot(name)
        assert (snap.name, snap.provider) == (name, provider)
        assert name in [s.name for s in client.snapshots(provider)]
        assert name not in [s.name for s in other.snapshots(provider)]
        made.append(client.create_box(provider, max_lifetime_ms=600_000, snapshot=name))
        assert made[0].read_file("kept.txt") == b"kept"
        with pytest.raises(agentbox.NotFound):
            other.create_box(provider, max_lifetime_ms=600_000, snapshot=name)
        box.write_file("kept.txt", "changed")
        made.extend(box.fork(2, max_lifetime_ms=600_000))
        assert [f.read_file("kept.txt") for f in made[1:]] == [b"changed", b"changed"]
        assert not {f.id for f in made} & {b.id for b in other.list_boxes()}
    finally:
        for b in [box, *made]:
            b.delete()
        client.delete_snapshot(provider, name)
    with pytest.raises(agentbox.NotFound):
        client.delete_snapshot(provider, name)


def test_the_async_stream_does_the_same() -> None:
    async def main() -> str:
        async with agentbox.AsyncClient(URL, KEY_A) as c:
            box = await c.create_box(PROVIDERS[0], max_lifetime_ms=600_000)
            try:
                p = await box.start(command="cat")
                text = ""
                async with await p.stream() as s:
                    await s.write("async\n", close=True)
                    async for ev in s:
                        if ev.type == "output":
                            text += ev.text
                        elif ev.type == "exit":
                            break
                return text
            finally:
                await box.delete()

    assert asyncio.run(main()) == "async\n"

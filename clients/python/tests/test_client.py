"""The client against a real `agentbox serve`, which `cargo test -p agentbox-cli --test
python_client` starts and names here: AGENTBOX_URL, two keys (AGENTBOX_TEST_KEY_A and _B),
and the providers to run on (AGENTBOX_TEST_PROVIDERS, comma-separated)."""

from __future__ import annotations

import asyncio
import os

import pytest

import agentbox


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(
            f"{name} is not set: run these through "
            "`cargo test -p agentbox-cli --test python_client`"
        )
    return value


PROVIDERS = _env("AGENTBOX_TEST_PROVIDERS").split(",")


@pytest.fixture
def client() -> agentbox.Client:
    return agentbox.Client(_env("AGENTBOX_URL"), _env("AGENTBOX_TEST_KEY_A"))


@pytest.fixture
def other() -> agentbox.Client:
    return agentbox.Client(_env("AGENTBOX_URL"), _env("AGENTBOX_TEST_KEY_B"))


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_box_runs_programs_holds_files_and_takes_tools(
    client: agentbox.Client, provider: str
) -> None:
    box = client.create_box(provider, max_lifetime_ms=600_000, env={"GREETING": "hello"})
    try:
        assert box.id.startswith(f"{provider}:")
        assert box.refresh().status == "running"
        r = box.exec(["sh", "-c", "echo $GREETING; echo err >&2; exit 4"])
        assert (r.exit_code, r.stdout, r.stderr) == (4, "hello\n", "err\n")
        r = box.exec(command="cat", stdin="through stdin")
        assert r.stdout == "through stdin"
        r = box.exec(command="seq 1 200000", max_output=10)
        assert r.stdout == "1\n2\n3\n4\n5\n" and r.stdout_dropped > 0
        data = bytes(range(256)) * 4
        box.write_file("data/blob.bin", data)
        assert box.read_file("data/blob.bin") == data
        assert box.stat("data/blob.bin").size == len(data)
        assert [f.name for f in box.list_dir("data")] == ["blob.bin"]
        box.mkdir("a/b", recursive=True)
        box.rename("data/blob.bin", "a/b/moved.bin")
        assert box.read_file("a/b/moved.bin") == data
        with pytest.raises(agentbox.NotFound):
            box.stat("data/blob.bin")
        box.remove("a", recursive=True)
        with pytest.raises(agentbox.AgentboxError) as climbed:
            box.read_file("../outside")
        assert climbed.value.code == "invalid" and climbed.value.status == 400
        wrote = box.tool("write", path="notes.md", content="# notes\n")
        assert not wrote.is_error, wrote.text
        read = box.tool("read", path="notes.md")
        assert "# notes" in read.text
        missing = box.tool("read", path="no/such/file")
        assert missing.is_error
        ran = box.tool("bash", command="echo from-bash")
        assert "from-bash" in ran.text
        with pytest.raises(agentbox.AgentboxError) as timed_out:
            box.exec(command="sleep 30", timeout_ms=300)
        assert timed_out.value.code == "timeout"
    finally:
        box.delete()
    with pytest.raises(agentbox.NotFound):
        client.get_box(box.id)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_named_box_sleeps_wakes_and_lives_longer(client: agentbox.Client, provider: str) -> None:
    box = client.open_box("py-dev", provider, max_lifetime_ms=600_000)
    try:
        assert client.open_box("py-dev", provider, max_lifetime_ms=600_000).id == box.id
        box.write_file("kept.txt", "kept")
        box.sleep()
        assert box.refresh().status == "sleeping"
        box.wake()
        assert box.read_file("kept.txt") == b"kept", "a sleep keeps the files"
        before = box.info.facts["ends_at_ms"]
        assert box.extend(by_ms=60_000).facts["ends_at_ms"] == before + 60_000
    finally:
        box.delete()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_detached_process_is_read_from_its_cursor_across_a_reconnect(provider: str) -> None:
    url, key = _env("AGENTBOX_URL"), _env("AGENTBOX_TEST_KEY_A")
    with agentbox.Client(url, key) as first:
        box = first.create_box(provider, max_lifetime_ms=600_000)
        p = box.start(command="echo one; read line; echo two $line; exit 5")
        seen = ""
        cursor = 0
        while "one" not in seen:
            out = p.output(after=cursor, wait_ms=1000)
            seen += out.text
            cursor = out.next
        handle, box_id = p.handle, box.id
    # A new client (a host that came back) goes on from the cursor: nothing twice, nothing lost.
    with agentbox.Client(url, key) as second:
        box = second.get_box(box_id)
        try:
            p = box.process(handle)
            assert handle in [q["handle"] for q in box.processes()]
            p.write("three\n", close=True)
            rest = ""
            while "two" not in rest:
                out = p.output(after=cursor, wait_ms=1000)
                rest += out.text
                cursor = out.next
            assert (seen, rest) == ("one\n", "two three\n")
            ended = p.wait(timeout_ms=30_000)
            assert (ended["state"], ended["status"]["code"]) == ("exited", 5)
            assert p.output(after=0).text == "one\ntwo three\n"
            sleeper = box.start(["sleep", "300"])
            sleeper.signal("KILL")
            assert sleeper.wait(timeout_ms=30_000)["status"]["signal"] == 9
        finally:
            box.delete()


def test_two_keys_never_see_each_others_boxes(
    client: agentbox.Client, other: agentbox.Client
) -> None:
    box = client.create_box(PROVIDERS[0], max_lifetime_ms=600_000, labels={"who": "a"})
    try:
        assert [b.id for b in client.list_boxes(labels={"who": "a"})] == [box.id]
        assert other.list_boxes() == []
        for call in (
            lambda: other.get_box(box.id),
            lambda: other._send(agentbox._requests.delete(box.id)),
        ):
            with pytest.raises(agentbox.NotFound):
                call()
        assert client.get_box(box.id).id == box.id, "still there for its own key"
    finally:
        box.delete()


def test_failures_are_exceptions_carrying_the_code(client: agentbox.Client) -> None:
    with pytest.raises(agentbox.Unauthenticated) as e:
        agentbox.Client(_env("AGENTBOX_URL"), "abk_wrong").providers()
    assert e.value.status == 401
    with pytest.raises(agentbox.AgentboxError) as bad:
        client.create_box(PROVIDERS[0], max_lifetime_ms=1000, colour="red")
    assert bad.value.code == "invalid" and "colour" in bad.value.message
    with pytest.raises(ValueError):
        agentbox.Client(_env("AGENTBOX_URL"), "")
    with pytest.raises(agentbox.AgentboxError) as unreachable:
        agentbox.Client("http://127.0.0.1:9", "abk_x").providers()
    assert (unreachable.value.code, unreachable.value.status) == ("transfer_failed", 0)
    names = {p.name: p for p in client.providers()}
    for p in PROVIDERS:
        assert names[p].available, names[p].why_not
    assert {"read", "write", "edit", "bash", "grep", "find", "ls"} <= {
        t.name for t in client.tools()
    }


def test_the_async_client_does_the_same() -> None:
    async def run() -> None:
        async with agentbox.AsyncClient(_env("AGENTBOX_URL"), _env("AGENTBOX_TEST_KEY_A")) as c:
            box = await c.create_box(PROVIDERS[0], max_lifetime_ms=600_000)
            try:
                r, listed = await asyncio.gather(
                    box.exec(command="echo async"), c.list_boxes(PROVIDERS[0])
                )
                assert r.stdout == "async\n"
                assert box.id in [b.id for b in listed]
                await box.write_file("x.txt", "x")
                assert await box.read_file("x.txt") == b"x"
                p = await box.start(command="echo detached")
                ended = await p.wait(timeout_ms=30_000)
                assert ended["status"]["code"] == 0
                assert (await p.output()).text == "detached\n"
            finally:
                await box.delete()

    asyncio.run(run())

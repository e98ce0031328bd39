"""MCP through the service, judged by the official MCP SDK (`mcp`): `/mcp` gives each session a
box of its own (owned by the key, ended with the session), `/v1/boxes/{id}/mcp` runs a
session's tools in a box the key owns, and neither route serves another key's box or session.
The server and keys are the suite's (see test_client.py)."""

from __future__ import annotations

import os
from typing import Any

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

import agentbox

URL = os.environ.get("AGENTBOX_URL", "")
KEY_A = os.environ.get("AGENTBOX_TEST_KEY_A", "")
KEY_B = os.environ.get("AGENTBOX_TEST_KEY_B", "")


def _text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def _session_calls(url: str, key: str, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Open a session at `url` with `key`, list the tools, make `calls`, close the session."""
    out: list[Any] = []
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(url, http_client=http) as streams,
        ClientSession(streams[0], streams[1]) as session,
    ):
        await session.initialize()
        listed = await session.list_tools()
        out.append(sorted(t.name for t in listed.tools))
        for name, args in calls:
            out.append(await session.call_tool(name, args))
    return out


def _mine(client: agentbox.Client) -> set[str]:
    return {b.id for b in client.list_boxes()}


def test_each_mcp_session_gets_a_box_of_its_own_that_ends_with_it() -> None:
    a = agentbox.Client(URL, KEY_A)
    b = agentbox.Client(URL, KEY_B)
    before = _mine(a)
    seen: dict[str, set[str]] = {}

    async def main() -> list[Any]:
        headers = {"Authorization": f"Bearer {KEY_A}"}
        async with (
            create_mcp_http_client(headers=headers) as http,
            streamable_http_client(f"{URL}/mcp", http_client=http) as streams,
            ClientSession(streams[0], streams[1]) as session,
        ):
            await session.initialize()
            listed = await session.list_tools()
            wrote = await session.call_tool("write", {"path": "note.txt", "content": "from mcp"})
            ran = await session.call_tool("bash", {"command": "cat note.txt; echo; id -u"})
            seen["during"] = _mine(a)
            seen["other"] = _mine(b)
            return [sorted(t.name for t in listed.tools), wrote, ran]

    names, wrote, ran = anyio.run(main)
    assert {"read", "bash", "edit", "write", "grep", "find", "ls"} <= set(names)
    assert not wrote.is_error, _text(wrote)
    assert not ran.is_error and _text(ran).startswith("from mcp\n"), _text(ran)
    made = seen["during"] - before
    assert len(made) == 1, seen
    assert not made & seen["other"], "the other key does not see the session's box"
    # The session closed: its box ends with it (the server ends it a moment later).
    for _ in range(100):
        if not (_mine(a) & made):
            break
        anyio.run(anyio.sleep, 0.1)
    assert not (_mine(a) & made), "the session's box ended with the session"


def test_a_session_on_a_box_the_key_owns_and_no_other() -> None:
    a = agentbox.Client(URL, KEY_A)
    box = a.create_box(os.environ["AGENTBOX_TEST_PROVIDERS"].split(",")[0], max_lifetime_ms=600_000)
    try:
        url = f"{URL}/v1/boxes/{box.id}/mcp"
        _, ran = anyio.run(
            _session_calls, url, KEY_A, [("bash", {"command": "echo through-mcp > m.txt"})]
        )
        assert not ran.is_error, _text(ran)
        # The box outlives the session, with what the session did in it.
        assert box.read_file("m.txt") == b"through-mcp\n"
        # Another key is told the box is not there, before any session.
        r = httpx.post(
            url,
            headers={
                "Authorization": f"Bearer {KEY_B}",
                "Accept": "application/json, text/event-stream",
            },
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        )
        assert r.status_code == 404 and r.json()["code"] == "not_found", r.text
    finally:
        box.delete()


def test_a_session_is_its_keys_alone() -> None:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "judge", "version": "1"},
        },
    }
    accept = {"Accept": "application/json, text/event-stream"}
    r = httpx.post(f"{URL}/mcp", headers={"Authorization": f"Bearer {KEY_A}", **accept}, json=init)
    assert r.status_code == 200, r.text
    session = r.headers["mcp-session-id"]
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    for key, want in ((KEY_B, 404), (KEY_A, 202)):
        r = httpx.post(
            f"{URL}/mcp",
            headers={"Authorization": f"Bearer {key}", "mcp-session-id": session, **accept},
            json={"jsonrpc": "2.0", "method": "notifications/initialized"},
        )
        assert r.status_code == want, (key == KEY_A, r.status_code, r.text)
    r = httpx.post(
        f"{URL}/mcp",
        headers={"Authorization": f"Bearer {KEY_A}", "mcp-session-id": session, **accept},
        json=ping,
    )
    assert r.status_code == 200, r.text
    gone = httpx.delete(
        f"{URL}/mcp", headers={"Authorization": f"Bearer {KEY_B}", "mcp-session-id": session}
    )
    assert gone.status_code == 404
    ended = httpx.delete(
        f"{URL}/mcp", headers={"Authorization": f"Bearer {KEY_A}", "mcp-session-id": session}
    )
    assert ended.status_code == 200
    r = httpx.post(f"{URL}/mcp", headers={"Authorization": "Bearer abk_wrong", **accept}, json=init)
    assert r.status_code == 401 and r.json()["code"] == "unauthenticated"


@pytest.fixture(autouse=True)
def _needs_a_server() -> None:
    if not (URL and KEY_A and KEY_B):
        raise RuntimeError("run through `cargo test -p agentbox-cli --test python_client`")

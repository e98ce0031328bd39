"""The clients: `Client` (blocking) and `AsyncClient` (asyncio), each with its `Box`."""

from __future__ import annotations

import os
from typing import Any

import httpx

from . import _requests as r
from ._models import (
    BoxInfo,
    ExecResult,
    FileInfo,
    Output,
    ProviderInfo,
    SnapshotInfo,
    ToolInfo,
    ToolResult,
    Unpacked,
)
from ._stream import AsyncStream, Stream
from .errors import raise_for, transport_error

DEFAULT_URL = "http://127.0.0.1:8080"
"""Where `agentbox serve` listens unless told otherwise."""


def _setup(
    url: str | None, key: str | None, socket: str | None
) -> tuple[str, dict[str, str], str | None]:
    key = key if key is not None else os.environ.get("AGENTBOX_KEY")
    if not key:
        raise ValueError("no API key: pass key= or set AGENTBOX_KEY (agentbox serve keys add NAME)")
    socket = socket if socket is not None else os.environ.get("AGENTBOX_SOCKET") or None
    base = "http://agentbox" if socket else (url or os.environ.get("AGENTBOX_URL") or DEFAULT_URL)
    return base.rstrip("/"), {"authorization": f"Bearer {key}"}, socket


def _spec(max_lifetime_ms: int, spec: dict[str, Any]) -> dict[str, Any]:
    return {"max_lifetime_ms": max_lifetime_ms, **spec}


class Client:
    """A blocking client of `agentbox serve`.

    >>> with Client(key="abk_...") as c:  # doctest: +SKIP
    ...     box = c.create_box(max_lifetime_ms=600_000)
    ...     print(box.exec(command="uname -a").stdout)
    ...     box.delete()

    `url` (default `AGENTBOX_URL`, else http://127.0.0.1:8080) or `socket` (a unix socket's
    path, default `AGENTBOX_SOCKET`) says where the server is; `key` (default `AGENTBOX_KEY`)
    who is calling. Every failure raises `AgentboxError` with the service's code.
    """

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        socket: str | None = None,
        timeout: float = 600.0,
    ) -> None:
        base, headers, uds = _setup(url, key, socket)
        self._base, self._headers, self._uds = base, headers, uds
        transport = httpx.HTTPTransport(uds=uds) if uds else None
        self._http = httpx.Client(
            base_url=base, headers=headers, timeout=timeout, transport=transport, trust_env=False
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def _send(self, q: r.Req) -> httpx.Response:
        try:
            response = self._http.request(
                q.method,
                q.path,
                params=q.params,
                json=q.json,
                content=q.content,
                timeout=q.timeout if q.timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.HTTPError as e:
            raise transport_error(q, e) from e
        raise_for(response)
        return response

    def providers(self) -> list[ProviderInfo]:
        """The providers: whether the server can make their boxes, what each honours."""
        return [ProviderInfo.from_json(p) for p in self._send(r.providers()).json()]

    def tools(self) -> list[ToolInfo]:
        """The agent's tools, with their argument schemas."""
        return [ToolInfo.from_json(t) for t in self._send(r.tools()).json()]

    def create_box(
        self, provider: str | None = None, *, max_lifetime_ms: int = 3_600_000, **spec: Any
    ) -> Box:
        """Make a box; `spec` takes any field of the contract's spec (`image`, `env`,
        `labels`, `network`, `ports`...). A field the provider cannot honour is refused."""
        info = BoxInfo.from_json(
            self._send(r.create(provider, _spec(max_lifetime_ms, spec))).json()
        )
        return Box(self, info)

    def open_box(
        self,
        name: str,
        provider: str | None = None,
        *,
        max_lifetime_ms: int = 3_600_000,
        **spec: Any,
    ) -> Box:
        """The box called `name` (this key's own): made from the spec, or found and woken."""
        q = r.open_box(provider, name, _spec(max_lifetime_ms, spec))
        return Box(self, BoxInfo.from_json(self._send(q).json()))

    def get_box(self, box_id: str) -> Box:
        """The box `box_id` (`provider:name`); `NotFound` for another key's."""
        return Box(self, BoxInfo.from_json(self._send(r.get(box_id)).json()))

    def list_boxes(
        self, provider: str | None = None, labels: dict[str, str] | None = None
    ) -> list[Box]:
        """The boxes this key owns, of one provider or all, with all of `labels`."""
        return [
            Box(self, BoxInfo.from_json(b))
            for b in self._send(r.list_boxes(provider, labels)).json()
        ]

    def snapshots(self, provider: str | None = None) -> list[SnapshotInfo]:
        """This key's snapshots, of one provider or all."""
        return [SnapshotInfo.from_json(x) for x in self._send(r.snapshots(provider)).json()]

    def delete_snapshot(self, provider: str, name: str) -> None:
        """Delete one of this key's snapshots; `NotFound` when there is none."""
        self._send(r.delete_snapshot(provider, name))

    def _stream(self, path: str, after: int) -> Stream:
        return Stream.open(self._base, path, self._headers, self._uds, after)


class Box:
    """One box, reached through its client."""

    def __init__(self, client: Client, info: BoxInfo) -> None:
        self._c = client
        self.info = info

    @property
    def id(self) -> str:
        """`provider:name`."""
        return self.info.id

    def refresh(self) -> BoxInfo:
        """Ask again, with its status."""
        self.info = BoxInfo.from_json(self._c._send(r.get(self.id)).json())
        return self.info

    def delete(self) -> None:
        """End the box, with every program in it."""
        self._c._send(r.delete(self.id))

    def sleep(self) -> None:
        """Files kept, programs ended; its lifetime goes on."""
        self._c._send(r.sleep(self.id))

    def wake(self) -> BoxInfo:
        """Wake it."""
        self.info = BoxInfo.from_json(self._c._send(r.wake(self.id)).json())
        return self.info

    def extend(self, *, by_ms: int | None = None, ends_at_ms: int | None = None) -> BoxInfo:
        """Move its deadline: `by_ms` from where it is, or to `ends_at_ms`."""
        self.info = BoxInfo.from_json(self._c._send(r.extend(self.id, by_ms, ends_at_ms)).json())
        return self.info

    def exec(
        self,
        argv: list[str] | None = None,
        *,
        command: str | None = None,
        stdin: str | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout_ms: int | None = None,
        max_output: int | None = None,
    ) -> ExecResult:
        """Run a program to its end (an argv, or a `command` for `sh -c`)."""
        q = r.exec_(self.id, argv, command, stdin, env, cwd, timeout_ms, max_output)
        return ExecResult.from_json(self._c._send(q).json())

    def read_file(self, path: str) -> bytes:
        """A file's bytes."""
        return self._c._send(r.read_file(self.id, path)).content

    def write_file(self, path: str, data: bytes | str) -> None:
        """Write a file whole, its parents made."""
        self._c._send(r.write_file(self.id, path, data))

    def stat(self, path: str) -> FileInfo:
        """What a path is."""
        return FileInfo.from_json(self._c._send(r.stat(self.id, path)).json())

    def list_dir(self, path: str) -> list[FileInfo]:
        """A directory's entries."""
        return [FileInfo.from_json(f) for f in self._c._send(r.list_dir(self.id, path)).json()]

    def mkdir(self, path: str, recursive: bool = False) -> None:
        """Make a directory (and its parents, with `recursive`)."""
        self._c._send(r.mkdir(self.id, path, recursive))

    def rename(self, src: str, dst: str) -> None:
        """Rename a path."""
        self._c._send(r.rename(self.id, src, dst))

    def remove(self, path: str, recursive: bool = False) -> None:
        """Remove a file, a link, or a directory (with its entries, with `recursive`)."""
        self._c._send(r.remove(self.id, path, recursive))

    def tool(self, name: str, **args: Any) -> ToolResult:
        """Call one of the agent's tools (`bash`, `read`, `edit`...) on the box."""
        return ToolResult.from_json(self._c._send(r.tool(self.id, name, args)).json())

    def start(
        self,
        argv: list[str] | None = None,
        *,
        command: str | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout_ms: int | None = None,
        tty: tuple[int, int] | None = None,
    ) -> Process:
        """Start a program detached: it outlives this call (and this client); with `tty`
        (rows, columns), in a terminal."""
        q = r.start(self.id, argv, command, env, cwd, timeout_ms, tty)
        return Process(self, int(self._c._send(q).json()["handle"]))

    def process(self, handle: int) -> Process:
        """The process `handle` of this box, reached again (by this client or another)."""
        return Process(self, handle)

    def processes(self) -> list[dict[str, Any]]:
        """The box's processes, running and ended."""
        answer: list[dict[str, Any]] = self._c._send(r.processes(self.id)).json()
        return answer

    def terminal(
        self,
        rows: int = 24,
        cols: int = 80,
        *,
        command: str | None = None,
        cwd: str | None = None,
    ) -> Stream:
        """A program in a terminal (a login shell unless `command`), started detached and
        streamed: its first event is `started`, whose handle reattaches to it."""
        return self._c._stream(r.terminal_path(self.id, rows, cols, command, cwd), 0)

    def snapshot(self, name: str) -> SnapshotInfo:
        """Keep the box's files under `name` (this key's own name)."""
        return SnapshotInfo.from_json(self._c._send(r.snapshot(self.id, name)).json())

    def fork(self, n: int = 1, *, max_lifetime_ms: int = 3_600_000, **spec: Any) -> list[Box]:
        """`n` new boxes holding this box's files as they are now, owned by this key."""
        made = self._c._send(r.fork(self.id, n, _spec(max_lifetime_ms, spec))).json()
        return [Box(self._c, BoxInfo.from_json(b)) for b in made]

    def upload_tar(self, path: str, tar: bytes) -> Unpacked:
        """Unpack a tar into the directory `path` (made if missing). The server unpacks it
        with agentbox's safe extractor first: links, devices and paths that climb are left
        out (and listed); a malformed tar leaves the box as it was."""
        return Unpacked.from_json(self._c._send(r.put_archive(self.id, path, tar)).json())

    def download_tar(self, path: str) -> bytes:
        """The directory `path`'s contents as a tar (links in the box left out)."""
        return self._c._send(r.get_archive(self.id, path)).content


class Process:
    """A detached process of a box, by its handle."""

    def __init__(self, box: Box, handle: int) -> None:
        self.box = box
        self.handle = handle

    def output(self, after: int = 0, wait_ms: int = 0, max_bytes: int | None = None) -> Output:
        """Its output from byte `after` on, waiting up to `wait_ms` for some to come."""
        q = r.output(self.box.id, self.handle, after, wait_ms, max_bytes)
        return Output.from_json(self.box._c._send(q).json())

    def write(self, data: str, close: bool = False) -> None:
        """Write to its stdin (and end it, with `close`)."""
        self.box._c._send(r.stdin(self.box.id, self.handle, data, close))

    def signal(self, sig: int | str = "TERM") -> None:
        """Signal its group: a number or a name (`TERM`, `KILL`, `INT`...)."""
        self.box._c._send(r.signal(self.box.id, self.handle, sig))

    def wait(self, timeout_ms: int = 60_000) -> dict[str, Any]:
        """How it ended (`{"state": "exited", "status": {"code": ...}}`); `timeout` past it."""
        answer: dict[str, Any] = self.box._c._send(
            r.wait(self.box.id, self.handle, timeout_ms)
        ).json()
        return answer

    def forget(self) -> None:
        """Let the box forget it (once it ended)."""
        self.box._c._send(r.forget(self.box.id, self.handle))

    def stream(self, after: int = 0) -> Stream:
        """Its output live from byte `after` on, over a WebSocket that also takes its stdin,
        terminal size and signals. Reopen from the stream's `next` after a drop."""
        return self.box._c._stream(r.stream_path(self.box.id, self.handle, after), after)

    def resize(self, rows: int, cols: int) -> None:
        """Set the size of its terminal."""
        self.box._c._send(r.resize(self.box.id, self.handle, rows, cols))


class AsyncClient:
    """The asyncio twin of `Client`: the same calls, awaited."""

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        socket: str | None = None,
        timeout: float = 600.0,
    ) -> None:
        base, headers, uds = _setup(url, key, socket)
        self._base, self._headers, self._uds = base, headers, uds
        transport = httpx.AsyncHTTPTransport(uds=uds) if uds else None
        self._http = httpx.AsyncClient(
            base_url=base, headers=headers, timeout=timeout, transport=transport, trust_env=False
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def _send(self, q: r.Req) -> httpx.Response:
        try:
            response = await self._http.request(
                q.method,
                q.path,
                params=q.params,
                json=q.json,
                content=q.content,
                timeout=q.timeout if q.timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.HTTPError as e:
            raise transport_error(q, e) from e
        raise_for(response)
        return response

    async def providers(self) -> list[ProviderInfo]:
        """See `Client.providers`."""
        return [ProviderInfo.from_json(p) for p in (await self._send(r.providers())).json()]

    async def tools(self) -> list[ToolInfo]:
        """See `Client.tools`."""
        return [ToolInfo.from_json(t) for t in (await self._send(r.tools())).json()]

    async def create_box(
        self, provider: str | None = None, *, max_lifetime_ms: int = 3_600_000, **spec: Any
    ) -> AsyncBox:
        """See `Client.create_box`."""
        answer = await self._send(r.create(provider, _spec(max_lifetime_ms, spec)))
        return AsyncBox(self, BoxInfo.from_json(answer.json()))

    async def open_box(
        self,
        name: str,
        provider: str | None = None,
        *,
        max_lifetime_ms: int = 3_600_000,
        **spec: Any,
    ) -> AsyncBox:
        """See `Client.open_box`."""
        q = r.open_box(provider, name, _spec(max_lifetime_ms, spec))
        return AsyncBox(self, BoxInfo.from_json((await self._send(q)).json()))

    async def get_box(self, box_id: str) -> AsyncBox:
        """See `Client.get_box`."""
        return AsyncBox(self, BoxInfo.from_json((await self._send(r.get(box_id))).json()))

    async def list_boxes(
        self, provider: str | None = None, labels: dict[str, str] | None = None
    ) -> list[AsyncBox]:
        """See `Client.list_boxes`."""
        answer = await self._send(r.list_boxes(provider, labels))
        return [AsyncBox(self, BoxInfo.from_json(b)) for b in answer.json()]

    async def snapshots(self, provider: str | None = None) -> list[SnapshotInfo]:
        """See `Client.snapshots`."""
        answer = await self._send(r.snapshots(provider))
        return [SnapshotInfo.from_json(x) for x in answer.json()]

    async def delete_snapshot(self, provider: str, name: str) -> None:
        """See `Client.delete_snapshot`."""
        await self._send(r.delete_snapshot(provider, name))

    async def _stream(self, path: str, after: int) -> AsyncStream:
        return await AsyncStream.open(self._base, path, self._headers, self._uds, after)


class AsyncBox:
    """The asyncio twin of `Box`."""

    def __init__(self, client: AsyncClient, info: BoxInfo) -> None:
        self._c = client
        self.info = info

    @property
    def id(self) -> str:
        """`provider:name`."""
        return self.info.id

    async def refresh(self) -> BoxInfo:
        """See `Box.refresh`."""
        self.info = BoxInfo.from_json((await self._c._send(r.get(self.id))).json())
        return self.info

    async def delete(self) -> None:
        """See `Box.delete`."""
        await self._c._send(r.delete(self.id))

    async def sleep(self) -> None:
        """See `Box.sleep`."""
        await self._c._send(r.sleep(self.id))

    async def wake(self) -> BoxInfo:
        """See `Box.wake`."""
        self.info = BoxInfo.from_json((await self._c._send(r.wake(self.id))).json())
        return self.info

    async def extend(self, *, by_ms: int | None = None, ends_at_ms: int | None = None) -> BoxInfo:
        """See `Box.extend`."""
        answer = await self._c._send(r.extend(self.id, by_ms, ends_at_ms))
        self.info = BoxInfo.from_json(answer.json())
        return self.info

    async def exec(
        self,
        argv: list[str] | None = None,
        *,
        command: str | None = None,
        stdin: str | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout_ms: int | None = None,
        max_output: int | None = None,
    ) -> ExecResult:
        """See `Box.exec`."""
        q = r.exec_(self.id, argv, command, stdin, env, cwd, timeout_ms, max_output)
        return ExecResult.from_json((await self._c._send(q)).json())

    async def read_file(self, path: str) -> bytes:
        """See `Box.read_file`."""
        return (await self._c._send(r.read_file(self.id, path))).content

    async def write_file(self, path: str, data: bytes | str) -> None:
        """See `Box.write_file`."""
        await self._c._send(r.write_file(self.id, path, data))

    async def stat(self, path: str) -> FileInfo:
        """See `Box.stat`."""
        return FileInfo.from_json((await self._c._send(r.stat(self.id, path))).json())

    async def list_dir(self, path: str) -> list[FileInfo]:
        """See `Box.list_dir`."""
        answer = await self._c._send(r.list_dir(self.id, path))
        return [FileInfo.from_json(f) for f in answer.json()]

    async def mkdir(self, path: str, recursive: bool = False) -> None:
        """See `Box.mkdir`."""
        await self._c._send(r.mkdir(self.id, path, recursive))

    async def rename(self, src: str, dst: str) -> None:
        """See `Box.rename`."""
        await self._c._send(r.rename(self.id, src, dst))

    async def remove(self, path: str, recursive: bool = False) -> None:
        """See `Box.remove`."""
        await self._c._send(r.remove(self.id, path, recursive))

    async def tool(self, name: str, **args: Any) -> ToolResult:
        """See `Box.tool`."""
        return ToolResult.from_json((await self._c._send(r.tool(self.id, name, args))).json())

    async def start(
        self,
        argv: list[str] | None = None,
        *,
        command: str | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout_ms: int | None = None,
        tty: tuple[int, int] | None = None,
    ) -> AsyncProcess:
        """See `Box.start`."""
        q = r.start(self.id, argv, command, env, cwd, timeout_ms, tty)
        return AsyncProcess(self, int((await self._c._send(q)).json()["handle"]))

    def process(self, handle: int) -> AsyncProcess:
        """See `Box.process`."""
        return AsyncProcess(self, handle)

    async def processes(self) -> list[dict[str, Any]]:
        """See `Box.processes`."""
        answer: list[dict[str, Any]] = (await self._c._send(r.processes(self.id))).json()
        return answer

    async def terminal(
        self,
        rows: int = 24,
        cols: int = 80,
        *,
        command: str | None = None,
        cwd: str | None = None,
    ) -> AsyncStream:
        """See `Box.terminal`."""
        return await self._c._stream(r.terminal_path(self.id, rows, cols, command, cwd), 0)

    async def snapshot(self, name: str) -> SnapshotInfo:
        """See `Box.snapshot`."""
        return SnapshotInfo.from_json((await self._c._send(r.snapshot(self.id, name))).json())

    async def fork(
        self, n: int = 1, *, max_lifetime_ms: int = 3_600_000, **spec: Any
    ) -> list[AsyncBox]:
        """See `Box.fork`."""
        made = await self._c._send(r.fork(self.id, n, _spec(max_lifetime_ms, spec)))
        return [AsyncBox(self._c, BoxInfo.from_json(b)) for b in made.json()]

    async def upload_tar(self, path: str, tar: bytes) -> Unpacked:
        """See `Box.upload_tar`."""
        return Unpacked.from_json((await self._c._send(r.put_archive(self.id, path, tar))).json())

    async def download_tar(self, path: str) -> bytes:
        """See `Box.download_tar`."""
        return (await self._c._send(r.get_archive(self.id, path))).content


class AsyncProcess:
    """The asyncio twin of `Process`."""

    def __init__(self, box: AsyncBox, handle: int) -> None:
        self.box = box
        self.handle = handle

    async def output(
        self, after: int = 0, wait_ms: int = 0, max_bytes: int | None = None
    ) -> Output:
        """See `Process.output`."""
        q = r.output(self.box.id, self.handle, after, wait_ms, max_bytes)
        return Output.from_json((await self.box._c._send(q)).json())

    async def write(self, data: str, close: bool = False) -> None:
        """See `Process.write`."""
        await self.box._c._send(r.stdin(self.box.id, self.handle, data, close))

    async def signal(self, sig: int | str = "TERM") -> None:
        """See `Process.signal`."""
        await self.box._c._send(r.signal(self.box.id, self.handle, sig))

    async def wait(self, timeout_ms: int = 60_000) -> dict[str, Any]:
        """See `Process.wait`."""
        q = r.wait(self.box.id, self.handle, timeout_ms)
        answer: dict[str, Any] = (await self.box._c._send(q)).json()
        return answer

    async def forget(self) -> None:
        """See `Process.forget`."""
        await self.box._c._send(r.forget(self.box.id, self.handle))

    async def stream(self, after: int = 0) -> AsyncStream:
        """See `Process.stream`."""
        return await self.box._c._stream(r.stream_path(self.box.id, self.handle, after), after)

    async def resize(self, rows: int, cols: int) -> None:
        """See `Process.resize`."""
        await self.box._c._send(r.resize(self.box.id, self.handle, rows, cols))

"""Live streams over WebSockets: a process's output as it comes, from a byte cursor, with its
stdin, terminal size and signals on the same socket. A stream that drops is opened again from
its `next` cursor and loses nothing the box still keeps (a `gap` event says what it lost)."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection as AsyncConnection
from websockets.asyncio.client import connect as async_connect
from websockets.asyncio.client import unix_connect as async_unix_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as sync_connect
from websockets.sync.client import unix_connect as sync_unix_connect

from ._models import StreamEvent
from .errors import raise_for

MAX_MESSAGE = 4 << 20
"""The largest message read: an output message is at most 256 KiB of bytes, base64'd."""


def ws_url(base: str, path: str) -> str:
    """The WebSocket URL of `path` on the server at `base`."""
    if base.startswith("https://"):
        return "wss://" + base[len("https://") :] + path
    return "ws://" + base.removeprefix("http://") + path


def _refused(e: InvalidStatus) -> None:
    """Raise the service's error for an upgrade it refused."""
    r = e.response
    raise_for(
        httpx.Response(
            r.status_code, content=bytes(r.body or b""), headers=list(r.headers.raw_items())
        )
    )


def _stdin(data: str | bytes, close: bool) -> str:
    if isinstance(data, bytes):
        body: dict[str, Any] = {"type": "stdin", "data_base64": base64.b64encode(data).decode()}
    else:
        body = {"type": "stdin", "data": data}
    body["close"] = close
    return json.dumps(body)


class _Cursor:
    """What a stream has seen: where the next read starts, how it ended, its handle."""

    def __init__(self, after: int) -> None:
        self.next = after
        self.exit: dict[str, Any] | None = None
        self.handle: int | None = None

    def saw(self, raw: str | bytes) -> StreamEvent:
        ev = StreamEvent.from_json(json.loads(raw))
        if ev.type == "output":
            self.next = ev.seq + len(ev.data)
        elif ev.type == "gap":
            self.next = ev.seq
        elif ev.type == "exit":
            self.next, self.exit = ev.seq, ev.exit
        elif ev.type == "started":
            self.handle = ev.handle
        return ev


class Stream(_Cursor):
    """A live stream (blocking). Iterate it for `StreamEvent`s until the program ends or the
    socket drops; `next` is then the cursor to reopen it from."""

    def __init__(self, ws: ClientConnection, after: int) -> None:
        super().__init__(after)
        self._ws = ws

    @classmethod
    def open(
        cls, base: str, path: str, headers: dict[str, str], uds: str | None, after: int
    ) -> Stream:
        url = ws_url(base, path)
        try:
            # Entered as the context manager it is (websockets 17 deprecates using it bare);
            # `close` leaves it.
            if uds:
                ws = sync_unix_connect(
                    uds, url, additional_headers=headers, max_size=MAX_MESSAGE
                ).__enter__()
            else:
                ws = sync_connect(url, additional_headers=headers, max_size=MAX_MESSAGE).__enter__()
        except InvalidStatus as e:
            _refused(e)
            raise
        return cls(ws, after)

    def __iter__(self) -> Iterator[StreamEvent]:
        while True:
            try:
                raw = self._ws.recv()
            except ConnectionClosed:
                return
            yield self.saw(raw)

    def write(self, data: str | bytes, close: bool = False) -> None:
        """Write to the program's stdin (and end it, with `close`)."""
        self._ws.send(_stdin(data, close))

    def resize(self, rows: int, cols: int) -> None:
        """Set its terminal's size."""
        self._ws.send(json.dumps({"type": "resize", "rows": rows, "cols": cols}))

    def signal(self, sig: int | str) -> None:
        """Signal its group."""
        self._ws.send(json.dumps({"type": "signal", "signal": sig}))

    def close(self) -> None:
        """Close the socket (the program runs on)."""
        self._ws.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncStream(_Cursor):
    """The asyncio twin of `Stream`: iterate it with `async for`."""

    def __init__(self, ws: AsyncConnection, after: int) -> None:
        super().__init__(after)
        self._ws = ws

    @classmethod
    async def open(
        cls, base: str, path: str, headers: dict[str, str], uds: str | None, after: int
    ) -> AsyncStream:
        url = ws_url(base, path)
        try:
            if uds:
                ws = await async_unix_connect(
                    uds, url, additional_headers=headers, max_size=MAX_MESSAGE
                )
            else:
                ws = await async_connect(url, additional_headers=headers, max_size=MAX_MESSAGE)
        except InvalidStatus as e:
            _refused(e)
            raise
        return cls(ws, after)

    async def __aiter__(self) -> AsyncIterator[StreamEvent]:
        while True:
            try:
                raw = await self._ws.recv()
            except ConnectionClosed:
                return
            yield self.saw(raw)

    async def write(self, data: str | bytes, close: bool = False) -> None:
        """See `Stream.write`."""
        await self._ws.send(_stdin(data, close))

    async def resize(self, rows: int, cols: int) -> None:
        """See `Stream.resize`."""
        await self._ws.send(json.dumps({"type": "resize", "rows": rows, "cols": cols}))

    async def signal(self, sig: int | str) -> None:
        """See `Stream.signal`."""
        await self._ws.send(json.dumps({"type": "signal", "signal": sig}))

    async def aclose(self) -> None:
        """See `Stream.close`."""
        await self._ws.close()

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

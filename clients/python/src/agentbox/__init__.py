"""A client of `agentbox serve`: sandboxes for AI agents over every provider agentbox has.

>>> import agentbox  # doctest: +SKIP
>>> with agentbox.Client(key="abk_...") as c:  # doctest: +SKIP
...     box = c.create_box("namespace", max_lifetime_ms=600_000)
...     box.write_file("hello.py", "print('hi')\\n")
...     print(box.exec(["python3", "hello.py"]).stdout)
...     box.delete()
"""

from ._client import DEFAULT_URL, AsyncBox, AsyncClient, AsyncProcess, Box, Client, Process
from ._models import (
    BoxInfo,
    Chunk,
    ExecResult,
    FileInfo,
    Output,
    ProviderInfo,
    SnapshotInfo,
    StreamEvent,
    ToolInfo,
    ToolResult,
    Unpacked,
)
from ._stream import AsyncStream, Stream
from .errors import AgentboxError, NotFound, RateLimited, Unauthenticated

__all__ = [
    "DEFAULT_URL",
    "AgentboxError",
    "AsyncBox",
    "AsyncClient",
    "AsyncProcess",
    "AsyncStream",
    "Box",
    "BoxInfo",
    "Chunk",
    "Client",
    "ExecResult",
    "FileInfo",
    "NotFound",
    "Output",
    "Process",
    "ProviderInfo",
    "RateLimited",
    "SnapshotInfo",
    "Stream",
    "StreamEvent",
    "ToolInfo",
    "ToolResult",
    "Unauthenticated",
    "Unpacked",
]

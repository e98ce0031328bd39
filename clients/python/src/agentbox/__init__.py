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
    ToolInfo,
    ToolResult,
)
from .errors import AgentboxError, NotFound, RateLimited, Unauthenticated

__all__ = [
    "DEFAULT_URL",
    "AgentboxError",
    "AsyncBox",
    "AsyncClient",
    "AsyncProcess",
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
    "ToolInfo",
    "ToolResult",
    "Unauthenticated",
]

"""A client of `agentbox serve`: sandboxes for AI agents over every provider agentbox has.

>>> import agentbox  # doctest: +SKIP
>>> with agentbox.Client(key="abk_...") as c:  # doctest: +SKIP
...     box = c.create_box("namespace", max_lifetime_ms=600_000)
...     box.write_file("hello.py", "print('hi')\\n")
...     print(box.exec(["python3", "hello.py"]).stdout)
...     box.delete()
"""

from ._client import DEFAULT_URL, AsyncBox, AsyncClient, Box, Client
from ._models import BoxInfo, ExecResult, FileInfo, ProviderInfo, ToolInfo, ToolResult
from .errors import AgentboxError, NotFound, RateLimited, Unauthenticated

__all__ = [
    "DEFAULT_URL",
    "AgentboxError",
    "AsyncBox",
    "AsyncClient",
    "Box",
    "BoxInfo",
    "Client",
    "ExecResult",
    "FileInfo",
    "NotFound",
    "ProviderInfo",
    "RateLimited",
    "ToolInfo",
    "ToolResult",
    "Unauthenticated",
]

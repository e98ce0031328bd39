"""The values the service answers, as typed records (the OpenAPI document's schemas)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{what}: the service answered {type(value).__name__}, not an object")
    return value


@dataclass(frozen=True)
class ProviderInfo:
    """One provider, as the server serves it."""

    name: str
    description: str
    compiled: bool
    available: bool
    default: bool
    why_not: str | None = None
    honours: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, v: Any) -> ProviderInfo:
        o = _obj(v, "provider")
        return cls(
            name=o["name"],
            description=o["description"],
            compiled=o["compiled"],
            available=o["available"],
            default=o["default"],
            why_not=o.get("why_not"),
            honours=o.get("honours"),
        )


@dataclass(frozen=True)
class BoxInfo:
    """A box: its id (`provider:name`), labels and facts; `status` where it was asked."""

    id: str
    provider: str
    labels: dict[str, str]
    facts: dict[str, Any]
    status: str | None = None

    @classmethod
    def from_json(cls, v: Any) -> BoxInfo:
        o = _obj(v, "box")
        return cls(
            id=o["id"],
            provider=o["provider"],
            labels=dict(o.get("labels") or {}),
            facts=dict(o.get("facts") or {}),
            status=o.get("status"),
        )


@dataclass(frozen=True)
class ExecResult:
    """How a program ended and what it printed, each stream up to the bound asked."""

    exit_code: int
    stdout: str
    stderr: str
    stdout_dropped: int = 0
    stderr_dropped: int = 0
    signal: int | None = None

    @classmethod
    def from_json(cls, v: Any) -> ExecResult:
        o = _obj(v, "exec result")
        return cls(
            exit_code=o["exit_code"],
            stdout=o["stdout"],
            stderr=o["stderr"],
            stdout_dropped=o.get("stdout_dropped", 0),
            stderr_dropped=o.get("stderr_dropped", 0),
            signal=o.get("signal"),
        )


@dataclass(frozen=True)
class FileInfo:
    """One path, as lstat sees it (a link is not followed)."""

    name: str
    path: str
    kind: str
    size: int
    mtime_ms: int

    @classmethod
    def from_json(cls, v: Any) -> FileInfo:
        o = _obj(v, "file info")
        return cls(
            name=o["name"],
            path=o["path"],
            kind=o["kind"],
            size=o["size"],
            mtime_ms=o["mtime_ms"],
        )


@dataclass(frozen=True)
class ToolInfo:
    """One of the agent's tools, as a model is told of it."""

    name: str
    description: str
    parameters: dict[str, Any]
    read_only: bool

    @classmethod
    def from_json(cls, v: Any) -> ToolInfo:
        o = _obj(v, "tool")
        return cls(
            name=o["name"],
            description=o["description"],
            parameters=dict(o["parameters"]),
            read_only=o["read_only"],
        )


@dataclass(frozen=True)
class ToolResult:
    """What a tool call gave the model: its content parts, details, and whether it failed."""

    content: list[dict[str, Any]]
    is_error: bool
    details: Any = None
    text: str = field(default="")

    @classmethod
    def from_json(cls, v: Any) -> ToolResult:
        o = _obj(v, "tool result")
        content = list(o.get("content") or [])
        text = "".join(c.get("text", "") for c in content if c.get("type") == "text")
        return cls(content=content, is_error=o["isError"], details=o.get("details"), text=text)


@dataclass(frozen=True)
class Chunk:
    """Bytes of one stream of a process's output, from byte `seq` on."""

    seq: int
    stream: str
    data: bytes

    @property
    def text(self) -> str:
        """The bytes as text, invalid UTF-8 replaced."""
        return self.data.decode(errors="replace")


@dataclass(frozen=True)
class Output:
    """One read of a process's output: its chunks, the cursor of the next read (`next`), the
    byte the output goes on from when bytes were lost (`gap_from`), and how it ended once it
    ended and all was read (`exit`)."""

    chunks: list[Chunk]
    next: int
    gap_from: int | None = None
    exit: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        """Every chunk's text, in order."""
        return "".join(c.text for c in self.chunks)

    @classmethod
    def from_json(cls, v: Any) -> Output:
        import base64

        o = _obj(v, "output")
        chunks = [
            Chunk(seq=c["seq"], stream=c["stream"], data=base64.b64decode(c["data"]))
            for c in o.get("chunks") or []
        ]
        return cls(chunks=chunks, next=o["next"], gap_from=o.get("gap_from"), exit=o.get("exit"))


@dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot, named as its key named it."""

    name: str
    provider: str
    source: str | None = None
    created_at_ms: int | None = None
    bytes: int | None = None
    memory: bool = False

    @classmethod
    def from_json(cls, v: Any) -> SnapshotInfo:
        o = _obj(v, "snapshot")
        return cls(
            name=o["name"],
            provider=o["provider"],
            source=o.get("from"),
            created_at_ms=o.get("created_at_ms"),
            bytes=o.get("bytes"),
            memory=bool(o.get("memory", False)),
        )


@dataclass(frozen=True)
class Unpacked:
    """What a tar sent into a box did: entries unpacked, sent in, and left out by reason."""

    written: int
    sent: int
    skipped: dict[str, int]
    skips: list[dict[str, Any]]

    @classmethod
    def from_json(cls, v: Any) -> Unpacked:
        o = _obj(v, "unpacked archive")
        return cls(
            written=o["written"],
            sent=o["sent"],
            skipped=dict(o.get("skipped") or {}),
            skips=list(o.get("skips") or []),
        )


@dataclass(frozen=True)
class StreamEvent:
    """One message of a live stream: `output` (`seq`, `stream`, `data`), `gap` (`gap_from` to
    `seq`, bytes no longer kept), `exit` (`exit`, and `seq` the cursor past the end),
    `started` (`handle`, a terminal's process) or `error` (`code`, `message`)."""

    type: str
    seq: int = 0
    stream: str = ""
    data: bytes = b""
    gap_from: int | None = None
    exit: dict[str, Any] | None = None
    handle: int | None = None
    code: str | None = None
    message: str | None = None

    @property
    def text(self) -> str:
        """An output's bytes as text, invalid UTF-8 replaced."""
        return self.data.decode(errors="replace")

    @classmethod
    def from_json(cls, v: Any) -> StreamEvent:
        import base64

        o = _obj(v, "stream message")
        kind = str(o.get("type"))
        if kind == "output":
            return cls(kind, seq=o["seq"], stream=o["stream"], data=base64.b64decode(o["data"]))
        if kind == "gap":
            return cls(kind, seq=o["to"], gap_from=o["from"])
        if kind == "exit":
            return cls(kind, seq=o["next"], exit=o["exit"])
        if kind == "started":
            return cls(kind, handle=o["handle"])
        return cls(kind, code=o.get("code"), message=o.get("message"))

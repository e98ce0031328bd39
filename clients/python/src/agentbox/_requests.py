"""Each call of the API as a request description, shared by the sync and async clients, so the
two differ only in how they send."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote


@dataclass(frozen=True)
class Req:
    """One request: method, path, query, and a JSON or a bytes body."""

    method: str
    path: str
    params: dict[str, str] | None = None
    json: Any = None
    content: bytes | None = None
    # Seconds this request may take, where the call itself may take long (an exec, a wait).
    timeout: float | None = None


MARGIN = 60.0
"""Seconds a long call's request may take past the time the call itself was given."""


def box_path(box_id: str) -> str:
    return f"/v1/boxes/{quote(box_id, safe=':')}"


def providers() -> Req:
    return Req("GET", "/v1/providers")


def tools() -> Req:
    return Req("GET", "/v1/tools")


def create(provider: str | None, spec: dict[str, Any]) -> Req:
    body: dict[str, Any] = {"spec": spec}
    if provider is not None:
        body["provider"] = provider
    return Req("POST", "/v1/boxes", json=body)


def open_box(provider: str | None, name: str, spec: dict[str, Any]) -> Req:
    body: dict[str, Any] = {"name": name, "spec": spec}
    if provider is not None:
        body["provider"] = provider
    return Req("POST", "/v1/boxes/open", json=body)


def sleep(box_id: str) -> Req:
    return Req("POST", box_path(box_id) + "/sleep")


def wake(box_id: str) -> Req:
    return Req("POST", box_path(box_id) + "/wake")


def extend(box_id: str, by_ms: int | None, ends_at_ms: int | None) -> Req:
    if (by_ms is None) == (ends_at_ms is None):
        raise ValueError("extend: give by_ms or ends_at_ms, one of them")
    body = {"by_ms": by_ms} if by_ms is not None else {"ends_at_ms": ends_at_ms}
    return Req("POST", box_path(box_id) + "/extend", json=body)


def list_boxes(provider: str | None, labels: dict[str, str] | None) -> Req:
    params: dict[str, str] = {}
    if provider is not None:
        params["provider"] = provider
    if labels:
        for k, v in labels.items():
            if "," in k + v or "=" in k:
                raise ValueError(f"labels: {k}={v} cannot be asked for (',' or '=' in it)")
        params["labels"] = ",".join(f"{k}={v}" for k, v in labels.items())
    return Req("GET", "/v1/boxes", params=params or None)


def get(box_id: str) -> Req:
    return Req("GET", box_path(box_id))


def delete(box_id: str) -> Req:
    return Req("DELETE", box_path(box_id))


def exec_(
    box_id: str,
    argv: list[str] | None,
    command: str | None,
    stdin: str | None,
    env: dict[str, str] | None,
    cwd: str | None,
    timeout_ms: int | None,
    max_output: int | None,
) -> Req:
    if (argv is None) == (command is None):
        raise ValueError("exec: give argv or command, one of them")
    body: dict[str, Any] = {}
    for k, v in [
        ("argv", argv),
        ("command", command),
        ("stdin", stdin),
        ("env", env),
        ("cwd", cwd),
        ("timeout_ms", timeout_ms),
        ("max_output", max_output),
    ]:
        if v is not None:
            body[k] = v
    seconds = (timeout_ms if timeout_ms is not None else 600_000) / 1000
    return Req("POST", box_path(box_id) + "/exec", json=body, timeout=seconds + MARGIN)


def read_file(box_id: str, path: str) -> Req:
    return Req("GET", box_path(box_id) + "/files", params={"path": path})


def write_file(box_id: str, path: str, data: bytes | str) -> Req:
    content = data.encode() if isinstance(data, str) else bytes(data)
    return Req("PUT", box_path(box_id) + "/files", params={"path": path}, content=content)


def remove(box_id: str, path: str, recursive: bool) -> Req:
    params = {"path": path, "recursive": "true" if recursive else "false"}
    return Req("DELETE", box_path(box_id) + "/files", params=params)


def stat(box_id: str, path: str) -> Req:
    return Req("GET", box_path(box_id) + "/files/stat", params={"path": path})


def list_dir(box_id: str, path: str) -> Req:
    return Req("GET", box_path(box_id) + "/files/list", params={"path": path})


def mkdir(box_id: str, path: str, recursive: bool) -> Req:
    return Req(
        "POST", box_path(box_id) + "/files/mkdir", json={"path": path, "recursive": recursive}
    )


def rename(box_id: str, src: str, dst: str) -> Req:
    return Req("POST", box_path(box_id) + "/files/rename", json={"from": src, "to": dst})


def tool(box_id: str, name: str, args: dict[str, Any]) -> Req:
    return Req("POST", box_path(box_id) + f"/tools/{quote(name, safe='')}", json=args)


def start(
    box_id: str,
    argv: list[str] | None,
    command: str | None,
    env: dict[str, str] | None,
    cwd: str | None,
    timeout_ms: int | None,
    tty: tuple[int, int] | None = None,
) -> Req:
    if (argv is None) == (command is None):
        raise ValueError("start: give argv or command, one of them")
    body: dict[str, Any] = {}
    for k, v in [
        ("argv", argv),
        ("command", command),
        ("env", env),
        ("cwd", cwd),
        ("timeout_ms", timeout_ms),
        ("tty", {"rows": tty[0], "cols": tty[1]} if tty else None),
    ]:
        if v is not None:
            body[k] = v
    return Req("POST", box_path(box_id) + "/processes", json=body)


def processes(box_id: str) -> Req:
    return Req("GET", box_path(box_id) + "/processes")


def _proc(box_id: str, handle: int) -> str:
    return box_path(box_id) + f"/processes/{int(handle)}"


def output(box_id: str, handle: int, after: int, wait_ms: int, max_bytes: int | None) -> Req:
    params = {"after": str(after), "wait_ms": str(wait_ms)}
    if max_bytes is not None:
        params["max_bytes"] = str(max_bytes)
    return Req(
        "GET", _proc(box_id, handle) + "/output", params=params, timeout=wait_ms / 1000 + MARGIN
    )


def stdin(box_id: str, handle: int, data: str, close: bool) -> Req:
    return Req("POST", _proc(box_id, handle) + "/stdin", json={"data": data, "close": close})


def signal(box_id: str, handle: int, sig: int | str) -> Req:
    return Req("POST", _proc(box_id, handle) + "/signal", json={"signal": sig})


def wait(box_id: str, handle: int, timeout_ms: int) -> Req:
    return Req(
        "POST",
        _proc(box_id, handle) + "/wait",
        json={"timeout_ms": timeout_ms},
        timeout=timeout_ms / 1000 + MARGIN,
    )


def forget(box_id: str, handle: int) -> Req:
    return Req("DELETE", _proc(box_id, handle))


def resize(box_id: str, handle: int, rows: int, cols: int) -> Req:
    return Req("POST", _proc(box_id, handle) + "/resize", json={"rows": rows, "cols": cols})


def snapshot(box_id: str, name: str) -> Req:
    return Req("POST", box_path(box_id) + "/snapshots", json={"name": name})


def snapshots(provider: str | None) -> Req:
    return Req("GET", "/v1/snapshots", params={"provider": provider} if provider else None)


def delete_snapshot(provider: str, name: str) -> Req:
    return Req("DELETE", f"/v1/snapshots/{quote(provider, safe='')}/{quote(name, safe='')}")


def fork(box_id: str, n: int, spec: dict[str, Any]) -> Req:
    return Req("POST", box_path(box_id) + "/fork", json={"n": n, "spec": spec})


def put_archive(box_id: str, path: str, tar: bytes) -> Req:
    return Req("PUT", box_path(box_id) + "/archive", params={"path": path}, content=bytes(tar))


def get_archive(box_id: str, path: str) -> Req:
    return Req("GET", box_path(box_id) + "/archive", params={"path": path})


def stream_path(box_id: str, handle: int, after: int) -> str:
    return _proc(box_id, handle) + f"/stream?after={int(after)}"


def terminal_path(box_id: str, rows: int, cols: int, command: str | None, cwd: str | None) -> str:
    from urllib.parse import urlencode

    params: dict[str, str] = {"rows": str(rows), "cols": str(cols)}
    if command is not None:
        params["command"] = command
    if cwd is not None:
        params["cwd"] = cwd
    return box_path(box_id) + "/terminal?" + urlencode(params)

"""The service's failures as exceptions carrying its code."""

from __future__ import annotations

import httpx


class AgentboxError(Exception):
    """A request the service refused or failed: `code` is one of the contract's codes
    (`invalid`, `not_found`, `unauthenticated`, `rate_limited`...), `message` says what and
    why, `status` is the HTTP status, `retry_after` the seconds a 429 asks to wait."""

    def __init__(
        self, code: str, message: str, status: int, retry_after: float | None = None
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.retry_after = retry_after


class NotFound(AgentboxError):
    """`not_found`: no such box, file or route (another key's box is one of these)."""


class Unauthenticated(AgentboxError):
    """`unauthenticated`: no key, or one the server does not hold."""


class RateLimited(AgentboxError):
    """`rate_limited`: a limit was reached; `retry_after` says when to try again."""


_BY_CODE: dict[str, type[AgentboxError]] = {
    "not_found": NotFound,
    "unauthenticated": Unauthenticated,
    "rate_limited": RateLimited,
}


def transport_error(q: object, e: httpx.HTTPError) -> AgentboxError:
    """A request that got no answer: `timeout` when it ran out of time, else
    `transfer_failed` (status 0: the service never answered)."""
    what = f"{getattr(q, 'method', '')} {getattr(q, 'path', '')}".strip()
    if isinstance(e, httpx.TimeoutException):
        return AgentboxError("timeout", f"{what}: no answer in time ({e})", 0)
    return AgentboxError("transfer_failed", f"{what}: {type(e).__name__}: {e}", 0)


def raise_for(response: httpx.Response) -> None:
    """Raise the error a failed answer carries (its `{code, message}`); nothing for success."""
    if response.is_success:
        return
    try:
        body = response.json()
        code, message = str(body["code"]), str(body["message"])
    except (ValueError, KeyError, TypeError):
        code = "unknown"
        message = f"the service answered {response.status_code} without its error shape"
    retry = response.headers.get("retry-after")
    retry_after = float(retry) if retry and retry.replace(".", "", 1).isdigit() else None
    raise _BY_CODE.get(code, AgentboxError)(code, message, response.status_code, retry_after)

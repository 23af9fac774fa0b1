"""Errors of the engine client, one class per way a call can fail, mapped from HTTP.

400, 422 → EngineRequestError   the engine refused the request (bad input; do not retry as is)
404      → EngineNotFound       no such endpoint / request / KV handle (real SGLang has no /gyre/*)
409      → EngineConflict       state mismatch (KV of another weight version or model)
503, 507 → EngineUnavailable    not serving now (starting, memory released, shutting down, full)
other 5xx → EngineServerError
connection refused / reset after retries → EngineUnavailable;  timeouts → EngineTimeout
"""

from __future__ import annotations

from typing import Any


class EngineError(Exception):
    """Base of all engine client errors; `status_code` is None when no HTTP answer came back."""

    def __init__(self, message: str, *, status_code: int | None = None, url: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.url = url


class EngineRequestError(EngineError):
    pass


class EngineNotFound(EngineError):
    pass


class EngineConflict(EngineError):
    pass


class EngineUnavailable(EngineError):
    pass


class EngineServerError(EngineError):
    pass


class EngineTimeout(EngineError):
    pass


def error_message(body: Any, fallback: str) -> str:
    """The message of any SGLang error shape: {"error": {"message"}}, {"message"}, {"detail"},
    {"error_message"} (LoRAUpdateOutput)."""
    if isinstance(body, dict):
        inner = body.get("error")
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        for key in ("message", "detail", "error_message"):
            if body.get(key):
                return str(body[key])
    return fallback


def error_for_status(status_code: int, message: str, url: str) -> EngineError:
    cls: type[EngineError]
    if status_code in (400, 422):
        cls = EngineRequestError
    elif status_code == 404:
        cls = EngineNotFound
    elif status_code == 409:
        cls = EngineConflict
    elif status_code in (503, 507):
        cls = EngineUnavailable
    elif status_code >= 500:
        cls = EngineServerError
    else:
        cls = EngineError
    return cls(f"{url}: HTTP {status_code}: {message}", status_code=status_code, url=url)

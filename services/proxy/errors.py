"""The proxy's domain errors: one class per way a harness call can be refused or fail.

API-neutral: each error has an HTTP status, a `kind` (the error type of the caller's format) and a
`reason`: why the call was refused, finer than `kind` (`prompt_too_long` inside `invalid_request`), the
label of `gyre_proxy_refused_calls_total` and the key of `ProxyStats.refused_calls`. The API modules
(anthropic_api.py, chat_api.py, responses_api.py) render it as the caller's own error body, and app.py maps any
exception that escapes a handler to one of these (an unexpected one becomes `InternalError`).
Only engine and internal failures are 5xx; everything a harness can send wrong is a 4xx.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar


class ErrorKind(StrEnum):
    INVALID_REQUEST = "invalid_request"
    AUTHENTICATION = "authentication"
    PERMISSION = "permission"
    NOT_FOUND = "not_found"
    TOO_LARGE = "request_too_large"
    OVERLOADED = "overloaded"
    INTERNAL = "internal"


class ProxyError(Exception):
    """Base of the errors a harness call is answered with."""

    status: ClassVar[int] = 500
    kind: ClassVar[ErrorKind] = ErrorKind.INTERNAL
    reason: ClassVar[str] = "internal"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        """The request field at fault (a dotted path), when there is one."""

    @property
    def is_client_error(self) -> bool:
        return self.status < 500


class InvalidRequestError(ProxyError):
    """Malformed JSON, a field of the wrong type, an unsupported feature."""

    status = 400
    kind = ErrorKind.INVALID_REQUEST
    reason = "invalid_request"


class PromptTooLongError(InvalidRequestError):
    """The prompt leaves the engine's context no room for one output token."""

    reason = "prompt_too_long"


class EngineRefusedError(InvalidRequestError):
    """The engine refused the request itself (HTTP 400): the harness's error, not retried."""

    reason = "engine_refused"


class AuthenticationError(ProxyError):
    """No key, or a key the proxy never issued."""

    status = 401
    kind = ErrorKind.AUTHENTICATION
    reason = "authentication"


class ExecutionClosedError(ProxyError):
    """The key's execution is closed: its tree is frozen and takes no more calls."""

    status = 403
    kind = ErrorKind.PERMISSION
    reason = "execution_closed"


class NotFoundError(ProxyError):
    status = 404
    kind = ErrorKind.NOT_FOUND
    reason = "not_found"


class BodyTooLargeError(ProxyError):
    status = 413
    kind = ErrorKind.TOO_LARGE
    reason = "body_too_large"


class EngineUnavailableError(ProxyError):
    """No engine could serve the call (none routed, or all attempts failed); retrying may help."""

    status = 503
    kind = ErrorKind.OVERLOADED
    reason = "engine_unavailable"


class EngineOutputError(ProxyError):
    """The engine returned ids the chat template cannot decode (e.g. a padded-vocabulary id); the
    output is not recorded."""

    status = 502
    kind = ErrorKind.INTERNAL
    reason = "engine_output"


class InternalError(ProxyError):
    """A bug in the proxy; logged once where it is caught."""

    status = 500
    kind = ErrorKind.INTERNAL

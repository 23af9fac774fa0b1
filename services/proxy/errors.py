"""The proxy's domain errors: one class per way a harness call can be refused or fail.

API-neutral: each error has an HTTP status and a `kind`; the API modules (anthropic_api.py,
chat_api.py, responses_api.py) render it as the caller's own error body, and app.py maps any
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

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        """The request field at fault (a dotted path), when there is one."""

    @property
    def is_client_error(self) -> bool:
        return self.status < 500


class InvalidRequestError(ProxyError):
    """Malformed JSON, a field of the wrong type, an unsupported feature, a prompt too long."""

    status = 400
    kind = ErrorKind.INVALID_REQUEST


class AuthenticationError(ProxyError):
    """No key, or a key the proxy never issued."""

    status = 401
    kind = ErrorKind.AUTHENTICATION


class ExecutionClosedError(ProxyError):
    """The key's execution is closed: its tree is frozen and takes no more calls."""

    status = 403
    kind = ErrorKind.PERMISSION


class NotFoundError(ProxyError):
    status = 404
    kind = ErrorKind.NOT_FOUND


class BodyTooLargeError(ProxyError):
    status = 413
    kind = ErrorKind.TOO_LARGE


class EngineUnavailableError(ProxyError):
    """No engine could serve the call (none routed, or all attempts failed); retrying may help."""

    status = 503
    kind = ErrorKind.OVERLOADED


class EngineOutputError(ProxyError):
    """The engine returned ids the chat template cannot decode (e.g. a padded-vocabulary id); the
    output is not recorded."""

    status = 502
    kind = ErrorKind.INTERNAL


class InternalError(ProxyError):
    """A bug in the proxy; logged once where it is caught."""

    status = 500
    kind = ErrorKind.INTERNAL

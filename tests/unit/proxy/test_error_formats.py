"""Every proxy error renders in each API's own error format with a 4xx for what a harness sent
wrong and a 5xx (529 for Anthropic's overloaded) only for engine or proxy failures."""

from __future__ import annotations

import pytest

from services.proxy.anthropic_api import AnthropicAdapter
from services.proxy.api import ApiAdapter
from services.proxy.chat_api import ChatAdapter
from services.proxy.errors import (
    AuthenticationError,
    BodyTooLargeError,
    EngineOutputError,
    EngineUnavailableError,
    ExecutionClosedError,
    InternalError,
    InvalidRequestError,
    NotFoundError,
    ProxyError,
)
from services.proxy.responses_api import ResponsesAdapter

ERRORS: list[ProxyError] = [
    InvalidRequestError("bad", "messages[0]"),
    AuthenticationError("no key"),
    ExecutionClosedError("closed"),
    NotFoundError("nope"),
    BodyTooLargeError("big"),
    EngineUnavailableError("busy"),
    EngineOutputError("garbled"),
    InternalError("bug"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_anthropic_error_bodies(error: ProxyError) -> None:
    adapter = AnthropicAdapter()
    body = adapter.error_body(error)
    assert body["type"] == "error" and body["error"]["message"] == error.message
    expected = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        503: "overloaded_error",
    }.get(error.status, "api_error")
    assert body["error"]["type"] == expected
    assert adapter.error_status(error) == (529 if error.status == 503 else error.status)


@pytest.mark.parametrize("adapter", [ChatAdapter(), ResponsesAdapter()], ids=lambda a: type(a).__name__)
@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_openai_error_bodies(adapter: ApiAdapter, error: ProxyError) -> None:
    body = adapter.error_body(error)["error"]
    assert body["message"] == error.message and body["param"] == error.param
    assert body["type"] == ("server_error" if error.status >= 500 else body["type"])
    assert adapter.error_status(error) == error.status
    assert (error.status < 500) == error.is_client_error

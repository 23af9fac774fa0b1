"""Anthropic Messages API: `POST /v1/messages` (stream or not) and `POST /v1/messages/count_tokens`.

Requests go through `gyre.trajectory.from_anthropic` (unknown fields ignored); answers are
`to_anthropic_content` of the recorded output with `stop_reason` (`end_turn`, `tool_use`,
`max_tokens`, `stop_sequence`) and usage, or the SSE sequence of anthropic_sse.py. Errors use
Anthropic's body `{"type": "error", "error": {"type": ..., "message": ...}}`; an engine that
cannot serve is `529 overloaded_error`, which Anthropic clients (Claude Code) retry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from gyre.log import bind_context, get_logger
from gyre.trajectory import Api, MessageMemo, ModelRequest, from_anthropic, to_anthropic_content
from services.proxy.anthropic_sse import AnthropicStream, stop_reason, usage
from services.proxy.api import (
    ApiAdapter,
    api_key_of,
    check_declared_size,
    json_response,
    new_request_id,
    parse_request,
    read_json,
)
from services.proxy.calls import CallResult, ModelCall
from services.proxy.errors import ErrorKind, InternalError, ProxyError
from services.proxy.metrics import OverheadClock

if TYPE_CHECKING:
    from services.proxy.core import ProxyCore

log = get_logger("gyre.proxy.anthropic")

_ERROR_TYPES = {
    ErrorKind.INVALID_REQUEST: "invalid_request_error",
    ErrorKind.AUTHENTICATION: "authentication_error",
    ErrorKind.PERMISSION: "permission_error",
    ErrorKind.NOT_FOUND: "not_found_error",
    ErrorKind.TOO_LARGE: "request_too_large",
    ErrorKind.OVERLOADED: "overloaded_error",
    ErrorKind.INTERNAL: "api_error",
}


class AnthropicAdapter(ApiAdapter):
    api = Api.ANTHROPIC
    request_id_header = "request-id"

    def parse(self, body: Any, headers: Mapping[str, str], memo: MessageMemo | None = None) -> ModelRequest:
        return from_anthropic(body, headers, memo)

    def answer(self, call: ModelCall, result: CallResult) -> dict[str, Any]:
        return {
            "id": f"msg_{call.request_id}",
            "type": "message",
            "role": "assistant",
            "model": call.request.model,
            "content": to_anthropic_content(result.output),
            "stop_reason": stop_reason(result),
            "stop_sequence": result.stop_sequence,
            "usage": usage(result.prompt_tokens, result.cached_tokens, len(result.output_ids)),
        }

    def encoder(self, call: ModelCall) -> AnthropicStream:
        return AnthropicStream(f"msg_{call.request_id}", call.request.model, self.error_body)

    def error_body(self, error: ProxyError) -> dict[str, Any]:
        return {"type": "error", "error": {"type": _ERROR_TYPES[error.kind], "message": error.message}}

    def error_status(self, error: ProxyError) -> int:
        return 529 if error.kind is ErrorKind.OVERLOADED else error.status


async def count_tokens(core: ProxyCore, adapter: AnthropicAdapter, request: Request) -> Response:
    """`{"input_tokens": n}`: the prompt the call would send (matched ids reused, nothing stored)."""
    request_id = new_request_id()
    bind_context(request=request_id, api="anthropic_count_tokens")
    try:
        check_declared_size(request.headers, core.section.max_body_bytes)
        state = await core.executions.for_key(api_key_of(request.headers))
        body = await read_json(request, core.section.max_body_bytes, OverheadClock())
        model_request = parse_request(core, adapter, body, request.headers)
        num_tokens = await core.count_tokens(state, model_request)
    except ProxyError as e:
        core.metrics.answered("anthropic_count_tokens", adapter.error_status(e))
        core.metrics.failed("anthropic_count_tokens", e, False, model_call=False)
        return adapter.error_response(e, request_id)
    except Exception as e:
        log.exception("proxy_internal_error", error=repr(e))
        failure = InternalError(f"internal error in the proxy: {e!r}")
        core.metrics.failed("anthropic_count_tokens", failure, False, model_call=False)
        return adapter.error_response(failure, request_id)
    core.metrics.answered("anthropic_count_tokens", 200)
    return json_response({"input_tokens": num_tokens}, 200, {adapter.request_id_header: request_id})

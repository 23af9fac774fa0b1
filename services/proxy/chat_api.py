"""OpenAI Chat Completions API: `POST /v1/chat/completions`, streaming and not, with tools.

Requests go through `gyre.trajectory.from_openai_chat`; the answer is one choice with
`to_openai_chat_message` of the recorded output and `finish_reason` (`stop`, `tool_calls`,
`length`), or the chunk stream of chat_sse.py. Errors use OpenAI's body
`{"error": {"message", "type", "param", "code"}}`. Shared with the Responses adapter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gyre.trajectory import Api, MessageMemo, ModelRequest, from_openai_chat, to_openai_chat_message
from services.proxy.api import ApiAdapter
from services.proxy.calls import CallResult, ModelCall
from services.proxy.chat_sse import ChatStream, chat_usage
from services.proxy.errors import ErrorKind, ProxyError

_OPENAI_ERRORS: dict[ErrorKind, tuple[str, str | None]] = {
    ErrorKind.INVALID_REQUEST: ("invalid_request_error", None),
    ErrorKind.AUTHENTICATION: ("invalid_request_error", "invalid_api_key"),
    ErrorKind.PERMISSION: ("permission_error", "execution_closed"),
    ErrorKind.NOT_FOUND: ("invalid_request_error", "not_found"),
    ErrorKind.TOO_LARGE: ("invalid_request_error", "request_too_large"),
    ErrorKind.OVERLOADED: ("server_error", "engine_unavailable"),
    ErrorKind.INTERNAL: ("server_error", None),
}


def openai_error_body(error: ProxyError) -> dict[str, Any]:
    kind, code = _OPENAI_ERRORS[error.kind]
    return {"error": {"message": error.message, "type": kind, "param": error.param, "code": code}}


class ChatAdapter(ApiAdapter):
    api = Api.OPENAI_CHAT

    def parse(self, body: Any, headers: Mapping[str, str], memo: MessageMemo | None = None) -> ModelRequest:
        return from_openai_chat(body, headers, memo)

    def options(self, body: Any) -> dict[str, Any]:
        stream_options = body.get("stream_options") if isinstance(body, dict) else None
        if isinstance(stream_options, dict):
            return {"include_usage": stream_options.get("include_usage") is True}
        return {}

    def answer(self, call: ModelCall, result: CallResult) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{call.request_id}",
            "object": "chat.completion",
            "created": int(call.received_at_s),
            "model": call.request.model,
            "choices": [
                {
                    "index": 0,
                    "message": to_openai_chat_message(result.output),
                    "logprobs": None,
                    "finish_reason": result.finish_reason,
                }
            ],
            "usage": chat_usage(result),
        }

    def encoder(self, call: ModelCall) -> ChatStream:
        include_usage = bool(call.options.get("include_usage", False))
        return ChatStream(f"chatcmpl-{call.request_id}", call.request.model, include_usage, openai_error_body)

    def error_body(self, error: ProxyError) -> dict[str, Any]:
        return openai_error_body(error)

"""OpenAI Responses API: `POST /v1/responses` (what the Codex CLI uses), streaming and not.

Requests go through `gyre.trajectory.from_openai_responses` (tools at the top level, the system
prompt as `instructions` or a leading `developer` message); the answer is a `response` object
whose `output` is `to_responses_output` of the recorded output, or the event stream of
responses_sse.py. Errors use OpenAI's error body.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gyre.trajectory import Api, MessageMemo, ModelRequest, from_openai_responses, to_responses_output
from services.proxy.api import ApiAdapter
from services.proxy.calls import CallResult, ModelCall
from services.proxy.chat_api import openai_error_body
from services.proxy.errors import ProxyError
from services.proxy.responses_sse import ResponsesStream, response_object, responses_usage


class ResponsesAdapter(ApiAdapter):
    api = Api.OPENAI_RESPONSES

    def parse(self, body: Any, headers: Mapping[str, str], memo: MessageMemo | None = None) -> ModelRequest:
        return from_openai_responses(body, headers, memo)

    def answer(self, call: ModelCall, result: CallResult) -> dict[str, Any]:
        status = "incomplete" if result.finish_reason == "length" else "completed"
        return response_object(
            call,
            f"resp_{call.request_id}",
            status,
            to_responses_output(result.output),
            responses_usage(result),
        )

    def encoder(self, call: ModelCall) -> ResponsesStream:
        return ResponsesStream(call, f"resp_{call.request_id}", openai_error_body)

    def error_body(self, error: ProxyError) -> dict[str, Any]:
        return openai_error_body(error)

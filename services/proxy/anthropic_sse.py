"""Anthropic Messages streaming: the exact SSE event sequence of `POST /v1/messages` with `stream`.

    message_start → ping → (content_block_start → deltas → content_block_stop)* → message_delta → message_stop

Deltas are `text_delta`, `thinking_delta` + `signature_delta`, and `input_json_delta` (the whole
input of a tool call, compact JSON, once it is complete). Blocks are what `to_anthropic_content`
gives for the same output: whitespace-only text blocks are left out (they are held back until
their first visible character), thinking carries the same signature. An error after the stream
started is `event: error` with Anthropic's error object.
"""

from __future__ import annotations

from typing import Any

import orjson

from gyre.trajectory import AssistantOutput, ThinkingBlock, to_anthropic_content
from services.proxy.api import StreamEncoder, sse
from services.proxy.calls import CallResult, ModelCall
from services.proxy.errors import ProxyError
from services.proxy.streaming import StreamEvent, TextDelta, TextEnd, ThinkingDone, ToolCallDone


def stop_reason(result: CallResult) -> str:
    if result.output.tool_calls:
        return "tool_use"
    if result.stop_sequence is not None:
        return "stop_sequence"
    return "end_turn" if result.output.stopped else "max_tokens"


def usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, int]:
    """Anthropic counts cache reads apart from `input_tokens`; their sum is the prompt."""
    cached = min(cached_tokens, prompt_tokens)
    return {
        "input_tokens": prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": output_tokens,
    }


class AnthropicStream(StreamEncoder):
    def __init__(self, message_id: str, model: str, error_body: Any) -> None:
        self.message_id = message_id
        self.model = model
        self._error_body = error_body
        self._index = 0
        self._text_open = False
        self._held = ""

    def start(self, call: ModelCall) -> bytes:
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage(call.prompt_tokens, call.generation.cached_tokens, 0),
        }
        return sse("message_start", {"type": "message_start", "message": message}) + sse(
            "ping", {"type": "ping"}
        )

    def events(self, events: list[StreamEvent]) -> bytes:
        out: list[bytes] = []
        for event in events:
            if isinstance(event, TextDelta):
                self._text(out, event.text)
            elif isinstance(event, TextEnd):
                if self._text_open:
                    out.append(self._block_stop())
                self._text_open, self._held = False, ""
            elif isinstance(event, ThinkingDone):
                self._thinking(out, event.text)
            elif isinstance(event, ToolCallDone):
                self._tool_use(out, event)
        return b"".join(out)

    def finish(self, call: ModelCall, result: CallResult) -> bytes:
        out: list[bytes] = []
        if self._text_open:
            out.append(self._block_stop())
            self._text_open = False
        delta = {"stop_reason": stop_reason(result), "stop_sequence": result.stop_sequence}
        out.append(
            sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": delta,
                    "usage": usage(result.prompt_tokens, result.cached_tokens, len(result.output_ids)),
                },
            )
        )
        out.append(sse("message_stop", {"type": "message_stop"}))
        return b"".join(out)

    def error(self, error: ProxyError) -> bytes:
        return sse("error", self._error_body(error))

    # -- blocks ------------------------------------------------------------------------------

    def _text(self, out: list[bytes], text: str) -> None:
        if not self._text_open:
            self._held += text
            if not self._held.strip():
                return
            text, self._held = self._held, ""
            out.append(self._block_start({"type": "text", "text": ""}))
            self._text_open = True
        out.append(self._delta({"type": "text_delta", "text": text}))

    def _thinking(self, out: list[bytes], thinking: str) -> None:
        block = to_anthropic_content(AssistantOutput((ThinkingBlock(thinking),), True))[0]
        out.append(self._block_start({"type": "thinking", "thinking": "", "signature": ""}))
        if thinking:
            out.append(self._delta({"type": "thinking_delta", "thinking": thinking}))
        out.append(self._delta({"type": "signature_delta", "signature": block["signature"]}))
        out.append(self._block_stop())

    def _tool_use(self, out: list[bytes], event: ToolCallDone) -> None:
        block = to_anthropic_content(AssistantOutput((event.call,), True))[0]
        out.append(
            self._block_start({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}})
        )
        out.append(
            self._delta({"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()})
        )
        out.append(self._block_stop())

    def _block_start(self, block: dict[str, Any]) -> bytes:
        return sse(
            "content_block_start",
            {"type": "content_block_start", "index": self._index, "content_block": block},
        )

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse(
            "content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta}
        )

    def _block_stop(self) -> bytes:
        data = sse("content_block_stop", {"type": "content_block_stop", "index": self._index})
        self._index += 1
        return data

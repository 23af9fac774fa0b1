"""OpenAI Chat Completions streaming: `chat.completion.chunk` objects as `data:` lines, then `[DONE]`.

The first chunk carries `{"role": "assistant", "content": ""}`; then `content` deltas,
`reasoning_content` (the whole thinking, once certain) and `tool_calls` deltas (each call whole,
with its index, id, name and arguments JSON as `to_openai_chat_message` writes it); a last chunk
with `finish_reason`, a usage chunk when `stream_options.include_usage` is set, and `[DONE]`.
An error after the stream started is a `data: {"error": ...}` line.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from gyre.trajectory import AssistantOutput, to_openai_chat_message
from services.proxy.api import StreamEncoder
from services.proxy.calls import CallResult, ModelCall
from services.proxy.errors import ProxyError
from services.proxy.streaming import StreamEvent, TextDelta, ThinkingDone, ToolCallDone

DONE = b"data: [DONE]\n\n"


def data_line(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chat_usage(result: CallResult) -> dict[str, Any]:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": len(result.output_ids),
        "total_tokens": result.prompt_tokens + len(result.output_ids),
        "prompt_tokens_details": {"cached_tokens": min(result.cached_tokens, result.prompt_tokens)},
    }


class ChatStream(StreamEncoder):
    def __init__(self, completion_id: str, model: str, include_usage: bool, error_body: Any) -> None:
        self.completion_id = completion_id
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage
        self._error_body = error_body
        self._num_calls = 0

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return data_line(
            {
                "id": self.completion_id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
            }
        )

    def start(self, call: ModelCall) -> bytes:
        return self._chunk({"role": "assistant", "content": ""})

    def events(self, events: list[StreamEvent]) -> bytes:
        out: list[bytes] = []
        for event in events:
            if isinstance(event, TextDelta):
                out.append(self._chunk({"content": event.text}))
            elif isinstance(event, ThinkingDone):
                if event.text:
                    out.append(self._chunk({"reasoning_content": event.text}))
            elif isinstance(event, ToolCallDone):
                (entry,) = to_openai_chat_message(AssistantOutput((event.call,), True))["tool_calls"]
                delta = {"index": self._num_calls, **entry}
                self._num_calls += 1
                out.append(self._chunk({"tool_calls": [delta]}))
        return b"".join(out)

    def finish(self, call: ModelCall, result: CallResult) -> bytes:
        out = [self._chunk({}, result.finish_reason)]
        if self.include_usage:
            out.append(
                data_line(
                    {
                        "id": self.completion_id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": chat_usage(result),
                    }
                )
            )
        out.append(DONE)
        return b"".join(out)

    def error(self, error: ProxyError) -> bytes:
        return data_line(self._error_body(error))

"""OpenAI Responses streaming (what the Codex CLI reads): typed events with a `sequence_number`.

    response.created → response.in_progress →
      per item: response.output_item.added → deltas → …done → response.output_item.done
    → response.completed (or response.incomplete when cut by max_output_tokens)

Items are what `to_responses_output` gives for the same output: `reasoning` (reasoning_text
delta/done), `message` with one `output_text` part (content_part.added, output_text.delta,
output_text.done, content_part.done; whitespace-only text is left out), and `function_call`
(function_call_arguments.delta/done, the arguments JSON whole). A message item's id cannot hash
its text before the text exists, so streamed message ids derive from the response id and the
item's position. An error after the stream started is `response.failed`.
"""

from __future__ import annotations

import hashlib
from typing import Any

from gyre.trajectory import AssistantOutput, ThinkingBlock, to_responses_output
from services.proxy.api import StreamEncoder, sse
from services.proxy.calls import CallResult, ModelCall
from services.proxy.errors import ProxyError
from services.proxy.streaming import StreamEvent, TextDelta, TextEnd, ThinkingDone, ToolCallDone


def responses_usage(result: CallResult) -> dict[str, Any]:
    return {
        "input_tokens": result.prompt_tokens,
        "input_tokens_details": {"cached_tokens": min(result.cached_tokens, result.prompt_tokens)},
        "output_tokens": len(result.output_ids),
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": result.prompt_tokens + len(result.output_ids),
    }


def response_object(
    call: ModelCall, response_id: str, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(call.received_at_s),
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "model": call.request.model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    }


class ResponsesStream(StreamEncoder):
    def __init__(self, call: ModelCall, response_id: str, error_body: Any) -> None:
        self.call = call
        self.response_id = response_id
        self._error_body = error_body
        self._seq = 0
        self.output: list[dict[str, Any]] = []
        self._text: dict[str, Any] | None = None
        self._text_parts: list[str] = []
        self._held = ""

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse(kind, data)

    def start(self, call: ModelCall) -> bytes:
        response = response_object(call, self.response_id, "in_progress", [], None)
        return self._event("response.created", response=response) + self._event(
            "response.in_progress", response=response
        )

    def events(self, events: list[StreamEvent]) -> bytes:
        out: list[bytes] = []
        for event in events:
            if isinstance(event, TextDelta):
                self._text_delta(out, event.text)
            elif isinstance(event, TextEnd):
                self._text_end(out)
            elif isinstance(event, ThinkingDone):
                self._reasoning(out, event.text)
            elif isinstance(event, ToolCallDone):
                self._function_call(out, event)
        return b"".join(out)

    def finish(self, call: ModelCall, result: CallResult) -> bytes:
        out: list[bytes] = []
        self._text_end(out)
        status = "incomplete" if result.finish_reason == "length" else "completed"
        response = response_object(call, self.response_id, status, self.output, responses_usage(result))
        out.append(self._event(f"response.{status}", response=response))
        return b"".join(out)

    def error(self, error: ProxyError) -> bytes:
        response = response_object(self.call, self.response_id, "failed", self.output, None)
        body = self._error_body(error)["error"]
        response["error"] = {"code": body.get("code") or body["type"], "message": error.message}
        return self._event("response.failed", response=response)

    # -- items -------------------------------------------------------------------------------

    def _text_delta(self, out: list[bytes], text: str) -> None:
        if self._text is None:
            self._held += text
            if not self._held.strip():
                return
            text, self._held = self._held, ""
            item_id = (
                "msg_"
                + hashlib.blake2b(
                    f"{self.response_id}:{len(self.output)}".encode(), digest_size=8
                ).hexdigest()
            )
            self._text = {
                "type": "message",
                "id": item_id,
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            index = len(self.output)
            out.append(self._event("response.output_item.added", output_index=index, item=dict(self._text)))
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []},
                )
            )
        self._text_parts.append(text)
        out.append(
            self._event(
                "response.output_text.delta",
                item_id=self._text["id"],
                output_index=len(self.output),
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )

    def _text_end(self, out: list[bytes]) -> None:
        self._held = ""
        if self._text is None:
            return
        text = "".join(self._text_parts)
        part = {"type": "output_text", "text": text, "annotations": []}
        item = {**self._text, "status": "completed", "content": [part]}
        index, item_id = len(self.output), item["id"]
        out.append(
            self._event(
                "response.output_text.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            )
        )
        out.append(
            self._event(
                "response.content_part.done", item_id=item_id, output_index=index, content_index=0, part=part
            )
        )
        out.append(self._event("response.output_item.done", output_index=index, item=item))
        self.output.append(item)
        self._text, self._text_parts = None, []

    def _reasoning(self, out: list[bytes], thinking: str) -> None:
        item = to_responses_output(AssistantOutput((ThinkingBlock(thinking),), True))[0]
        index = len(self.output)
        out.append(
            self._event(
                "response.output_item.added",
                output_index=index,
                item={"type": "reasoning", "id": item["id"], "summary": []},
            )
        )
        out.append(
            self._event(
                "response.reasoning_text.delta",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                delta=thinking,
            )
        )
        out.append(
            self._event(
                "response.reasoning_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=thinking,
            )
        )
        out.append(self._event("response.output_item.done", output_index=index, item=item))
        self.output.append(item)

    def _function_call(self, out: list[bytes], event: ToolCallDone) -> None:
        item = to_responses_output(AssistantOutput((event.call,), True))[0]
        arguments = item["arguments"]
        index = len(self.output)
        out.append(
            self._event(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
        )
        out.append(
            self._event(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=index,
                delta=arguments,
            )
        )
        out.append(
            self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=arguments,
            )
        )
        out.append(self._event("response.output_item.done", output_index=index, item=item))
        self.output.append(item)

"""A scripted Anthropic Messages endpoint for benchmarks that measure the harness, not the model.

It stands in for the model's outputs only: every first call of a conversation is answered with one
`write_file` tool call, every call that carries a tool result with a final text, in the Messages API's
own JSON or SSE stream (`stream: true`), so the demo harness runs its real SDK, agent loop and tools.
With `tool_call=False` every call gets the final text (a harness that makes one call and ends). It
records when each API key's first call arrived (`first_call`: bench sandbox's time to first call).

    endpoint = ScriptedMessages(path="answer.txt", content="8")
    port = await endpoint.start()          # 127.0.0.1:port, POST /v1/messages
    ...
    await endpoint.stop()
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any


class ScriptedMessages:
    def __init__(self, path: str = "answer.txt", content: str = "8", *, tool_call: bool = True) -> None:
        self.tool_input = {"path": path, "content": content}
        self.tool_call = tool_call
        self.requests = 0
        self.first_call: dict[str, float] = {}
        """API key → when its first call's headers arrived (time.time())."""
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _reply(self, request: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
        last = request.get("messages", [{}])[-1].get("content")
        answered = isinstance(last, list) and any(b.get("type") == "tool_result" for b in last)
        if answered or not self.tool_call:
            return [{"type": "text", "text": "Done."}], "end_turn"
        block = {
            "type": "tool_use",
            "id": f"toolu_{self.requests}",
            "name": "write_file",
            "input": self.tool_input,
        }
        return [block], "tool_use"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            arrived = time.time()
            headers = {
                k.strip().lower(): v.strip()
                for k, _, v in (line.partition(":") for line in head.decode("latin-1").split("\r\n")[1:])
            }
            self.first_call.setdefault(headers.get("x-api-key", ""), arrived)
            length = int(headers.get("content-length", "0"))
            request = json.loads(await reader.readexactly(length)) if length else {}
            self.requests += 1
            content, stop = self._reply(request)
            if request.get("stream"):
                body, kind = self._events(content, stop), "text/event-stream"
            else:
                body, kind = json.dumps(self._message(content, stop)).encode(), "application/json"
            writer.write(
                f"HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    def _message(self, content: list[dict[str, Any]], stop: str) -> dict[str, Any]:
        return {
            "id": f"msg_{self.requests}",
            "type": "message",
            "role": "assistant",
            "model": "scripted",
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 100, "output_tokens": 10},
        }

    def _events(self, content: list[dict[str, Any]], stop: str) -> bytes:
        start = {**self._message([], stop), "stop_reason": None}
        events: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": start})
        ]
        for i, block in enumerate(content):
            if block["type"] == "text":
                opening, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
            else:
                opening = {**block, "input": {}}
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            events += [
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": i, "content_block": opening},
                ),
                ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}),
                ("content_block_stop", {"type": "content_block_stop", "index": i}),
            ]
        events += [
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": 10},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)

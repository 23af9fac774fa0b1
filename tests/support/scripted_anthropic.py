"""A scripted Anthropic Messages endpoint for tests: a test double for MODEL OUTPUTS only.

The harness under test is real; what the "model" answers comes from a script. Serves
`POST /v1/messages` (streaming SSE with Anthropic's event sequence, and plain JSON) on 127.0.0.1
from a background thread, records every request (path, headers, body), and answers each one with
the next step of the script, or with what a callable script returns for it.

    with ScriptedAnthropic([tool_use("write_file", {"path": "a.txt", "content": "8"}), text("Done.")]) as api:
        env = {"ANTHROPIC_BASE_URL": api.base_url, "ANTHROPIC_API_KEY": "k"}
        ...
        assert api.requests[1].body["messages"][-1]["content"][0]["type"] == "tool_result"

A step is a `Reply` (content blocks, stop reason, usage) or a `Fail` (an HTTP error status the
harness should retry or not). An exhausted script answers 500 and records the request.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True, slots=True)
class Reply:
    content: tuple[dict[str, Any], ...]
    stop_reason: str = "end_turn"
    input_tokens: int = 10
    output_tokens: int = 5


@dataclass(frozen=True, slots=True)
class Fail:
    status: int = 500
    message: str = "scripted failure"


Step = Reply | Fail


@dataclass(slots=True)
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    step: Step | None = None

    @property
    def api_key(self) -> str:
        """The key the client sent (`x-api-key`, or `Authorization: Bearer`)."""
        return self.headers.get("x-api-key") or self.headers.get("authorization", "").removeprefix("Bearer ")

    @property
    def system(self) -> str:
        system = self.body.get("system", "")
        return system if isinstance(system, str) else "".join(b.get("text", "") for b in system)

    def first_user_text(self) -> str:
        content = self.body["messages"][0]["content"]
        return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)


def text(value: str, **usage: int) -> Reply:
    return Reply(({"type": "text", "text": value},), "end_turn", **usage)


def tool_use(name: str, arguments: dict[str, Any], text_before: str = "", **usage: int) -> Reply:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text_before}] if text_before else []
    blocks.append(
        {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:20]}", "name": name, "input": arguments}
    )
    return Reply(tuple(blocks), "tool_use", **usage)


ScriptFn = Callable[[RecordedRequest], Step]

_ADDITION = re.compile(r"^([0-9])\+([0-9])=\? Write the answer to (\S+)\.$")


def arithmetic_solver(request: RecordedRequest) -> Step:
    """Answers the `add/` demo tasks like a perfect model: one write_file call, then 'Done.'."""
    last = request.body["messages"][-1]
    if (
        last["role"] == "user"
        and isinstance(last["content"], list)
        and last["content"][0]["type"] == "tool_result"
    ):
        return text("Done.")
    m = _ADDITION.match(request.first_user_text())
    if m is None:
        return text("I cannot do this task.")
    return tool_use("write_file", {"path": m.group(3), "content": str(int(m.group(1)) + int(m.group(2)))})


class ScriptedAnthropic:
    """The endpoint; use as a context manager (starts and stops the server thread)."""

    def __init__(self, script: Iterable[Step] | ScriptFn, host: str = "127.0.0.1") -> None:
        self._fn: ScriptFn | None = script if callable(script) else None
        self._steps: list[Step] = [] if callable(script) else list(script)
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="scripted-anthropic", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ScriptedAnthropic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def next_step(self, request: RecordedRequest) -> Step:
        with self._lock:
            if self._fn is not None:
                step = self._fn(request)
            elif self._steps:
                step = self._steps.pop(0)
            else:
                step = Fail(500, "script exhausted")
            request.step = step
            self.requests.append(request)
            return step


def _message_json(step: Reply) -> dict[str, Any]:
    return {
        "id": f"msg_{uuid.uuid4().hex[:20]}",
        "type": "message",
        "role": "assistant",
        "model": "scripted",
        "content": list(step.content),
        "stop_reason": step.stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": step.input_tokens, "output_tokens": step.output_tokens},
    }


def _sse_events(step: Reply) -> list[tuple[str, dict[str, Any]]]:
    message = _message_json(step)
    start = {**message, "content": [], "stop_reason": None, "usage": {**message["usage"], "output_tokens": 0}}
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    events.append(("ping", {"type": "ping"}))
    for i, block in enumerate(step.content):
        if block["type"] == "text":
            events.append(
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": i,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
            )
            events.append(
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": i,
                        "delta": {"type": "text_delta", "text": block["text"]},
                    },
                )
            )
        else:
            events.append(
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": i, "content_block": {**block, "input": {}}},
                )
            )
            events.append(
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": i,
                        "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])},
                    },
                )
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": step.stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": step.output_tokens},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _handler_for(api: ScriptedAnthropic) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            headers = {k.lower(): v for k, v in self.headers.items()}
            step = api.next_step(RecordedRequest(self.path, headers, body))
            if isinstance(step, Fail):
                payload = {"type": "error", "error": {"type": "api_error", "message": step.message}}
                self._send_json(step.status, payload)
            elif body.get("stream"):
                self._send_sse(step)
            else:
                self._send_json(200, _message_json(step))

        def _send_json(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _send_sse(self, step: Reply) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("cache-control", "no-cache")
            self.send_header("connection", "close")
            self.end_headers()
            for name, data in _sse_events(step):
                self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
            self.close_connection = True

    return Handler

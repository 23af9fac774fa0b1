"""A scripted Anthropic Messages endpoint that records every request it receives (test support).

Real harness CLIs (Claude Code) talk to `POST /v1/messages?beta=true` with `stream: true` and probe
`HEAD /`. This server answers with Anthropic's SSE event sequence (message_start, ping,
content_block_start, deltas, content_block_stop, message_delta, message_stop) built from a
`Responder` — a function from the request body to the assistant reply — and appends each request
(path, headers, body, and the reply it got) to `CaptureServer.records`. It listens on 127.0.0.1
only, on a free port, in a background thread:

    with CaptureServer(responder) as server:
        run_claude(base_url=server.base_url)
    server.write_jsonl(path)      # one envelope per line, readable by `gyre trace replay`

It is a test double of the model, never of the harness: the harness under test is the real CLI.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Reply:
    """One scripted assistant turn: optional text, then tool calls `(name, input)`."""

    text: str = ""
    tool_calls: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    input_tokens: int = 100
    """Reported `usage.input_tokens` (a huge value makes Claude Code compact)."""
    content: tuple[dict[str, Any], ...] | None = None
    """Complete content blocks to send before `text` and `tool_calls` (e.g. from a recording proxy)."""


Responder = Callable[[Mapping[str, Any], Mapping[str, str]], Reply]


def text_reply(text: str) -> Responder:
    """A responder that always answers with the same text."""
    return lambda body, headers: Reply(text=text)


@dataclass
class CaptureServer:
    """Scripted Anthropic endpoint on 127.0.0.1; `records` holds every POSTed request."""

    responder: Responder
    records: list[dict[str, Any]] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                self._json(200, {})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                body = json.loads(raw or b"{}")
                headers = {k.lower(): v for k, v in self.headers.items()}
                path = self.path.split("?")[0]
                if path.endswith("/count_tokens"):
                    self._json(200, {"input_tokens": 100})
                    return
                if not path.endswith("/v1/messages"):
                    self._json(404, {"type": "error", "error": {"type": "not_found_error", "message": path}})
                    return
                reply = server.responder(body, headers)
                message = server._message(reply, body)
                with server._lock:
                    server.records.append(
                        {"path": self.path, "headers": headers, "body": body, "response": message}
                    )
                if body.get("stream"):
                    self._sse(message)
                else:
                    self._json(200, message)

            def _json(self, status: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _sse(self, message: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")
                self.end_headers()
                for event, data in _sse_events(message):
                    self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> CaptureServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def write_jsonl(self, path: Path) -> None:
        """One `{"headers", "body", "response"}` envelope per line."""
        with path.open("w") as f:
            for record in self.records:
                envelope = {k: record[k] for k in ("headers", "body", "response")}
                f.write(json.dumps(envelope) + "\n")

    def _message(self, reply: Reply, body: Mapping[str, Any]) -> dict[str, Any]:
        n = next(self._ids)
        content: list[dict[str, Any]] = [dict(block) for block in reply.content or ()]
        if reply.text:
            content.append({"type": "text", "text": reply.text})
        for i, (name, tool_input) in enumerate(reply.tool_calls):
            content.append(
                {"type": "tool_use", "id": f"toolu_capture_{n}_{i}", "name": name, "input": dict(tool_input)}
            )
        return {
            "id": f"msg_capture_{n}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "capture"),
            "content": content,
            "stop_reason": "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": reply.input_tokens, "output_tokens": 10},
        }


def _sse_events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Anthropic's streaming event sequence for a complete message."""
    start = dict(message, content=[], stop_reason=None, usage=dict(message["usage"], output_tokens=1))
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("ping", {"type": "ping"}),
    ]

    def block_events(index: int, empty: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
        events.append(
            ("content_block_start", {"type": "content_block_start", "index": index, "content_block": empty})
        )
        for delta in deltas:
            events.append(
                ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))

    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            block_events(index, {"type": "text", "text": ""}, [{"type": "text_delta", "text": block["text"]}])
        elif block["type"] == "thinking":
            block_events(
                index,
                {"type": "thinking", "thinking": ""},
                [
                    {"type": "thinking_delta", "thinking": block["thinking"]},
                    {"type": "signature_delta", "signature": block["signature"]},
                ],
            )
        else:
            partial = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            block_events(index, dict(block, input={}), [partial])
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    usage = {"output_tokens": message["usage"]["output_tokens"]}
    events.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events

"""The `/metrics` listener of a service: a small HTTP/1.1 server on the service's own event loop.

    listener = MetricsListener(registry, host="127.0.0.1", port=0)
    await listener.start()          # listener.port is known from here on
    ...                             # curl http://127.0.0.1:<port>/metrics
    await listener.stop()

It answers `GET`/`HEAD /metrics` with the Prometheus text format (or OpenMetrics when the scraper asks for
it) and nothing else: another path is 404, another method 405, a request it cannot parse 400, a head over
16 KiB 431 — each a one-line plain-text reason, and the connection is closed after every answer.
Collection runs on the event loop, between the service's own callbacks, so the collectors read the
service's state without locks; there is no thread and no import of a web framework.
"""

from __future__ import annotations

import asyncio
import contextlib
from http import HTTPStatus

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from gyre.metrics.registry import CombinedRegistry

MAX_HEAD_BYTES = 16 * 1024
READ_TIMEOUT_S = 10.0


class MetricsListener:
    def __init__(self, registry: CollectorRegistry | CombinedRegistry, *, host: str, port: int) -> None:
        self.registry = registry
        self.host = host
        self.requested_port = port
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, self.host, self.requested_port, limit=MAX_HEAD_BYTES, reuse_address=True
        )
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop accepting and close the socket. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), timeout=2.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, headers, body, send_body = await self._answer(reader)
            head = [
                f"HTTP/1.1 {status.value} {status.phrase}",
                f"Content-Length: {len(body)}",
                "Connection: close",
                *headers,
            ]
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
            if send_body:
                writer.write(body)
            await writer.drain()
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            pass  # the scraper went away: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), timeout=2.0)

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[HTTPStatus, list[str], bytes, bool]:
        """Status, extra headers, body and whether to send it (not for HEAD) of one request."""
        try:
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=READ_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            return _text(
                HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"request head over {MAX_HEAD_BYTES} bytes"
            )
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return _text(HTTPStatus.BAD_REQUEST, "not an HTTP/1.x request line")
        method, target = parts[0], parts[1]
        headers = {}
        for line in lines[1:]:
            if line:
                name, sep, value = line.partition(":")
                if not sep:
                    return _text(HTTPStatus.BAD_REQUEST, f"malformed header line {line[:80]!r}")
                headers[name.strip().lower()] = value.strip()
        if target.split("?", 1)[0] != "/metrics":
            return _text(
                HTTPStatus.NOT_FOUND, f"no such endpoint: {target[:200]} (this listener serves /metrics)"
            )
        if method not in ("GET", "HEAD"):
            status, extra, body, _ = _text(
                HTTPStatus.METHOD_NOT_ALLOWED, f"method {method[:20]} is not allowed on /metrics"
            )
            return status, [*extra, "Allow: GET, HEAD"], body, True
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        body = encoder(self.registry)
        return HTTPStatus.OK, [f"Content-Type: {content_type}"], body, method == "GET"


def _text(status: HTTPStatus, message: str) -> tuple[HTTPStatus, list[str], bytes, bool]:
    return status, ["Content-Type: text/plain; charset=utf-8"], (message + "\n").encode(), True

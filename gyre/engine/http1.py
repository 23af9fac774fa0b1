"""A small HTTP/1.1 client for whole exchanges with one engine: keep-alive connections over asyncio streams.

    pool = Http1Pool("127.0.0.1", 30000, connect_timeout_s=5.0)
    status, reason, body = await pool.request("POST", "/generate", body, "application/json", timeout_s=600)
    status, reason, body = await pool.request("POST", "/v1/messages", body, "application/json",
                                              headers={"x-api-key": key}, timeout_s=600)   # extra headers
    await pool.aclose()

The proxy sends one `/generate` per harness call; through aiohttp's request machinery (its request and
response models, header multidicts, cookie jar, per-read timers) that exchange was ~10% of the proxy's CPU
under `gyre bench load`, more than the engine's answer takes to parse. This pool writes the request in one
write and reads the status line, the headers and a `content-length`, chunked or close-delimited body (none
after HEAD, 204 and 304, as HTTP/1.1 has it); that is all a whole answer of SGLang or the embedded engine
(uvicorn) needs. Streams stay on aiohttp (`EngineClient`). Over HTTPS (`ssl`: the client's context of the
deployment's TLS identity, `gyre.tls`) the same exchanges run inside TLS. `gyre bench proxy` sends its
harness calls to the proxy through it too (the API key in `headers`), so that a proxied call and its
direct twin to the engine pay for the same client.

Connections are reused most-recent first and dropped after `idle_s` unused, below uvicorn's default
keep-alive of 5 s (SGLang's), so a request is not written into a connection the server is closing. A
failed connect raises `Http1ConnectError` (the request never left: safe to retry); anything that breaks
after the request was written raises `Http1BrokenError` and is never retried here, because the server may
have started on it. Timeouts raise `TimeoutError`. A cancelled request closes its connection.
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
import time
from collections.abc import Mapping

MAX_HEAD_BYTES = 64 << 10
"""Longest status line and headers of an answer."""
LARGE_BODY_BYTES = 1 << 20
"""Bodies above this size (weight updates) are written after the head, not joined to it, and drained."""


class Http1ConnectError(OSError):
    """The connection could not be made; the request was not sent."""


class Http1BrokenError(OSError):
    """The connection broke or the answer was malformed after the request was written."""


class _Connection:
    __slots__ = ("reader", "used_at", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.used_at = time.monotonic()


class Http1Pool:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout_s: float,
        idle_s: float = 4.0,
        max_idle: int = 2048,
        ssl: _ssl.SSLContext | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.ssl = ssl
        self.connect_timeout_s = connect_timeout_s
        self.idle_s = idle_s
        self.max_idle = max_idle
        self._idle: list[_Connection] = []
        self._host_header = f"host: {host}:{port}\r\n"

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None,
        content_type: str | None,
        *,
        timeout_s: float,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, str, bytes]:
        """Status, reason and the whole body of one exchange; `headers` are added to the request's own
        (host, content-length, content-type), which they must not repeat."""
        head = f"{method} {path} HTTP/1.1\r\n{self._host_header}content-length: {len(body or b'')}\r\n"
        if content_type is not None:
            head += f"content-type: {content_type}\r\n"
        if headers:
            head += "".join(_header_line(name, value) for name, value in headers.items())
        head_bytes = (head + "\r\n").encode()
        connection = self._take() or await self._connect()
        reusable = False
        try:
            writer = connection.writer
            async with asyncio.timeout(timeout_s):
                if body is not None and len(body) > LARGE_BODY_BYTES:  # not joined to the head: no copy
                    writer.write(head_bytes)  # two writes: Python 3.11's writelines joins its buffers
                    writer.write(body)
                    await writer.drain()
                else:  # one write, one segment
                    writer.write(head_bytes + (body or b""))
                status, reason, headers = await _read_head(connection.reader)
                bodiless = method == "HEAD" or status in (204, 304)  # no body, whatever the headers say
                content = b"" if bodiless else await _read_body(connection.reader, headers)
            framed = (
                bodiless
                or "content-length" in headers
                or "chunked" in headers.get("transfer-encoding", "").lower()
            )
            reusable = framed and headers.get("connection", "").lower() != "close"
            return status, reason, content
        except (TimeoutError, Http1BrokenError):  # TimeoutError is an OSError: named first
            raise
        except (OSError, EOFError, ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
            raise Http1BrokenError(f"{type(e).__name__}: {e}") from e
        finally:
            if reusable:
                connection.used_at = time.monotonic()
                self._idle.append(connection)
                if len(self._idle) > self.max_idle:
                    self._idle.pop(0).writer.close()
            else:
                connection.writer.close()

    def _take(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if now - connection.used_at < self.idle_s and not connection.reader.at_eof():
                return connection
            connection.writer.close()
        return None

    async def _connect(self) -> _Connection:
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                reader, writer = await asyncio.open_connection(
                    self.host, self.port, limit=MAX_HEAD_BYTES, ssl=self.ssl
                )
        except (OSError, TimeoutError) as e:
            raise Http1ConnectError(f"cannot connect to {self.host}:{self.port}: {e!r}") from e
        return _Connection(reader, writer)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.writer.close()


def _header_line(name: str, value: str) -> str:
    """`name: value` and its CRLF; ValueError for a name or value that would break the request's framing."""
    if not name or any(c in name for c in ":\r\n \t") or "\r" in value or "\n" in value:
        raise ValueError(f"malformed header {name[:100]!r}: {value[:100]!r}")
    return f"{name}: {value}\r\n"


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, str, dict[str, str]]:
    raw = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = raw[:-4].decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise Http1BrokenError(f"not an HTTP/1.1 status line: {status_line[:100]!r}")
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise Http1BrokenError(f"malformed header line: {line[:100]!r}")
        headers[name.strip().lower()] = value.strip()
    if int(code) < 200:  # 1xx (100 Continue): the final answer follows
        return await _read_head(reader)
    return int(code), reason, headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks: list[bytes] = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)  # ValueError: a malformed chunk
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                    pass
                return b"".join(chunks)
            chunks.append(await reader.readexactly(size))
            if await reader.readexactly(2) != b"\r\n":
                raise Http1BrokenError("a chunk does not end with CRLF")
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise Http1BrokenError(f"malformed content-length {length!r}")
        return await reader.readexactly(int(length))
    return await reader.read()  # delimited by the server closing the connection

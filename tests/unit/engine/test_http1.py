"""`Http1Pool` against raw asyncio servers on loopback: framing (content-length, chunked, close-delimited),
keep-alive reuse and its limits, and failures before and after the request was written."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from gyre.engine.http1 import Http1BrokenError, Http1ConnectError, Http1Pool
from tests.support.eventually import eventually

Answer = Callable[[bytes], bytes | None]
"""Request head + body → raw answer bytes; None: hang up without answering."""


class RawServer:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                raw = self.answer(request)
                if raw is None:
                    break
                writer.write(raw)
                await writer.drain()
                if b"connection: close" in raw.lower():
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()


def _ok(body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body


@pytest.fixture
async def pools() -> AsyncIterator[Callable[..., Http1Pool]]:
    made: list[Http1Pool] = []

    def make(port: int, **kwargs: float) -> Http1Pool:
        made.append(Http1Pool("127.0.0.1", port, connect_timeout_s=1.0, **kwargs))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for pool in made:
        await pool.aclose()


async def test_the_request_is_written_whole_and_the_connection_kept(pools: Callable[..., Http1Pool]) -> None:
    async with RawServer(lambda request: _ok(b'{"ok": true}')) as server:
        pool = pools(server.port)
        for _ in range(3):
            assert await pool.request("POST", "/generate", b'{"a": 1}', "application/json", timeout_s=5) == (
                200,
                "OK",
                b'{"ok": true}',
            )
        assert server.connections == 1
        head, body = server.requests[0].split(b"\r\n\r\n")
        assert head.startswith(b"POST /generate HTTP/1.1\r\n") and b"content-type: application/json" in head
        assert body == b'{"a": 1}'


async def test_extra_headers_are_sent_and_malformed_ones_refused(pools: Callable[..., Http1Pool]) -> None:
    async with RawServer(lambda request: _ok(b"{}")) as server:
        pool = pools(server.port)
        answer = await pool.request(
            "POST", "/v1/messages", b"{}", "application/json", timeout_s=5, headers={"x-api-key": "k-1"}
        )
        assert answer == (200, "OK", b"{}")
        head = server.requests[0].split(b"\r\n\r\n")[0].split(b"\r\n")
        assert b"x-api-key: k-1" in head and b"content-type: application/json" in head
        for bad in ({"x-api-key": "k\r\nx-evil: 1"}, {"x-api-key:": "k"}, {"": "k"}):
            with pytest.raises(ValueError, match="malformed header"):
                await pool.request("POST", "/v1/messages", b"{}", None, timeout_s=5, headers=bad)
        assert len(server.requests) == 1 and server.connections == 1  # nothing was written for them


async def test_a_large_body_arrives_whole(pools: Callable[..., Http1Pool]) -> None:
    body = bytes(range(256)) * (3 << 12)  # 3 MB: written after the head and drained
    async with RawServer(lambda request: _ok(str(len(request.split(b"\r\n\r\n", 1)[1])).encode())) as server:
        pool = pools(server.port)
        assert await pool.request("POST", "/update", body, None, timeout_s=10) == (
            200,
            "OK",
            str(len(body)).encode(),
        )
        assert server.requests[0].endswith(body)


async def test_chunked_and_close_delimited_bodies(pools: Callable[..., Http1Pool]) -> None:
    chunked = b"HTTP/1.1 503 Service Unavailable\r\ntransfer-encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n1\r\n!\r\n0\r\n\r\n"
    async with RawServer(lambda request: chunked) as server:
        pool = pools(server.port)
        assert await pool.request("GET", "/", None, None, timeout_s=5) == (
            503,
            "Service Unavailable",
            b"hello!",
        )
        assert await pool.request("GET", "/", None, None, timeout_s=5) == (
            503,
            "Service Unavailable",
            b"hello!",
        )
        assert server.connections == 1  # a chunked answer leaves the connection reusable
    async with RawServer(
        lambda request: b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end"
    ) as server:
        pool = pools(server.port)
        assert (await pool.request("GET", "/", None, None, timeout_s=5))[2] == b"until the end"
        assert (await pool.request("GET", "/", None, None, timeout_s=5))[2] == b"until the end"
        assert server.connections == 2  # `connection: close` is not reused


async def test_answers_without_a_body_do_not_wait_for_one(pools: Callable[..., Http1Pool]) -> None:
    answers = {
        b"GET /empty": b"HTTP/1.1 204 No Content\r\n\r\n",
        b"GET /same": b"HTTP/1.1 304 Not Modified\r\netag: x\r\n\r\n",
        b"HEAD /": b"HTTP/1.1 200 OK\r\ncontent-length: 42\r\n\r\n",
    }
    async with RawServer(lambda request: answers[request.split(b" HTTP/")[0]]) as server:
        pool = pools(server.port)
        assert await pool.request("GET", "/empty", None, None, timeout_s=2) == (204, "No Content", b"")
        assert await pool.request("GET", "/same", None, None, timeout_s=2) == (304, "Not Modified", b"")
        assert await pool.request("HEAD", "/", None, None, timeout_s=2) == (200, "OK", b"")
        assert server.connections == 1  # each left the connection reusable


async def test_an_idle_connection_is_not_reused_past_idle_s(pools: Callable[..., Http1Pool]) -> None:
    async with RawServer(lambda request: _ok(b"x")) as server:
        pool = pools(server.port, idle_s=0.2)
        await pool.request("GET", "/", None, None, timeout_s=5)
        await asyncio.sleep(0.3)  # scenario: the connection stays idle past idle_s
        await pool.request("GET", "/", None, None, timeout_s=5)
        assert server.connections == 2


async def test_failures_before_and_after_the_request_left(pools: Callable[..., Http1Pool]) -> None:
    async with RawServer(lambda request: None) as server:  # hangs up on the request
        pool = pools(server.port)
        with pytest.raises(Http1BrokenError):
            await pool.request("POST", "/generate", b"{}", None, timeout_s=5)
        port = server.port
    with pytest.raises(Http1ConnectError):  # nothing listens any more
        await pools(port).request("POST", "/generate", b"{}", None, timeout_s=5)
    async with RawServer(lambda request: b"SPDY/3 200 OK\r\n\r\n") as server:
        with pytest.raises(Http1BrokenError, match="status line"):
            await pools(server.port).request("GET", "/", None, None, timeout_s=5)


async def test_a_timed_out_or_cancelled_request_closes_its_connection(
    pools: Callable[..., Http1Pool],
) -> None:
    answered = asyncio.Event()

    def slow(request: bytes) -> bytes:
        answered.set()
        return b""  # writes nothing: the answer never comes

    async with RawServer(slow) as server:
        pool = pools(server.port)
        with pytest.raises(TimeoutError):
            await pool.request("GET", "/", None, None, timeout_s=0.2)
        task: asyncio.Task[tuple[int, str, bytes]] = asyncio.create_task(
            pool.request("GET", "/", None, None, timeout_s=5)
        )
        await eventually(lambda: server.connections == 2, what="the second request's connection")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool._idle == [] and server.connections == 2

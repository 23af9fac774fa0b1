"""Client transport rules against a real HTTP server on loopback (aiohttp.web, answering as scripted): retries
on failed connects only, HTTP → exception mapping, and normalization of cumulative and incremental streams."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web

from gyre.engine import (
    EngineClient,
    EngineConflict,
    EngineNotFound,
    EngineRequestError,
    EngineServerError,
    EngineTimeout,
    EngineUnavailable,
)
from gyre.engine.types import StreamAccumulator

OK_BODY = {"text": "hi", "output_ids": [104, 105], "meta_info": {"id": "r", "completion_tokens": 2}}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Scripted:
    """An HTTP server on 127.0.0.1 whose every request `handler` answers; it counts the requests."""

    def __init__(self, handler: Handler, port: int | None = None) -> None:
        self.handler, self.port, self.requests = handler, port or _free_port(), 0
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        return await self.handler(request)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def client(self, **kwargs: Any) -> EngineClient:
        return EngineClient(f"http://127.0.0.1:{self.port}", retry_backoff_s=0.0, **kwargs)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[Scripted]]]:
    servers: list[Scripted] = []

    async def start(handler: Handler) -> Scripted:
        server = Scripted(handler)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


def _json(body: Any, status: int = 200) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        if body is None:
            return web.Response(status=status, text="Internal Server Error")
        return web.json_response(body, status=status)

    return handler


async def test_failed_connects_are_retried_until_the_server_listens() -> None:
    server = Scripted(_json(OK_BODY))
    client = EngineClient(f"http://127.0.0.1:{server.port}", max_connect_retries=6, retry_backoff_s=0.05)
    try:
        request = asyncio.create_task(client.generate([1]))
        await asyncio.sleep(0.3)  # scenario: refused at first, nothing listens yet
        assert not request.done()
        await server.start()
        result = await request
        assert result.output_ids == [104, 105] and server.requests == 1
    finally:
        await client.aclose()
        await server.stop()


async def test_connects_give_up_after_the_retry_budget() -> None:
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens
    async with EngineClient(url, max_connect_retries=2, retry_backoff_s=0.1) as client:
        start = time.monotonic()
        with pytest.raises(EngineUnavailable, match="cannot connect"):
            await client.generate([1])
        assert time.monotonic() - start >= 0.1 + 0.2  # two retries, with their backoff
    async with EngineClient(url, max_connect_retries=0) as client:
        assert not await client.health()


async def test_a_read_timeout_is_not_retried(serve: Any) -> None:
    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(5)  # scenario: a server slower than the read timeout
        return web.json_response(OK_BODY)

    server = await serve(slow)
    async with server.client(max_connect_retries=5) as client:
        with pytest.raises(EngineTimeout):
            await client.generate([1], timeout_s=0.3)
    assert server.requests == 1


async def test_a_connection_lost_after_the_request_was_sent_is_not_retried(serve: Any) -> None:
    async def hang_up(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.abort()
        await asyncio.sleep(1)  # scenario: it hung up and answers nothing
        return web.Response()

    server = await serve(hang_up)
    async with server.client(max_connect_retries=5) as client:
        with pytest.raises(EngineUnavailable, match="connection failed"):
            await client.generate([1])
    assert server.requests == 1


@pytest.mark.parametrize(
    ("status", "body", "cls", "message"),
    [
        (400, {"error": {"message": "top_p must be in (0, 1]"}}, EngineRequestError, "top_p"),
        (
            400,
            {"object": "error", "message": "not JSON", "type": "Bad Request", "code": 400},
            EngineRequestError,
            "JSON",
        ),
        (404, {"detail": "Not Found"}, EngineNotFound, "Not Found"),
        (409, {"error": {"message": "weight version"}}, EngineConflict, "weight version"),
        (503, {"error": {"message": "released"}}, EngineUnavailable, "released"),
        (500, None, EngineServerError, "Internal"),
    ],
)
async def test_http_errors_map_to_one_class_each(
    serve: Any, status: int, body: Any, cls: type[Exception], message: str
) -> None:
    server = await serve(_json(body, status))
    async with server.client() as client:
        with pytest.raises(cls, match=message) as info:
            await client.generate([1])
        assert info.value.status_code == status  # type: ignore[attr-defined]
        with pytest.raises(cls, match=message):  # a streamed request maps the same
            async for _ in client.generate_stream([1]):
                pass


async def test_flush_cache_reports_a_refusal_as_false(serve: Any) -> None:
    async def flush(request: web.Request) -> web.StreamResponse:
        return web.Response(status=400 if server.requests == 1 else 200, text="Cache flushed.")

    server = await serve(flush)
    async with server.client() as client:
        assert not await client.flush_cache()
        assert await client.flush_cache()


def _sse(*events: bytes) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await response.write(event)
        await response.write_eof()
        return response

    return handler


async def test_stream_error_events_raise(serve: Any) -> None:
    server = await serve(_sse(b'data: {"error": {"message": "bad input"}}\n\n', b"data: [DONE]\n\n"))
    async with server.client() as client:
        with pytest.raises(EngineRequestError, match="bad input"):
            async for _ in client.generate_stream([1]):
                pass


async def test_a_stream_cut_mid_event_is_a_broken_stream(serve: Any) -> None:
    first = orjson.dumps(_event("a", [10], 1, [-0.1]))
    server = await serve(_sse(b"data: " + first + b"\n\n", b'data: {"text": "b", "outp'))
    async with server.client() as client:
        seen = []
        with pytest.raises(EngineUnavailable, match="mid-event"):
            async for chunk in client.generate_stream([1]):
                seen.append(chunk.new_output_ids)
        assert seen == [[10]]


async def test_a_long_event_line_is_read_whole(serve: Any) -> None:
    ids = list(range(60_000))  # ~0.5 MB of one data line: SGLang's cumulative events grow with the output
    event = orjson.dumps(_event("x" * 60_000, ids, len(ids), [-0.5] * len(ids), done=True))
    server = await serve(_sse(b"data: " + event + b"\n\n", b"data: [DONE]\n\n"))
    async with server.client() as client:
        chunks = [c async for c in client.generate_stream([1])]
    assert chunks[-1].finished and chunks[-1].to_result().output_ids == ids


def _event(
    text: str, ids: list[int], completion: int, logprobs: list[float], done: bool = False
) -> dict[str, Any]:
    return {
        "text": text,
        "output_ids": ids,
        "meta_info": {
            "id": "r",
            "completion_tokens": completion,
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(logprobs, ids, strict=True)],
            "finish_reason": {"type": "length", "length": completion} if done else None,
        },
    }


@pytest.mark.parametrize("incremental", [True, False])
def test_stream_accumulator_normalizes_both_server_modes(incremental: bool) -> None:
    tokens, logprobs, texts = [10, 11, 12, 13], [-0.1, -0.2, -0.3, -0.4], ["a", "b", "cd", "e"]
    acc = StreamAccumulator()
    chunks = []
    for i, (step, size) in enumerate([(0, 1), (1, 2), (3, 1)]):
        end = step + size
        done = i == 2
        if incremental:
            event = _event("".join(texts[step:end]), tokens[step:end], end, logprobs[step:end], done)
        else:
            event = _event("".join(texts[:end]), tokens[:end], end, logprobs[:end], done)
        chunks.append(acc.accept(orjson.loads(orjson.dumps(event))))
    assert [c.new_output_ids for c in chunks] == [[10], [11, 12], [13]]
    assert [c.new_logprobs for c in chunks] == [[-0.1], [-0.2, -0.3], [-0.4]]
    assert [c.new_text for c in chunks] == ["a", "bcd", "e"]
    assert chunks[-1].finished and chunks[-1].to_result().output_ids == tokens
    assert chunks[-1].text == "abcde"


def test_tensor_encodings_round_trip() -> None:
    import base64
    import pickle

    import torch

    from gyre.engine.tensor_codec import (
        decode_safetensors_b64,
        encode_sglang_b64,
        update_weights_payload,
    )

    tensors = {"norm.weight": torch.arange(4.0), "embed.weight": torch.ones(2, 3)}
    body = update_weights_payload(tensors, encoding="safetensors", tp_size=2, weight_version="4")
    assert body["load_format"] == "safetensors" and body["weight_version"] == "4"
    assert len(body["serialized_named_tensors"]) == 2  # one per tensor-parallel rank, as SGLang expects
    decoded = decode_safetensors_b64(body["serialized_named_tensors"][0])
    assert all(torch.equal(decoded[k], v) for k, v in tensors.items())
    # SGLang's MultiprocessingSerializer format: a ForkingPickler dump of [(name, tensor), ...], whose
    # storages are copies in named shared memory (rebuilt by file name, as SGLang's unpickler allows),
    # held in `keep` until the server has read them.
    keep: list[torch.Tensor] = []
    payload = encode_sglang_b64(tensors, keep)
    assert b"rebuild_storage_filename" in base64.b64decode(payload)
    named = pickle.loads(base64.b64decode(payload))
    assert [n for n, _ in named] == list(tensors) and torch.equal(named[0][1], tensors["norm.weight"])
    assert len(keep) == 2 and keep[0].data_ptr() != tensors["norm.weight"].data_ptr()
    assert torch.multiprocessing.get_sharing_strategy() == "file_descriptor"  # restored
    assert update_weights_payload(tensors, encoding="sglang", keep=[])["load_format"] is None
    with pytest.raises(ValueError, match="pass `keep`"):
        update_weights_payload(tensors, encoding="sglang")
    with pytest.raises(ValueError, match="unknown tensor encoding"):
        update_weights_payload(tensors, encoding="pickle5")

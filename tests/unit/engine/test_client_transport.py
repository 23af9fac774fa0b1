"""Client transport rules without a server: retries on failed connects only, HTTP → exception
mapping, and normalization of cumulative and incremental streams."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

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


def client_with(handler: Any, **kwargs: Any) -> EngineClient:
    http = httpx.AsyncClient(base_url="http://engine", transport=httpx.MockTransport(handler))
    return EngineClient("http://engine", http=http, retry_backoff_s=0.0, **kwargs)


async def test_failed_connects_are_retried_then_succeed() -> None:
    attempts = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json=OK_BODY)

    result = await client_with(handler, max_connect_retries=3).generate([1])
    assert attempts == 3 and result.output_ids == [104, 105]


async def test_connects_give_up_after_the_retry_budget() -> None:
    attempts = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal attempts
        attempts += 1
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(EngineUnavailable, match="cannot connect"):
        await client_with(handler, max_connect_retries=2).generate([1])
    assert attempts == 3
    assert not await client_with(handler, max_connect_retries=0).health()


@pytest.mark.parametrize("error", [httpx.ReadTimeout, httpx.ReadError])
async def test_errors_after_the_request_was_sent_are_not_retried(error: type[Exception]) -> None:
    attempts = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal attempts
        attempts += 1
        raise error("lost", request=request)  # type: ignore[call-arg]

    with pytest.raises(EngineTimeout if error is httpx.ReadTimeout else EngineUnavailable):
        await client_with(handler, max_connect_retries=5).generate([1])
    assert attempts == 1


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
    status: int, body: Any, cls: type[Exception], message: str
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if body is None:
            return httpx.Response(status, text="Internal Server Error")
        return httpx.Response(status, json=body)

    with pytest.raises(cls, match=message) as info:
        await client_with(handler).generate([1])
    assert info.value.status_code == status  # type: ignore[attr-defined]


async def test_flush_cache_reports_a_refusal_as_false() -> None:
    assert not await client_with(lambda r: httpx.Response(400, text="Cache flushed.")).flush_cache()
    assert await client_with(lambda r: httpx.Response(200, text="Cache flushed.")).flush_cache()


async def test_stream_error_events_raise() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        events = b'data: {"error": {"message": "bad input"}}\n\ndata: [DONE]\n\n'
        return httpx.Response(200, content=events, headers={"content-type": "text/event-stream"})

    with pytest.raises(EngineRequestError, match="bad input"):
        async for _ in client_with(handler).generate_stream([1]):
            pass


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
    # SGLang's MultiprocessingSerializer format: a ForkingPickler dump of [(name, tensor), ...].
    named = pickle.loads(base64.b64decode(encode_sglang_b64(tensors)))
    assert [n for n, _ in named] == list(tensors) and torch.equal(named[0][1], tensors["norm.weight"])
    assert update_weights_payload(tensors, encoding="sglang")["load_format"] is None
    with pytest.raises(ValueError, match="unknown tensor encoding"):
        update_weights_payload(tensors, encoding="pickle5")

"""The proxy's HTTP contract: per-execution keys (401, 403, isolation), refusals in the caller's
own format that record nothing (400, 413), probes and metrics, the record written before the
response completes, an engine outage answered 529/503 without a record, and the gRPC errors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from app.stack.servers import ServerProcess
from gyre.v1 import common_pb2, proxy_pb2
from tests.support.proxy_stack import ProxyStack, proxy_stack, scripted_engine

pytestmark = pytest.mark.slow
MESSAGES = {"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def stack(
    nats_server: ServerProcess, redis_server: ServerProcess, tmp_path: Path, run_id: str
) -> AsyncIterator[ProxyStack]:
    async with proxy_stack(
        nats_server.url,
        redis_server.url,
        tmp_path,
        run_id,
        {"cell-0": scripted_engine()},
        # An unreachable engine is waited for 0.5 s, not the default 30 s (a restarting cell's engine is
        # back within seconds; no engine here restarts): the outage test then takes ~1 s, not ~60 s.
        proxy={
            "max_body_bytes": 64 * 1024,
            "max_engine_attempts": 2,
            "retry_backoff_s": 0.01,
            "unreachable_wait_s": 0.5,
        },
    ) as s:
        yield s


async def post(stack: ProxyStack, path: str, body: Any, key: str | None, **kw: Any) -> httpx.Response:
    headers = {"x-api-key": key} if key else {}
    return await stack.http.post(f"{stack.base_url}{path}", json=body, headers=headers, **kw)


async def stored_nodes(stack: ProxyStack, execution_id: str) -> int:
    return await stack.service.core.store.num_nodes(execution_id)


async def test_a_key_reaches_only_its_own_execution(stack: ProxyStack) -> None:
    k1, k2 = await stack.open("e1"), await stack.open("e2")
    await stack.script("cell-0", ["one<|im_end|>", "two<|im_end|>"])
    assert (await post(stack, "/v1/messages", MESSAGES, k1)).status_code == 200
    bearer = {"authorization": f"Bearer {k2}"}
    r = await stack.http.post(f"{stack.base_url}/v1/chat/completions", json=CHAT, headers=bearer)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "two"
    assert await stored_nodes(stack, "e1") == 3 and await stored_nodes(stack, "e2") == 3
    assert [n.meta.request_id for n in stack.tree("e1").leaves()] != [  # type: ignore[union-attr]
        n.meta.request_id
        for n in stack.tree("e2").leaves()  # type: ignore[union-attr]
    ]


async def test_unknown_or_missing_keys_are_401_in_the_callers_format(stack: ProxyStack) -> None:
    r = await post(stack, "/v1/messages", MESSAGES, "gyre-not-a-key")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = await post(stack, "/v1/messages", MESSAGES, None)
    assert r.status_code == 401 and r.json()["type"] == "error"
    r = await post(stack, "/v1/chat/completions", CHAT, "sk-other")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = await post(stack, "/v1/responses", {"model": "m", "input": "hi"}, None)
    assert r.status_code == 401 and "error" in r.json()


async def test_a_closed_execution_answers_403_and_records_nothing(stack: ProxyStack) -> None:
    key = await stack.open("e1")
    await stack.script("cell-0", ["done<|im_end|>"])
    assert (await post(stack, "/v1/messages", MESSAGES, key)).status_code == 200
    closed = await stack.close("e1")
    assert (closed.num_calls, closed.num_nodes, closed.num_sampled_tokens) == (1, 3, 5)
    assert await stack.service.core.store.is_closed("e1")
    r = await post(stack, "/v1/messages", {**MESSAGES, "stream": True}, key)
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    r = await post(stack, "/v1/messages/count_tokens", MESSAGES, key)
    assert r.status_code == 403
    assert await stored_nodes(stack, "e1") == 3
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.open("e1")
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (await stack.stats()).open_executions == 0


async def test_refused_requests_are_4xx_in_the_callers_format_and_record_nothing(stack: ProxyStack) -> None:
    key = await stack.open("e1")
    big = {**MESSAGES, "messages": [{"role": "user", "content": "x" * 70_000}]}
    r = await post(stack, "/v1/messages", big, key)
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"

    async def chunked() -> AsyncIterator[bytes]:  # no content-length: counted while read
        yield b'{"model": "m", "messages": [{"role": "user", "content": "'
        for _ in range(20):
            yield b"y" * 4096
        yield b'"}]}'

    r = await stack.http.post(
        f"{stack.base_url}/v1/chat/completions", content=chunked(), headers={"x-api-key": key}
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = await stack.http.post(
        f"{stack.base_url}/v1/messages", content=b"{not json", headers={"x-api-key": key}
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = await post(stack, "/v1/messages", {**MESSAGES, "messages": "hi"}, key)
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    r = await post(stack, "/v1/chat/completions", {"model": "m", "messages": [{"role": "wizard"}]}, key)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].role"
    r = await post(
        stack,
        "/v1/responses",
        {
            "model": "m",
            "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}
            ],
        },
        key,
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = await post(stack, "/v1/messages", {**MESSAGES, "max_tokens": 0}, key)
    assert r.status_code == 400
    r = await post(
        stack,
        "/v1/messages",
        {**MESSAGES, "messages": [*MESSAGES["messages"], {"role": "assistant", "content": "pre"}]},
        key,
    )
    assert r.status_code == 400
    assert await stored_nodes(stack, "e1") == 0 and not stack.tree("e1").nodes
    stats = await stack.stats()
    assert stats.client_errors == 8 and stats.server_errors == 0
    # every refusal is a refused model call, by reason, with its latest message (no silent runs)
    assert sum(stats.refused_calls.values()) == 8, dict(stats.refused_calls)
    assert stats.refused_calls["body_too_large"] == 2 and stats.refused_calls["invalid_request"] == 6
    assert set(stats.refusal_messages) == set(stats.refused_calls) and all(stats.refusal_messages.values())
    assert stats.chat_template.source == "model" and stats.chat_template.name.startswith("hf-")

    await stack.script("cell-0", ["fine<|im_end|>"])
    newer = {
        **MESSAGES,
        "future_field": {"nested": [1, 2]},
        "metadata": {"user_id": "u"},
        "thinking": {"type": "adaptive"},
    }
    r = await post(stack, "/v1/messages?beta=true", newer, key)
    assert r.status_code == 200 and r.json()["content"] == [{"type": "text", "text": "fine"}]


async def test_probes_metrics_and_unknown_paths(stack: ProxyStack) -> None:
    for path in ("/", "/api/hello"):
        assert (await stack.http.head(f"{stack.base_url}{path}")).status_code == 200
    key = await stack.open("e1")
    await stack.script("cell-0", ["ok<|im_end|>"])
    await post(stack, "/v1/messages", MESSAGES, key)
    text = (await stack.http.get(f"{stack.base_url}/metrics")).text
    for series in (
        'gyre_proxy_requests_total{api="anthropic",status="200"} 1.0',
        "gyre_proxy_overhead_seconds_bucket",
        "gyre_proxy_prompt_tokens_total",
        "gyre_proxy_output_tokens_total 3.0",
        "gyre_proxy_rerouted_calls_total 0.0",
        "gyre_proxy_open_executions 1.0",
    ):
        assert series in text, series
    r = await stack.http.post(f"{stack.base_url}/v1/embeddings", json={})
    assert r.status_code == 404 and "error" in r.json()
    r = await stack.http.get(f"{stack.base_url}/v1/messages")
    assert r.status_code == 405 and r.json()["type"] == "error"


async def test_the_record_is_in_redis_before_the_stream_ends(stack: ProxyStack) -> None:
    key = await stack.open("e1")
    await stack.script("cell-0", [{"text": "slow words<|im_end|>", "token_interval_s": 0.01}])
    seen: list[tuple[str, int]] = []
    async with stack.http.stream(
        "POST", f"{stack.base_url}/v1/messages", json={**MESSAGES, "stream": True}, headers={"x-api-key": key}
    ) as response:
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                seen.append((line[7:], await stored_nodes(stack, "e1")))
    events = [e for e, _ in seen]
    assert events[:2] == ["message_start", "ping"] and events[-2:] == ["message_delta", "message_stop"]
    assert dict(seen)["message_delta"] == 3  # root, user message, output: stored before the final events


async def test_an_engine_outage_is_overloaded_and_records_nothing(stack: ProxyStack) -> None:
    key = await stack.open("e1")
    await stack.stub.UpdateRoutes(
        proxy_pb2.UpdateRoutesRequest(
            engines=[common_pb2.EngineEndpoint(engine_id="gone", url="http://127.0.0.1:9", cell=0)],
            default_engine_id="gone",
        )
    )
    r = await post(stack, "/v1/messages", MESSAGES, key)
    assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"
    r = await post(stack, "/v1/chat/completions", {**CHAT, "stream": True}, key)
    assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
    assert await stored_nodes(stack, "e1") == 0
    stats = await stack.stats()
    assert stats.server_errors == 2 and dict(stats.refused_calls) == {"engine_unavailable": 2}


async def test_grpc_refusals(stack: ProxyStack) -> None:
    stub = stack.stub
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.OpenExecution(
            proxy_pb2.OpenExecutionRequest(
                execution=common_pb2.ExecutionRef(execution_id="e1"), profile="nope"
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "claude_code" in (
        err.value.details() or ""
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.OpenExecution(proxy_pb2.OpenExecutionRequest())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.close("never-opened")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Drain(proxy_pb2.DrainRequest(engine_id="cell-9"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    # The only engine may drain while nothing is in flight (nothing to move); with calls in flight
    # and nowhere to go it is refused (tests/unit/proxy/test_routing.py).
    drained = await stub.Drain(proxy_pb2.DrainRequest(engine_id="cell-0"))
    assert drained.calls_rerouted == 0 and drained.executions_moved == 0


async def test_closing_an_execution_stops_its_call_in_flight(stack: ProxyStack) -> None:
    key = await stack.open("e1")
    await stack.script("cell-0", [{"text": "x" * 400 + "<|im_end|>", "token_interval_s": 0.01}])
    events: list[str] = []
    async with stack.http.stream(
        "POST", f"{stack.base_url}/v1/messages", json={**MESSAGES, "stream": True}, headers={"x-api-key": key}
    ) as response:
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                events.append(line[7:])
            if events == ["message_start", "ping"]:
                await stack.close("e1")
    assert events[-1] == "error" and "message_stop" not in events
    assert await stored_nodes(stack, "e1") == 0
    assert stack.engines["cell-0"].core.num_running == 0

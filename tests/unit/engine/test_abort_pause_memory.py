"""Acceptance: abort and pause semantics (SGLang's three modes), flush, memory release and resume."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gyre.engine import EngineClient, EngineRequestError
from tests.support.eventually import eventually
from tests.unit.engine.helpers import (
    engine_section,
    engine_stats,
    max_logprob_error,
    prompt,
    serve,
    small_model,
)

LONG = {"max_new_tokens": 900, "ignore_eos": True}


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    await eventually(check, what="the engine's state")


async def running(client: EngineClient, n: int = 1, min_steps: int = 2) -> None:
    async def ok() -> bool:
        s = await engine_stats(client)
        return bool(s["num_running_reqs"] == n and s["num_steps"] >= min_steps)

    await until(ok)


async def test_abort_returns_abort_with_the_output_so_far_and_frees_kv() -> None:
    async with serve() as (_, client):
        task = asyncio.create_task(client.generate(prompt(30, 0), LONG, rid="victim"))
        await running(client)
        assert (await engine_stats(client))["kv_blocks_in_use"] > 0
        await client.abort("victim")
        result = await task
        assert result.finish_reason is not None and result.finish_reason.type == "abort"
        assert 0 < result.completion_tokens < 900 and len(result.output_logprobs) == result.completion_tokens
        stats = await engine_stats(client)
        assert stats["kv_blocks_in_use"] == 0 and stats["num_running_reqs"] == 0


async def test_abort_all_and_abort_of_a_queued_request() -> None:
    async with serve() as (_, client):
        await client.pause_generation("in_place")
        queued = asyncio.create_task(client.generate(prompt(5, 1), LONG, rid="queued"))
        await until(lambda: _stat_is(client, "num_waiting_reqs", 1))
        await client.abort("queued")
        result = await queued
        assert result.finish_reason.type == "abort" and result.completion_tokens == 0  # type: ignore[union-attr]
        await client.continue_generation()
        tasks = [asyncio.create_task(client.generate(prompt(5, i), LONG)) for i in range(3)]
        await running(client, n=3)
        await client.abort(abort_all=True)
        assert all(r.finish_reason.type == "abort" for r in await asyncio.gather(*tasks))  # type: ignore[union-attr]
        assert (await engine_stats(client))["kv_blocks_in_use"] == 0


async def _stat_is(client: EngineClient, key: str, value: Any) -> bool:
    return bool((await engine_stats(client))[key] == value)


async def test_pause_abort_aborts_in_flight_and_queues_new_requests_until_continue() -> None:
    async with serve() as (_, client):
        first = asyncio.create_task(client.generate(prompt(10, 0), LONG))
        await running(client)
        await client.pause_generation("abort")
        assert (await first).finish_reason.type == "abort"  # type: ignore[union-attr]
        later = asyncio.create_task(client.generate(prompt(10, 1), {"max_new_tokens": 5, "ignore_eos": True}))
        await until(lambda: _stat_is(client, "num_waiting_reqs", 1))
        assert not later.done()
        await client.continue_generation()
        assert (await later).completion_tokens == 5


async def test_pause_in_place_keeps_kv_and_continues_exactly() -> None:
    model = small_model()
    ids = prompt(20, 2)
    async with serve(model=model) as (_, client):
        task = asyncio.create_task(client.generate(ids, {"max_new_tokens": 200, "ignore_eos": True}))
        await running(client)
        await client.pause_generation("in_place")
        frozen = await engine_stats(client)
        await asyncio.sleep(0.05)  # scenario: a paused engine takes no step meanwhile
        again = await engine_stats(client)
        assert frozen["num_steps"] == again["num_steps"] and again["num_running_reqs"] == 1
        assert again["kv_blocks_in_use"] > 0
        assert not await client.flush_cache()  # SGLang refuses while requests hold KV
        await client.continue_generation()
        result = await task
        assert result.completion_tokens == 200 and max_logprob_error(model, ids, result, 1.0) <= 1e-4
        assert await client.flush_cache()
        assert (await engine_stats(client))["kv_blocks_cached"] == 0


async def test_pause_retract_frees_kv_and_recomputes_exactly_on_continue() -> None:
    model = small_model()
    ids = prompt(20, 3)
    async with serve(model=model) as (_, client):
        task = asyncio.create_task(client.generate(ids, {"max_new_tokens": 150, "ignore_eos": True}))
        await running(client, min_steps=5)
        await client.pause_generation("retract")
        stats = await engine_stats(client)
        assert (
            stats["num_running_reqs"] == 0
            and stats["num_waiting_reqs"] == 1
            and stats["kv_blocks_in_use"] == 0
        )
        await client.continue_generation()
        result = await task
        assert result.completion_tokens == 150 and max_logprob_error(model, ids, result, 1.0) <= 1e-4


async def test_pause_rejects_an_unknown_mode() -> None:
    async with serve() as (_, client):
        response = await client.request("POST", "/pause_generation", json={"mode": "sideways"})
        assert response.status_code == 400 and "Invalid mode" in response.json()["error"]["message"]


async def test_release_and_resume_memory_without_backup_needs_new_weights() -> None:
    new = small_model(seed=4)
    ids = prompt(12, 4)
    async with serve() as (_, client):
        blocker = asyncio.create_task(client.generate(prompt(5, 0), LONG))
        await running(client)
        with pytest.raises(EngineRequestError, match="hold KV"):
            await client.release_memory_occupation()
        await client.abort(abort_all=True)
        await blocker
        await client.release_memory_occupation()
        assert not await client.health()
        stats = await engine_stats(client)
        assert stats["kv_resident"] == 0 and stats["weights_resident"] == 0
        queued = asyncio.create_task(client.generate(ids, {"max_new_tokens": 4}))
        await until(lambda: _stat_is(client, "num_waiting_reqs", 1))
        await client.resume_memory_occupation(["kv_cache"])
        await client.resume_memory_occupation(["weights"])
        assert not await client.health()  # resident again, but holding no weights yet
        assert not queued.done()
        await client.update_weights_from_tensor(dict(new.named_parameters()), weight_version="2")
        result = await queued
        assert await client.health() and await client.health_generate()
        assert result.weight_version == "2" and max_logprob_error(new, ids, result, 1.0) <= 1e-4


async def test_release_weights_with_cpu_backup_restores_them() -> None:
    model = small_model(seed=5)
    ids = prompt(12, 5)
    async with serve(engine_section(weights_cpu_backup=True), model=model) as (_, client):
        await client.release_memory_occupation(["weights"])
        assert (await engine_stats(client))["kv_resident"] == 1
        await client.resume_memory_occupation(["weights"])
        result = await client.generate(ids, {"max_new_tokens": 4})
        assert max_logprob_error(model, ids, result, 1.0) <= 1e-4
        with pytest.raises(EngineRequestError, match="memory tags"):
            await client.release_memory_occupation(["cuda_graph_everything"])


async def test_closing_a_stream_aborts_its_request() -> None:
    async with serve() as (_, client):
        stream = client.generate_stream(prompt(8, 6), LONG, rid="streamed")
        chunks = 0
        async for chunk in stream:
            chunks += 1
            assert not chunk.finished
            if chunks == 3:
                break
        await stream.aclose()  # type: ignore[attr-defined]
        await until(lambda: _stat_is(client, "num_running_reqs", 0))
        assert (await engine_stats(client))["kv_blocks_in_use"] == 0

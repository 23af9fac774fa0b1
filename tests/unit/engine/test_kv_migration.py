"""Acceptance: KV pinned on one engine, exported, imported on another; the destination continues the
same input exactly and without recomputing the covered prefix."""

from __future__ import annotations

import asyncio

import pytest

from gyre.engine import EngineConflict, EngineNotFound
from gyre.engine.migration import migrate_request_kv
from tests.support.eventually import eventually
from tests.unit.engine.helpers import (
    engine_section,
    engine_stats,
    max_logprob_error,
    prompt,
    serve,
    small_model,
)


async def _wait_steps(client: object, n: int) -> None:
    async def stepped() -> bool:
        return bool((await engine_stats(client))["num_steps"] >= n)  # type: ignore[arg-type]

    await eventually(stepped, what=f"{n} engine steps")


async def test_imported_kv_continues_exactly_without_recompute() -> None:
    model = small_model()
    section = engine_section(max_prefill_tokens=16)
    async with serve(section, model=model) as (_, source), serve(section, model=model) as (_, destination):
        ids = prompt(70, seed=11)
        task = asyncio.create_task(
            source.generate(ids, {"max_new_tokens": 400, "ignore_eos": True}, rid="m1")
        )
        await _wait_steps(source, 10)
        moved = await migrate_request_kv(source, destination, "m1")
        aborted = await task
        assert aborted.finish_reason is not None and aborted.finish_reason.type == "abort"
        assert moved.num_tokens == moved.pinned_tokens >= 70 and moved.reason is None
        source_stats = await engine_stats(source)
        assert source_stats["kv_pins"] == 0 and source_stats["kv_blocks_in_use"] == 0

        continued = [*ids, *aborted.output_ids]  # the proxy re-sends prompt + output so far
        before = (await engine_stats(destination))["num_steps"]
        result = await destination.generate(continued, {"max_new_tokens": 20, "ignore_eos": True})
        steps = (await engine_stats(destination))["num_steps"] - before
        assert result.cached_tokens == moved.num_tokens
        # Only the tokens produced after the pin are prefilled (16 per step), then 19 decode steps;
        # recomputing the whole prefix would have cost len(continued) / 16 prefill steps.
        uncovered = len(continued) - moved.num_tokens
        assert steps == -(-uncovered // 16) + 19
        assert uncovered < len(continued) // 4
        assert max_logprob_error(model, continued, result, 1.0) <= 1e-4


async def test_kv_of_another_weight_version_or_model_is_refused() -> None:
    model = small_model()
    async with (
        serve(model=model) as (_, source),
        serve(engine_section(weight_version="9"), model=model) as (_, other_version),
        serve(engine_section(output_source="scripted"), script=[{"text": "hi"}]) as (_, scripted),
    ):
        task = asyncio.create_task(
            source.generate(prompt(30, 1), {"max_new_tokens": 400, "ignore_eos": True}, rid="x")
        )
        await _wait_steps(source, 3)
        pin = await source.pin_kv("x")
        blob = await source.export_kv(pin.handle)
        with pytest.raises(EngineConflict, match="weight version"):
            await other_version.import_kv(blob)
        with pytest.raises(EngineConflict, match="scripted"):
            await scripted.import_kv(blob)
        await source.release_kv(pin.handle)
        with pytest.raises(EngineNotFound):
            await source.export_kv(pin.handle)
        with pytest.raises(EngineNotFound):
            await source.release_kv(pin.handle)
        moved = await migrate_request_kv(source, other_version, "x")
        assert moved.num_tokens == 0 and moved.pinned_tokens > 0 and "weight version" in (moved.reason or "")
        await task
        with pytest.raises(EngineNotFound):
            await source.pin_kv("x")  # finished: nothing in flight to pin
        assert (await engine_stats(source))["kv_pins"] == 0

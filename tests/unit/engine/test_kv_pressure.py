"""A KV pool smaller than the batch needs: the youngest request is retracted and recomputed from the
prefix cache, every request still completes exactly; a request larger than the pool fails fast."""

from __future__ import annotations

import asyncio

import pytest

from gyre.engine import EngineUnavailable
from tests.unit.engine.helpers import (
    engine_section,
    engine_stats,
    max_logprob_error,
    prompt,
    serve,
    small_model,
)


async def test_kv_pressure_retracts_and_still_completes_exactly() -> None:
    model = small_model()
    section = engine_section(kv_cache_tokens=128, block_size=16)  # 8 blocks
    cases = [prompt(20, seed=i) for i in range(3)]  # each needs 4 blocks by the end: 12 > 8
    async with serve(section, model=model) as (_, client):
        results = await asyncio.gather(
            *(client.generate(ids, {"max_new_tokens": 40, "ignore_eos": True}) for ids in cases)
        )
        stats = await engine_stats(client)
    for ids, result in zip(cases, results, strict=True):
        assert result.completion_tokens == 40
        assert max_logprob_error(model, ids, result, 1.0) <= 1e-4
    assert stats["kv_blocks_in_use"] == 0 and stats["num_retractions"] > 0
    assert sum(r.meta_info["num_retractions"] for r in results) == stats["num_retractions"]


async def test_a_request_larger_than_the_pool_fails_instead_of_waiting_forever() -> None:
    async with serve(engine_section(kv_cache_tokens=128, block_size=16)) as (_, client):
        with pytest.raises(EngineUnavailable, match="kv_cache_tokens"):
            await client.generate(prompt(200, seed=0), {"max_new_tokens": 4})
        with pytest.raises(EngineUnavailable, match="cannot hold"):
            await client.generate(prompt(100, seed=1), {"max_new_tokens": 100, "ignore_eos": True})
        assert (
            await client.generate(prompt(10, seed=2), {"max_new_tokens": 4, "ignore_eos": True})
        ).completion_tokens == 4

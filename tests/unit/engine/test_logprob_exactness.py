"""Acceptance: reported log-probs equal a fresh full forward (≤ 1e-4) under continuous batching,
chunked prefill and prefix-cache hits."""

from __future__ import annotations

import asyncio

import torch

from gyre.engine import EngineClient
from gyre.model.logprobs import effective_temperature
from tests.support.eventually import eventually
from tests.unit.engine.helpers import (
    engine_section,
    engine_stats,
    max_logprob_error,
    prompt,
    serve,
    small_model,
)

TOL = 1e-4


async def _waiting_at_least(client: EngineClient, n: int) -> bool:
    return bool((await engine_stats(client))["num_waiting_reqs"] >= n)


async def test_logprobs_are_exact_under_continuous_batching() -> None:
    model = small_model()
    # A small prefill budget forces chunked prefill interleaved with other requests' decode steps.
    section = engine_section(max_batch_size=8, max_prefill_tokens=24)
    cases = [
        (prompt(5 + 9 * i, seed=i), {"temperature": t, "max_new_tokens": 20, "ignore_eos": True, **extra})
        for i, (t, extra) in enumerate(
            [
                (1.0, {}),
                (0.7, {}),
                (1.3, {"top_p": 0.9}),
                (0.0, {}),
                (0.9, {"top_k": 20}),
                (1.0, {"min_p": 0.05}),
                (0.5, {}),
                (1.1, {"sampling_seed": 7}),
            ]
        )
    ]
    async with serve(section, model=model) as (_, client):

        async def one(i: int) -> object:
            ids, params = cases[i]
            return await client.generate(ids, params, rid=f"r{i}")

        async def late(i: int) -> object:
            await asyncio.sleep(0.01 * i)  # scenario: staggered arrivals join a running batch
            return await one(i)

        # The first half is queued while the engine is paused and starts together, so steps are shared
        # however fast each request would run alone; the second half arrives while they run.
        await client.pause_generation("in_place")
        first = [asyncio.ensure_future(one(i)) for i in range(4)]
        await eventually(lambda: _waiting_at_least(client, 4), timeout_s=30, what="4 requests queued")
        await client.continue_generation()
        results = await asyncio.gather(*first, *(late(i) for i in range(4, len(cases))))
        stats = await engine_stats(client)
    total_tokens = 0
    for (ids, params), result in zip(cases, results, strict=True):
        assert result.completion_tokens == 20 and result.finish_reason.type == "length"  # type: ignore[attr-defined]
        err = max_logprob_error(model, ids, result, effective_temperature(float(params["temperature"])))
        assert err <= TOL, err
        total_tokens += 20
    assert stats["num_steps"] < total_tokens  # steps were shared between requests
    greedy_ids, _ = cases[3]
    greedy = results[3]
    full = torch.tensor([*greedy_ids, *greedy.output_ids])  # type: ignore[attr-defined]
    with torch.no_grad():
        logits = model(full, torch.arange(len(full)), [0, len(full)])
    assert greedy.output_ids == logits[len(greedy_ids) - 1 : -1].argmax(-1).tolist()  # type: ignore[attr-defined]


async def test_logprobs_are_exact_after_a_prefix_cache_hit() -> None:
    model = small_model()
    async with serve(engine_section(block_size=8), model=model) as (_, client):
        first_ids = prompt(45, seed=1)
        first = await client.generate(
            first_ids, {"max_new_tokens": 12, "ignore_eos": True, "temperature": 0.8}
        )
        assert first.cached_tokens == 0
        # The next turn of the conversation: prompt + output + a new message.
        second_ids = [*first_ids, *first.output_ids, *prompt(10, seed=2)]
        second = await client.generate(
            second_ids, {"max_new_tokens": 12, "ignore_eos": True, "temperature": 0.8}
        )
        assert second.cached_tokens >= 45 + 12 - 1  # everything the first request computed
        assert max_logprob_error(model, second_ids, second, 0.8) <= TOL
        again = await client.generate(
            first_ids, {"max_new_tokens": 5, "ignore_eos": True, "temperature": 1.2}
        )
        assert again.cached_tokens == 44  # all but the last prompt token
        assert max_logprob_error(model, first_ids, again, 1.2) <= TOL
        stats = await engine_stats(client)
        assert stats["kv_blocks_in_use"] == 0 and stats["kv_blocks_cached"] > 0


async def test_a_request_larger_than_the_prefill_budget_is_prefilled_in_chunks() -> None:
    model = small_model()
    async with serve(engine_section(max_prefill_tokens=16), model=model) as (_, client):
        ids = prompt(100, seed=3)
        result = await client.generate(ids, {"max_new_tokens": 4, "ignore_eos": True})
        assert max_logprob_error(model, ids, result, 1.0) <= TOL
        assert (await engine_stats(client))["num_steps"] >= 100 // 16 + 3


async def test_with_the_prefix_cache_off_nothing_is_reused() -> None:
    model = small_model()
    async with serve(engine_section(enable_prefix_cache=False), model=model) as (_, client):
        ids = prompt(40, seed=4)
        for _ in range(2):
            result = await client.generate(ids, {"max_new_tokens": 3})
            assert result.cached_tokens == 0 and max_logprob_error(model, ids, result, 1.0) <= TOL
        assert (await engine_stats(client))["kv_blocks_cached"] == 0

"""Acceptance (HF models): the embedded engine's /generate log-probs equal a `transformers` forward over
the same ids within 1e-4 (fp32), for tiny Llama, Qwen2 and Qwen3 made by `gyre model init` — 8
concurrent requests sharing a prefix with the prefix cache on, and a request continued on a second
engine after its KV was exported and imported."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from gyre.engine import EngineClient
from gyre.engine.migration import migrate_request_kv
from gyre.model.architectures import ARCHITECTURES
from gyre.model.logprobs import token_logprobs
from services.cell_agent.engine import EngineServer
from tests.support.eventually import eventually
from tests.support.models import hf_dir
from tests.unit.engine.helpers import engine_section, engine_stats, steps_at_least

TOL = 1e-4
ARCHES = tuple(sorted(ARCHITECTURES))


def _hf_error(hf: Any, ids: list[int], result: Any, temperature: float) -> float:
    full = torch.tensor([[*ids, *result.output_ids]])
    with torch.no_grad():
        logits = hf(full).logits[0]
    ref = token_logprobs(logits[len(ids) - 1 : -1], torch.tensor(result.output_ids), temperature)
    return float((torch.tensor(result.output_logprobs) - ref).abs().max())


def _ids(n: int, seed: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _hf(path: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("arch", ARCHES)
async def test_concurrent_requests_sharing_a_prefix_match_transformers(arch: str) -> None:
    path = hf_dir(arch)
    hf = _hf(path)
    vocab = hf.config.vocab_size
    # inline_step_ms far above any step here: which steps run on the loop does not depend on the load.
    section = engine_section(block_size=8, max_batch_size=8, max_prefill_tokens=64, inline_step_ms=1000.0)
    prefix = _ids(48, 1, vocab)
    prompts = [prefix + _ids(3 + 2 * i, 10 + i, vocab) for i in range(8)]
    params = [
        {"max_new_tokens": 12, "ignore_eos": True, "temperature": t}
        for t in (1.0, 0.7, 1.3, 0.0, 1.0, 0.9, 1.1, 0.5)
    ]
    async with EngineServer(section, model_dir=path) as engine, EngineClient(engine.url) as client:
        await client.generate(prefix, {"max_new_tokens": 1})  # the shared prefix enters the cache

        async def one(i: int) -> Any:
            await asyncio.sleep(0.005 * i)  # scenario: staggered, later requests join a running batch
            return await client.generate(prompts[i], params[i])

        results = await asyncio.gather(*(one(i) for i in range(8)))
        stats = await engine_stats(client)
    assert all(r.cached_tokens >= 40 for r in results), [r.cached_tokens for r in results]
    assert stats["num_steps"] < 8 * 12, "requests shared steps (continuous batching)"
    assert 0 < stats["num_inline_steps"] < stats["num_steps"], "decode steps on the loop, prefill chunks not"
    for ids, p, r in zip(prompts, params, results, strict=True):
        temperature = float(p["temperature"]) or 1.0
        assert _hf_error(hf, ids, r, temperature) <= TOL


@pytest.mark.parametrize("arch", ARCHES)
async def test_a_request_continued_after_kv_import_matches_transformers(arch: str) -> None:
    path = hf_dir(arch)
    hf = _hf(path)
    section = engine_section(max_prefill_tokens=16)
    ids = _ids(60, 3, hf.config.vocab_size)
    async with (
        EngineServer(section, model_dir=path) as a,
        EngineServer(section, model_dir=path) as b,
        EngineClient(a.url) as source,
        EngineClient(b.url) as destination,
    ):
        task = asyncio.create_task(source.generate(ids, {"max_new_tokens": 400, "ignore_eos": True}, rid="m"))
        await eventually(lambda: steps_at_least(source, 8), what="eight engine steps")
        moved = await migrate_request_kv(source, destination, "m")
        first = await task
        continued = [*ids, *first.output_ids]
        result = await destination.generate(continued, {"max_new_tokens": 16, "ignore_eos": True})
    assert moved.num_tokens >= 60 and result.cached_tokens == moved.num_tokens
    assert _hf_error(hf, continued, result, 1.0) <= TOL

"""`return_routed_experts` on the embedded engine, in SGLang's format: the experts of every forwarded
token (prompt and outputs but the last) per decoder layer, equal to a fresh forward's routing, carried
over prefix-cache hits and chunked prefill, in plain and streamed responses; and the client's parsing
of both of SGLang's shapes (base64 int32, nested list)."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import numpy as np
import pytest
import torch

from gyre.engine import EngineClient
from gyre.engine.migration import migrate_request_kv
from gyre.engine.types import GenerateResult, parse_routed_experts
from gyre.model.causal_lm import CausalLM
from gyre.model.init import init_model_dir
from gyre.model.routing import ExpertRouting
from gyre.model.weights import load_model
from services.cell_agent.engine import EngineServer
from tests.support.eventually import eventually
from tests.support.models import MOE_MIXED
from tests.unit.engine.helpers import engine_section, engine_stats, prompt, serve

LAYERS, TOP_K = 3, 2
MOE = {**MOE_MIXED, "max_position_embeddings": 1024}


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model_dir(
        tmp_path_factory.mktemp("routed") / "moe",
        arch="qwen3_moe",
        tokenizer="byte",
        family="qwen3",
        seed=2,
        overrides=MOE,
    )


def _fresh_routing(model: CausalLM, ids: list[int]) -> torch.Tensor:
    """[len(ids), L, k] experts of one full forward over `ids`."""
    routing = ExpertRouting()
    with torch.no_grad():
        model(torch.tensor(ids), torch.arange(len(ids)), [0, len(ids)], routing=routing)
    return routing.stacked(LAYERS, TOP_K)


def _rows(result: GenerateResult) -> torch.Tensor:
    assert result.routed_experts is not None
    return torch.from_numpy(result.routed_experts.reshape(-1, LAYERS, TOP_K).copy())


async def test_routed_experts_equal_a_fresh_forward_over_cache_hits_and_chunks(moe_dir: Path) -> None:
    model = load_model(moe_dir)
    section = engine_section(max_prefill_tokens=16, block_size=8)
    params = {"temperature": 1.0, "max_new_tokens": 12, "ignore_eos": True}
    shared = prompt(40, seed=1)
    async with (
        EngineServer(section, model_dir=moe_dir, model=load_model(moe_dir)) as server,
        EngineClient(server.url, timeout_s=60) as client,
    ):
        first = await client.generate([*shared, 5, 6], params, return_routed_experts=True)
        second = await client.generate([*shared, 7], params, return_routed_experts=True)
        streamed = [c async for c in client.generate_stream(shared, params, return_routed_experts=True)]
        plain = await client.generate(shared, params)
    assert second.cached_tokens >= 32  # the shared prefix came from the cache, its routing with it
    for ids, result in (([*shared, 5, 6], first), ([*shared, 7], second)):
        tokens = ids + result.output_ids
        got = _rows(result)
        assert got.shape == (len(tokens) - 1, LAYERS, TOP_K)
        assert torch.equal(got, _fresh_routing(model, tokens)[:-1])
        assert bool((got[:, 1] == -1).all())
    assert all(c.routed_experts is None for c in streamed[:-1])
    final = streamed[-1].to_result()
    assert final.routed_experts is not None and final.routed_experts.shape == (
        len(shared) + 11,
        LAYERS * TOP_K,
    )
    assert torch.equal(_rows(final), _fresh_routing(model, shared + final.output_ids)[:-1])
    assert plain.routed_experts is None and "routed_experts" not in plain.meta_info


async def test_a_dense_model_answers_no_routing() -> None:
    async with serve() as (_, client):
        result = await client.generate([1, 2, 3], {"max_new_tokens": 2}, return_routed_experts=True)
    assert result.routed_experts is None


def test_the_client_parses_both_of_sglangs_shapes() -> None:
    experts = np.arange(5 * LAYERS * TOP_K, dtype=np.int32).reshape(5, LAYERS, TOP_K)
    encoded = base64.b64encode(experts.astype("<i4").tobytes()).decode("ascii")
    for value in (encoded, experts.tolist()):
        parsed = parse_routed_experts(value, 5)
        assert parsed is not None and np.array_equal(parsed, experts.reshape(5, -1))
    result = GenerateResult.from_json(
        {
            "output_ids": [1, 2],
            "meta_info": {"prompt_tokens": 4, "completion_tokens": 2, "routed_experts": encoded},
        }
    )
    assert result.routed_experts is not None and result.routed_experts.shape == (5, LAYERS * TOP_K)
    with pytest.raises(ValueError, match="not a multiple of 4 tokens"):
        parse_routed_experts(encoded, 4)
    with pytest.raises(ValueError, match="not base64"):
        parse_routed_experts("@@@", 5)


async def test_the_scored_script_source_answers_its_scoring_forwards_routing(moe_dir: Path) -> None:
    model = load_model(moe_dir)
    script = [{"text": "abc"}]
    section = engine_section(output_source="scored_script")
    async with (
        EngineServer(section, model_dir=moe_dir, model=load_model(moe_dir), script=script) as server,
        EngineClient(server.url, timeout_s=60) as client,
    ):
        ids = prompt(20, seed=3)
        result = await client.generate(ids, {"max_new_tokens": 8}, return_routed_experts=True)
    tokens = ids + result.output_ids
    assert result.output_ids[:3] == list(b"abc")
    assert torch.equal(_rows(result), _fresh_routing(model, tokens)[:-1])


async def test_migrated_kv_carries_no_routing_and_says_so(moe_dir: Path) -> None:
    """A KV import has no routing (the payload carries K/V only): its rows answer -1, the rest as computed."""
    model = load_model(moe_dir)
    section = engine_section(max_prefill_tokens=16)
    ids = prompt(40, seed=5)
    async with (
        EngineServer(section, model_dir=moe_dir, model=load_model(moe_dir)) as source_server,
        EngineServer(section, model_dir=moe_dir, model=load_model(moe_dir)) as destination_server,
        EngineClient(source_server.url, timeout_s=60) as source,
        EngineClient(destination_server.url, timeout_s=60) as destination,
    ):
        task = asyncio.create_task(
            source.generate(ids, {"max_new_tokens": 400, "ignore_eos": True}, rid="m1")
        )
        await eventually(lambda: _steps_at_least(source, 6), what="6 engine steps")
        moved = await migrate_request_kv(source, destination, "m1")
        aborted = await task
        continued = [*ids, *aborted.output_ids]
        result = await destination.generate(
            continued, {"max_new_tokens": 4, "ignore_eos": True}, return_routed_experts=True
        )
    assert moved.num_tokens >= 40 and result.cached_tokens == moved.num_tokens
    rows = _rows(result)
    assert bool((rows[: moved.num_tokens] == -1).all())
    fresh = _fresh_routing(model, continued + result.output_ids)[:-1]
    assert torch.equal(rows[moved.num_tokens :], fresh[moved.num_tokens :])


async def _steps_at_least(client: EngineClient, n: int) -> bool:
    return bool((await engine_stats(client))["num_steps"] >= n)

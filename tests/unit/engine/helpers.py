"""Helpers of the engine tests: a served engine plus client, and the fresh-forward reference."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import torch

from gyre.config.engine import EngineSection
from gyre.engine import EngineClient
from gyre.model.causal_lm import CausalLM
from gyre.model.logprobs import token_logprobs
from services.cell_agent.engine import EngineServer
from tests.support.models import load_small, small_dir


def engine_section(**overrides: Any) -> EngineSection:
    return EngineSection(**{"kv_cache_tokens": 8192, **overrides})


def small_model(seed: int = 0) -> CausalLM:
    """The small test model (a 2-layer Llama with the demo model's byte tokenizer and template)."""
    return load_small(seed)


@asynccontextmanager
async def serve(
    section: EngineSection | None = None, *, model: CausalLM | None = None, script: Sequence[Any] = ()
) -> AsyncIterator[tuple[EngineServer, EngineClient]]:
    section = section or engine_section()
    if model is None and section.output_source == "model":
        model = small_model()
    async with (
        EngineServer(section, model_dir=small_dir(), model=model, script=script) as server,
        EngineClient(server.url, timeout_s=60) as client,
    ):
        yield server, client


def reference_logprobs(
    model: CausalLM, input_ids: Sequence[int], output_ids: Sequence[int], temperature: float
) -> torch.Tensor:
    """Log-probs of `output_ids` from one fresh full forward over prompt + output."""
    ids = torch.tensor([*input_ids, *output_ids])
    with torch.no_grad():
        logits = model(ids, torch.arange(len(ids)), [0, len(ids)])
    start = len(input_ids) - 1
    return token_logprobs(logits[start : start + len(output_ids)], torch.tensor(output_ids), temperature)


def max_logprob_error(model: CausalLM, input_ids: Sequence[int], result: Any, temperature: float) -> float:
    ref = reference_logprobs(model, input_ids, result.output_ids, temperature)
    got = torch.tensor(result.output_logprobs)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    return float((got - ref).abs().max()) if len(got) else 0.0


async def engine_stats(client: EngineClient) -> dict[str, Any]:
    return dict((await client.get_server_info())["internal_states"][0])


async def steps_at_least(client: EngineClient, n: int) -> bool:
    """The engine has taken `n` scheduling steps (for `eventually`)."""
    return bool((await engine_stats(client))["num_steps"] >= n)


async def running_at_least(client: EngineClient, n: int) -> bool:
    """`n` requests are running (for `eventually`)."""
    return bool((await engine_stats(client))["num_running_reqs"] >= n)


def prompt(length: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (length,), generator=torch.Generator().manual_seed(seed)).tolist()

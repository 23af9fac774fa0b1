"""Acceptance: after a weight update, nothing computed under the old version is served from the cache."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from gyre.engine import EngineRequestError
from gyre.model.init import init_model_dir
from gyre.model.weights import write_model_dir
from tests.support.eventually import eventually
from tests.support.models import SMALL, small_dir
from tests.unit.engine.helpers import (
    engine_section,
    engine_stats,
    max_logprob_error,
    prompt,
    serve,
    small_model,
    steps_at_least,
)


@pytest.mark.parametrize("flush_cache", [True, False])
async def test_update_from_tensor_never_serves_old_version_cache(flush_cache: bool) -> None:
    served = small_model(seed=0)
    new = small_model(seed=1)
    ids = prompt(40, seed=5)
    params = {"max_new_tokens": 8, "ignore_eos": True}
    async with serve(model=served) as (_, client):
        before = await client.generate(ids, params)
        warm = await client.generate(ids, params)
        assert warm.cached_tokens == 39 and warm.weight_version == "0"
        message = await client.update_weights_from_tensor(
            dict(new.named_parameters()), weight_version="1", flush_cache=flush_cache
        )
        assert "1" in message or message
        after = await client.generate(ids, params)
        assert after.cached_tokens == 0  # old-version blocks are unreachable, flushed or not
        assert after.weight_version == "1" and await client.get_weight_version() == "1"
        assert max_logprob_error(new, ids, after, 1.0) <= 1e-4
        assert max_logprob_error(new, ids, before, 1.0) > 1e-3  # the weights really changed
        cached_again = await client.generate(ids, params)
        assert cached_again.cached_tokens == 39  # the new version caches again


async def test_an_update_that_keeps_the_version_string_still_invalidates_the_cache() -> None:
    ids = prompt(40, seed=6)
    async with serve() as (_, client):
        await client.generate(ids, {"max_new_tokens": 2})
        assert (await client.generate(ids, {"max_new_tokens": 2})).cached_tokens == 39
        await client.update_weights_from_tensor(
            dict(small_model(seed=1).named_parameters()), flush_cache=False
        )
        after = await client.generate(ids, {"max_new_tokens": 2})
        assert after.cached_tokens == 0 and after.weight_version == "0"


async def test_a_request_spanning_an_update_caches_and_pins_nothing() -> None:
    served, new = small_model(seed=0), small_model(seed=1)
    ids = prompt(40, seed=7)
    async with serve(model=served) as (server, client):
        task = asyncio.create_task(
            client.generate(ids, {"max_new_tokens": 300, "ignore_eos": True}, rid="long")
        )
        await eventually(lambda: steps_at_least(client, 3), what="three engine steps")
        await client.pause_generation("in_place")
        await server.update_weights(dict(new.named_parameters()), weight_version="1", flush_cache=False)
        pin = await client.pin_kv("long")
        assert pin.num_tokens == 0  # its KV mixes two weight versions: nothing trustworthy to move
        await client.release_kv(pin.handle)
        await client.continue_generation()
        first = await task
        follow_up = [*ids, *first.output_ids]
        assert (await client.generate(follow_up, {"max_new_tokens": 1})).cached_tokens == 0


async def test_partial_update_and_validation() -> None:
    model = small_model()
    async with serve(model=model) as (_, client):
        norm = torch.full((32,), 2.0)
        await client.update_weights_from_tensor({"model.norm.weight": norm}, weight_version="7")
        assert torch.equal(model.model.norm.weight.detach(), norm)
        with pytest.raises(EngineRequestError, match="unknown parameter"):
            await client.update_weights_from_tensor({"nope.weight": norm})
        with pytest.raises(EngineRequestError, match="shape"):
            await client.update_weights_from_tensor({"model.norm.weight": torch.zeros(3)})
        with pytest.raises(EngineRequestError, match="unpickle"):
            await client.update_weights_from_tensor({"model.norm.weight": norm}, encoding="sglang")
        assert await client.get_weight_version() == "7"


async def test_update_from_disk(tmp_path: Path) -> None:
    new = small_model(seed=2)
    path = write_model_dir(
        tmp_path / "step3", arch=new.arch, tensors=dict(new.named_parameters()), source=small_dir()
    )
    other = init_model_dir(
        tmp_path / "other",
        arch="llama",
        tokenizer="byte",
        family="chatml",
        overrides={**SMALL, "num_hidden_layers": 1},
    )
    ids = prompt(20, seed=1)
    async with serve() as (_, client):
        await client.update_weights_from_disk(str(path), weight_version="3")
        result = await client.generate(ids, {"max_new_tokens": 5})
        assert result.weight_version == "3" and max_logprob_error(new, ids, result, 1.0) <= 1e-4
        assert (await client.get_model_info())["model_path"] == str(path)
        with pytest.raises(EngineRequestError, match="architecture"):
            await client.update_weights_from_disk(str(other))
        with pytest.raises(EngineRequestError, match="not a directory"):
            await client.update_weights_from_disk(str(tmp_path / "missing"))
        assert (await engine_stats(client))["weight_version"] == "3"


async def test_in_process_update_path() -> None:
    new = small_model(seed=3)
    ids = prompt(10, seed=0)
    async with serve(engine_section(weight_version="a")) as (server, client):
        assert await client.get_weight_version() == "a"
        await server.update_weights(dict(new.named_parameters()), weight_version="b")
        result = await client.generate(ids, {"max_new_tokens": 4})
        assert result.weight_version == "b" and max_logprob_error(new, ids, result, 1.0) <= 1e-4

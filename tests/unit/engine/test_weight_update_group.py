"""SGLang's distributed weight updates on the embedded engine (gloo): `/init_weights_update_group`,
`/update_weights_from_distributed`, `/destroy_weights_update_group` driven by `EngineClient` with
this process as rank 0 (`gyre.engine.update_group`), and bad requests answered in SGLang's shape with
nothing changed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import torch

from gyre.engine import EngineClient, EngineRequestError
from gyre.engine.update_group import UpdateGroupSender, dtype_name, in_daemon_thread
from tests.unit.engine.helpers import max_logprob_error, prompt, serve, small_model

PARAMS = {"max_new_tokens": 6, "ignore_eos": True}
GREEDY = {**PARAMS, "temperature": 0.0}


@asynccontextmanager
async def joined(client: EngineClient, name: str = "g") -> AsyncIterator[UpdateGroupSender]:
    sender = UpdateGroupSender.host(bind_host="127.0.0.1", world_size=2, backend="gloo", timeout_s=30)
    connected = in_daemon_thread(lambda: sender.connect(name))
    message = await client.init_weights_update_group(
        master_address="127.0.0.1",
        master_port=sender.port,
        rank_offset=1,
        world_size=2,
        group_name=name,
        backend="gloo",
    )
    await connected
    assert name in message
    try:
        yield sender
    finally:
        sender.close()


async def send(
    client: EngineClient,
    sender: UpdateGroupSender,
    named: dict[str, torch.Tensor],
    version: str,
    name: str = "g",
) -> str:
    tensors = [t.detach().contiguous() for t in named.values()]
    request = asyncio.ensure_future(
        client.update_weights_from_distributed(
            list(named),
            [dtype_name(t.dtype) for t in tensors],
            [list(t.shape) for t in tensors],
            group_name=name,
            weight_version=version,
        )
    )
    works = sender.broadcast(tensors)
    message = await request
    for w in works:
        w.wait()
    return message


async def test_distributed_update_serves_the_new_version_with_the_prefix_cache_invalidated() -> None:
    new = small_model(seed=1)
    ids = prompt(40, seed=7)
    async with serve() as (_, client):
        before = await client.generate(ids, PARAMS)
        assert (await client.generate(ids, PARAMS)).cached_tokens == 39
        async with joined(client) as sender:
            await send(client, sender, dict(new.named_parameters()), "1")
            after = await client.generate(ids, PARAMS)
            assert after.weight_version == "1" and after.cached_tokens == 0
            assert max_logprob_error(new, ids, after, 1.0) <= 1e-4
            assert max_logprob_error(new, ids, before, 1.0) > 1e-3, "the weights really changed"
            again = small_model(seed=2)  # the same group carries the next publication too
            await send(client, sender, dict(again.named_parameters()), "2")
            assert (await client.generate(ids, PARAMS)).weight_version == "2"
        assert "destroy" in (await client.destroy_weights_update_group("g"))


async def test_bad_requests_are_refused_and_change_nothing() -> None:
    ids = prompt(30, seed=8)
    async with serve() as (_, client):
        reference = await client.generate(ids, GREEDY)
        with pytest.raises(EngineRequestError, match="runs on CPU; its weight-update groups use gloo"):
            await client.init_weights_update_group(
                master_address="127.0.0.1",
                master_port=1,
                rank_offset=1,
                world_size=2,
                group_name="n",
                backend="nccl",
            )
        with pytest.raises(EngineRequestError, match="no weight-update group 'nope'"):
            await client.update_weights_from_distributed(
                ["model.norm.weight"], ["float32"], [[32]], group_name="nope"
            )
        with pytest.raises(EngineRequestError, match="dtypes: dtype 'int7'"):
            await client.update_weights_from_distributed(
                ["model.norm.weight"], ["int7"], [[32]], group_name="g"
            )
        async with joined(client) as sender:
            with pytest.raises(EngineRequestError, match="exists already"):
                await client.init_weights_update_group(
                    master_address="127.0.0.1",
                    master_port=sender.port,
                    rank_offset=1,
                    world_size=2,
                    group_name="g",
                    backend="gloo",
                )
            # a name the model does not have: drained (the sender does not hang), refused, nothing applied
            bogus = {"model.norm.weight": torch.zeros(32), "model.nope.weight": torch.ones(4)}
            with pytest.raises(EngineRequestError, match=r"unknown parameter 'model\.nope\.weight'"):
                await send(client, sender, bogus, "9")
            after = await client.generate(ids, GREEDY)
            assert after.weight_version == "0" and after.output_ids == reference.output_ids
            assert after.output_logprobs == pytest.approx(reference.output_logprobs, abs=1e-6)
            # and the group still works
            await send(client, sender, dict(small_model(seed=1).named_parameters()), "1")
            assert (await client.generate(ids, PARAMS)).weight_version == "1"
        with pytest.raises(EngineRequestError, match="no weight-update group 'other'"):
            await client.destroy_weights_update_group("other")

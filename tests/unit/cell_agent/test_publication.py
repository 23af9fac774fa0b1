"""A core cell publishes its weights to another cell's rollout engine by each `trainer.publication`
path — tensor, disk, and distributed (`init_weights_update_group` + `update_weights_from_distributed`
over gloo) — and the engine serves version + 1 with its prefix cache invalidated; a request running
through a publication is not aborted (the config's default)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from google.protobuf.message import Message

from gyre.config.engine import EngineSection
from gyre.engine import EngineClient
from gyre.model.causal_lm import CausalLM
from gyre.model.weights import assign_weights
from gyre.roles import TRAINING
from gyre.stack.servers import ServerProcess
from services.cell_agent.agent import CellAgent, PublishTarget
from services.cell_agent.engine import EngineServer
from tests.support.cells import SMALL_MODEL, cell_config
from tests.unit.cell_agent.helpers import batch
from tests.unit.engine.helpers import max_logprob_error, prompt

PARAMS = {"max_new_tokens": 6, "ignore_eos": True}


@pytest.mark.parametrize("publication", ["distributed", "tensor", "disk"])
async def test_core_publishes_to_another_cells_engine(
    publication: str, tmp_path: Path, redis: aioredis.Redis, redis_server: ServerProcess, run_id: str
) -> None:
    config = cell_config(
        tmp_path,
        nats_url="nats://unused",
        redis_url=redis_server.url,
        run_id=run_id,
        num_cells=1,
        overrides={"cell_agent": {"trainer": {"publication": publication}}},
    )
    events: list[Message] = []

    async def emit(event: Message, event_id: str) -> None:
        events.append(event)

    agent = CellAgent(config, cell=0, redis=redis, emit=emit)
    await agent.start()
    await asyncio.gather(*await agent.background())
    model_dir = Path(SMALL_MODEL["path"])
    rollout = EngineServer(EngineSection(kv_cache_tokens=4096), model_dir=model_dir)
    await rollout.start()
    try:
        async with EngineClient(rollout.url) as client:
            ids = prompt(40, seed=3)
            before = await client.generate(ids, PARAMS)
            assert (await client.generate(ids, PARAMS)).cached_tokens == 39
            await agent.switch_role(TRAINING)
            t = agent.training
            for s in batch(t.trainer):
                await t.compute.run(t.trainer.accumulate, s)
            await t.optimizer_step()
            assert t.trainer.version == 1
            model = CausalLM(t.trainer.arch)
            assign_weights(model, t.trainer.named_weights())
            model.eval()
            running = asyncio.ensure_future(
                client.generate(prompt(20, seed=4), {"max_new_tokens": 400, "ignore_eos": True})
            )
            while (await client.get_server_info())["internal_states"][0]["num_running_reqs"] == 0:
                await asyncio.sleep(0.01)
            result = await agent.publish_weights([PublishTarget("cell-1", rollout.url, 1)])
            assert result.engine_ids == ("cell-1",) and result.policy_version == 1
            survived = await running
            assert survived.finish_reason is not None and survived.finish_reason.type == "length", (
                "a publication does not abort running requests"
            )
            assert survived.completion_tokens == 400
            after = await client.generate(ids, PARAMS)
            assert after.weight_version == "1" and after.cached_tokens == 0
            assert max_logprob_error(model, ids, after, 1.0) <= 1e-4
            assert max_logprob_error(model, ids, before, 1.0) > 1e-5, "the weights really changed"
    finally:
        await rollout.stop()
        await agent.stop()
    assert [type(e).__name__ for e in events].count("WeightsPublished") == 1

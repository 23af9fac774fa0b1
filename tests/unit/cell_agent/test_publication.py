"""A core cell publishes its weights to another cell's rollout engine by each `trainer.publication`
path — tensor, disk, and distributed (`init_weights_update_group` + `update_weights_from_distributed`
over gloo) — and the engine serves version + 1 with its prefix cache invalidated; a request running
through a publication is not aborted (the config's default)."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from google.protobuf.message import Message

from app.stack.servers import ServerProcess
from gyre.config.engine import EngineSection
from gyre.engine import EngineClient
from gyre.model.causal_lm import CausalLM
from gyre.model.model_dir import ModelDir
from gyre.model.weights import assign_weights
from gyre.roles import TRAINING
from gyre.trainer.backends.torch_backend import TorchTrainer
from services.cell_agent.agent import CellAgent, PublishTarget
from services.cell_agent.engine import EngineServer
from tests.support.cells import SMALL_MODEL, cell_config
from tests.support.eventually import eventually
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
        overrides={
            "cell_agent": {
                "trainer": {"publication": publication},
                # the engine reads the core's published directory: a disk both see
                "published_weights": "shared" if publication == "disk" else "core",
            }
        },
    )
    events: list[Message] = []

    async def emit(event: Message, event_id: str) -> None:
        events.append(event)

    agent = CellAgent(config, model=ModelDir.open(config.model), cell=0, redis=redis, emit=emit)
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

            async def generating() -> bool:
                return bool((await client.get_server_info())["internal_states"][0]["num_running_reqs"])

            await eventually(generating, what="the generation to run")
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


@pytest.mark.parametrize("publication", ["tensor", "disk"])
async def test_a_lora_core_publishes_its_adapter(
    publication: str, tmp_path: Path, redis: aioredis.Redis, redis_server: ServerProcess, run_id: str
) -> None:
    """Under `trainer.lora` the publication is the adapter: the engine loads `policy-v1` on its base
    weights, reports version 1, and a request naming it gets the trainer's own log-probs."""
    lora = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}
    config = cell_config(
        tmp_path,
        nats_url="nats://unused",
        redis_url=redis_server.url,
        run_id=run_id,
        num_cells=1,
        overrides={
            "cell_agent": {
                "trainer": {"publication": publication, "lora": lora, "lr": 1e-2},
                "published_weights": "shared" if publication == "disk" else "core",
            }
        },
    )

    async def emit(event: Message, event_id: str) -> None:
        pass

    agent = CellAgent(config, model=ModelDir.open(config.model), cell=0, redis=redis, emit=emit)
    await agent.start()
    await asyncio.gather(*await agent.background())
    rollout = EngineServer(
        config.cell_agent.engine.model_copy(update={"port": 0}), model_dir=Path(SMALL_MODEL["path"])
    )
    await rollout.start()
    try:
        async with EngineClient(rollout.url) as client:
            await agent.switch_role(TRAINING)
            t = agent.training
            for s in batch(t.trainer):
                await t.compute.run(t.trainer.accumulate, s)
            await t.optimizer_step()
            result = await agent.publish_weights([PublishTarget("cell-1", rollout.url, 1)])
            assert result.engine_ids == ("cell-1",)
            assert (Path(result.path) / "adapter_config.json").is_file()
            assert await client.get_weight_version() == "1"
            ids = prompt(40, seed=3)
            tuned = await client.generate(ids, PARAMS, lora_path="policy-v1")
            base = await client.generate(ids, PARAMS)
            assert tuned.weight_version == "1"
            trainer = t.trainer
            assert isinstance(trainer, TorchTrainer) and trainer.adapter is not None
            policy = functools.partial(trainer.logits, tree=None)  # base + adapter, the packed contract
            assert max_logprob_error(policy, ids, tuned, 1.0) <= 1e-4  # type: ignore[arg-type]
            model = trainer.model
            assert max_logprob_error(model, ids, base, 1.0) <= 1e-4
            assert max_logprob_error(model, ids, tuned, 1.0) > 1e-5, "the adapter changes the policy"
    finally:
        await rollout.stop()
        await agent.stop()

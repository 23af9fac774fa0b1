"""rollout → training → rollout on one cell agent process: requests in flight at the switch are
handed back (each ends with an abort the proxy retries, none is lost), the cell trains one step, and
afterwards its engine serves the newest published version, without stale prefix-cache entries."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import torch

from app.stack.servers import ServerProcess
from gyre.engine import EngineClient, GenerateResult
from gyre.model.logprobs import token_logprobs
from gyre.model.model_dir import ModelDir
from gyre.model.weights import load_model
from gyre.rl.loss import ObjectiveParams
from gyre.store import Keys, WorkQueue
from gyre.trainer.backends import TorchTrainer, TrainerSpec, create_trainer
from gyre.trainer.synthetic import synthetic_microsteps
from services.cell_agent.trainer_state import TrainerState, WorldRecord
from tests.support.cells import ROLLOUT, TRAINING, CellStack, enqueue
from tests.support.eventually import eventually
from tests.support.torch_threads import one_torch_thread  # noqa: F401  (autouse: the references run here)

pytestmark = pytest.mark.slow


LONG = {"max_new_tokens": 400, "ignore_eos": True, "temperature": 1.0}


async def _in_flight(client: EngineClient, n: int) -> None:
    async def enough() -> bool:
        states = (await client.get_server_info())["internal_states"][0]
        return bool(states["num_running_reqs"] + states["num_waiting_reqs"] >= n)

    await eventually(enough, what=f"{n} requests in flight")


async def test_rollout_training_rollout_hands_back_and_serves_the_new_version(
    tmp_path: Path,
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    redis: aioredis.Redis,
    keys: Keys,
    run_id: str,
) -> None:
    with CellStack(
        tmp_path, nats_url=nats_server.url, redis_url=redis_server.url, run_id=run_id, num_cells=1
    ) as cells:
        config = cells.config
        url = (await cells.status(0)).engine.url
        prompt = list(range(60, 140))
        async with EngineClient(url, timeout_s=120) as engine:
            warm = await engine.generate(prompt, {"max_new_tokens": 1})
            assert warm.weight_version == "0"
            prompts = [[1, 2, 3, i] for i in range(4)]
            calls = [
                asyncio.create_task(engine.generate(p, LONG, rid=f"r{i}")) for i, p in enumerate(prompts)
            ]
            await _in_flight(engine, len(calls))

            switched = await cells.switch(0, TRAINING)
            assert switched.role == TRAINING and switched.requests_handed_back == len(calls)
            handed_back = await asyncio.gather(*calls)
            for r in handed_back:
                assert (
                    isinstance(r, GenerateResult) and r.finish_reason is not None and r.finish_reason.aborted
                )

            spec = TrainerSpec(
                config.cell_agent.trainer,
                ModelDir.open(config.model).path,
                ObjectiveParams(),
                with_optimizer=True,
            )
            reference = create_trainer("torch", spec)
            assert isinstance(reference, TorchTrainer)
            steps = synthetic_microsteps(
                reference.model,
                batch_id="b0",
                step=0,
                num_groups=2,
                group_size=2,
                token_budget=256,
                max_row_tokens=100,
            )
            await enqueue(WorkQueue(redis, keys, "microsteps:b0"), steps, close=True)
            joined = await cells.join(0, "b0", 0, True)
            assert joined.policy_version == 1

            back = await cells.switch(0, ROLLOUT, weight_version=1)
            assert back.role == ROLLOUT and back.weight_version == 1
            assert await engine.get_weight_version() == "1"

            retried = await asyncio.gather(
                *(
                    engine.generate(p, {**LONG, "max_new_tokens": 8}, rid=f"r{i}-retry")
                    for i, p in enumerate(prompts)
                )
            )
            for r in retried:
                assert r.weight_version == "1" and r.finish_reason is not None and not r.finish_reason.aborted

            again = await engine.generate(prompt, {"max_new_tokens": 4, "temperature": 0.0})
            assert again.cached_tokens == 0, "no prefix-cache entry computed under version 0 is served"
            published = await TrainerState(redis, keys).published()
            assert published is not None and published.version == 1
            model = load_model(Path(published.path))
            ids = torch.tensor([*prompt, *again.output_ids])
            with torch.no_grad():
                logits = model(ids, torch.arange(len(ids)), [0, len(ids)])
            expected = token_logprobs(logits[len(prompt) - 1 : -1], torch.tensor(again.output_ids), 1.0)
            assert float((torch.tensor(again.output_logprobs) - expected).abs().max()) < 1e-4, (
                "the engine computes with the published weights"
            )
        await cells.close_channels()


async def test_a_closed_world_keeps_its_generation(redis: aioredis.Redis, keys: Keys) -> None:
    # A core that stops closes its world; the next core (a new process, counting from 0) must number its
    # world past it, or the satellites, which follow only newer generations, never join.
    state = TrainerState(redis, keys)
    await state.set_world(WorldRecord(3, "10.0.0.2", 29500, ("core-a", "sat-b")))
    await state.clear_world(2)  # not the announced generation: nothing changes
    assert await state.world() == WorldRecord(3, "10.0.0.2", 29500, ("core-a", "sat-b"))
    await state.clear_world(3)
    closed = await state.world()
    assert closed is not None and closed.generation == 3 and closed.members == ()

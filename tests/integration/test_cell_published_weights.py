"""A satellite back in rollout serves the core's published weights whether or not it shares the core's disk:
with `cell_agent.published_weights: core` it streams the publication from the core (FetchPublished) into its
own directory and loads that copy; with `shared` it loads the core's directory. Both end in an engine that
serves version 1 with the published bytes."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import grpc
import pytest
import redis.asyncio as aioredis

from app.stack.servers import ServerProcess
from gyre.model.model_dir import ModelDir
from gyre.rl.loss import ObjectiveParams
from gyre.store import Keys, WorkQueue
from gyre.trainer.backends import TorchTrainer, TrainerSpec, create_trainer
from gyre.trainer.checkpoint import published_path
from gyre.trainer.synthetic import synthetic_microsteps
from gyre.v1 import cell_agent_pb2, cell_agent_pb2_grpc
from services.cell_agent.trainer_state import TrainerState
from tests.support.cells import ROLLOUT, TRAINING, CellStack, enqueue
from tests.support.torch_threads import one_torch_thread  # noqa: F401  (autouse: the reference runs here)

pytestmark = pytest.mark.slow


def _files(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("source", ["core", "shared"])
async def test_satellite_back_in_rollout_serves_the_published_version(
    tmp_path: Path,
    nats_server: ServerProcess,
    redis_server: ServerProcess,
    redis: aioredis.Redis,
    keys: Keys,
    run_id: str,
    source: str,
) -> None:
    with CellStack(
        tmp_path,
        nats_url=nats_server.url,
        redis_url=redis_server.url,
        run_id=run_id,
        num_cells=2,
        overrides={"cell_agent": {"published_weights": source}},
    ) as cells:
        config = cells.config
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
            max_row_tokens=80,
        )
        for cell in (0, 1):
            await cells.switch(cell, TRAINING)
        await enqueue(WorkQueue(redis, keys, "microsteps:b0"), steps, close=True)
        joined = await asyncio.gather(*(cells.join(cell, "b0", 0, True) for cell in (0, 1)))
        assert joined[0].policy_version == 1  # the satellite may or may not have made it into the window

        back = await cells.switch(1, ROLLOUT, weight_version=1)
        assert back.role == ROLLOUT and back.weight_version == 1
        status = await cells.status(1)
        assert status.engine_weight_version == 1

        published = await TrainerState(redis, keys).published()
        assert published is not None and published.version == 1
        core_copy = Path(published.path)
        checkpoint_root = config.run.path / "checkpoints"
        own_copy = published_path(checkpoint_root / "cells" / "1", 1)
        if source == "core":
            assert own_copy.is_dir(), "the satellite keeps its own copy of the publication"
            assert _files(own_copy) == _files(core_copy), "byte for byte the core's publication"
        else:
            assert not own_copy.exists(), "a shared directory is read in place"

        # The core answers a version it does not have with NOT_FOUND (a satellite then asks for the newest).
        port = config.cell_agent.ports[0]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = cell_agent_pb2_grpc.CellAgentStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as gone:
                async for _ in stub.FetchPublished(cell_agent_pb2.FetchPublishedRequest(policy_version=7)):
                    pass
            assert gone.value.code() == grpc.StatusCode.NOT_FOUND
        await cells.close_channels()

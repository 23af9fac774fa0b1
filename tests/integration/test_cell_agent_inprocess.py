"""CellAgent in-process (one cell, real Redis, events captured): the role machine's guards, the
transition events, released engine weights restored without a publication, publication rules, and a
core that lapses mid-step (its claims reclaimed) starting its part over without losing exactness."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from google.protobuf.message import Message

from app.stack.servers import ServerProcess
from gyre.engine import EngineClient
from gyre.model.files import check_model_dir
from gyre.model.model_dir import ModelDir
from gyre.model.weights import load_state_dict
from gyre.rl.loss import ObjectiveParams
from gyre.roles import ROLLOUT, TRAINING
from gyre.store import Keys
from gyre.trainer.backends import TorchTrainer, TrainerSpec, create_trainer
from gyre.trainer.synthetic import synthetic_microsteps
from gyre.v1 import events_pb2 as ev
from services.cell_agent.agent import CellAgent
from services.cell_agent.errors import CellStateError
from services.cell_agent.step_record import StepRecord, consumer_name
from tests.support.cells import cell_config, enqueue
from tests.support.eventually import eventually

Events = list[tuple[Message, str]]


@pytest.fixture
async def agent_and_events(
    tmp_path: Path, redis: aioredis.Redis, redis_server: ServerProcess, run_id: str
) -> AsyncIterator[tuple[CellAgent, Events]]:
    config = cell_config(
        tmp_path,
        nats_url="nats://unused",
        redis_url=redis_server.url,
        run_id=run_id,
        num_cells=1,
        overrides={"cell_agent": {"release_engine_weights": True, "engine_ready_timeout_s": 1.0}},
    )
    events: Events = []

    async def emit(event: Message, event_id: str) -> None:
        events.append((event, event_id))

    agent = CellAgent(config, model=ModelDir.open(config.model), cell=0, redis=redis, emit=emit)
    await agent.start()
    await asyncio.gather(*await agent.background())  # one cell: no world to join, nothing to serve
    yield agent, events
    await agent.stop()


async def test_guards_events_and_released_weights(agent_and_events: tuple[CellAgent, Events]) -> None:
    agent, events = agent_and_events
    with pytest.raises(CellStateError, match="switch it to training first"):
        await agent.join_batch("b0", 0, True)
    async with EngineClient(agent.engine.url) as client:
        before = await client.generate([5, 6, 7], {"max_new_tokens": 6, "temperature": 0.0})
        to_training = await agent.switch_role(TRAINING)
        assert to_training.role == TRAINING and agent.engine.weights_released
        same = await agent.switch_role(TRAINING)
        assert same.duration_s == 0.0, "a repeated switch is a no-op"
        back = await agent.switch_role(ROLLOUT, weight_version=0)
        assert back.weight_version == 0
        after = await client.generate([5, 6, 7], {"max_new_tokens": 6, "temperature": 0.0})
        assert after.output_ids == before.output_ids, "initial weights restored after a release"
        assert after.output_logprobs == pytest.approx(before.output_logprobs, abs=1e-5)
    kinds = [(type(e).__name__, i) for e, i in events]
    assert kinds == [
        ("RoleTransitionBegun", "cell:0:transition:1:begun"),
        ("RoleTransitionCompleted", "cell:0:transition:1:completed"),
        ("RoleTransitionBegun", "cell:0:transition:2:begun"),
        ("RoleTransitionCompleted", "cell:0:transition:2:completed"),
    ]
    completed = events[1][0]
    assert (
        isinstance(completed, ev.RoleTransitionCompleted)
        and completed.to_role == 3
        and completed.duration_s > 0
    )


async def test_waiting_for_an_unpublished_version_times_out(
    agent_and_events: tuple[CellAgent, Events],
) -> None:
    agent, _ = agent_and_events
    await agent.switch_role(TRAINING)
    with pytest.raises(TimeoutError, match="version 3 were not published"):
        await agent.switch_role(ROLLOUT, weight_version=3)
    assert agent.roles.role == TRAINING, "a failed switch leaves the cell where it was"


async def test_publication_writes_the_file_and_records_it(agent_and_events: tuple[CellAgent, Events]) -> None:
    agent, events = agent_and_events
    result = await agent.publish_weights(None)
    assert result.policy_version == 0 and (Path(result.path) / "model.safetensors").is_file()
    assert result.engine_ids == ("cell-0",), "the core in rollout updates its own engine"
    published = [e for e, _ in events if isinstance(e, ev.WeightsPublished)]
    assert len(published) == 1 and published[0].checkpoint_path == result.path
    await agent.publish_weights(None)
    assert len([e for e, _ in events if isinstance(e, ev.WeightsPublished)]) == 1, "one event per version"


async def test_a_core_that_lapses_mid_step_starts_over_and_stays_exact(
    agent_and_events: tuple[CellAgent, Events], redis: aioredis.Redis
) -> None:
    agent, events = agent_and_events
    reference = create_trainer(
        "torch",
        TrainerSpec(agent.section.trainer, agent.model.path, ObjectiveParams(), with_optimizer=True),
    )
    assert isinstance(reference, TorchTrainer)
    steps = synthetic_microsteps(
        reference.model,
        batch_id="b0",
        step=0,
        num_groups=6,
        group_size=4,
        token_budget=128,
        max_row_tokens=100,
        seed=4,
    )
    record = StepRecord(redis, Keys(agent.config.run.id), "b0", heartbeat_timeout_s=agent.heartbeat_timeout_s)
    await enqueue(record.queue, steps, close=True)
    await agent.switch_role(TRAINING)
    join = asyncio.create_task(agent.join_batch("b0", 0, True))

    async def two_done() -> bool:
        return int(await redis.scard(record.done_key(0))) >= 2

    await eventually(two_done, what="the core to finish two micro-steps")
    taken: list[str] = []
    while not taken:  # what a starved event loop looks like to the others: a stale heartbeat
        await redis.zadd(record.heartbeats_key, {consumer_name(0): 1.0})
        taken = await record.queue.reclaim_dead()
    outcome = await join
    for s in steps:
        reference.accumulate(s)
    reference.optimizer_step()
    assert outcome.participated and outcome.policy_version == 1
    assert outcome.microsteps == len(steps), "the core redid its part from scratch"
    published = Path(agent.checkpoint_root / "published" / "v00000001")
    tensors = load_state_dict(check_model_dir(published))
    diff = max(float((tensors[n] - w).abs().max()) for n, w in reference.named_weights().items())
    assert diff <= 1e-6
    assert any(isinstance(e, ev.StepCompleted) for e, _ in events)


async def test_heartbeats_must_fit_the_timeout(
    tmp_path: Path, redis: aioredis.Redis, redis_server: ServerProcess, run_id: str
) -> None:
    config = cell_config(
        tmp_path,
        nats_url="nats://unused",
        redis_url=redis_server.url,
        run_id=run_id,
        num_cells=1,
        overrides={
            "redis": {"heartbeat_timeout_s": 1.0},
            "cell_agent": {"trainer": {"heartbeat_interval_s": 0.6}},
        },
    )

    async def emit(event: Message, event_id: str) -> None:
        raise AssertionError("nothing is emitted")

    with pytest.raises(ValueError, match="heartbeat_interval_s"):
        CellAgent(config, model=ModelDir.open(config.model), cell=0, redis=redis, emit=emit)

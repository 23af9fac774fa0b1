"""CellAgent in-process (one cell, real Redis, events captured): the role machine's guards, the
transition events, released engine weights restored without a publication, and publication rules."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from google.protobuf.message import Message

from gyre.engine import EngineClient
from gyre.stack.servers import ServerProcess
from gyre.v1 import events_pb2 as ev
from services.cell_agent.agent import CellAgent
from services.cell_agent.errors import CellStateError
from services.cell_agent.roles import Role
from tests.support.cells import cell_config

Events = list[tuple[Message, str]]


@pytest.fixture
async def agent_and_events(
    tmp_path: Path, redis: aioredis.Redis, redis_server: ServerProcess, run_id: str
) -> AsyncIterator[tuple[CellAgent, Events]]:
    config = cell_config(
        tmp_path, nats_url="nats://unused", redis_url=redis_server.url, run_id=run_id, num_cells=1,
        overrides={"cell_agent": {"release_engine_weights": True, "engine_ready_timeout_s": 1.0}},
    )
    events: Events = []

    async def emit(event: Message, event_id: str) -> None:
        events.append((event, event_id))

    agent = CellAgent(config, cell=0, redis=redis, emit=emit)
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
        to_training = await agent.switch_role(Role.TRAINING)
        assert to_training.role is Role.TRAINING and agent.engine.weights_released
        same = await agent.switch_role(Role.TRAINING)
        assert same.duration_s == 0.0, "a repeated switch is a no-op"
        back = await agent.switch_role(Role.ROLLOUT, weight_version=0)
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
    assert isinstance(completed, ev.RoleTransitionCompleted) and completed.to_role == 3 and completed.duration_s > 0


async def test_waiting_for_an_unpublished_version_times_out(agent_and_events: tuple[CellAgent, Events]) -> None:
    agent, _ = agent_and_events
    await agent.switch_role(Role.TRAINING)
    with pytest.raises(TimeoutError, match="version 3 were not published"):
        await agent.switch_role(Role.ROLLOUT, weight_version=3)
    assert agent.roles.role is Role.TRAINING, "a failed switch leaves the cell where it was"


async def test_publication_writes_the_file_and_records_it(agent_and_events: tuple[CellAgent, Events]) -> None:
    agent, events = agent_and_events
    result = await agent.publish_weights(None)
    assert result.policy_version == 0 and Path(result.path).is_file()
    assert result.engine_ids == ("cell-0",), "the core in rollout updates its own engine"
    published = [e for e, _ in events if isinstance(e, ev.WeightsPublished)]
    assert len(published) == 1 and published[0].checkpoint_path == result.path
    await agent.publish_weights(None)
    assert len([e for e, _ in events if isinstance(e, ev.WeightsPublished)]) == 1, "one event per version"

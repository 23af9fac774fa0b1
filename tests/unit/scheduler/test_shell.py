"""The scheduler shell's pure parts: engine ids, batch ids, and the driver's event order."""

from __future__ import annotations

import asyncio

import pytest

from gyre.ids import batch_id, step_of_batch
from services.scheduler.driver import Driver, MakeEvent
from services.scheduler.naming import engine_id, engine_index
from services.scheduler.policy import (
    SEPARATE_POOL,
    Action,
    DispatchGroups,
    GroupDispatched,
    Policy,
    PolicyParams,
    RunStarted,
)


def _dispatched(group_id: str, size: int, version: int) -> MakeEvent:
    return lambda now: GroupDispatched(now, group_id, size, version)


def test_engine_ids_round_trip() -> None:
    for engine in (0, 3, SEPARATE_POOL):
        assert engine_index(engine_id(engine)) == engine
    with pytest.raises(ValueError, match="cell-<k>"):
        engine_index("gpu-1")


def test_batch_ids_round_trip() -> None:
    assert step_of_batch(batch_id("demo-1-b2", 17)) == 17
    with pytest.raises(ValueError, match="<run>-b<step>"):
        step_of_batch("b17")


async def test_driver_applies_follow_ups_before_queued_events_and_persists() -> None:
    policy = Policy(PolicyParams(num_cells=2, group_size=2, batch_groups=1, phi=0.0, mu=1, cell_capacity=4))
    seen: list[str] = []
    persisted: list[int] = []

    async def execute(action: Action) -> list[MakeEvent]:
        seen.append(type(action).__name__)
        if isinstance(action, DispatchGroups):
            ids = [f"g{i}" for i in range(action.num_groups)]
            return [_dispatched(g, action.group_size, action.policy_version) for g in ids]
        return []

    async def after() -> None:
        persisted.append(policy.state.dispatched)

    driver = Driver(policy, execute, after)
    task = asyncio.create_task(driver.run())
    await driver.handle(lambda now: RunStarted(now))
    # Dispatch answered with GroupDispatched follow-ups, which let the start rule start executions.
    assert seen[0] == "DispatchGroups" and "StartExecutions" in seen
    assert persisted == [2]
    await driver.handle(lambda now: GroupDispatched(now, "g0", 2, 0))  # a duplicate: rejected, logged
    assert driver.num_rejected == 1 and persisted == [2]
    task.cancel()

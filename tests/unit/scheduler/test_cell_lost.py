"""The shell removes a satellite lost for good: the supervisor's `ProcessExited` (gave_up) of its cell agent
becomes `CellLost`, and the policy's answer reaches the proxy: the cell's executions rerouted, its engine
out of the table, its transition abandoned. The core's agent, and an exit followed by a restart, are not
losses here."""

from __future__ import annotations

import asyncio
from typing import Any

from gyre.v1 import events_pb2 as ev
from services.scheduler.policy import Role
from services.scheduler.translate import EventTranslator, lost_satellite
from tests.support.eventually import eventually
from tests.unit.scheduler.scenario import Scenario
from tests.unit.scheduler.test_engine_table import _executor, _routed_driver


def _exited(process: str, gave_up: bool = True) -> ev.ProcessExited:
    return ev.ProcessExited(process=process, pid=42, reason="killed by SIGKILL", gave_up=gave_up)


def test_only_a_satellite_agent_out_of_restarts_is_a_lost_cell() -> None:
    assert lost_satellite(_exited("cell_agent-2")) == 2
    assert lost_satellite(_exited("cell_agent-2", gave_up=False)) is None  # a restart follows
    assert lost_satellite(_exited("cell_agent-0")) is None  # the core: the supervisor stops the run
    assert lost_satellite(_exited("packer")) is None
    assert lost_satellite(_exited("cell_agent-x")) is None


async def test_a_lost_rollout_satellite_is_rerouted_and_leaves_the_proxy_table() -> None:
    sc = Scenario(num_cells=3, cell_capacity=2, group_size=1, batch_groups=2, phi=1.0, mu=2)
    sc.start()  # 6 executions fill C_R = 6: g0.0 and g1.0 run on cell 2
    executor, proxy = _executor(3, list(sc.policy.state.roles))
    driver, routes = _routed_driver(sc.policy, executor, proxy)
    await executor.publish_engine_table()
    assert proxy.tables[-1] == ["cell-0", "cell-1", "cell-2"]
    translator = EventTranslator(executor.facts.shell)
    run = asyncio.create_task(driver.run())
    try:
        for ignored in (_exited("cell_agent-2", gave_up=False), _exited("cell_agent-0"), _exited("proxy")):
            assert translator.translate(ignored) == []
        await driver.handle(translator.translate(_exited("cell_agent-2")))
        await eventually(  # the deferred table update: a few fake round trips
            lambda: len(routes) == 2 and proxy.tables[-1] == ["cell-0", "cell-1"],
            timeout_s=10,
            what="the reroutes and the proxy's table without the lost cell",
        )
    finally:
        run.cancel()
    assert routes == [{"g0.0": "cell-1"}, {"g1.0": "cell-0"}]
    assert proxy.tables[-1] == ["cell-0", "cell-1"]
    snap = sc.policy.snapshot()
    assert snap.roles[2] is Role.GONE and snap.cells_lost == 1 and snap.num_cells == 2
    assert driver.num_rejected == 0


async def test_a_transition_of_a_lost_cell_is_abandoned() -> None:
    """A cell lost while it switched: the switch (retried while its agent is down) stops at once."""
    executor, _ = _executor(3, [Role.ROLLOUT] * 3)
    switching = asyncio.Event()

    class DeadCell:
        async def SwitchRole(self, request: Any, timeout: float) -> Any:
            switching.set()
            await asyncio.Event().wait()  # never answers

    executor._peers.cells[2] = DeadCell()
    executor._defer(executor._transition(2, Role.TRAINING), "transition-2-training", 2)
    executor.start_deferred()
    await asyncio.wait_for(switching.wait(), 5)
    (task,) = executor._cell_tasks[2]
    executor._abandon(2)
    await eventually(task.done, timeout_s=5, what="the lost cell's switch to end")
    assert task.cancelled()

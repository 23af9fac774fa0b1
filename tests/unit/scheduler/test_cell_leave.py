"""A cell leaves the pool with notice (`DrainCell`): the notice is checked against the roles when it applies,
the policy's `CellLeaving` answer reaches the proxy — the cell's executions rerouted, its engine drained with
KV migration, then out of the table — and the notice answers with what moved. A notice refused changes
nothing."""

from __future__ import annotations

import asyncio
import re

import grpc
import pytest

from gyre.v1 import proxy_pb2
from services.scheduler.departure import DrainFailed, LeaveRefused, check_leave, give_notice
from services.scheduler.driver import Driver
from services.scheduler.executor import ActionExecutor
from services.scheduler.persist import ShellState
from services.scheduler.policy import Role
from tests.support.eventually import eventually
from tests.unit.scheduler.scenario import Scenario
from tests.unit.scheduler.test_engine_table import FakeProxy, _executor, _routed_driver


def _started() -> Scenario:
    sc = Scenario(num_cells=3, cell_capacity=2, group_size=1, batch_groups=2, phi=1.0, mu=2)
    sc.start()  # 6 executions fill C_R = 6: g0.0 and g1.0 run on cell 2
    return sc


async def _scheduler(sc: Scenario, proxy: FakeProxy) -> tuple[ActionExecutor, Driver, list[dict[str, str]]]:
    """The scheduler's executor and driver over `sc`'s policy, talking to `proxy`, its engine table published:
    (executor, driver, the routes each UpdateRoutes carried). The caller runs the driver."""
    executor, _ = _executor(3, list(sc.policy.state.roles))
    executor._peers.proxy = proxy  # type: ignore[assignment]
    driver, routes = _routed_driver(sc.policy, executor, proxy)
    await executor.publish_engine_table()
    return executor, driver, routes


def test_only_a_satellite_serving_with_somewhere_to_move_or_training_may_leave() -> None:
    sc = _started()
    state = sc.policy.state
    check_leave(state, 2, separate_pool_capacity=0)
    with pytest.raises(ValueError, match=re.escape("unknown cell 3: the pool has cells 0..2")):
        check_leave(state, 3, separate_pool_capacity=0)
    with pytest.raises(LeaveRefused, match="cell 0 is the core: the core's hand-over is not built yet"):
        check_leave(state, 0, separate_pool_capacity=0)
    roles = list(state.roles)
    try:
        state.roles[1] = Role.TRAINING
        check_leave(state, 1, separate_pool_capacity=0)  # a training satellite: its micro-steps go back
        state.roles[1] = Role.DRAINING
        with pytest.raises(LeaveRefused, match="cell 1 is switching roles"):
            check_leave(state, 1, separate_pool_capacity=0)
        state.roles[0] = state.roles[1] = Role.TRAINING
        with pytest.raises(LeaveRefused, match="cell 2 is the only engine serving rollout"):
            check_leave(state, 2, separate_pool_capacity=0)
        check_leave(state, 2, separate_pool_capacity=4)  # the separate pool takes its calls
        state.roles[2] = Role.GONE
        with pytest.raises(LeaveRefused, match="cell 2 already left the pool"):
            check_leave(state, 2, separate_pool_capacity=0)
    finally:
        state.roles[:] = roles


class DrainingProxy(FakeProxy):
    """Records each drain and holds it until `release` is set; it moved 2 calls with 300 KV tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.drains: list[proxy_pb2.DrainRequest] = []
        self.release = asyncio.Event()

    async def Drain(self, request: proxy_pb2.DrainRequest, timeout: float) -> proxy_pb2.DrainResponse:
        self.drains.append(request)
        await self.release.wait()
        return proxy_pb2.DrainResponse(executions_moved=2, calls_rerouted=2, kv_migrated_tokens=300)


async def test_a_rollout_satellite_given_notice_is_drained_with_its_kv_and_leaves() -> None:
    sc = _started()
    proxy = DrainingProxy()
    executor, driver, routes = await _scheduler(sc, proxy)
    run = asyncio.create_task(driver.run())
    try:
        for refused, error in ((0, LeaveRefused), (7, ValueError)):
            with pytest.raises(error):
                await give_notice(driver, executor.departures, refused, separate_pool_capacity=0)
        assert proxy.drains == [] and routes == [] and sc.policy.state.roles == [Role.ROLLOUT] * 3

        notice = asyncio.create_task(give_notice(driver, executor.departures, 2, separate_pool_capacity=0))
        await eventually(lambda: proxy.drains, timeout_s=10, what="the drain of cell 2's engine")
        # Gone for the policy, still draining for GetState (the stack stops its agent only after this)
        assert sc.policy.state.roles[2] is Role.GONE and executor.facts.shell.departing == [2]
        assert proxy.tables[-1] == ["cell-0", "cell-1", "cell-2"]
        proxy.release.set()
        outcome = await asyncio.wait_for(notice, 10)
    finally:
        run.cancel()
    (drain,) = proxy.drains
    assert drain.engine_id == "cell-2" and drain.migrate_kv
    assert list(drain.destination_engine_ids) == ["cell-1", "cell-0"]
    assert routes == [{"g0.0": "cell-1"}, {"g1.0": "cell-0"}]
    assert proxy.tables[-1] == ["cell-0", "cell-1"]
    assert (outcome.cell, outcome.calls_rerouted, outcome.kv_migrated_tokens) == (2, 2, 300)
    assert executor.facts.shell.departing == []
    snap = sc.policy.snapshot()
    assert snap.cells_left == 1 and snap.cells_lost == 0 and snap.num_cells == 2
    assert driver.num_rejected == 0
    with pytest.raises(LeaveRefused, match="cell 2 already left the pool"):
        run = asyncio.create_task(driver.run())
        try:
            await give_notice(driver, executor.departures, 2, separate_pool_capacity=0)
        finally:
            run.cancel()


async def test_a_scheduler_restarted_before_the_drain_ended_drains_the_cell_again() -> None:
    """The departure is persisted with the policy's state (`ShellState.departing`): a restarted scheduler keeps
    the cell's engine in the table it publishes, drains it, and only then drops it."""
    sc = _started()
    sc.leave(2)  # gone for the policy; the killed scheduler had not drained it yet
    executor, _ = _executor(3, list(sc.policy.state.roles))
    proxy = DrainingProxy()
    proxy.release.set()
    executor._peers.proxy = proxy  # type: ignore[assignment]
    executor.facts.shell.departing.append(2)
    executor.facts.shell.stopping = True  # the open batch is not re-driven: no packer here
    assert ShellState.from_dict(executor.facts.shell.to_dict()).departing == [2]

    async def after_apply() -> None:
        executor.start_deferred()

    driver = Driver(sc.policy, executor.execute, after_apply)
    executor._driver = lambda: driver
    await executor.publish_engine_table()
    assert proxy.tables[-1] == ["cell-0", "cell-1", "cell-2"]
    assert executor.recover() == ["departure of cell 2"]
    await eventually(lambda: executor.facts.shell.departing == [], timeout_s=10, what="the drain again")
    (drain,) = proxy.drains
    assert drain.engine_id == "cell-2" and drain.migrate_kv
    assert proxy.tables[-1] == ["cell-0", "cell-1"]


class RefusingProxy(FakeProxy):
    """Answers every drain as the proxy does when no serving engine is left to take the calls in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.drains = 0

    async def Drain(self, request: proxy_pb2.DrainRequest, timeout: float) -> proxy_pb2.DrainResponse:
        self.drains += 1
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.FAILED_PRECONDITION,
            grpc.aio.Metadata(),
            grpc.aio.Metadata(),
            details="no serving engine to move cell-2's calls to",
        )


async def test_a_drain_the_proxy_fails_leaves_the_cell_out_and_the_scheduler_running() -> None:
    """The proxy refuses the drain: the notice answers DrainFailed with the proxy's reason, the cell is out of
    the pool and of the proxy's table, nothing stays departing, and the scheduler goes on (its task
    supervisor saw no failure, the driver still applies events)."""
    sc = _started()
    proxy = RefusingProxy()
    executor, driver, _ = await _scheduler(sc, proxy)
    run = asyncio.create_task(driver.run())
    try:
        with pytest.raises(
            DrainFailed,
            match="cell 2 left the pool, but the proxy did not drain its engine "
            r"\(FAILED_PRECONDITION: no serving engine to move cell-2's calls to\)",
        ):
            await asyncio.wait_for(give_notice(driver, executor.departures, 2, separate_pool_capacity=0), 10)
        await eventually(lambda: proxy.tables[-1] == ["cell-0", "cell-1"], timeout_s=10, what="cell-2 out")
        assert proxy.drains == 1 and executor.facts.shell.departing == []
        assert sc.policy.state.roles[2] is Role.GONE
        assert not run.done()
        with pytest.raises(LeaveRefused, match="cell 2 already left the pool"):
            await give_notice(driver, executor.departures, 2, separate_pool_capacity=0)
    finally:
        run.cancel()


async def test_a_training_satellite_given_notice_leaves_at_once_with_nothing_to_drain() -> None:
    """Its engine is out of the proxy's table: no Drain is sent (this proxy would hold one), the notice answers
    at once with nothing moved, the policy releases the micro-steps it claimed, and nothing stays departing."""
    sc = Scenario(num_cells=3, cell_capacity=2, group_size=1, batch_groups=2, phi=1.0, mu=2)
    sc.start()
    for group in ("g0", "g1", "g2", "g3", "g4", "g5"):  # the batch is ready, then nothing runs: every cell
        sc.finish_group(group)  # goes to training, one after another (the core first)
    sc.transitioned(0, Role.TRAINING)
    sc.transitioned(1, Role.TRAINING)
    assert sc.policy.state.roles == [Role.TRAINING, Role.TRAINING, Role.DRAINING]
    proxy = DrainingProxy()  # never released: a Drain sent would hang the notice
    executor, driver, _ = await _scheduler(sc, proxy)
    run = asyncio.create_task(driver.run())
    try:
        outcome = await asyncio.wait_for(
            give_notice(driver, executor.departures, 1, separate_pool_capacity=0), 10
        )
    finally:
        run.cancel()
    assert (outcome.cell, outcome.executions_moved, outcome.calls_rerouted, outcome.kv_migrated_tokens) == (
        1,
        0,
        0,
        0,
    )
    assert proxy.drains == [] and executor.facts.shell.departing == []
    assert sc.policy.state.roles == [Role.TRAINING, Role.GONE, Role.DRAINING]
    assert sc.policy.snapshot().cells_left == 1 and driver.num_rejected == 0

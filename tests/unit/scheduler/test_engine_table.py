"""The proxy's engine table under concurrent role transitions (colocate returns every cell at once), and a
cell that refuses to return to rollout while it is still in a batch."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import grpc

from gyre.lifecycle import TaskSupervisor
from gyre.v1 import cell_agent_pb2, common_pb2, proxy_pb2
from services.scheduler.driver import Driver
from services.scheduler.executor import ActionExecutor, ShellFacts
from services.scheduler.peers import Peers
from services.scheduler.persist import ShellState
from services.scheduler.policy import Role


class FakeProxy:
    """Records table updates; a drain takes a while, and no table update may land meanwhile."""

    def __init__(self) -> None:
        self.tables: list[list[str]] = []
        self.draining = 0
        self.updates_during_drain = 0

    async def Drain(self, request: proxy_pb2.DrainRequest, timeout: float) -> proxy_pb2.DrainResponse:
        self.draining += 1
        await asyncio.sleep(0.02)  # scenario: a drain takes a while
        self.draining -= 1
        return proxy_pb2.DrainResponse()

    async def UpdateRoutes(self, request: proxy_pb2.UpdateRoutesRequest, timeout: float) -> Any:
        self.updates_during_drain += self.draining > 0
        await asyncio.sleep(0.01)  # scenario: replies come back in any order
        if request.engines:
            self.tables.append([e.engine_id for e in request.engines])
        return proxy_pb2.UpdateRoutesResponse()


class FakeCell:
    async def SwitchRole(self, request: Any, timeout: float) -> cell_agent_pb2.SwitchRoleResponse:
        await asyncio.sleep(0.01)  # scenario: a switch takes a while
        return cell_agent_pb2.SwitchRoleResponse()


class CellInABatch(FakeCell):
    """Refuses its first `refusals` switches to rollout as a cell agent does while a JoinBatch holds its batch
    lock (one a scheduler started before it restarted, or one just accepted)."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals

    async def SwitchRole(self, request: Any, timeout: float) -> cell_agent_pb2.SwitchRoleResponse:
        if request.role == common_pb2.CELL_ROLE_ROLLOUT and self.refusals:
            self.refusals -= 1
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.FAILED_PRECONDITION,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                details="cell 0 is training on batch 'b6'; switch after it",
            )
        return await super().SwitchRole(request, timeout)


async def _nothing() -> None:
    return None


def _routed_driver(policy: Any, executor: ActionExecutor, proxy: Any) -> tuple[Driver, list[dict[str, str]]]:
    """A real Driver over `policy` executing through `executor`, and the routes each UpdateRoutes to `proxy`
    carried (execution → engine), in order."""
    routes: list[dict[str, str]] = []
    update = proxy.UpdateRoutes

    async def record(request: Any, timeout: float) -> Any:
        if request.routes:
            routes.append({r.execution_id: r.engine_id for r in request.routes})
        return await update(request, timeout)

    proxy.UpdateRoutes = record

    async def after_apply() -> None:
        executor.start_deferred()

    driver = Driver(policy, executor.execute, after_apply)
    executor._driver = lambda: driver
    return driver, routes


def _executor(num_cells: int, roles: list[Role]) -> tuple[ActionExecutor, FakeProxy]:
    proxy = FakeProxy()
    engines = [
        common_pb2.EngineEndpoint(engine_id=f"cell-{c}", url=f"http://127.0.0.1:{9000 + c}")
        for c in range(num_cells)
    ]
    peers = Peers(
        channels=[],
        cells=[FakeCell() for _ in range(num_cells)],
        proxy=proxy,  # type: ignore[arg-type]
        packer=None,
        runner=None,
        engines=engines,
    )  # type: ignore[arg-type]

    async def handle(make: Any, seq: int | None = None) -> None:
        return None

    driver = SimpleNamespace(
        policy=SimpleNamespace(state=SimpleNamespace(roles=roles, version=1)), now=lambda: 0.0, handle=handle
    )
    executor = ActionExecutor(
        driver=lambda: driver,
        peers=peers,
        dispatcher=None,  # type: ignore[arg-type]
        supervisor=TaskSupervisor("test"),
        facts=ShellFacts(max_steps=0, shell=ShellState()),
        separate_pool_capacity=0,
        persist=_nothing,
    )
    return executor, proxy


async def test_cells_returning_together_all_end_up_in_the_table() -> None:
    roles = [Role.ROLLOUT] * 3
    executor, proxy = _executor(3, roles)
    await executor.publish_engine_table()
    assert proxy.tables[-1] == ["cell-0", "cell-1", "cell-2"]
    # Colocate: every cell leaves together, then every cell comes back together. The policy's roles
    # change only when each TransitionCompleted is applied, i.e. after these calls return.
    await asyncio.gather(*(executor._transition(c, Role.TRAINING) for c in range(3)))
    roles[:] = [Role.TRAINING] * 3
    await asyncio.gather(*(executor._transition(c, Role.ROLLOUT) for c in range(3)))
    assert proxy.tables[-1] == ["cell-0", "cell-1", "cell-2"]
    assert proxy.updates_during_drain == 0


async def test_a_drained_cell_leaves_the_next_table() -> None:
    roles = [Role.ROLLOUT] * 3
    executor, proxy = _executor(3, roles)
    await executor.publish_engine_table()
    await executor._transition(0, Role.TRAINING)
    roles[0] = Role.TRAINING
    await executor._transition(1, Role.TRAINING)
    roles[1] = Role.TRAINING
    await executor._transition(1, Role.ROLLOUT)
    assert proxy.tables[-1] == ["cell-1", "cell-2"]


async def test_a_cell_still_in_a_batch_returns_to_rollout_once_it_has_left_it() -> None:
    """The switch is asked again until the cell has left its batch; before, the refusal crashed the
    scheduler, and its restart re-drove the same switch into the same refusal until it ran out of restarts
    (seen in tests/faults/test_faults.py)."""
    roles = [Role.TRAINING, Role.ROLLOUT]
    executor, proxy = _executor(2, roles)
    cell = CellInABatch(refusals=2)
    executor._peers.cells[0] = cell
    await executor._transition(0, Role.ROLLOUT)
    assert cell.refusals == 0
    assert proxy.tables[-1] == ["cell-0"]

"""Cells out of the pool: what the executor does for the policy's `RemoveCell`.

A cell lost for good (`RemoveCell(lost=True)`, translate.py): its pending transition and JoinBatch calls are
abandoned (a lost cell never answers) and its engine leaves the proxy's table; its executions were rerouted
by the RerouteExecutions before it, to recompute their prefix on the other engines.

A training satellite given notice (`RemoveCell(lost=False)` of a cell whose engine is out of the table): its
calls were abandoned above (its JoinBatch); its engine serves nothing, so `DrainCell` answers at once with
nothing moved. The stack then stops its agent, which first leaves its step (departure.py).

A rollout cell given notice (`RemoveCell(lost=False)`, departure.py): the proxy drains its engine first — it stops
taking calls, and its in-flight calls move to the other engines with their KV (`migrate_kv`) — then it leaves
the table and the `DrainCell` waiting for it answers with what moved. A drain the proxy fails does not stop
the scheduler: the cell leaves the table all the same and the notice answers `DrainFailed`. Until then the cell is in
`ShellState.departing` (persisted with the policy's state), so a scheduler restarted meanwhile keeps its
engine in the table it publishes and drains it again (executor.py `recover`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from gyre.log import get_logger
from gyre.v1 import proxy_pb2
from services.scheduler.departure import Departures, DrainFailed, DrainOutcome
from services.scheduler.driver import Driver
from services.scheduler.naming import engine_id
from services.scheduler.peers import Peers
from services.scheduler.persist import ShellState
from services.scheduler.policy import RemoveCell, destination_order

log = get_logger("gyre.scheduler.executor")

DRAIN_TIMEOUT_S = 600.0
"""A notice's drain waits for the cell's in-flight calls and their KV to move (the executor's RPC timeout)."""


class CellRemoval:
    """The part of `ActionExecutor` (executor.py) that takes cells out of the pool."""

    _driver: Callable[[], Driver]
    _peers: Peers
    _shell: ShellState
    _persist: Callable[[], Awaitable[None]]
    _pool_capacity: int
    _cell_tasks: dict[int, set[asyncio.Task[None]]]
    _joins: dict[int, asyncio.Task[None]]
    _routable: set[int]
    _table_lock: asyncio.Lock
    departures: Departures

    async def _call(
        self, rpc: Callable[..., Awaitable[Any]], request: Any, what: str, timeout_s: float
    ) -> Any:
        raise NotImplementedError  # ActionExecutor's: retried while the peer restarts

    def _abandon(self, cell: int) -> None:
        """Stop calling a cell that left the pool (a lost one never answers again)."""
        abandoned = self._cell_tasks.pop(cell, set())
        join = self._joins.pop(cell, None)
        if join is not None and not join.done():
            abandoned.add(join)
        for task in abandoned:
            task.cancel()
        if abandoned:
            log.info("cell_calls_abandoned", cell=cell, calls=len(abandoned))

    async def _drop_engine(self, a: RemoveCell) -> None:
        """Take the cell's engine out of the proxy's table (a restarted scheduler's table leaves it out)."""
        async with self._table_lock:
            self._routable.discard(a.cell)
            engines = [self._peers.engines[c] for c in sorted(self._routable)]
            if engines:  # an empty table keeps the proxy's; the next cell back in rollout replaces it
                await self._call(
                    self._peers.proxy.UpdateRoutes,
                    proxy_pb2.UpdateRoutesRequest(engines=engines),
                    "UpdateRoutes",
                    timeout_s=30,
                )
        log.warning("cell_removed", cell=a.cell, lost=a.lost)

    async def _leave(self, a: RemoveCell) -> None:
        """A cell given notice: its engine stops taking calls and its in-flight calls move to the other
        engines with their KV (the proxy's Drain), then it leaves the proxy's table. A training satellite's
        engine is not in the table: nothing to drain."""
        t0 = self._driver().now()
        try:
            roles = self._driver().policy.state.roles
            order = [engine_id(e) for e in destination_order(roles, self._pool_capacity) if e != a.cell]
            failure: grpc.aio.AioRpcError | None = None
            drain = proxy_pb2.DrainResponse()  # a training satellite's engine serves no call: nothing to move
            async with self._table_lock:
                if a.cell in self._routable:
                    try:
                        drain = await self._call(
                            self._peers.proxy.Drain,
                            proxy_pb2.DrainRequest(
                                engine_id=engine_id(a.cell), destination_engine_ids=order, migrate_kv=True
                            ),
                            f"Drain {engine_id(a.cell)}",
                            DRAIN_TIMEOUT_S,
                        )
                    except grpc.aio.AioRpcError as e:  # the cell leaves all the same (departure.DrainFailed)
                        failure = e
                    self._routable.discard(a.cell)
            await self._drop_engine(a)
        except asyncio.CancelledError:
            self.departures.forget(a.cell)
            raise
        except Exception as e:
            self.departures.failed(a.cell, e)
            raise
        if a.cell in self._shell.departing:
            self._shell.departing.remove(a.cell)
            await self._persist()
        if failure is not None:
            error = f"{failure.code().name}: {failure.details()}"
            log.warning("cell_left_undrained", cell=a.cell, error=error)
            self.departures.failed(
                a.cell,
                DrainFailed(
                    f"cell {a.cell} left the pool, but the proxy did not drain its engine ({error}): its calls "
                    "in flight fail over to the other engines once its agent stops, recomputing their prefix"
                ),
            )
            return
        outcome = DrainOutcome(
            cell=a.cell,
            executions_moved=drain.executions_moved,
            calls_rerouted=drain.calls_rerouted,
            kv_migrated_tokens=drain.kv_migrated_tokens,
            duration_s=round(self._driver().now() - t0, 3),
        )
        log.info(
            "cell_left",
            cell=a.cell,
            executions_moved=outcome.executions_moved,
            calls_rerouted=outcome.calls_rerouted,
            kv_migrated_tokens=outcome.kv_migrated_tokens,
            duration_s=outcome.duration_s,
        )
        self.departures.drained(outcome)

"""Executes the policy's actions against the other services.

    DispatchGroups    → Redis records + d counter + GroupDispatched (answered at once)
    StartExecutions   → start commands on the runners' work queue (answered at once)
    RerouteExecutions → proxy UpdateRoutes for those executions
    BeginTransition   → to training: proxy Drain (reroute + KV migration), then cell SwitchRole, then
                        JoinBatch if a batch is open; to rollout: cell SwitchRole with the newest
                        weights, then the engine is routable again
    OpenBatch         → packer OpenBatch, then JoinBatch on every training cell
    PublishWeights    → core PublishWeights to every rollout engine
    ScheduleTick      → a timer that posts a Tick
Long actions run as supervised tasks and report back through the driver.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from gyre.lifecycle import Supervisor
from gyre.log import get_logger
from gyre.v1 import cell_agent_pb2, common_pb2, packer_pb2, proxy_pb2
from services.scheduler.dispatch import Dispatcher
from services.scheduler.driver import Driver, MakeEvent
from services.scheduler.naming import engine_id
from services.scheduler.peers import Peers
from services.scheduler.policy import (
    Action,
    BeginTransition,
    DispatchGroups,
    EndBurst,
    GroupDispatched,
    OpenBatch,
    PublishWeights,
    RerouteExecutions,
    Role,
    ScheduleTick,
    StartExecutions,
    Tick,
    TransitionCompleted,
    WeightsPublished,
    destination_order,
)

log = get_logger("gyre.scheduler.executor")

RPC_TIMEOUT_S = 600.0


@dataclass
class BatchInfo:
    step: int
    batch_id: str
    final_in_burst: bool
    joined: set[int] = field(default_factory=set)


@dataclass
class RunFacts:
    """What the shell knows beyond the policy: the open batch, transitions, limits."""

    max_steps: int
    batch: BatchInfo | None = None
    transitions: list[dict[str, float | int | str]] = field(default_factory=list)
    stopping: bool = False


class ActionExecutor:
    def __init__(
        self,
        *,
        driver: Callable[[], Driver],
        peers: Peers,
        dispatcher: Dispatcher,
        supervisor: Supervisor,
        facts: RunFacts,
        separate_pool_capacity: int,
    ) -> None:
        self._driver = driver
        self._peers = peers
        self._dispatcher = dispatcher
        self._supervisor = supervisor
        self.facts = facts
        self._pool_capacity = separate_pool_capacity
        self._tick_handles: list[asyncio.TimerHandle] = []
        self.commanded: dict[str, int] = {}
        """Executions whose start was commanded, not yet confirmed started, and their engines."""
        self._joins: dict[int, asyncio.Task[None]] = {}
        """The JoinBatch call in flight per cell: a cell leaves training only after it returned."""
        self._routable: set[int] = set()
        """Cells whose engines the proxy's table lists (rollout cells, and a cell while it drains)."""
        self._table_lock = asyncio.Lock()
        """Serializes the proxy's table changes: `UpdateRoutes` replaces the whole table and marks every
        listed engine serving, so one sent while another cell drains (or from a stale view of the roles,
        when cells return to rollout together) would re-enable or drop an engine."""

    @property
    def driver(self) -> Driver:
        return self._driver()

    async def execute(self, action: Action) -> list[MakeEvent]:
        match action:
            case DispatchGroups():
                return await self._dispatch(action)
            case StartExecutions():
                return await self._start(action)
            case RerouteExecutions():
                await self._reroute(action)
            case BeginTransition():
                self._supervisor.spawn(self._transition(action), f"transition-{action.cell}-{action.to_role}")
            case OpenBatch():
                self._supervisor.spawn(self._open_batch(action.step), f"open-batch-{action.step}")
            case EndBurst():
                log.info("burst_ended", version=action.version)
            case PublishWeights():
                self._supervisor.spawn(self._publish(action.version), f"publish-{action.version}")
            case ScheduleTick():
                delay = max(0.0, action.at_s - self.driver.now())
                loop = asyncio.get_running_loop()
                self._tick_handles = [h for h in self._tick_handles if h.when() > loop.time()]  # drop fired ones
                self._tick_handles.append(loop.call_later(delay, self.driver.post, lambda now: Tick(now)))
            case _:
                raise AssertionError(f"unhandled action {action!r}")
        return []

    # -- dispatch and start ------------------------------------------------------------------------
    async def _dispatch(self, a: DispatchGroups) -> list[MakeEvent]:
        if self.facts.stopping:
            log.info("dispatch_skipped_stopping", groups=a.num_groups)
            return []
        burst = self.driver.policy.state.burst
        group_ids = await self._dispatcher.dispatch(a.num_groups, a.group_size, a.policy_version, burst)
        return [_dispatched(g, a.group_size, a.policy_version) for g in group_ids]

    async def _start(self, a: StartExecutions) -> list[MakeEvent]:
        if self.facts.stopping:  # the run is over: queued executions stay unstarted (reported cancelled)
            return []
        for execution_id in await self._dispatcher.start(engine_id(a.engine), a.count):
            self.commanded[execution_id] = a.engine
        return []

    async def _reroute(self, a: RerouteExecutions) -> None:
        routes = [proxy_pb2.Route(execution_id=e, engine_id=engine_id(a.destination)) for e in a.execution_ids]
        await self._peers.proxy.UpdateRoutes(proxy_pb2.UpdateRoutesRequest(routes=routes), timeout=30)

    # -- transitions -------------------------------------------------------------------------------
    async def _transition(self, a: BeginTransition) -> None:
        cell, t0 = a.cell, self.driver.now()
        stub = self._peers.cells[cell]
        if a.to_role is Role.TRAINING:
            roles = self.driver.policy.state.roles
            order = [engine_id(e) for e in destination_order(roles, self._pool_capacity) if e != cell]
            async with self._table_lock:
                drain = await self._peers.proxy.Drain(
                    proxy_pb2.DrainRequest(engine_id=engine_id(cell), destination_engine_ids=order, migrate_kv=True),
                    timeout=RPC_TIMEOUT_S,
                )
                self._routable.discard(cell)  # drained: the next table leaves it out
            resp = await stub.SwitchRole(
                cell_agent_pb2.SwitchRoleRequest(role=common_pb2.CELL_ROLE_TRAINING), timeout=RPC_TIMEOUT_S
            )
            log.info("cell_training", cell=cell, calls_rerouted=drain.calls_rerouted,
                     kv_migrated_tokens=drain.kv_migrated_tokens, duration_s=resp.duration_s)
        else:
            join = self._joins.get(cell)
            if join is not None:
                await asyncio.gather(join, return_exceptions=True)
            version = self.driver.policy.state.version
            resp = await stub.SwitchRole(
                cell_agent_pb2.SwitchRoleRequest(role=common_pb2.CELL_ROLE_ROLLOUT, weight_version=version),
                timeout=RPC_TIMEOUT_S,
            )
            await self.publish_engine_table(add=cell)
            log.info("cell_rollout", cell=cell, weight_version=resp.weight_version, duration_s=resp.duration_s)
        self.facts.transitions.append(
            {"cell": cell, "to": str(a.to_role), "started_s": t0, "duration_s": self.driver.now() - t0}
        )
        await self.driver.handle(lambda now: TransitionCompleted(now, cell, a.to_role))
        batch = self.facts.batch
        if a.to_role is Role.TRAINING and batch is not None:
            self._join(cell, batch)

    async def publish_engine_table(self, *, add: int | None = None) -> None:
        """Send the proxy the engines of the routable cells, plus `add` (a cell back in rollout).
        Without `add` (the run starts or resumes): the rollout cells of the policy's roles, the
        lowest of them the default engine."""
        async with self._table_lock:
            default = ""
            if add is not None:
                self._routable.add(add)
            else:
                roles = self.driver.policy.state.roles
                self._routable = {c for c, r in enumerate(roles) if r is Role.ROLLOUT}
                default = engine_id(min(self._routable)) if self._routable else ""
            engines = [self._peers.engines[c] for c in sorted(self._routable)]
            await self._peers.proxy.UpdateRoutes(
                proxy_pb2.UpdateRoutesRequest(engines=engines, default_engine_id=default), timeout=30
            )

    # -- batches -----------------------------------------------------------------------------------
    async def _open_batch(self, step: int) -> None:
        if self.facts.max_steps and step >= self.facts.max_steps:
            self.facts.stopping = True
            self.facts.batch = None
            log.info("max_steps_reached", steps=step)
            return
        state = self.driver.policy.state
        final = step + 1 - state.burst_start_version >= self.driver.policy.params.mu
        policy_version = state.version
        resp = await self._peers.packer.OpenBatch(
            packer_pb2.OpenBatchRequest(
                step=step, num_groups=self.driver.policy.params.batch_groups, policy_version=policy_version
            ),
            timeout=60,
        )
        batch = BatchInfo(step=step, batch_id=resp.batch_id, final_in_burst=final)
        self.facts.batch = batch
        for cell, role in enumerate(self.driver.policy.state.roles):
            if role is Role.TRAINING:
                self._join(cell, batch)

    def _join(self, cell: int, batch: BatchInfo) -> None:
        if cell in batch.joined:
            return
        batch.joined.add(cell)
        self._joins[cell] = self._supervisor.spawn(self._join_batch(cell, batch), f"join-{cell}-{batch.step}")

    async def _join_batch(self, cell: int, batch: BatchInfo) -> None:
        request = cell_agent_pb2.JoinBatchRequest(
            batch_id=batch.batch_id, step=batch.step, final_in_burst=batch.final_in_burst
        )
        try:
            resp = await self._peers.cells[cell].JoinBatch(request, timeout=RPC_TIMEOUT_S * 6)
        except grpc.aio.AioRpcError as e:
            log.error("join_batch_failed", cell=cell, batch=batch.batch_id, code=str(e.code()), detail=e.details())
            raise
        log.info("cell_left_batch", cell=cell, batch=batch.batch_id, microsteps=resp.microsteps)

    # -- publication -------------------------------------------------------------------------------
    async def _publish(self, version: int) -> None:
        roles = self.driver.policy.state.roles
        engines = [self._peers.engines[c] for c, r in enumerate(roles) if r is Role.ROLLOUT]
        resp = await self._peers.cells[0].PublishWeights(
            cell_agent_pb2.PublishWeightsRequest(engines=engines), timeout=RPC_TIMEOUT_S
        )
        log.info("weights_published", version=resp.policy_version, engines=len(engines), duration_s=resp.duration_s)
        await self.driver.handle(lambda now: WeightsPublished(now, version))

    def cancel_timers(self) -> None:
        for handle in self._tick_handles:
            handle.cancel()


def _dispatched(group_id: str, size: int, version: int) -> MakeEvent:
    return lambda now: GroupDispatched(now, group_id, size, version)

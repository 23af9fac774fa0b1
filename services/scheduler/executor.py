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
    ReleaseMicroSteps → recorded only: the training cells reclaim a dead cell's claims themselves (by
                        heartbeat, services/cell_agent/step_runner.py)
    RemoveCell        → the cell's transition and JoinBatch calls are abandoned and its engine leaves the
                        proxy's table (its executions were rerouted by the RerouteExecutions before it);
                        a cell given notice (not lost) whose engine serves is first drained through the
                        proxy: its in-flight calls move with their KV, and its `DrainCell` answers
                        (removal.py, departure.py); until then it is in `ShellState.departing`, so a
                        restarted scheduler drains it again. A training satellite given notice has no
                        engine to drain: stopped, its agent gives back what it claimed (departure.py)

Long actions run as supervised tasks that report back through the driver, and start only once the
state that emitted them is persisted (`start_deferred`, called after each save): a scheduler killed at
any moment finds every long action it had begun in its stored state, and re-drives it after its restart
(`recover`). The answered-at-once actions are idempotent instead (services/scheduler/dispatch.py). Every
call to a peer is retried while the peer is down or restarting (`call_peer`); a cell agent that restarted
while the policy has it in training is switched back to training before it rejoins the batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import grpc

from gyre.lifecycle import TaskSupervisor
from gyre.log import get_logger
from gyre.v1 import cell_agent_pb2, common_pb2, packer_pb2, proxy_pb2
from services.scheduler.departure import Departures
from services.scheduler.dispatch import Dispatcher
from services.scheduler.driver import Driver, MakeEvent
from services.scheduler.naming import engine_id
from services.scheduler.peers import RETRYABLE, Peers, call_peer
from services.scheduler.persist import ShellState
from services.scheduler.policy import (
    Action,
    BeginTransition,
    DispatchGroups,
    EndBurst,
    GroupDispatched,
    OpenBatch,
    PublishWeights,
    ReleaseMicroSteps,
    RemoveCell,
    RerouteExecutions,
    Role,
    ScheduleTick,
    StartExecutions,
    Tick,
    TransitionCompleted,
    WeightsPublished,
    destination_order,
)
from services.scheduler.removal import CellRemoval

log = get_logger("gyre.scheduler.executor")

RPC_TIMEOUT_S = 600.0


@dataclass
class BatchInfo:
    step: int
    batch_id: str
    final_in_burst: bool
    joined: set[int] = field(default_factory=set)


@dataclass
class ShellFacts:
    """What the shell knows beyond the policy: the open batch, limits, its persisted facts."""

    max_steps: int
    shell: ShellState
    peer_retry_s: float = 300.0
    batch: BatchInfo | None = None

    @property
    def stopping(self) -> bool:
        return self.shell.stopping


class ActionExecutor(CellRemoval):
    def __init__(
        self,
        *,
        driver: Callable[[], Driver],
        peers: Peers,
        dispatcher: Dispatcher,
        supervisor: TaskSupervisor,
        facts: ShellFacts,
        separate_pool_capacity: int,
        persist: Callable[[], Awaitable[None]],
    ) -> None:
        self._driver = driver
        self._peers = peers
        self._dispatcher = dispatcher
        self._supervisor = supervisor
        self.facts = facts
        self._shell = facts.shell
        self._pool_capacity = separate_pool_capacity
        self._persist = persist
        self._tick_handles: list[asyncio.TimerHandle] = []
        self.commanded = facts.shell.commanded
        """Executions whose start was commanded, not yet confirmed started, and their engines."""
        self._deferred: list[tuple[Coroutine[Any, Any, None], str, int | None]] = []
        """Long actions emitted by the event being applied (and the cell each is about): started once the
        state is persisted."""
        self._cell_tasks: dict[int, set[asyncio.Task[None]]] = {}
        """The transitions in flight per cell: abandoned when the cell leaves the pool."""
        self._joins: dict[int, asyncio.Task[None]] = {}
        """The JoinBatch call in flight per cell: a cell leaves training only after it returned."""
        self._routable: set[int] = set()
        """Cells whose engines the proxy's table lists (rollout cells, and a cell while it drains)."""
        self.departures = Departures()
        """The `DrainCell` calls waiting for their cell's drain."""
        self._table_lock = asyncio.Lock()
        """Serializes the proxy's table changes: `UpdateRoutes` replaces the whole table and marks every
        listed engine serving, so one sent while another cell drains (or from a stale view of the roles,
        when cells return to rollout together) would re-enable or drop an engine."""

    @property
    def driver(self) -> Driver:
        return self._driver()

    async def _call(
        self,
        rpc: Callable[..., Awaitable[Any]],
        request: Any,
        what: str,
        timeout_s: float = RPC_TIMEOUT_S,
        retry_on: frozenset[grpc.StatusCode] = RETRYABLE,
    ) -> Any:
        return await call_peer(
            rpc, request, timeout_s=timeout_s, retry_s=self.facts.peer_retry_s, what=what, retry_on=retry_on
        )

    async def execute(self, action: Action) -> list[MakeEvent]:
        match action:
            case DispatchGroups():
                return await self._dispatch(action)
            case StartExecutions():
                return await self._start(action)
            case RerouteExecutions():
                await self._reroute(action)
            case BeginTransition():
                self._defer(
                    self._transition(action.cell, action.to_role),
                    f"transition-{action.cell}-{action.to_role}",
                    action.cell,
                )
            case OpenBatch():
                self._defer(self._open_batch(action.step), f"open-batch-{action.step}")
            case EndBurst():
                log.info("burst_ended", version=action.version)
            case PublishWeights():
                self._defer(self._publish([action.version]), f"publish-{action.version}")
            case ScheduleTick():
                delay = max(0.0, action.at_s - self.driver.now())
                loop = asyncio.get_running_loop()
                self._tick_handles = [
                    h for h in self._tick_handles if h.when() > loop.time()
                ]  # drop fired ones
                self._tick_handles.append(loop.call_later(delay, self.driver.post, lambda now: Tick(now)))
            case ReleaseMicroSteps():
                log.info("microsteps_released", cell=action.cell, step=action.step)
            case RemoveCell():
                self._abandon(action.cell)
                serving = action.cell in self._routable  # a training cell's engine serves no call
                if not action.lost and serving and action.cell not in self.facts.shell.departing:
                    self.facts.shell.departing.append(action.cell)
                leave = self._drop_engine(action) if action.lost else self._leave(action)
                self._defer(leave, f"remove-{action.cell}")
            case _:
                raise AssertionError(f"unhandled action {action!r}")
        return []

    def _defer(self, coro: Coroutine[Any, Any, None], name: str, cell: int | None = None) -> None:
        self._deferred.append((coro, name, cell))

    def start_deferred(self) -> None:
        """Start the long actions of the events applied so far (their state is persisted now)."""
        deferred, self._deferred = self._deferred, []
        for coro, name, cell in deferred:
            if cell is not None and self.driver.policy.state.roles[cell] is Role.GONE:
                coro.close()  # the cell left the pool in the same apply
                continue
            task = self._supervisor.spawn(coro, name)
            if cell is not None:
                tasks = self._cell_tasks.setdefault(cell, set())
                tasks.add(task)
                task.add_done_callback(tasks.discard)

    # -- after a restart ------------------------------------------------------------------------------
    def recover(self) -> list[str]:
        """Re-drive every long action the restored state has in flight (each is idempotent on its peer):
        transitions of cells in draining or returning (the SwitchRole answers with the cell's role, so a
        cell that already switched just reports it), publications not yet reported, and the open batch
        (OpenBatch again, JoinBatch on every training cell). Returns what was re-driven, for the log."""
        state = self.driver.policy.state
        redriven: list[str] = []
        for cell, role in enumerate(state.roles):
            if role is Role.DRAINING:
                self._defer(self._transition(cell, Role.TRAINING), f"transition-{cell}-training", cell)
                redriven.append(f"transition {cell}→training")
            elif role is Role.RETURNING:
                self._defer(self._transition(cell, Role.ROLLOUT), f"transition-{cell}-rollout", cell)
                redriven.append(f"transition {cell}→rollout")
        for cell in self.facts.shell.departing:
            self._defer(self._leave(RemoveCell(cell, lost=False)), f"remove-{cell}")
            redriven.append(f"departure of cell {cell}")
        if state.pending_publications:
            versions = list(state.pending_publications)
            self._defer(self._publish(versions), f"publish-{versions[0]}")
            redriven.append(f"publish {versions}")
        if state.batch_step is not None and not self.facts.stopping:
            self._defer(self._open_batch(state.batch_step), f"open-batch-{state.batch_step}")
            redriven.append(f"batch {state.batch_step}")
        self.start_deferred()
        return redriven

    # -- dispatch and start ------------------------------------------------------------------------
    async def _dispatch(self, a: DispatchGroups) -> list[MakeEvent]:
        if self.facts.stopping:
            log.info("dispatch_skipped_stopping", groups=a.num_groups)
            return []
        burst = self.driver.policy.state.burst
        group_ids = await self._dispatcher.dispatch(
            a.num_groups, a.group_size, a.policy_version, burst, first_group=a.first_group
        )
        return [_dispatched(g, a.group_size, a.policy_version) for g in group_ids]

    async def _start(self, a: StartExecutions) -> list[MakeEvent]:
        if self.facts.stopping:  # the run is over: queued executions stay unstarted (reported cancelled)
            return []
        for execution_id in await self._dispatcher.start(engine_id(a.engine), a.count, first=a.first):
            self.commanded[execution_id] = a.engine
        return []

    async def _reroute(self, a: RerouteExecutions) -> None:
        routes = [
            proxy_pb2.Route(execution_id=e, engine_id=engine_id(a.destination)) for e in a.execution_ids
        ]
        await self._call(
            self._peers.proxy.UpdateRoutes,
            proxy_pb2.UpdateRoutesRequest(routes=routes),
            "UpdateRoutes",
            timeout_s=30,
        )
        log.info(
            "executions_rerouted",
            source=a.source,
            destination=a.destination,
            executions=len(a.execution_ids),
            recompute=a.recompute,
        )

    # -- transitions -------------------------------------------------------------------------------
    async def _transition(self, cell: int, to_role: Role) -> None:
        t0 = self.driver.now()
        stub = self._peers.cells[cell]
        if to_role is Role.TRAINING:
            roles = self.driver.policy.state.roles
            order = [engine_id(e) for e in destination_order(roles, self._pool_capacity) if e != cell]
            async with self._table_lock:
                drain = await self._call(
                    self._peers.proxy.Drain,
                    proxy_pb2.DrainRequest(
                        engine_id=engine_id(cell), destination_engine_ids=order, migrate_kv=True
                    ),
                    f"Drain {engine_id(cell)}",
                )
                self._routable.discard(cell)  # drained: the next table leaves it out
            resp = await self._call(
                stub.SwitchRole,
                cell_agent_pb2.SwitchRoleRequest(role=common_pb2.CELL_ROLE_TRAINING),
                f"SwitchRole cell {cell} training",
            )
            log.info(
                "cell_training",
                cell=cell,
                calls_rerouted=drain.calls_rerouted,
                kv_migrated_tokens=drain.kv_migrated_tokens,
                duration_s=resp.duration_s,
            )
        else:
            join = self._joins.get(cell)
            if join is not None:
                await asyncio.gather(join, return_exceptions=True)
            version = self.driver.policy.state.version
            # A cell still in a batch refuses the switch (FAILED_PRECONDITION) until it leaves it: a JoinBatch
            # this scheduler did not start (one from before it restarted) is waited out, as a restart is.
            resp = await self._call(
                stub.SwitchRole,
                cell_agent_pb2.SwitchRoleRequest(role=common_pb2.CELL_ROLE_ROLLOUT, weight_version=version),
                f"SwitchRole cell {cell} rollout",
                retry_on=RETRYABLE | {grpc.StatusCode.FAILED_PRECONDITION},
            )
            await self.publish_engine_table(add=cell)
            log.info(
                "cell_rollout", cell=cell, weight_version=resp.weight_version, duration_s=resp.duration_s
            )
        log.info("transition_done", cell=cell, to=str(to_role), duration_s=round(self.driver.now() - t0, 3))
        await self.driver.handle(lambda now: TransitionCompleted(now, cell, to_role))
        batch = self.facts.batch
        # Only while the policy still wants the cell in this batch: TransitionCompleted may have sent it
        # back to rollout at once (the batch's step was taken while it switched), and a JoinBatch started
        # then would hold the cell's batch lock under that switch.
        if to_role is Role.TRAINING and batch is not None and self._joining(cell, batch):
            self._join(cell, batch)

    async def publish_engine_table(self, *, add: int | None = None) -> None:
        """Send the proxy the engines of the routable cells, plus `add` (a cell back in rollout).
        Without `add` (the run starts or resumes): the rollout cells of the policy's roles and the cells
        still draining or departing (a drain re-driven after a restart finds its engine in the table), the
        lowest rollout cell the default engine."""
        async with self._table_lock:
            default = ""
            if add is not None:
                self._routable.add(add)
            else:
                roles = self.driver.policy.state.roles
                self._routable = {c for c, r in enumerate(roles) if r in (Role.ROLLOUT, Role.DRAINING)}
                self._routable.update(self.facts.shell.departing)
                serving = [c for c, r in enumerate(roles) if r is Role.ROLLOUT]
                default = engine_id(min(serving)) if serving else ""
            engines = [self._peers.engines[c] for c in sorted(self._routable)]
            await self._call(
                self._peers.proxy.UpdateRoutes,
                proxy_pb2.UpdateRoutesRequest(engines=engines, default_engine_id=default),
                "UpdateRoutes",
                timeout_s=30,
            )

    # -- batches -----------------------------------------------------------------------------------
    async def _open_batch(self, step: int) -> None:
        if self.facts.stopping or (self.facts.max_steps and step >= self.facts.max_steps):
            self.facts.shell.stopping = True
            self.facts.batch = None
            await self._persist()
            log.info("batch_not_opened", steps=step, reason=self.facts.shell.stop_reason or "max_steps")
            return
        state = self.driver.policy.state
        final = step + 1 - state.burst_start_version >= self.driver.policy.params.mu
        policy_version = state.version
        resp = await self._call(
            self._peers.packer.OpenBatch,
            packer_pb2.OpenBatchRequest(
                step=step, num_groups=self.driver.policy.params.batch_groups, policy_version=policy_version
            ),
            f"OpenBatch {step}",
            timeout_s=60,
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

    def _joining(self, cell: int, batch: BatchInfo) -> bool:
        """`cell` should still take part in `batch`: the batch is the open one and the cell trains."""
        state = self.driver.policy.state
        return (
            self.facts.batch is batch
            and state.batch_step == batch.step
            and state.roles[cell] is Role.TRAINING
        )

    async def _join_batch(self, cell: int, batch: BatchInfo) -> None:
        request = cell_agent_pb2.JoinBatchRequest(
            batch_id=batch.batch_id, step=batch.step, final_in_burst=batch.final_in_burst
        )
        stub = self._peers.cells[cell]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.facts.peer_retry_s
        while True:
            try:
                resp = await self._call(
                    stub.JoinBatch,
                    request,
                    f"JoinBatch cell {cell} {batch.batch_id}",
                    timeout_s=RPC_TIMEOUT_S * 6,
                )
                log.info("cell_left_batch", cell=cell, batch=batch.batch_id, microsteps=resp.microsteps)
                return
            except grpc.aio.AioRpcError as e:
                if not self._joining(cell, batch):
                    log.info("join_batch_abandoned", cell=cell, batch=batch.batch_id, code=e.code().name)
                    return
                if e.code() is not grpc.StatusCode.FAILED_PRECONDITION or loop.time() > deadline:
                    log.error(
                        "join_batch_failed",
                        cell=cell,
                        batch=batch.batch_id,
                        code=str(e.code()),
                        detail=e.details(),
                    )
                    raise
                await self._repair_training(cell, e.details() or "")

    async def _repair_training(self, cell: int, why: str) -> None:
        """The policy has `cell` in training but the cell refused a batch: a restarted cell agent comes back
        in rollout, so switch it to training again (it takes no part in the policy's ledger meanwhile: its
        engine is out of the proxy's table). Anything else (the core still resuming) is waited out."""
        status = await self._call(
            self._peers.cells[cell].GetStatus,
            cell_agent_pb2.GetCellStatusRequest(),
            f"GetStatus cell {cell}",
            timeout_s=30,
        )
        if status.role == common_pb2.CELL_ROLE_ROLLOUT:
            log.warning("cell_back_in_rollout_while_training", cell=cell, reason=why[:200])
            await self._call(
                self._peers.cells[cell].SwitchRole,
                cell_agent_pb2.SwitchRoleRequest(role=common_pb2.CELL_ROLE_TRAINING),
                f"SwitchRole cell {cell} training (repair)",
            )
        else:
            log.warning(
                "join_batch_refused", cell=cell, role=common_pb2.CellRole.Name(status.role), reason=why[:200]
            )
            await asyncio.sleep(1.0)

    # -- publication -------------------------------------------------------------------------------
    async def _publish(self, versions: list[int]) -> None:
        for version in versions:
            roles = self.driver.policy.state.roles
            engines = [self._peers.engines[c] for c, r in enumerate(roles) if r is Role.ROLLOUT]
            resp = await self._call(
                self._peers.cells[0].PublishWeights,
                cell_agent_pb2.PublishWeightsRequest(engines=engines),
                f"PublishWeights {version}",
            )
            log.info(
                "weights_published",
                version=resp.policy_version,
                engines=len(engines),
                duration_s=resp.duration_s,
            )
            await self.driver.handle(lambda now, v=version: WeightsPublished(now, v))  # type: ignore[misc]

    def cancel_timers(self) -> None:
        for handle in self._tick_handles:
            handle.cancel()


def _dispatched(group_id: str, size: int, version: int) -> MakeEvent:
    return lambda now: GroupDispatched(now, group_id, size, version)

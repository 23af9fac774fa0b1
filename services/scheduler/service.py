"""The scheduler service: the shell around the policy state machine.

It feeds the policy real events (from NATS, from RPC completions and a clock) and executes its
actions on the other services (see executor.py). `GetState` serves `gyre status`;
`DrainCell` serves `gyre cell drain ID`, a cell's notice that it leaves the pool (departure.py).

Restart-safe: the whole state is persisted after every applied event (persist.py). A restarted
scheduler restores it, asks every cell agent for its role, re-drives the long actions that were in
flight (executor.py `recover`), and re-reads the event stream from the first event the stored state
does not include (its durable consumer is re-created at that sequence), so each bus event is applied
exactly once, in stream order, whatever moment the previous scheduler was killed at.

    python -m services.scheduler --config runs/<run>/config.yaml
"""

from __future__ import annotations

import asyncio

import grpc
from google.protobuf.message import Message

from gyre.bus import Delivery
from gyre.metrics.writer import StepMetricsWriter
from gyre.roles import role_name
from gyre.rpc import INVALID_ARGUMENT, ErrorStatus
from gyre.service import GyreService
from gyre.tasks import TaskSet
from gyre.v1 import common_pb2, runner_pb2, scheduler_pb2, scheduler_pb2_grpc
from gyre.v1 import events_pb2 as ev
from services.scheduler import persist
from services.scheduler.departure import DrainFailed, LeaveRefused, give_notice
from services.scheduler.dispatch import Dispatcher, QuerySource
from services.scheduler.driver import Driver
from services.scheduler.executor import ActionExecutor, ShellFacts
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.mismatch_gate import MismatchGate
from services.scheduler.naming import ROLE_TO_PROTO
from services.scheduler.params import policy_params
from services.scheduler.peers import Peers, call_peer
from services.scheduler.persist import ShellState
from services.scheduler.policy import (
    Mode,
    Policy,
    Role,
    RunStarted,
    Tick,
)
from services.scheduler.translate import CONSUMED, EventTranslator

_MODES = {
    Mode.ELASTIC: common_pb2.SCHEDULING_MODE_ELASTIC,
    Mode.ASYNC: common_pb2.SCHEDULING_MODE_ASYNC,
    Mode.COLOCATE: common_pb2.SCHEDULING_MODE_COLOCATE,
}


class SchedulerService(GyreService):
    """Owns the run: dispatch, start decisions, the capacity ledger, waterlevel, transitions, bursts."""

    name = "scheduler"
    error_statuses = (
        ErrorStatus(LeaveRefused, grpc.StatusCode.FAILED_PRECONDITION),
        ErrorStatus(DrainFailed, grpc.StatusCode.ABORTED),
        INVALID_ARGUMENT,
    )

    async def setup(self) -> None:
        cfg = self.config.scheduler
        self.metrics = SchedulerMetrics(
            self.metrics_registry,
            snapshot=lambda: self.policy.snapshot() if hasattr(self, "policy") else None,
            driver=lambda: getattr(self, "driver", None),
        )
        # Per-step training metrics (metrics.jsonl and the configured sinks): a sink whose package is
        # missing stops the start here.
        self.step_metrics = StepMetricsWriter(
            self.bus, self.config.metrics, run_dir=self.config.run.path, run_id=self.config.run.id
        )
        self.step_metrics.open()
        # Every dispatched task is loaded here: a malformed one stops the start, naming file and key.
        tasks = TaskSet.from_section(self.config.tasks)
        queries = QuerySource(tasks, cfg.seed)
        for warning in tasks.warnings:
            self.log.warning("task_not_reproduced_locally", detail=warning)
        self.params = policy_params(cfg)
        self.peers = Peers.connect(self.config)
        self.dispatcher = Dispatcher(
            self.redis,
            self.keys,
            self.bus,
            profile=cfg.profile or "generic",
            queries=queries,
            group_size=cfg.group_size,
        )
        restored = await persist.restore(self.redis, self.keys.scheduler_state(), self.params)
        self.resumed = restored is not None
        self.policy = Policy(self.params, restored.state if restored else None)
        shell = restored.shell if restored else ShellState()
        self.facts = ShellFacts(max_steps=cfg.max_steps, shell=shell, peer_retry_s=cfg.peer_retry_s)
        self.executor = ActionExecutor(
            driver=lambda: self.driver,
            peers=self.peers,
            dispatcher=self.dispatcher,
            supervisor=self.supervisor,
            facts=self.facts,
            separate_pool_capacity=cfg.separate_pool_capacity,
            persist=self.persist_state,
        )
        self.translator = EventTranslator(shell, MismatchGate(cfg.mismatch_gate))
        self.driver = Driver(
            self.policy,
            self.executor.execute,
            self._after_apply,
            start_s=restored.state.now_s if restored else 0.0,
            applied_seq=restored.applied_seq if restored else 0,
        )
        if restored is not None:
            snap = self.policy.snapshot()
            self.log.info(
                "scheduler_resumed",
                version=snap.version,
                dispatched=snap.dispatched,
                started=snap.started,
                finished=snap.finished,
                roles=[str(r) for r in snap.roles],
                batch=snap.batch_step,
                pending_publications=self.policy.state.pending_publications,
                applied_seq=restored.applied_seq,
            )
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(_Servicer(self), self.server)
        self.supervisor.spawn(self.driver.run(), "driver")
        self.supervisor.spawn(self.step_metrics.run(), "step-metrics")
        self.supervisor.spawn(self._begin(), "begin")

    async def persist_state(self) -> None:
        await persist.save(
            self.redis, self.keys.scheduler_state(), self.policy, self.facts.shell, self.driver.applied_seq
        )

    async def _after_apply(self) -> None:
        await self.persist_state()
        self.executor.start_deferred()

    async def _begin(self) -> None:
        """Wait for the engines, publish the engine table to the proxy, then start (or resume) the run."""
        roles = await self._wait_for_peers()
        await self.executor.publish_engine_table()
        if self.resumed:
            policy_roles = [str(r) for r in self.policy.state.roles]
            self.log.info(
                "cells_reconciled",
                policy_roles=policy_roles,
                cell_roles=roles,
                redriven=self.executor.recover(),
            )
        await self.bus.consume(
            "scheduler",
            list(CONSUMED),
            self._on_event,
            max_ack_pending=1024,
            ack_wait_s=120.0,
            batch=4,
            start_seq=self.driver.applied_seq + 1,
        )
        if not self.resumed:
            await self.driver.handle(lambda now: RunStarted(now))
        self.supervisor.spawn(self._ticker(), "ticker")

    async def _wait_for_peers(self, timeout_s: float = 120.0) -> list[str]:
        """Every cell agent's role, once each answers (a cell removed from the pool is not asked)."""
        from gyre.v1 import cell_agent_pb2

        deadline = asyncio.get_running_loop().time() + timeout_s
        roles: list[str] = []
        policy_roles = self.policy.state.roles
        for cell, stub in enumerate(self.peers.cells):
            if cell < len(policy_roles) and policy_roles[cell] is Role.GONE:
                roles.append(str(Role.GONE))
                continue
            while True:
                try:
                    status = await stub.GetStatus(cell_agent_pb2.GetCellStatusRequest(), timeout=5)
                    roles.append(role_name(status.role))
                    break
                except grpc.aio.AioRpcError:
                    if asyncio.get_running_loop().time() > deadline:
                        raise TimeoutError(
                            f"cell agent {cell} did not answer within {timeout_s:.0f} s"
                        ) from None
                    await asyncio.sleep(0.5)
        return roles

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.config.scheduler.tick_s)
            self.driver.post(lambda now: Tick(now))

    # -- events --------------------------------------------------------------------------------------
    async def _on_event(self, event: Message, delivery: Delivery) -> None:
        if delivery.stream_seq <= self.driver.applied_seq:  # a redelivery of an event already applied
            return
        if isinstance(event, ev.GroupPacked):
            self.metrics.group_staleness.observe(event.staleness)
            self.facts.shell.packed_executions += self.config.scheduler.group_size
            self.facts.shell.executions_without_targets += event.num_executions_without_targets
        await self.driver.handle(self.translator.translate(event), seq=delivery.stream_seq)

    async def teardown(self) -> None:
        if hasattr(self, "step_metrics"):
            self.step_metrics.close()
        if hasattr(self, "executor"):
            self.executor.cancel_timers()
        if hasattr(self, "peers"):
            await self.peers.close()

    # -- queries -------------------------------------------------------------------------------------
    def state_proto(self) -> scheduler_pb2.SchedulerState:
        snap = self.policy.snapshot()
        loads = snap.engine_loads
        departing = self.facts.shell.departing
        cells = [
            scheduler_pb2.CellState(
                cell=c,
                # a cell given notice shows DRAINING until its calls moved: the stack stops a GONE cell's agent
                role=common_pb2.CELL_ROLE_DRAINING if c in departing else ROLE_TO_PROTO[r],
                engine=self.peers.engines[c],
                executions_routed=loads.get(c, 0),
            )
            for c, r in enumerate(snap.roles)
        ]
        return scheduler_pb2.SchedulerState(
            run_id=self.config.run.id,
            mode=_MODES[snap.mode],
            counters=common_pb2.Counters(
                dispatched=snap.dispatched, started=snap.started, finished=snap.finished
            ),
            waterlevel=snap.waterlevel,
            rollout_capacity=snap.rollout_capacity,
            training_cells=snap.training_cells,
            cells=cells,
            policy_version=snap.version,
            published_version=snap.published_version,
            burst=snap.burst,
            steps=snap.version,
            ready_groups=snap.ready_unclaimed,
            mean_staleness=snap.mean_staleness or 0.0,
            consumed_groups=snap.consumed_groups,
            transitions=snap.transitions_completed,
            last_step_reward=self.translator.last_step_reward,
            executions_in_flight=len(self.policy.state.placement.assignments())
            + len(self.executor.commanded),
            packed_executions=self.facts.shell.packed_executions,
            executions_without_targets=self.facts.shell.executions_without_targets,
            stop_reason=self.facts.shell.stop_reason,
        )


class _Servicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, service: SchedulerService) -> None:
        self.s = service

    async def GetState(
        self, request: scheduler_pb2.GetStateRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.SchedulerState:
        return self.s.state_proto()

    async def RegisterTrainingCell(
        self, request: scheduler_pb2.RegisterTrainingCellRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.RegisterTrainingCellResponse:
        batch = self.s.facts.batch
        snap = self.s.policy.snapshot()
        return scheduler_pb2.RegisterTrainingCellResponse(
            batch_id=batch.batch_id if batch else "",
            policy_version=snap.version,
            training_cells=snap.training_cells,
        )

    async def DrainCell(
        self, request: scheduler_pb2.DrainCellRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.DrainCellResponse:
        self.s.log.info("cell_notice", cell=request.cell)
        outcome = await give_notice(
            self.s.driver,
            self.s.executor.departures,
            request.cell,
            separate_pool_capacity=self.s.config.scheduler.separate_pool_capacity,
        )
        return scheduler_pb2.DrainCellResponse(
            cell=outcome.cell,
            executions_moved=outcome.executions_moved,
            calls_rerouted=outcome.calls_rerouted,
            kv_migrated_tokens=outcome.kv_migrated_tokens,
            duration_s=outcome.duration_s,
        )

    async def Shutdown(
        self, request: scheduler_pb2.ShutdownRequest, context: grpc.aio.ServicerContext
    ) -> scheduler_pb2.ShutdownResponse:
        self.s.facts.shell.stopping = True
        await self.s.persist_state()
        cancelled = 0
        if request.cancel_running:
            resp = await call_peer(
                self.s.peers.runner.CancelExecution,
                runner_pb2.CancelExecutionRequest(all=True),
                timeout_s=60,
                retry_s=self.s.config.scheduler.peer_retry_s,
                what="CancelExecution",
            )
            cancelled = resp.cancelled
        return scheduler_pb2.ShutdownResponse(cancelled=cancelled)

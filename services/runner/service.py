"""The runner service: harness executions in sandboxes, started from the JetStream work queue.

    python -m services.runner --config runs/<run>/config.yaml

All runner instances share one durable consumer of `ExecutionStartRequested` (a work queue: each
request goes to one of them). A runner takes a request only when it has a free slot
(`runner.max_concurrent`), so queued requests wait in JetStream, not in memory. At start it
reconciles the executions it owned before a crash or restart (adopts running sandboxes,
terminates the rest with a reason); at stop it cancels running executions (`on_stop: cancel`) or
leaves them for the next incarnation (`detach`). The lifecycle of one execution is in
`services/runner/execution.py`; sandboxes in `gyre/sandbox/`.
"""

from __future__ import annotations

import asyncio
import socket
import time

import grpc

from gyre.bus import Delivery, EventConsumer, watch_consumer
from gyre.config import GyreConfig
from gyre.sandbox.forkclient import ForkServer
from gyre.sandbox.host import open_sandbox
from gyre.sandbox.launchers.supervised import SupervisedLauncher
from gyre.service import GyreService
from gyre.store import Counters
from gyre.tasks import TaskSet
from gyre.v1 import common_pb2 as cm
from gyre.v1 import events_pb2 as ev
from gyre.v1 import runner_pb2, runner_pb2_grpc
from services.runner.execution import ExecutionController, PendingStart, Slots
from services.runner.harnesses import check_harness, make_harness
from services.runner.metrics import RunnerMetrics
from services.runner.ownership import Ownership
from services.runner.proxy_client import ProxyClient

#: Durable consumer shared by every runner instance (the work queue of start requests).
START_CONSUMER = "runner"


class RunnerService(GyreService):
    """runner service: harness executions in sandboxes, started from the JetStream work queue."""

    name = "runner"

    def __init__(self, config: GyreConfig, instance: int | None = None) -> None:
        super().__init__(config, instance)
        check_harness(config.runner)  # before any connection: a harness not registered stops it (exit 2)
        self.consumer: EventConsumer | None = None
        self.starting: set[asyncio.Task[None]] = set()
        """Starts claimed and acknowledged whose sandbox is being launched."""
        self.fork_server: ForkServer | None = None
        self._drained = False

    @property
    def runner_id(self) -> str:
        """Stable across restarts on one host, so a restarted runner finds what it owned."""
        return f"{socket.gethostname()}:{self.instance_name}"

    async def setup(self) -> None:
        section = self.config.runner
        tasks = TaskSet.from_section(
            self.config.tasks
        )  # a malformed task stops the start, naming file and key
        self.launcher, limits = open_sandbox(self, section)
        run_dir = self.config.run.path.resolve()
        harness = make_harness(section)
        if (
            section.fork_server
            and harness.fork_module is not None
            and isinstance(self.launcher, SupervisedLauncher)
        ):
            self.fork_server = ForkServer.start(
                harness.fork_module,
                paths=harness.fork_paths,
                log_path=run_dir / "logs" / f"{self.instance_name}-forkserver.log",
            )
            self.launcher.fork_server = self.fork_server
        self.proxy = ProxyClient(
            f"{self.config.run.peer_host('proxy')}:{self.config.proxy.port}",
            attempts=section.open_attempts,
            retry_s=section.open_retry_s,
        )
        self.slots = Slots(section.max_concurrent)
        metrics = RunnerMetrics(self.metrics_registry)
        metrics.slots = lambda: (self.slots.used, self.slots.size)
        self.controller = ExecutionController(
            runner_id=self.runner_id,
            bus=self.bus,
            counters=Counters(self.redis, self.keys),
            ownership=Ownership(self.redis, self.keys, self.runner_id),
            proxy=self.proxy,
            launcher=self.launcher,
            harness=harness,
            registry=tasks.registry,
            workspace_root=(section.workspace_dir or run_dir / "workspaces").resolve(),
            sandbox_root=run_dir / "sandboxes",
            limits=limits,
            kill_grace_s=section.sandbox.kill_grace_s,
            copy_out_max_bytes=section.sandbox.copy_out_max_bytes,
            copy_out_max_files=section.sandbox.copy_out_max_files,
            slots=self.slots,
            spawn=self.supervisor.spawn,
            metrics=metrics,
        )
        metrics.running = lambda: len(self.controller.running)
        runner_pb2_grpc.add_RunnerServicer_to_server(RunnerServicer(self), self.server)
        counts = await self.controller.reconcile()
        self.log.info("runner_reconciled", runner_id=self.runner_id, **counts)
        self.consumer = await self.bus.consume(
            START_CONSUMER,
            [ev.ExecutionStartRequested],
            self._on_start,
            batch=1,
            max_ack_pending=self.config.nats.max_ack_pending,
            ack_wait_s=self.config.nats.ack_wait_s,
        )
        self.supervisor.spawn(watch_consumer(self.consumer), "consumer-watch")

    async def _on_start(self, event: object, delivery: Delivery) -> None:
        """Take a free slot, claim the execution (from then on a restart finds it), and launch it in a
        task of its own: the request is acknowledged and the next one taken while this one launches."""
        assert isinstance(event, ev.ExecutionStartRequested)
        await self.slots.acquire()
        try:
            pending = await self.controller.begin(event)
        except BaseException:
            await self.slots.release()
            raise
        if pending is None:
            await self.slots.release()
            return
        task = self.supervisor.spawn(self._complete(pending), f"start/{pending.owned.execution_id}")
        self.starting.add(task)
        task.add_done_callback(self.starting.discard)

    async def _complete(self, pending: PendingStart) -> None:
        try:
            running = await self.controller.complete(pending)
        except BaseException:
            await self.slots.release()
            raise
        if not running:
            await self.slots.release()

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop taking requests, then cancel (or detach from) running executions, then the shell."""
        if self.consumer is not None and not self._drained:
            self._drained = True
            await self.consumer.stop()
            if self.config.runner.on_stop == "cancel":
                self.controller.close()  # starts under way end as CANCELLED, or are cancelled once launched
            if self.starting:  # with `detach` they launch, and the next incarnation adopts them
                await asyncio.wait(
                    list(self.starting), timeout=self.config.runner.sandbox.kill_grace_s + 15.0
                )
            if self.config.runner.on_stop == "cancel" and self.controller.running:
                tasks = list(self.controller.tasks.values())
                self.log.info("runner_cancelling", executions=len(tasks))
                self.controller.cancel(None)
                _, pending = await asyncio.wait(tasks, timeout=self.config.runner.sandbox.kill_grace_s + 15.0)
                if pending:
                    self.log.error("runner_cancel_incomplete", executions=len(pending))
        await super().stop(grace_s)

    async def teardown(self) -> None:
        if self.fork_server is not None:
            await self.fork_server.stop()
        if hasattr(self, "proxy"):
            await self.proxy.close()


class RunnerServicer(runner_pb2_grpc.RunnerServicer):
    def __init__(self, service: RunnerService) -> None:
        self.service = service

    async def GetStatus(
        self, request: runner_pb2.GetRunnerStatusRequest, context: grpc.aio.ServicerContext
    ) -> runner_pb2.RunnerStatus:
        controller = self.service.controller
        now = time.time()
        running = [
            runner_pb2.RunningExecution(
                execution=cm.ExecutionRef(
                    execution_id=r.owned.execution_id,
                    group_id=r.owned.group_id,
                    index_in_group=r.owned.index_in_group,
                    query_id=r.owned.query_id,
                ),
                pid=r.handle.pid,
                elapsed_s=now - r.owned.started_at_ms / 1000,
                workspace_path=r.owned.workspace,
            )
            for r in controller.running.values()
        ]
        return runner_pb2.RunnerStatus(
            runner_id=self.service.runner_id,
            running=running,
            max_concurrent=self.service.slots.size,
            started_total=controller.started_total,
        )

    async def CancelExecution(
        self, request: runner_pb2.CancelExecutionRequest, context: grpc.aio.ServicerContext
    ) -> runner_pb2.CancelExecutionResponse:
        if not request.all and not request.execution_id:
            raise ValueError("give execution_id or all=true")
        if request.all:  # the run is ending: what is still queued must not start afterwards
            self.service.controller.close()
        cancelled = self.service.controller.cancel(None if request.all else request.execution_id)
        return runner_pb2.CancelExecutionResponse(cancelled=cancelled)

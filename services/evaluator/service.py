"""The evaluator service: scores preserved workspaces after every termination and marks groups
ready exactly once.

    python -m services.evaluator --config runs/<run>/config.yaml

Every `ExecutionTerminated` (timeouts and harness failures included) is put on a reliable Redis
work queue (`evaluations`, idempotent by execution id) and acknowledged at once: evaluations may
retry for as long as an execution's overall budget, far longer than a NATS ack wait. Workers
(`evaluator.max_concurrent`) claim items, score them (services/evaluator/verifier.py), store the
evaluation bound to (execution, workspace hash), publish `EvaluationDone`, record the member's
outcome in its group (gyre/store/groups.py) and publish `GroupReady` (event id
`group.ready:<group>`) when the group is complete. An item is acknowledged only after all of
that, so an evaluator that dies mid-way leaves it to be reclaimed and finished by another.
Every step is idempotent, so duplicate deliveries of any event change nothing.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter

import grpc
from google.protobuf import json_format

from gyre.bus import Delivery, watch_consumer
from gyre.config import GyreConfig
from gyre.sandbox.host import open_sandbox
from gyre.service import GyreService
from gyre.store import Records, WorkQueue
from gyre.store.groups import GroupOutcomes, MemberOutcome
from gyre.tasks import TaskSet
from gyre.v1 import common_pb2 as cm
from gyre.v1 import evaluator_pb2, evaluator_pb2_grpc
from gyre.v1 import events_pb2 as ev
from services.evaluator.metrics import EvaluatorMetrics
from services.evaluator.store import Evaluation, EvaluationStore
from services.evaluator.verifier import VerifierRunner

TERMINATED_CONSUMER = "evaluator"
QUEUE = "evaluations"
PUBLICATION_LEASE_MS = 10_000
"""How long a claim to publish a group's `GroupReady` holds off the others if its holder dies before
marking it published (a publish takes milliseconds)."""
STATUS_PB = {
    "valid": cm.EVALUATION_STATUS_VALID,
    "excluded": cm.EVALUATION_STATUS_EXCLUDED,
    "placeholder": cm.EVALUATION_STATUS_PLACEHOLDER,
}


class EvaluatorService(GyreService):
    """evaluator service: scores preserved workspaces after every termination and marks groups ready."""

    name = "evaluator"

    def __init__(self, config: GyreConfig, instance: int | None = None) -> None:
        super().__init__(config, instance)
        self._stopping = False

    async def stop(self, grace_s: float = 5.0) -> None:
        # Loops also check this flag: a cancellation swallowed by a racing Redis reply (Python 3.11's
        # wait_for) must not leave a worker claiming forever.
        self._stopping = True
        await super().stop(grace_s)

    async def setup(self) -> None:
        section = self.config.evaluator
        tasks = TaskSet.from_section(
            self.config.tasks
        )  # a malformed task stops the start, naming file and key
        self.launcher, limits = open_sandbox(self, section)
        host_launcher = open_sandbox(self, section, on_host=True)[0] if self.launcher.own_filesystem else None
        run_dir = self.config.run.path.resolve()
        self.verifier = VerifierRunner(
            registry=tasks.registry,
            launcher=self.launcher,
            work_root=(section.work_dir or run_dir / "evaluations").resolve(),
            limits=limits,
            max_attempts=section.max_attempts,
            backoff_s=section.backoff_s,
            kill_grace_s=section.sandbox.kill_grace_s,
            host_launcher=host_launcher,
        )
        self.evaluations = EvaluationStore(self.redis, self.keys)
        self.outcomes = GroupOutcomes(self.redis, self.keys)
        self.records = Records(self.redis, self.keys)
        self.queue = WorkQueue(self.redis, self.keys, QUEUE, self.config.redis.heartbeat_timeout_s)
        self.stats: Counter[str] = Counter()
        self.in_progress = 0
        self.metrics = EvaluatorMetrics(self.metrics_registry, pending=lambda: self.in_progress)
        evaluator_pb2_grpc.add_EvaluatorServicer_to_server(EvaluatorServicer(self), self.server)
        incarnation = uuid.uuid4().hex[:8]
        for k in range(section.max_concurrent):
            worker_id = f"{self.instance_name}:{incarnation}:{k}"
            self.supervisor.spawn(self._worker(worker_id), f"worker/{k}")
        self.supervisor.spawn(self._reclaim_loop(), "reclaim")
        consumer = await self.bus.consume(
            TERMINATED_CONSUMER,
            [ev.ExecutionTerminated],
            self._on_terminated,
            ack_wait_s=self.config.nats.ack_wait_s,
            confirm_ack=True,
        )
        self.supervisor.spawn(watch_consumer(consumer), "consumer-watch")

    async def _on_terminated(self, event: object, delivery: Delivery) -> None:
        assert isinstance(event, ev.ExecutionTerminated)
        eid = event.execution.execution_id
        await self.queue.put(eid, json_format.MessageToJson(event, indent=None).encode())

    async def _reclaim_loop(self) -> None:
        """Items of dead workers (any evaluator instance) go back to the queue."""
        while not self._stopping:
            moved = await self.queue.reclaim_dead()
            if moved:
                self.log.warning("evaluations_reclaimed", executions=moved)
            self.metrics.queued = await self.queue.pending()
            await asyncio.sleep(max(1.0, self.queue.heartbeat_timeout_s / 2))

    async def _worker(self, consumer: str) -> None:
        while not self._stopping:
            claim = await self.queue.claim(consumer, timeout_s=1.0, poll_s=0.05)
            if claim is None:
                continue
            term = json_format.Parse(claim.payload, ev.ExecutionTerminated(), ignore_unknown_fields=True)
            beat = asyncio.create_task(self._heartbeat(consumer))
            self.in_progress += 1
            try:
                await self.process(term)
            finally:
                self.in_progress -= 1
                beat.cancel()
            await self.queue.ack(claim)

    async def _heartbeat(self, consumer: str) -> None:
        while True:
            await asyncio.sleep(max(0.5, self.queue.heartbeat_timeout_s / 4))
            await self.queue.heartbeat(consumer)

    async def process(self, term: ev.ExecutionTerminated) -> Evaluation:
        """Evaluate (or re-use the stored evaluation), publish, resolve the group. Idempotent."""
        ref = term.execution
        evaluation = await self.evaluations.first(ref.execution_id)
        if evaluation is None:
            began = time.monotonic()
            evaluation = await self.evaluations.put(await self.verifier.evaluate(term))
            self.metrics.evaluated(evaluation.status, evaluation.attempts, time.monotonic() - began)
            self.stats[evaluation.status] += 1
            self.log.info(
                "execution_evaluated",
                execution=ref.execution_id,
                status=evaluation.status,
                reward=evaluation.reward,
                attempts=evaluation.attempts,
                detail=evaluation.detail[:200],
            )
        await self.bus.publish(
            ev.EvaluationDone(
                execution=ref,
                status=STATUS_PB[evaluation.status],
                reward=evaluation.reward,
                workspace=cm.WorkspaceRef(
                    path=evaluation.workspace_path, content_hash=evaluation.workspace_hash
                ),
                attempts=evaluation.attempts,
                detail=evaluation.detail,
            ),
            event_id=f"eval.done:{ref.execution_id}:{evaluation.workspace_hash or 'none'}",
        )
        await self.verifier.release(ref.execution_id)  # accounted: its container (if any) goes
        await self._resolve_group(ref, evaluation)
        return evaluation

    async def _resolve_group(self, ref: cm.ExecutionRef, evaluation: Evaluation) -> None:
        group = await self.records.get_group(ref.group_id)
        if group is None or ref.execution_id not in group.execution_ids:
            self.log.error("group_membership_unknown", execution=ref.execution_id, group=ref.group_id)
            return
        outcome = MemberOutcome(
            ref.execution_id, evaluation.status, evaluation.reward, evaluation.workspace_hash
        )
        result = await self.outcomes.resolve(group.group_id, group.size, group.policy_version, outcome)
        if not result.ready or not await self._publication(group.group_id):
            return
        ready = await self.outcomes.get(group.group_id)
        assert ready is not None
        await self.bus.publish(
            ev.GroupReady(
                group_id=group.group_id,
                policy_version=group.policy_version,
                mean_reward=ready.mean_reward,
                num_valid=ready.count("valid"),
                num_excluded=ready.count("excluded"),
                num_placeholder=ready.count("placeholder"),
            ),
            event_id=f"group.ready:{group.group_id}",
        )
        if await self.outcomes.mark_published(group.group_id):
            self.stats["groups_ready"] += 1
            self.metrics.groups_ready.inc()
            self.log.info("group_ready", group=group.group_id, mean_reward=round(ready.mean_reward, 4))

    async def _publication(self, group_id: str) -> bool:
        """Whether this call publishes the ready group's `GroupReady`: exactly one call does, whichever
        of the concurrent ones (duplicate deliveries, a reclaimed item) claims it first; the others
        wait until it is marked published. If the claimant dies before marking it, its lease lapses and
        a waiter, or the claimant's reclaimed work item, publishes instead (same event id: JetStream
        drops the copy if the claimant's did reach the stream)."""
        token = uuid.uuid4().hex
        while True:
            claim = await self.outcomes.claim_publication(group_id, token, PUBLICATION_LEASE_MS)
            if claim != "busy":
                return claim == "claimed"
            await asyncio.sleep(0.05)  # the claimant is publishing: a NATS publish and a Redis write


class EvaluatorServicer(evaluator_pb2_grpc.EvaluatorServicer):
    def __init__(self, service: EvaluatorService) -> None:
        self.service = service

    async def GetEvaluation(
        self, request: evaluator_pb2.GetEvaluationRequest, context: grpc.aio.ServicerContext
    ) -> evaluator_pb2.GetEvaluationResponse:
        stored = await self.service.evaluations.all(request.execution_id)
        return evaluator_pb2.GetEvaluationResponse(
            evaluations=[
                evaluator_pb2.Evaluation(
                    status=STATUS_PB[e.status],
                    reward=e.reward,
                    attempts=e.attempts,
                    detail=e.detail,
                    workspace=cm.WorkspaceRef(path=e.workspace_path, content_hash=e.workspace_hash),
                    stored_at_ms=e.stored_at_ms,
                )
                for e in stored
            ]
        )

    async def GetStatus(
        self, request: evaluator_pb2.GetEvaluatorStatusRequest, context: grpc.aio.ServicerContext
    ) -> evaluator_pb2.EvaluatorStatus:
        s = self.service.stats
        return evaluator_pb2.EvaluatorStatus(
            in_progress=self.service.in_progress,
            valid=s["valid"],
            excluded=s["excluded"],
            placeholder=s["placeholder"],
            groups_ready=s["groups_ready"],
        )

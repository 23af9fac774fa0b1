"""The packer service: the stream packing buffer.

`OpenBatch(step, B, v_t)` starts the stream of a batch: ready groups are claimed one at a time
(oldest dispatch policy version first), admitted (J_max per execution), materialized as path or
tree rows (`packer.row_layout`), given group-relative
advantages and per-token coefficients, packed into micro-steps on the batch's Redis queue, and the
stream is closed after B groups. Events: GroupPacked, MicroStepEnqueued, StreamClosed.

Restart-safe: each open batch is recorded in Redis (`Keys.batch`, indexed by `Keys.open_batches`) until
its stream closes, and a restarted packer resumes every one at start-up. A resumed stream takes the
groups its batch had claimed first, in packing order, and packs them again into the same micro-steps
(admission is seeded per execution): queue items and events carry deterministic ids, so nothing is
enqueued or counted twice.

When a step commits (`StepCompleted`, durable consumer `packer-archive`), the groups of its batch are
archived to files and deleted from Redis (`archive:` section; gyre/store/archive.py).

    python -m services.packer --config runs/<run>/config.yaml
"""

from __future__ import annotations

import grpc
from google.protobuf import json_format

from gyre.bus import Delivery
from gyre.ids import batch_id as make_batch_id
from gyre.ids import microstep_queue
from gyre.rpc import INVALID_ARGUMENT, ErrorStatus
from gyre.service import GyreService
from gyre.store import WorkQueue
from gyre.store.archive import StepArchiver
from gyre.v1 import events_pb2 as ev
from gyre.v1 import packer_pb2, packer_pb2_grpc
from services.packer.batch import BatchProgress, fill_batch
from services.packer.metrics import PackerMetrics
from services.packer.sources import GroupSource, TreeSource

ARCHIVE_CONSUMER = "packer-archive"


class UnknownBatchError(LookupError):
    """GetBatch names a batch this packer has not opened: NOT_FOUND."""


class PackerService(GyreService):
    """Turns ready groups into micro-steps, one batch stream at a time."""

    name = "packer"
    error_statuses = (ErrorStatus(UnknownBatchError, grpc.StatusCode.NOT_FOUND), INVALID_ARGUMENT)

    async def setup(self) -> None:
        self.batches: dict[str, BatchProgress] = {}
        self.groups = GroupSource(self.redis, self.keys)
        self.trees = TreeSource(self.redis, self.keys)
        self.metrics = PackerMetrics(
            self.metrics_registry, open_batches=lambda: sum(not b.closed for b in self.batches.values())
        )
        packer_pb2_grpc.add_PackerServicer_to_server(_Servicer(self), self.server)
        for raw in sorted(await self.redis.smembers(self.keys.open_batches())):
            record = await self.redis.hgetall(self.keys.batch(raw.decode()))
            if not record:
                continue
            step, num_groups, version = (int(record[k]) for k in (b"step", b"num_groups", b"policy_version"))
            claimed = await self.groups.recover(raw.decode())  # before the archive consumer below starts
            self.log.info("batch_resumed", batch=raw.decode(), step=step, claimed=claimed)
            await self.open_batch(step, num_groups, version)
        archive = self.config.archive
        if archive.enabled:
            self.archiver = StepArchiver(
                self.redis,
                self.keys,
                archive.path_for(self.config.run.path),
                compress_level=archive.compress_level,
            )
            await self.bus.consume(
                ARCHIVE_CONSUMER,
                [ev.StepCompleted],
                self._archive_step,
                batch=1,
                ack_wait_s=archive.ack_wait_s,
                confirm_ack=True,
            )

    async def _archive_step(self, event: object, delivery: Delivery) -> None:
        """The step of this batch committed: its groups leave Redis, archived first."""
        assert isinstance(event, ev.StepCompleted)
        done = await self.archiver.archive_step(
            event.batch_id, policy_version=event.policy_version, completed=json_format.MessageToDict(event)
        )
        self.log.info(
            "step_archived",
            batch=done.batch_id,
            groups=done.num_groups,
            trees=done.num_trees,
            keys_deleted=done.num_keys_deleted,
            bytes_written=done.bytes_written,
        )

    async def open_batch(self, step: int, num_groups: int, policy_version: int) -> BatchProgress:
        batch_id = make_batch_id(self.config.run.id, step)
        if batch_id in self.batches:  # a retried OpenBatch
            return self.batches[batch_id]
        progress = BatchProgress(batch_id, step, num_groups, policy_version)
        self.batches[batch_id] = progress
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                self.keys.batch(batch_id),
                mapping={"step": step, "num_groups": num_groups, "policy_version": policy_version},
            )
            pipe.sadd(self.keys.open_batches(), batch_id)
            await pipe.execute()
        await self.bus.publish(
            ev.BatchOpened(batch_id=batch_id, step=step, num_groups=num_groups),
            event_id=f"batch.opened:{batch_id}",
        )
        queue = WorkQueue(
            self.redis, self.keys, microstep_queue(batch_id), self.config.redis.heartbeat_timeout_s
        )
        self.supervisor.spawn(self._stream(progress, queue), f"batch-{step}")
        self.log.info(
            "batch_opened", batch=batch_id, step=step, groups=num_groups, policy_version=policy_version
        )
        return progress

    async def _stream(self, progress: BatchProgress, queue: WorkQueue) -> None:
        cfg, sched = self.config.packer, self.config.scheduler
        await fill_batch(
            progress,
            claim_group=self.groups.claim,
            load_tree=self.trees.load,
            queue=queue,
            bus=self.bus,
            num_batch_executions=progress.num_groups * sched.group_size,
            token_budget=cfg.microstep_tokens,
            j_max=cfg.j_max,
            run_seed=sched.seed,
            normalize_std=cfg.normalize_std,
            row_layout=cfg.row_layout,
            metrics=self.metrics,
        )
        await self.redis.srem(self.keys.open_batches(), progress.batch_id)


class _Servicer(packer_pb2_grpc.PackerServicer):
    def __init__(self, service: PackerService) -> None:
        self.s = service

    async def OpenBatch(
        self, request: packer_pb2.OpenBatchRequest, context: grpc.aio.ServicerContext
    ) -> packer_pb2.OpenBatchResponse:
        if request.num_groups < 1:
            raise ValueError("num_groups must be at least 1")
        progress = await self.s.open_batch(request.step, request.num_groups, request.policy_version)
        return packer_pb2.OpenBatchResponse(batch_id=progress.batch_id)

    async def GetBatch(
        self, request: packer_pb2.GetBatchRequest, context: grpc.aio.ServicerContext
    ) -> packer_pb2.BatchStatus:
        progress = self.s.batches.get(request.batch_id)
        if progress is None:
            raise UnknownBatchError(f"no batch {request.batch_id!r}")
        return packer_pb2.BatchStatus(
            batch_id=progress.batch_id,
            groups_packed=progress.groups_packed,
            groups_needed=progress.num_groups,
            microsteps_enqueued=progress.microsteps_enqueued,
            closed=progress.closed,
        )

"""The stream of one batch: claim ready groups one at a time (oldest policy version first), turn
each into rows and advantages, pack micro-steps into the batch's Redis queue, close after B groups.

Event order per group keeps the scheduler's policy consistent: GroupPacked, then MicroStepEnqueued
for each micro-step now full, then the queue item (so no cell can claim a micro-step of a group
the scheduler has not seen packed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from gyre.bus import EventBus
from gyre.log import get_logger
from gyre.rl.codec import encode_microstep
from gyre.rl.microstep import MicroStep
from gyre.rl.stream import StreamPacker
from gyre.store import WorkQueue
from gyre.trajectory.materialize import RowLayout
from gyre.v1 import events_pb2 as ev
from services.packer.metrics import PackerMetrics
from services.packer.rows import ClaimedGroup, LoadTree, group_rows

log = get_logger("gyre.packer.batch")

ClaimGroup = Callable[[str], Awaitable[ClaimedGroup | None]]


@dataclass
class BatchProgress:
    batch_id: str
    step: int
    num_groups: int
    policy_version: int
    groups_packed: int = 0
    microsteps_enqueued: int = 0
    closed: bool = False
    group_of_execution: dict[str, str] = field(default_factory=dict)
    rewards: list[float] = field(default_factory=list)


def microstep_id(batch_id: str, index: int) -> str:
    return f"{batch_id}-m{index:04d}"


async def fill_batch(
    progress: BatchProgress,
    *,
    claim_group: ClaimGroup,
    load_tree: LoadTree,
    queue: WorkQueue,
    bus: EventBus,
    num_batch_executions: int,
    token_budget: int,
    j_max: int,
    run_seed: int,
    normalize_std: bool,
    row_layout: RowLayout,
    metrics: PackerMetrics | None = None,
    poll_s: float = 0.2,
) -> None:
    """Run the stream of one batch to its close (counted in `metrics`, a fresh registry's when None)."""
    metrics = metrics or PackerMetrics(CollectorRegistry())
    stream = StreamPacker(
        batch_id=progress.batch_id,
        step=progress.step,
        num_batch_executions=num_batch_executions,
        token_budget=token_budget,
    )
    while progress.groups_packed < progress.num_groups:
        group = await claim_group(progress.batch_id)
        if group is None:
            await asyncio.sleep(poll_s)
            continue
        packed = await group_rows(
            group,
            load_tree,
            j_max=j_max,
            run_seed=run_seed,
            normalize_std=normalize_std,
            row_layout=row_layout,
        )
        for m in group.members:
            progress.group_of_execution[m.execution_id] = group.group_id
        metrics_ = packed.advantages.metrics
        progress.rewards.append(metrics_.reward_mean)
        await bus.publish(
            ev.GroupPacked(
                batch_id=progress.batch_id,
                group_id=group.group_id,
                staleness=max(0, progress.policy_version - group.policy_version),
                num_trajectories=packed.num_trajectories,
                num_targets=packed.num_targets,
                reward_mean=metrics_.reward_mean,
                reward_std=metrics_.reward_std,
                num_resolved=metrics_.num_valid + metrics_.num_placeholder,
                admitted_by_class=packed.admitted_by_class,
                targets_by_class=packed.targets_by_class,
                num_executions_without_targets=packed.num_executions_without_targets,
            ),
            event_id=f"batch.group_packed:{progress.batch_id}:{group.group_id}",
        )
        metrics.group_packed(packed.admitted_by_class, packed.targets_by_class, metrics_.zero_variance)
        progress.groups_packed += 1
        log.info(
            "group_packed",
            batch=progress.batch_id,
            group=group.group_id,
            rows=len(packed.rows),
            trajectories=packed.num_trajectories,
            targets=packed.num_targets,
            reward_mean=metrics_.reward_mean,
            zero_variance=metrics_.zero_variance,
        )
        await _enqueue(progress, stream.add(packed.rows, packed.advantages.advantages), queue, bus, metrics)
    await _enqueue(progress, stream.close(), queue, bus, metrics)
    await queue.close()
    await bus.publish(
        ev.StreamClosed(
            batch_id=progress.batch_id,
            num_microsteps=progress.microsteps_enqueued,
            num_groups=progress.groups_packed,
            mean_reward=sum(progress.rewards) / len(progress.rewards) if progress.rewards else 0.0,
        ),
        event_id=f"batch.stream_closed:{progress.batch_id}",
    )
    progress.closed = True
    metrics.batches_closed.inc()
    log.info("stream_closed", batch=progress.batch_id, microsteps=progress.microsteps_enqueued)


async def _enqueue(
    progress: BatchProgress,
    microsteps: list[MicroStep],
    queue: WorkQueue,
    bus: EventBus,
    metrics: PackerMetrics,
) -> None:
    for ms in microsteps:
        item_id = microstep_id(progress.batch_id, ms.index)
        groups = sorted({progress.group_of_execution[e] for e in ms.execution_ids})
        await bus.publish(
            ev.MicroStepEnqueued(
                batch_id=progress.batch_id,
                microstep_id=item_id,
                num_tokens=len(ms.input_ids),
                num_executions=len(ms.execution_ids),
                step=progress.step,
                group_ids=groups,
            ),
            event_id=f"batch.microstep_enqueued:{item_id}",
        )
        await queue.put(item_id, encode_microstep(ms))
        progress.microsteps_enqueued += 1
        metrics.microstep_enqueued(len(ms.input_ids))

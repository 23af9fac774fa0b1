"""Replaying the steps a restarted core lost: the optimizer steps taken after its newest checkpoint.

    replayed = await replay_steps(training, from_version=6, to_version=8)   # steps 6 and 7 again
    await report_replayed(training, emit, replayed)                        # records done, StepCompleted
    await drop_replay_payloads(training, range(0, 6))                       # after a checkpoint of 6

The core checkpoints every `trainer.checkpoint_every_steps` steps, and every step it takes raises the
policy version in Redis (`trainer:version`). A core that dies after steps its newest checkpoint does not
hold restarts behind that version; rather than skip those steps (the scheduler, the rollout engines and
the published weights are already past them) or take new ones in their place, it takes them again from
the same micro-steps: every micro-step of a completed step stays in its batch's queue (`payloads`, which
the step's acknowledgement keeps) until a checkpoint covers the step. Each is accumulated once and the
optimizer steps once per batch, so no step is applied twice and none is skipped; the new weights equal
the lost ones up to the order of the floating-point sums (the step ran split over several cells).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from google.protobuf.message import Message

from gyre.ids import batch_id, microstep_queue
from gyre.log import get_logger
from gyre.rl.codec import decode_microstep
from gyre.rl.loss import LossMetrics
from gyre.v1 import events_pb2 as ev
from services.cell_agent.errors import CellStateError
from services.cell_agent.step_archive import ArchivingSide, archive_step
from services.cell_agent.step_fields import correction_fields
from services.cell_agent.step_record import StepRecord

log = get_logger("gyre.cell_agent.replay")
Emit = Callable[[Message, str], Awaitable[None]]


class ReplayingSide(ArchivingSide, Protocol):
    """What a replay needs of the core's training side (`TrainingSide`, training.py, which imports this
    module): besides recording the steps it takes again, the lock its optimizer steps hold."""

    is_core: bool
    num_cells: int
    weights_lock: threading.Lock


@dataclass(frozen=True, slots=True)
class ReplayedStep:
    batch_id: str
    version: int
    """Policy version after the step."""
    num_microsteps: int
    grad_norm: float
    metrics: LossMetrics = field(default_factory=LossMetrics)
    microstep_ids: tuple[str, ...] = ()


def _queue_key(side: ReplayingSide, step: int, part: str) -> str:
    return side.keys.queue(microstep_queue(batch_id(side.keys.run_id, step)), part)


async def replay_steps(side: ReplayingSide, from_version: int, to_version: int) -> list[ReplayedStep]:
    """Core: take the steps `from_version` .. `to_version − 1` again from their stored micro-steps."""
    assert side.is_core and side.trainer.version == from_version
    replayed: list[ReplayedStep] = []
    for step in range(from_version, to_version):
        payloads = await side.redis.hgetall(_queue_key(side, step, "payloads"))
        known = int(await side.redis.scard(_queue_key(side, step, "known")))
        if not payloads or len(payloads) != known:
            raise CellStateError(
                f"cannot replay step {step} after a restart: {len(payloads)} of its {known} micro-steps are stored "
                f"(the newest checkpoint is version {from_version}; the core had reached {to_version})"
            )
        ids = sorted(k.decode() if isinstance(k, bytes) else str(k) for k in payloads)
        by_id = {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in payloads.items()}

        def run(ids: list[str] = ids, by_id: dict[str, bytes] = by_id) -> tuple[LossMetrics, float]:
            metrics = LossMetrics()
            side.trainer.zero_grads()
            for item in ids:
                metrics = metrics.merge(side.trainer.accumulate(decode_microstep(by_id[item])).metrics)
            with side.weights_lock:
                return metrics, side.trainer.optimizer_step()

        metrics, grad_norm = await side.compute.run(run)
        assert side.trainer.version == step + 1
        # The weights that exist now are this replay's: its record replaces the first one.
        await archive_step(
            side,
            batch_id=batch_id(side.keys.run_id, step),
            step=step,
            cells=(0,),
            accumulated={0: ids},
            applied=ids,
            grad_norm=grad_norm,
            final_in_burst=False,
            replayed=True,
        )
        replayed.append(
            ReplayedStep(batch_id(side.keys.run_id, step), step + 1, len(ids), grad_norm, metrics, tuple(ids))
        )
        log.warning("step_replayed", step=step, policy_version=step + 1, microsteps=len(ids))
    return replayed


async def drop_replay_payloads(side: ReplayingSide, steps: Iterable[int]) -> None:
    """The micro-steps of these steps are covered by a checkpoint: no replay needs them any more."""
    keys = [_queue_key(side, s, part) for s in steps for part in ("payloads", "known")]
    for i in range(0, len(keys), 64):
        await side.redis.delete(*keys[i : i + 64])


async def report_replayed(side: ReplayingSide, emit: Emit, replayed: list[ReplayedStep]) -> None:
    """Mark each replayed step's record done (its items acknowledged) and report it: a scheduler that saw
    the step already drops the repeat, one that was waiting for it (the core died before reporting it)
    moves on."""
    for r in replayed:
        record = StepRecord(side.redis, side.keys, r.batch_id, heartbeat_timeout_s=1.0)
        status = await record.status(0)
        await record.finish_replayed(side.num_cells, r.version)
        m = r.metrics
        await emit(
            ev.StepCompleted(
                batch_id=r.batch_id,
                policy_version=r.version,
                cells=[0],
                num_microsteps=r.num_microsteps,
                loss=m.loss,
                grad_norm=r.grad_norm,
                num_targets=m.num_targets,
                clip_fraction=m.num_clipped_executions / m.num_executions if m.num_executions else 0.0,
                final_in_burst=status.final_in_burst,
                microstep_ids=list(r.microstep_ids),
                replayed=True,
                **correction_fields(m),
            ),
            f"step:{r.batch_id}:{r.version}:replayed",
        )

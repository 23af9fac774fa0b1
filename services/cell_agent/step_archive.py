"""The core records each optimizer step it takes, for `gyre audit` (format: gyre/store/step_archive.py).

    await archive_step(training, batch_id="r-b3", step=3, cells=(0, 1), accumulated={0: [...], 1: [...]},
                       applied=[...], grad_norm=0.8, final_in_burst=False)

Called after the optimizer step and before the step counts as done (step_runner.py), and for each step a
restarted core takes again (replay.py), whose record replaces the first one. The micro-steps' payloads are
read from the batch's queue (`payloads`), which keeps them until a checkpoint covers the step; the weights
come from the trainer itself (`named_weights`), written on its compute thread so no optimizer step runs
while they are read. `archive.steps: false` turns it off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import redis.asyncio as aioredis

from gyre.ids import microstep_queue
from gyre.log import get_logger
from gyre.store import Keys
from gyre.store.step_archive import StepRecordFile, write_step_record
from gyre.trainer.backends import TrainerBackend
from services.cell_agent.compute import ComputeThread

log = get_logger("gyre.cell_agent.step_archive")


class ArchivingSide(Protocol):
    """What recording a step needs of the core's training side (`TrainingSide`, training.py, which
    imports this module): where and how to record, the store, the trainer and its compute thread."""

    archive_dir: Path | None
    archive_weights_every: int
    archive_level: int
    redis: aioredis.Redis
    keys: Keys
    compute: ComputeThread

    @property
    def trainer(self) -> TrainerBackend: ...


async def archive_step(
    side: ArchivingSide,
    *,
    batch_id: str,
    step: int,
    cells: tuple[int, ...],
    accumulated: dict[int, list[str]],
    applied: list[str],
    grad_norm: float,
    final_in_burst: bool,
    replayed: bool = False,
) -> None:
    """Core: write the record of the step just taken (a no-op without `archive.steps`)."""
    if side.archive_dir is None:
        return
    version = side.trainer.version
    assert version is not None
    ids = sorted({*applied, *(i for order in accumulated.values() for i in order)})
    key = side.keys.queue(microstep_queue(batch_id), "payloads")
    raw = await side.redis.hmget(key, ids) if ids else []
    payloads = {i: bytes(v) for i, v in zip(ids, raw, strict=True) if v is not None}
    if len(payloads) != len(ids):
        log.error("step_archive_payloads_missing", batch=batch_id, missing=sorted(set(ids) - set(payloads)))
    every = side.archive_weights_every
    record = StepRecordFile(
        batch_id=batch_id,
        step=step,
        version=version,
        cells=tuple(cells),
        accumulated={c: list(accumulated.get(c, [])) for c in cells},
        applied=list(applied),
        payloads=payloads,
        grad_norm=grad_norm,
        final_in_burst=final_in_burst,
        replayed=replayed,
    )
    archive_dir = side.archive_dir

    def write() -> int:
        weights = side.trainer.named_weights() if every and version % every == 0 else None
        return write_step_record(archive_dir, record, weights=weights, compress_level=side.archive_level)

    written = await side.compute.run(write)
    log.info("step_archived", batch=batch_id, policy_version=version, microsteps=len(ids), bytes=written)

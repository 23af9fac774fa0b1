"""The `archive:` section: where a run's trained groups go when they leave Redis (bounded state), and the
training record `gyre audit` replays.

Once the step that consumed a batch committed, the packer writes the batch's trajectory trees, group
records, outcomes and evaluations as compressed files under `dir` and deletes them from Redis
(gyre/store/archive.py), so Redis holds only what the run still works on. The core writes each optimizer
step's micro-steps as its cells applied them, and the weights after it (gyre/store/step_archive.py).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import field_validator

from gyre.config.base import NonNegativeInt, Section


class ArchiveSection(Section):
    enabled: bool = True
    """Archive and delete each group once its step committed. `false` keeps everything in Redis, whose memory
    then grows with every execution of the run."""
    dir: Path | None = None
    """Archive directory; None = `<run dir>/archive`. On a cluster, a volume that outlives the packer's pod."""
    compress_level: int = 6
    """gzip level of the archive files (1 fastest .. 9 smallest)."""
    ack_wait_s: float = 300.0
    """Seconds the packer may take to archive one step before NATS redelivers its StepCompleted."""
    steps: bool = True
    """The core keeps every optimizer step's micro-steps (per cell, in the order each cell accumulated them)
    under `dir/steps/`: what `gyre audit` replays the run's training from. About 3 bytes per trained token."""
    weights_every_steps: NonNegativeInt = 1
    """With `steps`, the weights after every this many steps go to `dir/weights/` (the trainer's dtype: one
    model's size each; 0 = none, and `gyre audit` compares the replay with the run's checkpoints and
    publications only). 1 on the embedded default, whose model is 3.6 MB; a cluster sets it to its
    checkpoint interval or 0."""

    @field_validator("compress_level")
    @classmethod
    def _level(cls, v: int) -> int:
        if not 1 <= v <= 9:
            raise ValueError(f"compress_level must be a gzip level in 1..9; got {v}")
        return v

    @field_validator("ack_wait_s")
    @classmethod
    def _ack_wait(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"ack_wait_s must be > 0 (seconds); got {v}")
        return v

    def path_for(self, run_dir: Path) -> Path:
        """The archive directory of a run whose directory is `run_dir`."""
        return self.dir if self.dir is not None else Path(run_dir) / "archive"

"""The `archive:` section: where a run's trained groups go when they leave Redis (bounded state).

Once the step that consumed a batch committed, the packer writes the batch's trajectory trees, group
records, outcomes and evaluations as compressed files under `dir` and deletes them from Redis
(gyre/store/archive.py), so Redis holds only what the run still works on.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import field_validator

from gyre.config.base import Section


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

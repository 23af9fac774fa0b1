"""The `wandb` sink: an offline W&B run of the per-step training metrics (`pip install 'gyre[wandb]'`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gyre.metrics.sinks.base import MetricsSink, SinkSettings


class WandbSink(MetricsSink):
    """A W&B run in offline mode under `runs/<run>/wandb/` (id = the run id: after a restart a second offline
    directory logs to the same run); `wandb sync runs/<run>/wandb/offline-run-*` uploads them later."""

    name = "wandb"
    extra = "wandb"

    def __init__(self, section: SinkSettings, run_dir: Path, run_id: str) -> None:
        super().__init__(section, run_dir, run_id)
        try:
            import wandb
        except ImportError as e:
            raise self._missing(e) from None
        run_dir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=section.wandb_project,
            name=run_id,
            id=run_id,
            dir=str(run_dir),
            mode="offline",
            resume="allow",
        )

    def write(self, row: dict[str, Any], scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=int(row["step"]))

    def close(self) -> None:
        self._run.finish()

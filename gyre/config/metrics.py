"""Config section of observability: the Prometheus `/metrics` listener every service runs, and the sinks
of the per-step training metrics (`runs/<run>/metrics.jsonl` always; TensorBoard, W&B, MLflow on demand).

    metrics:
      port: 0                       # each service's /metrics on run.host; 0 = a free port (see `gyre status`)
      sinks: [tensorboard, wandb]   # besides metrics.jsonl, the source of truth
      wandb_project: my-project
"""

from __future__ import annotations

from pydantic import Field, field_validator

from gyre.config.base import Port, Section
from gyre.metrics.sinks import SINKS, unknown_sink


class MetricsSection(Section):
    serve: bool = True
    """Every service serves Prometheus `/metrics` on `run.host:port` (a small HTTP listener of its own)."""
    port: Port = 0
    """Port of that listener. 0 = a free port per process (written to `runs/<run>/services/<name>.json` and
    shown by `gyre status`); a fixed port is for one service per network namespace (a container, a pod),
    where every service listens on the same one (deploy/ uses 9400)."""
    sinks: list[str] = Field(default_factory=lambda: ["tensorboard"])
    """Where per-step training metrics go besides `runs/<run>/metrics.jsonl` (always written, the source of
    truth), names in the registry of `gyre.metrics.sinks` (`SINKS`): `tensorboard` (event files under
    `runs/<run>/tensorboard/`), `wandb` (offline run under `runs/<run>/wandb/`; `pip install 'gyre[wandb]'`),
    `mlflow` (a local SQLite store `runs/<run>/mlflow.db`; `pip install 'gyre[mlflow]'`). A sink whose package is missing stops the scheduler at start."""
    wandb_project: str = "gyre"
    """W&B project name of the offline run (`wandb sync runs/<run>/wandb/offline-run-*` uploads it later)."""
    mlflow_experiment: str = "gyre"
    """MLflow experiment the run is logged under."""

    @field_validator("sinks")
    @classmethod
    def _registered_and_distinct(cls, v: list[str]) -> list[str]:
        for name in v:
            if name not in SINKS:
                raise ValueError(unknown_sink(name))
        if len(set(v)) != len(v):
            raise ValueError(f"sinks must not repeat a sink; got {v}")
        return v

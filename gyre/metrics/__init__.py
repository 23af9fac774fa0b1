"""Observability: Prometheus series of every service (naming scheme, registries, the `/metrics` listener)
and per-step training metrics (joined from events, written to `metrics.jsonl`, TensorBoard, W&B, MLflow).

    registry.py   `series()` naming scheme, per-process registry, scrape-time collectors
    listener.py   the `/metrics` HTTP listener on a service's event loop
    steps.py      one row per optimizer step from GroupPacked / MicroStepEnqueued / StreamClosed / StepCompleted
    sinks/        the registry of sinks (jsonl, tensorboard, wandb, mlflow), one module each
    writer.py     the scheduler's writer: replays the run's events into the rows and the sinks
"""

from gyre.metrics.listener import MetricsListener
from gyre.metrics.registry import (
    SECONDS_BUCKETS,
    CombinedRegistry,
    Family,
    ScrapeCollector,
    process_registry,
    sample_values,
    series,
)

__all__ = [
    "SECONDS_BUCKETS",
    "CombinedRegistry",
    "Family",
    "MetricsListener",
    "ScrapeCollector",
    "process_registry",
    "sample_values",
    "series",
]

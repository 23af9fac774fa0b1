"""Sinks of per-step training metrics, by name (the config field `metrics.sinks`): `metrics.jsonl` (always,
the source of truth), TensorBoard, W&B (offline), MLflow (a local SQLite store).

    sinks = open_sinks(config.metrics, run_dir=Path("runs/r1"), run_id="r1")   # raises ConfigError early
    for sink in sinks:
        sink.write(row, scalars(row))
    close_sinks(sinks)

The registry maps a name to a loader of its class, so a sink's module loads only when a run opens that sink,
and the config checks `metrics.sinks` against the names here (this package imports nothing of the config).
A sink whose package is missing raises `ConfigError` naming the extra when it opens (the scheduler then
refuses to start), never skips silently. See `base.py` for the interface and how to add a sink;
tests/unit/metrics/test_sink_contract.py runs the contract for every name here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gyre.metrics.sinks.base import MetricsSink, SinkSettings
from gyre.metrics.sinks.jsonl import JSONL_NAME, JsonlSink, read_jsonl_steps


def _tensorboard() -> type[MetricsSink]:
    from gyre.metrics.sinks.tensorboard_sink import TensorBoardSink

    return TensorBoardSink


def _wandb() -> type[MetricsSink]:
    from gyre.metrics.sinks.wandb_sink import WandbSink

    return WandbSink


def _mlflow() -> type[MetricsSink]:
    from gyre.metrics.sinks.mlflow_sink import MlflowSink

    return MlflowSink


SINKS: dict[str, Callable[[], type[MetricsSink]]] = {
    "tensorboard": _tensorboard,
    "wandb": _wandb,
    "mlflow": _mlflow,
}
"""name → a function returning the sink class (importing its module on first use): the sinks `metrics.sinks`
may name (JSONL is always on)."""


def unknown_sink(name: str) -> str:
    """The one-line refusal of a name `SINKS` does not hold (the config's message and `sink_class`'s)."""
    return f"{name!r} is not a registered sink; available: {', '.join(SINKS)}"


def sink_class(name: str) -> type[MetricsSink]:
    """The sink class registered as `name` (imports its module)."""
    try:
        load = SINKS[name]
    except KeyError:
        raise ValueError(f"metrics.sinks: {unknown_sink(name)}") from None
    return load()


def open_sinks(section: SinkSettings, run_dir: Path, run_id: str) -> list[MetricsSink]:
    """The JSONL sink first, then each configured one; on a failure the ones opened are closed again."""
    opened: list[MetricsSink] = [JsonlSink(section, run_dir, run_id)]
    try:
        for name in section.sinks:
            opened.append(sink_class(name)(section, run_dir, run_id))
    except BaseException:
        close_sinks(opened)
        raise
    return opened


def close_sinks(sinks: list[MetricsSink]) -> None:
    for sink in reversed(sinks):
        sink.close()


__all__ = [
    "JSONL_NAME",
    "SINKS",
    "JsonlSink",
    "MetricsSink",
    "SinkSettings",
    "close_sinks",
    "open_sinks",
    "read_jsonl_steps",
    "sink_class",
    "unknown_sink",
]

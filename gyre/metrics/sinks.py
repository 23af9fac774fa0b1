"""Where per-step training metrics go: `metrics.jsonl` (always, the source of truth), TensorBoard, W&B
(offline), MLflow (a local SQLite store). `metrics.sinks` in the config picks the others.

    sinks = open_sinks(config.metrics, run_dir=Path("runs/r1"), run_id="r1")   # raises ConfigError early
    for sink in sinks:
        sink.write(row, scalars(row))
    close_sinks(sinks)

To add a sink: subclass `MetricsSink`, set `name` (and `extra`, the optional dependency it needs), implement
`write` and `close`, add it to `SINKS` and to `Sink` in gyre/config/metrics.py. A sink whose package is
missing raises `ConfigError` naming the extra when it opens (the scheduler then refuses to start), never
skips silently. Every sink must tolerate a restart: rows already written are not written again (the
writer skips the steps `metrics.jsonl` holds), and a sink resumes its run rather than starting a second.
"""

from __future__ import annotations

import json
import os
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from gyre.config import ConfigError
from gyre.config.metrics import MetricsSection

JSONL_NAME = "metrics.jsonl"


class MetricsSink(ABC):
    name: ClassVar[str]
    extra: ClassVar[str | None] = None
    """The optional dependency group (`pip install 'gyre[<extra>]'`) the sink needs, if any."""

    def __init__(self, section: MetricsSection, run_dir: Path, run_id: str) -> None:
        self.section = section
        self.run_dir = run_dir
        self.run_id = run_id

    @abstractmethod
    def write(self, row: dict[str, Any], scalars: dict[str, float]) -> None:
        """Record one step's row (`row["step"]` is the step; `scalars` its numbers by name)."""

    @abstractmethod
    def close(self) -> None:
        """Flush and release (idempotent)."""

    def _missing(self, error: ImportError) -> ConfigError:
        install = (
            f"pip install 'gyre[{self.extra}]'"
            if self.extra
            else "pip install -e . (it is a dependency of gyre)"
        )
        package = (error.name or self.extra or self.name).split(".")[0]
        return ConfigError(
            f"metrics.sinks: {self.name!r} needs the {package} package, which is not installed; "
            f"install it with `{install}` or remove {self.name!r} from metrics.sinks"
        )


def read_jsonl_steps(path: Path) -> set[int]:
    """Steps already in a `metrics.jsonl`; a torn last line (a crash mid-write) is cut off the file."""
    if not path.exists():
        return set()
    data = path.read_bytes()
    good = data.rfind(b"\n") + 1
    if good < len(data):
        with open(path, "r+b") as f:
            f.truncate(good)
    return {int(json.loads(line)["step"]) for line in data[:good].splitlines() if line.strip()}


class JsonlSink(MetricsSink):
    """`runs/<run>/metrics.jsonl`: one JSON object per step, appended and flushed as each step completes."""

    name = "jsonl"

    def __init__(self, section: MetricsSection, run_dir: Path, run_id: str) -> None:
        super().__init__(section, run_dir, run_id)
        self.path = run_dir / JSONL_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.written = read_jsonl_steps(self.path)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, row: dict[str, Any], scalars: dict[str, float]) -> None:
        self._file.write(json.dumps(row, allow_nan=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


class TensorBoardSink(MetricsSink):
    """TensorBoard event files under `runs/<run>/tensorboard/` (the `tensorboard` package's writer, no torch
    or TensorFlow); `tensorboard --logdir runs/<run>/tensorboard` shows them."""

    name = "tensorboard"

    def __init__(self, section: MetricsSection, run_dir: Path, run_id: str) -> None:
        super().__init__(section, run_dir, run_id)
        try:
            from tensorboard.compat.proto import event_pb2, summary_pb2
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError as e:
            raise self._missing(e) from None

        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        self.logdir = run_dir / "tensorboard"
        self._writer = EventFileWriter(str(self.logdir))

    def write(self, row: dict[str, Any], scalars: dict[str, float]) -> None:
        values = [self._summary.Value(tag=tag, simple_value=v) for tag, v in scalars.items()]
        event = self._event(
            wall_time=float(row.get("time_s") or time.time()),
            step=int(row["step"]),
            summary=self._summary(value=values),
        )
        self._writer.add_event(event)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink(MetricsSink):
    """A W&B run in offline mode under `runs/<run>/wandb/` (id = the run id: after a restart a second offline
    directory logs to the same run); `wandb sync runs/<run>/wandb/offline-run-*` uploads them later."""

    name = "wandb"
    extra = "wandb"

    def __init__(self, section: MetricsSection, run_dir: Path, run_id: str) -> None:
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


class MlflowSink(MetricsSink):
    """An MLflow run in a local SQLite store `runs/<run>/mlflow.db` (experiment `metrics.mlflow_experiment`,
    run tagged `gyre.run=<run id>` and resumed after a restart); `mlflow ui --backend-store-uri
    sqlite:///runs/<run>/mlflow.db` shows it."""

    name = "mlflow"
    extra = "mlflow"

    def __init__(self, section: MetricsSection, run_dir: Path, run_id: str) -> None:
        super().__init__(section, run_dir, run_id)
        try:
            from mlflow.entities import Metric
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise self._missing(e) from None
        self._metric = Metric
        self.store = (run_dir / "mlflow.db").resolve()
        self._client = MlflowClient(tracking_uri=f"sqlite:///{self.store}")
        experiment = self._client.get_experiment_by_name(section.mlflow_experiment)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self._client.create_experiment(section.mlflow_experiment)
        )
        found = self._client.search_runs([experiment_id], filter_string=f"tags.`gyre.run` = '{run_id}'")
        self.mlflow_run_id = (
            found[0].info.run_id
            if found
            else self._client.create_run(
                experiment_id, run_name=run_id, tags={"gyre.run": run_id}
            ).info.run_id
        )
        self._closed = False

    def write(self, row: dict[str, Any], scalars: dict[str, float]) -> None:
        ms, step = int(1000 * float(row.get("time_s") or time.time())), int(row["step"])
        self._client.log_batch(
            self.mlflow_run_id, metrics=[self._metric(k, v, ms, step) for k, v in scalars.items()]
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._client.set_terminated(self.mlflow_run_id)


SINKS: dict[str, type[MetricsSink]] = {s.name: s for s in (TensorBoardSink, WandbSink, MlflowSink)}
"""The sinks `metrics.sinks` may name (JSONL is always on)."""


def open_sinks(section: MetricsSection, run_dir: Path, run_id: str) -> list[MetricsSink]:
    """The JSONL sink first, then each configured one; on a failure the ones opened are closed again."""
    opened: list[MetricsSink] = [JsonlSink(section, run_dir, run_id)]
    try:
        for name in section.sinks:
            opened.append(SINKS[name](section, run_dir, run_id))
    except BaseException:
        close_sinks(opened)
        raise
    return opened


def close_sinks(sinks: list[MetricsSink]) -> None:
    for sink in reversed(sinks):
        sink.close()

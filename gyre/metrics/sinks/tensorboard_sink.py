"""The `tensorboard` sink: TensorBoard event files of the per-step training metrics (no torch or TensorFlow)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gyre.metrics.sinks.base import MetricsSink, SinkSettings


class TensorBoardSink(MetricsSink):
    """TensorBoard event files under `runs/<run>/tensorboard/` (the `tensorboard` package's writer, no torch
    or TensorFlow); `tensorboard --logdir runs/<run>/tensorboard` shows them."""

    name = "tensorboard"

    def __init__(self, section: SinkSettings, run_dir: Path, run_id: str) -> None:
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

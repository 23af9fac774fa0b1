"""The sink that is always on: `runs/<run>/metrics.jsonl`, one JSON object per step, the source of truth of
per-step training metrics (the writer skips the steps it already holds after a restart)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gyre.metrics.sinks.base import MetricsSink, SinkSettings

JSONL_NAME = "metrics.jsonl"


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

    def __init__(self, section: SinkSettings, run_dir: Path, run_id: str) -> None:
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

"""The extension point of per-step training metrics: where a step's row goes besides `metrics.jsonl`.

A sink is opened once when the scheduler starts (`open_sinks`), gets every completed step's row, and is
closed when the scheduler stops:

    sink = TensorBoardSink(section, run_dir=Path("runs/r1"), run_id="r1")   # ConfigError: its package is missing
    sink.write(row, scalars(row))
    sink.close()

To add a sink: write a module beside this one with a subclass of `MetricsSink` that sets `name` (and `extra`,
the optional dependency group it needs), imports its package inside `__init__` (raising `self._missing(e)`
on an ImportError, never skipping silently) and implements `write` and `close`; then add its loader to `SINKS`
in gyre/metrics/sinks/__init__.py. The config field `metrics.sinks` accepts the registry's names, and
tests/unit/metrics/test_sink_contract.py runs the contract for every one. Every sink must tolerate a
restart: rows already written are not written again (the writer skips the steps `metrics.jsonl` holds),
and a sink resumes its run rather than starting a second.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

from gyre.errors import ConfigError


class SinkSettings(Protocol):
    """What the sinks read of their config section (`gyre.config.metrics.MetricsSection`, which sits above
    the sinks: the config checks `metrics.sinks` against their registry)."""

    @property
    def sinks(self) -> Sequence[str]: ...
    @property
    def wandb_project(self) -> str: ...
    @property
    def mlflow_experiment(self) -> str: ...


class MetricsSink(ABC):
    name: ClassVar[str]
    extra: ClassVar[str | None] = None
    """The optional dependency group (`pip install 'gyre[<extra>]'`) the sink needs, if any."""

    def __init__(self, section: SinkSettings, run_dir: Path, run_id: str) -> None:
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

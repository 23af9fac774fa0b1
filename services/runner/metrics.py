"""Runner metrics on `/metrics`: sandboxes by state (starting, running, finishing), slots, the launch
latency from start request to running harness, executions terminated by reason and how long they ran."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram

from gyre.metrics.registry import SECONDS_BUCKETS, Family, ScrapeCollector, series
from gyre.v1 import common_pb2 as cm

LAUNCH_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def reason_label(name: str) -> str:
    """`TERMINATION_REASON_HARNESS_TIMEOUT` → `harness_timeout`."""
    return name.removeprefix("TERMINATION_REASON_").lower()


class RunnerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        s = "runner"
        self.launch_seconds = Histogram(
            series(s, "launch_seconds"),
            "Start request taken → harness running in its sandbox (workspace, credentials, launch).",
            buckets=LAUNCH_BUCKETS,
            registry=registry,
        )
        self.terminated = Counter(
            series(s, "terminated_executions"),
            "Executions reported terminated, by reason.",
            ["reason"],
            registry=registry,
        )
        self.execution_seconds = Histogram(
            series(s, "execution_seconds"),
            "Seconds each execution ran.",
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        for reason, number in cm.TerminationReason.items():  # every reason from the first scrape on, at 0
            if number != cm.TERMINATION_REASON_UNSPECIFIED:
                self.terminated.labels(reason_label(reason))
        self.starting = 0
        """Starts under way (claimed, sandbox not launched yet)."""
        self.finishing = 0
        """Executions whose harness ended and whose workspace is being preserved and reported."""
        self.running: Callable[[], int] = lambda: 0
        """Sandboxes the runner owns (set by the service: its controller's running table)."""
        self.slots: Callable[[], tuple[int, int]] = lambda: (0, 0)
        """(used, size) of the concurrency bound (set by the service)."""
        ScrapeCollector(self._read, registry)

    def _read(self) -> Iterable[Family]:
        running, (used, size) = self.running(), self.slots()
        boxes = Family(series("runner", "sandboxes"), "Sandboxes by state.", label_names=("state",))
        boxes.add(self.starting, "starting")
        boxes.add(max(0, running - self.finishing), "running")
        boxes.add(self.finishing, "finishing")
        slots = Family(
            series("runner", "slots"),
            "Execution slots (runner.max_concurrent), by use.",
            label_names=("use",),
        )
        slots.add(used, "used")
        slots.add(max(0, size - used), "free")
        return [boxes, slots]

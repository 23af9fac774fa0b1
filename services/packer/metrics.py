"""Packer metrics on `/metrics`: groups packed, micro-steps enqueued, admitted trajectories and target tokens
by leaf class, and the batches in flight (gyre/metrics/registry.py has the naming scheme)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram

from gyre.metrics.registry import Family, ScrapeCollector, series
from gyre.trajectory.profiles import LeafClass

TOKEN_BUCKETS = (256, 1024, 4096, 16384, 65536, 262144, 1048576)


class PackerMetrics:
    def __init__(self, registry: CollectorRegistry, open_batches: Callable[[], int] = lambda: 0) -> None:
        s = "packer"
        self.groups = Counter(
            series(s, "groups_packed"), "Ready groups packed into a batch.", registry=registry
        )
        self.zero_variance_groups = Counter(
            series(s, "zero_variance_groups"),
            "Groups packed whose resolved rewards were all equal (no signal).",
            registry=registry,
        )
        self.microsteps = Counter(
            series(s, "microsteps_enqueued"), "Micro-steps put on a batch queue.", registry=registry
        )
        self.tokens = Counter(
            series(s, "enqueued_tokens"), "Tokens of the micro-steps enqueued.", registry=registry
        )
        self.microstep_tokens = Histogram(
            series(s, "microstep_tokens"),
            "Tokens per enqueued micro-step.",
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self.trajectories = Counter(
            series(s, "admitted_trajectories"),
            "Trajectories admitted, by leaf class.",
            ["leaf_class"],
            registry=registry,
        )
        self.targets = Counter(
            series(s, "admitted_target_tokens"),
            "Target tokens admitted, by leaf class.",
            ["leaf_class"],
            registry=registry,
        )
        self.batches_closed = Counter(
            series(s, "batches_closed"), "Batch streams closed (B groups packed).", registry=registry
        )
        for leaf_class in LeafClass:  # every class from the first scrape on, at 0
            self.trajectories.labels(leaf_class.value)
            self.targets.labels(leaf_class.value)
        self._open_batches = open_batches
        ScrapeCollector(self._read, registry)

    def group_packed(
        self, by_class: dict[str, int], targets_by_class: dict[str, int], zero_variance: bool
    ) -> None:
        self.groups.inc()
        if zero_variance:
            self.zero_variance_groups.inc()
        for leaf_class, n in by_class.items():
            self.trajectories.labels(leaf_class).inc(n)
        for leaf_class, n in targets_by_class.items():
            self.targets.labels(leaf_class).inc(n)

    def microstep_enqueued(self, num_tokens: int) -> None:
        self.microsteps.inc()
        self.tokens.inc(num_tokens)
        self.microstep_tokens.observe(num_tokens)

    def _read(self) -> Iterable[Family]:
        f = Family(series("packer", "open_batches"), "Batch streams open (packing, not yet closed).")
        f.add(self._open_batches())
        return [f]

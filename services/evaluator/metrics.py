"""Evaluator metrics on `/metrics`: evaluation latency and outcomes (valid, excluded, placeholder), verifier
attempts, evaluations pending (being evaluated or retried) and queued, groups made ready."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram

from gyre.metrics.registry import SECONDS_BUCKETS, Family, ScrapeCollector, series

STATUSES = ("valid", "excluded", "placeholder")


class EvaluatorMetrics:
    def __init__(self, registry: CollectorRegistry, pending: Callable[[], int]) -> None:
        s = "evaluator"
        self.evaluation_seconds = Histogram(
            series(s, "evaluation_seconds"),
            "Seconds to resolve one execution (all verifier attempts).",
            ["status"],
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.evaluations = Counter(
            series(s, "evaluations"),
            "Executions resolved, by outcome (valid, excluded, placeholder).",
            ["status"],
            registry=registry,
        )
        self.attempts = Counter(series(s, "verifier_attempts"), "Verifier attempts made.", registry=registry)
        self.groups_ready = Counter(
            series(s, "groups_ready"), "Groups made ready (all members resolved).", registry=registry
        )
        for status in STATUSES:  # every outcome from the first scrape on, at 0
            self.evaluations.labels(status)
            self.evaluation_seconds.labels(status)
        self.queued = 0
        """Evaluations waiting in the queue (refreshed by the service every few seconds)."""
        self._pending = pending
        ScrapeCollector(self._read, registry)

    def evaluated(self, status: str, attempts: int, seconds: float) -> None:
        self.evaluations.labels(status).inc()
        self.attempts.inc(attempts)
        self.evaluation_seconds.labels(status).observe(seconds)

    def _read(self) -> Iterable[Family]:
        pending = Family(
            series("evaluator", "pending_evaluations"),
            "Executions being evaluated now (verifier running or waiting to retry).",
        )
        pending.add(self._pending())
        queued = Family(
            series("evaluator", "queued_evaluations"), "Terminated executions waiting for a worker."
        )
        queued.add(self.queued)
        return [pending, queued]

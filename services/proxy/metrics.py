"""Proxy metrics: Prometheus series on `/metrics` and the plain counters `GetStats` returns.

Each proxy owns its `CollectorRegistry` (two proxies in one test process do not collide).
`overhead_seconds` is the time a call spends in the proxy itself — parsing, matching, encoding,
rendering, recording — excluding the time it waits on engines and on the harness reading the
stream (`OverheadClock` measures it by pausing around those waits).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from services.proxy.errors import ProxyError

OVERHEAD_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass(slots=True)
class StatsCounters:
    """Totals since the proxy started (`GetStats`)."""

    requests: int = 0
    client_errors: int = 0
    server_errors: int = 0
    reroutes: int = 0
    kv_migrated_tokens: int = 0
    errors_during_transitions: int = 0


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.stats = StatsCounters()
        r = self.registry
        self.requests = Counter(
            "gyre_proxy_requests",
            "Harness requests answered, by API and HTTP status.",
            ["api", "status"],
            registry=r,
        )
        self.errors = Counter(
            "gyre_proxy_errors",
            "Harness requests answered with an error, by API and error class.",
            ["api", "error_class"],
            registry=r,
        )
        self.overhead = Histogram(
            "gyre_proxy_overhead_seconds",
            "Time a call spends in the proxy, excluding engine and client waits.",
            ["api"],
            buckets=OVERHEAD_BUCKETS_S,
            registry=r,
        )
        self.tokens_in = Counter("gyre_proxy_tokens_in", "Prompt tokens sent to engines.", registry=r)
        self.tokens_encoded = Counter(
            "gyre_proxy_tokens_encoded", "Prompt tokens newly encoded (not reused from the tree).", registry=r
        )
        self.tokens_out = Counter("gyre_proxy_tokens_out", "Output tokens recorded.", registry=r)
        self.reroutes = Counter(
            "gyre_proxy_reroutes", "Calls moved to another engine mid-generation.", registry=r
        )
        self.kv_migrated = Counter(
            "gyre_proxy_kv_migrated_tokens",
            "Prompt tokens whose KV was imported instead of recomputed.",
            registry=r,
        )
        self.transition_errors = Counter(
            "gyre_proxy_errors_during_transitions",
            "Errors harnesses saw while a drain was under way.",
            registry=r,
        )
        self.stream_mismatches = Counter(
            "gyre_proxy_stream_mismatches",
            "Streamed outputs that differ from the recorded parse (a bug).",
            registry=r,
        )
        self.conversion_bugs = Counter(
            "gyre_proxy_conversion_bugs",
            "Malformed requests a converter failed on without a RequestError (a bug; answered 400).",
            registry=r,
        )
        self.replayed = Counter(
            "gyre_proxy_calls_replayed",
            "Retried calls answered with the output recorded for their lost first attempt (replay.py).",
            registry=r,
        )
        self.open_executions = Gauge("gyre_proxy_open_executions", "Executions with a live key.", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def answered(self, api: str, status: int) -> None:
        self.stats.requests += 1
        self.requests.labels(api, str(status)).inc()

    def failed(self, api: str, error: ProxyError, during_transition: bool) -> None:
        if error.is_client_error:
            self.stats.client_errors += 1
        else:
            self.stats.server_errors += 1
        self.errors.labels(api, str(error.kind)).inc()
        if during_transition:
            self.stats.errors_during_transitions += 1
            self.transition_errors.inc()

    def rerouted(self, num_calls: int, kv_tokens: int) -> None:
        self.stats.reroutes += num_calls
        self.reroutes.inc(num_calls)
        if kv_tokens:
            self.stats.kv_migrated_tokens += kv_tokens
            self.kv_migrated.inc(kv_tokens)


class OverheadClock:
    """Accumulates time inside the proxy; `outside()` pauses it around engine and client waits."""

    def __init__(self) -> None:
        self._total = 0.0
        self._since: float | None = time.perf_counter()

    @contextmanager
    def outside(self) -> Iterator[None]:
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def pause(self) -> None:
        if self._since is not None:
            self._total += time.perf_counter() - self._since
            self._since = None

    def resume(self) -> None:
        if self._since is None:
            self._since = time.perf_counter()

    @property
    def seconds(self) -> float:
        running = time.perf_counter() - self._since if self._since is not None else 0.0
        return self._total + running

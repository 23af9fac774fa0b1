"""Proxy metrics: Prometheus series (`gyre_proxy_*`) and the plain counters `GetStats` returns.

The series are served on the proxy's `/metrics` listener (gyre/service.py) and on its harness HTTP port's
`GET /metrics`.

Each proxy owns its `CollectorRegistry` (two proxies in one test process do not collide).
`overhead_seconds` is the time a call spends in the proxy itself — parsing, matching, encoding,
rendering, recording — excluding the time it waits on engines and on the harness reading the
stream (`OverheadClock` measures it by pausing around those waits).

Refused calls: every model call answered with an error counts once under its `ProxyError.reason`
(`prompt_too_long`, `engine_unavailable`, ...), with the latest message per reason kept for reports
(`gyre status`, the demo's summary.json), so a run whose calls are all refused says why instead of
"completing" on empty trees. A harness retry is another call and counts again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gyre.metrics.registry import series
from services.proxy.errors import ProxyError

REFUSAL_REASONS = (
    "invalid_request",
    "prompt_too_long",
    "engine_refused",
    "authentication",
    "execution_closed",
    "not_found",
    "body_too_large",
    "engine_unavailable",
    "engine_output",
    "internal",
)
"""The reasons of the proxy's errors (services/proxy/errors.py), pre-created as label children."""
REFUSAL_MESSAGE_CHARS = 300
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
    recorded_calls: int = 0
    history_mismatches: int = 0
    side_calls: int = 0
    refused_calls: dict[str, int] = field(default_factory=dict)
    """Model calls answered with an error, by `ProxyError.reason`."""
    refusal_messages: dict[str, str] = field(default_factory=dict)
    """The latest error message per reason (at most REFUSAL_MESSAGE_CHARS characters)."""


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.stats = StatsCounters()
        r = self.registry
        self.requests = Counter(
            series("proxy", "requests"),
            "Harness requests answered, by API and HTTP status.",
            ["api", "status"],
            registry=r,
        )
        self.errors = Counter(
            series("proxy", "errors"),
            "Harness requests answered with an error, by API and error class.",
            ["api", "error_class"],
            registry=r,
        )
        self.overhead = Histogram(
            series("proxy", "overhead_seconds"),
            "Time a call spends in the proxy, excluding engine and client waits.",
            ["api"],
            buckets=OVERHEAD_BUCKETS_S,
            registry=r,
        )
        self.tokens_in = Counter(
            series("proxy", "prompt_tokens"), "Prompt tokens sent to engines.", registry=r
        )
        self.tokens_encoded = Counter(
            series("proxy", "encoded_prompt_tokens"),
            "Prompt tokens newly encoded (not reused from the tree).",
            registry=r,
        )
        self.tokens_out = Counter(series("proxy", "output_tokens"), "Output tokens recorded.", registry=r)
        self.reroutes = Counter(
            series("proxy", "rerouted_calls"), "Calls moved to another engine mid-generation.", registry=r
        )
        self.kv_migrated = Counter(
            series("proxy", "kv_migrated_tokens"),
            "Prompt tokens whose KV was imported instead of recomputed.",
            registry=r,
        )
        self.transition_errors = Counter(
            series("proxy", "errors_during_transitions"),
            "Errors harnesses saw while a drain was under way.",
            registry=r,
        )
        self.stream_mismatches = Counter(
            series("proxy", "stream_mismatches"),
            "Streamed outputs that differ from the recorded parse (a bug).",
            registry=r,
        )
        self.conversion_bugs = Counter(
            series("proxy", "conversion_bugs"),
            "Malformed requests a converter failed on without a RequestError (a bug; answered 400).",
            registry=r,
        )
        self.open_executions = Gauge(
            series("proxy", "open_executions"), "Executions with a live key.", registry=r
        )
        self.history_mismatches = Counter(
            series("proxy", "history_mismatched_calls"),
            "Recorded calls whose history matched no tree path as sent (an assistant turn encoded anew).",
            registry=r,
        )
        self.recorded = Counter(
            series("proxy", "recorded_calls"),
            "Calls recorded in a tree, by request kind.",
            ["request_kind"],
            registry=r,
        )
        for kind in ("task", "summary", "side"):
            self.recorded.labels(kind)
        self.replayed = Counter(
            series("proxy", "replayed_calls"),
            "Retried calls answered with the output recorded for their lost first attempt (replay.py).",
            registry=r,
        )
        self.refused = Counter(
            series("proxy", "refused_calls"),
            "Model calls answered with an error, by reason.",
            ["reason"],
            registry=r,
        )
        for reason in REFUSAL_REASONS:
            self.refused.labels(reason)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def answered(self, api: str, status: int) -> None:
        self.stats.requests += 1
        self.requests.labels(api, str(status)).inc()

    def failed(
        self, api: str, error: ProxyError, during_transition: bool, *, model_call: bool = True
    ) -> None:
        """An answered error; `model_call=False` for requests that are not model calls (count_tokens)."""
        if model_call:
            self.stats.refused_calls[error.reason] = self.stats.refused_calls.get(error.reason, 0) + 1
            self.stats.refusal_messages[error.reason] = error.message[:REFUSAL_MESSAGE_CHARS]
            self.refused.labels(error.reason).inc()
        if error.is_client_error:
            self.stats.client_errors += 1
        else:
            self.stats.server_errors += 1
        self.errors.labels(api, str(error.kind)).inc()
        if during_transition:
            self.stats.errors_during_transitions += 1
            self.transition_errors.inc()

    def recorded_call(self, request_kind: str, history_mismatch: bool) -> None:
        self.stats.recorded_calls += 1
        self.recorded.labels(request_kind).inc()
        if request_kind == "side":
            self.stats.side_calls += 1
        if history_mismatch:
            self.stats.history_mismatches += 1
            self.history_mismatches.inc()

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

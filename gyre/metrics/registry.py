"""Prometheus series of Gyre's services: one naming scheme, one registry per process, scrape-time gauges.

Every series is `gyre_<service>_<what>_<unit>` (`gyre_scheduler_waterlevel_executions`,
`gyre_cell_agent_step_seconds`, `gyre_engine_prompt_tokens_total`): the service that exports it, what it
counts, its unit (`seconds`, `tokens`, `executions`, `groups`, `ratio`…); counters end in `_total`
(prometheus-client adds it). `series(service, what)` builds the name and refuses one outside the scheme.

State a service already keeps (the scheduler's counters, the runner's sandboxes) is read when Prometheus
scrapes, not copied on every change: a `ScrapeCollector` turns a function into gauges and counters at
collection time, so hot paths pay nothing for it. Events that happen (a micro-step, a role switch) are
counted where they happen with prometheus-client's own `Counter` and `Histogram`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Gauge, ProcessCollector, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

disable_created_metrics()  # type: ignore[no-untyped-call]  # no `_created` sample next to every counter and histogram: half of a scrape, unused

SERVICES: tuple[str, ...] = ("scheduler", "proxy", "runner", "evaluator", "packer", "cell_agent", "engine")
"""The first word after `gyre_` of every series (`engine`: a cell's embedded rollout engine)."""

_WHAT = re.compile(r"[a-z][a-z0-9_]*[a-z0-9]")

SECONDS_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    900.0,
    3600.0,
)
"""Histogram buckets for durations from milliseconds (a role switch) to an hour (a long execution)."""


def series(service: str, what: str) -> str:
    """`gyre_<service>_<what>`; `what` is snake_case and ends in its unit (`step_seconds`, `queued_executions`)."""
    if service not in SERVICES:
        raise ValueError(f"unknown service {service!r} in a series name; use one of {', '.join(SERVICES)}")
    if not _WHAT.fullmatch(what) or "__" in what:
        raise ValueError(f"series name part {what!r} must be snake_case (a-z, 0-9, '_')")
    return f"gyre_{service}_{what}"


def process_registry(service: str, instance: str, run_id: str) -> CollectorRegistry:
    """The registry of one service process: `process_*` series (CPU, memory, open files) and
    `gyre_<service>_info{instance, run}` = 1, to which the service adds its own series."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    info = Gauge(
        series(service, "info"), "Always 1; labels name the process.", ["instance", "run"], registry=registry
    )
    info.labels(instance, run_id).set(1)
    return registry


@dataclass(slots=True)
class Sample:
    """One value a `ScrapeCollector` reports, with its labels (values in the family's label order)."""

    value: float
    labels: tuple[str, ...] = ()


@dataclass(slots=True)
class Family:
    """A series family a `ScrapeCollector` fills at scrape time."""

    name: str
    doc: str
    kind: str = "gauge"
    """`gauge`, or `counter` for a cumulative count the service keeps itself (exported with `_total`)."""
    label_names: tuple[str, ...] = ()
    samples: list[Sample] = field(default_factory=list)

    def add(self, value: float, *labels: str) -> None:
        self.samples.append(Sample(float(value), labels))


Read = Callable[[], Iterable[Family]]


class ScrapeCollector(Collector):
    """Reports what `read()` returns each time the registry is collected (the service's own state, read on
    the event loop: the metrics listener runs there too). `read` returns no families before the state it
    reads exists (a service still starting)."""

    def __init__(self, read: Read, registry: CollectorRegistry) -> None:
        self._read = read
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        for f in self._read():
            family: Metric
            if f.kind == "counter":
                family = CounterMetricFamily(f.name.removesuffix("_total"), f.doc, labels=list(f.label_names))
            elif f.kind == "gauge":
                family = GaugeMetricFamily(f.name, f.doc, labels=list(f.label_names))
            else:
                raise ValueError(f"family {f.name}: kind must be gauge or counter; got {f.kind!r}")
            for s in f.samples:
                family.add_metric(list(s.labels), s.value)
            yield family


class CombinedRegistry:
    """Several registries collected as one (a cell agent's own series and its embedded engine's)."""

    def __init__(self, registries: Sequence[CollectorRegistry]) -> None:
        self.registries = tuple(registries)

    def collect(self) -> Iterator[Metric]:
        for registry in self.registries:
            yield from registry.collect()


def sample_values(registry: CollectorRegistry | CombinedRegistry) -> Mapping[str, float]:
    """Every sample as `name{label="v",…}` → value (for tests and `gyre status`)."""
    out: dict[str, float] = {}
    for family in registry.collect():
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out

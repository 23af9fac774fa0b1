"""The series naming scheme and scrape-time collectors."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gyre.metrics import Family, ScrapeCollector, sample_values, series


def test_series_names_follow_the_scheme() -> None:
    assert series("scheduler", "waterlevel_executions") == "gyre_scheduler_waterlevel_executions"
    with pytest.raises(ValueError, match="unknown service 'trainer'"):
        series("trainer", "loss")
    for bad in ("StepSeconds", "step-seconds", "step__seconds", "_step", "step_"):
        with pytest.raises(ValueError, match="snake_case"):
            series("packer", bad)


def test_scrape_collector_reads_state_at_collection_time() -> None:
    state = {"running": 2, "done": 5}
    registry = CollectorRegistry()

    def read() -> list[Family]:
        running = Family(series("runner", "sandboxes"), "Sandboxes.", label_names=("state",))
        running.add(state["running"], "running")
        done = Family(series("runner", "done_executions_total"), "Done.", kind="counter")
        done.add(state["done"])
        return [running, done]

    ScrapeCollector(read, registry)
    assert sample_values(registry) == {
        'gyre_runner_sandboxes{state="running"}': 2.0,
        "gyre_runner_done_executions_total": 5.0,
    }
    state["running"] = 7
    assert sample_values(registry)['gyre_runner_sandboxes{state="running"}'] == 7.0
    text = generate_latest(registry).decode()
    assert re.search(r"# TYPE gyre_runner_done_executions(_total)? counter", text)
    assert "# TYPE gyre_runner_sandboxes gauge" in text


def test_a_family_of_unknown_kind_is_refused() -> None:
    registry = CollectorRegistry()
    ScrapeCollector(lambda: [Family(series("packer", "x_groups"), "X.", kind="summary")], registry)
    with pytest.raises(ValueError, match="kind must be gauge or counter"):
        generate_latest(registry)

"""The whole system for 2 optimizer steps in elastic mode: NATS, Redis, the six services, K = 3
cell agents, the demo harness in sandboxes, real model calls through the proxy.

The run is shaped so that elasticity is exercised: groups become ready at different times (seeded
heavy-tailed tool sleeps), the core joins training while executions are live, and a satellite joins
a batch the core is already in. Asserted from the run's stored events.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gyre.cli.demo import demo_config
from gyre.demo.run import DemoRun

pytestmark = pytest.mark.slow

GYRE = [sys.executable, "-c", "from gyre.cli import main; main()"]


def _events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_two_elastic_steps_with_a_satellite_joining_mid_batch(tmp_path: Path) -> None:
    config = demo_config(None, {
        "run": {"id": "e2e", "dir": str(tmp_path / "runs")},
        "scheduler": {
            "num_cells": 3, "group_size": 2, "batch_groups": 3, "phi": 1 / 3, "mu": 2, "rho_min": 1 / 3,
            "tau_s": 0.2, "cell_capacity": 10,
        },
        "tasks": {"queries": ["add"]},
        "runner": {"harness_args": ["--tool-latency-s", "6", "--tool-latency-max-s", "40"]},
    })
    status_file = tmp_path / "status.yaml"
    status_file.write_text(f"run:\n  id: e2e\n  dir: {tmp_path / 'runs'}\n")
    status_outputs: list[str] = []

    def progress(state: Any, elapsed_s: float) -> None:
        if not status_outputs and state.counters.started > state.counters.finished:
            out = subprocess.run([*GYRE, "status", "--config", str(status_file)], capture_output=True, text=True,
                                 timeout=60)
            status_outputs.append(out.stdout)

    summary = DemoRun(config, steps=2).execute(progress=progress)
    events = _events(config.run.path)

    # `gyre status` during the run shows roles, waterlevel and counters.
    assert status_outputs and "waterlevel" in status_outputs[0] and "0:rollout" in status_outputs[0]
    assert "dispatched" in status_outputs[0] and "SERVING" in status_outputs[0]

    assert summary["steps"] == 2
    ex = summary["executions"]
    assert ex["dispatched"] == sum(v for k, v in ex.items() if k != "dispatched")
    assert ex["trained"] >= 2 * 3 * 2 - ex["excluded"] - ex["placeholder"]
    assert summary["harness_errors_during_transitions"] == 0
    terminated = [e["event"] for e in events if e["type"] == "gyre.v1.ExecutionTerminated"]
    assert terminated and all(t.get("reason") in ("TERMINATION_REASON_COMPLETED", "TERMINATION_REASON_CANCELLED")
                              for t in terminated)

    # A role switch while executions were live: some harness was running when the core began to drain.
    running, live_switches = 0, 0
    for e in events:
        if e["type"] == "gyre.v1.ExecutionStarted":
            running += 1
        elif e["type"] == "gyre.v1.ExecutionTerminated":
            running -= 1
        elif e["type"] == "gyre.v1.RoleTransitionBegun" and e["event"].get("toRole") == "CELL_ROLE_TRAINING":
            live_switches += running > 0
    assert live_switches >= 1

    # A satellite joined a batch mid-way: its switch to training completed after the batch had
    # started packing, and it took part in that batch's step.
    first_packed: dict[str, float] = {}
    for e in events:
        if e["type"] == "gyre.v1.GroupPacked":
            first_packed.setdefault(e["event"]["batchId"], e["time_s"])
    steps = {e["event"]["batchId"]: e for e in events if e["type"] == "gyre.v1.StepCompleted"}
    joined = [
        e for e in events
        if e["type"] == "gyre.v1.RoleTransitionCompleted" and e["event"].get("cell", 0) > 0
        and e["event"].get("toRole") == "CELL_ROLE_TRAINING"
    ]
    mid_batch = [
        (j["event"]["cell"], batch) for j in joined for batch, step in steps.items()
        if first_packed.get(batch, float("inf")) < j["time_s"] < step["time_s"]
        and j["event"]["cell"] in step["event"].get("cells", [])
    ]
    assert mid_batch, f"no satellite joined a batch in flight; joins at {[j['time_s'] for j in joined]}"
    assert summary["transitions"]["count"] >= 2

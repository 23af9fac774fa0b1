"""The reduced fault matrix: one elastic run of a few steps during which scheduler, proxy, packer, evaluator,
runner, a satellite and the core are SIGKILLed one after another (the stack's supervisor restarts each),
the core while it trains. After it the run has reached its step count and `gyre audit` holds (tests/support/audit.py): the
training replayed from its recorded micro-steps equals the run's weights at every step across every kill,
no group was trained twice, every dispatched execution is in exactly one terminal state and none is lost,
all from the services' own records, not from their events. `gyre bench faults` runs the full matrix (NATS and Redis
kills, a satellite SIGSTOPped for 10 s, a hung verifier) with the same code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.demo.config import demo_config
from app.demo.faults import Fault, FaultInjector, fault_report
from app.demo.ledger import read_event_lines
from app.demo.run import DemoRun
from tests.support.audit import assert_audited

pytestmark = pytest.mark.slow

STEPS = 7
SHAPE: dict[str, Any] = {
    "scheduler": {
        "num_cells": 3,
        "group_size": 2,
        "batch_groups": 2,
        "phi": 0.5,
        "mu": 2,
        "rho_min": 0.5,
        "tau_s": 0.2,
        "cell_capacity": 6,
    },
    "tasks": {"queries": ["add"]},
    "runner": {
        "harness_args": ["--tool-latency-s", "2", "--tool-latency-max-s", "8"],
        "sandbox": {"uid_base": 152000},
    },
    "evaluator": {"sandbox": {"uid_base": 153000}},
    # a checkpoint every other step: a core killed after an odd step replays it from its micro-steps
    "cell_agent": {"trainer": {"checkpoint_every_steps": 2}},
}
FAULTS = [
    Fault("scheduler", at_step=0),
    Fault("core", at_step=1, when="training"),
    Fault("proxy", at_step=2),
    Fault("packer", at_step=2),
    Fault("evaluator", at_step=3),
    Fault("runner", at_step=3),
    Fault("satellite", at_step=4, when="any"),
]


def test_services_killed_one_after_another_lose_nothing(tmp_path: Path) -> None:
    config = demo_config(None, {"run": {"id": "faults", "dir": str(tmp_path / "runs")}, **SHAPE})
    injector = FaultInjector(config.run.path, FAULTS)
    try:
        summary = DemoRun(config, steps=STEPS).execute(progress=injector.progress)
    finally:
        injector.stop()
    report = fault_report(read_event_lines(config.run.path / "events.jsonl"), injector.done, STEPS)
    print(json.dumps(report, indent=1))
    assert summary["steps"] == STEPS
    for fault in FAULTS:
        row = report["faults"][fault.label()]
        assert row["injected"] and row["recovery_s"] is not None, (fault.label(), row)
    audited = assert_audited(config.run.path, steps=STEPS)
    counts = audited.accounting.counts()
    assert counts["trained"] + counts["excluded"] + counts["placeholder"] >= 1

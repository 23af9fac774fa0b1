"""Whole-run resume: every process of an elastic run is SIGKILLed at once after its first steps (the
supervisor, NATS, Redis, every service, the sandboxes); `gyre resume RUN` (`DemoRun.resuming`) brings the
run back on its own config and data, and it trains to its step count. `gyre audit` then holds for the whole
run (tests/support/audit.py): the training replayed from the initial weights through the crash equals the
run's weights at every step (so the core resumed from its checkpoint, weights and optimizer state, or took
the lost steps again from their micro-steps, and nothing was applied twice or skipped), no group trained
twice, every dispatched execution in exactly one terminal state and none lost.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from app.cli import app
from app.demo.config import demo_config
from app.demo.faults import kill_whole_run
from app.demo.run import DemoRun
from app.stack.launcher import StackError
from gyre.procs import ProcessId, alive
from tests.faults.test_faults import SHAPE
from tests.support.audit import assert_audited

pytestmark = pytest.mark.slow

STEPS = 3
KILL_AT_STEP = 1


def test_a_run_killed_whole_resumes_and_accounts_for_everything(tmp_path: Path) -> None:
    config = demo_config(None, {"run": {"id": "resume", "dir": str(tmp_path / "runs")}, **SHAPE})
    killed: list[list[ProcessId]] = []
    steps_at_crash: list[int] = []

    def crash(st: Any, elapsed_s: float) -> None:
        if st.steps >= KILL_AT_STEP and not killed and st.counters.started > st.counters.finished:
            steps_at_crash.append(int(st.steps))
            killed.append(kill_whole_run(config.run.path))

    with pytest.raises(StackError):
        DemoRun(config, steps=STEPS).execute(progress=crash)
    assert killed and len(killed[0]) >= 10, killed  # supervisor, nats, redis, 5 services, 3 cells, sandboxes
    assert not [p for p in killed[0] if alive(p.pid, p.started)]
    assert steps_at_crash[0] < STEPS

    # `gyre resume RUN`, as a user runs it (DemoRun.resuming underneath).
    resumed = CliRunner().invoke(app, ["resume", str(config.run.path), "--json"])
    assert resumed.exit_code == 0, resumed.output
    summary = json.loads(resumed.output.strip().splitlines()[-1])
    print(json.dumps({"killed_processes": len(killed[0])}))
    assert summary["steps"] == STEPS
    audited = assert_audited(config.run.path, steps=STEPS)
    assert len(audited.ledger.group_step) >= STEPS * 2

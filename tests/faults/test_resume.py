"""Whole-run resume: every process of an elastic run is SIGKILLed at once after its first steps (the
supervisor, NATS, Redis, every service, the sandboxes); `DemoRun.resuming` (`gyre resume RUN`) brings the
run back on its own config and data, and it trains to its step count. The whole run's events then account
for every dispatched execution once and the group ledger trains no group twice, the policy version +1 per
step across the crash.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gyre.demo.config import demo_config
from gyre.demo.faults import kill_whole_run
from gyre.demo.ledger import check_events, read_event_lines
from gyre.demo.run import DemoRun
from gyre.procs import ProcessId, alive
from gyre.stack.launcher import StackError
from tests.faults.test_faults import SHAPE

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

    summary = DemoRun.resuming(config.run.path).execute()
    check = check_events(read_event_lines(config.run.path / "events.jsonl"), STEPS)
    print(json.dumps({"killed_processes": len(killed[0]), **check.summary()}, indent=1))
    assert summary["steps"] == STEPS and check.completed, check.summary()
    # The core came back from a checkpoint of the crashed run (or replayed the steps after it).
    core_log = (config.run.path / "logs" / "cell_agent-0.log").read_text()
    assert "trainer_resumed" in core_log or "step_replayed" in core_log
    assert check.lost == check.double_trained == check.double_applied == 0, check.violations
    assert check.count("double_accounted") == check.count("version") == 0, check.violations
    assert all(len(v) == 1 for v in check.group_ledger.values()) and len(check.group_ledger) >= STEPS * 2
    ex = summary["executions"]
    assert ex["dispatched"] == sum(v for k, v in ex.items() if k != "dispatched") == check.dispatched

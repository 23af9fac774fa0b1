"""A satellite lost for good while the run goes on: the elastic run of test_elastic_run.py (K = 3, 2 steps)
with restarts off, and a satellite's cell agent SIGKILLed in rollout while its engine serves executions,
or in training once it switched.

The stack's supervisor gives the cell up without stopping the run (only the core's agent is fatal), its
`ProcessExited` tells the scheduler, which removes the cell from the pool: its executions rerouted to the
other engines (their prefix recomputed there), its JoinBatch abandoned, its engine out of the proxy's
table. The run completes its steps without it and `gyre audit` accounts for every execution and step.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from app.demo.config import demo_config
from app.demo.run import DemoRun
from app.stack.state import StackState
from gyre.v1 import common_pb2
from tests.e2e.test_elastic_run import SHAPE
from tests.support.audit import assert_audited, assert_every_execution_ended_ok

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REMOVED_WITHIN_S = 120.0
SATELLITES = (1, 2)


@pytest.mark.parametrize(
    "role", [common_pb2.CELL_ROLE_ROLLOUT, common_pb2.CELL_ROLE_TRAINING], ids=["rollout", "training"]
)
def test_a_satellite_lost_for_good_is_removed_and_the_run_completes(tmp_path: Path, role: int) -> None:
    """Killed in rollout while its engine serves executions (they move and recompute), or in training once
    it switched (its JoinBatch is abandoned and the step is taken without it)."""
    config = demo_config(
        None,
        {
            **SHAPE,
            "run": {"id": "e2elost", "dir": str(tmp_path / "runs"), "supervisor": {"restart": False}},
            # Sandbox uids of its own: a run's sweep kills every process of its uids, so a stack of another
            # test on this host with the default ones would kill these harnesses (SIGKILL, seen here).
            "runner": {**SHAPE["runner"], "sandbox": {"uid_base": 171000}},
            "evaluator": {"sandbox": {"uid_base": 172000}},
        },
    )
    seen: dict[str, Any] = {}

    def progress(st: Any, elapsed_s: float) -> None:
        if "lost" not in seen:
            for k in SATELLITES:
                cell = st.cells[k]
                if (
                    st.steps == 0
                    and cell.role == role
                    and (role != common_pb2.CELL_ROLE_ROLLOUT or cell.executions_routed)
                ):
                    os.kill(_pid(config.run.path, f"cell_agent-{k}"), signal.SIGKILL)
                    seen.update(lost=k, killed_at=time.monotonic())
                    return
            return
        if "removed_at" not in seen:
            if st.cells[seen["lost"]].role == common_pb2.CELL_ROLE_GONE:
                seen["removed_at"] = time.monotonic()
                seen["rollout_capacity"] = st.rollout_capacity
            elif time.monotonic() - seen["killed_at"] > REMOVED_WITHIN_S:
                raise AssertionError(
                    f"cell {seen['lost']} not removed {REMOVED_WITHIN_S:.0f} s after its agent was killed"
                )

    summary = DemoRun(config, steps=2).execute(progress=progress)
    assert "removed_at" in seen, seen  # killed in that role, then removed from the pool
    lost = seen["lost"]
    assert seen["rollout_capacity"] <= 2 * config.scheduler.cell_capacity
    assert summary["steps"] == 2

    events = [json.loads(line) for line in (config.run.path / "events.jsonl").read_text().splitlines()]
    exits = [e["event"] for e in events if e["type"] == "gyre.v1.ProcessExited"]
    assert [(x["process"], x.get("gaveUp", False)) for x in exits] == [(f"cell_agent-{lost}", True)], exits
    assert_every_execution_ended_ok(events)
    steps = [e["event"] for e in events if e["type"] == "gyre.v1.StepCompleted"]
    assert len(steps) == 2 and all(lost not in s.get("cells", []) for s in steps)

    scheduler_log = [
        json.loads(line)
        for line in (config.run.path / "logs" / "scheduler.log").read_text().splitlines()
        if line.startswith("{")
    ]
    removed = [r for r in scheduler_log if r.get("event") == "cell_removed"]
    assert [(r["cell"], r["lost"]) for r in removed] == [(lost, True)], removed
    # What ran on the lost engine moved to the others (where the prefix is recomputed: no KV to migrate),
    # at the loss or, for a start commanded before it and reported after, at that report.
    reroutes = [r for r in scheduler_log if r.get("event") == "executions_rerouted"]
    assert all(r["source"] == lost for r in reroutes if r["recompute"]), reroutes
    loss = next(i for i, r in enumerate(scheduler_log) if r.get("event") == "cell_lost")
    moved = [
        r for r in scheduler_log[loss:] if r.get("event") == "executions_rerouted" and r["source"] == lost
    ]
    assert all(r["destination"] != lost for r in moved), moved
    assert bool(moved) == (role == common_pb2.CELL_ROLE_ROLLOUT), moved
    assert_audited(config.run.path, steps=2)


def _pid(run_dir: Path, process: str) -> int:
    state = StackState.load(run_dir)
    assert state is not None
    (entry,) = [p for p in state.processes if p.name == process]
    return entry.pid

"""Two elastic steps on the real SGLang: the demo with `app/demo/sglang.yaml` (every cell's rollout engine is
an SGLang server its cell agent launches on these CPUs; K = 3, the demo's warm start, `disk` publication),
shaped like tests/e2e/test_elastic_run.py and with cells small enough that every cell hosts executions, so
a cell switches to training while one of its calls runs on its SGLang.

That a call is in flight on the core's SGLang at the very moment its switch begins is left to no chance: the
run's own dynamics gave one only most of the time (a CI run found the core between calls). So the core's
server is held (SIGSTOP of its process group, `hold_engine` in app/demo/faults.py) from a call it runs until
the scheduler reports the core's switch begun, then let go: the calls on it stay in flight across the switch,
as long generations do on GPUs. The batch is ready without the core: the start rule places executions on the
high cells first, so the first groups run on the satellites.

Asserted from the run's stored events and the proxy's log, and from the servers themselves: a role switch
rerouted a call in flight to another SGLang, which recomputed its prefix (SGLang has no `/gyre/kv/*`: no
KV moved); every SGLang serves the last publication (each server's own `GET /get_model_info`, asked while
the run is still up); `gyre audit` recomputes the run, and its forward on the ids the proxy recorded gives
the recorded behaviour log-probs within 1e-4 (SGLang's own sampling, float32); 0 harness errors; nothing of the run is left
running once it is down (no SGLang process group, no listening engine port, no process naming the run).

    .venv/bin/python -m pytest -q tests/e2e/test_sglang_run.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.demo.faults import Fault, FaultInjector
from app.demo.run import DemoRun
from gyre.config import GyreConfig
from tests.support.audit import assert_audited
from tests.support.sglang_runs import assert_nothing_left, sglang_demo_config, wait_served

# Three SGLang servers start in 40–80 s together here (200 s each on a loaded machine): the start counts.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

STEPS = 2


def test_two_elastic_steps_on_three_sglang_servers(tmp_path: Path) -> None:
    config = sglang_demo_config(tmp_path, "e2esglang", uid_base=163000)
    assert config.cell_agent.engine.backend == "sglang" and config.cell_agent.trainer.publication == "disk"
    served: dict[str, list[str | None]] = {}
    hold = FaultInjector(config.run.path, [Fault("core", when="live", action="hold_engine")], wait_s=600)

    def progress(state: Any, elapsed_s: float) -> None:
        hold.progress(state, elapsed_s)
        # The last step is done: wait (the stack still up) until the publication reached every SGLang.
        if state.steps >= STEPS and not served:
            served["versions"] = wait_served(config, str(STEPS), timeout_s=300)

    try:
        summary = DemoRun(config, steps=STEPS).execute(progress=progress)
    finally:
        hold.stop()
    events = [json.loads(line) for line in (config.run.path / "events.jsonl").read_text().splitlines()]

    assert summary["steps"] == STEPS
    steps = [e["event"] for e in events if e["type"] == "gyre.v1.StepCompleted"]
    assert len(steps) == STEPS and all(int(s.get("numTargets", 0)) > 0 for s in steps), steps
    published = [e["event"] for e in events if e["type"] == "gyre.v1.WeightsPublished"]
    assert published and published[-1]["policyVersion"] == str(STEPS)
    assert served["versions"] == [str(STEPS)] * 3, served  # every server's own report, last publication

    assert summary["harness_errors_during_transitions"] == 0
    terminated = [e["event"] for e in events if e["type"] == "gyre.v1.ExecutionTerminated"]
    assert terminated and all(
        t.get("reason") in ("TERMINATION_REASON_COMPLETED", "TERMINATION_REASON_CANCELLED")
        for t in terminated
    ), [t.get("reason") for t in terminated]
    (held,) = hold.done
    assert held.at_s and "until its cell's switch began" in held.detail, held
    _assert_rerouted_on_a_switch(config, events, summary)
    objective = assert_audited(config.run.path, steps=STEPS).to_json()["objective"]
    # what the proxy recorded is SGLang's own sampling: the audit's float32 forward on the recorded ids gives
    # the recorded behaviour log-probs within the engine contract's 1e-4 (SGLang serves in float32 here)
    mismatch = objective["mismatch_by_step"]
    assert sum(m["tokens"] for m in mismatch) > 0 and objective["mismatch_max_abs"] <= 1e-4, mismatch
    assert_nothing_left(config)


def _assert_rerouted_on_a_switch(
    config: GyreConfig, events: list[dict[str, Any]], summary: dict[str, Any]
) -> None:
    """A cell began to switch to training while executions ran, and the proxy moved a call in flight off
    its engine then: continued on another SGLang, with no KV carried (the destination recomputed it)."""
    assert summary["reroutes"] >= 1, summary
    drains = [
        line
        for line in map(json.loads, (config.run.path / "logs" / "proxy.log").read_text().splitlines())
        if line.get("event") == "engine_drained"
    ]
    rerouted = [d for d in drains if d["calls_rerouted"] > 0]
    assert rerouted, drains
    assert all(d.get("kv_migrated_tokens", 0) == 0 for d in drains), drains  # absent: nowhere to move to
    running, live = 0, set()
    for e in events:
        if e["type"] == "gyre.v1.ExecutionStarted":
            running += 1
        elif e["type"] == "gyre.v1.ExecutionTerminated":
            running -= 1
        elif (
            e["type"] == "gyre.v1.RoleTransitionBegun"
            and e["event"].get("toRole") == "CELL_ROLE_TRAINING"
            and running > 0
        ):
            live.add(f"cell-{e['event'].get('cell', 0)}")
    assert "cell-0" in live & {d["engine"] for d in rerouted}, (live, rerouted)

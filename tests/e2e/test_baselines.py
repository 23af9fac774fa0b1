"""The two baselines as run modes: `gyre demo --mode async|colocate` for 2 optimizer steps through the
real services (NATS, Redis, the six services, K = 3 cell agents, the demo harness in sandboxes), with
(φ, μ) matched to the run's target staleness by the same function the demo uses (`mode_config`).

The role pattern is asserted from the run's stored events: in `async` the fixed training cell (cell 0,
T = 1) goes to training once at the start and never returns to rollout while the others never leave
rollout; in `colocate` every transition is a wave of all K cells to the same role. The model is a tiny
random Qwen3 whose engine emits a scripted write_file call with its own log-probs (`scored_script`), so
each execution makes real tool calls in a few seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.demo.config import mode_config
from app.demo.run import DemoRun
from tests.support.audit import assert_audited
from tests.support.models import hf_dir

pytestmark = pytest.mark.slow

WRITE_8 = (
    '<tool_call>\n{"name": "write_file", "arguments": {"path": "answer.txt", "content": "8"}}\n</tool_call>'
)
"""The scripted call in Qwen3's Hermes format (every `add/` task asks for answer.txt)."""

SHAPE: dict[str, Any] = {
    # E[d] = φ + (μ − 1)/2 = 0.5: async (0.5, 1), colocate (0, 2), so 2 steps are one colocate burst.
    "scheduler": {
        "num_cells": 3,
        "group_size": 2,
        "batch_groups": 2,
        "phi": 0.0,
        "mu": 2,
        "rho_min": 0.5,
        "tau_s": 0.2,
        "cell_capacity": 4,
    },
    "tasks": {"queries": ["add"]},
    "runner": {"harness_args": ["--tool-latency-s", "0.5", "--tool-latency-max-s", "3"]},
}


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("script") / "script.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in (WRITE_8, "Done.")) + "\n")
    return path


def _run(mode: str, tmp_path: Path, script: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    overrides = {
        "run": {"id": f"e2e{mode}", "dir": str(tmp_path / "runs")},
        "model": {"path": str(hf_dir("qwen3"))},
        "cell_agent": {
            "engine": {"output_source": "scored_script", "script_file": str(script), "script_repeat": True}
        },
        **SHAPE,
    }
    config = mode_config(None, overrides, mode)
    summary = DemoRun(config, steps=2).execute()
    events = [json.loads(line) for line in (config.run.path / "events.jsonl").read_text().splitlines()]
    assert summary["steps"] == 2 and summary["mode"] == mode
    assert summary["target_staleness"] == 0.5
    ex = summary["executions"]
    assert ex["trained"] >= 2 * 2 * 2 - ex["excluded"] - ex["placeholder"]
    assert_audited(config.run.path, steps=2)
    return summary, events


def _transitions(events: list[dict[str, Any]]) -> list[tuple[float, int, str]]:
    """(time, cell, to-role) of every transition begun, in order."""
    return [
        (e["time_s"], e["event"].get("cell", 0), e["event"].get("toRole", ""))
        for e in events
        if e["type"] == "gyre.v1.RoleTransitionBegun"
    ]


def test_async_keeps_its_training_cell_in_training_for_the_whole_run(tmp_path: Path, script: Path) -> None:
    summary, events = _run("async", tmp_path, script)
    assert (summary["phi"], summary["mu"]) == (0.5, 1)
    begun = _transitions(events)
    assert [(cell, role) for _, cell, role in begun] == [(0, "CELL_ROLE_TRAINING")]
    steps = [e for e in events if e["type"] == "gyre.v1.StepCompleted"]
    assert len(steps) >= 2 and all(s["event"].get("cells") == [0] for s in steps), steps


def test_colocate_switches_every_cell_together(tmp_path: Path, script: Path) -> None:
    summary, events = _run("colocate", tmp_path, script)
    assert (summary["phi"], summary["mu"]) == (0.0, 2)
    begun = _transitions(events)
    assert len(begun) >= 3 and len(begun) % 3 == 0, begun
    waves = [begun[i : i + 3] for i in range(0, len(begun), 3)]
    for wave in waves:
        assert sorted(cell for _, cell, _ in wave) == [0, 1, 2], waves
        assert len({role for _, _, role in wave}) == 1, waves
    assert waves[0][0][2] == "CELL_ROLE_TRAINING"
    # The burst of μ = 2 steps ended with the run: every cell went back to rollout together.
    assert [w[0][2] for w in waves][:2] == ["CELL_ROLE_TRAINING", "CELL_ROLE_ROLLOUT"]
    steps = [e for e in events if e["type"] == "gyre.v1.StepCompleted"]
    # A step's `cells` are the cells that claimed one of its micro-steps: a batch of one micro-step (the
    # scripted outputs are short) is trained by one cell while the others wait in training.
    assert len(steps) >= 2 and all(set(s["event"].get("cells", [])) <= {0, 1, 2} for s in steps), steps

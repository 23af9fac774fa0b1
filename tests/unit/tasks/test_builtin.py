"""Built-in suites: the contract of every registered suite, the registry's lookups and the arithmetic
verifier's scoring."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gyre.tasks import (
    BUILTIN_SUITES,
    Task,
    TaskError,
    TaskRegistry,
    UnknownTaskError,
    Verifier,
    check_relative,
    demo_task_ids,
)
from gyre.tasks.builtin.verify import MISSING, RIGHT, WRITTEN
from harness.tools import TOOL_SPECS

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("suite_name", sorted(BUILTIN_SUITES))
def test_every_suite_honours_the_contract(suite_name: str) -> None:
    suite = BUILTIN_SUITES[suite_name]()
    ids = suite.task_ids()
    assert ids and len(set(ids)) == len(ids)
    for task_id in ids:
        assert task_id.startswith(f"{suite_name}/")
        task = suite.get(task_id.split("/", 1)[1])
        assert task.task_id == task_id and task.prompt and task.verifier.argv
        assert task.verifier.protocol == "score_line" and task.source == "builtin"
        assert 0 < task.harness_timeout_s <= task.overall_budget_s
        for rel in task.files:
            check_relative(rel)
        assert task.tools is None or set(task.tools) <= set(TOOL_SPECS)


def test_registry_resolves_demo_tasks_and_names_unknown_ones() -> None:
    registry = TaskRegistry()
    assert all(registry.get(t).task_id == t for t in demo_task_ids())
    assert registry.get("add/3+5").prompt == "3+5=? Write the answer to answer.txt."
    for bad in ("nope/1", "add/12+3", "add/", "parts/1+1"):
        with pytest.raises(UnknownTaskError):
            registry.get(bad)


def test_task_validation_names_the_problem() -> None:
    with pytest.raises(TaskError, match="overall_budget_s"):
        Task("s/a", "p", harness_timeout_s=10, overall_budget_s=5)
    with pytest.raises(TaskError, match="relative"):
        Task("s/a", "p", files={"../x": ""})
    with pytest.raises(TaskError, match="timeouts must be positive"):
        Task("s/a", "p", verifier=Verifier(("true",), timeout_s=0))


def test_verifier_scores_right_written_and_missing_parts(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("8\n")
    (tmp_path / "b.txt").write_text("five")
    done = subprocess.run(
        [sys.executable, "-m", "gyre.tasks.builtin.verify", "a.txt=8", "b.txt=5", "c.txt=1"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["parts"] == {"a.txt": RIGHT, "b.txt": WRITTEN, "c.txt": MISSING}
    assert result["score"] == pytest.approx((RIGHT + WRITTEN + MISSING) / 3)

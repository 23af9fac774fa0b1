"""Task registry contract (every registered suite) and the demo verifier's scoring."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.tasks import SUITES, Task, TaskRegistry, UnknownTaskError, check_relative, demo_task_ids
from harness.tools import TOOL_SPECS
from harness.verify import MISSING, RIGHT, WRITTEN

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("suite_name", sorted(SUITES))
def test_every_suite_honours_the_contract(suite_name: str) -> None:
    suite = SUITES[suite_name]()
    ids = suite.task_ids()
    assert ids and len(set(ids)) == len(ids)
    for task_id in ids:
        assert task_id.startswith(f"{suite_name}/")
        task = suite.get(task_id.split("/", 1)[1])
        assert task.task_id == task_id and task.prompt and task.verifier
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


def test_directory_tasks_load_with_template_and_placeholders(tmp_path: Path) -> None:
    (tmp_path / "fix" / "workspace").mkdir(parents=True)
    (tmp_path / "fix" / "workspace" / "calc.py").write_text("x = 1\n")
    (tmp_path / "fix" / "task.yaml").write_text(
        'prompt: "Fix it."\nverifier: ["{python}", "{task_dir}/verify.py"]\nharness_timeout_s: 5\noverall_budget_s: 9\n'
    )
    registry = TaskRegistry([tmp_path])
    task = registry.get(f"{tmp_path.name}/fix")
    assert task.template_dir == tmp_path.resolve() / "fix" / "workspace"
    assert task.verifier_argv("/py") == ["/py", f"{tmp_path.resolve()}/fix/verify.py"]
    assert (task.harness_timeout_s, task.overall_budget_s) == (5.0, 9.0)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "task.yaml").write_text("prompt: x\ncolour: red\n")
    with pytest.raises(UnknownTaskError, match="unknown keys"):
        registry.get(f"{tmp_path.name}/bad")


def test_task_validation_names_the_problem() -> None:
    with pytest.raises(ValueError, match="overall_budget_s"):
        Task("s/a", "p", harness_timeout_s=10, overall_budget_s=5)
    with pytest.raises(ValueError, match="relative"):
        Task("s/a", "p", files={"../x": ""})


def test_verifier_scores_right_written_and_missing_parts(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("8\n")
    (tmp_path / "b.txt").write_text("five")
    done = subprocess.run(
        [sys.executable, "-m", "harness.verify", "a.txt=8", "b.txt=5", "c.txt=1"],
        cwd=tmp_path, env={"PYTHONPATH": str(REPO)}, capture_output=True, text=True, check=True,
    )
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["parts"] == {"a.txt": RIGHT, "b.txt": WRITTEN, "c.txt": MISSING}
    assert result["score"] == pytest.approx((RIGHT + WRITTEN + MISSING) / 3)

"""Gyre's own task.yaml directories: template, placeholders, timeouts; defects named with the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre.tasks import TaskError, TaskRegistry, UnknownTaskError, WorkspaceSource


def test_task_yaml_loads_with_template_placeholders_and_timeouts(tmp_path: Path) -> None:
    (tmp_path / "fix" / "workspace").mkdir(parents=True)
    (tmp_path / "fix" / "workspace" / "calc.py").write_text("x = 1\n")
    (tmp_path / "fix" / "task.yaml").write_text(
        'prompt: "Fix it."\nverifier: ["{python}", "{task_dir}/verify.py"]\nharness_timeout_s: 5\n'
        "overall_budget_s: 9\nverifier_timeout_s: 2\ntools: [bash]\nfiles: {notes.txt: hi}\n"
    )
    task = TaskRegistry([tmp_path]).get(f"{tmp_path.name}/fix")
    assert task.source == "task.yaml" and task.workspace == (
        WorkspaceSource(tmp_path.resolve() / "fix" / "workspace"),
    )
    assert task.verifier_argv("/py") == ["/py", f"{tmp_path.resolve()}/fix/verify.py"]
    assert (task.harness_timeout_s, task.overall_budget_s, task.verifier.timeout_s) == (5.0, 9.0, 2.0)
    assert task.tools == ("bash",) and dict(task.files) == {"notes.txt": "hi"}
    assert task.verifier.protocol == "score_line" and task.environment.workdir is None


def test_task_yaml_defects_and_unknown_names(tmp_path: Path) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "task.yaml").write_text("prompt: x\ncolour: red\nverifier: python verify.py\n")
    registry = TaskRegistry([tmp_path])
    with pytest.raises(TaskError) as e:
        registry.get(f"{tmp_path.name}/bad")
    spec = tmp_path.resolve() / "bad" / "task.yaml"
    assert str(e.value) == (
        f"{spec}: colour: unknown key; allowed: files, harness_timeout_s, overall_budget_s, "
        f"prompt, tools, verifier, verifier_timeout_s; {spec}: verifier: must be a list of "
        "arguments (an argv)"
    )
    with pytest.raises(UnknownTaskError, match="no task directory 'nope'"):
        registry.get(f"{tmp_path.name}/nope")
    with pytest.raises(UnknownTaskError, match="no suite 'elsewhere'"):
        registry.get("elsewhere/x")

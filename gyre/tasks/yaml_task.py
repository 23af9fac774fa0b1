"""Gyre's own on-disk task format: a directory with `task.yaml` and an optional `workspace/`.

    <task>/task.yaml      prompt, verifier, timeouts (the keys below)
    <task>/workspace/     optional workspace template, copied into every execution's workspace

Example `task.yaml` (the verifier prints `{"score": x}` as its last line, see gyre/tasks/task.py):

    prompt: "Fix the failing test in calc.py."
    verifier: ["{python}", "{task_dir}/verify.py"]
    harness_timeout_s: 600
    overall_budget_s: 900
    verifier_timeout_s: 60
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from gyre.tasks.problems import Problems
from gyre.tasks.task import (
    DEFAULT_HARNESS_TIMEOUT_S,
    DEFAULT_OVERALL_BUDGET_S,
    DEFAULT_VERIFIER_TIMEOUT_S,
    Task,
    TaskError,
    Verifier,
    WorkspaceSource,
)

TASK_YAML = "task.yaml"
KEYS = {"prompt", "files", "verifier", "tools", "harness_timeout_s", "overall_budget_s", "verifier_timeout_s"}
_TIMEOUTS = ("harness_timeout_s", "overall_budget_s", "verifier_timeout_s")


def _string_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str | int | float) for v in value)


def load_yaml_task(task_dir: Path, task_id: str, problems: Problems) -> Task | None:
    """The task of `task_dir/task.yaml`, or None with the reasons appended to `problems`."""
    spec_path = task_dir / TASK_YAML
    try:
        spec: Any = yaml.safe_load(spec_path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        problems.error(spec_path, f"not readable YAML: {str(e).splitlines()[0]}")
        return None
    if not isinstance(spec, dict):
        problems.error(spec_path, f"must be a mapping of keys; got {type(spec).__name__}")
        return None
    before = len(problems.errors)
    for key in sorted(set(spec) - KEYS):
        problems.error(spec_path, f"{key}: unknown key; allowed: {', '.join(sorted(KEYS))}")
    if not isinstance(spec.get("prompt"), str) or not spec["prompt"].strip():
        problems.error(spec_path, "prompt: required, a non-empty string")
    if not _string_list(spec.get("verifier") or []):
        problems.error(spec_path, "verifier: must be a list of arguments (an argv)")
    elif not spec.get("verifier"):
        problems.warn(
            spec_path, "verifier: none given, so nothing can score this task (its executions are excluded)"
        )
    if spec.get("tools") is not None and not _string_list(spec["tools"]):
        problems.error(spec_path, "tools: must be a list of tool names")
    files = spec.get("files") or {}
    if not isinstance(files, dict):
        problems.error(spec_path, "files: must be a mapping of relative path to text")
        files = {}
    timeouts: dict[str, float] = {}
    for key in _TIMEOUTS:
        if key not in spec:
            continue
        value = spec[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            problems.error(spec_path, f"{key}: must be a positive number of seconds; got {value!r}")
        else:
            timeouts[key] = float(value)
    if len(problems.errors) > before:
        return None
    template = task_dir / "workspace"
    try:
        return Task(
            task_id=task_id,
            prompt=str(spec["prompt"]),
            files=MappingProxyType({str(k): str(v) for k, v in files.items()}),
            workspace=(WorkspaceSource(template),) if template.is_dir() else (),
            verifier=Verifier(
                tuple(str(a) for a in spec.get("verifier") or ()),
                timeout_s=timeouts.get("verifier_timeout_s", DEFAULT_VERIFIER_TIMEOUT_S),
            ),
            tools=tuple(str(t) for t in spec["tools"]) if spec.get("tools") else None,
            task_dir=task_dir,
            source="task.yaml",
            harness_timeout_s=timeouts.get("harness_timeout_s", DEFAULT_HARNESS_TIMEOUT_S),
            overall_budget_s=timeouts.get("overall_budget_s", DEFAULT_OVERALL_BUDGET_S),
        )
    except TaskError as e:
        problems.error(spec_path, str(e))
        return None

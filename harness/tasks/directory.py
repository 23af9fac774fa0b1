"""On-disk tasks: a directory whose subdirectories each hold one task.

    <root>/<name>/task.yaml      prompt, verifier, timeouts (keys of `Task`)
    <root>/<name>/workspace/     optional workspace template, copied into every execution's workspace

The task id is `<suite>/<name>` where the suite is named after `<root>` (or given explicitly).
Example `task.yaml`:

    prompt: "Fix the failing test in calc.py."
    verifier: ["{python}", "{task_dir}/verify.py"]
    harness_timeout_s: 600
    overall_budget_s: 900
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from harness.tasks.task import Task, TaskSuite

_KEYS = {"prompt", "files", "verifier", "tools", "harness_timeout_s", "overall_budget_s", "verifier_timeout_s"}


class DirectorySuite(TaskSuite):
    """Tasks loaded from `<root>/<name>/task.yaml`; re-read on every `get` (edits take effect)."""

    def __init__(self, root: Path, name: str | None = None) -> None:
        if not root.is_dir():
            raise ValueError(f"task directory {root} does not exist")
        self.root = root.resolve()
        self.name = name or self.root.name

    def task_ids(self) -> list[str]:
        return sorted(f"{self.name}/{p.parent.name}" for p in self.root.glob("*/task.yaml"))

    def get(self, name: str) -> Task:
        task_dir = self.root / name
        spec_path = task_dir / "task.yaml"
        if "/" in name or not spec_path.is_file():
            raise KeyError(name)
        spec: Any = yaml.safe_load(spec_path.read_text()) or {}
        if not isinstance(spec, dict):
            raise ValueError(f"{spec_path}: must be a mapping")
        unknown = set(spec) - _KEYS
        if unknown:
            raise ValueError(f"{spec_path}: unknown keys {sorted(unknown)}; allowed: {sorted(_KEYS)}")
        if "prompt" not in spec:
            raise ValueError(f"{spec_path}: `prompt` is required")
        template = task_dir / "workspace"
        return Task(
            task_id=f"{self.name}/{name}",
            prompt=str(spec["prompt"]),
            files=MappingProxyType({str(k): str(v) for k, v in (spec.get("files") or {}).items()}),
            verifier=tuple(str(a) for a in spec.get("verifier") or ()),
            tools=tuple(str(t) for t in spec["tools"]) if spec.get("tools") else None,
            template_dir=template if template.is_dir() else None,
            task_dir=task_dir,
            **{k: float(spec[k]) for k in ("harness_timeout_s", "overall_budget_s", "verifier_timeout_s") if k in spec},
        )

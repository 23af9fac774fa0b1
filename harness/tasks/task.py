"""The task format: what an execution is asked to do and how its preserved workspace is scored.

A task is a prompt, a workspace template (files the workspace starts with), a verifier command,
a harness timeout and an overall budget. The verifier runs with the working directory set to a
copy of the preserved workspace and prints one JSON object with a `score` in [0, 1] as its last
line of stdout, or fails (non-zero exit, no JSON, a score out of range): a failure is *pending*,
never a zero. Verifier arguments may use two placeholders, expanded by the evaluator:

    {python}    the interpreter of the evaluating process (the demo verifiers are Python modules)
    {task_dir}  the directory a task was loaded from (on-disk tasks; empty for built-in suites)

Tasks come from suites (`harness.tasks.registry`): built-in suites generate their tasks from the
id, directory suites load `task.yaml` files.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

DEFAULT_HARNESS_TIMEOUT_S = 120.0
DEFAULT_OVERALL_BUDGET_S = 300.0
DEFAULT_VERIFIER_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Task:
    """One query: the unit a group of N executions samples."""

    task_id: str
    """Unique id, `<suite>/<name>` (also the query id of its groups)."""
    prompt: str
    """What the harness is asked to do."""
    files: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Workspace template: relative path → text content."""
    verifier: tuple[str, ...] = ()
    """Verifier argv (placeholders `{python}`, `{task_dir}`); empty = nothing can score this task."""
    harness_timeout_s: float = DEFAULT_HARNESS_TIMEOUT_S
    """Harness time limit: past it the harness is stopped, the workspace preserved and scored."""
    overall_budget_s: float = DEFAULT_OVERALL_BUDGET_S
    """Harness plus evaluation retries; past it an execution without a valid score is excluded."""
    verifier_timeout_s: float = DEFAULT_VERIFIER_TIMEOUT_S
    """Wall-clock limit of one verifier attempt (a timeout is a failed attempt, i.e. pending)."""
    tools: tuple[str, ...] | None = None
    """Tools the demo harness offers for this task (None = its default set). Every tool definition
    is part of every request, so a task that needs one tool keeps the byte-level model's context short."""
    template_dir: Path | None = None
    """Directory copied into the workspace before `files` (on-disk tasks)."""
    task_dir: Path | None = None
    """Directory the task was loaded from, substituted for `{task_dir}`."""

    def __post_init__(self) -> None:
        if not self.task_id or any(c.isspace() for c in self.task_id):
            raise ValueError(f"task id must be non-empty without whitespace; got {self.task_id!r}")
        if self.harness_timeout_s <= 0 or self.verifier_timeout_s <= 0:
            raise ValueError(f"task {self.task_id}: timeouts must be positive")
        if self.overall_budget_s < self.harness_timeout_s:
            raise ValueError(
                f"task {self.task_id}: overall_budget_s ({self.overall_budget_s}) must be at least "
                f"harness_timeout_s ({self.harness_timeout_s}); the budget covers the harness and its evaluation"
            )
        for rel in self.files:
            check_relative(rel)

    def verifier_argv(self, python: str) -> list[str]:
        """The verifier command with placeholders expanded."""
        task_dir = str(self.task_dir) if self.task_dir else ""
        return [arg.replace("{python}", python).replace("{task_dir}", task_dir) for arg in self.verifier]


def check_relative(rel: str) -> Path:
    """A workspace-relative path that cannot escape the workspace; `ValueError` otherwise."""
    path = Path(rel)
    if not rel or path.is_absolute() or ".." in path.parts:
        raise ValueError(f"workspace paths must be relative without '..'; got {rel!r}")
    return path


class TaskSuite(ABC):
    """A named family of tasks; ids are `<suite name>/<name>`. See `harness.tasks.registry`."""

    name: str

    @abstractmethod
    def task_ids(self) -> list[str]:
        """Every task id of the suite (the queries a run can dispatch)."""

    @abstractmethod
    def get(self, name: str) -> Task:
        """The task `<suite>/<name>`; `KeyError` or `ValueError` when the suite has no such task."""

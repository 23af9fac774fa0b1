"""The task registry: built-in suites plus directories of on-disk tasks, looked up by task id.

    registry = TaskRegistry(task_dirs=[Path("my_tasks")])
    task = registry.get("add/3+5")
    ids = demo_task_ids()

Adding a built-in suite: subclass `TaskSuite` (harness/tasks/task.py) with a unique `name`,
`task_ids()` and `get(name)`, and add it to `SUITES`. The contract test in
tests/unit/harness/test_tasks.py checks every registered suite (ids round-trip through `get`,
verifiers and limits are set, workspace paths stay inside the workspace).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from harness.tasks.arithmetic import AdditionSuite, MultiPartSuite
from harness.tasks.directory import DirectorySuite
from harness.tasks.task import Task, TaskSuite

SUITES: dict[str, type[TaskSuite]] = {
    AdditionSuite.name: AdditionSuite,
    MultiPartSuite.name: MultiPartSuite,
}


class UnknownTaskError(KeyError):
    """No suite knows the task id (the runner terminates such a start request as INFRA_FAILURE)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown task"


class TaskRegistry:
    """Resolves task ids against the built-in suites and the given task directories."""

    def __init__(self, task_dirs: Iterable[Path] = ()) -> None:
        self.suites: dict[str, TaskSuite] = {name: cls() for name, cls in SUITES.items()}
        for root in task_dirs:
            suite = DirectorySuite(Path(root))
            if suite.name in self.suites:
                raise ValueError(f"task directory {root} is named like the suite {suite.name!r}; rename it")
            self.suites[suite.name] = suite

    def get(self, task_id: str) -> Task:
        """The task, or `UnknownTaskError` naming why it cannot be resolved."""
        suite_name, _, name = task_id.partition("/")
        suite = self.suites.get(suite_name)
        if suite is None or not name:
            raise UnknownTaskError(f"unknown task {task_id!r}: no suite {suite_name!r} (have {sorted(self.suites)})")
        try:
            return suite.get(name)
        except (KeyError, ValueError) as e:
            raise UnknownTaskError(f"unknown task {task_id!r}: {e}") from None

    def task_ids(self) -> list[str]:
        return [tid for suite in self.suites.values() for tid in suite.task_ids()]


def demo_task_ids() -> list[str]:
    """The queries of the demo run: every single-digit addition and the multi-part tasks."""
    return AdditionSuite().task_ids() + MultiPartSuite().task_ids()

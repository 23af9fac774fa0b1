"""The task registry: the built-in suites plus suites of on-disk task directories, looked up by id.

    registry = TaskRegistry(dirs=[Path("examples/tasks")])
    task = registry.get("tasks/fix-add")          # or "add/3+5" (built-in)

The scheduler, the runner and the evaluator each build it from the same `tasks:` config section
(`gyre.tasks.taskset.TaskSet`), so an id the scheduler dispatches is one the runner can run and the
evaluator can score. Built-in suites are in gyre/tasks/builtin/ (how to add one is said there).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from gyre.tasks.builtin import BUILTIN_SUITES
from gyre.tasks.directory import DirectorySuite
from gyre.tasks.task import Task, TaskError, TaskSuite, UnknownTaskError


class TaskRegistry:
    """Resolves task ids against the built-in suites and the given task directories."""

    def __init__(self, dirs: Iterable[Path] = ()) -> None:
        self.suites: dict[str, TaskSuite] = {name: cls() for name, cls in BUILTIN_SUITES.items()}
        self.dir_suites: list[DirectorySuite] = []
        for root in dirs:
            self.add_dir(Path(root))

    def add_dir(self, root: Path) -> DirectorySuite:
        """Register a task directory (a set, or one task) as a suite; tasks of one set directory share one."""
        suite = DirectorySuite(root)
        known = self.suites.get(suite.name)
        if isinstance(known, DirectorySuite) and known.root == suite.root:
            known.merge(suite)
            return known
        if known is not None:
            what = (
                "a built-in suite"
                if suite.name in BUILTIN_SUITES
                else f"the directory {getattr(known, 'display', '')}"
            )
            raise TaskError(f"{root}: its suite name {suite.name!r} is taken by {what}; rename the directory")
        self.suites[suite.name] = suite
        self.dir_suites.append(suite)
        return suite

    def get(self, task_id: str) -> Task:
        """The task; `UnknownTaskError` when no suite has it, `TaskError` when its files are malformed."""
        suite_name, _, name = task_id.partition("/")
        suite = self.suites.get(suite_name)
        if suite is None or not name:
            raise UnknownTaskError(
                f"unknown task {task_id!r}: no suite {suite_name!r} (have {sorted(self.suites)})"
            )
        try:
            return suite.get(name)
        except UnknownTaskError as e:
            raise UnknownTaskError(f"unknown task {task_id!r}: {e}") from None

    def task_ids(self) -> list[str]:
        return [tid for suite in self.suites.values() for tid in suite.task_ids()]
